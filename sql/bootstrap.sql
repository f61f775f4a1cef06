-- alkblobs extension: schema (runs first).
--
-- Internal state lives in schema `alkblobs`, owned (with every table and
-- function of the extension) by the role `alkblobs_owner`: NOLOGIN, not a
-- superuser, member of nothing. The API functions (in the extension's
-- schema, normally `public`) are SECURITY DEFINER as that role with a
-- pinned search_path and are the only way in; so a definer function never
-- runs as a superuser. See docs/sql-api.md, docs/operations.md ("Security
-- model") and docs/design.md §4.

DO $$
DECLARE
    r record;
    members text;
    who text;
BEGIN
    SELECT * INTO r FROM pg_catalog.pg_roles WHERE rolname = 'alkblobs_owner';
    IF NOT FOUND THEN
        CREATE ROLE alkblobs_owner NOLOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS;
    ELSIF r.rolsuper OR r.rolcanlogin OR r.rolcreaterole OR r.rolbypassrls OR r.rolreplication THEN
        RAISE EXCEPTION 'role alkblobs_owner exists with privileges it must not have (superuser, login, createrole, replication or bypassrls)'
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'ALTER ROLE alkblobs_owner NOLOGIN NOSUPERUSER NOCREATEROLE NOREPLICATION NOBYPASSRLS, then retry.';
    END IF;
    -- A member of nothing, and nobody may use its privileges. Since
    -- PostgreSQL 16 a role created by a non-superuser with CREATEROLE (the
    -- SQL-only install's) is granted back to its creator WITH ADMIN OPTION:
    -- that membership may stay if it is ADMIN only (no INHERIT, no SET
    -- now). An ADMIN holder can still grant itself SET later, as every
    -- CREATEROLE role could on 15: it is trusted as the installer is
    -- (docs/operations.md, "The SQL-only flavour"). This check runs at
    -- install only.
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_auth_members m JOIN pg_catalog.pg_roles o ON o.oid = m.member
                WHERE o.rolname = 'alkblobs_owner') THEN
        RAISE EXCEPTION 'role alkblobs_owner must be a member of no role'
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    members := 'SELECT r.rolname FROM pg_catalog.pg_auth_members m JOIN pg_catalog.pg_roles r ON r.oid = m.member
                 WHERE m.roleid = (SELECT o.oid FROM pg_catalog.pg_roles o WHERE o.rolname = ''alkblobs_owner'')';
    -- (Dynamic: PostgreSQL 15 has no inherit_option or set_option.)
    IF pg_catalog.current_setting('server_version_num')::integer >= 160000 THEN
        members := members || ' AND (m.inherit_option OR m.set_option)';
    END IF;
    EXECUTE 'SELECT pg_catalog.string_agg(x.rolname, '', '' ORDER BY x.rolname) FROM (' || members || ') x' INTO who;
    IF who IS NOT NULL THEN
        RAISE EXCEPTION 'role alkblobs_owner must have no members that can use its privileges: %', who
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'REVOKE alkblobs_owner FROM each of them (PostgreSQL 16 and later: a membership WITH ADMIN OPTION, INHERIT FALSE, SET FALSE may stay), then retry; a running sql-only-backup.py dump or restore holds such a membership until it ends, so wait for it.';
    END IF;
END $$;

CREATE SCHEMA IF NOT EXISTS alkblobs;
REVOKE ALL ON SCHEMA alkblobs FROM PUBLIC;
-- The five internals that registration, which runs as the caller, calls
-- (0.7.0). Admins get USAGE on this schema, which holds no table, and not
-- on `alkblobs`: with USAGE there, an admin of one pool could queue an
-- ACCESS EXCLUSIVE lock on the extension's tables (`CREATE RULE … ON
-- alkblobs.pools` takes it before it checks ownership) behind any reader
-- and stall every call of every pool behind it. Owned by the installing
-- superuser, so alkblobs_owner cannot add functions to what admins run
-- (it owns, and so could alter, the five definer functions in it, as it
-- owns every definer function of the extension).
CREATE SCHEMA alkblobs_registration;
REVOKE ALL ON SCHEMA alkblobs_registration FROM PUBLIC;

-- A pool: a named set of entries with its own window, pin TTL and sweeper
-- lock. The window and TTL live here so that every entry point (client,
-- CLI, psql) applies the same ones.
CREATE TABLE alkblobs.pools (
    id            integer GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name          text NOT NULL UNIQUE
                  CONSTRAINT pool_name_format CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9_.:-]{0,62}$'),
    delete_window interval NOT NULL CONSTRAINT window_not_negative CHECK (delete_window >= interval '0')
                  CONSTRAINT window_at_most_a_year CHECK (delete_window <= interval '366 days'),
    pin_ttl       interval NOT NULL CONSTRAINT ttl_positive CHECK (pin_ttl > interval '0')
                  CONSTRAINT ttl_at_most_a_week CHECK (pin_ttl <= interval '7 days'),
    -- Where content over the client's kv threshold goes: 'pg-lo' (large
    -- objects in this database), 'local' (files on fleet-shared media; the
    -- client stages and deletes them under this database's arbitration),
    -- 's3' (objects under large_location in an S3 bucket: the same shared
    -- tier, another medium) or 'none' (kv-only; large content is routed to
    -- a storage node).
    large_tier    text NOT NULL CONSTRAINT large_tier_known CHECK (large_tier IN ('pg-lo', 'local', 's3', 'none')),
    -- An 's3' pool's bucket and prefix ('s3://bucket/prefix'); every node
    -- declares the same (the fleet-validity rule). No other pool's
    -- location is it or nests in it (alkblobs_create_pool).
    large_location text CONSTRAINT location_iff_s3 CHECK ((large_tier = 's3') = (large_location IS NOT NULL))
                   CONSTRAINT location_format CHECK (large_location ~ '^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/[A-Za-z0-9!_.*''()-]+)*$' AND large_location !~ '/\.\.?(/|$)')
                   CONSTRAINT location_unique UNIQUE,
    -- 'fleet': swept by the extension (pins are rows, liveness is tables).
    -- 'single': one store instance owns the pool and sweeps it itself with
    -- its in-process arbiter (its pins are in its memory, its staged rows
    -- and roots in single_staged / single_roots); the extension's own sweep
    -- and the fleet-only functions refuse it.
    mode          text NOT NULL DEFAULT 'fleet' CONSTRAINT mode_known CHECK (mode IN ('fleet', 'single')),
    -- The role that created the pool (its login role): it and its members
    -- have every access to the pool; others need a grant (pool_grants).
    -- The role's name (0.8.0; an oid before), as pins.role: a restore into
    -- another cluster, whose roles have other OIDs, hands the pool to the
    -- same role by name, and one without that role still loads the pool
    -- and everything that references it (its registrations, marks and
    -- staged rows): only the owner's own access waits until the role
    -- exists. (A regrole failed the whole table's restore, and with it
    -- every table that references pools.) The same for
    -- pool_grants.grantee.
    owner         name NOT NULL,
    -- The owner role's OID in this cluster, set from `owner` whenever the
    -- row is written, a restore included (alkblobs.roles_by_name), NULL
    -- while no role has that name. Access follows the OID once it is set:
    -- a role created later under a dropped owner's name gains nothing, and
    -- a renamed owner keeps its pools. While it is NULL (a restore without
    -- the role), the name decides: restore the roles first.
    owner_oid     oid,
    -- Largest large object an upload may write (offset + chunk length).
    max_object_bytes bigint NOT NULL DEFAULT 68719476736
                  CONSTRAINT max_object_positive CHECK (max_object_bytes > 0),
    -- A mark in progress across calls: its id and the last key it examined.
    open_mark     bigint,
    mark_cursor   bytea,
    created_at    timestamptz NOT NULL DEFAULT now(),
    -- Scheduling and health (0.6.0). sweep_every: how often the
    -- extension's scheduler sweeps the pool (NULL: manual, the default);
    -- history_keep: how long its rows in alkblobs.sweeps are kept;
    -- warn_after / critical_after: how old the last completed sweep may be
    -- before alkblobs_health says 'warn' / 'critical' (NULL: derived from
    -- sweep_every, see alkblobs.health_rows). Ranges: alkblobs.check_schedule.
    sweep_every    interval,
    history_keep   interval NOT NULL DEFAULT '14 days',
    warn_after     interval,
    critical_after interval,
    -- The incarnation of the extension (alkblobs.incarnation) and the
    -- server start (pg_postmaster_start_time()) this pool last ran under
    -- (0.8.0): when either differs, the pool was restored or the server
    -- restarted, and alkblobs.adopt gives its pins a fresh TTL and its marks
    -- a fresh window before anything reaps or deletes.
    seen_incarnation uuid,
    seen_start       timestamptz,
    -- How the pool's sweeps find dead content (0.8.0). 'queue' (the
    -- default): every event that can leave a key unprotected queues it in
    -- alkblobs.review_queue, and a sweep reviews only the queue, so its
    -- cost follows churn; the full mark runs only as an audit (audit_due,
    -- audit_every, alkblobs_audit). 'mark': every sweep marks the whole
    -- pool, slice by slice (the collector before 0.8.0).
    collector      text NOT NULL DEFAULT 'queue' CONSTRAINT collector_known CHECK (collector IN ('queue', 'mark')),
    -- A 'queue' pool's audits: how often one runs (NULL: only when an
    -- event asks for one, alkblobs.audit_requests, or alkblobs_audit is
    -- called), why the one under way runs, and when the last ended.
    audit_every    interval CONSTRAINT audit_every_positive CHECK (audit_every > interval '0'),
    audit_running  text,
    last_audit     timestamptz,
    -- A pool with a shared large tier ('local', 's3'): since when a node
    -- with the tier should list it, to stage files nobody recorded (found
    -- only by listing: every file a fleet put writes is recorded first).
    -- Set at creation and whenever a mark seals — every sweep of a 'mark'
    -- pool, only audits of a 'queue' one; cleared by the listing
    -- (alkblobs_tier_listed). NULL: no listing due.
    tier_listing_due timestamptz
);

-- Per-pool grants: `access` is 'read', 'write' (and read), 'sweep' (and
-- read) or 'admin' (everything). See alkblobs.may().
CREATE TABLE alkblobs.pool_grants (
    pool    integer NOT NULL REFERENCES alkblobs.pools (id) ON DELETE CASCADE,
    -- A name (see pools.owner): one missing grantee costs only its rows;
    -- and its OID here, as pools.owner_oid.
    grantee name NOT NULL,
    grantee_oid oid,
    access  text NOT NULL CHECK (access IN ('read', 'write', 'sweep', 'admin')),
    PRIMARY KEY (pool, grantee, access)
);

-- Entries held in this database: kv values inline, large objects by oid
-- (this table is the pg-lo tier's companion-table authority).
CREATE TABLE alkblobs.entries (
    -- No foreign key to pools (nor in pins): on the put path its per-row
    -- check cost more than the rest of a batch put; pools are never
    -- deleted (alkblobs.refuse_pool_delete).
    pool       integer NOT NULL,
    key        bytea NOT NULL CONSTRAINT key_is_32_bytes CHECK (length(key) = 32),
    size       bigint NOT NULL CHECK (size >= 0),
    tier       text NOT NULL CHECK (tier IN ('kv', 'lo')),
    value      bytea,
    loid       oid,
    created_at timestamptz NOT NULL DEFAULT now(),
    -- A large object's BLAKE3 outboard (0.8.0; NULL for one stored before,
    -- until `alkblobs verify --repair-outboards`): 64 bytes per 16 KiB of
    -- the blob, read by window (hence stored uncompressed, out of line:
    -- substring fetches only the TOAST chunks it needs). Not checked by the
    -- server: every reader checks what it reads against the key.
    outboard   bytea,
    PRIMARY KEY (pool, key),
    CONSTRAINT tier_payload CHECK (
        (tier = 'kv' AND value IS NOT NULL AND loid IS NULL)
        OR (tier = 'lo' AND loid IS NOT NULL AND value IS NULL)),
    CONSTRAINT outboard_of_lo CHECK (outboard IS NULL OR tier = 'lo')
);
ALTER TABLE alkblobs.entries ALTER COLUMN outboard SET STORAGE EXTERNAL;
-- One entry per large object: an entry whose object was lost must never
-- share its OID with a live one (its deletion would unlink the other's
-- bytes). alkblobs_lo_create hands out no OID a record names.
CREATE UNIQUE INDEX entries_loid ON alkblobs.entries (loid) WHERE loid IS NOT NULL;

-- Pins: one row per (pool, key, role, owner), where role is the session
-- role that made the pin and owner the caller's store-instance id. Only
-- un-expired pins protect.
CREATE TABLE alkblobs.pins (
    pool       integer NOT NULL,
    key        bytea NOT NULL CONSTRAINT key_is_32_bytes CHECK (length(key) = 32),
    -- The session role's name (0.8.0; an oid before): a restore into a
    -- cluster whose roles have other OIDs keeps each pin with its role, and
    -- one whose role is missing there still loads (and protects until it
    -- expires) where a regrole would make the whole table fail to load.
    role       name NOT NULL,
    owner      text NOT NULL CONSTRAINT owner_format CHECK (length(owner) BETWEEN 1 AND 200),
    pinned_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (pool, key, role, owner)
);
-- Renewal is by (role, owner). Reaping scans one pool's pins once per
-- sweep, which is cheaper than maintaining an expiry index on every put.
CREATE INDEX pins_by_owner ON alkblobs.pins (pool, role, owner);

-- Registered liveness tables. `relid` is the table's oid; a DROP TABLE
-- removes the registration (event trigger below).
CREATE TABLE alkblobs.liveness (
    pool          integer NOT NULL REFERENCES alkblobs.pools (id),
    -- regclass (an OID that pg_dump writes as the table's name, so a
    -- restore maps it to the restored table).
    relid         regclass NOT NULL,
    -- false (the default): a row naming a key the pool does not hold fails
    -- with AB002. true: such a row is accepted and protects the content if
    -- it is put later (see docs/design.md §4 for what that gives up).
    forward_refs  boolean NOT NULL DEFAULT false,
    -- A name, not a regrole, for the reason given at pins.role: a missing
    -- role must never make the registrations fail to load.
    registered_by name NOT NULL,
    registered_at timestamptz NOT NULL DEFAULT now(),
    -- Rows may have reached the table without this pool's guard (DDL that
    -- could not be checked on the spot: alkblobs.on_ddl_end): 'recheck'
    -- makes the next sweep check every row and abort if one names content
    -- the pool does not hold. ('seed' was set by the 0.3.0 -> 0.4.0 upgrade
    -- of a local-tier pool, whose first sweep recorded the keys its rows
    -- named as published files; since 0.8.0 its upgrade does that and
    -- leaves 'recheck'.)
    pending       text CONSTRAINT pending_known CHECK (pending IN ('recheck', 'seed')),
    -- The state of the table's guard triggers (alkblobs.guard_state) when
    -- its rows were last known to be guarded (0.8.0): any ALTER TABLE that
    -- disabled, dropped, re-created or added one (ATTACH PARTITION) leaves
    -- another state, and the next use checks every row as for 'recheck'.
    -- The SQL-only flavour, which cannot have event triggers, relies on it.
    guard_seen    text,
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
-- The executor walks one due mark's rows in key order.
CREATE INDEX staged_by_mark ON alkblobs.staged (mark, key);

-- The review queue (0.8.0): the keys of a 'queue' pool that an event may
-- have left unprotected (a pin released, expired or reaped; a liveness row
-- deleted or its key changed; an entry whose key also has a file deleted;
-- a put's key is queued when its pin goes), a row per
-- event, appended in the event's transaction (never updated: an append
-- cannot fail with a serialization error at REPEATABLE READ or
-- SERIALIZABLE). A sweep reviews the oldest rows, stages the keys nothing
-- protects, which the executor deletes a window later after its usual
-- re-check, and deletes exactly the rows it read. A missed row leaks
-- content until the next audit; it can never delete any.
CREATE TABLE alkblobs.review_queue (
    pool      integer NOT NULL,
    id        bigint GENERATED ALWAYS AS IDENTITY,
    key       bytea NOT NULL CONSTRAINT key_is_32_bytes CHECK (length(key) = 32),
    queued_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (pool, id)
);
CREATE INDEX review_queue_by_key ON alkblobs.review_queue (pool, key);
-- Liveness rows deleted or moved off a key (0.8.0): the guard appends the
-- table and the key, and nothing else — no lookup of which pools the table
-- feeds, which is what a deleted row would otherwise pay for (most of the
-- guard's cost on a delete, measured). Each sweep call of a fleet pool
-- routes the rows of the tables it is fed by into review_queue rows of the
-- 'queue' pools those tables (or tables they are partitions of) feed at
-- that moment, in the transaction that deletes them
-- (alkblobs.route_released): a row is moved, never dropped, unless no
-- 'queue' pool is fed by its table. A table unregistered, detached or
-- dropped in between asked for an audit, which finds what the routing can
-- no longer tell; its rows are dropped.
CREATE TABLE alkblobs.released (
    relid       regclass NOT NULL,
    id          bigint GENERATED ALWAYS AS IDENTITY,
    key         bytea NOT NULL,
    released_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (relid, id)
);
-- Audits asked for (0.8.0): an event that cannot be queued key by key (a
-- liveness table truncated, dropped, unregistered or altered, a restore,
-- the upgrade) or alkblobs_audit, a row each, appended (nothing waits for
-- an uncommitted request). The next sweep call of the pool that starts an
-- audit takes the rows committed by then (alkblobs.request_audit).
CREATE TABLE alkblobs.audit_requests (
    pool         integer NOT NULL,
    id           bigint GENERATED ALWAYS AS IDENTITY,
    reason       text NOT NULL,
    requested_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (pool, id)
);

-- Large-object uploads in progress. An upload belongs to the transaction
-- and the session role that created it (alkblobs_lo_write and _lo_commit
-- accept only those); a row whose transaction is over was abandoned (its
-- creator committed without alkblobs_lo_commit) and the sweep unlinks it.
CREATE TABLE alkblobs.uploads (
    loid       oid PRIMARY KEY,
    pool       integer NOT NULL REFERENCES alkblobs.pools (id),
    xact       xid8 NOT NULL,
    role       name NOT NULL,
    started_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX uploads_by_pool ON alkblobs.uploads (pool);

-- The files of a pool's `local` tier (fleet-shared media) this database
-- knows of. alkblobs_pin_new records a key, not yet published, in the
-- transaction that pins it (before the client writes or renames the file
-- into place); alkblobs_local_published marks it published once the file
-- is there; alkblobs_claim_local removes it in the transaction during
-- which the client deletes the file. It is what makes "is this key in the
-- pool" answerable for the local tier: a liveness write naming a key that
-- is neither an entry nor a published file here fails with AB002, and it
-- locks the row it found FOR KEY SHARE, which a claim must pass over.
CREATE TABLE alkblobs.files (
    pool         integer NOT NULL REFERENCES alkblobs.pools (id),
    key          bytea NOT NULL CONSTRAINT key_is_32_bytes CHECK (length(key) = 32),
    published    boolean NOT NULL DEFAULT false,
    recorded_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    -- A tombstone: a claim decided the file is dead and committed; its
    -- claimer is deleting it (alkblobs_local_deleted removes the row after).
    -- Not published, so nothing may reference it, and alkblobs_pin_new
    -- refuses to record the key afresh (55006) until the delete is done.
    deleting_since timestamptz,
    -- Which object holds the key's bytes on an s3 tier (0: the key's own
    -- name; N > 0: the name with a `.gN` suffix): what alkblobs_pin_new
    -- handed the writer, from alkblobs.file_fences (0.8.0).
    generation   bigint NOT NULL DEFAULT 0 CONSTRAINT generation_not_negative CHECK (generation >= 0),
    PRIMARY KEY (pool, key)
);

-- Keys whose tombstone a claim handed out again (its first claimer looked
-- dead, but may only be stopped: SIGSTOP, a long pause, a partition). That
-- claimer may still send the delete it was about to send, at any time, for
-- the objects of the generations it was handed; so a key recorded afresh
-- gets `generation` (one past every generation a tombstone handed out
-- again carried), an object name no such late delete can name. On an s3
-- tier a claimer that finished fences its keys too: an attempt of a delete
-- its HTTP client retried may still land after it (alkblobs_local_deleted).
-- Rows stay: a stopped process can resume at any time. (0.8.0;
-- docs/design.md, "The shared tier over S3".)
CREATE TABLE alkblobs.file_fences (
    pool        integer NOT NULL REFERENCES alkblobs.pools (id),
    key         bytea NOT NULL CONSTRAINT key_is_32_bytes CHECK (length(key) = 32),
    generation  bigint NOT NULL CONSTRAINT generation_positive CHECK (generation > 0),
    fenced_at   timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (pool, key)
);

-- A single-instance pool's GC state (see pools.mode): the in-process
-- arbiter's staged candidates (visible_after NULL while its sweep is still
-- marking) and persistent roots, durable across restarts of the instance.
CREATE TABLE alkblobs.single_staged (
    pool             integer NOT NULL REFERENCES alkblobs.pools (id),
    key              bytea NOT NULL CONSTRAINT key_is_32_bytes CHECK (length(key) = 32),
    staged_at_ms     bigint NOT NULL,
    visible_after_ms bigint,
    PRIMARY KEY (pool, key)
);
CREATE TABLE alkblobs.single_roots (
    pool integer NOT NULL REFERENCES alkblobs.pools (id),
    key  bytea NOT NULL CONSTRAINT key_is_32_bytes CHECK (length(key) = 32),
    PRIMARY KEY (pool, key)
);

-- Sweep history: one row per sweep call (alkblobs_sweep from a node or
-- psql, and the scheduler's calls), written in the sweep's own transaction
-- (a sweep that raises is recorded only when the scheduler ran it: it
-- catches the error and records it). Rows older than the pool's
-- history_keep are deleted by the pool's next sweeps.
CREATE TABLE alkblobs.sweeps (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    pool             integer NOT NULL,
    role             name NOT NULL,
    application_name text,
    scheduled        boolean NOT NULL,
    dry_run          boolean NOT NULL,
    started          timestamptz NOT NULL,
    finished         timestamptz NOT NULL,
    examined bigint, live bigint, pinned bigint, staged bigint, executed bigint,
    deleted bigint, kept bigint, bytes_freed bigint, pins_reaped bigint, remaining bigint,
    local_due bigint, skipped bigint, uploads_reaped bigint, mark_done boolean,
    -- The sweep's own abort cause (sweeper_lock, liveness_table_busy, ...).
    aborted          text,
    -- SQLSTATE and message of a scheduled sweep that raised.
    error            text,
    -- (0.8.0) Queue rows reviewed; why the call ran a slice of an audit
    -- (NULL: none); and how many keys that slice staged which no queue
    -- row, staged row or pin accounted for: events the queue missed.
    reviewed bigint, audit text, missed bigint
);
CREATE INDEX sweeps_by_pool ON alkblobs.sweeps (pool, started);

-- The last verify of each pool (alkblobs_verify_finished): when it ran,
-- who ran it, whether it walked the whole record, what it checked and
-- found. damaged_since is set by a run that found content missing or
-- corrupt and cleared only by a whole run that found neither;
-- alkblobs_health is 'critical' while it is set. (0.8.0)
CREATE TABLE alkblobs.verifies (
    pool          integer CONSTRAINT verifies_pkey PRIMARY KEY,
    role          name NOT NULL,
    started       timestamptz NOT NULL,
    finished      timestamptz NOT NULL,
    whole         boolean NOT NULL,
    checked       bigint NOT NULL,
    bytes         bigint NOT NULL,
    missing       bigint NOT NULL,
    corrupt       bigint NOT NULL,
    unrecorded    bigint NOT NULL,
    -- Since when content is missing or corrupt (the first run that found
    -- it), and when the last run that found any finished: only a whole
    -- run that started after that clears both.
    damaged_since timestamptz,
    last_damage   timestamptz
);

-- Per-pool sweep bookkeeping alkblobs_health reads in O(1), independent of
-- the history's retention: when a sweep last completed, and since when the
-- pool is tracked (its creation, or the upgrade to 0.6.0).
CREATE TABLE alkblobs.sweep_state (
    pool           integer PRIMARY KEY,
    tracked_since  timestamptz NOT NULL DEFAULT clock_timestamp(),
    last_completed timestamptz
);
-- When the scheduler last started a run of each pool (claimed in its own
-- transaction before the run, so a run that takes its worker down does not
-- make the pool first in line again at once). The database's one worker
-- and pg_cron jobs (0.8.0) write it, each claim one statement that
-- re-checks the period, so one period is never run twice.
CREATE TABLE alkblobs.schedule (
    pool           integer PRIMARY KEY,
    last_scheduled timestamptz NOT NULL,
    -- What started that run (0.8.0): the background worker, or a pg_cron
    -- job (alkblobs_schedule_cron).
    runner         text NOT NULL DEFAULT 'worker' CONSTRAINT runner_known CHECK (runner IN ('worker', 'pg_cron'))
);
-- Each pool's sweeper lock (0.7.0), a row only the extension can lock
-- (SELECT … FOR UPDATE needs UPDATE on the table, which only
-- alkblobs_owner has), taken by every sweep call, claim, staging and
-- registration of the pool for the rest of its transaction. Until 0.6.0
-- it was an advisory lock, which any role that can connect can take:
-- holding it made every sweep of the pool abort and every staging call
-- wait. The rows are never updated, only locked, so locking one raises no
-- serialization failure at REPEATABLE READ or SERIALIZABLE. See
-- alkblobs.take_lock.
CREATE TABLE alkblobs.pool_locks (
    pool integer PRIMARY KEY
);
-- Fleet clients' sweep leases (0.7.0; alkblobs_sweep_lease): which store
-- instance (role and instance id, as for pins) sweeps the pool, until
-- when, and the backend that last took or renewed it. A row that expired,
-- or whose backend is gone (its client died), is anyone's to take.
-- Exclusivity among clients only: no sweep's safety depends on it. Not
-- dumped: its pids and role oids mean nothing after a restore.
CREATE TABLE alkblobs.leases (
    pool       integer PRIMARY KEY,
    role       oid NOT NULL,
    holder     text NOT NULL CONSTRAINT holder_format CHECK (length(holder) BETWEEN 1 AND 200),
    pid        integer NOT NULL,
    expires_at timestamptz NOT NULL
);

-- This installation of the extension (0.8.0): one row, made by CREATE
-- EXTENSION (the library flavour never dumps it) or by the SQL-only
-- install (whose dump carries it: relid tells), so a pool restored from a
-- dump names another one (alkblobs.adopt).
CREATE TABLE alkblobs.incarnation (
    id         uuid NOT NULL DEFAULT gen_random_uuid(),
    created_at timestamptz NOT NULL DEFAULT now(),
    one        boolean PRIMARY KEY DEFAULT true CONSTRAINT one_row CHECK (one),
    -- This table's own OID when the row was made. A logical restore keeps
    -- the row where it copies it (the SQL-only flavour's tables are
    -- ordinary ones, which pg_dump dumps) but never the OID, so a row
    -- whose relid is not the table's is a restored one (alkblobs.incarnation_id).
    relid      oid NOT NULL
);
INSERT INTO alkblobs.incarnation (relid) VALUES ('alkblobs.incarnation'::regclass);

REVOKE ALL ON ALL TABLES IN SCHEMA alkblobs FROM PUBLIC;

-- pg_dump dumps the rows of these tables (they are the pools), and the
-- sequences behind their identity columns.
-- (One call per statement: each updates the extension's row.)
SELECT pg_catalog.pg_extension_config_dump('alkblobs.pools', '');
SELECT pg_catalog.pg_extension_config_dump('alkblobs.pools_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('alkblobs.pool_grants', '');
SELECT pg_catalog.pg_extension_config_dump('alkblobs.entries', '');
SELECT pg_catalog.pg_extension_config_dump('alkblobs.pins', '');
SELECT pg_catalog.pg_extension_config_dump('alkblobs.liveness', '');
SELECT pg_catalog.pg_extension_config_dump('alkblobs.marks', '');
SELECT pg_catalog.pg_extension_config_dump('alkblobs.marks_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('alkblobs.staged', '');
SELECT pg_catalog.pg_extension_config_dump('alkblobs.review_queue', '');
SELECT pg_catalog.pg_extension_config_dump('alkblobs.review_queue_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('alkblobs.released', '');
SELECT pg_catalog.pg_extension_config_dump('alkblobs.released_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('alkblobs.audit_requests', '');
SELECT pg_catalog.pg_extension_config_dump('alkblobs.audit_requests_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('alkblobs.uploads', '');
SELECT pg_catalog.pg_extension_config_dump('alkblobs.files', '');
SELECT pg_catalog.pg_extension_config_dump('alkblobs.file_fences', '');
SELECT pg_catalog.pg_extension_config_dump('alkblobs.single_staged', '');
SELECT pg_catalog.pg_extension_config_dump('alkblobs.single_roots', '');
SELECT pg_catalog.pg_extension_config_dump('alkblobs.sweeps', '');
SELECT pg_catalog.pg_extension_config_dump('alkblobs.sweeps_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('alkblobs.sweep_state', '');
SELECT pg_catalog.pg_extension_config_dump('alkblobs.verifies', '');
SELECT pg_catalog.pg_extension_config_dump('alkblobs.schedule', '');
SELECT pg_catalog.pg_extension_config_dump('alkblobs.pool_locks', '');

