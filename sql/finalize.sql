-- alkblobs extension: views, roles and grants (runs last).

-- Every view shows only the pools the caller (session_user) may read. The
-- views are security barriers: a caller's own WHERE clause (a cast that
-- fails on a foreign value, a function in pg_temp) is applied only to rows
-- the pool filter already let through, so it cannot see other pools' rows.
CREATE VIEW @extschema@.alkblobs_pools WITH (security_barrier) AS
SELECT p.name AS pool, p.delete_window, p.pin_ttl, p.large_tier, p.max_object_bytes,
       coalesce(o.rolname, p.owner)::text AS owner, p.created_at, p.mode,
       p.id AS pool_id, p.sweep_every, p.history_keep, p.warn_after, p.critical_after,
       p.large_location, p.collector, p.audit_every, p.last_audit,
       coalesce(p.audit_running, (SELECT alkblobs.audit_reason(array_agg(a.reason ORDER BY a.id))
                                    FROM alkblobs.audit_requests a WHERE a.pool = p.id)) AS audit_pending,
       p.tier_listing_due
  FROM alkblobs.pools p LEFT JOIN pg_catalog.pg_roles o ON o.oid = p.owner_oid
 WHERE alkblobs.may(p, 'read');

CREATE VIEW @extschema@.alkblobs_pool_grants WITH (security_barrier) AS
SELECT p.name AS pool, coalesce(r.rolname, g.grantee)::text AS grantee, g.access
  FROM alkblobs.pool_grants g JOIN alkblobs.pools p ON p.id = g.pool
  LEFT JOIN pg_catalog.pg_roles r ON r.oid = g.grantee_oid
 WHERE alkblobs.may(p, 'read');

CREATE VIEW @extschema@.alkblobs_pins WITH (security_barrier) AS
SELECT p.name AS pool, encode(pn.key, 'hex') AS key, pn.role::text AS role, pn.owner,
       pn.pinned_at, pn.expires_at, pn.expires_at <= clock_timestamp() AS expired
  FROM alkblobs.pins pn JOIN alkblobs.pools p ON p.id = pn.pool
 WHERE alkblobs.may(p, 'read');

CREATE VIEW @extschema@.alkblobs_staged WITH (security_barrier) AS
SELECT p.name AS pool, encode(s.key, 'hex') AS key, s.tier, s.staged_at,
       mk.mark_end + mk.delete_window AS visible_after,
       coalesce(mk.mark_end + mk.delete_window <= clock_timestamp(), false) AS due
  FROM alkblobs.staged s
  JOIN alkblobs.marks mk ON mk.id = s.mark
  JOIN alkblobs.pools p ON p.id = s.pool
 WHERE alkblobs.may(p, 'read');

