#!/usr/bin/python3
"""Curves of grass runs: loss, validation perplexity and throughput, from each run's metrics.jsonl.

    tools/plot_curves.py [--out FILE.png] RUN_DIR [RUN_DIR...]
    tools/plot_curves.py --check RUN_DIR...      read and check the runs, draw nothing

Draws one PNG of three panels against the step: the training loss of every logged step (thin)
with the validation loss of the evaluations (thick, with markers), the validation perplexity,
and tokens per second; one colour per run. A RUN_DIR is a `grass train` out_dir (or the path of
a metrics.jsonl). The PNG goes to --out, by default RUN_DIR/curves.png for one run and
./curves.png for several; one summary line per run and the PNG's path go to stdout.

scripts/plot.sh is the way in: it installs Debian's python3-matplotlib when /usr/bin/python3
lacks it. Bad input is one `error: ...` line on stderr and exit status 2.
"""
import argparse
import json
import math
import os
import statistics
import sys


class UserError(Exception):
    pass


class Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, as every grass error
        raise UserError(f"{message} (usage: scripts/plot.sh [--out FILE.png] RUN_DIR...)")


def number(value):
    """A loss or rate from a row: grass writes a non-finite value (a diverged loss) as null."""
    return float("nan") if value is None else float(value)


class Run:
    def __init__(self, label, path):
        self.label = label
        self.path = path
        self.steps, self.losses, self.rates = [], [], []  # step rows
        self.evals = []  # (step, val_loss, val_perplexity)


def metrics_path(arg):
    if os.path.isdir(arg):
        path = os.path.join(arg, "metrics.jsonl")
        if not os.path.isfile(path):
            raise UserError(f"{arg}: no metrics.jsonl here: not a grass run's out_dir "
                            "(give the out_dir of a `grass train` run)")
        return path
    if os.path.isfile(arg):
        return arg
    raise UserError(f"{arg}: no such run directory")


def read_run(arg):
    path = metrics_path(arg)
    run = Run(arg.rstrip("/") or arg, path)
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"{path}: cannot read: {e}")
    if not text.strip():
        raise UserError(f"{path} is empty: the run has not logged a step yet")
    lines = text.split("\n")
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            if lineno == len(lines):  # no newline after it: a row still being written
                continue
            raise UserError(f"{path}:{lineno}: not a JSON row: is this a grass metrics.jsonl?")
        try:
            step = row["step"]
            if row.get("eval"):
                run.evals.append((step, number(row["val_loss"]), number(row["val_perplexity"])))
            else:
                run.steps.append(step)
                run.losses.append(number(row["loss"]))
                run.rates.append(number(row.get("tokens_per_s")))
        except (TypeError, KeyError, ValueError, AttributeError):
            raise UserError(f"{path}:{lineno}: a row without step and loss (or val_loss): "
                            "is this a grass metrics.jsonl?")
    if not run.steps and not run.evals:
        raise UserError(f"{path}: no step rows: the run has not logged a step yet")
    return run


def summary(run):
    parts = [f"{run.label}: {len(run.steps)} steps logged"]
    if run.steps:
        parts.append(f"last loss {run.losses[-1]:.4f} at step {run.steps[-1]}")
    if run.evals:
        step, loss, ppl = run.evals[-1]
        parts.append(f"val loss {loss:.4f} (ppl {ppl:.1f}) at step {step}")
    # as `grass train`'s last line: the first step (warm-up) counts only when it is the only one
    rates = [r for r in run.rates[1:] or run.rates if math.isfinite(r)]
    if rates:
        parts.append(f"median {statistics.median(rates):,.0f} tok/s")
    return ", ".join(parts)


def draw(runs, out):
    try:
        import matplotlib
    except ImportError:
        raise UserError("/usr/bin/python3 has no matplotlib: run scripts/plot.sh, which installs "
                        "it (or apt-get install python3-matplotlib)")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, (loss_ax, ppl_ax, rate_ax) = plt.subplots(1, 3, figsize=(15, 4.4), dpi=100)
    for run in runs:
        label = run.label  # one legend entry per run, on its first line
        color = None
        if run.steps:
            line, = loss_ax.plot(run.steps, run.losses, linewidth=0.8, alpha=0.6, label=label)
            color, label = line.get_color(), None
            rate_ax.plot(run.steps, run.rates, linewidth=1.0, color=color)
        if run.evals:
            steps = [s for s, _, _ in run.evals]
            kw = dict(marker="o", markersize=4, linewidth=1.8, color=color)
            line, = loss_ax.plot(steps, [l for _, l, _ in run.evals], label=label, **kw)
            kw["color"] = line.get_color()
            ppl_ax.plot(steps, [p for _, _, p in run.evals], **kw)
    loss_ax.set_title("loss (thin: training steps; markers: validation)")
    loss_ax.set_ylabel("loss (nats/token)")
    ppl_ax.set_title("validation perplexity")
    ppls = [p for run in runs for _, _, p in run.evals if math.isfinite(p) and p > 0]
    if not ppls:
        ppl_ax.text(0.5, 0.5, "no evaluations\n(set eval_every and data.val)",
                    ha="center", va="center", transform=ppl_ax.transAxes)
    elif max(ppls) > 3 * min(ppls):  # an untrained model's thousands beside a trained one's tens
        ppl_ax.set_yscale("log")
    rate_ax.set_title("throughput")
    rate_ax.set_ylabel("tokens/s")
    rate_ax.set_ylim(bottom=0)
    for ax in (loss_ax, ppl_ax, rate_ax):
        ax.set_xlabel("step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
    loss_ax.legend(fontsize=8)
    fig.tight_layout()
    try:
        fig.savefig(out)
    except OSError as e:
        raise UserError(f"{out}: cannot write the plot: {e.strerror or e}")
    finally:
        plt.close(fig)


def main():
    parser = Parser(prog="scripts/plot.sh", description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="the PNG to write (default: RUN_DIR/curves.png for one run, "
                        "./curves.png for several)")
    parser.add_argument("--check", action="store_true", help="read and check the runs, draw nothing")
    parser.add_argument("runs", nargs="+", metavar="RUN_DIR")
    args = parser.parse_args()
    runs = [read_run(arg) for arg in args.runs]
    if args.check:
        return
    out = args.out
    if out is None:
        one = args.runs[0]
        out = os.path.join(one, "curves.png") if len(runs) == 1 and os.path.isdir(one) else "curves.png"
    folder = os.path.dirname(out) or "."
    if not os.path.isdir(folder):
        raise UserError(f"--out {out}: no such directory {folder}")
    draw(runs, out)
    for run in runs:
        print(summary(run))
    print(f"wrote {out}")


if __name__ == "__main__":
    try:
        main()
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        sys.exit(130)
