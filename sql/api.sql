-- alkblobs extension: the SQL API (after bootstrap.sql and the Rust
-- functions alkblobs.blake3 / alkblobs.lo_blake3).
--
-- Every function that touches the internal tables is SECURITY DEFINER with
-- `search_path = pg_catalog, pg_temp`, and every object it names is
-- schema-qualified, so a caller's search_path cannot hijack it. Values are
-- always bound parameters; the only dynamic SQL splices liveness table names
-- produced by `regclass` output (quoted and schema-qualified by PostgreSQL).
--
-- Locking protocol (docs/design.md, "Fleet protocol"): the executor takes
-- FOR UPDATE on a candidate's entry row, then on its staged row, and only
-- then re-checks pins and liveness tables in a new statement. Everything
-- that must serialise against it (put, pin, the liveness guard trigger)
-- takes FOR KEY SHARE on the entry row first and touches the staged row
-- second: one lock order everywhere, so the protocol cannot deadlock.
--
-- SQLSTATEs raised on purpose (docs/sql-api.md):
--   22023 invalid_parameter_value   bad key length, negative window, bad name
--   22004 null_value_not_allowed    NULL key, value or owner
--   42704 undefined_object          unknown pool
--   42710 duplicate_object          pool exists
--   42809 wrong_object_type         liveness target is not a table
--   42703 undefined_column          liveness table has no "key" column
--   42804 datatype_mismatch         liveness "key" column is not bytea
--   42501 insufficient_privilege    registering a table you do not own
--   AB001 (alkblobs) hash mismatch  bytes do not hash to the key
--   AB002 (alkblobs) key collected  a liveness row was written for a key the
--                                   executor deleted while the write waited

-- Internal helpers ----------------------------------------------------------

-- The advisory lock class of pool locks: 'alkb'. The object id is the pool id.
CREATE FUNCTION alkblobs.lock_class() RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS 'SELECT 1634495330';

CREATE FUNCTION alkblobs.pool(p_name text) RETURNS alkblobs.pools
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    r alkblobs.pools;
BEGIN
    IF p_name IS NULL THEN
        RAISE EXCEPTION 'pool name must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    SELECT * INTO r FROM alkblobs.pools p WHERE p.name = p_name;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'alkblobs pool "%" does not exist', p_name
            USING ERRCODE = 'undefined_object',
                  HINT = format('Create it with SELECT alkblobs_create_pool(%L);', p_name);
    END IF;
    RETURN r;
END $$;

CREATE FUNCTION alkblobs.check_key(k bytea) RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF k IS NULL THEN
        RAISE EXCEPTION 'key must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF length(k) <> 32 THEN
        RAISE EXCEPTION 'a key is 32 bytes (the BLAKE3 hash of the content), got % bytes', length(k)
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Pass the raw hash, e.g. decode(''<64 hex characters>'', ''hex'').';
    END IF;
END $$;

CREATE FUNCTION alkblobs.check_owner(o text) RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF o IS NULL THEN
        RAISE EXCEPTION 'owner must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF length(o) NOT BETWEEN 1 AND 200 THEN
        RAISE EXCEPTION 'owner must be 1 to 200 characters (a store-instance id), got %', length(o)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
END $$;

-- "Is any registered liveness table holding <key_expr>?" for pool p, as a
-- SQL predicate. Table names come from regclass output; key_expr is one of
-- the fixed internal expressions below, never caller input.
CREATE FUNCTION alkblobs.live_predicate(p integer, key_expr text) RETURNS text
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp AS $$
    SELECT coalesce(
        string_agg(format('EXISTS (SELECT 1 FROM %s lv WHERE lv.key = %s)', l.relid::regclass, key_expr),
                   ' OR ' ORDER BY l.relid),
        'false')
    FROM alkblobs.liveness l
    JOIN pg_catalog.pg_class c ON c.oid = l.relid
    WHERE l.pool = p
$$;

-- Takes ACCESS SHARE on every liveness table of pool p so that none can be
-- dropped while a sweep relies on it. A table dropped before its lock was
-- granted is skipped: its DROP removed the registration.
CREATE FUNCTION alkblobs.lock_liveness(p integer) RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    r record;
BEGIN
    FOR r IN SELECT l.relid FROM alkblobs.liveness l WHERE l.pool = p ORDER BY l.relid LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_class c WHERE c.oid = r.relid) THEN
            CONTINUE;
        END IF;
        BEGIN
            EXECUTE format('LOCK TABLE %s IN ACCESS SHARE MODE', r.relid::regclass);
        EXCEPTION WHEN undefined_table OR syntax_error THEN
            CONTINUE;
        END;
    END LOOP;
END $$;

-- Pools ----------------------------------------------------------------------

-- Validates pool settings (NULLs are "unchanged" and pass).
CREATE FUNCTION alkblobs.check_settings(w interval, ttl interval) RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF w < interval '0' THEN
        RAISE EXCEPTION 'delete_window must not be negative, got %', w USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF ttl <= interval '0' THEN
        RAISE EXCEPTION 'pin_ttl must be positive, got %', ttl USING ERRCODE = 'invalid_parameter_value';
    END IF;
END $$;

