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
