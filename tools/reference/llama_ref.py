#!/usr/bin/python3
"""Independent plain-PyTorch LLaMA reference (no `transformers` import).

Written from the Hugging Face LlamaForCausalLM formulas (eager attention):

  h = embed_tokens[input_ids]
  for each layer:
      a = input_layernorm(h)
      q, k, v = q_proj(a), k_proj(a), v_proj(a)          # [B,T,H*hd], [B,T,KV*hd]
      q, k = rope(q), rope(k)                             # HF rotate-half layout
      k, v = repeat_kv(k), repeat_kv(v)                   # GQA: q head h uses kv head h // (H/KV)
      att = softmax(q k^T / sqrt(hd) + causal_mask) v
      h = h + o_proj(att)
      m = post_attention_layernorm(h)
      h = h + down_proj(silu(gate_proj(m)) * up_proj(m))
  h = norm(h); logits = lm_head(h)   (lm_head = embed_tokens when tied)
  loss = mean cross-entropy over targets != ignore_index (-100)

  RMSNorm(x) = x * rsqrt(mean(x^2, -1) + eps) * w

Everything is computed in the dtype of the parameters (the test fixture uses
float64).  The RoPE cos/sin tables are computed in float64 and then cast to the
parameter dtype (HF computes inv_freq in float32; in float64 this is the exact
math, in float32 the difference is at the rounding level).

Parameters are a plain dict {HF name: tensor}; see `param_shapes`.
Also provides a hand-written AdamW (torch.optim.AdamW semantics) and a
clip_grad_norm_ equivalent.
"""
import math

import torch
import torch.nn.functional as F

IGNORE_INDEX = -100


