#!/usr/bin/env bash
# data.train / data.val as a user writes them for real data sets: a glob of shards trains (the
# start-up table counts them, config.json keeps the glob); a spec without shards, a broken
# manifest, shards of different tokenizers (within data.train, data.val against data.train, and in
# grass eval) and a model vocabulary smaller than the tokenizer's are each one error line, exit 2;
# a larger one is a warning; grass mem plans a run whose data is not on this machine.
# Run by ctest with GRASS=<grass> and MAKE_SHARD=<make_synthetic_shard>, from the source directory.
set -uo pipefail
: "${GRASS:?set GRASS to the grass binary}" "${MAKE_SHARD:?set MAKE_SHARD to make_synthetic_shard}"
source "$(dirname "$0")/cli_lib.sh"

check() {  # check <description> <command...>
  local what=$1; shift
  if "$@"; then pass; else fail "$what"; fi
}

# shard <path> <vocab> <tokenizer hash> <seed>
shard() { "$MAKE_SHARD" --out "$1" --vocab "$2" --tokens 20000 --tokenizer-hash "$3" --seed "$4" >/dev/null; }
mkdir -p "$tmp/c4/tokens" "$tmp/mixed"
shard "$tmp/c4/tokens/train_00000.bin" 500 7 1
shard "$tmp/c4/tokens/train_00001.bin" 500 7 2
shard "$tmp/c4/tokens/val_00000.bin" 500 7 3
shard "$tmp/mixed/a.bin" 512 7 4
shard "$tmp/mixed/b.bin" 512 8 5
shard "$tmp/wide.bin" 1000 0 6

cat >"$tmp/run.json" <<JSON
{"model": "configs/models/llama_tiny.json",
 "data": {"train": "$tmp/c4/tokens/train_*.bin", "val": "$tmp/c4/tokens/val_00000.bin"},
 "device": "cpu", "micro_batch_size": 2, "total_batch_size": 2, "seq_len": 32, "steps": 2,
 "log_every": 1, "eval_tokens": 256, "out_dir": "$tmp/run"}
JSON

# a glob of two shards trains; the tokenizer's 500 tokens under the model's 512 are a warning
expect 0 "data          2 shard(s), 0.04 M tokens" -- train "$tmp/run.json"
check "the larger model vocabulary is one warning" \
  test "$(grep -c "^warning: configs/models/llama_tiny.json: vocab_size 512 is larger than the tokenizer's vocabulary of 500 tokens" "$tmp/err")" = 1
check "config.json keeps the glob as written" grep -qF "$tmp/c4/tokens/train_*.bin" "$tmp/run/config.json"
check "two steps were logged" test "$(grep -c '"step"' "$tmp/run/metrics.jsonl")" -ge 2

# specs without shards, and manifests that do not match their shards
expect 2 "data.train: no shard matches no/such/train_*.bin (relative paths resolve against the working directory, $PWD)" \
  -- train "$tmp/run.json" --set "data.train=no/such/train_*.bin" --set out_dir="$tmp/x"
expect 2 "data.val: not found: $tmp/c4/val.bin" -- train "$tmp/run.json" --set data.val="$tmp/c4/val.bin" --set out_dir="$tmp/x"
printf '{"format": "grass-prepare", "version": 1, "tokenizer": {"vocab_size": 500},\n "shards": [{"file": "train_00000.bin", "tokens": 20000}, {"file": "train_00002.bin", "tokens": 20000}]}\n' \
  >"$tmp/c4/tokens/train.manifest.json"
expect 2 "data.train: $tmp/c4/tokens/train.manifest.json lists $tmp/c4/tokens/train_00002.bin, which is missing" \
  -- train "$tmp/run.json" --set data.train="$tmp/c4/tokens/train.manifest.json" --set out_dir="$tmp/x"
printf '{"format": "grass-prepare", "version": 1, "tokenizer": {"vocab_size": 500},\n "shards": [{"file": "val_00000.bin", "tokens": 19000}]}\n' \
  >"$tmp/c4/tokens/val.manifest.json"
expect 2 "records 19000 tokens (38256 bytes) for $tmp/c4/tokens/val_00000.bin, but the file has 40256 bytes" \
  -- train "$tmp/run.json" --set data.val="$tmp/c4/tokens/val.manifest.json" --set out_dir="$tmp/x"
expect 2 "data.train: the directory $tmp/c4/tokens holds 2 manifests (train.manifest.json, val.manifest.json)" \
  -- train "$tmp/run.json" --set data.train="$tmp/c4/tokens" --set out_dir="$tmp/x"

# shards of different tokenizers: within data.train, data.val against data.train, and in eval
expect 2 "data.train: $tmp/mixed/b.bin was made with another tokenizer than $tmp/mixed/a.bin" \
  -- train "$tmp/run.json" --set data.train="$tmp/mixed/*.bin" --set data.val="$tmp/mixed/a.bin" --set out_dir="$tmp/x"
expect 2 "data.val's $tmp/mixed/b.bin was made with another tokenizer than data.train's $tmp/mixed/a.bin" \
  -- train "$tmp/run.json" --set data.train="$tmp/mixed/a.bin" --set data.val="$tmp/mixed/b.bin" --set out_dir="$tmp/x"
expect 2 "data.val: $tmp/mixed/b.bin was made with another tokenizer than $tmp/mixed/a.bin" \
  -- eval "$tmp/run.json" --set data.val="$tmp/mixed/*.bin"

# the model's vocabulary smaller than the tokenizer's
expect 2 "configs/models/llama_tiny.json: vocab_size 512 is smaller than the tokenizer's vocabulary of 1000 tokens (data.train's $tmp/wide.bin)" \
  -- train "$tmp/run.json" --set data.train="$tmp/wide.bin" --set out_dir="$tmp/x"
check "no refused run created its out_dir" test ! -e "$tmp/x"

# grass mem needs the model, not the data
expect 0 "" -- mem "$tmp/run.json" --set data.train="elsewhere/c4/train_*.bin" --set data.tokenizer=elsewhere/c4.model

finish cli_data_sets