CREATE FUNCTION @extschema@.alkblobs_create_pool(
    pool text,
    delete_window interval DEFAULT '5 minutes',
    pin_ttl interval DEFAULT '60 seconds',
    large_tier text DEFAULT 'pg-lo')
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF $1 IS NULL OR $2 IS NULL OR $3 IS NULL OR $4 IS NULL THEN
        RAISE EXCEPTION 'pool, delete_window, pin_ttl and large_tier must not be NULL'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF $1 !~ '^[A-Za-z0-9][A-Za-z0-9_.:-]{0,62}$' THEN
        RAISE EXCEPTION 'invalid pool name %: use 1 to 63 letters, digits, "_", ".", ":" or "-", starting with a letter or digit', quote_literal($1)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM alkblobs.check_settings($2, $3);
    IF $4 NOT IN ('pg-lo', 'local', 'none') THEN
        RAISE EXCEPTION 'large_tier must be ''pg-lo'', ''local'' or ''none'', got %', quote_literal($4)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    INSERT INTO alkblobs.pools (name, delete_window, pin_ttl, large_tier) VALUES ($1, $2, $3, $4);
EXCEPTION WHEN unique_violation THEN
    RAISE EXCEPTION 'alkblobs pool "%" already exists', $1
        USING ERRCODE = 'duplicate_object',
              HINT = 'Change its settings with alkblobs_alter_pool.';
END $$;

