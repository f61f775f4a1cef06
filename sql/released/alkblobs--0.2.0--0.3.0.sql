-- alkblobs 0.2.0 -> 0.3.0: the hardening of issue 8.
--
-- Generated once from the 0.3.0 sql/ files (schema delta first, then every
-- function and view of sql/api.sql and sql/finalize.sql re-created) and,
-- like every released upgrade script, never edited afterwards: fixes go in
-- the next one. It ends, as the install does, with alkblobs.apply_policy():
-- alkblobs_owner owns everything and nothing is executable by PUBLIC but
-- alkblobs_key, including any function this script adds.
--
-- What an existing install receives:
-- * pools get an owner (the role running this upgrade) and, so that the
--   fleet keeps working, grants of read/write/sweep/admin to the four
--   alkblobs_* roles: narrow them with alkblobs_revoke_pool / _grant_pool;
-- * windows over 366 days and TTLs over 7 days are clamped to those maxima;
-- * pins made before the upgrade belong to no role (role 0): their holders
--   cannot renew them, so they lapse within one TTL and the holders re-put
--   (an admin can release them);
-- * uploads left over (abandoned before the upgrade) are unlinked;
-- * every registered table gets the new AFTER ROW guard trigger and a
--   SELECT grant to alkblobs_owner; a table that no longer passes
--   validation makes its pool's sweeps abort until it is fixed.

DO $$
DECLARE
    r record;
BEGIN
    SELECT * INTO r FROM pg_catalog.pg_roles WHERE rolname = 'alkblobs_owner';
    IF NOT FOUND THEN
        CREATE ROLE alkblobs_owner NOLOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS;
    ELSIF r.rolsuper OR r.rolcanlogin OR r.rolcreaterole OR r.rolbypassrls OR r.rolreplication THEN
        RAISE EXCEPTION 'role alkblobs_owner exists with privileges it must not have (superuser, login, createrole, replication or bypassrls)'
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'ALTER ROLE alkblobs_owner NOLOGIN NOSUPERUSER NOCREATEROLE NOREPLICATION NOBYPASSRLS, then retry.';
    END IF;
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_auth_members m JOIN pg_catalog.pg_roles o ON o.oid = m.roleid OR o.oid = m.member
                WHERE o.rolname = 'alkblobs_owner') THEN
        RAISE EXCEPTION 'role alkblobs_owner must be a member of no role and have no members'
            USING ERRCODE = 'insufficient_privilege';
    END IF;
END $$;


-- Old functions and views go (the trigger function stays: registered
-- tables' triggers depend on it; it is replaced below).
DROP EVENT TRIGGER IF EXISTS alkblobs_liveness_drop;
DROP VIEW IF EXISTS @extschema@.alkblobs_pools, @extschema@.alkblobs_pins, @extschema@.alkblobs_staged, @extschema@.alkblobs_usage;
DO $$
DECLARE
    f record;
BEGIN
    FOR f IN
        SELECT p.oid::regprocedure AS sig, p.prokind FROM pg_catalog.pg_proc p
          JOIN pg_catalog.pg_depend d ON d.classid = 'pg_catalog.pg_proc'::regclass AND d.objid = p.oid AND d.deptype = 'e'
          JOIN pg_catalog.pg_extension x ON x.oid = d.refobjid AND x.extname = 'alkblobs'
         WHERE p.proname NOT IN ('alkblobs_key', 'blake3', 'lo_blake3', 'liveness_guard')
    LOOP
        EXECUTE format('DROP %s %s', CASE WHEN f.prokind = 'p' THEN 'PROCEDURE' ELSE 'FUNCTION' END, f.sig);
    END LOOP;
END $$;

-- Schema delta.
UPDATE alkblobs.pools SET delete_window = least(delete_window, interval '366 days'),
                          pin_ttl = least(pin_ttl, interval '7 days');
ALTER TABLE alkblobs.pools
    ADD CONSTRAINT window_at_most_a_year CHECK (delete_window <= interval '366 days'),
    ADD CONSTRAINT ttl_at_most_a_week CHECK (pin_ttl <= interval '7 days'),
    ADD COLUMN owner oid,
    ADD COLUMN max_object_bytes bigint NOT NULL DEFAULT 68719476736
        CONSTRAINT max_object_positive CHECK (max_object_bytes > 0),
    ADD COLUMN open_mark bigint,
    ADD COLUMN mark_cursor bytea;
UPDATE alkblobs.pools SET owner = (SELECT r.oid FROM pg_catalog.pg_roles r WHERE r.rolname = session_user);
ALTER TABLE alkblobs.pools ALTER COLUMN owner SET NOT NULL;
-- created_at was the last column; keep the row type's order irrelevant
-- (every function names columns).

CREATE TABLE alkblobs.pool_grants (
    pool    integer NOT NULL REFERENCES alkblobs.pools (id) ON DELETE CASCADE,
    grantee oid NOT NULL,
    access  text NOT NULL CHECK (access IN ('read', 'write', 'sweep', 'admin')),
    PRIMARY KEY (pool, grantee, access)
);
INSERT INTO alkblobs.pool_grants (pool, grantee, access)
SELECT p.id, r.oid, g.access FROM alkblobs.pools p,
       (VALUES ('alkblobs_reader', 'read'), ('alkblobs_writer', 'write'),
               ('alkblobs_sweeper', 'sweep'), ('alkblobs_admin', 'admin')) g(rolname, access)
  JOIN pg_catalog.pg_roles r ON r.rolname = g.rolname;

ALTER TABLE alkblobs.pins ADD COLUMN role oid NOT NULL DEFAULT 0;
ALTER TABLE alkblobs.pins ALTER COLUMN role DROP DEFAULT;
ALTER TABLE alkblobs.pins DROP CONSTRAINT pins_pkey;
ALTER TABLE alkblobs.pins ADD CONSTRAINT pins_pkey PRIMARY KEY (pool, key, role, owner);
DROP INDEX alkblobs.pins_by_owner;
CREATE INDEX pins_by_owner ON alkblobs.pins (pool, role, owner);

ALTER TABLE alkblobs.liveness
    ADD COLUMN forward_refs boolean NOT NULL DEFAULT false,
    ADD COLUMN registered_by oid NOT NULL DEFAULT 0;
ALTER TABLE alkblobs.liveness ALTER COLUMN registered_by DROP DEFAULT;

SELECT pg_catalog.lo_unlink(u.loid) FROM alkblobs.uploads u
 WHERE EXISTS (SELECT 1 FROM pg_catalog.pg_largeobject_metadata m WHERE m.oid = u.loid);
DELETE FROM alkblobs.uploads;
ALTER TABLE alkblobs.uploads
    ADD COLUMN pool integer NOT NULL REFERENCES alkblobs.pools (id),
    ADD COLUMN xact xid8 NOT NULL,
    ADD COLUMN role oid NOT NULL;
CREATE INDEX uploads_by_pool ON alkblobs.uploads (pool);

DROP INDEX alkblobs.staged_by_mark;
CREATE INDEX staged_by_mark ON alkblobs.staged (mark, key);

CREATE TABLE alkblobs.collected (
    pool         integer NOT NULL REFERENCES alkblobs.pools (id),
    key          bytea NOT NULL,
    collected_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (pool, key)
);
REVOKE ALL ON ALL TABLES IN SCHEMA alkblobs FROM PUBLIC;

-- The 0.3.0 functions (sql/api.sql) ---------------------------------------

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

-- Internal helpers ----------------------------------------------------------

-- The advisory lock class of pool locks: 'alkb'. The object id is the pool id.
CREATE OR REPLACE FUNCTION alkblobs.lock_class() RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS 'SELECT 1634495330';

-- The advisory lock (bigint form, which never collides with the two-int
-- pool locks) of a local-tier key's bucket: 256 buckets per pool, so a
-- writer holds at most 256 of them however many rows it writes.
CREATE OR REPLACE FUNCTION alkblobs.bucket_lock(p integer, k bytea) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp AS $$
    SELECT (1634495330::bigint << 20) + (p::bigint << 8) + pg_catalog.get_byte(k, 0)
$$;

-- The calling role: the session's login role.
CREATE OR REPLACE FUNCTION alkblobs.caller() RETURNS oid
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp AS $$
    SELECT r.oid FROM pg_catalog.pg_roles r WHERE r.rolname = session_user
$$;

-- Does the caller have `need` ('read', 'write', 'sweep' or 'admin') on pool
-- p? Superusers and members of the pool's owner role have everything;
-- 'admin' implies every access, 'write' and 'sweep' imply 'read'.
-- SECURITY DEFINER because the views call it as the reader (a function in
-- a view runs with the caller's privileges); it reveals nothing but the
-- caller's own access.
CREATE OR REPLACE FUNCTION alkblobs.may(p alkblobs.pools, need text) RETURNS boolean
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
    SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_roles r WHERE r.rolname = session_user AND r.rolsuper)
        OR EXISTS (SELECT 1 FROM pg_catalog.pg_roles r
                    WHERE r.oid = p.owner AND pg_catalog.pg_has_role(session_user, r.oid, 'USAGE'))
        OR EXISTS (SELECT 1 FROM alkblobs.pool_grants g JOIN pg_catalog.pg_roles r ON r.oid = g.grantee
                    WHERE g.pool = p.id AND pg_catalog.pg_has_role(session_user, r.oid, 'USAGE')
                      AND (g.access = need OR g.access = 'admin' OR (need = 'read' AND g.access IN ('write', 'sweep'))))
$$;

-- The pool named p_name, if the caller has `need` on it.
CREATE OR REPLACE FUNCTION alkblobs.pool(p_name text, need text) RETURNS alkblobs.pools
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

-- The executor's re-check and the validation of registered tables read
-- the catalog and the pins as of each statement: only READ COMMITTED gives
-- that (docs/design.md §4, "Isolation levels").
CREATE OR REPLACE FUNCTION alkblobs.require_read_committed(what text) RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF pg_catalog.current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION '% needs READ COMMITTED, this transaction is %', what, pg_catalog.current_setting('transaction_isolation')
            USING ERRCODE = 'AB003',
                  HINT = 'Run it in its own READ COMMITTED transaction (SET default_transaction_isolation may be set for this role or database).';
    END IF;
END $$;

CREATE OR REPLACE FUNCTION alkblobs.check_key(k bytea) RETURNS void
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

CREATE OR REPLACE FUNCTION alkblobs.check_owner(o text) RETURNS void
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

CREATE OR REPLACE FUNCTION alkblobs.not_null(v anyelement, what text) RETURNS void
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
-- guarded), and the extension's own guard trigger, enabled, on it and on
-- every partition. VOLATILE on purpose: each statement reads the catalog
-- as it is now.
CREATE OR REPLACE FUNCTION alkblobs.source_problem(rel oid) RETURNS text
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
    IF NOT EXISTS (
        SELECT 1 FROM pg_catalog.pg_trigger tg
         WHERE tg.tgrelid = rel AND tg.tgname = 'alkblobs_liveness_guard'
           AND tg.tgfoid = 'alkblobs.liveness_guard()'::pg_catalog.regprocedure
           AND tg.tgtype = 21  -- ROW | INSERT | UPDATE, AFTER
           AND tg.tgenabled IN ('O', 'A') AND tg.tgqual IS NULL AND tg.tgnargs = 0
           AND coalesce(pg_catalog.array_length(tg.tgattr::int2[], 1), 0) = 0) THEN
        RETURN 'lacks its guard trigger alkblobs_liveness_guard (missing, altered or disabled)';
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

