-- alkblobs SQL API, 92-health.sql: Health: alkblobs_health's rows.
-- (sql/api/*.sql load in file-name order after bootstrap.sql and the Rust
-- functions; docs/design.md, "Layout". The rules of the whole API are in 10-helpers.sql's header.)

-- Health ---------------------------------------------------------------------

-- The size of large object `o` (NULL if it is gone).
CREATE FUNCTION alkblobs.lo_size(o oid) RETURNS bigint
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    fd integer;
    n bigint;
BEGIN
    fd := pg_catalog.lo_open(o, 262144);  -- INV_READ
    n := pg_catalog.lo_lseek64(fd, 0, 2); -- SEEK_END
    PERFORM pg_catalog.lo_close(fd);
    RETURN n;
EXCEPTION WHEN OTHERS THEN
    RETURN NULL;  -- gone, or not readable: the count still stands
END $$;

-- One row per pool the caller may read: the alkblobs_health view.
-- Thresholds (docs/operations.md, "Health"): a pool is 'critical' when its
-- last completed sweep (or its creation, if it was never swept) is older
-- than critical_after, or a registered liveness table fails validation
-- (every sweep aborts); 'warn' when that age passes warn_after, the last
-- sweep attempt failed or aborted (a skip for a busy sweeper lock is not a
-- failure), or something a sweep should have removed is older than
-- warn_after: staged rows due that long ago, pins expired that long ago,
-- uploads abandoned that long ago, review-queue rows due that long ago;
-- or when an audit found keys the review queue missed (the sweep
-- history's `missed`, kept for history_keep). 'critical' too while the
-- last verify that found content missing or corrupt has not been followed
-- by a whole verify that found none (alkblobs.verifies). Defaults: a scheduled pool warns after
-- max(3 × sweep_every, 5 min) and is critical after
-- max(10 × sweep_every, 30 min); a manual pool after 1 and 7 days.
-- Single-instance pools are swept by their owner instance, outside the
-- history: their age is not judged. Counts stop at 100,000 (abandoned
-- uploads at 10,000). A pool with no completed sweep is aged from when it
-- was created, or from the upgrade to 0.6.0 for older pools.
CREATE FUNCTION alkblobs.health_rows()
RETURNS TABLE (pool text, status text, reasons text[], mode text, sweep_every interval, scheduler text,
               last_sweep timestamptz, last_sweep_age interval, last_attempt timestamptz, last_outcome text,
               overdue_staged bigint, expired_pins bigint, abandoned_uploads bigint, abandoned_upload_bytes bigint,
               invalid_sources bigint, warn_after interval, critical_after interval,
               last_verify timestamptz, verify_missing bigint, verify_corrupt bigint)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    pl alkblobs.pools;
    sched text := alkblobs.scheduler_state();
    now_ts timestamptz := clock_timestamp();
    last_row alkblobs.sweeps;
    l record;
    prob text;
    why text[];
    age interval;
    old_uploads bigint;
    since timestamptz;
    n bigint;
    missed_at timestamptz;
    vf alkblobs.verifies;
BEGIN
    FOR pl IN SELECT * FROM alkblobs.pools x WHERE alkblobs.may(x, 'read') ORDER BY x.name LOOP
        pool := pl.name;
        mode := pl.mode;
        sweep_every := pl.sweep_every;
        scheduler := CASE WHEN pl.mode = 'single' THEN 'owner instance' WHEN pl.sweep_every IS NULL THEN 'manual'
                          ELSE alkblobs.pool_scheduler(pl, sched) END;
        warn_after := coalesce(pl.warn_after,
                               CASE WHEN pl.sweep_every IS NULL THEN interval '1 day'
                                    ELSE greatest(3 * pl.sweep_every, interval '5 minutes') END);
        critical_after := coalesce(pl.critical_after,
                                   CASE WHEN pl.sweep_every IS NULL THEN interval '7 days'
                                        ELSE greatest(10 * pl.sweep_every, interval '30 minutes') END);
        SELECT s.last_completed, s.tracked_since INTO last_sweep, since FROM alkblobs.sweep_state s WHERE s.pool = pl.id;
        SELECT * INTO last_row FROM alkblobs.sweeps s
         WHERE s.pool = pl.id AND NOT s.dry_run ORDER BY s.started DESC, s.id DESC LIMIT 1;
        last_attempt := last_row.started;
        last_outcome := CASE WHEN last_row.id IS NULL THEN NULL
                             WHEN last_row.error IS NOT NULL THEN 'error: ' || last_row.error
                             WHEN last_row.aborted IS NOT NULL THEN 'aborted: ' || last_row.aborted
                             ELSE 'ok' END;
        age := now_ts - coalesce(last_sweep, since, pl.created_at);
        last_sweep_age := CASE WHEN last_sweep IS NULL THEN NULL ELSE now_ts - last_sweep END;
        SELECT count(*) INTO overdue_staged FROM (
            SELECT 1 FROM alkblobs.marks mk JOIN alkblobs.staged s ON s.mark = mk.id
             WHERE mk.pool = pl.id AND mk.mark_end IS NOT NULL
               AND mk.mark_end + mk.delete_window + warn_after <= now_ts
             LIMIT 100000) x;
        SELECT count(*) INTO expired_pins FROM (
            SELECT 1 FROM alkblobs.pins pn WHERE pn.pool = pl.id AND pn.expires_at + warn_after <= now_ts
             LIMIT 100000) x;
        SELECT count(*), coalesce(sum(alkblobs.lo_size(u.loid)), 0), count(*) FILTER (WHERE u.started_at + warn_after <= now_ts)
          INTO abandoned_uploads, abandoned_upload_bytes, old_uploads
          FROM (SELECT u0.loid, u0.started_at FROM alkblobs.uploads u0
                 WHERE u0.pool = pl.id AND NOT alkblobs.upload_running(u0.xact)
                 LIMIT 10000) u;
        invalid_sources := 0;
        why := '{}';
        FOR l IN SELECT lv.relid, lv.pending, lv.forward_refs, lv.guard_seen FROM alkblobs.liveness lv WHERE lv.pool = pl.id
                    AND EXISTS (SELECT 1 FROM pg_catalog.pg_class c WHERE c.oid = lv.relid) ORDER BY lv.relid LOOP
            BEGIN
                prob := alkblobs.source_problem_top(l.relid);
            EXCEPTION WHEN OTHERS THEN
                prob := 'cannot be checked: ' || SQLERRM;
            END;
            -- What the sweeps see, not only the table's definition: rows
            -- that reached it past its guard (before registration, through
            -- ATTACH PARTITION or a disabled guard, or from a restore) are
            -- checked by the next sweep (alkblobs.check_sources), which
            -- aborts while one names content the pool does not hold. While
            -- such rows wait and the pool's last sweep aborted that way,
            -- the table is invalid here too. (Health does not scan the
            -- table itself: it stays cheap.)
            IF prob IS NULL AND last_row.aborted = 'liveness_table_invalid'
               AND (l.pending IS NOT NULL
                    OR (NOT l.forward_refs AND l.guard_seen IS DISTINCT FROM alkblobs.guard_state(l.relid))) THEN
                prob := 'has rows not yet checked since they bypassed its guard, and the last sweep aborted on them: rows naming keys the pool does not hold (delete them, or put the content)';
            END IF;
            IF prob IS NOT NULL THEN
                invalid_sources := invalid_sources + 1;
                why := why || format('liveness table %s %s', l.relid::regclass, prob);
            END IF;
        END LOOP;
        status := CASE WHEN invalid_sources > 0 THEN 'critical' ELSE 'ok' END;
        IF pl.mode = 'fleet' THEN
            IF age > critical_after THEN
                status := 'critical';
                why := why || format('no completed sweep for %s (critical after %s)', date_trunc('second', age), critical_after);
            ELSIF age > warn_after THEN
                why := why || format('no completed sweep for %s (warn after %s)', date_trunc('second', age), warn_after);
            END IF;
            IF last_row.error IS NOT NULL OR last_row.aborted NOT IN ('sweeper_lock') THEN
                why := why || format('the last sweep (%s) %s', last_row.started, last_outcome);
            END IF;
            IF pl.sweep_every IS NOT NULL AND scheduler NOT IN ('on', 'pg_cron') THEN
                why := why || format('sweep_every is %s but scheduling is %s in this database%s', pl.sweep_every, sched,
                                     coalesce(': ' || CASE WHEN sched = 'off' THEN alkblobs.scheduler_off_reason() END, ''));
                IF EXISTS (SELECT 1 FROM alkblobs.schedule s WHERE s.pool = pl.id AND s.runner = 'pg_cron') THEN
                    why := why || format('its pg_cron job last started a run at %s',
                                         (SELECT s.last_scheduled FROM alkblobs.schedule s WHERE s.pool = pl.id));
                END IF;
            END IF;
        END IF;
        IF overdue_staged > 0 THEN
            why := why || format('%s staged rows due for longer than %s', overdue_staged, warn_after);
        END IF;
        IF expired_pins > 0 THEN
            why := why || format('%s pins expired for longer than %s', expired_pins, warn_after);
        END IF;
        IF old_uploads > 0 THEN
            why := why || format('%s uploads abandoned for longer than %s', old_uploads, warn_after);
        END IF;
        IF pl.mode = 'fleet' THEN
            -- Liveness deletions of its tables not routed (no sweep of it
            -- has run, or its sweeps abort).
            SELECT count(*) INTO n FROM (
                SELECT 1 FROM alkblobs.released r
                 WHERE r.relid::oid = ANY (alkblobs.fed_by(pl.id)) AND r.released_at + warn_after <= now_ts
                 LIMIT 100000) x;
            IF n > 0 THEN
                why := why || format('%s liveness deletions waiting to be routed for longer than %s', n, warn_after);
            END IF;
        END IF;
        IF pl.collector = 'queue' AND pl.mode = 'fleet' THEN
            -- The review queue falling behind, and audits that found what
            -- it missed (a scheduled or requested audit finds nothing while
            -- every event is queued: each key it finds is a bug to report).
            SELECT count(*) INTO n FROM (
                SELECT 1 FROM alkblobs.review_queue q WHERE q.pool = pl.id AND q.queued_at + warn_after <= now_ts
                 LIMIT 100000) x;
            IF n > 0 THEN
                why := why || format('%s review-queue rows due for longer than %s', n, warn_after);
            END IF;
            SELECT coalesce(sum(s.missed), 0), max(s.started) INTO n, missed_at FROM alkblobs.sweeps s
             WHERE s.pool = pl.id AND s.missed > 0 AND s.audit IN ('scheduled', 'requested');
            IF n > 0 THEN
                why := why || format('audits found %s keys the review queue missed (the last at %s): please report it; each was staged and is collected as usual', n, missed_at);
            END IF;
        END IF;
        -- What the last verify found (alkblobs_verify_finished): content
        -- recorded or referenced and gone, or corrupt, is critical until a
        -- whole verify finds none.
        SELECT * INTO vf FROM alkblobs.verifies v WHERE v.pool = pl.id;
        last_verify := vf.finished;
        verify_missing := vf.missing;
        verify_corrupt := vf.corrupt;
        IF vf.damaged_since IS NOT NULL THEN
            status := 'critical';
            why := why || format('verify found content missing or corrupt (since %s; the last run, at %s, found %s missing and %s corrupt): restore it and run a whole verify (docs/operations.md, "Verify")',
                                 vf.damaged_since, vf.finished, vf.missing, vf.corrupt);
        END IF;
        IF status = 'ok' AND cardinality(why) > 0 THEN
            status := 'warn';
        END IF;
        reasons := why;
        RETURN NEXT;
    END LOOP;
END $$;

