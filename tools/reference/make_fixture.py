#!/usr/bin/python3
"""Generate tests/fixtures/tiny_ref/ (config.json, fixture.json, fixture.safetensors).

Tiny LLaMA (GQA, F not a multiple of 8, untied lm_head), float64 throughout:
  * forward + backward on one batch with 3 ignored targets (-100):
      logits, loss, grad.<name> for every parameter
  * 5 steps of clip + AdamW from the same initial weights:
      train_losses, train_grad_norms (pre-clip), final.<name>

Self-checks before anything is written:
  * forward agrees with an independent naive loop implementation (explicit
    per-head/per-position attention, pairwise RoPE rotation, GQA indexing)
  * loss agrees with a hand-computed masked mean of -log_softmax
  * gradients come from torch.autograd and agree with central finite
    differences (float64) on the largest-|grad| entry of every parameter tensor
  * hand-written AdamW + clipping agrees with torch.optim.AdamW +
    torch.nn.utils.clip_grad_norm_ over the 5 training steps
  * the max_norm clips on some steps and not on others

Deterministic: single-threaded, fixed seed -> byte-identical output on rerun.
Usage:  tools/reference/make_fixture.py [--out DIR]
"""
import argparse
import json
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llama_ref as L  # noqa: E402
import safetensors_io as st  # noqa: E402

SEED = 20240611
B, T = 2, 12
N_IGNORED = 3
TRAIN_STEPS = 5
LR = 1e-2
BETAS = (0.9, 0.95)
EPS = 1e-8
WEIGHT_DECAY = 0.1
# Pre-clip global grad norms of the 5 training steps with this seed:
#   4.836 (clipped), 4.152, 4.375, 5.798 (clipped), 3.351
# MAX_NORM sits between them (>= 3% margin) so some steps clip and some don't.
MAX_NORM = 4.5
INIT_STD = 0.1
NORM_NOISE = 0.1

CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_act": "silu",
    "vocab_size": 96,
    "hidden_size": 48,
    "intermediate_size": 86,
    "num_attention_heads": 6,
    "num_key_value_heads": 2,
    "num_hidden_layers": 2,
    "max_position_embeddings": 64,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "initializer_range": 0.02,
}

# Storage dtypes.  All math is float64.  Initial weights are drawn in float64
# and rounded to float32-representable values *before* any use, so storing them
# as F32 is lossless (and an fp32 engine loads exactly the reference weights).
# Gradients/logits/losses are stored as F64.  final.* (weights after 5 AdamW
# steps) are float64 results rounded to F32 (rel. error <= 6e-8) to keep the
# fixture well under 1 MB.
WEIGHT_STORE = torch.float32
GRAD_STORE = torch.float64
FINAL_STORE = torch.float32


