#!/usr/bin/env bash
# offload end to end on the CPU backend. First offload.optimizer_states: a run with the states
# in the host tier writes the resident run's losses, gradient norms and checkpoints byte for
# byte (offload is a layout of memory, not of state), its step line and metrics show the host
# tier and the copies, and a checkpoint taken either way resumes the other way with the same
# steps and bytes. A memory_limit below the resident plan is refused with the offloaded plan
# named, and met with offload, or by offload "auto". Then offload.activations (host and disk):
# the resident run's bytes, a resume into it, the disk ring's file never left behind, and the
# faults of its directory (unwritable; full, where a tmpfs can be mounted) in one line. Then
# offload.layers: the resident run's bytes and resumes across it. Run by
# ctest with GRASS=<grass> and MAKE_SHARD=<make_synthetic_shard>, from the source directory.
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
check "and the copy queues: the CPU backend's two threads" grep -q "offload       copies both ways at once: the CPU backend has 2 copy threads" "$tmp/offloaded.log"
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
check "and names the offloaded plan that fits" grep -q 'offload "auto" fits it with optimizer states in the host tier: .* on the device' "$tmp/capped.log"
"$GRASS" train "$tmp/run.json" --set out_dir="$tmp/capped" --set memory_limit=$limit --set steps=2 \
  --set offload.optimizer_states=true >"$tmp/capped_offloaded.log" 2>&1
check "with offload it runs under the same limit" test $? = 0

"$GRASS" train "$tmp/run.json" --set out_dir="$tmp/capped_auto" --set memory_limit=$limit --set steps=2 \
  --set offload=auto >"$tmp/capped_auto.log" 2>&1
check "offload auto meets it too, and says what it chose" \
  grep -q "offload auto: optimizer states in the host tier, the fastest placement that fits memory_limit" "$tmp/capped_auto.log"

# the issue's plan: 13B under 24 GiB with offload "auto": the weights alone are 24.24 GiB, so
# some layers stream, and the plan leaves what a card holds beside it
"$GRASS" mem configs/runs/llama_13b_grass.json --memory-limit 24GiB --set offload=auto \
  --set micro_batch_size=16 --set total_batch_size=16 >"$tmp/mem_13b.log" 2>&1
check "grass mem --set offload=auto exits 0: it fits with streamed layers" test $? = 0
check "it says what auto chose and why" grep -q "^offload auto: optimizer states in the host tier, layer inputs in the host tier, 10 layers' weights streamed from the host tier, the fastest placement that fits memory_limit 24.00 GiB (22.74 GiB for the plan, 1.26 GiB for what a card holds beside it): 22.36 GiB on the device" "$tmp/mem_13b.log"
check "a row per place" sh -c "grep -q '^total on the device  ' '$tmp/mem_13b.log' && grep -q '^host tier (offload)  ' '$tmp/mem_13b.log'"
check "the traffic and the step-time bound, pass by pass" sh -c "grep -q '^to device a step ' '$tmp/mem_13b.log' && grep -q 'of copies over a 25 GB/s link (two copy queues, both ways at once) against .* s of compute at 395.6 TFLOP/s: hidden' '$tmp/mem_13b.log' && grep -q '^         forward   4.34 GiB to the device, 1.45 GiB back: ' '$tmp/mem_13b.log' && grep -q '^         backward  9.37 GiB to the device, 3.88 GiB back: ' '$tmp/mem_13b.log' && grep -q '^         a step takes at least .* s: .* tokens/s' '$tmp/mem_13b.log'"
# bf16-mixed: no layer streams (its fp32 master copy does not), and the weights are the floor
"$GRASS" mem configs/runs/llama_13b_grass.json --memory-limit 24GiB --set offload=auto \
  --set precision=bf16-mixed >"$tmp/mem_13b_mixed.log" 2>&1
check "in bf16-mixed it exits 3: it does not fit" test $? = 3
check "its verdict names the weights as the floor" grep -q "^does not fit memory_limit 24.00 GiB: .*the bf16 weights alone take 24.24 GiB: no placement trains this model under 24.00 GiB with every weight on the device: stream some layers' (offload.layers, with precision \"bf16\" or \"fp32\")" "$tmp/mem_13b_mixed.log"
check "and auto says why none streams" grep -q "^offload auto: no placement fits memory_limit 24.00 GiB .* (no layer streams: bf16-mixed's fp32 master copy does not stream yet" "$tmp/mem_13b_mixed.log"
# two micro-batches a step: the layers stream all the same, each micro-batch fetching them and
# an update pass after the last
"$GRASS" mem configs/runs/llama_13b_grass.json --memory-limit 24GiB --set offload=auto \
  --set micro_batch_size=8 --set total_batch_size=16 >"$tmp/mem_13b_accumulating.log" 2>&1
