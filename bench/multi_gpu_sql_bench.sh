#!/usr/bin/env bash
# multi_gpu_sql_bench.sh DATA_DIR OUT_DIR NAME:DIMS:METHOD:K... -- one
# self-join through SQL (psql -> knn_join -> rows) on each list of GPUs, the
# rows compared between the lists.
#
#   MULTI_GPU_DEVICES="0/0,1/0,1,2,3" bash .gpu/run.sh \
#     bench/multi_gpu_sql_bench.sh /data /out c5m:8:ti:10 e768:768:brute:10
#
# Runs against the server PGHOST/PGPORT name (on a GPU host, under
# ../shared/gpu-host's run.sh). For each NAME:DIMS:METHOD:K, DATA_DIR/NAME.f32
# (raw float32 rows, ids from 1) is loaded into an unlogged table
# (bench/write_copy_binary.py, binary COPY); then, per list of
# MULTI_GPU_DEVICES (default 0/0,1), one session (knn_gpu.device = gpu,
# knn_gpu.devices = the list) warms the list's GPUs with a join of 1000
# queries and times MULTI_GPU_SQL_REPEAT (default 3) statements
#   SELECT count(*), sum(distance), bit_xor(hash of target, query, rank and distance)
#   FROM knn_join('SELECT id, v FROM NAME', 'SELECT id, v FROM NAME', K, method => METHOD)
# each followed by knn_gpu_last_stats() (the engine's seconds, each GPU's
# queries and seconds, the rows' read and return). The checksum hashes every
# row's target id, query id, rank and the bits of its distance: equal
# checksums mean the same rows in the same order.
# MULTI_GPU_SQL_SERVICE=on runs the joins in the GPU service
# (knn_gpu.gpu_service, ALTER SYSTEM; reset at the end) and every timed
# statement in a new session (a session's first join, the service warm);
# off (the default) in the backends.
# MULTI_GPU_SQL_CHECKSUM=0 times SELECT count(*) instead (the rows' count
# is then all that is compared).
# MULTI_GPU_SQL_KEEP=1 keeps the tables for the next call (a table that
# holds the file's number of rows is not loaded again).
# MULTI_GPU_SQL_DEVICE=cpu tries the script on a host without a GPU.
# Writes OUT_DIR/multi_gpu_sql[_service_on|_off].jsonl (one line per
# statement), prints per set and list the medians (statement, engine) and
# their ratios to the first list, and exits non-zero when a statement fails
# or a checksum differs from the set's first.
set -uo pipefail
data=${1:?DATA_DIR} out=${2:?OUT_DIR}
shift 2
here=$(cd "$(dirname "$0")" && pwd)
devices=${MULTI_GPU_DEVICES:-0/0,1}
repeat=${MULTI_GPU_SQL_REPEAT:-3}
mkdir -p "$out"
jsonl=$out/multi_gpu_sql${MULTI_GPU_SQL_SERVICE:+_service_$MULTI_GPU_SQL_SERVICE}.jsonl
: >"$jsonl"
service=${MULTI_GPU_SQL_SERVICE:-off}
psql_q() { psql -X -q -v ON_ERROR_STOP=1 "$@"; }
psql_run() { psql -X -q -At -v ON_ERROR_STOP=1 -F ' ' 2>&1; }
psql_q -c "CREATE EXTENSION IF NOT EXISTS knn_gpu" \
  -c "LOAD 'knn_gpu'" -c "ALTER SYSTEM SET knn_gpu.gpu_service = $service" -c "SELECT pg_reload_conf()" >/dev/null || exit 1
