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
DROP EXTENSION knn_gpu;
DROP EXTENSION vector;
