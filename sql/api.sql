-- alkblobs extension: the SQL API (after bootstrap.sql and the Rust
-- functions alkblobs.blake3 / alkblobs.lo_blake3).
--
-- Every function that touches the internal tables is SECURITY DEFINER as
-- the non-superuser role alkblobs_owner, with `search_path = pg_catalog,
-- pg_temp`, and every object it names is schema-qualified, so a caller's
-- search_path cannot hijack it. Values are always bound parameters; the
-- only dynamic SQL splices liveness table names produced by `regclass`
-- output (quoted and schema-qualified by PostgreSQL), and only after
-- alkblobs.check_sources has locked and re-validated every one of them in
-- this transaction.
--
-- Identity: the caller is `session_user` (the login role). SET ROLE does
-- not change who owns a pin or a pool grant.
--
-- Locking protocol (docs/design.md §4): nobody but the executor takes a
-- lock stronger than FOR KEY SHARE on an entry; the executor takes FOR
-- UPDATE SKIP LOCKED on staged rows, entries and pin rows and never waits
-- for a row lock: a key someone is locking is being protected and stays
-- staged. The re-check after the locks needs READ COMMITTED (each
-- statement sees what committed before it), so the sweep, stage, claim and
-- explain refuse any other isolation level with AB003.
--
-- SQLSTATEs raised on purpose (docs/sql-api.md):
--   22023 invalid_parameter_value   bad key length, window, TTL, name, offset
--   22004 null_value_not_allowed    a NULL argument
--   42704 undefined_object          unknown pool
--   42710 duplicate_object          pool exists
--   42809 wrong_object_type         liveness target is not a table it can guard
--   42703 undefined_column          liveness table has no "key" column
--   42804 datatype_mismatch         liveness "key" column is not bytea
--   42501 insufficient_privilege    no access to the pool, not the table's owner
--   54000 program_limit_exceeded    an upload past the pool's max_object_bytes
--   AB001 (alkblobs) hash mismatch  bytes do not hash to the key
--   AB002 (alkblobs) key not held   a liveness row names a key the pool does
--                                   not hold (never put, or collected)
--   AB003 (alkblobs) isolation      the call needs READ COMMITTED
--   AB004 (alkblobs) bad source     a registered liveness table no longer
--                                   passes validation; nothing was done
--   55P03 lock_not_available        a registered liveness table stayed
--                                   locked by someone else's DDL for 5 s

-- Internal helpers ----------------------------------------------------------

-- Takes pool p's sweeper lock (see alkblobs.pool_locks) until the
-- transaction ends: waiting for it (bounded by lock_timeout: 55P03), or
-- with `try` not waiting for its holder — false when someone holds it. A
-- row lock, not an advisory lock: only the extension's functions can take
-- it. (A pool whose lock row is missing — restored by hand without it —
-- gets it on first use; that first use may wait for a concurrent first
-- use, or at REPEATABLE READ fail with 40001 against it.)
CREATE FUNCTION alkblobs.take_lock(p integer, try boolean) RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    LOOP
        IF $2 THEN
            PERFORM 1 FROM alkblobs.pool_locks l WHERE l.pool = $1 FOR UPDATE SKIP LOCKED;
        ELSE
            PERFORM 1 FROM alkblobs.pool_locks l WHERE l.pool = $1 FOR UPDATE;
        END IF;
        IF FOUND THEN
            RETURN true;
        ELSIF EXISTS (SELECT 1 FROM alkblobs.pool_locks l WHERE l.pool = $1) THEN
            RETURN false;
        END IF;
        INSERT INTO alkblobs.pool_locks (pool) VALUES ($1) ON CONFLICT DO NOTHING;
    END LOOP;
END $$;

-- Whether fleet pool `pl` has run under this server start and this
-- incarnation of the extension (alkblobs.incarnation: made by CREATE
-- EXTENSION, never dumped, so a restored pool names another one).
CREATE FUNCTION alkblobs.adopted(pl alkblobs.pools) RETURNS boolean
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RETURN pl.mode = 'single'
        OR (pl.seen_incarnation = (SELECT i.id FROM alkblobs.incarnation i)
            AND pl.seen_start = pg_catalog.pg_postmaster_start_time());
END $$;

-- Whether a pin on `k` in pool `p` guards content that is still there:
-- an entry, or a published file of the local tier.
CREATE FUNCTION alkblobs.content_exists(p integer, k bytea) RETURNS boolean
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RETURN EXISTS (SELECT 1 FROM alkblobs.entries e WHERE e.pool = p AND e.key = k)
        OR EXISTS (SELECT 1 FROM alkblobs.files f WHERE f.pool = p AND f.key = k AND f.published);
END $$;

-- A fleet pool's first sweep, stage or claim since the server started or
-- since it was restored from a dump (alkblobs.adopted is false), during
-- which no instance could renew its pins: however long the server was
-- down or the restore took, every pin whose content is still there gets a
-- fresh TTL and every sealed mark a fresh window, from now. So that first
-- call deletes nothing that was protected when the server stopped or the
-- dump was taken; instances still alive renew as usual, a dead one's pins
-- lapse one TTL later. A pin on content already gone (the reaper may lag
-- the executor) is not revived, and a pin row someone is changing right
-- now (a renewal, an upsert, an unpin) is skipped, never waited for: its
-- holder is alive. The caller holds the pool's sweeper lock. Once done,
-- a comparison of two values. Returns the pool row as it is now.
CREATE FUNCTION alkblobs.adopt(pl alkblobs.pools) RETURNS alkblobs.pools
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    pins bigint;
    marks bigint;
BEGIN
    IF alkblobs.adopted(pl) THEN
        RETURN pl;
    END IF;
    -- Rows restored from a dump taken before 0.8.0 name their role by OID
    -- (now text): map those to the role's name, so its pins renew again.
    -- (Such a dump is only right in the cluster it was taken in, where the
    -- OIDs are the same roles: docs/operations.md, "Dump and restore".)
    UPDATE alkblobs.pins pn SET role = pg_catalog.pg_get_userbyid(pn.role::text::oid)
     WHERE pn.pool = pl.id AND pn.role::text ~ '^[0-9]{1,10}$'
       AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles r WHERE r.rolname = pn.role)
       AND EXISTS (SELECT 1 FROM pg_catalog.pg_roles r WHERE r.oid = pn.role::text::oid)
       AND NOT EXISTS (SELECT 1 FROM alkblobs.pins y
                        WHERE y.pool = pn.pool AND y.key = pn.key AND y.owner = pn.owner
                          AND y.role = pg_catalog.pg_get_userbyid(pn.role::text::oid));
    UPDATE alkblobs.liveness lv SET registered_by = pg_catalog.pg_get_userbyid(lv.registered_by::text::oid)
     WHERE lv.pool = pl.id AND lv.registered_by::text ~ '^[0-9]{1,10}$'
       AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles r WHERE r.rolname = lv.registered_by)
       AND EXISTS (SELECT 1 FROM pg_catalog.pg_roles r WHERE r.oid = lv.registered_by::text::oid);
    UPDATE alkblobs.pins pn SET expires_at = clock_timestamp() + pl.pin_ttl
      FROM (SELECT x.ctid AS t FROM alkblobs.pins x
             WHERE x.pool = pl.id AND x.expires_at < clock_timestamp() + pl.pin_ttl
               AND alkblobs.content_exists(x.pool, x.key)
               FOR UPDATE SKIP LOCKED) l
     WHERE pn.ctid = l.t;
    GET DIAGNOSTICS pins = ROW_COUNT;
    UPDATE alkblobs.marks mk SET mark_end = clock_timestamp()
     WHERE mk.pool = pl.id AND mk.mark_end < clock_timestamp();
    GET DIAGNOSTICS marks = ROW_COUNT;
    RAISE LOG 'alkblobs pool "%": first use since %: % pins get a fresh TTL (%), % marks a fresh window',
              pl.name, CASE WHEN pl.seen_incarnation IS DISTINCT FROM (SELECT i.id FROM alkblobs.incarnation i)
                            THEN 'a restore from a dump' ELSE 'the server started' END,
              pins, pl.pin_ttl, marks;
    UPDATE alkblobs.pools p SET seen_incarnation = (SELECT i.id FROM alkblobs.incarnation i),
                                seen_start = pg_catalog.pg_postmaster_start_time()
     WHERE p.id = pl.id
    RETURNING * INTO pl;
    RETURN pl;
END $$;

-- The calling role: the session's login role. (plpgsql, like every helper
-- on a hot path: a SQL-language function that cannot be inlined — it has a
-- SET clause — is parsed and planned again in every statement that calls
-- it, ~0.5 ms each for may(); plpgsql caches its plans per session.)
CREATE FUNCTION alkblobs.caller() RETURNS oid
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RETURN (SELECT r.oid FROM pg_catalog.pg_roles r WHERE r.rolname = session_user);
END $$;