status=0
for spec in "$@"; do
  IFS=: read -r name dims method k <<<"$spec"
  table="mgpu_$name"
  expected=$(( $(stat -c %s "$data/$name.f32") / (4 * dims) ))
  rows=$(psql -X -At -c "SELECT count(*) FROM $table" 2>/dev/null)
  if [ "$rows" != "$expected" ]; then
    copy=$(mktemp)
    python3 "$here/write_copy_binary.py" "$data/$name.f32" "$dims" vector "$copy" || exit 1
    psql_q -c "DROP TABLE IF EXISTS $table" \
      -c "CREATE UNLOGGED TABLE $table (id bigint, v vector($dims))" \
      -c "\\copy $table FROM '$copy' WITH (FORMAT binary)" \
      -c "VACUUM ANALYZE $table" || exit 1
    rm -f "$copy"
    rows=$(psql -X -At -c "SELECT count(*) FROM $table")
  fi
  join="knn_join('SELECT id, v FROM $table', 'SELECT id, v FROM $table', $k, method => '$method')"
  warm="knn_join('SELECT id, v FROM $table WHERE id <= 1000', 'SELECT id, v FROM $table', $k, method => '$method')"
  checksum_query="SELECT count(*), sum(distance), bit_xor(hashint8extended(target_id, query_id * 4096 + rank) # hashfloat8extended(distance, 0)) FROM $join"
  [ "${MULTI_GPU_SQL_CHECKSUM:-1}" = 0 ] && checksum_query="SELECT count(*) FROM $join"
  for list in ${devices//\// }; do
    settings="SET knn_gpu.device = ${MULTI_GPU_SQL_DEVICE:-gpu}; SET knn_gpu.devices = '$list';"
    # One timed run: a marker, the checksum row, psql's timing, the statistics.
    timed_run() { printf '%s\n' "\\echo RUN $1" '\timing on' "$checksum_query;" '\timing off' \
      "SELECT knn_gpu_last_stats();"; }
    if [ "$service" = on ]; then
      # The warm-up starts the service (and its GPUs' contexts); then every
      # run is a new session's first join.
      printf '%s\n' "$settings" "SELECT count(*) FROM $warm;" | psql_run >"$out/psql.txt" ||
        { echo "$name $list: warm-up failed: $(cat "$out/psql.txt")"; status=1; continue; }
      : >"$out/psql.txt"
      for run in $(seq 1 "$repeat"); do
        { echo "$settings"; timed_run "$run"; } | psql_run >>"$out/psql.txt"
      done
    else
      # One session: the warm-up creates its GPU contexts, the runs follow.
      { echo "$settings"; echo "SELECT count(*) FROM $warm;"
        for run in $(seq 1 "$repeat"); do timed_run "$run"; done; } | psql_run >"$out/psql.txt"
    fi
    python3 - "$out/psql.txt" "$name" "$rows" "$dims" "$method" "$k" "$list" "$service" "$repeat" \
      >>"$jsonl" <<'EOF' || status=1
import json, re, sys
path, name, rows, dims, method, k, devices, service, repeat = sys.argv[1:10]
text = open(path).read()
runs = re.split(r"^RUN (\d+)$", text, flags=re.M)
found = 0
for number, body in zip(runs[1::2], runs[2::2]):
    lines = [l for l in body.splitlines() if l.strip()]
    time = [l for l in lines if l.startswith("Time: ")]
    stats = [l for l in lines if l.startswith("{")]
    if not lines or not time or not stats:
        continue
    found += 1
    print(json.dumps({"name": name, "rows": int(rows), "dims": int(dims), "method": method,
                      "k": int(k), "devices": devices, "gpu_service": service, "run": int(number),
                      "statement_seconds": float(time[0].split()[1]) / 1000,
                      "checksum": lines[0], "stats": json.loads(stats[-1])}))
if found != int(repeat):
    sys.stderr.write("%s on GPUs %s: %d of %s runs came back:\n%s\n" % (name, devices, found, repeat, text))
    sys.exit(1)
EOF
  done
  [ "${MULTI_GPU_SQL_KEEP:-0}" = 1 ] || psql_q -c "DROP TABLE $table"
done
# Per set and list: medians of the statement's and the engine's seconds, and
# whether every run's checksum equals the set's first run's.
python3 - "$jsonl" <<'EOF' || status=1
import json, statistics, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
groups, first, same_everywhere = {}, {}, True
for l in lines:
    groups.setdefault((l["name"], l["devices"]), []).append(l)
    first.setdefault(l["name"], l["checksum"])
base = {}
for (name, devices), runs in groups.items():
    st = statistics.median(r["statement_seconds"] for r in runs)
    eng = statistics.median(r["stats"]["seconds"]["engine_total"] for r in runs)
    base.setdefault(name, (st, eng))
    same = all(r["checksum"] == first[name] for r in runs)
    same_everywhere = same_everywhere and same
    gpus = ", ".join("GPU %s %s q %.3f s" % (g.get("gpu"), g.get("queries"), g.get("seconds", 0))
                     for g in runs[-1]["stats"].get("gpus", []))
    print("%-6s GPUs %-8s statement %.3f s (x%.2f), engine %.3f s (x%.2f), same rows: %s; %s" % (
        name, devices, st, base[name][0] / st, eng, base[name][1] / eng if eng else 0, same, gpus))
sys.exit(0 if same_everywhere else 1)
EOF
rm -f "$out/psql.txt"
psql_q -c "LOAD 'knn_gpu'" -c "ALTER SYSTEM RESET knn_gpu.gpu_service" -c "SELECT pg_reload_conf()" >/dev/null
exit $status