CREATE FUNCTION @extschema@.alkblobs_alter_pool(
    pool text,
    delete_window interval DEFAULT NULL,
    pin_ttl interval DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    pl alkblobs.pools := alkblobs.pool($1);
BEGIN
    PERFORM alkblobs.check_settings($2, $3);
    UPDATE alkblobs.pools p
       SET delete_window = coalesce($2, p.delete_window),
           pin_ttl = coalesce($3, p.pin_ttl)
     WHERE p.id = pl.id;
END $$;

-- Puts and pins --------------------------------------------------------------

-- Upserts (pool, key, owner)'s pin to expire one TTL from now.
CREATE FUNCTION alkblobs.pin_row(p alkblobs.pools, k bytea, o text) RETURNS void
LANGUAGE sql
SET search_path = pg_catalog, pg_temp AS $$
    INSERT INTO alkblobs.pins AS pn (pool, key, owner, expires_at)
    VALUES (p.id, k, o, clock_timestamp() + p.pin_ttl)
    ON CONFLICT (pool, key, owner)
    DO UPDATE SET expires_at = greatest(pn.expires_at, EXCLUDED.expires_at)
$$;

-- Locks the entry row FOR KEY SHARE if it exists: waits while the executor
-- decides the key, and keeps it from deleting the key until we commit.
-- (INSERT ... ON CONFLICT DO NOTHING would not wait: it can report an entry
-- the executor is deleting right now.)
CREATE FUNCTION alkblobs.lock_entry(p integer, k bytea) RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM 1 FROM alkblobs.entries e WHERE e.pool = p AND e.key = k FOR KEY SHARE;
    RETURN FOUND;
END $$;

-- The hot path, so written as a few inline statements (no nested calls).
CREATE FUNCTION @extschema@.alkblobs_put(pool text, key bytea, value bytea, owner text)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    pid integer;
    ttl interval;
    tier text;
    actual bytea;
BEGIN
    SELECT p.id, p.pin_ttl, p.large_tier INTO pid, ttl, tier FROM alkblobs.pools p WHERE p.name = $1;
    IF NOT FOUND THEN
        PERFORM alkblobs.pool($1);  -- raises the unknown-pool error
    END IF;
    IF $2 IS NULL OR $3 IS NULL OR $4 IS NULL THEN
        RAISE EXCEPTION 'key, value and owner must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF length($2) <> 32 THEN
        PERFORM alkblobs.check_key($2);
    END IF;
    IF length($4) NOT BETWEEN 1 AND 200 THEN
        PERFORM alkblobs.check_owner($4);
    END IF;
    actual := alkblobs.blake3($3);
    IF actual <> $2 THEN
        RAISE EXCEPTION 'hash mismatch: the value hashes to %, not to the key %', encode(actual, 'hex'), encode($2, 'hex')
            USING ERRCODE = 'AB001', HINT = 'Nothing was stored. Re-fetch the content; the key is its BLAKE3 hash.';
    END IF;
    -- The entry row and the pin row commit together, or neither does.
    FOR attempt IN 1..5 LOOP
        INSERT INTO alkblobs.entries (pool, key, size, tier, value)
        VALUES (pid, $2, length($3), 'kv', $3)
        ON CONFLICT ON CONSTRAINT entries_pkey DO NOTHING;
        IF FOUND THEN
            -- A new entry has no staged row, unless the pool's local tier
            -- staged a file of the same key: a put restarts its window.
            -- (The executor removes a kv/lo key's staged row when it
            -- deletes the entry.)
            IF tier = 'local' THEN
                DELETE FROM alkblobs.staged s WHERE s.pool = pid AND s.key = $2;
            END IF;
            INSERT INTO alkblobs.pins AS pn (pool, key, owner, expires_at)
            VALUES (pid, $2, $4, clock_timestamp() + ttl)
            ON CONFLICT ON CONSTRAINT pins_pkey DO UPDATE SET expires_at = greatest(pn.expires_at, EXCLUDED.expires_at);
            RETURN true;
        END IF;
        -- Present. DO NOTHING did not wait for an executor that may be
        -- deleting it right now; this lock does, and finds the row only if
        -- it survived. Then it stays until we commit.
        PERFORM 1 FROM alkblobs.entries e WHERE e.pool = pid AND e.key = $2 FOR KEY SHARE;
        IF FOUND THEN
            DELETE FROM alkblobs.staged s WHERE s.pool = pid AND s.key = $2;
            INSERT INTO alkblobs.pins AS pn (pool, key, owner, expires_at)
            VALUES (pid, $2, $4, clock_timestamp() + ttl)
            ON CONFLICT ON CONSTRAINT pins_pkey DO UPDATE SET expires_at = greatest(pn.expires_at, EXCLUDED.expires_at);
            RETURN false;
        END IF;
        -- Deleted while we waited: insert it afresh.
    END LOOP;
    RAISE EXCEPTION 'could not store key % in pool "%": it kept being deleted concurrently', encode($2, 'hex'), $1
        USING ERRCODE = 'serialization_failure', HINT = 'Retry the put.';
END $$;

CREATE FUNCTION @extschema@.alkblobs_pin(pool text, key bytea, owner text)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    pl alkblobs.pools := alkblobs.pool($1);
BEGIN
    PERFORM alkblobs.check_key($2);
    PERFORM alkblobs.check_owner($3);
    -- Waits out an executor deciding this key; false if it is gone.
    IF NOT alkblobs.lock_entry(pl.id, $2) THEN
        RETURN false;
    END IF;
    PERFORM alkblobs.pin_row(pl, $2, $3);
    RETURN true;
END $$;

-- Pins a key whose content the caller is about to publish outside this
-- database (a file on the pool's shared `local` tier): always succeeds.
-- Removing the key's staged row waits out an executor deciding it, so the
-- file the caller then renames into place cannot be deleted on stale
-- staging, and its window restarts.
CREATE FUNCTION @extschema@.alkblobs_pin_new(pool text, key bytea, owner text)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    pl alkblobs.pools := alkblobs.pool($1);
BEGIN
    PERFORM alkblobs.check_key($2);
    PERFORM alkblobs.check_owner($3);
    PERFORM alkblobs.lock_entry(pl.id, $2);
    DELETE FROM alkblobs.staged s WHERE s.pool = pl.id AND s.key = $2;
    PERFORM alkblobs.pin_row(pl, $2, $3);
END $$;

CREATE FUNCTION @extschema@.alkblobs_unpin(pool text, key bytea, owner text)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    pl alkblobs.pools := alkblobs.pool($1);
BEGIN
    PERFORM alkblobs.check_key($2);
    DELETE FROM alkblobs.pins pn WHERE pn.pool = pl.id AND pn.key = $2 AND pn.owner = $3;
    RETURN FOUND;
END $$;

-- Renews every un-expired pin of one owner in one statement. An expired pin
-- is not revived: its protection already lapsed and a sweep may have acted,
-- so the holder must re-put (the count tells it how many survived).
CREATE FUNCTION @extschema@.alkblobs_renew(pool text, owner text)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    pl alkblobs.pools := alkblobs.pool($1);
    n bigint;
BEGIN
    PERFORM alkblobs.check_owner($2);
    UPDATE alkblobs.pins pn
       SET expires_at = clock_timestamp() + pl.pin_ttl
     WHERE pn.pool = pl.id AND pn.owner = $2 AND pn.expires_at > clock_timestamp();
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END $$;

-- Which of `keys` this owner holds an un-expired pin on: a holder checks
-- before publishing under a pin (its renewal may have failed).
CREATE FUNCTION @extschema@.alkblobs_pins_held(pool text, owner text, keys bytea[])
RETURNS SETOF bytea
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    pl alkblobs.pools := alkblobs.pool($1);
BEGIN
    RETURN QUERY
        SELECT pn.key FROM alkblobs.pins pn
         WHERE pn.pool = pl.id AND pn.owner = $2 AND pn.key = ANY($3)
           AND pn.expires_at > clock_timestamp()
         ORDER BY pn.key;
END $$;

CREATE FUNCTION @extschema@.alkblobs_unpin_all(pool text, owner text)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    pl alkblobs.pools := alkblobs.pool($1);
    n bigint;
BEGIN
    DELETE FROM alkblobs.pins pn WHERE pn.pool = pl.id AND pn.owner = $2;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END $$;

-- Reads ------------------------------------------------------------------------

CREATE FUNCTION @extschema@.alkblobs_get(pool text, key bytea)
RETURNS bytea
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    pl alkblobs.pools := alkblobs.pool($1);
    v bytea;
BEGIN
    PERFORM alkblobs.check_key($2);
    SELECT e.value INTO v FROM alkblobs.entries e WHERE e.pool = pl.id AND e.key = $2 AND e.tier = 'kv';
    RETURN v;
END $$;

CREATE FUNCTION @extschema@.alkblobs_stat(pool text, key bytea)
RETURNS TABLE (size bigint, tier text, created_at timestamptz)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    pl alkblobs.pools := alkblobs.pool($1);
BEGIN
    PERFORM alkblobs.check_key($2);
    RETURN QUERY SELECT e.size, e.tier, e.created_at FROM alkblobs.entries e WHERE e.pool = pl.id AND e.key = $2;
END $$;

-- Large objects (the pg-lo tier) ---------------------------------------------
--
-- One upload is one client transaction, in bounded chunks:
--   BEGIN;
--   SELECT alkblobs_lo_create();                      -- -> oid
--   SELECT alkblobs_lo_write(oid, offset, chunk);     -- repeatedly, e.g. 1 MiB each
--   SELECT alkblobs_lo_commit(pool, key, oid, owner); -- verify, companion row + pin
--   COMMIT;
-- A client that dies mid-upload rolls the object back with its transaction.

CREATE FUNCTION @extschema@.alkblobs_lo_create()
RETURNS oid
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    o oid := pg_catalog.lo_create(0);
BEGIN
    INSERT INTO alkblobs.uploads (loid) VALUES (o);
    RETURN o;
END $$;

CREATE FUNCTION @extschema@.alkblobs_lo_write(loid oid, "offset" bigint, chunk bytea)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM alkblobs.uploads u WHERE u.loid = $1) THEN
        RAISE EXCEPTION 'large object % is not an upload in progress in this transaction', $1
            USING ERRCODE = 'invalid_parameter_value', HINT = 'Start one with alkblobs_lo_create() in the same transaction.';
    END IF;
    IF $2 < 0 THEN
        RAISE EXCEPTION 'offset must not be negative' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM pg_catalog.lo_put($1, $2, $3);
END $$;

CREATE FUNCTION @extschema@.alkblobs_lo_commit(pool text, key bytea, loid oid, owner text)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    pl alkblobs.pools := alkblobs.pool($1);
    h record;
    created boolean := false;
BEGIN
    PERFORM alkblobs.check_key($2);
    PERFORM alkblobs.check_owner($4);
    DELETE FROM alkblobs.uploads u WHERE u.loid = $3;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'large object % is not an upload in progress in this transaction', $3
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT * INTO h FROM alkblobs.lo_blake3($3);
    IF h.hash <> $2 THEN
        PERFORM pg_catalog.lo_unlink($3);
        RAISE EXCEPTION 'hash mismatch: the large object hashes to %, not to the key %', encode(h.hash, 'hex'), encode($2, 'hex')
            USING ERRCODE = 'AB001', HINT = 'Nothing was stored.';
    END IF;
    FOR attempt IN 1..5 LOOP
        IF alkblobs.lock_entry(pl.id, $2) THEN
            EXIT;
        END IF;
        INSERT INTO alkblobs.entries (pool, key, size, tier, loid)
        VALUES (pl.id, $2, h.size, 'lo', $3)
        ON CONFLICT ON CONSTRAINT entries_pkey DO NOTHING;
        IF FOUND THEN
            created := true;
            EXIT;
        END IF;
    END LOOP;
    IF NOT created THEN
        IF NOT alkblobs.lock_entry(pl.id, $2) THEN
            RAISE EXCEPTION 'could not store key % in pool "%": it kept being deleted concurrently', encode($2, 'hex'), pl.name
                USING ERRCODE = 'serialization_failure', HINT = 'Retry the put.';
        END IF;
        -- A dedup hit: the existing entry stays, the new object goes.
        PERFORM pg_catalog.lo_unlink($3);
    END IF;
    DELETE FROM alkblobs.staged s WHERE s.pool = pl.id AND s.key = $2;
    PERFORM alkblobs.pin_row(pl, $2, $4);
    RETURN created;
END $$;

-- A window of a large-object entry (lo_get(oid, offset, len)); NULL if the
-- key is absent. Offsets past the end give an empty result.
CREATE FUNCTION @extschema@.alkblobs_lo_read(pool text, key bytea, "offset" bigint, len integer)
RETURNS bytea
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    pl alkblobs.pools := alkblobs.pool($1);
    o oid;
BEGIN
    PERFORM alkblobs.check_key($2);
    IF $3 < 0 OR $4 < 0 THEN
        RAISE EXCEPTION 'offset and len must not be negative' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF $4 > 64 * 1024 * 1024 THEN
        RAISE EXCEPTION 'len % is over the 64 MiB window limit; read in windows', $4 USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT e.loid INTO o FROM alkblobs.entries e WHERE e.pool = pl.id AND e.key = $2 AND e.tier = 'lo';
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    RETURN pg_catalog.lo_get(o, $3, $4);
END $$;

-- Liveness tables --------------------------------------------------------------

-- Installed on every registered liveness table: a row naming a key locks
-- that key's entry (or staged row) FOR KEY SHARE before it is written, so an
-- executor deciding the key either waits for this row to commit (and then
-- sees it) or has already deleted the key — in which case this write fails
-- with SQLSTATE AB002 rather than recording liveness for content that is
-- gone. A key absent before the write started is accepted (it protects the
-- key if the content is put later).
CREATE FUNCTION alkblobs.liveness_guard() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    p integer;
    k bytea := NEW.key;
BEGIN
    IF k IS NULL OR length(k) <> 32 THEN
        RETURN NEW;
    END IF;
    FOR p IN SELECT l.pool FROM alkblobs.liveness l WHERE l.relid = TG_RELID ORDER BY l.pool LOOP
        -- Plain reads first: was the key present when this statement began?
        IF NOT EXISTS (SELECT 1 FROM alkblobs.entries e WHERE e.pool = p AND e.key = k)
           AND NOT EXISTS (SELECT 1 FROM alkblobs.staged s WHERE s.pool = p AND s.key = k) THEN
            CONTINUE;
        END IF;
        IF alkblobs.lock_entry(p, k) THEN
            CONTINUE;
        END IF;
        PERFORM 1 FROM alkblobs.staged s WHERE s.pool = p AND s.key = k FOR KEY SHARE;
        IF FOUND THEN
            CONTINUE;
        END IF;
        RAISE EXCEPTION 'key % was collected from pool "%" while this row was being written', encode(k, 'hex'),
                (SELECT name FROM alkblobs.pools WHERE id = p)
            USING ERRCODE = 'AB002',
                  HINT = 'Put the content again (same bytes, same key), then record it.';
    END LOOP;
    RETURN NEW;
END $$;

CREATE FUNCTION @extschema@.alkblobs_register_liveness(pool text, tbl regclass)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    pl alkblobs.pools := alkblobs.pool($1);
    rel record;
    keytype oid;
BEGIN
    IF $2 IS NULL THEN
        RAISE EXCEPTION 'table must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    SELECT c.relkind, c.relowner, c.relpersistence INTO rel FROM pg_catalog.pg_class c WHERE c.oid = $2;
    IF rel.relkind NOT IN ('r', 'p') THEN
        RAISE EXCEPTION '% is not a table', $2 USING ERRCODE = 'wrong_object_type',
            HINT = 'A liveness source is a table with a "key bytea" column.';
    END IF;
    IF rel.relpersistence = 't' THEN
        RAISE EXCEPTION '% is a temporary table; the sweeper''s session cannot see it', $2
            USING ERRCODE = 'wrong_object_type';
    END IF;
    IF NOT pg_catalog.pg_has_role(session_user, rel.relowner, 'USAGE') THEN
        RAISE EXCEPTION 'must own table % to register it as a liveness source', $2
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    SELECT a.atttypid INTO keytype FROM pg_catalog.pg_attribute a
     WHERE a.attrelid = $2 AND a.attname = 'key' AND a.attnum > 0 AND NOT a.attisdropped;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'table % has no column "key"', $2 USING ERRCODE = 'undefined_column',
            HINT = 'A liveness table holds one row per live key in a column "key bytea".';
    END IF;
    IF keytype <> 'bytea'::regtype THEN
        RAISE EXCEPTION 'column "key" of % is %, not bytea', $2, keytype::regtype USING ERRCODE = 'datatype_mismatch';
    END IF;
    -- Registration waits out a running sweep: the next sweep sees the table
    -- from its first statement on.
    PERFORM pg_catalog.pg_advisory_xact_lock(alkblobs.lock_class(), pl.id);
    INSERT INTO alkblobs.liveness (pool, relid) VALUES (pl.id, $2) ON CONFLICT DO NOTHING;
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_trigger t WHERE t.tgrelid = $2 AND t.tgname = 'alkblobs_liveness_guard') THEN
        EXECUTE format('CREATE TRIGGER alkblobs_liveness_guard BEFORE INSERT OR UPDATE OF key ON %s '
                       'FOR EACH ROW EXECUTE FUNCTION alkblobs.liveness_guard()', $2);
    END IF;
    IF NOT EXISTS (
        SELECT 1 FROM pg_catalog.pg_index i
         WHERE i.indrelid = $2 AND i.indkey[0] = (SELECT a.attnum FROM pg_catalog.pg_attribute a WHERE a.attrelid = $2 AND a.attname = 'key')) THEN
        RAISE NOTICE 'liveness table % has no index leading with "key"; sweeps will scan it for every candidate batch', $2
            USING HINT = format('CREATE INDEX ON %s (key);', $2);
    END IF;
