#!/usr/bin/python3
"""Tables and plots of scripts/experiments/compare_optimizers.sh's runs (docs/experiments.md).

    compare_report.py last-val RUN_DIR            the run's last validation loss
    compare_report.py best-lr METHOD_DIR          the grid rate (folder lr<X>_s42) with the lowest
                                                  final validation loss
    compare_report.py next-lr METHOD_DIR LR...    the next rate of the ladder LR... past the grid's
                                                  edge when the best rate is on it, else nothing
    compare_report.py table-a A_DIR MODEL...      Table A (markdown) and docs/img/compare_a_<MODEL>.png
    compare_report.py table-b B_DIR LR            Table B (markdown) and docs/img/compare_b.png
    compare_report.py table-peers PEERS_DIR       the peers' table and docs/img/compare_peers.png
    compare_report.py table-clipoff A_DIR OFF_DIR MODEL...   each Table A method at its best rate
                                                  with clipping at 1.0 (A_DIR) and off (OFF_DIR)
    compare_report.py table-prox PROX_DIR         the proximal method with and without, every rate
                                                  at seeds 42, 1, 2
    compare_report.py table-d D_DIR MODEL...      Table D: q8 optimizer states against the
                                                  precision's own (fp32, pure bf16)
    compare_report.py table-e E_DIR MODEL...      Table E: ways of keeping activations at equal
                                                  activation memory
    compare_report.py table-c-row METRICS NAME K PLAN_BYTES   one row of Table C
    compare_report.py finished RUN_DIR            exit status 0 when the run evaluated after its
                                                  last step
    compare_report.py check-config RUN_JSON       one error line, exit 2, unless the run config
                                                  names data.val (--config runs are ranked by it)
    compare_report.py optimizer-base RUN_JSON dense|projected   the run config's optimizer keys
                                                  that every method of that kind keeps (betas,
                                                  eps, weight_decay; rank, update_interval,
                                                  scale, targets), as a JSON object for --set

A difference between two methods "counts" when it exceeds twice the larger of their seed spreads
(max - min of the final validation loss over seeds 42, 1, 2). Plots need python3-matplotlib
(without it the tables are printed and the plots skipped with a line on stderr); they go to
docs/img/, or to the folder COMPARE_PLOTS names (compare_optimizers.sh --config: its --out DIR).
"""
import json
import os
import statistics
import sys

SEEDS = (42, 1, 2)
PLOTS = os.environ.get("COMPARE_PLOTS", "docs/img")
# The optimizer keys a --config comparison keeps from the user's run config; the rest (the name,
# the rate, one optimizer's own choices) are the method's.
DENSE_KEYS = ("betas", "eps", "weight_decay")
PROJECTED_KEYS = DENSE_KEYS + ("rank", "update_interval", "scale", "targets")
BASELINE_B = "r32_K40"
LABELS = {
    "adamw": "AdamW",
    "adamw_split": "AdamW, split rates",
    "grass_top_r": "GRASS top_r",
    "grass_multinomial_nr": "GRASS multinomial_nr",
    "grass_uniform_nr": "GRASS uniform_nr",
    "galore": "GaLore",
    "flora": "FLORA",
}


def read_run(run_dir):
    """(eval curve [(tokens, val_loss)], tokens per step) of one run."""
    evals, tokens_per_step = [], None
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        for line in f:
            row = json.loads(line)
            if row.get("eval"):
                evals.append((row["step"], row["val_loss"]))
            elif tokens_per_step is None:
                tokens_per_step = row["tokens"] // row["step"]
    return [(s * tokens_per_step, v) for s, v in evals]


def finished(run_dir):
    """Whether the run evaluated after its last step (config.json's steps): a run still going, or
    one that stopped, is left out of every table until it has."""
    try:
        with open(os.path.join(run_dir, "config.json")) as f:
            steps = json.load(f)["steps"]
        with open(os.path.join(run_dir, "metrics.jsonl")) as f:
            return any(r.get("eval") and r["step"] == steps for r in map(json.loads, f))
    except (OSError, ValueError, KeyError):
        return False


def final_val(run_dir):
    return read_run(run_dir)[-1][1]


