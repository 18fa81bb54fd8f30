-- knn_range_join: every pair within a radius, compared with PostgreSQL's own
-- cross join filtered by the operator (EXCEPT ALL both ways, ranks by
-- (distance, id), the order of the rows), for every metric, < and <=, a
-- radius exactly on tied distances, radius 0, a huge and a NaN radius,
-- exclude_self, the per-query cap k, TI and brute force, halfvec and bit.
\i sql/error_of.psql
SET knn_gpu.enable_knn_join = off;

-- Coarse values: duplicates and tied distances everywhere; a zero vector
-- (cosine distance NaN) and a row without a vector.
CREATE TABLE rp AS
SELECT i AS id, format('[%s,%s,%s]', i % 7 - 3, (i * 3) % 5 - 2, (i % 4) * 0.5)::vector AS v
FROM generate_series(1, 120) i;
INSERT INTO rp VALUES (0, '[0,0,0]'), (500, NULL);

-- Finer values, enough rows for the engine to cluster (method => 'ti').
CREATE TABLE rf AS
SELECT i AS id,
       format('[%s,%s,%s]', (i % 13) + sin(i) * 0.1, (i % 11) + cos(i) * 0.1,
              (i % 7) * 0.5 + sin(3 * i) * 0.05)::vector AS v
FROM generate_series(1, 900) i;

\i sql/knn_range_helpers.psql

-- Every metric, < and <=, at a radius that is itself a (tied) distance.
SELECT m.metric, r.inclusive, pg_temp.dist('rp', m.op, 3, 17) AS radius, c.*
FROM (VALUES ('l2', '<->'), ('cosine', '<=>'), ('ip', '<#>'), ('l1', '<+>')) m(metric, op),
     (VALUES (true), (false)) r(inclusive),
     LATERAL pg_temp.check_range('rp', m.op, m.metric, pg_temp.dist('rp', m.op, 3, 17),
                                 r.inclusive) c
ORDER BY 1, 2;

-- Radius 0: the duplicates (and each row itself); none with <.
SELECT 'zero' AS radius, r.inclusive, c.*
FROM (VALUES (true), (false)) r(inclusive),
     LATERAL pg_temp.check_range('rp', '<->', 'l2', 0, r.inclusive) c;
-- A huge radius: every pair (121 rows with a vector, squared).
SELECT * FROM pg_temp.check_range('rp', '<->', 'l2', 1e300, false);
-- NaN: PostgreSQL sorts it above every number, so every distance is < NaN,
-- and the zero vector's NaN cosine distances are <= NaN.
SELECT * FROM pg_temp.check_range('rp', '<=>', 'cosine', 'NaN', false);
SELECT * FROM pg_temp.check_range('rp', '<=>', 'cosine', 'NaN', true);
-- A negative radius: no pair.
SELECT * FROM pg_temp.check_range('rp', '<->', 'l2', -1, true);

-- exclude_self and the per-query cap.
SELECT * FROM pg_temp.check_range('rp', '<->', 'l2', 1.5, true, NULL, true);
SELECT * FROM pg_temp.check_range('rp', '<->', 'l2', 2, true, 3, false);
SELECT * FROM pg_temp.check_range('rp', '<+>', 'l1', 2, false, 1, true);

-- The clustered (TI) join and brute force, on finer values, the radius
-- exactly one pair's distance.
SELECT m.method, x.metric, r.inclusive, c.*
FROM (VALUES ('ti'), ('brute'), ('auto')) m(method),
     (VALUES ('l2', '<->'), ('l1', '<+>')) x(metric, op),
     (VALUES (true), (false)) r(inclusive),
     LATERAL pg_temp.check_range('rf', x.op, x.metric, pg_temp.dist('rf', x.op, 5, 200),
                                 r.inclusive, NULL, false, m.method) c
ORDER BY 1, 2, 3;
-- A cap of 3 binds for some queries, but most have fewer pairs within the
-- radius (2.1 on average): the range engine's cap (a cap the radius
-- overfills runs as the top-k join: sql/knn_range_cap_topk.sql).
SELECT * FROM pg_temp.check_range('rf', '<->', 'l2', 0.9, false, 3, true, 'ti');
SELECT (knn_gpu_last_stats()->>'method') AS method,
       (knn_gpu_last_stats()->>'variant') LIKE 'range/ti, % pairs within radius' AS ti_variant,
       (knn_gpu_last_stats()->>'distance_computations')::bigint < 900 * 900 / 4 AS pruned;

