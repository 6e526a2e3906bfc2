#!/usr/bin/env bash
# `grass sample` as a user meets it: a quickstart-shaped model trained 4 steps on the bundled C4
# sample with its tokenizer, sampled from the run's out_dir, its checkpoint and its Hugging Face
# export. A fixed seed repeats its text and another seed changes it; --top-k 1 is --greedy; the
# export samples what the checkpoint does; a short max_position_embeddings slides the window;
# errors are one line, exit 2. With GRASS_EMU (grass_emu), the emulated CUDA backend samples too.
# Run by ctest with GRASS=<path to the grass binary>, from the source directory.
set -uo pipefail
: "${GRASS:?set GRASS to the grass binary}"
source "$(dirname "$0")/cli_lib.sh"

# The samples' text (stdout without the settings line), or "FAILED" when grass fails.
texts() {
  "$GRASS" sample "$@" --device cpu >"$tmp/out" 2>"$tmp/err" || { echo FAILED; cat "$tmp/err" >&2; return; }
  tail -n +2 "$tmp/out"
}

tokenizer=data/c4_sample/tokenizer.model
"$GRASS" prepare --input data/c4_sample/c4-train.00000-of-00001.json.gz --tokenizer "$tokenizer" \
  --out "$tmp/shards" --max-docs 200 --quiet >/dev/null || { echo "FAIL: prepare"; exit 1; }
cat >"$tmp/run.json" <<EOF
{
  "model": "configs/models/llama_quickstart.json",
  "data": {"train": "$tmp/shards/shard_00000.bin", "tokenizer": "$tokenizer"},
  "optimizer": {"name": "adamw", "lr": 0.003},
  "micro_batch_size": 2, "seq_len": 64, "steps": 4, "precision": "fp32", "device": "cpu",
  "out_dir": "$tmp/run", "checkpoint_every": 4, "log_every": 4
}
EOF
"$GRASS" train "$tmp/run.json" >"$tmp/train.log" 2>&1 || { echo "FAIL: train"; cat "$tmp/train.log"; exit 1; }
checkpoint=$(ls -d "$tmp"/run/checkpoints/step_* | tail -n 1)
"$GRASS" export --checkpoint "$checkpoint" --out "$tmp/hf" >/dev/null || { echo "FAIL: export"; exit 1; }

expect 0 "usage: grass sample" -- sample --help
expect 0 "sample <weights>" -- --help

# The settings line names the weights (the run's newest checkpoint), the tokenizer that came with
# them and the draws; each sample is the prompt and its continuation.
prompt="The meaning of"
expect 0 "sample | weights checkpoint $checkpoint (step 4) | tokenizer $checkpoint/tokenizer.model | temperature 0.8, top-k 200, seed 5 | up to 12 new tokens x 2 samples" \
  -- sample "$tmp/run" --prompt "$prompt" --tokens 12 --samples 2 --seed 5 --device cpu
grep -q "^--- sample 2: " "$tmp/stdout" && [ "$(grep -c "^$prompt" "$tmp/stdout")" = 2 ] && pass ||
  { fail "two samples that start with the prompt expected:"; cat "$tmp/stdout"; }

# A fixed seed gives the same text, another seed another.
first=$(texts "$tmp/run" --prompt "$prompt" --tokens 12 --samples 2 --seed 5)
again=$(texts "$tmp/run" --prompt "$prompt" --tokens 12 --samples 2 --seed 5)
other=$(texts "$tmp/run" --prompt "$prompt" --tokens 12 --samples 2 --seed 6)
[ "$first" != FAILED ] && [ "$first" = "$again" ] && pass || fail "seed 5 twice gave different text:
$first
---
$again"
[ "$other" != FAILED ] && [ "$first" != "$other" ] && pass || fail "seeds 5 and 6 gave the same text: $first"

