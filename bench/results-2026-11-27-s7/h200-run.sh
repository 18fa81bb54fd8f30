#!/bin/bash
# h9mapped: main's build (base/) against this branch's (mine/), one run:
# GPU tests of the branch, then knn_bench ti k 20 at 0,1/2,1/4,1/8 on kdd and
# a 5000000 x 8 clustered set, base, mapped lists (default), device lists.
set -u
R=$PWD; X=$R/.xfer/h9mapped; W=/tmp/w; mkdir -p $W; tar -xJf $X/builds.tar.xz -C $W
S=$OUT/summary.txt; nvidia-smi -L > $S; T0=$(date +%s)
D=/tmp/d; mkdir -p $D; cp $X/kdd.json $D/; xz -dc $X/kdd.f32.xz > $D/kdd.f32
(cd $W/mine && timeout 100 python3 bench/make_cpu_sets.py clustered 5000000 8 $D clustered5m > /tmp/mk.log 2>&1) &
MK=$!
cd $W/mine
timeout ${TEST_S:-70} ./test/gpu_engine_test --gtest_filter='GpuTiOutOfCore.*:GpuTi*' > $OUT/tests.txt 2>&1
echo "tests rc=$? ($(( $(date +%s) - T0 )) s)" >> $S
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED  \]|^\[==========\]" $OUT/tests.txt >> $S
B() { # name module-dir sets fractions repeat [env...]
  local n=$1 m=$2 sets=$3 fr=$4 rep=$5; shift 5
  env KNN_TI_TRACE=1 "$@" timeout 70 $W/mine/bench/knn_bench $D --module-dir $m --methods ti --k 20 \
    --sets $sets --repeat $rep --gpu-memory-fractions $fr --out /tmp/$n.json > /tmp/$n.txt 2>&1
  echo "== $n rc=$? ($(( $(date +%s) - T0 )) s)" >> $S; grep -E "^$sets" /tmp/$n.txt >> $S
  { echo "== $n"; cat /tmp/$n.txt; } >> $OUT/bench-trace.txt; cat /tmp/$n.json >> $OUT/bench.jsonl
}
B kdd-base $W/base kdd 0,0.5,0.25,0.125 3
B kdd-mapped $W/mine kdd 0,0.5,0.25,0.125 3
B kdd-device $W/mine kdd 0.25,0.125 3 KNN_TI_LISTS=device
wait $MK; echo "5M made rc=$? ($(( $(date +%s) - T0 )) s)" >> $S
B c5m-base $W/base clustered5m 0,0.5,0.25,0.125 1
B c5m-mapped $W/mine clustered5m 0,0.5,0.25,0.125 1
B c5m-device $W/mine clustered5m 0.25,0.125 1 KNN_TI_LISTS=device
echo "all $(( $(date +%s) - T0 )) s" >> $S
cat $S
