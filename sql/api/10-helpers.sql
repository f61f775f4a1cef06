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
--   AB006 (alkblobs) content lost   the key is recorded but its large object
--                                   is gone (put the bytes again)
--   55P03 lock_not_available        a registered liveness table stayed
--                                   locked by someone else's DDL for 5 s


-- This file: internal helpers. The API is split by concern into
-- sql/api/*.sql, loaded in file-name order (pg_ext/src/lib.rs declares
-- each, scripts/gen-upgrade.py checks the two agree).

-- Internal helpers ----------------------------------------------------------

-- Which install this database has: 'library' (CREATE EXTENSION, the Rust
-- library and its background worker) or 'sql-only' (the script of
-- scripts/package.sh sql-only, for servers that cannot load a library:
-- keys are trusted, not verified; pg_cron schedules; docs/operations.md,
-- "The SQL-only flavour"). Public, like alkblobs_key: clients ask it at
-- connect (the extension's catalog row exists only for the first).
CREATE FUNCTION @extschema@.alkblobs_flavour() RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp AS $$
    SELECT CASE WHEN EXISTS (SELECT 1 FROM pg_catalog.pg_extension x WHERE x.extname = 'alkblobs')
                THEN 'library' ELSE 'sql-only' END
$$;

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

-- This installation's incarnation (alkblobs.incarnation), or NULL while
-- its row is one a restore copied from another installation (its relid is
-- not the table's OID; the SQL-only flavour's dump carries the row): no
-- pool has run under this installation then, and alkblobs.adopt makes a
-- new one.
CREATE FUNCTION alkblobs.incarnation_id() RETURNS uuid
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp AS $$
    SELECT i.id FROM alkblobs.incarnation i WHERE i.relid OPERATOR(pg_catalog.=) 'alkblobs.incarnation'::pg_catalog.regclass
$$;

-- Whether fleet pool `pl` has run under this server start and this
-- incarnation of the extension (alkblobs.incarnation_id: a restored pool
-- names another one).
CREATE FUNCTION alkblobs.adopted(pl alkblobs.pools) RETURNS boolean
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RETURN pl.mode = 'single'
        OR (pl.seen_incarnation = alkblobs.incarnation_id()
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
    restored boolean;
    v record;
BEGIN
    IF alkblobs.adopted(pl) THEN
        RETURN pl;
    END IF;
    restored := pl.seen_incarnation IS DISTINCT FROM alkblobs.incarnation_id();
    -- A row a restore copied (SQL-only flavour): this installation gets an
    -- incarnation of its own, once (a concurrent adoption of another pool
    -- waits for this row, then finds it current and changes nothing).
    UPDATE alkblobs.incarnation i SET id = gen_random_uuid(), created_at = now(),
                                      relid = 'alkblobs.incarnation'::regclass
     WHERE i.relid <> 'alkblobs.incarnation'::regclass;
    IF restored THEN
        -- The restored review queue is the dump's: events since it was
        -- taken are not in it, so the full mark runs once.
        PERFORM alkblobs.request_audit(pl.id, 'a restore from a dump');
        -- A restored lease names a backend of the other server (its pid
        -- may be a live one here); a lease only decides which client does
        -- the work (every sweep call takes the sweeper lock itself).
        DELETE FROM alkblobs.leases ls WHERE ls.pool = pl.id;
        -- The views a restore brought back under their tables' old OIDs
        -- (src_<old>): no registration reads them (each gets the view of
        -- its new OID at its first use), and they would keep a table from
        -- being dropped after it is unregistered.
        FOR v IN SELECT c.relname FROM pg_catalog.pg_class c
                  WHERE c.relnamespace = 'alkblobs'::pg_catalog.regnamespace AND c.relkind = 'v'
                    AND c.relname ~ '^src_[0-9]+$'
                    AND NOT EXISTS (SELECT 1 FROM alkblobs.liveness l
                                     WHERE 'src_' || l.relid::oid::text = c.relname) LOOP
            BEGIN
                EXECUTE pg_catalog.format('DROP VIEW alkblobs.%I', v.relname);
            EXCEPTION WHEN insufficient_privilege OR dependent_objects_still_exist OR lock_not_available THEN
                RAISE WARNING 'alkblobs: the stale view alkblobs.% (restored from a dump) stays: %', v.relname, SQLERRM;
            END;
        END LOOP;
    END IF;
    -- Rows restored from a dump taken before 0.8.0 name their role by OID
    -- (now text): map those to the role's name, so its pins renew again.
    -- (Such a dump is only right in the cluster it was taken in, where the
    -- OIDs are the same roles: docs/operations.md, "Dump and restore".)
    -- (alkblobs.role_of_digits: no cast of a name past the OID range,
    -- which would make every use of the pool fail.)
    UPDATE alkblobs.pins pn SET role = alkblobs.role_of_digits(pn.role)
     WHERE pn.pool = pl.id AND pn.role::text ~ '^[0-9]{1,10}$'
       AND alkblobs.role_of_digits(pn.role) <> pn.role
       AND NOT EXISTS (SELECT 1 FROM alkblobs.pins y
                        WHERE y.pool = pn.pool AND y.key = pn.key AND y.owner = pn.owner
                          AND y.role = alkblobs.role_of_digits(pn.role));
    UPDATE alkblobs.liveness lv SET registered_by = alkblobs.role_of_digits(lv.registered_by)
     WHERE lv.pool = pl.id AND lv.registered_by::text ~ '^[0-9]{1,10}$'
       AND alkblobs.role_of_digits(lv.registered_by) <> lv.registered_by;
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
              pl.name, CASE WHEN restored THEN 'a restore from a dump' ELSE 'the server started' END,
              pins, pl.pin_ttl, marks;
    UPDATE alkblobs.pools p SET seen_incarnation = alkblobs.incarnation_id(),
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

-- The rules below, inline, for the hot paths (put, put_many, get, stat),
-- where a call to alkblobs.may per statement costs a plan: a pool row `p`
-- qualifies, and anything else falls back to alkblobs.pool(name, need),
-- which applies alkblobs.may and raises. This is their one source: every
-- copy stands between /* @may(<need>) */ and /* @end */, and
-- scripts/gen-upgrade.py (run by every install) fails if a copy is not this
-- text (white space aside); `scripts/gen-upgrade.py --inline` rewrites the
-- copies from it. (Superusers take the fallback; pg_hotpaths'
-- inline_access_checks_follow_the_pool_grants checks that both agree.)
-- (Roles are held by OID once one has the name, else by name: a name no
-- role has is nobody's access, and never reaches pg_has_role, which raises
-- for an unknown name. See pools.owner_oid.)
-- @source may(write): (EXISTS (SELECT 1 FROM pg_catalog.pg_roles o WHERE (o.oid = p.owner_oid OR (p.owner_oid IS NULL AND o.rolname = p.owner)) AND pg_catalog.pg_has_role(session_user, o.oid, 'USAGE')) OR EXISTS (SELECT 1 FROM alkblobs.pool_grants g JOIN pg_catalog.pg_roles r ON (r.oid = g.grantee_oid OR (g.grantee_oid IS NULL AND r.rolname = g.grantee)) WHERE g.pool = p.id AND g.access IN ('write', 'admin') AND pg_catalog.pg_has_role(session_user, r.oid, 'USAGE')))
-- @source may(read): (EXISTS (SELECT 1 FROM pg_catalog.pg_roles o WHERE (o.oid = p.owner_oid OR (p.owner_oid IS NULL AND o.rolname = p.owner)) AND pg_catalog.pg_has_role(session_user, o.oid, 'USAGE')) OR EXISTS (SELECT 1 FROM alkblobs.pool_grants g JOIN pg_catalog.pg_roles r ON (r.oid = g.grantee_oid OR (g.grantee_oid IS NULL AND r.rolname = g.grantee)) WHERE g.pool = p.id AND pg_catalog.pg_has_role(session_user, r.oid, 'USAGE')))

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
                    WHERE (r.oid = p.owner_oid OR (p.owner_oid IS NULL AND r.rolname = p.owner))
                      AND pg_catalog.pg_has_role(session_user, r.oid, 'USAGE'))
        OR EXISTS (SELECT 1 FROM alkblobs.pool_grants g
                     JOIN pg_catalog.pg_roles r ON (r.oid = g.grantee_oid OR (g.grantee_oid IS NULL AND r.rolname = g.grantee))
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

-- A pool's owner and its grantees: their OID here is taken from the name
-- as the row is written (pools.owner_oid). And as a dump taken before
-- 0.8.0 names them: by OID, as digits. Restored (such a dump is only right in the cluster it
-- was taken in), each becomes the name of the role of that OID before the
-- row is stored, so the first access check already finds it. A name of
-- digits that is a role's name, or that no role's OID is, stays as it is.
CREATE FUNCTION alkblobs.role_of_digits(n name) RETURNS name
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp AS $$
    SELECT CASE WHEN n::text ~ '^[0-9]{1,10}$' AND n::text::bigint < 4294967296
                     AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles r WHERE r.rolname = n)
                THEN coalesce((SELECT r.rolname FROM pg_catalog.pg_roles r WHERE r.oid = n::text::bigint::oid), n)
                ELSE n END