CREATE VIEW @extschema@.alkblobs_usage WITH (security_barrier) AS
SELECT p.name AS pool,
       coalesce(e.kv_entries, 0) AS kv_entries, coalesce(e.kv_bytes, 0) AS kv_bytes,
       coalesce(e.lo_entries, 0) AS lo_entries, coalesce(e.lo_bytes, 0) AS lo_bytes,
       (SELECT count(*) FROM alkblobs.pins pn WHERE pn.pool = p.id AND pn.expires_at > clock_timestamp()) AS pins,
       (SELECT count(*) FROM alkblobs.staged s WHERE s.pool = p.id) AS staged,
       -- (A dropped table's registration lingers in the SQL-only flavour until
       -- the pool's next sweep, stage or claim removes it: not counted.)
       (SELECT count(*) FROM alkblobs.liveness l WHERE l.pool = p.id
           AND EXISTS (SELECT 1 FROM pg_catalog.pg_class c WHERE c.oid = l.relid)) AS liveness_tables,
       (SELECT count(*) FROM alkblobs.uploads u WHERE u.pool = p.id) AS uploads,
       (SELECT count(*) FROM alkblobs.uploads u WHERE u.pool = p.id
           AND NOT alkblobs.upload_running(u.xact)) AS uploads_abandoned,
       (SELECT count(*) FROM alkblobs.files f WHERE f.pool = p.id) AS local_files,
       -- (0.8.0, appended: a view keeps its columns' order.) The large
       -- objects' outboards (entries.outboard): octet_length reads the
       -- TOAST pointer's length, not the bytes.
       coalesce(e.lo_outboard_bytes, 0) AS lo_outboard_bytes
  FROM alkblobs.pools p
  LEFT JOIN (
        SELECT en.pool,
               count(*) FILTER (WHERE en.tier = 'kv') AS kv_entries,
               sum(en.size) FILTER (WHERE en.tier = 'kv') AS kv_bytes,
               count(*) FILTER (WHERE en.tier = 'lo') AS lo_entries,
               sum(en.size) FILTER (WHERE en.tier = 'lo') AS lo_bytes,
               sum(pg_catalog.octet_length(en.outboard)) FILTER (WHERE en.tier = 'lo') AS lo_outboard_bytes
          FROM alkblobs.entries en GROUP BY en.pool) e ON e.pool = p.id
 WHERE alkblobs.may(p, 'read');

-- The sweep history (alkblobs.sweeps): one row per sweep call.
CREATE VIEW @extschema@.alkblobs_sweeps WITH (security_barrier) AS
SELECT p.name AS pool, s.id, s.started, s.finished, s.finished - s.started AS duration,
       s.role, s.application_name, s.scheduled, s.dry_run,
       CASE WHEN s.error IS NOT NULL THEN 'error' WHEN s.aborted IS NOT NULL THEN 'aborted' ELSE 'ok' END AS outcome,
       s.aborted, s.error, s.examined, s.live, s.pinned, s.staged, s.executed, s.deleted, s.kept,
       s.bytes_freed, s.pins_reaped, s.uploads_reaped, s.remaining, s.local_due, s.skipped, s.mark_done,
       s.reviewed, s.audit, s.missed
  FROM alkblobs.sweeps s JOIN alkblobs.pools p ON p.id = s.pool
 WHERE alkblobs.may(p, 'read');

-- One row per pool: is its collector running, and is anything piling up?
-- (alkblobs.health_rows filters by the caller's access.)
CREATE VIEW @extschema@.alkblobs_health WITH (security_barrier) AS
SELECT * FROM alkblobs.health_rows();

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

-- Ownership and the default-deny policy, as one function so that every
-- upgrade script applies exactly the same policy (it ends by calling it):
-- alkblobs_owner owns the internal schema, its tables and sequences and
-- every SECURITY DEFINER function (they run as it, never as a superuser);
-- every other function and procedure, and the views, stay with the
-- extension's owner, because they run with the privileges of whoever
-- calls them (a superuser running alkblobs_sweep_all or registering a
-- table): a role that owned them could redefine them (ALTER … SET, CREATE
-- OR REPLACE) and so run code as that caller. Nothing of the extension
-- (found through its membership, so one added later cannot be forgotten)
-- is executable or readable by PUBLIC, except alkblobs_key, alkblobs_flavour
-- and (SQL-only) alkblobs_sql_only_version.
CREATE FUNCTION alkblobs.apply_policy() RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    o record;
    sql_only boolean := @extschema@.alkblobs_flavour() = 'sql-only';
    -- The library flavour: the extension's owner, a superuser. The SQL-only
    -- flavour: the role that ran the install script (it owns the schema
    -- alkblobs_registration, which the script creates).
    ext_owner name := CASE WHEN sql_only
                           THEN (SELECT r.rolname FROM pg_catalog.pg_namespace n JOIN pg_catalog.pg_roles r ON r.oid = n.nspowner
                                  WHERE n.nspname = 'alkblobs_registration')
                           ELSE (SELECT r.rolname FROM pg_catalog.pg_extension x JOIN pg_catalog.pg_roles r ON r.oid = x.extowner
                                  WHERE x.extname = 'alkblobs') END;
BEGIN
    IF NOT sql_only AND NOT (SELECT r.rolsuper FROM pg_catalog.pg_roles r WHERE r.rolname = ext_owner) THEN
        RAISE EXCEPTION 'the alkblobs extension must be installed (and upgraded) by a superuser, not %', ext_owner
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    -- Ownership changes are ALTER TABLE commands: keep the row check of
    -- registered tables (alkblobs.on_ddl_end, which runs as alkblobs_owner)
    -- out of them while ownership is in flux.
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_event_trigger WHERE evtname = 'alkblobs_liveness_ddl') THEN
        EXECUTE 'ALTER EVENT TRIGGER alkblobs_liveness_ddl DISABLE';
    END IF;
    IF sql_only THEN
        -- A schema's new owner needs CREATE on the database, which the
        -- installer may not give: the installer keeps it, and alkblobs_owner
        -- creates in it (the views of registered tables).
        EXECUTE 'GRANT USAGE, CREATE ON SCHEMA alkblobs TO alkblobs_owner';
        -- A function's new owner needs CREATE on its schema (until the
        -- end of this function: ownership stays when the grant goes).
        EXECUTE 'GRANT CREATE ON SCHEMA @extschema@, alkblobs_registration TO alkblobs_owner';
    ELSE
        EXECUTE 'ALTER SCHEMA alkblobs OWNER TO alkblobs_owner';
    END IF;
    -- The members: the extension's (found through pg_depend, so one added
    -- later cannot be forgotten); without an extension, everything in the
    -- two internal schemas and the API's alkblobs_* routines and views.
    FOR o IN
        SELECT d.classid, d.objid FROM pg_catalog.pg_depend d
          JOIN pg_catalog.pg_extension x ON x.oid = d.refobjid AND x.extname = 'alkblobs'
         WHERE NOT sql_only AND d.deptype = 'e' AND d.refclassid = 'pg_catalog.pg_extension'::regclass
        UNION ALL
        SELECT 'pg_catalog.pg_proc'::regclass, f.oid FROM pg_catalog.pg_proc f
         WHERE sql_only AND (f.pronamespace IN ('alkblobs'::regnamespace, 'alkblobs_registration'::regnamespace)
                             OR (f.pronamespace = '@extschema@'::regnamespace AND f.proname LIKE 'alkblobs\_%'))
        UNION ALL
        SELECT 'pg_catalog.pg_class'::regclass, c.oid FROM pg_catalog.pg_class c
         WHERE sql_only AND ((c.relnamespace = 'alkblobs'::regnamespace AND c.relname NOT LIKE 'src\_%')
                             OR (c.relnamespace = '@extschema@'::regnamespace AND c.relname LIKE 'alkblobs\_%' AND c.relkind = 'v'))
        UNION ALL
        SELECT 'pg_catalog.pg_type'::regclass, y.oid FROM pg_catalog.pg_type y
         WHERE sql_only AND y.typnamespace = 'alkblobs'::regnamespace
         ORDER BY 1, 2
    LOOP
        IF o.classid = 'pg_catalog.pg_proc'::regclass THEN
            EXECUTE format('ALTER %s %s OWNER TO %I',
                           CASE WHEN (SELECT prokind FROM pg_catalog.pg_proc WHERE oid = o.objid) = 'p' THEN 'PROCEDURE' ELSE 'FUNCTION' END,
                           o.objid::regprocedure,
                           CASE WHEN (SELECT prosecdef FROM pg_catalog.pg_proc WHERE oid = o.objid) THEN 'alkblobs_owner' ELSE ext_owner END);
            -- The definer functions call the internal invoker helpers.
            IF (SELECT NOT prosecdef AND pronamespace = 'alkblobs'::regnamespace FROM pg_catalog.pg_proc WHERE oid = o.objid) THEN
                EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO alkblobs_owner', o.objid::regprocedure);
            END IF;
            IF (SELECT proname FROM pg_catalog.pg_proc WHERE oid = o.objid) NOT IN ('alkblobs_key', 'alkblobs_flavour', 'alkblobs_sql_only_version') THEN
                EXECUTE format('REVOKE ALL ON %s %s FROM PUBLIC',
                               CASE WHEN (SELECT prokind FROM pg_catalog.pg_proc WHERE oid = o.objid) = 'p' THEN 'PROCEDURE' ELSE 'FUNCTION' END,
                               o.objid::regprocedure);
            END IF;
        ELSIF o.classid = 'pg_catalog.pg_class'::regclass
              AND (SELECT relkind FROM pg_catalog.pg_class WHERE oid = o.objid) IN ('r', 'v', 'p') THEN
            EXECUTE format('ALTER TABLE %s OWNER TO %I', o.objid::regclass,
                           CASE WHEN (SELECT relkind FROM pg_catalog.pg_class WHERE oid = o.objid) = 'v' THEN ext_owner ELSE 'alkblobs_owner' END);
            EXECUTE format('REVOKE ALL ON %s FROM PUBLIC', o.objid::regclass);
        ELSIF o.classid = 'pg_catalog.pg_type'::regclass
              AND (SELECT typtype FROM pg_catalog.pg_type WHERE oid = o.objid) NOT IN ('c')
              AND (SELECT typrelid FROM pg_catalog.pg_type WHERE oid = o.objid) = 0
              AND (SELECT typelem FROM pg_catalog.pg_type WHERE oid = o.objid) = 0 THEN
            EXECUTE format('ALTER TYPE %s OWNER TO alkblobs_owner', o.objid::regtype);
        END IF;
    END LOOP;
    -- Large objects the extension holds belong to it too (lo_unlink needs it).
    FOR o IN SELECT m.oid FROM pg_catalog.pg_largeobject_metadata m
              WHERE m.oid IN (SELECT e.loid FROM alkblobs.entries e WHERE e.loid IS NOT NULL
                              UNION SELECT u.loid FROM alkblobs.uploads u)
                AND m.lomowner <> 'alkblobs_owner'::regrole LOOP
        EXECUTE format('ALTER LARGE OBJECT %s OWNER TO alkblobs_owner', o.oid);
    END LOOP;
    IF sql_only THEN
        EXECUTE 'REVOKE CREATE ON SCHEMA @extschema@, alkblobs_registration FROM alkblobs_owner';
        -- The views read the tables with their owner's privileges, and
        -- their owner is the installer here, not a superuser.
        EXECUTE format('GRANT USAGE ON SCHEMA alkblobs TO %I', ext_owner);
        EXECUTE format('GRANT SELECT ON ALL TABLES IN SCHEMA alkblobs TO %I', ext_owner);
    END IF;
    -- ALWAYS: a role allowed to set session_replication_role must not
    -- slip DDL past them.
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_event_trigger WHERE evtname = 'alkblobs_liveness_ddl') THEN
        EXECUTE 'ALTER EVENT TRIGGER alkblobs_liveness_ddl ENABLE ALWAYS';
    END IF;
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_event_trigger WHERE evtname = 'alkblobs_liveness_drop') THEN
        EXECUTE 'ALTER EVENT TRIGGER alkblobs_liveness_drop ENABLE ALWAYS';
    END IF;