-- source_problem plus what alkblobs_owner itself needs to read the table.
CREATE OR REPLACE FUNCTION alkblobs.source_problem_top(rel oid) RETURNS text
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
        RETURN 'is not readable by alkblobs_owner (USAGE on its schema and SELECT on it are needed)';
    END IF;
    RETURN NULL;
END $$;

-- Takes ACCESS SHARE on every liveness table of pool p (so none can be
-- dropped, retyped, turned into a view or given rules or row security while
-- this transaction relies on it) and then validates each one. Returns the
-- first problem as '<table> <why>', or NULL when every source is sound. A
-- table dropped before its lock was granted is skipped: its DROP removed
-- the registration.
CREATE OR REPLACE FUNCTION alkblobs.check_sources(p integer) RETURNS text
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    r record;
    prob text;
BEGIN
    FOR r IN SELECT l.relid FROM alkblobs.liveness l WHERE l.pool = p ORDER BY l.relid LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_class c WHERE c.oid = r.relid) THEN
            CONTINUE;
        END IF;
        -- Before the lock too: LOCK on a view would lock its base tables.
        prob := alkblobs.source_problem_top(r.relid);
        IF prob IS NULL THEN
            BEGIN
                EXECUTE format('LOCK TABLE %s IN ACCESS SHARE MODE', r.relid::pg_catalog.regclass);
            EXCEPTION WHEN undefined_table THEN
                CONTINUE;
            END;
            -- A new statement after the lock (READ COMMITTED): the catalog
            -- as it is now, and it cannot change until we commit.
            prob := alkblobs.source_problem_top(r.relid);
        END IF;
        IF prob IS NOT NULL THEN
            RETURN format('%s %s', r.relid::pg_catalog.regclass, prob);
        END IF;
    END LOOP;
    RETURN NULL;
END $$;

-- "Is any registered liveness table holding <key_expr>?" for pool p, as a
-- SQL predicate. Table names come from regclass output; key_expr is one of
-- the fixed internal expressions below, never caller input. Only call it
-- after check_sources(p) returned NULL in this transaction.
CREATE OR REPLACE FUNCTION alkblobs.live_predicate(p integer, key_expr text) RETURNS text
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

-- Pools ----------------------------------------------------------------------

-- Validates pool settings (NULLs are "unchanged" and pass). The maxima keep
-- every later `mark_end + window` and `clock_timestamp() + ttl` in range.
-- True for an interval with a month or year part, a negative day part or a
-- negative time part (NULL: "unchanged", false).
CREATE OR REPLACE FUNCTION alkblobs.mixed_interval(i interval) RETURNS boolean
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp AS $$
    SELECT coalesce(extract(year FROM i) <> 0 OR extract(month FROM i) <> 0
                    OR extract(day FROM i) < 0
                    OR extract(epoch FROM i) - extract(day FROM i) * 86400 < 0, false)
$$;

CREATE OR REPLACE FUNCTION alkblobs.check_settings(w interval, ttl interval) RETURNS void
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

