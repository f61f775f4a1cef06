-- The SQL API end to end on one connection: pools, puts, pins, sweeps,
-- liveness tables, explain. Deterministic: no timestamps are printed.
BEGIN;
\set VERBOSITY sqlstate
SELECT alkblobs_create_pool('regress', '0 seconds', '60 seconds');
SELECT pool, delete_window, pin_ttl, large_tier FROM alkblobs_pools WHERE pool = 'regress';

-- A put stores the entry and its pin together; a second put dedups.
SELECT alkblobs_put('regress', alkblobs_key('alpha'), 'alpha', 'node-a') AS created;
SELECT alkblobs_put('regress', alkblobs_key('alpha'), 'alpha', 'node-b') AS created;
SELECT alkblobs_put('regress', alkblobs_key('bravo'), 'bravo', 'node-a') AS created;
SELECT convert_from(alkblobs_get('regress', alkblobs_key('alpha')), 'UTF8') AS value;
SELECT alkblobs_get('regress', alkblobs_key('nothing')) IS NULL AS absent;
SELECT size, tier FROM alkblobs_stat('regress', alkblobs_key('bravo'));
SELECT key = encode(alkblobs_key('alpha'), 'hex') AS is_alpha, owner, expired
  FROM alkblobs_pins WHERE pool = 'regress' ORDER BY key, owner;

-- Pinned entries survive a sweep; unpinned ones go (window zero).
SELECT alkblobs_unpin('regress', alkblobs_key('bravo'), 'node-a') AS unpinned;
SELECT examined, live, pinned, staged, executed, deleted, kept, bytes_freed, pins_reaped, remaining, aborted
  FROM alkblobs_sweep('regress');
SELECT alkblobs_get('regress', alkblobs_key('bravo')) IS NULL AS bravo_gone;
SELECT alkblobs_pin('regress', alkblobs_key('bravo'), 'node-c') AS pinned_missing;

-- Renewal extends only the owner's live pins.
SELECT alkblobs_renew('regress', 'node-a') AS renewed_a, alkblobs_renew('regress', 'nobody') AS renewed_nobody;
SELECT alkblobs_unpin_all('regress', 'node-a') AS dropped;

-- A liveness table protects what it names.
CREATE TABLE regress_live (key bytea PRIMARY KEY, note text);
SELECT alkblobs_register_liveness('regress', 'regress_live');
INSERT INTO regress_live VALUES (alkblobs_key('alpha'), 'kept by the index');
SELECT alkblobs_unpin('regress', alkblobs_key('alpha'), 'node-b') AS unpinned;
SELECT examined, live, pinned, staged, deleted FROM alkblobs_sweep('regress');
SELECT aspect, detail FROM alkblobs_explain('regress', alkblobs_key('alpha')) WHERE aspect IN ('liveness', 'verdict');
DELETE FROM regress_live;
SELECT examined, live, pinned, staged, deleted FROM alkblobs_sweep('regress', dry_run => true);
SELECT examined, staged, deleted FROM alkblobs_sweep('regress');
SELECT aspect, detail FROM alkblobs_explain('regress', alkblobs_key('alpha'));
SELECT pool, kv_entries, kv_bytes, pins, staged, liveness_tables FROM alkblobs_usage WHERE pool = 'regress';
SELECT alkblobs_unregister_liveness('regress', 'regress_live') AS unregistered;
SELECT count(*) AS guards_left FROM pg_trigger WHERE tgrelid = 'regress_live'::regclass AND tgname = 'alkblobs_liveness_guard';
ROLLBACK;
