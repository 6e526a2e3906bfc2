#!/usr/bin/python3
"""Load a `grass export` directory the way Hugging Face would, and score it with the reference.

Checks the directory as transformers' LlamaForCausalLM.from_pretrained reads it:
  * config.json: architectures ["LlamaForCausalLM"], model_type "llama", torch_dtype matching
    the weights, and a config llama_ref.normalize_config accepts;
  * model.safetensors (or model.safetensors.index.json + shards): __metadata__ {"format": "pt"},
    exactly the tensor names and shapes of llama_ref.param_shapes(config), one float dtype;
  * tokenizer.model + tokenizer_config.json (tokenizer_class LlamaTokenizer) when present, or
    required with --require-tokenizer.
Then computes, in float64, the mean cross-entropy over the first N targets of a grass token shard
with grass's evaluation protocol (windows of T+1 tokens at stride T, the last one padded), and
compares it with the loss the engine reported (--expect-loss, relative error <= --tol).

Usage:
  check_export.py HF_DIR --shard val.bin --tokens N --seq-len T [--expect-loss X] [--tol 1e-5]
Prints `reference_loss <value>`; exit code 1 when a check fails.
If `transformers` happens to be importable, the directory is also loaded with
LlamaForCausalLM.from_pretrained and its logits compared with the reference's.
"""
import argparse
import json
import math
import os
import struct
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llama_ref as L  # noqa: E402
import safetensors_io as st  # noqa: E402

TORCH_DTYPES = {"float32": "F32", "bfloat16": "BF16", "float16": "F16"}


class ExportError(Exception):
    pass


def require(cond, message):
    if not cond:
        raise ExportError(message)


def load_hf_dir(path, require_tokenizer=False):
    """Returns (config dict, {name: float64 tensor}, dtype tag). Raises ExportError."""
    cfg_path = os.path.join(path, "config.json")
    require(os.path.exists(cfg_path), f"{cfg_path}: missing")
    with open(cfg_path) as f:
        cfg = json.load(f)
    require(cfg.get("architectures") == ["LlamaForCausalLM"],
            f"{cfg_path}: architectures is {cfg.get('architectures')!r}, expected ['LlamaForCausalLM']")
    require(cfg.get("model_type") == "llama", f"{cfg_path}: model_type is {cfg.get('model_type')!r}")
    require(cfg.get("torch_dtype") in TORCH_DTYPES, f"{cfg_path}: torch_dtype {cfg.get('torch_dtype')!r}")
    require(cfg.get("hidden_act", "silu") == "silu", f"{cfg_path}: hidden_act")
    L.normalize_config(cfg)

    index_path = os.path.join(path, "model.safetensors.index.json")
    files = {}
    if os.path.exists(index_path):
        with open(index_path) as f:
            weight_map = json.load(f)["weight_map"]
        for name, shard in weight_map.items():
            files.setdefault(shard, []).append(name)
    else:
        files["model.safetensors"] = None
    tensors = {}
    for shard, names in files.items():
        loaded, meta = st.load_file(os.path.join(path, shard), with_metadata=True)
        require(meta == {"format": "pt"}, f"{shard}: __metadata__ is {meta!r}, expected {{'format': 'pt'}}")
        for name in (names if names is not None else loaded):
            tensors[name] = loaded[name]

    want = L.param_shapes(cfg)
    require(set(tensors) == set(want),
            f"tensor names differ from a LlamaForCausalLM's: missing {sorted(set(want) - set(tensors))}, "
            f"unexpected {sorted(set(tensors) - set(want))}")
    tag = TORCH_DTYPES[cfg["torch_dtype"]]
    for name, shape in want.items():
        t = tensors[name]
        require(tuple(t.shape) == tuple(shape), f"{name}: shape {list(t.shape)}, expected {list(shape)}")
        require(st.TAGS[t.dtype] == tag, f"{name}: dtype {st.TAGS[t.dtype]}, config says {cfg['torch_dtype']}")

    tok_model = os.path.join(path, "tokenizer.model")
    tok_cfg = os.path.join(path, "tokenizer_config.json")
    if require_tokenizer or os.path.exists(tok_model) or os.path.exists(tok_cfg):
        require(os.path.exists(tok_model), f"{tok_model}: missing")
        require(os.path.exists(tok_cfg), f"{tok_cfg}: missing")
        with open(tok_cfg) as f:
            tc = json.load(f)
        require(tc.get("tokenizer_class") == "LlamaTokenizer",
                f"{tok_cfg}: tokenizer_class {tc.get('tokenizer_class')!r}")
    return cfg, {k: v.to(torch.float64) for k, v in tensors.items()}, tag


