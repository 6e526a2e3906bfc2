#!/usr/bin/python3
"""Generate tests/fixtures/lowrank_ref/ (fixture.json, fixture.safetensors): GaLore and FLORA
steps in float64, the reference for kernels/lowrank_ops.h (formulas: docs/lowrank.md).

Three weights, each trained 6 steps by both methods from the same start with random dy, x:
  rows   w [12, 20]  out < in:  P [out, r], R = Pᵀ G
  cols   w [20, 12]  out > in:  P [in, r],  R = G P
  square w [16, 16]  out = in:  cols, as GaLore's 'std' and flora-opt both do
r = 4, N = 10 tokens per step, grad_scale (the clipping coefficient) 0.75 and 0.5 on two steps,
weight decay on one case per method.
  GaLore: update_proj_gap 3, the basis from the SVD of the full gradient before steps 1 and 4
          (galore_torch: step counter % gap == 0, counted before its increment), moments kept.
  FLORA:  kappa 3, a new Gaussian projection before steps 3 and 6 (t % kappa == 0, t from 1),
          first moment transferred, regenerated from (seed, tensor, refresh) with the
          splitmix64 / Box-Muller stream of src/core/rng.h.

Every sequence is computed twice and the two must agree to 1e-12 before anything is written:
  * the libraries' flow: the full gradient G = dyᵀx every step, projected as galore_torch's
    GaLoreProjector ('std') and flora-opt's _down_proj/_up_proj orient it (the right
    projection as Vh[:r] [r, in], the left one as [r, out]), HF-AdamW arithmetic order (update,
    then decay), FLORA's transfer through the full out x in up-projection;
  * the engine's flow: R straight from the activations ((dy P)ᵀ x or dyᵀ (x P)), P stored
    [side, r], the decay folded into the back-projection, the transfer through P_oldᵀ P_new.
Also asserted: PᵀP = I and the singular-value equation for every GaLore basis, and the written
file read back bit-exactly. Inputs and w0 are float32-representable (stored as F32) so the fp32
test starts from exactly the same numbers. Deterministic: reruns are byte-identical.

Usage:  tools/reference/make_lowrank_fixture.py [--out DIR]    (default tests/fixtures/lowrank_ref)
"""
import argparse
import json
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_io as st  # noqa: E402

# The seed gives every refresh gradient top-5 singular values at least 3% of σ1 apart, so the
# fp32 SVD of the test (error ~ 6e-8·σ1/gap per vector) stays a few times below its 1e-5 bar.
SEED = 20240614
MIN_GAP = 0.03
STEPS, TOKENS, RANK = 6, 10, 4
GRAD_SCALE = [1.0, 1.0, 0.75, 1.0, 0.5, 1.0]
CASES = [  # name, out, in, tensor index (FLORA's stream), weight decay (GaLore, FLORA)
    ("rows", 12, 20, 0, 0.0, 0.1),
    ("cols", 20, 12, 1, 0.1, 0.0),
    ("square", 16, 16, 2, 0.0, 0.0),
]
# galore_torch's AdamW defaults (eps 1e-6, betas (0.9, 0.999)) and its scripts' lr and scale
GALORE = {"lr": 1e-2, "alpha": 0.25, "beta1": 0.9, "beta2": 0.999, "eps": 1e-6, "update_proj_gap": 3}
FLORA = {"lr": 1e-2, "alpha": 1.0, "beta1": 0.9, "beta2": 0.999, "eps": 1e-6, "kappa": 3,
         "seed": 777}
AGREE = 1e-12

# ---- src/core/rng.h in Python integers (the same bits) ---------------------------------------
M64 = (1 << 64) - 1


def splitmix64(x):
    x = (x + 0x9E3779B97F4A7C15) & M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M64
    return x ^ (x >> 31)


def uniform_open01(seed, i):
    bits = splitmix64(splitmix64(seed) ^ i) >> 11
    return (bits + 0.5) * (1.0 / 9007199254740992.0)


def normal(seed, i):
    u1, u2 = uniform_open01(seed, 2 * i), uniform_open01(seed, 2 * i + 1)
    return math.sqrt(-2.0 * math.log(u1)) * math.cos(6.283185307179586 * u2)


def derive_seed(seed, tag):
    return splitmix64(seed ^ splitmix64(tag))


# ---- the two projections ---------------------------------------------------------------------
def flora_projection(seed, tensor, refresh, side, r):
    """P [side, r], N(0, 1/r): entry i of the stream derive_seed(derive_seed(seed, refresh), tensor)."""
    stream = derive_seed(derive_seed(seed, refresh), tensor)
    vals = [normal(stream, i) / math.sqrt(r) for i in range(side * r)]
    return torch.tensor(vals, dtype=torch.float64).reshape(side, r)


def sign_normalise(P):
    """Each column times the sign of its largest-magnitude entry (the first one on ties)."""
    P = P.clone()
    for j in range(P.shape[1]):
        col = P[:, j].tolist()
        peak = 0
        for i in range(1, len(col)):
            if abs(col[i]) > abs(col[peak]):
                peak = i
        if col[peak] < 0:
            P[:, j] = -P[:, j]
    return P


