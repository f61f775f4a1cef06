-- alkblobs 0.4.0 -> 0.5.0: the client engines' hot paths (issue 9).
--
-- What an existing install receives:
-- * alkblobs_get, alkblobs_stat, alkblobs_put and alkblobs_put_many check
--   the caller's access in the statement that reads the pool (the rules of
--   alkblobs.may, inline) instead of through nested SECURITY DEFINER calls;
-- * alkblobs_put_many checks a batch in one pass of a Rust function
--   (alkblobs.first_bad) and skips its present-key statements when every
--   key was new;
-- * entries and pins no longer carry a foreign key to pools (its per-row
--   check was the largest cost of a batch put); pools refuse DELETE and
--   TRUNCATE instead (they were never deleted by the API);
-- * alkblobs_unpin_many(pool, owner, keys) releases a store instance's pins
--   on many keys in one statement (granted to alkblobs_writer);
-- * alkblobs_pin pins a published file of a local-tier pool too (it
--   returned false for every key that was not an entry);
-- * a claim of local-tier files commits tombstones (files.deleting_since)
--   before its caller unlinks anything; the caller then locks them
--   (alkblobs_local_deleting), unlinks the files and removes them
--   (alkblobs_local_deleted) in one transaction (both granted to
--   alkblobs_sweeper); alkblobs_pin_new of a tombstoned key fails with 55006 until
--   then, and the next claim hands out tombstones a dead claimer left (the
--   0.4.0 claim held its rows until the caller committed, and a caller
--   that died after unlinking left records of files that were gone);
-- * alkblobs_renew passes over pin rows a sweep holds instead of waiting
--   (and waits for those within half a TTL of expiry);
-- * alkblobs_local_published(pool, keys, owner) marks a file published only
--   under the caller's own un-expired pin on it;
-- * the alkblobs_pools view shows each pool's id (pool_id, the object id of
--   its advisory locks).

-- Functions whose argument list changed.
DROP FUNCTION @extschema@.alkblobs_local_published(text, bytea[]);

-- New Rust functions (pg_ext/src/lib.rs), as pgrx declares them.
CREATE FUNCTION alkblobs."first_bad"("keys" bytea[], "vals" bytea[]) RETURNS integer
IMMUTABLE STRICT PARALLEL SAFE LANGUAGE c AS 'MODULE_PATHNAME', 'first_bad_wrapper';

-- Schema delta.
ALTER TABLE alkblobs.files ADD COLUMN deleting_since timestamptz;
ALTER TABLE alkblobs.entries DROP CONSTRAINT entries_pool_fkey;
ALTER TABLE alkblobs.pins DROP CONSTRAINT pins_pool_fkey;
