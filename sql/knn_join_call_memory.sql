-- knn_join called once per row of a statement (in a target list, or
-- LATERAL through the Function Scan's tuplestore), and the KNN Join node
-- rescanned once per row, leave nothing of a call in the statement's
-- memory: after 500 calls and after 3000, the bytes in use in its
-- ExecutorState are the same, give or take a few bytes a call. (knn_join's
-- result type looked up from the catalog on each call left about 0.65 kB
-- a call there, the node's catalog lookups about 0.2 kB a run.)
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

-- The KNN Join node rescanned once per outer row (a correlated subquery):
-- each run's catalog lookups (is the column's type a vector type, and its
-- distance function pgvector's?) leave nothing behind either.
SET enable_sort = off;  -- (10 rows: the subquery's own plan, a sort, would be cheaper)
EXPLAIN (COSTS OFF)
SELECT o.x, (SELECT count(*) FROM cm q CROSS JOIN LATERAL (
  SELECT t.id FROM cm t ORDER BY t.v <-> q.v LIMIT 2) n WHERE q.id <> o.x % 10) AS c
FROM generate_series(1, 3000) o(x);
SELECT (max(b) FILTER (WHERE x = 3000) - max(b) FILTER (WHERE x = 500)) / 2500 < 64 AS node_rescans_steady
FROM (SELECT x, pg_temp.statement_bytes() AS b FROM (
  SELECT o.x, (SELECT count(*) FROM cm q CROSS JOIN LATERAL (
    SELECT t.id FROM cm t ORDER BY t.v <-> q.v LIMIT 2) n WHERE q.id <> o.x % 10) AS c
  FROM generate_series(1, 3000) o(x) OFFSET 0) s WHERE x IN (500, 3000) AND c >= 0) m;
RESET enable_sort;
-- The rows are still the calls' (the result type is the caller's: the
-- same columns as the catalog's).
SELECT count(*) AS rows, count(DISTINCT x) AS queries, min(pg_typeof(x)::text) AS key_type
FROM (SELECT (knn_join('SELECT id::text, v FROM cm', 'SELECT id::text, v FROM cm', 2, key => NULL::text)).query_id AS x
      FROM generate_series(1, 3)) s;
RESET knn_gpu.device;
DROP TABLE cm;
