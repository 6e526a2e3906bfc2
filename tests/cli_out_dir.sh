#!/usr/bin/env bash
# What `grass train` does with its out_dir (train/out_dir.h): nothing a user made is lost. An
# export, another run, an unrelated folder, a finished run and a run without checkpoints are
# refused in one line and left byte for byte as they were; --overwrite moves them aside; this
# run's checkpoints resume and raising steps extends them. Every run ends with its model saved
# (<out_dir>/model, or the last checkpoint), also when SIGTERM or SIGINT stops it.
# Run by ctest with GRASS and MAKE_SHARD set, from the source directory.
set -uo pipefail
: "${GRASS:?set GRASS to the grass binary}" "${MAKE_SHARD:?set MAKE_SHARD}"
source "$(dirname "$0")/cli_lib.sh"
check() { if eval "$1"; then pass; else fail "$2"; fi; }  # check <condition> <what failed>
# the bytes of every file under a directory, for "left as it was"
snapshot() { (cd "$1" && find . -type f ! -name .lock -print0 | sort -z | xargs -0 md5sum); }
step_rows() { grep -c '"loss"' "$1/metrics.jsonl" | tr -d ' '; }

"$MAKE_SHARD" --out "$tmp/train.bin" --vocab 512 --tokens 20000 >/dev/null
"$MAKE_SHARD" --out "$tmp/val.bin" --vocab 512 --tokens 4000 --seed 2 >/dev/null
cat >"$tmp/run.json" <<JSON
{"model": "configs/models/llama_tiny.json", "data": {"train": "$tmp/train.bin", "val": "$tmp/val.bin"},
 "micro_batch_size": 2, "total_batch_size": 2, "seq_len": 32, "steps": 3, "eval_tokens": 512,
 "out_dir": "$tmp/run", "log_every": 1}
JSON

# A run without checkpoints keeps its model in out_dir/model, a Hugging Face directory.
expect 0 "" -- train "$tmp/run.json"
for f in config.json model.safetensors grass_run.json; do check "[ -s '$tmp/run/model/$f' ]" "no model/$f"; done
check "grep -q \"^model $tmp/run/model \" '$tmp/stdout'" "the run should say where its model is"
check "grep -q '\"step\": 3' '$tmp/run/model/grass_run.json'" "grass_run.json should record step 3"
expect 0 "" -- eval "$tmp/run.json" --weights "$tmp/run"
check "grep -q 'weights final model $tmp/run/model (step 3)' '$tmp/stdout'" "eval should name the final model"
expect 0 "" -- eval "$tmp/run.json"
check "grep -q 'weights untrained: seeded initial weights (seed 42)' '$tmp/stdout'" "eval should say it scored untrained weights"
expect 0 "" -- export --checkpoint "$tmp/run" --out "$tmp/hf"
check "grep -q 'exported final model $tmp/run/model (step 3)' '$tmp/stdout'" "export should read the final model"

# Refusals leave everything as it was.
run_before=$(snapshot "$tmp/run")
expect 2 "$tmp/run: out_dir holds this run's results (metrics.jsonl to step 3, its model in $tmp/run/model) and no checkpoint to resume from" -- train "$tmp/run.json"
expect 2 "$tmp/run: out_dir holds another run (optimizer.lr is 0.001 there, 0.005 here)" -- train "$tmp/run.json" --set optimizer.lr=5e-3
check "grep -qF 'or pass --overwrite to move its contents to $tmp/run.old-1' '$tmp/err'" "a refusal should name --overwrite's destination"
check "[ \"\$(snapshot '$tmp/run')\" = \"\$run_before\" ]" "a refused run changed out_dir"
hf_before=$(snapshot "$tmp/hf")
expect 2 "$tmp/hf: out_dir is not empty and holds no grass run (a Hugging Face model)" -- train "$tmp/run.json" --set out_dir="$tmp/hf"
check "[ \"\$(snapshot '$tmp/hf')\" = \"\$hf_before\" ]" "a refused run changed the export"
check "[ ! -e '$tmp/hf/.lock' ]" "a refused run left a lock file in the export"
mkdir "$tmp/notes" && echo "mine" >"$tmp/notes/notes.txt"
expect 2 "$tmp/notes: out_dir is not empty and holds no grass run (1 entry: notes.txt)" -- train "$tmp/run.json" --set out_dir="$tmp/notes"
check "[ \"\$(cat '$tmp/notes/notes.txt')\" = mine ]" "a refused run changed an unrelated file"
mkdir "$tmp/empty"
expect 0 "" -- train "$tmp/run.json" --set out_dir="$tmp/empty" --set steps=1

# --overwrite moves the old contents aside, whole.
expect 0 "" -- train "$tmp/run.json" --overwrite --set steps=2
check "grep -qF '(its earlier contents moved to $tmp/run.old-1: --overwrite)' '$tmp/stdout'" "--overwrite should say where it moved out_dir"
check "[ \"\$(snapshot '$tmp/run.old-1')\" = \"\$run_before\" ]" "--overwrite lost or changed the earlier run"
check "[ \"\$(step_rows '$tmp/run')\" = 2 ]" "the new run should have 2 step rows"
expect 0 "" -- train "$tmp/run.json" --set out_dir="$tmp/notes" --overwrite --set steps=1
check "[ \"\$(cat '$tmp/notes.old-1/notes.txt')\" = mine ]" "--overwrite lost an unrelated file"