CREATE OR REPLACE FUNCTION @extschema@.alkblobs_create_pool(
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
    INSERT INTO alkblobs.pools (name, delete_window, pin_ttl, large_tier, owner)
    VALUES ($1, $2, $3, $4, alkblobs.caller());
EXCEPTION WHEN unique_violation THEN
    RAISE EXCEPTION 'alkblobs pool "%" already exists', $1
        USING ERRCODE = 'duplicate_object',
              HINT = 'Change its settings with alkblobs_alter_pool.';
END $$;

CREATE OR REPLACE FUNCTION @extschema@.alkblobs_alter_pool(
    pool text,
    delete_window interval DEFAULT NULL,
    pin_ttl interval DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    pl alkblobs.pools := alkblobs.pool($1, 'admin');
BEGIN
    PERFORM alkblobs.check_settings($2, $3);
    UPDATE alkblobs.pools p
       SET delete_window = coalesce($2, p.delete_window),
           pin_ttl = coalesce($3, p.pin_ttl)
     WHERE p.id = pl.id;
END $$;

-- Grants `role` one access ('read', 'write', 'sweep' or 'admin') on a pool.
CREATE OR REPLACE FUNCTION @extschema@.alkblobs_grant_pool(pool text, role regrole, access text)
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

CREATE OR REPLACE FUNCTION @extschema@.alkblobs_revoke_pool(pool text, role regrole, access text)
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
CREATE OR REPLACE FUNCTION alkblobs.pin_row(p alkblobs.pools, k bytea, o text) RETURNS void
LANGUAGE sql
SET search_path = pg_catalog, pg_temp AS $$
    INSERT INTO alkblobs.pins AS pn (pool, key, role, owner, expires_at)
    VALUES (p.id, k, alkblobs.caller(), o, clock_timestamp() + p.pin_ttl)
    ON CONFLICT (pool, key, role, owner)
    DO UPDATE SET expires_at = greatest(pn.expires_at, EXCLUDED.expires_at)
$$;

-- Locks the entry row FOR KEY SHARE if it exists: waits while the executor
-- decides the key, and keeps it from deleting the key until we commit.
-- (INSERT ... ON CONFLICT DO NOTHING would not wait: it can report an entry
-- the executor is deleting right now.) At REPEATABLE READ a row deleted
-- after our snapshot raises 40001 here instead of being "found".
CREATE OR REPLACE FUNCTION alkblobs.lock_entry(p integer, k bytea) RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM 1 FROM alkblobs.entries e WHERE e.pool = p AND e.key = k FOR KEY SHARE;
    RETURN FOUND;
END $$;

-- The hot path, so written as a few inline statements (no nested calls).
CREATE OR REPLACE FUNCTION @extschema@.alkblobs_put(pool text, key bytea, value bytea, owner text)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    pl alkblobs.pools;
    me oid;
    actual bytea;
BEGIN
    SELECT * INTO pl FROM alkblobs.pools p WHERE p.name = $1;
    IF NOT FOUND OR NOT alkblobs.may(pl, 'write') THEN
        PERFORM alkblobs.pool($1, 'write');  -- raises the unknown-pool or no-access error
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
    me := alkblobs.caller();
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
            INSERT INTO alkblobs.pins AS pn (pool, key, role, owner, expires_at)
            VALUES (pl.id, $2, me, $4, clock_timestamp() + pl.pin_ttl)
            ON CONFLICT ON CONSTRAINT pins_pkey DO UPDATE SET expires_at = greatest(pn.expires_at, EXCLUDED.expires_at);
            RETURN true;
        END IF;
        -- Present. DO NOTHING did not wait for an executor that may be
        -- deleting it right now; this lock does, and finds the row only if
        -- it survived. Then it stays until we commit.
        PERFORM 1 FROM alkblobs.entries e WHERE e.pool = pl.id AND e.key = $2 FOR KEY SHARE;
        IF FOUND THEN
            DELETE FROM alkblobs.staged s WHERE s.pool = pl.id AND s.key = $2;
            INSERT INTO alkblobs.pins AS pn (pool, key, role, owner, expires_at)
            VALUES (pl.id, $2, me, $4, clock_timestamp() + pl.pin_ttl)
            ON CONFLICT ON CONSTRAINT pins_pkey DO UPDATE SET expires_at = greatest(pn.expires_at, EXCLUDED.expires_at);
            RETURN false;
        END IF;
        -- Deleted while we waited: insert it afresh.
    END LOOP;
    RAISE EXCEPTION 'could not store key % in pool "%": it kept being deleted concurrently', encode($2, 'hex'), $1
        USING ERRCODE = 'serialization_failure', HINT = 'Retry the put.';
END $$;

CREATE OR REPLACE FUNCTION @extschema@.alkblobs_pin(pool text, key bytea, owner text)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    pl alkblobs.pools := alkblobs.pool($1, 'write');
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
-- Removing the key's staged row waits out a claim deciding it, so the file
-- the caller then renames into place cannot be deleted on stale staging,
-- and its window restarts; its bucket lock keeps a claim off the key until
-- this transaction commits; and a collected mark is cleared (the file is
-- back).
CREATE OR REPLACE FUNCTION @extschema@.alkblobs_pin_new(pool text, key bytea, owner text)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    pl alkblobs.pools := alkblobs.pool($1, 'write');
BEGIN
    PERFORM alkblobs.check_key($2);
    PERFORM alkblobs.check_owner($3);
    PERFORM pg_catalog.pg_advisory_xact_lock_shared(alkblobs.bucket_lock(pl.id, $2));
    PERFORM alkblobs.lock_entry(pl.id, $2);
    DELETE FROM alkblobs.staged s WHERE s.pool = pl.id AND s.key = $2;
    DELETE FROM alkblobs.collected c WHERE c.pool = pl.id AND c.key = $2;
    PERFORM alkblobs.pin_row(pl, $2, $3);
END $$;

-- Releases the caller's pin (a pool admin may release anyone's).
CREATE OR REPLACE FUNCTION @extschema@.alkblobs_unpin(pool text, key bytea, owner text)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    pl alkblobs.pools := alkblobs.pool($1, 'write');
    any_role boolean := alkblobs.may(pl, 'admin');
BEGIN
    PERFORM alkblobs.check_key($2);
    PERFORM alkblobs.check_owner($3);
    DELETE FROM alkblobs.pins pn
     WHERE pn.pool = pl.id AND pn.key = $2 AND pn.owner = $3 AND (any_role OR pn.role = alkblobs.caller());
    RETURN FOUND;
END $$;

-- Renews every un-expired pin of the caller's (role, owner) in one
-- statement. An expired pin is not revived: its protection already lapsed
-- and a sweep may have acted, so the holder must re-put (the count tells it
-- how many survived).
CREATE OR REPLACE FUNCTION @extschema@.alkblobs_renew(pool text, owner text)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    pl alkblobs.pools := alkblobs.pool($1, 'write');
    me oid := alkblobs.caller();
    n bigint;
BEGIN
    PERFORM alkblobs.check_owner($2);
    UPDATE alkblobs.pins pn
       SET expires_at = clock_timestamp() + pl.pin_ttl
     WHERE pn.pool = pl.id AND pn.role = me AND pn.owner = $2 AND pn.expires_at > clock_timestamp();
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END $$;

-- Which of `keys` the caller's (role, owner) holds an un-expired pin on: a
-- holder checks before publishing under a pin (its renewal may have
-- failed).
CREATE OR REPLACE FUNCTION @extschema@.alkblobs_pins_held(pool text, owner text, keys bytea[])
RETURNS SETOF bytea
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    pl alkblobs.pools := alkblobs.pool($1, 'write');
    me oid := alkblobs.caller();
BEGIN
    PERFORM alkblobs.check_owner($2);
    PERFORM alkblobs.not_null($3, 'keys');
    RETURN QUERY
        SELECT pn.key FROM alkblobs.pins pn
         WHERE pn.pool = pl.id AND pn.role = me AND pn.owner = $2 AND pn.key = ANY($3)
           AND pn.expires_at > clock_timestamp()
         ORDER BY pn.key;
END $$;

-- Releases every pin of the caller's (role, owner); a pool admin releases
-- that owner's pins under every role.
CREATE OR REPLACE FUNCTION @extschema@.alkblobs_unpin_all(pool text, owner text)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    pl alkblobs.pools := alkblobs.pool($1, 'write');
    any_role boolean := alkblobs.may(pl, 'admin');
    n bigint;
BEGIN
    PERFORM alkblobs.check_owner($2);
    DELETE FROM alkblobs.pins pn
     WHERE pn.pool = pl.id AND pn.owner = $2 AND (any_role OR pn.role = alkblobs.caller());
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END $$;

-- Reads ------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION @extschema@.alkblobs_get(pool text, key bytea)
RETURNS bytea
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    pl alkblobs.pools := alkblobs.pool($1, 'read');
    v bytea;
BEGIN
    PERFORM alkblobs.check_key($2);
    SELECT e.value INTO v FROM alkblobs.entries e WHERE e.pool = pl.id AND e.key = $2 AND e.tier = 'kv';
    RETURN v;
END $$;

CREATE OR REPLACE FUNCTION @extschema@.alkblobs_stat(pool text, key bytea)
RETURNS TABLE (size bigint, tier text, created_at timestamptz)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    pl alkblobs.pools := alkblobs.pool($1, 'read');
BEGIN
    PERFORM alkblobs.check_key($2);
    RETURN QUERY SELECT e.size, e.tier, e.created_at FROM alkblobs.entries e WHERE e.pool = pl.id AND e.key = $2;
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

CREATE OR REPLACE FUNCTION @extschema@.alkblobs_lo_create(pool text)
RETURNS oid
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    pl alkblobs.pools := alkblobs.pool($1, 'write');
    o oid := pg_catalog.lo_create(0);
BEGIN
    INSERT INTO alkblobs.uploads (loid, pool, xact, role) VALUES (o, pl.id, pg_catalog.pg_current_xact_id(), alkblobs.caller());
    RETURN o;
END $$;

-- The upload `o` if it belongs to this transaction and the caller's role.
CREATE OR REPLACE FUNCTION alkblobs.my_upload(o oid) RETURNS alkblobs.uploads
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    u alkblobs.uploads;
BEGIN
    SELECT * INTO u FROM alkblobs.uploads up
     WHERE up.loid = o AND up.xact = pg_catalog.pg_current_xact_id() AND up.role = alkblobs.caller();
    IF NOT FOUND THEN
        RAISE EXCEPTION 'large object % is not an upload of this transaction', o
            USING ERRCODE = 'invalid_parameter_value', HINT = 'Start one with alkblobs_lo_create(pool) in the same transaction.';
    END IF;
    RETURN u;
END $$;

CREATE OR REPLACE FUNCTION @extschema@.alkblobs_lo_write(loid oid, "offset" bigint, chunk bytea)
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

CREATE OR REPLACE FUNCTION @extschema@.alkblobs_lo_commit(pool text, key bytea, loid oid, owner text)
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
    PERFORM alkblobs.check_owner($4);
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
    PERFORM alkblobs.pin_row(pl, $2, $4);
    RETURN created;
END $$;

-- A window of a large-object entry (lo_get(oid, offset, len)); NULL if the
-- key is absent. Offsets past the end give an empty result.
CREATE OR REPLACE FUNCTION @extschema@.alkblobs_lo_read(pool text, key bytea, "offset" bigint, len integer)
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
-- EACH ROW: it sees the final key, after generated columns and every BEFORE
-- trigger). For each pool the table is registered with, a row naming a key
-- locks that key's entry FOR KEY SHARE: an executor deciding the key is
-- waited for, and one that comes later passes over the key (SKIP LOCKED)
-- until this transaction ends. If the pool does not hold the key (never
-- put, or collected — also when the executor deleted it while this write
-- waited) the write fails with AB002, unless the table was registered with
-- forward_references. In a local-tier pool a key without an entry is a
-- file: the write takes the key's bucket lock (which alkblobs_claim_local
-- must win to hand the file out) and fails with AB002 if the file was
-- claimed.
CREATE OR REPLACE FUNCTION alkblobs.liveness_guard() RETURNS trigger
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
        IF r.large_tier = 'local' THEN
            IF NOT rc THEN
                PERFORM alkblobs.require_read_committed('a liveness write for a local-tier file');
            END IF;
            PERFORM pg_catalog.pg_advisory_xact_lock_shared(alkblobs.bucket_lock(r.pool, k));
            IF EXISTS (SELECT 1 FROM alkblobs.collected c WHERE c.pool = r.pool AND c.key = k) THEN
                RAISE EXCEPTION 'key % was collected from pool "%"', encode(k, 'hex'), r.name
                    USING ERRCODE = 'AB002',
                          HINT = 'Publish the file again (alkblobs_pin_new, then the file), then record it.';
            END IF;
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

