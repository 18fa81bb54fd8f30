-- A running join's progress, seen from another session: a second session
-- (dblink) runs a long CPU join, this one polls the knn_gpu_progress view
-- until the join is in the engine, checks the counts it shows and the wait
-- event beside it in pg_stat_activity, then cancels the join: its row goes.
SET client_min_messages = warning;	-- another test may have created dblink
CREATE EXTENSION IF NOT EXISTS dblink;
RESET client_min_messages;
SET jit = off;
CREATE TABLE progress_rows AS
SELECT i AS id, array_agg(((i * 7919 + j * 104729) % 1000)::real / 1000 ORDER BY j)::vector AS v
FROM generate_series(1, 20000) i, generate_series(1, 128) j GROUP BY i;
-- Nothing runs: no row.
SELECT count(*) AS rows FROM knn_gpu_progress;
SELECT dblink_connect('watched', format('host=%s port=%s dbname=%s',
  split_part(current_setting('unix_socket_directories'), ',', 1),
  current_setting('port'), current_database())) AS connected;
SELECT dblink_exec('watched', 'SET knn_gpu.device = cpu') AS set_device;
SELECT dblink_exec('watched', 'SET knn_gpu.threads = 1') AS set_threads;
SELECT dblink_send_query('watched',
  'SELECT count(*) FROM knn_join(''SELECT id, v FROM progress_rows'', ''SELECT id, v FROM progress_rows WHERE id > 0'', 10, method => ''brute'')') AS sent;
-- Poll (up to 60 s) until the other backend's join waits for the engine; the
-- phases seen on the way are those of a join (any of them may be too short to see).
CREATE FUNCTION pg_temp.watch() RETURNS TABLE (phases_seen_valid boolean, source text, phase text,
  k integer, queries_read bigint, targets_read bigint, queries bigint, targets bigint,
  computations_known boolean, rows_returned bigint, wait_event_type text, elapsed_positive boolean)
LANGUAGE plpgsql AS $$
DECLARE
  seen text[] := '{}';
  p record;
BEGIN
  FOR i IN 1 .. 6000 LOOP
    FOR p IN SELECT g.*, a.wait_event_type AS wait FROM knn_gpu_progress g JOIN pg_stat_activity a USING (pid)
             WHERE g.pid <> pg_backend_pid() LOOP
      seen := seen || p.phase;
      -- the wait event is set right after the phase is written
      IF p.phase = 'engine running' AND p.wait = 'Extension' THEN
        RETURN QUERY SELECT seen <@ ARRAY['reading queries', 'reading targets', 'sorting', 'engine running'],
          p.source, p.phase, p.k, p.queries_read, p.targets_read, p.queries, p.targets,
          p.distance_computations IS NOT NULL, p.rows_returned, p.wait::text, p.elapsed > interval '0';
        RETURN;
      END IF;
    END LOOP;
    PERFORM pg_sleep(0.01);
    -- pg_stat_activity is read once per transaction unless cleared
    PERFORM pg_stat_clear_snapshot();
  END LOOP;
  RETURN QUERY SELECT false, NULL, 'not seen', NULL::integer, NULL::bigint, NULL::bigint, NULL::bigint,
    NULL::bigint, NULL::boolean, NULL::bigint, NULL, NULL::boolean;
END $$;
-- Cancels the other session's statement: no rows, its error says so, and
-- no result after it.
CREATE FUNCTION pg_temp.cancel_watched(OUT cancel text, OUT rows bigint,
                                       OUT was_cancelled boolean, OUT end_of_results bigint)
LANGUAGE sql AS $$
  SELECT dblink_cancel_query('watched'),
         (SELECT count(*) FROM dblink_get_result('watched', false) AS r(count bigint)),
         dblink_error_message('watched') LIKE '%cancel%',
         (SELECT count(*) FROM dblink_get_result('watched', false) AS r(count bigint))
$$;
SELECT * FROM pg_temp.watch();
-- Another role sees no row of it, as pg_stat_activity shows it no query of
-- another role's; a member of pg_read_all_stats sees it.
CREATE ROLE regress_knn_progress_other;
SET ROLE regress_knn_progress_other;
SELECT count(*) AS rows_another_role_sees FROM knn_gpu_progress_rows() WHERE pid <> pg_backend_pid();
RESET ROLE;
GRANT pg_read_all_stats TO regress_knn_progress_other;
SET ROLE regress_knn_progress_other;
SELECT count(*) AS rows_a_stats_reader_sees FROM knn_gpu_progress_rows() WHERE pid <> pg_backend_pid();
RESET ROLE;
DROP ROLE regress_knn_progress_other;
-- The row is joinable to pg_stat_activity by pid and names the database.
SELECT a.datname = current_database() AS same_database, a.query LIKE 'SELECT count(*) FROM knn_join(%' AS its_query
FROM knn_gpu_progress p JOIN pg_stat_activity a USING (pid) WHERE p.pid <> pg_backend_pid();
SELECT * FROM pg_temp.cancel_watched();
-- The cancelled join left no row, even in the files (the view would hide
-- it anyway, as the backend is idle), and a join that ends normally leaves none.
SELECT count(*) AS rows FROM knn_gpu_progress;
SELECT count(*) AS file_rows FROM knn_gpu_progress_rows();
SELECT * FROM dblink('watched', 'SELECT count(*) FROM knn_join(''SELECT id, v FROM progress_rows WHERE id < 50'', ''SELECT id, v FROM progress_rows'', 3)') AS r(count bigint);
SELECT count(*) AS rows FROM knn_gpu_progress;
SELECT count(*) AS file_rows FROM knn_gpu_progress_rows();

