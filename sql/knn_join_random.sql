-- knn_join against the pgvector-style LATERAL query over generated data:
-- identical neighbour sets, ranks and distances, for every metric, with
-- duplicate points (ties) and a query set different from the target set.
SELECT setseed(0.42);
CREATE TABLE rq AS
SELECT i AS id, array_agg(round((random() * 4)::numeric, 1)::real ORDER BY j)::vector(6) AS v
FROM generate_series(1, 150) i, generate_series(1, 6) j GROUP BY i;
CREATE TABLE rt AS
SELECT i AS id, array_agg(round((random() * 4)::numeric, 1)::real ORDER BY j)::vector(6) AS v
FROM generate_series(1, 900) i, generate_series(1, 6) j GROUP BY i;
-- Duplicate points: every target 1..100 appears again as 1001..1100.
INSERT INTO rt SELECT id + 1000, v FROM rt WHERE id <= 100;
-- And coarse one-dimensional data, where ties are everywhere.
CREATE TABLE r1 AS SELECT i AS id, ARRAY[(i % 7)::real]::vector(1) AS v FROM generate_series(1, 300) i;

-- PostgreSQL's own nested loop is the reference, ranks numbered by (distance, id).
SET knn_gpu.enable_knn_join = off;
CREATE FUNCTION lateral_knn(queries regclass, targets regclass, k int, op text)
RETURNS TABLE (query_id bigint, target_id bigint, rank int, distance float8)
LANGUAGE plpgsql AS $$
BEGIN
  RETURN QUERY EXECUTE format(
    'SELECT q.id::bigint, n.id::bigint, (row_number() OVER (PARTITION BY q.id ORDER BY n.dist, n.id))::int, n.dist
     FROM %s q CROSS JOIN LATERAL (
       SELECT t.id, t.v %s q.v AS dist FROM %s t ORDER BY t.v %s q.v, t.id LIMIT %s) n',
    queries, op, targets, op, k);
END $$;

-- Rows in either result but not the other (EXCEPT ALL both ways) and the row count.
CREATE FUNCTION compare_knn(queries regclass, targets regclass, k int, metric text, op text)
RETURNS TABLE (metric_name text, k_used int, differing bigint, rows_compared bigint)
LANGUAGE sql AS $$
  WITH a AS (SELECT * FROM knn_join(format('SELECT id, v FROM %s', queries),
                                    format('SELECT id, v FROM %s', targets), k, metric)),
       b AS (SELECT * FROM lateral_knn(queries, targets, k, op))
  SELECT metric, k,
         (SELECT count(*) FROM ((SELECT * FROM a EXCEPT ALL SELECT * FROM b)
                                UNION ALL (SELECT * FROM b EXCEPT ALL SELECT * FROM a)) d),
         (SELECT count(*) FROM a)
$$;

SELECT * FROM compare_knn('rq', 'rt', 7, 'l2', '<->');
SELECT * FROM compare_knn('rq', 'rt', 7, 'cosine', '<=>');
SELECT * FROM compare_knn('rq', 'rt', 7, 'ip', '<#>');
SELECT * FROM compare_knn('rq', 'rt', 7, 'l1', '<+>');
SELECT * FROM compare_knn('rt', 'rt', 25, 'l2', '<->');
SELECT * FROM compare_knn('r1', 'r1', 40, 'l2', '<->');
SELECT * FROM compare_knn('r1', 'r1', 40, 'l1', '<+>');