# --------------------------------------------------------------------------- checks
def naive_forward(params, cfg, ids):
    """Deliberately different, loop-based formulation of the same model."""
    c = L.normalize_config(cfg)
    d, H, KV, hd = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    eps, theta = c["rms_norm_eps"], c["rope_theta"]
    Bn, Tn = ids.shape
    half = hd // 2

    def rms(x, w):  # x [d]
        return x / math.sqrt(float((x * x).sum()) / d + eps) * w

    def rot(x, pos):  # x [hd], pairwise rotation of (i, i + hd/2)
        y = x.clone()
        for i in range(half):
            ang = pos * theta ** (-(2.0 * i) / hd)
            cs, sn = math.cos(ang), math.sin(ang)
            y[i] = x[i] * cs - x[i + half] * sn
            y[i + half] = x[i + half] * cs + x[i] * sn
        return y

    E = params["model.embed_tokens.weight"]
    out = torch.zeros(Bn, Tn, c["vocab_size"], dtype=E.dtype)
    for b in range(Bn):
        h = [E[int(ids[b, t])].clone() for t in range(Tn)]
        for li in range(c["num_hidden_layers"]):
            P = lambda n: params[f"model.layers.{li}.{n}"]  # noqa: E731
            a = [rms(x, P("input_layernorm.weight")) for x in h]
            q = [P("self_attn.q_proj.weight") @ x for x in a]
            k = [P("self_attn.k_proj.weight") @ x for x in a]
            v = [P("self_attn.v_proj.weight") @ x for x in a]
            attn_out = []
            for t in range(Tn):
                heads = []
                for hh in range(H):
                    g = hh // (H // KV)
                    qt = rot(q[t][hh * hd:(hh + 1) * hd], t)
                    scores = torch.stack([
                        (qt * rot(k[s][g * hd:(g + 1) * hd], s)).sum() / math.sqrt(hd)
                        for s in range(t + 1)])
                    w = torch.exp(scores - scores.max())
                    w = w / w.sum()
                    heads.append(sum(w[s] * v[s][g * hd:(g + 1) * hd] for s in range(t + 1)))
                attn_out.append(torch.cat(heads))
            h = [h[t] + P("self_attn.o_proj.weight") @ attn_out[t] for t in range(Tn)]
            m = [rms(x, P("post_attention_layernorm.weight")) for x in h]
            h = [h[t] + P("mlp.down_proj.weight") @ (
                (lambda gt: gt / (1.0 + torch.exp(-gt)))(P("mlp.gate_proj.weight") @ m[t])
                * (P("mlp.up_proj.weight") @ m[t])) for t in range(Tn)]
        Wo = params["model.embed_tokens.weight"] if c["tie_word_embeddings"] else params["lm_head.weight"]
        for t in range(Tn):
            out[b, t] = Wo @ rms(h[t], params["model.norm.weight"])
    return out


def rel_err(a, b):
    return abs(a - b) / max(abs(a), abs(b), 1e-300)


def finite_difference_check(params, cfg, ids, tgt, grads):
    """Central differences on the largest-|grad| entry of every tensor."""
    worst = 0.0
    h = 1e-5
    with torch.no_grad():
        for name in params:
            g = grads[name]
            idx = int(g.abs().reshape(-1).argmax())
            flat = params[name].view(-1)
            orig = float(flat[idx])
            flat[idx] = orig + h
            lp = float(L.forward(params, cfg, ids, tgt)[1])
            flat[idx] = orig - h
            lm = float(L.forward(params, cfg, ids, tgt)[1])
            flat[idx] = orig
            fd = (lp - lm) / (2 * h)
            an = float(g.reshape(-1)[idx])
            e = rel_err(fd, an)
            worst = max(worst, e)
            if e >= 1e-6:
                raise AssertionError(f"finite-difference mismatch {name}[{idx}]: fd={fd!r} autograd={an!r} rel={e:.3g}")
    return worst


def loss_and_grads(params, cfg, ids, tgt):
    leaves = {k: v.detach().clone().requires_grad_(True) for k, v in params.items()}
    logits, loss = L.forward(leaves, cfg, ids, tgt)
    names = list(leaves)
    gs = torch.autograd.grad(loss, [leaves[n] for n in names])
    for n, g in zip(names, gs):
        assert g is not None and g.dtype == torch.float64 and g.shape == params[n].shape
    return logits.detach(), loss.detach(), {n: g.detach().clone() for n, g in zip(names, gs)}


def train(params0, cfg, tokens, max_norm):
    """Hand-written clip + AdamW. Returns losses, pre-clip norms, final params."""
    params = {k: v.clone() for k, v in params0.items()}
    opt = L.AdamW(lr=LR, betas=BETAS, eps=EPS, weight_decay=WEIGHT_DECAY)
    losses, norms = [], []
    for s in range(tokens.shape[0]):
        _, loss, grads = loss_and_grads(params, cfg, tokens[s, :, :-1], tokens[s, :, 1:])
        losses.append(float(loss))
        norms.append(L.clip_grads_(grads, max_norm))
        opt.step(params, grads)
    return losses, norms, params


