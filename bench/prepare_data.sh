#!/bin/sh
# prepare_data.sh -- copies the benchmark data (compressed) into .bench-data/
# inside the repository, ignored by git, so that it can travel to a GPU host
# (the device tool carries ignored folders only when named) and be found by
# run_bench.sh. Sources: /work/shared/datasets (*.f32.xz + *.json) and the
# Debian package dataset-fashion-mnist (first 20000 training images).
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
# Only the first 20000 images are used: keep a truncated copy (IDX header
# with the count set to 20000, then 20000 * 784 bytes), about 9 MB gzipped.
if [ -e "$fashion" ] && [ ! -e .bench-data/train-images-idx3-ubyte.gz ]; then
  gzip -dc "$fashion" | python3 -c '
import sys
data = sys.stdin.buffer.read()
n = 20000
header = data[:4] + n.to_bytes(4, "big") + data[8:16]
sys.stdout.buffer.write(header + data[16:16 + n * 28 * 28])' | gzip -9 > .bench-data/train-images-idx3-ubyte.gz
fi
ls -la .bench-data
