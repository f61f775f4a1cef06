-- alkblobs SQL API, 93-explain.sql: Why is this key live or not: alkblobs_explain.
-- (sql/api/*.sql load in file-name order after bootstrap.sql and the Rust
-- functions; docs/design.md, "Layout". The rules of the whole API are in 10-helpers.sql's header.)

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
    lost boolean := false;
BEGIN
    PERFORM alkblobs.require_read_committed('alkblobs_explain');
    PERFORM alkblobs.check_key($2);
    SELECT en.size, en.tier, en.created_at, en.loid INTO e FROM alkblobs.entries en WHERE en.pool = pl.id AND en.key = $2;
    has_entry := FOUND;
    IF has_entry AND e.tier = 'lo' AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_largeobject_metadata m WHERE m.oid = e.loid) THEN
        lost := true;
        aspect := 'entry';
        detail := format('LOST: recorded (%s bytes in tier lo since %s) but its large object %s is gone', e.size, e.created_at, e.loid);
    ELSIF has_entry THEN
        aspect := 'entry';
        detail := format('present: %s bytes in tier %s since %s', e.size, e.tier, e.created_at);
    ELSE
        aspect := 'entry';
        IF pl.large_tier IN ('local', 's3') AND EXISTS (SELECT 1 FROM alkblobs.files f WHERE f.pool = pl.id AND f.key = $2 AND f.published) THEN
            has_entry := true;
            detail := format('present: a published file on the pool''s %s tier, recorded %s', pl.large_tier,
                             (SELECT f.recorded_at FROM alkblobs.files f WHERE f.pool = pl.id AND f.key = $2));
        ELSIF pl.large_tier IN ('local', 's3') AND EXISTS (SELECT 1 FROM alkblobs.files f WHERE f.pool = pl.id AND f.key = $2 AND f.deleting_since IS NOT NULL) THEN
            detail := 'absent: a sweep claimed its file and is deleting it (put it again once that is done)';
        ELSIF pl.large_tier IN ('local', 's3') AND EXISTS (SELECT 1 FROM alkblobs.files f WHERE f.pool = pl.id AND f.key = $2) THEN
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
    IF lost THEN
        detail := 'LOST: recorded but its content is gone' || CASE WHEN cardinality(protected_by) > 0
                  THEN ' while protected by ' || array_to_string(protected_by, ', ') ELSE '' END
                  || ': put the original bytes again to restore it';
    ELSIF cardinality(protected_by) > 0 THEN
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