def grid(method_dir):
    """{lr string: final validation loss} of the finished seed-42 grid runs."""
    out = {}
    for name in os.listdir(method_dir):
        path = os.path.join(method_dir, name)
        if name.startswith("lr") and name.endswith("_s42") and finished(path):
            out[name[2:-4]] = final_val(path)
    return dict(sorted(out.items(), key=lambda kv: float(kv[0])))


def best_lr(method_dir):
    g = grid(method_dir)
    return min(g, key=g.get)


def next_lr(method_dir, ladder):
    """The ladder's rate beyond the grid's edge when the best rate is on that edge, else ''."""
    g = grid(method_dir)
    best, tried = best_lr(method_dir), list(g)
    i = ladder.index(best)
    if best == tried[-1] and i + 1 < len(ladder):
        return ladder[i + 1]
    if best == tried[0] and i > 0:
        return ladder[i - 1]
    return ""


def seed_runs(dirs):
    """Final losses, mean, spread and curves of the runs in dirs (one per seed)."""
    finals = [final_val(d) for d in dirs]
    return {
        "finals": finals,
        "mean": statistics.fmean(finals),
        "spread": max(finals) - min(finals),
        "curves": [read_run(d) for d in dirs],
    }


def best_seed_dirs(method_dir):
    """The grid's best rate and its runs at seeds 42, 1, 2 (empty until all three finished)."""
    if not grid(method_dir):
        return None, []
    lr = best_lr(method_dir)
    dirs = [os.path.join(method_dir, f"lr{lr}_s{s}") for s in SEEDS]
    return lr, dirs if all(finished(d) for d in dirs) else []


def versus(a, b):
    """a's mean minus b's, and whether it exceeds twice the larger seed spread."""
    delta = a["mean"] - b["mean"]
    counts = abs(delta) > 2 * max(a["spread"], b["spread"])
    return f"{delta:+.4f} ({'counts' if counts else 'within noise'})"


