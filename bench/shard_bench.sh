#!/usr/bin/env bash
# shard_bench.sh OUT_DIR -- issue 11's benchmark: an exact self-join over a
# table sharded across two PostgreSQL servers, each on its own GPU, against
# one server with one GPU holding all rows.
#
# On the two-GPU host (nvidia-h200-x2), from the project root:
#     bash .gpu/run.sh bash bench/shard_bench.sh $OUT
# run.sh's environment gives the binaries (PATH, LD_LIBRARY_PATH) with this
# build laid over them; its own server is not used. This script starts three
# servers of its own from those binaries, as test/shard_test.sh does: a
# coordinator (pinned to GPU 0: it is also the one-server baseline, which
# runs while the shards are idle) and two shards, pinned to GPU 0 and GPU 1
# (CUDA_VISIBLE_DEVICES; and knn_gpu.devices = '0' where the setting
# exists). The coordinator holds every row in a plain table (the baseline)
# and a hash-partitioned table whose two partitions are postgres_fdw
# foreign tables of the shards, each holding its half.
#
# Sets (seeded, bench/make_cpu_sets.py's unit-norm Gaussian mixtures,
# loaded by binary COPY: bench/write_copy_binary.py):
#   emb: EMB_ROWS x EMB_DIMS (1000000 x 768)
#   clu: CLU_ROWS x CLU_DIMS (5000000 x 8), clustered (CLU_CENTRES centres)
# Per set, k = K nearest other rows of every row (knn_join, exclude_self):
#   - the baseline (one server, one GPU) and the sharded join (queries and
#     targets both the sharded table), timed in psql, and the sharded join
#     once more with its queries read from the coordinator's plain copy
#     ("sharded_local_queries"), each with an order-free checksum of its rows (count, sum of
#     ranks, bit_xor of a hash of every row): identical results have equal
#     checksums;
#   - an exact check: the first CHECK_QUERIES queries' rows of both joins,
#     EXCEPT ALL both ways (0 differing rows);
#   - the statistics: knn_gpu_last_stats() of the baseline,
#     knn_gpu_last_shard_stats() of the sharded join (per shard its time,
#     rows and own engine record; shipping, merge);
# and for emb the KNN Join node (the LATERAL top-k query, ORDER BY distance,
# id) over the first NODE_QUERIES rows, sharded and not, with checksums.
# With SHIP_TARGETS=N (default 0: not run), also every emb row as a query
# (SHIP_COPIES times, default 1, under ids of their own) against the first
# N rows (a filter the shards run), one server and sharded: little join work, so the sharded run is mostly the shipping of
# the queries and the shards' reading of them (derived: ship seconds and
# each shard's read seconds, from knn_gpu_last_shard_stats()). With
# SHIP_ROUNDS=R (default 0), then R rounds of the sharded join, each once
# with the query rows shipped into the shards' memory and once by COPY
# into a temporary table (knn_shard_receive_queries renamed away on the
# shards for it): the two ways side by side on the same servers.
# With QUERY_TEXT_FETCH_SIZES="100 10000" (default empty: not run), also
# the emb self-join with its query text over the sharded table (its rows
# read here through postgres_fdw) and over the plain one, per fetch_size
# (bench_query_text). FETCH_SIZE sets the shards' servers' fetch_size for
# every run (default: postgres_fdw's 100); the JSON says which.
# With AB_LIBS="NAME=PATH ..." (builds of knn_gpu.so, e.g. main's and a
# branch's), only the emb set is loaded, and each sharded join of AB_FORMS
# ("ship": every row against the first SHIP_TARGETS rows (default 100);
# "self": the self-join) runs AB_ROUNDS times (default 3) per build, the
# builds alternating on the same servers (each run a new session, so it
# loads the build just put in place): per run its psql time, checksum and
# phases (coordinator query read, ship, merge, slowest shard, the rest),
# one JSON line each in OUT_DIR/ab.jsonl as they come, then OUT_DIR/ab.json
# with each build's medians and whether all builds' checksums agree. Forms
# AB_SELF_LIBS (default: all) lists the builds the self-join runs for.
# AB_METHOD (default: none, the engine's choice) gives their joins a method
# (e.g. brute: on a CPU dry run, where the engine's choice for the ship
# form can take a minute and swamp the phases the builds differ in).
# Derived: speedup = baseline / sharded (psql time), the coordinator's
# shipping + merge over the slowest shard's time, and the merge's cost per
# million result rows. Writes OUT_DIR/shard_bench.json and prints it.
#
# Every step runs under `timeout` (STEP_TIMEOUT seconds, default 240); the
# whole script is meant to take well under 9 minutes on that host.
#
# A dry run on a machine without a GPU (all sizes are settings):
#   EMB_ROWS=20000 EMB_DIMS=32 CLU_ROWS=50000 NODE_QUERIES=2000 CHECK_QUERIES=2000 \
#   DEVICE=cpu SHARED_BUFFERS=128MB PG_BIN=/usr/lib/postgresql/15/bin bash bench/shard_bench.sh /tmp/out
#
# Settings: EMB_ROWS EMB_DIMS CLU_ROWS CLU_DIMS CLU_CENTRES K CHECK_QUERIES
#   RELAY_OFF (1: the self-join over the sharded table once more with knn_gpu.shard_relay = off,
#   "sharded_no_relay") NODE_QUERIES PREFETCH_OFF (1: each set's sharded join once more with
#   knn_gpu.shard_prefetch = off, "sharded_no_prefetch") SHIP_TARGETS (0) SHIP_COPIES (1) SHIP_ROUNDS (0) FETCH_SIZE
#   QUERY_TEXT_FETCH_SIZES DEVICE (gpu) GPUS ("0 1": the shards' GPUs; the coordinator
#   takes the first) PORTS ("5701 5702 5703") SHARED_BUFFERS (8GB)
#   PG_SETTINGS (more server settings) PG_BIN (default: pg_ctl's directory
#   on PATH) PYTHON (python3 with numpy) STEP_TIMEOUT.
set -uo pipefail
out=${1:?usage: shard_bench.sh OUT_DIR}
emb_rows=${EMB_ROWS:-1000000} emb_dims=${EMB_DIMS:-768}
clu_rows=${CLU_ROWS:-5000000} clu_dims=${CLU_DIMS:-8} clu_centres=${CLU_CENTRES:-1000}
k=${K:-10} check_queries=${CHECK_QUERIES:-20000} node_queries=${NODE_QUERIES:-100000}
prefetch_off=${PREFETCH_OFF:-1}
relay_off=${RELAY_OFF:-1}
device=${DEVICE:-gpu} step_timeout=${STEP_TIMEOUT:-240} ship_targets=${SHIP_TARGETS:-0} ship_copies=${SHIP_COPIES:-1} ship_rounds=${SHIP_ROUNDS:-0}
# postgres_fdw's fetch_size on the shards' servers (empty: its default, 100 rows)
server_fetch_size=${FETCH_SIZE:-} fetch_size=${FETCH_SIZE:-} query_text_fetch_sizes=${QUERY_TEXT_FETCH_SIZES:-}
read -r -a gpus <<<"${GPUS:-0 1}"
read -r -a ports <<<"${PORTS:-5701 5702 5703}"
here=$(cd "$(dirname "$0")" && pwd)
py=${PYTHON:-python3}
pg_bin=${PG_BIN:-$(dirname "$(command -v pg_ctl 2>/dev/null || echo /usr/lib/postgresql/15/bin/pg_ctl)")}
psql_bin=$pg_bin/psql
mkdir -p "$out"
result=$out/shard_bench.json
log=$out/shard_bench.log
: > "$log"

