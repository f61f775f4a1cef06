-- alkblobs SQL API, 85-review.sql: The review queue and the audit.
-- (sql/api/*.sql load in file-name order after bootstrap.sql and the Rust
-- functions; docs/design.md, "Layout". The rules of the whole API are in 10-helpers.sql's header.)

-- The review queue ---------------------------------------------------------------

-- A 'queue' pool's sweep reviews only the keys an event may have left
-- unprotected, so its cost follows churn and not the pool's size. Every
-- such event queues its key in the event's own transaction:
--   * a pin row deleted (released, released in bulk, reaped when expired):
--     the trigger queue_released on alkblobs.pins. Every entry and file
--     record of a fleet pool is created with a pin row in its put's
--     transaction (pin before publish: an owner is required), so a key put
--     and never referenced is queued when that pin goes; a row inserted
--     by hand with no pin is found by the next audit;
--   * a liveness row deleted, or updated to another key: the guard
--     (alkblobs_registration.liveness_guard, AFTER … OR DELETE) appends
--     it to alkblobs.released, and the next sweep call of any fleet pool
--     routes it to the queues of the pools its table feeds
--     (alkblobs.route_released);
--   * the executor deleting an entry whose key also has a file record.
-- Events that cannot be told key by key ask for an audit instead (the full
-- mark: alkblobs.request_audit): a registered table truncated, dropped,
-- unregistered or altered, a restore, the upgrade to 0.8.0.
--
-- A queue row is one event, appended (never updated, so an event cannot
-- fail with a serialization error at REPEATABLE READ or SERIALIZABLE, nor
-- wait for a review); the sweep reviews the oldest rows and stages the
-- keys nothing protects into a mark sealed at the review, so the executor
-- deletes them a delete window after the review, after its usual re-check
-- under FOR UPDATE: the window runs from the review, as it runs from the
-- end of a mark. The queue decides only what gets reviewed; what gets
-- deleted is decided where it always was. A missed event leaks content
-- until the next audit and deletes nothing.

-- The statement trigger on the pins: every pin row deleted (the transition
-- table `changed`) of a 'queue' pool queues its key. SECURITY DEFINER:
-- whoever deleted the pin (a superuser by hand too) queues it.
CREATE FUNCTION alkblobs.queue_changed() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    INSERT INTO alkblobs.review_queue (pool, key)
    SELECT DISTINCT c.pool, c.key
      FROM changed c JOIN alkblobs.pools p ON p.id = c.pool
     WHERE p.collector = 'queue' AND p.mode = 'fleet';
    RETURN NULL;
END $$;

CREATE OR REPLACE TRIGGER queue_released AFTER DELETE ON alkblobs.pins
    REFERENCING OLD TABLE AS changed
    FOR EACH STATEMENT EXECUTE FUNCTION alkblobs.queue_changed();
-- Also under session_replication_role = replica (a restore run that way).
-- A logical-replication subscriber's apply fires row triggers only, so a
-- copy of the tables kept that way is not queued: audit it before sweeping
-- it (alkblobs_audit).
ALTER TABLE alkblobs.pins ENABLE ALWAYS TRIGGER queue_released;

-- The tables pool p is fed by, as the guard names them: its registered
-- tables and, for a partitioned one, every partition below it.
CREATE FUNCTION alkblobs.fed_by(p integer) RETURNS oid[]
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp AS $$
    SELECT coalesce(array_agg(DISTINCT x.relid), '{}') FROM (
        SELECT l.relid::oid AS relid FROM alkblobs.liveness l WHERE l.pool = p
        UNION ALL
        SELECT t.relid::oid FROM alkblobs.liveness l, pg_catalog.pg_partition_tree(l.relid) t WHERE l.pool = p) x
$$;

-- Routes liveness deletions (alkblobs.released) of the tables pool p is
-- fed by to the review queue of every 'queue' fleet pool each table (or a
-- table it is a partition of) feeds now — p's own and any other's —
-- deleting them in the same statement: a row is moved, never lost, unless
-- no such pool exists (a table that feeds only 'mark' pools). Each queue
-- row keeps its event's time. At most max_rows, oldest first per table,
-- the tables in a random order each call (one busy table cannot starve
-- the others); rows another pool's router holds (a table both feed) are
-- passed over, not waited for. Then drops up to max_rows rows of tables
-- that feed no pool any more (unregistered, dropped or detached since:
-- each asked for an audit), found among the oldest max_rows rows. Only p's
-- own tables' rows are routed, so the sweeps of pools that share no table
-- never meet here. Returns the rows routed.
CREATE FUNCTION alkblobs.route_released(p integer, max_rows integer) RETURNS bigint
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    rel oid;
    targets integer[];
    budget bigint := max_rows;
    n bigint;
    orphans oid[];
BEGIN
    FOR rel IN SELECT r FROM unnest(alkblobs.fed_by(p)) r ORDER BY random() LOOP
        EXIT WHEN budget <= 0;
        -- The pools this table's rows go to (one lookup per table, not
        -- per row).
        SELECT coalesce(array_agg(DISTINCT l.pool), '{}') INTO targets
          FROM alkblobs.liveness l JOIN alkblobs.pools pl ON pl.id = l.pool
         WHERE (l.relid = rel OR l.relid IN (SELECT a.relid FROM pg_catalog.pg_partition_ancestors(rel) a))
           AND pl.collector = 'queue' AND pl.mode = 'fleet';
        -- The rows are picked once (MATERIALIZED): a semi-join the
        -- planner may rescan per outer row would pass over the rows this
        -- statement has deleted (locked by this command: skipped) and
        -- take the next ones, past the LIMIT.
        WITH pick AS MATERIALIZED (
            SELECT x.relid, x.id FROM alkblobs.released x
             WHERE x.relid = rel
             ORDER BY x.relid, x.id LIMIT budget FOR UPDATE SKIP LOCKED),
        taken AS (
            DELETE FROM alkblobs.released r USING pick
             WHERE r.relid = pick.relid AND r.id = pick.id
            RETURNING r.key, r.released_at),
        routed AS (
            INSERT INTO alkblobs.review_queue (pool, key, queued_at)
            SELECT t.pool, t.key, min(t.released_at)
              FROM (SELECT q.pool, taken.key, taken.released_at FROM taken, unnest(targets) q(pool)) t
             GROUP BY t.pool, t.key
            RETURNING 1)
        SELECT count(*) INTO n FROM taken;
        budget := budget - n;
    END LOOP;
    -- Rows of tables no pool is fed by any more, among the oldest.
    SELECT array_agg(DISTINCT o.relid::oid) INTO orphans FROM (
        SELECT y.relid FROM alkblobs.released y ORDER BY y.released_at LIMIT max_rows) o
     WHERE NOT EXISTS (
        SELECT 1 FROM alkblobs.liveness l
         WHERE l.relid = o.relid OR l.relid IN (SELECT a.relid FROM pg_catalog.pg_partition_ancestors(o.relid) a));
    IF orphans IS NOT NULL THEN
        WITH pick AS MATERIALIZED (
            SELECT x.relid, x.id FROM alkblobs.released x
             WHERE x.relid::oid = ANY (orphans)
             ORDER BY x.relid, x.id LIMIT max_rows FOR UPDATE SKIP LOCKED)
        DELETE FROM alkblobs.released r USING pick
         WHERE r.relid = pick.relid AND r.id = pick.id;
    END IF;
    RETURN max_rows - budget;
END $$;

-- Asks for an audit of pool p (a 'queue' fleet pool; others ignore it),
-- saying why: the next sweep call starts one once the audit under way (if
-- any) is done, for every request committed by then. An appended row,
-- never an update and never a unique key: a TRUNCATE or DROP in a long
-- transaction holds no row a sweep, an unregistration or another event
-- could wait for.
CREATE FUNCTION alkblobs.request_audit(p integer, why text) RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    INSERT INTO alkblobs.audit_requests (pool, reason)
    SELECT x.id, why FROM alkblobs.pools x WHERE x.id = p AND x.collector = 'queue' AND x.mode = 'fleet';
END $$;

-- Why an audit that answers `reasons` (requests, oldest first) runs: the
-- first event's reason if any (an event's audit exists to find keys
-- nothing queued, so it counts nothing as missed), else 'requested'
-- (alkblobs_audit); NULL for none.
CREATE FUNCTION alkblobs.audit_reason(reasons text[]) RETURNS text
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp AS $$
    SELECT coalesce((SELECT r FROM unnest(reasons) WITH ORDINALITY u(r, i) WHERE r <> 'requested' ORDER BY i LIMIT 1),
                    (SELECT r FROM unnest(reasons) u(r) WHERE r = 'requested' LIMIT 1))
$$;

-- The keys of `ks` (with their tiers, in key order) that no unexpired pin
-- and no liveness row protects now and that no mark has staged yet are
-- staged under mark `mark_id` (counted only, on a dry run). Shared by the
-- mark's slices and the queue's reviews. `missed` (counted when asked): of
-- those, the ones no queue row, no row still to be routed
-- (alkblobs.released, of a table that feeds the pool) and no pin row (expired or not)
-- accounts for — on an audit, the events the queue missed.
CREATE FUNCTION alkblobs.stage_unprotected(
    p integer, ks bytea[], tiers text[], mark_id bigint, dry boolean, live_sql text, count_missed boolean,
    OUT pinned bigint, OUT candidates bigint, OUT staged bigint, OUT missed bigint)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    EXECUTE format($q$
        WITH slice AS MATERIALIZED (
            SELECT u.key, u.tier FROM unnest($4::bytea[], $5::text[]) u(key, tier)),
        -- Pins and staged rows of the slice by `key = ANY(array)`: an
        -- index lookup whatever the (often stale) row estimates of a
        -- freshly filled pool, never a per-row range scan.
        held AS MATERIALIZED (
            SELECT DISTINCT pn.key FROM alkblobs.pins pn
             WHERE pn.pool = $1 AND pn.key = ANY ($4) AND pn.expires_at > $2),
        already AS MATERIALIZED (
            SELECT s.key FROM alkblobs.staged s
             WHERE s.pool = $1 AND s.key = ANY ($4)),
        cand AS MATERIALIZED (
            SELECT c.key, c.tier FROM slice c
             WHERE NOT EXISTS (SELECT 1 FROM held h WHERE h.key = c.key)
               AND NOT (%s)),
        fresh AS MATERIALIZED (
            SELECT cand.key, cand.tier FROM cand
             WHERE NOT EXISTS (SELECT 1 FROM already a WHERE a.key = cand.key)),
        ins AS (
            INSERT INTO alkblobs.staged (pool, key, tier, mark)
            SELECT $1, fresh.key, fresh.tier, $3 FROM fresh WHERE NOT $6
            ON CONFLICT (pool, key) DO NOTHING
            RETURNING 1)
        SELECT (SELECT count(*) FROM held), (SELECT count(*) FROM cand),
               CASE WHEN $6 THEN (SELECT count(*) FROM fresh) ELSE (SELECT count(*) FROM ins) END,
               CASE WHEN $7 THEN (
                   SELECT count(*) FROM fresh f
                    WHERE NOT EXISTS (SELECT 1 FROM alkblobs.review_queue q WHERE q.pool = $1 AND q.key = f.key)
                      AND NOT EXISTS (SELECT 1 FROM alkblobs.released r
                                       WHERE r.relid::oid = ANY (alkblobs.fed_by($1)) AND r.key = f.key)
                      AND NOT EXISTS (SELECT 1 FROM alkblobs.pins pn WHERE pn.pool = $1 AND pn.key = f.key)) END$q$,
        live_sql)
      INTO pinned, candidates, staged, missed
      USING p, clock_timestamp(), mark_id, ks, tiers, dry, count_missed;
END $$;

-- A sweep call's review (the caller holds the pool's sweeper lock and has
-- validated its liveness tables; READ COMMITTED, so each statement below
-- sees what committed before it began): the keys of the oldest
-- `max_keys` rows of the pool's queue, then every row of those keys
-- committed by now — each row commits with its event's change, so the
-- check that follows, a later statement, sees every change these rows
-- stand for. The keys the pool still holds (an entry, or a file that is no
-- tombstone) and nothing protects are staged under a mark sealed now;
-- exactly the rows read are deleted (a row an event commits meanwhile
-- stays for the next review; nothing on a dry run). `reviewed` counts the
-- rows.
CREATE FUNCTION alkblobs.review(
    pl alkblobs.pools, max_keys integer, dry boolean, live_sql text,
    OUT reviewed bigint, OUT examined bigint, OUT pinned bigint, OUT candidates bigint, OUT staged bigint)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    batch bytea[];
    ids bigint[];
    ks bytea[];
    tiers text[];
    mark_id bigint;
    st record;
BEGIN
    reviewed := 0; examined := 0; pinned := 0; candidates := 0; staged := 0;
    SELECT coalesce(array_agg(DISTINCT x.key), '{}') INTO batch FROM (
        SELECT q.key FROM alkblobs.review_queue q
         WHERE q.pool = pl.id
         ORDER BY q.id LIMIT max_keys
           FOR UPDATE SKIP LOCKED) x;
    -- A dry run routes nothing, so it also reads the liveness deletions of
    -- the pool's tables still to be routed: the keys a real call would
    -- route, then review.
    IF dry THEN
        batch := ARRAY(SELECT DISTINCT b.key FROM (
            SELECT unnest(batch) AS key
            UNION ALL
            (SELECT r.key FROM alkblobs.released r
              WHERE r.relid::oid = ANY (alkblobs.fed_by(pl.id))
              LIMIT max_keys)) b);
    END IF;
    IF cardinality(batch) = 0 THEN
        RETURN;
    END IF;
    SELECT coalesce(array_agg(x.id), '{}') INTO ids FROM (
        SELECT q.id FROM alkblobs.review_queue q
         WHERE q.pool = pl.id AND q.key = ANY(batch)
           FOR UPDATE SKIP LOCKED) x;
    reviewed := cardinality(ids);
    -- (A key that is both an entry and a file, after a threshold change, is
    -- one candidate: its entry, as in the mark.)
    SELECT array_agg(s.key ORDER BY s.key), array_agg(s.tier ORDER BY s.key) INTO ks, tiers FROM (
        SELECT u.key, min(u.tier) AS tier FROM (
            SELECT e.key, e.tier FROM alkblobs.entries e WHERE e.pool = pl.id AND e.key = ANY(batch)
            UNION ALL
            SELECT f.key, 'local' FROM alkblobs.files f
             WHERE f.pool = pl.id AND f.key = ANY(batch) AND f.deleting_since IS NULL) u
         GROUP BY u.key) s;
    IF ks IS NOT NULL THEN
        examined := cardinality(ks);
        IF NOT dry THEN
            INSERT INTO alkblobs.marks (pool, delete_window)
            VALUES (pl.id, pl.delete_window) RETURNING id INTO mark_id;
        END IF;
        SELECT * INTO st FROM alkblobs.stage_unprotected(pl.id, ks, tiers, mark_id, dry, live_sql, false);
        -- Sealed once staged: the window runs from after the check.
        UPDATE alkblobs.marks mk SET mark_end = clock_timestamp() WHERE mk.id = mark_id;
        pinned := st.pinned;
        candidates := st.candidates;
        staged := st.staged;
    END IF;
    IF NOT dry THEN
        DELETE FROM alkblobs.review_queue q WHERE q.pool = pl.id AND q.id = ANY(ids);
    END IF;
END $$;

-- The audit ------------------------------------------------------------------------

-- Asks for an audit of a pool now (sweep access): the next sweep call
-- starts one. Returns the pool's collector: a 'mark' pool marks in every
-- sweep, so there is nothing to ask for.
CREATE FUNCTION @extschema@.alkblobs_request_audit(pool text) RETURNS text
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    pl alkblobs.pools := alkblobs.pool($1, 'sweep');
BEGIN
    PERFORM alkblobs.require_mode(pl, 'fleet', 'alkblobs_request_audit');
    PERFORM alkblobs.request_audit(pl.id, 'requested');
    RETURN pl.collector;
END $$;

-- An audit of a pool on demand: asks for one, then runs sweep calls until
-- it has marked the whole pool, committing between calls so that every
-- transaction stays bounded (like alkblobs_sweep_all; use with CALL
-- outside a transaction block). The calls also review the queue and
-- execute what is due, as any sweep does. Says how many keys the audit
-- staged and how many of those the queue had missed (each such key is an
-- event the queue should have seen: a bug to report). On a 'mark' pool,
-- one full mark (every sweep marks there). The same rules as
-- alkblobs_sweep_all: not SECURITY DEFINER, no SET clause, every operator
-- schema-qualified.
CREATE PROCEDURE @extschema@.alkblobs_audit(pool text, max_unlinks integer DEFAULT 1000)
LANGUAGE plpgsql AS $$
DECLARE
    r record;
    collector text;
    calls integer := 0;
    staged bigint := 0;
    missed bigint := 0;
    audits integer := 0;
BEGIN
    IF $1 IS NULL OR $2 IS NULL THEN
        RAISE EXCEPTION 'pool and max_unlinks must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    collector := @extschema@.alkblobs_request_audit($1);
    COMMIT;
    LOOP
        SELECT * INTO r FROM @extschema@.alkblobs_sweep($1, false, $2, true);
        calls := calls OPERATOR(pg_catalog.+) 1;
        IF r.aborted IS NOT NULL THEN
            RAISE NOTICE 'audit of pool "%" stopped: the sweep aborted (%)', $1, r.aborted;
            COMMIT;
            RETURN;
        END IF;
        IF r.audit IS NOT NULL OR collector OPERATOR(pg_catalog.=) 'mark' THEN
            staged := staged OPERATOR(pg_catalog.+) r.staged;
            missed := missed OPERATOR(pg_catalog.+) coalesce(r.missed, 0);
        END IF;
        COMMIT;
        -- Done once the requested audit sealed its mark (or another sweep
        -- finished it meanwhile: no audit under way); an audit that was
        -- under way is followed by the one that answers the request, which
        -- is the second to seal at the latest (events asking for more
        -- audits meanwhile do not keep this call running).
        IF r.mark_done AND r.audit IS NOT NULL THEN
            audits := audits OPERATOR(pg_catalog.+) 1;
        END IF;
        EXIT WHEN r.mark_done AND (r.audit IS NULL OR r.audit OPERATOR(pg_catalog.=) 'requested'
                                   OR audits OPERATOR(pg_catalog.>=) 2);
    END LOOP;
    RAISE NOTICE 'pool "%": audit done in % call(s): % keys staged, % of them missed by the review queue', $1, calls, staged, missed;
END $$;

-- Registrations from before 0.8.0 (an upgrade): their guards fire on
-- INSERT OR UPDATE only, and their tables have no TRUNCATE trigger, so the
-- installing role (the extension's owner, a superuser on most servers)
-- installs both now. A table it may not alter keeps its old guard, and
-- its pools keep the old collector until it is registered again.
DO $$
DECLARE
    r record;
    waited text := pg_catalog.current_setting('lock_timeout');
BEGIN
    -- A table busy for 10 s keeps its old guard rather than stall writers
    -- behind this upgrade's locks.
    PERFORM pg_catalog.set_config('lock_timeout', '10s', true);
    FOR r IN SELECT DISTINCT l.relid FROM alkblobs.liveness l
               JOIN pg_catalog.pg_class c ON c.oid = l.relid
              WHERE alkblobs.queue_problem(l.relid) IS NOT NULL
              ORDER BY l.relid LOOP
        BEGIN
            PERFORM alkblobs_registration.install_guard(r.relid::pg_catalog.regclass);
        EXCEPTION WHEN insufficient_privilege OR lock_not_available OR deadlock_detected THEN
            UPDATE alkblobs.pools p SET collector = 'mark'
             WHERE p.id IN (SELECT l.pool FROM alkblobs.liveness l WHERE l.relid = r.relid);
            DELETE FROM alkblobs.audit_requests a
             WHERE a.pool IN (SELECT l.pool FROM alkblobs.liveness l WHERE l.relid = r.relid);
            RAISE WARNING 'alkblobs: liveness table % keeps its old guard (%); its pools keep the full-mark collector until its owner registers it again and an admin sets collector => ''queue''', r.relid::pg_catalog.regclass, SQLERRM;
        END;
    END LOOP;
    PERFORM pg_catalog.set_config('lock_timeout', waited, true);
END $$;