-- Registration, the part that needs the extension's tables (see
-- alkblobs_register_liveness for the part that runs as the caller).
CREATE OR REPLACE FUNCTION alkblobs.add_source(pool text, tbl regclass, fwd boolean) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    pl alkblobs.pools := alkblobs.pool($1, 'admin');
    prob text;
BEGIN
    IF $2 IS NULL OR $3 IS NULL THEN
        RAISE EXCEPTION 'table and forward_references must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF NOT pg_catalog.pg_has_role(session_user, (SELECT c.relowner FROM pg_catalog.pg_class c WHERE c.oid = $2), 'USAGE') THEN
        RAISE EXCEPTION 'must own table % to register it as a liveness source', $2
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    -- Registration waits out a running sweep: the next sweep sees the table
    -- from its first statement on.
    PERFORM pg_catalog.pg_advisory_xact_lock(alkblobs.lock_class(), pl.id);
    prob := alkblobs.source_problem_top($2);
    IF prob IS NOT NULL THEN
        RAISE EXCEPTION 'table % cannot be a liveness source: it %', $2, prob USING ERRCODE = 'wrong_object_type';
    END IF;
    INSERT INTO alkblobs.liveness (pool, relid, forward_refs, registered_by)
    VALUES (pl.id, $2, $3, alkblobs.caller())
    ON CONFLICT ON CONSTRAINT liveness_pkey DO UPDATE SET forward_refs = EXCLUDED.forward_refs;
END $$;

