-- The GPU service (knn_gpu.gpu_service): one background worker that runs
-- the backends' k-NN joins. There is no GPU in CI: the superuser-only test
-- hook knn_gpu.fault_injection = service_cpu starts the service as a CPU
-- stand-in that runs each job it receives on its CPU engine, so that the
-- real transport, worker, cancel and death paths are exercised.
CREATE EXTENSION IF NOT EXISTS dblink;
SET jit = off;
\i sql/error_of.psql
\i sql/dblink_sessions.psql
SELECT knn_gpu_last_stats() IS NULL AS library_loaded;

-- The setting: off by default, for the whole server (reload), not per session.
SELECT name, setting, context FROM pg_settings WHERE name = 'knn_gpu.gpu_service';
SELECT pg_temp.error_of('SET knn_gpu.gpu_service = on');
CREATE ROLE knn_service_user;
SET ROLE knn_service_user;
SELECT pg_temp.error_of('SET knn_gpu.fault_injection = service_cpu');
RESET ROLE;
DROP ROLE knn_service_user;

CREATE TABLE svc_rows AS
SELECT i AS id, array_agg(((i * 7919 + j * 104729) % 1000)::real / 1000 ORDER BY j)::vector AS v
FROM generate_series(1, 1500) i, generate_series(1, 24) j GROUP BY i;
INSERT INTO svc_rows SELECT id + 10000, v FROM svc_rows WHERE id <= 40;  -- duplicate rows: ties
CREATE TABLE svc_bits AS
SELECT i AS id, (SELECT string_agg(((i * j * 7919) % 3 = 0)::int::text, '') FROM generate_series(1, 70) j)::bit(70) AS b
FROM generate_series(1, 800) i;

-- The service's answer against the in-process CPU engine's, row for row.
CREATE FUNCTION pg_temp.through_service(queries text, targets text, k int,
                                        metric text DEFAULT 'l2', exclude_self boolean DEFAULT false)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
  missing bigint;
  extra bigint;
  n bigint;
  device text;
BEGIN
  PERFORM set_config('knn_gpu.fault_injection', 'none', true);
  PERFORM set_config('knn_gpu.device', 'cpu', true);
  CREATE TEMP TABLE expected_rows AS
  SELECT * FROM knn_join(queries, targets, k, metric => metric, exclude_self => exclude_self);
  PERFORM set_config('knn_gpu.fault_injection', 'service_cpu', true);
  PERFORM set_config('knn_gpu.device', 'gpu', true);
  CREATE TEMP TABLE served_rows AS
  SELECT * FROM knn_join(queries, targets, k, metric => metric, exclude_self => exclude_self);
  device := knn_gpu_last_stats()->>'device';
  SELECT count(*) INTO missing FROM (SELECT * FROM expected_rows EXCEPT ALL SELECT * FROM served_rows) d;
  SELECT count(*) INTO extra FROM (SELECT * FROM served_rows EXCEPT ALL SELECT * FROM expected_rows) d;
  SELECT count(*) INTO n FROM served_rows;
  DROP TABLE expected_rows;
  DROP TABLE served_rows;
  RETURN format('%s rows, %s missing, %s extra, via the service: %s',
                n, missing, extra, device LIKE '% via GPU service');
END $$;

-- Waits until no service runs (its socket gone with it).
CREATE FUNCTION pg_temp.await_no_service() RETURNS text LANGUAGE plpgsql AS $$
BEGIN
  FOR i IN 1 .. 1000 LOOP
    PERFORM pg_stat_clear_snapshot();
    IF NOT EXISTS (SELECT FROM pg_stat_activity WHERE backend_type = 'knn_gpu service') THEN
      RETURN 'no service; socket left: ' ||
        EXISTS (SELECT FROM pg_ls_dir('pg_stat_tmp') f WHERE f LIKE 'knn_gpu_service.sock%');
    END IF;
    PERFORM pg_sleep(0.01);
  END LOOP;
  RETURN 'the service still runs';
END $$;
-- No service runs before the first join (one left by an earlier run is
-- stopped). Its socket file is not looked at here: one may be left by a
-- service that died without its cleanup before this test (a crash, kill -9,
-- an immediate shutdown: nothing clears pg_stat_tmp), and such a file is no
-- service (README); the first join's service replaces it, checked below.
SELECT count(*) >= 0 AS stopped FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE backend_type = 'knn_gpu service') t;
SELECT split_part(pg_temp.await_no_service(), ';', 1) AS before_the_first_join;
CREATE TEMP TABLE test_start AS SELECT date_trunc('second', clock_timestamp()) AS at;

