-- alkblobs SQL API, 70-liveness.sql: Liveness tables: registration, validation, the guard.
-- (sql/api/*.sql load in file-name order after bootstrap.sql and the Rust
-- functions; docs/design.md, "Layout". The rules of the whole API are in 10-helpers.sql's header.)

-- Liveness tables --------------------------------------------------------------

-- Installed on every registered liveness table (AFTER INSERT OR UPDATE OR
-- DELETE, FOR EACH ROW, ENABLE ALWAYS: it sees the final key, after
-- generated columns and every BEFORE trigger, and fires under
-- session_replication_role = replica too). A row deleted, or updated to
-- another key, queues its old key for review in each 'queue' pool the
-- table is registered with (a guard installed
-- before 0.8.0 fires on INSERT OR UPDATE only, and such a pool's sweeps ask
-- for the table to be registered again). For each pool the table is registered with, a row naming a
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
    gone bytea;
    r record;
    rc boolean := pg_catalog.current_setting('transaction_isolation') = 'read committed';
BEGIN
    -- Never convert a column of someone else's type: its cast would run as
    -- this function's owner.
    IF TG_OP = 'DELETE' THEN
        IF pg_catalog.pg_typeof(OLD.key) <> 'pg_catalog.bytea'::pg_catalog.regtype THEN
            RAISE EXCEPTION 'liveness table % has a "key" column of type %, not bytea', TG_RELID::pg_catalog.regclass, pg_catalog.pg_typeof(OLD.key)
                USING ERRCODE = 'AB004';
        END IF;
        gone := OLD.key;
    ELSE
        IF pg_catalog.pg_typeof(NEW.key) <> 'pg_catalog.bytea'::pg_catalog.regtype THEN
            RAISE EXCEPTION 'liveness table % has a "key" column of type %, not bytea', TG_RELID::pg_catalog.regclass, pg_catalog.pg_typeof(NEW.key)
                USING ERRCODE = 'AB004';
        END IF;
        k := NEW.key;
        IF TG_OP = 'UPDATE' THEN
            IF OLD.key IS NOT DISTINCT FROM k THEN
                RETURN NULL;
            END IF;
            -- (The same column: NEW's type is OLD's.)
            gone := OLD.key;
        END IF;
    END IF;
    -- The key a row left (deleted, or moved to another key): appended with
    -- the table, and routed to the review queue of every 'queue' pool the
    -- table, or a table it is a partition of, feeds by the next sweep call
    -- (alkblobs.route_released). Appended here, not in a function of its
    -- own, and with no lookup: this runs for every row deleted from a
    -- registered table.
    IF length(gone) = 32 THEN
        INSERT INTO alkblobs.released (relid, key) VALUES (TG_RELID, gone);
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
        IF r.large_tier IN ('local', 's3') AND alkblobs.lock_file(r.pool, k) THEN
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
    INSERT INTO alkblobs.liveness (pool, relid, forward_refs, registered_by, guard_seen)
    VALUES (pl.id, $2, $3, session_user, alkblobs.guard_state($2))
    ON CONFLICT ON CONSTRAINT liveness_pkey DO UPDATE SET forward_refs = EXCLUDED.forward_refs, guard_seen = EXCLUDED.guard_seen;
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
      INTO k USING pl.id, pl.large_tier IN ('local', 's3');
    IF k IS NOT NULL THEN
        RAISE EXCEPTION 'table % has a row naming key %, which pool "%" does not hold', rel::regclass, encode(k, 'hex'), pl.name
            USING ERRCODE = 'AB002',
                  HINT = 'Put the content first, delete the row, or register the table with forward_references => true.';
    END IF;
END $$;

-- A registered table that changed (ATTACH PARTITION brings in rows no
-- guard saw; ENABLE TRIGGER after a DISABLE lets in rows written without
-- it) must still name only held content. After every ALTER TABLE of a
-- registered table or of a partition of one, the registration is marked
-- 'recheck', and the next sweep, stage or claim checks every row under its lock and
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
    IF found_it THEN
        PERFORM alkblobs.request_audit(pl.id, format('liveness table %s was unregistered', $2));
    END IF;
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
    PERFORM alkblobs_registration.install_guard($2);
    -- alkblobs_owner reads it (through its view, alkblobs.src_<oid>; its
    -- partitions through it).
    EXECUTE format('GRANT SELECT ON %s TO alkblobs_owner', $2);
    -- The SQL-only flavour locks it with LOCK TABLE, which needs UPDATE
    -- (alkblobs_owner never writes it; docs/operations.md).
    IF @extschema@.alkblobs_flavour() = 'sql-only' THEN
        EXECUTE format('GRANT UPDATE ON %s TO alkblobs_owner', $2);
    END IF;
    PERFORM alkblobs_registration.add_source($1, $2, $3);
    IF NOT EXISTS (
        SELECT 1 FROM pg_catalog.pg_index i
         WHERE i.indrelid = $2 AND i.indkey[0] = (SELECT a.attnum FROM pg_catalog.pg_attribute a WHERE a.attrelid = $2 AND a.attname = 'key')) THEN
        RAISE NOTICE 'liveness table % has no index leading with "key"; sweeps will scan it for every candidate batch', $2
            USING HINT = format('CREATE INDEX ON %s (key);', $2);
    END IF;
END $$;

-- The triggers of a registered table, ours exactly (an older or altered one
-- is replaced): the guard (AFTER INSERT OR UPDATE OR DELETE, FOR EACH ROW,
-- cloned onto every partition) and, for 'queue' pools, the TRUNCATE
-- trigger, both ENABLE ALWAYS (also under session_replication_role =
-- replica). SECURITY INVOKER: run by the table's owner (registration), or
-- by the extension's owner for the tables registered before 0.8.0.
CREATE FUNCTION alkblobs_registration.install_guard(tbl regclass) RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    tg record;
BEGIN
    SELECT t.tgfoid, t.tgtype INTO tg FROM pg_catalog.pg_trigger t WHERE t.tgrelid = $1 AND t.tgname = 'alkblobs_liveness_guard';
    IF FOUND AND (tg.tgfoid <> 'alkblobs_registration.liveness_guard()'::pg_catalog.regprocedure OR tg.tgtype <> 29) THEN
        EXECUTE format('DROP TRIGGER alkblobs_liveness_guard ON %s', $1);
    END IF;
    IF NOT FOUND OR tg.tgfoid <> 'alkblobs_registration.liveness_guard()'::pg_catalog.regprocedure OR tg.tgtype <> 29 THEN
        EXECUTE format('CREATE TRIGGER alkblobs_liveness_guard AFTER INSERT OR UPDATE OR DELETE ON %s '
                       'FOR EACH ROW EXECUTE FUNCTION alkblobs_registration.liveness_guard()', $1);
    END IF;
    EXECUTE format('ALTER TABLE %s ENABLE ALWAYS TRIGGER alkblobs_liveness_guard', $1);
    SELECT t.tgfoid, t.tgtype INTO tg FROM pg_catalog.pg_trigger t WHERE t.tgrelid = $1 AND t.tgname = 'alkblobs_liveness_truncate';
    IF FOUND AND (tg.tgfoid <> 'alkblobs_registration.liveness_truncated()'::pg_catalog.regprocedure OR tg.tgtype <> 32) THEN
        EXECUTE format('DROP TRIGGER alkblobs_liveness_truncate ON %s', $1);
    END IF;
    IF NOT FOUND OR tg.tgfoid <> 'alkblobs_registration.liveness_truncated()'::pg_catalog.regprocedure OR tg.tgtype <> 32 THEN
        EXECUTE format('CREATE TRIGGER alkblobs_liveness_truncate AFTER TRUNCATE ON %s '
                       'FOR EACH STATEMENT EXECUTE FUNCTION alkblobs_registration.liveness_truncated()', $1);
    END IF;
    EXECUTE format('ALTER TABLE %s ENABLE ALWAYS TRIGGER alkblobs_liveness_truncate', $1);
END $$;

-- A registered table truncated: every key its rows protected may be
-- unprotected now, which no queue row says key by key, so each 'queue'
-- pool it is registered with gets an audit (a full mark). A TRUNCATE of
-- one partition fires no trigger of its parent's: that leaks until the
-- next scheduled audit, it never deletes anything protected.
CREATE FUNCTION alkblobs_registration.liveness_truncated() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM alkblobs.request_audit(l.pool, format('liveness table %s was truncated', TG_RELID::pg_catalog.regclass))
       FROM alkblobs.liveness l
      WHERE l.relid = TG_RELID OR l.relid IN (SELECT a.relid FROM pg_catalog.pg_partition_ancestors(TG_RELID) a);
    RETURN NULL;
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
        EXECUTE format('DROP TRIGGER IF EXISTS alkblobs_liveness_truncate ON %s', $2);
        EXECUTE format('REVOKE SELECT, UPDATE ON %s FROM alkblobs_owner', $2);
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
DECLARE
    r record;
BEGIN
    FOR r IN DELETE FROM alkblobs.liveness l
              USING pg_catalog.pg_event_trigger_dropped_objects() d
              WHERE d.classid = 'pg_catalog.pg_class'::regclass AND d.objid = l.relid
              RETURNING l.pool, d.object_identity LOOP
        PERFORM alkblobs.request_audit(r.pool, format('liveness table %s was dropped', r.object_identity));
    END LOOP;
END $$;

CREATE EVENT TRIGGER alkblobs_liveness_drop ON sql_drop
    EXECUTE FUNCTION alkblobs.on_sql_drop();
