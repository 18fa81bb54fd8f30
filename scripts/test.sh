#!/usr/bin/env bash
# test.sh -- every test, on a fresh machine: installs what is missing, builds
# and installs knn_gpu, runs the engine unit tests (GoogleTest), the GPU
# tests (they skip, saying so, where no GPU is usable) and the pg_regress
# suite against a throw-away PostgreSQL. Ends with one summary line.
set -uo pipefail
source "$(dirname "$0")/lib.sh"

set -e
knn_install_prerequisites
knn_build_and_install
set +e

logs=$(mktemp -d)
cd "$KNN_ROOT"

echo "== engine unit tests (CPU)"
make unittest PG_CONFIG="$PG_BIN/pg_config" 2>&1 | tee "$logs/unit.log"
echo "== GPU engine tests"
make gputest PG_CONFIG="$PG_BIN/pg_config" 2>&1 | tee "$logs/gpu.log"

echo "== pg_regress suite"
knn_cluster_start "${TMPDIR:-/tmp}/knn_gpu_test" "${PGPORT_TEST:-5498}" || exit 1
make installcheck PG_CONFIG="$PG_BIN/pg_config" 2>&1 | tee "$logs/regress.log"
[ -f regression.diffs ] && cat regression.diffs
knn_cluster_stop

# Tally: GoogleTest's closing lines and pg_regress's per-test lines.
gtest_count() { sed -n "s/^\[  $1 *\] \([0-9]*\) tests\?[.,].*/\1/p" "$2" | tail -1; }
passed=0 failed=0 skipped=0
for log in "$logs/unit.log" "$logs/gpu.log"; do
  p=$(gtest_count PASSED "$log"); f=$(gtest_count FAILED "$log"); s=$(gtest_count SKIPPED "$log")
  if [ -z "$p$f$s" ]; then failed=$((failed + 1)); echo "no GoogleTest summary in $(basename "$log")"; fi
  passed=$((passed + ${p:-0})); failed=$((failed + ${f:-0})); skipped=$((skipped + ${s:-0}))
done
r_ok=$(grep -cE '^(ok|test) .* \.\.\. ok|^ok [0-9]+ ' "$logs/regress.log")
r_fail=$(grep -cE '\.\.\. FAILED|^not ok [0-9]+ ' "$logs/regress.log")
[ "$r_ok" -gt 0 ] || { r_fail=$((r_fail + 1)); echo "pg_regress ran no test"; }
passed=$((passed + r_ok)); failed=$((failed + r_fail))
echo "GoogleTest: unit $(gtest_count PASSED "$logs/unit.log") passed; gpu $(gtest_count PASSED "$logs/gpu.log") passed, $(gtest_count SKIPPED "$logs/gpu.log") skipped. pg_regress: $r_ok passed, $r_fail failed."
echo "tests: $passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
