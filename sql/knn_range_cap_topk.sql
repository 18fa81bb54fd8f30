-- knn_range_join with a cap k: where a sample says the radius holds more
-- pairs a query than k, the engine runs the top-k join and cuts each
-- query's k nearest at the radius (knn_gpu_last_stats()'s variant
-- 'range/top-k, ...'); where it holds fewer, the range join (variant
-- 'range/...'). Both against PostgreSQL's own answer row for row (ids,
-- ranks, distances, order), for every metric, < and <=, the radius and the
-- cap on tied distances, exclude_self, group keys, keyed ids, halfvec and
-- bit rows, NULL vectors; the KNN Join node's radius form with a LIMIT;
-- a cancel of the top-k path.
\i sql/error_of.psql
SET knn_gpu.enable_knn_join = off;

-- Coarse values (duplicates and tied distances everywhere), a zero vector
-- (cosine distance NaN) and a row without a vector.
CREATE TABLE cq AS
SELECT i AS id, format('[%s,%s,%s]', i % 7 - 3, (i * 3) % 5 - 2, (i % 4) * 0.5)::vector AS v
FROM generate_series(1, 300) i;
INSERT INTO cq VALUES (0, '[0,0,0]'), (900, NULL);
CREATE TABLE cq_half AS SELECT id, v::halfvec AS v FROM cq;
CREATE TABLE cq_bit AS
SELECT i AS id, ((i * 37) % 4096)::bit(12) AS v FROM generate_series(1, 300) i;

\i sql/knn_range_helpers.psql