-- Unregistration's part in the extension's tables: (found, still
-- registered with another pool).
CREATE OR REPLACE FUNCTION alkblobs.remove_source(pool text, tbl regclass, OUT found_it boolean, OUT elsewhere boolean)
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
    PERFORM pg_catalog.pg_advisory_xact_lock(alkblobs.lock_class(), pl.id);
    DELETE FROM alkblobs.liveness l WHERE l.pool = pl.id AND l.relid = $2;
    found_it := FOUND;
    elsewhere := EXISTS (SELECT 1 FROM alkblobs.liveness l WHERE l.relid = $2);
END $$;

-- Registers a table as a liveness source of a pool. SECURITY INVOKER: the
-- guard trigger is created, and SELECT granted to alkblobs_owner, by the
-- caller, who must own the table (alkblobs_owner owns nothing of yours).
CREATE OR REPLACE FUNCTION @extschema@.alkblobs_register_liveness(pool text, tbl regclass, forward_references boolean DEFAULT false)
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
    -- The guard: ours, exactly (an older or altered one is replaced).
    SELECT t.tgfoid, t.tgtype INTO tg FROM pg_catalog.pg_trigger t WHERE t.tgrelid = $2 AND t.tgname = 'alkblobs_liveness_guard';
    IF FOUND AND (tg.tgfoid <> 'alkblobs.liveness_guard()'::pg_catalog.regprocedure OR tg.tgtype <> 21) THEN
        EXECUTE format('DROP TRIGGER alkblobs_liveness_guard ON %s', $2);
    END IF;
    IF NOT FOUND OR tg.tgfoid <> 'alkblobs.liveness_guard()'::pg_catalog.regprocedure OR tg.tgtype <> 21 THEN
        EXECUTE format('CREATE TRIGGER alkblobs_liveness_guard AFTER INSERT OR UPDATE ON %s '
                       'FOR EACH ROW EXECUTE FUNCTION alkblobs.liveness_guard()', $2);
    END IF;
    EXECUTE format('ALTER TABLE %s ENABLE TRIGGER alkblobs_liveness_guard', $2);
    EXECUTE format('GRANT SELECT ON %s TO alkblobs_owner', $2);
    PERFORM alkblobs.add_source($1, $2, $3);
    IF NOT EXISTS (
        SELECT 1 FROM pg_catalog.pg_index i
         WHERE i.indrelid = $2 AND i.indkey[0] = (SELECT a.attnum FROM pg_catalog.pg_attribute a WHERE a.attrelid = $2 AND a.attname = 'key')) THEN
        RAISE NOTICE 'liveness table % has no index leading with "key"; sweeps will scan it for every candidate batch', $2
            USING HINT = format('CREATE INDEX ON %s (key);', $2);
    END IF;
END $$;

-- Unregisters a table you own. SECURITY INVOKER for the same reason.
CREATE OR REPLACE FUNCTION @extschema@.alkblobs_unregister_liveness(pool text, tbl regclass)
RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    r record;
BEGIN
    IF $1 IS NULL OR $2 IS NULL THEN
        RAISE EXCEPTION 'pool and table must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    SELECT * INTO r FROM alkblobs.remove_source($1, $2);
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
CREATE OR REPLACE FUNCTION alkblobs.on_sql_drop() RETURNS event_trigger
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
CREATE OR REPLACE FUNCTION @extschema@.alkblobs_stage(pool text, keys bytea[])
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    pl alkblobs.pools := alkblobs.pool($1, 'sweep');
    m bigint;
    n bigint;
    prob text;
BEGIN
    PERFORM alkblobs.require_read_committed('alkblobs_stage');
    PERFORM alkblobs.not_null($2, 'keys');
    IF EXISTS (SELECT 1 FROM unnest($2) k WHERE k IS NULL OR length(k) <> 32) THEN
        RAISE EXCEPTION 'every key is 32 bytes (a BLAKE3 hash)' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF cardinality($2) > 100000 THEN
        RAISE EXCEPTION 'at most 100000 keys per call, got %', cardinality($2) USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM pg_catalog.pg_advisory_xact_lock(alkblobs.lock_class(), pl.id);
    prob := alkblobs.check_sources(pl.id);
    IF prob IS NOT NULL THEN
        RAISE EXCEPTION 'liveness table %; nothing staged', prob USING ERRCODE = 'AB004',
            HINT = 'Fix the table and register it again, or unregister it.';
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
CREATE OR REPLACE FUNCTION alkblobs.protected(p integer, ks bytea[], live_sql text, OUT keep bytea[], OUT busy bytea[])
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

-- The executor for client-listed files: re-arbitrates due 'local' rows and
-- returns the dead keys, their staged rows deleted but still locked by the
-- caller's open transaction (with their bucket locks). The caller deletes
-- those files and only then commits; until it does, a pin_new or a liveness
-- write for one of these keys waits, and afterwards a liveness write naming
-- one fails with AB002. A caller that fails rolls back and the rows stay
-- staged. Keys someone is locking (staged row, bucket or pin row) are
-- passed over, not waited for. At most 10,000 keys per call.
CREATE OR REPLACE FUNCTION @extschema@.alkblobs_claim_local(pool text, max_keys integer DEFAULT 1000)
RETURNS SETOF bytea
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    pl alkblobs.pools := alkblobs.pool($1, 'sweep');
    batch bytea[];
    ours bytea[];
    pr record;
    dead bytea[];
    prob text;
BEGIN
    PERFORM alkblobs.require_read_committed('alkblobs_claim_local');
    PERFORM alkblobs.not_null($2, 'max_keys');
    IF $2 < 0 OR $2 > 10000 THEN
        RAISE EXCEPTION 'max_keys must be between 0 and 10000, got %', $2 USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF NOT pg_catalog.pg_try_advisory_xact_lock(alkblobs.lock_class(), pl.id) THEN
        RAISE NOTICE 'another sweeper holds pool "%"; nothing claimed', pl.name;
        RETURN;
    END IF;
    prob := alkblobs.check_sources(pl.id);
    IF prob IS NOT NULL THEN
        RAISE EXCEPTION 'liveness table %; nothing claimed', prob USING ERRCODE = 'AB004',
            HINT = 'Fix the table and register it again, or unregister it.';
    END IF;
    SELECT array_agg(x.key ORDER BY x.key) INTO batch FROM (
        SELECT s.key FROM alkblobs.staged s JOIN alkblobs.marks mk ON mk.id = s.mark
         WHERE s.pool = pl.id AND s.tier = 'local'
           AND mk.mark_end IS NOT NULL AND mk.mark_end + mk.delete_window <= clock_timestamp()
         ORDER BY s.key LIMIT $2
           FOR UPDATE OF s SKIP LOCKED) x;
    IF batch IS NULL THEN
        RETURN;
    END IF;
    -- A liveness writer or pin_new in flight holds the key's bucket.
    SELECT array_agg(b ORDER BY b) INTO ours FROM unnest(batch) b
     WHERE pg_catalog.pg_try_advisory_xact_lock(alkblobs.bucket_lock(pl.id, b));
    IF ours IS NULL THEN
        RETURN;
    END IF;
    SELECT * INTO pr FROM alkblobs.protected(pl.id, ours, alkblobs.live_predicate(pl.id, 'c.key'));
    dead := ARRAY(SELECT k FROM unnest(ours) k EXCEPT SELECT k FROM unnest(pr.keep || pr.busy) k);
    -- Protected keys are unstaged (a later mark restages them if need be);
    -- keys whose pins someone is changing stay staged for the next claim.
    DELETE FROM alkblobs.staged s WHERE s.pool = pl.id AND s.key = ANY(ours) AND NOT (s.key = ANY(pr.busy));
    INSERT INTO alkblobs.collected (pool, key) SELECT pl.id, d FROM unnest(dead) d
    ON CONFLICT ON CONSTRAINT collected_pkey DO UPDATE SET collected_at = EXCLUDED.collected_at;
    RETURN QUERY SELECT d FROM unnest(dead) d ORDER BY d;
