-- alkblobs SQL API, 30-puts-and-pins.sql: Puts and pins: one value, a batch (alkblobs_put_many), pins, renewal, release.
-- (sql/api/*.sql load in file-name order after bootstrap.sql and the Rust
-- functions; docs/design.md, "Layout". The rules of the whole API are in 10-helpers.sql's header.)

-- Puts and pins --------------------------------------------------------------

-- Upserts the caller's pin on (pool, key, owner) to expire one TTL from now.
--
-- What a pin row is, written once: it lasts the pool's pin_ttl from now,
-- and a pin taken again never ends sooner than it did. The puts write the
-- upsert inline (their hot paths; alkblobs_put_many for a whole batch in
-- key order); every copy of these two parts is marked @pin(expires) or
-- @pin(again) and checked against these sources as the access rules'
-- copies are (10-helpers.sql), with `pl` the pool row:
-- @source pin(expires): clock_timestamp() + pl.pin_ttl
-- @source pin(again): ON CONFLICT ON CONSTRAINT pins_pkey DO UPDATE SET expires_at = greatest(pn.expires_at, EXCLUDED.expires_at)
CREATE FUNCTION alkblobs.pin_row(p alkblobs.pools, k bytea, o text) RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    pl ALIAS FOR p;
BEGIN
    INSERT INTO alkblobs.pins AS pn (pool, key, role, owner, expires_at)
    VALUES (pl.id, k, session_user, o, /* @pin(expires) */ clock_timestamp() + pl.pin_ttl /* @end */)
    /* @pin(again) */ ON CONFLICT ON CONSTRAINT pins_pkey DO UPDATE SET expires_at = greatest(pn.expires_at, EXCLUDED.expires_at) /* @end */;
END $$;

-- Locks the entry row FOR KEY SHARE if it exists: waits while the executor
-- decides the key, and keeps it from deleting the key until we commit.
-- (INSERT ... ON CONFLICT DO NOTHING would not wait: it can report an entry
-- the executor is deleting right now.) At REPEATABLE READ a row deleted
-- after our snapshot raises 40001 here instead of being "found".
CREATE FUNCTION alkblobs.lock_entry(p integer, k bytea) RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM 1 FROM alkblobs.entries e WHERE e.pool = p AND e.key = k FOR KEY SHARE;
    RETURN FOUND;
END $$;

-- The same for a published file of a local-tier pool: its row in
-- alkblobs.files. (A row whose file is not yet published does not count:
-- its content may never arrive.)
CREATE FUNCTION alkblobs.lock_file(p integer, k bytea) RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM 1 FROM alkblobs.files f WHERE f.pool = p AND f.key = k AND f.published FOR KEY SHARE;
    RETURN FOUND;
END $$;

-- Whether the entry of `k` in pool `p` holds exactly `v` (or, with `o`
-- given, the large object `o` of `n` bytes). Asked only where the server
-- trusts writers' keys (the SQL-only flavour, whose alkblobs.blake3 is
-- NULL): there a put of a key that is present with other bytes means that
-- one of the two does not hash to the key, and answering "present" would
-- let a forged value squat an honest writer's key unnoticed. The library
-- flavour has hashed both, so never asks. Large objects are compared 1 MiB
-- at a time; sizes first.
CREATE FUNCTION alkblobs.holds(p integer, k bytea, v bytea, o oid, n bigint) RETURNS boolean
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    e alkblobs.entries;
    off bigint := 0;
BEGIN
    SELECT * INTO e FROM alkblobs.entries x WHERE x.pool = p AND x.key = k;
    IF NOT FOUND THEN
        RETURN true;  -- nothing to differ from
    END IF;
    IF e.size <> coalesce(n, length(v)) THEN
        RETURN false;
    END IF;
    IF o IS NULL THEN
        RETURN CASE e.tier WHEN 'kv' THEN e.value = v ELSE pg_catalog.lo_get(e.loid) = v END;
    END IF;
    IF e.tier = 'kv' THEN
        RETURN e.value = pg_catalog.lo_get(o);
    END IF;
    WHILE off < n LOOP
        IF pg_catalog.lo_get(e.loid, off, 1048576) <> pg_catalog.lo_get(o, off, 1048576) THEN
            RETURN false;
        END IF;
        off := off + 1048576;
    END LOOP;
    RETURN true;
