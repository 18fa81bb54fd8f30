#!/usr/bin/env bash
# sessions_bench.sh OUT_DIR -- many sessions sharing one GPU (issue 9): N
# concurrent pgbench clients each run the same GPU knn_join for a while,
# against the server that PGHOST/PGPORT name (e.g. under .gpu/run.sh with
# PG_SETTINGS="-c max_connections=200"). For each client count in
# KNN_SESSIONS (default "16 64") it reports joins per second, failed joins
# (a wrong checksum counts as a failure, as does any SQL error), and the
# peak GPU memory in use (nvidia-smi, sampled every 100 ms) above what was
# in use before the clients connected. The server settings under test are
# KNN_SESSIONS_SETTINGS (default: max_gpu_jobs 4, gpu_memory_budget 8192 MB,
# gpu_idle_release 60 s), set with ALTER SYSTEM and a reload; the bound on
# GPU contexts is KNN_SESSIONS_CONTEXTS (knn_gpu.max_gpu_contexts, default
# 16, 0 = no limit). With fewer contexts than sessions, run the clients
# with KNN_SESSIONS_DEVICE=auto: a session without a context then joins on
# the CPU engine (under gpu it would wait for a context until one is
# released, i.e. for the whole run). KNN_SESSIONS_SERVICE=on runs the joins
# in the GPU service (knn_gpu.gpu_service: one process, one GPU context,
# for all sessions); off (the default) in each backend.
# The join: KNN_SESSIONS_Q queries x KNN_SESSIONS_T targets of
# KNN_SESSIONS_DIM dimensions (default 1000 x 100000 x 128), k = 10,
# device = gpu; every result is checked against the CPU engine's checksum.
# KNN_SESSIONS_KEEP_DATA=1 keeps the tables of an earlier run of the same
# sizes (for several runs in a row: the service off and on, alternately).
# Writes OUT_DIR/sessions_bench.json and the pgbench logs.
set -uo pipefail
out=$1
mkdir -p "$out"
q=${KNN_SESSIONS_Q:-1000} t=${KNN_SESSIONS_T:-100000} dim=${KNN_SESSIONS_DIM:-128}
secs=${KNN_SESSIONS_SECONDS:-20}
psql_q() { psql -X -q -At -v ON_ERROR_STOP=1 "$@"; }

psql_q -c "CREATE EXTENSION IF NOT EXISTS knn_gpu" -c "LOAD 'knn_gpu'" \
  -c "ALTER SYSTEM SET knn_gpu.max_gpu_jobs = ${KNN_SESSIONS_JOBS:-4}" \
  -c "ALTER SYSTEM SET knn_gpu.gpu_memory_budget = ${KNN_SESSIONS_BUDGET_MB:-8192}" \
  -c "ALTER SYSTEM SET knn_gpu.gpu_idle_release = 60" \
  -c "ALTER SYSTEM SET knn_gpu.max_gpu_contexts = ${KNN_SESSIONS_CONTEXTS:-16}" \
  -c "ALTER SYSTEM SET knn_gpu.gpu_service = ${KNN_SESSIONS_SERVICE:-off}" \
  -c "SELECT pg_reload_conf()" >/dev/null
# Seeded data: targets t, queries q (rows of t with a small offset).
have=$(psql_q -c "SELECT (SELECT count(*) FROM bench_t) || ',' || (SELECT count(*) FROM bench_q) || ',' || (SELECT vector_dims(v) FROM bench_t LIMIT 1)" 2>/dev/null)
if [ "${KNN_SESSIONS_KEEP_DATA:-0}" = 1 ] && [ "$have" = "$t,$q,$dim" ]; then
  echo "keeping the tables bench_t and bench_q ($have)"
else
psql_q <<SQL
SELECT setseed(0.42);
DROP TABLE IF EXISTS bench_t, bench_q;
CREATE TABLE bench_t AS
  SELECT i AS id, (SELECT array_agg(random()::real) FROM generate_series(1, $dim) WHERE i > 0)::vector($dim) AS v
  FROM generate_series(1, $t) i;
CREATE TABLE bench_q AS
  SELECT id, (SELECT array_agg(x + 0.001) FROM unnest(v::real[]) x WHERE id > 0)::vector($dim) AS v
  FROM bench_t WHERE id % ($t / $q) = 0;
