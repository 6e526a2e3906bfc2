#!/usr/bin/env bash
# The whole trainer on the CUDA backend, on the CUDA emulator (tests/cuda_emu): `grass train` with
# device "cuda" picks the CUDA backend, trains GRASS in bf16-mixed with evaluations and
# checkpoints (attention "auto" falling back to the engine's kernels: the emulator has no cuDNN),
# and a run resumed from its step-6 checkpoint ends with the same losses and the same
# weights and optimizer state, byte for byte, as the run that never stopped (resumed with the
# optimizer states offloaded too); a pure-bf16 run with
# per-layer checkpointing and fused updates trains too (and with a layer's weights streamed, to
# the same bytes), and so do GaLore and FLORA (an SVD and a
# resampling inside 6 steps, bf16-mixed and fused pure bf16). Run by ctest with GRASS=<grass_emu> and
# MAKE_SHARD=<make_synthetic_shard>, from the source directory.
set -uo pipefail
: "${GRASS:?set GRASS to the grass_emu binary}" "${MAKE_SHARD:?set MAKE_SHARD to make_synthetic_shard}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0
passes=0
check() {  # check <description> <command...>
  local what=$1; shift
  if "$@"; then passes=$((passes + 1)); else echo "FAIL: $what"; failures=$((failures + 1)); fi
}
export OMP_NUM_THREADS=1

"$MAKE_SHARD" --out "$tmp/train.bin" --vocab 512 --tokens 20000 >/dev/null
cat >"$tmp/run.json" <<JSON
{"model": "configs/models/llama_tiny.json",
 "data": {"train": "$tmp/train.bin", "val": "$tmp/train.bin"},
 "optimizer": {"name": "grass", "rank": 8, "update_interval": 4, "lr": 3e-3},
 "schedule": {"name": "cosine", "warmup_steps": 2},
 "precision": "bf16-mixed", "device": "cuda",
 "micro_batch_size": 4, "total_batch_size": 8, "seq_len": 32, "steps": 12,
 "eval_every": 6, "eval_tokens": 256, "log_every": 3, "checkpoint_every": 6,
 "out_dir": "$tmp/a"}
JSON

"$GRASS" train "$tmp/run.json" >"$tmp/a.log" 2>&1
check "the straight run exits 0" test $? = 0
check "the run names the CUDA backend" grep -q "cuda, cuda_emu" "$tmp/a.log"
check "nothing allocates device memory after the reservation" bash -c "! grep -q 'memory in use grew' '$tmp/a.log'"
check "llama_tiny's ffn 172 is stored padded" grep -q "ffn 172 (stored 176 wide" "$tmp/a.log"
# attention "auto" (the default): the emulator's build has no cuDNN, so the engine's kernels, and
# one line in the table saying why; config.json keeps "auto", metrics.jsonl and the checkpoints
# what it took
check "attention auto falls back to the engine's kernels, saying why" \
  grep -q '^  attention     the engine.s kernels ("auto" did not take cuDNN.s: this grass was built without cuDNN.s headers' "$tmp/a.log"
check "and says it once" test "$(grep -c 'did not take cuDNN' "$tmp/a.log")" = 1
check "config.json keeps attention auto" grep -q '"attention": "auto"' "$tmp/a/config.json"
check "every step row of metrics.jsonl names the engine's kernels" \
  test "$(grep -c '"attention":"grass"' "$tmp/a/metrics.jsonl")" = 12
check "and the checkpoint's state.json" \
  grep -q '"kernel": "grass"' "$tmp/a/checkpoints/step_00000006/state.json"
check "metrics.jsonl has 12 steps" test "$(grep -c '"grad_norm"' "$tmp/a/metrics.jsonl")" = 12
check "and 2 evaluations" test "$(grep -c '"val_loss"' "$tmp/a/metrics.jsonl")" = 2
# "step loss grad_norm" of each step row (evaluation rows have no grad_norm)
losses() {
  grep '"grad_norm"' "$1" | sed -E 's/.*"grad_norm":([^,]*).*"loss":([^,]*).*"step":([0-9]+).*/\3 \2 \1/'
}
first=$(losses "$tmp/a/metrics.jsonl" | head -1 | cut -d' ' -f2)
last=$(losses "$tmp/a/metrics.jsonl" | tail -1 | cut -d' ' -f2)
check "the loss falls ($first -> $last)" awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a - 0.05) }'