END $$;

-- AB005: key `k` is present in pool `pl` with other bytes than this put's.
CREATE FUNCTION alkblobs.refuse_other_content(pl alkblobs.pools, k bytea, pos integer) RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RAISE EXCEPTION 'key % is stored in pool "%" with other content%: one of the two does not hash to the key',
                    encode(k, 'hex'), pl.name, CASE WHEN pos IS NULL THEN '' ELSE format(' (position %s)', pos) END
        USING ERRCODE = 'AB005',
              HINT = 'This server trusts writers'' keys (the SQL-only flavour). Nothing was stored; the entry keeps its content. `alkblobs verify` says whether it is the stored one that is forged: then it is collected like any entry once nothing protects it, and the put can be repeated.';
END $$;

-- The hot path, so written as a few inline statements (no nested calls).
CREATE FUNCTION @extschema@.alkblobs_put(pool text, key bytea, value bytea, owner text)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    pl alkblobs.pools;
    me name;
    actual bytea;
BEGIN
    -- alkblobs.may's rules for 'write', inline (one source: 10-helpers.sql).
    SELECT * INTO pl FROM alkblobs.pools p WHERE p.name = $1
       AND /* @may(write) */ (EXISTS (SELECT 1 FROM pg_catalog.pg_roles o WHERE (o.oid = p.owner_oid OR (p.owner_oid IS NULL AND o.rolname = p.owner)) AND pg_catalog.pg_has_role(session_user, o.oid, 'USAGE')) OR EXISTS (SELECT 1 FROM alkblobs.pool_grants g JOIN pg_catalog.pg_roles r ON (r.oid = g.grantee_oid OR (g.grantee_oid IS NULL AND r.rolname = g.grantee)) WHERE g.pool = p.id AND g.access IN ('write', 'admin') AND pg_catalog.pg_has_role(session_user, r.oid, 'USAGE'))) /* @end */;
    IF NOT FOUND THEN
        pl := alkblobs.pool($1, 'write');  -- raises the unknown-pool or no-access error
    END IF;
    IF $2 IS NULL OR $3 IS NULL OR ($4 IS NULL AND pl.mode <> 'single') THEN
        RAISE EXCEPTION 'key, value and owner must not be NULL (owner may be NULL only in single-instance pools)'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF $4 IS NOT NULL AND pl.mode = 'single' THEN
        -- Its owning instance pins in memory; a pin row would protect nothing.
        PERFORM alkblobs.require_mode(pl, 'fleet', 'a put with an owner (a pin row)');
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
    IF $4 IS NOT NULL THEN
        me := session_user;
    END IF;
    -- The entry row and the pin row commit together, or neither does.
    FOR attempt IN 1..5 LOOP
        INSERT INTO alkblobs.entries (pool, key, size, tier, value)
        VALUES (pl.id, $2, length($3), 'kv', $3)
        ON CONFLICT ON CONSTRAINT entries_pkey DO NOTHING;
        IF FOUND THEN
            -- A new entry has no staged row, unless the pool's local tier
            -- staged a file of the same key: a put restarts its window.
            -- (The executor removes a kv/lo key's staged row when it
            -- deletes the entry.)
            IF pl.large_tier IN ('local', 's3') THEN
                DELETE FROM alkblobs.staged s WHERE s.pool = pl.id AND s.key = $2;
            END IF;
            IF $4 IS NOT NULL THEN
                INSERT INTO alkblobs.pins AS pn (pool, key, role, owner, expires_at)
                VALUES (pl.id, $2, me, $4, /* @pin(expires) */ clock_timestamp() + pl.pin_ttl /* @end */)
                /* @pin(again) */ ON CONFLICT ON CONSTRAINT pins_pkey DO UPDATE SET expires_at = greatest(pn.expires_at, EXCLUDED.expires_at) /* @end */;
            END IF;
            RETURN true;
        END IF;
        -- Present. DO NOTHING did not wait for an executor that may be
        -- deleting it right now; this lock does, and finds the row only if
        -- it survived. Then it stays until we commit.
        PERFORM 1 FROM alkblobs.entries e WHERE e.pool = pl.id AND e.key = $2 FOR KEY SHARE;
        IF FOUND THEN
            IF actual IS NULL AND NOT alkblobs.holds(pl.id, $2, $3, NULL, NULL) THEN
                PERFORM alkblobs.refuse_other_content(pl, $2, NULL);  -- keys trusted: see alkblobs.holds
            END IF;
            DELETE FROM alkblobs.staged s WHERE s.pool = pl.id AND s.key = $2;
            IF $4 IS NOT NULL THEN
                INSERT INTO alkblobs.pins AS pn (pool, key, role, owner, expires_at)
                VALUES (pl.id, $2, me, $4, /* @pin(expires) */ clock_timestamp() + pl.pin_ttl /* @end */)
                /* @pin(again) */ ON CONFLICT ON CONSTRAINT pins_pkey DO UPDATE SET expires_at = greatest(pn.expires_at, EXCLUDED.expires_at) /* @end */;
            END IF;
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
    pl alkblobs.pools := alkblobs.pool($1, 'write');