check "with two micro-batches a step auto streams layers and fits" \
  sh -c "[ $? = 0 ] && grep -q \"^offload auto: .* layers' weights streamed from the host tier, the fastest placement that fits\" '$tmp/mem_13b_accumulating.log'"
"$GRASS" mem configs/runs/llama_13b_grass.json --memory-limit 24GiB --set offload=auto \
  --set micro_batch_size=16 --set total_batch_size=16 --copy-queues 1 >"$tmp/mem_13b_one_queue.log" 2>&1
check "--copy-queues 1: both ways in turn, more seconds of copies" python3 - "$tmp/mem_13b.log" "$tmp/mem_13b_one_queue.log" <<'PY'
import re, sys
two, one = (open(p).read() for p in sys.argv[1:])
seconds = lambda text, queues: float(re.search(r"([0-9.e+-]+) s of copies over a 25 GB/s link \(" + queues, text).group(1))
sys.exit(0 if seconds(one, "one copy queue, both ways in turn") > seconds(two, "two copy queues") else 1)
PY
"$GRASS" mem configs/runs/llama_13b_grass.json --copy-queues 3 >"$tmp/queues3.log" 2>&1
check "--copy-queues 3 is refused in one line, exit 2" sh -c "test $? = 2 && grep -q '^error: mem: --copy-queues 3: expected 1 or 2' '$tmp/queues3.log' && test \$(wc -l <'$tmp/queues3.log') = 1"
"$GRASS" mem configs/runs/llama_13b_grass.json --set micro_batch_size=16 --set total_batch_size=16 \
  --set offload='{"optimizer_states": true, "activations": "disk", "disk_dir": "/nvme"}' >"$tmp/mem_disk.log" 2>&1
check "with the inputs on disk: the file's row, the bytes a step and the SSD-endurance warning" \
  sh -c "grep -q '^disk file (offload) .* 1.45 GiB' '$tmp/mem_disk.log' && grep -q '1.45 GiB written to disk and read back' '$tmp/mem_disk.log' && grep -q '^warning  the disk tier writes .* TB a day' '$tmp/mem_disk.log'"

# offload.activations: six layers under per-layer checkpointing, three inputs leave the device
python3 - "$tmp/run.json" "$tmp/layers.json" <<'PY'
import json, sys
run = json.load(open(sys.argv[1]))
model = json.load(open(run["model"]))
model["num_hidden_layers"] = 6
run.update(model=model, activation_checkpointing="layer", out_dir=sys.argv[2] + ".resident")
json.dump(run, open(sys.argv[2], "w"))
PY
ring="$tmp/ring"
"$GRASS" train "$tmp/layers.json" --set out_dir="$tmp/layers" >"$tmp/layers.log" 2>&1
check "the resident six-layer run exits 0" test $? = 0
for where in host disk; do
  "$GRASS" train "$tmp/layers.json" --set out_dir="$tmp/layers_$where" \
    --set offload="{\"activations\": \"$where\", \"disk_dir\": \"$ring\"}" \
    >"$tmp/layers_$where.log" 2>&1
  check "inputs on $where: exits 0" test $? = 0
  check "inputs on $where: the start-up table names the ring" \
    grep -q "offload       layer inputs 0..2, 96.0 KiB in .*, through a ring of 3 device slots" "$tmp/layers_$where.log"
  check "inputs on $where: the resident run's losses and gradient norms" \
    diff <(losses "$tmp/layers/metrics.jsonl") <(losses "$tmp/layers_$where/metrics.jsonl")
  check "inputs on $where: step 8's checkpoint byte for byte" \
    same_checkpoint "$tmp/layers/checkpoints/step_00000008" "$tmp/layers_$where/checkpoints/step_00000008"