-- Does the caller have `need` ('read', 'write', 'sweep' or 'admin') on pool
-- p? Superusers and members of the pool's owner role have everything;
-- 'admin' implies every access, 'write' and 'sweep' imply 'read'.
-- SECURITY DEFINER because the views call it as the reader (a function in
-- a view runs with the caller's privileges); it reveals nothing but the
-- caller's own access.
CREATE FUNCTION alkblobs.may(p alkblobs.pools, need text) RETURNS boolean
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RETURN EXISTS (SELECT 1 FROM pg_catalog.pg_roles r WHERE r.rolname = session_user AND r.rolsuper)
        OR EXISTS (SELECT 1 FROM pg_catalog.pg_roles r
                    WHERE r.oid = p.owner AND pg_catalog.pg_has_role(session_user, r.oid, 'USAGE'))
        OR EXISTS (SELECT 1 FROM alkblobs.pool_grants g JOIN pg_catalog.pg_roles r ON r.oid = g.grantee
                    WHERE g.pool = p.id AND pg_catalog.pg_has_role(session_user, r.oid, 'USAGE')
                      AND (g.access = need OR g.access = 'admin' OR (need = 'read' AND g.access IN ('write', 'sweep'))));
END $$;

-- The pool named p_name, if the caller has `need` on it.
CREATE FUNCTION alkblobs.pool(p_name text, need text) RETURNS alkblobs.pools
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
    IF NOT alkblobs.may(r, need) THEN
        RAISE EXCEPTION 'role % has no % access to alkblobs pool "%"', session_user, need, p_name
            USING ERRCODE = 'insufficient_privilege',
                  HINT = format('An admin of the pool can run SELECT alkblobs_grant_pool(%L, %L, %L);', p_name, session_user, need);
    END IF;
    RETURN r;
END $$;

-- Pools are never deleted: entries and pins name their pool without a
-- foreign key (its per-row check was the largest cost of a batch put), so
-- a deleted pool would orphan them.
CREATE FUNCTION alkblobs.refuse_pool_delete() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RAISE EXCEPTION 'alkblobs pools are never deleted'
        USING ERRCODE = 'feature_not_supported',
              HINT = 'Unregister its liveness tables and sweep it to empty it; the pool row stays.';
END $$;
CREATE OR REPLACE TRIGGER refuse_pool_delete BEFORE DELETE ON alkblobs.pools
    FOR EACH ROW EXECUTE FUNCTION alkblobs.refuse_pool_delete();
CREATE OR REPLACE TRIGGER refuse_pool_truncate BEFORE TRUNCATE ON alkblobs.pools
    FOR EACH STATEMENT EXECUTE FUNCTION alkblobs.refuse_pool_delete();

-- The executor's re-check and the validation of registered tables read
-- the catalog and the pins as of each statement: only READ COMMITTED gives
-- that (docs/design.md §4, "Isolation levels").
CREATE FUNCTION alkblobs.require_read_committed(what text) RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF pg_catalog.current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION '% needs READ COMMITTED, this transaction is %', what, pg_catalog.current_setting('transaction_isolation')
            USING ERRCODE = 'AB003',
                  HINT = 'Run it in its own READ COMMITTED transaction (SET default_transaction_isolation may be set for this role or database).';
    END IF;
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

-- Refuses `what` on a pool of the wrong mode (pools.mode).
CREATE FUNCTION alkblobs.require_mode(pl alkblobs.pools, need text, what text) RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF pl.mode <> need THEN
        RAISE EXCEPTION '% is for % pools; pool "%" is a % pool', what,
                        CASE need WHEN 'single' THEN 'single-instance' ELSE 'fleet' END, pl.name,
                        CASE pl.mode WHEN 'single' THEN 'single-instance' ELSE 'fleet' END
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = CASE pl.mode WHEN 'single' THEN 'The store instance that owns a single-instance pool sweeps it (and its liveness is in that process).'
                                      ELSE 'Fleet pools are swept by alkblobs_sweep; puts pin for an owner.' END;
    END IF;
END $$;

-- At most n elements in a key array argument (bounded work per call).
CREATE FUNCTION alkblobs.max_keys(ks bytea[], n integer) RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF cardinality(ks) > n THEN
        RAISE EXCEPTION 'at most % keys per call, got %', n, cardinality(ks) USING ERRCODE = 'invalid_parameter_value';
    END IF;
END $$;

CREATE FUNCTION alkblobs.not_null(v anyelement, what text) RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF v IS NULL THEN
        RAISE EXCEPTION '% must not be NULL', what USING ERRCODE = 'null_value_not_allowed';
    END IF;
END $$;

-- Why registered table `rel` cannot be read safely as a liveness source,
-- or NULL if it can. Checked at registration and again at every use (its
-- owner can change it at any time): an ordinary or partitioned table (so
-- no view, no rules), not temporary, no row-level security (the sweeper
-- must see every row), a `key` column of type exactly bytea (a type with
-- an implicit cast to bytea would run its owner's cast function as
-- alkblobs_owner), no INHERITS children (read through the parent, never
-- guarded), not unlogged (a crash would empty it), no user-defined
-- function or operator in anything a query of the table may evaluate while
-- it is planned or scanned (index expressions and predicates, constraints,
-- partition keys, extended statistics: the planner folds them as the
-- definer, alkblobs_owner), and the extension's own guard trigger, enabled
-- ALWAYS (also under session_replication_role = replica), on it and on
-- every partition. VOLATILE on purpose: each statement reads the catalog
-- as it is now.
CREATE FUNCTION alkblobs.source_problem(rel oid) RETURNS text
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    c record;
    t oid;
    child oid;
    prob text;
BEGIN
    SELECT cl.relkind, cl.relpersistence, cl.relrowsecurity INTO c FROM pg_catalog.pg_class cl WHERE cl.oid = rel;
    IF NOT FOUND THEN
        RETURN 'no longer exists';
    END IF;
    IF c.relkind NOT IN ('r', 'p') THEN
        RETURN format('is not a table (relkind %s)', c.relkind);
    END IF;
    IF c.relpersistence = 't' THEN
        RETURN 'is a temporary table';
    END IF;
    IF c.relpersistence = 'u' THEN
        RETURN 'is an unlogged table (a crash empties it, and every key it protected with it)';
    END IF;
    IF c.relrowsecurity THEN
        RETURN 'has row-level security enabled (a sweep must see every row)';
    END IF;
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_rewrite rw WHERE rw.ev_class = rel) THEN
        RETURN 'has rules';
    END IF;
    SELECT a.atttypid INTO t FROM pg_catalog.pg_attribute a
     WHERE a.attrelid = rel AND a.attname = 'key' AND a.attnum > 0 AND NOT a.attisdropped;
    IF NOT FOUND THEN
        RETURN 'has no column "key"';
    END IF;
    IF t <> 'pg_catalog.bytea'::pg_catalog.regtype THEN
        RETURN format('has a "key" column of type %s, not bytea', t::pg_catalog.regtype);
    END IF;
    IF c.relkind = 'r' AND EXISTS (SELECT 1 FROM pg_catalog.pg_inherits i WHERE i.inhparent = rel) THEN
        RETURN 'has INHERITS children (a sweep reads their rows, the guard does not see their writes)';
    END IF;
    -- User code the planner or executor could run as the definer: every
    -- dependency of the table itself (partition key expressions), of its
    -- indexes (expressions, predicates), constraints and extended
    -- statistics on a function or operator that is not built in.
    SELECT format('%s %s', CASE d.refclassid WHEN 'pg_catalog.pg_proc'::pg_catalog.regclass THEN 'function' ELSE 'operator' END,
                  CASE d.refclassid WHEN 'pg_catalog.pg_proc'::pg_catalog.regclass THEN d.refobjid::pg_catalog.regprocedure::text
                                    ELSE d.refobjid::pg_catalog.regoperator::text END)
      INTO prob
      FROM pg_catalog.pg_depend d
     WHERE d.refclassid IN ('pg_catalog.pg_proc'::pg_catalog.regclass, 'pg_catalog.pg_operator'::pg_catalog.regclass)
       AND d.refobjid >= 16384
       AND ((d.classid = 'pg_catalog.pg_class'::pg_catalog.regclass
             AND (d.objid = rel OR d.objid IN (SELECT ix.indexrelid FROM pg_catalog.pg_index ix WHERE ix.indrelid = rel)))
         OR (d.classid = 'pg_catalog.pg_constraint'::pg_catalog.regclass
             AND d.objid IN (SELECT co.oid FROM pg_catalog.pg_constraint co WHERE co.conrelid = rel))
         OR (d.classid = 'pg_catalog.pg_statistic_ext'::pg_catalog.regclass
             AND d.objid IN (SELECT st.oid FROM pg_catalog.pg_statistic_ext st WHERE st.stxrelid = rel)))
     ORDER BY d.refobjid LIMIT 1;
    IF prob IS NOT NULL THEN
        RETURN format('uses the user-defined %s in an index, constraint, partition key or statistics object (a sweep would run it as alkblobs_owner)', prob);
    END IF;
    IF NOT EXISTS (
        SELECT 1 FROM pg_catalog.pg_trigger tg
         WHERE tg.tgrelid = rel AND tg.tgname = 'alkblobs_liveness_guard'
           AND tg.tgfoid = 'alkblobs_registration.liveness_guard()'::pg_catalog.regprocedure
           AND tg.tgtype = 21  -- ROW | INSERT | UPDATE, AFTER
           AND tg.tgenabled = 'A' AND tg.tgqual IS NULL AND tg.tgnargs = 0
           AND tg.tgconstraint = 0 AND NOT tg.tgdeferrable
           AND coalesce(pg_catalog.array_length(tg.tgattr::int2[], 1), 0) = 0) THEN
        RETURN 'lacks its guard trigger alkblobs_liveness_guard (missing, altered, deferred or not ENABLE ALWAYS)';
    END IF;
    IF c.relkind = 'p' THEN
        FOR child IN SELECT i.inhrelid FROM pg_catalog.pg_inherits i WHERE i.inhparent = rel ORDER BY 1 LOOP
            prob := alkblobs.source_problem(child);
            IF prob IS NOT NULL THEN
                RETURN format('has a partition %s that %s', child::pg_catalog.regclass, prob);
            END IF;
        END LOOP;
    END IF;
    RETURN NULL;
END $$;

-- source_problem plus what alkblobs_owner itself needs to read the table
-- through its parent: USAGE on its schema and SELECT on it.
CREATE FUNCTION alkblobs.source_problem_top(rel oid) RETURNS text
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    prob text := alkblobs.source_problem(rel);
BEGIN
    IF prob IS NOT NULL THEN
        RETURN prob;
    END IF;
    IF NOT pg_catalog.has_schema_privilege('alkblobs_owner',
            (SELECT c.relnamespace FROM pg_catalog.pg_class c WHERE c.oid = rel), 'USAGE')
       OR NOT pg_catalog.has_table_privilege('alkblobs_owner', rel, 'SELECT') THEN
        RETURN 'is not readable by alkblobs_owner (USAGE on its schema and SELECT on it are needed; register it again)';
    END IF;
    RETURN NULL;
END $$;

-- The name under which the extension reads registered table `rel`: a view
-- alkblobs.src_<oid> over it, owned by alkblobs_owner in the extension's
-- own schema. A view is bound to the table's OID when it is created, so
-- no later rename of the table or of its schema can make a sweep read
-- another relation (ALTER SCHEMA … RENAME takes no lock on the tables in
-- it); and while it exists the table's "key" column cannot be retyped or
-- dropped, and DROP TABLE needs CASCADE (or unregistering first).
CREATE FUNCTION alkblobs.source_name(rel oid) RETURNS text
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RETURN pg_catalog.format('alkblobs.%I', 'src_' || rel::text);
END $$;

-- Creates the view of registered table `rel` if it is missing, and checks
-- that it reads `rel` and nothing else (the name used to create it is
-- resolved once, here, and might have been made to mean another relation
-- a moment ago). Returns the problem, or NULL.
CREATE FUNCTION alkblobs.ensure_view(rel oid) RETURNS text
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v text := alkblobs.source_name(rel);
    reads oid[];
BEGIN
    IF pg_catalog.to_regclass(v) IS NULL THEN
        EXECUTE format('CREATE VIEW %s AS SELECT lv.key FROM %s lv', v, rel::pg_catalog.regclass);
    END IF;
    SELECT pg_catalog.array_agg(DISTINCT d.refobjid ORDER BY d.refobjid) INTO reads
      FROM pg_catalog.pg_rewrite rw
      JOIN pg_catalog.pg_depend d ON d.classid = 'pg_catalog.pg_rewrite'::pg_catalog.regclass AND d.objid = rw.oid
     WHERE rw.ev_class = v::pg_catalog.regclass AND d.refobjid <> rw.ev_class
       AND d.refclassid IN ('pg_catalog.pg_class'::pg_catalog.regclass, 'pg_catalog.pg_proc'::pg_catalog.regclass,
                            'pg_catalog.pg_operator'::pg_catalog.regclass, 'pg_catalog.pg_type'::pg_catalog.regclass);
    IF reads IS DISTINCT FROM ARRAY[rel] THEN
        EXECUTE format('DROP VIEW %s', v);
        RETURN 'was being renamed while the extension read it (its name meant another relation); try again';
    END IF;
    -- A view follows a column's number, the guard its name: after
    -- `RENAME key TO …; ADD key …` they would read different columns.
    -- Rebind the view to the column now called "key".
    IF NOT EXISTS (
        SELECT 1 FROM pg_catalog.pg_rewrite rw
          JOIN pg_catalog.pg_depend d ON d.classid = 'pg_catalog.pg_rewrite'::pg_catalog.regclass AND d.objid = rw.oid
          JOIN pg_catalog.pg_attribute a ON a.attrelid = rel AND a.attnum = d.refobjsubid
         WHERE rw.ev_class = v::pg_catalog.regclass AND d.refobjid = rel AND a.attname = 'key' AND NOT a.attisdropped) THEN
        EXECUTE format('DROP VIEW %s', v);
        RETURN alkblobs.ensure_view(rel);
    END IF;
    RETURN NULL;
