-- knn_join with a group key (a third column in each query text): each
-- query is joined only with the targets of an equal key. Compared with
-- PostgreSQL's own LATERAL plan (WHERE t.g = q.g) and with one knn_join
-- call per group, for every metric, k below and above the group sizes,
-- ties and duplicates, groups on one side only, NULL keys, several key
-- types, halfvec and bit rows, the self-join and exclude_self.
\i sql/error_of.psql
SET knn_gpu.enable_knn_join = off;
SELECT setseed(0.17);

-- Coarse values (many ties and duplicate points), no zero vector (cosine).
CREATE TABLE gq AS
SELECT i AS id, array_agg((1 + floor(random() * 4))::real ORDER BY j)::vector(3) AS v,
       (ARRAY['a', 'b', 'c', 'q-only', NULL])[1 + i % 5] AS g
FROM generate_series(1, 250) i, generate_series(1, 3) j GROUP BY i;
CREATE TABLE gt AS
SELECT i AS id, array_agg((1 + floor(random() * 4))::real ORDER BY j)::vector(3) AS v,
       (ARRAY['a', 'b', 'b', 'c', 't-only', NULL, 'a'])[1 + i % 7] AS g
FROM generate_series(1, 700) i, generate_series(1, 3) j GROUP BY i;
-- a small group (fewer targets than k), rows without a vector
INSERT INTO gq VALUES (1001, '[1,1,1]', 'small'), (1002, NULL, 'a');
INSERT INTO gt VALUES (2001, '[2,2,2]', 'small'), (2002, '[1,1,2]', 'small'), (2003, NULL, 'a');

-- PostgreSQL's plan, ranks by (distance, id); NULL keys match nothing.
CREATE FUNCTION pg_temp.lateral_group(qtab text, ttab text, k int, op text, excl boolean)
RETURNS TABLE (query_id bigint, target_id bigint, rank int, distance float8)
LANGUAGE plpgsql AS $$
BEGIN
  RETURN QUERY EXECUTE format(
    'SELECT q.id::bigint, n.id::bigint, (row_number() OVER (PARTITION BY q.id ORDER BY n.dist, n.id))::int, n.dist
     FROM %s q CROSS JOIN LATERAL (
       SELECT t.id, t.v %s q.v AS dist FROM %s t
       WHERE t.g = q.g AND t.v IS NOT NULL %s
       ORDER BY t.v %s q.v, t.id LIMIT %s) n
     WHERE q.v IS NOT NULL',
    qtab, op, ttab, CASE WHEN excl THEN 'AND t.id <> q.id' ELSE '' END, op, k);
END $$;

-- One knn_join per distinct key of the queries (a composite key with a
-- NULL field is a key: NOT (g IS NULL)).
CREATE FUNCTION pg_temp.per_group(qtab text, ttab text, k int, metric text, excl boolean)
RETURNS TABLE (query_id bigint, target_id bigint, rank int, distance float8)
LANGUAGE plpgsql AS $$
DECLARE
  key text;
  typ text;
BEGIN
  FOR key, typ IN EXECUTE format(
      'SELECT DISTINCT ON (g) g::text, pg_typeof(g)::text FROM %s WHERE NOT (g IS NULL)', qtab) LOOP
    RETURN QUERY SELECT * FROM knn_join(
      format('SELECT id, v FROM %s WHERE g = %L::%s', qtab, key, typ),
      format('SELECT id, v FROM %s WHERE g = %L::%s', ttab, key, typ), k, metric, excl);
  END LOOP;
END $$;

-- Row counts and the rows in one result but not the other (both ways).
CREATE FUNCTION pg_temp.compare_group(qtab text, ttab text, k int, metric text, op text,
                                      excl boolean DEFAULT false)
RETURNS TABLE (rows_knn bigint, rows_pg bigint, differ_pg bigint, differ_per_group bigint)
LANGUAGE plpgsql AS $$
BEGIN
  CREATE TEMP TABLE knn_res AS SELECT * FROM knn_join(
    format('SELECT id, v, g FROM %s', qtab), format('SELECT id, v, g FROM %s', ttab),
    k, metric, excl);
  CREATE TEMP TABLE pg_res AS SELECT * FROM pg_temp.lateral_group(qtab, ttab, k, op, excl);
  CREATE TEMP TABLE pg_per AS SELECT * FROM pg_temp.per_group(qtab, ttab, k, metric, excl);
  RETURN QUERY SELECT
    (SELECT count(*) FROM knn_res), (SELECT count(*) FROM pg_res),
    (SELECT count(*) FROM ((TABLE knn_res EXCEPT ALL TABLE pg_res)
                           UNION ALL (TABLE pg_res EXCEPT ALL TABLE knn_res)) d),
    (SELECT count(*) FROM ((TABLE knn_res EXCEPT ALL TABLE pg_per)
                           UNION ALL (TABLE pg_per EXCEPT ALL TABLE knn_res)) d);
  DROP TABLE knn_res, pg_res, pg_per;
