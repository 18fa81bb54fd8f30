-- A GPU shared by many sessions: the admission GUCs, the queue for GPU
-- slots (cancellable, visible in pg_stat_activity and the statistics, no
-- slot left behind), and the server-wide GPU probe record. There is no GPU
-- in CI: the superuser-only test hook knn_gpu.fault_injection = admit_cpu
-- makes CPU joins take slots as GPU joins do.
CREATE EXTENSION IF NOT EXISTS dblink;
SET jit = off;
\i sql/error_of.psql
SELECT knn_gpu_last_stats() IS NULL AS library_loaded;

-- The settings: defaults, ranges, who may set them.
SELECT name, setting, unit, context, min_val, max_val FROM pg_settings
WHERE name IN ('knn_gpu.max_gpu_jobs', 'knn_gpu.gpu_memory_budget') ORDER BY name;
-- Cluster-wide: postgresql.conf or ALTER SYSTEM, never per session.
SELECT pg_temp.error_of('SET knn_gpu.max_gpu_jobs = 2');
SELECT pg_temp.error_of('SET knn_gpu.gpu_memory_budget = ''1GB''');
ALTER SYSTEM SET knn_gpu.max_gpu_jobs = 0;
ALTER SYSTEM SET knn_gpu.max_gpu_jobs = 1025;
ALTER SYSTEM SET knn_gpu.gpu_memory_budget = -1;
-- The test hook is a superuser's.
CREATE ROLE knn_admission_user;
SET ROLE knn_admission_user;
SELECT pg_temp.error_of('SET knn_gpu.fault_injection = admit_cpu');
RESET ROLE;
DROP ROLE knn_admission_user;

-- Sessions through dblink; each waits until it sees a setting (a reload
-- reaches a backend at its next command).
\i sql/dblink_sessions.psql
-- The state of the backend that runs a query starting with prefix, once it
-- waits on the extension (up to 30 s).
CREATE FUNCTION pg_temp.seen_waiting(prefix text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
  seen text;
BEGIN
  FOR i IN 1 .. 3000 LOOP
    PERFORM pg_stat_clear_snapshot();  -- else one transaction sees one snapshot
    SELECT state || ' / ' || wait_event_type || ' / ' || wait_event INTO seen
    FROM pg_stat_activity
    WHERE pid <> pg_backend_pid() AND query LIKE prefix || '%' AND wait_event_type = 'Extension';
    IF seen IS NOT NULL THEN
      RETURN seen;
    END IF;
    PERFORM pg_sleep(0.01);
  END LOOP;
  RETURN 'not seen';
END $$;

-- The process title of the backend running a query starting with prefix.
CREATE FUNCTION pg_temp.waiter_title(prefix text) RETURNS text LANGUAGE sql AS $$
  SELECT encode(pg_read_binary_file('/proc/' || pid || '/cmdline'), 'escape')
  FROM pg_stat_activity WHERE pid <> pg_backend_pid() AND query LIKE prefix || '%' $$;
-- Whether the backend running a query starting with prefix waits for a
-- slot, by its process title, polled up to 30 s: the extension wait
-- seen_waiting sees first may be the engine's, before its job asks for the
-- slot.
CREATE FUNCTION pg_temp.title_shows_slot_wait(prefix text) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
  FOR i IN 1 .. 3000 LOOP
    PERFORM pg_stat_clear_snapshot();  -- else one transaction sees one snapshot
    IF pg_temp.waiter_title(prefix) LIKE '%waiting for a GPU slot%' THEN
      RETURN true;
    END IF;
    PERFORM pg_sleep(0.01);
  END LOOP;
  RETURN false;
END $$;

-- Replaces the probe record with these lines (COPY wants an absolute path).
CREATE FUNCTION pg_temp.write_record(lines text[]) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
  EXECUTE format('COPY (SELECT unnest(%L::text[])) TO %L', lines,
                 current_setting('data_directory') || '/pg_stat_tmp/knn_gpu_probe');
END $$;

-- ---- The probe record: one GPU probe per server run ----
-- A damaged record means "probe again": the next session probes, and
-- writes a valid record.
SELECT pg_temp.write_record(ARRAY['knn_gpu probe record 1', 'key garbage', 'usable 0',
                                  'reason damaged', 'check 0000000000000000']);
SELECT pg_temp.connect('prober') AS connected;
SELECT info !~ 'probe record' AS probed_itself FROM dblink('prober', 'SELECT knn_gpu_info()') AS r(info text);
SELECT split_part(pg_read_file('pg_stat_tmp/knn_gpu_probe'), E'\n', 1) AS header,
       split_part(pg_read_file('pg_stat_tmp/knn_gpu_probe'), E'\n', 3) IN ('usable 0', 'usable 1') AS outcome,
       split_part(pg_read_file('pg_stat_tmp/knn_gpu_probe'), E'\n', 5) ~ '^check [0-9a-f]{16}$' AS checked;
SELECT dblink_disconnect('prober') AS disconnected;
-- A later session does not probe where the record says there is no GPU:
-- knn_gpu_info() and the join's device say the record answered (where a
-- GPU is usable, it is used instead).
SELECT pg_temp.connect('reader') AS connected;
SELECT CASE WHEN split_part(pg_read_file('pg_stat_tmp/knn_gpu_probe'), E'\n', 3) = 'usable 0'
            THEN info ~ '^cpu: .*; from the server''s probe record\)'
            ELSE info ~ '^gpu: ' END AS info_from_record
