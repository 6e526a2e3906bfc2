#!/usr/bin/env python3
"""Train the PyTorch reference model (tools/reference/llama_ref.py) with a peer's optimizer, on
grass's data and protocol, writing metrics.jsonl rows in grass's format.

    build/torch2-venv/bin/python tools/peers/train_peer.py --optimizer galore-torch \
        --model configs/models/llama_quickstart.json --train data/c4_sample/tokens/train_00000.bin \
        --val data/c4_sample/tokens/val_00000.bin --lr 1e-2 --seed 42 --out runs/peer

Optimizers (the targets are every layer's q/k/v/o/gate/up/down, as in grass):
  galore-torch  the GaLore authors' GaLoreAdamW (galore_torch 1.0): targets in a group with
                rank, update_proj_gap = --interval, scale, proj_type 'std'; embeddings, lm_head and
                norms in a plain group of the same optimizer.
  flora-opt     FLORA's authors' Flora (flora_opt 0.0.3) on the targets at lr x scale, with
                beta1 0.9 (its compressed momentum), kappa = --interval, and scale_parameter off so
                that its lr is a step size as in Adam; the rest with torch.optim.AdamW at lr.
grass's protocol, as compare_optimizers.sh runs it: betas (0.9, 0.95), no weight decay, eps the
defaults of each side (galore-torch's 1e-6, which grass's GaLore takes too; 1e-8 for FLORA's AdamW);
warmup then cosine to min_lr_ratio (grass's schedule_lr); the global gradient norm clipped at
--clip (here over the full gradients); windows of seq_len + 1 tokens at stride seq_len read in
stream order (grass's data.shuffle = false): step s takes windows s*batch .. s*batch + batch - 1;
validation over the first --eval-tokens targets of --val in grass's evaluator windows. fp32, one
thread unless --threads.
"""
import argparse
import json
import math
import os
import sys
import time

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "reference"))
import llama_ref as L  # noqa: E402
from check_export import eval_windows, read_shard  # noqa: E402

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def schedule_lr(base, step, total, warmup, min_ratio):
    """grass's schedule_lr (src/optim/schedule.cpp), cosine; step counts from 0."""
    if step < warmup:
        return base * (step + 1) / warmup
    span = max(1, total - 1 - warmup)
    progress = min(1.0, (step - warmup) / span)
    return base * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def make_optimizers(args, params):
    """[(optimizer, lr multiplier of its groups)] for the chosen peer."""
    targets = [p for n, p in params.items() if any(t in n for t in TARGETS)]
    rest = [p for n, p in params.items() if not any(t in n for t in TARGETS)]
    adam = dict(betas=(0.9, 0.95), weight_decay=0.0)
    if args.optimizer == "galore-torch":
        from galore_torch import GaLoreAdamW
        groups = [{"params": rest},
                  {"params": targets, "rank": args.rank, "update_proj_gap": args.interval,
                   "scale": args.scale, "proj_type": "std"}]
        # eps: GaLoreAdamW's own default (1e-6), grass's GaLore default too
        return [(GaLoreAdamW(groups, lr=args.lr, no_deprecation_warning=True, **adam), 1.0)]
    from flora_opt import Flora
    flora = Flora(targets, lr=args.lr * args.scale, rank=args.rank, kappa=args.interval, beta1=0.9,
                  scale_parameter=False, seed=args.seed)
    return [(flora, args.scale), (torch.optim.AdamW(rest, lr=args.lr, eps=1e-8, **adam), 1.0)]


def evaluate(params, cfg, tokens, n_targets, seq_len):
    total, counted = 0.0, 0
    with torch.no_grad():
        for ids, tgt in eval_windows(tokens, n_targets, seq_len, L.IGNORE_INDEX):
            logits, _ = L.forward(params, cfg, ids)
            total += float(F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1),
                                           ignore_index=L.IGNORE_INDEX, reduction="sum"))
            counted += int((tgt != L.IGNORE_INDEX).sum())
    return total / counted


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--optimizer", required=True, choices=["galore-torch", "flora-opt"])
    ap.add_argument("--model", required=True, help="HF config.json of the model")
    ap.add_argument("--train", required=True, help="grass token shard")
    ap.add_argument("--val", required=True, help="grass token shard")
    ap.add_argument("--out", required=True, help="folder for metrics.jsonl")
    ap.add_argument("--lr", type=float, required=True)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--rank", type=int, default=32)
    ap.add_argument("--interval", type=int, default=40, help="GaLore's update_proj_gap, FLORA's kappa")
    ap.add_argument("--scale", type=float, default=0.25)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--min-lr-ratio", type=float, default=0.1)
    ap.add_argument("--clip", type=float, default=1.0)
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--eval-tokens", type=int, default=128238)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    with open(args.model) as f:
        cfg = L.normalize_config(json.load(f))
    train, val = read_shard(args.train), read_shard(args.val)
    B, T = args.batch, args.seq_len
    if (len(train) - 1) // T < args.steps * B:
        sys.exit(f"{args.train}: {len(train)} tokens hold fewer than {args.steps} x {B} windows")
    if len(val) < args.eval_tokens + 1:
        sys.exit(f"{args.val}: fewer than --eval-tokens + 1 = {args.eval_tokens + 1} tokens")
    train = torch.tensor(train, dtype=torch.int64)

    generator = torch.Generator().manual_seed(args.seed)
    params = {n: p.requires_grad_(True)
              for n, p in L.init_params(cfg, cfg.get("initializer_range", 0.02), torch.float32,
                                        generator).items()}
    optimizers = make_optimizers(args, params)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "metrics.jsonl"), "w") as out:
        def log(row):
            out.write(json.dumps(row, sort_keys=True, separators=(",", ":")) + "\n")
            out.flush()

        for step in range(args.steps):
            start = time.perf_counter()
            rows = torch.stack([train[w * T: w * T + T + 1] for w in range(step * B, step * B + B)])
            _, loss = L.forward(params, cfg, rows[:, :-1], rows[:, 1:])
            for p in params.values():
                p.grad = None
            loss.backward()
            grad_norm = float(torch.nn.utils.clip_grad_norm_(list(params.values()), args.clip))
            lr = schedule_lr(args.lr, step, args.steps, args.warmup, args.min_lr_ratio)
            for opt, multiplier in optimizers:
                for group in opt.param_groups:
                    group["lr"] = lr * multiplier
                opt.step()
            ms = (time.perf_counter() - start) * 1e3
            loss = float(loss.detach())
            log({"step": step + 1, "loss": loss, "lr": lr, "grad_norm": grad_norm,
                 "step_ms": ms, "tokens": (step + 1) * B * T})
            if (step + 1) % args.eval_every == 0 or step + 1 == args.steps:
                val_loss = evaluate(params, cfg, val, args.eval_tokens, T)
                log({"eval": True, "step": step + 1, "val_loss": val_loss,
                     "val_tokens": args.eval_tokens})
                print(f"step {step + 1}/{args.steps} | loss {loss:.4f} | "
                      f"val loss {val_loss:.4f} | {ms:.0f} ms", file=sys.stderr)


if __name__ == "__main__":
    main()
