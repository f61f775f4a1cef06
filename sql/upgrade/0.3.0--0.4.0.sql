-- alkblobs 0.3.0 -> 0.4.0: the audit follow-ups of issue 8.
--
-- What an existing install receives:
-- * every SECURITY INVOKER function and procedure and every view is owned
--   by the extension's owner (a superuser) instead of alkblobs_owner;
-- * registered liveness tables are re-validated at every use against user
--   code in indexes, constraints, partition keys and statistics, locked by
--   OID IN SHARE UPDATE EXCLUSIVE MODE while a sweep relies on them, and
--   read through a view alkblobs.src_<oid> bound to their OID (created at
--   first use; from then on DROP TABLE of a registered table needs CASCADE
--   or unregistering first); their guard trigger is ENABLE ALWAYS (below);
-- * every registration is marked for a check of its rows at the next sweep
--   (rows written while a guard was disabled abort that pool's sweeps until
--   they are deleted or their content put) — except in local-tier pools,
--   where the keys the rows name and no entry holds are recorded as
--   published files, which is what 0.3.0 took them to be;
-- * the local tier's files are recorded in alkblobs.files (by
--   alkblobs_pin_new, published by alkblobs_local_published), and a
--   liveness write for a key that is neither an entry nor a published file
--   fails with AB002. Keys pinned or staged on the local tier at the upgrade
--   are recorded as published files too. The `collected` table is gone;
-- * alkblobs_create_pool / alkblobs_alter_pool take max_object_bytes;
-- * pools have a mode: 'fleet' (every existing pool) or 'single' (one store
--   instance owns and sweeps it: alkblobs_create_pool(…, single_instance =>
--   true)), with the engine functions alkblobs_list, alkblobs_put_many,
--   alkblobs_delete and the single-instance arbiter's tables.

-- Functions whose argument list or result changed, or that are gone.
DROP FUNCTION alkblobs.check_sources(integer);
DROP FUNCTION alkblobs.bucket_lock(integer, bytea);
DROP FUNCTION @extschema@.alkblobs_create_pool(text, interval, interval, text);
DROP FUNCTION @extschema@.alkblobs_alter_pool(text, interval, interval);

-- New Rust functions (pg_ext/src/lib.rs), as pgrx declares them.
CREATE FUNCTION alkblobs."lock_for_sweep"("rel" oid) RETURNS void
STRICT LANGUAGE c AS 'MODULE_PATHNAME', 'lock_for_sweep_wrapper';

-- Schema delta.
DROP TABLE alkblobs.collected;
CREATE TABLE alkblobs.files (
    pool         integer NOT NULL REFERENCES alkblobs.pools (id),
    key          bytea NOT NULL CONSTRAINT key_is_32_bytes CHECK (length(key) = 32),
    published    boolean NOT NULL DEFAULT false,
    recorded_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (pool, key)
);
REVOKE ALL ON alkblobs.files FROM PUBLIC;
INSERT INTO alkblobs.files (pool, key, published)
SELECT s.pool, s.key, true FROM alkblobs.staged s WHERE s.tier = 'local'
UNION
SELECT pn.pool, pn.key, true FROM alkblobs.pins pn JOIN alkblobs.pools p ON p.id = pn.pool
 WHERE p.large_tier = 'local' AND pn.expires_at > clock_timestamp()
   AND NOT EXISTS (SELECT 1 FROM alkblobs.entries e WHERE e.pool = pn.pool AND e.key = pn.key)
ON CONFLICT DO NOTHING;

ALTER TABLE alkblobs.pools
    ADD COLUMN mode text NOT NULL DEFAULT 'fleet' CONSTRAINT mode_known CHECK (mode IN ('fleet', 'single'));
CREATE TABLE alkblobs.single_staged (
    pool             integer NOT NULL REFERENCES alkblobs.pools (id),
    key              bytea NOT NULL CONSTRAINT key_is_32_bytes CHECK (length(key) = 32),
    staged_at_ms     bigint NOT NULL,
    visible_after_ms bigint,
    PRIMARY KEY (pool, key)
);
CREATE TABLE alkblobs.single_roots (
    pool integer NOT NULL REFERENCES alkblobs.pools (id),
    key  bytea NOT NULL CONSTRAINT key_is_32_bytes CHECK (length(key) = 32),
    PRIMARY KEY (pool, key)
);
REVOKE ALL ON alkblobs.single_staged, alkblobs.single_roots FROM PUBLIC;

ALTER TABLE alkblobs.liveness
    ADD COLUMN pending text CONSTRAINT pending_known CHECK (pending IN ('recheck', 'seed'));
UPDATE alkblobs.liveness l
   SET pending = CASE WHEN p.large_tier = 'local' THEN 'seed' ELSE 'recheck' END
  FROM alkblobs.pools p WHERE p.id = l.pool AND NOT l.forward_refs;

-- A registration names its table by regclass (pg_dump writes a name).
ALTER TABLE alkblobs.liveness ALTER COLUMN relid TYPE regclass;

-- pg_dump dumps the pools (new in 0.4.0).
-- (One call per statement: each updates the extension's row.)
SELECT pg_catalog.pg_extension_config_dump('alkblobs.pools', '');
SELECT pg_catalog.pg_extension_config_dump('alkblobs.pools_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('alkblobs.pool_grants', '');
SELECT pg_catalog.pg_extension_config_dump('alkblobs.entries', '');
SELECT pg_catalog.pg_extension_config_dump('alkblobs.pins', '');
SELECT pg_catalog.pg_extension_config_dump('alkblobs.liveness', '');
SELECT pg_catalog.pg_extension_config_dump('alkblobs.marks', '');
SELECT pg_catalog.pg_extension_config_dump('alkblobs.marks_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('alkblobs.staged', '');
SELECT pg_catalog.pg_extension_config_dump('alkblobs.uploads', '');
SELECT pg_catalog.pg_extension_config_dump('alkblobs.files', '');
SELECT pg_catalog.pg_extension_config_dump('alkblobs.single_staged', '');
SELECT pg_catalog.pg_extension_config_dump('alkblobs.single_roots', '');

-- Registered tables: the guard fires ALWAYS.
DO $$
DECLARE
    r record;
BEGIN
    FOR r IN SELECT DISTINCT l.relid FROM alkblobs.liveness l
               JOIN pg_catalog.pg_trigger t ON t.tgrelid = l.relid AND t.tgname = 'alkblobs_liveness_guard'
              ORDER BY l.relid LOOP
        EXECUTE format('ALTER TABLE %s ENABLE ALWAYS TRIGGER alkblobs_liveness_guard', r.relid::regclass);
    END LOOP;
END $$;
