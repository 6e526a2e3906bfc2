#!/usr/bin/env python3
"""The engine's 8-bit blockwise codes (kernels/quant8.h, through build/quant8_codes) against
bitsandbytes itself, live (issue 27 item 5), on fresh random values: blocks of scales from 1e-30
to 1e30, heavy tails, exact zeros, an all-zero block, both signs of the absmax, values below the
smallest code, and a last, shorter block.

Against bitsandbytes' portable quantize_blockwise rule (its backends/default/ops.py, recomputed
step for step with torch and its own create_dynamic_map), every code must be equal, or one code
further out where the engine's rule moves a nonzero value off a code of 0 or of the other sign.
Against its native CPU kernel (an approximation of the same rule), the differing codes are
counted and reported, not failed. Exit 0: passed; 1: a code differs; 77: bitsandbytes missing.

Then one 8-bit Adam step (bitsandbytes' optimizer_update_8bit_blockwise, "adam", blocks of 256)
against the engine's (ops::adamw_update_q8, through quant8_codes --adam-step) from the same codes,
weights and gradient, on its CPU kernel and, where torch sees a GPU, its CUDA one. The two round
the step's fp32 arithmetic in different orders, and bitsandbytes' CPU requantization is its
approximate native kernel, so against the step recomputed in fp64: every new weight within 2
ulp, 1e-5 of its update and m's rounding (which cancellation can make most of m); every new
absmax within 1e-6 relative; where the codes differ, the engine's decodes nearer the exact
moment (up to rounding), or its zero-point rule moved a nonzero value off 0 or the other sign.
The CUDA kernel decays the weight after the update (the engine and torch before it), so its step
runs without weight decay.

Where torch sees a GPU it then times bitsandbytes' CUDA step, the same call, on the tensors the
kernel lab's adamw_update_q8 rows time for LLaMA-1B (C x C = 4,194,304 and V x C = 65,536,000
elements, blocks of 256; fp32 weights and gradients): the median of 20 calls by CUDA events,
after 3 warm-ups (issue 46: the engine's step must be no slower).

Usage:  build/torch2-venv/bin/python tools/peers/bitsandbytes_check.py --tool build/quant8_codes
"""
import argparse
import os
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import torch
    import bitsandbytes
    import bitsandbytes.functional as F
except ImportError as e:
    print("skipped: %s (tools/peers/setup_venv.sh torch2 installs bitsandbytes)" % e)
    sys.exit(77)


