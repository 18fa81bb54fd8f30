#!/usr/bin/env python3
"""Draws bench/cpu_bench.sh's result: seconds per data set per system (log
scale): knn_gpu's CPU engine (auto, and its fastest method where another one
was faster), knn_gpu through SQL, FAISS flat; FAISS / knn_gpu auto written
above each group.

  plot_cpu.py bench/results/cpu_bench.json [-o bench/results/cpu_bench.png]
"""
import argparse
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("json")
    p.add_argument("-o", "--out", default="bench/results/cpu_bench.png")
    a = p.parse_args()
    with open(a.json) as f:
        doc = json.load(f)
    sets = doc["sets"]
    if not sets:
        print("no data sets in " + a.json)
        return 1

    def engine(s, key):
        return (s.get("knn_gpu_engine") or {}).get(key)

    series = [
        ("knn_gpu engine, auto", "#1f77b4", lambda s: engine(s, "auto_seconds")),
        ("knn_gpu engine, fastest method", "#aec7e8",
         lambda s: engine(s, "best_seconds") if engine(s, "best_method") not in (None, "cpu-auto") else None),
        ("knn_gpu through SQL", "#2ca02c", lambda s: (s.get("knn_gpu_sql") or {}).get("median")),
        ("FAISS IndexFlatL2", "#d62728", lambda s: (s.get("faiss") or {}).get("median")),
    ]
    width = 0.8 / len(series)
    fig, ax = plt.subplots(figsize=(max(8, 1.3 * len(sets) + 2), 5.5))
    tops = [0.0] * len(sets)
    for j, (label, colour, get) in enumerate(series):
        xs, ys = [], []
        for i, s in enumerate(sets):
            v = get(s)
            if v:
                xs.append(i - 0.4 + width * (j + 0.5))
                ys.append(v)
                tops[i] = max(tops[i], v)
        if xs:
            ax.bar(xs, ys, width, label=label, color=colour)
    ax.set_yscale("log")
    for i, s in enumerate(sets):
        r = (s.get("ratios") or {}).get("faiss_over_engine_auto")
        if r and tops[i]:
            tgt = s.get("target")
            text = "%.1fx" % r if r < 10 else "%.0fx" % r
            if tgt:
                text += "\n(goal %gx)" % tgt["faiss_over_engine_auto_at_least"]
            ax.annotate(text, (i, tops[i] * 1.15), ha="center", va="bottom", fontsize=8,
                        color="black" if not tgt or tgt["met"] else "#d62728")
    ax.set_xticks(range(len(sets)))
    def tick(s):
        best = engine(s, "best_method")
        extra = "\nfastest: %s" % best if best not in (None, "cpu-auto") else ""
        return "%s\n%sx%s%s" % (s["name"], s["rows"], s["dims"], extra)
    ax.set_xticklabels([tick(s) for s in sets], fontsize=8)
    lo, hi = ax.get_ylim()
    ax.set_ylim(lo, hi * 8)
    ax.set_ylabel("seconds (median), log scale")
    ax.set_title("k = %s self-join, L2, %s threads on %s\nlabels: FAISS time / knn_gpu auto time (above 1: knn_gpu faster)"
                 % (doc.get("k"), doc.get("threads"), (doc.get("machine") or {}).get("cpu", "?")), fontsize=9)
    ax.legend(fontsize=8, loc="upper left")
    ax.grid(axis="y", which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(a.out, dpi=120)
    print("wrote " + a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
