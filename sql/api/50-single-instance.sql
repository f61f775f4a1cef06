-- alkblobs SQL API, 50-single-instance.sql: Single-instance pools: the owning instance's staged rows, roots and deletes.
-- (sql/api/*.sql load in file-name order after bootstrap.sql and the Rust
-- functions; docs/design.md, "Layout". The rules of the whole API are in 10-helpers.sql's header.)

-- Single-instance pools (pools.mode = 'single') ------------------------------------
--
-- One store instance owns such a pool and collects it with its in-process
-- arbiter: it decides what is dead (its pins are in its memory) and deletes
-- through alkblobs_delete; its staged candidates and roots are durable rows
-- here, read and written through the functions below. Nothing in this
-- section works on a fleet pool (22023), and the extension's sweep refuses
-- a single-instance pool.

-- Deletes entries (and their large objects) of a single-instance pool; at
-- most 1,000 keys per call. Returns each deleted key and its size.
CREATE FUNCTION @extschema@.alkblobs_delete(pool text, keys bytea[])
RETURNS TABLE (key bytea, size bigint)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    pl alkblobs.pools := alkblobs.pool($1, 'sweep');
    r record;
BEGIN
    PERFORM alkblobs.require_mode(pl, 'single', 'alkblobs_delete');
    PERFORM alkblobs.not_null($2, 'keys');
    IF cardinality($2) > 1000 THEN
        RAISE EXCEPTION 'at most 1000 keys per call, got %', cardinality($2) USING ERRCODE = 'invalid_parameter_value';
    END IF;
    FOR r IN DELETE FROM alkblobs.entries e WHERE e.pool = pl.id AND e.key = ANY($2)
             RETURNING e.key, e.size, e.loid LOOP
        -- (A large object already gone: the entry goes, nothing to unlink.)
        IF r.loid IS NOT NULL
           AND EXISTS (SELECT 1 FROM pg_catalog.pg_largeobject_metadata m WHERE m.oid = r.loid) THEN
            PERFORM pg_catalog.lo_unlink(r.loid);
        END IF;
        key := r.key;
        size := r.size;
        RETURN NEXT;
    END LOOP;
END $$;

-- The single-instance arbiter's staged rows: stage (unsealed), seal,
-- reseal (move earlier), discard unsealed, due / staged pages, unstage.
-- Times are the client's Unix milliseconds (its clock decides its window).
CREATE FUNCTION @extschema@.alkblobs_single_stage(pool text, keys bytea[], now_ms bigint)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    pl alkblobs.pools := alkblobs.pool($1, 'sweep');
    n bigint;
BEGIN
    PERFORM alkblobs.require_mode(pl, 'single', 'alkblobs_single_stage');
    PERFORM alkblobs.not_null($2, 'keys');
    PERFORM alkblobs.max_keys($2, 10000);
    PERFORM alkblobs.not_null($3, 'now_ms');
    IF EXISTS (SELECT 1 FROM unnest($2) k WHERE k IS NULL OR length(k) <> 32) THEN
        RAISE EXCEPTION 'every key is 32 bytes (a BLAKE3 hash)' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    INSERT INTO alkblobs.single_staged (pool, key, staged_at_ms)
    SELECT DISTINCT pl.id, k, $3 FROM unnest($2) k
    ON CONFLICT ON CONSTRAINT single_staged_pkey DO NOTHING;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END $$;

-- op: 'seal' (unsealed rows get visible_after_ms = v), 'reseal' (sealed
-- rows later than v move to v), 'discard' (unsealed rows go).
CREATE FUNCTION @extschema@.alkblobs_single_seal(pool text, op text, v bigint)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    pl alkblobs.pools := alkblobs.pool($1, 'sweep');
    n bigint;
BEGIN
    PERFORM alkblobs.require_mode(pl, 'single', 'alkblobs_single_seal');
    PERFORM alkblobs.not_null($2, 'op');
    IF $2 = 'seal' THEN
        PERFORM alkblobs.not_null($3, 'v');
        UPDATE alkblobs.single_staged s SET visible_after_ms = $3 WHERE s.pool = pl.id AND s.visible_after_ms IS NULL;
    ELSIF $2 = 'reseal' THEN
        PERFORM alkblobs.not_null($3, 'v');
        UPDATE alkblobs.single_staged s SET visible_after_ms = $3 WHERE s.pool = pl.id AND s.visible_after_ms > $3;
    ELSIF $2 = 'discard' THEN
        DELETE FROM alkblobs.single_staged s WHERE s.pool = pl.id AND s.visible_after_ms IS NULL;
    ELSE
        RAISE EXCEPTION 'op must be ''seal'', ''reseal'' or ''discard'', got %', quote_literal($2) USING ERRCODE = 'invalid_parameter_value';
    END IF;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END $$;

-- Staged rows with key > after, ascending, at most lim (1 to 100,000);
-- only those due at due_at_ms if it is not NULL.
CREATE FUNCTION @extschema@.alkblobs_single_staged(pool text, after bytea, lim integer, due_at_ms bigint DEFAULT NULL)
RETURNS TABLE (key bytea, staged_at_ms bigint, visible_after_ms bigint)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    pl alkblobs.pools := alkblobs.pool($1, 'read');
BEGIN
    PERFORM alkblobs.require_mode(pl, 'single', 'alkblobs_single_staged');
    PERFORM alkblobs.not_null($3, 'lim');
    IF $3 < 1 OR $3 > 100000 THEN
        RAISE EXCEPTION 'lim must be between 1 and 100000, got %', $3 USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN QUERY
        SELECT s.key, s.staged_at_ms, s.visible_after_ms FROM alkblobs.single_staged s
         WHERE s.pool = pl.id AND s.key > coalesce($2, '\x'::bytea)
           AND ($4 IS NULL OR s.visible_after_ms <= $4)
         ORDER BY s.key LIMIT $3;
END $$;

CREATE FUNCTION @extschema@.alkblobs_single_unstage(pool text, keys bytea[])
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    pl alkblobs.pools := alkblobs.pool($1, 'write');
    n bigint;
BEGIN
    PERFORM alkblobs.require_mode(pl, 'single', 'alkblobs_single_unstage');
    PERFORM alkblobs.not_null($2, 'keys');
    PERFORM alkblobs.max_keys($2, 10000);
    DELETE FROM alkblobs.single_staged s WHERE s.pool = pl.id AND s.key = ANY($2);
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END $$;

-- Roots: add (true) or remove (false) keys; returns how many changed.
CREATE FUNCTION @extschema@.alkblobs_single_roots_set(pool text, keys bytea[], present boolean)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    pl alkblobs.pools := alkblobs.pool($1, 'write');
    n bigint;
BEGIN
    PERFORM alkblobs.require_mode(pl, 'single', 'alkblobs_single_roots_set');
    PERFORM alkblobs.not_null($2, 'keys');
    PERFORM alkblobs.not_null($3, 'present');
    PERFORM alkblobs.max_keys($2, 10000);
    IF NOT $3 THEN
        -- Removing roots lets the owner's sweep collect them: sweep access.
        PERFORM alkblobs.pool($1, 'sweep');
    END IF;
    IF EXISTS (SELECT 1 FROM unnest($2) k WHERE k IS NULL OR length(k) <> 32) THEN
        RAISE EXCEPTION 'every key is 32 bytes (a BLAKE3 hash)' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF $3 THEN
        INSERT INTO alkblobs.single_roots (pool, key) SELECT DISTINCT pl.id, k FROM unnest($2) k
        ON CONFLICT ON CONSTRAINT single_roots_pkey DO NOTHING;
    ELSE
        DELETE FROM alkblobs.single_roots r WHERE r.pool = pl.id AND r.key = ANY($2);
    END IF;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END $$;

-- Roots with key > after, ascending, at most lim (1 to 100,000); or, with
-- keys given, which of them are roots.
CREATE FUNCTION @extschema@.alkblobs_single_roots(pool text, after bytea, lim integer, keys bytea[] DEFAULT NULL)
RETURNS SETOF bytea
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    pl alkblobs.pools := alkblobs.pool($1, 'read');
BEGIN
    PERFORM alkblobs.require_mode(pl, 'single', 'alkblobs_single_roots');
    PERFORM alkblobs.not_null($3, 'lim');
    IF $4 IS NOT NULL THEN
        PERFORM alkblobs.max_keys($4, 10000);
    END IF;
    IF $3 < 1 OR $3 > 100000 THEN
        RAISE EXCEPTION 'lim must be between 1 and 100000, got %', $3 USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN QUERY
        SELECT r.key FROM alkblobs.single_roots r
         WHERE r.pool = pl.id AND r.key > coalesce($2, '\x'::bytea) AND ($4 IS NULL OR r.key = ANY($4))
         ORDER BY r.key LIMIT $3;
END $$;