done
check "the disk ring's file is gone after the run" test -z "$(ls -A "$ring")"
# a checkpoint of the resident run resumed with the inputs on disk and the states offloaded
"$GRASS" train "$tmp/layers.json" --set out_dir="$tmp/layers_resumed" \
  --set offload="{\"optimizer_states\": true, \"activations\": \"disk\", \"disk_dir\": \"$ring\"}" \
  --resume "$tmp/layers/checkpoints/step_00000004" >"$tmp/layers_resumed.log" 2>&1
check "a resident checkpoint resumes with everything offloaded, no config key warned about" \
  sh -c "[ $? = 0 ] && ! grep -q 'warning: resuming with' '$tmp/layers_resumed.log'"
check "and ends on the resident run's step 8, byte for byte" \
  same_checkpoint "$tmp/layers/checkpoints/step_00000008" "$tmp/layers_resumed/checkpoints/step_00000008"
# a file where the ring would be is not ours: it is left alone
mkdir -p "$ring" && echo "not grass's" >"$ring/grass-activations-old"
"$GRASS" train "$tmp/layers.json" --set out_dir="$tmp/layers_stale" --set steps=2 \
  --set offload="{\"activations\": \"disk\", \"disk_dir\": \"$ring\"}" \
  >"$tmp/layers_stale.log" 2>&1
check "a run beside an old file in disk_dir exits 0 and leaves the file" \
  sh -c "[ $? = 0 ] && [ \"\$(ls -A '$ring')\" = grass-activations-old ]"
rm -f "$ring/grass-activations-old"

# offload.layers: four of the six layers' weights streamed through the default three slots, with
# the states and inputs offloaded too; the resident run's bytes, and resumes across the two
step4="$tmp/layers/checkpoints/step_00000004"
"$GRASS" train "$tmp/layers.json" --set out_dir="$tmp/streamed" \
  --set offload='{"layers": 4, "optimizer_states": true, "activations": "host"}' >"$tmp/streamed.log" 2>&1
check "streamed layers: exits 0" test $? = 0
check "streamed layers: the start-up table names them, their host bytes and slots" \
  grep -q "offload       layers 0, 2, 3, 5: their matrices, .* in host memory outside the arena, through 3 device slots: .* fetched and .* written back a step" "$tmp/streamed.log"
check "streamed layers: the resident run's losses and gradient norms" \
  diff <(losses "$tmp/layers/metrics.jsonl") <(losses "$tmp/streamed/metrics.jsonl")
for step in 00000004 00000008; do
  check "streamed layers: step $step's checkpoint byte for byte" \
    same_checkpoint "$tmp/layers/checkpoints/step_$step" "$tmp/streamed/checkpoints/step_$step"
done
"$GRASS" train "$tmp/layers.json" --set out_dir="$tmp/to_streamed" --set offload.layers=6 \
  --resume "$step4" >"$tmp/to_streamed.log" 2>&1
check "a resident checkpoint resumes with every layer streamed" test $? = 0
"$GRASS" train "$tmp/layers.json" --set out_dir="$tmp/from_streamed" \
  --resume "$tmp/streamed/checkpoints/step_00000004" >"$tmp/from_streamed.log" 2>&1
check "a streamed checkpoint resumes resident" test $? = 0
for run in to_streamed from_streamed; do
  check "$run: step 8's checkpoint byte for byte" \
    same_checkpoint "$tmp/layers/checkpoints/step_00000008" "$tmp/$run/checkpoints/step_00000008"
done
# offload.layers "auto" under a memory_limit that 4 streamed layers meet and 3 do not: it streams
# 4, says so at start-up, and trains to the same bytes
four=$("$GRASS" mem "$tmp/layers.json" --json \
       --set offload='{"layers": 4, "optimizer_states": true, "activations": "host"}' |
       sed -E 's/.*"total":([0-9]+).*/\1/')
"$GRASS" train "$tmp/layers.json" --set out_dir="$tmp/streamed_auto" --set memory_limit=$four \
  --set offload='{"layers": "auto", "optimizer_states": true, "activations": "host"}' >"$tmp/streamed_auto.log" 2>&1
check "offload.layers auto: exits 0" test $? = 0
check "offload.layers auto: the start-up table says it streams 4, and why" \
  grep -q "offload.layers auto: optimizer states in the host tier, layer inputs in the host tier, 4 layers' weights streamed from the host tier, the fastest placement that fits memory_limit" "$tmp/streamed_auto.log"
