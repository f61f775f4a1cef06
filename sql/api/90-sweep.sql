-- alkblobs SQL API, 90-sweep.sql: The sweep: mark, execute, reap; the history.
-- (sql/api/*.sql load in file-name order after bootstrap.sql and the Rust
-- functions; docs/design.md, "Layout". The rules of the whole API are in 10-helpers.sql's header.)

-- The sweep ----------------------------------------------------------------------

-- One call is one transaction under the pool's sweeper lock (a row lock,
-- alkblobs.take_lock): the lock cannot outlive the call or be lost inside it, whatever a
-- connection pooler does. Steps: validate every registered liveness table
-- (one that fails aborts the call, cause 'liveness_table_invalid'); reap
-- expired pins and abandoned uploads; in a 'queue' pool review at most
-- `max_keys` due rows of its review queue (`reviewed`; alkblobs.review),
-- staging the unprotected keys under a mark sealed once they are staged; mark one
-- slice of at most `max_keys` entries after the pool's persisted mark
-- cursor and stage the unprotected ones — in every call of a 'mark' pool,
-- in a 'queue' pool's only during an audit (`audit` says why it runs,
-- `missed` how many keys the slice staged that the queue did not account
-- for) — (the mark is sealed, visible_after = mark_end + window, when a
-- slice reaches the end of the pool; until then its rows are not due); then
-- execute at most `max_keys` kv/lo rows due by now, each batch locked FOR
-- UPDATE SKIP LOCKED and re-checked against pins and liveness tables
-- before it is deleted. A key someone holds a lock on is passed over
-- (`skipped`) and stays staged. At most `max_unlinks` large objects are
-- unlinked per call (each holds a lock until commit), at most `max_keys`
-- expired pins reaped; `remaining` says how many due rows are left for the
-- next call (counted up to max_keys + 1) (`mark => false` runs just the
-- executor). `local_due` counts due rows of the local tier, which the
-- client executes with alkblobs_claim_local.
CREATE FUNCTION alkblobs.sweep_core(
    pool text,
    dry_run boolean DEFAULT false,
    max_unlinks integer DEFAULT 1000,
    mark boolean DEFAULT true,
    max_keys integer DEFAULT 20000)
RETURNS TABLE (
    examined bigint, live bigint, pinned bigint, staged bigint, executed bigint,
    deleted bigint, kept bigint, bytes_freed bigint, pins_reaped bigint, remaining bigint,
    local_due bigint, skipped bigint, uploads_reaped bigint, mark_done boolean,
    aborted text, duration interval, reviewed bigint, audit text, missed bigint)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    t0 timestamptz := clock_timestamp();
    pl alkblobs.pools := alkblobs.pool($1, 'sweep');
    v_marking boolean;
    rv record;
    st record;
    ks bytea[];
    tiers text[];
    v_dry boolean := $2;
    v_max integer := $3;
    v_mark boolean := $4;
    v_keys integer := $5;
    v_routed bigint := 0;
    cs record;
    live_sql text;
    v_mark_id bigint;
    v_last_mark bigint;
    v_cursor bytea;
    v_last bytea;
    v_mark_end timestamptz;
    candidates bigint := 0;
    batch bytea[];
    stl bytea[];
    ent bytea[];
    orphans bytea[];
    pr record;
    dead bytea[];
    now_dead bytea[];
    deferred bytea[];
    last_key bytea := '\x'::bytea;
    processed integer := 0;
    budget integer;
    unlinks integer := 0;
    r record;
BEGIN
    PERFORM alkblobs.require_read_committed('alkblobs_sweep');
    IF v_dry IS NULL OR v_max IS NULL OR v_mark IS NULL OR v_keys IS NULL THEN
        RAISE EXCEPTION 'dry_run, max_unlinks, mark and max_keys must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF v_max < 0 OR v_max > 1000000 THEN
        RAISE EXCEPTION 'max_unlinks must be between 0 and 1000000, got %', v_max USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF v_keys < 1 OR v_keys > 10000000 THEN
        RAISE EXCEPTION 'max_keys must be between 1 and 10000000, got %', v_keys USING ERRCODE = 'invalid_parameter_value';
    END IF;
    examined := 0; live := 0; pinned := 0; staged := 0; executed := 0; deleted := 0;
    kept := 0; bytes_freed := 0; pins_reaped := 0; remaining := 0; local_due := 0;
    skipped := 0; uploads_reaped := 0; mark_done := false; reviewed := 0;
    IF pl.mode = 'single' THEN
        RAISE WARNING 'alkblobs pool "%" is a single-instance pool: the store instance that owns it sweeps it', pl.name;
        aborted := 'single_instance_pool';
        duration := clock_timestamp() - t0;
        RETURN NEXT;
        RETURN;
    END IF;
    IF NOT alkblobs.take_lock(pl.id, true) THEN
        aborted := 'sweeper_lock';
        duration := clock_timestamp() - t0;
        RETURN NEXT;
        RETURN;
    END IF;
    -- The pool row as of now, under the lock: the one read before it may
    -- predate the commit of the sweep that held the lock (its open mark).
    SELECT * INTO pl FROM alkblobs.pools p WHERE p.id = pl.id;
    IF NOT v_dry THEN
        pl := alkblobs.adopt(pl);
    END IF;
    SELECT * INTO cs FROM alkblobs.check_sources(pl.id);
    IF cs.problem IS NOT NULL THEN
        RAISE WARNING 'sweep of alkblobs pool "%" aborted: liveness table %', pl.name, cs.problem
            USING HINT = CASE WHEN cs.busy THEN 'The next sweep retries.' ELSE 'Fix the table and register it again, or unregister it.' END;
        aborted := CASE WHEN cs.busy THEN 'liveness_table_busy' ELSE 'liveness_table_invalid' END;
        duration := clock_timestamp() - t0;
        RETURN NEXT;
        RETURN;
    END IF;
    live_sql := alkblobs.live_predicate(pl.id, 'c.key');

    -- 1. Reap expired pins (they protect nothing already); one someone is
    -- renewing or releasing right now is left for the next sweep.
    IF v_dry THEN
        SELECT count(*) INTO pins_reaped FROM alkblobs.pins pn
         WHERE pn.pool = pl.id AND pn.expires_at <= clock_timestamp();
    ELSE
        -- Each batch below is picked once (MATERIALIZED): a semi-join the
        -- planner may rescan per outer row would pass over the rows this
        -- statement has deleted (locked by this command: skipped) and
        -- take the next ones, past the LIMIT.
        WITH pick AS MATERIALIZED (
            SELECT x.pool, x.key, x.role, x.owner FROM alkblobs.pins x
             WHERE x.pool = pl.id AND x.expires_at <= clock_timestamp()
             LIMIT v_keys FOR UPDATE SKIP LOCKED)
        DELETE FROM alkblobs.pins pn USING pick
         WHERE pn.pool = pick.pool AND pn.key = pick.key AND pn.role = pick.role AND pn.owner = pick.owner;
        GET DIAGNOSTICS pins_reaped = ROW_COUNT;
        -- Abandoned uploads: their transaction ended without lo_commit.
        SELECT ru.reaped, unlinks + ru.unlinked INTO uploads_reaped, unlinks
          FROM alkblobs.reap_uploads(pl.id, v_max) ru;
    END IF;

    -- 2. Liveness deletions appended since the last call are routed to
    -- the queues of the pools they concern (any fleet pool's call does
    -- it: they are no pool's until then). Then a 'queue' pool's review:
    -- the keys events queued (85-review.sql).
    IF NOT v_dry THEN
        v_routed := alkblobs.route_released(pl.id, v_keys);
    END IF;
    IF pl.collector = 'queue' THEN
        SELECT * INTO rv FROM alkblobs.review(pl, v_keys, v_dry, live_sql);
        reviewed := rv.reviewed;
        examined := rv.examined;
        pinned := rv.pinned;
        candidates := rv.candidates;
        staged := rv.staged;
    END IF;
    -- A full routing batch: more deletions may be waiting, so the caller
    -- (alkblobs_sweep_all, the scheduler, the client, which call again
    -- while a call reviewed a full batch) calls again, also for a pool
    -- whose tables feed only 'mark' pools.
    IF v_routed >= v_keys THEN
        reviewed := greatest(reviewed, v_routed);
    END IF;

    -- 3. Mark one slice: in every call of a 'mark' pool; in a 'queue'
    -- pool's only while an audit runs, or to start one (asked for, or
    -- audit_every since the last). A dry run examines the same slice (from
    -- the pool's cursor, at most max_keys), stages nothing and starts no
    -- audit.
    v_marking := v_mark AND pl.collector = 'mark';
    IF v_mark AND pl.collector = 'queue' THEN
        IF pl.open_mark IS NOT NULL AND EXISTS (SELECT 1 FROM alkblobs.marks mk WHERE mk.id = pl.open_mark AND mk.mark_end IS NULL) THEN
            audit := coalesce(pl.audit_running, 'under way');
        ELSIF v_dry THEN
            SELECT alkblobs.audit_reason(array_agg(a.reason ORDER BY a.id)) INTO audit
              FROM alkblobs.audit_requests a WHERE a.pool = pl.id;
        ELSE
            -- Every request committed by now (one audit answers them all).
            WITH taken AS (DELETE FROM alkblobs.audit_requests a WHERE a.pool = pl.id RETURNING a.id, a.reason)
            SELECT alkblobs.audit_reason(array_agg(t.reason ORDER BY t.id)) INTO audit FROM taken t;
        END IF;
        IF audit IS NULL AND pl.audit_every IS NOT NULL
           AND coalesce(pl.last_audit, pl.created_at) + pl.audit_every <= clock_timestamp() THEN
            audit := 'scheduled';
        END IF;
        v_marking := audit IS NOT NULL;
    END IF;
    IF v_marking THEN
        v_mark_id := pl.open_mark;
        v_cursor := pl.mark_cursor;
        IF v_mark_id IS NULL OR NOT EXISTS (SELECT 1 FROM alkblobs.marks mk WHERE mk.id = v_mark_id AND mk.mark_end IS NULL) THEN
            v_mark_id := NULL;
            IF NOT v_dry THEN
                INSERT INTO alkblobs.marks (pool, delete_window) VALUES (pl.id, pl.delete_window) RETURNING id INTO v_mark_id;
            END IF;
            v_cursor := '\x'::bytea;
        END IF;
        -- Entries, and the files a local-tier pool recorded (the client
        -- claims those), merged in key order. (A key that is both, after
        -- a threshold change, is one candidate: its entry; the file is
        -- staged once that is gone.)
        -- Each side limited on its own index first: the grouping of the
        -- whole union, limited only after, aggregated every entry past the
        -- cursor in every call (5 s a slice at 10,000,000 entries,
        -- measured: quadratic over an audit). The first max_keys distinct
        -- keys of the union are among the first max_keys of each side.
        SELECT array_agg(x.key ORDER BY x.key), array_agg(x.tier ORDER BY x.key) INTO ks, tiers FROM (
            SELECT u.key, min(u.tier) AS tier FROM (
                (SELECT e.key, e.tier FROM alkblobs.entries e
                  WHERE e.pool = pl.id AND e.key > v_cursor ORDER BY e.key LIMIT v_keys)
                UNION ALL
                (SELECT f.key, 'local' FROM alkblobs.files f
                  WHERE f.pool = pl.id AND f.key > v_cursor AND f.deleting_since IS NULL
                  ORDER BY f.key LIMIT v_keys)) u
             GROUP BY u.key ORDER BY u.key LIMIT v_keys) x;
        IF ks IS NOT NULL THEN
            v_last := ks[cardinality(ks)];
            examined := examined + cardinality(ks);
            -- What the queue missed counts on audits no event asked for:
            -- an event's audit exists to find keys nothing queued.
            SELECT * INTO st FROM alkblobs.stage_unprotected(pl.id, ks, tiers, v_mark_id, v_dry, live_sql,
                                                              coalesce(audit IN ('scheduled', 'requested'), false));
            pinned := pinned + st.pinned;
            candidates := candidates + st.candidates;
            staged := staged + st.staged;
            missed := st.missed;
        END IF;
        mark_done := v_last IS NULL
            OR (NOT EXISTS (SELECT 1 FROM alkblobs.entries e WHERE e.pool = pl.id AND e.key > v_last)
                AND NOT EXISTS (SELECT 1 FROM alkblobs.files f
                                 WHERE f.pool = pl.id AND f.key > v_last AND f.deleting_since IS NULL));
        IF v_dry THEN
            NULL;
        ELSIF mark_done THEN
            -- Seal: the window runs from the end of the mark.
            v_mark_end := clock_timestamp();
            UPDATE alkblobs.marks mk SET mark_end = v_mark_end WHERE mk.id = v_mark_id;
            -- A shared tier's files nobody recorded are found by listing
            -- the tier, which a node with the tier does once a mark sealed
            -- (alkblobs_tier_listed): an audit's, or every sweep's in a
            -- 'mark' pool.
            UPDATE alkblobs.pools p SET open_mark = NULL, mark_cursor = NULL, audit_running = NULL,
                                        last_audit = CASE WHEN audit IS NULL THEN p.last_audit ELSE v_mark_end END,
                                        tier_listing_due = CASE WHEN p.large_tier IN ('local', 's3') THEN v_mark_end END
             WHERE p.id = pl.id;
        ELSE
            UPDATE alkblobs.pools p SET open_mark = v_mark_id, mark_cursor = v_last, audit_running = audit WHERE p.id = pl.id;
        END IF;
    ELSE
        -- Nothing to mark: a 'queue' pool between audits (or mark => false).
        mark_done := v_mark;
    END IF;
    live := greatest(examined - pinned - candidates, 0);
    v_mark_end := coalesce(v_mark_end, clock_timestamp());

    -- 3. Execute kv/lo rows due by v_mark_end: mark by mark (so rows of a
    -- mark still running are never even scanned), each in key order.
    v_mark_id := NULL;
    LOOP
        EXIT WHEN processed >= v_keys;
        IF v_mark_id IS NULL THEN
            SELECT mk.id INTO v_mark_id FROM alkblobs.marks mk
             WHERE mk.pool = pl.id AND mk.id > coalesce(v_last_mark, 0) AND mk.mark_end IS NOT NULL
               AND mk.mark_end + mk.delete_window <= v_mark_end
             ORDER BY mk.id LIMIT 1;
            EXIT WHEN v_mark_id IS NULL;
            last_key := '\x'::bytea;
        END IF;
        SELECT array_agg(x.key ORDER BY x.key) INTO batch FROM (
            SELECT s.key FROM alkblobs.staged s
             WHERE s.mark = v_mark_id AND s.key > last_key AND s.tier <> 'local'
             ORDER BY s.key LIMIT least(1000, v_keys - processed)) x;
        IF batch IS NULL THEN
            v_last_mark := v_mark_id;
            v_mark_id := NULL;
            CONTINUE;
        END IF;
        last_key := batch[array_upper(batch, 1)];
        processed := processed + cardinality(batch);
        IF v_dry THEN
            executed := executed + cardinality(batch);
            CONTINUE;
        END IF;
        -- Lock what nobody else holds; never wait. A put removing a staged
        -- row, a pin or a liveness write holding an entry: that key is
        -- being protected and stays staged.
        SELECT coalesce(array_agg(x.key ORDER BY x.key), '{}') INTO stl FROM (
            SELECT s.key FROM alkblobs.staged s
             WHERE s.pool = pl.id AND s.key = ANY(batch) AND s.tier <> 'local'
             ORDER BY s.key FOR UPDATE SKIP LOCKED) x;
        SELECT coalesce(array_agg(x.key ORDER BY x.key), '{}') INTO ent FROM (
            SELECT e.key FROM alkblobs.entries e
             WHERE e.pool = pl.id AND e.key = ANY(stl) ORDER BY e.key FOR UPDATE SKIP LOCKED) x;
        orphans := ARRAY(SELECT k FROM unnest(stl) k
                          WHERE NOT EXISTS (SELECT 1 FROM alkblobs.entries e WHERE e.pool = pl.id AND e.key = k));
        -- The re-check, in statements that start after the locks were
        -- granted: they see every pin and liveness row committed before.
        SELECT * INTO pr FROM alkblobs.protected(pl.id, ent, live_sql);
        dead := ARRAY(SELECT k FROM unnest(ent) k EXCEPT SELECT k FROM unnest(pr.keep || pr.busy) k);
        -- Spend the large-object budget; dead objects over it wait (staged)
        -- for the next call.
        budget := v_max - unlinks;
        SELECT coalesce(array_agg(d.key) FILTER (WHERE d.tier = 'kv' OR d.rank <= budget), '{}'),
               coalesce(array_agg(d.key) FILTER (WHERE d.tier = 'lo' AND d.rank > budget), '{}')
          INTO now_dead, deferred
          FROM (SELECT e.key, e.tier, row_number() OVER (PARTITION BY e.tier ORDER BY e.key) AS rank
                  FROM alkblobs.entries e WHERE e.pool = pl.id AND e.key = ANY(dead)) d;
        FOR r IN DELETE FROM alkblobs.entries e WHERE e.pool = pl.id AND e.key = ANY(now_dead)
                 RETURNING e.size, e.loid LOOP
            deleted := deleted + 1;
            bytes_freed := bytes_freed + r.size;
            -- (A large object already gone — lost behind the pool's back —
            -- must not make every sweep of the pool fail with 42704.)
            IF r.loid IS NOT NULL
               AND EXISTS (SELECT 1 FROM pg_catalog.pg_largeobject_metadata m WHERE m.oid = r.loid) THEN
                PERFORM pg_catalog.lo_unlink(r.loid);
                unlinks := unlinks + 1;
            END IF;
        END LOOP;
        -- A key that was both an entry and a file (a threshold change) is
        -- staged as its entry: with the entry gone, its file is reviewed.
        IF pl.collector = 'queue' AND pl.large_tier IN ('local', 's3') AND cardinality(now_dead) > 0 THEN
            INSERT INTO alkblobs.review_queue (pool, key)
            SELECT pl.id, f.key FROM alkblobs.files f
             WHERE f.pool = pl.id AND f.key = ANY(now_dead) AND f.deleting_since IS NULL;
        END IF;
        kept := kept + cardinality(pr.keep);
        skipped := skipped + cardinality(batch) - cardinality(ent) - cardinality(orphans)
                   + (SELECT count(*) FROM unnest(pr.busy) b WHERE NOT (b = ANY(pr.keep)));
        DELETE FROM alkblobs.staged s
         WHERE s.pool = pl.id AND s.key = ANY(orphans || pr.keep || now_dead);
        executed := executed + cardinality(orphans) + cardinality(pr.keep) + cardinality(now_dead);
        EXIT WHEN cardinality(deferred) > 0 OR (unlinks >= v_max AND v_max > 0 AND EXISTS (
            SELECT 1 FROM alkblobs.entries e WHERE e.pool = pl.id AND e.tier = 'lo' LIMIT 1));
    END LOOP;

    -- Counted up to max_keys + 1 (bounded work): a value over max_keys
    -- means "at least that many".
    -- (Driven from the due marks: rows of a mark still running are not
    -- scanned.)
    SELECT count(*) INTO remaining FROM (
        SELECT 1 FROM alkblobs.marks mk JOIN alkblobs.staged s ON s.mark = mk.id
         WHERE mk.pool = pl.id AND mk.mark_end IS NOT NULL
           AND mk.mark_end + mk.delete_window <= v_mark_end AND s.tier <> 'local'
         LIMIT v_keys + 1) x;
    SELECT count(*) INTO local_due FROM (
        SELECT 1 FROM alkblobs.marks mk JOIN alkblobs.staged s ON s.mark = mk.id
         WHERE mk.pool = pl.id AND mk.mark_end IS NOT NULL
           AND mk.mark_end + mk.delete_window <= clock_timestamp() AND s.tier = 'local'
         LIMIT v_keys + 1) x;
    IF v_dry THEN
        remaining := greatest(remaining - executed, 0);
    ELSE
        DELETE FROM alkblobs.marks mk
         WHERE mk.pool = pl.id AND mk.mark_end IS NOT NULL
           AND NOT EXISTS (SELECT 1 FROM alkblobs.staged s WHERE s.mark = mk.id);
    END IF;
    duration := clock_timestamp() - t0;
    RETURN NEXT;
END $$;

-- The sweep history's writer: one row per sweep call, in the sweep's
-- transaction, and the pool's rows older than its history_keep deleted
-- (at most 1,000 a call, so a long backlog drains over a few sweeps;
-- rows another uncommitted sweep is deleting are passed over, never
-- waited for). A completed sweep (not a dry run, not aborted) sets the
-- pool's last_completed. `r` is a row of alkblobs.sweep_core, or NULL
-- with `err` set.
CREATE FUNCTION alkblobs.record_sweep(p integer, t0 timestamptz, is_scheduled boolean, is_dry boolean, r record, err text)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    keep interval := (SELECT x.history_keep FROM alkblobs.pools x WHERE x.id = p);
BEGIN
    IF err IS NOT NULL THEN
        INSERT INTO alkblobs.sweeps (pool, role, application_name, scheduled, dry_run, started, finished, error)
        VALUES (p, session_user, nullif(current_setting('application_name', true), ''), is_scheduled, is_dry,
                t0, clock_timestamp(), err);
    ELSE
        INSERT INTO alkblobs.sweeps (pool, role, application_name, scheduled, dry_run, started, finished,
                                     examined, live, pinned, staged, executed, deleted, kept, bytes_freed,
                                     pins_reaped, remaining, local_due, skipped, uploads_reaped, mark_done, aborted,
                                     reviewed, audit, missed)
        VALUES (p, session_user, nullif(current_setting('application_name', true), ''), is_scheduled, is_dry,
                t0, clock_timestamp(), r.examined, r.live, r.pinned, r.staged, r.executed, r.deleted, r.kept,
                r.bytes_freed, r.pins_reaped, r.remaining, r.local_due, r.skipped, r.uploads_reaped, r.mark_done,
                r.aborted, r.reviewed, r.audit, r.missed);
        IF NOT is_dry AND r.aborted IS NULL THEN
            INSERT INTO alkblobs.sweep_state AS st (pool, last_completed) VALUES (p, clock_timestamp())
            ON CONFLICT (pool) DO UPDATE SET last_completed = excluded.last_completed;
        END IF;
    END IF;
    WITH pick AS MATERIALIZED (
        SELECT x.id FROM alkblobs.sweeps x
         WHERE x.pool = p AND x.started < clock_timestamp() - keep
         ORDER BY x.started LIMIT 1000 FOR UPDATE SKIP LOCKED)
    DELETE FROM alkblobs.sweeps s USING pick WHERE s.id = pick.id;
END $$;

-- One bounded sweep call (alkblobs.sweep_core, above), recorded in the
-- sweep history. A call that raises leaves no row: its error goes to the
-- caller and its transaction (with the row) is rolled back.
CREATE FUNCTION @extschema@.alkblobs_sweep(
    pool text,
    dry_run boolean DEFAULT false,
    max_unlinks integer DEFAULT 1000,
    mark boolean DEFAULT true,
    max_keys integer DEFAULT 20000)
RETURNS TABLE (
    examined bigint, live bigint, pinned bigint, staged bigint, executed bigint,
    deleted bigint, kept bigint, bytes_freed bigint, pins_reaped bigint, remaining bigint,
    local_due bigint, skipped bigint, uploads_reaped bigint, mark_done boolean,
    aborted text, duration interval, reviewed bigint, audit text, missed bigint)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    t0 timestamptz := clock_timestamp();
    r record;
BEGIN
    SELECT * INTO r FROM alkblobs.sweep_core($1, $2, $3, $4, $5);
    -- (sweep_core checked the caller's access to the pool.)
    PERFORM alkblobs.record_sweep((SELECT p.id FROM alkblobs.pools p WHERE p.name = $1), t0, false, $2, r, NULL);
    RETURN QUERY SELECT r.examined, r.live, r.pinned, r.staged, r.executed, r.deleted, r.kept, r.bytes_freed,
                        r.pins_reaped, r.remaining, r.local_due, r.skipped, r.uploads_reaped, r.mark_done,
                        r.aborted, r.duration, r.reviewed, r.audit, r.missed;
END $$;

-- A fleet client's sweep lease on a pool: `holder` (the caller's
-- store-instance id, as for pins; bound to the calling role too) takes
-- it, or renews it, until now + ttl. True if the caller holds it now;
-- false, without waiting for its holder, while another holder's lease has
-- neither expired nor lost its backend (the connection that last took or
-- renewed it: a client that died frees its lease at once, unless a
-- connection pooler keeps that connection open, when ttl still bounds
-- it). A client takes it before the alkblobs_sweep calls of one sweep,
-- renews it as they go and ends it after (alkblobs_sweep_lease_end), so
-- that of two instances sweeping at once one does the work and the other
-- reports the sweeper lock. (Whether a backend is gone is read once per
-- transaction: call it outside a long one.) Exclusivity among clients only: each
-- alkblobs_sweep call takes the pool's sweeper lock for itself, and psql
-- users and the scheduler ignore leases. Needs 'sweep' access (unlike the
-- advisory lock it replaces, 0.6.0: any role could hold that to stop a
-- fleet's sweeps) and READ COMMITTED (AB003).
CREATE FUNCTION @extschema@.alkblobs_sweep_lease(pool text, holder text, ttl interval DEFAULT '60 seconds')
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET lock_timeout = '200ms' AS $$
#variable_conflict use_column
DECLARE
    pl alkblobs.pools := alkblobs.pool($1, 'sweep');
    me oid := alkblobs.caller();
    cur alkblobs.leases;
BEGIN
    PERFORM alkblobs.require_read_committed('alkblobs_sweep_lease');
    PERFORM alkblobs.check_owner($2);
    PERFORM alkblobs.not_null($3, 'ttl');
    IF $3 < interval '1 second' OR $3 > interval '1 hour' THEN
        RAISE EXCEPTION 'ttl must be between 1 second and 1 hour, got %', $3 USING ERRCODE = 'invalid_parameter_value';
    END IF;
    LOOP
        INSERT INTO alkblobs.leases AS l (pool, role, holder, pid, expires_at)
        VALUES (pl.id, me, $2, pg_catalog.pg_backend_pid(), clock_timestamp() + $3)
        ON CONFLICT (pool) DO NOTHING;
        IF FOUND THEN
            RETURN true;
        END IF;
        -- (Waits for a concurrent call on the same lease, then sees its row.)
        SELECT * INTO cur FROM alkblobs.leases l WHERE l.pool = pl.id FOR UPDATE;
        IF FOUND THEN
            IF (cur.role = me AND cur.holder = $2) OR cur.expires_at <= clock_timestamp()
               OR NOT EXISTS (SELECT 1 FROM pg_catalog.pg_stat_activity a WHERE a.pid = cur.pid) THEN
                UPDATE alkblobs.leases l
                   SET role = me, holder = $2, pid = pg_catalog.pg_backend_pid(), expires_at = clock_timestamp() + $3
                 WHERE l.pool = pl.id;
                RETURN true;
            END IF;
            RETURN false;
        END IF;
        -- Ended meanwhile: take it.
    END LOOP;
EXCEPTION WHEN lock_not_available THEN
    -- Another caller's lease call sits in an open transaction: theirs.
    RETURN false;
END $$;

-- Ends holder's sweep lease on a pool (a lease of the calling role); true
-- if it held one.
CREATE FUNCTION @extschema@.alkblobs_sweep_lease_end(pool text, holder text) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    pl alkblobs.pools := alkblobs.pool($1, 'sweep');
BEGIN
    PERFORM alkblobs.check_owner($2);
    DELETE FROM alkblobs.leases l WHERE l.pool = pl.id AND l.role = alkblobs.caller() AND l.holder = $2;
    RETURN FOUND;
END $$;

-- Runs sweep calls until the mark is sealed and no due row is left (or a
-- call makes no progress: what is left is held by someone), committing
-- between calls so that every transaction stays bounded. Use with CALL
-- outside a transaction block.
-- (No SET clause: a procedure with one cannot COMMIT. It is not SECURITY
-- DEFINER, and it runs as whoever calls it, a superuser too, under the
-- caller's search_path: so every function it calls and every operator it
-- uses is schema-qualified, OPERATOR(pg_catalog.+) and all, and a schema
-- placed before pg_catalog cannot redirect any of it. pg_privileges checks
-- that this is the only routine without a pinned search_path.)
CREATE PROCEDURE @extschema@.alkblobs_sweep_all(pool text, max_unlinks integer DEFAULT 1000)
LANGUAGE plpgsql AS $$
DECLARE
    r record;
    marking boolean := true;
    total_deleted bigint := 0;
    calls integer := 0;
    full_reviews integer := 0;
BEGIN
    IF $1 IS NULL OR $2 IS NULL THEN
        RAISE EXCEPTION 'pool and max_unlinks must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF $2 OPERATOR(pg_catalog.<) 1 THEN
        RAISE EXCEPTION 'max_unlinks must be at least 1 for alkblobs_sweep_all, got %', $2
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Call alkblobs_sweep(pool, max_unlinks => 0) for a sweep that unlinks nothing.';
    END IF;
    LOOP
        SELECT * INTO r FROM @extschema@.alkblobs_sweep($1, false, $2, marking);
        calls := calls OPERATOR(pg_catalog.+) 1;
        IF r.aborted IS NOT NULL THEN
            RAISE NOTICE 'sweep of pool "%" aborted: %', $1, r.aborted;
            EXIT;
        END IF;
        total_deleted := total_deleted OPERATOR(pg_catalog.+) r.deleted;
        marking := marking AND NOT r.mark_done;
        COMMIT;
        -- A full batch of the review queue: more of it may be due (up to
        -- 100 such calls, 2,000,000 rows: events arriving faster than that
        -- are left to the next run, which is then not endless).
        IF r.reviewed OPERATOR(pg_catalog.>=) 20000 THEN
            full_reviews := full_reviews OPERATOR(pg_catalog.+) 1;
        END IF;
        EXIT WHEN NOT marking
              AND (r.reviewed OPERATOR(pg_catalog.<) 20000 OR full_reviews OPERATOR(pg_catalog.>=) 100)
              AND (r.remaining OPERATOR(pg_catalog.=) 0 OR r.executed OPERATOR(pg_catalog.=) 0);
    END LOOP;
    RAISE NOTICE 'pool "%": % call(s), % entries deleted', $1, calls, total_deleted;
END $$;