def plot(path, title, series):
    """series: [(label, seed_runs result)]: the mean over seeds and a min-max band."""
    try:
        import matplotlib
    except ImportError:  # the table is the result; the plot waits for the package
        print(f"no python3-matplotlib: {path} not drawn (apt-get install python3-matplotlib)",
              file=sys.stderr)
        return

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # Left: the whole run; right: its second half, where the methods separate.
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.8), dpi=120)
    for half, ax in enumerate(axes):
        for label, runs in series:
            points = len(runs["curves"][0])
            keep = slice(points // 2 if half else 0, points)
            tokens = [t for t, _ in runs["curves"][0]][keep]
            per_step = list(zip(*[[v for _, v in c] for c in runs["curves"]]))[keep]
            mean = [statistics.fmean(vs) for vs in per_step]
            line, = ax.plot(tokens, mean, marker="o", markersize=3, linewidth=1.5, label=label)
            ax.fill_between(tokens, [min(vs) for vs in per_step], [max(vs) for vs in per_step],
                            color=line.get_color(), alpha=0.2)
        ax.set_xlabel("training tokens")
        ax.set_ylabel("validation loss (nats/token)")
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def table_a(a_dir, models):
    for model in models:
        model_dir = os.path.join(a_dir, model)
        methods = [m for m in LABELS if os.path.isdir(os.path.join(model_dir, m))]
        results = {}
        for m in methods:  # a method whose runs have not all finished is left out
            lr, dirs = best_seed_dirs(os.path.join(model_dir, m))
            if dirs:
                results[m] = (lr, seed_runs(dirs))
        methods = [m for m in methods if m in results]
        grids = {m: grid(os.path.join(model_dir, m)) for m in methods}
        rates = sorted({lr for g in grids.values() for lr in g}, key=float)
        print(f"\n**{model}** (final validation loss; grid at seed 42, then seeds 42, 1, 2 at the best rate)\n")
        print("| method | " + " | ".join(f"lr {r}" for r in rates) +
              " | best lr | mean of 3 seeds | spread | vs AdamW | vs AdamW, split rates |")
        print("|---" * (len(rates) + 6) + "|")
        for m in methods:
            lr, runs = results[m]
            own = list(grids[m])
            edge = " (grid edge)" if lr in (own[0], own[-1]) else ""
            cells = [f"{grids[m][r]:.4f}" if r in grids[m] else "" for r in rates]
            vs = [versus(runs, results[b][1]) if b in results and b != m else "-"
                  for b in ("adamw", "adamw_split")]
            print(f"| {LABELS[m]} | " + " | ".join(cells) +
                  f" | {lr}{edge} | {runs['mean']:.4f} | {runs['spread']:.4f} | {vs[0]} | {vs[1]} |")
        plot(os.path.join(PLOTS, f"compare_a_{model}.png"),
             f"Table A, {model}: validation loss, mean and min-max of 3 seeds at each method's best lr",
             [(f"{LABELS[m]} (lr {results[m][0]})", results[m][1]) for m in methods])


def table_b(b_dir, lr):
    variants = [v for v in os.listdir(b_dir) if os.path.isdir(os.path.join(b_dir, v))]
    results = {v: seed_runs([os.path.join(b_dir, v, f"s{s}") for s in SEEDS]) for v in variants}
    base = results[BASELINE_B]
    cell = lambda v: f"{results[v]['mean']:.4f} ± {results[v]['spread'] / 2:.4f}"
    grid_runs = [v for v in variants if v.startswith("r") and "_K" in v]
    ranks = sorted({int(v[1:].split("_K")[0]) for v in grid_runs})
    intervals = sorted({int(v.split("_K")[1]) for v in grid_runs})
    print(f"\nGRASS top_r at lr {lr}, scale 0.25: final validation loss, mean of seeds 42, 1, 2 "
          "± half their spread\n")
    print("| rank \\ K | " + " | ".join(f"K {k}" for k in intervals) + " |")
    print("|---" * (len(intervals) + 1) + "|")
    for r in ranks:
        print(f"| r {r} | " + " | ".join(cell(f"r{r}_K{k}") for k in intervals) + " |")
    others = sorted(v for v in variants if v not in grid_runs)
    print(f"\nSelection variants at r 32, K 40 (the same rate), against top_r ({BASELINE_B}):\n")
    print("| variant | mean ± half spread | vs top_r |")
    print("|---|---|---|")
    for v in others:
        print(f"| {v} | {cell(v)} | {versus(results[v], base)} |")
    plot(os.path.join(PLOTS, "compare_b.png"),
         f"Table B: GRASS selection variants (r 32, K 40, lr {lr}), mean and min-max of 3 seeds",
         [(v, results[v]) for v in [BASELINE_B] + others])


def median_step_ms(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    return statistics.median(r["step_ms"] for r in rows if "step_ms" in r and r["step"] > 1)


def table_peers(peers_dir):
    pairs = [("galore", "galore-torch"), ("flora", "flora-opt")]
    cell = lambda r: f"{r['mean']:.4f} ± {r['spread'] / 2:.4f}"
    print("\nFinal validation loss, mean of seeds 42, 1, 2 ± half their spread; median step time "
          "(steps 2-400, one thread, two runs at a time)\n")
    print("| method | grass | peer | peer - grass | grass step | peer step |")
    print("|---|---|---|---|---|---|")
    series = []
    for name, peer in pairs:
        dirs = {who: [os.path.join(peers_dir, who, f"s{s}") for s in SEEDS]
                for who in (f"grass_{name}", peer)}
        if not all(os.path.isdir(d) for ds in dirs.values() for d in ds):
            continue
        ours, theirs = seed_runs(dirs[f"grass_{name}"]), seed_runs(dirs[peer])
        ms = {who: statistics.median(median_step_ms(d) for d in ds) for who, ds in dirs.items()}
        print(f"| {LABELS[name]} vs {peer} | {cell(ours)} | {cell(theirs)} | {versus(theirs, ours)} | "
              f"{ms[f'grass_{name}']:.0f} ms | {ms[peer]:.0f} ms |")
        series += [(f"grass {LABELS[name]}", ours), (peer, theirs)]
    plot(os.path.join(PLOTS, "compare_peers.png"),
         "grass's GaLore and FLORA beside galore-torch and flora-opt (quickstart model, 3 seeds)",
         series)


def clip_rate(run_dir):
    """The fraction of steps whose gradients were clipped (clip_coef < 1 in metrics.jsonl)."""
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        coefs = [row["clip_coef"] for row in map(json.loads, f) if "clip_coef" in row]
    return sum(c < 1 for c in coefs) / len(coefs)


def table_clipoff(a_dir, off_dir, models):
    cell = lambda r: f"{r['mean']:.4f} ± {r['spread'] / 2:.4f}"
    for model in models:
        print(f"\n**{model}**: final validation loss, mean of seeds 42, 1, 2 ± half their spread, "
              "at each method's best Table A rate; clipped: the steps the clip-1.0 runs clipped\n")
        print("| method | lr | clip 1.0 | clipped | clip off | off - on |")
        print("|---|---|---|---|---|---|")
        for m in LABELS:
            off_method = os.path.join(off_dir, model, m)
            if not os.path.isdir(off_method):
                continue
            lr, on_dirs = best_seed_dirs(os.path.join(a_dir, model, m))
            off_dirs = [os.path.join(off_method, f"lr{lr}_s{s}") for s in SEEDS]
            if not on_dirs or not all(finished(d) for d in off_dirs):
                continue  # not all finished
            on, off = seed_runs(on_dirs), seed_runs(off_dirs)
            clipped = statistics.fmean(clip_rate(d) for d in on_dirs)
            print(f"| {LABELS[m]} | {lr} | {cell(on)} | {clipped:.0%} | {cell(off)} | "
                  f"{versus(off, on)} |")


def table_prox(prox_dir):
    cell = lambda r: f"{r['mean']:.4f} ± {r['spread'] / 2:.4f}"
    pairs = [("adamw", "AdamW"), ("grass_top_r", "GRASS top_r")]
    rates = sorted({n[2:].split("_s")[0] for v in os.listdir(prox_dir)
                    for n in os.listdir(os.path.join(prox_dir, v)) if n.endswith("_s42")}, key=float)
    print("\nOne sequence (128 tokens) per step, 1,600 steps: final validation loss, mean of seeds "
          "42, 1, 2 ± half their spread\n")
    print("| method | lr | without | with the proximal method | with - without |")
    print("|---|---|---|---|---|")
    series, bests = [], []
    for name, label in pairs:
        best = {}
        for lr in rates:
            if not all(os.path.isdir(os.path.join(prox_dir, v, f"lr{lr}_s{s}"))
                       for v in (name, name + "_proximal") for s in SEEDS):
                continue
            runs = {v: seed_runs([os.path.join(prox_dir, v, f"lr{lr}_s{s}") for s in SEEDS])
                    for v in (name, name + "_proximal")}
            without, with_ = runs[name], runs[name + "_proximal"]
            print(f"| {label} | {lr} | {cell(without)} | {cell(with_)} | {versus(with_, without)} |")
            for v, r in runs.items():
                if v not in best or r["mean"] < best[v][1]["mean"]:
                    best[v] = (lr, r)
        series += [(f"{label}{' + proximal' if v.endswith('_proximal') else ''} (lr {lr})", r)
                   for v, (lr, r) in best.items()]
        bests.append((label, best[name], best[name + "_proximal"]))
    print("\nEach at its best rate (lowest mean of 3 seeds):\n")
    print("| method | without | with the proximal method | with - without |")
    print("|---|---|---|---|")
    for label, (lr, without), (lr_p, with_) in bests:
        print(f"| {label} | {cell(without)} (lr {lr}) | {cell(with_)} (lr {lr_p}) | "
              f"{versus(with_, without)} |")
    plot(os.path.join(PLOTS, "compare_prox.png"),
         "One sequence per step: with and without the proximal method, each at its best lr (3 seeds)",
         series)


def v_at_smallest_code(run_dir):
    """Of the nonzero 8-bit v codes in the run's last checkpoint, the fraction at code 1 (the
    unsigned map's smallest positive value, where the zero-point guard holds a tiny v)."""
    ckpts = sorted(os.listdir(os.path.join(run_dir, "checkpoints")))
    path = os.path.join(run_dir, "checkpoints", ckpts[-1], "state.safetensors")
    with open(path, "rb") as f:
        header_len = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(header_len))
        data = f.read()
    nonzero = smallest = 0
    for name, t in header.items():
        if name.endswith("v_q8"):
            begin, end = t["data_offsets"]
            codes = data[begin:end]
            nonzero += len(codes) - codes.count(0)
            smallest += codes.count(1)
    return smallest / nonzero


D_FORMATS = (("fp32", "fp32", "fp32"), ("fp32_q8", "q8", "fp32"),
             ("bf16", "bf16", "bf16"), ("bf16_q8", "q8", "bf16"))


def table_d(d_dir, models):
    for model in models:
        model_dir = os.path.join(d_dir, model)
        methods = [m for m in LABELS if os.path.isdir(os.path.join(model_dir, m))]
        grids = {(m, f): grid(os.path.join(model_dir, m, f)) for m in methods
                 for f, _, _ in D_FORMATS if os.path.isdir(os.path.join(model_dir, m, f))}
        rates = sorted({lr for g in grids.values() for lr in g}, key=float)
        print(f"\n**{model}** (final validation loss; seed 42 at each rate, then seeds 42, 1, 2 at "
              "the best; v at the smallest code: the fraction of nonzero v codes there at step 400, "
              "mean of the 3 seeds)\n")
        print("| method | states | precision | " + " | ".join(f"lr {r}" for r in rates) +
              " | lr | mean of 3 seeds | spread | q8 - the precision's own | v at the smallest code |")
        print("|---" * (len(rates) + 8) + "|")
        series = []
        for m in methods:
            own = None
            for f, states, precision in D_FORMATS:
                if (m, f) not in grids:
                    continue
                method_dir = os.path.join(model_dir, m, f)
                lr, dirs = best_seed_dirs(method_dir)
                if not dirs:
                    continue
                runs = seed_runs(dirs)
                cells = [f"{grids[m, f][r]:.4f}" if r in grids[m, f] else "" for r in rates]
                if states == "q8":
                    vs = versus(runs, own) if own else "-"
                    small = f"{statistics.fmean(v_at_smallest_code(d) for d in dirs):.2e}"
                else:
                    own, vs, small = runs, "-", "-"
                print(f"| {LABELS[m]} | {states} | {precision} | " + " | ".join(cells) +
                      f" | {lr} | {runs['mean']:.4f} | {runs['spread']:.4f} | {vs} | {small} |")
                if precision == "fp32":
                    series.append((f"{LABELS[m]}, {states} states (lr {lr})", runs))
        plot(os.path.join(PLOTS, f"compare_d_{model}.png"),
             f"Table D, {model}: fp32 against 8-bit Adam states, mean and min-max of 3 seeds",
             series)


E_MODES = (("none", "kept"), ("elementwise", "kept, n1 n2 act recomputed"),
           ("layer", "checkpointed per layer"), ("wta-crs_0.5", "sampled, wta-crs keep 0.5"),
           ("wta-crs_0.3", "sampled, wta-crs keep 0.3"),
           ("columns", "kept, GRASS `cols` targets' inputs as their selected columns"))


def table_e(e_dir, models):
    for model in models:
        model_dir = os.path.join(e_dir, model)
        batches = {}
        with open(os.path.join(model_dir, "batches.txt")) as f:
            for line in f:
                mode, micro, used, budget = line.split()
                batches[mode] = (int(micro), int(used), int(budget))
        budget = next(iter(batches.values()))[2]
        methods = [m for m in LABELS if os.path.isdir(os.path.join(model_dir, m))]
        print(f"\n**{model}** (activation budget {budget / 2**20:.1f} MiB; one micro-batch of "
              "128-token sequences per step, 400 steps; final validation loss, seed 42 at each "
              "rate, then seeds 42, 1, 2 at the best)\n")
        for m in methods:
            grids = {mode: grid(os.path.join(model_dir, m, mode)) for mode, _ in E_MODES
                     if os.path.isdir(os.path.join(model_dir, m, mode))}
            rates = sorted({lr for g in grids.values() for lr in g}, key=float)
            print(f"{LABELS[m]}:\n")
            print("| activations | sequences | activation MiB | " +
                  " | ".join(f"lr {r}" for r in rates) +
                  " | lr | mean of 3 seeds | spread | minus all kept (none) |")
            print("|---" * (len(rates) + 7) + "|")
            series, none = [], None
            for mode, words in E_MODES:
                if mode not in grids:
                    continue
                method_dir = os.path.join(model_dir, m, mode)
                lr, dirs = best_seed_dirs(method_dir)
                if not dirs:
                    continue
                runs = seed_runs(dirs)
                micro, used, _ = batches[mode]
                if mode == "none":
                    none, vs = runs, "-"
                else:
                    vs = versus(runs, none) if none else "-"
                cells = [f"{grids[mode][r]:.4f}" if r in grids[mode] else "" for r in rates]
                print(f"| {words} | {micro} | {used / 2**20:.1f} | " + " | ".join(cells) +
                      f" | {lr} | {runs['mean']:.4f} | {runs['spread']:.4f} | {vs} |")
                series.append((f"{words}, {micro} seq (lr {lr})", runs))
            print()
            plot(os.path.join(PLOTS, f"compare_e_{model}_{m}.png"),
                 f"Table E, {model}, {LABELS[m]}: equal activation memory, mean and min-max of 3 seeds",
                 series)


def table_c_row(path, name, interval, plan):
    rows = [json.loads(l) for l in open(path) if '"step_ms"' in l]
    projected = not name.startswith("adamw")
    # 1-based steps; a refresh at step 1, 1 + interval, ...; step 1 also warms up and is left out
    is_refresh = lambda r: projected and (r["step"] - 1) % interval == 0
    refresh = [r["step_ms"] for r in rows if r["step"] > 1 and is_refresh(r)]
    plain = [r["step_ms"] for r in rows if r["step"] > 1 and not is_refresh(r)]
    step = statistics.median(plain)
    mib = lambda b: f"{b / 2**20:.0f} MiB"
    peak = max(r["mem_bytes"] for r in rows)
    if refresh:
        ref = statistics.median(refresh)
        extra = ref - step
        cols = [f"{ref:.0f}", f"{extra:+.0f} ms ({extra / step:+.0%}); {extra / 200 / step:+.2%} a step at K = 200"]
    else:
        cols = ["-", "-"]
    print(f"| {name} | {step:.0f} | {cols[0]} | {cols[1]} | {mib(peak)} | {mib(plan)} |")


def read_config(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        sys.exit(f"error: {path}: cannot read the run config: {e}")


def check_config(path):
    config = read_config(path)
    if not isinstance(config, dict) or not (config.get("data") or {}).get("val"):
        print(f"error: {path}: no data.val: a comparison ranks the methods by their final "
              "validation loss; add data.val (validation shards) to the run config", file=sys.stderr)
        sys.exit(2)


def optimizer_base(path, kind):
    optimizer = read_config(path).get("optimizer") or {}
    keys = PROJECTED_KEYS if kind == "projected" else DENSE_KEYS
    print(json.dumps({k: optimizer[k] for k in keys if k in optimizer}, separators=(",", ":")))


def main():
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "last-val":
        print(f"{final_val(args[0]):.4f}")
    elif cmd == "best-lr":
        print(best_lr(args[0]))
    elif cmd == "next-lr":
        print(next_lr(args[0], args[1:]))
    elif cmd == "table-a":
        table_a(args[0], args[1:])
    elif cmd == "table-b":
        table_b(args[0], args[1])
    elif cmd == "table-peers":
        table_peers(args[0])
    elif cmd == "table-clipoff":
        table_clipoff(args[0], args[1], args[2:])
    elif cmd == "table-prox":
        table_prox(*args)
    elif cmd == "table-d":
        table_d(args[0], args[1:])
    elif cmd == "table-e":
        table_e(args[0], args[1:])
    elif cmd == "table-c-row":
        table_c_row(args[0], args[1], int(args[2]), int(args[3]))
    elif cmd == "finished":
        sys.exit(0 if finished(args[0]) else 1)
    elif cmd == "check-config":
        check_config(args[0])
    elif cmd == "optimizer-base":
        optimizer_base(args[0], args[1])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
