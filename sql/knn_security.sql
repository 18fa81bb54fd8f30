--
-- Trust boundaries: what an ordinary user (no grants, only the right to
-- create objects in pg_temp and in a schema of their own) can do must never
-- crash the server, read past a value, or give wrong rows. Types, operators
-- and index access methods are recognised by catalog identity, not by name.
--
SET client_min_messages = warning;
DROP ROLE IF EXISTS knn_mallory;
RESET client_min_messages;
CREATE ROLE knn_mallory;
CREATE SCHEMA mallory AUTHORIZATION knn_mallory;
SELECT pg_backend_pid() AS backend_at_start \gset
SET ROLE knn_mallory;

\i sql/error_of.psql

-- 1. Types called "vector" that are not a vector type: a range (the reported
--    crash: its value was read with pgvector's layout), a composite, a
--    domain over bytea and an enum, in pg_temp and in the user's schema.
CREATE TYPE pg_temp.vector AS RANGE (subtype = text, collation = "C");
SELECT pg_temp.error_of($q$
  SELECT count(*) FROM knn_join('SELECT 1::bigint, pg_temp.vector(repeat(''a'', 20000), ''b'')',
                                'SELECT 1::bigint, pg_temp.vector(repeat(''a'', 20000), ''b'')', 1)$q$);
-- Such a type as the inner column of a LATERAL top-k query, ordered by an
-- operator called <->: PostgreSQL's plan.
CREATE TEMP TABLE ranges (id int, r pg_temp.vector);
INSERT INTO ranges SELECT i, pg_temp.vector(lpad(i::text, 3, '0'), 'z') FROM generate_series(1, 50) i;
CREATE FUNCTION pg_temp.range_gap(a pg_temp.vector, b pg_temp.vector) RETURNS float8
  LANGUAGE plpgsql IMMUTABLE AS 'BEGIN RETURN abs(lower(a)::int - lower(b)::int); END';
CREATE OPERATOR pg_temp.<-> (LEFTARG = pg_temp.vector, RIGHTARG = pg_temp.vector,
                             FUNCTION = pg_temp.range_gap);
EXPLAIN (COSTS OFF)
SELECT q.id, n.id FROM ranges q
CROSS JOIN LATERAL (SELECT t.id FROM ranges t ORDER BY t.r OPERATOR(pg_temp.<->) q.r LIMIT 2) n;

-- (pg_temp's types hide public's: the rest uses the real vector again.)
SET client_min_messages = warning;
DROP TYPE pg_temp.vector CASCADE;
RESET client_min_messages;
CREATE TYPE mallory.vector AS (dim smallint, unused smallint, x real);
SELECT pg_temp.error_of($q$
  SELECT count(*) FROM knn_join('SELECT 1, ROW(30000, 0, 1)::mallory.vector',
                                'SELECT 1, ROW(30000, 0, 1)::mallory.vector', 1)$q$);
DROP TYPE mallory.vector;
CREATE DOMAIN mallory.vector AS bytea;
SELECT pg_temp.error_of($q$
  SELECT count(*) FROM knn_join('SELECT 1, ''\x1000000030750000''::mallory.vector',
                                'SELECT 1, ''\x1000000030750000''::mallory.vector', 1)$q$);
DROP DOMAIN mallory.vector;
CREATE TYPE mallory.vector AS ENUM ('a');
SELECT pg_temp.error_of($q$
  SELECT count(*) FROM knn_join('SELECT 1, ''a''::mallory.vector', 'SELECT 1, ''a''::mallory.vector', 1)$q$);
DROP TYPE mallory.vector;
-- A domain over the real vector type is still a vector.
CREATE DOMAIN mallory.unit_vector AS vector;
SELECT query_id, target_id, distance FROM knn_join(
  'SELECT 1, ''[1,0]''::mallory.unit_vector', 'SELECT 2, ''[0,1]''::mallory.unit_vector', 1, 'l1');
DROP DOMAIN mallory.unit_vector;

-- 2. A user's operator called <-> over the real vector type (here L1, not
--    L2): PostgreSQL's plan and its results, never a KNN Join with metric l2.
-- (plpgsql: an SQL function would be inlined into the real <+> operator.)
CREATE FUNCTION mallory.taxicab(a vector, b vector) RETURNS float8
  LANGUAGE plpgsql IMMUTABLE AS 'BEGIN RETURN a <+> b; END';
CREATE OPERATOR mallory.<-> (LEFTARG = vector, RIGHTARG = vector, FUNCTION = mallory.taxicab,
                             COMMUTATOR = OPERATOR(mallory.<->));
CREATE TEMP TABLE pts (id int, v vector);
INSERT INTO pts SELECT i, format('[%s,%s]', (i * 7) % 23, (i * 11) % 19)::vector
  FROM generate_series(1, 60) i;
