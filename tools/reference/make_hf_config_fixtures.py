#!/usr/bin/env python3
"""Writes the config.json Hugging Face transformers saves with a tiny GQA LLaMA, as a fixture.

Run it with the python of an environment that has torch and the transformers version wanted
(tests/fixtures/hf_configs/README.md lists the commands). It builds LlamaForCausalLM from a
LlamaConfig that sets only the shape (GQA: 6 query heads, 2 key/value heads) and a rope_theta
other than the default, so a reader that misses where a version keeps θ is caught; saves the model
with save_pretrained, as a user would; and copies the config.json it wrote, byte for byte, to
tests/fixtures/hf_configs/transformers_<version>.json: "4.40" for 4.40.x, "5.x" for the whole 5
line (kept at its newest release). transformers_version inside names the exact release.
Usage: <venv>/bin/python tools/reference/make_hf_config_fixtures.py [--out FILE]
"""
import argparse
import os
import shutil
import tempfile

import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

# tests/test_hf_config.cpp expects exactly this model from every fixture.
TINY_GQA = dict(vocab_size=96, hidden_size=48, intermediate_size=86, num_attention_heads=6,
                num_key_value_heads=2, num_hidden_layers=2, max_position_embeddings=64,
                rms_norm_eps=1e-5, rope_theta=500000.0)


def fixture_name(version):
    major, minor = version.split(".")[:2]
    line = f"{major}.{minor}" if int(major) < 5 else f"{major}.x"
    return f"transformers_{line}.json"


def main():
    default_out = os.path.join(ROOT, "tests", "fixtures", "hf_configs",
                               fixture_name(transformers.__version__))
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=default_out, help="default: %(default)s")
    out = ap.parse_args().out
    model = LlamaForCausalLM(LlamaConfig(**TINY_GQA))
    work = tempfile.mkdtemp(prefix="hf_config_fixture_")
    try:
        model.save_pretrained(work)
        shutil.copyfile(os.path.join(work, "config.json"), out)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"transformers {transformers.__version__}, torch {torch.__version__}: {out}")


if __name__ == "__main__":
    main()
