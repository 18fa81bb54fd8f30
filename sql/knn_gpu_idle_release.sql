-- knn_gpu.gpu_idle_release: how long an idle backend keeps its GPU context
-- and memory. The release itself needs a GPU (test/gpu_first_use_test.cpp);
-- here the setting: default, unit, range and who may set it.
SET jit = off;
\i sql/error_of.psql
SELECT knn_gpu_last_stats() IS NULL AS library_loaded;

SELECT name, setting, unit, context, vartype, min_val, max_val, boot_val
FROM pg_settings WHERE name = 'knn_gpu.gpu_idle_release';
SHOW knn_gpu.gpu_idle_release;
-- Cluster-wide (reload), never per session.
SELECT pg_temp.error_of('SET knn_gpu.gpu_idle_release = 10');
SELECT pg_temp.error_of('SET LOCAL knn_gpu.gpu_idle_release = 0');
-- Out of range, and not a time: refused before anything is written.
ALTER SYSTEM SET knn_gpu.gpu_idle_release = -1;
ALTER SYSTEM SET knn_gpu.gpu_idle_release = 'soon';
ALTER SYSTEM SET knn_gpu.gpu_idle_release = '3000000000s';
-- A valid value, with a unit, reaches the sessions on reload.
ALTER SYSTEM SET knn_gpu.gpu_idle_release = '2min';
SELECT pg_reload_conf() AS reloaded;
SELECT pg_sleep(0.5);
SHOW knn_gpu.gpu_idle_release;
ALTER SYSTEM RESET knn_gpu.gpu_idle_release;
SELECT pg_reload_conf() AS reloaded;
SELECT pg_sleep(0.5);
SHOW knn_gpu.gpu_idle_release;