ANALYZE pts;
EXPLAIN (COSTS OFF)
SELECT q.id, n.id FROM pts q
CROSS JOIN LATERAL (SELECT t.id FROM pts t ORDER BY t.v OPERATOR(mallory.<->) q.v LIMIT 3) n;
-- The built-in operator, for contrast, is planned as the KNN Join.
EXPLAIN (COSTS OFF)
SELECT q.id, n.id FROM pts q
CROSS JOIN LATERAL (SELECT t.id FROM pts t ORDER BY t.v <-> q.v LIMIT 3) n;
-- With the user's operator the result is the user's (L1 distances), the same
-- with the KNN Join on and off.
CREATE TEMP TABLE with_node AS
SELECT q.id AS qid, n.d FROM pts q
CROSS JOIN LATERAL (SELECT t.v OPERATOR(mallory.<->) q.v AS d FROM pts t
                    ORDER BY t.v OPERATOR(mallory.<->) q.v LIMIT 3) n;
SET knn_gpu.enable_knn_join = off;
CREATE TEMP TABLE without_node AS
SELECT q.id AS qid, n.d FROM pts q
CROSS JOIN LATERAL (SELECT t.v OPERATOR(mallory.<->) q.v AS d FROM pts t
                    ORDER BY t.v OPERATOR(mallory.<->) q.v LIMIT 3) n;
RESET knn_gpu.enable_knn_join;
SELECT (SELECT count(*) FROM (TABLE with_node EXCEPT ALL TABLE without_node) x) AS differing,
       (SELECT count(*) FROM with_node) AS rows,
       (SELECT count(*) FROM pts q
         WHERE (SELECT min(d) FROM with_node w WHERE w.qid = q.id)
               <> (SELECT min(t.v <+> q.v) FROM pts t)) AS not_l1,
       (SELECT count(*) FROM pts q
         WHERE (SELECT max(d) FROM with_node w WHERE w.qid = q.id)
               <> (SELECT max(d) FROM (SELECT t.v <-> q.v AS d FROM pts t ORDER BY 1 LIMIT 3) x)) > 0
         AS differs_from_l2;

-- 3. Query texts must be plain SELECTs; arguments must not be NULL; limits
--    are those of the type; messages quote a short prefix of user input.
CREATE TEMP TABLE e (id bigint, v vector);
INSERT INTO e VALUES (1, '[1,2]'), (2, '[3,4]');
SELECT pg_temp.error_of($q$SELECT * FROM knn_join('WITH d AS (DELETE FROM e RETURNING id, v) SELECT id, v FROM d', 'SELECT id, v FROM e', 1)$q$);
SELECT pg_temp.error_of($q$SELECT * FROM knn_join('SELECT id, v FROM e FOR UPDATE', 'SELECT id, v FROM e', 1)$q$);
SELECT pg_temp.error_of($q$SELECT * FROM knn_join('SELECT id, v INTO TEMP stolen FROM e', 'SELECT id, v FROM e', 1)$q$);
SELECT pg_temp.error_of($q$SELECT * FROM knn_join('SELECT id, v FROM e; SELECT id, v FROM e', 'SELECT id, v FROM e', 1)$q$);
SELECT pg_temp.error_of($q$SELECT * FROM knn_join('DELETE FROM e RETURNING id, v', 'SELECT id, v FROM e', 1)$q$);
SELECT count(*) AS rows_left FROM e;
SELECT pg_temp.error_of($q$SELECT * FROM knn_join(NULL, 'SELECT id, v FROM e', 1)$q$);
SELECT pg_temp.error_of($q$SELECT * FROM knn_join('SELECT id, v FROM e', NULL, 1)$q$);
SELECT pg_temp.error_of($q$SELECT * FROM knn_join('SELECT id, v FROM e', 'SELECT id, v FROM e', NULL)$q$);
SELECT pg_temp.error_of($q$SELECT * FROM knn_join('SELECT id, v FROM e', 'SELECT id, v FROM e', 1, NULL)$q$);
SELECT pg_temp.error_of($q$SELECT * FROM knn_join('SELECT id, v FROM e', 'SELECT id, v FROM e', 1, exclude_self => NULL)$q$);
SELECT pg_temp.error_of($q$SELECT * FROM knn_join('SELECT id, v FROM e', 'SELECT id, v FROM e', 1, method => NULL)$q$);
SELECT length(pg_temp.error_of(format($q$SELECT * FROM knn_join('SELECT id, v FROM e', 'SELECT id, v FROM e', 1, %L)$q$,
                                      repeat('x', 100000)))) < 100 AS short_message;