-- The first join starts the service (device = gpu waits for it), which
-- listens on a socket file of its own (made since this test began).
SELECT pg_temp.through_service('SELECT id, v FROM svc_rows WHERE id % 7 = 0', 'SELECT id, v FROM svc_rows', 5);
SELECT count(*) AS services FROM pg_stat_activity WHERE backend_type = 'knn_gpu service';
SELECT (pg_stat_file('pg_stat_tmp/knn_gpu_service.sock')).modification >= at AS its_own_socket
FROM test_start;
SELECT pg_temp.through_service('SELECT id, v FROM svc_rows WHERE id % 5 = 0', 'SELECT id, v FROM svc_rows', 3, 'cosine');
SELECT pg_temp.through_service('SELECT id, v FROM svc_rows WHERE id % 5 = 0', 'SELECT id, v FROM svc_rows', 4, 'ip');
SELECT pg_temp.through_service('SELECT id, v FROM svc_rows WHERE id % 5 = 0', 'SELECT id, v FROM svc_rows', 2, 'l1');
SELECT pg_temp.through_service('SELECT id, v FROM svc_rows', 'SELECT id, v FROM svc_rows', 6, exclude_self => true);
SELECT pg_temp.through_service('SELECT id, v::halfvec FROM svc_rows WHERE id < 300', 'SELECT id, v::halfvec FROM svc_rows', 5);
SELECT pg_temp.through_service('SELECT id, b FROM svc_bits WHERE id < 100', 'SELECT id, b FROM svc_bits', 7, 'hamming');
-- Rows read out of id order: sorted in place in the shared row buffer.
SELECT pg_temp.through_service('SELECT id, v FROM svc_rows WHERE id % 3 = 0 ORDER BY id DESC',
                               'SELECT id, v FROM svc_rows ORDER BY (id * 7919) % 1543', 5);
SELECT pg_temp.through_service('SELECT id, v FROM svc_rows ORDER BY (id * 31) % 101', 'SELECT id, v FROM svc_rows ORDER BY (id * 31) % 101', 4, exclude_self => true);
-- k above the number of targets, and an empty side.
SELECT pg_temp.through_service('SELECT id, v FROM svc_rows WHERE id < 4', 'SELECT id, v FROM svc_rows WHERE id < 10', 25);
SELECT pg_temp.through_service('SELECT id, v FROM svc_rows WHERE id < 4', 'SELECT id, v FROM svc_rows WHERE id < 0', 3);

-- The rows went to the service in this backend's shared row buffer: one
-- memfd, mapped here, the same one join after join (its inode).
CREATE FUNCTION pg_temp.row_buffers() RETURNS text LANGUAGE sql AS $$
  SELECT string_agg(DISTINCT (regexp_match(l, '\s(\d+)\s+/memfd:knn_gpu_rows'))[1], ',')
  FROM regexp_split_to_table(pg_read_file('/proc/self/maps'), '\n') l
  WHERE l LIKE '%/memfd:knn_gpu_rows%' $$;
-- Test hooks (knn_gpu_service.c): segments live in this backend, jobs it
-- sent in the buffer (not copied into a memfd of their own), and every
-- later growth of a segment failing.
CREATE FUNCTION pg_temp.rows_live() RETURNS bigint
  AS 'knn_gpu', 'knn_gpu_service_test_rows_live' LANGUAGE C STRICT;
CREATE FUNCTION pg_temp.rows_jobs() RETURNS bigint
  AS 'knn_gpu', 'knn_gpu_service_test_rows_jobs' LANGUAGE C STRICT;
CREATE FUNCTION pg_temp.rows_fail_growth(boolean) RETURNS void
  AS 'knn_gpu', 'knn_gpu_service_test_rows_fail_growth' LANGUAGE C STRICT;
CREATE TEMP TABLE buffer_before AS SELECT pg_temp.row_buffers() AS inode, pg_temp.rows_jobs() AS jobs;
SELECT pg_temp.through_service('SELECT id, v FROM svc_rows WHERE id % 7 = 0', 'SELECT id, v FROM svc_rows', 5);
SELECT inode IS NOT NULL AS one_buffer, inode NOT LIKE '%,%' AS only_one,
       inode = pg_temp.row_buffers() AS the_same_after_a_join,
       pg_temp.rows_jobs() > jobs AS the_job_was_the_buffer,
       pg_temp.rows_live() AS segments_left
FROM buffer_before;

-- An ERROR while the rows are read (a dimension mismatch past the first
-- rows) frees their segments with the statement.
SET knn_gpu.fault_injection = service_cpu;
SET knn_gpu.device = gpu;
SELECT pg_temp.error_of($q$SELECT count(*) FROM knn_join('SELECT id, v FROM svc_rows WHERE id < 50',
  'SELECT id, v FROM svc_rows UNION ALL SELECT 0, ''[1,2,3]''::vector', 3)$q$);