BEGIN
    PERFORM alkblobs.require_mode(pl, 'fleet', 'alkblobs_pin');
    PERFORM alkblobs.check_key($2);
    PERFORM alkblobs.check_owner($3);
    -- Waits out an executor (or a claim of a local-tier file) deciding this
    -- key; false if it is gone. In a local-tier pool a published file is
    -- held content too.
    IF NOT alkblobs.lock_entry(pl.id, $2)
       AND NOT (pl.large_tier IN ('local', 's3') AND alkblobs.lock_file(pl.id, $2)) THEN
        RETURN false;
    END IF;
    PERFORM alkblobs.pin_row(pl, $2, $3);
    RETURN true;
END $$;

-- Pins a key whose content the caller is about to publish outside this
-- database (a file on the pool's shared `local` tier) and records the file
-- in alkblobs.files (not yet published unless it already was). Pin and
-- record commit first; then the caller makes sure the file is in place
-- (writes or renames it if it is missing: a claim may have deleted it up
-- to the moment this committed) and calls alkblobs_local_published.
-- Recording is an upsert that waits out a claim holding the file's row
-- (and then records it afresh), and removing the key's staged row waits
-- out a claim deciding it, so the file the caller then puts in place
-- cannot be deleted on stale staging, and its window restarts. Only in
-- pools whose large tier is shared, 'local' or 's3' (22023 elsewhere).
-- Returns the record's generation: the object an s3 tier keeps the bytes
-- in (0 the key's own name, N > 0 the name with `.gN`), which a key whose
-- tombstone was handed out again gets afresh (alkblobs.file_fences), so a
-- stopped claimer's late delete cannot name it (0.8.0; void before).
CREATE FUNCTION @extschema@.alkblobs_pin_new(pool text, key bytea, owner text)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    pl alkblobs.pools := alkblobs.pool($1, 'write');
    tomb timestamptz;
    gen bigint;
    fresh boolean;
    placed boolean;
    fence bigint;
BEGIN
    PERFORM alkblobs.check_key($2);
    PERFORM alkblobs.check_owner($3);
    PERFORM alkblobs.require_mode(pl, 'fleet', 'alkblobs_pin_new');
    IF pl.large_tier NOT IN ('local', 's3') THEN
        RAISE EXCEPTION 'pool "%" keeps large content in tier %, not on a shared tier (local or s3)', pl.name, pl.large_tier
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Use alkblobs_put, or alkblobs_lo_create/_lo_write/_lo_commit for pg-lo pools.';
    END IF;
    -- The staged row first, then the record: the order a claim locks them
    -- in, so the two cannot deadlock.
    DELETE FROM alkblobs.staged s WHERE s.pool = pl.id AND s.key = $2;
    INSERT INTO alkblobs.files AS f (pool, key, generation)
    VALUES (pl.id, $2, coalesce((SELECT ff.generation FROM alkblobs.file_fences ff
                                  WHERE ff.pool = pl.id AND ff.key = $2), 0))
    ON CONFLICT ON CONSTRAINT files_pkey DO UPDATE SET recorded_at = f.recorded_at
    RETURNING f.deleting_since, f.generation, f.xmax::text = '0' INTO tomb, gen, fresh;
    IF tomb IS NOT NULL THEN
        -- A claim committed this file's deletion and its claimer may be
        -- unlinking it right now: a file put in place before that is done
        -- could be the one it unlinks.
        RAISE EXCEPTION 'the file of key % in pool "%" is being deleted by a sweep (claimed at %); put it again in a moment',
                        encode($2, 'hex'), pl.name, tomb
            USING ERRCODE = 'object_in_use',
                  HINT = 'The claiming sweep removes the tombstone when its files are gone (alkblobs_local_deleted); if it died, the next sweep finishes its claim.';
    END IF;
    IF fresh THEN
        -- The key's fence as it is now, not as the insert's snapshot saw
        -- it: a claim may have fenced the key and removed its tombstone
        -- while the insert waited for that claim's lock, or (REPEATABLE
        -- READ, SERIALIZABLE) after the transaction's snapshot was taken.
        -- At READ COMMITTED the next statement's snapshot sees it. At the
        -- snapshot levels, touching the fence row reaches its newest
        -- version: a fence the snapshot cannot see fails here with 40001
        -- (retry); a placeholder made where there is none goes at once.
        IF current_setting('transaction_isolation') <> 'read committed' THEN
            INSERT INTO alkblobs.file_fences AS ff (pool, key, generation) VALUES (pl.id, $2, 1)
            ON CONFLICT ON CONSTRAINT file_fences_pkey DO NOTHING
            RETURNING true INTO placed;
            IF placed THEN
                DELETE FROM alkblobs.file_fences ff WHERE ff.pool = pl.id AND ff.key = $2;
            END IF;
        END IF;
        SELECT ff.generation INTO fence FROM alkblobs.file_fences ff WHERE ff.pool = pl.id AND ff.key = $2;
        IF fence > gen THEN
            UPDATE alkblobs.files f SET generation = fence WHERE f.pool = pl.id AND f.key = $2;
            gen := fence;
        END IF;
    END IF;
    PERFORM alkblobs.pin_row(pl, $2, $3);
    RETURN gen;
END $$;

-- Marks files the caller recorded with alkblobs_pin_new as published, once
-- they are in place on the shared local tier; from then on liveness rows
-- may name them. Returns the keys it marked: a key missing from the result
-- has no record any more (a claim collected it, or it was never recorded)
-- and must be put again. Waits out a claim deciding one of the keys.
CREATE FUNCTION @extschema@.alkblobs_local_published(pool text, keys bytea[], owner text)
RETURNS SETOF bytea
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    pl alkblobs.pools := alkblobs.pool($1, 'write');
BEGIN
    PERFORM alkblobs.not_null($2, 'keys');
    PERFORM alkblobs.check_owner($3);
    PERFORM alkblobs.max_keys($2, 10000);
    -- Only under the caller's own un-expired pin: a holder that stalled
    -- past its TTL must not publish a record someone else made meanwhile
    -- (its own file may have been claimed and unlinked since).
    RETURN QUERY
        UPDATE alkblobs.files f SET published = true
         WHERE f.pool = pl.id AND f.key = ANY($2) AND f.deleting_since IS NULL
           AND EXISTS (SELECT 1 FROM alkblobs.pins pn
                        WHERE pn.pool = pl.id AND pn.key = f.key AND pn.role = session_user
                          AND pn.owner = $3 AND pn.expires_at > clock_timestamp())
        RETURNING f.key;
END $$;

-- Releases the caller's pin (a pool admin may release anyone's).
CREATE FUNCTION @extschema@.alkblobs_unpin(pool text, key bytea, owner text)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    pl alkblobs.pools := alkblobs.pool($1, 'write');
    any_role boolean := alkblobs.may(pl, 'admin');
