#!/usr/bin/env python3
"""FAISS flat (exact brute force, BLAS) baseline for the CPU benchmark.

  faiss_reference.py DATA_DIR NAME [--k 20] [--threads 2] [--repeat 3]
                     [--exact NAME.knn.csv] [--out FILE.json]

DATA_DIR/NAME.f32 (raw float32 rows) with NAME.json ("rows", "dims"), the
format bench/knn_bench reads. The same job as knn_gpu's benchmark: a k = 20
self-join with self-match exclusion (each row's k nearest other rows, L2).
faiss.IndexFlatL2: add all rows, search all rows for k + 1 and drop the
query's own row (or, where the row is not among the k + 1 because of more
than k exact duplicates, the last one). Timed: add + search, one untimed
warm-up, then the median of --repeat runs (fewer where --budget says so,
none where the warm-up alone exceeds it: then it is the measurement;
the upper median for an even count, as knn_bench); faiss.omp_set_num_threads
and OpenBLAS's thread count are --threads (set OPENBLAS_NUM_THREADS before
Python starts; this script sets it too when it is not set).

FAISS flat is not exact (it ranks by |q|^2 + |t|^2 - 2 q.t in float32), so
with --exact (knn_gpu's own result: CSV lines query_id,target_id,distance,
1-based ids, ordered by query and rank, as bench/cpu_bench.sh dumps it) the
script also counts
  id_differences: FAISS neighbours not in knn_gpu's neighbour list of that
      row (includes equally near rows swapped at ties: not errors),
  wrong: FAISS neighbours farther than knn_gpu's k-th distance of that row,
      by knn_gpu's own distance (pgvector's float32 sums in a fixed order,
      recomputed here exactly): true errors; ties are not counted,
  recall = 1 - wrong / (rows * k),
and recomputes knn_gpu's own distances (knn_gpu_distances_not_reproduced:
how many differ, bit for bit; expected 0).
Writes one JSON object (stdout, or --out).
"""
import argparse
import json
import os
import sys
import time


def loaded_blas():
    """The BLAS / LAPACK libraries mapped into this process."""
    libs = set()
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.split()[-1]
                if any(s in path for s in ("blas", "lapack", "blis", "atlas", "mkl")):
                    libs.add(path)
    except OSError:
        pass
    return sorted(libs)


def load(data_dir, name):
    import numpy as np
    with open(os.path.join(data_dir, name + ".json")) as f:
        meta = json.load(f)
    rows, dims = int(meta["rows"]), int(meta["dims"])
    x = np.fromfile(os.path.join(data_dir, name + ".f32"), dtype="<f4", count=rows * dims)
    return np.ascontiguousarray(x.reshape(rows, dims))


def drop_self(labels, dist, k):
    """k + 1 results per row -> k: without the row itself (else the last)."""
    import numpy as np
    n = labels.shape[0]
    own = labels == np.arange(n)[:, None]
    own[~own.any(axis=1), k] = True
    keep = ~own
    return labels[keep].reshape(n, k), dist[keep].reshape(n, k)


def faiss_once(faiss, x, k):
    t0 = time.perf_counter()
    index = faiss.IndexFlatL2(x.shape[1])
    index.add(x)
    dist, labels = index.search(x, k + 1)
    return time.perf_counter() - t0, labels, dist


def read_exact(path, n, k):
    import numpy as np
    with open(path) as f:
        text = f.read()
    vals = np.fromstring(text.replace(",", " "), sep=" ")  # C parser; fine for 10M lines
    del text
    if vals.size != n * k * 3:
        raise ValueError(f"{path}: {vals.size // 3} neighbour rows, expected {n} x {k}")
    vals = vals.reshape(n * k, 3)
    qid = vals[:, 0].astype(np.int64).reshape(n, k)
    if not (qid == np.arange(1, n + 1)[:, None]).all():
        raise ValueError(f"{path}: not ordered by query id 1..{n}")
    return vals[:, 1].astype(np.int64).reshape(n, k) - 1, vals[:, 2].reshape(n, k)


