#!/usr/bin/env python3
"""grass against Hugging Face transformers, both ways: the same weights, the same tokens, one loss.

Runs with a peers environment's python (tools/peers/setup_venv.sh: transformers 4.40.2 on Debian's
torch 1.13, or the newest transformers 5.x on PyPI's torch 2.x), so it checks the engine against
code no one here wrote:
  1. grass -> transformers: trains the tiny_ref model (tests/fixtures/tiny_ref/config.json: GQA,
     vocab 96), untied and tied, for 6 AdamW steps on a synthetic shard with the real binary, and
     `grass export`s each final checkpoint as fp32 and as bf16; `grass eval --weights <export>
     --json` gives the engine's mean loss over the first N targets of the shard (windows of T+1
     tokens at stride T, the last one padded: docs/training.md), and transformers'
     LlamaForCausalLM.from_pretrained loads each export (float32: the bf16 weights widened, as the
     engine computes) and scores the same windows. The bf16 export is also run in bf16
     arithmetic, reported for information only (bf16 rounds every activation).
  2. transformers -> grass: LlamaForCausalLM(config) with transformers' own random initialisation
     (tiny_ref's shape, initializer_range 0.2 and RMSNorm gains drawn around 1, so every tensor
     moves the loss; rope_theta 500000, which transformers 5 keeps in rope_parameters) is saved
     with save_pretrained in several safetensors shards. `grass eval` reads that directory's
     config.json as its model config and the directory as --weights; a `grass train` run with
     init_from the directory logs its first step's loss (before the update) on the first
     micro-batch. Each must equal transformers' float32 loss on the same tokens.
Every comparison must agree within --tol relative (default 1e-5).
Exit status 0 when every one agrees, 1 otherwise.
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
import transformers
from transformers import LlamaConfig, LlamaForCausalLM

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tools", "reference"))
import check_export as C  # noqa: E402  (the token shard format and the evaluation windows)

IGNORE = -100  # transformers' ignore index
# transformers 4.56 renamed from_pretrained's torch_dtype to dtype (5.x warns on the old name).
DTYPE_ARG = "dtype" if tuple(int(x) for x in transformers.__version__.split(".")[:2]) >= (4, 56) \
    else "torch_dtype"


def run(cmd, **kw):
    print("+", " ".join(cmd), flush=True)
    return subprocess.run(cmd, check=True, **kw)


def load_transformers(hf_dir, dtype):
    return LlamaForCausalLM.from_pretrained(hf_dir, **{DTYPE_ARG: dtype}).eval()


def summed_loss(model, ids, tgt):
    with torch.no_grad():
        logits = model(input_ids=ids).logits.to(torch.float64)
    return float(F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1),
                                 ignore_index=IGNORE, reduction="sum"))


def transformers_loss(hf_dir, dtype, tokens, n_targets, T):
    """Mean cross-entropy over targets 1..n_targets of the stream, grass's windows, in `dtype`."""
    model = load_transformers(hf_dir, dtype)
    total, counted = 0.0, 0
    for ids, tgt in C.eval_windows(tokens, n_targets, T, IGNORE):
        total += summed_loss(model, ids, tgt)
        counted += int((tgt != IGNORE).sum())
    assert counted == n_targets, (counted, n_targets)
    return total / n_targets


def first_batch_loss(hf_dir, tokens, batch, T):
    """Mean cross-entropy of a run's first micro-batch with data.shuffle false: window i is
    tokens i*T .. i*T + T, predicting the next token of each."""
    windows = torch.tensor([tokens[i * T:i * T + T + 1] for i in range(batch)], dtype=torch.long)
    model = load_transformers(hf_dir, torch.float32)
    return summed_loss(model, windows[:, :-1], windows[:, 1:]) / (batch * T)


def save_transformers_model(model_cfg, hf_dir, seed):
    """transformers' own LlamaForCausalLM, randomly initialised, saved in several shards."""
    torch.manual_seed(seed)
    config = LlamaConfig(**dict(model_cfg, initializer_range=0.2, rope_theta=500000.0))
    model = LlamaForCausalLM(config)
    with torch.no_grad():  # transformers sets the gains to 1: draw them, so they matter too
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.add_(0.1 * torch.randn_like(p))
    model.save_pretrained(hf_dir, safe_serialization=True, max_shard_size="40KB")
    shards = [f for f in os.listdir(hf_dir) if f.endswith(".safetensors")]
    index = os.path.join(hf_dir, "model.safetensors.index.json")
    assert len(shards) > 1 and os.path.exists(index), shards
    return len(shards)


def write_run(work, name, run_cfg):
    path = os.path.join(work, name + ".json")
    with open(path, "w") as f:
        json.dump(run_cfg, f)
    return path


