#!/usr/bin/env bash
# offload.optimizer_states end to end on the CPU backend: a run with the states in the host tier
# writes the resident run's losses, gradient norms and checkpoints byte for byte (offload is a
# layout of memory, not of state), its step line and metrics show the host tier and the copies,
# and a checkpoint taken either way resumes the other way with the same steps and bytes. A
# memory_limit below the resident plan is refused with the offloaded plan named, and met with
# offload. Run by ctest with GRASS=<grass> and MAKE_SHARD=<make_synthetic_shard>, from the
# source directory.
set -uo pipefail
: "${GRASS:?set GRASS to the grass binary}" "${MAKE_SHARD:?set MAKE_SHARD to make_synthetic_shard}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0
passes=0
check() {  # check <description> <command...>
  local what=$1; shift
  if "$@"; then passes=$((passes + 1)); else echo "FAIL: $what"; failures=$((failures + 1)); fi
}

"$MAKE_SHARD" --out "$tmp/train.bin" --vocab 512 --tokens 20000 >/dev/null
cat >"$tmp/run.json" <<JSON
{"model": "configs/models/llama_tiny.json",
 "data": {"train": "$tmp/train.bin"},
 "optimizer": {"name": "grass", "rank": 8, "update_interval": 3, "lr": 3e-3},
 "schedule": {"name": "cosine", "warmup_steps": 2},
 "precision": "bf16", "device": "cpu", "fused_update": "on",
 "micro_batch_size": 4, "seq_len": 32, "steps": 8, "log_every": 1, "checkpoint_every": 4,
 "out_dir": "$tmp/resident"}
JSON
# "step loss grad_norm" of each step row
losses() {
  grep '"grad_norm"' "$1" | sed -E 's/.*"grad_norm":([^,]*).*"loss":([^,]*).*"step":([0-9]+).*/\3 \2 \1/'
}
same_checkpoint() {  # same_checkpoint <dir a> <dir b>
  cmp -s "$1/model.safetensors" "$2/model.safetensors" && cmp -s "$1/state.safetensors" "$2/state.safetensors"
}
# AdamW's embedding and lm_head (512 x 64, bf16 moments: 128 KiB) in 16 KiB pieces
offload=(--set offload='{"optimizer_states": true, "piece_bytes": "16KiB"}')

"$GRASS" train "$tmp/run.json" >"$tmp/resident.log" 2>&1
check "the resident run exits 0" test $? = 0
"$GRASS" train "$tmp/run.json" --set out_dir="$tmp/offloaded" "${offload[@]}" >"$tmp/offloaded.log" 2>&1
check "the offloaded run exits 0" test $? = 0
check "its start-up table names the host tier" grep -q "offload       optimizer states, .* in host memory outside the arena, through two device slots of 16.0 KiB" "$tmp/offloaded.log"
check "its step line shows the host tier and the copies" grep -qE "\+ host .* \| copy .* at [0-9.]+ GB/s" "$tmp/offloaded.log"
check "its metrics carry copy_bytes" grep -q '"copy_bytes":[1-9]' "$tmp/offloaded/metrics.jsonl"
check "8 steps: the resident run's losses and gradient norms" \
  diff <(losses "$tmp/resident/metrics.jsonl") <(losses "$tmp/offloaded/metrics.jsonl")
for step in 00000004 00000008; do
  check "step $step's checkpoint is the resident run's, byte for byte" \
    same_checkpoint "$tmp/resident/checkpoints/step_$step" "$tmp/offloaded/checkpoints/step_$step"
done

# a resident checkpoint resumed with offload, and the reverse
"$GRASS" train "$tmp/run.json" --set out_dir="$tmp/to_offload" "${offload[@]}" \
  --resume "$tmp/resident/checkpoints/step_00000004" >"$tmp/to_offload.log" 2>&1
check "a resident checkpoint resumes offloaded" test $? = 0
"$GRASS" train "$tmp/run.json" --set out_dir="$tmp/to_resident" \
  --resume "$tmp/offloaded/checkpoints/step_00000004" >"$tmp/to_resident.log" 2>&1
check "an offloaded checkpoint resumes resident" test $? = 0
for run in to_offload to_resident; do
  check "$run: steps 5-8 as the straight run's" \
    diff <(losses "$tmp/resident/metrics.jsonl" | tail -4) <(losses "$tmp/$run/metrics.jsonl" | tail -4)
  check "$run: step 8's checkpoint byte for byte" \
    same_checkpoint "$tmp/resident/checkpoints/step_00000008" "$tmp/$run/checkpoints/step_00000008"
done

# memory_limit between the offloaded plan (AdamW's tensors whole) and the resident one
limit=$("$GRASS" mem "$tmp/run.json" --json --set offload.optimizer_states=true |
        sed -E 's/.*"total":([0-9]+).*/\1/')
"$GRASS" train "$tmp/run.json" --set out_dir="$tmp/capped" --set memory_limit=$limit --set steps=2 \
  >"$tmp/capped.log" 2>&1
check "the resident run over memory_limit exits 2" test $? = 2
check "and names the offloaded plan that fits" grep -q "with offload.optimizer_states true it plans .* (fits)" "$tmp/capped.log"
"$GRASS" train "$tmp/run.json" --set out_dir="$tmp/capped" --set memory_limit=$limit --set steps=2 \
  --set offload.optimizer_states=true >"$tmp/capped_offloaded.log" 2>&1
check "with offload it runs under the same limit" test $? = 0

echo "offload_cli: $passes passed, $failures failed"
[ "$failures" = 0 ] || for log in "$tmp"/*.log; do echo "--- $log"; cat "$log"; done
[ "$failures" = 0 ]
