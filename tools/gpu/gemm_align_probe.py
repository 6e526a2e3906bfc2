#!/usr/bin/env python3
"""GEMM alignment probe (docs/gpu-status.md, step T1 of scripts/gpu_first_run.sh).

LLaMA-1B's ffn width 5461 is odd: a row of an [N, 5461] bf16 activation is 10,922 bytes, so rows
start at 2-byte boundaries and cuBLAS(Lt) cannot use its 16-byte-aligned kernels. This times,
through PyTorch (bf16, fp32 accumulation), the five products of an MLP block at N tokens and hidden
C for ffn widths F (row-major, as grass lays them out):

    x @ wᵀ     up/gate forward     [N,C] x [C,F]  -> [N,F]
    a @ wdᵀ    down forward        [N,F] x [F,C]  -> [N,C]
    dy @ wd    down backward dx    [N,C] x [C,F]  -> [N,F]
    dyᵀ @ a    down backward dW    [C,N] x [N,F]  -> [C,F]
    aᵀ @ x     up/gate backward dW [F,N] x [N,C]  -> [F,C]

each 2·N·C·F FLOPs, timed with CUDA events (3 warm-ups, 20 timed back to back with an event
between each two, median), on random inputs
(never zeros). It prints a table of TFLOP/s, the slowdown of F = 5461 against F = 5504 (a
multiple of 64 of about the same size) per product in time per FLOP, and one verdict line, the
rule of GPU_FIRST_RUN.md applied to the engine's row-pitch padding (pad_ffn, on by default on the
GPU since issue 14): within ~15% everywhere -> padding gains little; 1.5x or more anywhere -> it
is essential; in between -> it pays.

    python3 tools/gpu/gemm_align_probe.py [--n 16384] [--c 2048] [--f 5461,5464,5504,5632]
                                          [--warmup 3] [--iters 20] [--json PATH] [--dry-run]

--dry-run checks the arguments and prints the plan without torch or a GPU. Exit status: 0 when
it ran (whatever the verdict), 2 on bad arguments, 3 when torch or CUDA is missing.
"""
import argparse
import json
import statistics
import sys
import time

OPS = ["x@w^T", "a@wd^T", "dy@wd", "dy^T@a", "a^T@x"]
WHAT = {
    "x@w^T": "up/gate fwd",
    "a@wd^T": "down fwd",
    "dy@wd": "down bwd dx",
    "dy^T@a": "down bwd dW",
    "a^T@x": "up/gate bwd dW",
}
REF_F, ODD_F = 5504, 5461


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n", type=int, default=16384, help="tokens (rows of x)")
    p.add_argument("--c", type=int, default=2048, help="hidden size")
    p.add_argument("--f", default="5461,5464,5504,5632", help="ffn widths, comma-separated")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--json", default="", help="write the results here too")
    p.add_argument("--dry-run", action="store_true", help="check arguments, print the plan")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                   help="cpu: a smoke test of this script at small sizes (wall-clock timing)")
    a = p.parse_args(argv)
    try:
        a.fs = [int(x) for x in a.f.split(",") if x.strip()]
    except ValueError:
        p.error("--f: expected comma-separated integers, got %r" % a.f)
    if not a.fs or min(a.fs) <= 0 or a.n <= 0 or a.c <= 0 or a.iters <= 0 or a.warmup < 0:
        p.error("sizes and --iters must be positive, --warmup non-negative")
    return a


def verdict(slowdowns):
    """The rule of GPU_FIRST_RUN.md T1 on the per-product slowdowns of 5461 against 5504."""
    if not slowdowns:
        return "no verdict: F=%d and F=%d were not both measured" % (ODD_F, REF_F)
    worst = max(slowdowns)
    if worst <= 1.15:
        return ("row-pitch padding (pad_ffn) GAINS LITTLE: F=%d within 15%% of F=%d on every "
                "product (worst %.2fx)" % (ODD_F, REF_F, worst))
    if worst >= 1.5:
        return ("row-pitch padding (pad_ffn) is ESSENTIAL: F=%d is %.2fx slower than F=%d on at "
                "least one product" % (ODD_F, worst, REF_F))
    return ("row-pitch padding (pad_ffn) PAYS: F=%d up to %.2fx slower than F=%d"
            % (ODD_F, worst, REF_F))


