#!/usr/bin/env python3
"""A model of one optimizer step on 8 data-parallel GPUs: AdamW against GRASS (docs/experiments.md,
"Step time on 8 GPUs, modelled"). Planning only, seconds on any machine:

    scripts/experiments/step_time_model.py [--mfu 0.4] [--grass build/grass]

Every number it prints comes from `grass mem --json` (the bytes a rank sums each step and at a
refresh, the weights, gradients and optimizer states it holds, the training FLOPs per token) and
from the assumptions below, none of them measured here: no GPU has run grass yet. Where a session
measures single-GPU step times, they replace the compute term.

One rank's step, in pure bf16 at GaLore's batch (512 sequences of 256 tokens a step over 8 ranks:
16,384 tokens a rank):
  compute   tokens x FLOPs per token / (MFU x 989 TFLOP/s)         (H100 SXM dense bf16 peak)
  update    (2 x weights + gradients + 2 x optimizer states) / 3.35 TB/s   (read and write, HBM3)
  sums      2 (W - 1) / W x bytes / bus bandwidth                  (a ring all-reduce, NCCL's busbw)
            bytes: every step's sums plus a refresh's full gradients spread over K = 200 steps
  serial    compute + sums + update
  overlap   forward (a third of compute) + max(backward, sums) + update: the sums started under
            the backward (docs/distributed.md), at best
"""
import argparse
import json
import subprocess
import sys

PEAK_FLOPS = 989e12  # H100 SXM, dense bf16 (kernels/cuda/cuda_backend.cu, ../shared/ANCHORS.md)
HBM_BYTES_PER_S = 3.35e12  # H100 SXM HBM3, datasheet
RANKS = 8
SEQUENCES, SEQ_LEN = 512, 256  # GaLore's pretraining batch
K = 200
# Bus bandwidths of an 8-GPU all-reduce (nccl-tests' busbw), assumed: NVLink 4 through NVSwitch
# (450 GB/s a direction per GPU, of which NCCL reaches most), and PCIe switches without NVLink.
LINKS = [("NVLink (H100 SXM)", 360e9), ("PCIe Gen5", 40e9), ("PCIe Gen4", 20e9)]
MODELS = [("1b", 512), ("7b", 1024), ("13b", 256)]  # GaLore's ranks up to 7B, GRASS's 256 at 13B


def plan(grass, size, optimizer):
    cmd = [grass, "mem", "configs/runs/llama_13b_grass.json", "--json", "--device", "cuda",
           "--ranks", str(RANKS), "--set", f"model=configs/models/llama_{size}.json",
           "--set", f"optimizer={json.dumps(optimizer)}", "--set", "micro_batch_size=4",
           "--set", f"total_batch_size={SEQUENCES}", "--set", f"seq_len={SEQ_LEN}"]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed: {out.stderr.strip()}")
    return json.loads(out.stdout)


def step_times(p, mfu, busbw):
    tokens = SEQUENCES * SEQ_LEN / RANKS
    compute = tokens * p["flops_per_token"] / (mfu * PEAK_FLOPS)
    b = p["bytes"]
    update = (2 * b["weights"] + p["step_sum_bytes"] + 2 * b["optimizer"]) / HBM_BYTES_PER_S
    summed = p["step_sum_bytes"] + p["refresh_sum_bytes"] / K
    sums = 2 * (RANKS - 1) / RANKS * summed / busbw
    serial = compute + sums + update
    overlap = compute / 3 + max(2 * compute / 3, sums) + update
    return compute, sums, update, serial, overlap


def break_even(adamw, grass, mfu, which):
    """The bus bandwidth below which GRASS's step is at least 2x faster (serial or overlap)."""
    ratio = lambda bw: step_times(adamw, mfu, bw)[which] / step_times(grass, mfu, bw)[which]
    lo, hi = 1e6, 1e13
    if ratio(lo) < 2:
        return None  # not even at 1 MB/s
    for _ in range(200):  # geometric bisection
        mid = (lo * hi) ** 0.5
        lo, hi = (mid, hi) if ratio(mid) >= 2 else (lo, mid)
    return lo


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mfu", type=float, default=0.4, help="model FLOPs utilisation (default 0.4)")
    ap.add_argument("--grass", default="build/grass")
    args = ap.parse_args()
    ms = lambda s: f"{s * 1e3:.0f}"
    print(f"| model | link | AdamW: compute / sums / update (ms) | AdamW serial / overlap | "
          f"GRASS: compute / sums / update | GRASS serial / overlap | speed-up serial / overlap |")
    print("|---|---|---|---|---|---|---|")
    notes = []
    for size, rank in MODELS:
        adamw = plan(args.grass, size, {"name": "adamw", "lr": 0.001})
        grass = plan(args.grass, size, {"name": "grass", "lr": 0.01, "rank": rank,
                                        "update_interval": K})
        for link, bw in LINKS:
            a, g = step_times(adamw, args.mfu, bw), step_times(grass, args.mfu, bw)
            print(f"| {size.upper()} | {link}, {bw / 1e9:.0f} GB/s | {ms(a[0])} / {ms(a[1])} / {ms(a[2])} | "
                  f"{ms(a[3])} / {ms(a[4])} | {ms(g[0])} / {ms(g[1])} / {ms(g[2])} | "
                  f"{ms(g[3])} / {ms(g[4])} | {a[3] / g[3]:.2f}x / {a[4] / g[4]:.2f}x |")
        gib = lambda p: p["total"] / 2**30
        even = [break_even(adamw, grass, args.mfu, w) for w in (3, 4)]
        fmt = lambda bw: "never" if bw is None else f"below {bw / 1e9:.0f} GB/s"
        free = step_times(adamw, args.mfu, 1e18)[3] / step_times(grass, args.mfu, 1e18)[3]
        notes.append(f"- {size.upper()}: GRASS >= 2x {fmt(even[0])} serial, {fmt(even[1])} with overlap; "
                     f"{free:.2f}x with free sums (compute and update alone); "
                     f"planned per rank: AdamW {gib(adamw):.1f} GiB, GRASS {gib(grass):.1f} GiB "
                     f"(micro-batches of 4, layer checkpointing)")
    print(f"\nMFU {args.mfu}, {RANKS} ranks, {SEQUENCES} x {SEQ_LEN} tokens a step, K = {K}.")
    print("\n".join(notes))


if __name__ == "__main__":
    main()
