-- Bad input raises a deliberate SQLSTATE and changes nothing.
BEGIN;
\set VERBOSITY sqlstate
\set ON_ERROR_ROLLBACK on
SELECT alkblobs_create_pool('errors', '1 minute');
-- wrong key length (22023), NULL key (22004)
SELECT alkblobs_put('errors', '\x0102', 'x', 'node');
SELECT alkblobs_pin('errors', NULL, 'node');
-- hash mismatch (AB001)
SELECT alkblobs_put('errors', alkblobs_key('right'), 'wrong', 'node');
-- unknown pool (42704)
SELECT alkblobs_get('no-such-pool', alkblobs_key('x'));
SELECT * FROM alkblobs_sweep('no-such-pool');
-- negative window, zero TTL, bad tier, bad name (22023); duplicate (42710)
SELECT alkblobs_create_pool('neg', '-1 second');
SELECT alkblobs_create_pool('ttl', '1 minute', '0 seconds');
SELECT alkblobs_create_pool('tier', '1 minute', '1 minute', 'ftp');
SELECT alkblobs_create_pool('bad name; drop table x', '1 minute');
SELECT alkblobs_create_pool('errors');
-- bad owners (22023, 22004)
SELECT alkblobs_put('errors', alkblobs_key('v'), 'v', '');
SELECT alkblobs_renew('errors', NULL);
-- liveness registration: not a table (42809), no key column (42703),
-- key not bytea (42804), a temporary table (42809), unknown table (42P01)
CREATE VIEW errors_view AS SELECT '\x00'::bytea AS key;
SELECT alkblobs_register_liveness('errors', 'errors_view');
CREATE TABLE errors_nokey (id int);
SELECT alkblobs_register_liveness('errors', 'errors_nokey');
CREATE TABLE errors_textkey (key text);
SELECT alkblobs_register_liveness('errors', 'errors_textkey');
CREATE TEMP TABLE errors_temp (key bytea);
SELECT alkblobs_register_liveness('errors', 'errors_temp');
SELECT alkblobs_register_liveness('errors', 'no_such_table');
-- a table name cannot smuggle SQL: regclass refuses it before we run
SELECT alkblobs_register_liveness('errors', 'errors_nokey; DROP TABLE errors_nokey');
-- shapes the guard cannot cover are refused (42809): INHERITS children,
-- row-level security, rules; a domain over bytea is not bytea (42804)
CREATE TABLE errors_parent (key bytea);
CREATE TABLE errors_child () INHERITS (errors_parent);
SELECT alkblobs_register_liveness('errors', 'errors_parent');
CREATE TABLE errors_rls (key bytea);
ALTER TABLE errors_rls ENABLE ROW LEVEL SECURITY;
SELECT alkblobs_register_liveness('errors', 'errors_rls');
CREATE TABLE errors_rule (key bytea);
CREATE RULE errors_rule_nothing AS ON INSERT TO errors_rule DO INSTEAD NOTHING;
SELECT alkblobs_register_liveness('errors', 'errors_rule');
CREATE DOMAIN errors_dom AS bytea;
CREATE TABLE errors_domkey (key errors_dom);
SELECT alkblobs_register_liveness('errors', 'errors_domkey');
-- ...while generated keys and partitioned tables are fine
CREATE TABLE errors_gen (hex text, key bytea GENERATED ALWAYS AS (decode(hex, 'hex')) STORED);
SELECT alkblobs_register_liveness('errors', 'errors_gen', forward_references => true);
CREATE TABLE errors_part (key bytea, n int) PARTITION BY RANGE (n);
CREATE TABLE errors_part_1 PARTITION OF errors_part FOR VALUES FROM (0) TO (10);
SELECT alkblobs_register_liveness('errors', 'errors_part');
INSERT INTO errors_part VALUES (alkblobs_key('not put'), 1);
SELECT tgname, tgrelid::regclass FROM pg_trigger WHERE tgname = 'alkblobs_liveness_guard'
   AND tgrelid IN ('errors_gen'::regclass, 'errors_part'::regclass, 'errors_part_1'::regclass) ORDER BY 2;
-- bounds and NULLs (22023, 22004)
SELECT alkblobs_create_pool('huge', '300000 years');
SELECT alkblobs_alter_pool('errors', pin_ttl => '8 days');
SELECT alkblobs_unregister_liveness('errors', NULL);
SELECT alkblobs_unpin('errors', alkblobs_key('x'), NULL);
SELECT * FROM alkblobs_sweep('errors', max_unlinks => NULL);
CALL alkblobs_sweep_all('errors', 0);
-- large-object misuse (22023)
SELECT alkblobs_lo_write(12345, 0, '\x00');
SELECT alkblobs_lo_create(NULL);
SELECT alkblobs_lo_read('errors', alkblobs_key('x'), -1, 10);
-- stage with a bad key (22023)
SELECT alkblobs_stage('errors', ARRAY['\x01'::bytea]);
-- nothing changed
SELECT count(*) AS pools FROM alkblobs_pools WHERE pool IN ('neg', 'ttl', 'tier', 'errors');
SELECT kv_entries, pins, staged, liveness_tables FROM alkblobs_usage WHERE pool = 'errors';
ROLLBACK;