def main(argv):
    a = parse_args(argv)
    flops = {f: 2.0 * a.n * a.c * f for f in a.fs}
    print("gemm_align_probe: N=%d C=%d F=%s, bf16 in / fp32 accumulate, %d warm-ups, %d timed "
          "(median)" % (a.n, a.c, ",".join(map(str, a.fs)), a.warmup, a.iters))
    if a.dry_run:
        for f in a.fs:
            print("  F=%-5d  %s  %.1f GFLOP each; row pitch of [N,F] %d bytes (%s)"
                  % (f, " ".join(OPS), flops[f] / 1e9, 2 * f,
                     "16-byte aligned" if (2 * f) % 16 == 0 else "NOT 16-byte aligned"))
        print("dry-run: arguments fine; nothing timed (needs torch with CUDA)")
        return 0

    try:
        import torch
    except ImportError:
        print("gemm_align_probe: torch is not importable", file=sys.stderr)
        return 3
    cuda = a.device == "cuda"
    if cuda and not torch.cuda.is_available():
        print("gemm_align_probe: torch %s sees no CUDA device" % torch.__version__, file=sys.stderr)
        return 3
    dev = torch.device(a.device)
    print("device: %s, torch %s (CUDA %s)" % (torch.cuda.get_device_name(0) if cuda else "cpu",
                                              torch.__version__, torch.version.cuda))

    def times_ms(fn, n):
        """n calls' times. On the GPU the calls and an event between each two are queued back to
        back and read after one synchronisation, so a busy host (the build runs beside this) adds
        no gaps; on the CPU, the wall clock."""
        if not cuda:
            out = []
            for _ in range(n):
                t0 = time.perf_counter()
                fn()
                out.append(1e3 * (time.perf_counter() - t0))
            return out
        events = [torch.cuda.Event(enable_timing=True) for _ in range(n + 1)]
        events[0].record()
        for i in range(n):
            fn()
            events[i + 1].record()
        events[-1].synchronize()
        return [events[i].elapsed_time(events[i + 1]) for i in range(n)]

    def measure(f):
        """op -> median ms at ffn width f; the tensors are freed on return."""
        g = lambda *shape: torch.randn(*shape, device=dev, dtype=torch.bfloat16)
        x, dy = g(a.n, a.c), g(a.n, a.c)
        w, wd = g(f, a.c), g(a.c, f)  # up/gate weight [F, C], down weight [C, F]
        act = g(a.n, f)               # an [N, F] activation (or its gradient)
        outs = {"x@w^T": torch.empty(a.n, f, device=dev, dtype=torch.bfloat16),
                "a@wd^T": torch.empty(a.n, a.c, device=dev, dtype=torch.bfloat16),
                "dy@wd": torch.empty(a.n, f, device=dev, dtype=torch.bfloat16),
                "dy^T@a": torch.empty(a.c, f, device=dev, dtype=torch.bfloat16),
                "a^T@x": torch.empty(f, a.c, device=dev, dtype=torch.bfloat16)}
        calls = {"x@w^T": lambda: torch.matmul(x, w.t(), out=outs["x@w^T"]),
                 "a@wd^T": lambda: torch.matmul(act, wd.t(), out=outs["a@wd^T"]),
                 "dy@wd": lambda: torch.matmul(dy, wd, out=outs["dy@wd"]),
                 "dy^T@a": lambda: torch.matmul(dy.t(), act, out=outs["dy^T@a"]),
                 "a^T@x": lambda: torch.matmul(act.t(), x, out=outs["a^T@x"])}
        # one correctness check per width, on 64 rows in fp32: a fast wrong product is no result
        ref = x[:64].float() @ w.float().t()
        calls["x@w^T"]()
        err = ((outs["x@w^T"][:64].float() - ref).norm() / ref.norm()).item()
        if not err < 2e-2:
            print("F=%d: x@w^T relative error %.3g against fp32: results unreliable" % (f, err))
        ms = {}
        for op in OPS:
            for _ in range(a.warmup):
                calls[op]()
            ms[op] = statistics.median(times_ms(calls[op], a.iters))
        return ms

    torch.manual_seed(0)
    results = {}  # f -> op -> ms
    for f in a.fs:
        results[f] = measure(f)
        if cuda:
            torch.cuda.empty_cache()

    print()
    print("| F | " + " | ".join("%s (%s)" % (op, WHAT[op]) for op in OPS) + " |")
    print("|---|" + "---|" * len(OPS))
    for f in a.fs:
        print("| %d | " % f + " | ".join("%.0f TFLOP/s (%.3f ms)" % (flops[f] / (results[f][op] * 1e-3) / 1e12,
                                                                     results[f][op]) for op in OPS) + " |")
    slow = []
    if ODD_F in results and REF_F in results:
        per_flop = lambda f, op: results[f][op] / flops[f]
        slow = [per_flop(ODD_F, op) / per_flop(REF_F, op) for op in OPS]
        print("| %d / %d (time per FLOP) | " % (ODD_F, REF_F) + " | ".join("%.2fx" % s for s in slow) + " |")
    print()
    line = verdict(slow)
    print("VERDICT: " + line)
    tflops_5461 = [flops[ODD_F] / (results[ODD_F][op] * 1e-3) / 1e12 for op in OPS] if ODD_F in results else []
    print("SUMMARY: %s" % (("5461/5504 slowdown %.2f-%.2fx, F=5461 %.0f-%.0f TFLOP/s"
                            % (min(slow), max(slow), min(tflops_5461), max(tflops_5461)))
                           if slow else "no 5461/5504 pair"))
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"n": a.n, "c": a.c, "ms": {str(f): results[f] for f in results},
                       "slowdown_5461_vs_5504": dict(zip(OPS, slow)), "verdict": line}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