END $$;

-- The sweep ----------------------------------------------------------------------

-- One call is one transaction under the pool's transaction-level advisory
-- lock: the lock cannot outlive the call or be lost inside it, whatever a
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
CREATE OR REPLACE FUNCTION @extschema@.alkblobs_sweep(
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
    prob text;
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
    IF NOT pg_catalog.pg_try_advisory_xact_lock(alkblobs.lock_class(), pl.id) THEN
        aborted := 'sweeper_lock';
        duration := clock_timestamp() - t0;
        RETURN NEXT;
        RETURN;
    END IF;
    prob := alkblobs.check_sources(pl.id);
    IF prob IS NOT NULL THEN
        RAISE WARNING 'sweep of alkblobs pool "%" aborted: liveness table %', pl.name, prob
            USING HINT = 'Fix the table and register it again, or unregister it.';
        aborted := 'liveness_table_invalid';
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
                      WHERE x.pool = pl.id AND pg_catalog.pg_xact_status(x.xact) IS DISTINCT FROM 'in progress'
                      ORDER BY x.loid LIMIT v_max FOR UPDATE SKIP LOCKED)
                 RETURNING u.loid LOOP
            uploads_reaped := uploads_reaped + 1;
            IF EXISTS (SELECT 1 FROM pg_catalog.pg_largeobject_metadata m WHERE m.oid = r.loid) THEN
                PERFORM pg_catalog.lo_unlink(r.loid);
                unlinks := unlinks + 1;
            END IF;
        END LOOP;
        DELETE FROM alkblobs.collected c WHERE (c.pool, c.key) IN (
            SELECT x.pool, x.key FROM alkblobs.collected x
             WHERE x.pool = pl.id AND x.collected_at < clock_timestamp() - interval '1 day' LIMIT v_keys);
    END IF;

    -- 2. Mark one slice.
    IF v_mark THEN
        IF v_dry THEN
            SELECT count(*) INTO examined FROM alkblobs.entries e WHERE e.pool = pl.id;
            SELECT count(DISTINCT pn.key) INTO pinned FROM alkblobs.pins pn
              JOIN alkblobs.entries e ON e.pool = pn.pool AND e.key = pn.key
             WHERE pn.pool = pl.id AND pn.expires_at > clock_timestamp();
            EXECUTE format($q$
                SELECT count(*) FROM alkblobs.entries c
                 WHERE c.pool = $1
                   AND NOT EXISTS (SELECT 1 FROM alkblobs.pins pn WHERE pn.pool = $1 AND pn.key = c.key AND pn.expires_at > $2)
                   AND NOT (%s)$q$, live_sql)
                INTO candidates USING pl.id, clock_timestamp();
            staged := candidates;
            mark_done := true;
        ELSE
            v_mark_id := pl.open_mark;
            v_cursor := pl.mark_cursor;
            IF v_mark_id IS NULL OR NOT EXISTS (SELECT 1 FROM alkblobs.marks mk WHERE mk.id = v_mark_id AND mk.mark_end IS NULL) THEN
                INSERT INTO alkblobs.marks (pool, delete_window) VALUES (pl.id, pl.delete_window) RETURNING id INTO v_mark_id;
                v_cursor := '\x'::bytea;
            END IF;
            EXECUTE format($q$
                WITH slice AS MATERIALIZED (
                    SELECT e.key, e.tier FROM alkblobs.entries e
                     WHERE e.pool = $1 AND e.key > $4 ORDER BY e.key LIMIT $5),
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
                ins AS (
                    INSERT INTO alkblobs.staged (pool, key, tier, mark)
                    SELECT $1, cand.key, cand.tier, $3 FROM cand
                     WHERE NOT EXISTS (SELECT 1 FROM already a WHERE a.key = cand.key)
                    ON CONFLICT (pool, key) DO NOTHING
                    RETURNING 1)
                SELECT (SELECT count(*) FROM slice), (SELECT s2.key FROM slice s2 ORDER BY s2.key DESC LIMIT 1), (SELECT count(*) FROM held),
                       (SELECT count(*) FROM cand), (SELECT count(*) FROM ins)$q$, live_sql)
                INTO examined, v_last, pinned, candidates, staged
                USING pl.id, clock_timestamp(), v_mark_id, v_cursor, v_keys;
            IF v_last IS NULL OR NOT EXISTS (SELECT 1 FROM alkblobs.entries e WHERE e.pool = pl.id AND e.key > v_last) THEN
                -- Seal: the window runs from the end of the mark.
                v_mark_end := clock_timestamp();
                UPDATE alkblobs.marks mk SET mark_end = v_mark_end WHERE mk.id = v_mark_id;
                UPDATE alkblobs.pools p SET open_mark = NULL, mark_cursor = NULL WHERE p.id = pl.id;
                mark_done := true;
            ELSE
                UPDATE alkblobs.pools p SET open_mark = v_mark_id, mark_cursor = v_last WHERE p.id = pl.id;
            END IF;
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
         LIMIT CASE WHEN v_dry THEN NULL ELSE v_keys + 1 END) x;
    SELECT count(*) INTO local_due FROM (
        SELECT 1 FROM alkblobs.marks mk JOIN alkblobs.staged s ON s.mark = mk.id
         WHERE mk.pool = pl.id AND mk.mark_end IS NOT NULL
           AND mk.mark_end + mk.delete_window <= clock_timestamp() AND s.tier = 'local'
         LIMIT CASE WHEN v_dry THEN NULL ELSE v_keys + 1 END) x;
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

-- Runs sweep calls until the mark is sealed and no due row is left (or a
-- call makes no progress: what is left is held by someone), committing
-- between calls so that every transaction stays bounded. Use with CALL
-- outside a transaction block.
-- (No SET clause: a procedure with one cannot COMMIT. It is not SECURITY
-- DEFINER and names everything schema-qualified, so search_path cannot
-- redirect it.)
CREATE OR REPLACE PROCEDURE @extschema@.alkblobs_sweep_all(pool text, max_unlinks integer DEFAULT 1000)
LANGUAGE plpgsql AS $$
DECLARE
    r record;
    marking boolean := true;
    total_deleted bigint := 0;
    calls integer := 0;