-- The KNN Join node reports the same way: source "KNN Join", its phases,
-- the rows it read, k once its LIMIT is evaluated, and the wait event
-- while the engine runs (rows of no structure, so that the engine takes a
-- few seconds on one thread).
CREATE TABLE progress_random AS
SELECT i AS id, array_agg((hashint4(i * 1000 + j) & 1023)::real / 1024 ORDER BY j)::vector AS v
FROM generate_series(1, 30000) i, generate_series(1, 128) j GROUP BY i;
ANALYZE progress_random;
SELECT dblink_send_query('watched',
  'SELECT count(*) FROM progress_random q CROSS JOIN LATERAL (SELECT t.id FROM progress_random t ORDER BY t.v <-> q.v LIMIT 10) n') AS sent;
SELECT * FROM pg_temp.watch();
SELECT a.query LIKE 'SELECT count(*) FROM progress_random q CROSS JOIN LATERAL%' AS its_query,
       p.source, p.queries, p.targets
FROM knn_gpu_progress p JOIN pg_stat_activity a USING (pid) WHERE p.pid <> pg_backend_pid();
SELECT * FROM pg_temp.cancel_watched();
SELECT count(*) AS rows FROM knn_gpu_progress;
-- A node that returns all its rows, and one whose consumer stops early
-- (LIMIT above it: the node is ended before its last row), leave no row.
SELECT * FROM dblink('watched', 'SELECT count(*) FROM progress_random q CROSS JOIN LATERAL (SELECT t.id FROM progress_random t WHERE t.id < 100 ORDER BY t.v <-> q.v LIMIT 2) n WHERE q.id < 2000') AS r(count bigint);
SELECT count(*) AS file_rows FROM knn_gpu_progress_rows();
-- (A LIMIT 1 above prefers a plan that starts fast: nested loops are off.)
SELECT dblink_exec('watched', 'SET enable_nestloop = off') AS set_nestloop;
SELECT count(*) AS knn_join_plans FROM dblink('watched', 'EXPLAIN (COSTS OFF) SELECT q.id FROM progress_random q CROSS JOIN LATERAL (SELECT t.id FROM progress_random t WHERE t.id < 100 ORDER BY t.v <-> q.v LIMIT 2) n WHERE q.id < 2000 LIMIT 1') AS r(line text)
WHERE line LIKE '%KNN Join%';
SELECT count(*) AS rows FROM dblink('watched', 'SELECT q.id FROM progress_random q CROSS JOIN LATERAL (SELECT t.id FROM progress_random t WHERE t.id < 100 ORDER BY t.v <-> q.v LIMIT 2) n WHERE q.id < 2000 LIMIT 1') AS r(id int);
SELECT count(*) AS file_rows FROM knn_gpu_progress_rows();
SELECT dblink_exec('watched', 'RESET enable_nestloop') AS reset_nestloop;

-- A knn_join inside another's query text: the row stays the outer join's
-- (the inner one's end used to close it, and the outer join then ran with
-- no row at all).
SELECT dblink_send_query('watched', $q$SELECT count(*) FROM knn_join(
  $$SELECT id, v FROM progress_rows WHERE id > (SELECT count(*) FROM knn_join('SELECT id, v FROM progress_rows WHERE id < 5', 'SELECT id, v FROM progress_rows WHERE id < 5', 1)) - 5$$,
  'SELECT id, v FROM progress_rows WHERE id > 0', 10, method => 'brute')$q$) AS sent;
SELECT * FROM pg_temp.watch();
SELECT * FROM pg_temp.cancel_watched();
SELECT count(*) AS file_rows FROM knn_gpu_progress_rows();
SELECT dblink_disconnect('watched') AS disconnected;

