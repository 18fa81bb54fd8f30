#!/bin/sh
# prepare_data.sh -- copies the benchmark data (compressed) into .bench-data/
# inside the repository, ignored by git, so that it can travel to a GPU host
# (the device tool carries ignored folders only when named) and be found by
# run_bench.sh. Sources: /work/shared/datasets (*.f32.xz + *.json) and the
# Debian package dataset-fashion-mnist (its 60000 training images).
set -eu
cd "$(dirname "$0")/.."
src=${KNN_DATASETS:-../shared/datasets}
fashion=${KNN_FASHION:-/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz}
mkdir -p .bench-data
grep -qx '/.bench-data/' .git/info/exclude 2>/dev/null || echo '/.bench-data/' >> .git/info/exclude
for f in "$src"/*.f32.xz; do
  [ -e "$f" ] || continue
  name=$(basename "$f" .f32.xz)
  cp "$f" "$src/$name.json" .bench-data/
done
# fashion-mnist's training images as they are (60000, 26 MB gzipped);
# knn_bench and the torch reference use the first --fashion-rows of them.
if [ -e "$fashion" ] && ! cmp -s "$fashion" .bench-data/train-images-idx3-ubyte.gz; then
  cp "$fashion" .bench-data/train-images-idx3-ubyte.gz
fi
ls -la .bench-data
