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
-- False (the pool is skipped this time) if its row stays locked.
CREATE FUNCTION alkblobs.scheduler_claim(p integer) RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    INSERT INTO alkblobs.schedule AS s (pool, last_scheduled) VALUES (p, clock_timestamp())
    ON CONFLICT (pool) DO UPDATE SET last_scheduled = excluded.last_scheduled;
    RETURN true;
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
    ELSIF r.remaining > 0 AND r.executed > 0 THEN
        RETURN false;
    END IF;
    RETURN NULL;
END $$;
