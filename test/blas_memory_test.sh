#!/usr/bin/env bash
# blas_memory_test.sh -- the CPU engine where OpenBLAS's work buffers cannot
# be mapped (kernels/cpu/blas_buffers.h). OpenBLAS retries a failed mmap of
# a 128 MiB buffer forever; a join that needed one more buffer than there
# was room for spun there, answered neither statement_timeout nor cancel,
# and the server needed SIGKILL to stop.
#
# Starts a throw-away server (knn_gpu.device = cpu, 2 threads), measures a
# backend's address space once knn_gpu and OpenBLAS are loaded, then
# restarts the server under `ulimit -v` 64 MiB over that (no room for a
# buffer: the AVX2 loop answers) and 256 MiB over it (the SGEMM's). Each time: a brute-force self-join of 2000 x 64
# vectors must return the same rows as without the limit, well inside its
# statement_timeout; a longer join must end with statement_timeout
# (57014) promptly; the server must stop with pg_ctl -m fast.
#
# Ends with "blas memory tests: N passed, N failed" (or "... skipped"
# where no libopenblas.so.0 is installed). Port: BLAS_TEST_PORT (default
# 5564); directory: a fresh one under $TMPDIR.
set -uo pipefail
source "$(dirname "$0")/../scripts/lib.sh"