"$GRASS" train "$tmp/run.json" --set out_dir="$tmp/b" --resume "$tmp/a/checkpoints/step_00000006" \
  >"$tmp/b.log" 2>&1
check "the resumed run exits 0" test $? = 0
check "the resumed run continues from step 6" grep -q "step_00000006" "$tmp/b.log"
check "steps 7-12: the same losses and gradient norms" \
  diff <(losses "$tmp/a/metrics.jsonl" | tail -6) <(losses "$tmp/b/metrics.jsonl" | tail -6)
for f in model.safetensors state.safetensors; do
  check "step 12 $f is byte-identical" \
    cmp -s "$tmp/a/checkpoints/step_00000012/$f" "$tmp/b/checkpoints/step_00000012/$f"
done

# The same resumed with the optimizer states in pinned host memory (offload is a layout of memory):
# the same steps and bytes, the states through the copy stream.
"$GRASS" train "$tmp/run.json" --set out_dir="$tmp/c" --resume "$tmp/a/checkpoints/step_00000006" \
  --set offload='{"optimizer_states": true, "piece_bytes": "16KiB"}' >"$tmp/c.log" 2>&1
check "the run resumed with offloaded states exits 0" test $? = 0
check "its states are in pinned host memory" grep -q "in pinned host memory, through two device slots" "$tmp/c.log"
check "its copies go both ways at once on the emulator's 2 copy engines" \
  grep -q "offload       copies both ways at once: the GPU has 2 copy engines (asyncEngineCount)" "$tmp/c.log"
check "steps 7-12 offloaded: the same losses and gradient norms" \
  diff <(losses "$tmp/a/metrics.jsonl" | tail -6) <(losses "$tmp/c/metrics.jsonl" | tail -6)
for f in model.safetensors state.safetensors; do
  check "step 12 $f offloaded is byte-identical" \
    cmp -s "$tmp/a/checkpoints/step_00000012/$f" "$tmp/c/checkpoints/step_00000012/$f"
done

"$GRASS" train "$tmp/run.json" --set out_dir="$tmp/lean" --set precision=bf16 --set steps=4 \
  --set total_batch_size=4 --set activation_checkpointing=layer --set fused_update=on \
  --set checkpoint_every=0 --set eval_every=0 >"$tmp/lean.log" 2>&1
check "a pure-bf16 checkpointed, fused run exits 0" test $? = 0
check "it trains 4 finite steps" test "$(grep -c '"loss":[0-9]' "$tmp/lean/metrics.jsonl")" = 4
# The same with layer 1's weights in pinned host memory (offload.layers), fetched through a device
# slot on the copy streams: the same losses and final weights, byte for byte.
"$GRASS" train "$tmp/run.json" --set out_dir="$tmp/streamed" --set precision=bf16 --set steps=4 \
  --set total_batch_size=4 --set activation_checkpointing=layer --set fused_update=on \
  --set checkpoint_every=0 --set eval_every=0 --set offload.layers=1 >"$tmp/streamed.log" 2>&1
check "the run with a streamed layer exits 0" test $? = 0
check "its layer's weights are in pinned host memory" \
  grep -q "offload       layers 1: their matrices, .* in pinned host memory, through 1 device slot:" "$tmp/streamed.log"
check "streamed: the same losses and gradient norms" \
  diff <(losses "$tmp/lean/metrics.jsonl") <(losses "$tmp/streamed/metrics.jsonl")
check "streamed: the final weights byte for byte" \
  cmp -s "$tmp/lean/model/model.safetensors" "$tmp/streamed/model/model.safetensors"
# A machine that cannot pin the host tier (cudaHostAlloc fails past the emulator's limit: the
# backend's 32 MiB staging ring and 4 KiB more): one line naming the key and the bytes, before
# anything is written; and one that cannot pin the staging ring, one line too
CUDA_EMU_PINNED_LIMIT=$(((32 << 20) + 4096)) "$GRASS" train "$tmp/run.json" --set out_dir="$tmp/unpinned" \
  --set precision=bf16 --set total_batch_size=4 --set activation_checkpointing=layer \
  --set fused_update=on --set offload.layers=1 >"$tmp/unpinned.log" 2>&1
