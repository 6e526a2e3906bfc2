#!/usr/bin/env bash
# The CLI as a user meets it: exit codes (0 ok, 2 user error), one-line error messages that name
# the file or field, and bad input that leaves an existing out_dir untouched.
# Run by ctest with GRASS=<path to the grass binary>, from the source directory.
set -uo pipefail
: "${GRASS:?set GRASS to the grass binary}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0
passes=0

# expect <exit code> <substring of stderr> -- <grass args...>
expect() {
  local want_code=$1 want_msg=$2
  shift 3
  "$GRASS" "$@" >"$tmp/stdout" 2>"$tmp/err"
  local code=$?
  local lines
  lines=$(wc -l <"$tmp/err")
  if [ "$code" != "$want_code" ]; then
    echo "FAIL: grass $* exited $code, expected $want_code"; cat "$tmp/err"; failures=$((failures + 1)); return
  fi
  if [ -n "$want_msg" ] && ! grep -qF -- "$want_msg" "$tmp/err"; then
    echo "FAIL: grass $*: stderr lacks \"$want_msg\":"; cat "$tmp/err"; failures=$((failures + 1)); return
  fi
  if [ "$want_code" = 2 ] && [ "$lines" != 1 ]; then
    echo "FAIL: grass $*: expected one error line, got $lines:"; cat "$tmp/err"; failures=$((failures + 1)); return
  fi
  passes=$((passes + 1))
}

# a valid run on a small synthetic shard, in the temp dir
"$(dirname "$GRASS")/make_synthetic_shard" --out "$tmp/train.bin" --vocab 512 --tokens 20000 >/dev/null
cat >"$tmp/run.json" <<JSON
{"model": "configs/models/llama_tiny.json", "data": {"train": "$tmp/train.bin"},
 "micro_batch_size": 2, "total_batch_size": 4, "seq_len": 32, "steps": 3,
 "out_dir": "$tmp/out", "log_every": 1}
JSON

expect 0 "" -- --help
expect 0 "" -- train --help
expect 0 "" -- tokenizer train --help
grep -q -- "--vocab-size" "$tmp/stdout" && passes=$((passes + 1)) || { echo "FAIL: tokenizer train --help should list its options"; failures=$((failures + 1)); }
expect 0 "" -- --version
head -1 "$tmp/stdout" | grep -Eq "^grass [0-9a-f]{12}|^grass unknown" && grep -q "CUDA backend" "$tmp/stdout" && grep -q "MPI" "$tmp/stdout" \
  && passes=$((passes + 1)) || { echo "FAIL: --version should name the commit and the build's options:"; cat "$tmp/stdout"; failures=$((failures + 1)); }
"$GRASS" >/dev/null 2>&1; [ $? = 2 ] && passes=$((passes + 1)) || { echo "FAIL: grass with no command should exit 2"; failures=$((failures + 1)); }
expect 2 'unknown command "trian"' -- trian x.json
expect 2 "missing <run.json>" -- train
expect 2 "$tmp/nope.json" -- train "$tmp/nope.json"
expect 2 'optimizer.weigth_decay' -- train "$tmp/run.json" --set optimizer.weigth_decay=0.1
expect 2 'did you mean "weight_decay"' -- train "$tmp/run.json" --set optimizer.weigth_decay=0.1
expect 2 'optimizer.lr' -- train "$tmp/run.json" --set optimizer.lr=fast
expect 2 'total_batch_size' -- train "$tmp/run.json" --set total_batch_size=5
expect 2 '--set' -- train "$tmp/run.json" --set steps
expect 2 'unknown option --sett' -- train "$tmp/run.json" --sett steps=1

# the model's vocabulary is smaller than the shard's tokens
cat >"$tmp/small_vocab.json" <<JSON
{"hidden_size": 32, "intermediate_size": 40, "num_attention_heads": 4, "num_hidden_layers": 1,
 "vocab_size": 100}
JSON
expect 2 "$tmp/train.bin" -- train "$tmp/run.json" --set model="$tmp/small_vocab.json"

