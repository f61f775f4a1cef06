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
-- the definers run as alkblobs_owner: not a superuser, cannot log in, member
-- of nothing; it owns every definer function of the extension and its
-- tables, while the invoker functions belong to the installing superuser
SELECT rolsuper, rolcanlogin, rolcreaterole, rolcreatedb, rolbypassrls, rolreplication
  FROM pg_roles WHERE rolname = 'alkblobs_owner';
SELECT count(*) AS memberships FROM pg_auth_members m
  JOIN pg_roles r ON r.oid IN (m.roleid, m.member) WHERE r.rolname = 'alkblobs_owner';
SELECT r.rolname AS owner, p.prosecdef AS definer, count(*)
  FROM pg_proc p JOIN pg_depend d ON d.objid = p.oid AND d.deptype = 'e'
  JOIN pg_extension x ON x.oid = d.refobjid AND x.extname = 'alkblobs'
  JOIN pg_roles r ON r.oid = p.proowner
 GROUP BY 1, 2 ORDER BY 1, 2;
SELECT c.relname, r.rolname AS owner FROM pg_class c JOIN pg_roles r ON r.oid = c.relowner
 WHERE c.relnamespace = 'alkblobs'::regnamespace AND c.relkind = 'r' ORDER BY 1;
-- per-pool access: a writer without a grant on a pool cannot use it
CREATE ROLE regress_app LOGIN IN ROLE alkblobs_admin;
SET SESSION AUTHORIZATION regress_app;
SELECT alkblobs_create_pool('app');
SELECT pool, owner FROM alkblobs_pools ORDER BY 1;
SET SESSION AUTHORIZATION regress_writer;
SELECT pool FROM alkblobs_pools ORDER BY 1;
SELECT alkblobs_put('app', alkblobs_key('w'), 'w', 'writer-1');
RESET SESSION AUTHORIZATION;
SET SESSION AUTHORIZATION regress_app;
SELECT alkblobs_grant_pool('app', 'regress_writer', 'write');
SELECT pool, grantee, access FROM alkblobs_pool_grants ORDER BY 1, 2, 3;
SET SESSION AUTHORIZATION regress_writer;
SELECT alkblobs_put('app', alkblobs_key('w'), 'w', 'writer-1') AS created;
SELECT pool, role, owner FROM alkblobs_pins WHERE pool = 'app';
SELECT * FROM alkblobs_sweep('app');
RESET SESSION AUTHORIZATION;
ROLLBACK;