VACUUM ANALYZE bench_t; VACUUM ANALYZE bench_q;
-- Which engine ran each join (GPU, or the CPU where no GPU context was free).
DROP TABLE IF EXISTS bench_engines;
CREATE UNLOGGED TABLE bench_engines (engine text, device text);
SQL
fi
join="knn_join('SELECT id, v FROM bench_q', 'SELECT id, v FROM bench_t', 10)"
checksum="SELECT sum(target_id * rank)::bigint AS s, sum(distance)::numeric(30,6) AS d FROM $join"
ref=$(PGOPTIONS="-c knn_gpu.device=cpu" psql_q -F ' ' -c "$checksum")
ref_s=${ref%% *} ref_d=${ref##* }
echo "reference (CPU engine): ids $ref_s, distances $ref_d"
# One session's second GPU join, with its phases (the first builds the context).
PGOPTIONS="-c knn_gpu.device=${KNN_SESSIONS_DEVICE:-gpu}" psql_q -c "$checksum" -c '\timing on' -c "$checksum" \
  -c "SELECT knn_gpu_last_stats()" > "$out/one_session.txt" 2>&1

cat > "$out/sessions_join.sql" <<SQL
SET knn_gpu.device = ${KNN_SESSIONS_DEVICE:-gpu};
$checksum \\gset
\\set ok (:s = $ref_s)
\\if :ok
\\else
SELECT 1 / 0 AS wrong_checksum;
\\endif
INSERT INTO bench_engines SELECT s->>'engine', s->>'device' FROM knn_gpu_last_stats() s;
SQL

gpu_mem() { command -v nvidia-smi >/dev/null || { echo 0; return; }; nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | awk '{ s += $1 } END { print s }'; }
results=()
for clients in ${KNN_SESSIONS:-16 64}; do
  base=$(gpu_mem)
  psql_q -c "TRUNCATE bench_engines"
  : > "$out/gpu_mem_$clients.txt"
  ( while :; do gpu_mem >> "$out/gpu_mem_$clients.txt"; sleep 0.1; done ) &
  sampler=$!
  # -C would reconnect per join; sessions stay connected, as pooled clients do.
  timeout $((secs + 120)) pgbench -n -c "$clients" -j "$clients" -T "$secs" -f "$out/sessions_join.sql" \
    > "$out/pgbench_$clients.log" 2>&1
  rc=$?
  kill "$sampler" 2>/dev/null; wait "$sampler" 2>/dev/null
  peak=$(sort -n "$out/gpu_mem_$clients.txt" | tail -1)
  tps=$(sed -n 's/^tps = \([0-9.]*\).*/\1/p' "$out/pgbench_$clients.log" | tail -1)
  done_=$(sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p' "$out/pgbench_$clients.log")
  failed=$(sed -n 's/^number of failed transactions: \([0-9]*\).*/\1/p' "$out/pgbench_$clients.log")
  aborted=$(grep -c 'client [0-9]* .*aborted' "$out/pgbench_$clients.log")
  errors=$(grep -ciE 'error|out of memory' "$out/pgbench_$clients.log")
  engines=$(psql_q -c "SELECT count(*) FILTER (WHERE engine = 'gpu') || ',' || count(*) FILTER (WHERE engine = 'cpu') || ',' || count(*) FILTER (WHERE device LIKE '%no GPU context free%') || ',' || count(*) FILTER (WHERE device LIKE '%via GPU service%') FROM bench_engines")
  IFS=, read -r on_gpu on_cpu no_context via_service <<< "$engines"
  echo "$clients sessions: joins on the GPU $on_gpu ($via_service via the GPU service), on the CPU $on_cpu ($no_context for want of a GPU context)"
  echo "$clients sessions: ${tps:-?} joins/s, ${done_:-0} joins, ${aborted} clients aborted, ${errors} error lines, GPU memory ${base} -> peak ${peak} MiB (pgbench rc $rc)"
  results+=("{\"sessions\":$clients,\"joins_per_second\":${tps:-null},\"joins\":${done_:-0},\"failed\":${failed:-null},\"clients_aborted\":$aborted,\"error_lines\":$errors,\"gpu_mib_before\":${base:-null},\"gpu_mib_peak\":${peak:-null},\"joins_on_gpu\":${on_gpu:-null},\"joins_on_cpu\":${on_cpu:-null},\"cpu_for_want_of_a_context\":${no_context:-null},\"joins_via_service\":${via_service:-null},\"pgbench_rc\":$rc}")
  sleep 2
done
printf '{"queries":%s,"targets":%s,"dim":%s,"k":10,"seconds":%s,"device":"%s","max_gpu_jobs":%s,"gpu_memory_budget_mb":%s,"max_gpu_contexts":%s,"gpu_service":"%s","runs":[%s]}\n' \
  "$q" "$t" "$dim" "$secs" "${KNN_SESSIONS_DEVICE:-gpu}" "${KNN_SESSIONS_JOBS:-4}" "${KNN_SESSIONS_BUDGET_MB:-8192}" \
  "${KNN_SESSIONS_CONTEXTS:-16}" "${KNN_SESSIONS_SERVICE:-off}" \
  "$(IFS=,; echo "${results[*]}")" > "$out/sessions_bench.json"
cat "$out/sessions_bench.json"