-- A KNN Join node that an ERROR ends inside an EXCEPTION block (it has no
-- error path of its own) leaves no row: the abort of its subtransaction
-- ends it, and a knn_join after it in the same statement shows its own row
-- (review r13diff: the node's row stayed running and hid the later join's).
CREATE TABLE progress_q AS SELECT i AS id, ARRAY[i, 1, 2]::real[]::vector AS v FROM generate_series(1, 50) i;
CREATE TABLE progress_t AS SELECT * FROM progress_q;
INSERT INTO progress_t VALUES (51, '[1,2]');
ANALYZE progress_q, progress_t;
CREATE FUNCTION pg_temp.own_row(tag text) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
  RAISE NOTICE '%: %', tag, (SELECT coalesce(string_agg(source || ', ' || phase || ', k ' || k, '; '), 'no row')
                             FROM knn_gpu_progress_rows() WHERE pid = pg_backend_pid());
  RETURN true;
END $$;
CREATE FUNCTION pg_temp.runs_the_node(statement text) RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE line text;
BEGIN
  FOR line IN EXECUTE 'EXPLAIN (COSTS OFF) ' || statement LOOP
    IF line LIKE '%KNN Join%' THEN RETURN true; END IF;
  END LOOP;
  RETURN false;
END $$;
SELECT pg_temp.runs_the_node('SELECT q.id, n.id FROM progress_q q CROSS JOIN LATERAL (SELECT t.id FROM progress_t t ORDER BY t.v <-> q.v LIMIT 2) n') AS node;
-- The failing node in an EXCEPTION block, then a knn_join: this
-- session's row after the catch, inside the knn_join's text and after it.
CREATE FUNCTION pg_temp.caught_node_then_knn_join(tag text) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
  BEGIN
    PERFORM count(*) FROM progress_q q CROSS JOIN LATERAL (SELECT t.id FROM progress_t t ORDER BY t.v <-> q.v LIMIT 2) n;
  EXCEPTION WHEN others THEN PERFORM pg_temp.own_row(tag || 'after the caught error');
  END;
  PERFORM count(*) FROM knn_join(format('SELECT id, v FROM progress_q WHERE CASE WHEN id = 1 THEN pg_temp.own_row(%L) ELSE true END',
                                        tag || 'inside the next knn_join'),
                                 'SELECT id, v FROM progress_q', 5);
  PERFORM pg_temp.own_row(tag || 'after it');
END $$;
SELECT pg_temp.caught_node_then_knn_join('');
-- ... also where the library is loaded inside that block (a fresh session:
-- the subtransaction began before its callbacks existed), and where a
-- cursor's node still holds the row from an earlier statement (review
-- r13diff2: either left the failed node's row running).
SELECT dblink_connect('fresh', format('host=%s port=%s dbname=%s',
  split_part(current_setting('unix_socket_directories'), ',', 1),
  current_setting('port'), current_database())) AS connected;
SELECT dblink_exec('fresh', $d$DO $$ BEGIN
  BEGIN
    PERFORM count(*) FROM knn_gpu_progress_rows();
    PERFORM count(*) FROM progress_q q CROSS JOIN LATERAL (SELECT t.id FROM progress_t t ORDER BY t.v <-> q.v LIMIT 2) n;
  EXCEPTION WHEN others THEN NULL;
  END;
  IF EXISTS (SELECT FROM knn_gpu_progress_rows() WHERE pid = pg_backend_pid()) THEN
    RAISE EXCEPTION 'a row after the caught error';
  END IF;
END $$$d$) AS fresh_session;
SELECT dblink_disconnect('fresh') AS disconnected;
BEGIN;
SET LOCAL cursor_tuple_fraction = 1.0;
SELECT pg_temp.runs_the_node('SELECT q.id, n.id FROM progress_q q CROSS JOIN LATERAL (SELECT t.id FROM progress_q t ORDER BY t.v <-> q.v LIMIT 2) n') AS node;
DECLARE held CURSOR FOR SELECT q.id, n.id FROM progress_q q CROSS JOIN LATERAL (SELECT t.id FROM progress_q t ORDER BY t.v <-> q.v LIMIT 2) n;
FETCH 1 FROM held;
SELECT pg_temp.caught_node_then_knn_join('beside a cursor, ');
COMMIT;
DROP TABLE progress_q, progress_t;

-- The file of a backend that is gone (killed, say) is removed by the next
-- reader.
DO $$ BEGIN
  EXECUTE format('COPY (SELECT 1) TO %L',
                 current_setting('data_directory') || '/pg_stat_tmp/knn_gpu_progress.2147483646');
END $$;
SELECT (pg_stat_file('pg_stat_tmp/knn_gpu_progress.2147483646', true)).size IS NOT NULL AS left_behind;
SELECT count(*) AS file_rows FROM knn_gpu_progress_rows();
SELECT (pg_stat_file('pg_stat_tmp/knn_gpu_progress.2147483646', true)).size IS NULL AS removed;
DROP TABLE progress_rows, progress_random;