check "offload.layers auto: step 8's checkpoint as the resident run's, byte for byte" \
  same_checkpoint "$tmp/layers/checkpoints/step_00000008" "$tmp/streamed_auto/checkpoints/step_00000008"
# two micro-batches a step (deferred updates): each micro-batch fetches the streamed layers, an
# update pass after the last updates each in a slot and writes it back; the resident run's bytes
"$GRASS" train "$tmp/layers.json" --set out_dir="$tmp/deferred" --set micro_batch_size=2 \
  --set total_batch_size=4 --set fused_update=off --set steps=4 --set checkpoint_every=0 \
  >"$tmp/deferred.log" 2>&1
check "deferred, resident: exits 0" test $? = 0
"$GRASS" train "$tmp/layers.json" --set out_dir="$tmp/deferred_streamed" --set micro_batch_size=2 \
  --set total_batch_size=4 --set fused_update=off --set steps=4 --set checkpoint_every=0 \
  --set offload.layers=4 >"$tmp/deferred_streamed.log" 2>&1
check "deferred, streamed: exits 0" test $? = 0
check "deferred, streamed: the start-up table says what each micro-batch fetches" \
  grep -q "offload       layers 0, 2, 3, 5: .* written back a step (each of the 2 micro-batches fetches them for its passes, then the updates' pass)" "$tmp/deferred_streamed.log"
check "deferred, streamed: the resident run's final weights, byte for byte" \
  cmp -s "$tmp/deferred/model/model.safetensors" "$tmp/deferred_streamed/model/model.safetensors"
check "deferred, streamed: the resident run's losses and gradient norms" \
  diff <(losses "$tmp/deferred/metrics.jsonl") <(losses "$tmp/deferred_streamed/metrics.jsonl")
"$GRASS" train "$tmp/layers.json" --set out_dir="$tmp/streamed_mixed" --set precision=bf16-mixed \
  --set offload.layers=2 >"$tmp/streamed_mixed.log" 2>&1
check "streamed layers with bf16-mixed: exit 2, one line naming offload.layers" \
  sh -c "[ $? = 2 ] && [ \"\$(grep -c . '$tmp/streamed_mixed.log')\" = 1 ] && grep -q 'offload.layers: does not stream bf16-mixed' '$tmp/streamed_mixed.log' && [ ! -e '$tmp/streamed_mixed' ]"

# faults: a disk_dir nothing can be created in, and a full disk, each in one line before a step
# runs, the checkpoints already there untouched
cp -r "$tmp/layers" "$tmp/layers_before"
"$GRASS" train "$tmp/layers.json" --set out_dir="$tmp/layers" --set steps=12 \
  --set offload='{"activations": "disk", "disk_dir": "/proc/grass-ring"}' >"$tmp/unwritable.log" 2>&1
check "an unwritable disk_dir exits 2" test $? = 2
check "with one error line naming offload.disk_dir" \
  sh -c "[ \"\$(grep -c . '$tmp/unwritable.log')\" = 1 ] && grep -q '^error: offload.disk_dir /proc/grass-ring: cannot create' '$tmp/unwritable.log'"
mkdir -p "$tmp/small"
if mount -t tmpfs -o size=16k tmpfs "$tmp/small" 2>/dev/null; then
  "$GRASS" train "$tmp/layers.json" --set out_dir="$tmp/layers" --set steps=12 \
    --set offload="{\"activations\": \"disk\", \"disk_dir\": \"$tmp/small\"}" >"$tmp/full.log" 2>&1
  code=$?
  umount "$tmp/small"
  check "a disk too small for the ring exits 2" test $code = 2
  check "with one error line: No space left on device" \
    sh -c "[ \"\$(grep -c . '$tmp/full.log')\" = 1 ] && grep -q '^error: offload.disk_dir .*: cannot reserve 96.0 KiB for the activation ring: No space left on device' '$tmp/full.log'"
else
  echo "offload_cli: a full disk not tried (mounting a small tmpfs needs root)"
fi
check "the checkpoints already there are untouched" diff -r "$tmp/layers_before" "$tmp/layers"

echo "offload_cli: $passes passed, $failures failed"
[ "$failures" = 0 ] || for log in "$tmp"/*.log; do echo "--- $log"; cat "$log"; done
[ "$failures" = 0 ]