BEGIN
    PERFORM alkblobs.require_mode(pl, 'fleet', 'alkblobs_unpin');
    PERFORM alkblobs.check_key($2);
    PERFORM alkblobs.check_owner($3);
    DELETE FROM alkblobs.pins pn
     WHERE pn.pool = pl.id AND pn.key = $2 AND pn.owner = $3 AND (any_role OR pn.role = session_user);
    RETURN FOUND;
END $$;

-- Renews every un-expired pin of the caller's (role, owner) in one
-- statement. An expired pin is not revived: its protection already lapsed
-- and a sweep may have acted, so the holder must re-put (the count tells it
-- how many survived).
CREATE FUNCTION @extschema@.alkblobs_renew(pool text, owner text)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    pl alkblobs.pools := alkblobs.pool($1, 'write');
    me name := session_user;
    n bigint;
    skipped bigint;
    stale boolean;
BEGIN
    PERFORM alkblobs.require_mode(pl, 'fleet', 'alkblobs_renew');
    PERFORM alkblobs.check_owner($2);
    -- Before the pool's first sweep since a server start or a restore
    -- (alkblobs.adopt), the caller's pins that lapsed meanwhile are renewed
    -- too if their content is still there: nothing could renew them, and
    -- no executor runs before that sweep has given them a fresh TTL.
    stale := NOT alkblobs.adopted(pl);
    -- A row a sweep holds (deciding its key) is passed over, not waited
    -- for: one long sweep call must not hold back the renewal of every pin
    -- of the instance. The next round (TTL/3 later) renews it.
    -- (Joined by ctid: whatever plan the estimates pick, each locked row
    -- is found again by a TID lookup — a key join could be a nested loop
    -- over 100,000 pins squared.)
    UPDATE alkblobs.pins pn
       SET expires_at = clock_timestamp() + pl.pin_ttl
      FROM (SELECT x.ctid AS t FROM alkblobs.pins x
             WHERE x.pool = pl.id AND x.role = me AND x.owner = $2
               AND (x.expires_at > clock_timestamp() OR (stale AND alkblobs.content_exists(x.pool, x.key)))
               FOR UPDATE SKIP LOCKED) l
     WHERE pn.ctid = l.t;
    GET DIAGNOSTICS n = ROW_COUNT;
    -- A row passed over because a sweep holds it, and close to expiry:
    -- wait for the sweep call (bounded) rather than let it lapse.
    UPDATE alkblobs.pins pn
       SET expires_at = clock_timestamp() + pl.pin_ttl
     WHERE pn.pool = pl.id AND pn.role = me AND pn.owner = $2
       AND pn.expires_at > clock_timestamp() AND pn.expires_at < clock_timestamp() + pl.pin_ttl / 2;
    GET DIAGNOSTICS skipped = ROW_COUNT;
    n := n + skipped;
    RETURN n;
