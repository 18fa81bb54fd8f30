#!/usr/bin/env bash
# cpu_bench.sh -- the CPU benchmark: knn_gpu's CPU engine (engine only, and
# through SQL) against FAISS flat search, in one run on the same cores.
# Every job is a k = 20 L2 self-join with self-match exclusion: each row's
# 20 nearest other rows.
#
#   bench/cpu_bench.sh                          # all sets, 2 threads, median of 3
#   SETS="3DNet_head5000 arcene embedding-5k" KNN_CPU_REPEAT=2 bench/cpu_bench.sh
#
# Installs nothing. Needs (Debian 12):
#   apt-get install python3-faiss python3-numpy python3-matplotlib libopenblas0-pthread
#   (libopenblas0-pthread makes the libblas.so.3 alternative OpenBLAS; without it
#   FAISS runs on the reference BLAS and the comparison means nothing: refused)
#   apt-get install dataset-fashion-mnist     # for the fashion-mnist sets
# and knn_gpu built and installed into PostgreSQL 15 (make && make install, or
# scripts/lib.sh's knn_build_and_install) for the SQL part; bench/knn_bench is
# built here with make unless KNN_BENCH_BUILD=0.
#
# Per set, in this order, pinned to the same cores (KNN_CPU_CORES, default
# 0-(threads-1); "none" leaves the affinity alone):
#   1. engine only: bench/knn_bench DIR --sets NAME --methods $KNN_CPU_METHODS
#      --threads N --repeat R (each method's median; runs verified against
#      each other bit for bit by knn_bench)
#   2. through SQL: a throw-away PostgreSQL (scripts/lib.sh knn_cluster_start,
#      port KNN_CPU_PORT=5541), the set loaded with bench/load_dataset.py +
#      \copy into t(id bigint, v vector(d)), then, with knn_gpu.device = cpu
#      and knn_gpu.threads = N, one untimed run and R timed runs of
#        SELECT count(*) FROM knn_join('SELECT id, v FROM t', 'SELECT id, v FROM t',
#                                      20, exclude_self => true)
#      each followed by knn_gpu_last_stats() (the phase split); then knn_gpu's
#      neighbours are dumped (CSV) for the FAISS comparison
#   3. FAISS: bench/faiss_reference.py (IndexFlatL2, add + search k+1, drop the
#      self match, faiss.omp_set_num_threads(N), OPENBLAS_NUM_THREADS=N; one
#      warm-up then the median of R) and how many of its neighbours are wrong
#      against knn_gpu's exact ones.
# Then bench/cpu_bench_report.py merges everything into one JSON and prints
# the table, and bench/plot_cpu.py draws the PNG. The parts stay in
# $KNN_CPU_OUT/cpu_bench-parts/ (an interrupted run's can be merged by hand:
# bench/cpu_bench_report.py bench/results/cpu_bench-parts --out FILE.json).
# Time: all sets at the defaults take one to two hours on 2 cores; FAISS flat
# alone takes minutes per run on skin and ipums, 15-30 minutes on kdd.
#
# Sets (SETS, space or comma separated; default: all of them):
#   the dense ../shared/datasets sets (NAME.f32.xz + NAME.json; KNN_DATASETS):
#     3DNet_head5000 arcene keggD_std kegg_std blog skin ipums kdd
#   fashion-mnist-20k, fashion-mnist-60k: the first 20000 / all 60000 training
#     images of dataset-fashion-mnist (KNN_FASHION), pixels 0..255 as float32
#     (the values knn_bench's fashion-mnist-20k and load_dataset.py use)
#   embedding-50k: 50000 x 768 unit-norm Gaussian-mixture rows, generated
#     deterministically by bench/make_cpu_sets.py; embedding-<N>k for any N
#     (the first N*1000 rows of the same stream), e.g. embedding-5k to try it
# Every set is written as NAME.f32 + NAME.json, which knn_bench reads as is.
#
# Settings (environment):
#   KNN_CPU_THREADS=2  KNN_CPU_REPEAT=3  KNN_CPU_K=20
#   KNN_CPU_METHODS    default cpu-auto,cpu-ti,cpu-blas,cpu-avx2 where knn_bench
#                      knows them, else cpu-auto,cpu-ti,cpu-brute
#   KNN_CPU_BRUTE_MAX_ROWS=100000   the brute-force-only methods (cpu-brute,
#                      cpu-blas, cpu-avx2) only on sets up to this many rows: on
#                      skin, ipums, kdd one run takes many minutes on 2 cores
#   KNN_CPU_FAISS_BUDGET=600   seconds for FAISS's timed runs of one set: fewer
#                      than KNN_CPU_REPEAT (at least 1) where the warm-up shows
#                      they would take longer; where the warm-up alone took
#                      longer (kdd) it is the measurement (0: always KNN_CPU_REPEAT)
#   KNN_CPU_TIMEOUT=3600   seconds for each step (engine, SQL, FAISS) of each set
#   KNN_CPU_ENGINE=1 KNN_CPU_SQL=1 KNN_CPU_FAISS=1   0 skips that part
#   KNN_CPU_RECALL=1   0 skips the neighbour dump (one more join) and the check
#   KNN_CPU_OUT=bench/results  -> cpu_bench.json, cpu_bench.png, cpu_bench-parts/
#   PYTHON             default /usr/bin/python3 (Debian's, which has faiss)
#   PG_SETTINGS        extra server options, default "-c shared_buffers=1GB"
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
root=$PWD
threads=${KNN_CPU_THREADS:-2}
repeat=${KNN_CPU_REPEAT:-3}
k=${KNN_CPU_K:-20}
tmo=${KNN_CPU_TIMEOUT:-3600}
port=${KNN_CPU_PORT:-5541}
datasets=${KNN_DATASETS:-../shared/datasets}
fashion=${KNN_FASHION:-/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz}
out=${KNN_CPU_OUT:-bench/results}
py=${PYTHON:-/usr/bin/python3}
[ -x "$py" ] || py=python3
sets=${SETS:-3DNet_head5000 arcene keggD_std kegg_std blog fashion-mnist-20k embedding-50k fashion-mnist-60k skin ipums kdd}
sets=${sets//,/ }
export PG_SETTINGS=${PG_SETTINGS:--c shared_buffers=1GB}

die() { echo "cpu_bench: $*" >&2; exit 2; }

# --- checks (nothing is installed) ---
"$py" -c 'import numpy, faiss' 2>/dev/null || die "$py cannot import numpy and faiss.
  apt-get install python3-faiss python3-numpy python3-matplotlib libopenblas0-pthread
  (PYTHON=/path/to/python3 names another interpreter that has them)"
blas=$("$py" -c 'import faiss
print(" ".join(sorted({l.split()[-1] for l in open("/proc/self/maps") if "blas" in l})))')
case $blas in
  *openblas*) ;;
  *) [ "${KNN_CPU_ANY_BLAS:-0}" = 1 ] || die "FAISS is not using OpenBLAS (loaded: ${blas:-none}).
  apt-get install libopenblas0-pthread   (or KNN_CPU_ANY_BLAS=1 to run anyway)" ;;