# --------------------------------------------------------------------------- config
def normalize_config(cfg: dict) -> dict:
    """Return a copy of an HF LLaMA config dict with defaults filled in."""
    c = dict(cfg)
    for k in ("hidden_size", "intermediate_size", "num_attention_heads",
              "num_hidden_layers", "vocab_size"):
        if k not in c:
            raise KeyError(f"config missing {k}")
    c.setdefault("num_key_value_heads", c["num_attention_heads"])
    if c["num_key_value_heads"] is None:
        c["num_key_value_heads"] = c["num_attention_heads"]
    c.setdefault("max_position_embeddings", 2048)
    c.setdefault("rms_norm_eps", 1e-6)
    c.setdefault("rope_theta", 10000.0)
    c.setdefault("tie_word_embeddings", False)
    c.setdefault("head_dim", c["hidden_size"] // c["num_attention_heads"])
    H, KV = c["num_attention_heads"], c["num_key_value_heads"]
    if H % KV != 0:
        raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
    if c["head_dim"] % 2 != 0:
        raise ValueError("head_dim must be even for RoPE")
    if c.get("rope_scaling"):
        raise NotImplementedError("rope_scaling is not supported by this reference")
    return c


def param_shapes(cfg: dict) -> dict:
    """{HF name: shape} for every parameter, in a fixed canonical order."""
    c = normalize_config(cfg)
    d, F_, V = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    H, KV, hd = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    shapes = {"model.embed_tokens.weight": (V, d)}
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes[p + "input_layernorm.weight"] = (d,)
        shapes[p + "self_attn.q_proj.weight"] = (H * hd, d)
        shapes[p + "self_attn.k_proj.weight"] = (KV * hd, d)
        shapes[p + "self_attn.v_proj.weight"] = (KV * hd, d)
        shapes[p + "self_attn.o_proj.weight"] = (d, H * hd)
        shapes[p + "post_attention_layernorm.weight"] = (d,)
        shapes[p + "mlp.gate_proj.weight"] = (F_, d)
        shapes[p + "mlp.up_proj.weight"] = (F_, d)
        shapes[p + "mlp.down_proj.weight"] = (d, F_)
    shapes["model.norm.weight"] = (d,)
    if not c["tie_word_embeddings"]:
        shapes["lm_head.weight"] = (V, d)
    return shapes


def is_norm_weight(name: str) -> bool:
    """RMSNorm gains (excluded from weight decay)."""
    return name.endswith("layernorm.weight") or name == "model.norm.weight"


def init_params(cfg: dict, std: float = 0.02, dtype=torch.float32,
                generator: torch.Generator = None, norm_noise: float = 0.0) -> dict:
    """normal(0, std) for matrices; RMSNorm gains 1 (+ norm_noise * randn)."""
    out = {}
    for name, shape in param_shapes(cfg).items():
        if is_norm_weight(name):
            w = torch.ones(shape, dtype=torch.float64)
            if norm_noise:
                w = w + norm_noise * torch.randn(shape, dtype=torch.float64, generator=generator)
        else:
            w = std * torch.randn(shape, dtype=torch.float64, generator=generator)
        out[name] = w.to(dtype)
    return out


# --------------------------------------------------------------------------- model
def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope_cos_sin(T: int, head_dim: int, theta: float, dtype, device=None):
    """cos, sin of shape [T, head_dim] (HF layout: emb = cat(freqs, freqs))."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    pos = torch.arange(T, dtype=torch.float64)
    freqs = torch.outer(pos, inv_freq)                 # [T, hd/2]
    emb = torch.cat((freqs, freqs), dim=-1)            # [T, hd]
    return emb.cos().to(dtype=dtype, device=device), emb.sin().to(dtype=dtype, device=device)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x: [B, heads, T, hd]; cos/sin: [T, hd] broadcast over B, heads
    return x * cos + rotate_half(x) * sin


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """[B, KV, T, hd] -> [B, KV*n_rep, T, hd]; head h reads kv head h // n_rep."""
    if n_rep == 1:
        return x
    return torch.repeat_interleave(x, n_rep, dim=1)


def causal_mask(T: int, dtype, device=None) -> torch.Tensor:
    """Additive [T, T] mask: 0 on/below the diagonal, -inf above."""
    m = torch.full((T, T), float("-inf"), dtype=dtype, device=device)
    return torch.triu(m, diagonal=1)


def forward(params: dict, config: dict, input_ids: torch.Tensor, targets: torch.Tensor = None,
            ignore_index: int = IGNORE_INDEX):
    """Returns (logits [B,T,V], loss scalar or None)."""
    c = normalize_config(config)
    B, T = input_ids.shape
    H, KV, hd = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    eps = c["rms_norm_eps"]
    emb = params["model.embed_tokens.weight"]
    dtype, device = emb.dtype, emb.device

    cos, sin = rope_cos_sin(T, hd, c["rope_theta"], dtype, device)
    mask = causal_mask(T, dtype, device)
    scale = 1.0 / math.sqrt(hd)

    h = F.embedding(input_ids, emb)                                   # [B,T,d]
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        a = rms_norm(h, params[p + "input_layernorm.weight"], eps)
        q = F.linear(a, params[p + "self_attn.q_proj.weight"]).view(B, T, H, hd).transpose(1, 2)
        k = F.linear(a, params[p + "self_attn.k_proj.weight"]).view(B, T, KV, hd).transpose(1, 2)
        v = F.linear(a, params[p + "self_attn.v_proj.weight"]).view(B, T, KV, hd).transpose(1, 2)
        q = apply_rope(q, cos, sin)
        k = apply_rope(k, cos, sin)
        k = repeat_kv(k, H // KV)
        v = repeat_kv(v, H // KV)
        s = torch.matmul(q, k.transpose(-1, -2)) * scale + mask        # [B,H,T,T]
        pr = torch.softmax(s, dim=-1)
        o = torch.matmul(pr, v)                                        # [B,H,T,hd]
        o = o.transpose(1, 2).reshape(B, T, H * hd)
        h = h + F.linear(o, params[p + "self_attn.o_proj.weight"])
        m = rms_norm(h, params[p + "post_attention_layernorm.weight"], eps)
        g = F.linear(m, params[p + "mlp.gate_proj.weight"])
        u = F.linear(m, params[p + "mlp.up_proj.weight"])
        h = h + F.linear(F.silu(g) * u, params[p + "mlp.down_proj.weight"])
    h = rms_norm(h, params["model.norm.weight"], eps)
    w_out = emb if c["tie_word_embeddings"] else params["lm_head.weight"]
    logits = F.linear(h, w_out)                                        # [B,T,V]
    loss = None
    if targets is not None:
        # mean over non-ignored positions (== HF / F.cross_entropy default)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
                               ignore_index=ignore_index, reduction="mean")
    return logits, loss


# --------------------------------------------------------------------------- optimizer
def global_grad_norm(grads: dict) -> torch.Tensor:
    """sqrt(sum over all grad elements of g^2), in float64."""
    total = torch.zeros((), dtype=torch.float64)
    for g in grads.values():
        total = total + g.detach().to(torch.float64).pow(2).sum()
    return total.sqrt()


def clip_grads_(grads: dict, max_norm: float) -> float:
    """torch.nn.utils.clip_grad_norm_ semantics. Returns the pre-clip norm."""
    total = float(global_grad_norm(grads))
    coef = max_norm / (total + 1e-6)
    if coef < 1.0:
        for g in grads.values():
            g.mul_(coef)
    return total


class AdamW:
    """Hand-written AdamW matching torch.optim.AdamW (amsgrad=False, maximize=False).

    step t (1-based):
        p  -= lr * wd * p                      (decoupled decay; skipped for RMSNorm gains)
        m   = b1 m + (1-b1) g
        v   = b2 v + (1-b2) g^2
        p  -= (lr / (1-b1^t)) * m / (sqrt(v) / sqrt(1-b2^t) + eps)
    """

    def __init__(self, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2,
                 no_decay=is_norm_weight):
        self.lr, self.betas, self.eps, self.wd = lr, betas, eps, weight_decay
        self.no_decay = no_decay
        self.t = 0
        self.m, self.v = {}, {}

    @torch.no_grad()
    def step(self, params: dict, grads: dict) -> None:
        self.t += 1
        b1, b2 = self.betas
        bc1 = 1.0 - b1 ** self.t
        bc2 = 1.0 - b2 ** self.t
        for name, p in params.items():
            g = grads[name]
            if name not in self.m:
                self.m[name] = torch.zeros_like(p)
                self.v[name] = torch.zeros_like(p)
            m, v = self.m[name], self.v[name]
            if self.wd != 0.0 and not self.no_decay(name):
                p.mul_(1.0 - self.lr * self.wd)
            m.mul_(b1).add_(g, alpha=1.0 - b1)
            v.mul_(b2).addcmul_(g, g, value=1.0 - b2)
            denom = v.sqrt() / math.sqrt(bc2) + self.eps
            p.addcdiv_(m, denom, value=-(self.lr / bc1))