base=$(mktemp -d /tmp/knn_shard_bench.XXXXXX)
chmod 755 "$base"
names=(coordinator shard1 shard2)
# The servers run as an unprivileged user: run.sh's (knnpg) when root.
owner=$(id -un)
if [ "$(id -u)" = 0 ]; then
  owner=${BENCH_OWNER:-knnpg}
  id "$owner" >/dev/null 2>&1 || useradd -m "$owner" || exit 1
  chown "$owner" "$base"
fi
as_owner() {
  if [ "$(id -u)" = 0 ]; then
    su "$owner" -s /bin/bash -c "export PATH='$PATH' LD_LIBRARY_PATH='${LD_LIBRARY_PATH:-}'; $1"
  else
    bash -c "$1"
  fi
}
stop_all() {
  for i in 0 1 2; do
    [ -f "$base/${names[$i]}/data/postmaster.pid" ] &&
      as_owner "'$pg_bin/pg_ctl' -D '$base/${names[$i]}/data' -m fast stop" >/dev/null 2>&1
  done
  for i in 0 1 2; do cp "$base/${names[$i]}/server.log" "$out/${names[$i]}.log" 2>/dev/null; done
  rm -rf "$base"
}
trap stop_all EXIT
step() { # step SECONDS COMMAND...: one bounded step, its output in the log
  timeout "$1" "${@:2}" >>"$log" 2>&1 || { echo "step failed (or took over $1 s): ${*:2}" | tee -a "$log"; tail -20 "$log"; exit 1; }
}
# sql SERVER ARGS...: psql on one of the three servers
sql() { local i=$1; shift; timeout "$step_timeout" "$psql_bin" -X -q -At -v ON_ERROR_STOP=1 -h "$base/${names[$i]}" -p "${ports[$i]}" -U postgres -d postgres "$@"; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.3f", b - a }'; }

# ---- the servers ----
start_server() { # start_server INDEX GPU
  local i=$1 gpu=$2 dir=$base/${names[$1]}
  mkdir -p "$dir"; [ "$(id -u)" = 0 ] && chown "$owner" "$dir"
  as_owner "'$pg_bin/initdb' -D '$dir/data' -U postgres -A trust >'$dir/initdb.log' 2>&1" ||
    { cat "$dir/initdb.log"; exit 1; }
  as_owner "export CUDA_VISIBLE_DEVICES='$gpu'; '$pg_bin/pg_ctl' -D '$dir/data' -l '$dir/server.log' -w -t 120 -o \"-p ${ports[$i]} -k '$dir' -c listen_addresses='' -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c jit=off -c shared_buffers=${SHARED_BUFFERS:-8GB} -c temp_buffers=4GB -c work_mem=1GB -c maintenance_work_mem=2GB -c max_wal_size=16GB ${PG_SETTINGS:-}\" start" >/dev/null ||
    { tail -20 "$dir/server.log"; exit 1; }
}
start_server 0 "${gpus[0]:-}"
start_server 1 "${gpus[0]:-}"
start_server 2 "${gpus[1]:-${gpus[0]:-}}"
for i in 0 1 2; do
  sql "$i" -c "CREATE EXTENSION knn_gpu" -c "SELECT knn_gpu_info()" >>"$log" 2>&1 || { tail "$log"; exit 1; }
  sql "$i" -c "ALTER DATABASE postgres SET knn_gpu.device = '$device'" >>"$log" 2>&1 || exit 1
  # each server sees one GPU (CUDA_VISIBLE_DEVICES): ordinal 0, where the setting exists
  if [ -n "$(sql "$i" -c "SELECT knn_gpu_info() IS NOT NULL" -c "SELECT current_setting('knn_gpu.devices', true)" | tail -1)" ]; then
    sql "$i" -c "ALTER DATABASE postgres SET knn_gpu.devices = '0'" >>"$log" 2>&1 || exit 1
  fi
done
info=$(sql 0 -c "SELECT knn_gpu_info()")
echo "coordinator: $info"
sql 0 >>"$log" 2>&1 <<EOF || { tail "$log"; exit 1; }
CREATE EXTENSION postgres_fdw;
CREATE SERVER shard1 FOREIGN DATA WRAPPER postgres_fdw OPTIONS (host '$base/shard1', port '${ports[1]}', dbname 'postgres'${server_fetch_size:+, fetch_size '$server_fetch_size'});
CREATE SERVER shard2 FOREIGN DATA WRAPPER postgres_fdw OPTIONS (host '$base/shard2', port '${ports[2]}', dbname 'postgres'${server_fetch_size:+, fetch_size '$server_fetch_size'});
CREATE USER MAPPING FOR postgres SERVER shard1 OPTIONS (user 'postgres');
CREATE USER MAPPING FOR postgres SERVER shard2 OPTIONS (user 'postgres');
EOF

# ---- the data ----
# load NAME ROWS DIMS CENTRES: NAME_all here, NAME_0 / NAME_1 on the shards
# (the rows of hash partition 0 / 1 by id), NAME partitioned here over them.
load() {
  local name=$1 rows=$2 dims=$3 centres=$4 t0
  t0=$(now)
  step "$step_timeout" "$py" "$here/make_cpu_sets.py" embedding "$rows" "$dims" "$base" "$name" --centres "$centres"
  step "$step_timeout" "$py" "$here/write_copy_binary.py" "$base/$name.f32" "$dims" vector "$base/$name.copy"
  rm -f "$base/$name.f32"
  chmod 644 "$base/$name.copy"
  # the partitioned table first: its hash partitioning places the rows
  sql 0 -c "CREATE TABLE ${name}_all (id bigint PRIMARY KEY, v vector($dims))" \
    -c "\\copy ${name}_all FROM '$base/$name.copy' WITH (FORMAT binary)" \
    -c "ANALYZE ${name}_all" \
    -c "CREATE TABLE $name (id bigint, v vector($dims)) PARTITION BY HASH (id)" \
    -c "CREATE FOREIGN TABLE ${name}_0 PARTITION OF $name FOR VALUES WITH (MODULUS 2, REMAINDER 0) SERVER shard1 OPTIONS (table_name '${name}_0')" \
    -c "CREATE FOREIGN TABLE ${name}_1 PARTITION OF $name FOR VALUES WITH (MODULUS 2, REMAINDER 1) SERVER shard2 OPTIONS (table_name '${name}_1')" \
    >>"$log" 2>&1 || { tail "$log"; exit 1; }
  rm -f "$base/$name.copy"
  for s in 0 1; do
    sql $((s + 1)) -c "CREATE TABLE ${name}_$s (id bigint PRIMARY KEY, v vector($dims))" >>"$log" 2>&1 || exit 1
    ( sql 0 -c "COPY (SELECT id, v FROM ${name}_all WHERE satisfies_hash_partition('$name'::regclass, 2, $s, id)) TO STDOUT (FORMAT binary)" |
        sql $((s + 1)) -c "COPY ${name}_$s FROM STDIN (FORMAT binary)" -c "ANALYZE ${name}_$s" ) >>"$log" 2>&1 &
  done
  wait
  local counts
  counts=$(sql 0 -c "SELECT (SELECT count(*) FROM ${name}_all) || ' = ' || (SELECT count(*) FROM ${name}_0) || ' + ' || (SELECT count(*) FROM ${name}_1)")
  echo "$name: $rows x $dims loaded in $(since "$t0") s: $counts"
}

# ---- the joins ----
# An order-free checksum of a join's rows: equal rows, equal checksums.
CHECKSUM="count(*) || ':' || sum(rank) || ':' || bit_xor(hashint8extended(target_id, query_id) # hashfloat8extended(distance, rank))"
# timed SERVER SQL STATS_SQL [SETTING_SQL] -> "ms|first column|stats" of one run in a session
timed() {
  local res ms value stats
  res=$(sql "$1" -c "SET client_min_messages = warning" ${4:+-c "$4"} -c '\timing on' -c "$2" -c '\timing off' -c "$3" 2>&1) ||
    { echo "$res" >>"$log"; echo "failed: $2" >&2; return 1; }
  ms=$(echo "$res" | sed -n 's/^Time: \([0-9.]*\) ms.*/\1/p' | head -1)
  value=$(echo "$res" | grep -v '^Time:' | grep -v '^{' | head -1)
  stats=$(echo "$res" | grep '^{' | tail -1)
  echo "${ms:-null}|${value}|${stats:-null}"
}
json_string() { printf '"%s"' "$(echo "$1" | sed 's/\\/\\\\/g; s/"/\\"/g')"; }

# timed_variant WHAT QUERY_TABLE [SETTING_SQL] (in bench_set: $name, $k): the sharded
# self-join once more, its queries read from QUERY_TABLE, as JSON {sql_ms, checksum, stats}
timed_variant() {
  local run
  run=$(timed 0 "SELECT $CHECKSUM FROM knn_join('SELECT id, v FROM $2', 'SELECT id, v FROM $name', $k, exclude_self => true)" \
    "SELECT knn_gpu_last_shard_stats()" "${3:-}") || return 1
  echo "$name knn_join, two shards, $1: ${run%%|*} ms" >&2
  echo "{\"sql_ms\":${run%%|*},\"checksum\":$(json_string "$(echo "$run" | cut -d'|' -f2)"),\"stats\":${run#*|*|}}"
}

# bench_set NAME: the self-join, baseline and sharded, checked; its JSON object
bench_set() {
  local name=$1 rows=$2 dims=$3 base_run shard_run check diff
  # untimed warm-up on every server (engine and GPU context loaded)
  for i in 0 1 2; do
    local table=${name}_all
    [ "$i" -gt 0 ] && table=${name}_$((i - 1))
    sql "$i" -c "SELECT count(*) FROM knn_join('SELECT id, v FROM $table WHERE id <= 1000', 'SELECT id, v FROM $table WHERE id <= 1000', 2)" >>"$log" 2>&1 || exit 1
  done
  base_run=$(timed 0 "SELECT $CHECKSUM FROM knn_join('SELECT id, v FROM ${name}_all', 'SELECT id, v FROM ${name}_all', $k, exclude_self => true)" \
    "SELECT knn_gpu_last_stats()") || exit 1
  # the self-join over the sharded table: queries and targets both its rows (the queries come
  # from the shards' held targets where the path applies: stats "queries_from_shards")
  shard_run=$(timed 0 "SELECT $CHECKSUM FROM knn_join('SELECT id, v FROM $name', 'SELECT id, v FROM $name', $k, exclude_self => true)" \
    "SELECT knn_gpu_last_shard_stats()") || exit 1
  # the same self-join with the shards' rows decoded here and encoded again (knn_gpu.shard_relay = off)
  local no_relay_json=null late_json=null local_json
  if [ "$relay_off" = 1 ]; then
    no_relay_json=$(timed_variant "the shards' rows not relayed (knn_gpu.shard_relay = off)" "$name" \
      "SET knn_gpu.shard_relay = off") || exit 1
  fi
  # the same rows as queries read from the coordinator's plain copy (the form earlier sessions timed)
  local_json=$(timed_variant "queries from the coordinator's plain copy" "${name}_all") || exit 1
  # the same sharded join with the shards reading their targets only after the queries are shipped (as before)
  if [ "$prefetch_off" = 1 ]; then
    late_json=$(timed_variant "knn_gpu.shard_prefetch = off" "${name}_all" "SET knn_gpu.shard_prefetch = off") || exit 1
  fi
  diff=$(sql 0 -c "SET client_min_messages = warning" \
    -c "CREATE TEMP TABLE s AS SELECT * FROM knn_join('SELECT id, v FROM ${name}_all WHERE id <= $check_queries', 'SELECT id, v FROM $name', $k, exclude_self => true)" \
    -c "CREATE TEMP TABLE r AS SELECT * FROM knn_join('SELECT id, v FROM ${name}_all WHERE id <= $check_queries', 'SELECT id, v FROM ${name}_all', $k, exclude_self => true)" \
    -c "SELECT (SELECT count(*) FROM (SELECT * FROM s EXCEPT ALL SELECT * FROM r) a) + (SELECT count(*) FROM (SELECT * FROM r EXCEPT ALL SELECT * FROM s) b)" 2>>"$log" | tail -1)
  local base_ms=${base_run%%|*} shard_ms=${shard_run%%|*}
  local base_sum=${base_run#*|}; base_sum=${base_sum%%|*}
  local shard_sum=${shard_run#*|}; shard_sum=${shard_sum%%|*}
  local shard_stats=${shard_run#*|*|}
  check=false; [ -n "$base_sum" ] && [ "$base_sum" = "$shard_sum" ] && [ "$diff" = 0 ] && check=true
  echo "$name knn_join: one server ${base_ms} ms, two shards ${shard_ms} ms; checksums $base_sum / $shard_sum; first $check_queries queries: ${diff:-?} differing rows" >&2
  printf '{"set":"%s","rows":%s,"dims":%s,"k":%s,"form":"knn_join exclude_self","one_server":{"sql_ms":%s,"checksum":%s,"stats":%s},"sharded":{"sql_ms":%s,"checksum":%s,"stats":%s},"sharded_no_prefetch":%s,"sharded_no_relay":%s,"sharded_local_queries":%s,"check_queries":%s,"check_differing_rows":%s,"identical":%s}' \
    "$name" "$rows" "$dims" "$k" "$base_ms" "$(json_string "$base_sum")" "${base_run##*|}" \
    "$shard_ms" "$(json_string "$shard_sum")" "$shard_stats" "$late_json" "$no_relay_json" "$local_json" "$check_queries" "${diff:-null}" "$check"
}

# bench_node NAME: the KNN Join node over the first NODE_QUERIES rows, sharded and not
bench_node() {
  local name=$1 base_run shard_run
  # (the rows' set: the node returns no rank column)
  lateral() {
    echo "SELECT count(*) || ':' || bit_xor(hashint8extended(n.id, q.id) # hashfloat8extended(n.d, 0)) FROM (SELECT id, v FROM ${name}_all WHERE id <= $node_queries) q CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v AS d FROM $1 t WHERE t.id <> q.id ORDER BY t.v <-> q.v, t.id LIMIT $k) n"
  }
  base_run=$(timed 0 "$(lateral "${name}_all")" "SELECT knn_gpu_last_stats()") || exit 1
  shard_run=$(timed 0 "$(lateral "$name")" "SELECT knn_gpu_last_shard_stats()") || exit 1
  local base_sum=${base_run#*|}; base_sum=${base_sum%%|*}
  local shard_sum=${shard_run#*|}; shard_sum=${shard_sum%%|*}
  local check=false
  [ -n "$base_sum" ] && [ "$base_sum" = "$shard_sum" ] && check=true
  echo "$name KNN Join node, $node_queries queries: one server ${base_run%%|*} ms, two shards ${shard_run%%|*} ms; checksums $base_sum / $shard_sum" >&2
  printf '{"set":"%s","queries":%s,"k":%s,"form":"KNN Join node (LATERAL, ORDER BY distance, id)","one_server":{"sql_ms":%s,"checksum":%s,"stats":%s},"sharded":{"sql_ms":%s,"checksum":%s,"stats":%s},"identical":%s}' \
    "$name" "$node_queries" "$k" "${base_run%%|*}" "$(json_string "$base_sum")" "${base_run##*|}" \
    "${shard_run%%|*}" "$(json_string "$shard_sum")" "${shard_run#*|*|}" "$check"
}

# bench_ship NAME: every row as a query against the first SHIP_TARGETS rows, one server and sharded
bench_ship() {
  local name=$1 join base_run shard_run
  join() { echo "SELECT $CHECKSUM FROM knn_join('SELECT id * $ship_copies + g, v FROM ${name}_all, generate_series(0, $ship_copies - 1) g', 'SELECT id, v FROM $1 WHERE id <= $ship_targets', $k)"; }
  base_run=$(timed 0 "$(join "${name}_all")" "SELECT knn_gpu_last_stats()") || exit 1
  shard_run=$(timed 0 "$(join "$name")" "SELECT knn_gpu_last_shard_stats()") || exit 1
  local base_sum=${base_run#*|}; base_sum=${base_sum%%|*}
  local shard_sum=${shard_run#*|}; shard_sum=${shard_sum%%|*}
  local check=false
  [ -n "$base_sum" ] && [ "$base_sum" = "$shard_sum" ] && check=true
  echo "$name shipping, $ship_targets targets: one server ${base_run%%|*} ms, two shards ${shard_run%%|*} ms; checksums $base_sum / $shard_sum" >&2
  # memory and COPY side by side: the sharded join's time, shipping, each shard's read
  local ab="" round mode run
  local phases="SELECT json_build_object('ship', knn_gpu_last_shard_stats()->'seconds'->'ship', 'reads', (SELECT json_agg(s->'remote_stats'->'seconds'->'read' ORDER BY s->>'server') FROM json_array_elements(knn_gpu_last_shard_stats()->'shards') s), 'memory', (SELECT bool_and(s->>'remote_sql' LIKE '%knn_join_received_packed(%') FROM json_array_elements(knn_gpu_last_shard_stats()->'shards') s))"
  for ((round = 1; round <= ship_rounds; round++)); do
    for mode in memory table; do
      how() { [ "$mode" = table ] && for s in 1 2; do sql "$s" -c "ALTER FUNCTION knn_shard_$1(bigint, regtype, bytea) RENAME TO knn_shard_$2" >>"$log" 2>&1; done; }
      how receive_queries receive_queries_off
      run=$(timed 0 "$(join "$name")" "$phases") || exit 1
      how receive_queries_off receive_queries
      echo "  round $round, $mode: ${run%%|*} ms, ${run##*|}" >&2
      ab="$ab${ab:+,}{\"round\":$round,\"mode\":\"$mode\",\"sql_ms\":${run%%|*},\"phases\":${run##*|}}"
    done
  done
  printf '{"set":"%s","queries":%s,"targets":%s,"k":%s,"form":"knn_join, every row against few targets (shipping)","one_server":{"sql_ms":%s,"checksum":%s,"stats":%s},"sharded":{"sql_ms":%s,"checksum":%s,"stats":%s},"identical":%s,"memory_and_copy":[%s]}' \
    "$name" "$((emb_rows * ship_copies))" "$ship_targets" "$k" "${base_run%%|*}" "$(json_string "$base_sum")" "${base_run##*|}" \
    "${shard_run%%|*}" "$(json_string "$shard_sum")" "${shard_run#*|*|}" "$check" "$ab"
}

# bench_query_text NAME: the coordinator's time before the shipping when the
# query text reads the sharded table itself (postgres_fdw brings its rows as
# text, each value through the type's input function) rather than the plain
# table, per fetch_size of the shards' servers (QUERY_TEXT_FETCH_SIZES): a
# plain scan of each (count(v)), and the sharded join with each query text;
# "outside" is the psql time less knn_gpu_last_shard_stats()'s total (the
# query rows' reading before it, the result's checksum after it).
bench_query_text() {
  local name=$1 fs runs="" scan join outside
  local scan_sql="SELECT count(v) FROM"
  for fs in $query_text_fetch_sizes; do
    local op=ADD; [ -n "$fetch_size" ] && op=SET
    for s in 1 2; do sql 0 -c "ALTER SERVER shard$s OPTIONS ($op fetch_size '$fs')" >>"$log" 2>&1 || exit 1; done
    fetch_size=$fs
    for q in "${name}_all" "$name"; do
      scan=$(timed 0 "$scan_sql $q" "SELECT 1") || exit 1
      join=$(timed 0 "SELECT $CHECKSUM FROM knn_join('SELECT id, v FROM $q', 'SELECT id, v FROM $name', $k, exclude_self => true)" \
        "SELECT knn_gpu_last_shard_stats()") || exit 1
      outside=$(awk -v ms="${join%%|*}" -v total="$(echo "${join##*|}" | sed -n 's/.*"total" *: *\([0-9.e+-]*\).*/\1/p')" 'BEGIN { printf "%.3f", ms / 1000 - total }')
      echo "$name query text over $q, fetch_size $fs: scan ${scan%%|*} ms, sharded join ${join%%|*} ms (outside the shard phases ${outside} s)" >&2
      runs="$runs${runs:+,}{\"fetch_size\":$fs,\"query_table\":\"$q\",\"scan_ms\":${scan%%|*},\"join_ms\":${join%%|*},\"outside_shard_phases_s\":$outside,\"checksum\":$(json_string "$(echo "$join" | cut -d'|' -f2)"),\"stats\":${join##*|}}"
    done
  done
  # back to the servers' setting for the other runs
  for s in 1 2; do
    if [ -n "$server_fetch_size" ]; then sql 0 -c "ALTER SERVER shard$s OPTIONS (SET fetch_size '$server_fetch_size')"
    else sql 0 -c "ALTER SERVER shard$s OPTIONS (DROP fetch_size)"; fi >>"$log" 2>&1 || exit 1
  done
  fetch_size=$server_fetch_size
  printf '{"set":"%s","form":"knn_join exclude_self, the query text over the plain table or the sharded one, per fetch_size","runs":[%s]}' "$name" "$runs"
}

# bench_ab: the builds of AB_LIBS alternating on the same servers (see the top)
bench_ab() {
  local lib_dir round form entry name path run stats query
  # the servers' own $libdir (the one they load knn_gpu.so from)
  lib_dir=$(sql 0 -c "SELECT setting FROM pg_catalog.pg_config WHERE name = 'PKGLIBDIR'") || exit 1
  local ship_n=${ship_targets:-0}; [ "$ship_n" -gt 0 ] || ship_n=100
  : > "$out/ab.jsonl"
  # untimed warm-up: every server's engine loaded once
  sql 0 -c "SELECT count(*) FROM knn_join('SELECT id, v FROM emb_all WHERE id <= 1000', 'SELECT id, v FROM emb WHERE id <= 1000', 2)" >>"$log" 2>&1 || exit 1
  for ((round = 1; round <= ${AB_ROUNDS:-3}; round++)); do
    for form in ${AB_FORMS:-ship self}; do
      for entry in $AB_LIBS; do
        name=${entry%%=*} path=${entry#*=}
        if [ "$form" = self ] && [ -n "${AB_SELF_LIBS:-}" ] && [[ " $AB_SELF_LIBS " != *" $name "* ]]; then continue; fi
        # a rename: the running backends keep the file they loaded
        cp "$path" "$lib_dir/knn_gpu.so.ab" && mv "$lib_dir/knn_gpu.so.ab" "$lib_dir/knn_gpu.so" || exit 1
        if [ "$form" = ship ]; then
          query="SELECT $CHECKSUM FROM knn_join('SELECT id, v FROM emb_all', 'SELECT id, v FROM emb WHERE id <= $ship_n', $k${AB_METHOD:+, method => '$AB_METHOD'})"
        else
          query="SELECT $CHECKSUM FROM knn_join('SELECT id, v FROM emb_all', 'SELECT id, v FROM emb', $k, exclude_self => true${AB_METHOD:+, method => '$AB_METHOD'})"
        fi
        run=$(timed 0 "$query" "SELECT knn_gpu_last_shard_stats()") || exit 1
        stats=${run#*|*|}
        printf '{"round":%s,"form":"%s","build":"%s","sql_ms":%s,"checksum":%s,"stats":%s}\n' \
          "$round" "$form" "$name" "${run%%|*}" "$(json_string "$(echo "$run" | cut -d'|' -f2)")" "$stats" >>"$out/ab.jsonl"
        echo "ab round $round $form $name: ${run%%|*} ms" >&2
      done
    done
  done
  timeout 60 "$py" - "$out/ab.jsonl" "$out/ab.json" <<'PYEOF'
import json, statistics, sys
runs = [json.loads(line) for line in open(sys.argv[1])]
summary = {}
for form in sorted({r["form"] for r in runs}):
    of_form = [r for r in runs if r["form"] == form]
    builds = {}
    for name in dict.fromkeys(r["build"] for r in of_form):
        mine = [r for r in of_form if r["build"] == name]
        def median(f):
            values = [v for v in (f(r) for r in mine) if v is not None]
            return statistics.median(values) if values else None
        seconds = lambda r: (r["stats"] or {}).get("seconds", {})
        slowest = lambda r: max((s["seconds_join"] for s in (r["stats"] or {}).get("shards", [])), default=None)
        builds[name] = {
            "runs": len(mine),
            "sql_s": median(lambda r: r["sql_ms"] / 1000 if r["sql_ms"] else None),
            "queries_s": median(lambda r: seconds(r).get("queries")),
            "ship_s": median(lambda r: seconds(r).get("ship")),
            "merge_s": median(lambda r: seconds(r).get("merge")),
            "slowest_shard_s": median(slowest),
            # the total less the phases named: reading the shards' results, among others
            "rest_s": median(lambda r: seconds(r).get("total", 0) - seconds(r).get("queries", 0) - seconds(r).get("ship", 0)
                             - seconds(r).get("merge", 0) - (slowest(r) or 0)),
            "result_rows": median(lambda r: (r["stats"] or {}).get("rows")),
        }
    summary[form] = {"builds": builds, "identical": len({r["checksum"] for r in of_form}) == 1}
json.dump({"benchmark": "sharded knn_join, builds alternating on the same servers", "summary": summary, "runs": runs},
          open(sys.argv[2], "w"), indent=1)
print(json.dumps(summary, indent=1))
PYEOF
}

load emb "$emb_rows" "$emb_dims" 100
if [ -n "${AB_LIBS:-}" ]; then
  bench_ab
  exit 0
fi
emb=$(bench_set emb "$emb_rows" "$emb_dims") || exit 1
query_text=
if [ -n "$query_text_fetch_sizes" ]; then query_text=$(bench_query_text emb) || exit 1; fi
node=$(bench_node emb) || exit 1
ship=
if [ "$ship_targets" -gt 0 ]; then ship=$(bench_ship emb) || exit 1; fi
sql 0 -c "DROP TABLE emb, emb_all" >>"$log" 2>&1
for s in 1 2; do sql "$s" -c "DROP TABLE emb_$((s - 1))" >>"$log" 2>&1; done
load clu "$clu_rows" "$clu_dims" "$clu_centres"
clu=$(bench_set clu "$clu_rows" "$clu_dims") || exit 1

# Derived figures, from the psql times and knn_gpu_last_shard_stats().
step 60 "$py" - "$result" "$device" "$info" "${server_fetch_size:-null}" "${query_text:-null}" "$emb" "$node" "$clu" ${ship:+"$ship"} <<'PYEOF'
import json, sys
path, device, info, fetch_size, query_text = sys.argv[1:6]
runs = [json.loads(text) for text in sys.argv[6:]]
for run in runs:
    stats = run["sharded"]["stats"] or {}
    shards = stats.get("shards", [])
    seconds = stats.get("seconds", {})
    slowest = max((s["seconds_join"] for s in shards), default=None)
    coordinator = seconds.get("ship", 0) + seconds.get("merge", 0)
    rows = stats.get("rows", 0)
    run["derived"] = {
        "speedup_sql": (run["one_server"]["sql_ms"] / run["sharded"]["sql_ms"]
                        if run["one_server"]["sql_ms"] and run["sharded"]["sql_ms"] else None),
        "per_shard_seconds": {s["server"]: s["seconds_join"] for s in shards},
        "per_shard_rows": {s["server"]: s["rows"] for s in shards},
        # the shard's own record: reading its queries (shipped) and targets
        "per_shard_read_seconds": {s["server"]: ((s.get("remote_stats") or {}).get("seconds") or {}).get("read")
                                   for s in shards},
        "slowest_shard_seconds": slowest,
        "coordinator_ship_seconds": seconds.get("ship"),
        "coordinator_merge_seconds": seconds.get("merge"),
        "coordinator_ship_plus_merge_over_slowest_shard": coordinator / slowest if slowest else None,
        "merge_seconds_per_million_result_rows": seconds.get("merge", 0) / (rows / 1e6) if rows else None,
        "result_rows": rows,
        # the shards' target reads overlapping the coordinator's query read (knn_shard_prefetch_targets)
        "coordinator_query_read_seconds": seconds.get("queries"),
        "coordinator_wait_for_target_reads_seconds": seconds.get("wait_targets"),
        "per_shard_target_read_ahead_seconds": {s["server"]: s.get("seconds_read") for s in shards},
    }
    late = run.get("sharded_no_prefetch")
    if late and late.get("sql_ms") and run["sharded"]["sql_ms"]:
        run["derived"]["no_prefetch_sql_ms_over_prefetch"] = late["sql_ms"] / run["sharded"]["sql_ms"]
        run["derived"]["no_prefetch_identical"] = late.get("checksum") == run["sharded"].get("checksum")
    no_relay = run.get("sharded_no_relay")
    if no_relay and no_relay.get("sql_ms"):
        run["derived"]["speedup_sql_no_relay"] = run["one_server"]["sql_ms"] / no_relay["sql_ms"]
        run["derived"]["no_relay_identical"] = no_relay.get("checksum") == run["one_server"].get("checksum")
        run["derived"]["queries_relayed"] = (run["sharded"]["stats"] or {}).get("queries_relayed")
    local_q = run.get("sharded_local_queries")
    if local_q and local_q.get("sql_ms"):
        run["derived"]["speedup_sql_local_queries"] = run["one_server"]["sql_ms"] / local_q["sql_ms"]
        run["derived"]["local_queries_identical"] = local_q.get("checksum") == run["one_server"].get("checksum")
        run["derived"]["queries_from_shards"] = (run["sharded"]["stats"] or {}).get("queries_from_shards")
report = {"benchmark": "issue 11: sharded self-join, two shards on two GPUs vs one server on one GPU",
          "device": device, "coordinator_engine": info,
          # the shards' servers' postgres_fdw fetch_size (null: its default, 100)
          "fetch_size": json.loads(fetch_size), "runs": runs}
if query_text != "null":
    report["query_text"] = json.loads(query_text)
with open(path, "w") as f:
    json.dump(report, f, indent=1)
    f.write("\n")
PYEOF
cat "$result"