esac
have_plot=1
"$py" -c 'import matplotlib' 2>/dev/null || { have_plot=0; echo "matplotlib missing: no plot (apt-get install python3-matplotlib)"; }
command -v xz >/dev/null || die "xz missing (apt-get install xz-utils)"
command -v timeout >/dev/null || die "timeout missing (coreutils)"
cores=$(nproc)
[ "$cores" -ge "$threads" ] || echo "warning: $threads threads on $cores cores"

# Same cores for everything started from here on (knn_bench, the server,
# python): the affinity is inherited.
pin=${KNN_CPU_CORES:-0-$((threads - 1))}
if [ "$pin" != none ] && command -v taskset >/dev/null; then
  taskset -a -pc "$pin" $$ >/dev/null || die "taskset -pc $pin failed (KNN_CPU_CORES=none skips pinning)"
  echo "pinned to cores $pin"
fi

if [ "${KNN_CPU_ENGINE:-1}" != 0 ]; then
  if [ "${KNN_BENCH_BUILD:-1}" != 0 ]; then make -s bench/knn_bench || die "make bench/knn_bench failed"; fi
  [ -x bench/knn_bench ] || die "bench/knn_bench missing (make bench/knn_bench)"
  if [ -z "${KNN_CPU_METHODS:-}" ]; then
    if bench/knn_bench /nonexistent --sets none --methods cpu-blas,cpu-avx2 --out /dev/null >/dev/null 2>&1; then
      KNN_CPU_METHODS=cpu-auto,cpu-ti,cpu-blas,cpu-avx2
    else
      KNN_CPU_METHODS=cpu-auto,cpu-ti,cpu-brute
    fi
  fi
  echo "knn_bench methods: $KNN_CPU_METHODS"