$$;
CREATE FUNCTION alkblobs.roles_by_name() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    -- (A dumped OID column is this cluster's or another's: always taken
    -- again from the name.)
    IF TG_TABLE_NAME = 'pools' THEN
        NEW.owner := alkblobs.role_of_digits(NEW.owner);
        NEW.owner_oid := (SELECT r.oid FROM pg_catalog.pg_roles r WHERE r.rolname = NEW.owner);
    ELSE
        NEW.grantee := alkblobs.role_of_digits(NEW.grantee);
        NEW.grantee_oid := (SELECT r.oid FROM pg_catalog.pg_roles r WHERE r.rolname = NEW.grantee);
    END IF;
    RETURN NEW;
END $$;
CREATE OR REPLACE TRIGGER owner_by_name BEFORE INSERT OR UPDATE OF owner, owner_oid ON alkblobs.pools
    FOR EACH ROW EXECUTE FUNCTION alkblobs.roles_by_name();
CREATE OR REPLACE TRIGGER grantee_by_name BEFORE INSERT OR UPDATE OF grantee, grantee_oid ON alkblobs.pool_grants
    FOR EACH ROW EXECUTE FUNCTION alkblobs.roles_by_name();

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
           -- ROW | INSERT | UPDATE (| DELETE since 0.8.0), AFTER; a
           -- 'queue' pool needs DELETE (alkblobs.queue_problem)
           AND tg.tgtype IN (21, 29)
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

