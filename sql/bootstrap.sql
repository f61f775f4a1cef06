-- alkblobs extension: schema (runs first).
--
-- Internal state lives in schema `alkblobs`, which nobody but the extension
-- owner can touch; the API functions (in the extension's schema, normally
-- `public`) are SECURITY DEFINER with a pinned search_path and are the only
-- way in. See docs/sql-api.md and docs/design.md ("Fleet protocol").

CREATE SCHEMA IF NOT EXISTS alkblobs;
REVOKE ALL ON SCHEMA alkblobs FROM PUBLIC;

-- A pool: a named set of entries with its own window, pin TTL and sweeper
-- lock. The window and TTL live here so that every entry point (client,
-- CLI, psql) applies the same ones.
CREATE TABLE alkblobs.pools (
    id            integer GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name          text NOT NULL UNIQUE
                  CONSTRAINT pool_name_format CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9_.:-]{0,62}$'),
    delete_window interval NOT NULL CONSTRAINT window_not_negative CHECK (delete_window >= interval '0'),
    pin_ttl       interval NOT NULL CONSTRAINT ttl_positive CHECK (pin_ttl > interval '0'),
    -- Where content over the client's kv threshold goes: 'pg-lo' (large
    -- objects in this database), 'local' (files on fleet-shared media; the
    -- client stages and deletes them under this database's arbitration) or
    -- 'none' (kv-only; large content is routed to a storage node).
    large_tier    text NOT NULL CONSTRAINT large_tier_known CHECK (large_tier IN ('pg-lo', 'local', 'none')),
    created_at    timestamptz NOT NULL DEFAULT now()
);

-- Entries held in this database: kv values inline, large objects by oid
-- (this table is the pg-lo tier's companion-table authority).
CREATE TABLE alkblobs.entries (
    pool       integer NOT NULL REFERENCES alkblobs.pools (id),
    key        bytea NOT NULL CONSTRAINT key_is_32_bytes CHECK (length(key) = 32),
    size       bigint NOT NULL CHECK (size >= 0),
    tier       text NOT NULL CHECK (tier IN ('kv', 'lo')),
    value      bytea,
    loid       oid,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (pool, key),
    CONSTRAINT tier_payload CHECK (
        (tier = 'kv' AND value IS NOT NULL AND loid IS NULL)
        OR (tier = 'lo' AND loid IS NOT NULL AND value IS NULL))
);

-- Pins: one row per (pool, key, owner). Only un-expired pins protect.
CREATE TABLE alkblobs.pins (
    pool       integer NOT NULL REFERENCES alkblobs.pools (id),
    key        bytea NOT NULL CONSTRAINT key_is_32_bytes CHECK (length(key) = 32),
    owner      text NOT NULL CONSTRAINT owner_format CHECK (length(owner) BETWEEN 1 AND 200),
    pinned_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (pool, key, owner)
);
-- Renewal is by owner. Reaping scans one pool's pins once per sweep, which
-- is cheaper than maintaining an expiry index on every put.
CREATE INDEX pins_by_owner ON alkblobs.pins (pool, owner);

-- Registered liveness tables. `relid` is the table's oid; a DROP TABLE
-- removes the registration (event trigger below).
CREATE TABLE alkblobs.liveness (
    pool          integer NOT NULL REFERENCES alkblobs.pools (id),
    relid         oid NOT NULL,
    registered_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (pool, relid)
);
CREATE INDEX liveness_by_relid ON alkblobs.liveness (relid);

-- A mark: one pass that found candidates. Its rows become due at
-- mark_end + delete_window; mark_end is set when the mark finishes, so a
-- long mark never shortens the window (and sealing is one row update).
CREATE TABLE alkblobs.marks (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    pool          integer NOT NULL REFERENCES alkblobs.pools (id),
    delete_window interval NOT NULL,
    started_at    timestamptz NOT NULL DEFAULT clock_timestamp(),
    mark_end      timestamptz
);

-- Staged delete candidates. tier 'local' rows are files the client listed;
-- the client deletes them under alkblobs_claim_local's arbitration.
CREATE TABLE alkblobs.staged (
    pool      integer NOT NULL REFERENCES alkblobs.pools (id),
    key       bytea NOT NULL CONSTRAINT key_is_32_bytes CHECK (length(key) = 32),
    tier      text NOT NULL CHECK (tier IN ('kv', 'lo', 'local')),
    mark      bigint NOT NULL REFERENCES alkblobs.marks (id),
    staged_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (pool, key)
);
CREATE INDEX staged_by_mark ON alkblobs.staged (mark);

-- Large-object uploads in progress (visible only inside the uploading
-- transaction): alkblobs_lo_write accepts only these oids.
CREATE TABLE alkblobs.uploads (
    loid       oid PRIMARY KEY,
    started_at timestamptz NOT NULL DEFAULT clock_timestamp()
);

REVOKE ALL ON ALL TABLES IN SCHEMA alkblobs FROM PUBLIC;