fi

mkdir -p "$out"
parts=$out/cpu_bench-parts
rm -rf "$parts"; mkdir -p "$parts"
tmp=$(mktemp -d /tmp/knn_cpu_bench.XXXXXX)
chmod 755 "$tmp"
cluster=
cleanup() {
  [ -z "$cluster" ] || knn_cluster_stop
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# --- data: NAME.f32 + NAME.json in $tmp ---
prepare() {
  local name=$1
  case $name in
    fashion-mnist-*k)
      [ -f "$fashion" ] || { echo "skip $name: no $fashion (apt-get install dataset-fashion-mnist)"; return 1; }
      local m=${name#fashion-mnist-}; m=${m%k}
      "$py" bench/make_cpu_sets.py fashion "$fashion" "${m}000" "$tmp" "$name" ;;
    embedding-*k)
      local n=${name#embedding-}; n=${n%k}
      "$py" bench/make_cpu_sets.py embedding "${n}000" 768 "$tmp" "$name" ;;
    *)
      [ -f "$datasets/$name.f32.xz" ] || { echo "skip $name: no $datasets/$name.f32.xz"; return 1; }
      xz -dc "$datasets/$name.f32.xz" > "$tmp/$name.f32" && cp "$datasets/$name.json" "$tmp/" ;;
  esac
}
json_get() { "$py" -c 'import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$1" "$2"; }

# --- SQL ---
psql_q() { psql -X -q -v ON_ERROR_STOP=1 "$@"; }
sql_start() {
  [ -z "$cluster" ] || return 0
  [ -x /usr/lib/postgresql/15/bin/postgres ] || die "PostgreSQL 15 missing (apt-get install postgresql-15)"
  # shellcheck source=../scripts/lib.sh
  . scripts/lib.sh
  knn_cluster_start "$tmp/pg" "$port" || die "could not start PostgreSQL on port $port (KNN_CPU_PORT)"
  cluster=$tmp/pg
  trap cleanup EXIT  # lib.sh set its own
  psql_q -c "CREATE EXTENSION knn_gpu" 2>"$tmp/ext.err" || die "CREATE EXTENSION knn_gpu failed: $(cat "$tmp/ext.err")
  build and install it first: make && make install (scripts/lib.sh knn_build_and_install)"
  psql -X -At -c "SELECT knn_gpu_info()" | tee "$parts/knn_gpu_info.txt"
}

sql_set() {
  local name=$1 rows=$2 dims=$3
  local res=$parts/$name.sql.json
  local q="SELECT count(*) FROM knn_join('SELECT id, v FROM t', 'SELECT id, v FROM t', $k, exclude_self => true)"
  psql_q -c "SET client_min_messages = warning" -c "DROP TABLE IF EXISTS t" -c "CREATE TABLE t (id bigint PRIMARY KEY, v vector($dims))" || return 1
  local t0 load_s
  t0=$(date +%s.%N)
  timeout "$tmo" "$py" bench/load_dataset.py "$tmp/$name.f32" "$dims" | psql_q -c "\\copy t FROM STDIN" || return 1
  psql_q -c "VACUUM ANALYZE t" || return 1
  load_s=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.3f", b-a}')
  {
    echo "\\echo warm"
    echo "$q;"
    for ((i = 0; i < repeat; i++)); do
      echo "\\timing on"
      echo "$q;"
      echo "\\timing off"
      echo "SELECT knn_gpu_last_stats();"
    done
  } > "$tmp/sql_script"
  PGOPTIONS="-c knn_gpu.device=cpu -c knn_gpu.threads=$threads" \
    timeout "$tmo" psql -X -At -v ON_ERROR_STOP=1 -f "$tmp/sql_script" > "$parts/$name.sql.log" 2>&1
  local rc=$?
  local ms stats counts
  ms=$(sed -n 's/^Time: \([0-9.]*\) ms.*/\1/p' "$parts/$name.sql.log" | paste -sd, -)
  stats=$(grep '^{' "$parts/$name.sql.log" | paste -sd, -)
  counts=$(grep -E '^[0-9]+$' "$parts/$name.sql.log" | paste -sd, -)
  printf '{"set":"%s","rows":%s,"dims":%s,"status":%s,"load_seconds":%s,"counts":[%s],"sql_ms":[%s],"stats":[%s],"query":"%s","settings":{"knn_gpu.device":"cpu","knn_gpu.threads":%s}}\n' \
    "$name" "$rows" "$dims" "$rc" "$load_s" "$counts" "$ms" "$stats" "$q" "$threads" > "$res"
  [ $rc = 0 ] || { echo "   SQL run failed (rc $rc): $(tail -3 "$parts/$name.sql.log")"; return 1; }
  echo "   SQL: $ms ms (loaded in $load_s s)"
  if [ "${KNN_CPU_RECALL:-1}" != 0 ] && [ "${KNN_CPU_FAISS:-1}" != 0 ]; then
    PGOPTIONS="-c knn_gpu.device=cpu -c knn_gpu.threads=$threads" timeout "$tmo" psql -X -q -v ON_ERROR_STOP=1 -c "\\copy (SELECT query_id, target_id, distance FROM knn_join('SELECT id, v FROM t', 'SELECT id, v FROM t', $k, exclude_self => true) ORDER BY query_id, rank) TO '$tmp/$name.knn.csv' WITH (FORMAT csv)" \
      || echo "   neighbour dump failed"
  fi
  psql_q -c "DROP TABLE t"
}

echo "== CPU benchmark: sets: $sets; $threads threads, k = $k, median of $repeat ($(date -u +%FT%TZ))"
for name in $sets; do
  echo "== $name"
  prepare "$name" || continue
  rows=$(json_get "$tmp/$name.json" rows) dims=$(json_get "$tmp/$name.json" dims)
  echo "   $rows x $dims"
  methods=${KNN_CPU_METHODS:-}
  if [ "${KNN_CPU_ENGINE:-1}" != 0 ]; then
    if [ "$rows" -gt "${KNN_CPU_BRUTE_MAX_ROWS:-100000}" ]; then
      methods=$(echo "$methods" | tr , '\n' | grep -vxE 'cpu-(brute|blas|avx2)' | paste -sd, -)
      [ "$methods" = "$KNN_CPU_METHODS" ] || echo "   brute-force methods left out above ${KNN_CPU_BRUTE_MAX_ROWS:-100000} rows: $methods"
    fi
  fi
  if [ "${KNN_CPU_ENGINE:-1}" != 0 ] && [ -n "$methods" ]; then
    timeout "$tmo" bench/knn_bench "$tmp" --sets "$name" --methods "$methods" --threads "$threads" \
      --repeat "$repeat" --k "$k" --cpu-max-rows 1000000000 --module-dir "$root" \
      --out "$parts/$name.engine.json" > "$parts/$name.engine.log" 2>&1
    rc=$?
    grep -E "^$name +cpu" "$parts/$name.engine.log" | head -20 | sed 's/^/   /'
    [ $rc = 0 ] || echo "   knn_bench exit status $rc (124 = timeout, 1 = mismatch): see $parts/$name.engine.log"
  fi
  if [ "${KNN_CPU_SQL:-1}" != 0 ]; then
    sql_start
    sql_set "$name" "$rows" "$dims" || echo "   SQL part failed"
  fi
  if [ "${KNN_CPU_FAISS:-1}" != 0 ]; then
    exact=()
    [ -s "$tmp/$name.knn.csv" ] && exact=(--exact "$tmp/$name.knn.csv")
    OPENBLAS_NUM_THREADS=$threads OMP_NUM_THREADS=$threads timeout "$tmo" \
      "$py" bench/faiss_reference.py "$tmp" "$name" --k "$k" --threads "$threads" --repeat "$repeat" \
      --budget "${KNN_CPU_FAISS_BUDGET:-600}" "${exact[@]}" --out "$parts/$name.faiss.json" | sed 's/^/   /'
    [ "${PIPESTATUS[0]}" = 0 ] || echo "   FAISS failed or timed out"
  fi
  rm -f "$tmp/$name.f32" "$tmp/$name.knn.csv"
done

"$py" bench/cpu_bench_report.py "$parts" --out "$out/cpu_bench.json" --threads "$threads" --k "$k" \
  --repeat "$repeat" --methods "${KNN_CPU_METHODS:-}" --cores "$pin" --sets $sets
if [ $have_plot = 1 ]; then
  "$py" bench/plot_cpu.py "$out/cpu_bench.json" -o "$out/cpu_bench.png"
fi