END $$;

-- Which of `keys` the caller's (role, owner) holds an un-expired pin on: a
-- holder checks before publishing under a pin (its renewal may have
-- failed).
CREATE FUNCTION @extschema@.alkblobs_pins_held(pool text, owner text, keys bytea[])
RETURNS SETOF bytea
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    pl alkblobs.pools := alkblobs.pool($1, 'write');
    me name := session_user;
BEGIN
    PERFORM alkblobs.require_mode(pl, 'fleet', 'alkblobs_pins_held');
    PERFORM alkblobs.check_owner($2);
    PERFORM alkblobs.not_null($3, 'keys');
    RETURN QUERY
        SELECT pn.key FROM alkblobs.pins pn
         WHERE pn.pool = pl.id AND pn.role = me AND pn.owner = $2 AND pn.key = ANY($3)
           AND pn.expires_at > clock_timestamp()
         ORDER BY pn.key;
END $$;

-- Releases the caller's (role, owner) pins on `keys` in one statement (a
-- store instance's guards dropping); at most 10,000 keys. Returns how many
-- pin rows it deleted.
CREATE FUNCTION @extschema@.alkblobs_unpin_many(pool text, owner text, keys bytea[])
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    pl alkblobs.pools := alkblobs.pool($1, 'write');
    n bigint;
