-- While the engine runs, the backend shows it in pg_stat_activity: state
-- active, wait_event_type "Extension". A second session (dblink) runs a
-- long CPU join (about 10 s on one idle core: the engine must still be
-- running when a loaded machine's watcher gets to look); this one watches
-- it, then cancels it.
CREATE EXTENSION IF NOT EXISTS dblink;
SET jit = off;
CREATE TABLE activity_rows AS
SELECT i AS id, array_agg(((i * 7919 + j * 104729) % 1000)::real / 1000 ORDER BY j)::vector AS v
FROM generate_series(1, 20000) i, generate_series(1, 128) j GROUP BY i;
SELECT dblink_connect('watched', format('host=%s port=%s dbname=%s',
  split_part(current_setting('unix_socket_directories'), ',', 1),
  current_setting('port'), current_database())) AS connected;
SELECT dblink_exec('watched', 'SET knn_gpu.device = cpu') AS set_device;
SELECT dblink_exec('watched', 'SET knn_gpu.threads = 1') AS set_threads;
SELECT dblink_send_query('watched',
  'SELECT count(*) FROM knn_join(''SELECT id, v FROM activity_rows'', ''SELECT id + g * 100000, v FROM activity_rows, generate_series(0, 7) g'', 10, method => ''brute'')') AS sent;
-- Look for the other backend waiting on the engine (up to 120 s: on a loaded
-- machine it was seen still reading its rows after 30 s).
CREATE FUNCTION pg_temp.seen_waiting() RETURNS text LANGUAGE plpgsql AS $$
DECLARE
  seen text;
BEGIN
  FOR i IN 1 .. 12000 LOOP
    SELECT state || ' / ' || wait_event_type INTO seen FROM pg_stat_activity
    WHERE pid <> pg_backend_pid() AND query LIKE 'SELECT count(*) FROM knn_join(%'
      AND wait_event_type = 'Extension';
    IF seen IS NOT NULL THEN
      RETURN seen;
    END IF;
    PERFORM pg_sleep(0.01);
  END LOOP;
  RETURN 'not seen';
END $$;
SELECT pg_temp.seen_waiting() AS other_backend;
SELECT dblink_cancel_query('watched') AS cancel;
SELECT count(*) AS rows FROM dblink_get_result('watched', false) AS r(count bigint);
SELECT dblink_error_message('watched') LIKE '%cancel%' AS was_cancelled;
SELECT dblink_disconnect('watched') AS disconnected;
DROP TABLE activity_rows;