def grass_eval(grass, run_path, weights):
    return json.loads(run([grass, "eval", run_path, "--weights", weights, "--json"],
                          stdout=subprocess.PIPE, text=True).stdout)["val_loss"]


class Comparison:
    """The table of losses, each checked against --tol unless it is for information."""

    def __init__(self, tol):
        self.tol, self.rows, self.failed = tol, [], False

    def add(self, weights, dtype, engine, theirs, information=False):
        rel = abs(engine - theirs) / abs(theirs)
        verdict = "(information)" if information else ("ok" if rel <= self.tol else "FAIL")
        self.failed |= verdict == "FAIL"
        self.rows.append((weights, dtype, engine, theirs, rel, verdict))


def grass_to_transformers(grass, work, shard, stream, model_cfg, args, table):
    """grass trains and exports; transformers loads each export."""
    T = args.seq_len
    for tied in (False, True):
        name = "tied" if tied else "untied"
        out_dir = os.path.join(work, "run_" + name)
        run_path = write_run(work, name, {
            "model": dict(model_cfg, tie_word_embeddings=tied),
            "data": {"train": shard, "val": shard},
            "optimizer": {"name": "adamw", "lr": 1e-2, "betas": [0.9, 0.95]},
            "schedule": {"name": "constant"}, "micro_batch_size": 2, "seq_len": T,
            "steps": 6, "seed": 3, "out_dir": out_dir, "eval_tokens": args.tokens,
            "checkpoint_every": 6})
        run([grass, "train", run_path], stdout=subprocess.DEVNULL)
        for dtype in ("fp32", "bf16"):
            hf = os.path.join(work, f"hf_{name}_{dtype}")
            run([grass, "export", "--checkpoint", out_dir, "--out", hf, "--dtype", dtype],
                stdout=subprocess.DEVNULL)
            engine = grass_eval(grass, run_path, hf)
            export = f"grass export, {name}, {dtype}: eval"
            table.add(export, "float32", engine,
                      transformers_loss(hf, torch.float32, stream, args.tokens, T))
            if dtype == "bf16":
                table.add(export, "bfloat16", engine,
                          transformers_loss(hf, torch.bfloat16, stream, args.tokens, T),
                          information=True)


def transformers_to_grass(grass, work, shard, stream, model_cfg, args, table):
    """transformers initialises and saves; grass evaluates it and starts a run from it."""
    T, batch = args.seq_len, 2
    hf = os.path.join(work, "hf_saved_by_transformers")
    shards = save_transformers_model(model_cfg, hf, seed=5)
    saved = f"transformers save_pretrained, {shards} shards"
    # The runs' model config is the config.json transformers wrote.
    config_json = os.path.join(hf, "config.json")
    eval_path = write_run(work, "eval_saved", {
        "model": config_json, "data": {"train": shard, "val": shard}, "seq_len": T,
        "eval_tokens": args.tokens, "out_dir": os.path.join(work, "eval_saved")})
    table.add(saved + ": eval", "float32", grass_eval(grass, eval_path, hf),
              transformers_loss(hf, torch.float32, stream, args.tokens, T))

    out_dir = os.path.join(work, "run_init_from")
    init_path = write_run(work, "init_from", {
        "model": config_json, "data": {"train": shard, "shuffle": False}, "init_from": hf,
        "micro_batch_size": batch, "seq_len": T, "steps": 1, "out_dir": out_dir})
    run([grass, "train", init_path], stdout=subprocess.DEVNULL)
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        first_step = json.loads(f.readline())
    assert first_step["step"] == 1, first_step
    table.add(saved + ": init_from, step 1 loss", "float32", first_step["loss"],
              first_batch_loss(hf, stream, batch, T))


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

    work = tempfile.mkdtemp(prefix="grass_transformers_check_")
    try:
        shard = os.path.join(work, "data.bin")
        run([maker, "--out", shard, "--vocab", str(model_cfg["vocab_size"]), "--tokens", "6000",
             "--ngrams", "16", "--ngram-len", "6", "--seed", "7"], stdout=subprocess.DEVNULL)
        stream = C.read_shard(shard)
        table = Comparison(args.tol)
        grass_to_transformers(grass, work, shard, stream, model_cfg, args, table)
        transformers_to_grass(grass, work, shard, stream, model_cfg, args, table)
        print(f"\ntransformers {transformers.__version__}, torch {torch.__version__}; "
              f"{args.tokens} targets, seq_len {args.seq_len}; tolerance {args.tol:g}")
        print("| weights: check | transformers dtype | grass loss | transformers loss | rel. diff | |")
        print("|---|---|---|---|---|---|")
        for weights, dtype, engine, theirs, rel, verdict in table.rows:
            print(f"| {weights} | {dtype} | {engine:.9f} | {theirs:.9f} | {rel:.2e} | {verdict} |")
        sys.exit(1 if table.failed else 0)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