END $$;

-- Locks registered table `rel` (and each partition) IN SHARE UPDATE
-- EXCLUSIVE MODE by OID, then validates it and makes sure its view reads
-- it (a new statement after the lock: in READ COMMITTED the catalog as it
-- is now). That lock leaves the table's writers alone (they take ROW
-- EXCLUSIVE) but freezes its definition until this transaction ends: no
-- CREATE INDEX (plain or CONCURRENTLY), CREATE STATISTICS, ALTER TABLE
-- (DISABLE TRIGGER, ATTACH PARTITION, INHERIT, ENABLE ROW LEVEL SECURITY)
-- or CREATE RULE can slip in between the validation and the queries that
-- rely on it. Waits at most 5 s for DDL in progress (lock_timeout,
-- restored on return): `busy` then. `gone` when the table was dropped (its
-- DROP removed the registration).
CREATE FUNCTION alkblobs.lock_source(rel oid, OUT problem text, OUT busy boolean, OUT gone boolean)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET lock_timeout = '5s' AS $$
DECLARE
    locked oid[];
    frontier oid[];
BEGIN
    busy := false;
    gone := false;
    BEGIN
        PERFORM alkblobs.lock_for_sweep(rel);
        -- Partitions are read through their parent: lock them too, one
        -- level at a time. Attaching to a locked table waits for us, so
        -- once a level is locked, its children as read by the next
        -- statement are all it will have; a sub-partition attached just
        -- before we locked its parent is seen by that statement.
        locked := ARRAY[rel];
        frontier := ARRAY[rel];
        LOOP
            frontier := ARRAY(SELECT i.inhrelid FROM pg_catalog.pg_inherits i
                               WHERE i.inhparent = ANY(frontier) AND NOT i.inhrelid = ANY(locked)
                               ORDER BY i.inhrelid);
            EXIT WHEN cardinality(frontier) = 0;
            PERFORM alkblobs.lock_for_sweep(x) FROM unnest(frontier) x;
            locked := locked || frontier;
        END LOOP;
    EXCEPTION WHEN lock_not_available OR deadlock_detected THEN
        busy := true;
        problem := 'is locked by DDL in progress (waited 5 s)';
        RETURN;
    END;
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_class c WHERE c.oid = rel) THEN
        gone := true;
        RETURN;
    END IF;
    problem := coalesce(alkblobs.source_problem_top(rel), alkblobs.ensure_view(rel));
END $$;

