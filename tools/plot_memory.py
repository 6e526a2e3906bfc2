#!/usr/bin/python3
"""The memory-limit chart: planned peak per model and optimizer against the 24/32/40/80 GiB caps.

    tools/plot_memory.py docs/img/memory_limit.jsonl docs/img/memory_limit.png

Reads the rows scripts/experiments/memory_limit.sh writes. Needs python3-matplotlib.
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

GIB = 1024.0**3


def main(rows_path, png_path):
    rows = [json.loads(line) for line in open(rows_path)]
    models = list(dict.fromkeys(r["model"] for r in rows))
    series = list(dict.fromkeys((r["optimizer"], r["precision"]) for r in rows))
    width = 0.8 / len(series)
    fig, ax = plt.subplots(figsize=(10, 5))
    for i, (optimizer, precision) in enumerate(series):
        peaks = []
        for m in models:
            row = next(r for r in rows if r["model"] == m and r["optimizer"] == optimizer
                       and r["precision"] == precision)
            peaks.append(row["total"] / GIB)
        xs = [j + (i - (len(series) - 1) / 2) * width for j in range(len(models))]
        ax.bar(xs, peaks, width, label=f"{optimizer}, {precision}")
    for cap in (24, 32, 40, 80):
        ax.axhline(cap, color="grey", linestyle="--", linewidth=0.8)
        ax.text(len(models) - 0.45, cap, f"{cap} GiB", va="bottom", ha="right", fontsize=8)
    ax.set_yscale("log")
    ax.set_xticks(range(len(models)))
    ax.set_xticklabels(models)
    ax.set_ylabel("planned peak, GiB (log scale)")
    ax.set_title("Planned peak memory at a token batch of 256, per-layer activation checkpointing")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png_path, dpi=110)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
