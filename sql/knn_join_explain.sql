-- EXPLAIN ANALYZE of a statement calling knn_join shows the engine's
-- statistics on the "KNN Join Function" node above the Function Scan, in
-- TEXT and JSON; the node changes no result (LATERAL calls, quals, joins).
SET knn_gpu.device = cpu;
CREATE TABLE ex (id integer, g integer, t text, v vector);
INSERT INTO ex SELECT i, i % 3, 'e' || i, format('[%s,%s]', i % 5, i % 7)::vector FROM generate_series(1, 40) i;

-- explained(statement): EXPLAIN ANALYZE's lines, the machine-dependent
-- values (the engine's device and variant) masked; no timing.
CREATE FUNCTION pg_temp.explained(statement text) RETURNS SETOF text LANGUAGE plpgsql AS $$
DECLARE
  line text;
BEGIN
  FOR line IN EXECUTE 'EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) ' || statement LOOP
    RETURN NEXT regexp_replace(line, '(Engine Device|Engine Variant): .*', '\1: (masked)');
  END LOOP;
END $$;
SELECT pg_temp.explained($$SELECT * FROM knn_join('SELECT id, v FROM ex', 'SELECT id, v FROM ex WHERE id <= 30', 3, method => 'brute')$$);
SELECT pg_temp.explained($$SELECT * FROM knn_join('SELECT t, v FROM ex', 'SELECT t, v FROM ex', 2, key => NULL::text, method => 'brute') WHERE distance > 0$$);
-- Calls that return before the engine runs (empty sets) show no statistics.
SELECT pg_temp.explained($$SELECT * FROM knn_join('SELECT id, v FROM ex WHERE false', 'SELECT id, v FROM ex', 3)$$);
-- Without ANALYZE, only the nodes.
EXPLAIN (COSTS OFF) SELECT * FROM knn_join('SELECT id, v FROM ex', 'SELECT id, v FROM ex', 3);

-- JSON: the statistics are properties of the node.
CREATE FUNCTION pg_temp.explained_json(statement text) RETURNS json LANGUAGE plpgsql AS $$
DECLARE
  plan json;
BEGIN
  EXECUTE 'EXPLAIN (ANALYZE, TIMING OFF, SUMMARY OFF, FORMAT JSON) ' || statement INTO plan;
  RETURN plan -> 0 -> 'Plan';
END $$;
SELECT p ->> 'Node Type' AS node, p ->> 'Custom Plan Provider' AS provider,
       p ->> 'Engine Method' AS method, p ->> 'Queries' AS queries, p ->> 'Targets' AS targets,
       p ->> 'Dimensions' AS dims, p ->> 'Distance Computations' AS computations, p ->> 'Pairs' AS pairs,
       p -> 'Engine Device' IS NOT NULL AS has_device, p ->> 'Actual Rows' AS actual_rows,
       p -> 'Plans' -> 0 ->> 'Node Type' AS child
FROM pg_temp.explained_json($$SELECT * FROM knn_join('SELECT id, v FROM ex', 'SELECT id, v FROM ex WHERE id <= 30', 3, method => 'brute')$$) p;
-- With timing, the phase times are there too (their values vary).
CREATE FUNCTION pg_temp.explained_json_timed(statement text) RETURNS json LANGUAGE plpgsql AS $$
DECLARE
  plan json;
BEGIN
  EXECUTE 'EXPLAIN (ANALYZE, FORMAT JSON) ' || statement INTO plan;
  RETURN plan -> 0 -> 'Plan';
END $$;
SELECT p -> 'Read Time' IS NOT NULL AS has_read_time, p -> 'Engine Time' IS NOT NULL AS has_engine_time
FROM pg_temp.explained_json_timed($$SELECT * FROM knn_join('SELECT id, v FROM ex', 'SELECT id, v FROM ex', 3)$$) p;

-- LATERAL calls, one per outer row: the node is rescanned with new
-- parameters each time and shows the number of engine calls and the sums
-- of their statistics (as PostgreSQL's figures cover every loop: 40
-- queries in all, 40 targets each time); the rows are those of the calls
-- one by one.
SELECT pg_temp.explained($$SELECT g.g, n.* FROM generate_series(0, 2) g(g),
  LATERAL knn_join(format('SELECT id, v FROM ex WHERE g = %s', g.g), 'SELECT id, v FROM ex', 2, method => 'brute') n$$);
-- Calls that differ: each method with its calls, the range of the
-- dimensions (ex3's vectors have 3); the counts are sums (JSON: numbers).
CREATE TABLE ex3 (id integer, v vector);
INSERT INTO ex3 SELECT i, format('[%s,%s,%s]', i % 5, i % 7, i % 3)::vector FROM generate_series(1, 20) i;
SELECT p ->> 'Engine Calls' AS calls, p ->> 'Engine Method' AS method, p ->> 'Dimensions' AS dims,
       p -> 'Queries' AS queries, p -> 'Targets' AS targets, p -> 'Pairs' AS pairs,
       p ->> 'Actual Loops' AS loops
FROM pg_temp.explained_json($$SELECT n.* FROM (VALUES ('ex', 'brute', 1), ('ex3', 'ti', 2), ('ex', 'brute', 3)) s(tbl, m, o),
  LATERAL knn_join(format('SELECT id, v FROM %I', s.tbl), format('SELECT id, v FROM %I WHERE id > %s', s.tbl, s.o), 2,
                   method => s.m) n$$) j, json_array_elements(j -> 'Plans') p
WHERE p ->> 'Custom Plan Provider' = 'KNN Join Function';
-- A call whose arguments do not change is not run again: one call, its
-- rows read on each loop.
SELECT pg_temp.explained($$SELECT g.g, n.* FROM generate_series(0, 2) g(g),
  LATERAL (SELECT * FROM knn_join('SELECT id, v FROM ex WHERE g = 1', 'SELECT id, v FROM ex', 2, method => 'brute') j
           WHERE j.query_id % 3 = g.g OFFSET 0) n$$);
DROP TABLE ex3;
SELECT count(*) AS differing FROM (
  (SELECT g.g, n.* FROM generate_series(0, 2) g(g),
     LATERAL knn_join(format('SELECT id, v FROM ex WHERE g = %s', g.g), 'SELECT id, v FROM ex', 2) n
   EXCEPT ALL
   (SELECT 0, * FROM knn_join('SELECT id, v FROM ex WHERE g = 0', 'SELECT id, v FROM ex', 2)
    UNION ALL SELECT 1, * FROM knn_join('SELECT id, v FROM ex WHERE g = 1', 'SELECT id, v FROM ex', 2)
    UNION ALL SELECT 2, * FROM knn_join('SELECT id, v FROM ex WHERE g = 2', 'SELECT id, v FROM ex', 2)))
  UNION ALL
  ((SELECT 0, * FROM knn_join('SELECT id, v FROM ex WHERE g = 0', 'SELECT id, v FROM ex', 2)
    UNION ALL SELECT 1, * FROM knn_join('SELECT id, v FROM ex WHERE g = 1', 'SELECT id, v FROM ex', 2)
    UNION ALL SELECT 2, * FROM knn_join('SELECT id, v FROM ex WHERE g = 2', 'SELECT id, v FROM ex', 2))
   EXCEPT ALL
   SELECT g.g, n.* FROM generate_series(0, 2) g(g),
     LATERAL knn_join(format('SELECT id, v FROM ex WHERE g = %s', g.g), 'SELECT id, v FROM ex', 2) n)) d;
-- The result joined to a table, and the function in a subquery.
SET knn_gpu.enable_knn_join = off;
SELECT (SELECT array_agg(ARRAY[n.query_id, e.id] ORDER BY n.query_id)
        FROM knn_join('SELECT id, v FROM ex', 'SELECT id, v FROM ex', 2, exclude_self => true) n
        JOIN ex e ON e.id = n.target_id WHERE n.rank = 1)
     = (SELECT array_agg(ARRAY[q.id, n.id]::bigint[] ORDER BY q.id) FROM ex q CROSS JOIN LATERAL (
          SELECT t.id FROM ex t WHERE t.id <> q.id ORDER BY t.v <-> q.v, t.id LIMIT 1) n) AS same_as_lateral;
RESET knn_gpu.enable_knn_join;
SELECT count(*) AS rows FROM (SELECT * FROM knn_join('SELECT id, v FROM ex', 'SELECT id, v FROM ex', 2) LIMIT 5) s;
-- A knn_join that a call's text runs in its target list is not that call: one engine call shown.
SELECT pg_temp.explained($$SELECT count(*) FROM knn_join(
  $q$SELECT (knn_join('SELECT id, v FROM ex WHERE id <= 3', 'SELECT id, v FROM ex', 1)).query_id, '[1,1]'::vector$q$,
  'SELECT id, v FROM ex', 2, method => 'brute')$$);
-- A function with ORDINALITY is left as it is.
EXPLAIN (COSTS OFF) SELECT * FROM knn_join('SELECT id, v FROM ex', 'SELECT id, v FROM ex', 3) WITH ORDINALITY;
RESET knn_gpu.device;
DROP TABLE ex;
