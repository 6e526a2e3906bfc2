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
    print("FAILED" if failed else "passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
