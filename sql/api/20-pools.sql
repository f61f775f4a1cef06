-- alkblobs SQL API, 20-pools.sql: Pools: create, alter, grant and revoke.
-- (sql/api/*.sql load in file-name order after bootstrap.sql and the Rust
-- functions; docs/design.md, "Layout". The rules of the whole API are in 10-helpers.sql's header.)

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

-- A collector and an audit period (NULL or '0': none).
CREATE FUNCTION alkblobs.check_collector(c text, every interval) RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF c IS NOT NULL AND c NOT IN ('queue', 'mark') THEN
        RAISE EXCEPTION 'collector must be ''queue'' or ''mark'', got %', quote_literal(c)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF every < interval '0' OR alkblobs.mixed_interval(every) OR every > interval '366 days' THEN
        RAISE EXCEPTION 'audit_every must be between 0 (none) and 366 days, in days or smaller units only, got %', every
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
    IF @extschema@.alkblobs_flavour() = 'sql-only' THEN
        RETURN 'the SQL-only install has no background worker; SELECT alkblobs_schedule_cron(pool) schedules a pool with pg_cron';
    ELSIF NOT alkblobs.scheduler_preloaded() THEN
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
                         WHEN @extschema@.alkblobs_flavour() = 'sql-only' THEN 'Schedule it with pg_cron: SELECT alkblobs_schedule_cron(pool) (docs/operations.md, "Scheduled sweeps").'
                         ELSE 'Add alkblobs to shared_preload_libraries and this database to alkblobs.scheduler_databases, then restart the server; or schedule it with pg_cron: SELECT alkblobs_schedule_cron(pool) (docs/operations.md, "Scheduled sweeps").' END;
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
    critical_after interval DEFAULT NULL,
    large_location text DEFAULT NULL,
    collector text DEFAULT NULL,
    audit_every interval DEFAULT '1 day')
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_collector text;
BEGIN
    IF $1 IS NULL OR $2 IS NULL OR $3 IS NULL OR $4 IS NULL OR $5 IS NULL OR $6 IS NULL OR $8 IS NULL THEN
        RAISE EXCEPTION 'pool, delete_window, pin_ttl, large_tier, max_object_bytes, single_instance and history_keep must not be NULL'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    -- NULL: the database's default (ALTER DATABASE … SET
    -- alkblobs.default_collector = 'mark'), else 'queue'.
    v_collector := coalesce($12, nullif(pg_catalog.current_setting('alkblobs.default_collector', true), ''), 'queue');
    PERFORM alkblobs.check_collector(v_collector, $13);
    PERFORM alkblobs.check_max_object($5);
    IF $1 !~ '^[A-Za-z0-9][A-Za-z0-9_.:-]{0,62}$' THEN
        RAISE EXCEPTION 'invalid pool name %: use 1 to 63 letters, digits, "_", ".", ":" or "-", starting with a letter or digit', quote_literal($1)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM alkblobs.check_settings($2, $3);
    PERFORM alkblobs.check_schedule($7, $8, $9, $10);
    IF $4 NOT IN ('pg-lo', 'local', 's3', 'none') THEN
        RAISE EXCEPTION 'large_tier must be ''pg-lo'', ''local'', ''s3'' or ''none'', got %', quote_literal($4)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF ($4 = 's3') <> ($11 IS NOT NULL) THEN
        RAISE EXCEPTION 'large_location is the bucket and prefix of an s3 pool (''s3://bucket/prefix''): given for large_tier ''s3'' and only then'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF $11 IS NOT NULL THEN
        -- A prefix is one pool's: a pool sweeping under another's prefix
        -- would delete what the other holds. Creations of s3 pools take
        -- turns (a transaction-level advisory lock; nothing else waits),
        -- and at READ COMMITTED the check after the lock sees every s3 pool
        -- committed before it, so two cannot both pass.
        IF $11 !~ '^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/[A-Za-z0-9!_.*''()-]+)*$' OR $11 ~ '/\.\.?(/|$)' THEN
            RAISE EXCEPTION 'large_location must be ''s3://bucket'' or ''s3://bucket/prefix'' (a bucket name, then path segments of letters, digits and !_.*''()- with no empty, "." or ".." segment), got %', quote_literal($11)
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        PERFORM alkblobs.require_read_committed('alkblobs_create_pool of an s3 pool');
        PERFORM pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtext('alkblobs s3 pool locations'));
        PERFORM 1 FROM alkblobs.pools p
         WHERE p.large_location IS NOT NULL
           AND (starts_with(p.large_location || '/', $11 || '/')
                OR starts_with($11 || '/', p.large_location || '/'));
        IF FOUND THEN
            RAISE EXCEPTION 'large_location % overlaps the location of another pool: a pool''s prefix is its own, and none may nest in another', quote_literal($11)
                USING ERRCODE = 'duplicate_object';
        END IF;
    END IF;
    IF $6 AND nullif($7, interval '0') IS NOT NULL THEN
        RAISE EXCEPTION 'a single-instance pool cannot have sweep_every: the store instance that owns it sweeps it'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    INSERT INTO alkblobs.pools (name, delete_window, pin_ttl, large_tier, owner, max_object_bytes, mode,
                                sweep_every, history_keep, warn_after, critical_after, seen_incarnation, seen_start,
                                large_location, collector, audit_every, tier_listing_due)
    VALUES ($1, $2, $3, $4, session_user, $5, CASE WHEN $6 THEN 'single' ELSE 'fleet' END,
            nullif($7, interval '0'), $8, nullif($9, interval '0'), nullif($10, interval '0'),
            alkblobs.incarnation_id(), pg_catalog.pg_postmaster_start_time(), $11, v_collector, nullif($13, interval '0'),
            CASE WHEN $4 IN ('local', 's3') AND NOT $6 THEN clock_timestamp() END);
    INSERT INTO alkblobs.sweep_state (pool) SELECT p.id FROM alkblobs.pools p WHERE p.name = $1;
    INSERT INTO alkblobs.pool_locks (pool) SELECT p.id FROM alkblobs.pools p WHERE p.name = $1;
    PERFORM alkblobs.notice_if_unscheduled($1, nullif($7, interval '0'));
EXCEPTION WHEN unique_violation THEN
    RAISE EXCEPTION 'alkblobs pool "%" already exists', $1
        USING ERRCODE = 'duplicate_object',
              HINT = 'Change its settings with alkblobs_alter_pool.';
END $$;

-- NULL settings are unchanged; sweep_every, warn_after and critical_after
-- set to interval '0' go back to their defaults (manual; derived), and
-- audit_every set to interval '0' means no scheduled audit. A pool that
-- takes the 'queue' collector starts with an audit (its queue is empty);
-- one that leaves it drops its queue.
CREATE FUNCTION @extschema@.alkblobs_alter_pool(
    pool text,
    delete_window interval DEFAULT NULL,
    pin_ttl interval DEFAULT NULL,
    max_object_bytes bigint DEFAULT NULL,
    sweep_every interval DEFAULT NULL,
    history_keep interval DEFAULT NULL,
    warn_after interval DEFAULT NULL,
    critical_after interval DEFAULT NULL,
    collector text DEFAULT NULL,
    audit_every interval DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    pl alkblobs.pools := alkblobs.pool($1, 'admin');
    was text := pl.collector;
    bad regclass;
BEGIN
    PERFORM alkblobs.check_settings($2, $3);
    PERFORM alkblobs.check_schedule($5, $6, $7, $8);
    PERFORM alkblobs.check_collector(coalesce($9, pl.collector), $10);
    IF $9 IS NOT NULL THEN
        -- Between sweeps (a review's rows, the queue dropped or an audit
        -- asked for, never under one), the collector read under the lock
        -- (a concurrent switch is seen), and only when every registered
        -- table has guards that see deletions.
        PERFORM alkblobs.take_lock(pl.id, false);
        SELECT * INTO pl FROM alkblobs.pools x WHERE x.id = pl.id FOR UPDATE;
        was := pl.collector;
    END IF;
    IF $9 IS NOT NULL AND $9 <> was THEN
        SELECT l.relid INTO bad FROM alkblobs.liveness l JOIN pg_catalog.pg_class c ON c.oid = l.relid
         WHERE l.pool = pl.id AND $9 = 'queue' AND alkblobs.queue_problem(l.relid) IS NOT NULL
         ORDER BY l.relid LIMIT 1;
        IF bad IS NOT NULL THEN
            RAISE EXCEPTION 'pool "%" cannot take the ''queue'' collector: liveness table % has guards from before 0.8.0, which do not see deletions', pl.name, bad
                USING ERRCODE = 'object_not_in_prerequisite_state',
                      HINT = 'Its owner registers it again (alkblobs_register_liveness), which replaces them.';
        END IF;
    END IF;
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
           critical_after = CASE WHEN $8 IS NULL THEN p.critical_after ELSE nullif($8, interval '0') END,
           collector = coalesce($9, p.collector),
           audit_every = CASE WHEN $10 IS NULL THEN p.audit_every ELSE nullif($10, interval '0') END
     WHERE p.id = pl.id
    RETURNING * INTO pl;
    IF pl.collector <> was THEN
        IF pl.collector = 'queue' THEN
            PERFORM alkblobs.request_audit(pl.id, 'the collector changed to ''queue'' (its queue starts empty)');
        ELSE
            DELETE FROM alkblobs.review_queue q WHERE q.pool = pl.id;
            DELETE FROM alkblobs.audit_requests a WHERE a.pool = pl.id;
        END IF;
    END IF;
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
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles r WHERE r.oid = $2) THEN
        RAISE EXCEPTION 'role % does not exist', $2::oid USING ERRCODE = 'undefined_object';
    END IF;
    -- A row of that name and access already there is this role's, or a
    -- gone grantee's of the same name (it grants nothing): the grant takes
    -- it over (the trigger takes the OID from the name again).
    INSERT INTO alkblobs.pool_grants AS g (pool, grantee, access)
    VALUES (pl.id, pg_catalog.pg_get_userbyid($2), $3)
    ON CONFLICT ON CONSTRAINT pool_grants_pkey DO UPDATE SET grantee_oid = NULL
     WHERE g.grantee_oid IS DISTINCT FROM $2::oid;
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
    -- The role's grant, and one recorded under its name for a grantee
    -- that is gone (a dropped role of that name: it grants nothing).
    DELETE FROM alkblobs.pool_grants g
     WHERE g.pool = pl.id AND g.access = $3
       AND (g.grantee_oid = $2
            OR (g.grantee = pg_catalog.pg_get_userbyid($2)
                AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles ro WHERE ro.oid = g.grantee_oid)));
    RETURN FOUND;
END $$;

-- Revokes a grant by the grantee's name: a role's name as the regrole
-- form reads it (an identifier: unquoted is folded to lower case, quoted
-- is exact), or, when no role has it, the name a grant records for a
-- grantee that no longer exists (a dropped role, or one a restore did not
-- bring: alkblobs_pool_grants lists it), which a regrole cannot name. A
-- name that is neither is an error (42704), as for the regrole form. A
-- literal name resolves here. (0.8.0)
CREATE FUNCTION @extschema@.alkblobs_revoke_pool(pool text, grantee name, access text)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    pl alkblobs.pools := alkblobs.pool($1, 'admin');
    r regrole;
    ident name;
BEGIN
    PERFORM alkblobs.not_null($2, 'grantee');
    PERFORM alkblobs.not_null($3, 'access');
    r := pg_catalog.to_regrole($2::text);
    IF r IS NOT NULL THEN
        RETURN @extschema@.alkblobs_revoke_pool(pl.name, r, $3);
    END IF;
    -- The name as an identifier too ('MediaNode' is medianode), as the
    -- regrole form would have read the name of the role when it existed.
    BEGIN
        ident := (pg_catalog.parse_ident($2::text))[1];
    EXCEPTION WHEN invalid_parameter_value OR invalid_name OR syntax_error THEN
        ident := $2;
    END;
    -- No role has the name: a grant of a grantee that is gone.
    DELETE FROM alkblobs.pool_grants g
     WHERE g.pool = pl.id AND g.access = $3 AND g.grantee IN ($2, ident)
       AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles ro WHERE ro.oid = g.grantee_oid);
    IF FOUND THEN
        RETURN true;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM alkblobs.pool_grants g WHERE g.pool = pl.id AND g.grantee IN ($2, ident)) THEN
        RAISE EXCEPTION 'role "%" does not exist, and no grant of pool "%" names a grantee gone by that name', $2, pl.name
            USING ERRCODE = 'undefined_object';
    END IF;
    RETURN false;
END $$;