END $$;
DO $$ BEGIN PERFORM alkblobs.apply_policy(); END $$;

-- ...then each role gets exactly what it needs.
GRANT SELECT ON @extschema@.alkblobs_pools, @extschema@.alkblobs_pins, @extschema@.alkblobs_staged,
    @extschema@.alkblobs_usage, @extschema@.alkblobs_pool_grants, @extschema@.alkblobs_sweeps,
    @extschema@.alkblobs_health TO alkblobs_reader;
-- The views filter pools by the caller's access through alkblobs.may.
GRANT EXECUTE ON FUNCTION alkblobs.may(alkblobs.pools, text), alkblobs.health_rows(), alkblobs.upload_running(xid8),
    alkblobs.audit_reason(text[]) TO alkblobs_reader;
GRANT EXECUTE ON FUNCTION
    @extschema@.alkblobs_get(text, bytea),
    @extschema@.alkblobs_stat(text, bytea),
    @extschema@.alkblobs_lo_read(text, bytea, bigint, integer),
    @extschema@.alkblobs_lo_outboard(text, bytea, bigint, integer),
    @extschema@.alkblobs_explain(text, bytea),
    @extschema@.alkblobs_list(text, bytea, integer, text),
    @extschema@.alkblobs_single_staged(text, bytea, integer, bigint),
    @extschema@.alkblobs_single_roots(text, bytea, integer, bytea[]),
    @extschema@.alkblobs_verify_records(text, bytea, integer),
    @extschema@.alkblobs_verify_lookup(text, bytea[], boolean),
    @extschema@.alkblobs_verify_sources(text),
    @extschema@.alkblobs_verify_abandoned(text)
  TO alkblobs_reader;
