--
-- knn_range_join with a cap k under pgvector's types: each query's k best
-- by pgvector's operator (knn_operator_values.c, capped_range), filtered by
-- the radius. A statement_timeout is answered promptly while the candidates
-- are ranked by the operator (it was looked for once per 256 queries).
--
CREATE EXTENSION vector;
CREATE EXTENSION knn_gpu;
SET jit = off;
SET knn_gpu.device = cpu;
SET knn_gpu.threads = 1;

-- Wide rows and k at half the targets: every target is a candidate of every
-- query, so ranking one query takes 6000 operator calls on 2000 dimensions.
CREATE TABLE cap_wide AS
SELECT i AS id, array_fill(((i * 7919) % 1000)::real / 1000, ARRAY[2000])::vector(2000) AS v
FROM generate_series(1, 6000) i;

CREATE TABLE cancel_lateness (fraction float8, late interval);
CREATE FUNCTION run_until_cancelled(fraction float8, statement text) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
  started timestamptz := statement_timestamp();
BEGIN
  EXECUTE statement;
  INSERT INTO cancel_lateness VALUES (fraction, NULL);  -- finished first
EXCEPTION WHEN query_canceled THEN
  INSERT INTO cancel_lateness
  VALUES (fraction, clock_timestamp() - started - current_setting('statement_timeout')::interval);
END $$;

-- A first run warms up, two more are timed; then statement_timeout falls at
-- fractions of the faster time (in the engine and in the ranking).
\set capped 'SELECT count(*) FROM knn_range_join(''SELECT id, v FROM cap_wide WHERE id <= 300'', ''SELECT id, v FROM cap_wide'', 1, k => 3000)'
:capped;
SELECT clock_timestamp() AS started \gset
:capped;
SELECT clock_timestamp() AS second \gset
:capped;
SELECT 1000 * least(extract(epoch FROM :'second'::timestamptz - :'started'),
                    extract(epoch FROM clock_timestamp() - :'second')) AS full_ms \gset
SELECT round(:full_ms * 0.3) AS t30, round(:full_ms * 0.45) AS t45,
       round(:full_ms * 0.6) AS t60 \gset
SET statement_timeout = :t30;
SELECT run_until_cancelled(0.3, :'capped');
SET statement_timeout = :t45;
SELECT run_until_cancelled(0.45, :'capped');
SET statement_timeout = :t60;
SELECT run_until_cancelled(0.6, :'capped');
RESET statement_timeout;
-- (a run of a busy host may end before its timeout: NULL lateness)
SELECT count(late) > 0 AS some_cancelled,
       bool_and(coalesce(late < interval '100 ms', true)) AS all_within_100_ms
FROM cancel_lateness;
-- The backend is fine afterwards.
SELECT count(*) FROM knn_range_join('SELECT id, v FROM cap_wide WHERE id <= 3',
                                    'SELECT id, v FROM cap_wide', 1, k => 2);

DROP TABLE cap_wide, cancel_lateness;
DROP FUNCTION run_until_cancelled(float8, text);

-- The queries go through in slices (of 2^20 query x k slots): against
-- PostgreSQL's plan with exclude_self, group keys and halfvec rows over two
-- slices (1100 queries, k = 1000), a self-join (one matrix) and not.
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
DROP FUNCTION cap_differences(text, text, text, float8, int);
DROP TABLE cap_pts;

-- Memory: the k best of 3000 queries at k = 3000 took 3000 x 3000 slots
-- several times over (over 300 MB); a slice takes a ninth of that. The
-- peak resident size of a fresh backend (Linux's VmHWM) before and after.
\c
SET knn_gpu.device = cpu;
CREATE TABLE cap_many AS
SELECT i AS id, format('[%s,%s]', i % 97, i % 89)::vector(2) AS v FROM generate_series(1, 3000) i;
CREATE FUNCTION peak_kb() RETURNS bigint LANGUAGE sql AS $$
  SELECT substring(pg_read_file('/proc/self/status') FROM 'VmHWM:\s+(\d+) kB')::bigint
$$;
SELECT peak_kb() AS peak_before \gset
SELECT count(*) FROM knn_range_join('SELECT id, v FROM cap_many', 'SELECT id, v FROM cap_many', 0,
                                    k => 3000);
SELECT peak_kb() - :peak_before < 150 * 1024 AS grew_by_less_than_150_mb;
DROP TABLE cap_many;
DROP FUNCTION peak_kb();
DROP EXTENSION knn_gpu;
DROP EXTENSION vector;