-- Locks and validates every liveness table of pool p (lock_source), and
-- checks the rows of any whose rows may have bypassed its guard (pending).
-- Returns the first problem as '<table> <why>' (busy: a table stayed
-- locked by someone's DDL), or a NULL problem when every source is sound.
CREATE FUNCTION alkblobs.check_sources(p integer, OUT problem text, OUT busy boolean)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    r record;
    ls record;
    pl alkblobs.pools;
BEGIN
    busy := false;
    FOR r IN SELECT l.relid, l.pending FROM alkblobs.liveness l WHERE l.pool = p ORDER BY l.relid LOOP
        SELECT * INTO ls FROM alkblobs.lock_source(r.relid);
        CONTINUE WHEN ls.gone;
        IF ls.problem IS NOT NULL THEN
            problem := format('%s %s', r.relid::pg_catalog.regclass, ls.problem);
            busy := ls.busy;
            RETURN;
        END IF;
        IF r.pending IS NOT NULL THEN
            SELECT * INTO pl FROM alkblobs.pools x WHERE x.id = p;
            IF r.pending = 'seed' THEN
                PERFORM alkblobs.seed_files(pl, r.relid);
            ELSE
                BEGIN
                    PERFORM alkblobs.refuse_absent(pl, r.relid);
                EXCEPTION WHEN SQLSTATE 'AB002' THEN
                    problem := format('%s has rows naming keys the pool does not hold (written while its guard was off or before it was registered): delete them, or put the content', r.relid::pg_catalog.regclass);
                    RETURN;
                END;
            END IF;
            UPDATE alkblobs.liveness l SET pending = NULL WHERE l.pool = p AND l.relid = r.relid;
        END IF;
    END LOOP;
END $$;

-- "Is any registered liveness table holding <key_expr>?" for pool p, as a
-- SQL predicate over the tables' views. key_expr is one of the fixed
-- internal expressions below, never caller input. Only call it after
-- check_sources(p) returned no problem in this transaction.
CREATE FUNCTION alkblobs.live_predicate(p integer, key_expr text) RETURNS text
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp AS $$
    SELECT coalesce(
        string_agg(format('EXISTS (SELECT 1 FROM %s lv WHERE lv.key = %s)', alkblobs.source_name(l.relid), key_expr),
                   ' OR ' ORDER BY l.relid),
        'false')
    FROM alkblobs.liveness l
    JOIN pg_catalog.pg_class c ON c.oid = l.relid
    WHERE l.pool = p
$$;

-- Pools ----------------------------------------------------------------------

-- Validates pool settings (NULLs are "unchanged" and pass). The maxima keep
-- every later `mark_end + window` and `clock_timestamp() + ttl` in range.
-- True for an interval with a month or year part, a negative day part or a
-- negative time part (NULL: "unchanged", false).
CREATE FUNCTION alkblobs.mixed_interval(i interval) RETURNS boolean
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp AS $$
    SELECT coalesce(extract(year FROM i) <> 0 OR extract(month FROM i) <> 0
                    OR extract(day FROM i) < 0
                    OR extract(epoch FROM i) - extract(day FROM i) * 86400 < 0, false)
$$;

CREATE FUNCTION alkblobs.check_settings(w interval, ttl interval) RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    -- Interval comparison folds a month into 30 days, so a mixed-unit value
    -- ('3600000 months -107999700 days') can compare as small and still
    -- overflow or go negative when added to a timestamp. Only plain spans
    -- of days, hours, minutes and seconds, none of them negative, are
    -- accepted; then the comparison below is exact.
    IF alkblobs.mixed_interval(w) THEN
        RAISE EXCEPTION 'delete_window must be days, hours, minutes and seconds with no month, year or negative part, got %', w
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF alkblobs.mixed_interval(ttl) THEN
        RAISE EXCEPTION 'pin_ttl must be days, hours, minutes and seconds with no month, year or negative part, got %', ttl
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF w < interval '0' OR w > interval '366 days' THEN
        RAISE EXCEPTION 'delete_window must be between 0 and 366 days, got %', w USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF ttl <= interval '0' OR ttl > interval '7 days' THEN
        RAISE EXCEPTION 'pin_ttl must be positive and at most 7 days, got %', ttl USING ERRCODE = 'invalid_parameter_value';
    END IF;
END $$;

-- Largest large object an upload may write: at least 1 byte, at most
-- 4 TiB (PostgreSQL's own limit for a large object).
CREATE FUNCTION alkblobs.check_max_object(n bigint) RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF n < 1 OR n > 4398046511104 THEN
        RAISE EXCEPTION 'max_object_bytes must be between 1 and 4398046511104 (4 TiB), got %', n
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
END $$;

-- Validates scheduling and health settings (NULLs are "unchanged" and
-- pass; '0' means "back to the default" and passes too).
CREATE FUNCTION alkblobs.check_schedule(every interval, keep interval, warn interval, crit interval) RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v record;
BEGIN
    FOR v IN SELECT * FROM (VALUES ('sweep_every', every), ('history_keep', keep),
                                   ('warn_after', warn), ('critical_after', crit)) x(name, val) LOOP
        IF alkblobs.mixed_interval(v.val) THEN
            RAISE EXCEPTION '% must be days, hours, minutes and seconds with no month, year or negative part, got %', v.name, v.val
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        IF v.val > interval '0' AND (v.val < interval '1 second' OR v.val > interval '3660 days') THEN
            RAISE EXCEPTION '% must be between 1 second and 3660 days (or 0 for the default), got %', v.name, v.val
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
    END LOOP;
    IF keep = interval '0' THEN
        RAISE EXCEPTION 'history_keep must be at least 1 second, got %', keep USING ERRCODE = 'invalid_parameter_value';
    END IF;
END $$;

-- Whether this database's scheduler runs: 'on', 'paused'
-- (alkblobs.scheduler_enabled = off) or 'off' (no scheduler serves this
-- database: the library is not in shared_preload_libraries, or the
-- database is not in alkblobs.scheduler_databases).
CREATE FUNCTION alkblobs.scheduler_state() RETURNS text
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    -- (backend_type is hidden from alkblobs_owner; application_name is
    -- not, and only a superuser's session counts, so no other role can
    -- pose as the scheduler.)
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_stat_activity a JOIN pg_catalog.pg_roles r ON r.oid = a.usesysid
                    WHERE a.application_name = 'alkblobs scheduler' AND a.datname = current_database()
                      AND r.rolsuper) THEN
        RETURN 'off';
    ELSIF lower(coalesce(current_setting('alkblobs.scheduler_enabled', true), 'on')) IN ('off', 'false', 'no', '0') THEN
        RETURN 'paused';
    END IF;
    RETURN 'on';
END $$;

-- Why scheduling is 'off' in this database, or NULL when a scheduler
-- serves it (for alkblobs_health's reasons and the notices).
CREATE FUNCTION alkblobs.scheduler_off_reason() RETURNS text
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    dbs text := current_setting('alkblobs.scheduler_databases', true);
BEGIN
    IF NOT alkblobs.scheduler_preloaded() THEN
        RETURN 'the alkblobs library is not in shared_preload_libraries';
    ELSIF NOT EXISTS (SELECT 1 FROM pg_catalog.regexp_split_to_table(coalesce(dbs, ''), ',') d
                       WHERE pg_catalog.btrim(d) OPERATOR(pg_catalog.=) current_database()) THEN
        RETURN format('database "%s" is not in alkblobs.scheduler_databases', current_database());
    ELSIF alkblobs.scheduler_state() = 'off' THEN
        RETURN 'its background worker is not running (see the server log)';
    END IF;
    RETURN NULL;
END $$;

-- The notice a pool with a schedule gets when nothing will run it.
CREATE FUNCTION alkblobs.notice_if_unscheduled(pool_name text, every interval) RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    st text := alkblobs.scheduler_state();
BEGIN
    IF every IS NOT NULL AND st <> 'on' THEN
        RAISE NOTICE 'alkblobs pool "%" has sweep_every = %, but scheduling is % in database "%"%: nothing sweeps it until a node or an operator does',
                     pool_name, every, st, current_database(),
                     coalesce(' (' || CASE WHEN st = 'off' THEN alkblobs.scheduler_off_reason() END || ')', '')
            USING HINT = CASE WHEN st = 'paused' THEN 'alkblobs.scheduler_enabled is off; turn it on and reload (SELECT pg_reload_conf()).'
                         ELSE 'Add alkblobs to shared_preload_libraries and this database to alkblobs.scheduler_databases, then restart the server; or schedule CALL alkblobs_sweep_all(pool) with pg_cron (docs/operations.md, "Scheduled sweeps").' END;
    END IF;
END $$;

CREATE FUNCTION @extschema@.alkblobs_create_pool(
    pool text,
    delete_window interval DEFAULT '5 minutes',
    pin_ttl interval DEFAULT '60 seconds',
    large_tier text DEFAULT 'pg-lo',
    max_object_bytes bigint DEFAULT 68719476736,
    single_instance boolean DEFAULT false,
    sweep_every interval DEFAULT NULL,
    history_keep interval DEFAULT '14 days',
    warn_after interval DEFAULT NULL,
    critical_after interval DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF $1 IS NULL OR $2 IS NULL OR $3 IS NULL OR $4 IS NULL OR $5 IS NULL OR $6 IS NULL OR $8 IS NULL THEN
        RAISE EXCEPTION 'pool, delete_window, pin_ttl, large_tier, max_object_bytes, single_instance and history_keep must not be NULL'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    PERFORM alkblobs.check_max_object($5);
    IF $1 !~ '^[A-Za-z0-9][A-Za-z0-9_.:-]{0,62}$' THEN
        RAISE EXCEPTION 'invalid pool name %: use 1 to 63 letters, digits, "_", ".", ":" or "-", starting with a letter or digit', quote_literal($1)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM alkblobs.check_settings($2, $3);
    PERFORM alkblobs.check_schedule($7, $8, $9, $10);
    IF $4 NOT IN ('pg-lo', 'local', 'none') THEN
        RAISE EXCEPTION 'large_tier must be ''pg-lo'', ''local'' or ''none'', got %', quote_literal($4)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF $6 AND nullif($7, interval '0') IS NOT NULL THEN
        RAISE EXCEPTION 'a single-instance pool cannot have sweep_every: the store instance that owns it sweeps it'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    INSERT INTO alkblobs.pools (name, delete_window, pin_ttl, large_tier, owner, max_object_bytes, mode,
                                sweep_every, history_keep, warn_after, critical_after, seen_incarnation, seen_start)
    VALUES ($1, $2, $3, $4, alkblobs.caller(), $5, CASE WHEN $6 THEN 'single' ELSE 'fleet' END,
            nullif($7, interval '0'), $8, nullif($9, interval '0'), nullif($10, interval '0'),
            (SELECT i.id FROM alkblobs.incarnation i), pg_catalog.pg_postmaster_start_time());
    INSERT INTO alkblobs.sweep_state (pool) SELECT p.id FROM alkblobs.pools p WHERE p.name = $1;
    INSERT INTO alkblobs.pool_locks (pool) SELECT p.id FROM alkblobs.pools p WHERE p.name = $1;
    PERFORM alkblobs.notice_if_unscheduled($1, nullif($7, interval '0'));
EXCEPTION WHEN unique_violation THEN
    RAISE EXCEPTION 'alkblobs pool "%" already exists', $1
        USING ERRCODE = 'duplicate_object',
              HINT = 'Change its settings with alkblobs_alter_pool.';
END $$;

-- NULL settings are unchanged; sweep_every, warn_after and critical_after
-- set to interval '0' go back to their defaults (manual; derived).
CREATE FUNCTION @extschema@.alkblobs_alter_pool(
    pool text,
    delete_window interval DEFAULT NULL,
    pin_ttl interval DEFAULT NULL,
    max_object_bytes bigint DEFAULT NULL,
    sweep_every interval DEFAULT NULL,
    history_keep interval DEFAULT NULL,
    warn_after interval DEFAULT NULL,
    critical_after interval DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    pl alkblobs.pools := alkblobs.pool($1, 'admin');
BEGIN
    PERFORM alkblobs.check_settings($2, $3);
    PERFORM alkblobs.check_schedule($5, $6, $7, $8);
    IF $4 IS NOT NULL THEN
        PERFORM alkblobs.check_max_object($4);
    END IF;
    IF pl.mode = 'single' AND $5 > interval '0' THEN
        RAISE EXCEPTION 'alkblobs pool "%" is a single-instance pool and cannot have sweep_every: the store instance that owns it sweeps it', pl.name
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    UPDATE alkblobs.pools p
       SET delete_window = coalesce($2, p.delete_window),
           pin_ttl = coalesce($3, p.pin_ttl),
           max_object_bytes = coalesce($4, p.max_object_bytes),
           sweep_every = CASE WHEN $5 IS NULL THEN p.sweep_every ELSE nullif($5, interval '0') END,
           history_keep = coalesce($6, p.history_keep),
           warn_after = CASE WHEN $7 IS NULL THEN p.warn_after ELSE nullif($7, interval '0') END,
           critical_after = CASE WHEN $8 IS NULL THEN p.critical_after ELSE nullif($8, interval '0') END
     WHERE p.id = pl.id
    RETURNING * INTO pl;
    IF $5 IS NOT NULL THEN
        PERFORM alkblobs.notice_if_unscheduled(pl.name, pl.sweep_every);
    END IF;
END $$;

-- Grants `role` one access ('read', 'write', 'sweep' or 'admin') on a pool.
CREATE FUNCTION @extschema@.alkblobs_grant_pool(pool text, role regrole, access text)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    pl alkblobs.pools := alkblobs.pool($1, 'admin');
BEGIN
    PERFORM alkblobs.not_null($2, 'role');
    PERFORM alkblobs.not_null($3, 'access');
    IF $3 NOT IN ('read', 'write', 'sweep', 'admin') THEN
        RAISE EXCEPTION 'access must be ''read'', ''write'', ''sweep'' or ''admin'', got %', quote_literal($3)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    INSERT INTO alkblobs.pool_grants (pool, grantee, access) VALUES (pl.id, $2, $3) ON CONFLICT DO NOTHING;
END $$;

CREATE FUNCTION @extschema@.alkblobs_revoke_pool(pool text, role regrole, access text)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    pl alkblobs.pools := alkblobs.pool($1, 'admin');
BEGIN
    PERFORM alkblobs.not_null($2, 'role');
    PERFORM alkblobs.not_null($3, 'access');
    DELETE FROM alkblobs.pool_grants g WHERE g.pool = pl.id AND g.grantee = $2 AND g.access = $3;
    RETURN FOUND;
END $$;

-- Puts and pins --------------------------------------------------------------

-- Upserts the caller's pin on (pool, key, owner) to expire one TTL from now.
CREATE FUNCTION alkblobs.pin_row(p alkblobs.pools, k bytea, o text) RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    INSERT INTO alkblobs.pins AS pn (pool, key, role, owner, expires_at)
    VALUES (p.id, k, session_user, o, clock_timestamp() + p.pin_ttl)
    ON CONFLICT (pool, key, role, owner)
    DO UPDATE SET expires_at = greatest(pn.expires_at, EXCLUDED.expires_at);
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
    -- alkblobs.may's rules for 'write', inline.
    SELECT * INTO pl FROM alkblobs.pools p WHERE p.name = $1
       AND (pg_catalog.pg_has_role(session_user, p.owner, 'USAGE')
            OR EXISTS (SELECT 1 FROM alkblobs.pool_grants g
                        WHERE g.pool = p.id AND g.access IN ('write', 'admin')
                          AND pg_catalog.pg_has_role(session_user, g.grantee, 'USAGE')));
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
            IF pl.large_tier = 'local' THEN
                DELETE FROM alkblobs.staged s WHERE s.pool = pl.id AND s.key = $2;
            END IF;
            IF $4 IS NOT NULL THEN
                INSERT INTO alkblobs.pins AS pn (pool, key, role, owner, expires_at)
                VALUES (pl.id, $2, me, $4, clock_timestamp() + pl.pin_ttl)
                ON CONFLICT ON CONSTRAINT pins_pkey DO UPDATE SET expires_at = greatest(pn.expires_at, EXCLUDED.expires_at);
            END IF;
            RETURN true;
        END IF;
        -- Present. DO NOTHING did not wait for an executor that may be
        -- deleting it right now; this lock does, and finds the row only if
        -- it survived. Then it stays until we commit.
        PERFORM 1 FROM alkblobs.entries e WHERE e.pool = pl.id AND e.key = $2 FOR KEY SHARE;
        IF FOUND THEN
            DELETE FROM alkblobs.staged s WHERE s.pool = pl.id AND s.key = $2;
            IF $4 IS NOT NULL THEN
                INSERT INTO alkblobs.pins AS pn (pool, key, role, owner, expires_at)
                VALUES (pl.id, $2, me, $4, clock_timestamp() + pl.pin_ttl)
                ON CONFLICT ON CONSTRAINT pins_pkey DO UPDATE SET expires_at = greatest(pn.expires_at, EXCLUDED.expires_at);
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
       AND NOT (pl.large_tier = 'local' AND alkblobs.lock_file(pl.id, $2)) THEN
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
-- pools whose large tier is 'local' (22023 elsewhere).
CREATE FUNCTION @extschema@.alkblobs_pin_new(pool text, key bytea, owner text)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    pl alkblobs.pools := alkblobs.pool($1, 'write');
    tomb timestamptz;
BEGIN
    PERFORM alkblobs.check_key($2);
    PERFORM alkblobs.check_owner($3);
    PERFORM alkblobs.require_mode(pl, 'fleet', 'alkblobs_pin_new');
    IF pl.large_tier <> 'local' THEN
        RAISE EXCEPTION 'pool "%" keeps large content in tier %, not on a shared local tier', pl.name, pl.large_tier
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Use alkblobs_put, or alkblobs_lo_create/_lo_write/_lo_commit for pg-lo pools.';
    END IF;
    -- The staged row first, then the record: the order a claim locks them
    -- in, so the two cannot deadlock.
    DELETE FROM alkblobs.staged s WHERE s.pool = pl.id AND s.key = $2;
    INSERT INTO alkblobs.files AS f (pool, key) VALUES (pl.id, $2)
    ON CONFLICT ON CONSTRAINT files_pkey DO UPDATE SET recorded_at = f.recorded_at
    RETURNING f.deleting_since INTO tomb;
    IF tomb IS NOT NULL THEN
        -- A claim committed this file's deletion and its claimer may be
        -- unlinking it right now: a file put in place before that is done
        -- could be the one it unlinks.
        RAISE EXCEPTION 'the file of key % in pool "%" is being deleted by a sweep (claimed at %); put it again in a moment',
                        encode($2, 'hex'), pl.name, tomb
            USING ERRCODE = 'object_in_use',
                  HINT = 'The claiming sweep removes the tombstone when its files are gone (alkblobs_local_deleted); if it died, the next sweep finishes its claim.';
    END IF;
    PERFORM alkblobs.pin_row(pl, $2, $3);
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

-- Reads ------------------------------------------------------------------------

CREATE FUNCTION @extschema@.alkblobs_get(pool text, key bytea)
RETURNS bytea
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    ok boolean;
    v bytea;
BEGIN
    -- The hot path: access and value in one statement (alkblobs.may's
    -- rules for 'read', inline); anything else takes the checks that raise.
    SELECT pg_catalog.pg_has_role(session_user, p.owner, 'USAGE')
           OR EXISTS (SELECT 1 FROM alkblobs.pool_grants g
                       WHERE g.pool = p.id AND pg_catalog.pg_has_role(session_user, g.grantee, 'USAGE')),
           (SELECT e.value FROM alkblobs.entries e WHERE e.pool = p.id AND e.key = $2 AND e.tier = 'kv')
      INTO ok, v
      FROM alkblobs.pools p WHERE p.name = $1;
    IF ok AND length($2) = 32 THEN
        RETURN v;
    END IF;
    PERFORM alkblobs.pool($1, 'read');
    PERFORM alkblobs.check_key($2);
    RETURN v;
END $$;

CREATE FUNCTION @extschema@.alkblobs_stat(pool text, key bytea)
RETURNS TABLE (size bigint, tier text, created_at timestamptz)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    pid integer;
BEGIN
    -- alkblobs.may's rules for 'read', inline (as in alkblobs_get).
    SELECT p.id INTO pid FROM alkblobs.pools p WHERE p.name = $1
       AND (pg_catalog.pg_has_role(session_user, p.owner, 'USAGE')
            OR EXISTS (SELECT 1 FROM alkblobs.pool_grants g
                        WHERE g.pool = p.id AND pg_catalog.pg_has_role(session_user, g.grantee, 'USAGE')));
    IF NOT FOUND THEN
        pid := (alkblobs.pool($1, 'read')).id;
    END IF;
    IF length($2) IS DISTINCT FROM 32 THEN
        PERFORM alkblobs.check_key($2);
    END IF;
    RETURN QUERY SELECT e.size, e.tier, e.created_at FROM alkblobs.entries e WHERE e.pool = pid AND e.key = $2;
END $$;

-- Entries of one tier ('kv' or 'lo', NULL: both) with key > after, in key
-- order, at most lim (1 to 100,000): how an engine lists a pool in pages.
CREATE FUNCTION @extschema@.alkblobs_list(pool text, after bytea DEFAULT NULL, lim integer DEFAULT 10000, only_tier text DEFAULT NULL)
RETURNS TABLE (key bytea, size bigint, tier text)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    pl alkblobs.pools := alkblobs.pool($1, 'read');
BEGIN
    PERFORM alkblobs.not_null($3, 'lim');
    IF $3 < 1 OR $3 > 100000 THEN
        RAISE EXCEPTION 'lim must be between 1 and 100000, got %', $3 USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF $4 IS NOT NULL AND $4 NOT IN ('kv', 'lo') THEN
        RAISE EXCEPTION 'tier must be ''kv'', ''lo'' or NULL, got %', quote_literal($4) USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN QUERY
        SELECT e.key, e.size, e.tier FROM alkblobs.entries e
         WHERE e.pool = pl.id AND e.key > coalesce($2, '\x'::bytea) AND ($4 IS NULL OR e.tier = $4)
         ORDER BY e.key LIMIT $3;
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
    -- alkblobs.may's rules for 'write', inline (as in alkblobs_put).
    SELECT * INTO pl FROM alkblobs.pools p WHERE p.name = $1
       AND (pg_catalog.pg_has_role(session_user, p.owner, 'USAGE')
            OR EXISTS (SELECT 1 FROM alkblobs.pool_grants g
                        WHERE g.pool = p.id AND g.access IN ('write', 'admin')
                          AND pg_catalog.pg_has_role(session_user, g.grantee, 'USAGE')));
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
    -- A re-put restarts the window.
    IF cardinality(present) > 0 THEN
        DELETE FROM alkblobs.staged s WHERE s.pool = pl.id AND s.key = ANY(present);
    END IF;
    -- In a local-tier pool a new entry may replace a staged file of the
    -- same key: a put restarts its window.
    IF pl.large_tier = 'local' THEN
        DELETE FROM alkblobs.staged s WHERE s.pool = pl.id AND s.key = ANY(created);
    END IF;
    IF $4 IS NOT NULL THEN
        INSERT INTO alkblobs.pins AS pn (pool, key, role, owner, expires_at)
        SELECT pl.id, u.k, session_user, $4, clock_timestamp() + pl.pin_ttl
          FROM (SELECT DISTINCT unnest($2)) u(k)
         ORDER BY u.k  -- pin rows locked in key order, as the entries
        ON CONFLICT ON CONSTRAINT pins_pkey DO UPDATE SET expires_at = greatest(pn.expires_at, EXCLUDED.expires_at);
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
        IF r.loid IS NOT NULL THEN
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

-- Large objects (the pg-lo tier) ---------------------------------------------
--
-- One upload is one client transaction, in bounded chunks:
--   BEGIN;
--   SELECT alkblobs_lo_create(pool);                  -- -> oid
--   SELECT alkblobs_lo_write(oid, offset, chunk);     -- repeatedly, e.g. 1 MiB each
--   SELECT alkblobs_lo_commit(pool, key, oid, owner); -- verify, companion row + pin
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
    o oid := pg_catalog.lo_create(0);
BEGIN
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

CREATE FUNCTION @extschema@.alkblobs_lo_commit(pool text, key bytea, loid oid, owner text)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    pl alkblobs.pools := alkblobs.pool($1, 'write');
    u alkblobs.uploads;
    h record;
    created boolean := false;
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
    RETURN pg_catalog.lo_get(o, $3, $4);
END $$;

-- Liveness tables --------------------------------------------------------------

-- Installed on every registered liveness table (AFTER INSERT OR UPDATE, FOR
-- EACH ROW, ENABLE ALWAYS: it sees the final key, after generated columns
-- and every BEFORE trigger, and fires under session_replication_role =
-- replica too). For each pool the table is registered with, a row naming a
-- key locks the row that says the pool holds it FOR KEY SHARE: the entry,
-- or in a local-tier pool the file's row in alkblobs.files. An executor or
-- claim deciding the key is waited for; one that comes later passes over
-- the key (SKIP LOCKED) until this transaction ends. If the pool holds no
-- such row (never put, or collected — also when the executor deleted it
-- while this write waited) the write fails with AB002, unless the table
-- was registered with forward_references. At REPEATABLE READ or
-- SERIALIZABLE a row deleted after the writer's snapshot raises 40001
-- instead of being found.
CREATE FUNCTION alkblobs_registration.liveness_guard() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    k bytea;
    r record;
    rc boolean := pg_catalog.current_setting('transaction_isolation') = 'read committed';
BEGIN
    -- Never convert a column of someone else's type: its cast would run as
    -- this function's owner.
    IF pg_catalog.pg_typeof(NEW.key) <> 'pg_catalog.bytea'::pg_catalog.regtype THEN
        RAISE EXCEPTION 'liveness table % has a "key" column of type %, not bytea', TG_RELID::pg_catalog.regclass, pg_catalog.pg_typeof(NEW.key)
            USING ERRCODE = 'AB004';
    END IF;
    k := NEW.key;
    IF TG_OP = 'UPDATE' AND OLD.key IS NOT DISTINCT FROM k THEN
        RETURN NULL;
    END IF;
    IF k IS NULL OR length(k) <> 32 THEN
        RETURN NULL;
    END IF;
    FOR r IN SELECT l.pool, l.forward_refs, p.name, p.large_tier
               FROM alkblobs.liveness l JOIN alkblobs.pools p ON p.id = l.pool
              WHERE (l.relid = TG_RELID OR l.relid IN (SELECT a.relid FROM pg_catalog.pg_partition_ancestors(TG_RELID) a))
              ORDER BY l.pool LOOP
        IF alkblobs.lock_entry(r.pool, k) THEN
            CONTINUE;
        END IF;
        IF r.large_tier = 'local' AND alkblobs.lock_file(r.pool, k) THEN
            CONTINUE;
        END IF;
        IF r.forward_refs THEN
            -- A forward reference protects content put after it commits.
            -- Outside READ COMMITTED "absent" may be a stale snapshot of an
            -- entry being deleted right now: refuse.
            IF NOT rc THEN
                PERFORM alkblobs.require_read_committed('a forward reference');
            END IF;
            CONTINUE;
        END IF;
        RAISE EXCEPTION 'key % is not present in pool "%"', encode(k, 'hex'), r.name
            USING ERRCODE = 'AB002',
                  HINT = 'Put the content first (same bytes, same key), then record it.';
    END LOOP;
    RETURN NULL;
END $$;

-- alkblobs.require_read_committed for the registration functions, which
-- run as the caller (who has no USAGE on schema alkblobs).
CREATE FUNCTION alkblobs_registration.require_read_committed(what text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM alkblobs.require_read_committed($1);
END $$;

-- Takes pool p_name's sweeper lock (waiting out a running sweep) for a
-- caller with admin access to it: registration and unregistration take it
-- before they lock the table, in the order a sweep takes them.
CREATE FUNCTION alkblobs_registration.lock_pool_for_admin(p_name text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    pl alkblobs.pools := alkblobs.pool(p_name, 'admin');
BEGIN
    PERFORM alkblobs.take_lock(pl.id, false);
END $$;

-- Registration, the part that needs the extension's tables (see
-- alkblobs_register_liveness for the part that runs as the caller).
CREATE FUNCTION alkblobs_registration.add_source(pool text, tbl regclass, fwd boolean) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    pl alkblobs.pools := alkblobs.pool($1, 'admin');
    ls record;
BEGIN
    IF $2 IS NULL OR $3 IS NULL THEN
        RAISE EXCEPTION 'table and forward_references must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF NOT pg_catalog.pg_has_role(session_user, (SELECT c.relowner FROM pg_catalog.pg_class c WHERE c.oid = $2), 'USAGE') THEN
        RAISE EXCEPTION 'must own table % to register it as a liveness source', $2
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    -- A single-instance store keeps its liveness in its own process.
    PERFORM alkblobs.require_mode(pl, 'fleet', 'alkblobs_register_liveness');
    -- Registration waits out a running sweep: the next sweep sees the table
    -- from its first statement on.
    PERFORM alkblobs.take_lock(pl.id, false);
    -- Lock (table and partitions), then validate: the rows are read below.
    SELECT * INTO ls FROM alkblobs.lock_source($2);
    IF ls.busy THEN
        RAISE EXCEPTION 'table % %', $2, ls.problem USING ERRCODE = 'lock_not_available';
    ELSIF ls.gone THEN
        RAISE EXCEPTION 'table % was dropped', $2 USING ERRCODE = 'undefined_table';
    ELSIF ls.problem IS NOT NULL THEN
        RAISE EXCEPTION 'table % cannot be a liveness source: it %', $2, ls.problem USING ERRCODE = 'wrong_object_type';
    END IF;
    INSERT INTO alkblobs.liveness (pool, relid, forward_refs, registered_by)
    VALUES (pl.id, $2, $3, session_user)
    ON CONFLICT ON CONSTRAINT liveness_pkey DO UPDATE SET forward_refs = EXCLUDED.forward_refs;
    -- Rows already in the table were written without this pool's guard.
    -- (No sweep of the pool runs until we commit: we hold its lock; the
    -- table's definition is held by ours. Outside READ COMMITTED the scan
    -- would miss rows committed after the snapshot: refused.)
    IF NOT $3 THEN
        PERFORM alkblobs.require_read_committed('alkblobs_register_liveness');
        PERFORM alkblobs.refuse_absent(pl, $2);
    END IF;
END $$;

-- Raises AB002 if registered table `rel` (validated, its view in place,
-- held against DDL by the caller) has a row naming a key pool `pl` does
-- not hold: an entry, or in a local-tier pool a published file.
CREATE FUNCTION alkblobs.refuse_absent(pl alkblobs.pools, rel oid) RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    k bytea;
BEGIN
    EXECUTE format($q$
        SELECT lv.key FROM %s lv
         WHERE lv.key IS NOT NULL AND pg_catalog.length(lv.key) = 32
           AND NOT EXISTS (SELECT 1 FROM alkblobs.entries e WHERE e.pool = $1 AND e.key = lv.key)
           AND NOT ($2 AND EXISTS (SELECT 1 FROM alkblobs.files f WHERE f.pool = $1 AND f.key = lv.key AND f.published))
         LIMIT 1$q$, alkblobs.source_name(rel))
      INTO k USING pl.id, pl.large_tier = 'local';
    IF k IS NOT NULL THEN
        RAISE EXCEPTION 'table % has a row naming key %, which pool "%" does not hold', rel::regclass, encode(k, 'hex'), pl.name
            USING ERRCODE = 'AB002',
                  HINT = 'Put the content first, delete the row, or register the table with forward_references => true.';
    END IF;
END $$;

-- The 0.3.0 -> 0.4.0 upgrade of a local-tier pool: 0.3.0 took a key named
-- by a liveness row and held by no entry to be a file on the local tier;
-- record those as published files.
CREATE FUNCTION alkblobs.seed_files(pl alkblobs.pools, rel oid) RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF pl.large_tier <> 'local' THEN
        RETURN;
    END IF;
    EXECUTE format($q$
        INSERT INTO alkblobs.files (pool, key, published)
        SELECT DISTINCT $1, lv.key, true FROM %s lv
         WHERE lv.key IS NOT NULL AND pg_catalog.length(lv.key) = 32
           AND NOT EXISTS (SELECT 1 FROM alkblobs.entries e WHERE e.pool = $1 AND e.key = lv.key)
        ON CONFLICT ON CONSTRAINT files_pkey DO UPDATE SET published = true$q$, alkblobs.source_name(rel))
      USING pl.id;
END $$;

-- A registered table that changed (ATTACH PARTITION brings in rows no
-- guard saw; ENABLE TRIGGER after a DISABLE lets in rows written without
-- it) must still name only held content. After every ALTER TABLE of a
-- registered table or of a partition of one, the registration is marked
-- 'recheck' (a 'seed' of an upgrade too: rows may have arrived meanwhile),
-- and the next sweep, stage or claim checks every row under its lock and
-- aborts while one names content the pool does not hold. This trigger
-- itself reads no user table (it runs inside anyone's DDL).
CREATE FUNCTION alkblobs.on_ddl_end() RETURNS event_trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    UPDATE alkblobs.liveness l SET pending = 'recheck'
     WHERE NOT l.forward_refs AND l.pending IS DISTINCT FROM 'recheck'
       AND l.relid IN (
           SELECT d.objid FROM pg_catalog.pg_event_trigger_ddl_commands() d
            WHERE d.classid = 'pg_catalog.pg_class'::regclass
           UNION
           SELECT a.relid FROM pg_catalog.pg_event_trigger_ddl_commands() d,
                  LATERAL pg_catalog.pg_partition_ancestors(d.objid) a
            WHERE d.classid = 'pg_catalog.pg_class'::regclass);
    -- (Every subcommand counts: RENAME COLUMN reports the column number.)
END $$;

CREATE EVENT TRIGGER alkblobs_liveness_ddl ON ddl_command_end
    WHEN TAG IN ('ALTER TABLE')
    EXECUTE FUNCTION alkblobs.on_ddl_end();

-- Unregistration's part in the extension's tables: (found, still
-- registered with another pool).
CREATE FUNCTION alkblobs_registration.remove_source(pool text, tbl regclass, OUT found_it boolean, OUT elsewhere boolean)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    pl alkblobs.pools := alkblobs.pool($1, 'admin');
BEGIN
    IF $2 IS NULL THEN
        RAISE EXCEPTION 'table must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF NOT pg_catalog.pg_has_role(session_user, (SELECT c.relowner FROM pg_catalog.pg_class c WHERE c.oid = $2), 'USAGE') THEN
        RAISE EXCEPTION 'must own table % to unregister it', $2 USING ERRCODE = 'insufficient_privilege';
    END IF;
    PERFORM alkblobs.take_lock(pl.id, false);
    DELETE FROM alkblobs.liveness l WHERE l.pool = pl.id AND l.relid = $2;
    found_it := FOUND;
    elsewhere := EXISTS (SELECT 1 FROM alkblobs.liveness l WHERE l.relid = $2);
    IF NOT elsewhere THEN
        EXECUTE format('DROP VIEW IF EXISTS %s', alkblobs.source_name($2));
    END IF;
END $$;

-- Registers a table as a liveness source of a pool. SECURITY INVOKER: the
-- guard trigger is created, and SELECT granted to alkblobs_owner, by the
-- caller, who must own the table (alkblobs_owner owns nothing of yours).
CREATE FUNCTION @extschema@.alkblobs_register_liveness(pool text, tbl regclass, forward_references boolean DEFAULT false)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    rel record;
    keytype oid;
    tg record;
BEGIN
    IF $1 IS NULL OR $2 IS NULL OR $3 IS NULL THEN
        RAISE EXCEPTION 'pool, table and forward_references must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    -- The check of the rows already in the table must see every committed
    -- one (an older snapshot would miss rows committed since).
    PERFORM alkblobs_registration.require_read_committed('alkblobs_register_liveness');
    SELECT c.relkind, c.relowner, c.relpersistence, c.relrowsecurity INTO rel FROM pg_catalog.pg_class c WHERE c.oid = $2;
    IF rel.relkind NOT IN ('r', 'p') THEN
        RAISE EXCEPTION '% is not a table', $2 USING ERRCODE = 'wrong_object_type',
            HINT = 'A liveness source is a table with a "key bytea" column.';
    END IF;
    IF rel.relpersistence = 't' THEN
        RAISE EXCEPTION '% is a temporary table; the sweeper''s session cannot see it', $2
            USING ERRCODE = 'wrong_object_type';
    END IF;
    IF NOT pg_catalog.pg_has_role(current_user, rel.relowner, 'USAGE') THEN
        RAISE EXCEPTION 'must own table % to register it as a liveness source', $2
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    SELECT a.atttypid INTO keytype FROM pg_catalog.pg_attribute a
     WHERE a.attrelid = $2 AND a.attname = 'key' AND a.attnum > 0 AND NOT a.attisdropped;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'table % has no column "key"', $2 USING ERRCODE = 'undefined_column',
            HINT = 'A liveness table holds one row per live key in a column "key bytea".';
    END IF;
    IF keytype <> 'pg_catalog.bytea'::pg_catalog.regtype THEN
        RAISE EXCEPTION 'column "key" of % is %, not bytea', $2, keytype::pg_catalog.regtype USING ERRCODE = 'datatype_mismatch';
    END IF;
    -- The pool's sweeper lock before any lock on the table: a sweep holds
    -- the pool and then locks its tables, so the other order deadlocks.
    PERFORM alkblobs_registration.lock_pool_for_admin($1);
    -- The guard: ours, exactly (an older or altered one is replaced).
    SELECT t.tgfoid, t.tgtype INTO tg FROM pg_catalog.pg_trigger t WHERE t.tgrelid = $2 AND t.tgname = 'alkblobs_liveness_guard';
    IF FOUND AND (tg.tgfoid <> 'alkblobs_registration.liveness_guard()'::pg_catalog.regprocedure OR tg.tgtype <> 21) THEN
        EXECUTE format('DROP TRIGGER alkblobs_liveness_guard ON %s', $2);
    END IF;
    IF NOT FOUND OR tg.tgfoid <> 'alkblobs_registration.liveness_guard()'::pg_catalog.regprocedure OR tg.tgtype <> 21 THEN
        EXECUTE format('CREATE TRIGGER alkblobs_liveness_guard AFTER INSERT OR UPDATE ON %s '
                       'FOR EACH ROW EXECUTE FUNCTION alkblobs_registration.liveness_guard()', $2);
    END IF;
    -- ALWAYS: also under session_replication_role = replica.
    EXECUTE format('ALTER TABLE %s ENABLE ALWAYS TRIGGER alkblobs_liveness_guard', $2);
    -- alkblobs_owner reads it (through its view, alkblobs.src_<oid>; its
    -- partitions through it).
    EXECUTE format('GRANT SELECT ON %s TO alkblobs_owner', $2);
    PERFORM alkblobs_registration.add_source($1, $2, $3);
    IF NOT EXISTS (
        SELECT 1 FROM pg_catalog.pg_index i
         WHERE i.indrelid = $2 AND i.indkey[0] = (SELECT a.attnum FROM pg_catalog.pg_attribute a WHERE a.attrelid = $2 AND a.attname = 'key')) THEN
        RAISE NOTICE 'liveness table % has no index leading with "key"; sweeps will scan it for every candidate batch', $2
            USING HINT = format('CREATE INDEX ON %s (key);', $2);
    END IF;
END $$;

-- Unregisters a table you own. SECURITY INVOKER for the same reason.
CREATE FUNCTION @extschema@.alkblobs_unregister_liveness(pool text, tbl regclass)
RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    r record;
BEGIN
    IF $1 IS NULL OR $2 IS NULL THEN
        RAISE EXCEPTION 'pool and table must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    PERFORM alkblobs_registration.lock_pool_for_admin($1);
    SELECT * INTO r FROM alkblobs_registration.remove_source($1, $2);
    IF NOT r.elsewhere THEN
        EXECUTE format('DROP TRIGGER IF EXISTS alkblobs_liveness_guard ON %s', $2);
        EXECUTE format('REVOKE SELECT ON %s FROM alkblobs_owner', $2);
    END IF;
    RETURN r.found_it;
END $$;

-- A dropped liveness table stops being a source, however it was dropped
-- (DROP TABLE, DROP SCHEMA, DROP OWNED, DROP TYPE ... CASCADE of a typed
-- table, DROP EXTENSION of one it belonged to): otherwise its OID could be
-- reused by another table. (It cannot be half-dropped under a sweep: the
-- sweep holds ACCESS SHARE on every source it reads.)
CREATE FUNCTION alkblobs.on_sql_drop() RETURNS event_trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    DELETE FROM alkblobs.liveness l
     USING pg_catalog.pg_event_trigger_dropped_objects() d
     WHERE d.classid = 'pg_catalog.pg_class'::regclass AND d.objid = l.relid;
END $$;

CREATE EVENT TRIGGER alkblobs_liveness_drop ON sql_drop
    EXECUTE FUNCTION alkblobs.on_sql_drop();

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
    -- can record these keys meanwhile): handed out again, first.
    RETURN QUERY
        SELECT t.key FROM (
            SELECT f.key FROM alkblobs.files f
             WHERE f.pool = pl.id AND f.deleting_since IS NOT NULL
             ORDER BY f.key LIMIT $2 FOR UPDATE SKIP LOCKED) t;
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
    -- of its key cannot slip in before it is unlinked).
    INSERT INTO alkblobs.files AS f (pool, key, published, deleting_since)
    SELECT pl.id, d, false, clock_timestamp() FROM unnest(dead) d ORDER BY d
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
DECLARE
    pl alkblobs.pools := alkblobs.pool($1, 'sweep');
BEGIN
    PERFORM alkblobs.require_read_committed('alkblobs_local_deleting');
    PERFORM alkblobs.require_mode(pl, 'fleet', 'alkblobs_local_deleting');
    PERFORM alkblobs.not_null($2, 'keys');
    PERFORM alkblobs.max_keys($2, 10000);
    RETURN QUERY
        SELECT t.key FROM (
            SELECT f.key FROM alkblobs.files f
             WHERE f.pool = pl.id AND f.key = ANY($2) AND f.deleting_since IS NOT NULL
             ORDER BY f.key FOR UPDATE) t;
END $$;

-- Removes the tombstones of files the caller unlinked (see above); at most
-- 10,000 keys. Returns how many it removed. Until then the keys cannot be
-- recorded afresh (alkblobs_pin_new: 55006).
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
    DELETE FROM alkblobs.files f
     WHERE f.pool = pl.id AND f.key = ANY($2) AND f.deleting_since IS NOT NULL;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END $$;

-- The sweep ----------------------------------------------------------------------

-- One call is one transaction under the pool's sweeper lock (a row lock,
-- alkblobs.take_lock): the lock cannot outlive the call or be lost inside it, whatever a
-- connection pooler does. Steps: validate every registered liveness table
-- (one that fails aborts the call, cause 'liveness_table_invalid'); reap
-- expired pins and abandoned uploads; mark one slice of at most `max_keys`
-- entries after the pool's persisted mark cursor and stage the unprotected
-- ones (the mark is sealed, visible_after = mark_end + window, when a slice
-- reaches the end of the pool; until then its rows are not due); then
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
    aborted text, duration interval)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    t0 timestamptz := clock_timestamp();
    pl alkblobs.pools := alkblobs.pool($1, 'sweep');
    v_dry boolean := $2;
    v_max integer := $3;
    v_mark boolean := $4;
    v_keys integer := $5;
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
    skipped := 0; uploads_reaped := 0; mark_done := false;
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
        DELETE FROM alkblobs.pins pn
         WHERE (pn.pool, pn.key, pn.role, pn.owner) IN (
               SELECT x.pool, x.key, x.role, x.owner FROM alkblobs.pins x
                WHERE x.pool = pl.id AND x.expires_at <= clock_timestamp()
                LIMIT v_keys FOR UPDATE SKIP LOCKED);
        GET DIAGNOSTICS pins_reaped = ROW_COUNT;
        -- Abandoned uploads: their transaction ended without lo_commit.
        FOR r IN DELETE FROM alkblobs.uploads u WHERE u.loid IN (
                     SELECT x.loid FROM alkblobs.uploads x
                      WHERE x.pool = pl.id AND NOT alkblobs.upload_running(x.xact)
                      ORDER BY x.loid LIMIT v_max FOR UPDATE SKIP LOCKED)
                 RETURNING u.loid LOOP
            uploads_reaped := uploads_reaped + 1;
            IF EXISTS (SELECT 1 FROM pg_catalog.pg_largeobject_metadata m WHERE m.oid = r.loid) THEN
                PERFORM pg_catalog.lo_unlink(r.loid);
                unlinks := unlinks + 1;
            END IF;
        END LOOP;
    END IF;

    -- 2. Mark one slice. A dry run examines the same slice (from the
    -- pool's cursor, at most max_keys) and stages nothing.
    IF v_mark THEN
        v_mark_id := pl.open_mark;
        v_cursor := pl.mark_cursor;
        IF v_mark_id IS NULL OR NOT EXISTS (SELECT 1 FROM alkblobs.marks mk WHERE mk.id = v_mark_id AND mk.mark_end IS NULL) THEN
            v_mark_id := NULL;
            IF NOT v_dry THEN
                INSERT INTO alkblobs.marks (pool, delete_window) VALUES (pl.id, pl.delete_window) RETURNING id INTO v_mark_id;
            END IF;
            v_cursor := '\x'::bytea;
        END IF;
        EXECUTE format($q$
            -- Entries, and the files a local-tier pool recorded (the
            -- client claims those), merged in key order.
            WITH slice AS MATERIALIZED (
                -- (A key that is both, after a threshold change, is one
                -- candidate: its entry; the file is staged once that is
                -- gone.)
                SELECT u.key, min(u.tier) AS tier FROM (
                    SELECT e.key, e.tier FROM alkblobs.entries e WHERE e.pool = $1 AND e.key > $4
                    UNION ALL
                    SELECT f.key, 'local' FROM alkblobs.files f
                     WHERE f.pool = $1 AND f.key > $4 AND f.deleting_since IS NULL) u
                 GROUP BY u.key ORDER BY u.key LIMIT $5),
            -- Pins and staged rows of the slice by `key = ANY(array)`:
            -- an index lookup whatever the (often stale) row estimates
            -- of a freshly filled pool, never a per-row range scan.
            held AS MATERIALIZED (
                SELECT DISTINCT pn.key FROM alkblobs.pins pn
                 WHERE pn.pool = $1 AND pn.key = ANY (ARRAY(SELECT key FROM slice)) AND pn.expires_at > $2),
            already AS MATERIALIZED (
                SELECT s.key FROM alkblobs.staged s
                 WHERE s.pool = $1 AND s.key = ANY (ARRAY(SELECT key FROM slice))),
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
            SELECT (SELECT count(*) FROM slice), (SELECT s2.key FROM slice s2 ORDER BY s2.key DESC LIMIT 1), (SELECT count(*) FROM held),
                   (SELECT count(*) FROM cand),
                   CASE WHEN $6 THEN (SELECT count(*) FROM fresh) ELSE (SELECT count(*) FROM ins) END$q$, live_sql)
            INTO examined, v_last, pinned, candidates, staged
            USING pl.id, clock_timestamp(), v_mark_id, v_cursor, v_keys, v_dry;
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
            UPDATE alkblobs.pools p SET open_mark = NULL, mark_cursor = NULL WHERE p.id = pl.id;
        ELSE
            UPDATE alkblobs.pools p SET open_mark = v_mark_id, mark_cursor = v_last WHERE p.id = pl.id;
        END IF;
        live := greatest(examined - pinned - candidates, 0);
    END IF;
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
            IF r.loid IS NOT NULL THEN
                PERFORM pg_catalog.lo_unlink(r.loid);
                unlinks := unlinks + 1;
            END IF;
        END LOOP;
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
                                     pins_reaped, remaining, local_due, skipped, uploads_reaped, mark_done, aborted)
        VALUES (p, session_user, nullif(current_setting('application_name', true), ''), is_scheduled, is_dry,
                t0, clock_timestamp(), r.examined, r.live, r.pinned, r.staged, r.executed, r.deleted, r.kept,
                r.bytes_freed, r.pins_reaped, r.remaining, r.local_due, r.skipped, r.uploads_reaped, r.mark_done,
                r.aborted);
        IF NOT is_dry AND r.aborted IS NULL THEN
            INSERT INTO alkblobs.sweep_state AS st (pool, last_completed) VALUES (p, clock_timestamp())
            ON CONFLICT (pool) DO UPDATE SET last_completed = excluded.last_completed;
        END IF;
    END IF;
    DELETE FROM alkblobs.sweeps s WHERE s.id IN (
        SELECT x.id FROM alkblobs.sweeps x
         WHERE x.pool = p AND x.started < clock_timestamp() - keep
         ORDER BY x.started LIMIT 1000 FOR UPDATE SKIP LOCKED);
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
    aborted text, duration interval)
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
                        r.aborted, r.duration;
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

-- Scheduling (the extension's background worker, pg_ext/src/scheduler.rs) -----

-- The fleet pools of this database whose schedule is due: sweep_every has
-- passed since the scheduler last started a run of them; the longest
-- waiting first.
-- (Nothing, with a WARNING, when the tables stay locked, e.g. by an
-- upgrade, for the worker's lock_timeout: the next look retries.)
CREATE FUNCTION alkblobs.scheduler_due() RETURNS SETOF integer
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RETURN QUERY
    SELECT p.id FROM alkblobs.pools p LEFT JOIN alkblobs.schedule s ON s.pool = p.id
     WHERE p.sweep_every IS NOT NULL AND p.mode = 'fleet'
       AND coalesce(s.last_scheduled, '-infinity'::timestamptz) + p.sweep_every <= clock_timestamp()
     ORDER BY s.last_scheduled NULLS FIRST, p.id;
EXCEPTION WHEN lock_not_available THEN
    RAISE WARNING 'alkblobs scheduler: no pool scheduled this time: %', SQLERRM
        USING HINT = 'The pools table stayed locked (an upgrade, a VACUUM FULL?) for lock_timeout; the next look retries.';
    RETURN;
END $$;

-- The start of a scheduled run of pool p, committed before its first call.
-- False (the pool is skipped this time) if its row stays locked.
CREATE FUNCTION alkblobs.scheduler_claim(p integer) RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    INSERT INTO alkblobs.schedule AS s (pool, last_scheduled) VALUES (p, clock_timestamp())
    ON CONFLICT (pool) DO UPDATE SET last_scheduled = excluded.last_scheduled;
    RETURN true;
EXCEPTION WHEN lock_not_available THEN
    RAISE WARNING 'alkblobs scheduler: pool % skipped: its schedule row stayed locked', p;
    RETURN false;
END $$;

-- One scheduled sweep call of pool p, in the worker's transaction. The
-- sweep's errors are caught (its subtransaction rolled back), recorded in
-- the history with their SQLSTATE and logged as a WARNING: the pool is
-- retried after sweep_every and the worker goes on. Returns the `mark`
-- argument of the next call of this run, or NULL when the run is over (the
-- same rule as alkblobs_sweep_all: go on while the mark is open, or while
-- due rows are left and the call executed some).
CREATE FUNCTION alkblobs.scheduled_sweep(p integer, marking boolean) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    pl alkblobs.pools;
    t0 timestamptz := clock_timestamp();
    r record;
    err text;
BEGIN
    BEGIN
        SELECT * INTO pl FROM alkblobs.pools x WHERE x.id = p;
    EXCEPTION WHEN lock_not_available THEN
        RAISE WARNING 'alkblobs scheduler: pool % skipped: %', p, SQLERRM;
        RETURN NULL;
    END;
    IF NOT FOUND OR pl.sweep_every IS NULL OR pl.mode <> 'fleet' OR marking IS NULL THEN
        RETURN NULL;
    END IF;
    BEGIN
        SELECT * INTO r FROM alkblobs.sweep_core(pl.name, false, 1000, marking, 20000);
    EXCEPTION WHEN query_canceled OR OTHERS THEN
        err := SQLSTATE || ': ' || SQLERRM;
    END;
    BEGIN
        IF err IS NULL THEN
            PERFORM alkblobs.record_sweep(pl.id, t0, true, false, r, NULL);
        ELSE
            PERFORM alkblobs.record_sweep(pl.id, t0, true, false, NULL::record, err);
        END IF;
    EXCEPTION WHEN query_canceled OR OTHERS THEN
        -- Not even the failure can be recorded (a read-only database, a
        -- full disk): say so in the log and end the run.
        RAISE WARNING 'alkblobs scheduler: cannot record the sweep of pool "%" (%): %: %', pl.name,
                      coalesce('it failed: ' || err, 'it completed'), SQLSTATE, SQLERRM;
        RETURN NULL;
    END;
    IF err IS NOT NULL THEN
        RAISE WARNING 'alkblobs scheduler: the sweep of pool "%" failed: %', pl.name, err
            USING HINT = 'The scheduler retries it after sweep_every; alkblobs_health and alkblobs_sweeps show it.';
        RETURN NULL;
    END IF;
    IF r.aborted IS NOT NULL THEN
        RETURN NULL;
    END IF;
    IF r.deleted > 0 OR r.pins_reaped > 0 OR r.uploads_reaped > 0 THEN
        RAISE LOG 'alkblobs scheduler: pool "%": % deleted (% bytes freed), % pins reaped, % uploads reclaimed, % due left',
                  pl.name, r.deleted, r.bytes_freed, r.pins_reaped, r.uploads_reaped, r.remaining;
    END IF;
    IF marking AND NOT r.mark_done THEN
        RETURN true;
    ELSIF r.remaining > 0 AND r.executed > 0 THEN
        RETURN false;
    END IF;
    RETURN NULL;
END $$;

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
-- uploads abandoned that long ago. Defaults: a scheduled pool warns after
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
               invalid_sources bigint, warn_after interval, critical_after interval)
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
BEGIN
    FOR pl IN SELECT * FROM alkblobs.pools x WHERE alkblobs.may(x, 'read') ORDER BY x.name LOOP
        pool := pl.name;
        mode := pl.mode;
        sweep_every := pl.sweep_every;
        scheduler := CASE WHEN pl.mode = 'single' THEN 'owner instance' WHEN pl.sweep_every IS NULL THEN 'manual' ELSE sched END;
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
        FOR l IN SELECT lv.relid FROM alkblobs.liveness lv WHERE lv.pool = pl.id ORDER BY lv.relid LOOP
            BEGIN
                prob := alkblobs.source_problem_top(l.relid);
            EXCEPTION WHEN OTHERS THEN
                prob := 'cannot be checked: ' || SQLERRM;
            END;
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
            IF pl.sweep_every IS NOT NULL AND sched <> 'on' THEN
                why := why || format('sweep_every is %s but scheduling is %s in this database%s', pl.sweep_every, sched,
                                     coalesce(': ' || CASE WHEN sched = 'off' THEN alkblobs.scheduler_off_reason() END, ''));
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
        IF status = 'ok' AND cardinality(why) > 0 THEN
            status := 'warn';
        END IF;
        reasons := why;
        RETURN NEXT;
    END LOOP;
END $$;

-- Runs sweep calls until the mark is sealed and no due row is left (or a
-- call makes no progress: what is left is held by someone), committing
-- between calls so that every transaction stays bounded. Use with CALL
-- outside a transaction block.
-- (No SET clause: a procedure with one cannot COMMIT. It is not SECURITY
-- DEFINER, and it runs as whoever calls it, a superuser too, under the
-- caller's search_path: so every function it calls and every operator it
-- uses is schema-qualified, OPERATOR(pg_catalog.+) and all, and a schema
-- placed before pg_catalog cannot redirect any of it. pg_hardening checks
-- that this is the only routine without a pinned search_path.)
CREATE PROCEDURE @extschema@.alkblobs_sweep_all(pool text, max_unlinks integer DEFAULT 1000)
LANGUAGE plpgsql AS $$
DECLARE
    r record;
    marking boolean := true;
    total_deleted bigint := 0;
    calls integer := 0;
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
        EXIT WHEN NOT marking AND (r.remaining OPERATOR(pg_catalog.=) 0 OR r.executed OPERATOR(pg_catalog.=) 0);
    END LOOP;
    RAISE NOTICE 'pool "%": % call(s), % entries deleted', $1, calls, total_deleted;
END $$;

-- Why is this key live or not? -----------------------------------------------

-- Reports only what the caller may read: a liveness table the caller has
-- no SELECT on is named but not probed; a table that fails validation is
-- reported as refused and not read.
CREATE FUNCTION @extschema@.alkblobs_explain(pool text, key bytea)
RETURNS TABLE (aspect text, detail text)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    pl alkblobs.pools := alkblobs.pool($1, 'read');
    e record;
    r record;
    is_live boolean;
    protected_by text[] := '{}';
    st record;
    has_entry boolean;
    is_staged boolean;
    prob text;
    ls record;
    refused boolean := false;
    hidden boolean := false;
BEGIN
    PERFORM alkblobs.require_read_committed('alkblobs_explain');
    PERFORM alkblobs.check_key($2);
    SELECT en.size, en.tier, en.created_at INTO e FROM alkblobs.entries en WHERE en.pool = pl.id AND en.key = $2;
    has_entry := FOUND;
    IF has_entry THEN
        aspect := 'entry';
        detail := format('present: %s bytes in tier %s since %s', e.size, e.tier, e.created_at);
    ELSE
        aspect := 'entry';
        IF pl.large_tier = 'local' AND EXISTS (SELECT 1 FROM alkblobs.files f WHERE f.pool = pl.id AND f.key = $2 AND f.published) THEN
            has_entry := true;
            detail := format('present: a published file on the shared local tier, recorded %s',
                             (SELECT f.recorded_at FROM alkblobs.files f WHERE f.pool = pl.id AND f.key = $2));
        ELSIF pl.large_tier = 'local' AND EXISTS (SELECT 1 FROM alkblobs.files f WHERE f.pool = pl.id AND f.key = $2 AND f.deleting_since IS NOT NULL) THEN
            detail := 'absent: a sweep claimed its file and is deleting it (put it again once that is done)';
        ELSIF pl.large_tier = 'local' AND EXISTS (SELECT 1 FROM alkblobs.files f WHERE f.pool = pl.id AND f.key = $2) THEN
            detail := 'absent: a file is being published (recorded, not yet confirmed by alkblobs_local_published)';
        ELSE
            detail := 'absent';
        END IF;
    END IF;
    RETURN NEXT;
    FOR r IN SELECT pn.owner, pn.role::text AS role, pn.expires_at, pn.expires_at > clock_timestamp() AS valid
               FROM alkblobs.pins pn
              WHERE pn.pool = pl.id AND pn.key = $2 ORDER BY pn.owner, 2 LOOP
        aspect := 'pin';
        IF r.valid THEN
            detail := format('owner %s (role %s), expires %s (in %s)', r.owner, r.role, r.expires_at, date_trunc('second', r.expires_at - clock_timestamp()));
            protected_by := protected_by || format('pin of %s', r.owner);
        ELSE
            detail := format('owner %s (role %s), EXPIRED at %s (protects nothing; reaped at the next sweep)', r.owner, r.role, r.expires_at);
        END IF;
        RETURN NEXT;
    END LOOP;
    FOR r IN SELECT l.relid FROM alkblobs.liveness l JOIN pg_catalog.pg_class c ON c.oid = l.relid
              WHERE l.pool = pl.id ORDER BY l.relid LOOP
        aspect := 'liveness';
        IF NOT pg_catalog.has_table_privilege(session_user, r.relid, 'SELECT') THEN
            detail := format('%s: not readable by you (not probed)', r.relid::regclass);
            hidden := true;
            RETURN NEXT;
            CONTINUE;
        END IF;
        -- Lock, validate and probe in a subtransaction that is then rolled
        -- back: the lock a sweep takes is released at once, so a reader's
        -- open transaction never holds up sweeps or the table's DDL.
        is_live := NULL;
        BEGIN
            SELECT * INTO ls FROM alkblobs.lock_source(r.relid);
            IF NOT ls.gone AND ls.problem IS NULL THEN
                EXECUTE format('SELECT EXISTS (SELECT 1 FROM %s lv WHERE lv.key = $1)', alkblobs.source_name(r.relid))
                   INTO is_live USING $2;
            END IF;
            RAISE EXCEPTION USING ERRCODE = 'AB999';
        EXCEPTION WHEN SQLSTATE 'AB999' THEN
            NULL;
        END;
        CONTINUE WHEN ls.gone;
        prob := ls.problem;
        IF prob IS NOT NULL AND ls.busy THEN
            detail := format('%s: BUSY: it %s (sweeps of this pool wait for it or abort and retry)', r.relid::regclass, prob);
            refused := true;
            RETURN NEXT;
            CONTINUE;
        ELSIF prob IS NOT NULL THEN
            detail := format('%s: REFUSED: it %s (sweeps of this pool abort until it is fixed or unregistered)', r.relid::regclass, prob);
            refused := true;
            RETURN NEXT;
            CONTINUE;
        END IF;
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
    ELSIF refused THEN
        detail := 'unknown: a liveness table is refused, so sweeps of this pool abort and delete nothing';
    ELSIF hidden THEN
        detail := 'unknown to you: a liveness table you cannot read may hold it';
    ELSIF NOT has_entry AND NOT is_staged THEN
        detail := 'not in the pool: put the content to (re)create it';
    ELSIF is_staged THEN
        detail := 'not live: staged, deleted when due unless re-protected before then';
    ELSE
        detail := 'not live: the next sweep stages it for deletion';
    END IF;
    RETURN NEXT;
END $$;