END $$;

CREATE FUNCTION @extschema@.alkblobs_unregister_liveness(pool text, tbl regclass)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    pl alkblobs.pools := alkblobs.pool($1);
    found_it boolean;
BEGIN
    PERFORM pg_catalog.pg_advisory_xact_lock(alkblobs.lock_class(), pl.id);
    DELETE FROM alkblobs.liveness l WHERE l.pool = pl.id AND l.relid = $2;
    found_it := FOUND;
    IF NOT EXISTS (SELECT 1 FROM alkblobs.liveness l WHERE l.relid = $2) THEN
        EXECUTE format('DROP TRIGGER IF EXISTS alkblobs_liveness_guard ON %s', $2);
    END IF;
    RETURN found_it;
END $$;

-- A dropped liveness table stops being a source (and cannot be half-dropped
-- under a sweep: the sweep holds ACCESS SHARE on every source it reads).
CREATE FUNCTION alkblobs.on_sql_drop() RETURNS event_trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    DELETE FROM alkblobs.liveness l
     USING pg_catalog.pg_event_trigger_dropped_objects() d
     WHERE d.classid = 'pg_catalog.pg_class'::regclass AND d.objid = l.relid;
END $$;

CREATE EVENT TRIGGER alkblobs_liveness_drop ON sql_drop
    WHEN TAG IN ('DROP TABLE', 'DROP SCHEMA', 'DROP OWNED')
    EXECUTE FUNCTION alkblobs.on_sql_drop();

