#!/bin/sh
# run_bench.sh -- decompresses the benchmark data into a temporary folder,
# builds and runs bench/knn_bench (GPU brute / TI / auto and the CPU engine,
# verified against each other), then the torch reference where torch is
# installed, then the plot where matplotlib is installed.
#
#   bench/run_bench.sh [knn_bench options, e.g. --sets skin,kdd --repeat 3]
#
# Data: .bench-data/ (see bench/prepare_data.sh) or $KNN_BENCH_DATA.
# KNN_BENCH_TORCH=0 skips the torch reference; KNN_BENCH_BUILD=0 skips the build.
# KNN_BENCH_EMBED="300000x768 1000000x768" adds embedding-like sets generated
# on the fly (bench/make_cpu_sets.py embedding: unit-norm Gaussian mixture,
# seeded), named embed-DIMd-ROWS; pass them to --sets. KNN_BENCH_TORCH_MODES
# (default fp32,tf32,bf16) picks the torch runs (all but fp32 inexact).
# KNN_BENCH_K (default 20) is k for knn_bench and torch alike, and so are
# KNN_BENCH_SETS (a,b: the sets; default every set found),
# KNN_BENCH_QUERIES (1,4,12: small query batches against each set instead of
# its self-join) and KNN_BENCH_FASHION_ROWS (default 20000).
# Results: bench/results/{knn_bench,torch_reference}.json and bench.png
# (or $KNN_BENCH_OUT).
set -eu
cd "$(dirname "$0")/.."
data=${KNN_BENCH_DATA:-.bench-data}
out=${KNN_BENCH_OUT:-bench/results}
mkdir -p "$out"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for f in "$data"/*.f32.xz; do
  [ -e "$f" ] || continue
  name=$(basename "$f" .f32.xz)
  xz -dc "$f" > "$tmp/$name.f32"
  cp "$data/$name.json" "$tmp/"
done
if [ -e "$data/train-images-idx3-ubyte.gz" ]; then
  gzip -dc "$data/train-images-idx3-ubyte.gz" > "$tmp/fashion-mnist.idx"
fi
for spec in ${KNN_BENCH_EMBED:-}; do
  rows=${spec%x*}
  dims=${spec#*x}
  python3 bench/make_cpu_sets.py embedding "$rows" "$dims" "$tmp" "embed-${dims}d-${rows}"
done
# KNN_BENCH_BUILD=0: bench/knn_bench and knn_gpu_cuda.so were built elsewhere
# (a GPU host without the build tools) and travel with the tree.
[ "${KNN_BENCH_BUILD:-1}" = 0 ] || make -s bench/knn_bench
status=0
k=${KNN_BENCH_K:-20}
common=""
[ -z "${KNN_BENCH_QUERIES:-}" ] || common="$common --queries $KNN_BENCH_QUERIES"
[ -z "${KNN_BENCH_FASHION_ROWS:-}" ] || common="$common --fashion-rows $KNN_BENCH_FASHION_ROWS"
[ -z "${KNN_BENCH_SETS:-}" ] || common="$common --sets $KNN_BENCH_SETS"
# shellcheck disable=SC2086  # $common holds whole options
bench/knn_bench "$tmp" --module-dir "$PWD" --k "$k" --out "$out/knn_bench.json" $common "$@" || status=$?
if [ "${KNN_BENCH_TORCH:-1}" = 0 ]; then
  echo "torch reference skipped (KNN_BENCH_TORCH=0)"
elif python3 -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null; then
  sets=${KNN_BENCH_SETS:-$(ls "$tmp" | sed -n 's/\.json$//p' | tr '\n' ',')fashion-mnist}
  # shellcheck disable=SC2086
  python3 bench/torch_reference.py "$tmp" --k "$k" --out "$out/torch_reference.json" \
    $(echo "$common" | sed 's/--sets [^ ]*//') --sets "$sets" \
    --modes "${KNN_BENCH_TORCH_MODES:-fp32,tf32,bf16}" || status=$?
else
  echo "torch with CUDA not available: torch reference skipped"
fi
if python3 -c 'import matplotlib' 2>/dev/null; then
  python3 bench/plot.py "$out/knn_bench.json" "$out/torch_reference.json" -o "$out/bench.png"
else
  echo "matplotlib not available: run bench/plot.py where it is"
fi
exit $status