BEGIN
    IF $2 IS NULL OR $2 < 1 THEN
        RAISE EXCEPTION 'max_unlinks must be at least 1 for alkblobs_sweep_all, got %', coalesce($2::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Call alkblobs_sweep(pool, max_unlinks => 0) for a sweep that unlinks nothing.';
    END IF;
    LOOP
        SELECT * INTO r FROM @extschema@.alkblobs_sweep($1, false, $2, marking);
        calls := calls + 1;
        IF r.aborted IS NOT NULL THEN
            RAISE NOTICE 'sweep of pool "%" aborted: %', $1, r.aborted;
            EXIT;
        END IF;
        total_deleted := total_deleted + r.deleted;
        marking := marking AND NOT r.mark_done;
        COMMIT;
        EXIT WHEN NOT marking AND (r.remaining = 0 OR r.executed = 0);
    END LOOP;
    RAISE NOTICE 'pool "%": % call(s), % entries deleted', $1, calls, total_deleted;
END $$;

-- Why is this key live or not? -----------------------------------------------

-- Reports only what the caller may read: a liveness table the caller has
-- no SELECT on is named but not probed; a table that fails validation is
-- reported as refused and not read.
CREATE OR REPLACE FUNCTION @extschema@.alkblobs_explain(pool text, key bytea)
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
        detail := CASE pl.large_tier WHEN 'local' THEN 'not in this database (a file on the local tier, or absent)' ELSE 'absent' END;
    END IF;
    RETURN NEXT;
    FOR r IN SELECT pn.owner, coalesce(ro.rolname, pn.role::text) AS role, pn.expires_at, pn.expires_at > clock_timestamp() AS valid
               FROM alkblobs.pins pn LEFT JOIN pg_catalog.pg_roles ro ON ro.oid = pn.role
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
        prob := alkblobs.source_problem_top(r.relid);
        IF prob IS NULL THEN
            BEGIN
                EXECUTE format('LOCK TABLE %s IN ACCESS SHARE MODE', r.relid::regclass);
            EXCEPTION WHEN undefined_table THEN
                CONTINUE;
            END;
            prob := alkblobs.source_problem_top(r.relid);
        END IF;
        IF prob IS NOT NULL THEN
            detail := format('%s: REFUSED: it %s (sweeps of this pool abort until it is fixed or unregistered)', r.relid::regclass, prob);
            refused := true;
            RETURN NEXT;
            CONTINUE;
        END IF;
        EXECUTE format('SELECT EXISTS (SELECT 1 FROM %s lv WHERE lv.key = $1)', r.relid::regclass) INTO is_live USING $2;
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
    ELSIF NOT has_entry AND NOT is_staged AND pl.large_tier <> 'local' THEN
        detail := 'not in the pool: put the content to (re)create it';
    ELSIF is_staged THEN
        detail := 'not live: staged, deleted when due unless re-protected before then';
    ELSE
        detail := 'not live: the next sweep stages it for deletion';
    END IF;
    RETURN NEXT;
END $$;


-- The 0.3.0 views, roles, ownership and grants (sql/finalize.sql) ---------

-- alkblobs extension: views, roles and grants (runs last).

-- Every view shows only the pools the caller (session_user) may read. The
-- views are security barriers: a caller's own WHERE clause (a cast that
-- fails on a foreign value, a function in pg_temp) is applied only to rows
-- the pool filter already let through, so it cannot see other pools' rows.
CREATE VIEW @extschema@.alkblobs_pools WITH (security_barrier) AS
SELECT p.name AS pool, p.delete_window, p.pin_ttl, p.large_tier, p.max_object_bytes,
       coalesce(o.rolname, p.owner::text) AS owner, p.created_at
  FROM alkblobs.pools p LEFT JOIN pg_catalog.pg_roles o ON o.oid = p.owner
 WHERE alkblobs.may(p, 'read');

CREATE VIEW @extschema@.alkblobs_pool_grants WITH (security_barrier) AS
SELECT p.name AS pool, coalesce(r.rolname, g.grantee::text) AS grantee, g.access
  FROM alkblobs.pool_grants g JOIN alkblobs.pools p ON p.id = g.pool
  LEFT JOIN pg_catalog.pg_roles r ON r.oid = g.grantee
 WHERE alkblobs.may(p, 'read');

CREATE VIEW @extschema@.alkblobs_pins WITH (security_barrier) AS
SELECT p.name AS pool, encode(pn.key, 'hex') AS key, coalesce(r.rolname, pn.role::text) AS role, pn.owner,
       pn.pinned_at, pn.expires_at, pn.expires_at <= clock_timestamp() AS expired
  FROM alkblobs.pins pn JOIN alkblobs.pools p ON p.id = pn.pool
  LEFT JOIN pg_catalog.pg_roles r ON r.oid = pn.role
 WHERE alkblobs.may(p, 'read');

CREATE VIEW @extschema@.alkblobs_staged WITH (security_barrier) AS
SELECT p.name AS pool, encode(s.key, 'hex') AS key, s.tier, s.staged_at,
       mk.mark_end + mk.delete_window AS visible_after,
       coalesce(mk.mark_end + mk.delete_window <= clock_timestamp(), false) AS due
  FROM alkblobs.staged s
  JOIN alkblobs.marks mk ON mk.id = s.mark
  JOIN alkblobs.pools p ON p.id = s.pool
 WHERE alkblobs.may(p, 'read');

CREATE VIEW @extschema@.alkblobs_usage WITH (security_barrier) AS
SELECT p.name AS pool,
       coalesce(e.kv_entries, 0) AS kv_entries, coalesce(e.kv_bytes, 0) AS kv_bytes,
       coalesce(e.lo_entries, 0) AS lo_entries, coalesce(e.lo_bytes, 0) AS lo_bytes,
       (SELECT count(*) FROM alkblobs.pins pn WHERE pn.pool = p.id AND pn.expires_at > clock_timestamp()) AS pins,
       (SELECT count(*) FROM alkblobs.staged s WHERE s.pool = p.id) AS staged,
       (SELECT count(*) FROM alkblobs.liveness l WHERE l.pool = p.id) AS liveness_tables,
       (SELECT count(*) FROM alkblobs.uploads u WHERE u.pool = p.id) AS uploads,
       (SELECT count(*) FROM alkblobs.uploads u WHERE u.pool = p.id
           AND pg_catalog.pg_xact_status(u.xact) IS DISTINCT FROM 'in progress') AS uploads_abandoned
  FROM alkblobs.pools p
  LEFT JOIN (
        SELECT en.pool,
               count(*) FILTER (WHERE en.tier = 'kv') AS kv_entries,
               sum(en.size) FILTER (WHERE en.tier = 'kv') AS kv_bytes,
               count(*) FILTER (WHERE en.tier = 'lo') AS lo_entries,
               sum(en.size) FILTER (WHERE en.tier = 'lo') AS lo_bytes
          FROM alkblobs.entries en GROUP BY en.pool) e ON e.pool = p.id
 WHERE alkblobs.may(p, 'read');

-- Roles: readers read and inspect; writers put and pin; sweepers sweep;
-- admins create pools and register liveness tables. Roles are cluster-wide
-- and survive DROP EXTENSION.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'alkblobs_reader') THEN
        CREATE ROLE alkblobs_reader NOLOGIN;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'alkblobs_writer') THEN
        CREATE ROLE alkblobs_writer NOLOGIN IN ROLE alkblobs_reader;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'alkblobs_sweeper') THEN
        CREATE ROLE alkblobs_sweeper NOLOGIN IN ROLE alkblobs_reader;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'alkblobs_admin') THEN
        CREATE ROLE alkblobs_admin NOLOGIN IN ROLE alkblobs_writer, alkblobs_sweeper;
    END IF;