-- What a 'queue' pool needs of registered table `rel` beyond
-- source_problem: a guard that also fires on DELETE, on it and on every
-- partition (one installed before 0.8.0 does not, and rows deleted would
-- leave their keys unqueued), and its TRUNCATE trigger. NULL if none.
CREATE FUNCTION alkblobs.queue_problem(rel oid) RETURNS text
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_trigger tg
                WHERE tg.tgname = 'alkblobs_liveness_guard' AND tg.tgtype <> 29
                  AND tg.tgrelid IN (SELECT rel UNION SELECT pt.relid FROM pg_catalog.pg_partition_tree(rel) pt))
       OR NOT EXISTS (SELECT 1 FROM pg_catalog.pg_trigger tg
                       WHERE tg.tgrelid = rel AND tg.tgname = 'alkblobs_liveness_truncate'
                         AND tg.tgfoid = 'alkblobs_registration.liveness_truncated()'::pg_catalog.regprocedure
                         AND tg.tgtype = 32 AND tg.tgenabled = 'A') THEN
        RETURN 'has guard triggers that do not see deletions and truncation (installed before 0.8.0, or altered): register it again, or set the pool''s collector to ''mark'' (alkblobs_alter_pool)';
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
    d record;
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
    WHEN insufficient_privilege THEN
        -- (SQL-only flavour: the LOCK TABLE privilege was revoked.)
        problem := 'cannot be locked by alkblobs_owner (register it again): ' || SQLERRM;
        RETURN;
    END;
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_class c WHERE c.oid = rel) THEN
        -- Dropped: it protects nothing any more. (The library flavour's
        -- event trigger has removed its registrations already; the
        -- SQL-only flavour has none, and removes them here. A table that
        -- took a dropped one's OID before that is not taken for it: it has
        -- no guard, so it fails validation and every use aborts until an
        -- operator unregisters it; a missing view or guard is never read
        -- as a drop, which would unprotect a table whose guard was
        -- dropped.)
        -- Every pool it fed loses protection no queue row names: audits.
        FOR d IN DELETE FROM alkblobs.liveness l WHERE l.relid = rel RETURNING l.pool LOOP
            PERFORM alkblobs.request_audit(d.pool, format('liveness table %s was dropped', rel));
        END LOOP;
        gone := true;
        RETURN;
    END IF;
    problem := coalesce(alkblobs.source_problem_top(rel), alkblobs.ensure_view(rel));
