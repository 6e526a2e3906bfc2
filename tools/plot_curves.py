#!/usr/bin/python3
"""Loss curves from grass runs: one line per run, from <out_dir>/metrics.jsonl.

    tools/plot_curves.py --out docs/img/curves.png LABEL=runs/a/metrics.jsonl LABEL=runs/b/...

Plots the training loss of every step (thin) and the validation loss of the eval rows (rows with
"eval": true; thick, with markers), and prints a markdown table of the validation loss at each
eval step. Needs python3-matplotlib (apt-get install python3-matplotlib).
"""
import argparse
import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def read_metrics(path):
    train, evals = [], []
    with open(path) as f:
        for line in f:
            row = json.loads(line)
            if row.get("eval"):
                evals.append((row["step"], row["val_loss"]))
            else:
                train.append((row["step"], row["loss"]))
    return train, evals


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="PNG to write")
    parser.add_argument("--title", default="")
    parser.add_argument("runs", nargs="+", help="LABEL=path/to/metrics.jsonl")
    args = parser.parse_args()

    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    table = {}
    for spec in args.runs:
        label, path = spec.split("=", 1)
        train, evals = read_metrics(path)
        line, = ax.plot([s for s, _ in train], [l for _, l in train], linewidth=0.6, alpha=0.5)
        if evals:
            ax.plot([s for s, _ in evals], [l for _, l in evals], marker="o", markersize=3,
                    color=line.get_color(), linewidth=1.8, label=f"{label} (validation)")
        table[label] = dict(evals)
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats/token)")
    ax.set_title(args.title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.out)

    steps = sorted({s for evals in table.values() for s in evals})
    print("| step | " + " | ".join(table) + " |")
    print("|---" * (len(table) + 1) + "|")
    for s in steps:
        cells = [f"{table[label][s]:.4f}" if s in table[label] else "" for label in table]
        print(f"| {s} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
