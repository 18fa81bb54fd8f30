#!/usr/bin/env python3
"""plot_scale.py -- issue 9's figures in one picture: out-of-core TI
throughput against GPU memory budget (knn_bench JSON runs with
--gpu-memory-fractions), one GPU against two (multi_gpu_bench.sh's
multi_gpu.json) and many sessions (sessions_bench.sh's JSON, the GPU
service off and on). Any input may be left out.

    python3 bench/plot_scale.py --out-of-core kdd.json [more.json ...] \
        --multi multi_gpu.json --sessions off.json on.json -o scale.png
"""
import argparse
import json
import re

import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def out_of_core_points(paths):
    """{set: [(budget fraction, throughput share of in memory)]}"""
    sets = {}
    for path in paths:
        for d in json.load(open(path))["datasets"]:
            m = re.match(r"(.*)-mem([0-9.]+)$", d["name"])
            base, frac = (m.group(1), float(m.group(2))) if m else (d["name"], 1.0)
            sets.setdefault(base, {})[frac] = d["runs"][0]["median"]
    points = {}
    for name, runs in sets.items():
        if 1.0 in runs:
            points[name] = sorted((f, runs[1.0] / s) for f, s in runs.items() if f < 1.0)
    return points


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out-of-core", nargs="*", default=[])
    ap.add_argument("--multi")
    ap.add_argument("--sessions", nargs="*", default=[])
    ap.add_argument("-o", "--out", default="bench/results/scale.png")
    args = ap.parse_args()
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))

    ax = axes[0]
    for name, pts in out_of_core_points(args.out_of_core).items():
        ax.plot([f for f, _ in pts], [100 * s for _, s in pts], marker="o", label=name)
    ax.axhline(80, color="grey", linestyle="--", linewidth=1, label="target at 1/4")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("GPU memory budget / data size")
    ax.set_ylabel("throughput, % of in memory")
    ax.set_title("Out-of-core TI join")
    ax.legend(fontsize=8)

    ax = axes[1]
    if args.multi:
        joins = [j for j in json.load(open(args.multi))["joins"] if "speedup" in j]
        names = ["%s\n%s" % (j["name"], j["method"]) for j in joins]
        ax.bar(names, [j["speedup"] for j in joins], color="tab:blue")
        for i, j in enumerate(joins):
            ax.text(i, j["speedup"], "%.2fx\n%.3f s -> %.3f s" % (
                j["speedup"], j["seconds_one"], j["seconds_split"]), ha="center", va="bottom",
                fontsize=8)
        ax.axhline(1.8, color="grey", linestyle="--", linewidth=1, label="target 1.8x")
        ax.set_ylim(0, 2.3)
        ax.legend(fontsize=8)
    ax.set_ylabel("speed-up, 2 GPUs over 1")
    ax.set_title("Every GPU of the host")

    ax = axes[2]
    labels, rates, peaks = [], [], []
    for path in args.sessions:
        s = json.load(open(path))
        for r in s["runs"]:
            labels.append("%d sessions\nservice %s" % (r["sessions"], s.get("gpu_service", "off")))
            rates.append(r["joins_per_second"] or 0)
            peaks.append((r["gpu_mib_peak"] or 0) / 1024.0)
    if labels:
        x = range(len(labels))
        ax.bar([i - 0.2 for i in x], rates, width=0.4, color="tab:green", label="joins/s")
        ax2 = ax.twinx()
        ax2.bar([i + 0.2 for i in x], peaks, width=0.4, color="tab:red", label="peak GPU GB")
        ax2.set_ylabel("peak GPU memory, GB")
        ax.set_xticks(list(x))
        ax.set_xticklabels(labels, fontsize=8)
        ax.legend(loc="upper left", fontsize=8)
        ax2.legend(loc="upper right", fontsize=8)
    ax.set_ylabel("joins per second")
    ax.set_title("One GPU, many sessions")
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print("wrote", args.out)


if __name__ == "__main__":
    main()