-- The distance at a quantile of every pair's: a radius on a (tied) distance.
CREATE FUNCTION pg_temp.quantile(tab text, op text, at float8) RETURNS float8
LANGUAGE plpgsql AS $$
DECLARE d float8;
BEGIN
  EXECUTE format('SELECT percentile_disc(%3$s) WITHIN GROUP (ORDER BY x.v %2$s y.v)
                  FROM %1$s x, %1$s y', tab, op, at) INTO d;
  RETURN d;
END $$;

-- Which join the last knn_range_join ran.
CREATE FUNCTION pg_temp.path() RETURNS text LANGUAGE sql AS $$
  SELECT CASE WHEN knn_gpu_last_stats()->>'variant' LIKE 'range/top-k, % pairs within radius; %'
              THEN 'top-k' ELSE 'range' END $$;

-- check_range's comparison, the join that ran, the queries whose pairs
-- the radius ends before the cap (fewer than k), and those whose cap falls
-- on a tie (their k-th and (k+1)-th pairs within the radius tied).
CREATE FUNCTION pg_temp.check_cap(tab text, op text, metric text, radius float8,
                                  inclusive boolean, k int, excl boolean)
RETURNS TABLE (path text, pairs bigint, missing bigint, extra bigint, out_of_order bigint,
               short_of_cap bigint, tied_at_cap bigint)
LANGUAGE plpgsql AS $$
BEGIN
  SELECT c.pairs, c.missing, c.extra, c.out_of_order
    INTO pairs, missing, extra, out_of_order
    FROM pg_temp.check_range(tab, op, metric, radius, inclusive, k, excl) c;
  path := pg_temp.path();
  SELECT count(*) INTO short_of_cap FROM (
    SELECT query_id FROM pg_temp.sql_range(tab, op, radius, inclusive, k, excl)
    GROUP BY query_id HAVING max(rank) < k) s;
  SELECT count(*) INTO tied_at_cap
    FROM pg_temp.sql_range(tab, op, radius, inclusive, k + 1, excl) a
    JOIN pg_temp.sql_range(tab, op, radius, inclusive, k + 1, excl) b
      ON a.query_id = b.query_id AND a.rank = k AND b.rank = k + 1
   WHERE a.distance = b.distance;
  RETURN NEXT;
END $$;

-- Every metric, < and <=, with and without exclude_self: a wide radius (the
-- median distance: about 150 pairs a query) at a cap of 5 runs as the
-- top-k join; a narrow one (the 1st percentile: about 3 a query) at a cap
-- of 50 as the range join; a middle one (the 4th percentile: about 12 a
-- query, on a tie) at caps of 6 and 12 as either, the radius ending some
-- queries' pairs before the cap.
SELECT m.metric, w.width, w.k, r.inclusive, e.excl, c.*
FROM (VALUES ('l2', '<->'), ('cosine', '<=>'), ('ip', '<#>'), ('l1', '<+>')) m(metric, op),
     (VALUES ('wide', 0.5, 5), ('middle', 0.04, 6), ('middle', 0.04, 12),
             ('narrow', 0.01, 50)) w(width, at, k),
     (VALUES (true), (false)) r(inclusive),
     (VALUES (false), (true)) e(excl),
     LATERAL pg_temp.check_cap('cq', m.op, m.metric, pg_temp.quantile('cq', m.op, w.at),
                               r.inclusive, w.k, e.excl) c
ORDER BY 1, w.at DESC, 3, 4, 5;

-- halfvec rows (the engine widens them) and bit rows, both joins (<= with
-- exclude_self, < without).
SELECT m.tab, m.metric, w.width, w.k, r.inclusive, c.*
FROM (VALUES ('cq_half', 'l2', '<->'), ('cq_half', 'cosine', '<=>'), ('cq_half', 'ip', '<#>'),
             ('cq_half', 'l1', '<+>'), ('cq_bit', 'hamming', '<~>'),
             ('cq_bit', 'jaccard', '<%>')) m(tab, metric, op),
     (VALUES ('wide', 0.5, 4), ('middle', 0.04, 6), ('middle', 0.04, 12),
             ('narrow', 0.01, 60)) w(width, at, k),
     (VALUES (true), (false)) r(inclusive),
     LATERAL pg_temp.check_cap(m.tab, m.op, m.metric, pg_temp.quantile(m.tab, m.op, w.at),
                               r.inclusive, w.k, r.inclusive) c
ORDER BY 1, 2, w.at DESC, 4, 5;

-- Radii every pair is within (huge, NaN: NaN cosines are <= NaN) at a cap.
SELECT r.radius, c.*
FROM (VALUES (1e300::float8), ('NaN')) r(radius),
     LATERAL pg_temp.check_cap('cq', '<=>', 'cosine', r.radius, true, 3, false) c;

-- Group keys (columns after (id, vector), a NULL key meets nothing) and
-- exclude_self, both joins.
CREATE TABLE cq_group AS
SELECT id, v, (ARRAY['a', 'b', 'c', NULL])[1 + id % 4] AS g, id % 2 AS h FROM cq;
CREATE FUNCTION pg_temp.check_groups(radius float8, k int)
RETURNS TABLE (path text, pairs bigint, want bigint, differ bigint, out_of_order bigint)
LANGUAGE plpgsql AS $$
BEGIN
  CREATE TEMP TABLE got AS
  SELECT *, row_number() OVER () AS pos
  FROM knn_range_join('SELECT id, v, g, h FROM cq_group', 'SELECT id, v, g, h FROM cq_group',
                      radius, exclude_self => true, k => k);
  path := pg_temp.path();
  CREATE TEMP TABLE wanted AS
  SELECT * FROM (
    SELECT q.id::bigint AS query_id, t.id::bigint AS target_id,
           (row_number() OVER (PARTITION BY q.id ORDER BY q.v <-> t.v, t.id))::int AS rank,
           q.v <-> t.v AS distance
    FROM cq_group q, cq_group t
    WHERE q.g = t.g AND q.h = t.h AND q.id <> t.id AND q.v <-> t.v <= radius) s
  WHERE rank <= k;
  SELECT count(*) INTO pairs FROM got;
  SELECT count(*) INTO want FROM wanted;
  SELECT count(*) INTO differ FROM (
    (SELECT query_id, target_id, rank, distance FROM got
     EXCEPT ALL SELECT * FROM wanted)
    UNION ALL
    (SELECT * FROM wanted
     EXCEPT ALL SELECT query_id, target_id, rank, distance FROM got)) d;
  SELECT count(*) INTO out_of_order FROM (
    SELECT pos, row_number() OVER (ORDER BY query_id, rank) AS expected FROM got) o
  WHERE pos <> expected;
  DROP TABLE got, wanted;
  RETURN NEXT;
END $$;
SELECT * FROM pg_temp.check_groups(4, 3);
SELECT * FROM pg_temp.check_groups(0.5, 40);

-- Keyed ids (text): ties at the cap broken by the text order of the ids.
CREATE TEMP TABLE keyed_got AS
SELECT *, row_number() OVER () AS pos
FROM knn_range_join('SELECT id::text, v FROM cq', 'SELECT id::text, v FROM cq', 3,
                    key => NULL::text, k => 4, exclude_self => true);
SELECT pg_temp.path();
CREATE TEMP TABLE keyed_want AS
SELECT * FROM (
  SELECT q.id::text AS query_id, t.id::text AS target_id,
         (row_number() OVER (PARTITION BY q.id::text ORDER BY q.v <-> t.v, t.id::text))::int AS rank,
         q.v <-> t.v AS distance
  FROM cq q, cq t
  WHERE q.v <-> t.v <= 3 AND q.id <> t.id) s
WHERE rank <= 4;
SELECT (SELECT count(*) FROM keyed_got) AS pairs,
       (SELECT count(*) FROM ((SELECT query_id, target_id, rank, distance FROM keyed_got
                               EXCEPT ALL TABLE keyed_want)
                              UNION ALL (TABLE keyed_want
                               EXCEPT ALL SELECT query_id, target_id, rank, distance
                               FROM keyed_got)) d) AS differ,
       (SELECT count(*) FROM (SELECT pos, row_number() OVER (ORDER BY query_id, rank)
                              AS expected FROM keyed_got) o
        WHERE pos <> expected) AS out_of_order;

-- The KNN Join node's radius form with a LIMIT: the LIMIT is the cap, and
-- the same choice of join (its EXPLAIN ANALYZE names it), the same rows as
-- PostgreSQL's plan.
\i sql/knn_scan_helpers.psql
CREATE FUNCTION pg_temp.engine_variant(query text) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
  line text;
BEGIN
  FOR line IN EXECUTE 'EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) ' || query LOOP
    IF line ~ 'Engine Variant:' THEN
      RETURN regexp_replace(regexp_replace(trim(line), '\d+ pairs', 'N pairs'), '; .*', '; ...');
    END IF;
  END LOOP;
  RETURN NULL;
END $$;
SELECT r.radius, r.k, c.*
FROM (VALUES (3.0, 5), (0.6, 40)) r(radius, k),
     LATERAL pg_temp.knn_check(format($$
       SELECT q.id AS qid, n.id AS nid, n.dist
       FROM cq q
       CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM cq t
                           WHERE t.v <-> q.v <= %s ORDER BY t.v <-> q.v, t.id LIMIT %s) n $$,
       r.radius, r.k)) c;