FROM dblink('reader', 'SELECT knn_gpu_info()') AS r(info text);
CREATE TABLE admission_small AS
SELECT i AS id, format('[%s,%s]', i % 7, i % 5)::vector AS v FROM generate_series(1, 50) i;
SELECT count(*) AS rows, bool_and(n = 3) AS three_each FROM (
  SELECT query_id, count(*) AS n FROM dblink('reader',
    'SELECT query_id FROM knn_join(''SELECT id, v FROM admission_small'', ''SELECT id, v FROM admission_small'', 3)')
    AS r(query_id bigint) GROUP BY query_id) c;
SELECT CASE WHEN split_part(pg_read_file('pg_stat_tmp/knn_gpu_probe'), E'\n', 3) = 'usable 0'
            THEN device ~ '^cpu.*\[no GPU: server''s probe record\]'
            ELSE engine = 'gpu' OR device ~ '\[GPU not ready, CPU answers sooner\]' END AS device_from_record
FROM dblink('reader', 'SELECT knn_gpu_last_stats()->>''device'', knn_gpu_last_stats()->>''engine''')
  AS r(device text, engine text);
-- knn_gpu.device = gpu still loads the module and asks the driver.
SELECT dblink_exec('reader', 'SET knn_gpu.device = gpu') AS set_device;
SELECT count(*) AS rows FROM dblink('reader',
  'SELECT query_id FROM knn_join(''SELECT id, v FROM admission_small'', ''SELECT id, v FROM admission_small'', 3)')
  AS r(query_id bigint);
SELECT device !~ 'probe record' AS probed_again
FROM dblink('reader', 'SELECT knn_gpu_last_stats()->>''device''') AS r(device text);
SELECT dblink_disconnect('reader') AS disconnected;
-- A record whose checksum does not match is not trusted either.
SELECT pg_temp.write_record(array_agg(regexp_replace(line, '^reason .*', 'reason forged')))
FROM regexp_split_to_table(rtrim(pg_read_file('pg_stat_tmp/knn_gpu_probe'), E'\n'), E'\n') AS line;
SELECT pg_temp.connect('forged') AS connected;
SELECT info !~ 'forged' AS forged_ignored FROM dblink('forged', 'SELECT knn_gpu_info()') AS r(info text);
SELECT pg_read_file('pg_stat_tmp/knn_gpu_probe') !~ 'forged' AS rewritten;
SELECT dblink_disconnect('forged') AS disconnected;

