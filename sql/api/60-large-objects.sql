-- alkblobs SQL API, 60-large-objects.sql: Large objects (the pg-lo tier): uploads, reads.
-- (sql/api/*.sql load in file-name order after bootstrap.sql and the Rust
-- functions; docs/design.md, "Layout". The rules of the whole API are in 10-helpers.sql's header.)

-- Large objects (the pg-lo tier) ---------------------------------------------
--
-- One upload is one client transaction, in bounded chunks:
--   BEGIN;
--   SELECT alkblobs_lo_create(pool);                  -- -> oid
--   SELECT alkblobs_lo_write(oid, offset, chunk);     -- repeatedly, e.g. 1 MiB each
--   SELECT alkblobs_lo_commit(pool, key, oid, owner, outboard); -- verify, companion row + pin
--   COMMIT;
-- The upload belongs to that transaction and the caller's role: nobody
-- else can write into it, and once the transaction is over it can only be
-- committed as an entry (lo_commit, in it) or reaped by the sweep. A client
-- that dies mid-upload rolls the object back with its transaction.

CREATE FUNCTION @extschema@.alkblobs_lo_create(pool text)
RETURNS oid
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    pl alkblobs.pools := alkblobs.pool($1, 'write');
    o oid;
BEGIN
    -- Never an OID a record still names: an entry whose object was lost
    -- (then the OID counter came round, or a restore without the large
    -- objects), or an upload row restored the same way. Handed out, it
    -- would make that entry read this upload's bytes, and its deletion
    -- unlink them. Such an object is unlinked and the next OID taken (the
    -- counter has moved past it).
    FOR i IN 1..1000 LOOP
        o := pg_catalog.lo_create(0);
        EXIT WHEN NOT EXISTS (SELECT 1 FROM alkblobs.entries e WHERE e.loid = o)
              AND NOT EXISTS (SELECT 1 FROM alkblobs.uploads u WHERE u.loid = o);
        PERFORM pg_catalog.lo_unlink(o);
        o := NULL;
    END LOOP;
    IF o IS NULL THEN
        RAISE EXCEPTION 'no free large-object OID in 1000 tries: the entries name them'
            USING ERRCODE = 'program_limit_exceeded';
    END IF;
    INSERT INTO alkblobs.uploads (loid, pool, xact, role) VALUES (o, pl.id, pg_catalog.pg_current_xact_id(), session_user);
    RETURN o;
END $$;

-- Whether the transaction of an upload row is still running, i.e. the
-- upload is not abandoned. A row restored from another cluster's dump
-- carries that cluster's transaction id: pg_xact_status raises 22023 for
-- one this cluster has not reached yet, and answers NULL for one older
-- than its commit log; both are abandoned (the upload's transaction ended
-- in the cluster it ran in). (One that is an unrelated transaction here
-- and still running only delays the upload's reaping until it ends.)
CREATE FUNCTION alkblobs.upload_running(x xid8) RETURNS boolean
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RETURN coalesce(pg_catalog.pg_xact_status(x) OPERATOR(pg_catalog.=) 'in progress', false);
EXCEPTION WHEN invalid_parameter_value THEN
    RETURN false;  -- "transaction ID … is in the future": another cluster's
END $$;

-- Reaps at most `lim` of pool `pool_id`'s abandoned uploads (their
-- transaction ended without lo_commit: no entry references their object):
-- the row, and its large object if one is left. One another session is
-- reaping is skipped. A fleet pool's sweep calls it (within its
-- max_unlinks budget), a single-instance pool's through alkblobs_lo_reap.
CREATE FUNCTION alkblobs.reap_uploads(pool_id integer, lim integer, OUT reaped bigint, OUT unlinked integer)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    r record;
BEGIN
    reaped := 0;
    unlinked := 0;
    FOR r IN WITH pick AS MATERIALIZED (
                 SELECT x.loid FROM alkblobs.uploads x
                  WHERE x.pool = pool_id AND NOT alkblobs.upload_running(x.xact)
                  ORDER BY x.loid LIMIT lim FOR UPDATE SKIP LOCKED)
             DELETE FROM alkblobs.uploads u USING pick WHERE u.loid = pick.loid
             RETURNING u.loid LOOP
        reaped := reaped + 1;
        IF EXISTS (SELECT 1 FROM pg_catalog.pg_largeobject_metadata m WHERE m.oid = r.loid) THEN
            PERFORM pg_catalog.lo_unlink(r.loid);
            unlinked := unlinked + 1;
        END IF;
    END LOOP;
END $$;

-- A single-instance pool's sweep (the client's) reaps the pool's abandoned
-- uploads here, as a fleet pool's alkblobs_sweep does itself: at most
-- `max_unlinks`; returns how many were reaped. Sweep access.
CREATE FUNCTION @extschema@.alkblobs_lo_reap(pool text, max_unlinks integer DEFAULT 1000)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    pl alkblobs.pools := alkblobs.pool($1, 'sweep');
BEGIN
    PERFORM alkblobs.not_null($2, 'max_unlinks');
    IF $2 < 0 OR $2 > 1000000 THEN
        RAISE EXCEPTION 'max_unlinks must be between 0 and 1000000, got %', $2 USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN (SELECT ru.reaped FROM alkblobs.reap_uploads(pl.id, $2) ru);
END $$;

-- The upload `o` if it belongs to this transaction and the caller's role.
CREATE FUNCTION alkblobs.my_upload(o oid) RETURNS alkblobs.uploads
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    u alkblobs.uploads;
BEGIN
    SELECT * INTO u FROM alkblobs.uploads up
     WHERE up.loid = o AND up.xact = pg_catalog.pg_current_xact_id() AND up.role = session_user;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'large object % is not an upload of this transaction', o
            USING ERRCODE = 'invalid_parameter_value', HINT = 'Start one with alkblobs_lo_create(pool) in the same transaction.';
    END IF;
    RETURN u;
END $$;

CREATE FUNCTION @extschema@.alkblobs_lo_write(loid oid, "offset" bigint, chunk bytea)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    u alkblobs.uploads;
    lim bigint;
BEGIN
    IF $1 IS NULL OR $2 IS NULL OR $3 IS NULL THEN
        RAISE EXCEPTION 'loid, offset and chunk must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    u := alkblobs.my_upload($1);
    IF $2 < 0 THEN
        RAISE EXCEPTION 'offset must not be negative' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT p.max_object_bytes INTO lim FROM alkblobs.pools p WHERE p.id = u.pool;
    IF $2 + length($3) > lim THEN
        RAISE EXCEPTION 'an upload to this pool may be at most % bytes; this write ends at byte %', lim, $2 + length($3)
            USING ERRCODE = 'program_limit_exceeded';
    END IF;
    PERFORM pg_catalog.lo_put($1, $2, $3);
END $$;

-- The length of the outboard of a blob of `size` bytes: 64 bytes per 16 KiB
-- chunk group after the first (client/src/outboard.rs).
CREATE FUNCTION alkblobs.outboard_len(size bigint) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp AS $$
    SELECT 64 OPERATOR(pg_catalog.*) greatest((size OPERATOR(pg_catalog.+) 16383) OPERATOR(pg_catalog./) 16384 OPERATOR(pg_catalog.-) 1, 0)
$$;

-- Refuses an outboard whose length is not that of a blob of `size` bytes
-- (22023): a client's slip, caught before it is stored. Its content is not
-- checked here (the server need not hash); readers check it.
CREATE FUNCTION alkblobs.check_outboard(outboard bytea, size bigint) RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF $1 IS NOT NULL AND pg_catalog.octet_length($1) OPERATOR(pg_catalog.<>) alkblobs.outboard_len($2) THEN
        RAISE EXCEPTION 'an outboard of % bytes, but a blob of % bytes has one of %', pg_catalog.octet_length($1), $2, alkblobs.outboard_len($2)
            USING ERRCODE = 'invalid_parameter_value', HINT = 'Nothing was stored.';
    END IF;
END $$;

CREATE FUNCTION @extschema@.alkblobs_lo_commit(pool text, key bytea, loid oid, owner text, outboard bytea DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    pl alkblobs.pools := alkblobs.pool($1, 'write');
    u alkblobs.uploads;
    h record;
    created boolean := false;
    restored boolean;
    old_loid oid;
    old_size bigint;
BEGIN
    PERFORM alkblobs.check_key($2);
    PERFORM alkblobs.not_null($3, 'loid');
    IF $4 IS NOT NULL OR pl.mode <> 'single' THEN
        PERFORM alkblobs.check_owner($4);
        PERFORM alkblobs.require_mode(pl, 'fleet', 'a put with an owner (a pin row)');
    END IF;
    u := alkblobs.my_upload($3);
    IF u.pool <> pl.id THEN
        RAISE EXCEPTION 'large object % is an upload to another pool', $3 USING ERRCODE = 'invalid_parameter_value';
    END IF;
    DELETE FROM alkblobs.uploads up WHERE up.loid = $3;
    SELECT * INTO h FROM alkblobs.lo_blake3($3);
    PERFORM alkblobs.check_outboard($5, h.size);
    IF h.hash <> $2 THEN
        PERFORM pg_catalog.lo_unlink($3);
        RAISE EXCEPTION 'hash mismatch: the large object hashes to %, not to the key %', encode(h.hash, 'hex'), encode($2, 'hex')
            USING ERRCODE = 'AB001', HINT = 'Nothing was stored.';
    END IF;
    FOR attempt IN 1..5 LOOP
        IF alkblobs.lock_entry(pl.id, $2) THEN
            EXIT;
        END IF;
        INSERT INTO alkblobs.entries (pool, key, size, tier, loid, outboard)
        VALUES (pl.id, $2, h.size, 'lo', $3, $5)
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
        -- An entry whose large object is gone (unlinked behind the pool's
        -- back: content lost, AB006 to readers) takes this upload's
        -- object: a put of the original bytes restores it. The entry is
        -- locked first (FOR NO KEY UPDATE: the executor's SKIP LOCKED
        -- passes over it, puts' FOR KEY SHARE do not wait) and its object
        -- looked up again in the next statement, which sees what committed
        -- meanwhile: of two puts restoring one key, the second finds the
        -- first's object and drops its own (none leaks). Where keys are
        -- trusted (SQL-only flavour) the sizes must agree, as alkblobs.holds
        -- requires of any present key.
        restored := false;
        IF EXISTS (SELECT 1 FROM alkblobs.entries e WHERE e.pool = pl.id AND e.key = $2 AND e.tier = 'lo'
                      AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_largeobject_metadata m WHERE m.oid = e.loid)) THEN
            SELECT e.loid, e.size INTO old_loid, old_size FROM alkblobs.entries e
             WHERE e.pool = pl.id AND e.key = $2 AND e.tier = 'lo' FOR NO KEY UPDATE OF e;
            IF FOUND AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_largeobject_metadata m WHERE m.oid = old_loid) THEN
                IF old_size <> h.size THEN
                    PERFORM alkblobs.refuse_other_content(pl, $2, NULL);
                END IF;
                UPDATE alkblobs.entries e SET loid = $3, outboard = coalesce($5, e.outboard)
                 WHERE e.pool = pl.id AND e.key = $2;
                restored := true;
            END IF;
        END IF;
        IF NOT restored THEN
            IF h.hash IS NULL AND NOT alkblobs.holds(pl.id, $2, NULL, $3, h.size) THEN
                PERFORM alkblobs.refuse_other_content(pl, $2, NULL);  -- keys trusted: see alkblobs.holds
            END IF;
            -- A dedup hit: the existing entry stays, the new object goes.
            -- An entry stored before outboards gets this one.
            PERFORM pg_catalog.lo_unlink($3);
            UPDATE alkblobs.entries e SET outboard = $5
             WHERE e.pool = pl.id AND e.key = $2 AND e.tier = 'lo' AND e.outboard IS NULL AND $5 IS NOT NULL;
        END IF;
    END IF;
    DELETE FROM alkblobs.staged s WHERE s.pool = pl.id AND s.key = $2;
    IF $4 IS NOT NULL THEN
        PERFORM alkblobs.pin_row(pl, $2, $4);
    END IF;
    RETURN created;
END $$;

-- A window of a large-object entry (lo_get(oid, offset, len)); NULL if the
-- key is absent. Offsets past the end give an empty result.
CREATE FUNCTION @extschema@.alkblobs_lo_read(pool text, key bytea, "offset" bigint, len integer)
RETURNS bytea
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    pl alkblobs.pools := alkblobs.pool($1, 'read');
    o oid;
BEGIN
    PERFORM alkblobs.check_key($2);
    PERFORM alkblobs.not_null($3, 'offset');
    PERFORM alkblobs.not_null($4, 'len');
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
    -- Recorded, its large object gone (unlinked behind the pool's back,
    -- or not restored): a loss, never "absent" (lo_get would say 42704).
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_largeobject_metadata m WHERE m.oid = o) THEN
        RAISE EXCEPTION 'alkblobs pool "%": the entry % is recorded but its large object % is gone', $1, $2, o
            USING ERRCODE = 'AB006',
                  HINT = 'Put the original bytes again to restore it; alkblobs verify lists every such key.';
    END IF;
    RETURN pg_catalog.lo_get(o, $3, $4);
END $$;

-- A window of a large-object entry's outboard (bytes `offset`.. of it, at
-- most `len`; empty past its end); NULL if the key is absent or its entry
-- has no outboard.
CREATE FUNCTION @extschema@.alkblobs_lo_outboard(pool text, key bytea, "offset" bigint, len integer)
RETURNS bytea
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    pl alkblobs.pools := alkblobs.pool($1, 'read');
    o bytea;
BEGIN
    PERFORM alkblobs.check_key($2);
    PERFORM alkblobs.not_null($3, 'offset');
    PERFORM alkblobs.not_null($4, 'len');
    IF $3 < 0 OR $4 < 0 THEN
        RAISE EXCEPTION 'offset and len must not be negative' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- A blob of one 16 KiB group or less has an empty outboard, stored or not.
    -- An offset at or past the end (any bigint) is empty, not 22003.
    SELECT CASE WHEN alkblobs.outboard_len(e.size) OPERATOR(pg_catalog.=) 0 THEN ''::bytea
                WHEN e.outboard IS NULL THEN NULL
                WHEN $3 OPERATOR(pg_catalog.>=) pg_catalog.octet_length(e.outboard) THEN ''::bytea
                ELSE pg_catalog.substring(e.outboard, ($3 OPERATOR(pg_catalog.+) 1)::integer, $4) END INTO o
      FROM alkblobs.entries e
     WHERE e.pool = pl.id AND e.key = $2 AND e.tier = 'lo';
    RETURN o;
END $$;

-- Stores the outboard of a present large-object entry, replacing any
-- (`alkblobs verify --repair-outboards`); false if the key is absent.
CREATE FUNCTION @extschema@.alkblobs_lo_put_outboard(pool text, key bytea, outboard bytea)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    pl alkblobs.pools := alkblobs.pool($1, 'write');
    n bigint;
BEGIN
    PERFORM alkblobs.check_key($2);
    PERFORM alkblobs.not_null($3, 'outboard');
    -- No lock above FOR KEY SHARE but the executor's (10-helpers.sql): the
    -- size is read unlocked (it never changes), the UPDATE of a non-key
    -- column takes FOR NO KEY UPDATE, which puts, pins and liveness writes
    -- do not wait for. A deletion racing it wins: nothing is updated.
    SELECT e.size INTO n FROM alkblobs.entries e WHERE e.pool = pl.id AND e.key = $2 AND e.tier = 'lo';
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM alkblobs.check_outboard($3, n);
    UPDATE alkblobs.entries e SET outboard = $3 WHERE e.pool = pl.id AND e.key = $2 AND e.tier = 'lo';
    RETURN FOUND;
END $$;
