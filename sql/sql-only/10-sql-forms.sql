-- alkblobs SQL-only flavour, 10-sql-forms.sql: SQL forms of the functions
-- the library flavour writes in Rust (pg_ext/src/lib.rs).
--
-- Loaded by the SQL-only install script (scripts/gen-sql-only.py) in the
-- place of the library, after bootstrap.sql and before sql/api/*.sql; the
-- extension build never reads it. Same names, same arguments, so the API
-- above them is one text for both flavours. What differs
-- (docs/operations.md, "The SQL-only flavour"):
-- * BLAKE3 cannot be computed here at a useful speed, so the server
--   trusts writers' keys: alkblobs.blake3 and alkblobs.lo_blake3 answer
--   NULL for the hash (every "hash <> key" check is then not true and lets
--   the put through), alkblobs.first_bad checks NULLs and key lengths only,
--   and alkblobs_key says it cannot (0A000). The client verifies every
--   value it reads against its key, and `alkblobs verify` reports a forged
--   key.
-- * A registered table is locked with LOCK TABLE, which needs a privilege
--   (UPDATE, which registration grants alkblobs_owner in this flavour)
--   where the library's LockRelationOid needs none.
-- * No background worker: alkblobs_schedule_cron (sql/api/91-scheduler.sql)
--   schedules a pool's sweeps with pg_cron.

-- The key of a value. The SQL-only flavour cannot compute it.
CREATE FUNCTION @extschema@.alkblobs_key(value bytea) RETURNS bytea
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RAISE EXCEPTION 'alkblobs_key needs the alkblobs library; this database has the SQL-only install'
        USING ERRCODE = 'feature_not_supported',
              HINT = 'A key is the BLAKE3 hash of the value: compute it in the client (b3sum, the alkblobs crate).';
END $$;

-- Unknown (NULL): the put trusts the writer's key.
CREATE FUNCTION alkblobs.blake3(value bytea) RETURNS bytea
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
SET search_path = pg_catalog, pg_temp AS $$
    SELECT NULL::bytea
$$;

-- The 1-based position of the first pair of a batch that is not a valid
-- put: a NULL key or value, a key that is not 32 bytes; extra elements of
-- the longer array too (unnest pads the shorter with NULLs). NULL when
-- every pair is valid. One pass.
CREATE FUNCTION alkblobs.first_bad(keys bytea[], vals bytea[]) RETURNS integer
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
SET search_path = pg_catalog, pg_temp AS $$
    SELECT min(u.o)::integer FROM unnest(keys, vals) WITH ORDINALITY AS u(k, v, o)
     WHERE u.k IS NULL OR u.v IS NULL OR length(u.k) <> 32
$$;

-- The size of a large object, by seeking to its end (nothing is read);
-- its hash unknown (NULL).
CREATE FUNCTION alkblobs.lo_blake3(loid oid) RETURNS TABLE (hash bytea, size bigint)
LANGUAGE plpgsql STRICT
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    fd integer;
BEGIN
    fd := pg_catalog.lo_open(loid, 262144);  -- INV_READ
    size := pg_catalog.lo_lseek64(fd, 0, 2); -- SEEK_END
    PERFORM pg_catalog.lo_close(fd);
    hash := NULL;
    RETURN NEXT;
END $$;

-- Locks relation `rel` (and, PostgreSQL's LOCK TABLE recursing, every
-- partition under it) IN SHARE UPDATE EXCLUSIVE MODE for the rest of the
-- transaction, as the library's LockRelationOid does by OID. SQL can only
-- lock by name, and a name can be made to mean another relation at any
-- moment (ALTER … RENAME takes no lock on the relation the name is moved
-- to), so: look up the name of the OID, lock that name, then check in
-- pg_locks that this backend now holds the lock on the OID itself; if a
-- rename came between, the name is looked up again. Already holding it
-- (a partition locked through its parent): nothing to do. An OID that is
-- no table (dropped, or a view now) is not locked: the validation that
-- follows says what it is. Waits at most lock_timeout (55P03).
CREATE FUNCTION alkblobs.lock_for_sweep(rel oid) RETURNS void
LANGUAGE plpgsql STRICT
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    nm text;
    held boolean;
BEGIN
    FOR attempt IN 1..20 LOOP
        SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_locks l
                        WHERE l.locktype = 'relation' AND l.relation = rel AND l.granted
                          AND l.pid = pg_catalog.pg_backend_pid()
                          AND l.database = (SELECT d.oid FROM pg_catalog.pg_database d WHERE d.datname = current_database())
                          AND l.mode IN ('ShareUpdateExclusiveLock', 'ShareRowExclusiveLock', 'ExclusiveLock', 'AccessExclusiveLock'))
          INTO held;
        IF held THEN
            RETURN;
        END IF;
        SELECT format('%I.%I', n.nspname, c.relname) INTO nm
          FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
         WHERE c.oid = rel AND c.relkind IN ('r', 'p');
        IF NOT FOUND THEN
            RETURN;
        END IF;
        BEGIN
            EXECUTE format('LOCK TABLE %s IN SHARE UPDATE EXCLUSIVE MODE', nm);
        EXCEPTION WHEN undefined_table OR wrong_object_type OR insufficient_privilege THEN
            -- The name moved to another relation (or to none) since it was
            -- looked up; unless it is ours that we may not lock.
            IF SQLSTATE = '42501' AND NOT pg_catalog.has_schema_privilege(
                   (SELECT c.relnamespace FROM pg_catalog.pg_class c WHERE c.oid = rel), 'USAGE') THEN
                RAISE EXCEPTION 'alkblobs_owner cannot lock liveness table %: it has no USAGE on the table''s schema', rel
                    USING ERRCODE = 'insufficient_privilege',
                          HINT = 'The SQL-only flavour locks registered tables with LOCK TABLE, by name: grant USAGE on the schema to alkblobs_owner again.';
            ELSIF SQLSTATE = '42501' AND NOT pg_catalog.has_table_privilege(rel, 'UPDATE') THEN
                RAISE EXCEPTION 'alkblobs_owner cannot lock liveness table %: it has no UPDATE privilege on it', rel::regclass
                    USING ERRCODE = 'insufficient_privilege',
                          HINT = 'The SQL-only flavour locks registered tables with LOCK TABLE, which needs it: register the table again (alkblobs_register_liveness).';
            END IF;
        END;
    END LOOP;
    RAISE EXCEPTION 'cannot lock relation % by its name: the name keeps moving to another relation', rel
        USING ERRCODE = 'lock_not_available';
END $$;

-- No background worker in this flavour.
CREATE FUNCTION alkblobs.scheduler_preloaded() RETURNS boolean
LANGUAGE sql STABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp AS $$
    SELECT false
$$;

-- The version of this install (the library flavour's is its extension's
-- extversion). Public: clients check it at connect.
CREATE FUNCTION @extschema@.alkblobs_sql_only_version() RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp AS $$
    SELECT '@VERSION@'::text
$$;
