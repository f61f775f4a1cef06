-- alkblobs SQL API, 94-verify.sql: what `alkblobs verify` checks a pool
-- against — the record of what must exist — and where it keeps what it
-- found (alkblobs_health reads it).
-- (sql/api/*.sql load in file-name order after bootstrap.sql and the Rust
-- functions; docs/design.md, "Layout". The rules of the whole API are in 10-helpers.sql's header.)

-- The record of what must exist ----------------------------------------------

-- A verify walks the pool's record, never the tier's listing: a tier that
-- lost an object lists nothing for it, so a walk of the listing cannot see
-- the loss. The record is every key the pool holds (entries of either tier,
-- file records of a shared tier) and every key something references (a
-- single-instance pool's roots, the rows of its registered liveness
-- tables). Pins are not references: a pin comes before its content.
--
-- One row per key, ascending: `record` says what the pool holds —
--   'kv', 'lo'      an entry (inline bytes; a large object);
--   'lo_lost'       an entry whose large object is gone (pg_largeobject
--                   has no such object): content lost, whatever reads it;
--   'file'          a published file record (local or s3 tier): the tier
--                   must hold the object of `generation`;
--   'in_flight'     a file record not yet published: a put in progress,
--                   not a loss;
--   'deleting'      a tombstone: a sweep is deleting it, not a loss;
--   NULL            nothing: only references name the key (or, in a
--                   page, nothing at all any more: a key the page picked
--                   and a sweep deleted since, kept so that the page is
--                   not short);
-- `size` is the entry's (NULL for file records: the tier knows it);
-- `refs` names what references the key: 'root', or 'liveness <table>'
-- (with ' (forward references)' for a table registered to accept keys not
-- yet put: such a reference alone names no loss).
--
-- Pages: `ks` NULL pages through the record after `after` (NULL: from the
-- start), at most `lim` keys; otherwise exactly the keys `ks` (a re-check).
-- A registered table is read only if the caller may SELECT it and it
-- passes validation now (as in alkblobs_explain, inside a subtransaction
-- that is rolled back, so the lock it takes is not held); the others are
-- reported by alkblobs_verify_sources. Each source gives its first `lim`
-- keys after `after`, so any key in the page's first `lim` of the union
-- is in each source's first `lim` that holds it: the references of every
-- key returned are complete. After the keys, one row per source skipped
-- while this call read it (key NULL, record 'unchecked', refs {source,
-- problem}): a run that got one is not whole.
CREATE FUNCTION alkblobs.verify_rows(pl alkblobs.pools, after bytea, lim integer, ks bytea[], with_refs boolean)
RETURNS TABLE (key bytea, record text, size bigint, generation bigint, refs text[])
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    keys bytea[] := '{}';
    ref_keys bytea[] := '{}';
    ref_names text[] := '{}';
    l record;
    ls record;
    got bytea[];
    paging boolean := ks IS NULL;
    skipped text[] := '{}';
    skip_why text[] := '{}';
BEGIN
    IF paging THEN
        keys := keys
            || ARRAY(SELECT e.key FROM alkblobs.entries e WHERE e.pool = pl.id AND (after IS NULL OR e.key > after)
                      ORDER BY e.key LIMIT lim)
            || ARRAY(SELECT f.key FROM alkblobs.files f WHERE f.pool = pl.id AND (after IS NULL OR f.key > after)
                      ORDER BY f.key LIMIT lim)
            || ARRAY(SELECT r.key FROM alkblobs.single_roots r WHERE r.pool = pl.id AND (after IS NULL OR r.key > after)
                      ORDER BY r.key LIMIT lim);
    END IF;
    FOR l IN SELECT lv.relid, lv.forward_refs FROM alkblobs.liveness lv JOIN pg_catalog.pg_class c ON c.oid = lv.relid
              WHERE lv.pool = pl.id AND with_refs ORDER BY lv.relid LOOP
        IF NOT pg_catalog.has_table_privilege(session_user, l.relid, 'SELECT') THEN
            skipped := skipped || format('liveness %s', l.relid::regclass);
            skip_why := skip_why || 'not readable by you'::text;
            CONTINUE;
        END IF;
        got := NULL;
        BEGIN
            SELECT * INTO ls FROM alkblobs.lock_source(l.relid);
            IF NOT ls.gone AND ls.problem IS NULL THEN
                IF ks IS NULL THEN
                    EXECUTE format('SELECT ARRAY(SELECT DISTINCT lv.key FROM %s lv WHERE ($1 IS NULL OR lv.key > $1) AND lv.key IS NOT NULL ORDER BY lv.key LIMIT $2)',
                                   alkblobs.source_name(l.relid))
                       INTO got USING after, lim;
                ELSE
                    EXECUTE format('SELECT ARRAY(SELECT DISTINCT lv.key FROM %s lv WHERE lv.key = ANY ($1))',
                                   alkblobs.source_name(l.relid))
                       INTO got USING ks;
                END IF;
            END IF;
            RAISE EXCEPTION USING ERRCODE = 'AB999';
        EXCEPTION WHEN SQLSTATE 'AB999' THEN
            NULL;
        END;
        -- A table someone's DDL holds: the page cannot be complete, so it
        -- is refused (retryable), never silently short of its references.
        -- One that fails validation is skipped here and reported by
        -- alkblobs_verify_sources (a run with such a source is never whole).
        IF ls.busy THEN
            RAISE EXCEPTION 'liveness table % is locked by DDL in progress; verify again in a moment', l.relid::regclass
                USING ERRCODE = 'lock_not_available';
        END IF;
        IF NOT ls.gone AND ls.problem IS NOT NULL THEN
            skipped := skipped || format('liveness %s', l.relid::regclass);
            skip_why := skip_why || ('refused: it ' || ls.problem);
        END IF;
        CONTINUE WHEN got IS NULL;
        IF paging THEN
            keys := keys || got;
        END IF;
        ref_keys := ref_keys || got;
        ref_names := ref_names || array_fill(format('liveness %s%s', l.relid::regclass,
                                                    CASE WHEN l.forward_refs THEN ' (forward references)' ELSE '' END),
                                             ARRAY[cardinality(got)]);
    END LOOP;
    IF paging THEN
        ks := ARRAY(SELECT DISTINCT k FROM unnest(keys) k ORDER BY k LIMIT lim);
    END IF;
    RETURN QUERY
    SELECT x.* FROM (
    SELECT k.key AS key,
           CASE WHEN e.tier = 'kv' THEN 'kv'
                WHEN e.tier = 'lo' AND EXISTS (SELECT 1 FROM pg_catalog.pg_largeobject_metadata m WHERE m.oid = e.loid) THEN 'lo'
                WHEN e.tier = 'lo' THEN 'lo_lost'
                WHEN f.published THEN 'file'
                WHEN f.deleting_since IS NOT NULL THEN 'deleting'
                WHEN f.key IS NOT NULL THEN 'in_flight' END AS record,
           e.size AS size,
           f.generation AS generation,
           CASE WHEN r.key IS NULL THEN '{}'::text[] ELSE ARRAY['root'] END || coalesce(rf.names, '{}') AS refs
      FROM (SELECT DISTINCT u AS key FROM unnest(ks) u) k
      LEFT JOIN alkblobs.entries e ON e.pool = pl.id AND e.key = k.key
      LEFT JOIN alkblobs.files f ON f.pool = pl.id AND f.key = k.key
      LEFT JOIN alkblobs.single_roots r ON r.pool = pl.id AND r.key = k.key
      -- (The references, grouped once: a hash join, not a scan per key.)
      LEFT JOIN (SELECT g.key, array_agg(g.name ORDER BY g.name) AS names
                   FROM unnest(ref_keys, ref_names) g(key, name) GROUP BY g.key) rf ON rf.key = k.key) x
     -- (A key nothing records or references is not in the record; but a
     -- page keeps every key it picked, even one a sweep deleted since: a
     -- page emptied that way would end the walk early.)
     WHERE x.record IS NOT NULL OR cardinality(x.refs) > 0 OR paging
     ORDER BY x.key;
    -- Then one row per source skipped here (key NULL, record
    -- 'unchecked', refs {source, problem}): a table that failed
    -- validation, or that the caller could no longer read, while this page
    -- was read. The run that got it is not whole.
    RETURN QUERY SELECT NULL::bytea, 'unchecked'::text, NULL::bigint, NULL::bigint, ARRAY[s.src, s.why]
                   FROM unnest(skipped, skip_why) s(src, why);
END $$;

-- The record of pool `pool` after key `after`, at most `lim` keys (1 to
-- 10,000), ascending; see alkblobs.verify_rows. READ COMMITTED only.
CREATE FUNCTION @extschema@.alkblobs_verify_records(pool text, after bytea DEFAULT NULL, lim integer DEFAULT 1000)
RETURNS TABLE (key bytea, record text, size bigint, generation bigint, refs text[])
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    pl alkblobs.pools := alkblobs.pool($1, 'read');
BEGIN
    PERFORM alkblobs.require_read_committed('alkblobs_verify_records');
    PERFORM alkblobs.not_null($3, 'lim');
    IF $3 < 1 OR $3 > 10000 THEN
        RAISE EXCEPTION 'lim must be between 1 and 10000, not %', $3 USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN QUERY SELECT * FROM alkblobs.verify_rows(pl, $2, $3, NULL, true);
END $$;

-- The record of exactly `keys` (at most 10,000) now: what a verify
-- re-checks before it calls a key missing (a sweep may have claimed it, a
-- put may have recorded it, since the page was read); a key nothing
-- records or references has no row. `with_refs` false leaves the liveness
-- tables unread (what a tier's listing is compared with: only what the
-- pool holds). READ COMMITTED only.
CREATE FUNCTION @extschema@.alkblobs_verify_lookup(pool text, keys bytea[], with_refs boolean DEFAULT true)
RETURNS TABLE (key bytea, record text, size bigint, generation bigint, refs text[])
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    pl alkblobs.pools := alkblobs.pool($1, 'read');
BEGIN
    PERFORM alkblobs.require_read_committed('alkblobs_verify_lookup');
    PERFORM alkblobs.not_null($2, 'keys');
    IF cardinality($2) > 10000 THEN
        RAISE EXCEPTION 'at most 10000 keys per call, not %', cardinality($2) USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM alkblobs.not_null($3, 'with_refs');
    RETURN QUERY SELECT * FROM alkblobs.verify_rows(pl, NULL, 0, $2, $3);
END $$;

-- The references a verify of pool `pool` by the caller cannot check: each
-- registered liveness table the caller may not read, or that fails
-- validation now (its rows are not read, so a key only it names is not
-- checked). Empty when every reference is checked.
CREATE FUNCTION @extschema@.alkblobs_verify_sources(pool text)
RETURNS TABLE (source text, problem text)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    pl alkblobs.pools := alkblobs.pool($1, 'read');
    l record;
    ls record;
    prob text;
BEGIN
    FOR l IN SELECT lv.relid FROM alkblobs.liveness lv JOIN pg_catalog.pg_class c ON c.oid = lv.relid
              WHERE lv.pool = pl.id ORDER BY lv.relid LOOP
        source := format('liveness %s', l.relid::regclass);
        IF NOT pg_catalog.has_table_privilege(session_user, l.relid, 'SELECT') THEN
            problem := 'not readable by you';
            RETURN NEXT;
            CONTINUE;
        END IF;
        -- The check verify_rows makes (inside a subtransaction rolled
        -- back: the lock is not kept), so that a source this reports as
        -- fine is one the walk reads.
        prob := NULL;
        BEGIN
            SELECT * INTO ls FROM alkblobs.lock_source(l.relid);
            IF NOT ls.gone THEN
                prob := ls.problem;
            END IF;
            RAISE EXCEPTION USING ERRCODE = 'AB999';
        EXCEPTION WHEN SQLSTATE 'AB999' THEN
            NULL;
        WHEN OTHERS THEN
            prob := 'cannot be checked: ' || SQLERRM;
        END;
        IF prob IS NOT NULL THEN
            problem := 'refused: it ' || prob;
            RETURN NEXT;
        END IF;
    END LOOP;
END $$;

-- The large objects pool `pool` created for uploads (alkblobs_lo_create)
-- whose transaction ended without alkblobs_lo_commit: no entry references
-- them, and the pool's next sweep unlinks them (uploads_reaped). `bytes`
-- NULL: the object is gone already. What a verify reports beside the
-- tier's unrecorded objects; read access.
CREATE FUNCTION @extschema@.alkblobs_verify_abandoned(pool text)
RETURNS TABLE (loid oid, bytes bigint, started_at timestamptz)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    pl alkblobs.pools := alkblobs.pool($1, 'read');
BEGIN
    RETURN QUERY SELECT u.loid, alkblobs.lo_size(u.loid), u.started_at FROM alkblobs.uploads u
                  WHERE u.pool = pl.id AND NOT alkblobs.upload_running(u.xact)
                  ORDER BY u.loid;
END $$;

-- What a verify found ---------------------------------------------------------

-- Records the outcome of a verify of pool `pool` that started at `started`:
-- `whole` when it walked the whole record (not a slice), how many keys it
-- checked and their bytes, how many it found missing (recorded or
-- referenced, content gone) or corrupt, and how many objects of the tier
-- no record names. A run that found content missing or corrupt marks the
-- pool (alkblobs_health is 'critical' from then on); only a whole run
-- that started after the mark and found nothing missing or corrupt clears
-- it. A run is whole only if it walked every key and the caller could read
-- every registered liveness table now valid (alkblobs_verify_sources
-- empty): otherwise it is recorded as a slice. Needs sweep access (a
-- reader, or the monitoring role, must not clear a pool's alarm): the
-- database cannot read a shared tier itself, it keeps what the client
-- found, and who ran it.
CREATE FUNCTION @extschema@.alkblobs_verify_finished(pool text, started timestamptz, whole boolean, checked bigint,
                                                     bytes bigint, missing bigint, corrupt bigint, unrecorded bigint)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    pl alkblobs.pools := alkblobs.pool($1, 'sweep');
    bad boolean;
    is_whole boolean;
BEGIN
    PERFORM alkblobs.not_null($2, 'started');
    PERFORM alkblobs.not_null($3, 'whole');
    IF $4 IS NULL OR $5 IS NULL OR $6 IS NULL OR $7 IS NULL OR $8 IS NULL THEN
        RAISE EXCEPTION 'the counts must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF least($4, $5, $6, $7, $8) < 0 THEN
        RAISE EXCEPTION 'the counts must not be negative' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    bad := $6 > 0 OR $7 > 0;
    is_whole := $3 AND NOT EXISTS (SELECT 1 FROM @extschema@.alkblobs_verify_sources($1));
    -- (A start in the future, from a client whose clock runs ahead, is
    -- taken as now: it must not pass for a run that began after damage
    -- another run found meanwhile.)
    INSERT INTO alkblobs.verifies AS v (pool, role, started, finished, whole, checked, bytes, missing, corrupt, unrecorded,
                                        damaged_since, last_damage)
    VALUES (pl.id, session_user, least($2, clock_timestamp()), clock_timestamp(), is_whole, $4, $5, $6, $7, $8,
            CASE WHEN bad THEN clock_timestamp() END, CASE WHEN bad THEN clock_timestamp() END)
    ON CONFLICT ON CONSTRAINT verifies_pkey DO UPDATE
       SET role = EXCLUDED.role, started = EXCLUDED.started, finished = EXCLUDED.finished, whole = EXCLUDED.whole,
           checked = EXCLUDED.checked, bytes = EXCLUDED.bytes, missing = EXCLUDED.missing,
           corrupt = EXCLUDED.corrupt, unrecorded = EXCLUDED.unrecorded,
           -- Cleared only by a whole run that started after the last run
           -- that found damage finished (a long run must not clear what a
           -- slice found while it ran).
           damaged_since = CASE WHEN bad THEN coalesce(v.damaged_since, clock_timestamp())
                                WHEN EXCLUDED.whole AND EXCLUDED.started > coalesce(v.last_damage, v.damaged_since) THEN NULL
                                ELSE v.damaged_since END,
           last_damage = CASE WHEN bad THEN clock_timestamp()
                              WHEN EXCLUDED.whole AND EXCLUDED.started > coalesce(v.last_damage, v.damaged_since) THEN NULL
                              ELSE v.last_damage END;
END $$;
