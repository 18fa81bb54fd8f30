-- statement_timeout (and cancel) stop a running join within a fraction of a
-- second, and the backend stays usable. The CPU engine is forced so that the
-- join is long enough on any host.
SET jit = off;  -- (a host without LLVM must not try to JIT the table creation)
SET knn_gpu.device = cpu;
SET knn_gpu.threads = 1;
CREATE TABLE big AS
SELECT i AS id, array_agg(((i * 7919 + j * 104729) % 1000)::real / 1000 ORDER BY j)::vector AS v
FROM generate_series(1, 20000) i, generate_series(1, 256) j GROUP BY i;

SET statement_timeout = '1s';
DO $$
DECLARE
  started timestamptz := clock_timestamp();
BEGIN
  PERFORM count(*) FROM knn_join('SELECT id, v FROM big', 'SELECT id, v FROM big', 10, method => 'brute');
  RAISE NOTICE 'the join finished before the timeout';
EXCEPTION WHEN query_canceled THEN
  RAISE NOTICE 'cancelled; stopped within 1.5 s of the statement start: %',
    clock_timestamp() - started < interval '1.5 s';
END $$;
RESET statement_timeout;

-- The backend is fine afterwards.
SELECT count(*) FROM knn_join('SELECT id, v FROM big WHERE id <= 3', 'SELECT id, v FROM big WHERE id <= 100', 2);
RESET knn_gpu.device;

-- A cancel is answered within 50 ms in every phase of the backend's work:
-- reading rows, sorting them by id, the engine, and handing rows back, for
-- knn_join and for the KNN Join node. A first run of each measures its
-- phases (knn_gpu_last_stats); then statement_timeout is set to the middle
-- of each phase in turn, and each run records how long after the timeout
-- the statement ended.
SET knn_gpu.device = cpu;
SET knn_gpu.threads = 1;
CREATE TABLE phases_q AS
SELECT (i * 7919) % 200003 AS id, format('[%s,%s,%s,%s]', i % 97, i % 89, i % 83, i % 79)::vector AS v
FROM generate_series(1, 200000) i;
CREATE TABLE phases_t AS SELECT id, v FROM phases_q WHERE id % 100 = 0;
ANALYZE phases_q, phases_t;
CREATE TABLE cancel_lateness (what text, phase text, late interval);
CREATE FUNCTION run_until_cancelled(what text, phase text, statement text) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
  started timestamptz := statement_timestamp();
BEGIN
  EXECUTE statement;
  INSERT INTO cancel_lateness VALUES (what, phase, NULL);  -- finished first
EXCEPTION WHEN query_canceled THEN
  INSERT INTO cancel_lateness
  VALUES (what, phase, clock_timestamp() - started - current_setting('statement_timeout')::interval);
END $$;

-- knn_join (the rows it returns are then read by an aggregate that takes its
-- time over each, so a timeout aimed at the return phase always falls
-- before the statement ends). The first run warms up; the second is measured.
\set join 'SELECT count(md5(target_id::text)) FROM knn_join(''SELECT id, v FROM phases_q'', ''SELECT id, v FROM phases_t'', 10, method => ''brute'')'
:join;
:join;
SELECT s->'seconds'->>'read' AS r, s->'seconds'->>'sort' AS s,
       s->'seconds'->>'engine_total' AS e, s->'seconds'->>'return' AS ret
FROM knn_gpu_last_stats() s \gset
SELECT round(1000 * :r / 2) AS t_read, round(1000 * (:r + :s / 2)) AS t_sort,
       round(1000 * (:r + :s + :e / 2)) AS t_engine,
       round(1000 * (:r + :s + :e + :ret / 2)) AS t_return \gset
SET statement_timeout = :t_read;
SELECT run_until_cancelled('knn_join', 'read', :'join');
SET statement_timeout = :t_sort;
SELECT run_until_cancelled('knn_join', 'sort', :'join');
SET statement_timeout = :t_engine;
SELECT run_until_cancelled('knn_join', 'engine', :'join');
SET statement_timeout = :t_return;
SELECT run_until_cancelled('knn_join', 'return', :'join');
RESET statement_timeout;

-- the KNN Join node: rows read by its children, vectors read, the engine,
-- rows handed back (to an aggregate that takes its time over each)
\set lateral 'SELECT count(md5(q.id::text || n.id::text)) FROM phases_q q CROSS JOIN LATERAL (SELECT t.id FROM phases_t t ORDER BY t.v <-> q.v LIMIT 10) n'
:lateral;
SELECT clock_timestamp() AS lateral_start \gset
:lateral;
SELECT extract(epoch FROM clock_timestamp() - :'lateral_start') AS total,
       s->'seconds'->>'read' AS r, s->'seconds'->>'engine_total' AS e
FROM knn_gpu_last_stats() s \gset
SELECT round(1000 * :r / 2) AS t_read, round(1000 * (:r + :e / 2)) AS t_engine,
       round(1000 * (:r + :e + (:total - :r - :e) / 3)) AS t_return \gset
SET statement_timeout = :t_read;
SELECT run_until_cancelled('KNN Join', 'read', :'lateral');
SET statement_timeout = :t_engine;
SELECT run_until_cancelled('KNN Join', 'engine', :'lateral');
SET statement_timeout = :t_return;
SELECT run_until_cancelled('KNN Join', 'return', :'lateral');
RESET statement_timeout;

-- NULL lateness: the statement ended before its timeout (not expected).
SELECT what, phase, late IS NOT NULL AS cancelled, late < interval '50 ms' AS within_50_ms
FROM cancel_lateness ORDER BY what COLLATE "C", phase COLLATE "C";
RESET knn_gpu.device;
RESET knn_gpu.threads;
DROP TABLE phases_q, phases_t, cancel_lateness;
DROP FUNCTION run_until_cancelled(text, text, text);