SELECT pg_temp.error_of($q$SELECT * FROM knn_join('SELECT id, v FROM e', 'SELECT id, v FROM e', 1, 'l2' || repeat('!', 50))$q$);
SELECT pg_temp.error_of($q$SELECT * FROM knn_join('SELECT 1, array_fill(1::real, ARRAY[16001])', 'SELECT 1, array_fill(1::real, ARRAY[16001])', 1)$q$);
SELECT count(*) FROM knn_join('SELECT 1, array_fill(1::real, ARRAY[16000])', 'SELECT 1, array_fill(1::real, ARRAY[16000])', 1);
SELECT pg_temp.error_of($q$SET knn_gpu.threads = 4096$q$);
SELECT pg_temp.error_of($q$SET knn_gpu.threads = 257$q$);
SET knn_gpu.threads = 256;
SELECT count(*) FROM knn_join('SELECT id, v FROM e', 'SELECT id, v FROM e', 1);
-- ... but a job runs on at most the server's cores (as with 0): 256 threads
-- on a small server made a cancel wait seconds for them and multiplied the
-- engine's per-thread memory.
SET knn_gpu.device = cpu;
SELECT count(*) FROM knn_join('SELECT id, v FROM e', 'SELECT id, v FROM e', 1);
SELECT substring(knn_gpu_last_stats()->>'device' FROM '^cpu \((\d+) thread') AS threads_256 \gset
RESET knn_gpu.threads;
SELECT count(*) FROM knn_join('SELECT id, v FROM e', 'SELECT id, v FROM e', 1);
SELECT substring(knn_gpu_last_stats()->>'device' FROM '^cpu \((\d+) thread') = :'threads_256'
       AS at_most_the_cores;
RESET knn_gpu.device;
-- The fault-injection setting is for superusers only.
SELECT pg_temp.error_of($q$SET knn_gpu.fault_injection = 'run'$q$);

-- 4. An engine entry that throws becomes an ERROR; the backend survives and
--    the next join works. (Set by a superuser, run by the user.)
RESET ROLE;
DO $$
DECLARE
  fault text;
BEGIN
  FOREACH fault IN ARRAY ARRAY['start', 'run', 'bad_alloc', 'finish'] LOOP
    PERFORM set_config('knn_gpu.fault_injection', fault, false);
    SET ROLE knn_mallory;
    RAISE NOTICE '%: %', fault, pg_temp.error_of(
      $q$SELECT count(*) FROM knn_join('SELECT id, v FROM e', 'SELECT id, v FROM e', 1)$q$);
    RESET ROLE;
  END LOOP;
END $$;
SET ROLE knn_mallory;
-- The KNN Join node goes through the same wall.
SELECT pg_temp.error_of($q$SELECT count(*) FROM pts q CROSS JOIN LATERAL (SELECT t.id FROM pts t ORDER BY t.v <-> q.v LIMIT 3) n$q$);
RESET ROLE;
RESET knn_gpu.fault_injection;
SET ROLE knn_mallory;
SELECT query_id, target_id, rank FROM knn_join('SELECT id, v FROM e', 'SELECT id, v FROM e', 1);
SELECT pg_backend_pid() = :backend_at_start AS same_backend, count(*) AS rows
FROM pts q CROSS JOIN LATERAL (SELECT t.id FROM pts t ORDER BY t.v <-> q.v LIMIT 3) n;

-- 5. knn_join's row estimate plans its texts: a text over a table or a
--    column the user may not read gets the default (1000), not the
--    planner's estimate from its statistics, which told the exact number of
--    rows of a value (here 137 rows of salary 9000) to a user whom
--    PostgreSQL's EXPLAIN refuses and pg_stats shows nothing of.
RESET ROLE;
CREATE TABLE knn_payroll (id int, v vector(2), salary int);
INSERT INTO knn_payroll SELECT i, '[1,1]', CASE WHEN i <= 137 THEN 9000 ELSE 100 END
  FROM generate_series(1, 10000) i;
ANALYZE knn_payroll;
GRANT SELECT (id, v) ON knn_payroll TO knn_mallory;
SET ROLE knn_mallory;
CREATE FUNCTION pg_temp.estimated_rows(statement text) RETURNS float8 LANGUAGE plpgsql AS $$
DECLARE
  plan json;
BEGIN
  EXECUTE 'EXPLAIN (FORMAT JSON) ' || statement INTO plan;
  RETURN (plan->0->'Plan'->>'Plan Rows')::float8;
