#!/usr/bin/env python3
"""Attention reference (docs/gpu-status.md, step T4 of scripts/gpu_first_run.sh).

Times PyTorch's scaled_dot_product_attention(is_causal=True) with the FlashAttention backend,
forward and forward+backward, bf16, at LLaMA-1B's attention shape: B=64, H=32, T=256, D=64 by
default (also B=16, the micro-batch of the 1B profile in T5, so its per-layer attention time can
be set beside this). CUDA events, 3 warm-ups, 20 timed, median; random inputs. FLOPs counted as
FlashAttention does: forward 4·B·H·T²·D halved for the causal mask, backward 2.5x the forward.

    python3 tools/gpu/attention_probe.py [--b 64,16] [--h 32] [--t 256] [--d 64]
                                         [--warmup 3] [--iters 20] [--json PATH] [--dry-run]

Layout as grass's: q, k, v [B, T, H, D] (transposed views to SDPA's [B, H, T, D], no copy).
--dry-run checks the arguments and prints the plan without torch or a GPU. Exit status: 0 when it
ran, 2 on bad arguments, 3 when torch, CUDA or the flash backend is missing.
"""
import argparse
import json
import statistics
import sys


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--b", default="64,16", help="batch sizes, comma-separated")
    p.add_argument("--h", type=int, default=32)
    p.add_argument("--t", type=int, default=256)
    p.add_argument("--d", type=int, default=64)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--json", default="")
    p.add_argument("--dry-run", action="store_true")
    a = p.parse_args(argv)
    try:
        a.bs = [int(x) for x in a.b.split(",") if x.strip()]
    except ValueError:
        p.error("--b: expected comma-separated integers, got %r" % a.b)
    if not a.bs or min(a.bs) <= 0 or min(a.h, a.t, a.d, a.iters) <= 0 or a.warmup < 0:
        p.error("sizes and --iters must be positive")
    return a


def fwd_flops(b, h, t, d):
    return 4.0 * b * h * t * t * d / 2  # causal: half the score matrix


def main(argv):
    a = parse_args(argv)
    print("attention_probe: SDPA causal, flash backend, bf16, B=%s H=%d T=%d D=%d, %d warm-ups, "
          "%d timed (median)" % (",".join(map(str, a.bs)), a.h, a.t, a.d, a.warmup, a.iters))
    if a.dry_run:
        for b in a.bs:
            print("  B=%-3d forward %.1f GFLOP, backward %.1f GFLOP"
                  % (b, fwd_flops(b, a.h, a.t, a.d) / 1e9, 2.5 * fwd_flops(b, a.h, a.t, a.d) / 1e9))
        print("dry-run: arguments fine; nothing timed (needs torch with CUDA)")
        return 0
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        print("attention_probe: torch is not importable", file=sys.stderr)
        return 3
    if not torch.cuda.is_available():
        print("attention_probe: torch %s sees no CUDA device" % torch.__version__, file=sys.stderr)
        return 3
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        flash = lambda: sdpa_kernel(SDPBackend.FLASH_ATTENTION)
    except ImportError:  # torch < 2.3
        flash = lambda: torch.backends.cuda.sdp_kernel(enable_flash=True, enable_math=False,
                                                       enable_mem_efficient=False)
    print("device: %s, torch %s (CUDA %s)" % (torch.cuda.get_device_name(0), torch.__version__,
                                              torch.version.cuda))

    def timed(fn):
        """The median of a.iters calls, queued back to back with an event between each two and
        read after one synchronisation (a busy host adds no gaps)."""
        for _ in range(a.warmup):
            fn()
        events = [torch.cuda.Event(enable_timing=True) for _ in range(a.iters + 1)]
        events[0].record()
        for i in range(a.iters):
            fn()
            events[i + 1].record()
        events[-1].synchronize()
        return statistics.median(events[i].elapsed_time(events[i + 1]) for i in range(a.iters))

    def measure(b):
        """(forward ms, forward+backward ms, relative error) at batch b; tensors freed on return.
        Raises RuntimeError when the flash backend has no kernel for this device or shape."""
        mk = lambda: torch.randn(b, a.t, a.h, a.d, device="cuda", dtype=torch.bfloat16).requires_grad_()
        q, k, v = mk(), mk(), mk()
        dout = torch.randn(b, a.h, a.t, a.d, device="cuda", dtype=torch.bfloat16)
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))  # [B, H, T, D] views
        # correctness: the first batch element against the default backends in fp32
        with torch.no_grad():
            ref = F.scaled_dot_product_attention(qt[:1].float(), kt[:1].float(), vt[:1].float(),
                                                 is_causal=True)
        with flash():
            with torch.no_grad():
                out = F.scaled_dot_product_attention(qt, kt, vt, is_causal=True)
            err = ((out[:1].float() - ref).norm() / ref.norm()).item()

            def fwd():
                with torch.no_grad():
                    F.scaled_dot_product_attention(qt, kt, vt, is_causal=True)

            def fwd_bwd():
                o = F.scaled_dot_product_attention(qt, kt, vt, is_causal=True)
                q.grad = k.grad = v.grad = None
                o.backward(dout)

            return timed(fwd), timed(fwd_bwd), err

    torch.manual_seed(0)
    rows = []
    for b in a.bs:
        try:
            t_f, t_fb, err = measure(b)
        except RuntimeError as e:  # no flash kernel for this device, dtype or shape
            print("attention_probe: flash backend failed at B=%d: %s" % (b, e), file=sys.stderr)
            return 3
        ff = fwd_flops(b, a.h, a.t, a.d)
        t_b = max(t_fb - t_f, 1e-9)
        rows.append({"B": b, "fwd_ms": t_f, "bwd_ms": t_b, "fwd_bwd_ms": t_fb, "rel_err": err,
                     "fwd_tflops": ff / (t_f * 1e-3) / 1e12, "bwd_tflops": 2.5 * ff / (t_b * 1e-3) / 1e12,
                     "fwd_bwd_tflops": 3.5 * ff / (t_fb * 1e-3) / 1e12})
        torch.cuda.empty_cache()
    print()
    print("| B | forward ms | backward ms | fwd+bwd ms | fwd TFLOP/s | bwd TFLOP/s | fwd+bwd TFLOP/s | rel err vs fp32 |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print("| %d | %.3f | %.3f | %.3f | %.0f | %.0f | %.0f | %.1e |" % (
            r["B"], r["fwd_ms"], r["bwd_ms"], r["fwd_bwd_ms"], r["fwd_tflops"], r["bwd_tflops"],
            r["fwd_bwd_tflops"], r["rel_err"]))
    print("SUMMARY: SDPA flash H=%d T=%d D=%d fwd+bwd " % (a.h, a.t, a.d) +
          ", ".join("B=%d %.3f ms (%.0f TFLOP/s)" % (r["B"], r["fwd_bwd_ms"], r["fwd_bwd_tflops"])
                    for r in rows))
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"h": a.h, "t": a.t, "d": a.d, "rows": rows}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
