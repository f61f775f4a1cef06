-- alkblobs 0.1.0 -> 0.2.0
--
-- The upgrade path's first link. Each released version gets a script
-- alkblobs--<from>--<to>.sql here; a released script is never edited again
-- (fixes go in the next one). 0.2.0 has not changed the schema yet, so this
-- script only records the step; `ALTER EXTENSION alkblobs UPDATE TO '0.2.0'`
-- is tested in tests/tests/pg_protocol.rs.
SELECT 1;
