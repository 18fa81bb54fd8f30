#!/usr/bin/env python3
"""plot.py -- bar chart of bench/knn_bench results (and the torch
reference, when its JSON exists): seconds per data set, log scale.

    python3 bench/plot.py bench/results/knn_bench.json [bench/results/torch_reference.json] -o out.png
"""
import argparse
import json
import os

import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("bench_json")
    ap.add_argument("torch_json", nargs="?")
    ap.add_argument("-o", "--out", default="bench/results/bench.png")
    args = ap.parse_args()
    with open(args.bench_json) as f:
        bench = json.load(f)
    torch_times = {}
    if args.torch_json and os.path.exists(args.torch_json):
        with open(args.torch_json) as f:
            for d in json.load(f)["datasets"]:
                if d.get("mode", "fp32") == "fp32":  # the reduced-precision runs are inexact
                    torch_times[d["name"]] = d["median"]

    sets = [d for d in bench["datasets"]]
    labels = [f'{d["name"]}\n{d["rows"]}x{d["dims"]}' for d in sets]
    series = {}
    for i, d in enumerate(sets):
        for r in d["runs"]:
            if r["status"] != 0 or not r["seconds"]:
                continue
            series.setdefault(f'{r["engine"]} {r["method"]}', {})[i] = r["median"]
        if d["name"] in torch_times:
            series.setdefault("torch fp32 addmm+topk", {})[i] = torch_times[d["name"]]

    names = sorted(series, key=lambda s: (s.startswith("torch"), s))
    width = 0.8 / max(1, len(names))
    fig, ax = plt.subplots(figsize=(max(8, 1.4 * len(sets)), 5))
    for j, name in enumerate(names):
        xs = [i + (j - (len(names) - 1) / 2) * width for i in series[name]]
        ax.bar(xs, list(series[name].values()), width, label=name)
    ax.set_xticks(range(len(sets)))
    ax.set_xticklabels(labels, fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("seconds (host arrays to host results)")
    ax.set_title(f'k={bench["k"]} self-joins, {bench["metric"]}; {bench["engine"]}', fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(axis="y", which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    print("wrote", args.out)


if __name__ == "__main__":
    main()
