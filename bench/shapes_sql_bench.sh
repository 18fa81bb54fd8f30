#!/usr/bin/env bash
# shapes_sql_bench.sh DATA_DIR OUT_DIR -- issue 10's two GPU-host figures,
# through SQL, against the server that PGHOST/PGPORT name (e.g. under
# .gpu/run.sh):
#  1. a per-group LATERAL top-k: KNN_GROUP_Q queries x KNN_GROUP_T targets
#     (default 100000 x 1000000) of KNN_GROUP_DIM (16) dimensions in
#     KNN_GROUPS (100) groups, k = 10, as one KNN Join; time through SQL and
#     the engine's share (knn_gpu_last_stats); the result checked against
#     the CPU engine's (same rows, same distances) where KNN_GROUP_CHECK=1;
#  2. a radius self-join of skin (DATA_DIR/skin.f32, 245057 x 4) at the
#     radius that gives about 50 pairs per row (the median 51st-neighbour
#     distance of a sample): rows per second through knn_range_join and
#     through the LATERAL radius shape, the engine's statistics (TI
#     pruning: distances computed against pairs).
# Writes OUT_DIR/shapes_sql_bench.jsonl; every statement bounded by
# statement_timeout (KNN_SHAPES_TIMEOUT, default 240 s).
set -uo pipefail
data=$1 out=$2
mkdir -p "$out"
here=$(cd "$(dirname "$0")" && pwd)
nq=${KNN_GROUP_Q:-100000} nt=${KNN_GROUP_T:-1000000} dim=${KNN_GROUP_DIM:-16} groups=${KNN_GROUPS:-100}
device=${KNN_SHAPES_DEVICE:-gpu}
export PGOPTIONS="-c statement_timeout=${KNN_SHAPES_TIMEOUT:-240}s -c knn_gpu.device=$device"
psql_q() { psql -X -q -At -v ON_ERROR_STOP=1 "$@"; }
# Runs one statement after \timing; prints "milliseconds<TAB>result<TAB>stats".
timed() {
  local res ms val stats
  res=$(psql -X -q -At -v ON_ERROR_STOP=1 -c '\timing on' -c "$1" -c '\timing off' -c "SELECT knn_gpu_last_stats()" 2>&1)
  ms=$(echo "$res" | sed -n 's/^Time: \([0-9.]*\) ms.*/\1/p' | head -1)
  val=$(echo "$res" | sed -n '1p')
  stats=$(echo "$res" | grep '^{' | tail -1)
  printf '%s\t%s\t%s\n' "${ms:-null}" "$val" "${stats:-null}"
}
: > "$out/shapes_sql_bench.jsonl"
psql_q -c "CREATE EXTENSION IF NOT EXISTS knn_gpu"

# ---- 1. per-group LATERAL ----
psql_q <<SQL
SELECT setseed(0.1);
DROP TABLE IF EXISTS grp_t, grp_q;
CREATE TABLE grp_t AS
  SELECT i AS id, i % $groups AS g,
         (SELECT array_agg(random()::real) FROM generate_series(1, $dim) WHERE i > 0)::vector($dim) AS v
  FROM generate_series(1, $nt) i;
CREATE TABLE grp_q AS
  SELECT i AS id, (i * 7) % $groups AS g,
         (SELECT array_agg(random()::real) FROM generate_series(1, $dim) WHERE i > 0)::vector($dim) AS v
  FROM generate_series(1, $nq) i;
VACUUM ANALYZE grp_t; VACUUM ANALYZE grp_q;
SQL
lateral="SELECT q.id AS qid, n.id AS tid, n.d FROM grp_q q CROSS JOIN LATERAL
  (SELECT t.id, t.v <-> q.v AS d FROM grp_t t WHERE t.g = q.g ORDER BY t.v <-> q.v LIMIT 10) n"