END $$;

-- The state of the guard triggers of registered table `rel` and of every
-- partition under it: each trigger row's table, version (xmin, ctid) and
-- enabled flag. Any ALTER TABLE that disabled, dropped, re-created or
-- added one (ATTACH PARTITION clones it) leaves another text, even when it
-- was put back as it was (DISABLE then ENABLE writes the row twice): rows
-- may have come in unguarded meanwhile. Compared with liveness.guard_seen.
CREATE FUNCTION alkblobs.guard_state(rel oid) RETURNS text
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp AS $$
    SELECT coalesce(string_agg(format('%s:%s:%s:%s', t.tgrelid, t.xmin, t.ctid, t.tgenabled), ',' ORDER BY t.tgrelid), '')
      FROM pg_catalog.pg_trigger t
     WHERE t.tgname IN ('alkblobs_liveness_guard', 'alkblobs_liveness_truncate')
       AND t.tgrelid IN (SELECT rel UNION SELECT pt.relid FROM pg_catalog.pg_partition_tree(rel) pt)
$$;

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
    SELECT * INTO pl FROM alkblobs.pools x WHERE x.id = p;
    FOR r IN SELECT l.relid, l.pending, l.forward_refs, l.guard_seen FROM alkblobs.liveness l WHERE l.pool = p ORDER BY l.relid LOOP
        SELECT * INTO ls FROM alkblobs.lock_source(r.relid);
        CONTINUE WHEN ls.gone;
        IF ls.problem IS NULL AND pl.collector = 'queue' THEN
            ls.problem := alkblobs.queue_problem(r.relid);
        END IF;
        IF ls.problem IS NOT NULL THEN
            problem := format('%s %s', r.relid::pg_catalog.regclass, ls.problem);
            busy := ls.busy;
            RETURN;
        END IF;
        IF r.pending IS NULL AND NOT r.forward_refs AND r.guard_seen IS DISTINCT FROM alkblobs.guard_state(r.relid) THEN
            r.pending := 'recheck';
        ELSIF r.forward_refs AND r.guard_seen IS DISTINCT FROM alkblobs.guard_state(r.relid) THEN
            -- Forward references are never checked, but rows deleted while
            -- the guard was off name keys no queue row names.
            UPDATE alkblobs.liveness l SET guard_seen = alkblobs.guard_state(r.relid)
             WHERE l.pool = p AND l.relid = r.relid;
            PERFORM alkblobs.request_audit(p, format('liveness table %s changed (ALTER TABLE, or its guard was altered)', r.relid::pg_catalog.regclass));
        END IF;
        IF r.pending IS NOT NULL THEN
            BEGIN
                PERFORM alkblobs.refuse_absent(pl, r.relid);
            EXCEPTION WHEN SQLSTATE 'AB002' THEN
                problem := format('%s has rows naming keys the pool does not hold (written while its guard was off or before it was registered): delete them, or put the content', r.relid::pg_catalog.regclass);
                RETURN;
            END;
            UPDATE alkblobs.liveness l SET pending = NULL, guard_seen = alkblobs.guard_state(r.relid)
             WHERE l.pool = p AND l.relid = r.relid;
            -- Rows may also have been deleted while the guard was off, or
            -- a partition detached: keys no queue row names.
            PERFORM alkblobs.request_audit(p, format('liveness table %s changed (ALTER TABLE, or its guard was altered)', r.relid::pg_catalog.regclass));
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