# A run with checkpoints resumes; raising steps extends it; a finished one is refused.
ck=(--set out_dir="$tmp/ck" --set checkpoint_every=2)
expect 0 "" -- train "$tmp/run.json" "${ck[@]}" --set steps=4
check "grep -q \"^model $tmp/ck/checkpoints/step_00000004 \" '$tmp/stdout'" "a checkpointed run's model is its last checkpoint"
check "[ ! -e '$tmp/ck/model' ]" "a checkpointed run needs no model directory"
ck_before=$(snapshot "$tmp/ck")
expect 2 "$tmp/ck: out_dir holds this run, finished: its newest complete checkpoint is at step 4 of steps 4; raise steps to train further" -- train "$tmp/run.json" "${ck[@]}" --set steps=4
check "[ \"\$(snapshot '$tmp/ck')\" = \"\$ck_before\" ]" "a refused finished run changed out_dir"
expect 2 "or --resume $tmp/ck to continue it with this config" -- train "$tmp/run.json" "${ck[@]}" --set steps=6 --set optimizer.lr=5e-3
expect 2 "$tmp/ck/checkpoints/step_00000004: the run is finished there (step 4 of steps 4)" -- train "$tmp/run.json" --set out_dir="$tmp/elsewhere" --resume "$tmp/ck" --set steps=4
expect 2 "lies inside out_dir $tmp/ck, which --overwrite moves aside" -- train "$tmp/run.json" "${ck[@]}" --set steps=6 --overwrite --resume "$tmp/ck"
expect 0 "" -- train "$tmp/run.json" "${ck[@]}" --set steps=6
check "grep -q 'resume        from $tmp/ck/checkpoints/step_00000004 (step 4 of 6)' '$tmp/stdout'" "raising steps should resume"
check "[ \"\$(step_rows '$tmp/ck')\" = 6 ]" "the extended run should hold steps 1..6 once each"

# A signal stops after the step in flight and saves the model: a checkpoint when checkpoints are
# on (the same command resumes), out_dir/model otherwise; exit 128 + the signal's number.
stop_with() {  # <signal> <out_dir> <extra args...>: runs a long training, signals it after step 2
  local signal=$1 dir=$2
  shift 2
  "$GRASS" train "$tmp/run.json" --set out_dir="$dir" --set steps=100000 "$@" >"$tmp/stop.out" 2>"$tmp/stop.err" &
  local pid=$!
  for _ in $(seq 300); do grep -q '^step 2/' "$tmp/stop.out" 2>/dev/null && break; sleep 0.1; done
  kill "-$signal" "$pid"
  wait "$pid"
  echo $?
}
code=$(stop_with TERM "$tmp/stopped")
check "[ '$code' = 143 ]" "SIGTERM should exit 143, got $code"
stopped_at=$(step_rows "$tmp/stopped")
check "grep -q \"^stopped by SIGTERM after step $stopped_at of 100000: model saved to $tmp/stopped/model\" '$tmp/stop.out'" "SIGTERM should save the model and say so"
check "grep -q '\"stopped_by\": \"SIGTERM\"' '$tmp/stopped/model/grass_run.json' && grep -q '\"step\": $stopped_at,' '$tmp/stopped/model/grass_run.json'" "grass_run.json should record the stop"
code=$(stop_with INT "$tmp/stopped_ck" --set checkpoint_every=1000)
check "[ '$code' = 130 ]" "SIGINT should exit 130, got $code"
stopped_at=$(step_rows "$tmp/stopped_ck")
checkpoint=$(printf '%s/checkpoints/step_%08d' "$tmp/stopped_ck" "$stopped_at")
check "[ -s '$checkpoint/manifest.json' ]" "SIGINT with checkpoints should write a checkpoint at step $stopped_at"
check "grep -q 'run the same command again to resume' '$tmp/stop.out'" "a stop with checkpoints should say how to resume"
expect 0 "" -- train "$tmp/run.json" --set out_dir="$tmp/stopped_ck" --set checkpoint_every=1000 --set steps=$((stopped_at + 2))
check "[ \"\$(step_rows '$tmp/stopped_ck')\" = $((stopped_at + 2)) ]" "the resumed run should continue after the stop"

# Killed outright before its first checkpoint (nothing saved): a run with checkpoints starts again
# from step 0, as from a checkpoint there.
code=$(stop_with KILL "$tmp/killed" --set checkpoint_every=1000)
check "[ '$code' = 137 ]" "SIGKILL should exit 137, got $code"
expect 0 "" -- train "$tmp/run.json" --set out_dir="$tmp/killed" --set checkpoint_every=1000 --set steps=3
check "grep -q 'resume        none: $tmp/killed holds this run to step [0-9]* but no checkpoint yet, so it starts again from step 0' '$tmp/stdout'" "the restart should say so"
check "[ \"\$(step_rows '$tmp/killed')\" = 3 ]" "the restarted run should hold steps 1..3 once each"

finish cli_out_dir