SELECT pg_temp.rows_live() AS segments_after_the_error;
RESET knn_gpu.fault_injection;
RESET knn_gpu.device;

-- A segment that cannot grow (memory ran out): the matrix's rows move to
-- the backend's own memory (4000-byte rows: past the first 4 MB at row
-- 1049) and the answer is the same.
CREATE TABLE svc_wide AS
SELECT i AS id, array_fill((i % 97)::real / 97 + i / 100000.0, ARRAY[1000])::vector AS v
FROM generate_series(1, 1200) i;
SELECT pg_temp.rows_fail_growth(true);
SELECT pg_temp.through_service('SELECT id, v FROM svc_wide WHERE id % 10 = 0', 'SELECT id, v FROM svc_wide', 4);
SELECT pg_temp.rows_fail_growth(false);
SELECT pg_temp.through_service('SELECT id, v FROM svc_wide WHERE id % 10 = 0', 'SELECT id, v FROM svc_wide', 4);
SELECT pg_temp.rows_live() AS segments_left;
DROP TABLE svc_wide;

-- EXPLAIN ANALYZE names the engine that ran, in the service.
SET knn_gpu.fault_injection = service_cpu;
SET knn_gpu.device = gpu;
CREATE FUNCTION pg_temp.engine_device_line(statement text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
  line text;
BEGIN
  FOR line IN EXECUTE 'EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) ' || statement LOOP
    IF line LIKE '%Engine Device:%' THEN
      RETURN regexp_replace(line, '^.*Engine Device: cpu \([0-9]+ threads?\)', 'Engine Device: cpu (N threads)');
    END IF;
  END LOOP;
  RETURN 'no Engine Device line';
END $$;
SELECT pg_temp.engine_device_line($q$
  SELECT q.id, t.id FROM svc_rows q CROSS JOIN LATERAL
    (SELECT id FROM svc_rows t ORDER BY t.v <-> q.v LIMIT 3) t WHERE q.id < 20 $q$);

-- statement_timeout while the service runs the job: the service's engine
-- stops (the backend set the job's cancel word), the statement ends within
-- a fraction of a second of its timeout, and the service lives on.
SET knn_gpu.threads = 1;
CREATE TABLE svc_big AS
SELECT i AS id, array_agg(((i * 7919 + j * 104729) % 1000)::real / 1000 ORDER BY j)::vector AS v
FROM generate_series(1, 20000) i, generate_series(1, 128) j GROUP BY i;
CREATE TEMP TABLE service_pid AS SELECT pid FROM pg_stat_activity WHERE backend_type = 'knn_gpu service';
SET statement_timeout = '500ms';
DO $$
DECLARE
  started timestamptz := clock_timestamp();
BEGIN
  PERFORM count(*) FROM knn_join('SELECT id, v FROM svc_big', 'SELECT id, v FROM svc_big', 10, method => 'brute');
  RAISE NOTICE 'the join finished before the timeout';
EXCEPTION WHEN query_canceled THEN
  RAISE NOTICE 'cancelled; stopped within 1 s of the statement start: %',
    clock_timestamp() - started < interval '1 s';
END $$;
RESET statement_timeout;
SELECT pid = (SELECT pid FROM service_pid) AS same_service
FROM pg_stat_activity WHERE backend_type = 'knn_gpu service';
SELECT pg_temp.through_service('SELECT id, v FROM svc_rows WHERE id < 50', 'SELECT id, v FROM svc_rows', 3);

-- Another session watches for this one to wait on its next join for
-- 0.15 s, then signals the service with `signal` (pg_cancel_backend or
-- pg_terminate_backend).
SELECT pg_temp.connect('killer');
CREATE FUNCTION pg_temp.signal_service_during_next_join(signal text) RETURNS void LANGUAGE sql AS $f$
  SELECT dblink_send_query('killer', format($k$
    DO $$
    BEGIN
      FOR i IN 1 .. 2000 LOOP
        PERFORM pg_stat_clear_snapshot();
        EXIT WHEN EXISTS (SELECT FROM pg_stat_activity WHERE pid = %s AND wait_event_type = 'Extension');
        PERFORM pg_sleep(0.005);
      END LOOP;
      PERFORM pg_sleep(0.15);
      PERFORM %I(pid) FROM pg_stat_activity WHERE backend_type = 'knn_gpu service';
    END $$ $k$, pg_backend_pid(), signal));
$f$;
-- pg_cancel_backend() on the service (an administrator cancelling every
-- long-running process) is ignored: the join it runs ends with every row,
-- and the same service goes on. (A join is cancelled from its backend.)
SELECT pg_temp.signal_service_during_next_join('pg_cancel_backend');
SELECT count(*) AS rows, count(DISTINCT query_id) AS queries
FROM knn_join('SELECT id, v FROM svc_big WHERE id <= 3000', 'SELECT id, v FROM svc_big', 10, method => 'brute');
SELECT knn_gpu_last_stats()->>'device' LIKE '%via GPU service' AS through_the_service;
SELECT * FROM dblink_get_result('killer') AS r(x text);
SELECT * FROM dblink_get_result('killer') AS r(x text);  -- the end of its results
SELECT pg_sleep(0.2);
SELECT pid = (SELECT pid FROM service_pid) AS same_service
FROM pg_stat_activity WHERE backend_type = 'knn_gpu service';

-- The service terminated while it runs a join. Under device = gpu: a clear ERROR.
SELECT pg_temp.signal_service_during_next_join('pg_terminate_backend');
SELECT pg_temp.error_of($$SELECT count(*) FROM knn_join('SELECT id, v FROM svc_big', 'SELECT id, v FROM svc_big', 10, method => 'brute')$$);
SELECT * FROM dblink_get_result('killer') AS r(x text);
SELECT * FROM dblink_get_result('killer') AS r(x text);  -- the end of its results
-- The join left without the service's answer: its row buffer is never used again.
SELECT inode <> coalesce(pg_temp.row_buffers(), '') AS buffer_dropped FROM buffer_before;
-- The service has gone, and its socket with it.
SELECT pg_temp.await_no_service();
-- The next join starts a new service.
SELECT pg_temp.through_service('SELECT id, v FROM svc_rows WHERE id < 50', 'SELECT id, v FROM svc_rows', 3);
SELECT pid <> (SELECT pid FROM service_pid) AS new_service
FROM pg_stat_activity WHERE backend_type = 'knn_gpu service';
SELECT inode <> pg_temp.row_buffers() AS a_new_buffer FROM buffer_before;

-- Under device = auto the CPU engine answers instead, with a notice.
SET knn_gpu.device = auto;
SELECT pg_temp.signal_service_during_next_join('pg_terminate_backend');
SELECT count(*) FROM knn_join('SELECT id, v FROM svc_big WHERE id <= 12000', 'SELECT id, v FROM svc_big', 10, method => 'brute');
SELECT knn_gpu_last_stats()->>'device' LIKE '%[GPU service failed, CPU engine ran]' AS cpu_answered;
SELECT * FROM dblink_get_result('killer') AS r(x text);
SELECT * FROM dblink_get_result('killer') AS r(x text);  -- the end of its results
SELECT pg_temp.await_no_service();
SELECT dblink_disconnect('killer');

-- Nothing left behind: a final service is stopped, its socket removed.
SELECT pg_temp.through_service('SELECT id, v FROM svc_rows WHERE id < 50', 'SELECT id, v FROM svc_rows', 3);
SELECT count(*) AS stopped FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE backend_type = 'knn_gpu service') t;
SELECT pg_temp.await_no_service();
RESET knn_gpu.threads;
RESET knn_gpu.device;
RESET knn_gpu.fault_injection;

-- The real service (the server's setting) and device = gpu on a host
-- without a usable GPU: the service finds none and leaves, and the join
-- stops waiting for it at the server's probe record (not after 30 s); the
-- CPU engine answers, with the usual notice, as without the service.
ALTER SYSTEM SET knn_gpu.gpu_service = on;
SELECT pg_reload_conf() AS reloaded;
SELECT pg_sleep(0.5);
SHOW knn_gpu.gpu_service;
SET knn_gpu.device = gpu;
SET client_min_messages = warning;
DO $$
DECLARE
  started timestamptz := clock_timestamp();
  n bigint;
BEGIN
  SELECT count(*) INTO n
  FROM knn_join('SELECT id, v FROM svc_rows WHERE id < 50', 'SELECT id, v FROM svc_rows', 3);
  CREATE TEMP TABLE no_gpu_join AS
  SELECT n, clock_timestamp() - started < interval '5 s' AS no_long_wait;
END $$;
SELECT n, no_long_wait,
       knn_gpu_info() ~ '^gpu: ' OR knn_gpu_last_stats()->>'device' LIKE 'cpu%' AS cpu_without_gpu
FROM no_gpu_join;
RESET client_min_messages;
RESET knn_gpu.device;
ALTER SYSTEM RESET knn_gpu.gpu_service;
SELECT pg_reload_conf() AS reloaded;
SELECT pg_sleep(0.5);
SHOW knn_gpu.gpu_service;
SELECT count(*) >= 0 AS stopped FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE backend_type = 'knn_gpu service') t;
SELECT pg_temp.await_no_service();
DROP TABLE svc_rows, svc_bits, svc_big;
DROP EXTENSION dblink;
