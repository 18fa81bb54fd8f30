#!/bin/bash
# multi_gpu_bench.sh -- one GPU against two (knn_gpu.devices) on one host,
# engine only, results compared bit for bit.
#
#   OUT=/some/dir bench/multi_gpu_bench.sh      (from the project root)
#
# On a host with two GPUs (the device tool's nvidia-h200-x2), every step
# under `timeout`, about 9 minutes at most in all:
#   1. builds knn_gpu_cuda.so (sm_90), test/gpu_multi_test and bench/knn_bench;
#   2. runs test/gpu_multi_test (split against one GPU against the CPU
#      engine, on GPU 0 listed twice and on GPUs 0 and 1);
#   3. generates, seeded, a 5000000 x 8 clustered set and a 1000000 x 768
#      embedding set (bench/make_cpu_sets.py clustered / embedding);
#   4. times the TI self-join of the first (k = 20) and the brute-force
#      self-join of the second (k = 10), each on GPU 0 and then on GPUs 0,1
#      (bench/knn_bench --devices 0/0,1: one untimed run, then
#      MULTI_GPU_REPEAT timed ones, default 3: the figures are their medians,
#      since one run of the one-GPU TI join varies by +-10 % with its result
#      download), and compares the split results with the one-GPU ones bit for bit;
#   5. writes $OUT/multi_gpu.json (per join: seconds on one and on two GPUs,
#      the speed-up, whether the results are identical, each GPU's rows and
#      seconds), knn_bench's own JSON (ti.json, brute.json) and three logs
#      (build.log, test.log, bench.log): six files.
# Exits non-zero when a step fails, a result differs or a test fails.
#
# Knobs (for trying the script on one GPU): MULTI_GPU_REPEAT (3), MULTI_GPU_DEVICES (default
# 0/0,1; 0/0,0 runs the split as two engines on GPU 0), MULTI_GPU_TI_ROWS
# (5000000), MULTI_GPU_EMBED_ROWS (1000000), MULTI_GPU_TEST=0 (skip step 2, run
# just before), MULTI_GPU_BUILD=0 (use what is
# built), GENCODE (default sm_90). GoogleTest is looked for in .gtest (or
# ../../.gtest, from a copy under .xfer/) where CPATH does not name it.
set -u
cd "$(dirname "$0")/.." || exit 2
for g in .gtest ../../.gtest; do
  if [ -z "${CPATH:-}" ] && [ -d "$g/include/gtest" ]; then
    export CPATH=$PWD/$g/include LIBRARY_PATH=$PWD/$g/lib
  fi
done
out=${OUT:?set OUT to the folder for the results}
mkdir -p "$out"
devices=${MULTI_GPU_DEVICES:-0/0,1}
ti_rows=${MULTI_GPU_TI_ROWS:-5000000}
embed_rows=${MULTI_GPU_EMBED_ROWS:-1000000}
repeat=${MULTI_GPU_REPEAT:-3}
gencode=${GENCODE:--gencode arch=compute_90,code=sm_90}
data=$(mktemp -d)
trap 'rm -rf "$data"' EXIT
status=0
step() {  # step SECONDS LOG COMMAND...: one step under timeout, its output in LOG
  local seconds=$1 log=$2
  shift 2
  echo "== $* (at most ${seconds}s)" | tee -a "$log"
  timeout "$seconds" "$@" >>"$log" 2>&1
  local rc=$?
  [ $rc -eq 124 ] && echo "   timed out after ${seconds}s" | tee -a "$log"
  echo "   exit $rc" | tee -a "$log"
  return $rc
}

nvidia-smi -L >"$data/gpus.txt" 2>&1
gpus=$(grep -c '^GPU ' "$data/gpus.txt")
echo "GPUs visible: $gpus"
highest=$(echo "$devices" | tr '/,' '\n\n' | sort -n | tail -1)
if [ "$gpus" -le "$highest" ]; then
  why="the lists $devices need GPU $highest, but $gpus GPU(s) are visible"
  echo "$why"
  printf '{"error": "%s"}\n' "$why" >"$out/multi_gpu.json"
  exit 1
fi

