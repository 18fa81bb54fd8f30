#!/usr/bin/env python3
"""Writes a raw float32 data set as COPY text rows: id<TAB>[v1,v2,...].

usage: load_dataset.py FILE.f32 DIMS [ROWS]   (stdout: one line per row, ids from 1)
Also reads fashion-mnist IDX (train-images-idx3-ubyte[.gz]) when DIMS is 'idx'.
Values are printed with 9 significant digits, which round-trips every float32.
"""
import gzip
import sys

import numpy as np


def load(path, dims, rows):
    if dims == "idx":
        opener = gzip.open if path.endswith(".gz") else open
        with opener(path, "rb") as f:
            raw = f.read()
        n, h, w = (int.from_bytes(raw[i:i + 4], "big") for i in (4, 8, 12))
        data = np.frombuffer(raw, dtype=np.uint8, offset=16).reshape(n, h * w).astype(np.float32)
    else:
        data = np.fromfile(path, dtype="<f4").reshape(-1, int(dims))
    return data[:rows] if rows else data


def main():
    path, dims = sys.argv[1], sys.argv[2]
    rows = int(sys.argv[3]) if len(sys.argv) > 3 else 0
    data = load(path, dims, rows)
    ids = np.arange(1, data.shape[0] + 1, dtype=np.float64)[:, None]
    table = np.hstack([ids, data.astype(np.float64)])
    row_format = "%d\t[" + ",".join(["%.9g"] * data.shape[1]) + "]"
    np.savetxt(sys.stdout.buffer, table, fmt=row_format)


if __name__ == "__main__":
    main()
