#!/usr/bin/env bash
# sql_bench.sh DATA_DIR OUT_DIR [SETS...] -- times k = 20 self-joins through SQL
# (psql -> knn_join -> rows) against the server that PGHOST/PGPORT name, for
# each data set: GPU TI, GPU brute force, auto, and the CPU engine; then the
# pgvector-style LATERAL query (the KNN Join plan node) on skin, and
# PostgreSQL's own plan for it on a sample of outer rows.
# KNN_BENCH_RUNS (default "gpu:ti gpu:brute gpu:auto cpu:auto") picks the runs,
# KNN_BENCH_COMPARE_DEVICE (default gpu) the engine of the TI-vs-brute check.
# DATA_DIR holds NAME.f32 files (raw float32) and fashion-mnist's
# train-images-idx3-ubyte.gz. Writes OUT_DIR/sql_bench.jsonl.
set -uo pipefail
data=$1 out=$2; shift 2
sets=${*:-skin kegg_std keggD_std blog ipums kdd arcene fashion20k}
here=$(cd "$(dirname "$0")" && pwd)
py=${PYTHON:-python3}
psql_q() { psql -X -q -v ON_ERROR_STOP=1 "$@"; }
dims() { case $1 in skin) echo 4;; kegg_std) echo 28;; keggD_std) echo 21;; blog) echo 281;;
  ipums) echo 61;; kdd) echo 38;; arcene) echo 10000;; 3DNet_head5000) echo 3;; fashion20k) echo 784;; esac; }

# Seconds since a `date +%s.%N` stamp.
elapsed() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.3f", b - a }'; }

# Times one statement with psql's \timing; prints milliseconds.
time_sql() {
  psql -X -v ON_ERROR_STOP=1 -c '\timing on' -c "$1" 2>&1 | sed -n 's/^Time: \([0-9.]*\) ms.*/\1/p' | tail -1
}

psql_q -c "CREATE EXTENSION IF NOT EXISTS knn_gpu" -c "SELECT knn_gpu_info()"
: > "$out/sql_bench.jsonl"
for name in $sets; do
  d=$(dims "$name")
  if [ "$name" = fashion20k ]; then src="$data/train-images-idx3-ubyte.gz"; fmt=idx; rows=20000
  else src="$data/$name.f32"; fmt=$d; rows=0; fi
  [ -f "$src" ] || { echo "skip $name: no $src"; continue; }
  psql_q -c "DROP TABLE IF EXISTS $name" -c "CREATE TABLE $name (id bigint PRIMARY KEY, v vector($d))"
  t0=$(date +%s.%N)
  "$py" "$here/load_dataset.py" "$src" "$fmt" $rows | psql_q -c "\\copy $name FROM STDIN"
  load_ms=$(elapsed "$t0")
  psql_q -c "VACUUM ANALYZE $name"
  n=$(psql -X -At -c "SELECT count(*) FROM $name")
  echo "== $name: $n rows x $d (loaded in ${load_ms}s)"
  q="SELECT count(*) FROM knn_join('SELECT id, v FROM $name', 'SELECT id, v FROM $name', 20, method => '%s')"
  for run in ${KNN_BENCH_RUNS:-gpu:ti gpu:brute gpu:auto cpu:auto}; do
    device=${run%%:*} method=${run#*:}
    if [ "$device" = cpu ] && [ "$n" -gt 100000 ] && [ "$d" -gt 16 ]; then continue; fi
    # One session: the timed join, then its statistics.
    # A tiny join first loads the engine (and the GPU's context) in this backend.
    res=$(PGOPTIONS="-c knn_gpu.device=$device" psql -X -At -v ON_ERROR_STOP=1 \
      -c "SELECT count(*) FROM knn_join('SELECT 1, ARRAY[1]::real[]', 'SELECT 1, ARRAY[2]::real[]', 1)" -c '\timing on' \
      -c "$(printf "$q" "$method")" -c "SELECT knn_gpu_last_stats()" 2>&1)
    ms=$(echo "$res" | sed -n 's/^Time: \([0-9.]*\) ms.*/\1/p' | head -1)
    stats=$(echo "$res" | grep '^{' | tail -1)
    echo "   $device/$method: ${ms} ms   $stats"
    printf '{"set":"%s","rows":%s,"dim":%s,"device":"%s","method":"%s","sql_ms":%s,"stats":%s}\n' \
      "$name" "$n" "$d" "$device" "$method" "${ms:-null}" "${stats:-null}" >> "$out/sql_bench.jsonl"
  done
  # Exactness through SQL: TI and brute force agree row for row.
  diff=$(psql -X -At -c "SET knn_gpu.device = ${KNN_BENCH_COMPARE_DEVICE:-gpu}" -c "SELECT count(*) FROM (
      (SELECT * FROM knn_join('SELECT id, v FROM $name', 'SELECT id, v FROM $name', 20, method => 'ti')
       EXCEPT ALL SELECT * FROM knn_join('SELECT id, v FROM $name', 'SELECT id, v FROM $name', 20, method => 'brute'))) x" | tail -1)
  echo "   ti vs brute differing rows: $diff"
done

# The KNN Join plan node: the pgvector-style LATERAL query, unchanged.
if psql -X -At -c "SELECT 1 FROM pg_class WHERE relname = 'skin'" | grep -q 1; then
  lateral="SELECT q.id, n.id AS neighbour, n.dist FROM skin q CROSS JOIN LATERAL (
    SELECT t.id, t.v <-> q.v AS dist FROM skin t ORDER BY t.v <-> q.v LIMIT 20) n"
  psql -X -c "EXPLAIN (COSTS OFF) $lateral" | tee "$out/lateral_explain.txt"
  ms_count=$(time_sql "SELECT count(*) FROM ($lateral) x")
  start=$(date +%s.%N)
  psql -X -At -c "$lateral" > /dev/null
  wall=$(elapsed "$start")
  ms_own=$(PGOPTIONS="-c knn_gpu.enable_knn_join=off" time_sql "SELECT count(*) FROM (
    SELECT q.id, n.id AS neighbour, n.dist FROM (SELECT * FROM skin WHERE id <= 100) q CROSS JOIN LATERAL (
    SELECT t.id, t.v <-> q.v AS dist FROM skin t ORDER BY t.v <-> q.v LIMIT 20) n) x")
  echo "LATERAL on skin through the KNN Join node: count(*) ${ms_count} ms; all 4.9M rows into psql ${wall} s wall"
  echo "PostgreSQL's own plan on 100 outer rows: ${ms_own} ms"
  printf '{"lateral_skin_count_ms":%s,"lateral_skin_psql_wall_s":%s,"own_plan_100_rows_ms":%s}\n' \
    "${ms_count:-null}" "${wall:-null}" "${ms_own:-null}" >> "$out/sql_bench.jsonl"
fi
