#!/usr/bin/env python3
"""Writes a raw float32 data set as a PostgreSQL binary COPY file for a
table (id bigint, v halfvec(DIMS)) or (id bigint, v vector(DIMS)).

usage: write_copy_binary.py FILE.f32 DIMS halfvec|vector OUT.copy

Ids run from 1. halfvec values are the float32 values rounded to the
nearest binary16 (numpy's float16 conversion, round to nearest even), the
rounding pgvector's text input applies too. Binary COPY skips the text
parsing of 1536 numbers per row, which dominates a text load.
"""
import struct
import sys

import numpy as np

# pgvector's binary forms: int16 dim, int16 unused, then the elements in
# network byte order (halfvec: binary16 bits; vector: float4).
ELEMENT = {"halfvec": ">f2", "vector": ">f4"}


def main():
    if len(sys.argv) != 5 or sys.argv[3] not in ELEMENT:
        sys.exit(__doc__)
    path, dims, kind, out = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    data = np.fromfile(path, dtype="<f4").reshape(-1, dims)
    n = data.shape[0]
    value_bytes = 4 + dims * np.dtype(ELEMENT[kind]).itemsize
    row = np.dtype([("fields", ">i2"), ("id_len", ">i4"), ("id", ">i8"), ("v_len", ">i4"),
                    ("dim", ">i2"), ("unused", ">i2"), ("x", ELEMENT[kind], (dims,))])
    rows = np.zeros(n, dtype=row)
    rows["fields"] = 2
    rows["id_len"] = 8
    rows["id"] = np.arange(1, n + 1)
    rows["v_len"] = value_bytes
    rows["dim"] = dims
    rows["x"] = data
    with open(out, "wb") as f:
        f.write(b"PGCOPY\n\xff\r\n\x00" + struct.pack(">ii", 0, 0))
        rows.tofile(f)
        f.write(struct.pack(">h", -1))
    print(f"{out}: {n} rows of {kind}({dims})")


if __name__ == "__main__":
    main()
