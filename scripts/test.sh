#!/usr/bin/env bash
# test.sh -- every test, on a fresh machine: installs what is missing, builds
# and installs knn_gpu, runs the engine unit tests (GoogleTest), the GPU
# tests (they skip, saying so, where no GPU is usable), the pg_regress
# suite against a throw-away PostgreSQL, pgvector's own test files against a
# database with knn_gpu alone, and the tests against the real pgvector
# (both from ../shared/pgvector; skipped, saying so, where it is absent).
# Ends with one summary line.
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

# Before pgvector is built: knn_gpu alone, in databases of the harness's own
# (dropped again). One check per file: every counted statement matches.
echo "== pgvector's own test files against knn_gpu alone"
PG_BIN="$PG_BIN" python3 "$KNN_ROOT/test/pgvector_compat/run_compat.py" 2>&1 | tee "$logs/compat.log"

echo "== tests against the real pgvector"
pgvector_dir="$KNN_ROOT/../shared/pgvector"
pgvector_skipped=0
if [ -f "$pgvector_dir/build.sh" ]; then
  as_root env PG_CONFIG="$PG_BIN/pg_config" bash "$pgvector_dir/build.sh"
  make installcheck-pgvector PG_CONFIG="$PG_BIN/pg_config" 2>&1 | tee "$logs/pgvector.log"
  [ -f test/pgvector/regression.diffs ] && cat test/pgvector/regression.diffs
else
  echo "skipped: $pgvector_dir is absent (these tests need the real pgvector)" | tee "$logs/pgvector.log"
  pgvector_skipped=1
fi
knn_cluster_stop

echo "== sharded tables: a coordinator and two shards (postgres_fdw)"
bash "$KNN_ROOT/test/shard_test.sh" 2>&1 | tee "$logs/shard.log"

echo "== the CPU engine where OpenBLAS's buffers do not fit (ulimit -v)"
bash "$KNN_ROOT/test/blas_memory_test.sh" 2>&1 | tee "$logs/blas.log"

# Tally: GoogleTest's closing lines and pg_regress's per-test lines.
# A log may hold several GoogleTest binaries (make unittest runs two): sum them.
gtest_count() {
  sed -n "s/^\[  $1 *\] \([0-9]*\) tests\?[.,].*/\1/p" "$2" | awk '{ n += $1; seen = 1 } END { if (seen) print n }'
}
passed=0 failed=0 skipped=0
for log in "$logs/unit.log" "$logs/gpu.log"; do
  p=$(gtest_count PASSED "$log"); f=$(gtest_count FAILED "$log"); s=$(gtest_count SKIPPED "$log")
  if [ -z "$p$f$s" ]; then failed=$((failed + 1)); echo "no GoogleTest summary in $(basename "$log")"; fi
  passed=$((passed + ${p:-0})); failed=$((failed + ${f:-0})); skipped=$((skipped + ${s:-0}))
done
regress_ok() { grep -cE '^(ok|test) .* \.\.\. ok|^ok [0-9]+ ' "$1"; }
regress_failed() { grep -cE '\.\.\. FAILED|^not ok [0-9]+ ' "$1"; }
r_ok=$(regress_ok "$logs/regress.log"); r_fail=$(regress_failed "$logs/regress.log")
[ "$r_ok" -gt 0 ] || { r_fail=$((r_fail + 1)); echo "pg_regress ran no test"; }
v_ok=$(regress_ok "$logs/pgvector.log"); v_fail=$(regress_failed "$logs/pgvector.log")
if [ "$pgvector_skipped" = 0 ] && [ "$v_ok" -eq 0 ]; then v_fail=$((v_fail + 1)); echo "the pgvector tests ran no test"; fi
passed=$((passed + r_ok + v_ok)); failed=$((failed + r_fail + v_fail)); skipped=$((skipped + pgvector_skipped))
# A harness's closing line, "PREFIX: N WORD, M failed..." or "PREFIX: skipped":
# prints "N M 0" or "0 0 1"; without the line, "0 1 0" (one failure).
harness_counts() {  # LOG PREFIX WORD
  local counts
  if grep -q "^$2: skipped" "$1"; then echo "0 0 1"; return; fi
  counts=$(sed -n "s/^$2: \([0-9]*\) $3, \([0-9]*\) failed.*/\1 \2/p" "$1" | tail -1)
  if [ -z "$counts" ]; then echo "$1 ended without its summary" >&2; echo "0 1 0"; return; fi
  echo "$counts 0"
}
read -r c_ok c_fail c_skipped < <(harness_counts "$logs/compat.log" "pgvector compat" "files passed")
read -r s_ok s_fail s_skipped < <(harness_counts "$logs/shard.log" "shard tests" "passed")
read -r b_ok b_fail b_skipped < <(harness_counts "$logs/blas.log" "blas memory tests" "passed")
passed=$((passed + c_ok + s_ok + b_ok)); failed=$((failed + c_fail + s_fail + b_fail))
skipped=$((skipped + c_skipped + s_skipped + b_skipped))
echo "GoogleTest: unit $(gtest_count PASSED "$logs/unit.log") passed; gpu $(gtest_count PASSED "$logs/gpu.log") passed, $(gtest_count SKIPPED "$logs/gpu.log") skipped. pg_regress: $r_ok passed, $r_fail failed; pgvector's test files on knn_gpu alone: $c_ok passed, $c_fail failed$([ "$c_skipped" = 1 ] && echo ", skipped"); with pgvector: $v_ok passed, $v_fail failed$([ "$pgvector_skipped" = 1 ] && echo ", skipped"). Sharded tables: $s_ok passed, $s_fail failed. OpenBLAS under ulimit -v: $b_ok passed, $b_fail failed$([ "$b_skipped" = 1 ] && echo ", skipped")."
echo "tests: $passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