END $$;

-- every metric, k = 1, 4 and past every group's size
SELECT m.metric, k, c.*
FROM (VALUES ('l2', '<->'), ('cosine', '<=>'), ('ip', '<#>'), ('l1', '<+>')) m(metric, op),
     (VALUES (1), (4), (300)) ks(k),
     LATERAL pg_temp.compare_group('gq', 'gt', k, m.metric, m.op) c
ORDER BY 1, 2;

-- the self-join (one text on both sides), with and without exclude_self
SELECT excl, c.*
FROM (VALUES (false), (true)) e(excl),
     LATERAL pg_temp.compare_group('gt', 'gt', 5, 'l2', '<->', excl) c;

-- queries whose key no target has, and NULL keys, give no rows
SELECT count(*) FILTER (WHERE q.g = 'q-only') AS q_only, count(*) FILTER (WHERE q.g IS NULL) AS null_key,
       count(*) FILTER (WHERE q.g = 'small') AS small, count(DISTINCT r.query_id) AS queries
FROM knn_join('SELECT id, v, g FROM gq', 'SELECT id, v, g FROM gt', 10) r JOIN gq q ON q.id = r.query_id;

-- other key types: integer (against a domain over it), uuid, a composite
-- (several columns as one key), numeric (1.0 = 1.00)
CREATE DOMAIN small_key AS integer;
CREATE TABLE gq_int AS SELECT id, v, (id % 4)::small_key AS g FROM gq;
CREATE TABLE gt_int AS SELECT id, v, (id % 3)::integer AS g FROM gt;
SELECT * FROM pg_temp.compare_group('gq_int', 'gt_int', 3, 'l1', '<+>');
CREATE TABLE gq_uuid AS SELECT id, v, md5((id % 3)::text)::uuid AS g FROM gq;
CREATE TABLE gt_uuid AS SELECT id, v, md5((id % 4)::text)::uuid AS g FROM gt;
SELECT * FROM pg_temp.compare_group('gq_uuid', 'gt_uuid', 3, 'l2', '<->');
CREATE TYPE two_keys AS (a integer, b text);
CREATE TABLE gq_row AS SELECT id, v, ROW(id % 2, g)::two_keys AS g FROM gq;
CREATE TABLE gt_row AS SELECT id, v, ROW(id % 3, g)::two_keys AS g FROM gt;
SELECT * FROM pg_temp.compare_group('gq_row', 'gt_row', 2, 'cosine', '<=>');
CREATE TABLE gq_num AS SELECT id, v, ((id % 3)::numeric + 0.0) AS g FROM gq;
CREATE TABLE gt_num AS SELECT id, v, ((id % 3)::numeric + 0.00) AS g FROM gt;
SELECT * FROM pg_temp.compare_group('gq_num', 'gt_num', 4, 'ip', '<#>');

-- several key columns (the same as one key per column combination)
SELECT * FROM pg_temp.compare_group('gq_row', 'gt_row', 3, 'l2', '<->');
CREATE TEMP TABLE two_columns AS SELECT * FROM knn_join(
  'SELECT id, v, (g).a, (g).b FROM gq_row', 'SELECT id, v, (g).a, (g).b FROM gt_row', 3);
CREATE TEMP TABLE lateral_two AS SELECT q.id::bigint AS query_id, n.id::bigint AS target_id,
  (row_number() OVER (PARTITION BY q.id ORDER BY n.dist, n.id))::int AS rank, n.dist AS distance
FROM gq_row q CROSS JOIN LATERAL (
  SELECT t.id, t.v <-> q.v AS dist FROM gt_row t
  WHERE (t.g).a = (q.g).a AND (t.g).b = (q.g).b AND t.v IS NOT NULL
  ORDER BY t.v <-> q.v, t.id LIMIT 3) n WHERE q.v IS NOT NULL;
SELECT (SELECT count(*) FROM two_columns) AS rows_knn, (SELECT count(*) FROM lateral_two) AS rows_pg,
  (SELECT count(*) FROM ((TABLE two_columns EXCEPT ALL TABLE lateral_two)
                         UNION ALL (TABLE lateral_two EXCEPT ALL TABLE two_columns)) d) AS differ_pg;