psql -X -c "EXPLAIN (COSTS OFF) $lateral" > "$out/group_plan.txt" 2>&1
# One untimed join first: the backend's GPU context.
psql_q -c "SELECT count(*) FROM ($lateral LIMIT 1) x" >/dev/null
IFS=$'\t' read -r ms rows stats < <(timed "SELECT count(*) FROM ($lateral) x")
echo "per-group LATERAL ${nq} x ${nt} in $groups groups: ${ms} ms, $rows rows; $stats"
check=null
if [ "${KNN_GROUP_CHECK:-1}" = 1 ]; then
  check=$(psql_q -c "CREATE TEMP TABLE a AS $lateral" -c "SET knn_gpu.device = cpu" \
    -c "CREATE TEMP TABLE b AS $lateral" \
    -c "SELECT (SELECT count(*) FROM (TABLE a EXCEPT ALL TABLE b) x) + (SELECT count(*) FROM (TABLE b EXCEPT ALL TABLE a) y)" | tail -1)
  echo "   rows differing from the CPU engine's: $check"
fi
printf '{"shape":"per-group lateral","queries":%s,"targets":%s,"dim":%s,"groups":%s,"k":10,"sql_ms":%s,"rows":%s,"differing_from_cpu":%s,"stats":%s}\n' \
  "$nq" "$nt" "$dim" "$groups" "$ms" "${rows:-null}" "${check:-null}" "$stats" >> "$out/shapes_sql_bench.jsonl"

# ---- 2. skin radius self-join ----
if [ -f "$data/skin.f32" ]; then
  psql_q -c "DROP TABLE IF EXISTS skin" -c "CREATE TABLE skin (id bigint PRIMARY KEY, v vector(4))"
  python3 "$here/load_dataset.py" "$data/skin.f32" 4 | psql_q -c "\\copy skin FROM STDIN"
  psql_q -c "VACUUM ANALYZE skin"
  # The radius: the distance at which every 100th row has, on average, the
  # closest number to 50 other rows within it (skin's values are integers,
  # so distances come in steps and many rows tie).
  radius=$(psql_q -c "WITH s AS (SELECT query_id, distance FROM knn_join(
        'SELECT id, v FROM skin WHERE id % 100 = 0', 'SELECT id, v FROM skin', 1000, exclude_self => true)),
      steps AS (SELECT distance, sum(count(*)) OVER (ORDER BY distance) AS within FROM s GROUP BY distance)
    SELECT distance FROM steps
    ORDER BY abs(within / (SELECT count(DISTINCT query_id) FROM s) - 50), distance LIMIT 1")
  echo "skin radius for about 50 pairs a row: $radius"
  IFS=$'\t' read -r ms rows stats < <(timed "SELECT count(*) FROM knn_range_join('SELECT id, v FROM skin', 'SELECT id, v FROM skin', $radius, exclude_self => true)")
  echo "knn_range_join: ${ms} ms, $rows pairs ($(awk -v r="$rows" -v m="$ms" 'BEGIN { printf "%.0f", r / (m / 1000) }') rows/s); $stats"
  printf '{"shape":"knn_range_join","set":"skin","radius":%s,"sql_ms":%s,"rows":%s,"stats":%s}\n' \
    "$radius" "$ms" "$rows" "$stats" >> "$out/shapes_sql_bench.jsonl"
  node="SELECT count(*) FROM skin q CROSS JOIN LATERAL
    (SELECT t.id FROM skin t WHERE t.v <-> q.v <= $radius AND t.id <> q.id) n"
  psql -X -c "EXPLAIN (COSTS OFF) $node" > "$out/radius_plan.txt" 2>&1
  IFS=$'\t' read -r ms rows stats < <(timed "$node")
  echo "LATERAL radius: ${ms} ms, $rows pairs; $stats"
  printf '{"shape":"lateral radius","set":"skin","radius":%s,"sql_ms":%s,"rows":%s,"stats":%s}\n' \
    "$radius" "$ms" "$rows" "$stats" >> "$out/shapes_sql_bench.jsonl"
fi
cat "$out/shapes_sql_bench.jsonl"