def fresh_values(rng, block):
    parts = []
    for _ in range(400):  # Gaussian blocks of random scales
        parts.append(rng.standard_normal(block) * 10.0 ** rng.uniform(-30, 30))
    parts.append(rng.standard_t(3, block * 8))  # heavy tails
    parts.append(np.zeros(block))  # an all-zero block
    mixed = rng.standard_normal(block)
    mixed[::5] = 0.0
    mixed[1], mixed[2] = 7.0, -7.0  # the absmax with both signs
    parts.append(mixed)
    tiny = rng.standard_normal(block) * 1e-8  # below the smallest code of the block's absmax
    tiny[0] = 1.0
    parts.append(tiny)
    parts.append(rng.standard_normal(block // 3 + 1))  # a last, shorter block
    return np.concatenate(parts).astype(np.float32)


def portable(x, code, block):
    """bitsandbytes' portable rule: s = x * (1 / absmax) clamped to [-1, 1], the number of
    midpoints below s (torch.bucketize, ties to the lower)."""
    a = torch.from_numpy(x)
    n = a.numel()
    codes, absmax = [], []
    bounds = (code[:-1] + code[1:]) / 2
    for start in range(0, n, block):
        b = a[start:start + block]
        m = b.abs().max()
        s = torch.clamp(b * (1.0 / m.clamp(min=1e-38)), -1, 1)
        codes.append(torch.bucketize(s, bounds, out_int32=True).to(torch.uint8))
        absmax.append(m)
    return torch.cat(codes).numpy(), torch.stack(absmax).numpy()


def engine(tool, x, block, signed, tmp):
    path = os.path.join(tmp, "x.f32")
    x.tofile(path)
    cmd = [tool, path, os.path.join(tmp, "out"), "--block", str(block)] + ([] if signed else ["--unsigned"])
    subprocess.run(cmd, check=True)
    return (np.fromfile(os.path.join(tmp, "out.codes"), dtype=np.uint8),
            np.fromfile(os.path.join(tmp, "out.absmax"), dtype=np.float32))


def adam_step_check(tool, rng, device, weight_decay, tmp):
    """One 8-bit Adam step from the same state in bitsandbytes (on device) and in the engine."""
    block, n = 256, 256 * 96 + 77
    scales = np.repeat(10.0 ** rng.uniform(-5, 0, n // block + 1), block)[:n]
    g = (rng.standard_normal(n) * scales).astype(np.float32)
    g[::97] = 0.0  # gradients of exactly zero
    p = (rng.standard_normal(n) * 0.02).astype(np.float32)
    m0 = (rng.standard_normal(n) * scales * 0.3).astype(np.float32)
    v0 = ((rng.standard_normal(n) * scales) ** 2 * 0.5).astype(np.float32)
    hyper = dict(lr=3e-3, beta1=0.9, beta2=0.95, eps=1e-8, step=7)
    state = {}
    for name, x, signed in (("m", m0, True), ("v", v0, False)):  # the engine's codes, shared
        codes, absmax = engine(tool, x, block, signed, tmp)
        state[name] = (codes, absmax)
    # bitsandbytes
    t = lambda a: torch.tensor(np.asarray(a)).to(device)
    bp, bm, bv, bam, bav = t(p), t(state["m"][0]), t(state["v"][0]), t(state["m"][1]), t(state["v"][1])
    torch.ops.bitsandbytes.optimizer_update_8bit_blockwise(
        "adam", t(g), bp, bm, bv, hyper["beta1"], hyper["beta2"], 0.0, 0.0, hyper["eps"],
        hyper["step"], hyper["lr"], t(F.create_dynamic_map(signed=True)),
        t(F.create_dynamic_map(signed=False)), bam, bav, weight_decay, 1.0, False)
    want = {k: x.cpu().numpy() for k, x in
            dict(p=bp, m=bm, v=bv, m_absmax=bam, v_absmax=bav).items()}
    # the engine
    step_dir = os.path.join(tmp, "step")
    os.makedirs(step_dir, exist_ok=True)
    for name, x in (("p.f32", p), ("g.f32", g), ("m.codes", state["m"][0]),
                    ("v.codes", state["v"][0]), ("m.absmax", state["m"][1]),
                    ("v.absmax", state["v"][1])):
        x.tofile(os.path.join(step_dir, name))
    subprocess.run([tool, "--adam-step", step_dir, "--lr", str(hyper["lr"]), "--beta1",
                    str(hyper["beta1"]), "--beta2", str(hyper["beta2"]), "--eps", str(hyper["eps"]),
                    "--weight-decay", str(weight_decay), "--step", str(hyper["step"])], check=True)
    got = dict(p=np.fromfile(os.path.join(step_dir, "p.f32"), dtype=np.float32),
               m=np.fromfile(os.path.join(step_dir, "m.codes"), dtype=np.uint8),
               v=np.fromfile(os.path.join(step_dir, "v.codes"), dtype=np.uint8),
               m_absmax=np.fromfile(os.path.join(step_dir, "m.absmax"), dtype=np.float32),
               v_absmax=np.fromfile(os.path.join(step_dir, "v.absmax"), dtype=np.float32))
    # The step in fp64 from the same decoded moments: the value each code should be nearest to,
    # and a bound on fp32's rounding of it (a few ulps of its terms; m cancels at times).
    b1, b2 = hyper["beta1"], hyper["beta2"]
    decode = lambda codes, absmax, signed: (F.create_dynamic_map(signed=signed).numpy()[codes]
                                            .astype(np.float64) * np.repeat(absmax, block)[:n])
    m_old, v_old = decode(*state["m"], True), decode(*state["v"], False)
    g64 = g.astype(np.float64)
    exact = dict(m=b1 * m_old + (1 - b1) * g64, v=b2 * v_old + (1 - b2) * g64 * g64)
    slack = dict(m=8 * 2.0 ** -24 * (b1 * np.abs(m_old) + (1 - b1) * np.abs(g64)),
                 v=8 * 2.0 ** -24 * (b2 * v_old + (1 - b2) * g64 * g64))
    c1, c2 = 1 - b1 ** hyper["step"], np.sqrt(1 - b2 ** hyper["step"])
    denom = np.sqrt(exact["v"]) / c2 + hyper["eps"]
    update = np.abs(want["p"].astype(np.float64) - p)
    bound = (2 * np.spacing(np.abs(want["p"])).astype(np.float64) + 1e-5 * update +
             hyper["lr"] / c1 * slack["m"] / denom)
    weight_bad = int((np.abs(got["p"].astype(np.float64) - want["p"]) > bound).sum())
    absmax_bad = sum(int((np.abs(got[k].astype(np.float64) - want[k]) > 1e-6 * np.abs(want[k])).sum())
                     for k in ("m_absmax", "v_absmax"))
    line = ("adam step on %s (weight decay %g): %d values; weights outside the bound: %d; absmax "
            "outside 1e-6: %d" % (device, weight_decay, n, weight_bad, absmax_bad))
    farther = 0
    for k, signed in (("m", True), ("v", False)):
        # Where the codes differ, the engine's must be the nearer to the exact moment (within
        # rounding), except where its zero-point rule moved a nonzero value off 0 or its sign.
        mine = decode(got[k], got[k + "_absmax"], signed)
        theirs = decode(want[k], want[k + "_absmax"], signed)
        differ = got[k] != want[k]
        guard = differ & (exact[k] != 0) & (np.sign(theirs) != np.sign(exact[k]))
        worse = differ & ~guard & (np.abs(mine - exact[k]) > np.abs(theirs - exact[k]) +
                                   slack[k] + 1e-6 * np.repeat(want[k + "_absmax"], block)[:n])
        nearer = differ & ~guard & (np.abs(mine - exact[k]) < np.abs(theirs - exact[k]))
        farther += int(worse.sum())
        line += ("; %s codes equal %d, differing %d (the engine's nearer the exact moment %d, "
                 "moved off 0 or the other sign %d, farther %d)" %
                 (k, int((~differ).sum()), int(differ.sum()), int(nearer.sum()), int(guard.sum()),
                  int(worse.sum())))
    print(line)
    return weight_bad > 0 or absmax_bad > 0 or farther > 0


def time_adam_steps(block=256, reps=20):
    """bitsandbytes' CUDA 8-bit Adam step on 1B's C x C and V x C tensors: median microseconds."""
    dev = "cuda"
    qmap1 = F.create_dynamic_map(signed=True).to(dev)
    qmap2 = F.create_dynamic_map(signed=False).to(dev)
    timed = []
    for n in (2048 * 2048, 32000 * 2048):
        blocks = (n + block - 1) // block
        p = torch.randn(n, device=dev) * 0.02
        g = torch.randn(n, device=dev) * 1e-3
        m = torch.randint(0, 256, (n,), dtype=torch.uint8, device=dev)
        v = torch.randint(128, 256, (n,), dtype=torch.uint8, device=dev)
        m_absmax = torch.rand(blocks, device=dev) * 1e-3 + 1e-4
        v_absmax = torch.rand(blocks, device=dev) * 1e-6 + 1e-7

        def step():
            torch.ops.bitsandbytes.optimizer_update_8bit_blockwise(
                "adam", g, p, m, v, 0.9, 0.999, 0.0, 0.0, 1e-8, 7, 1e-3, qmap1, qmap2,
                m_absmax, v_absmax, 0.0, 1.0, False)
        for _ in range(3):
            step()
        us = []
        for _ in range(reps):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            step()
            end.record()
            end.synchronize()
            us.append(start.elapsed_time(end) * 1000.0)
        timed.append((n, sorted(us)[reps // 2]))
    print("bitsandbytes 8-bit adam step on cuda: " +
          ", ".join("%d elements %.1f us" % t for t in timed) +
          " (median of %d, blocks of %d)" % (reps, block))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tool", required=True, help="the quant8_codes binary")
    ap.add_argument("--block", type=int, default=256)
    args = ap.parse_args()
    seed = int.from_bytes(os.urandom(4), "little")
    rng = np.random.default_rng(seed)
    print("bitsandbytes %s, torch %s, seed %d, blocks of %d" %
          (bitsandbytes.__version__, torch.__version__, seed, args.block))
    failed = False
    with tempfile.TemporaryDirectory() as tmp:
        for signed in (True, False):
            x = fresh_values(rng, args.block)
            if not signed:
                x = np.abs(x)
            code = F.create_dynamic_map(signed=signed)
            values = code.numpy()
            want, want_absmax = portable(x, code, args.block)
            got, got_absmax = engine(args.tool, x, args.block, signed, tmp)
            guard = ((x > 0) & (values[want] <= 0)) | ((x < 0) & (values[want] >= 0))
            moved = guard & (np.abs(got.astype(int) - want.astype(int)) == 1)
            other = (got != want) & ~moved
            absmax_differ = int((got_absmax.view(np.uint32) != want_absmax.astype(np.float32).view(np.uint32)).sum())
            native, _ = F.quantize_blockwise(torch.from_numpy(x), code=code, blocksize=args.block)
            native_differ = int((native.numpy() != want).sum())
            print("%s map: %d values; %d codes as bitsandbytes' portable rule, %d moved off 0 or "
                  "the other sign, %d other; absmax differing: %d; its native CPU kernel departs "
                  "from the portable rule on %d codes (information)" %
                  ("signed" if signed else "unsigned", len(x), int((got == want).sum()),
                   int(moved.sum()), int(other.sum()), absmax_differ, native_differ))
            for i in np.flatnonzero(other)[:5]:
                print("  value %d: %r, engine code %d, bitsandbytes %d" % (i, float(x[i]), got[i], want[i]))
            failed = failed or other.any() or absmax_differ > 0
        for weight_decay in (0.0, 0.1):
            failed = adam_step_check(args.tool, rng, "cpu", weight_decay, tmp) or failed
        if torch.cuda.is_available():
            failed = adam_step_check(args.tool, rng, "cuda", 0.0, tmp) or failed
            time_adam_steps(args.block)
    print("FAILED" if failed else "passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
