#!/usr/bin/env python3
"""grass against Hugging Face transformers: the same exported weights, the same tokens, one loss.

Runs with the peers environment's python (tools/peers/setup_venv.sh: Debian's torch 1.13 and
transformers from PyPI), so it checks the engine against code no one here wrote:
  1. trains the tiny_ref model (tests/fixtures/tiny_ref/config.json: GQA, vocab 96), untied and
     tied, for 6 AdamW steps on a synthetic shard with the real binary, and `grass export`s each
     final checkpoint as fp32 and as bf16;
  2. `grass eval --weights <export> --json` gives the engine's mean loss over the first N targets
     of the shard (windows of T+1 tokens at stride T, the last one padded: docs/training.md);
  3. transformers' LlamaForCausalLM.from_pretrained loads each export (torch_dtype float32: the
     bf16 weights widened, as the engine computes) and scores the same windows; the two losses
     must agree within --tol relative (default 1e-5). The bf16 export is also run in bf16
     arithmetic, reported for information only (bf16 rounds every activation).
Exit status 0 when every export agrees, 1 otherwise.
Usage: <venv>/bin/python tools/peers/transformers_check.py [--grass build/grass] [--tokens 500]
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

import torch
import torch.nn.functional as F
from transformers import LlamaForCausalLM

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tools", "reference"))
import check_export as C  # noqa: E402  (the token shard format and the evaluation windows)

IGNORE = -100  # transformers' ignore index


def run(cmd, **kw):
    print("+", " ".join(cmd), flush=True)
    return subprocess.run(cmd, check=True, **kw)


def transformers_loss(hf_dir, dtype, tokens, n_targets, T):
    """Mean cross-entropy over targets 1..n_targets of the stream, grass's windows, in `dtype`."""
    model = LlamaForCausalLM.from_pretrained(hf_dir, torch_dtype=dtype).eval()
    total, counted = 0.0, 0
    with torch.no_grad():
        for ids, tgt in C.eval_windows(tokens, n_targets, T, IGNORE):
            logits = model(input_ids=ids).logits.to(torch.float64)
            total += float(F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1),
                                           ignore_index=IGNORE, reduction="sum"))
            counted += int((tgt != IGNORE).sum())
    assert counted == n_targets, (counted, n_targets)
    return total / n_targets


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--grass", default=os.path.join(ROOT, "build", "grass"))
    ap.add_argument("--tokens", type=int, default=500, help="targets to score (not a multiple of T)")
    ap.add_argument("--seq-len", type=int, default=16)
    ap.add_argument("--tol", type=float, default=1e-5)
    args = ap.parse_args()
    torch.set_num_threads(1)
    grass = os.path.abspath(args.grass)
    maker = os.path.join(os.path.dirname(grass), "make_synthetic_shard")
    with open(os.path.join(ROOT, "tests", "fixtures", "tiny_ref", "config.json")) as f:
        model_cfg = json.load(f)
    T = args.seq_len

    work = tempfile.mkdtemp(prefix="grass_transformers_check_")
    try:
        shard = os.path.join(work, "data.bin")
        run([maker, "--out", shard, "--vocab", str(model_cfg["vocab_size"]), "--tokens", "6000",
             "--ngrams", "16", "--ngram-len", "6", "--seed", "7"], stdout=subprocess.DEVNULL)
        stream = C.read_shard(shard)
        failed = False
        rows = []
        for tied in (False, True):
            name = "tied" if tied else "untied"
            out_dir = os.path.join(work, "run_" + name)
            run_cfg = {"model": dict(model_cfg, tie_word_embeddings=tied),
                       "data": {"train": shard, "val": shard},
                       "optimizer": {"name": "adamw", "lr": 1e-2, "betas": [0.9, 0.95]},
                       "schedule": {"name": "constant"}, "micro_batch_size": 2, "seq_len": T,
                       "steps": 6, "seed": 3, "out_dir": out_dir, "eval_tokens": args.tokens,
                       "checkpoint_every": 6}
            run_path = os.path.join(work, name + ".json")
            with open(run_path, "w") as f:
                json.dump(run_cfg, f)
            run([grass, "train", run_path], stdout=subprocess.DEVNULL)
            for dtype in ("fp32", "bf16"):
                hf = os.path.join(work, f"hf_{name}_{dtype}")
                run([grass, "export", "--checkpoint", out_dir, "--out", hf, "--dtype", dtype],
                    stdout=subprocess.DEVNULL)
                engine = json.loads(run([grass, "eval", run_path, "--weights", hf, "--json"],
                                        stdout=subprocess.PIPE, text=True).stdout)["val_loss"]
                theirs = transformers_loss(hf, torch.float32, stream, args.tokens, T)
                rel = abs(engine - theirs) / abs(theirs)
                ok = rel <= args.tol
                failed |= not ok
                export = f"{name}, {dtype}"
                rows.append((export, "float32", engine, theirs, rel, "ok" if ok else "FAIL"))
                if dtype == "bf16":
                    native = transformers_loss(hf, torch.bfloat16, stream, args.tokens, T)
                    rows.append((export, "bfloat16", engine, native,
                                 abs(engine - native) / abs(native), "(information)"))
        print(f"\ntransformers {__import__('transformers').__version__}, torch {torch.__version__}; "
              f"{args.tokens} targets, seq_len {T}; tolerance {args.tol:g}")
        print("| export | transformers dtype | grass eval loss | transformers loss | rel. diff | |")
        print("|---|---|---|---|---|---|")
        for export, dt, engine, theirs, rel, verdict in rows:
            print(f"| {export} | {dt} | {engine:.9f} | {theirs:.9f} | {rel:.2e} | {verdict} |")
        sys.exit(1 if failed else 0)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
