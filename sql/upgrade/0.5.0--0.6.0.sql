-- alkblobs 0.5.0 -> 0.6.0: fleet GC that runs itself (issue 12).
--
-- What an existing install receives:
-- * pools gain sweep_every (NULL: manual, the default), history_keep
--   (14 days), warn_after and critical_after (NULL: derived); both
--   alkblobs_create_pool and alkblobs_alter_pool take them;
-- * the sweep scheduler: a background worker per database named in
--   alkblobs.scheduler_databases, when the library is in
--   shared_preload_libraries (alkblobs.scheduled_sweep,
--   alkblobs.scheduler_due);
-- * the sweep history: every alkblobs_sweep call leaves a row in
--   alkblobs.sweeps (view alkblobs_sweeps), old rows deleted by later
--   sweeps of the pool; alkblobs_sweep is now a wrapper around
--   alkblobs.sweep_core, the 0.5.0 sweep unchanged;
-- * alkblobs_health: one row per pool with a status (ok / warn /
--   critical) and its reasons, from alkblobs.sweep_state (last completed
--   sweep; existing pools are tracked from the upgrade on) and
--   alkblobs.schedule (the scheduler's claims).

-- Functions whose argument list changed.
DROP FUNCTION @extschema@.alkblobs_create_pool(text, interval, interval, text, bigint, boolean);
DROP FUNCTION @extschema@.alkblobs_alter_pool(text, interval, interval, bigint);

-- Schema delta.
ALTER TABLE alkblobs.pools
    ADD COLUMN sweep_every interval,
    ADD COLUMN history_keep interval NOT NULL DEFAULT '14 days',
    ADD COLUMN warn_after interval,
    ADD COLUMN critical_after interval;

CREATE TABLE alkblobs.sweeps (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    pool             integer NOT NULL,
    role             name NOT NULL,
    application_name text,
    scheduled        boolean NOT NULL,
    dry_run          boolean NOT NULL,
    started          timestamptz NOT NULL,
    finished         timestamptz NOT NULL,
    examined bigint, live bigint, pinned bigint, staged bigint, executed bigint,
    deleted bigint, kept bigint, bytes_freed bigint, pins_reaped bigint, remaining bigint,
    local_due bigint, skipped bigint, uploads_reaped bigint, mark_done boolean,
    aborted          text,
    error            text
);
CREATE INDEX sweeps_by_pool ON alkblobs.sweeps (pool, started);
-- Per-pool sweep bookkeeping alkblobs_health reads in O(1), independent of
-- the history's retention: when a sweep last completed, and since when the
-- pool is tracked (its creation, or the upgrade to 0.6.0).
CREATE TABLE alkblobs.sweep_state (
    pool           integer PRIMARY KEY,
    tracked_since  timestamptz NOT NULL DEFAULT clock_timestamp(),
    last_completed timestamptz
);
-- When the scheduler last started a run of each pool (claimed in its own
-- transaction before the run, so a run that takes its worker down does not
-- make the pool first in line again at once). Only the database's one
-- worker writes it: a claim never waits.
CREATE TABLE alkblobs.schedule (
    pool           integer PRIMARY KEY,
    last_scheduled timestamptz NOT NULL
);
-- Existing pools are tracked from the upgrade on (their health does not
-- count the time before it as time without a sweep).
INSERT INTO alkblobs.sweep_state (pool) SELECT p.id FROM alkblobs.pools p;
REVOKE ALL ON alkblobs.sweeps, alkblobs.sweep_state, alkblobs.schedule FROM PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('alkblobs.sweeps', '');
SELECT pg_catalog.pg_extension_config_dump('alkblobs.sweeps_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('alkblobs.sweep_state', '');
SELECT pg_catalog.pg_extension_config_dump('alkblobs.schedule', '');