# --top-k 1 is greedy, whatever the temperature and seed; the export samples as its checkpoint.
greedy=$(texts "$tmp/run" --prompt "$prompt" --tokens 12 --greedy)
top1=$(texts "$checkpoint" --prompt "$prompt" --tokens 12 --top-k 1 --temperature 0.5 --seed 9)
exported=$(texts "$tmp/hf" --prompt "$prompt" --tokens 12 --greedy)
[ "$greedy" != FAILED ] && [ "$greedy" = "$top1" ] && pass || fail "--top-k 1 differs from --greedy:
$greedy
---
$top1"
[ "$exported" = "$greedy" ] && pass || fail "the export's greedy text differs from its checkpoint's:
$exported
---
$greedy"
expect 0 "weights Hugging Face model $tmp/hf | tokenizer $tmp/hf/tokenizer.model | greedy" \
  -- sample "$tmp/hf" --tokens 2 --greedy --device cpu

# max_position_embeddings 16: the context stops growing at 16 tokens and the window slides.
sed 's/"max_position_embeddings": 256/"max_position_embeddings": 16/' \
  configs/models/llama_quickstart.json >"$tmp/short.json"
expect 0 "context 16 tokens, then slides (max_position_embeddings)" \
  -- sample "$tmp/hf" --config "$tmp/short.json" --prompt "$prompt" --tokens 20 --greedy --device cpu
grep -q "^--- sample 1: 20 new tokens ---" "$tmp/stdout" && pass || { fail "20 new tokens expected:"; cat "$tmp/stdout"; }

# The CUDA backend on the emulator (tests/cuda_emu), where ctest names it: the command runs
# through Backend there too, and a seed repeats its text.
if [ -x "${GRASS_EMU:-}" ]; then
  emulated() {
    OMP_NUM_THREADS=1 "$GRASS_EMU" sample "$tmp/run" --device cuda --prompt "$prompt" --tokens 8 \
      --samples 2 --seed 5 2>&1
  }
  one=$(emulated)
  two=$(emulated)
  grep -q "| cuda, cuda_emu" <<<"$one" && grep -q "^--- sample 2: " <<<"$one" && [ "$one" = "$two" ] &&
    pass || fail "the emulated CUDA backend's samples:
$one
---
$two"
fi

# Errors: one line, exit 2.
mkdir -p "$tmp/no_tokenizer" "$tmp/no_weights" "$tmp/no_config"
cp "$tmp/hf/config.json" "$tmp/hf/model.safetensors" "$tmp/no_tokenizer/"
cp "$tmp/run/config.json" "$tmp/no_weights/"
cp "$tmp/hf/model.safetensors" "$tmp/no_config/"
expect 2 "$tmp/no_tokenizer: no tokenizer.model with the weights" -- sample "$tmp/no_tokenizer" --device cpu
expect 0 "tokenizer $tokenizer" -- sample "$tmp/no_tokenizer" --tokenizer "$tokenizer" --tokens 2 --device cpu
expect 2 "$tmp/no_weights: no weights there" -- sample "$tmp/no_weights" --device cpu
expect 2 "$tmp/nothing: not found" -- sample "$tmp/nothing" --device cpu
expect 2 "$tmp/no_config/model.safetensors: no config.json beside the weights" -- sample "$tmp/no_config/model.safetensors" --device cpu
expect 2 "4096 pieces, more than the model's vocab_size 512" \
  -- sample "$tmp/run" --config configs/models/llama_tiny.json --tokenizer "$tokenizer" --device cpu
expect 2 "unknown option --topk" -- sample "$tmp/run" --topk 5
expect 2 "--greedy takes the most likely token; it has no --temperature" -- sample "$tmp/run" --greedy --temperature 0.5
expect 2 "--temperature 0: expected a number > 0" -- sample "$tmp/run" --temperature 0
expect 2 "--device gpu: expected one of" -- sample "$tmp/run" --device gpu
expect 2 "missing <weights>" -- sample --prompt "$prompt"

finish cli_sample