-- halfvec rows and bit rows
CREATE TABLE gq_half AS SELECT id, v::halfvec(3) AS v, g FROM gq;
CREATE TABLE gt_half AS SELECT id, v::halfvec(3) AS v, g FROM gt;
SELECT * FROM pg_temp.compare_group('gq_half', 'gt_half', 3, 'l2', '<->');
CREATE TABLE gq_bit AS SELECT id, (id * 7919 % 4096)::bit(12) AS v, g FROM gq;
CREATE TABLE gt_bit AS SELECT id, (id * 104729 % 4096)::bit(12) AS v, g FROM gt;
SELECT * FROM pg_temp.compare_group('gq_bit', 'gt_bit', 3, 'hamming', '<~>');
SELECT * FROM pg_temp.compare_group('gq_bit', 'gt_bit', 3, 'jaccard', '<%>');

-- the statistics count the pairs of each group only
SELECT count(*) > 0 AS rows FROM knn_join('SELECT id, v, g FROM gq', 'SELECT id, v, g FROM gt', 1);
SELECT (knn_gpu_last_stats()->>'pairs')::bigint =
       (SELECT sum(nq * nt) FROM (SELECT g, count(*) nq FROM gq WHERE v IS NOT NULL GROUP BY g) a
        JOIN (SELECT g, count(*) nt FROM gt WHERE v IS NOT NULL GROUP BY g) b USING (g)) AS pairs_per_group;

-- errors
SELECT pg_temp.error_of($q$SELECT * FROM knn_join('SELECT id, v, g FROM gq', 'SELECT id, v FROM gt', 1)$q$);
SELECT pg_temp.error_of($q$SELECT * FROM knn_join('SELECT id, v FROM gq', 'SELECT id, v, g FROM gt', 1)$q$);
SELECT pg_temp.error_of($q$SELECT * FROM knn_join('SELECT id, v, g FROM gq', 'SELECT id, v, 1 FROM gt', 1)$q$);
SELECT pg_temp.error_of($q$SELECT * FROM knn_join('SELECT id, v, point(1, 1) FROM gq', 'SELECT id, v, point(1, 1) FROM gt', 1)$q$);
SELECT pg_temp.error_of($q$SELECT * FROM knn_join('SELECT id, v, g COLLATE "C" FROM gq', 'SELECT id, v, g COLLATE "POSIX" FROM gt', 1)$q$);
SELECT pg_temp.error_of($q$SELECT * FROM knn_join('SELECT id, v, g, g FROM gq', 'SELECT id, v, g FROM gt', 1)$q$);
SELECT pg_temp.error_of($q$SELECT * FROM knn_join('SELECT id, v, g, 1 FROM gq', 'SELECT id, v, g, 1::bigint FROM gt', 1)$q$);
SELECT pg_temp.error_of($q$SELECT * FROM knn_join('SELECT id, v, (g, 1) FROM gq', 'SELECT id, v, (g, 1) FROM gt', 1)$q$);
SELECT pg_temp.error_of($q$SELECT * FROM knn_join('SELECT id FROM gq', 'SELECT id, v FROM gt', 1)$q$);

-- statement_timeout stops a grouped join within a fraction of a second of
-- the timeout (the engine looks at the cancel flag between groups and
-- inside each), and the backend stays usable.
SET jit = off;
SET knn_gpu.device = cpu;
SET knn_gpu.threads = 1;
CREATE TABLE group_big AS
SELECT i AS id, array_agg(((i * 7919 + j * 104729) % 1000)::real / 1000 ORDER BY j)::vector AS v,
       i % 2 AS g
FROM generate_series(1, 30000) i, generate_series(1, 128) j GROUP BY i;
SET statement_timeout = '200ms';
DO $$
DECLARE
  started timestamptz := clock_timestamp();
BEGIN
  PERFORM count(*) FROM knn_join('SELECT id, v, g FROM group_big', 'SELECT id, v, g FROM group_big',
                                 10, method => 'brute');
  RAISE NOTICE 'the join finished before the timeout';
EXCEPTION WHEN query_canceled THEN
  RAISE NOTICE 'cancelled; stopped within 0.8 s of the statement start: %',
    clock_timestamp() - started < interval '0.8 s';
END $$;
RESET statement_timeout;
SELECT count(*) FROM knn_join('SELECT id, v, g FROM group_big WHERE id <= 4',
                              'SELECT id, v, g FROM group_big WHERE id <= 100', 2);
RESET knn_gpu.threads;
RESET knn_gpu.device;