if ! ls /usr/lib/*/libopenblas.so.0 >/dev/null 2>&1; then
  echo "skipped: no libopenblas.so.0 (the CPU engine uses no BLAS here)"
  echo "blas memory tests: skipped"
  exit 0
fi

PORT=${BLAS_TEST_PORT:-5564}
DIR=$(mktemp -d "${TMPDIR:-/tmp}/knn_blas_test.XXXXXX")
chmod 755 "$DIR"
[ "$(id -u)" = 0 ] && chown "$KNN_CLUSTER_OWNER" "$DIR"
passed=0 failed=0
pass() { passed=$((passed + 1)); echo "ok: $1"; }
fail() { failed=$((failed + 1)); echo "FAILED: $1"; }
check() { if [ "$2" = "$3" ]; then pass "$1"; else fail "$1 (expected '$2', got '$3')"; fi; }

sql() { "$PG_BIN/psql" -X -q -At -h "$DIR" -p "$PORT" -U postgres -d postgres "$@"; }
# start_server ULIMIT_KB ('unlimited' for none)
start_server() {
  knn_as_owner "ulimit -v $1 && '$PG_BIN/pg_ctl' -D '$DIR/data' -l '$DIR/server.log' -w -o \"-p $PORT -k '$DIR' -c listen_addresses='' -c fsync=off -c knn_gpu.device=cpu -c knn_gpu.threads=2\" start" >/dev/null
}
# The server must stop on SIGTERM (an engine thread spinning in OpenBLAS kept it up).
stop_server() {
  timeout 30 bash -c "$(declare -f knn_as_owner); KNN_CLUSTER_OWNER=$KNN_CLUSTER_OWNER; knn_as_owner \"'$PG_BIN/pg_ctl' -D '$DIR/data' -m fast -t 20 stop\"" >/dev/null 2>&1
}
kill_server() { knn_as_owner "'$PG_BIN/pg_ctl' -D '$DIR/data' -m immediate stop" >/dev/null 2>&1; }
trap kill_server EXIT

knn_as_owner "'$PG_BIN/initdb' -D '$DIR/data' -U postgres -A trust >'$DIR/initdb.log' 2>&1" \
  || { cat "$DIR/initdb.log"; echo "blas memory tests: 0 passed, 1 failed"; exit 1; }
start_server unlimited || { tail -20 "$DIR/server.log"; echo "blas memory tests: 0 passed, 1 failed"; exit 1; }
sql -v ON_ERROR_STOP=1 <<'SQL' >/dev/null
CREATE EXTENSION knn_gpu;
CREATE TABLE v AS SELECT i AS id,
  (SELECT array_agg(((i * 7919 + j * 104729) % 1000) / 1000.0)::real[] FROM generate_series(1, 64) j)::vector(64) AS v
  FROM generate_series(1, 2000) i;
CREATE TABLE big AS SELECT i AS id,
  (SELECT array_agg(((i * 7919 + j * 104729) % 1009) / 1009.0)::real[] FROM generate_series(1, 64) j)::vector(64) AS v
  FROM generate_series(1, 40000) i;
SQL
JOIN="SELECT md5(string_agg(concat_ws(',', query_id, target_id, rank, distance), ';' ORDER BY query_id, rank))
      FROM knn_join('SELECT id, v FROM v', 'SELECT id, v FROM v', 5, method => 'brute')"
expected=$(sql -c "$JOIN")
# A fresh backend with knn_gpu and OpenBLAS loaded (knn_gpu_info loads the
# BLAS), before any buffer: its address space, in kB.
base_kb=$(sql -c "SELECT knn_gpu_info()" \
  -c "SELECT substring(pg_read_file('/proc/self/status') FROM 'VmSize:\\s*(\\d+) kB')" | tail -1)
stop_server || kill_server
case "$base_kb" in
  '' | *[!0-9]*) echo "no VmSize of a backend (got '$base_kb')"; echo "blas memory tests: 0 passed, 1 failed"; exit 1 ;;
esac
echo "a backend with OpenBLAS loaded: ${base_kb} kB of address space"

# 64 MiB over it: no room for a 128 MiB buffer (the AVX2 loop, on both
# threads); 256 MiB: room for one, not for two beside the engine threads'
# stacks and malloc arenas (the SGEMM on one thread, which
# knn_gpu_last_stats()'s device says).
declare -A threads_said=([64]="cpu (2 threads)" [256]="cpu (1 thread)")
for extra_mb in 64 256; do
  limit=$((base_kb + extra_mb * 1024))
  what="ulimit -v $limit (${extra_mb} MiB over a backend)"
  if ! start_server "$limit"; then fail "$what: the server did not start"; tail -5 "$DIR/server.log"; continue; fi
  t0=$(date +%s%N)
  got=$(timeout 30 "$PG_BIN/psql" -X -q -At -h "$DIR" -p "$PORT" -U postgres -d postgres \
        -c "SET statement_timeout = '10s'" -c "$JOIN" -c "SELECT knn_gpu_last_stats()->>'variant'" \
        -c "SELECT knn_gpu_last_stats()->>'device'" 2>&1)
  ms=$(( ($(date +%s%N) - t0) / 1000000 ))
  check "$what: the join's rows" "$expected" "$(head -1 <<<"$got")"
  if [ "$ms" -lt 5000 ]; then pass "$what: the join took less than 5 s"; else fail "$what: the join took $ms ms"; fi
  check "$what: the threads the join ran on" "${threads_said[$extra_mb]}" "$(sed -n 3p <<<"$got")"
  echo "   (the join: ${ms} ms, variant $(sed -n 2p <<<"$got"))"
  t0=$(date +%s%N)
  got=$(timeout 30 "$PG_BIN/psql" -X -q -At -h "$DIR" -p "$PORT" -U postgres -d postgres -v VERBOSITY=verbose \
        -c "SET statement_timeout = '300ms'" \
        -c "SELECT count(*) FROM knn_join('SELECT id, v FROM big', 'SELECT id, v FROM big', 10, method => 'brute')" 2>&1 | grep -o '57014' | head -1)
  ms=$(( ($(date +%s%N) - t0) / 1000000 ))
  check "$what: statement_timeout ends a long join (SQLSTATE)" "57014" "$got"
  if [ "$ms" -lt 2000 ]; then pass "$what: ... within 2 s"; else fail "$what: ... after $ms ms"; fi
  if stop_server; then pass "$what: pg_ctl stop -m fast"; else fail "$what: pg_ctl stop -m fast"; kill_server; fi
done
echo "blas memory tests: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
