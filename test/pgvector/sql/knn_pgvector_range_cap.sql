--
-- knn_range_join with a cap k under pgvector's types: each query's first k
-- pairs within the radius by pgvector's operator (knn_operator_values.c,
-- capped_range). Where a sample of the queries has few candidates within
-- the (candidate) radius, the engine is asked for about that many of each
-- query first, and more only for the queries that have more; otherwise
-- (and for fewer than 64 queries) each query's k best by the operator are
-- ranked in slices and filtered by the radius. A statement_timeout is
-- answered promptly either way (it was looked for once per 256 queries
-- while ranking).
--
CREATE EXTENSION vector;
CREATE EXTENSION knn_gpu;
SET jit = off;
SET knn_gpu.device = cpu;
SET knn_gpu.threads = 1;

-- Wide rows and k at half the targets: at a radius that every pair is
-- within, every target is a candidate of every query, so ranking one query
-- takes 6000 operator calls on 2000 dimensions (60 queries: too few to
-- sample, ranked); at radius 1, about 270 pairs a query, 300 queries are
-- asked for 512 candidates each first.
CREATE TABLE cap_wide AS
SELECT i AS id, array_fill(((i * 7919) % 1000)::real / 1000, ARRAY[2000])::vector(2000) AS v
FROM generate_series(1, 6000) i;

CREATE TABLE cancel_lateness (statement text, fraction float8, late interval);
CREATE FUNCTION run_until_cancelled(name text, fraction float8, statement text) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
  started timestamptz := statement_timestamp();
BEGIN
  EXECUTE statement;
  INSERT INTO cancel_lateness VALUES (name, fraction, NULL);  -- finished first
EXCEPTION WHEN query_canceled THEN
  INSERT INTO cancel_lateness
  VALUES (name, fraction, clock_timestamp() - started - current_setting('statement_timeout')::interval);
END $$;

-- A first run warms up, two more are timed; then statement_timeout falls at
-- fractions of the faster time (in the engine and in the ranking or the
-- first run of few candidates).
\set ranked 'SELECT count(*) FROM knn_range_join(''SELECT id, v FROM cap_wide WHERE id <= 60'', ''SELECT id, v FROM cap_wide'', 100, k => 3000)'
\set few_first 'SELECT count(*) FROM knn_range_join(''SELECT id, v FROM cap_wide WHERE id <= 300'', ''SELECT id, v FROM cap_wide'', 1, k => 3000)'
:ranked;
:few_first;
SELECT clock_timestamp() AS started \gset
:ranked;
SELECT clock_timestamp() AS second \gset
:ranked;
SELECT clock_timestamp() AS third \gset
:few_first;
SELECT clock_timestamp() AS fourth \gset
:few_first;
SELECT 1000 * least(extract(epoch FROM :'second'::timestamptz - :'started'),
                    extract(epoch FROM :'third'::timestamptz - :'second')) AS ranked_ms,
       1000 * least(extract(epoch FROM :'fourth'::timestamptz - :'third'),
                    extract(epoch FROM clock_timestamp() - :'fourth')) AS few_first_ms \gset
SELECT round(:ranked_ms * 0.3) AS r30, round(:ranked_ms * 0.45) AS r45,
       round(:ranked_ms * 0.6) AS r60, round(:few_first_ms * 0.3) AS f30,
       round(:few_first_ms * 0.45) AS f45, round(:few_first_ms * 0.6) AS f60 \gset
SET statement_timeout = :r30;
SELECT run_until_cancelled('ranked', 0.3, :'ranked');
SET statement_timeout = :r45;
SELECT run_until_cancelled('ranked', 0.45, :'ranked');
SET statement_timeout = :r60;
SELECT run_until_cancelled('ranked', 0.6, :'ranked');
SET statement_timeout = :f30;
SELECT run_until_cancelled('few first', 0.3, :'few_first');
SET statement_timeout = :f45;
SELECT run_until_cancelled('few first', 0.45, :'few_first');
SET statement_timeout = :f60;
SELECT run_until_cancelled('few first', 0.6, :'few_first');
RESET statement_timeout;
-- (a run of a busy host may end before its timeout: NULL lateness)
SELECT statement, count(late) > 0 AS some_cancelled,
       bool_and(coalesce(late < interval '100 ms', true)) AS all_within_100_ms