BEGIN
    PERFORM alkblobs.require_mode(pl, 'fleet', 'alkblobs_unpin_many');
    PERFORM alkblobs.check_owner($2);
    PERFORM alkblobs.max_keys($3, 10000);
    DELETE FROM alkblobs.pins pn
     WHERE pn.pool = pl.id AND pn.role = session_user AND pn.owner = $2 AND pn.key = ANY($3);
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END $$;

-- Releases every pin of the caller's (role, owner); a pool admin releases
-- that owner's pins under every role.
CREATE FUNCTION @extschema@.alkblobs_unpin_all(pool text, owner text)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    pl alkblobs.pools := alkblobs.pool($1, 'write');
    any_role boolean := alkblobs.may(pl, 'admin');
    n bigint;
BEGIN
    PERFORM alkblobs.require_mode(pl, 'fleet', 'alkblobs_unpin_all');
    PERFORM alkblobs.check_owner($2);
    DELETE FROM alkblobs.pins pn
     WHERE pn.pool = pl.id AND pn.owner = $2 AND (any_role OR pn.role = session_user);
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END $$;


-- Many kv puts in one call (one round trip, one transaction): the same as
-- alkblobs_put for each (keys[i], vals[i]), set-based; at most 10,000.
-- Returns, per position, whether it created the entry (a key repeated in
-- the batch is created at its first position at most). Entries are
-- inserted in key order; present ones are locked FOR KEY SHARE (waiting
-- out an executor deciding them), and if one was deleted meanwhile the
-- batch is put again from the start, so every lock is taken in key order.
CREATE FUNCTION @extschema@.alkblobs_put_many(pool text, keys bytea[], vals bytea[], owner text)
RETURNS boolean[]
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    pl alkblobs.pools;
    n integer := coalesce(cardinality($2), 0);
    bad integer;
    created bytea[];
    others bytea[];
    present bytea[];
    i integer;
    fast boolean := true;
    hint text;
    retries integer := 0;