def galore_basis(G, r, rows):
    """P [side, r]: G's top-r left (rows) or right (cols) singular vectors, sign-normalised."""
    U, S, Vh = torch.linalg.svd(G, full_matrices=False)
    assert ((S[:r] - S[1:r + 1]) / S[0]).min() >= MIN_GAP, "singular values too close"
    P = sign_normalise(U[:, :r] if rows else Vh[:r, :].t())
    # PᵀP = I and the singular-value equations G V = U S / Gᵀ U = V S on the kept vectors
    assert (P.t() @ P - torch.eye(r, dtype=G.dtype)).abs().max() < 1e-13
    other = G.t() @ P if rows else G @ P   # = V S (rows) or U S (cols), up to the column signs
    assert (other.norm(dim=0) - S[:r]).abs().max() < 1e-12 * S[0]
    assert ((G @ other if rows else G.t() @ other) - P * S[:r] ** 2).abs().max() < 1e-11 * S[0] ** 2
    return P


# ---- the libraries' flow: the full gradient every step ---------------------------------------
def galore_library(w0, dys, xs, rows, wd):
    h = GALORE
    w = w0.clone()
    state = {"step": 0}
    ortho, bases, weights = None, [], []
    for s in range(STEPS):
        G = GRAD_SCALE[s] * (dys[s].t() @ xs[s])
        # GaLoreProjector.project('std'): out >= in projects on the right with Vh[:r] [r, in]
        if state["step"] % h["update_proj_gap"] == 0:
            P = galore_basis(G, RANK, rows)
            ortho = P if rows else P.t()
            bases.append(P)
        low = ortho.t() @ G if rows else G @ ortho.t()
        if "exp_avg" not in state:
            state["exp_avg"], state["exp_avg_sq"] = torch.zeros_like(low), torch.zeros_like(low)
        state["step"] += 1
        m, v = state["exp_avg"], state["exp_avg_sq"]
        m.mul_(h["beta1"]).add_(low, alpha=1 - h["beta1"])
        v.mul_(h["beta2"]).addcmul_(low, low, value=1 - h["beta2"])
        denom = v.sqrt().add_(h["eps"])
        t = state["step"]
        step_size = h["lr"] * math.sqrt(1 - h["beta2"] ** t) / (1 - h["beta1"] ** t)
        norm = m / denom
        back = (ortho @ norm if rows else norm @ ortho) * h["alpha"]  # project_back * scale
        w.add_(back, alpha=-step_size)
        if wd > 0:
            w.add_(w, alpha=-h["lr"] * wd)
        weights.append(w.clone())
    return torch.stack(bases), torch.stack(weights)


def flora_library(w0, dys, xs, rows, wd, tensor):
    h = FLORA
    out, inp = w0.shape
    side = out if rows else inp

    # flora-opt's orientation: left projection [r, out], right projection [in, r]
    def down(A, X):
        return A @ X if rows else X @ A

    def up(A, C):
        return A.t() @ C if rows else C @ A.t()

    def proj(k):
        P = flora_projection(h["seed"], tensor, k, side, RANK)
        return P.t() if rows else P

    w = w0.clone()
    A, k = proj(0), 0
    projections, weights = [A.t() if rows else A], []
    m = v = None
    for s in range(STEPS):
        t = s + 1
        if t % h["kappa"] == 0:  # resample before this step's compression, carry the moment over
            k += 1
            A_new = proj(k)
            m = down(A_new, up(A, m))
            A = A_new
            projections.append(A.t() if rows else A)
        G = GRAD_SCALE[s] * (dys[s].t() @ xs[s])
        low = down(A, G)
        if m is None:
            m, v = torch.zeros_like(low), torch.zeros_like(low)
        m = h["beta1"] * m + (1 - h["beta1"]) * low
        v = h["beta2"] * v + (1 - h["beta2"]) * low * low
        step_size = h["lr"] * math.sqrt(1 - h["beta2"] ** t) / (1 - h["beta1"] ** t)
        w = w - step_size * h["alpha"] * up(A, m / (v.sqrt() + h["eps"]))
        w = w - h["lr"] * wd * w
        weights.append(w.clone())
    return torch.stack(projections), torch.stack(weights)


# ---- the engine's flow: R from the activations, P [side, r] -----------------------------------
def compressed_grad(dy, x, P, rows):
    return (dy @ P).t() @ x if rows else dy.t() @ (x @ P)


def adam_update(w, R, m, v, P, rows, h, wd, t, grad_scale):
    g = R * grad_scale
    m = h["beta1"] * m + (1 - h["beta1"]) * g
    v = h["beta2"] * v + (1 - h["beta2"]) * g * g
    N = m / (v.sqrt() + h["eps"])
    step_size = h["lr"] * math.sqrt(1 - h["beta2"] ** t) / (1 - h["beta1"] ** t)
    decay = 1 - h["lr"] * wd
    back = P @ N if rows else N @ P.t()
    return decay * w - step_size * h["alpha"] * decay * back, m, v


