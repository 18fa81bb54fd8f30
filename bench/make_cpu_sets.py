#!/usr/bin/env python3
"""Writes the CPU benchmark's extra data sets as NAME.f32 + NAME.json, the
format bench/knn_bench (load_f32) and bench/load_dataset.py already read:
raw little-endian float32, row-major, no header; NAME.json gives rows, dims.

  make_cpu_sets.py fashion IDX_GZ ROWS OUT_DIR NAME
      the first ROWS fashion-mnist images (Debian dataset-fashion-mnist,
      train-images-idx3-ubyte.gz) as float32 pixel values 0..255, unscaled:
      the same values as knn_bench's fashion-mnist-20k (load_idx) and
      load_dataset.py's 'idx' mode.
  make_cpu_sets.py embedding ROWS DIMS OUT_DIR NAME [--centres 100] [--seed 20261123]
      an embedding-like set, deterministic for a seed: a Gaussian mixture
      of --centres random unit directions, each row a centre plus isotropic
      noise (a per-cluster spread between 0.6 and 1.0 of the centre's
      length), normalised to unit length. Cluster sizes are uneven (Zipf-like
      weights). Rows are generated in blocks of 10000 from one seeded stream,
      so the first R rows of a bigger set are the set of R rows.
  make_cpu_sets.py clustered ROWS DIMS OUT_DIR NAME [--centres 1000] [--seed 20261126]
      a low-dimensional clustered set (the triangle-inequality join's
      ground), deterministic for a seed: --centres Gaussian blobs with
      centres uniform in [0, 100)^DIMS and a per-blob spread between 0.2
      and 2.0, sizes uneven (Zipf-like weights); rows in random order (each
      drawn independently), in blocks of 1000000 from one seeded stream.
"""
import argparse
import gzip
import json
import os
import sys

import numpy as np


def write_set(out_dir, name, data, meta):
    os.makedirs(out_dir, exist_ok=True)
    data = np.ascontiguousarray(data, dtype="<f4")
    data.tofile(os.path.join(out_dir, name + ".f32"))
    meta = dict({"rows": int(data.shape[0]), "dims": int(data.shape[1]), "dtype": "float32",
                 "layout": "row-major, little-endian, no header"}, **meta)
    with open(os.path.join(out_dir, name + ".json"), "w") as f:
        json.dump(meta, f, indent=1)
        f.write("\n")
    print(f"{name}: {data.shape[0]} x {data.shape[1]} -> {out_dir}/{name}.f32")


def fashion(args):
    with gzip.open(args.idx, "rb") as f:
        raw = f.read()
    n, h, w = (int.from_bytes(raw[i:i + 4], "big") for i in (4, 8, 12))
    rows = min(args.rows, n) if args.rows > 0 else n
    pixels = np.frombuffer(raw, dtype=np.uint8, offset=16, count=rows * h * w)
    write_set(args.out_dir, args.name, pixels.reshape(rows, h * w).astype(np.float32),
              {"source": os.path.abspath(args.idx),
               "notes": f"first {rows} of {n} fashion-mnist training images, pixels 0..255 as float32"})


def zipf_weights(c):
    """Uneven cluster sizes: weight 1/sqrt(i) for the i-th of c clusters."""
    weights = 1.0 / np.arange(1, c + 1) ** 0.5
    return weights / weights.sum()


def embedding(args):
    rng = np.random.default_rng(args.seed)
    d, c = args.dims, args.centres
    centres = rng.standard_normal((c, d))
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    spread = rng.uniform(0.6, 1.0, size=c)
    weights = zipf_weights(c)
    out = np.empty((args.rows, d), dtype=np.float32)
    block = 10000
    for start in range(0, args.rows, block):
        m = min(block, args.rows - start)
        # Whole blocks from the stream, the last one cut: a prefix property.
        label = rng.choice(c, size=block, p=weights)
        x = centres[label] + rng.standard_normal((block, d)) * (spread[label] / np.sqrt(d))[:, None]
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        out[start:start + m] = x[:m]
    write_set(args.out_dir, args.name, out,
              {"generator": "bench/make_cpu_sets.py embedding", "seed": args.seed,
               "centres": c,
               "notes": "Gaussian mixture in %d-d (%d unit centres, Zipf-like sizes, noise "
                        "0.6-1.0 x centre length), rows normalised to unit length" % (d, c)})


def clustered(args):
    rng = np.random.default_rng(args.seed)
    d, c = args.dims, args.centres
    centres = rng.uniform(0.0, 100.0, size=(c, d))
    spread = rng.uniform(0.2, 2.0, size=c)
    weights = zipf_weights(c)
    out = np.empty((args.rows, d), dtype=np.float32)
    for start in range(0, args.rows, 1000000):
        m = min(1000000, args.rows - start)
        label = rng.choice(c, size=m, p=weights)
        out[start:start + m] = centres[label] + rng.standard_normal((m, d)) * spread[label][:, None]
    write_set(args.out_dir, args.name, out,
              {"generator": "bench/make_cpu_sets.py clustered", "seed": args.seed,
               "centres": c,
               "notes": "%d Gaussian blobs in %d-d, centres uniform in [0,100), spread 0.2-2.0, "
                        "Zipf-like sizes, rows in random order" % (c, d)})


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="kind", required=True)
    f = sub.add_parser("fashion")
    f.add_argument("idx")
    f.add_argument("rows", type=int)
    f.add_argument("out_dir")
    f.add_argument("name")
    for kind, centres, seed in (("embedding", 100, 20261123), ("clustered", 1000, 20261126)):
        g = sub.add_parser(kind)
        g.add_argument("rows", type=int)
        g.add_argument("dims", type=int)
        g.add_argument("out_dir")
        g.add_argument("name")
        g.add_argument("--centres", type=int, default=centres)
        g.add_argument("--seed", type=int, default=seed)
    args = p.parse_args()
    {"fashion": fashion, "embedding": embedding, "clustered": clustered}[args.kind](args)


if __name__ == "__main__":
    sys.exit(main())