-- halfvec rows (the engine widens them).
CREATE TABLE rh AS SELECT id, v::halfvec AS v FROM rp;
SELECT * FROM pg_temp.check_range('rh', '<->', 'l2', 1.5, true);
SELECT * FROM pg_temp.check_range('rh', '<=>', 'cosine', 0.2, false);

-- bit rows: hamming and jaccard.
CREATE TABLE rb AS SELECT i AS id, ((i * 37) % 4096)::bit(12) AS v FROM generate_series(1, 150) i;
SELECT * FROM pg_temp.check_range('rb', '<~>', 'hamming', 3, true);
SELECT * FROM pg_temp.check_range('rb', '<%>', 'jaccard', 0.5, false, 4, true);

-- Two different sets (queries are not targets).
SELECT count(*) AS pairs,
       count(*) = (SELECT count(*) FROM rp q, rf t WHERE q.v <-> t.v <= 1.1) AS same_count
FROM knn_range_join('SELECT id, v FROM rp', 'SELECT id, v FROM rf', 1.1);
SELECT count(*) AS differ FROM (
  (SELECT query_id, target_id, distance
   FROM knn_range_join('SELECT id, v FROM rp', 'SELECT id, v FROM rf', 1.1)
   EXCEPT ALL
   SELECT q.id, t.id, q.v <-> t.v FROM rp q, rf t WHERE q.v <-> t.v <= 1.1)
  UNION ALL
  (SELECT q.id, t.id, q.v <-> t.v FROM rp q, rf t WHERE q.v <-> t.v <= 1.1
   EXCEPT ALL
   SELECT query_id, target_id, distance
   FROM knn_range_join('SELECT id, v FROM rp', 'SELECT id, v FROM rf', 1.1))) d;

-- Group keys (columns after (id, vector)): a query meets only the targets
-- of equal keys; a NULL key meets nothing.
CREATE TABLE rg AS SELECT id, v, (ARRAY['a', 'b', 'c', NULL])[1 + id % 4] AS g, id % 2 AS h FROM rp;
CREATE TEMP TABLE rg_got AS
SELECT * FROM knn_range_join('SELECT id, v, g, h FROM rg', 'SELECT id, v, g, h FROM rg', 2,
                             exclude_self => true);
CREATE TEMP TABLE rg_want AS
SELECT q.id::bigint AS query_id, t.id::bigint AS target_id,
       (row_number() OVER (PARTITION BY q.id ORDER BY q.v <-> t.v, t.id))::int AS rank,
       q.v <-> t.v AS distance
FROM rg q, rg t
WHERE q.g = t.g AND q.h = t.h AND q.id <> t.id AND q.v <-> t.v <= 2;
SELECT (SELECT count(*) FROM rg_got) AS pairs,
       (SELECT count(*) FROM rg_want) AS want,
       (SELECT count(*) FROM ((TABLE rg_got EXCEPT ALL TABLE rg_want)
                              UNION ALL (TABLE rg_want EXCEPT ALL TABLE rg_got)) d) AS differ;
SELECT pg_temp.error_of($$SELECT * FROM knn_range_join('SELECT id, v, g FROM rg', 'SELECT id, v FROM rg', 1)$$);

-- Empty sides return nothing.
SELECT count(*) FROM knn_range_join('SELECT id, v FROM rp WHERE false', 'SELECT id, v FROM rp', 1);

-- A GPU request: the GPU range join where there is a GPU, else the CPU
-- engine with a notice that names the host's reason (hidden here); the
-- same pairs either way.
SET knn_gpu.device = gpu;
SET client_min_messages = warning;
SELECT count(*) FROM knn_range_join('SELECT id, v FROM rp', 'SELECT id, v FROM rp', 0.5);
RESET client_min_messages;
RESET knn_gpu.device;