END $$;
SELECT pg_temp.error_of('EXPLAIN SELECT id FROM knn_payroll WHERE salary = 9000');
SELECT pg_temp.estimated_rows($q$SELECT * FROM knn_join('SELECT id, v FROM knn_payroll WHERE salary = 9000',
                                                      'SELECT 1, ''[1,1]''::vector', 1)$q$) AS unreadable_column,
       pg_temp.estimated_rows($q$SELECT * FROM knn_join('SELECT 1, ''[1,1]''::vector',
                                                      'SELECT id, v FROM knn_payroll WHERE salary = 9000', 1000)$q$) AS unreadable_target_column,
       pg_temp.estimated_rows($q$SELECT * FROM knn_join('SELECT id, v FROM knn_payroll WHERE id <= 137',
                                                      'SELECT 1, ''[1,1]''::vector', 1)$q$) AS readable_columns;
SELECT pg_temp.error_of($q$SELECT count(*) FROM knn_join('SELECT id, v FROM knn_payroll WHERE salary = 9000',
                                                        'SELECT 1, ''[1,1]''::vector', 1)$q$);

RESET ROLE;
DROP TABLE knn_payroll;

-- 6. What a role's joins leave behind in the backend is not shown to
--    another role (after SET ROLE, the caller of a SECURITY DEFINER
--    function, a pooler's next client): knn_gpu_last_stats() (row counts,
--    times, methods) answers as if no join had run, as pg_stat_activity
--    hides another role's query, except to a role with the privileges of
--    the join's (a superuser) or of pg_read_all_stats. Held targets are
--    only their reader's to take, so only its to count.
--    (knn_gpu_last_shard_stats(), with the shards' remote SQL: shard_test.sh.)
SET client_min_messages = warning;
DROP ROLE IF EXISTS knn_monitor;
RESET client_min_messages;
CREATE TABLE knn_secret_rows (id int, v vector(2));
INSERT INTO knn_secret_rows SELECT i, format('[%s,%s]', i % 5, i % 3)::vector FROM generate_series(1, 37) i;
CREATE ROLE knn_monitor IN ROLE pg_read_all_stats;
SELECT count(*) AS pairs FROM knn_join('SELECT id, v FROM knn_secret_rows', 'SELECT id, v FROM knn_secret_rows', 1);
SELECT knn_gpu_last_stats()->>'queries' AS own_queries;
SET ROLE knn_mallory;
SELECT knn_gpu_last_stats() IS NULL AS another_roles_stats_hidden;
SET ROLE knn_monitor;
SELECT knn_gpu_last_stats()->>'queries' AS shown_to_pg_read_all_stats;
RESET ROLE;
SELECT knn_gpu_last_stats()->>'queries' AS own_again;
-- an ordinary role's join: its own to see, and a superuser's
SET ROLE knn_mallory;
SELECT count(*) AS pairs FROM knn_join('SELECT 1, ''[1,1]''::vector', 'SELECT 2, ''[2,2]''::vector', 1);
SELECT knn_gpu_last_stats()->>'queries' AS own_queries;
RESET ROLE;
SELECT knn_gpu_last_stats()->>'queries' AS shown_to_a_superuser;
-- a SECURITY DEFINER function's join is its owner's, not its caller's
CREATE FUNCTION knn_secret_pairs() RETURNS bigint LANGUAGE sql SECURITY DEFINER AS
  $$ SELECT count(*) FROM knn_join('SELECT id, v FROM knn_secret_rows', 'SELECT id, v FROM knn_secret_rows', 2) $$;
GRANT EXECUTE ON FUNCTION knn_secret_pairs() TO knn_mallory;
SET ROLE knn_mallory;
SELECT knn_secret_pairs() AS pairs;
SELECT knn_gpu_last_stats() IS NULL AS the_definers_stats_hidden;
RESET ROLE;
SELECT knn_gpu_last_stats()->>'k' AS the_definers_k;
-- held targets: another role's count as none (-1), a superuser's too
BEGIN;
SELECT targets_read FROM knn_shard_prefetch_targets(1, 'vector', 'SELECT id, v FROM knn_secret_rows');
SELECT knn_shard_held_targets() AS own_held;
SET LOCAL ROLE knn_mallory;
SELECT knn_shard_held_targets() AS another_roles_held;
RESET ROLE;
SELECT knn_shard_held_targets() AS own_held_again;
ROLLBACK;
BEGIN;
SET LOCAL ROLE knn_mallory;
SELECT targets_read FROM knn_shard_prefetch_targets(1, 'vector', 'SELECT 1, ''[1,1]''::vector');
RESET ROLE;
SELECT knn_shard_held_targets() AS held_by_an_ordinary_role;
ROLLBACK;
DROP FUNCTION knn_secret_pairs();
DROP TABLE knn_secret_rows;
DROP ROLE knn_monitor;

DROP OWNED BY knn_mallory;
DROP ROLE knn_mallory;
