#!/usr/bin/python3
"""PyTorch CPU training-throughput baseline for a LLaMA config (float32).

Same model as llama_ref.py (HF LlamaForCausalLM math, eager attention, GQA via
repeat_interleave like HF's repeat_kv), all matmuls through F.linear / batched
torch.matmul -- no Python loops over tokens or heads.

One timed step = zero_grad + forward + cross-entropy + backward
               + clip_grad_norm_(1.0) + torch.optim.AdamW.step
Random tokens, init normal(0, 0.02) for matrices, RMSNorm gains 1.
AdamW: lr 3e-4, betas (0.9, 0.95), eps 1e-8, weight_decay 0.1 (not on norms),
default torch implementation unless --foreach.

Prints one line per step and ends with
    torch_version <v>
    torch_threads <n>
    torch_tok_per_s <median tokens/s over non-warmup steps>

Example:
    tools/reference/bench_torch.py --model tests/fixtures/tiny_ref/config.json \
        --batch 2 --seq-len 12 --steps 4
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llama_ref as L  # noqa: E402


def default_threads() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover
        return os.cpu_count() or 1


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="HF config.json of a LLaMA model")
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--seq-len", type=int, required=True)
    ap.add_argument("--steps", type=int, default=6, help="total steps including warmup (default 6)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed-for-median warmup steps (default 2)")
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: all usable cores)")
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--foreach", action="store_true", help="use AdamW(foreach=True) (default: torch default)")
    args = ap.parse_args()
    if args.steps <= args.warmup:
        ap.error("--steps must be larger than --warmup")

    threads = args.threads or default_threads()
    torch.set_num_threads(threads)
    torch.manual_seed(args.seed)

    with open(args.model) as f:
        cfg = L.normalize_config(json.load(f))
    if args.seq_len > cfg["max_position_embeddings"]:
        print(f"warning: seq_len {args.seq_len} > max_position_embeddings {cfg['max_position_embeddings']}",
              file=sys.stderr)
    V = cfg["vocab_size"]
    B, T = args.batch, args.seq_len

    params = {k: v.requires_grad_(True)
              for k, v in L.init_params(cfg, std=0.02, dtype=torch.float32).items()}
    n_params = sum(p.numel() for p in params.values())
    decay = [p for n, p in params.items() if not L.is_norm_weight(n)]
    no_decay = [p for n, p in params.items() if L.is_norm_weight(n)]
    opt_kwargs = dict(lr=args.lr, betas=(0.9, 0.95), eps=1e-8)
    if args.foreach:
        opt_kwargs["foreach"] = True
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}], **opt_kwargs)
    plist = list(params.values())

    print(f"model {args.model}: d={cfg['hidden_size']} F={cfg['intermediate_size']} "
          f"L={cfg['num_hidden_layers']} H={cfg['num_attention_heads']} KV={cfg['num_key_value_heads']} "
          f"V={V} tied={cfg['tie_word_embeddings']} params={n_params} ({n_params / 1e6:.2f}M)")
    print(f"batch {B} seq_len {T} tokens/step {B * T} steps {args.steps} warmup {args.warmup} "
          f"threads {threads} dtype float32")

    tok_per_s = []
    for step in range(args.steps):
        tokens = torch.randint(0, V, (B, T + 1))
        inp, tgt = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        _, loss = L.forward(params, cfg, inp, tgt)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(plist, 1.0)
        opt.step()
        dt = time.perf_counter() - t0
        tps = B * T / dt
        tag = "warmup" if step < args.warmup else "timed"
        print(f"step {step} loss {loss.item():.4f} grad_norm {gnorm.item():.4f} "
              f"time_ms {dt * 1e3:.2f} tok_per_s {tps:.1f} ({tag})", flush=True)
        if step >= args.warmup:
            tok_per_s.append(tps)

    print(f"torch_version {torch.__version__}")
    print(f"torch_threads {torch.get_num_threads()}")
    print(f"torch_tok_per_s {statistics.median(tok_per_s):.1f}")


if __name__ == "__main__":
    main()
