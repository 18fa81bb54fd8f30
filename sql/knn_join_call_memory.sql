-- knn_join called once per row of a statement (in a target list, or
-- LATERAL through the Function Scan's tuplestore) leaves nothing of a call
-- in the statement's memory: after 500 calls and after 3000, the bytes in
-- use in its ExecutorState are the same, give or take a few bytes a call.
-- (The result type looked up from the catalog on each call left about
-- 0.8 kB a call there: 2 MB over these 2500 calls.)
SET knn_gpu.device = cpu;
CREATE TABLE cm (id integer, v vector);
INSERT INTO cm SELECT i, format('[%s,%s]', i % 5, i % 7)::vector FROM generate_series(1, 10) i;

-- The bytes in use in the memory of the statement running (the top-level
-- one: its ExecutorState is the one under PortalContext).
CREATE FUNCTION pg_temp.statement_bytes() RETURNS bigint LANGUAGE sql AS $$
  SELECT total_bytes - free_bytes FROM pg_backend_memory_contexts
  WHERE name = 'ExecutorState' AND parent = 'PortalContext' $$;

-- Each statement samples the bytes at its 500th and 3000th call
-- (OFFSET 0: g's filter stays above the calls).
SELECT (max(b) FILTER (WHERE g = 3000) - max(b) FILTER (WHERE g = 500)) / 2500 < 64 AS target_list_steady
FROM (SELECT g, pg_temp.statement_bytes() AS b FROM (
  SELECT g, (knn_join(format('SELECT id, v FROM cm WHERE id > %s', g % 3), 'SELECT id, v FROM cm', 1)).query_id AS x
  FROM generate_series(1, 3000) g OFFSET 0) s WHERE x = 4 AND g IN (500, 3000)) m;
SELECT (max(b) FILTER (WHERE g = 3000) - max(b) FILTER (WHERE g = 500)) / 2500 < 64 AS keyed_steady
FROM (SELECT g, pg_temp.statement_bytes() AS b FROM (
  SELECT g, (knn_join('SELECT id::text, v FROM cm', 'SELECT id::text, v FROM cm', 1, key => NULL::text)).query_id AS x
  FROM generate_series(1, 3000) g OFFSET 0) s WHERE x = '4' AND g IN (500, 3000)) m;
SELECT (max(b) FILTER (WHERE g = 3000) - max(b) FILTER (WHERE g = 500)) / 2500 < 64 AS range_join_steady
FROM (SELECT g, pg_temp.statement_bytes() AS b FROM (
  SELECT g, n.query_id AS x FROM generate_series(1, 3000) g,
    LATERAL knn_range_join(format('SELECT id, v FROM cm WHERE id > %s', g % 3), 'SELECT id, v FROM cm', 0.5) n
  OFFSET 0) s WHERE x = 4 AND g IN (500, 3000)) m;
SET knn_gpu.direct_return = off;
SELECT (max(b) FILTER (WHERE g = 3000) - max(b) FILTER (WHERE g = 500)) / 2500 < 64 AS tuplestore_steady
FROM (SELECT g, pg_temp.statement_bytes() AS b FROM (
  SELECT g, n.query_id AS x FROM generate_series(1, 3000) g,
    LATERAL knn_join(format('SELECT id, v FROM cm WHERE id > %s', g % 3), 'SELECT id, v FROM cm', 1) n
  OFFSET 0) s WHERE x = 4 AND g IN (500, 3000)) m;
RESET knn_gpu.direct_return;
-- the KNN Join Function node's own call (its memory is reset on each call)
SELECT (max(b) FILTER (WHERE g = 3000) - max(b) FILTER (WHERE g = 500)) / 2500 < 64 AS direct_steady
FROM (SELECT g, pg_temp.statement_bytes() AS b FROM (
  SELECT g, n.query_id AS x FROM generate_series(1, 3000) g,
    LATERAL knn_join(format('SELECT id, v FROM cm WHERE id > %s', g % 3), 'SELECT id, v FROM cm', 1) n
  OFFSET 0) s WHERE x = 4 AND g IN (500, 3000)) m;

-- The rows are still the calls' (the result type is the caller's: the
-- same columns as the catalog's).
SELECT count(*) AS rows, count(DISTINCT x) AS queries, min(pg_typeof(x)::text) AS key_type
FROM (SELECT (knn_join('SELECT id::text, v FROM cm', 'SELECT id::text, v FROM cm', 2, key => NULL::text)).query_id AS x
      FROM generate_series(1, 3)) s;
RESET knn_gpu.device;
DROP TABLE cm;
