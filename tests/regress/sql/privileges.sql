-- Roles get what they need and no more; internals are closed to writers.
BEGIN;
\set VERBOSITY sqlstate
\set ON_ERROR_ROLLBACK on
SELECT alkblobs_create_pool('priv', '0 seconds');
CREATE ROLE regress_writer LOGIN IN ROLE alkblobs_writer;
CREATE ROLE regress_nobody LOGIN;
SET ROLE regress_writer;
SELECT alkblobs_put('priv', alkblobs_key('w'), 'w', 'writer-1') AS created;
-- writers cannot sweep, create pools, touch internals or delete entries
SELECT * FROM alkblobs_sweep('priv');
SELECT alkblobs_create_pool('mine');
SELECT count(*) FROM alkblobs.entries;
DELETE FROM alkblobs.pins;
RESET ROLE;
SET ROLE regress_nobody;
SELECT alkblobs_get('priv', alkblobs_key('w'));
SELECT * FROM alkblobs_pins;
RESET ROLE;
-- PUBLIC can execute nothing of the extension but alkblobs_key
SELECT p.proname AS public_executable
  FROM pg_proc p JOIN pg_depend d ON d.objid = p.oid AND d.deptype = 'e'
  JOIN pg_extension x ON x.oid = d.refobjid AND x.extname = 'alkblobs'
 WHERE has_function_privilege('regress_nobody', p.oid, 'EXECUTE')
 ORDER BY 1;
GRANT alkblobs_sweeper TO regress_nobody;
SET ROLE regress_nobody;
SELECT examined, pinned, deleted FROM alkblobs_sweep('priv');
RESET ROLE;
-- no SECURITY DEFINER function without a pinned search_path
SELECT count(*) AS unpinned_definers
  FROM pg_proc p JOIN pg_depend d ON d.objid = p.oid AND d.deptype = 'e'
  JOIN pg_extension x ON x.oid = d.refobjid AND x.extname = 'alkblobs'
 WHERE p.prosecdef AND NOT EXISTS (SELECT 1 FROM unnest(p.proconfig) c WHERE c LIKE 'search_path=%');
SELECT count(*) AS definers
  FROM pg_proc p JOIN pg_depend d ON d.objid = p.oid AND d.deptype = 'e'
  JOIN pg_extension x ON x.oid = d.refobjid AND x.extname = 'alkblobs'
 WHERE p.prosecdef;
ROLLBACK;