SET knn_gpu.enable_knn_join = on;
SELECT r.radius, r.k, pg_temp.engine_variant(format($$
       SELECT q.id AS qid, n.id AS nid, n.dist
       FROM cq q
       CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM cq t
                           WHERE t.v <-> q.v <= %s ORDER BY t.v <-> q.v, t.id LIMIT %s) n $$,
       r.radius, r.k)) AS engine_variant
FROM (VALUES (3.0, 5), (0.6, 40)) r(radius, k);
SET knn_gpu.enable_knn_join = off;

-- A cancel (statement_timeout) while the top-k join runs stops it, and
-- the backend goes on.
SET knn_gpu.device = cpu;
SET knn_gpu.threads = 1;
CREATE TABLE cq_big AS
SELECT i AS id, array_agg(((i * 7919 + j * 104729) % 1000)::real / 1000 ORDER BY j)::vector AS v
FROM generate_series(1, 20000) i, generate_series(1, 128) j GROUP BY i;
SELECT count(*), pg_temp.path()
FROM knn_range_join('SELECT id, v FROM cq_big WHERE id <= 50', 'SELECT id, v FROM cq_big', 1e9,
                    k => 10, method => 'brute');
-- (the whole join: about 2 s on one thread of a 2-core CI machine)
SET statement_timeout = '250ms';
DO $$
DECLARE
  started timestamptz := clock_timestamp();
BEGIN
  PERFORM count(*) FROM knn_range_join('SELECT id, v FROM cq_big',
                                       'SELECT id, v FROM cq_big WHERE id > 0',
                                       1e9, k => 10, method => 'brute');
  RAISE NOTICE 'the join finished before the timeout';
EXCEPTION WHEN query_canceled THEN
  RAISE NOTICE 'cancelled; stopped within 1 s of the statement start: %',
    clock_timestamp() - started < interval '1 s';
END $$;
RESET statement_timeout;
SELECT count(*), pg_temp.path()
FROM knn_range_join('SELECT id, v FROM cq WHERE id <= 3', 'SELECT id, v FROM cq', 1e9, k => 2);
RESET knn_gpu.threads;
RESET knn_gpu.device;

DROP TABLE cq, cq_half, cq_bit, cq_group, cq_big;
