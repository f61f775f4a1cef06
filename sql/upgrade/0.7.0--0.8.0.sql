-- alkblobs 0.7.0 -> 0.8.0: running where PostgreSQL users are.
--
-- What an existing install receives:
-- * CREATE EXTENSION works on a server that does not preload the library
--   (the library defines its postmaster-only setting only while
--   preloading); the sweep scheduler is then off, said by a WARNING at
--   CREATE EXTENSION / ALTER EXTENSION UPDATE and by alkblobs_health's
--   reasons (alkblobs.scheduler_preloaded, alkblobs.scheduler_off_reason);
-- * the role columns pg_dump writes are role names instead of OIDs, so a
--   restore into another cluster hands every pool, grant and pin to the
--   same roles (by name) and not to whichever roles got those OIDs there:
--   pools.owner, pool_grants.grantee, pins.role, liveness.registered_by
--   and uploads.role are plain names: a restore without one of the roles
--   loads every row (a missing role costs only its own access: no pool,
--   grant, pin or registration of another is lost with it);
-- * an upload row restored from another cluster (its transaction id is
--   that cluster's) counts as abandoned instead of making alkblobs_sweep,
--   alkblobs_usage and alkblobs_health fail with 22023
--   (alkblobs.upload_running);
-- * alkblobs_sweep_all qualifies every operator, so a schema before
--   pg_catalog on its caller's search_path cannot redirect it;
-- * alkblobs_put_many takes every row lock in key order: a batch whose
--   present key was deleted under it is put again from the start instead
--   of re-putting that key after the others (which could deadlock with a
--   concurrent batch), and its pin rows are upserted in key order.
-- * a fleet pool's first use after a server start or a restore gives every
--   pin a fresh TTL and every mark a fresh window (alkblobs.adopt), so the
--   first sweep deletes nothing that was protected when the server stopped
--   or the dump was taken, however long that took.
-- * a registered table whose guard triggers changed since its rows were
--   last known guarded (disabled, dropped, re-created, a partition
--   attached) has its rows checked at the next use, as after an ALTER
--   TABLE (liveness.guard_seen; what the SQL-only flavour, which has no
--   event triggers, relies on);
-- * pg_cron schedules: alkblobs_schedule_cron / alkblobs_unschedule_cron,
--   the procedure alkblobs_cron_sweep they schedule, and alkblobs_flavour;
-- * large content on S3: a pool's large_tier may be 's3', its bucket and
--   prefix in pools.large_location (alkblobs_create_pool's new
--   large_location argument, alkblobs_pools' new column); an s3 pool's
--   puts, pins, liveness and claims are the shared local tier's;
-- * a claim that hands a tombstone out again fences its key
--   (alkblobs.file_fences), and the key recorded afresh names another s3
--   object (files.generation, returned by alkblobs_pin_new, read by the
--   claim's phase 2 from alkblobs_local_deleting_generations): a stopped
--   claimer resuming cannot delete a re-put object;
-- * the 0.3.0 -> 0.4.0 migration of local-tier registrations (record the
--   files their rows name) runs here, once, for any not yet swept since,
--   and no longer in every sweep.
-- * a fleet pool's sweeps review a queue of the keys events may have left
--   unprotected instead of marking the whole pool (pools.collector
--   'queue'; 'mark' keeps the old collector), with the full mark as an
--   audit (audit_every, alkblobs_audit); every existing pool starts with
--   one audit, as its queue starts empty; registered tables get a guard
--   that also sees deletions (and a TRUNCATE trigger) when they are
--   registered again, which a 'queue' pool's sweep asks for.
-- * a pg-lo entry keeps its blob's BLAKE3 outboard (entries.outboard,
--   given to alkblobs_lo_commit's new outboard argument, read by window
--   with alkblobs_lo_outboard, mended with alkblobs_lo_put_outboard), so
--   a client verifies any range without reading the rest; entries stored
--   before have none until `alkblobs verify --repair-outboards`;
--   alkblobs_usage counts their bytes (a new last column,
--   lo_outboard_bytes).

-- New Rust functions (pg_ext/src/lib.rs), as pgrx declares them.
CREATE FUNCTION alkblobs."scheduler_preloaded"() RETURNS bool
STABLE PARALLEL SAFE LANGUAGE c AS 'MODULE_PATHNAME', 'scheduler_preloaded_wrapper';

-- Role columns become role names. The views that read them are dropped here
-- and created again below (with their grants, by the policy).
DROP VIEW @extschema@.alkblobs_pools;
DROP VIEW @extschema@.alkblobs_pool_grants;
DROP VIEW @extschema@.alkblobs_pins;
-- The OID of a role that no longer exists becomes a name no role can take
-- ('pg_' names are reserved): pg_get_userbyid's 'unknown (OID=n)' is a
-- name anyone with CREATEROLE could create, and be the owner, grantee or
-- pin holder the dropped role was.
ALTER TABLE alkblobs.pools ADD COLUMN owner_oid oid;
UPDATE alkblobs.pools p SET owner_oid = p.owner WHERE EXISTS (SELECT 1 FROM pg_catalog.pg_roles r WHERE r.oid = p.owner);
ALTER TABLE alkblobs.pool_grants ADD COLUMN grantee_oid oid;
UPDATE alkblobs.pool_grants g SET grantee_oid = g.grantee WHERE EXISTS (SELECT 1 FROM pg_catalog.pg_roles r WHERE r.oid = g.grantee);
ALTER TABLE alkblobs.pools ALTER COLUMN owner TYPE name
    USING CASE WHEN owner_oid IS NULL THEN ('pg_dropped_role_' || owner::text)::name ELSE pg_catalog.pg_get_userbyid(owner) END;
ALTER TABLE alkblobs.pool_grants ALTER COLUMN grantee TYPE name
    USING CASE WHEN grantee_oid IS NULL THEN ('pg_dropped_role_' || grantee::text)::name ELSE pg_catalog.pg_get_userbyid(grantee) END;
ALTER TABLE alkblobs.pins ALTER COLUMN role TYPE name
    USING CASE WHEN pg_catalog.pg_get_userbyid(role) = 'unknown (OID=' || role::text || ')'
               THEN ('pg_dropped_role_' || role::text)::name ELSE pg_catalog.pg_get_userbyid(role) END;
ALTER TABLE alkblobs.liveness ALTER COLUMN registered_by TYPE name
    USING CASE WHEN pg_catalog.pg_get_userbyid(registered_by) = 'unknown (OID=' || registered_by::text || ')'
               THEN ('pg_dropped_role_' || registered_by::text)::name ELSE pg_catalog.pg_get_userbyid(registered_by) END;
ALTER TABLE alkblobs.uploads ALTER COLUMN role TYPE name
    USING CASE WHEN pg_catalog.pg_get_userbyid(role) = 'unknown (OID=' || role::text || ')'
               THEN ('pg_dropped_role_' || role::text)::name ELSE pg_catalog.pg_get_userbyid(role) END;

-- A pool's first use after a server start or a restore gives its pins a
-- fresh TTL and its marks a fresh window (alkblobs.adopt): the
-- installation's incarnation (never dumped) and what each pool last ran
-- under.
CREATE TABLE alkblobs.incarnation (
    id         uuid NOT NULL DEFAULT gen_random_uuid(),
    created_at timestamptz NOT NULL DEFAULT now(),
    one        boolean PRIMARY KEY DEFAULT true CONSTRAINT one_row CHECK (one),
    -- This table's own OID when the row was made. A logical restore keeps
    -- the row where it copies it (the SQL-only flavour's tables are
    -- ordinary ones, which pg_dump dumps) but never the OID, so a row
    -- whose relid is not the table's is a restored one (alkblobs.incarnation_id).
    relid      oid NOT NULL
);
INSERT INTO alkblobs.incarnation (relid) VALUES ('alkblobs.incarnation'::regclass);
-- Left NULL: the first sweep after the upgrade adopts every pool (the
-- package upgrade before it restarted the server, or will).
ALTER TABLE alkblobs.pools ADD COLUMN seen_incarnation uuid, ADD COLUMN seen_start timestamptz;

-- The guard state last known to hold (NULL: the next use checks the rows),
-- and what started a scheduled run.
ALTER TABLE alkblobs.liveness ADD COLUMN guard_seen text;
ALTER TABLE alkblobs.schedule ADD COLUMN runner text NOT NULL DEFAULT 'worker'
    CONSTRAINT runner_known CHECK (runner IN ('worker', 'pg_cron'));

-- The last registrations 0.4.0 marked 'seed' (local-tier pools upgraded
-- from 0.3.0 and not swept since, which took a key named by a liveness
-- row and held by no entry to be a published file): record those files
-- now. The sweep no longer does (it was migration code on its hot path).
-- Their rows are checked at the next use (guard_seen is new, so unknown).
-- The table is read directly (its view, alkblobs.src_<oid>, is made at
-- the first use): an ordinary or partitioned table with a bytea key and
-- no row-level security, as registration validated, whose read runs
-- nothing of its owner's.
DO $$
DECLARE
    r record;
BEGIN
    FOR r IN SELECT l.pool, l.relid FROM alkblobs.liveness l
               JOIN alkblobs.pools p ON p.id = l.pool
               JOIN pg_catalog.pg_class c ON c.oid = l.relid
              WHERE l.pending = 'seed' AND p.large_tier = 'local'
                AND c.relkind IN ('r', 'p') AND NOT c.relrowsecurity
                AND EXISTS (SELECT 1 FROM pg_catalog.pg_attribute a
                             WHERE a.attrelid = l.relid AND a.attname = 'key'
                               AND a.atttypid = 'pg_catalog.bytea'::pg_catalog.regtype AND NOT a.attisdropped) LOOP
        EXECUTE pg_catalog.format($q$
            INSERT INTO alkblobs.files (pool, key, published)
            SELECT DISTINCT $1, lv.key, true FROM %s lv
             WHERE lv.key IS NOT NULL AND pg_catalog.length(lv.key) OPERATOR(pg_catalog.=) 32
               AND NOT EXISTS (SELECT 1 FROM alkblobs.entries e
                                WHERE e.pool OPERATOR(pg_catalog.=) $1 AND e.key OPERATOR(pg_catalog.=) lv.key)
            ON CONFLICT ON CONSTRAINT files_pkey DO UPDATE SET published = true$q$, r.relid::pg_catalog.regclass)
          USING r.pool;
    END LOOP;
    -- Seeded, or (not such a table any more) left to the row check, which
    -- refuses the sweep while a row names nothing held: closed.
    UPDATE alkblobs.liveness l SET pending = 'recheck' WHERE l.pending = 'seed';
END $$;
DROP FUNCTION alkblobs.seed_files(alkblobs.pools, oid);

-- Large content on S3: a pool's large tier may be 's3', with its bucket and
-- prefix (alkblobs_create_pool's new large_location argument).
ALTER TABLE alkblobs.pools DROP CONSTRAINT large_tier_known;
ALTER TABLE alkblobs.pools
    ADD CONSTRAINT large_tier_known CHECK (large_tier IN ('pg-lo', 'local', 's3', 'none')),
    ADD COLUMN large_location text CONSTRAINT location_iff_s3 CHECK ((large_tier = 's3') = (large_location IS NOT NULL))
                   CONSTRAINT location_format CHECK (large_location ~ '^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/[A-Za-z0-9!_.*''()-]+)*$' AND large_location !~ '/\.\.?(/|$)')
                   CONSTRAINT location_unique UNIQUE;
DROP FUNCTION @extschema@.alkblobs_create_pool(text, interval, interval, text, bigint, boolean, interval, interval, interval, interval);

-- A stopped claimer's late delete cannot name a re-put object: a file
-- record's generation (the s3 object it names), and the fences a re-handed
-- tombstone leaves (alkblobs_pin_new now returns the generation; the
-- claim's phase 2 reads it from alkblobs_local_deleting_generations).
ALTER TABLE alkblobs.files
    ADD COLUMN generation bigint NOT NULL DEFAULT 0 CONSTRAINT generation_not_negative CHECK (generation >= 0);
CREATE TABLE alkblobs.file_fences (
    pool        integer NOT NULL REFERENCES alkblobs.pools (id),
    key         bytea NOT NULL CONSTRAINT key_is_32_bytes CHECK (length(key) = 32),
    generation  bigint NOT NULL CONSTRAINT generation_positive CHECK (generation > 0),
    fenced_at   timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (pool, key)
);
REVOKE ALL ON alkblobs.file_fences FROM PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('alkblobs.file_fences', '');
DROP FUNCTION @extschema@.alkblobs_pin_new(text, bytea, text);

-- The review queue: a fleet pool's sweeps review the keys events queued
-- (pools.collector), and run the full mark as an audit. An existing pool's
-- queue starts empty, so its first sweep audits it (and says why).
ALTER TABLE alkblobs.pools
    ADD COLUMN collector text NOT NULL DEFAULT 'queue' CONSTRAINT collector_known CHECK (collector IN ('queue', 'mark')),
    ADD COLUMN audit_every interval CONSTRAINT audit_every_positive CHECK (audit_every > interval '0'),
    ADD COLUMN audit_running text,
    ADD COLUMN last_audit timestamptz;
-- Existing pools audit daily too, as new ones do (alkblobs_create_pool).
UPDATE alkblobs.pools p SET audit_every = interval '1 day' WHERE p.mode = 'fleet';
-- A shared tier is listed after an audit, not in every sweep (every pool
-- starts with one listing due).
ALTER TABLE alkblobs.pools ADD COLUMN tier_listing_due timestamptz;
UPDATE alkblobs.pools p SET tier_listing_due = clock_timestamp() WHERE p.large_tier IN ('local', 's3') AND p.mode = 'fleet';
CREATE TABLE alkblobs.review_queue (
    pool      integer NOT NULL,
    id        bigint GENERATED ALWAYS AS IDENTITY,
    key       bytea NOT NULL CONSTRAINT key_is_32_bytes CHECK (length(key) = 32),
    queued_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (pool, id)
);
CREATE INDEX review_queue_by_key ON alkblobs.review_queue (pool, key);
REVOKE ALL ON alkblobs.review_queue FROM PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('alkblobs.review_queue', '');
SELECT pg_catalog.pg_extension_config_dump('alkblobs.review_queue_id_seq', '');
CREATE TABLE alkblobs.released (
    relid       regclass NOT NULL,
    id          bigint GENERATED ALWAYS AS IDENTITY,
    key         bytea NOT NULL,
    released_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (relid, id)
);
REVOKE ALL ON alkblobs.released FROM PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('alkblobs.released', '');
SELECT pg_catalog.pg_extension_config_dump('alkblobs.released_id_seq', '');
CREATE TABLE alkblobs.audit_requests (
    pool         integer NOT NULL,
    id           bigint GENERATED ALWAYS AS IDENTITY,
    reason       text NOT NULL,
    requested_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (pool, id)
);
REVOKE ALL ON alkblobs.audit_requests FROM PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('alkblobs.audit_requests', '');
SELECT pg_catalog.pg_extension_config_dump('alkblobs.audit_requests_id_seq', '');
INSERT INTO alkblobs.audit_requests (pool, reason)
SELECT p.id, 'the upgrade to 0.8.0 (the review queue starts empty)' FROM alkblobs.pools p WHERE p.mode = 'fleet';
ALTER TABLE alkblobs.sweeps ADD COLUMN reviewed bigint, ADD COLUMN audit text, ADD COLUMN missed bigint;
DROP FUNCTION @extschema@.alkblobs_alter_pool(text, interval, interval, bigint, interval, interval, interval, interval);
DROP FUNCTION @extschema@.alkblobs_sweep(text, boolean, integer, boolean, integer);
DROP FUNCTION alkblobs.sweep_core(text, boolean, integer, boolean, integer);
-- NOT VALID, then VALIDATE: the check scans entries without the exclusive
-- lock ADD CONSTRAINT would hold for the scan (every row is NULL anyway).
ALTER TABLE alkblobs.entries ADD COLUMN outboard bytea,
    ADD CONSTRAINT outboard_of_lo CHECK (outboard IS NULL OR tier = 'lo') NOT VALID;
ALTER TABLE alkblobs.entries VALIDATE CONSTRAINT outboard_of_lo;
ALTER TABLE alkblobs.entries ALTER COLUMN outboard SET STORAGE EXTERNAL;
-- One entry per large object (see bootstrap.sql). Two entries can share
-- one only after an object was lost and its OID handed out again: that
-- must be looked at by a person, not resolved by the upgrade.
DO $$
DECLARE
    dup oid;
BEGIN
    SELECT e.loid INTO dup FROM alkblobs.entries e WHERE e.loid IS NOT NULL GROUP BY e.loid HAVING count(*) > 1 LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'alkblobs: several entries name large object %: at most one of them holds its bytes', dup
            USING ERRCODE = 'unique_violation',
                  HINT = 'List them with SELECT loid, array_agg(key) FROM alkblobs.entries WHERE loid IS NOT NULL GROUP BY loid HAVING count(*) > 1; run alkblobs verify, put the lost keys again, then delete the entries whose content does not hash to their key.';
    END IF;
END $$;
CREATE UNIQUE INDEX entries_loid ON alkblobs.entries (loid) WHERE loid IS NOT NULL;
DROP FUNCTION @extschema@.alkblobs_lo_commit(text, bytea, oid, text);
-- The last verify of each pool (alkblobs_verify_finished), which
-- alkblobs_health reads (three columns appended to it).
CREATE TABLE alkblobs.verifies (
    pool          integer CONSTRAINT verifies_pkey PRIMARY KEY,
    role          name NOT NULL,
    started       timestamptz NOT NULL,
    finished      timestamptz NOT NULL,
    whole         boolean NOT NULL,
    checked       bigint NOT NULL,
    bytes         bigint NOT NULL,
    missing       bigint NOT NULL,
    corrupt       bigint NOT NULL,
    unrecorded    bigint NOT NULL,
    -- Since when content is missing or corrupt (the first run that found
    -- it), and when the last run that found any finished: only a whole
    -- run that started after that clears both.
    damaged_since timestamptz,
    last_damage   timestamptz
);
REVOKE ALL ON alkblobs.verifies FROM PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('alkblobs.verifies', '');
DROP VIEW @extschema@.alkblobs_health;
DROP FUNCTION alkblobs.health_rows();