# a truncated shard
head -c 1000 "$tmp/train.bin" >"$tmp/cut.bin"
expect 2 "$tmp/cut.bin" -- train "$tmp/run.json" --set data.train="$tmp/cut.bin"

# a good run writes config.json and one metrics line per step ...
expect 0 "" -- train "$tmp/run.json"
if [ "$(wc -l <"$tmp/out/metrics.jsonl")" != 3 ]; then
  echo "FAIL: metrics.jsonl should have 3 lines"; failures=$((failures + 1))
else passes=$((passes + 1)); fi
grep -q '"step":3' "$tmp/out/metrics.jsonl" && passes=$((passes + 1)) || { echo "FAIL: no step 3 row"; failures=$((failures + 1)); }
# ... and a later run with bad input leaves them as they were
before=$(md5sum "$tmp/out/metrics.jsonl" "$tmp/out/config.json")
expect 2 "$tmp/cut.bin" -- train "$tmp/run.json" --set data.train="$tmp/cut.bin"
after=$(md5sum "$tmp/out/metrics.jsonl" "$tmp/out/config.json")
[ "$before" = "$after" ] && passes=$((passes + 1)) || { echo "FAIL: bad input changed out_dir"; failures=$((failures + 1)); }

# memory: a cap the plan exceeds stops the run before out_dir exists, with the breakdown on stdout
expect 2 'memory_limit: the run plans' -- train "$tmp/run.json" --memory-limit 1MiB --set out_dir="$tmp/capped"
grep -q "memory plan of $tmp/run.json" "$tmp/stdout" && grep -q "optimizer" "$tmp/stdout" &&
  passes=$((passes + 1)) || { echo "FAIL: a refused run should print its breakdown"; failures=$((failures + 1)); }
[ ! -e "$tmp/capped" ] && passes=$((passes + 1)) || { echo "FAIL: a refused run created out_dir"; failures=$((failures + 1)); }
expect 2 'memory_limit: expected a size such as' -- train "$tmp/run.json" --memory-limit lots
# (a GPU plan: the tiny model's 35 MiB and the 1.26 GiB a card holds beyond it)
expect 0 "" -- mem "$tmp/run.json" --memory-limit 2GiB
head -1 "$tmp/stdout" | grep -q "^fits memory_limit 2.00 GiB: " && passes=$((passes + 1)) || { echo "FAIL: mem --memory-limit should say first that it fits"; failures=$((failures + 1)); }
expect 0 "" -- mem "$tmp/run.json" --json --memory-limit 2GiB
grep -q '"fits":true' "$tmp/stdout" && passes=$((passes + 1)) || { echo "FAIL: mem --json lacks fits"; failures=$((failures + 1)); }
expect 2 'fused_update: "on" needs one micro-batch per step' -- train "$tmp/run.json" --set fused_update=on
# grass mem --ranks: one rank's plan, and a batch the ranks cannot split named
expect 0 "" -- mem "$tmp/run.json" --ranks 2 --set total_batch_size=4 --set micro_batch_size=2
grep -q "one of 2 data-parallel ranks" "$tmp/stdout" && passes=$((passes + 1)) || { echo "FAIL: mem --ranks should name the ranks"; failures=$((failures + 1)); }
expect 2 'total_batch_size: 4 must be a multiple of micro_batch_size x ranks = 2 x 3' -- mem "$tmp/run.json" --ranks 3 --set total_batch_size=4 --set micro_batch_size=2
expect 2 '--ranks 0: expected an integer >= 1' -- mem "$tmp/run.json" --ranks 0
expect 0 "" -- train "$tmp/run.json" --set out_dir="$tmp/lean" --set total_batch_size=2 \
  --set activation_checkpointing=layer --set fused_update=on --memory-limit 1GiB
grep -q "checkpointed per layer (recomputed in the backward); updates fused" "$tmp/stdout" &&
  passes=$((passes + 1)) || { echo "FAIL: the start-up table should name the memory options"; failures=$((failures + 1)); }