-- ---- The queue: one slot, three sessions ----
ALTER SYSTEM SET knn_gpu.max_gpu_jobs = 1;
ALTER SYSTEM SET knn_gpu.gpu_memory_budget = '64GB';
SELECT pg_reload_conf() AS reloaded;
CREATE TABLE admission_rows AS
SELECT i AS id, array_agg(((i * 7919 + j * 104729) % 1000)::real / 1000 ORDER BY j)::vector AS v
FROM generate_series(1, 60000) i, generate_series(1, 64) j GROUP BY i;
SELECT pg_temp.connect('holder') AS connected, pg_temp.connect('waiter') AS connected_too;
SELECT pg_temp.await_setting('holder', 'knn_gpu.max_gpu_jobs', '1') AS holder_sees_one_slot,
       pg_temp.await_setting('waiter', 'knn_gpu.max_gpu_jobs', '1') AS waiter_sees_one_slot;
SELECT dblink_exec(c, 'SET knn_gpu.device = cpu') AS set_device,
       dblink_exec(c, 'SET knn_gpu.threads = 1') AS set_threads,
       dblink_exec(c, 'SET knn_gpu.fault_injection = admit_cpu') AS set_hook
FROM unnest(ARRAY['holder', 'waiter']) AS c;
-- The holder takes the slot with a long join (L1 brute force on one thread).
SELECT dblink_send_query('holder',
  'SELECT count(*) FROM knn_join(''SELECT id, v FROM admission_rows'', ''SELECT id, v FROM admission_rows'', 10, ''l1'', method => ''brute'')') AS sent;
SELECT pg_temp.seen_waiting('SELECT count(*) FROM knn_join(''SELECT id, v FROM admission_rows''') AS holder;
SELECT pg_sleep(0.2);
-- A small join now waits for the slot: shown as an extension wait, and
-- still running long after it would have finished.
SELECT dblink_send_query('waiter',
  'SELECT count(*) FROM knn_join(''SELECT id, v FROM admission_small'', ''SELECT id, v FROM admission_small'', 3)') AS sent;
SELECT pg_temp.title_shows_slot_wait('SELECT count(*) FROM knn_join(''SELECT id, v FROM admission_small''') AS waiter_queued;
SELECT pg_sleep(0.5);
SELECT dblink_is_busy('waiter') AS still_waiting;
-- A cancel ends the wait at once.
SELECT clock_timestamp() AS cancel_sent \gset
SELECT dblink_cancel_query('waiter') AS cancel;
SELECT count(*) AS rows FROM dblink_get_result('waiter', false) AS r(count bigint);
SELECT clock_timestamp() - :'cancel_sent'::timestamptz < interval '1 second' AS cancelled_quickly,
       dblink_error_message('waiter') AS error;
SELECT count(*) AS rows FROM dblink_get_result('waiter', false) AS r(count bigint);
-- So does statement_timeout.
SELECT dblink_exec('waiter', 'SET statement_timeout = ''300ms''') AS set_timeout;
SELECT clock_timestamp() AS sent_at \gset
SELECT dblink_send_query('waiter',
  'SELECT count(*) FROM knn_join(''SELECT id, v FROM admission_small'', ''SELECT id, v FROM admission_small'', 3)') AS sent;
SELECT count(*) AS rows FROM dblink_get_result('waiter', false) AS r(count bigint);
SELECT clock_timestamp() - :'sent_at'::timestamptz BETWEEN interval '250 ms' AND interval '1300 ms' AS timed_out_in_time,
       dblink_error_message('waiter') AS error;