FROM cancel_lateness GROUP BY statement ORDER BY statement;
-- The backend is fine afterwards.
SELECT count(*) FROM knn_range_join('SELECT id, v FROM cap_wide WHERE id <= 3',
                                    'SELECT id, v FROM cap_wide', 1, k => 2);

DROP TABLE cap_wide, cancel_lateness;
DROP FUNCTION run_until_cancelled(text, float8, text);

-- Against PostgreSQL's plan with exclude_self, group keys and halfvec rows
-- (1100 queries, k = 1000), a self-join (one matrix) and not: at these
-- radii a few candidates of each query first (128). Ranked, the queries go
-- through in slices (of 2^20 query x k slots), here two: cosine with a row
-- of a tiny norm (below 2^-50) has no candidate radius, so every query is
-- ranked.
SELECT setseed(0.5);
CREATE TABLE cap_pts AS
SELECT i AS id, (SELECT array_agg(round(random() * 8)::real) FROM generate_series(1, 3) j WHERE i > 0)::vector(3) AS v,
       i % 3 AS g
FROM generate_series(1, 1100) i;
ALTER TABLE cap_pts ADD COLUMN h halfvec(3);
UPDATE cap_pts SET h = v::halfvec(3);
CREATE FUNCTION cap_differences(col text, op text, metric text, radius float8, targets int)
RETURNS TABLE (pairs bigint, differing_rows bigint) LANGUAGE plpgsql AS $$
BEGIN
  CREATE TEMP TABLE mine AS
  SELECT * FROM knn_range_join(format('SELECT id, %s, g FROM cap_pts WHERE id <= 1100', col),
                               format('SELECT id, %s, g FROM cap_pts WHERE id <= %s', col, targets),
                               radius, metric => metric, exclude_self => true, k => 1000);
  EXECUTE format(
    'CREATE TEMP TABLE theirs AS
     SELECT q.id::bigint AS query_id, t.id::bigint AS target_id,
            (row_number() OVER (PARTITION BY q.id ORDER BY q.%1$s %2$s t.%1$s, t.id))::int AS rank,
            q.%1$s %2$s t.%1$s AS distance
     FROM cap_pts q, cap_pts t
     WHERE t.id <= %4$s AND q.g = t.g AND q.id <> t.id AND q.%1$s %2$s t.%1$s <= %3$L::float8',
    col, op, radius, targets);
  pairs := (SELECT count(*) FROM theirs);
  differing_rows := (SELECT count(*) FROM (TABLE mine EXCEPT ALL TABLE theirs) a)
                  + (SELECT count(*) FROM (TABLE theirs EXCEPT ALL TABLE mine) b);
  DROP TABLE mine, theirs;
  RETURN NEXT;
END $$;
SELECT * FROM cap_differences('v', '<->', 'l2', 2, 1000);
SELECT * FROM cap_differences('h', '<+>', 'l1', 3, 1000);
SELECT * FROM cap_differences('v', '<=>', 'cosine', 0.01, 1000);
-- (all 1100 rows: the same text on both sides)
SELECT * FROM cap_differences('v', '<->', 'l2', 2, 1100);
UPDATE cap_pts SET v = '[1e-20,0,0]' WHERE id = 500;
SELECT * FROM cap_differences('v', '<=>', 'cosine', 0.01, 1000);
DROP FUNCTION cap_differences(text, text, text, float8, int);
DROP TABLE cap_pts;

