-- alkblobs SQL API, 91-scheduler.sql: Scheduling (the background worker's side, pg_ext/src/scheduler.rs).
-- (sql/api/*.sql load in file-name order after bootstrap.sql and the Rust
-- functions; docs/design.md, "Layout". The rules of the whole API are in 10-helpers.sql's header.)

-- Scheduling (the extension's background worker, pg_ext/src/scheduler.rs) -----

-- The fleet pools of this database whose schedule is due: sweep_every has
-- passed since the scheduler last started a run of them; the longest
-- waiting first.
-- (Nothing, with a WARNING, when the tables stay locked, e.g. by an
-- upgrade, for the worker's lock_timeout: the next look retries.)
CREATE FUNCTION alkblobs.scheduler_due() RETURNS SETOF integer
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RETURN QUERY
    SELECT p.id FROM alkblobs.pools p LEFT JOIN alkblobs.schedule s ON s.pool = p.id
     WHERE p.sweep_every IS NOT NULL AND p.mode = 'fleet'
       AND coalesce(s.last_scheduled, '-infinity'::timestamptz) + p.sweep_every <= clock_timestamp()
     ORDER BY s.last_scheduled NULLS FIRST, p.id;
EXCEPTION WHEN lock_not_available THEN
    RAISE WARNING 'alkblobs scheduler: no pool scheduled this time: %', SQLERRM
        USING HINT = 'The pools table stayed locked (an upgrade, a VACUUM FULL?) for lock_timeout; the next look retries.';
    RETURN;
END $$;

-- The start of a scheduled run of pool p, committed before its first call.
-- False (the pool is skipped this time) if its row stays locked, or if
-- another runner (a pg_cron job of the pool, alkblobs_cron_claim) started
-- a run since scheduler_due looked: the same one-statement claim as
-- alkblobs_cron_claim's, so two runners never both run one period.
CREATE FUNCTION alkblobs.scheduler_claim(p integer) RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    INSERT INTO alkblobs.schedule AS s (pool, last_scheduled, runner) VALUES (p, clock_timestamp(), 'worker')
    ON CONFLICT ON CONSTRAINT schedule_pkey DO UPDATE SET last_scheduled = excluded.last_scheduled, runner = 'worker'
     WHERE s.last_scheduled + (SELECT x.sweep_every FROM alkblobs.pools x WHERE x.id = p) <= clock_timestamp();
    RETURN FOUND;
EXCEPTION WHEN lock_not_available THEN
    RAISE WARNING 'alkblobs scheduler: pool % skipped: its schedule row stayed locked', p;
    RETURN false;
END $$;

-- One scheduled sweep call of pool p, in the worker's transaction. The
-- sweep's errors are caught (its subtransaction rolled back), recorded in
-- the history with their SQLSTATE and logged as a WARNING: the pool is
-- retried after sweep_every and the worker goes on. Returns the `mark`
-- argument of the next call of this run, or NULL when the run is over (the
-- same rule as alkblobs_sweep_all: go on while the mark is open, or while
-- due rows are left and the call executed some).
CREATE FUNCTION alkblobs.scheduled_sweep(p integer, marking boolean) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    pl alkblobs.pools;
    t0 timestamptz := clock_timestamp();
    r record;
    err text;
BEGIN
    BEGIN
        SELECT * INTO pl FROM alkblobs.pools x WHERE x.id = p;
    EXCEPTION WHEN lock_not_available THEN
        RAISE WARNING 'alkblobs scheduler: pool % skipped: %', p, SQLERRM;
        RETURN NULL;
    END;
    IF NOT FOUND OR pl.sweep_every IS NULL OR pl.mode <> 'fleet' OR marking IS NULL THEN
        RETURN NULL;
    END IF;
    BEGIN
        SELECT * INTO r FROM alkblobs.sweep_core(pl.name, false, 1000, marking, 20000);
    EXCEPTION WHEN query_canceled OR OTHERS THEN
        err := SQLSTATE || ': ' || SQLERRM;
    END;
    BEGIN
        IF err IS NULL THEN
            PERFORM alkblobs.record_sweep(pl.id, t0, true, false, r, NULL);
        ELSE
            PERFORM alkblobs.record_sweep(pl.id, t0, true, false, NULL::record, err);
        END IF;
    EXCEPTION WHEN query_canceled OR OTHERS THEN
        -- Not even the failure can be recorded (a read-only database, a
        -- full disk): say so in the log and end the run.
        RAISE WARNING 'alkblobs scheduler: cannot record the sweep of pool "%" (%): %: %', pl.name,
                      coalesce('it failed: ' || err, 'it completed'), SQLSTATE, SQLERRM;
        RETURN NULL;
    END;
    IF err IS NOT NULL THEN
        RAISE WARNING 'alkblobs scheduler: the sweep of pool "%" failed: %', pl.name, err
            USING HINT = 'The scheduler retries it after sweep_every; alkblobs_health and alkblobs_sweeps show it.';
        RETURN NULL;
    END IF;
    IF r.aborted IS NOT NULL THEN
        RETURN NULL;
    END IF;
    IF r.deleted > 0 OR r.pins_reaped > 0 OR r.uploads_reaped > 0 THEN
        RAISE LOG 'alkblobs scheduler: pool "%": % deleted (% bytes freed), % pins reaped, % uploads reclaimed, % due left',
                  pl.name, r.deleted, r.bytes_freed, r.pins_reaped, r.uploads_reaped, r.remaining;
    END IF;
    IF marking AND NOT r.mark_done THEN
        RETURN true;
    ELSIF r.reviewed >= 20000 THEN
        -- A full batch of the review queue: more may be due.
        RETURN false;
    ELSIF r.remaining > 0 AND r.executed > 0 THEN
        RETURN false;
    END IF;
    RETURN NULL;
END $$;

-- Scheduling with pg_cron (servers without the background worker: the
-- SQL-only flavour, a library that is not preloaded) ---------------------
--
-- alkblobs_schedule_cron(pool) makes one pg_cron job per pool, owned by
-- its caller, that runs CALL alkblobs_cron_sweep(pool) every minute.
-- Each run claims the
-- pool only when its schedule is due, by the same rule and in the same
-- alkblobs.schedule row as the background worker (so the two never both
-- run one period), then makes the worker's bounded calls
-- (alkblobs.scheduled_sweep: the same history, errors recorded, the same
-- health).

-- Claims a scheduled run of `pool` for a pg_cron job: true, and the run
-- recorded as started, when sweep_every has passed since the last
-- scheduled run of either runner (one statement: two jobs never both
-- claim one period); false when it is not due, has no schedule or is not a
-- fleet pool.
CREATE FUNCTION @extschema@.alkblobs_cron_claim(pool text) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    pl alkblobs.pools := alkblobs.pool($1, 'sweep');
BEGIN
    IF pl.sweep_every IS NULL OR pl.mode <> 'fleet' THEN
        RETURN false;
    END IF;
    INSERT INTO alkblobs.schedule AS s (pool, last_scheduled, runner) VALUES (pl.id, clock_timestamp(), 'pg_cron')
    ON CONFLICT ON CONSTRAINT schedule_pkey DO UPDATE SET last_scheduled = excluded.last_scheduled, runner = 'pg_cron'
     WHERE s.last_scheduled + pl.sweep_every <= clock_timestamp();
    RETURN FOUND;
END $$;

-- One call of a claimed run (alkblobs.scheduled_sweep): the next call's
-- `marking`, or NULL when the run is over.
CREATE FUNCTION @extschema@.alkblobs_cron_step(pool text, marking boolean) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    pl alkblobs.pools := alkblobs.pool($1, 'sweep');
BEGIN
    RETURN alkblobs.scheduled_sweep(pl.id, $2);
END $$;

-- What a pg_cron job runs: a scheduled run of `pool` if it is due, one
-- bounded call per transaction. (No SET clause, so that it can COMMIT; it
-- runs as its caller under the caller's search_path, so every name is
-- qualified, like alkblobs_sweep_all.)
CREATE PROCEDURE @extschema@.alkblobs_cron_sweep(pool text)
LANGUAGE plpgsql AS $$
DECLARE
    marking boolean := true;
BEGIN
    IF $1 IS NULL THEN
        RAISE EXCEPTION 'pool must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF NOT @extschema@.alkblobs_cron_claim($1) THEN
        RETURN;
    END IF;
    COMMIT;
    LOOP
        marking := @extschema@.alkblobs_cron_step($1, marking);
        COMMIT;
        EXIT WHEN marking IS NULL;
    END LOOP;
END $$;

-- Schedules the sweeps of `pool` with pg_cron (job 'alkblobs sweeps of
-- <pool>'), in this database, as the
-- caller (a login role with sweep access, and USAGE on schema cron);
-- `every` first sets the pool's sweep_every (admin access), which the pool
-- must have. Returns the job's id (cron.job). Calling it again replaces
-- the job. The caller must stay able to log in and sweep the pool:
-- pg_cron runs the job as it.
CREATE FUNCTION @extschema@.alkblobs_schedule_cron(pool text, every interval DEFAULT NULL) RETURNS bigint
LANGUAGE plpgsql
-- (Not the alter's notice that nothing schedules the pool: this does.)
SET client_min_messages = warning
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    period interval;
    cadence text;
    cmd text;
    db text;
    job bigint;
BEGIN
    IF $1 IS NULL THEN
        RAISE EXCEPTION 'pool must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF pg_catalog.to_regnamespace('cron') IS NULL OR pg_catalog.to_regproc('cron.schedule_in_database') IS NULL THEN
        RAISE EXCEPTION 'pg_cron is not installed in this database'
            USING ERRCODE = 'feature_not_supported',
                  HINT = 'Add pg_cron to shared_preload_libraries (cron.database_name = this database) and CREATE EXTENSION pg_cron, or ask your provider to enable it.';
    END IF;
    IF $2 IS NOT NULL THEN
        PERFORM @extschema@.alkblobs_alter_pool($1, sweep_every => $2);
    END IF;
    SELECT p.sweep_every INTO period FROM @extschema@.alkblobs_pools p WHERE p.pool = $1 AND p.mode = 'fleet';
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no fleet pool "%" that you may read', $1 USING ERRCODE = 'undefined_object';
    ELSIF period IS NULL THEN
        RAISE EXCEPTION 'pool "%" has no sweep_every', $1 USING ERRCODE = 'invalid_parameter_value',
            HINT = 'Pass every => interval ''5 minutes'' (or set it with alkblobs_alter_pool).';
    END IF;
    -- Every minute (pg_cron 1.4, Debian 12's, has no finer schedule): a
    -- sweep_every under a minute is served once a minute.
    cadence := '* * * * *';
    -- cron.schedule_in_database puts the job in this database; pg_cron 1.4
    -- grants it to nobody but a superuser (managed services, to their admin
    -- role). Without it, cron.schedule puts it in pg_cron's own database
    -- (cron.database_name, which only a superuser may read): kept if that
    -- is this one.
    cmd := format('CALL %I.alkblobs_cron_sweep(%L)', '@extschema@', $1);
    -- A job of that name made before (by a restore too, whose job names the
    -- server it was dumped from: pg_cron keeps a job's host when it is
    -- scheduled again under its name) is replaced by one made here.
    PERFORM @extschema@.alkblobs_unschedule_cron($1);
    BEGIN
        EXECUTE 'SELECT cron.schedule_in_database($1, $2, $3, $4)' INTO job
          USING 'alkblobs sweeps of ' || $1, cadence, cmd, current_database();
    EXCEPTION WHEN insufficient_privilege THEN
        EXECUTE 'SELECT cron.schedule($1, $2, $3)' INTO job USING 'alkblobs sweeps of ' || $1, cadence, cmd;
        EXECUTE 'SELECT j.database FROM cron.job j WHERE j.jobid = $1' INTO db USING job;
        IF db IS DISTINCT FROM current_database() THEN
            EXECUTE 'SELECT cron.unschedule($1)' USING job;
            RAISE EXCEPTION 'pg_cron runs jobs in database "%", not "%", and you may not schedule jobs in another database', db, current_database()
                USING ERRCODE = 'insufficient_privilege',
                      HINT = 'Ask a superuser to GRANT EXECUTE ON FUNCTION cron.schedule_in_database(text, text, text, text, text, boolean) to you, or install alkblobs in pg_cron''s database.';
        END IF;
    END;
    RETURN job;
END $$;

-- Removes the caller's pg_cron job of `pool`; false if there was none.
CREATE FUNCTION @extschema@.alkblobs_unschedule_cron(pool text) RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    job bigint;
BEGIN
    IF $1 IS NULL THEN
        RAISE EXCEPTION 'pool must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF pg_catalog.to_regnamespace('cron') IS NULL THEN
        RETURN false;
    END IF;
    EXECUTE 'SELECT j.jobid FROM cron.job j WHERE j.jobname = $1 AND j.username = current_user' INTO job
      USING 'alkblobs sweeps of ' || $1;
    IF job IS NULL THEN
        RETURN false;
    END IF;
    EXECUTE 'SELECT cron.unschedule($1)' USING job;
    RETURN true;
END $$;

-- Who runs pool pl's schedule: 'pg_cron' while its pg_cron job keeps
-- starting runs (one started within max(2 × sweep_every, 2 minutes)),
-- else the database's scheduler state `sched` ('on', 'paused', 'off').
CREATE FUNCTION alkblobs.pool_scheduler(pl alkblobs.pools, sched text) RETURNS text
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp AS $$
    SELECT coalesce((SELECT 'pg_cron' FROM alkblobs.schedule s
                      WHERE s.pool = pl.id AND s.runner = 'pg_cron'
                        AND s.last_scheduled > clock_timestamp() - greatest(2 * pl.sweep_every, interval '2 minutes')),
                    sched)
$$;