SELECT count(*) AS rows FROM dblink_get_result('waiter', false) AS r(count bigint);
SELECT dblink_exec('waiter', 'RESET statement_timeout') AS reset_timeout;
-- A cancel caught inside a function gives the process title back: the
-- statement goes on without "waiting for a GPU slot" (read from the
-- backend's command line, where PostgreSQL writes its title). One cancel
-- request can reach a backend as two signals (PostgreSQL signals it and
-- its process group): the function absorbs a second one.
CREATE FUNCTION admission_caught_wait() RETURNS text LANGUAGE plpgsql AS $$
DECLARE
  title text;
BEGIN
  BEGIN
    PERFORM count(*) FROM knn_join('SELECT id, v FROM admission_small', 'SELECT id, v FROM admission_small', 3);
  EXCEPTION WHEN query_canceled THEN
    NULL;
  END;
  FOR i IN 1 .. 3 LOOP
    BEGIN
      title := encode(pg_read_binary_file('/proc/' || pg_backend_pid() || '/cmdline'), 'escape');
      PERFORM pg_sleep(0.2);
      EXIT;
    EXCEPTION WHEN query_canceled THEN
      NULL;
    END;
  END LOOP;
  RETURN title;
END $$;
SELECT dblink_send_query('waiter', 'SELECT admission_caught_wait()') AS sent;
SELECT pg_temp.title_shows_slot_wait('SELECT admission_caught_wait()') AS title_while_waiting;
SELECT dblink_cancel_query('waiter') AS cancel;
SELECT title NOT LIKE '%waiting for a GPU slot%' AS title_given_back, title LIKE '%SELECT%' AS title_read
FROM dblink_get_result('waiter') AS r(title text);
SELECT count(*) AS rows FROM dblink_get_result('waiter', false) AS r(s text);
DROP FUNCTION admission_caught_wait();
-- A range join takes a slot too (on the GPU it draws from the budget as a
-- join does): it waits, titled so, and a cancel ends the wait.
SELECT dblink_send_query('waiter',
  'SELECT count(*) FROM knn_range_join(''SELECT id, v FROM admission_small'', ''SELECT id, v FROM admission_small'', 1.5)') AS sent;
SELECT pg_temp.title_shows_slot_wait('SELECT count(*) FROM knn_range_join(') AS range_join_titled_waiting;
SELECT pg_sleep(0.3);
SELECT dblink_is_busy('waiter') AS range_join_still_waiting;
SELECT dblink_cancel_query('waiter') AS cancel;
SELECT count(*) AS rows FROM dblink_get_result('waiter', false) AS r(count bigint);
SELECT dblink_error_message('waiter') LIKE '%cancel%' AS range_join_cancelled;
SELECT count(*) AS rows FROM dblink_get_result('waiter', false) AS r(count bigint);
-- A join that waits gets the slot when the holder ends (here: is
-- cancelled), and its statistics say how long it queued.
SELECT dblink_send_query('waiter',
  'SELECT count(*) FROM knn_join(''SELECT id, v FROM admission_small'', ''SELECT id, v FROM admission_small'', 3)') AS sent;
SELECT pg_temp.title_shows_slot_wait('SELECT count(*) FROM knn_join(''SELECT id, v FROM admission_small''') AS waiter_queued;
SELECT pg_sleep(0.3);
SELECT dblink_cancel_query('holder') AS cancel_holder;
SELECT count(*) AS rows FROM dblink_get_result('holder', false) AS r(count bigint);
SELECT dblink_error_message('holder') LIKE '%cancel%' AS holder_cancelled;
SELECT count(*) AS rows FROM dblink_get_result('holder', false) AS r(count bigint);
SELECT * FROM dblink_get_result('waiter') AS r(count bigint);
SELECT count(*) AS rows FROM dblink_get_result('waiter', false) AS r(count bigint);
SELECT s->'admission'->>'slot' AS slot, s->'admission'->>'max_gpu_jobs' AS max_gpu_jobs,
       s->'admission'->>'queued' AS queued,
       (s->'seconds'->>'queued')::float8 >= 0.25 AS queued_while_holder_ran,
       s->'admission'->>'gpu_memory_limit_mb' AS gpu_memory_limit_mb
FROM dblink('waiter', 'SELECT knn_gpu_last_stats()') AS r(s json);
-- No slot is left behind by the cancelled joins: the next join takes the
-- slot at once, with its own gpu_memory_limit where that is smaller than
-- its share of the budget.
SELECT dblink_exec('waiter', 'SET knn_gpu.gpu_memory_limit = ''1000MB''') AS set_limit;
SELECT count(*) AS rows FROM dblink('waiter',
  'SELECT query_id FROM knn_join(''SELECT id, v FROM admission_small'', ''SELECT id, v FROM admission_small'', 3)')
  AS r(query_id bigint);
SELECT s->'admission'->>'slot' AS slot, s->'admission'->>'queued' AS queued,
       (s->'seconds'->>'queued')::float8 < 0.1 AS not_queued,
       s->'admission'->>'gpu_memory_limit_mb' AS gpu_memory_limit_mb
FROM dblink('waiter', 'SELECT knn_gpu_last_stats()') AS r(s json);
-- EXPLAIN ANALYZE shows the slot (the KNN Join node).
SELECT line FROM dblink('waiter', $$
  EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF)
  SELECT q.id, n.id FROM admission_small q CROSS JOIN LATERAL (
    SELECT t.id FROM admission_small t ORDER BY t.v <-> q.v LIMIT 3) n$$) AS r(line text)
