#!/usr/bin/env python3
"""Generate tests/fixtures/quant8_ref/fixture.json from bitsandbytes (issue 27): its signed and
unsigned dynamic maps (create_dynamic_map itself) and the blockwise 8-bit codes and absmax of its
portable quantize_blockwise (backends/default/ops.py, recomputed here step for step with torch)
for a fixed input, every float as its fp32 bit pattern.

The engine's map (kernels/quant8.h) must equal these values bit for bit, and its quantizer must
give these codes but where its own rule moves a nonzero value off a code of 0 or of the other
sign (tests/test_quant8.cpp). The input mixes Gaussian values of several scales, exact zeros, an
all-zero block, a block's absmax repeated with both signs, values that sit on the map's codes
times the absmax, and a block of values far below its absmax.

Usage:  build/torch2-venv/bin/python tools/reference/make_quant8_fixture.py [--out DIR]
        (bitsandbytes from PyPI in that environment: tools/peers/setup_venv.sh torch2)
"""
import argparse
import json
import os
import struct

import numpy as np
import torch
import bitsandbytes
import bitsandbytes.functional as F

BLOCK = 256


def bits(values):
    return [struct.unpack("<I", struct.pack("<f", float(v)))[0] for v in values]


def sample_input():
    rng = np.random.default_rng(2027)
    blocks = []
    for scale in (1.0, 1e-3, 1e-8, 300.0):  # Gaussian blocks of several magnitudes
        blocks.append(rng.standard_normal(BLOCK) * scale)
    heavy = rng.standard_t(3, BLOCK)  # heavy tails: most values far below the absmax
    blocks.append(heavy)
    zeros = np.zeros(BLOCK)  # an all-zero block: absmax 0, every code the map's zero
    blocks.append(zeros)
    mixed = rng.standard_normal(BLOCK)
    mixed[::7] = 0.0
    mixed[3] = 4.0
    mixed[4] = -4.0  # the absmax, with both signs
    blocks.append(mixed)
    code = F.create_dynamic_map(signed=True).numpy().astype(np.float64)
    on_codes = code[rng.integers(0, 256, BLOCK)] * 2.5  # values on the codes (absmax 2.5 present)
    on_codes[0] = 2.5
    blocks.append(on_codes)
    tiny = rng.standard_normal(BLOCK) * 1e-7  # nearest code 0 for most: the engine's rule moves them
    tiny[0] = 1.0
    blocks.append(tiny)
    tail = rng.standard_normal(100)  # a last, partial block
    blocks.append(tail)
    return np.concatenate(blocks).astype(np.float32)


def portable_quantize_blockwise(A, code):
    """bitsandbytes' portable quantize_blockwise (backends/default/ops.py), step for step: the
    kernel the library registers for devices without a native one. Its native CPU kernel
    (libbitsandbytes_cpu) approximates this rule with a lookup table and differs near 0."""
    A_flat = A.reshape(-1).float()
    n = A_flat.numel()
    rem = n % BLOCK
    full = n - rem
    A_com = A_flat[:full].reshape(full // BLOCK, BLOCK)
    absmax = A_com.abs().max(dim=-1)[0]
    scaled = torch.clamp(A_com * (1.0 / absmax.clamp(min=1e-38).view(-1, 1)), -1, 1).reshape(-1)
    if rem:
        am = A_flat[full:].abs().max().clamp(min=1e-38)
        absmax = torch.cat([absmax, am.unsqueeze(0)])
        scaled = torch.cat([scaled, torch.clamp(A_flat[full:] / am, -1, 1)])
    bounds = (code[:-1] + code[1:]) / 2
    q = torch.bucketize(scaled, bounds, out_int32=True).to(torch.uint8)
    return q, absmax


def main():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(root, "tests", "fixtures", "quant8_ref"))
    args = ap.parse_args()
    signed = F.create_dynamic_map(signed=True)
    unsigned = F.create_dynamic_map(signed=False)
    x = sample_input()
    codes, absmax = portable_quantize_blockwise(torch.from_numpy(x), signed)
    ucodes, uabsmax = portable_quantize_blockwise(torch.from_numpy(np.abs(x)), unsigned)
    # bitsandbytes' native CPU kernel, for the record: an approximation of the same rule
    native, _ = F.quantize_blockwise(torch.from_numpy(x), code=signed, blocksize=BLOCK)
    print("bitsandbytes' native CPU kernel differs from its portable rule on %d of %d signed codes"
          % (int((native != codes).sum()), len(x)))
    fixture = {
        "source": "bitsandbytes %s, torch %s: create_dynamic_map(signed=True/False), "
                  "quantize_blockwise's portable rule (backends/default/ops.py), blocksize %d" %
                  (bitsandbytes.__version__, torch.__version__, BLOCK),
        "block": BLOCK,
        "signed_map": bits(signed.tolist()),
        "unsigned_map": bits(unsigned.tolist()),
        "input": bits(x.tolist()),
        "signed_codes": codes.numpy().astype(int).tolist(),
        "signed_absmax": bits(absmax.tolist()),
        "unsigned_codes": ucodes.numpy().astype(int).tolist(),
        "unsigned_absmax": bits(uabsmax.tolist()),
    }
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "fixture.json")
    with open(path, "w") as f:
        json.dump(fixture, f)
    print("wrote", path, "(%d values)" % len(x))


if __name__ == "__main__":
    main()
