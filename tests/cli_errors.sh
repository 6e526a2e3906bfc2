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

echo "$passes passed, $failures failed"
[ "$failures" = 0 ]
