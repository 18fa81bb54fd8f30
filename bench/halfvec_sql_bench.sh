#!/usr/bin/env bash
# halfvec_sql_bench.sh OUT_DIR -- an embedding self-join through SQL on a
# halfvec table and on a vector table holding the same values: k nearest
# other rows of every row, knn_join with exclude_self, on the server that
# PGHOST/PGPORT name (on the GPU host: bash .gpu/run.sh bash bench/halfvec_sql_bench.sh $OUT).
#
# Data: ROWS x DIMS (default 200000 x 1536) unit-norm Gaussian-mixture rows
# from bench/make_cpu_sets.py (seeded), loaded with binary COPY
# (bench/write_copy_binary.py): emb_half (halfvec) and emb_vec (vector, the
# same values widened, so both joins have the same answer). Per table: one
# untimed small join (engine and GPU context loaded), then the timed join and
# knn_gpu_last_stats() in the same session: SQL milliseconds and the read,
# engine and return phases. Then the check that the halfvec join returns
# exactly the rows of the vector join over the widened values (on the first
# CHECK_ROWS rows). Writes OUT_DIR/halfvec_sql_bench.jsonl and prints it.
#
# Settings: ROWS=200000 DIMS=1536 K=10 CHECK_ROWS=20000 DEVICE=gpu
#   WITH_PGVECTOR=1 creates pgvector first (its halfvec and vector types;
#   else knn_gpu's own), PYTHON (python3 with numpy).
set -uo pipefail
out=${1:?usage: halfvec_sql_bench.sh OUT_DIR}
rows=${ROWS:-200000} dims=${DIMS:-1536} k=${K:-10} check_rows=${CHECK_ROWS:-20000}
device=${DEVICE:-gpu}
here=$(cd "$(dirname "$0")" && pwd)
py=${PYTHON:-python3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
chmod 755 "$tmp"
mkdir -p "$out"
result=$out/halfvec_sql_bench.jsonl
: > "$result"
psql_q() { psql -X -q -v ON_ERROR_STOP=1 "$@"; }
elapsed() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.3f", b - a }'; }

"$py" "$here/make_cpu_sets.py" embedding "$rows" "$dims" "$tmp" emb || exit 1
"$py" "$here/write_copy_binary.py" "$tmp/emb.f32" "$dims" halfvec "$tmp/half.copy" || exit 1
"$py" "$here/write_copy_binary.py" "$tmp/emb.f32" "$dims" vector "$tmp/vec.copy" || exit 1
rm -f "$tmp/emb.f32"
# The vector table holds the halfvec values widened: read them back from the
# halfvec table rather than from the float32 file.
chmod 644 "$tmp"/*.copy

[ "${WITH_PGVECTOR:-0}" = 1 ] && psql_q -c "CREATE EXTENSION IF NOT EXISTS vector"
psql_q -c "CREATE EXTENSION IF NOT EXISTS knn_gpu" -c "SELECT knn_gpu_info()" || exit 1
psql_q -c "DROP TABLE IF EXISTS emb_half, emb_vec" \
  -c "CREATE TABLE emb_half (id bigint PRIMARY KEY, v halfvec($dims))" \
  -c "CREATE TABLE emb_vec (id bigint PRIMARY KEY, v vector($dims))" || exit 1
t0=$(date +%s.%N)
psql_q -c "\\copy emb_half FROM '$tmp/half.copy' WITH (FORMAT binary)" || exit 1
load_half=$(elapsed "$t0")
psql_q -c "INSERT INTO emb_vec SELECT id, v::vector FROM emb_half" -c "VACUUM ANALYZE emb_half, emb_vec" || exit 1
echo "loaded $rows x $dims: halfvec binary COPY ${load_half} s"

join_sql() {
  echo "SELECT count(*) FROM knn_join('SELECT id, v FROM $1', 'SELECT id, v FROM $1', $k, exclude_self => true)"
}
for table in emb_half emb_vec; do
  res=$(PGOPTIONS="-c knn_gpu.device=$device" psql -X -At -v ON_ERROR_STOP=1 \
    -c "SELECT count(*) FROM knn_join('SELECT id, v FROM $table WHERE id <= 100', 'SELECT id, v FROM $table WHERE id <= 100', 1)" \
    -c '\timing on' -c "$(join_sql "$table")" -c '\timing off' -c "SELECT knn_gpu_last_stats()" 2>&1)
  ms=$(echo "$res" | sed -n 's/^Time: \([0-9.]*\) ms.*/\1/p' | head -1)
  stats=$(echo "$res" | grep '^{' | tail -1)
  echo "$table: ${ms:-?} ms  $stats"
  [ -n "$ms" ] || echo "$res"
  printf '{"table":"%s","rows":%s,"dims":%s,"k":%s,"device":"%s","load_binary_copy_s":%s,"sql_ms":%s,"stats":%s}\n' \
    "$table" "$rows" "$dims" "$k" "$device" "$( [ "$table" = emb_half ] && echo "$load_half" || echo null)" \
    "${ms:-null}" "${stats:-null}" >> "$result"
done

# Exactness: the halfvec join equals the vector join of the widened values.
diff=$(PGOPTIONS="-c knn_gpu.device=$device" psql -X -At -v ON_ERROR_STOP=1 -c "SELECT count(*) FROM (
  (SELECT * FROM knn_join('SELECT id, v FROM emb_half WHERE id <= $check_rows', 'SELECT id, v FROM emb_half', $k, exclude_self => true)
   EXCEPT ALL
   SELECT * FROM knn_join('SELECT id, v::vector FROM emb_half WHERE id <= $check_rows', 'SELECT id, v::vector FROM emb_half', $k, exclude_self => true))
  UNION ALL
  (SELECT * FROM knn_join('SELECT id, v::vector FROM emb_half WHERE id <= $check_rows', 'SELECT id, v::vector FROM emb_half', $k, exclude_self => true)
   EXCEPT ALL
   SELECT * FROM knn_join('SELECT id, v FROM emb_half WHERE id <= $check_rows', 'SELECT id, v FROM emb_half', $k, exclude_self => true))) x" 2>&1 | tail -1)
echo "halfvec vs widened vector join, first $check_rows queries: $diff differing rows"
printf '{"check":"halfvec join vs vector join of the widened values","queries":%s,"differing_rows":"%s"}\n' \
  "$check_rows" "$diff" >> "$result"
cat "$result"
