-- alkblobs extension: views, roles and grants (runs last).

CREATE VIEW @extschema@.alkblobs_pools AS
SELECT p.name AS pool, p.delete_window, p.pin_ttl, p.large_tier, p.created_at
  FROM alkblobs.pools p;

CREATE VIEW @extschema@.alkblobs_pins AS
SELECT p.name AS pool, encode(pn.key, 'hex') AS key, pn.owner, pn.pinned_at, pn.expires_at,
       pn.expires_at <= clock_timestamp() AS expired
  FROM alkblobs.pins pn JOIN alkblobs.pools p ON p.id = pn.pool;

CREATE VIEW @extschema@.alkblobs_staged AS
SELECT p.name AS pool, encode(s.key, 'hex') AS key, s.tier, s.staged_at,
       mk.mark_end + mk.delete_window AS visible_after,
       coalesce(mk.mark_end + mk.delete_window <= clock_timestamp(), false) AS due
  FROM alkblobs.staged s
  JOIN alkblobs.marks mk ON mk.id = s.mark
  JOIN alkblobs.pools p ON p.id = s.pool;

CREATE VIEW @extschema@.alkblobs_usage AS
SELECT p.name AS pool,
       coalesce(e.kv_entries, 0) AS kv_entries, coalesce(e.kv_bytes, 0) AS kv_bytes,
       coalesce(e.lo_entries, 0) AS lo_entries, coalesce(e.lo_bytes, 0) AS lo_bytes,
       (SELECT count(*) FROM alkblobs.pins pn WHERE pn.pool = p.id AND pn.expires_at > clock_timestamp()) AS pins,
       (SELECT count(*) FROM alkblobs.staged s WHERE s.pool = p.id) AS staged,
       (SELECT count(*) FROM alkblobs.liveness l WHERE l.pool = p.id) AS liveness_tables
  FROM alkblobs.pools p
  LEFT JOIN (
        SELECT en.pool,
               count(*) FILTER (WHERE en.tier = 'kv') AS kv_entries,
               sum(en.size) FILTER (WHERE en.tier = 'kv') AS kv_bytes,
               count(*) FILTER (WHERE en.tier = 'lo') AS lo_entries,
               sum(en.size) FILTER (WHERE en.tier = 'lo') AS lo_bytes
          FROM alkblobs.entries en GROUP BY en.pool) e ON e.pool = p.id;

-- Roles: readers read and inspect; writers put and pin; sweepers sweep;
-- admins create pools and register liveness tables. Roles are cluster-wide
-- and survive DROP EXTENSION.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'alkblobs_reader') THEN
        CREATE ROLE alkblobs_reader NOLOGIN;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'alkblobs_writer') THEN
        CREATE ROLE alkblobs_writer NOLOGIN IN ROLE alkblobs_reader;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'alkblobs_sweeper') THEN
        CREATE ROLE alkblobs_sweeper NOLOGIN IN ROLE alkblobs_reader;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'alkblobs_admin') THEN
        CREATE ROLE alkblobs_admin NOLOGIN IN ROLE alkblobs_writer, alkblobs_sweeper;
    END IF;
END $$;

-- Nothing is executable or readable by default: every function and
-- procedure of the extension (found through its membership, so one added
-- later cannot be forgotten) is revoked from PUBLIC, except alkblobs_key.
DO $$
DECLARE
    f regprocedure;
BEGIN
    FOR f IN
        SELECT p.oid FROM pg_catalog.pg_proc p
          JOIN pg_catalog.pg_depend d ON d.classid = 'pg_catalog.pg_proc'::regclass
           AND d.objid = p.oid AND d.deptype = 'e'
          JOIN pg_catalog.pg_extension x ON x.oid = d.refobjid AND x.extname = 'alkblobs'
         WHERE p.proname <> 'alkblobs_key'
    LOOP
        EXECUTE format('REVOKE ALL ON %s %s FROM PUBLIC',
                       CASE WHEN (SELECT prokind FROM pg_catalog.pg_proc WHERE oid = f) = 'p' THEN 'PROCEDURE' ELSE 'FUNCTION' END, f);
    END LOOP;
END $$;
REVOKE ALL ON @extschema@.alkblobs_pools, @extschema@.alkblobs_pins, @extschema@.alkblobs_staged,
    @extschema@.alkblobs_usage FROM PUBLIC;

-- ...then each role gets exactly what it needs.
GRANT SELECT ON @extschema@.alkblobs_pools, @extschema@.alkblobs_pins, @extschema@.alkblobs_staged,
    @extschema@.alkblobs_usage TO alkblobs_reader;
GRANT EXECUTE ON FUNCTION
    @extschema@.alkblobs_get(text, bytea),
    @extschema@.alkblobs_stat(text, bytea),
    @extschema@.alkblobs_lo_read(text, bytea, bigint, integer),
    @extschema@.alkblobs_explain(text, bytea)
  TO alkblobs_reader;
GRANT EXECUTE ON FUNCTION
    @extschema@.alkblobs_put(text, bytea, bytea, text),
    @extschema@.alkblobs_pin(text, bytea, text),
    @extschema@.alkblobs_pin_new(text, bytea, text),
    @extschema@.alkblobs_unpin(text, bytea, text),
    @extschema@.alkblobs_renew(text, text),
    @extschema@.alkblobs_pins_held(text, text, bytea[]),
    @extschema@.alkblobs_unpin_all(text, text),
    @extschema@.alkblobs_lo_create(),
    @extschema@.alkblobs_lo_write(oid, bigint, bytea),
    @extschema@.alkblobs_lo_commit(text, bytea, oid, text)
  TO alkblobs_writer;
GRANT EXECUTE ON FUNCTION
    @extschema@.alkblobs_stage(text, bytea[]),
    @extschema@.alkblobs_claim_local(text, integer),
    @extschema@.alkblobs_sweep(text, boolean, integer, boolean)
  TO alkblobs_sweeper;
GRANT EXECUTE ON PROCEDURE @extschema@.alkblobs_sweep_all(text, integer) TO alkblobs_sweeper;
GRANT EXECUTE ON FUNCTION
    @extschema@.alkblobs_create_pool(text, interval, interval, text),
    @extschema@.alkblobs_alter_pool(text, interval, interval),
    @extschema@.alkblobs_register_liveness(text, regclass),
    @extschema@.alkblobs_unregister_liveness(text, regclass)
  TO alkblobs_admin;
