-- knn_gpu.max_gpu_contexts: how many server processes may hold a GPU
-- context at once (permit files pg_stat_tmp/knn_gpu_context.<i>, taken by
-- the engine before it creates a GPU context). The permits themselves need
-- a GPU (test/gpu_context_test.cpp, test/context_permit_test.cpp); here
-- the setting, and that a host without a GPU never takes a permit.
CREATE EXTENSION IF NOT EXISTS dblink;
SET jit = off;
\i sql/error_of.psql
SELECT knn_gpu_last_stats() IS NULL AS library_loaded;

SELECT name, setting, unit, context, vartype, min_val, max_val, boot_val
FROM pg_settings WHERE name = 'knn_gpu.max_gpu_contexts';
SHOW knn_gpu.max_gpu_contexts;
-- Cluster-wide (reload), never per session.
SELECT pg_temp.error_of('SET knn_gpu.max_gpu_contexts = 2');
SELECT pg_temp.error_of('SET LOCAL knn_gpu.max_gpu_contexts = 0');
SELECT pg_temp.error_of('SELECT set_config(''knn_gpu.max_gpu_contexts'', ''3'', false)');
-- Out of range, and not a number: refused before anything is written.
ALTER SYSTEM SET knn_gpu.max_gpu_contexts = -1;
ALTER SYSTEM SET knn_gpu.max_gpu_contexts = 1025;
ALTER SYSTEM SET knn_gpu.max_gpu_contexts = 'many';
-- A valid value reaches a new session and a running one on reload.
\i sql/dblink_sessions.psql
SELECT pg_temp.connect('other') AS connected;
-- Loaded there, so that the setting is known before the reload reaches it.
SELECT dblink_exec('other', 'LOAD ''knn_gpu''') AS loaded;
ALTER SYSTEM SET knn_gpu.max_gpu_contexts = 1;
SELECT pg_reload_conf() AS reloaded;
SELECT pg_temp.await_setting('other', 'knn_gpu.max_gpu_contexts', '1') AS other_sees_one;
SHOW knn_gpu.max_gpu_contexts;

-- Two sessions, one permit: on a host without a GPU both joins run on the
-- CPU engine as before, with the same answers as device = cpu, no note
-- about contexts and no permit file taken (where a GPU is usable, one
-- session may find the permit held by the other: see the GPU test).
CREATE TABLE contexts_rows AS
SELECT i AS id, format('[%s,%s,%s]', i % 7, i % 5, (i * 13) % 11)::vector AS v
FROM generate_series(1, 300) i;
SET knn_gpu.device = cpu;
CREATE TABLE contexts_cpu AS
SELECT * FROM knn_join('SELECT id, v FROM contexts_rows', 'SELECT id, v FROM contexts_rows', 4);
RESET knn_gpu.device;
CREATE TABLE contexts_auto AS
SELECT * FROM knn_join('SELECT id, v FROM contexts_rows', 'SELECT id, v FROM contexts_rows', 4);
SELECT knn_gpu_info() ~ '^gpu: ' OR knn_gpu_last_stats()->>'device' !~ 'context'
       AS here_no_context_note;
SELECT count(*) AS rows_other, bool_and(o IS NOT DISTINCT FROM c) AS other_same_as_cpu FROM (
  SELECT row(r.*)::text AS o, row(c.*)::text AS c
  FROM dblink('other', 'SELECT * FROM knn_join(''SELECT id, v FROM contexts_rows'', ''SELECT id, v FROM contexts_rows'', 4)')
         AS r(query_id bigint, target_id bigint, rank integer, distance float8)
  FULL JOIN contexts_cpu c USING (query_id, rank)) j;
SELECT info ~ '^gpu: ' OR device !~ 'context' AS other_no_context_note
FROM dblink('other', 'SELECT knn_gpu_info(), knn_gpu_last_stats()->>''device''') AS r(info text, device text);
SELECT count(*) AS rows_here,
       bool_and(row(a.*)::text IS NOT DISTINCT FROM row(c.*)::text) AS here_same_as_cpu
FROM contexts_auto a FULL JOIN contexts_cpu c USING (query_id, rank);
SELECT knn_gpu_info() ~ '^gpu: ' OR
       NOT EXISTS (SELECT 1 FROM pg_ls_dir('pg_stat_tmp') f WHERE f LIKE 'knn_gpu_context.%')
       AS no_permit_file_without_gpu;
-- device = gpu on a host without a GPU: the CPU engine with the notice, no wait.
SET knn_gpu.device = gpu;
SET client_min_messages = warning;
SELECT count(*) AS rows_gpu FROM knn_join('SELECT id, v FROM contexts_rows', 'SELECT id, v FROM contexts_rows', 4);
RESET client_min_messages;
SELECT (knn_gpu_last_stats()->'seconds'->>'queued')::float8 = 0 OR knn_gpu_info() ~ '^gpu: '
       AS not_queued;
RESET knn_gpu.device;
SELECT dblink_disconnect('other') AS disconnected;

-- 0 = no limit; RESET brings back the default.
ALTER SYSTEM SET knn_gpu.max_gpu_contexts = 0;
SELECT pg_reload_conf() AS reloaded;
SELECT pg_sleep(0.5);
SHOW knn_gpu.max_gpu_contexts;
ALTER SYSTEM RESET knn_gpu.max_gpu_contexts;
SELECT pg_reload_conf() AS reloaded;
SELECT pg_sleep(0.5);
SHOW knn_gpu.max_gpu_contexts;
DROP TABLE contexts_rows, contexts_cpu, contexts_auto;
DROP EXTENSION dblink;