WHERE line ~ 'GPU Slot';
-- A join that does not take a slot (no GPU, no hook) says so.
SELECT dblink_exec('waiter', 'RESET knn_gpu.fault_injection') AS reset_hook;
SELECT count(*) AS rows FROM dblink('waiter',
  'SELECT query_id FROM knn_join(''SELECT id, v FROM admission_small'', ''SELECT id, v FROM admission_small'', 3)')
  AS r(query_id bigint);
SELECT s->'admission' AS admission, (s->'seconds'->>'queued')::float8 AS seconds_queued
FROM dblink('waiter', 'SELECT knn_gpu_last_stats()') AS r(s json);
-- A backend that ends while it waits leaves no slot behind either.
SELECT dblink_exec('waiter', 'SET knn_gpu.fault_injection = admit_cpu') AS set_hook;
SELECT dblink_send_query('holder',
  'SELECT count(*) FROM knn_join(''SELECT id, v FROM admission_rows'', ''SELECT id, v FROM admission_rows'', 10, ''l1'', method => ''brute'')') AS sent;
SELECT pg_temp.seen_waiting('SELECT count(*) FROM knn_join(''SELECT id, v FROM admission_rows''') AS holder;
SELECT pg_sleep(0.2);
SELECT dblink_send_query('waiter',
  'SELECT count(*) FROM knn_join(''SELECT id, v FROM admission_small'', ''SELECT id, v FROM admission_small'', 3)') AS sent;
SELECT pg_temp.title_shows_slot_wait('SELECT count(*) FROM knn_join(''SELECT id, v FROM admission_small''') AS waiter_queued;
SELECT pg_terminate_backend(pid, 5000) AS terminated_holder FROM pg_stat_activity
WHERE pid <> pg_backend_pid() AND state = 'active'
  AND query LIKE 'SELECT count(*) FROM knn_join(''SELECT id, v FROM admission_rows''%';
SELECT * FROM dblink_get_result('waiter') AS r(count bigint);
SELECT count(*) AS rows FROM dblink_get_result('waiter', false) AS r(count bigint);
SELECT knn_gpu_last_stats IS NOT NULL AND (knn_gpu_last_stats->'admission'->>'queued')::boolean AS waiter_got_the_slot
FROM dblink('waiter', 'SELECT knn_gpu_last_stats()') AS r(knn_gpu_last_stats json);
SELECT dblink_disconnect('waiter') AS disconnected;
SELECT dblink_disconnect('holder') AS disconnected;

ALTER SYSTEM RESET knn_gpu.max_gpu_jobs;
ALTER SYSTEM RESET knn_gpu.gpu_memory_budget;
SELECT pg_reload_conf() AS reloaded;
DROP TABLE admission_rows, admission_small;
DROP EXTENSION dblink;