def l2_knn(x, rows, nbrs):
    """L2 distances between rows and their neighbour lists, computed exactly
    as knn_gpu does (kernels/knn_distance.h: float32 squares summed over 8
    interleaved lanes in index order, folded ((l0+l4)+(l2+l6)) +
    ((l1+l5)+(l3+l7)), sqrt in double): bit-identical to its distances."""
    import numpy as np
    n, d = x.shape
    dpad = -(-d // 8) * 8
    q = x[rows][:, None, :]
    t = x[nbrs]
    diff = t - q if dpad == d else np.pad(t - q, ((0, 0), (0, 0), (0, dpad - d)))
    sq = (diff * diff).reshape(diff.shape[0], diff.shape[1], dpad // 8, 8)
    lanes = np.zeros((diff.shape[0], diff.shape[1], 8), dtype=np.float32)
    for j in range(dpad // 8):
        lanes += sq[:, :, j, :]
    l = lanes
    s = ((l[..., 0] + l[..., 4]) + (l[..., 2] + l[..., 6])) + ((l[..., 1] + l[..., 5]) + (l[..., 3] + l[..., 7]))
    return np.sqrt(s.astype(np.float64))


def compare(x, faiss_ids, exact_ids, exact_dist, k):
    import numpy as np
    n, d = x.shape
    chunk = max(1, int(8e6 // (k * d)))
    id_diff = wrong = dist_mismatch = 0
    for s in range(0, n, chunk):
        e = min(n, s + chunk)
        rows = np.arange(s, e)
        f, ei, ed = faiss_ids[s:e], exact_ids[s:e], exact_dist[s:e]
        id_diff += int((~(f[:, :, None] == ei[:, None, :]).any(axis=2)).sum())
        # A FAISS neighbour is wrong when it is farther, by knn_gpu's own
        # distance, than knn_gpu's k-th neighbour: equal distances (ties
        # ordered differently) are not errors.
        wrong += int((l2_knn(x, rows, f) > ed[:, -1:]).sum())
        # knn_gpu's distances, recomputed: they must match bit for bit.
        dist_mismatch += int((l2_knn(x, rows, ei) != ed).sum())
    return {"id_differences": id_diff, "wrong": wrong, "recall": 1.0 - wrong / float(n * k),
            "knn_gpu_distances_not_reproduced": dist_mismatch}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("data_dir")
    p.add_argument("name")
    p.add_argument("--k", type=int, default=20)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--budget", type=float, default=0,
                   help="seconds for the timed runs: fewer than --repeat (at least 1) where the "
                        "warm-up shows that they would take longer, and none (the warm-up is "
                        "the measurement) where the warm-up alone took longer (0: no limit)")
    p.add_argument("--exact", help="knn_gpu's result as CSV query_id,target_id,distance")
    p.add_argument("--out")
    a = p.parse_args()
    os.environ.setdefault("OPENBLAS_NUM_THREADS", str(a.threads))
    os.environ.setdefault("OMP_NUM_THREADS", str(a.threads))
    import numpy as np
    import faiss

    faiss.omp_set_num_threads(a.threads)
    x = load(a.data_dir, a.name)
    n, d = x.shape
    k = min(a.k, n - 1)
    warm, labels, dist = faiss_once(faiss, x, k)  # warm-up, untimed
    runs = a.repeat
    if a.budget > 0:
        # A warm-up longer than the budget is itself the measurement: its
        # one-time costs are nothing at that length.
        runs = 0 if warm > a.budget else max(1, min(a.repeat, int(a.budget // max(warm, 1e-9))))
    seconds = []
    for _ in range(runs):
        s, labels, dist = faiss_once(faiss, x, k)
        seconds.append(s)
    if not seconds:
        seconds = [warm]
    result = {
        "set": a.name, "rows": n, "dims": d, "k": k, "threads": a.threads,
        "faiss_version": getattr(faiss, "__version__", "?"), "index": "IndexFlatL2",
        "blas": loaded_blas(), "openblas_num_threads": os.environ.get("OPENBLAS_NUM_THREADS"),
        "warmup_seconds": warm, "warmup_is_the_measurement": runs == 0, "seconds": seconds, "median": sorted(seconds)[len(seconds) // 2],
    }
    ids, _ = drop_self(labels, dist, k)
    result["self_in_results"] = float((labels == np.arange(n)[:, None]).any(axis=1).mean())
    if a.exact:
        try:
            exact_ids, exact_dist = read_exact(a.exact, n, k)
            result["vs_knn_gpu"] = compare(x, ids, exact_ids, exact_dist, k)
        except (OSError, ValueError) as e:
            result["vs_knn_gpu"] = {"error": str(e)}
    text = json.dumps(result, indent=1)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")
    print(text if not a.out else
          "%s: FAISS flat %.4f s (median of %d)%s" % (
              a.name, result["median"], len(seconds),
              "" if "vs_knn_gpu" not in result else "  vs knn_gpu: %s" % json.dumps(result["vs_knn_gpu"])))


if __name__ == "__main__":
    sys.exit(main())
