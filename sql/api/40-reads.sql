-- alkblobs SQL API, 40-reads.sql: Reads: get, stat, list.
-- (sql/api/*.sql load in file-name order after bootstrap.sql and the Rust
-- functions; docs/design.md, "Layout". The rules of the whole API are in 10-helpers.sql's header.)

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
    SELECT /* @may(read) */ (EXISTS (SELECT 1 FROM pg_catalog.pg_roles o WHERE (o.oid = p.owner_oid OR (p.owner_oid IS NULL AND o.rolname = p.owner)) AND pg_catalog.pg_has_role(session_user, o.oid, 'USAGE')) OR EXISTS (SELECT 1 FROM alkblobs.pool_grants g JOIN pg_catalog.pg_roles r ON (r.oid = g.grantee_oid OR (g.grantee_oid IS NULL AND r.rolname = g.grantee)) WHERE g.pool = p.id AND pg_catalog.pg_has_role(session_user, r.oid, 'USAGE'))) /* @end */,
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
    o oid;
BEGIN
    -- alkblobs.may's rules for 'read', inline (one source: 10-helpers.sql).
    SELECT p.id INTO pid FROM alkblobs.pools p WHERE p.name = $1
       AND /* @may(read) */ (EXISTS (SELECT 1 FROM pg_catalog.pg_roles o WHERE (o.oid = p.owner_oid OR (p.owner_oid IS NULL AND o.rolname = p.owner)) AND pg_catalog.pg_has_role(session_user, o.oid, 'USAGE')) OR EXISTS (SELECT 1 FROM alkblobs.pool_grants g JOIN pg_catalog.pg_roles r ON (r.oid = g.grantee_oid OR (g.grantee_oid IS NULL AND r.rolname = g.grantee)) WHERE g.pool = p.id AND pg_catalog.pg_has_role(session_user, r.oid, 'USAGE'))) /* @end */;
    IF NOT FOUND THEN
        pid := (alkblobs.pool($1, 'read')).id;
    END IF;
    IF length($2) IS DISTINCT FROM 32 THEN
        PERFORM alkblobs.check_key($2);
    END IF;
    SELECT e.size, e.tier, e.created_at, e.loid INTO size, tier, created_at, o
      FROM alkblobs.entries e WHERE e.pool = pid AND e.key = $2;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    -- A large-object entry whose large object is gone is lost, not
    -- present (one catalog probe, for 'lo' entries only).
    IF tier = 'lo' AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_largeobject_metadata m WHERE m.oid = o) THEN
        RAISE EXCEPTION 'alkblobs pool "%": the entry % is recorded but its large object is gone', $1, $2
            USING ERRCODE = 'AB006',
                  HINT = 'Put the original bytes again to restore it; alkblobs verify lists every such key.';
    END IF;
    RETURN NEXT;
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
