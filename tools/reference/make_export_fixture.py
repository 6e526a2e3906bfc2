#!/usr/bin/python3
"""Generate tests/fixtures/export_ref/: `grass export` output that the PyTorch reference loaded.

Drives the real binary, then checks its output with the independent reference:
  1. trains the tiny_ref model (tests/fixtures/tiny_ref/config.json: GQA, untied, vocab 96) for
     6 AdamW steps on a synthetic shard with checkpoint_every 6;
  2. `grass export --dtype fp32` and `--dtype bf16` of the final checkpoint;
  3. loads each export as Hugging Face would (check_export.load_hf_dir: config.json keys,
     __metadata__ {"format": "pt"}, HF tensor names, shapes, dtypes);
  4. computes, in float64, the loss over the first EVAL_TOKENS targets of the validation shard
     and checks it against `grass eval --weights <export> --json` (relative error <= 1e-5),
     and checks that the fp32 export gives exactly the loss of the run's own final evaluation;
  5. writes the two exports and the reference's float64 loss on a fixed token batch.

tests/test_export.cpp then needs no torch: it loads the committed exports into the engine and
matches these losses (1e-5), and it exports the same weights again and requires model.safetensors
byte for byte equal to the files the reference loaded here.

Usage: tools/reference/make_export_fixture.py [--grass build/grass] [--out DIR]
(without --out it rewrites tests/fixtures/export_ref). tests/export_torch.sh runs it into a
temporary directory as a ctest when /usr/bin/python3 has torch.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_export as C  # noqa: E402
import llama_ref as L  # noqa: E402
import safetensors_io as st  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
SEED = 20240612
B, T = 2, 16
EVAL_TOKENS = 500  # not a multiple of T: the last evaluation window is partial
TOL = 1e-5


def run(cmd, **kw):
    print("+", " ".join(cmd), flush=True)
    return subprocess.run(cmd, check=True, **kw)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--grass", default=os.path.join(ROOT, "build", "grass"))
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "fixtures", "export_ref"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    grass = os.path.abspath(args.grass)
    maker = os.path.join(os.path.dirname(grass), "make_synthetic_shard")
    with open(os.path.join(ROOT, "tests", "fixtures", "tiny_ref", "config.json")) as f:
        model_cfg = json.load(f)

    work = tempfile.mkdtemp(prefix="grass_export_fixture_")
    try:
        shard = os.path.join(work, "data.bin")
        run([maker, "--out", shard, "--vocab", "96", "--tokens", "6000", "--ngrams", "16",
             "--ngram-len", "6", "--seed", "7"], stdout=subprocess.DEVNULL)
        out_dir = os.path.join(work, "run")
        run_cfg = {"model": model_cfg, "data": {"train": shard, "val": shard},
                   "optimizer": {"name": "adamw", "lr": 1e-2, "betas": [0.9, 0.95]},
                   "schedule": {"name": "constant"}, "micro_batch_size": 2, "seq_len": T,
                   "steps": 6, "seed": 3, "out_dir": out_dir, "eval_tokens": EVAL_TOKENS,
                   "checkpoint_every": 6}
        run_path = os.path.join(work, "run.json")
        with open(run_path, "w") as f:
            json.dump(run_cfg, f)
        run([grass, "train", run_path], stdout=subprocess.DEVNULL)
        with open(os.path.join(out_dir, "metrics.jsonl")) as f:
            final_eval = [json.loads(line) for line in f if '"eval"' in line][-1]

        gen = torch.Generator().manual_seed(SEED)
        tokens = torch.randint(0, model_cfg["vocab_size"], (B, T + 1), generator=gen, dtype=torch.int64)
        input_ids, targets = tokens[:, :-1], tokens[:, 1:].clone()
        targets[0, 3] = L.IGNORE_INDEX  # one ignored target, as the engine allows
        stream = C.read_shard(shard)

        expected = {"input_ids": input_ids.contiguous(), "targets": targets.contiguous()}
        meta = {"batch": B, "seq_len": T, "eval_tokens": EVAL_TOKENS, "tolerance": TOL,
                "generated_by": "tools/reference/make_export_fixture.py",
                "torch_version": torch.__version__, "run_config": dict(run_cfg, data="<synthetic>",
                                                                       out_dir="<tmp>")}
        for dtype in ("fp32", "bf16"):
            hf = os.path.join(work, "hf_" + dtype)
            run([grass, "export", "--checkpoint", out_dir, "--out", hf, "--dtype", dtype],
                stdout=subprocess.DEVNULL)
            cfg, params, tag = C.load_hf_dir(hf)
            assert tag == {"fp32": "F32", "bf16": "BF16"}[dtype], tag
            engine = json.loads(run([grass, "eval", run_path, "--weights", hf, "--json"],
                                    stdout=subprocess.PIPE, text=True).stdout)["val_loss"]
            ref = C.eval_loss(params, cfg, stream, EVAL_TOKENS, T)
            rel = abs(engine - ref) / ref
            print(f"{dtype}: validation loss engine {engine!r} reference {ref!r} rel err {rel:.3g}")
            assert rel <= TOL, f"{dtype}: the engine and the reference disagree ({rel:.3g})"
            if dtype == "fp32":
                assert engine == final_eval["val_loss"], (engine, final_eval)  # lossless export
            _, loss = L.forward(params, cfg, input_ids, targets)
            expected["loss_" + dtype] = loss.reshape(1).to(torch.float64)
            meta[f"val_loss_{dtype}"] = {"engine": engine, "reference": ref, "rel_err": rel}
            print(f"{dtype}: reference loss on the fixed batch {float(loss)!r}")

        os.makedirs(args.out, exist_ok=True)
        for dtype in ("fp32", "bf16"):
            dst = os.path.join(args.out, "hf_" + dtype)
            shutil.rmtree(dst, ignore_errors=True)
            os.makedirs(dst)
            for name in ("config.json", "model.safetensors"):
                shutil.copy(os.path.join(work, "hf_" + dtype, name), dst)
        st.save_file(expected, os.path.join(args.out, "expected.safetensors"))
        with open(os.path.join(args.out, "fixture.json"), "w") as f:
            json.dump(meta, f, indent=2)
            f.write("\n")
        print(f"wrote {args.out}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
