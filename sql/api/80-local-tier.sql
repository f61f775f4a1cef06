-- alkblobs SQL API, 80-local-tier.sql: The local tier: staging listed keys, the two-phase claim.
-- (sql/api/*.sql load in file-name order after bootstrap.sql and the Rust
-- functions; docs/design.md, "Layout". The rules of the whole API are in 10-helpers.sql's header.)

-- Staging keys the client listed (files on the pool's local tier) --------------

-- Stages client-listed keys that nothing protects right now; keys that are
-- entries in this database are the database's own sweep's business and are
-- skipped. One call is one mark: its rows become due at the end of this
-- call plus the pool's window. At most 100,000 keys per call.
CREATE FUNCTION @extschema@.alkblobs_stage(pool text, keys bytea[])
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    pl alkblobs.pools := alkblobs.pool($1, 'sweep');
    m bigint;
    n bigint;
    cs record;
BEGIN
    PERFORM alkblobs.require_read_committed('alkblobs_stage');
    PERFORM alkblobs.require_mode(pl, 'fleet', 'alkblobs_stage');
    PERFORM alkblobs.not_null($2, 'keys');
    IF EXISTS (SELECT 1 FROM unnest($2) k WHERE k IS NULL OR length(k) <> 32) THEN
        RAISE EXCEPTION 'every key is 32 bytes (a BLAKE3 hash)' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF cardinality($2) > 100000 THEN
        RAISE EXCEPTION 'at most 100000 keys per call, got %', cardinality($2) USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM alkblobs.take_lock(pl.id, false);
    pl := alkblobs.adopt(pl);
    SELECT * INTO cs FROM alkblobs.check_sources(pl.id);
    IF cs.problem IS NOT NULL THEN
        RAISE EXCEPTION 'liveness table %; nothing staged', cs.problem
            USING ERRCODE = CASE WHEN cs.busy THEN 'lock_not_available' ELSE 'AB004' END,
                  HINT = CASE WHEN cs.busy THEN 'Retry when the DDL is done.' ELSE 'Fix the table and register it again, or unregister it.' END;
    END IF;
    INSERT INTO alkblobs.marks (pool, delete_window) VALUES (pl.id, pl.delete_window) RETURNING id INTO m;
    EXECUTE format($q$
        INSERT INTO alkblobs.staged (pool, key, tier, mark)
        SELECT DISTINCT $1, c.key, 'local', $2 FROM unnest($3::bytea[]) AS c(key)
         WHERE NOT EXISTS (SELECT 1 FROM alkblobs.entries e WHERE e.pool = $1 AND e.key = c.key)
           AND NOT EXISTS (SELECT 1 FROM alkblobs.staged s WHERE s.pool = $1 AND s.key = c.key)
           AND NOT EXISTS (SELECT 1 FROM alkblobs.pins pn WHERE pn.pool = $1 AND pn.key = c.key AND pn.expires_at > clock_timestamp())
           AND NOT (%s)
        ON CONFLICT (pool, key) DO NOTHING$q$, alkblobs.live_predicate(pl.id, 'c.key'))
        USING pl.id, m, $2;
    GET DIAGNOSTICS n = ROW_COUNT;
    UPDATE alkblobs.marks mk SET mark_end = clock_timestamp() WHERE mk.id = m;
    RETURN n;
END $$;

-- A node with the pool's shared tier listed all of it from `listed_from`
-- on (a time this database gave it, read before the listing began) and
-- staged what it found with alkblobs_stage: the listing that was due is
-- done, unless a mark sealed after `listed_from` (its listing is still
-- due). Returns whether one is still due. Sweep access.
CREATE FUNCTION @extschema@.alkblobs_tier_listed(pool text, listed_from timestamptz)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    pl alkblobs.pools := alkblobs.pool($1, 'sweep');
    due timestamptz;
BEGIN
    PERFORM alkblobs.require_mode(pl, 'fleet', 'alkblobs_tier_listed');
    PERFORM alkblobs.not_null($2, 'listed_from');
    -- (Never a time after now: a later one would clear listings of seals
    -- to come.)
    UPDATE alkblobs.pools p SET tier_listing_due = NULL
     WHERE p.id = pl.id AND p.tier_listing_due <= least($2, clock_timestamp());
    SELECT p.tier_listing_due INTO due FROM alkblobs.pools p WHERE p.id = pl.id;
    RETURN due IS NOT NULL;
END $$;

-- Of `ks` (whose entry or staged rows this transaction holds FOR UPDATE),
-- the keys that must not be deleted now: an un-expired pin, a row in a
-- registered liveness table (a new statement: READ COMMITTED sees every
-- commit before it), or a pin row someone is changing right now (a renewal,
-- an upsert or an unpin in flight: its outcome is unknown, so the key
-- waits). The pin rows it can lock stay locked, so a renewal that starts
-- later waits for this transaction and then finds the pin expired.
CREATE FUNCTION alkblobs.protected(p integer, ks bytea[], live_sql text, OUT keep bytea[], OUT busy bytea[])
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    WITH mine AS (
        SELECT pn.key, pn.role, pn.owner FROM alkblobs.pins pn
         WHERE pn.pool = p AND pn.key = ANY(ks) FOR UPDATE SKIP LOCKED)
    SELECT array_agg(DISTINCT a.key) INTO busy FROM alkblobs.pins a
     WHERE a.pool = p AND a.key = ANY(ks)
       AND NOT EXISTS (SELECT 1 FROM mine m WHERE m.key = a.key AND m.role = a.role AND m.owner = a.owner);
    EXECUTE format($q$
        SELECT array_agg(c.key) FROM unnest($1::bytea[]) AS c(key)
         WHERE EXISTS (SELECT 1 FROM alkblobs.pins pn WHERE pn.pool = $2 AND pn.key = c.key AND pn.expires_at > clock_timestamp())
            OR (%s)$q$, live_sql)
        INTO keep USING ks, p;
    keep := coalesce(keep, '{}');
    busy := coalesce(busy, '{}');
END $$;

-- The executor for the local tier's files, phase 1: re-arbitrates due
-- 'local' rows and returns the dead keys, their staged rows deleted and
-- their alkblobs.files rows turned into tombstones (not published,
-- deleting_since set). The caller commits, then unlinks the files, then
-- removes the tombstones (alkblobs_local_deleted). From the commit on, a
-- liveness write naming one of these keys fails with AB002 and a pin_new
-- with 55006, so nothing can come to rely on a file the caller is about
-- to unlink; before it, they wait. Tombstones a caller left (it died
-- between the phases) are handed out again by the next call, first.
-- Keys someone is locking (staged row, file row or pin row) are passed
-- over, not waited for. At most `max_keys` (≤ 10,000) of each kind.
CREATE FUNCTION @extschema@.alkblobs_claim_local(pool text, max_keys integer DEFAULT 1000)
RETURNS SETOF bytea
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    pl alkblobs.pools := alkblobs.pool($1, 'sweep');
    batch bytea[];
    ours bytea[];
    locked bytea[];
    pr record;
    dead bytea[];
    cs record;
BEGIN
    PERFORM alkblobs.require_read_committed('alkblobs_claim_local');
    PERFORM alkblobs.require_mode(pl, 'fleet', 'alkblobs_claim_local');
    PERFORM alkblobs.not_null($2, 'max_keys');
    IF $2 < 0 OR $2 > 10000 THEN
        RAISE EXCEPTION 'max_keys must be between 0 and 10000, got %', $2 USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF NOT alkblobs.take_lock(pl.id, true) THEN
        RAISE NOTICE 'another sweeper holds pool "%"; nothing claimed', pl.name;
        RETURN;
    END IF;
    pl := alkblobs.adopt(pl);
    SELECT * INTO cs FROM alkblobs.check_sources(pl.id);
    IF cs.problem IS NOT NULL THEN
        RAISE EXCEPTION 'liveness table %; nothing claimed', cs.problem
            USING ERRCODE = CASE WHEN cs.busy THEN 'lock_not_available' ELSE 'AB004' END,
                  HINT = CASE WHEN cs.busy THEN 'Retry when the DDL is done.' ELSE 'Fix the table and register it again, or unregister it.' END;
    END IF;
    SELECT array_agg(x.key ORDER BY x.key) INTO batch FROM (
        SELECT s.key FROM alkblobs.staged s JOIN alkblobs.marks mk ON mk.id = s.mark
         WHERE s.pool = pl.id AND s.tier = 'local'
           AND mk.mark_end IS NOT NULL AND mk.mark_end + mk.delete_window <= clock_timestamp()
         ORDER BY s.key LIMIT $2
           FOR UPDATE OF s SKIP LOCKED) x;
    -- Tombstones of claims whose claimer has not confirmed the delete
    -- (it died, or is still at it: unlinking twice is harmless, and nobody
    -- can record these keys meanwhile): handed out again, first. Their
    -- first claimer may only be stopped, and send its delete whenever it
    -- resumes: on an s3 tier the claimer that finishes moves the key's
    -- fence one past the generation handed out (alkblobs_local_deleted),
    -- so the key, recorded afresh, names an object that delete cannot.
    RETURN QUERY
        SELECT t.key FROM (
            SELECT f.key FROM alkblobs.files f
             WHERE f.pool = pl.id AND f.deleting_since IS NOT NULL
             ORDER BY f.key LIMIT $2 FOR UPDATE SKIP LOCKED) t
         ORDER BY t.key;
    IF batch IS NULL THEN
        RETURN;
    END IF;
    -- A liveness writer or pin_new in flight holds the key's file row.
    -- (A staged key with no file row is a file nobody recorded: it is
    -- claimed like any other.)
    SELECT array_agg(f.key ORDER BY f.key) INTO locked FROM (
        SELECT x.key FROM alkblobs.files x WHERE x.pool = pl.id AND x.key = ANY(batch)
         ORDER BY x.key FOR UPDATE SKIP LOCKED) f;
    ours := ARRAY(SELECT b FROM unnest(batch) b
                   WHERE b = ANY(coalesce(locked, '{}'))
                      OR NOT EXISTS (SELECT 1 FROM alkblobs.files x WHERE x.pool = pl.id AND x.key = b)
                   ORDER BY b);
    IF cardinality(ours) = 0 THEN
        RETURN;
    END IF;
    SELECT * INTO pr FROM alkblobs.protected(pl.id, ours, alkblobs.live_predicate(pl.id, 'c.key'));
    dead := ARRAY(SELECT k FROM unnest(ours) k EXCEPT SELECT k FROM unnest(pr.keep || pr.busy) k);
    -- Protected keys are unstaged (a later mark restages them if need be);
    -- keys whose pins someone is changing stay staged for the next claim.
    DELETE FROM alkblobs.staged s WHERE s.pool = pl.id AND s.key = ANY(ours) AND NOT (s.key = ANY(pr.busy));
    -- Tombstones (also for a dead file nobody recorded, so that a pin_new
    -- of its key cannot slip in before it is unlinked; its objects can be
    -- of any generation up to the key's fence).
    INSERT INTO alkblobs.files AS f (pool, key, published, deleting_since, generation)
    SELECT pl.id, d, false, clock_timestamp(),
           coalesce((SELECT ff.generation FROM alkblobs.file_fences ff WHERE ff.pool = pl.id AND ff.key = d), 0)
      FROM unnest(dead) d ORDER BY d
    ON CONFLICT ON CONSTRAINT files_pkey DO UPDATE SET published = false, deleting_since = clock_timestamp();
    RETURN QUERY SELECT d FROM unnest(dead) d ORDER BY d;
END $$;

-- Phase 2 of a claim, in one transaction: alkblobs_local_deleting(pool,
-- keys) locks the tombstones of `keys` (waiting for another claimer that
-- holds one) and returns the keys that are still tombstones — the files
-- the caller may unlink now; the caller unlinks exactly those and removes
-- their tombstones with alkblobs_local_deleted, then commits. A second
-- claimer handed the same tombstone (its first claimer looked dead) waits
-- here, then finds it gone and unlinks nothing — even if the key was
-- published afresh meanwhile. A caller that dies releases the locks and
-- leaves the tombstones for the next claim. At most 10,000 keys.
CREATE FUNCTION @extschema@.alkblobs_local_deleting(pool text, keys bytea[])
RETURNS SETOF bytea
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RETURN QUERY SELECT g.key FROM @extschema@.alkblobs_local_deleting_generations($1, $2) g;
END $$;

-- alkblobs_local_deleting with each tombstone's generation (0.8.0): the
-- caller deletes the key's objects of generations up to it (on s3, the
-- key's own name and its `.gN` names for N up to it; a local tier has
-- only the key's own name), never a later one.
CREATE FUNCTION @extschema@.alkblobs_local_deleting_generations(pool text, keys bytea[])
RETURNS TABLE (key bytea, generation bigint)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    pl alkblobs.pools := alkblobs.pool($1, 'sweep');
BEGIN
    PERFORM alkblobs.require_read_committed('alkblobs_local_deleting_generations');
    PERFORM alkblobs.require_mode(pl, 'fleet', 'alkblobs_local_deleting_generations');
    PERFORM alkblobs.not_null($2, 'keys');
    PERFORM alkblobs.max_keys($2, 10000);
    RETURN QUERY
        SELECT t.key, t.generation FROM (
            SELECT f.key, f.generation FROM alkblobs.files f
             WHERE f.pool = pl.id AND f.key = ANY($2) AND f.deleting_since IS NOT NULL
             ORDER BY f.key FOR UPDATE) t;
END $$;

-- Removes the tombstones of files the caller unlinked (see above); at most
-- 10,000 keys. Returns how many it removed. Until then the keys cannot be
-- recorded afresh (alkblobs_pin_new: 55006). On an s3 tier each key's
-- fence moves one past the generation its tombstone carried, and the key
-- recorded afresh names an object no earlier delete can: not the one of
-- a claimer that was handed this tombstone before and is only stopped,
-- nor an attempt of this caller's delete its HTTP client counted as
-- failed and retried (a proxy answered 502 while its upstream ran it, or
-- replays it later) (0.8.0).
CREATE FUNCTION @extschema@.alkblobs_local_deleted(pool text, keys bytea[])
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    pl alkblobs.pools := alkblobs.pool($1, 'sweep');
    n bigint;
BEGIN
    PERFORM alkblobs.require_mode(pl, 'fleet', 'alkblobs_local_deleted');
    PERFORM alkblobs.not_null($2, 'keys');
    PERFORM alkblobs.max_keys($2, 10000);
    WITH d AS (
        DELETE FROM alkblobs.files f
         WHERE f.pool = pl.id AND f.key = ANY($2) AND f.deleting_since IS NOT NULL
        RETURNING f.key, f.generation),
    fenced AS (
        INSERT INTO alkblobs.file_fences AS ff (pool, key, generation)
        SELECT pl.id, d.key, d.generation + 1 FROM d WHERE pl.large_tier = 's3' ORDER BY d.key
        ON CONFLICT ON CONSTRAINT file_fences_pkey DO UPDATE
           SET generation = greatest(ff.generation, excluded.generation), fenced_at = clock_timestamp())
    SELECT count(*) INTO n FROM d;
    RETURN n;
END $$;