BEGIN
    -- alkblobs.may's rules for 'write', inline (one source: 10-helpers.sql).
    SELECT * INTO pl FROM alkblobs.pools p WHERE p.name = $1
       AND /* @may(write) */ (EXISTS (SELECT 1 FROM pg_catalog.pg_roles o WHERE (o.oid = p.owner_oid OR (p.owner_oid IS NULL AND o.rolname = p.owner)) AND pg_catalog.pg_has_role(session_user, o.oid, 'USAGE')) OR EXISTS (SELECT 1 FROM alkblobs.pool_grants g JOIN pg_catalog.pg_roles r ON (r.oid = g.grantee_oid OR (g.grantee_oid IS NULL AND r.rolname = g.grantee)) WHERE g.pool = p.id AND g.access IN ('write', 'admin') AND pg_catalog.pg_has_role(session_user, r.oid, 'USAGE'))) /* @end */;
    IF NOT FOUND THEN
        pl := alkblobs.pool($1, 'write');  -- raises the unknown-pool or no-access error
    END IF;
    PERFORM alkblobs.not_null($2, 'keys');
    PERFORM alkblobs.not_null($3, 'vals');
    IF n <> coalesce(cardinality($3), 0) THEN
        RAISE EXCEPTION 'keys and vals differ in length (% and %)', n, coalesce(cardinality($3), 0)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF n > 10000 THEN
        RAISE EXCEPTION 'at most 10000 values per call, got %', n USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF n = 0 THEN
        RETURN '{}';
    END IF;
    IF $4 IS NULL AND pl.mode <> 'single' THEN
        RAISE EXCEPTION 'owner must not be NULL (only single-instance pools take puts without a pin)'
            USING ERRCODE = 'null_value_not_allowed';
    ELSIF $4 IS NOT NULL THEN
        PERFORM alkblobs.check_owner($4);
        PERFORM alkblobs.require_mode(pl, 'fleet', 'a put with an owner (a pin row)');
    END IF;
    IF array_ndims($2) <> 1 OR array_lower($2, 1) <> 1 OR array_ndims($3) <> 1 OR array_lower($3, 1) <> 1 THEN
        RAISE EXCEPTION 'keys and vals must be one-dimensional arrays starting at 1' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- Every pair checked in one pass (NULLs, key lengths, hashes); the
    -- first bad one, if any, is diagnosed below.
    bad := alkblobs.first_bad($2, $3);
    IF bad IS NOT NULL THEN
        IF $2[bad] IS NULL OR $3[bad] IS NULL THEN
            RAISE EXCEPTION 'keys and values must not be NULL (position %)', bad USING ERRCODE = 'null_value_not_allowed';
        ELSIF length($2[bad]) <> 32 THEN
            RAISE EXCEPTION 'every key is 32 bytes (a BLAKE3 hash); position % is %', bad, length($2[bad])
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        RAISE EXCEPTION 'hash mismatch at position %: the value hashes to %, not to the key %', bad,
                        encode(alkblobs.blake3($3[bad]), 'hex'), encode($2[bad], 'hex')
            USING ERRCODE = 'AB001', HINT = 'Nothing was stored. Re-fetch the content; the key is its BLAKE3 hash.';
    END IF;
    -- A batch of new keys, the common case, is one plain insert in key
    -- order, which costs less than ON CONFLICT's speculative insertion
    -- (1,000 × 1 KiB: a call 8.1–9.1 → 6.1–6.9 ms here) and waits for a
    -- concurrent writer or deleter of a key as ON CONFLICT does. A present
    -- key, or one repeated in the batch, makes it fail with a unique
    -- violation: none of it stays, and the ON CONFLICT DO NOTHING insert
    -- runs instead (so the failed one was wasted: 11–15 ms for a batch
    -- whose one present key sorts anywhere, against 8–9 ms straight away).
    -- So a session whose batch failed so takes the ON CONFLICT insert for
    -- its next 16 batches (a hint in the session, a performance matter
    -- only), and eight keys spread over the batch are probed first (~10
    -- µs): a batch re-putting content takes it at once.
    hint := pg_catalog.current_setting('alkblobs_hint.put_many_skip', true);
    IF hint ~ '^[1-9][0-9]{0,2}$' THEN
        PERFORM pg_catalog.set_config('alkblobs_hint.put_many_skip', (hint::integer - 1)::text, false);
        fast := false;
    ELSIF n >= 16 AND EXISTS (
        SELECT 1 FROM alkblobs.entries e
         WHERE e.pool = pl.id
           AND e.key = ANY (ARRAY(SELECT $2[1 + (j * (n - 1)) / 7] FROM generate_series(0, 7) j))) THEN
        fast := false;
    END IF;
    -- One pass over the batch in key order, in one subtransaction: the
    -- insert (plain, or ON CONFLICT DO NOTHING), then FOR KEY SHARE on
    -- the keys found present, also in key order. A present key that an
    -- executor deleted while this call waited for its lock is not re-put
    -- after the others (out of key order, that insert can wait for a
    -- concurrent batch that waits for a key this one holds: a deadlock):
    -- the pass is rolled back, which releases everything it took, and run
    -- again, and the deleted key is now a new one. Each retry follows a
    -- deletion of one of the batch's keys, so it ends; after 100 the call
    -- gives up with a serialization failure (40001, retryable).
    LOOP
        BEGIN
            IF fast THEN
                INSERT INTO alkblobs.entries (pool, key, size, tier, value)
                SELECT pl.id, u.k, length(u.v), 'kv', u.v FROM unnest($2, $3) u(k, v)
                 ORDER BY u.k;
                created := $2;
            ELSE
                WITH ins AS (
                    INSERT INTO alkblobs.entries (pool, key, size, tier, value)
                    SELECT pl.id, u.k, length(u.v), 'kv', u.v FROM unnest($2, $3) u(k, v)
                     ORDER BY u.k  -- a key repeated in the batch conflicts with its first copy
                    ON CONFLICT ON CONSTRAINT entries_pkey DO NOTHING
                    RETURNING key)
                SELECT coalesce(array_agg(ins.key), '{}') INTO created FROM ins;
            END IF;
            IF cardinality(created) < n THEN
                others := ARRAY(SELECT unnest($2) EXCEPT SELECT unnest(created) ORDER BY 1);
            ELSE
                others := '{}';  -- every key created: no duplicates, nothing present
            END IF;
            present := '{}';
            IF cardinality(others) > 0 THEN
                -- Present: DO NOTHING did not wait for an executor deleting
                -- them; this lock does, and finds only what survived.
                SELECT coalesce(array_agg(x.key), '{}') INTO present FROM (
                    SELECT e.key FROM alkblobs.entries e WHERE e.pool = pl.id AND e.key = ANY(others)
                     ORDER BY e.key FOR KEY SHARE) x;
                IF cardinality(present) < cardinality(others) THEN
                    RAISE EXCEPTION 'a key was deleted under the batch' USING ERRCODE = 'AB090';  -- run the pass again
                END IF;
            END IF;
            EXIT;
        EXCEPTION
            WHEN unique_violation THEN
                IF NOT fast THEN
                    RAISE;
                END IF;
                fast := false;
                PERFORM pg_catalog.set_config('alkblobs_hint.put_many_skip', '16', false);
            WHEN SQLSTATE 'AB090' THEN
                retries := retries + 1;
                IF retries >= 100 THEN
                    RAISE EXCEPTION 'alkblobs_put_many: keys of this batch were deleted under it 100 times in a row'
                        USING ERRCODE = 'serialization_failure', HINT = 'Nothing was stored; retry the call.';
                END IF;
                fast := false;
        END;
    END LOOP;
    -- Keys trusted (see alkblobs.holds): a present key, or a key repeated
    -- in the batch, must come with the bytes its entry holds.
    IF cardinality(created) < n AND alkblobs.blake3('\x'::bytea) IS NULL THEN
        SELECT u.i INTO bad FROM unnest($2, $3) WITH ORDINALITY u(k, v, i)
         WHERE NOT alkblobs.holds(pl.id, u.k, u.v, NULL, NULL)
         ORDER BY u.i LIMIT 1;
        IF FOUND THEN
            PERFORM alkblobs.refuse_other_content(pl, $2[bad], bad::integer);
        END IF;
    END IF;
    -- A re-put restarts the window.
    IF cardinality(present) > 0 THEN
        DELETE FROM alkblobs.staged s WHERE s.pool = pl.id AND s.key = ANY(present);
    END IF;
    -- In a local-tier pool a new entry may replace a staged file of the
    -- same key: a put restarts its window.
    IF pl.large_tier IN ('local', 's3') THEN
        DELETE FROM alkblobs.staged s WHERE s.pool = pl.id AND s.key = ANY(created);
    END IF;
    IF $4 IS NOT NULL THEN
        INSERT INTO alkblobs.pins AS pn (pool, key, role, owner, expires_at)
        SELECT pl.id, u.k, session_user, $4, /* @pin(expires) */ clock_timestamp() + pl.pin_ttl /* @end */
          FROM (SELECT DISTINCT unnest($2)) u(k)
         ORDER BY u.k  -- pin rows locked in key order, as the entries
        /* @pin(again) */ ON CONFLICT ON CONSTRAINT pins_pkey DO UPDATE SET expires_at = greatest(pn.expires_at, EXCLUDED.expires_at) /* @end */;
    END IF;
    IF cardinality(created) = n THEN
        RETURN array_fill(true, ARRAY[n]);
    END IF;
    RETURN ARRAY(
        SELECT c.k IS NOT NULL AND u.i = min(u.i) OVER (PARTITION BY u.k)
          FROM unnest($2) WITH ORDINALITY u(k, i)
          LEFT JOIN (SELECT DISTINCT unnest(created)) c(k) ON c.k = u.k
         ORDER BY u.i);
END $$;
