#!/usr/bin/env python3
"""torch_reference.py -- the baseline the GPU engine is measured against:
a brute-force k-NN self-join in PyTorch, fp32 (no TF32), chunked
addmm (|t|^2 - 2 q.t, plus |q|^2) and topk, host arrays in, host results
out, timed like bench/knn_bench (median of --repeat runs after a warm-up).
It is approximate (GEMM-expanded distances, no self-exclusion, ties in
any order): a speed reference only. --modes adds reduced-precision runs
(tf32: TF32 tensor cores; bf16, fp16: the rows and the GEMM in that format,
fp32 accumulation), which are inexact even as references: marked
"exact": false in the JSON.

    python3 bench/torch_reference.py DATA_DIR [--k 20] [--repeat 2] [--out FILE]
                                     [--sets a,b] [--modes fp32,tf32,bf16,fp16]
                                     [--fashion-rows 20000] [--queries 1,4,12]

--queries: instead of the self-join, batches of that many rows (evenly
spaced, as bench/knn_bench picks them) against all rows of the set.
"""
import argparse
import json
import os
import statistics
import time

import numpy as np
import torch

SETS = ["3DNet_head5000", "arcene", "keggD_std", "kegg_std", "blog", "fashion-mnist",
        "skin", "ipums", "kdd"]


def load(data_dir, name, fashion_rows=20000):
    if name == "fashion-mnist":
        path = os.path.join(data_dir, "fashion-mnist.idx")
        if not os.path.exists(path):
            return None
        raw = np.fromfile(path, dtype=np.uint8)
        count = int.from_bytes(raw[4:8].tobytes(), "big")
        h = int.from_bytes(raw[8:12].tobytes(), "big")
        w = int.from_bytes(raw[12:16].tobytes(), "big")
        rows = min(count, fashion_rows)
        return f"fashion-mnist-{rows // 1000}k", raw[16:16 + rows * h * w].reshape(rows, h * w).astype(np.float32)
    meta = os.path.join(data_dir, name + ".json")
    if not os.path.exists(meta):
        return None
    with open(meta) as f:
        m = json.load(f)
    x = np.fromfile(os.path.join(data_dir, name + ".f32"), dtype="<f4")
    return name, x.reshape(m["rows"], m["dims"])


def knn_self_join(x, k, chunk_bytes=2 << 30, mode="fp32", queries=None):
    """Host array in, host (distances, indices) out. queries: a host array
    of query rows (default: x itself, the self-join)."""
    dev = torch.device("cuda")
    torch.backends.cuda.matmul.allow_tf32 = mode == "tf32"
    dtype = torch.bfloat16 if mode == "bf16" else torch.float16 if mode == "fp16" else None
    xt = torch.from_numpy(x).to(dev)
    qt = xt if queries is None else torch.from_numpy(queries).to(dev)
    if dtype is not None:
        xt = xt.to(dtype)
        qt = xt if queries is None else qt.to(dtype)
    n, nq = xt.shape[0], qt.shape[0]
    norms = (xt.float() * xt.float()).sum(dim=1).to(xt.dtype)
    q_norms = norms if queries is None else (qt.float() * qt.float()).sum(dim=1).to(xt.dtype)
    rows = max(1, min(nq, chunk_bytes // (4 * n)))
    kk = min(k, n)
    out_d = torch.empty((nq, kk), dtype=xt.dtype, device=dev)
    out_i = torch.empty((nq, kk), dtype=torch.int64, device=dev)
    for s in range(0, nq, rows):
        q = qt[s:s + rows]
        d = torch.addmm(norms.unsqueeze(0), q, xt.t(), beta=1.0, alpha=-2.0)
        d += q_norms[s:s + rows].unsqueeze(1)
        v, i = torch.topk(d, kk, dim=1, largest=False, sorted=True)
        out_d[s:s + rows] = v.clamp_min_(0).sqrt_()
        out_i[s:s + rows] = i
    d_host, i_host = out_d.cpu(), out_i.cpu()
    torch.cuda.synchronize()
    return d_host, i_host


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("data_dir")
    ap.add_argument("--k", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--sets", default=",".join(SETS))
    ap.add_argument("--out", default="bench/results/torch_reference.json")
    ap.add_argument("--modes", default="fp32")
    ap.add_argument("--fashion-rows", type=int, default=20000)
    ap.add_argument("--queries", default="")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    result = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
              "k": args.k, "datasets": []}
    for name in args.sets.split(","):
        loaded = load(args.data_dir, name, args.fashion_rows)
        if loaded is None:
            continue
        set_label, x = loaded
        batches = [None]
        if args.queries:
            batches = [min(int(b), x.shape[0]) for b in args.queries.split(",")]
        for batch in batches:
            label, queries = set_label, None
            if batch is not None:
                label = f"{set_label}-q{batch}"
                queries = np.ascontiguousarray(x[[i * x.shape[0] // batch for i in range(batch)]])
            for mode in args.modes.split(","):
                knn_self_join(x[:1000], args.k, mode=mode)  # warm-up: context, kernels
                times = []
                for _ in range(args.repeat + 1):
                    t0 = time.perf_counter()
                    knn_self_join(x, args.k, mode=mode, queries=queries)
                    times.append(time.perf_counter() - t0)
                times = times[1:]  # the first full-size run pays the allocator's growth
                med = statistics.median(times)
                print(f"{label:18s} torch {mode:5s} {med:9.4f} s", flush=True)
                entry = {"name": label, "rows": int(x.shape[0]), "dims": int(x.shape[1]),
                         "queries": int(x.shape[0] if queries is None else queries.shape[0]),
                         "seconds": times, "median": med, "mode": mode, "exact": False}
                result["datasets"].append(entry)
        torch.backends.cuda.matmul.allow_tf32 = False
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