def read_shard(path):
    """Token ids of a grass token shard (docs/formats.md: 256-byte header, then tokens)."""
    with open(path, "rb") as f:
        raw = f.read()
    require(raw[:8] == b"GRASSTOK", f"{path}: not a grass token shard")
    token_bytes, count = struct.unpack_from("<IQ", raw, 12)
    require(len(raw) == 256 + count * token_bytes, f"{path}: size does not match its header")
    fmt = {2: "H", 4: "I"}[token_bytes]
    return list(struct.unpack_from(f"<{count}{fmt}", raw, 256))


def eval_windows(tokens, n_targets, T, ignore_index, batch=8):
    """grass's Evaluator protocol: batches of (inputs, targets) [b, T] over targets 1..n_targets
    of the stream, windows of T+1 tokens at stride T, the last one padded (its targets ignored)."""
    windows = (n_targets + T - 1) // T
    for first in range(0, windows, batch):
        ids, tgt = [], []
        for w in range(first, min(windows, first + batch)):
            off = w * T
            needed = min(T, n_targets - off)
            win = tokens[off:off + needed + 1]
            ids.append([win[t] if t < needed else 0 for t in range(T)])
            tgt.append([win[t + 1] if t < needed else ignore_index for t in range(T)])
        yield torch.tensor(ids, dtype=torch.int64), torch.tensor(tgt, dtype=torch.int64)


def eval_loss(params, cfg, tokens, n_targets, seq_len):
    """grass's Evaluator protocol in float64: mean CE over targets 1..n_targets of the stream."""
    total = 0.0
    counted = 0
    for ids, tgt in eval_windows(tokens, n_targets, seq_len, L.IGNORE_INDEX):
        logits, _ = L.forward(params, cfg, ids)
        ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1),
                             ignore_index=L.IGNORE_INDEX, reduction="sum")
        total += float(ce)
        counted += int((tgt != L.IGNORE_INDEX).sum())
    assert counted == n_targets, (counted, n_targets)
    return total / n_targets


def transformers_crosscheck(path, params, cfg):
    """When transformers is installed: its LlamaForCausalLM on the directory gives our logits."""
    try:
        from transformers import LlamaForCausalLM  # noqa: F401
    except Exception:
        print("transformers: not installed; loaded with the plain reference only")
        return
    model = LlamaForCausalLM.from_pretrained(path, torch_dtype=torch.float64)
    ids = torch.arange(0, 8, dtype=torch.int64).remainder(cfg["vocab_size"]).reshape(1, 8)
    theirs = model(ids).logits
    ours, _ = L.forward(params, cfg, ids)
    err = float((theirs - ours).abs().max() / ours.abs().max())
    print(f"transformers: LlamaForCausalLM.from_pretrained logits vs reference, max rel err {err:.3g}")
    require(err < 1e-6, "transformers disagrees with the reference")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("hf_dir")
    ap.add_argument("--shard", required=True)
    ap.add_argument("--tokens", type=int, required=True)
    ap.add_argument("--seq-len", type=int, required=True)
    ap.add_argument("--expect-loss", type=float)
    ap.add_argument("--tol", type=float, default=1e-5)
    ap.add_argument("--require-tokenizer", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)
    try:
        cfg, params, tag = load_hf_dir(args.hf_dir, args.require_tokenizer)
        transformers_crosscheck(args.hf_dir, params, cfg)
        loss = eval_loss(params, cfg, read_shard(args.shard), args.tokens, args.seq_len)
        print(f"{args.hf_dir}: {tag}, {len(params)} tensors, reference_loss {loss!r}")
        if args.expect_loss is not None:
            rel = abs(loss - args.expect_loss) / abs(loss)
            print(f"engine loss {args.expect_loss!r}, relative error {rel:.3g} (tolerance {args.tol:g})")
            require(rel <= args.tol, "the engine's loss and the reference's differ")
    except ExportError as e:
        print(f"FAIL: {e}")
        sys.exit(1)


if __name__ == "__main__":
    main()
