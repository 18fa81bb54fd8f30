-- knn_gpu.max_result_memory: knn_join's result arrays (|Q| x min(k, |T|) x
-- 16 bytes, k the caller's) are held at once only within the limit; a
-- larger join runs in batches of queries through the tuplestore and
-- returns the same rows in the same order.
SET knn_gpu.device = cpu;
CREATE TABLE rm (id integer, g integer, t text, v vector);
-- ties on purpose (few distinct values): their order must survive the batches
INSERT INTO rm SELECT i, i % 3, 'r' || i, format('[%s,%s]', i % 7, i % 11)::vector FROM generate_series(1, 300) i;

\i sql/same_under.psql
-- same(statement): whether 1 MB (300 x 300 x 16 bytes is 1.4 MB: batches) returns what 1 GB does.
CREATE FUNCTION pg_temp.same(statement text) RETURNS text LANGUAGE sql AS $$
  SELECT pg_temp.same_under(statement, 'knn_gpu.max_result_memory', '1024', '1') $$;

SELECT pg_temp.same($$SELECT * FROM knn_join('SELECT id, v FROM rm', 'SELECT id, v FROM rm', 300)$$) AS self_join;
SELECT pg_temp.same($$SELECT * FROM knn_join('SELECT id, v FROM rm', 'SELECT id, v FROM rm', 1000,
  exclude_self => true, metric => 'l1')$$) AS k_past_targets;
SELECT pg_temp.same($$SELECT * FROM knn_join('SELECT id, v, g FROM rm', 'SELECT id, v, g FROM rm', 300)$$) AS groups;
SELECT pg_temp.same($$SELECT * FROM knn_join('SELECT t, v FROM rm', 'SELECT t, v FROM rm WHERE id > 5', 300,
  key => NULL::text, exclude_self => true)$$) AS keyed;
SELECT pg_temp.same($$SELECT * FROM knn_join('SELECT id, v FROM rm WHERE g <> $1::integer', 'SELECT id, v FROM rm', 290,
  params => ARRAY['1'])$$) AS params;
SELECT pg_temp.same($$SELECT query_id, target_id FROM knn_join('SELECT id, v FROM rm', 'SELECT id, v FROM rm', 300)
  WHERE rank % 50 = 0$$) AS quals;
-- through the tuplestore as well (direct_return off), and in a target list
SET knn_gpu.direct_return = off;
SELECT pg_temp.same($$SELECT * FROM knn_join('SELECT id, v FROM rm', 'SELECT id, v FROM rm', 300)$$) AS stored;
RESET knn_gpu.direct_return;
SELECT pg_temp.same($$SELECT knn_join('SELECT id, v FROM rm', 'SELECT id, v FROM rm', 300)$$) AS target_list;
-- the packed form a coordinator calls, value per call and in FROM
SELECT pg_temp.same($$SELECT knn_join_packed('SELECT id, v FROM rm', 'SELECT id, v FROM rm', 300, 'l2', false, 'auto')$$) AS packed;
SELECT pg_temp.same($$SELECT * FROM knn_join_packed('SELECT id, v FROM rm', 'SELECT id, v FROM rm', 300, 'l2', false, 'auto')$$) AS packed_from;

-- the batched join's statistics are the whole join's
SET knn_gpu.max_result_memory = 1;
SELECT count(*) FROM knn_join('SELECT id, v FROM rm', 'SELECT id, v FROM rm', 300);
SELECT s->'queries' AS queries, s->'k' AS k, s->'distance_computations' AS computed
  FROM (SELECT knn_gpu_last_stats()::jsonb s) x;
RESET knn_gpu.max_result_memory;

-- The KNN Join node holds its result until the scan ends: past the limit
-- it ends with an error (54000) before allocating, not an OOM kill.
SET knn_gpu.max_result_memory = 1;
EXPLAIN (COSTS OFF) SELECT q.id, n.id FROM rm q
  CROSS JOIN LATERAL (SELECT t.id FROM rm t ORDER BY t.v <-> q.v LIMIT 300) n;
\set VERBOSITY sqlstate
SELECT count(*) FROM rm q CROSS JOIN LATERAL (SELECT t.id FROM rm t ORDER BY t.v <-> q.v LIMIT 300) n;
SELECT count(*) FROM rm q CROSS JOIN LATERAL (SELECT t.id FROM rm t WHERE t.g = q.g ORDER BY t.v <-> q.v LIMIT 300) n;
SELECT count(*) FROM rm q CROSS JOIN LATERAL (SELECT t.id FROM rm t WHERE t.v <-> q.v < 100 ORDER BY t.v <-> q.v) n;
SELECT count(*) FROM rm q CROSS JOIN LATERAL (SELECT t.id FROM rm t ORDER BY t.v <-> q.v FETCH FIRST 300 ROWS WITH TIES) n;
-- WITH TIES too before the engine runs (its first run takes LIMIT + 1
-- slots a query): an engine made to fail shows it did not run
SET knn_gpu.fault_injection = run;
SELECT count(*) FROM rm q CROSS JOIN LATERAL (SELECT t.id FROM rm t ORDER BY t.v <-> q.v FETCH FIRST 300 ROWS WITH TIES) n;
SELECT count(*) FROM rm q CROSS JOIN LATERAL (SELECT t.id FROM rm t WHERE t.g = q.g ORDER BY t.v <-> q.v FETCH FIRST 300 ROWS WITH TIES) n;
RESET knn_gpu.fault_injection;
\set VERBOSITY default
SELECT count(*) FROM rm q CROSS JOIN LATERAL (SELECT t.id FROM rm t ORDER BY t.v <-> q.v LIMIT 300) n;
-- within the limit, as before
SELECT count(*) FROM rm q CROSS JOIN LATERAL (SELECT t.id FROM rm t ORDER BY t.v <-> q.v LIMIT 200) n;
SELECT count(*) FROM rm q CROSS JOIN LATERAL (SELECT t.id FROM rm t WHERE t.v <-> q.v < 3 ORDER BY t.v <-> q.v) n;
RESET knn_gpu.max_result_memory;
SELECT count(*) FROM rm q CROSS JOIN LATERAL (SELECT t.id FROM rm t ORDER BY t.v <-> q.v LIMIT 300) n;

-- k is any user's; the limit is the administrator's
CREATE ROLE rm_user;
SET ROLE rm_user;
SET knn_gpu.max_result_memory = '100GB';
RESET ROLE;
DROP ROLE rm_user;
DROP TABLE rm;
