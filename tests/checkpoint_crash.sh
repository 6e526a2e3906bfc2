#!/usr/bin/env bash
# Crash safety, end to end with the real binary: a GRASS run (8-bit states, so their codes and absmax
# are among the bytes compared) that checkpoints every step is killed
# with SIGKILL at random moments, half of them while a checkpoint is being written, and resumed
# each time. After every kill each checkpoint under its final name must verify (grass export
# checks every size and checksum) and the next run must resume from the newest of them with no
# warning; at the end the weights, the optimizer state and metrics.jsonl must equal, byte for
# byte, those of a run that was never interrupted. Then: a corrupt checkpoint is named and skipped,
# a truncated one named with --resume is refused, a write that fails (file size limit, as on a
# full disk) stops with one error line and leaves the previous checkpoint intact, an unwritable
# checkpoint directory fails before training, and a second run on a locked out_dir is refused.
# With OFFLOAD=1 the killed runs offload (see below) and the faults are skipped; KILLS sets the
# number of kills (16). Run by ctest with GRASS=<path to the grass binary>, from the source
# directory.
set -uo pipefail
: "${GRASS:?set GRASS to the grass binary}"
KILLS=${KILLS:-16}
tmp=$(mktemp -d)
bg=""
cleanup() { [ -n "$bg" ] && kill -9 "$bg" 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
failures=0
passes=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
pass() { passes=$((passes + 1)); }
start=$SECONDS
# One thread: every run computes identically, and a loaded machine does not stall OpenMP barriers.
export OMP_NUM_THREADS=1
RANDOM=20240613  # the kill moments are random, but the same on every run of the test

"$(dirname "$GRASS")/make_synthetic_shard" --out "$tmp/train.bin" --vocab 512 --tokens 20000 >/dev/null
cat >"$tmp/run.json" <<JSON
{"model": "configs/models/llama_tiny.json",
 "data": {"train": "$tmp/train.bin", "val": "$tmp/train.bin"},
 "optimizer": {"name": "grass", "rank": 8, "update_interval": 4, "lr": 3e-3, "state_dtype": "q8", "state_block": 64},
 "schedule": {"name": "cosine", "warmup_steps": 3},
 "micro_batch_size": 8, "total_batch_size": 16, "seq_len": 64, "steps": 100,
 "eval_every": 25, "eval_tokens": 256, "log_every": 1,
 "checkpoint_every": 1, "checkpoint_keep": 2, "checkpoint_keep_every": 25,
 "out_dir": "$tmp/crash"}
JSON
ck="$tmp/crash/checkpoints"
final="step_00000100"
# OFFLOAD=1: the killed runs keep their optimizer states in the host tier, under per-layer
# checkpointing of a four-layer model layer 0's input in a file ring on disk, and layers 1 and 3's
# weights in the host tier (offload.layers: two micro-batches of 8 a step, so each micro-batch
# fetches the layers and an update pass writes them back, for both runs); the uninterrupted run
# keeps everything on the device (offload is a layout of memory, not of state), and no ring file
# may outlive a killed run. The faults after the kills are left to the plain run.
crash_args=()
ring="$tmp/ring"
if [ "${OFFLOAD:-0}" = 1 ]; then
  python3 - "$tmp/run.json" <<'PY'
import json, sys
run = json.load(open(sys.argv[1]))
model = json.load(open(run["model"]))
model["num_hidden_layers"] = 4
run.update(model=model, activation_checkpointing="layer", micro_batch_size=8, total_batch_size=16)
json.dump(run, open(sys.argv[1], "w"))
PY
  crash_args=(--set "offload={\"optimizer_states\": true, \"activations\": \"disk\", \"disk_dir\": \"$ring\", \"layers\": 2}")
fi

# The uninterrupted run (its only checkpoint is the last).
"$GRASS" train "$tmp/run.json" --set out_dir="$tmp/ref" --set checkpoint_every=100 >"$tmp/ref.log" 2>&1 \
  || { echo "FAIL: the reference run failed"; cat "$tmp/ref.log"; exit 1; }

newest_step() {  # the newest checkpoint under its final name, as a number; -1 when none
  local d
  d=$(ls -1 "$ck" 2>/dev/null | grep -E '^step_[0-9]{8}$' | sort | tail -1)
  if [ -z "$d" ]; then echo -1; else echo $((10#${d#step_})); fi
}

verify_all() {  # every final-named checkpoint is complete: manifest present, every file verifies
  local d
  for d in "$ck"/step_*; do
    [ -d "$d" ] || continue
    if ! "$GRASS" export --checkpoint "$d" --out "$tmp/verify" >/dev/null 2>"$tmp/verify.err"; then
      fail "after kill $1, $d does not verify: $(cat "$tmp/verify.err")"
      return
    fi
  done
  pass
}

kills=0
during_write=0
progress=""
expected_resume=-1
attempt=0
while [ "$kills" -lt "$KILLS" ]; do
  attempt=$((attempt + 1))
  log="$tmp/run.$attempt.log"
  if [ $((kills % 2)) = 0 ]; then
    # A random moment: anywhere in start-up, a step, an evaluation or a checkpoint write (each
    # file written is followed by 2 ms: a checkpoint write then takes about as long as a step).
    GRASS_TEST_CHECKPOINT_PAUSE_MS=2 "$GRASS" train "$tmp/run.json" "${crash_args[@]}" >"$log" 2>&1 &
    bg=$!
    sleep "0.$((RANDOM % 4))$((RANDOM % 10))$((RANDOM % 10 + 1))"
  else
    # During a checkpoint write: each file is followed by a pause, so the write is caught in
    # one of its phases (after one file, after the manifest, before the rename).
    GRASS_TEST_CHECKPOINT_PAUSE_MS=40 "$GRASS" train "$tmp/run.json" "${crash_args[@]}" >"$log" 2>&1 &
    bg=$!
    for _ in $(seq 1000); do
      compgen -G "$ck/.tmp_step_*" >/dev/null && break
      kill -0 "$bg" 2>/dev/null || break
      sleep 0.01
    done
    sleep "0.$((RANDOM % 20))"
  fi
  if ! kill -9 "$bg" 2>/dev/null; then
    wait "$bg"; code=$?; bg=""
    [ "$code" = 0 ] || { fail "run $attempt exited $code before it was killed"; cat "$log"; break; }
    break  # finished before the kill: the run is too short for the machine
  fi
  wait "$bg" 2>/dev/null; bg=""
  kills=$((kills + 1))
  if compgen -G "$ck/.tmp_step_*" >/dev/null; then during_write=$((during_write + 1)); fi
  progress="$progress $(newest_step)"
  # The run resumed from the newest complete checkpoint there was, without a warning.
  if [ "$expected_resume" -ge 0 ]; then
    if grep -q "resume        from" "$log"; then
      got=$(sed -nE 's/.*resume +from .*step_([0-9]{8}) .*/\1/p' "$log")
      [ "$((10#$got))" = "$expected_resume" ] && pass \
        || fail "run $attempt resumed from step $got, the newest complete checkpoint was $expected_resume"
    fi
  fi
  if grep -q "warning" "$log"; then fail "run $attempt warned: $(grep warning "$log")"; fi
  verify_all "$kills"
  if [ -d "$ring" ] && [ -n "$(ls -A "$ring")" ]; then fail "kill $kills left $(ls "$ring") in the ring's directory"; fi
  expected_resume=$(newest_step)
done

# The last run finishes; nothing of the crashes shows in what it leaves.
"$GRASS" train "$tmp/run.json" "${crash_args[@]}" >"$tmp/final.log" 2>&1 || { fail "the final run failed"; cat "$tmp/final.log"; }
if [ "$expected_resume" -ge 0 ]; then
  grep -q "resume        from .*step_$(printf %08d "$expected_resume") " "$tmp/final.log" && pass \
    || fail "the final run did not resume from step $expected_resume"
fi
for f in model.safetensors state.safetensors state.json; do
  cmp -s "$ck/$final/$f" "$tmp/ref/checkpoints/$final/$f" && pass \
    || fail "$f after $kills kills differs from the uninterrupted run's"
done
rows() {  # step, loss and val_loss of every metrics row, in order
  sed -E 's/.*"step":([0-9]+).*/\1/; t; s/.*/?/' "$1" | paste -d' ' - \
    <(sed -E 's/.*"loss":([^,}]*).*/\1/; t; s/.*/-/' "$1") \
    <(sed -E 's/.*"val_loss":([^,}]*).*/\1/; t; s/.*/-/' "$1")
}
if diff <(rows "$tmp/ref/metrics.jsonl") <(rows "$tmp/crash/metrics.jsonl") >"$tmp/rows.diff"; then pass
else fail "metrics.jsonl differs from the uninterrupted run's:"; head "$tmp/rows.diff"; fi
[ "$(grep -c . "$tmp/crash/metrics.jsonl")" = 104 ] && pass || fail "metrics.jsonl should have 100 step rows and 4 eval rows"
kept=$(ls -1 "$ck" | tr '\n' ' ')
[ "$kept" = "step_00000025 step_00000050 step_00000075 step_00000099 step_00000100 " ] && pass \
  || fail "checkpoints kept: $kept (expected the last 2 and every 25th)"
echo "$kills kills ($during_write during a checkpoint write, $((kills - during_write)) elsewhere) in $attempt runs; newest checkpoint after each:$progress"
[ "$kills" -ge $((KILLS * 5 / 8)) ] && pass || fail "only $kills kills: the run finished too soon"
[ "$during_write" -ge 3 ] && pass || fail "only $during_write kills landed during a checkpoint write"
if [ "${OFFLOAD:-0}" = 1 ]; then
  grep -q "offload       layer inputs 0..0" "$tmp/final.log" && pass || fail "the final run moved no layer input"
  grep -q "offload       layers 1, 3: their matrices" "$tmp/final.log" && pass || fail "the final run streamed no layer"
  echo "checkpoint_crash (offload): $passes checks passed, $failures failed ($((SECONDS - start)) s)"
  [ "$failures" = 0 ]
  exit
fi

# A corrupt file in the newest checkpoint: named, skipped, and the run still ends identical.
printf '\x55' | dd of="$ck/$final/model.safetensors" bs=1 seek=4000 conv=notrunc 2>/dev/null
"$GRASS" train "$tmp/run.json" >"$tmp/corrupt.log" 2>"$tmp/corrupt.err"
code=$?
[ "$code" = 0 ] && pass || fail "resume past a corrupt checkpoint exited $code"
grep -q "warning: skipping checkpoint .*$final/model.safetensors: checksum mismatch" "$tmp/corrupt.err" && pass \
  || fail "no warning naming the corrupt file: $(cat "$tmp/corrupt.err")"
grep -q "resume        from .*step_00000099 " "$tmp/corrupt.log" && pass || fail "did not fall back to step 99"
cmp -s "$ck/$final/model.safetensors" "$tmp/ref/checkpoints/$final/model.safetensors" && pass \
  || fail "the run resumed past the corrupt checkpoint does not end identical"

# A truncated file, named with --resume: an error naming it, exit 2, one line.
truncate -s -16 "$ck/step_00000099/state.safetensors"
"$GRASS" train "$tmp/run.json" --resume "$ck/step_00000099" >/dev/null 2>"$tmp/trunc.err"
code=$?
[ "$code" = 2 ] && [ "$(wc -l <"$tmp/trunc.err")" = 1 ] \
  && grep -q "^error: .*step_00000099/state.safetensors: .* bytes, but manifest.json records" "$tmp/trunc.err" \
  && pass || fail "truncated checkpoint with --resume: exit $code, $(cat "$tmp/trunc.err")"

# A failing write (files limited to 300 KiB, as a full disk would refuse them): one error line,
# exit 2, no temporary directory left, the previous checkpoint intact.
before=$(md5sum "$ck/$final"/*)
(trap '' XFSZ; ulimit -f 300; exec "$GRASS" train "$tmp/run.json" --set steps=102) >/dev/null 2>"$tmp/full.err"
code=$?
[ "$code" = 2 ] && [ "$(grep -c . "$tmp/full.err")" -le 2 ] \
  && grep -q "^error: .*step_00000101.*: write failed: File too large" "$tmp/full.err" && pass \
  || fail "a failing checkpoint write: exit $code, $(cat "$tmp/full.err")"
compgen -G "$ck/.tmp_step_*" >/dev/null && fail "a temporary checkpoint directory was left behind" || pass
[ "$before" = "$(md5sum "$ck/$final"/*)" ] && "$GRASS" export --checkpoint "$ck/$final" --out "$tmp/verify" >/dev/null \
  && pass || fail "the previous checkpoint changed"

# An out_dir of this run whose checkpoints directory cannot be created: refused before any step.
mkdir -p "$tmp/blocked" && touch "$tmp/blocked/checkpoints" && cp "$tmp/ref/config.json" "$tmp/blocked/"
"$GRASS" train "$tmp/run.json" --set out_dir="$tmp/blocked" >"$tmp/blocked.log" 2>"$tmp/blocked.err"
code=$?
[ "$code" = 2 ] && grep -q "^error: $tmp/blocked/checkpoints: cannot create the checkpoint directory" "$tmp/blocked.err" \
  && ! grep -q "^step" "$tmp/blocked.log" && pass || fail "unwritable checkpoints: exit $code, $(cat "$tmp/blocked.err")"
"$GRASS" train "$tmp/run.json" --set out_dir="$tmp/train.bin" >/dev/null 2>"$tmp/file.err"
[ $? = 2 ] && grep -q "out_dir is a file, not a directory" "$tmp/file.err" && pass || fail "out_dir is a file: $(cat "$tmp/file.err")"

# Two runs on one out_dir: the second is refused while the first holds the lock.
GRASS_TEST_CHECKPOINT_PAUSE_MS=200 "$GRASS" train "$tmp/run.json" --set out_dir="$tmp/locked" >/dev/null 2>&1 &
bg=$!
for _ in $(seq 500); do [ -d "$tmp/locked/checkpoints" ] && break; sleep 0.01; done
"$GRASS" train "$tmp/run.json" --set out_dir="$tmp/locked" >/dev/null 2>"$tmp/lock.err"
[ $? = 2 ] && grep -q "another grass process is training into this out_dir" "$tmp/lock.err" && pass \
  || fail "second run on a locked out_dir: $(cat "$tmp/lock.err")"
kill -9 "$bg" 2>/dev/null; wait "$bg" 2>/dev/null; bg=""

echo "$passes passed, $failures failed in $((SECONDS - start)) s"
[ "$failures" = 0 ]