check "a host tier that cannot be pinned exits 2" test $? = 2
check "in one line naming offload.layers and the bytes, nothing written" \
  sh -c "[ \"\$(grep -c . '$tmp/unpinned.log')\" = 1 ] && grep -q '^error: offload.layers: cannot allocate .* of pinned host memory for layer 1 weights (offload.layers) (0 B of the host tier already held)' '$tmp/unpinned.log' && [ ! -e '$tmp/unpinned' ]"
CUDA_EMU_PINNED_LIMIT=4096 "$GRASS" train "$tmp/run.json" --set out_dir="$tmp/unpinned" \
  >"$tmp/no_staging.log" 2>&1
check "no staging ring: exit 2, one line, nothing written" \
  sh -c "[ $? = 2 ] && [ \"\$(grep -c . '$tmp/no_staging.log')\" = 1 ] && grep -q '^error: cannot allocate 32.0 MiB of pinned host memory for the CUDA backend.s staging ring' '$tmp/no_staging.log' && [ ! -e '$tmp/unpinned' ]"

# The emulator has no cuDNN: attention "cudnn" is one error line and nothing written.
"$GRASS" train "$tmp/run.json" --set out_dir="$tmp/cudnn" --set attention=cudnn >"$tmp/cudnn.log" 2>&1
check "attention cudnn without cuDNN exits 2" test $? = 2
check "and says the build has none" grep -q 'attention: "cudnn" but this grass was built without' "$tmp/cudnn.log"
check "and writes nothing" test ! -e "$tmp/cudnn/metrics.jsonl"

# The checks below run in the plain variant only (the poison and deferred variants set
# GRASS_POISON or CUDA_EMU_STREAMS): their kernels' tests run in every mode on their own.
variant_plain() { [ -z "${GRASS_POISON:-}" ] && [ -z "${CUDA_EMU_STREAMS:-}" ]; }
if variant_plain; then
# attention "mma": its backward's path B forced (GRASS_MMA_BACKWARD, for A/B timing) trains to
# path A's losses, bit for bit on the emulator; a value that is neither a nor b is one line, and
# nothing is written
for path in a b; do
  GRASS_MMA_BACKWARD=$path "$GRASS" train "$tmp/run.json" --set out_dir="$tmp/mma_$path" \
    --set attention=mma --set steps=2 --set checkpoint_every=0 --set eval_every=0 \
    >"$tmp/mma_$path.log" 2>&1
  check "attention mma, backward path $path, exits 0" test $? = 0
