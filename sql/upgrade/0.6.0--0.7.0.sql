-- alkblobs 0.6.0 -> 0.7.0: pool locks only the extension can take.
--
-- What an existing install receives:
-- * each pool's sweeper lock (taken by every sweep call, alkblobs_stage,
--   alkblobs_claim_local and (un)registration) is a row lock on
--   alkblobs.pool_locks instead of the advisory lock ('alkb', pool id),
--   which any role that could connect could hold to make every sweep of
--   the pool abort and every staging call wait;
-- * alkblobs_sweep_lease(pool): a fleet client's sweep lease, for callers
--   with 'sweep' access, replacing the client-side advisory lock
--   ('alkS', pool id) that had the same weakness (the 0.7.0 client calls
--   it; older clients keep their advisory lease, which still excludes
--   their own kind);
-- * alkblobs.scheduler_due logs a WARNING when it gives up on a locked
--   table, as the scheduler's other functions do.

-- Functions this version no longer has.
DROP FUNCTION alkblobs.lock_class();

-- Schema delta.
CREATE TABLE alkblobs.pool_locks (
    pool integer NOT NULL,
    kind text NOT NULL CONSTRAINT lock_kind_known CHECK (kind IN ('sweep', 'lease')),
    PRIMARY KEY (pool, kind)
);
INSERT INTO alkblobs.pool_locks (pool, kind)
SELECT p.id, k.kind FROM alkblobs.pools p, (VALUES ('sweep'), ('lease')) k (kind);
REVOKE ALL ON alkblobs.pool_locks FROM PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('alkblobs.pool_locks', '');