-- Staging keys the client listed (files on the pool's local tier) --------------

-- Stages client-listed keys that nothing protects right now; keys that are
-- entries in this database are the database's own sweep's business and are
-- skipped. One call is one mark: its rows become due at the end of this
-- call plus the pool's window.
CREATE FUNCTION @extschema@.alkblobs_stage(pool text, keys bytea[])
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    pl alkblobs.pools := alkblobs.pool($1);
    m bigint;
    n bigint;
BEGIN
    IF EXISTS (SELECT 1 FROM unnest($2) k WHERE k IS NULL OR length(k) <> 32) THEN
        RAISE EXCEPTION 'every key is 32 bytes (a BLAKE3 hash)' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM pg_catalog.pg_advisory_xact_lock(alkblobs.lock_class(), pl.id);
    PERFORM alkblobs.lock_liveness(pl.id);
    INSERT INTO alkblobs.marks (pool, delete_window) VALUES (pl.id, pl.delete_window) RETURNING id INTO m;
    EXECUTE format($q$
        INSERT INTO alkblobs.staged (pool, key, tier, mark)
        SELECT DISTINCT $1, c.key, 'local', $2 FROM unnest($3::bytea[]) AS c(key)
         WHERE NOT EXISTS (SELECT 1 FROM alkblobs.entries e WHERE e.pool = $1 AND e.key = c.key)
           AND NOT EXISTS (SELECT 1 FROM alkblobs.pins pn WHERE pn.pool = $1 AND pn.key = c.key AND pn.expires_at > clock_timestamp())
           AND NOT (%s)
        ON CONFLICT (pool, key) DO NOTHING$q$, alkblobs.live_predicate(pl.id, 'c.key'))
        USING pl.id, m, $2;
    GET DIAGNOSTICS n = ROW_COUNT;
    UPDATE alkblobs.marks mk SET mark_end = clock_timestamp() WHERE mk.id = m;
    RETURN n;
END $$;

-- The executor for client-listed files: re-arbitrates due 'local' rows and
-- returns the dead keys, their staged rows deleted but still locked by the
-- caller's open transaction. The caller deletes those files and only then
-- commits; until it does, a pin or a liveness write for one of these keys
-- waits. A caller that fails rolls back and the rows stay staged.
CREATE FUNCTION @extschema@.alkblobs_claim_local(pool text, max_keys integer DEFAULT 1000)
RETURNS SETOF bytea
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    pl alkblobs.pools := alkblobs.pool($1);
    batch bytea[];
    keep bytea[];
BEGIN
    IF NOT pg_catalog.pg_try_advisory_xact_lock(alkblobs.lock_class(), pl.id) THEN
        RAISE NOTICE 'another sweeper holds pool "%"; nothing claimed', pl.name;
        RETURN;
    END IF;
    PERFORM alkblobs.lock_liveness(pl.id);
    SELECT array_agg(x.key ORDER BY x.key) INTO batch FROM (
        SELECT s.key FROM alkblobs.staged s JOIN alkblobs.marks mk ON mk.id = s.mark
         WHERE s.pool = pl.id AND s.tier = 'local'
           AND mk.mark_end IS NOT NULL AND mk.mark_end + mk.delete_window <= clock_timestamp()
         ORDER BY s.key LIMIT greatest($2, 0)
           FOR UPDATE OF s) x;
    IF batch IS NULL THEN
        RETURN;
    END IF;
    EXECUTE format($q$
        SELECT array_agg(c.key) FROM unnest($1::bytea[]) AS c(key)
         WHERE EXISTS (SELECT 1 FROM alkblobs.pins pn WHERE pn.pool = $2 AND pn.key = c.key AND pn.expires_at > clock_timestamp())
            OR (%s)$q$, alkblobs.live_predicate(pl.id, 'c.key'))
        INTO keep USING batch, pl.id;
    DELETE FROM alkblobs.staged s WHERE s.pool = pl.id AND s.key = ANY(batch);
    RETURN QUERY SELECT b FROM unnest(batch) b WHERE keep IS NULL OR NOT (b = ANY(keep)) ORDER BY b;
END $$;

-- The sweep ----------------------------------------------------------------------

-- One call is one transaction under the pool's transaction-level advisory
-- lock: the lock cannot outlive the call or be lost inside it, whatever a
-- connection pooler does. Steps: reap expired pins; mark the pool's entries
-- and stage the unprotected ones (visible_after = mark_end + window); then
-- execute every kv/lo row due by mark_end, each batch locked FOR UPDATE and
-- re-checked against pins and liveness tables before it is deleted. At most
-- `max_unlinks` large objects are unlinked per call (each holds a lock until
-- commit); `remaining` says how many due rows are left for the next call
-- (`mark => false` runs just the executor). `local_due` counts due rows of
-- the local tier, which the client executes with alkblobs_claim_local.
CREATE FUNCTION @extschema@.alkblobs_sweep(
    pool text,
    dry_run boolean DEFAULT false,
    max_unlinks integer DEFAULT 1000,
    mark boolean DEFAULT true)
RETURNS TABLE (
    examined bigint, live bigint, pinned bigint, staged bigint, executed bigint,
    deleted bigint, kept bigint, bytes_freed bigint, pins_reaped bigint, remaining bigint,
    local_due bigint, aborted text, duration interval)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    t0 timestamptz := clock_timestamp();
    pl alkblobs.pools := alkblobs.pool($1);
    v_dry boolean := coalesce($2, false);
    v_max integer := greatest(coalesce($3, 1000), 0);
    v_mark boolean := coalesce($4, true);
    live_sql text;
    v_mark_id bigint;
    v_mark_end timestamptz;
    candidates bigint := 0;
    batch bytea[];
    present bytea[];
    still bytea[];
    keep bytea[];
    dead bytea[];
    now_dead bytea[];
    deferred bytea[];
    last_key bytea := '\x'::bytea;
    budget integer;
    unlinks integer := 0;
    r record;
BEGIN
    examined := 0; live := 0; pinned := 0; staged := 0; executed := 0; deleted := 0;
    kept := 0; bytes_freed := 0; pins_reaped := 0; remaining := 0; local_due := 0;
    IF NOT pg_catalog.pg_try_advisory_xact_lock(alkblobs.lock_class(), pl.id) THEN
        aborted := 'sweeper_lock';
        duration := clock_timestamp() - t0;
        RETURN NEXT;
        RETURN;
    END IF;
    PERFORM alkblobs.lock_liveness(pl.id);
    live_sql := alkblobs.live_predicate(pl.id, 'c.key');

    -- 1. Reap expired pins (they protect nothing already).
    IF v_dry THEN
        SELECT count(*) INTO pins_reaped FROM alkblobs.pins pn
         WHERE pn.pool = pl.id AND pn.expires_at <= clock_timestamp();
    ELSE
        DELETE FROM alkblobs.pins pn WHERE pn.pool = pl.id AND pn.expires_at <= clock_timestamp();
        GET DIAGNOSTICS pins_reaped = ROW_COUNT;
    END IF;

    -- 2. Mark.
    IF v_mark THEN
        SELECT count(*) INTO examined FROM alkblobs.entries e WHERE e.pool = pl.id;
        SELECT count(DISTINCT pn.key) INTO pinned FROM alkblobs.pins pn
          JOIN alkblobs.entries e ON e.pool = pn.pool AND e.key = pn.key
         WHERE pn.pool = pl.id AND pn.expires_at > clock_timestamp();
        IF v_dry THEN
            EXECUTE format($q$
                SELECT count(*) FROM alkblobs.entries c
                 WHERE c.pool = $1
                   AND NOT EXISTS (SELECT 1 FROM alkblobs.pins pn WHERE pn.pool = $1 AND pn.key = c.key AND pn.expires_at > $2)
                   AND NOT (%s)$q$, live_sql)
                INTO candidates USING pl.id, clock_timestamp();
            staged := candidates;
        ELSE
            INSERT INTO alkblobs.marks (pool, delete_window) VALUES (pl.id, pl.delete_window) RETURNING id INTO v_mark_id;
            EXECUTE format($q$
                WITH cand AS MATERIALIZED (
                    SELECT c.key, c.tier FROM alkblobs.entries c
                     WHERE c.pool = $1
                       AND NOT EXISTS (SELECT 1 FROM alkblobs.pins pn WHERE pn.pool = $1 AND pn.key = c.key AND pn.expires_at > $2)
                       AND NOT (%s)),
                ins AS (
                    INSERT INTO alkblobs.staged (pool, key, tier, mark)
                    SELECT $1, cand.key, cand.tier, $3 FROM cand
                    ON CONFLICT (pool, key) DO NOTHING
                    RETURNING 1)
                SELECT (SELECT count(*) FROM cand), (SELECT count(*) FROM ins)$q$, live_sql)
                INTO candidates, staged USING pl.id, clock_timestamp(), v_mark_id;
            -- Seal: the window runs from the end of the mark.
            v_mark_end := clock_timestamp();
            UPDATE alkblobs.marks mk SET mark_end = v_mark_end WHERE mk.id = v_mark_id;
        END IF;
        live := greatest(examined - pinned - candidates, 0);
    END IF;
    v_mark_end := coalesce(v_mark_end, clock_timestamp());

    -- 3. Execute every kv/lo row due by v_mark_end.
    LOOP
        SELECT array_agg(x.key ORDER BY x.key) INTO batch FROM (
            SELECT s.key FROM alkblobs.staged s JOIN alkblobs.marks mk ON mk.id = s.mark
             WHERE s.pool = pl.id AND s.tier <> 'local' AND s.key > last_key
               AND mk.mark_end IS NOT NULL AND mk.mark_end + mk.delete_window <= v_mark_end
             ORDER BY s.key LIMIT 1000) x;
        EXIT WHEN batch IS NULL;
        last_key := batch[array_upper(batch, 1)];
        IF v_dry THEN
            executed := executed + cardinality(batch);
            CONTINUE;
        END IF;
        -- Lock the entries, then their staged rows (the protocol's order).
        SELECT array_agg(x.key ORDER BY x.key) INTO present FROM (
            SELECT e.key FROM alkblobs.entries e
             WHERE e.pool = pl.id AND e.key = ANY(batch) ORDER BY e.key FOR UPDATE) x;
        -- A put since the mark removed its staged row: not a candidate now.
        SELECT array_agg(x.key ORDER BY x.key) INTO still FROM (
            SELECT s.key FROM alkblobs.staged s
             WHERE s.pool = pl.id AND s.key = ANY(coalesce(present, '{}')) ORDER BY s.key FOR UPDATE) x;
        -- The re-check, in a statement that starts after the locks were
        -- granted: it sees every pin and liveness row committed meanwhile.
        EXECUTE format($q$
            SELECT array_agg(c.key) FROM unnest($1::bytea[]) AS c(key)
             WHERE EXISTS (SELECT 1 FROM alkblobs.pins pn WHERE pn.pool = $2 AND pn.key = c.key AND pn.expires_at > clock_timestamp())
                OR (%s)$q$, live_sql)
            INTO keep USING coalesce(still, '{}'), pl.id;
        dead := ARRAY(SELECT k FROM unnest(coalesce(still, '{}')) k EXCEPT SELECT k FROM unnest(coalesce(keep, '{}')) k);
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
            IF r.loid IS NOT NULL THEN
                PERFORM pg_catalog.lo_unlink(r.loid);
                unlinks := unlinks + 1;
            END IF;
        END LOOP;
        kept := kept + coalesce(cardinality(keep), 0);
        executed := executed + cardinality(batch) - cardinality(deferred);
        DELETE FROM alkblobs.staged s
         WHERE s.pool = pl.id AND s.key = ANY(batch) AND NOT (s.key = ANY(deferred));
        EXIT WHEN cardinality(deferred) > 0 OR (unlinks >= v_max AND v_max > 0 AND EXISTS (
            SELECT 1 FROM alkblobs.entries e WHERE e.pool = pl.id AND e.tier = 'lo' LIMIT 1));
    END LOOP;

    SELECT count(*) FILTER (WHERE s.tier <> 'local' AND mk.mark_end + mk.delete_window <= v_mark_end),
           count(*) FILTER (WHERE s.tier = 'local' AND mk.mark_end + mk.delete_window <= clock_timestamp())
      INTO remaining, local_due
      FROM alkblobs.staged s JOIN alkblobs.marks mk ON mk.id = s.mark
     WHERE s.pool = pl.id AND mk.mark_end IS NOT NULL;
    IF v_dry THEN
        remaining := remaining - executed;
    ELSE
        DELETE FROM alkblobs.marks mk
         WHERE mk.pool = pl.id AND mk.mark_end IS NOT NULL
           AND NOT EXISTS (SELECT 1 FROM alkblobs.staged s WHERE s.mark = mk.id);
    END IF;
    duration := clock_timestamp() - t0;
    RETURN NEXT;
END $$;

-- Runs sweep calls until no due row is left, committing between calls so
-- that no transaction unlinks more than max_unlinks large objects. Use with
-- CALL outside a transaction block.
-- (No SET clause: a procedure with one cannot COMMIT. It is not SECURITY
-- DEFINER and names everything schema-qualified, so search_path cannot
-- redirect it.)
CREATE PROCEDURE @extschema@.alkblobs_sweep_all(pool text, max_unlinks integer DEFAULT 1000)
LANGUAGE plpgsql AS $$
DECLARE
    r record;
    first boolean := true;
    total_deleted bigint := 0;
    calls integer := 0;
BEGIN
    LOOP
        SELECT * INTO r FROM @extschema@.alkblobs_sweep($1, false, $2, first);
        calls := calls + 1;
        IF r.aborted IS NOT NULL THEN
            RAISE NOTICE 'sweep of pool "%" aborted: %', $1, r.aborted;
            EXIT;
        END IF;
        total_deleted := total_deleted + r.deleted;
        first := false;
        COMMIT;
        EXIT WHEN r.remaining = 0;
    END LOOP;
    RAISE NOTICE 'pool "%": % call(s), % entries deleted', $1, calls, total_deleted;
END $$;

-- Why is this key live or not? -----------------------------------------------

CREATE FUNCTION @extschema@.alkblobs_explain(pool text, key bytea)
RETURNS TABLE (aspect text, detail text)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    pl alkblobs.pools := alkblobs.pool($1);
    e record;
    r record;
    is_live boolean;
    protected_by text[] := '{}';
    st record;
    has_entry boolean;
    is_staged boolean;
BEGIN
    PERFORM alkblobs.check_key($2);
    SELECT en.size, en.tier, en.created_at INTO e FROM alkblobs.entries en WHERE en.pool = pl.id AND en.key = $2;
    has_entry := FOUND;
    IF has_entry THEN
        aspect := 'entry';
        detail := format('present: %s bytes in tier %s since %s', e.size, e.tier, e.created_at);
    ELSE
        aspect := 'entry';
        detail := CASE pl.large_tier WHEN 'local' THEN 'not in this database (a file on the local tier, or absent)' ELSE 'absent' END;
    END IF;
    RETURN NEXT;
    FOR r IN SELECT pn.owner, pn.expires_at, pn.expires_at > clock_timestamp() AS valid
               FROM alkblobs.pins pn WHERE pn.pool = pl.id AND pn.key = $2 ORDER BY pn.owner LOOP
        aspect := 'pin';
        IF r.valid THEN
            detail := format('owner %s, expires %s (in %s)', r.owner, r.expires_at, date_trunc('second', r.expires_at - clock_timestamp()));
            protected_by := protected_by || format('pin of %s', r.owner);
        ELSE
            detail := format('owner %s, EXPIRED at %s (protects nothing; reaped at the next sweep)', r.owner, r.expires_at);
        END IF;
        RETURN NEXT;
    END LOOP;
    FOR r IN SELECT l.relid FROM alkblobs.liveness l JOIN pg_catalog.pg_class c ON c.oid = l.relid
              WHERE l.pool = pl.id ORDER BY l.relid LOOP
        EXECUTE format('SELECT EXISTS (SELECT 1 FROM %s lv WHERE lv.key = $1)', r.relid::regclass) INTO is_live USING $2;
        aspect := 'liveness';
        detail := format('%s: %s', r.relid::regclass, CASE WHEN is_live THEN 'holds the key' ELSE 'does not hold the key' END);
        IF is_live THEN
            protected_by := protected_by || format('liveness table %s', r.relid::regclass);
        END IF;
        RETURN NEXT;
    END LOOP;
    SELECT s.tier, s.staged_at, mk.mark_end + mk.delete_window AS visible_after INTO st
      FROM alkblobs.staged s JOIN alkblobs.marks mk ON mk.id = s.mark WHERE s.pool = pl.id AND s.key = $2;
    is_staged := FOUND;
    IF is_staged THEN
        aspect := 'staged';
        detail := CASE
            WHEN st.visible_after IS NULL THEN format('since %s, by a mark still running', st.staged_at)
            WHEN st.visible_after <= clock_timestamp() THEN format('since %s; due since %s (deleted by the next sweep unless re-protected)', st.staged_at, st.visible_after)
            ELSE format('since %s; due %s (in %s)', st.staged_at, st.visible_after, date_trunc('second', st.visible_after - clock_timestamp()))
        END;
        RETURN NEXT;
    END IF;
    aspect := 'verdict';
    IF cardinality(protected_by) > 0 THEN
        detail := 'live: protected by ' || array_to_string(protected_by, ', ');
    ELSIF NOT has_entry AND NOT is_staged AND pl.large_tier <> 'local' THEN
        detail := 'not in the pool: put the content to (re)create it';
    ELSIF is_staged THEN
        detail := 'not live: staged, deleted when due unless re-protected before then';
    ELSE
        detail := 'not live: the next sweep stages it for deletion';
    END IF;
    RETURN NEXT;
END $$;