# checkpoints, resume and export
expect 0 "fewer than optimizer.rank 16" -- train "$tmp/run.json" --set out_dir="$tmp/galore_few" \
  --set optimizer.name=galore --set optimizer.rank=16 --set micro_batch_size=1 \
  --set total_batch_size=1 --set seq_len=8 --set steps=1
expect 2 'checkpoint_keep' -- train "$tmp/run.json" --set checkpoint_keep=0
expect 2 "init_from: not found: $tmp/no_hf" -- train "$tmp/run.json" --set init_from="$tmp/no_hf"
expect 2 "$tmp/no_ckpt" -- train "$tmp/run.json" --resume "$tmp/no_ckpt"
expect 2 '--resume needs a value' -- train "$tmp/run.json" --resume
expect 0 "" -- export --help
expect 2 'missing --checkpoint' -- export --out "$tmp/hf"
expect 2 'missing --out' -- export --checkpoint "$tmp/out"
expect 2 'expected fp32 or bf16' -- export --checkpoint "$tmp/out" --out "$tmp/hf" --dtype fp16
expect 2 "$tmp: no checkpoint and no final model there" -- export --checkpoint "$tmp" --out "$tmp/hf"
expect 0 "" -- train "$tmp/run.json" --set out_dir="$tmp/ck" --set checkpoint_every=2
expect 0 "" -- export --checkpoint "$tmp/ck" --out "$tmp/hf" --dtype bf16
for f in config.json model.safetensors; do
  [ -s "$tmp/hf/$f" ] && passes=$((passes + 1)) || { echo "FAIL: export wrote no $f"; failures=$((failures + 1)); }
done
grep -q '"torch_dtype": "bfloat16"' "$tmp/hf/config.json" && passes=$((passes + 1)) || { echo "FAIL: config.json lacks torch_dtype bfloat16"; failures=$((failures + 1)); }
ls "$tmp/ck/checkpoints" | tr '\n' ' ' | grep -qx 'step_00000002 step_00000003 ' && passes=$((passes + 1)) || { echo "FAIL: expected checkpoints at steps 2 and 3"; failures=$((failures + 1)); }
expect 2 "$tmp/ck: out_dir holds this run, finished" -- train "$tmp/run.json" --set out_dir="$tmp/ck" --set checkpoint_every=2
expect 2 "init_from: $tmp/train.bin: header length" -- train "$tmp/run.json" --set out_dir="$tmp/init" --set init_from="$tmp/train.bin"
expect 0 "" -- train "$tmp/run.json" --set out_dir="$tmp/init" --set init_from="$tmp/hf"

# the summary line says what it measured: no median from one or two steps
expect 0 "" -- train "$tmp/run.json" --set out_dir="$tmp/one" --set steps=1
grep -q "^done: 1 steps, .*tok/s (the only step, warm-up included)" "$tmp/stdout" && ! grep -q "median" "$tmp/stdout" \
  && passes=$((passes + 1)) || { echo "FAIL: a 1-step run's summary:"; grep "^done" "$tmp/stdout"; failures=$((failures + 1)); }
expect 0 "" -- train "$tmp/run.json" --set out_dir="$tmp/two" --set steps=2
grep -q "^done: 2 steps, .*tok/s (one step after the first)" "$tmp/stdout" && ! grep -q "median" "$tmp/stdout" \
  && passes=$((passes + 1)) || { echo "FAIL: a 2-step run's summary:"; grep "^done" "$tmp/stdout"; failures=$((failures + 1)); }

# a projected optimizer's default rank that the model cannot take names the rank that fits
expect 2 "optimizer.rank: 128 (galore's default) exceeds" -- train configs/runs/quickstart.json --set optimizer.name=galore --set out_dir="$tmp/q"
expect 2 "(--set optimizer.rank=64)" -- train configs/runs/quickstart.json --set optimizer.name=galore --set out_dir="$tmp/q"

echo "$passes passed, $failures failed"
[ "$failures" = 0 ]