if [ "${MULTI_GPU_BUILD:-1}" != 0 ]; then
  step 190 "$out/build.log" make -j"$(nproc)" CUDA=1 GENCODE="$gencode" \
    knn_gpu_cuda.so test/gpu_multi_test bench/knn_bench || exit 1
fi

test_result=passed
if [ "${MULTI_GPU_TEST:-1}" != 0 ]; then
  step 110 "$out/test.log" ./test/gpu_multi_test || { test_result=failed; status=1; }
  grep -E '^\[  (PASSED|FAILED|SKIPPED) |tests? ran|^note:' "$out/test.log" | tail -20
else
  test_result="not run"
fi

step 40 "$out/bench.log" python3 bench/make_cpu_sets.py clustered "$ti_rows" 8 "$data" \
  "clustered-8d-$ti_rows" || exit 1
step 60 "$out/bench.log" ./bench/knn_bench "$data" --module-dir "$PWD" \
  --sets "clustered-8d-$ti_rows" --methods ti --k 20 --repeat "$repeat" --devices "$devices" \
  --out "$out/ti.json" || status=1
rm -f "$data"/clustered-8d-*
step 50 "$out/bench.log" python3 bench/make_cpu_sets.py embedding "$embed_rows" 768 "$data" \
  "embed-768d-$embed_rows" || exit 1
step 110 "$out/bench.log" ./bench/knn_bench "$data" --module-dir "$PWD" \
  --sets "embed-768d-$embed_rows" --methods brute --k 10 --repeat "$repeat" --devices "$devices" \
  --out "$out/brute.json" || status=1
grep -E '^(clustered|embed)-' "$out/bench.log" | grep -v ' s  ' 

# The summary: per join, the first list's run against each other list's.
python3 - "$out" "$test_result" "$devices" "$data/gpus.txt" <<'EOF' || status=1
import json, os, sys
out, test_result, devices, gpus_txt = sys.argv[1:5]
lists = devices.split("/")
joins, ok = [], True
for kind, k in (("ti", 20), ("brute", 10)):
    path = os.path.join(out, kind + ".json")
    if not os.path.exists(path):
        ok = False
        joins.append({"method": kind, "error": "no results (see the bench log)"})
        continue
    bench = json.load(open(path))
    for d in bench["datasets"]:
        runs = {r["devices"]: r for r in d["runs"]}
        base = runs.get(lists[0])
        for other in lists[1:]:
            r = runs.get(other)
            row = {"name": d["name"], "rows": d["rows"], "dims": d["dims"], "method": kind,
                   "k": k, "engine": bench["engine"]}
            if base is None or r is None or base["status"] != 0 or r["status"] != 0:
                row["error"] = "a run failed: " + "; ".join(
                    x["error"] for x in (base, r) if x is not None and x["status"] != 0)
                ok = False
            else:
                identical = r["verified_against"] != "" and r["mismatches"] == 0
                ok = ok and identical
                row.update({
                    "devices_one": lists[0], "devices_split": other,
                    "seconds_one": base["median"], "seconds_split": r["median"],
                    "speedup": base["median"] / r["median"] if r["median"] > 0 else None,
                    "identical": identical, "verified_against": r["verified_against"],
                    "mismatches": r["mismatches"], "variant": r["variant"],
                    "device_split": r["device"], "gpus_split": r["gpus"]})
            joins.append(row)
summary = {"gpu_multi_test": test_result, "devices": lists, "joins": joins,
           "gpus": open(gpus_txt).read().splitlines()}
json.dump(summary, open(os.path.join(out, "multi_gpu.json"), "w"), indent=1)
for j in joins:
    if "error" in j:
        print("%s %s: %s" % (j.get("name", "?"), j["method"], j["error"]))
    else:
        print("%-22s %-5s %s: %.3f s, %s: %.3f s, speed-up %.2fx, identical: %s" % (
            j["name"], j["method"], j["devices_one"], j["seconds_one"], j["devices_split"],
            j["seconds_split"], j["speedup"], j["identical"]))
sys.exit(0 if ok else 1)
EOF
echo "wrote $out/multi_gpu.json (exit $status)"
exit $status