def train_torch(params0, cfg, tokens, max_norm):
    """Same training with torch.optim.AdamW + clip_grad_norm_ (cross-check)."""
    ps = {k: torch.nn.Parameter(v.clone()) for k, v in params0.items()}
    decay = [p for n, p in ps.items() if not L.is_norm_weight(n)]
    no_decay = [p for n, p in ps.items() if L.is_norm_weight(n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": WEIGHT_DECAY},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=LR, betas=BETAS, eps=EPS)
    losses, norms = [], []
    for s in range(tokens.shape[0]):
        opt.zero_grad(set_to_none=True)
        _, loss = L.forward(ps, cfg, tokens[s, :, :-1], tokens[s, :, 1:])
        loss.backward()
        losses.append(float(loss))
        norms.append(float(torch.nn.utils.clip_grad_norm_(list(ps.values()), max_norm)))
        opt.step()
    return losses, norms, {k: v.detach() for k, v in ps.items()}


# --------------------------------------------------------------------------- main
def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--out", default=os.path.normpath(os.path.join(here, "..", "..", "tests", "fixtures", "tiny_ref")))
    ap.add_argument("--skip-naive", action="store_true", help="skip the (slow-ish) naive forward cross-check")
    args = ap.parse_args()

    torch.set_num_threads(1)  # reductions independent of thread count -> reproducible bytes
    torch.use_deterministic_algorithms(True)
    gen = torch.Generator().manual_seed(SEED)
    cfg = dict(CONFIG)
    c = L.normalize_config(cfg)
    V = c["vocab_size"]

    # ---- weights (float64 math, float32-representable values)
    params = L.init_params(cfg, std=INIT_STD, dtype=torch.float64, generator=gen, norm_noise=NORM_NOISE)
    params = {k: v.to(torch.float32).to(torch.float64) for k, v in params.items()}
    for k, shp in L.param_shapes(cfg).items():
        assert tuple(params[k].shape) == tuple(shp), k

    # ---- single forward/backward batch
    input_ids = torch.randint(0, V, (B, T), generator=gen, dtype=torch.int64)
    targets = torch.randint(0, V, (B, T), generator=gen, dtype=torch.int64)
    ign = torch.randperm(B * T, generator=gen)[:N_IGNORED]
    targets.view(-1)[ign] = L.IGNORE_INDEX
    assert int((targets == L.IGNORE_INDEX).sum()) == N_IGNORED

    logits, loss, grads = loss_and_grads(params, cfg, input_ids, targets)

    # loss == masked mean of -log p(target)
    lp = torch.log_softmax(logits, -1)
    keep = targets != L.IGNORE_INDEX
    manual = -(lp[keep].gather(-1, targets[keep].unsqueeze(-1))).sum() / keep.sum()
    assert rel_err(float(manual), float(loss)) < 1e-13, (float(manual), float(loss))

    if not args.skip_naive:
        ref = naive_forward(params, cfg, input_ids)
        md = float((ref - logits).abs().max())
        print(f"check: naive loop forward vs llama_ref max|dlogits| = {md:.3e}")
        assert md < 1e-11, md

    worst = finite_difference_check({k: v.clone() for k, v in params.items()}, cfg, input_ids, targets, grads)
    print(f"check: finite differences (h=1e-5, largest-|g| entry of each of {len(params)} tensors) worst rel err = {worst:.3e}")

    # ---- training
    train_tokens = torch.randint(0, V, (TRAIN_STEPS, B, T + 1), generator=gen, dtype=torch.int64)
    losses, norms, final = train(params, cfg, train_tokens, MAX_NORM)
    t_losses, t_norms, t_final = train_torch(params, cfg, train_tokens, MAX_NORM)
    for s in range(TRAIN_STEPS):
        print(f"train step {s}: loss {losses[s]:.17g}  pre-clip grad norm {norms[s]:.17g}  "
              f"{'CLIPPED' if norms[s] > MAX_NORM else 'not clipped'} (max_norm {MAX_NORM})")
        assert rel_err(losses[s], t_losses[s]) < 1e-12, (s, losses[s], t_losses[s])
        assert rel_err(norms[s], t_norms[s]) < 1e-12, (s, norms[s], t_norms[s])
    wdiff = max(float((final[k] - t_final[k]).abs().max()) for k in final)
    print(f"check: hand AdamW+clip vs torch.optim.AdamW+clip_grad_norm_ max|dW| = {wdiff:.3e}")
    assert wdiff < 1e-12, wdiff
    clipped = [n > MAX_NORM for n in norms]
    assert any(clipped) and not all(clipped), f"MAX_NORM={MAX_NORM} must clip on some steps only: {norms}"
    moved = max(float((final[k] - params[k]).abs().max()) for k in final)
    print(f"max |final - initial| = {moved:.4g}")

    # ---- write
    tensors = {}
    for k, v in params.items():
        tensors[k] = v.to(WEIGHT_STORE)
        assert torch.equal(tensors[k].to(torch.float64), v)  # lossless
    for k, g in grads.items():
        tensors["grad." + k] = g.to(GRAD_STORE)
    for k, w in final.items():
        tensors["final." + k] = w.to(FINAL_STORE)
    tensors["logits"] = logits.to(torch.float64)
    tensors["loss"] = loss.reshape(1).to(torch.float64)
    tensors["input_ids"] = input_ids
    tensors["targets"] = targets
    tensors["train_tokens"] = train_tokens
    tensors["train_losses"] = torch.tensor(losses, dtype=torch.float64)
    tensors["train_grad_norms"] = torch.tensor(norms, dtype=torch.float64)

    meta = {
        "batch": B,
        "seq_len": T,
        "ignore_index": L.IGNORE_INDEX,
        "adamw": {"lr": LR, "betas": list(BETAS), "eps": EPS, "weight_decay": WEIGHT_DECAY,
                  "no_weight_decay": "RMSNorm gains: names ending in 'layernorm.weight' and 'model.norm.weight'"},
        "grad_clip": MAX_NORM,
        "grad_clip_semantics": "torch.nn.utils.clip_grad_norm_: coef = max_norm/(total_norm+1e-6), applied if coef < 1",
        "train_steps": TRAIN_STEPS,
        "train_tokens_usage": "step s: input_ids = train_tokens[s,:,:-1], targets = train_tokens[s,:,1:]",
        "train_losses": "loss before the update of each step",
        "train_grad_norms": "global L2 norm of all gradients before clipping",
        "compute_dtype": "float64",
        "storage_dtypes": {
            "<hf name> (initial weights)": "F32, exactly the float64 values used (weights were rounded to float32-representable values before use)",
            "grad.<hf name>": "F64",
            "final.<hf name>": "F32, float64 result rounded to float32",
            "logits, loss, train_losses, train_grad_norms": "F64",
            "input_ids, targets, train_tokens": "I64",
        },
        "init": {"seed": SEED, "matrices_std": INIT_STD, "norm_gains": f"1 + {NORM_NOISE}*randn"},
        "generated_by": "tools/reference/make_fixture.py",
        "torch_version": torch.__version__,
    }

    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    with open(os.path.join(args.out, "fixture.json"), "w") as f:
        json.dump(meta, f, indent=2)
        f.write("\n")
    path = os.path.join(args.out, "fixture.safetensors")
    st.save_file(tensors, path)

    # round-trip
    back = st.load_file(path)
    assert set(back) == set(tensors)
    for k in tensors:
        assert back[k].dtype == tensors[k].dtype and torch.equal(back[k], tensors[k]), k
    total = sum(os.path.getsize(os.path.join(args.out, n)) for n in ("config.json", "fixture.json", "fixture.safetensors"))
    print(f"wrote {args.out}: {len(tensors)} tensors, {os.path.getsize(path)} bytes safetensors, {total} bytes total")
    print(f"loss = {float(loss):.17g}")


if __name__ == "__main__":
    main()
