-- The "KNN Join Function" node returns knn_join's rows straight from the
-- engine's arrays (knn_gpu.direct_return, on by default): the same rows in
-- the same order, the same EXPLAIN ANALYZE, as through the Function Scan's
-- tuplestore (off), for each form, quals, target lists, LATERAL calls and
-- rescans.
SET knn_gpu.device = cpu;
CREATE TABLE dr (id integer, g integer, t text, v vector);
INSERT INTO dr SELECT i, i % 3, 'd' || i, format('[%s,%s]', i % 5, i % 7)::vector FROM generate_series(1, 60) i;

\i sql/same_under.psql
-- same(statement): the row count, and whether both paths return the same rows in the same order.
CREATE FUNCTION pg_temp.same(statement text) RETURNS text LANGUAGE sql AS $$
  SELECT pg_temp.same_under(statement, 'knn_gpu.direct_return', 'true', 'false') $$;

SELECT pg_temp.same($$SELECT * FROM knn_join('SELECT id, v FROM dr', 'SELECT id, v FROM dr', 4)$$) AS self_join;
SELECT pg_temp.same($$SELECT target_id * 2 AS twice, round(distance::numeric, 3), query_id
  FROM knn_join('SELECT id, v FROM dr WHERE g = 1', 'SELECT id, v FROM dr', 5, exclude_self => true)
  WHERE rank % 2 = 1 AND distance > 1$$) AS quals_and_expressions;
SELECT pg_temp.same($$SELECT * FROM knn_join('SELECT t, v FROM dr', 'SELECT t, v FROM dr WHERE id > 20', 3, key => NULL::text)$$) AS keyed;
SELECT pg_temp.same($$SELECT * FROM knn_join('SELECT id, v FROM dr WHERE g = $1::integer', 'SELECT id, v FROM dr', 2,
  params => ARRAY['2'], metric => 'l1')$$) AS params;
SELECT pg_temp.same($$SELECT d.id, j.* FROM dr d, LATERAL knn_join(format('SELECT id, v FROM dr WHERE id = %s', d.id),
  'SELECT id, v FROM dr', 2 + d.id % 3) j WHERE d.id <= 12$$) AS lateral_calls;
-- k beyond the targets, and an empty set
SELECT pg_temp.same($$SELECT * FROM knn_join('SELECT id, v FROM dr', 'SELECT id, v FROM dr WHERE id <= 3', 10)$$) AS all_targets;
SELECT pg_temp.same($$SELECT * FROM knn_join('SELECT id, v FROM dr WHERE false', 'SELECT id, v FROM dr', 3)$$) AS empty;
-- the inner side of a nested loop, rescanned without new parameters: one call, its rows read again
SET enable_hashjoin = off;
SET enable_mergejoin = off;
SET enable_material = off;
SELECT pg_temp.same($$SELECT a.x, j.target_id FROM (VALUES (1), (2), (7), (40)) a(x) LEFT JOIN
  knn_join('SELECT id, v FROM dr WHERE id < 10', 'SELECT id, v FROM dr', 2) j ON j.query_id = a.x$$) AS rescanned;

-- EXPLAIN ANALYZE reads the same on both paths (the Function Scan's rows, loops and filter counts).
CREATE FUNCTION pg_temp.explained(statement text, direct boolean) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
  line text;
  result text := '';
BEGIN
  PERFORM set_config('knn_gpu.direct_return', direct::text, true);
  FOR line IN EXECUTE 'EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) ' || statement LOOP
    result := result || regexp_replace(line, '(Engine Device|Engine Variant): .*', '\1: (masked)') || E'\n';
  END LOOP;
  RETURN result;
END $$;
SELECT pg_temp.explained(q, true) AS direct, pg_temp.explained(q, true) = pg_temp.explained(q, false) AS same_explain
FROM (VALUES ($$SELECT a.x, j.target_id FROM (VALUES (1), (2), (7)) a(x) LEFT JOIN
  knn_join('SELECT id, v FROM dr WHERE id < 10', 'SELECT id, v FROM dr', 2, method => 'brute') j ON j.query_id = a.x AND j.rank > 1$$),
  ($$SELECT d.id, j.target_id FROM dr d, LATERAL knn_join(format('SELECT id, v FROM dr WHERE id = %s', d.id),
  'SELECT id, v FROM dr', 3, method => 'brute') j WHERE d.id <= 4 AND j.distance > 0$$),
  -- a LATERAL value in the quals only, not in the arguments: one call, its rows read again
  ($$SELECT a.x, s.target_id FROM (VALUES (1), (2), (7)) a(x), LATERAL (SELECT * FROM
  knn_join('SELECT id, v FROM dr WHERE id < 10', 'SELECT id, v FROM dr', 2, method => 'brute') j
  WHERE j.query_id = a.x OFFSET 0) s$$)) s(q);
RESET enable_hashjoin;
RESET enable_mergejoin;
RESET enable_material;

-- knn_gpu_last_stats: the direct path measures the return too.
SELECT count(*) FROM knn_join('SELECT id, v FROM dr', 'SELECT id, v FROM dr', 3);
SELECT (knn_gpu_last_stats()::json->'seconds'->>'return')::float8 > 0 AS return_measured;
-- A LIMIT stops reading early; the rows read are the first ones of the other path.
SELECT pg_temp.same($$SELECT * FROM knn_join('SELECT id, v FROM dr', 'SELECT id, v FROM dr', 3) LIMIT 7$$) AS limited;

-- Errors are the call's, on both paths.
SELECT * FROM knn_join('SELECT id, v FROM dr', 'SELECT id, v FROM dr', 0);
SELECT * FROM knn_join('SELECT id FROM dr', 'SELECT id, v FROM dr', 3);
SELECT * FROM knn_join('SELECT id, v FROM dr', NULL, 3, 'l2', false, 'auto');
SET knn_gpu.direct_return = off;
SELECT * FROM knn_join('SELECT id, v FROM dr', 'SELECT id, v FROM dr', 0);
SELECT * FROM knn_join('SELECT id FROM dr', 'SELECT id, v FROM dr', 3);
SELECT * FROM knn_join('SELECT id, v FROM dr', NULL, 3, 'l2', false, 'auto');
RESET knn_gpu.direct_return;
-- knn_range_join keeps the tuplestore path; its rows are unchanged by the setting.
SELECT pg_temp.same($$SELECT * FROM knn_range_join('SELECT id, v FROM dr', 'SELECT id, v FROM dr', 1.5)$$) AS range_join;
DROP TABLE dr;