done
check "paths A and B train to the same losses" \
  sh -c "grep -o '\"loss\":[^,]*' '$tmp/mma_a/metrics.jsonl' >'$tmp/mma_a.losses' &&
         grep -o '\"loss\":[^,]*' '$tmp/mma_b/metrics.jsonl' >'$tmp/mma_b.losses' &&
         [ \"\$(grep -c . '$tmp/mma_a.losses')\" = 2 ] && cmp -s '$tmp/mma_a.losses' '$tmp/mma_b.losses'"
GRASS_MMA_BACKWARD=c "$GRASS" train "$tmp/run.json" --set out_dir="$tmp/mma_c" --set attention=mma \
  >"$tmp/mma_c.log" 2>&1
check "GRASS_MMA_BACKWARD=c: exit 2, one line naming it, nothing written" \
  sh -c "[ $? = 2 ] && [ \"\$(grep -c . '$tmp/mma_c.log')\" = 1 ] && grep -q '^error: GRASS_MMA_BACKWARD: \"c\" is neither a nor b' '$tmp/mma_c.log' && [ ! -e '$tmp/mma_c' ]"
# path A at a sequence it does not take (T 300, over its 256: llama_tiny with room for it)
sed 's/"max_position_embeddings": 256/"max_position_embeddings": 512/' configs/models/llama_tiny.json \
  >"$tmp/tiny_512.json"
GRASS_MMA_BACKWARD=a "$GRASS" train "$tmp/run.json" --set out_dir="$tmp/mma_a300" --set attention=mma \
  --set model="$tmp/tiny_512.json" --set seq_len=300 >"$tmp/mma_a300.log" 2>&1
check "GRASS_MMA_BACKWARD=a at T 300: exit 2, one line, nothing written" \
  sh -c "[ $? = 2 ] && [ \"\$(grep -c . '$tmp/mma_a300.log')\" = 1 ] && grep -q '^error: GRASS_MMA_BACKWARD=a: path A of the mma backward does not take HD 16, T 300' '$tmp/mma_a300.log' && [ ! -e '$tmp/mma_a300' ]"
fi

for optimizer in galore flora; do
  for precision in bf16-mixed bf16; do
    run="$optimizer-$precision"
    "$GRASS" train "$tmp/run.json" --set out_dir="$tmp/$run" --set precision=$precision \
      --set optimizer="{\"name\": \"$optimizer\", \"rank\": 8, \"update_interval\": 3, \"lr\": 3e-3}" \
      --set steps=6 --set total_batch_size=4 --set checkpoint_every=0 --set eval_every=0 \
      >"$tmp/$run.log" 2>&1
    check "$run exits 0" test $? = 0
    check "$run trains 6 finite steps" test "$(grep -c '"loss":[0-9]' "$tmp/$run/metrics.jsonl")" = 6
  done
done
# GaLore's svd "auto" is the randomized range finder on the device (cuSOLVER emulated by LAPACK)
check "GaLore refreshes on the device" grep -q "randomized SVD every 3 steps.*on the GPU" "$tmp/galore-bf16.log"
# and with refresh_stagger each target at its own step of the interval: a refresh (and its
# cuSOLVER status read) at every step
if variant_plain; then
"$GRASS" train "$tmp/run.json" --set out_dir="$tmp/galore-staggered" \
  --set optimizer='{"name": "galore", "rank": 8, "update_interval": 3, "lr": 3e-3, "refresh_stagger": true}' \
  --set steps=6 --set total_batch_size=4 --set checkpoint_every=0 --set eval_every=0 \
  >"$tmp/galore-staggered.log" 2>&1
check "staggered GaLore exits 0" test $? = 0
check "staggered GaLore trains 6 finite steps" test "$(grep -c '"loss":[0-9]' "$tmp/galore-staggered/metrics.jsonl")" = 6
check "and says it staggers" grep -q "randomized SVD every 3 steps.*each target at its own step of the interval" "$tmp/galore-staggered.log"
# svd_batch "layer": each layer's eigenproblems in one cusolverDnXsyevBatched call (the
# emulator's: syevd for each matrix), in a refresh pass before the step's backward; the same
# projections, so the same losses as galore-bf16's per-target refreshes
"$GRASS" train "$tmp/run.json" --set out_dir="$tmp/galore-batched" --set precision=bf16 \
  --set optimizer='{"name": "galore", "rank": 8, "update_interval": 3, "lr": 3e-3, "svd_batch": "layer"}' \
  --set steps=6 --set total_batch_size=4 --set checkpoint_every=0 --set eval_every=0 \
  >"$tmp/galore-batched.log" 2>&1
check "batched GaLore exits 0" test $? = 0
check "and says it batches" grep -q "randomized SVD every 3 steps.*each layer's eigenproblems in one batched call" "$tmp/galore-batched.log"
check "batched GaLore's losses are the per-target refreshes'" \
  sh -c "[ \"\$(grep -o '\"loss\":[^,]*' '$tmp/galore-batched/metrics.jsonl')\" = \"\$(grep -o '\"loss\":[^,]*' '$tmp/galore-bf16/metrics.jsonl')\" ] && [ \"\$(grep -c '\"loss\":[0-9]' '$tmp/galore-batched/metrics.jsonl')\" = 6 ]"
fi

echo "cuda_emu_cli: $passes passed, $failures failed"
[ "$failures" = 0 ] || for log in "$tmp"/*.log; do echo "--- $log"; cat "$log"; done
[ "$failures" = 0 ]