-- Memory: the k best of 3000 queries at k = 3000 took 3000 x 3000 slots
-- several times over (over 300 MB); a slice takes a ninth of that. The
-- peak resident size of a fresh backend (Linux's VmHWM) before and after,
-- ranked (cosine, a row of a tiny norm: no candidate radius) and with a
-- few candidates first.
\c
SET knn_gpu.device = cpu;
CREATE TABLE cap_many AS
SELECT i AS id, format('[%s,%s]', i % 97, i % 89)::vector(2) AS v FROM generate_series(1, 3000) i;
UPDATE cap_many SET v = '[1e-20,0]' WHERE id = 1000;
CREATE FUNCTION peak_kb() RETURNS bigint LANGUAGE sql AS $$
  SELECT substring(pg_read_file('/proc/self/status') FROM 'VmHWM:\s+(\d+) kB')::bigint
$$;
SELECT peak_kb() AS peak_before \gset
SELECT count(*) FROM knn_range_join('SELECT id, v FROM cap_many', 'SELECT id, v FROM cap_many', 0,
                                    metric => 'cosine', k => 3000);
SELECT peak_kb() - :peak_before < 150 * 1024 AS grew_by_less_than_150_mb;
\c
SET knn_gpu.device = cpu;
SELECT peak_kb() AS peak_before \gset
SELECT count(*) FROM knn_range_join('SELECT id, v FROM cap_many', 'SELECT id, v FROM cap_many', 0,
                                    k => 3000);
SELECT peak_kb() - :peak_before < 150 * 1024 AS grew_by_less_than_150_mb;
DROP TABLE cap_many;
DROP FUNCTION peak_kb();

-- A small radius: ranking asked the engine for about 2 k candidates of
-- every query and the operator about those within the candidate radius
-- (all of them before), whatever the radius: 23 s of CPU for a join of
-- 10000 x 10000 rows at k => 10000 and 12734 pairs within the radius (0.06
-- s now). Against PostgreSQL's plan row for row, in order: 150 points of a
-- lattice, 4 rows each (ties at distances 0 and 1), and 1100 rows of one
-- point whose two queries (not in the sample) have more than the 32
-- candidates asked for first and are capped at k, their ties by id.
SET knn_gpu.threads = 1;
CREATE TABLE cap_lattice AS
SELECT i AS id, format('[%s,%s]', (i % 150) % 15, (i % 150) / 15)::vector(2) AS v
FROM generate_series(1, 600) i
UNION ALL
SELECT i, '[100,100]' FROM generate_series(601, 1700) i;
SET knn_gpu.enable_knn_join = off;  -- PostgreSQL's plan
CREATE TABLE lattice_theirs AS
SELECT row_number() OVER (ORDER BY query_id, distance, target_id) AS ord, * FROM (
  SELECT q.id::bigint AS query_id, t.id::bigint AS target_id,
         (row_number() OVER (PARTITION BY q.id ORDER BY q.v <-> t.v, t.id))::int AS rank,
         q.v <-> t.v AS distance
  FROM cap_lattice q, cap_lattice t
  WHERE (q.id <= 600 OR q.id IN (700, 1500)) AND q.id <> t.id AND q.v <-> t.v <= 1) pairs
WHERE rank <= 500;
RESET knn_gpu.enable_knn_join;
CREATE TABLE lattice_mine AS
SELECT row_number() OVER () AS ord, *
FROM knn_range_join('SELECT id, v FROM cap_lattice WHERE id <= 600 OR id IN (700, 1500)',
                    'SELECT id, v FROM cap_lattice', 1, exclude_self => true, k => 500);
SELECT (SELECT count(*) FROM lattice_theirs) AS pairs,
       (SELECT count(*) FROM lattice_theirs WHERE query_id IN (700, 1500)) AS capped_pairs,
       (SELECT count(*) FROM (TABLE lattice_mine EXCEPT ALL TABLE lattice_theirs) a)
       + (SELECT count(*) FROM (TABLE lattice_theirs EXCEPT ALL TABLE lattice_mine) b)
       AS differing_rows;
-- The KNN Join node's radius with a LIMIT: the same rows in the same order.
\set node_join 'SELECT row_number() OVER () AS ord, q.id::bigint AS query_id, n.id::bigint AS target_id, n.distance FROM (SELECT * FROM cap_lattice WHERE id <= 600 OR id IN (700, 1500) ORDER BY id) q CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v AS distance FROM cap_lattice t WHERE t.id <> q.id AND t.v <-> q.v <= 1 ORDER BY t.v <-> q.v, t.id LIMIT 500) n'
EXPLAIN (COSTS OFF) :node_join;
CREATE TABLE lattice_node AS :node_join;
SELECT (SELECT count(*) FROM (TABLE lattice_node EXCEPT ALL
                              SELECT ord, query_id, target_id, distance FROM lattice_theirs) a)
       + (SELECT count(*) FROM (SELECT ord, query_id, target_id, distance FROM lattice_theirs
                                EXCEPT ALL TABLE lattice_node) b) AS differing_rows;
-- The work (DEBUG1): 32 candidates of each query first, all of them within
-- the radius asking the operator, and the two queries of the dense point
-- ranked with more; ranking asked the engine for 1000 candidates of each
-- query and the operator 602000 times.
SET client_min_messages = debug1;
SELECT count(*) FROM (:node_join) n;
RESET client_min_messages;
DROP TABLE cap_lattice, lattice_theirs, lattice_mine, lattice_node;

-- Zero vectors under cosine: NaN by the engine and by pgvector's operator,
-- within no radius, so beyond the candidate radius as in the uncapped range
-- join. They counted as within it: each zero query stayed unproven until
-- every target had been ranked (the old code: 502086 operator calls here,
-- and queries x targets slots). Against PostgreSQL's plan row for row, and
-- the work (DEBUG1).
CREATE TABLE cap_zero AS
SELECT i AS id, CASE WHEN i % 4 = 0 THEN '[0,0,0]'
                     ELSE format('[%s,%s,%s]', i % 7 + 1, i % 11, i % 13) END::vector(3) AS v
FROM generate_series(1, 1000) i;
\set zero_join 'SELECT row_number() OVER () AS ord, q.id::bigint AS query_id, n.id::bigint AS target_id, n.distance FROM (SELECT * FROM cap_zero ORDER BY id) q CROSS JOIN LATERAL (SELECT t.id, t.v <=> q.v AS distance FROM cap_zero t WHERE t.id <> q.id AND t.v <=> q.v <= 0.001 ORDER BY t.v <=> q.v, t.id LIMIT 100) n'
EXPLAIN (COSTS OFF) :zero_join;
CREATE TABLE zero_node AS :zero_join;
SET knn_gpu.enable_knn_join = off;  -- PostgreSQL's plan
CREATE TABLE zero_theirs AS :zero_join;
RESET knn_gpu.enable_knn_join;
SELECT (SELECT count(*) FROM zero_theirs) AS pairs,
       (SELECT count(*) FROM (TABLE zero_node EXCEPT ALL TABLE zero_theirs) a)
       + (SELECT count(*) FROM (TABLE zero_theirs EXCEPT ALL TABLE zero_node) b) AS differing_rows;
SET client_min_messages = debug1;
SELECT count(*) FROM (:zero_join) n;
RESET client_min_messages;
DROP TABLE cap_zero, zero_node, zero_theirs;

-- Memory where every target ties with every other (duplicates within the
-- radius): a query is proven only once every target is a candidate, and the
-- queries run again with more went to the engine all at once (1000 x 6000
-- slots, over 90 MB); now in runs that fit knn_gpu.max_result_memory.
\c
SET knn_gpu.device = cpu;
SET knn_gpu.threads = 1;
SET knn_gpu.max_result_memory = '16MB';
CREATE TABLE cap_dup AS SELECT i AS id, '[0.5,0.25]'::vector(2) AS v FROM generate_series(1, 6000) i;
CREATE FUNCTION peak_kb() RETURNS bigint LANGUAGE sql AS $$
  SELECT substring(pg_read_file('/proc/self/status') FROM 'VmHWM:\s+(\d+) kB')::bigint
$$;
SELECT peak_kb() AS peak_before \gset
SELECT count(*), count(DISTINCT query_id) AS queries, max(target_id), max(rank), max(distance)
FROM knn_range_join('SELECT id + 6000, v FROM cap_dup WHERE id <= 1000', 'SELECT id, v FROM cap_dup', 1,
                    k => 50);
SELECT peak_kb() - :peak_before < 60 * 1024 AS grew_by_less_than_60_mb;
DROP TABLE cap_dup;
DROP FUNCTION peak_kb();
DROP EXTENSION knn_gpu;
DROP EXTENSION vector;
