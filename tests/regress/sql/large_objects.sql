-- The pg-lo tier: chunked upload, verification, dedup, ranged reads, sweep.
BEGIN;
\set VERBOSITY sqlstate
\set ON_ERROR_ROLLBACK on
SELECT alkblobs_create_pool('lo', '0 seconds');
CREATE TEMP TABLE content AS SELECT decode(repeat('00112233445566778899aabbccddeeff', 40000), 'hex') AS bytes;
SELECT length(bytes) AS size FROM content;
-- upload in three chunks
SELECT alkblobs_lo_create('lo') AS loid \gset
SELECT alkblobs_lo_write(:loid, 0, substring(bytes FROM 1 FOR 300000)) FROM content;
SELECT alkblobs_lo_write(:loid, 300000, substring(bytes FROM 300001 FOR 300000)) FROM content;
SELECT alkblobs_lo_write(:loid, 600000, substring(bytes FROM 600001)) FROM content;
SELECT alkblobs_lo_commit('lo', alkblobs_key(bytes), :loid, 'node-a') AS created FROM content;
SELECT size, tier FROM alkblobs_stat('lo', (SELECT alkblobs_key(bytes) FROM content));
-- ranged reads at the edges
SELECT encode(alkblobs_lo_read('lo', alkblobs_key(bytes), 0, 4), 'hex') AS head FROM content;
SELECT encode(alkblobs_lo_read('lo', alkblobs_key(bytes), 639998, 10), 'hex') AS tail FROM content;
SELECT length(alkblobs_lo_read('lo', alkblobs_key(bytes), 640000, 10)) AS past_end FROM content;
SELECT alkblobs_lo_read('lo', alkblobs_key('absent'), 0, 10) IS NULL AS absent;
-- a second upload of the same content unlinks its own object
SELECT count(*) AS objects_before FROM pg_largeobject_metadata \gset
SELECT alkblobs_lo_create('lo') AS loid2 \gset
SELECT alkblobs_lo_write(:loid2, 0, bytes) FROM content;
SELECT alkblobs_lo_commit('lo', alkblobs_key(bytes), :loid2, 'node-b') AS created FROM content;
SELECT count(*) - :objects_before AS new_objects FROM pg_largeobject_metadata;
-- a mismatching upload is refused (AB001)
SELECT alkblobs_lo_create('lo') AS loid3 \gset
SELECT alkblobs_lo_write(:loid3, 0, '\xdeadbeef');
SELECT alkblobs_lo_commit('lo', alkblobs_key('something else'), :loid3, 'node-a');
ROLLBACK;
BEGIN;
\set VERBOSITY sqlstate
\set ON_ERROR_ROLLBACK on
SELECT alkblobs_create_pool('lo2', '0 seconds');
SELECT alkblobs_lo_create('lo2') AS loid \gset
SELECT alkblobs_lo_write(:loid, 0, '\x0102030405');
SELECT alkblobs_lo_commit('lo2', alkblobs_key('\x0102030405'), :loid, 'node-a');
SELECT count(*) AS objects_before FROM pg_largeobject_metadata \gset
-- unpinned, the sweep unlinks the object with its row
SELECT alkblobs_unpin('lo2', alkblobs_key('\x0102030405'), 'node-a');
SELECT examined, staged, deleted, bytes_freed FROM alkblobs_sweep('lo2');
SELECT :objects_before - count(*) AS unlinked FROM pg_largeobject_metadata;
ROLLBACK;