GRANT EXECUTE ON FUNCTION
    @extschema@.alkblobs_put(text, bytea, bytea, text),
    @extschema@.alkblobs_put_many(text, bytea[], bytea[], text),
    @extschema@.alkblobs_single_unstage(text, bytea[]),
    @extschema@.alkblobs_single_roots_set(text, bytea[], boolean),
    @extschema@.alkblobs_pin(text, bytea, text),
    @extschema@.alkblobs_pin_new(text, bytea, text),
    @extschema@.alkblobs_local_published(text, bytea[], text),
    @extschema@.alkblobs_unpin(text, bytea, text),
    @extschema@.alkblobs_renew(text, text),
    @extschema@.alkblobs_pins_held(text, text, bytea[]),
    @extschema@.alkblobs_unpin_all(text, text),
    @extschema@.alkblobs_unpin_many(text, text, bytea[]),
    @extschema@.alkblobs_lo_create(text),
    @extschema@.alkblobs_lo_write(oid, bigint, bytea),
    @extschema@.alkblobs_lo_commit(text, bytea, oid, text, bytea),
    @extschema@.alkblobs_lo_put_outboard(text, bytea, bytea)
  TO alkblobs_writer;
GRANT EXECUTE ON FUNCTION
    @extschema@.alkblobs_stage(text, bytea[]),
    @extschema@.alkblobs_tier_listed(text, timestamptz),
    @extschema@.alkblobs_claim_local(text, integer),
    @extschema@.alkblobs_local_deleting(text, bytea[]),
    @extschema@.alkblobs_local_deleting_generations(text, bytea[]),
    @extschema@.alkblobs_local_deleted(text, bytea[]),
    @extschema@.alkblobs_sweep(text, boolean, integer, boolean, integer),
    @extschema@.alkblobs_sweep_lease(text, text, interval),
    @extschema@.alkblobs_sweep_lease_end(text, text),
    @extschema@.alkblobs_delete(text, bytea[]),
    @extschema@.alkblobs_single_stage(text, bytea[], bigint),
    @extschema@.alkblobs_single_seal(text, text, bigint),
    @extschema@.alkblobs_lo_reap(text, integer),
    @extschema@.alkblobs_verify_finished(text, timestamptz, boolean, bigint, bigint, bigint, bigint, bigint)
  TO alkblobs_sweeper;