-- Errors.
SELECT pg_temp.error_of($$SELECT * FROM knn_range_join('SELECT id, v FROM rp', 'SELECT id, v FROM rp', NULL)$$);
SELECT pg_temp.error_of($$SELECT * FROM knn_range_join('SELECT id, v FROM rp', 'SELECT id, v FROM rp', 1, k => 0)$$);
SELECT pg_temp.error_of($$SELECT * FROM knn_range_join('SELECT id, v FROM rp', 'SELECT id, v FROM rp', 1, 'nope')$$);
SELECT pg_temp.error_of($$SELECT * FROM knn_range_join('SELECT id, v FROM rp', 'SELECT id, v FROM rb', 1)$$);
SELECT pg_temp.error_of($$SELECT * FROM knn_range_join('SELECT id, v FROM rb', 'SELECT id, v FROM rb', 1, 'l2')$$);
SELECT pg_temp.error_of($$SELECT * FROM knn_range_join('SELECT id, v, 1 FROM rp', 'SELECT id, v FROM rp', 1)$$);
SELECT pg_temp.error_of($$SELECT * FROM knn_range_join('DELETE FROM rp RETURNING id, v', 'SELECT id, v FROM rp', 1)$$);
SELECT pg_temp.error_of($$SELECT * FROM knn_range_join('SELECT NULL::int, v FROM rp', 'SELECT id, v FROM rp', 1)$$);

-- An engine entry that throws becomes an ERROR, in the function and in the
-- node alike; the backend survives and the next join works.
DO $$
DECLARE
  fault text;
BEGIN
  PERFORM set_config('knn_gpu.enable_knn_join', 'on', false);
  FOREACH fault IN ARRAY ARRAY['start', 'run', 'bad_alloc', 'finish'] LOOP
    PERFORM set_config('knn_gpu.fault_injection', fault, false);
    RAISE NOTICE '%: %', fault, pg_temp.error_of(
      $q$SELECT count(*) FROM knn_range_join('SELECT id, v FROM rp', 'SELECT id, v FROM rp', 1)$q$);
    RAISE NOTICE '% (node): %', fault, pg_temp.error_of(
      $q$SELECT count(*) FROM rf q JOIN rf t ON q.v <-> t.v < 0.5$q$);
  END LOOP;
  PERFORM set_config('knn_gpu.enable_knn_join', 'off', false);
END $$;
SET knn_gpu.enable_knn_join = on;
EXPLAIN (COSTS OFF) SELECT count(*) FROM rf q JOIN rf t ON q.v <-> t.v < 0.5;
SET knn_gpu.enable_knn_join = off;
RESET knn_gpu.fault_injection;
SELECT count(*) FROM knn_range_join('SELECT id, v FROM rp', 'SELECT id, v FROM rp', 1);

-- A cancel (statement_timeout) during a large join stops the engine.
CREATE TABLE rbig AS SELECT i AS id, format('[%s,%s]', i % 100, i % 37)::vector AS v
FROM generate_series(1, 30000) i;
SET statement_timeout = '300ms';
SELECT count(*) FROM knn_range_join('SELECT id, v FROM rbig', 'SELECT id, v FROM rbig', 1e9, method => 'brute');
RESET statement_timeout;
SELECT count(*) FROM knn_range_join('SELECT id, v FROM rp', 'SELECT id, v FROM rp', 0);

-- Bind parameters, as in knn_join: $1 of both texts, typed by its use.
SELECT count(*) AS pairs,
       count(*) = (SELECT count(*) FROM pg_temp.sql_range('rf', '<->', 0.5, true, NULL, true) r
                   WHERE r.query_id <= 300) AS same_count
FROM knn_range_join('SELECT id, v FROM rf WHERE id <= $1', 'SELECT id, v FROM rf', 0.5,
                    exclude_self => true, params => ARRAY['300']);
SELECT count(*) AS differing_rows FROM (
  (SELECT * FROM knn_range_join('SELECT id, v FROM rf WHERE id <= $1', 'SELECT id, v FROM rf', 0.5,
                                exclude_self => true, params => ARRAY['300'])
   EXCEPT ALL
   SELECT * FROM pg_temp.sql_range('rf', '<->', 0.5, true, NULL, true) WHERE query_id <= 300)
  UNION ALL
  (SELECT * FROM pg_temp.sql_range('rf', '<->', 0.5, true, NULL, true) WHERE query_id <= 300
   EXCEPT ALL
   SELECT * FROM knn_range_join('SELECT id, v FROM rf WHERE id <= $1', 'SELECT id, v FROM rf', 0.5,
                                exclude_self => true, params => ARRAY['300']))) d;

DROP TABLE rp, rf, rh, rb, rg, rbig;