def galore_engine(w0, dys, xs, rows, wd):
    h = GALORE
    w, m, v, P, weights = w0.clone(), 0.0, 0.0, None, []
    for s in range(STEPS):
        if s % h["update_proj_gap"] == 0:  # refresh: the transient full gradient
            G = dys[s].t() @ xs[s]
            P = galore_basis(G, RANK, rows)
            R = P.t() @ G if rows else G @ P
        else:
            R = compressed_grad(dys[s], xs[s], P, rows)
        w, m, v = adam_update(w, R, m, v, P, rows, h, wd, s + 1, GRAD_SCALE[s])
        weights.append(w)
    return torch.stack(weights)


def flora_engine(w0, dys, xs, rows, wd, tensor, transfer=True):
    h = FLORA
    side = w0.shape[0] if rows else w0.shape[1]
    w, m, v, weights = w0.clone(), 0.0, 0.0, []
    P = flora_projection(h["seed"], tensor, 0, side, RANK)
    for s in range(STEPS):
        t = s + 1
        if t % h["kappa"] == 0:
            P_new = flora_projection(h["seed"], tensor, t // h["kappa"], side, RANK)
            if transfer:
                C = P.t() @ P_new
                m = C.t() @ m if rows else m @ C
            P = P_new
        R = compressed_grad(dys[s], xs[s], P, rows)
        w, m, v = adam_update(w, R, m, v, P, rows, h, wd, t, GRAD_SCALE[s])
        weights.append(w)
    return torch.stack(weights)


def rel(a, b):
    return ((a - b).norm() / b.norm()).item()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ap.add_argument("--out", default=os.path.join(root, "tests", "fixtures", "lowrank_ref"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(SEED)

    def f32_randn(*shape, std=1.0):
        return (std * torch.randn(*shape, generator=gen, dtype=torch.float64)).float().double()

    tensors = {"grad_scale": torch.tensor(GRAD_SCALE, dtype=torch.float64)}
    cases = []
    for name, out, inp, tensor, wd_galore, wd_flora in CASES:
        rows = out < inp  # the shorter side (GaLore 'std', flora-opt): a square weight is cols
        w0 = f32_randn(out, inp, std=0.1)
        dys = f32_randn(STEPS, TOKENS, out)
        xs = f32_randn(STEPS, TOKENS, inp)

        P_g, w_g = galore_library(w0, dys, xs, rows, wd_galore)
        e = rel(galore_engine(w0, dys, xs, rows, wd_galore) - w0, w_g - w0)
        assert e < AGREE, f"{name}: GaLore flows disagree by {e}"
        P_f, w_f = flora_library(w0, dys, xs, rows, wd_flora, tensor)
        e = rel(flora_engine(w0, dys, xs, rows, wd_flora, tensor) - w0, w_f - w0)
        assert e < AGREE, f"{name}: FLORA flows disagree by {e}"
        assert P_g.shape[0] == 2 and P_f.shape[0] == 3  # refreshes: GaLore 2, FLORA 3
        # the fixture sees the transfer: without it (moment kept as is) FLORA ends elsewhere
        no_transfer = rel(flora_engine(w0, dys, xs, rows, wd_flora, tensor, transfer=False) - w0,
                          w_f - w0)
        assert no_transfer > 1e-3, f"{name}: the transfer changes FLORA by only {no_transfer}"

        tensors.update({
            f"{name}.w0": w0.float(), f"{name}.dy": dys.float(), f"{name}.x": xs.float(),
            f"galore.{name}.P": P_g, f"galore.{name}.w": w_g,
            f"flora.{name}.P": P_f, f"flora.{name}.w": w_f,
        })
        cases.append({"name": name, "out": out, "in": inp, "rows": rows, "tensor": tensor,
                      "weight_decay_galore": wd_galore, "weight_decay_flora": wd_flora})
        print(f"{name:6s} [{out}x{inp}] rows={rows}: |w6 - w0| / |w0|: GaLore "
              f"{((w_g[-1] - w0).norm() / w0.norm()).item():.3e}, FLORA "
              f"{((w_f[-1] - w0).norm() / w0.norm()).item():.3e}; without the transfer FLORA "
              f"ends {no_transfer:.2e} away")

    meta = {
        "description": "GaLore and FLORA steps in float64 (tools/reference/make_lowrank_fixture.py)",
        "steps": STEPS, "tokens": TOKENS, "rank": RANK, "grad_scale": GRAD_SCALE,
        "galore": GALORE, "flora": FLORA, "cases": cases,
        "provenance": {"torch": torch.__version__, "seed": SEED},
    }
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "fixture.safetensors")
    st.save_file(tensors, path)
    back = st.load_file(path)
    assert sorted(back) == sorted(tensors)
    for k, t in tensors.items():
        assert back[k].dtype == t.dtype and torch.equal(back[k], t), k
    with open(os.path.join(args.out, "fixture.json"), "w") as f:
        json.dump(meta, f, indent=2)
        f.write("\n")
    print(f"wrote {path} ({os.path.getsize(path)} bytes, {len(tensors)} tensors)")


if __name__ == "__main__":
    main()
