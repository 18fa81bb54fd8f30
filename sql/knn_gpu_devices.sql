-- knn_gpu.devices: the GPUs one join is split across. The split itself
-- needs a GPU (test/gpu_multi_test.cpp); here the setting: its default,
-- the lists it takes and refuses, and that it changes no result of the
-- CPU engine, and that the statistics list no GPU there.
SET jit = off;
\i sql/error_of.psql
SELECT knn_gpu_last_stats() IS NULL AS library_loaded;

SELECT name, setting, context, vartype, boot_val
FROM pg_settings WHERE name = 'knn_gpu.devices';
SHOW knn_gpu.devices;
-- Lists of CUDA ordinals, spaces allowed; a GPU may be named twice (the
-- test mode: two engines on one GPU).
SET knn_gpu.devices = '1,0';
SHOW knn_gpu.devices;
SET knn_gpu.devices = 0, 0;
SHOW knn_gpu.devices;
SET knn_gpu.devices = ' ALL ';
SHOW knn_gpu.devices;
SET knn_gpu.devices = '0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15';
SHOW knn_gpu.devices;
-- Refused, with the reason, before anything changes.
CREATE FUNCTION pg_temp.refusal(list text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
  detail text;
BEGIN
  EXECUTE format('SET knn_gpu.devices = %L', list);
  RETURN 'accepted';
EXCEPTION WHEN OTHERS THEN
  GET STACKED DIAGNOSTICS detail = PG_EXCEPTION_DETAIL;
  RETURN SQLSTATE || ': ' || detail;
END $$;
SELECT list, pg_temp.refusal(list)
FROM unnest(ARRAY['', 'none', '-1', '0,,1', '0,', '1.5', 'gpu0', 'all,0', '0 1', '256',
                  '0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16']) list;
SHOW knn_gpu.devices;
RESET knn_gpu.devices;
SHOW knn_gpu.devices;

-- The CPU engine answers the same whatever the list, and its statistics
-- name no GPU.
SET knn_gpu.device = cpu;
CREATE TABLE dv (id integer, v vector);
INSERT INTO dv SELECT i, format('[%s,%s,%s]', i % 7, (i * 3) % 5, i % 4)::vector
FROM generate_series(1, 300) i;
CREATE TEMP TABLE all_gpus AS
SELECT * FROM knn_join('SELECT id, v FROM dv', 'SELECT id, v FROM dv', 6);
SELECT knn_gpu_last_stats()->'gpus' AS gpus;
SET knn_gpu.devices = '0,0';
SELECT count(*) AS rows, count(*) FILTER (WHERE a IS DISTINCT FROM b) AS differ
FROM (SELECT row(j.*) AS a, row(r.*) AS b
      FROM knn_join('SELECT id, v FROM dv', 'SELECT id, v FROM dv', 6) j
      FULL JOIN all_gpus r USING (query_id, rank)) x;
SELECT knn_gpu_last_stats()->'gpus' AS gpus;
-- Under auto the GPU answers where there is one (split in two engines on
-- GPU 0), else the CPU engine: the same rows.
RESET knn_gpu.device;
SELECT count(*) AS rows, count(*) FILTER (WHERE a IS DISTINCT FROM b) AS differ
FROM (SELECT row(j.*) AS a, row(r.*) AS b
      FROM knn_join('SELECT id, v FROM dv', 'SELECT id, v FROM dv', 6) j
      FULL JOIN all_gpus r USING (query_id, rank)) x;
RESET knn_gpu.devices;
DROP TABLE dv;