GRANT EXECUTE ON PROCEDURE @extschema@.alkblobs_sweep_all(text, integer), @extschema@.alkblobs_cron_sweep(text),
    @extschema@.alkblobs_audit(text, integer) TO alkblobs_sweeper;
GRANT EXECUTE ON FUNCTION @extschema@.alkblobs_request_audit(text) TO alkblobs_sweeper;
GRANT EXECUTE ON FUNCTION
    @extschema@.alkblobs_cron_claim(text),
    @extschema@.alkblobs_cron_step(text, boolean)
  TO alkblobs_sweeper;
GRANT EXECUTE ON FUNCTION
    @extschema@.alkblobs_create_pool(text, interval, interval, text, bigint, boolean, interval, interval, interval, interval, text, text, interval),
    @extschema@.alkblobs_alter_pool(text, interval, interval, bigint, interval, interval, interval, interval, text, interval),
    @extschema@.alkblobs_register_liveness(text, regclass, boolean),
    @extschema@.alkblobs_unregister_liveness(text, regclass),
    @extschema@.alkblobs_grant_pool(text, regrole, text),
    @extschema@.alkblobs_revoke_pool(text, regrole, text),
    @extschema@.alkblobs_revoke_pool(text, name, text),
    @extschema@.alkblobs_schedule_cron(text, interval),
    @extschema@.alkblobs_unschedule_cron(text)
  TO alkblobs_admin;
-- Registration runs as the caller (it creates the guard trigger on the
-- caller's table), so admins reach exactly these seven internals, in a
-- schema of their own (see bootstrap.sql: no USAGE on schema alkblobs).
GRANT USAGE ON SCHEMA alkblobs_registration TO alkblobs_admin;
-- (The extension's own checks name the guard function.)
GRANT USAGE ON SCHEMA alkblobs_registration TO alkblobs_owner;
GRANT EXECUTE ON FUNCTION
    alkblobs_registration.liveness_guard(),
    alkblobs_registration.liveness_truncated(),
    alkblobs_registration.install_guard(regclass),
    alkblobs_registration.lock_pool_for_admin(text),
    alkblobs_registration.require_read_committed(text),
    alkblobs_registration.add_source(text, regclass, boolean),
    alkblobs_registration.remove_source(text, regclass)
  TO alkblobs_admin;

-- A server that does not preload the library (every server until its
-- operator changes postgresql.conf) runs everything but the sweep
-- scheduler: say so once, at CREATE EXTENSION (and ALTER EXTENSION UPDATE).
-- A WARNING, because PostgreSQL raises client_min_messages to WARNING
-- while it runs an extension's script: a NOTICE would never be seen.
DO $$
BEGIN
    IF @extschema@.alkblobs_flavour() = 'library' AND NOT alkblobs.scheduler_preloaded() THEN
        RAISE WARNING 'alkblobs: scheduled sweeps are off on this server (the alkblobs library is not in shared_preload_libraries); everything else works'
            USING HINT = 'Sweep from a node or with CALL alkblobs_sweep_all(pool) (SELECT alkblobs_schedule_cron(pool) schedules it with pg_cron), or add alkblobs to shared_preload_libraries and this database to alkblobs.scheduler_databases and restart (docs/operations.md, "Scheduled sweeps").';
    END IF;
END $$;