END $$;

-- Ownership and the default-deny policy, as one function so that every
-- upgrade script applies exactly the same policy (it ends by calling it):
-- alkblobs_owner owns the internal schema, its tables and sequences, every
-- function and procedure of the extension and its views; nothing of the
-- extension (found through its membership, so one added later cannot be
-- forgotten) is executable or readable by PUBLIC, except alkblobs_key.
CREATE FUNCTION alkblobs.apply_policy() RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    o record;
BEGIN
    EXECUTE 'ALTER SCHEMA alkblobs OWNER TO alkblobs_owner';
    FOR o IN
        SELECT d.classid, d.objid FROM pg_catalog.pg_depend d
          JOIN pg_catalog.pg_extension x ON x.oid = d.refobjid AND x.extname = 'alkblobs'
         WHERE d.deptype = 'e' AND d.refclassid = 'pg_catalog.pg_extension'::regclass
         ORDER BY d.classid, d.objid
    LOOP
        IF o.classid = 'pg_catalog.pg_proc'::regclass THEN
            EXECUTE format('ALTER %s %s OWNER TO alkblobs_owner',
                           CASE WHEN (SELECT prokind FROM pg_catalog.pg_proc WHERE oid = o.objid) = 'p' THEN 'PROCEDURE' ELSE 'FUNCTION' END,
                           o.objid::regprocedure);
            IF (SELECT proname FROM pg_catalog.pg_proc WHERE oid = o.objid) <> 'alkblobs_key' THEN
                EXECUTE format('REVOKE ALL ON %s %s FROM PUBLIC',
                               CASE WHEN (SELECT prokind FROM pg_catalog.pg_proc WHERE oid = o.objid) = 'p' THEN 'PROCEDURE' ELSE 'FUNCTION' END,
                               o.objid::regprocedure);
            END IF;
        ELSIF o.classid = 'pg_catalog.pg_class'::regclass
              AND (SELECT relkind FROM pg_catalog.pg_class WHERE oid = o.objid) IN ('r', 'v', 'p') THEN
            EXECUTE format('ALTER TABLE %s OWNER TO alkblobs_owner', o.objid::regclass);
            EXECUTE format('REVOKE ALL ON %s FROM PUBLIC', o.objid::regclass);
        ELSIF o.classid = 'pg_catalog.pg_type'::regclass
              AND (SELECT typtype FROM pg_catalog.pg_type WHERE oid = o.objid) NOT IN ('c')
              AND (SELECT typrelid FROM pg_catalog.pg_type WHERE oid = o.objid) = 0
              AND (SELECT typelem FROM pg_catalog.pg_type WHERE oid = o.objid) = 0 THEN
            EXECUTE format('ALTER TYPE %s OWNER TO alkblobs_owner', o.objid::regtype);
        END IF;
    END LOOP;
    -- Large objects the extension holds belong to it too (lo_unlink needs it).
    FOR o IN SELECT m.oid FROM pg_catalog.pg_largeobject_metadata m
              WHERE m.oid IN (SELECT e.loid FROM alkblobs.entries e WHERE e.loid IS NOT NULL
                              UNION SELECT u.loid FROM alkblobs.uploads u)
                AND m.lomowner <> 'alkblobs_owner'::regrole LOOP
        EXECUTE format('ALTER LARGE OBJECT %s OWNER TO alkblobs_owner', o.oid);
    END LOOP;
END $$;
SELECT alkblobs.apply_policy();

-- ...then each role gets exactly what it needs.
GRANT SELECT ON @extschema@.alkblobs_pools, @extschema@.alkblobs_pins, @extschema@.alkblobs_staged,
    @extschema@.alkblobs_usage, @extschema@.alkblobs_pool_grants TO alkblobs_reader;
-- The views filter pools by the caller's access through alkblobs.may.
GRANT EXECUTE ON FUNCTION alkblobs.may(alkblobs.pools, text) TO alkblobs_reader;
GRANT EXECUTE ON FUNCTION
    @extschema@.alkblobs_get(text, bytea),
    @extschema@.alkblobs_stat(text, bytea),
    @extschema@.alkblobs_lo_read(text, bytea, bigint, integer),
    @extschema@.alkblobs_explain(text, bytea)
  TO alkblobs_reader;
GRANT EXECUTE ON FUNCTION
    @extschema@.alkblobs_put(text, bytea, bytea, text),
    @extschema@.alkblobs_pin(text, bytea, text),
    @extschema@.alkblobs_pin_new(text, bytea, text),
    @extschema@.alkblobs_unpin(text, bytea, text),
    @extschema@.alkblobs_renew(text, text),
    @extschema@.alkblobs_pins_held(text, text, bytea[]),
    @extschema@.alkblobs_unpin_all(text, text),
    @extschema@.alkblobs_lo_create(text),
    @extschema@.alkblobs_lo_write(oid, bigint, bytea),
    @extschema@.alkblobs_lo_commit(text, bytea, oid, text)
  TO alkblobs_writer;
GRANT EXECUTE ON FUNCTION
    @extschema@.alkblobs_stage(text, bytea[]),
    @extschema@.alkblobs_claim_local(text, integer),
    @extschema@.alkblobs_sweep(text, boolean, integer, boolean, integer)
  TO alkblobs_sweeper;
GRANT EXECUTE ON PROCEDURE @extschema@.alkblobs_sweep_all(text, integer) TO alkblobs_sweeper;
GRANT EXECUTE ON FUNCTION
    @extschema@.alkblobs_create_pool(text, interval, interval, text),
    @extschema@.alkblobs_alter_pool(text, interval, interval),
    @extschema@.alkblobs_register_liveness(text, regclass, boolean),
    @extschema@.alkblobs_unregister_liveness(text, regclass),
    @extschema@.alkblobs_grant_pool(text, regrole, text),
    @extschema@.alkblobs_revoke_pool(text, regrole, text)
  TO alkblobs_admin;
-- Registration runs as the caller (it creates the guard trigger on the
-- caller's table), so admins reach exactly these three internals.
GRANT USAGE ON SCHEMA alkblobs TO alkblobs_admin;
GRANT EXECUTE ON FUNCTION
    alkblobs.liveness_guard(),
    alkblobs.add_source(text, regclass, boolean),
    alkblobs.remove_source(text, regclass)
  TO alkblobs_admin;


-- Registered tables get the new guard (AFTER ROW) and the SELECT grant the
-- non-superuser definer needs to read them.
DO $$
DECLARE
    r record;
BEGIN
    FOR r IN SELECT DISTINCT l.relid FROM alkblobs.liveness l
               JOIN pg_catalog.pg_class c ON c.oid = l.relid ORDER BY 1 LOOP
        EXECUTE format('DROP TRIGGER IF EXISTS alkblobs_liveness_guard ON %s', r.relid::regclass);
        EXECUTE format('CREATE TRIGGER alkblobs_liveness_guard AFTER INSERT OR UPDATE ON %s '
                       'FOR EACH ROW EXECUTE FUNCTION alkblobs.liveness_guard()', r.relid::regclass);
        EXECUTE format('GRANT SELECT ON %s TO alkblobs_owner', r.relid::regclass);
    END LOOP;
END $$;
