#!/usr/bin/env bash
# GPU verification, one command for a machine with an NVIDIA GPU (docs/gpu-status.md):
#   1. builds for the GPU present (sm_90 for H100/H200 by default; CUDA_ARCH=80 for A100) in
#      build-gpu/, and runs the GPU tests (ctest label gpu: every kernel and the whole model
#      against the CPU reference);
#   2. trains llama_60m on the bundled C4-format sample for STEPS (default 300) steps, bf16-mixed;
#   3. benchmarks tokens/s and MFU of llama_60m, 350m and 1b, AdamW against GRASS at GaLore's
#      ranks (128, 256, 512), at seq_len 256 (GaLore's shape) on a synthetic token shard.
# Prints a table last. With $OUT set (the device tool), every log goes there too.
#   scripts/gpu_check.sh [--skip-bench]
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/cuda/bin:$PATH"
out=${OUT:-build-gpu/check}
mkdir -p "$out"
bench=1; [ "${1:-}" = "--skip-bench" ] && bench=0
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/gpu.txt"
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
echo "commit $commit" | tee -a "$out/gpu.txt"

gen=Ninja; command -v ninja >/dev/null || gen="Unix Makefiles"
cmake -S . -B build-gpu -G "$gen" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCH:-90}" ${CMAKE_ARGS:-} >"$out/configure.log" 2>&1 &&
  cmake --build build-gpu -j "$(nproc)" >"$out/build.log" 2>&1 ||
  { tail -30 "$out/build.log"; echo "gpu_check: build failed (log: $out/build.log)"; exit 1; }

status=0
(cd build-gpu && ./tests/grass_gpu_tests --reporter compact) >"$out/gpu_tests.log" 2>&1 || status=1
tail -5 "$out/gpu_tests.log"

sample=data/c4_sample
if [ ! -f "$sample/tokens/train.manifest.json" ] || [ ! -f "$sample/tokens/val.manifest.json" ]; then
  rm -rf "$sample/tokens"
  build-gpu/grass prepare --input "$sample/c4-train.00000-of-00001.json.gz" \
    --tokenizer "$sample/tokenizer.model" --out "$sample/tokens" --prefix train >/dev/null
  build-gpu/grass prepare --input "$sample/c4-validation.00000-of-00001.json.gz" \
    --tokenizer "$sample/tokenizer.model" --out "$sample/tokens" --prefix val >/dev/null
fi
build-gpu/grass train configs/runs/quickstart.json --set model=configs/models/llama_60m.json \
  --set precision=bf16-mixed --set device=cuda --set steps="${STEPS:-300}" --set eval_every=100 \
  --set micro_batch_size=32 --set total_batch_size=64 --set seq_len=256 --set optimizer.lr=1e-3 \
  --set log_every=50 --set out_dir=build-gpu/check_60m >"$out/train_60m.log" 2>&1 || status=1
grep -E "^(step|eval|done)" "$out/train_60m.log" | tail -6

table="$out/bench.md"
echo "| model | optimizer | micro-batch | tok/s (median) | MFU | memory (arena peak) |" >"$table"
echo "|---|---|---|---|---|---|" >>"$table"
if [ $bench = 1 ]; then
  shard=build-gpu/bench_v32000.bin
  [ -f $shard ] || build-gpu/make_synthetic_shard --out $shard --vocab 32000 --tokens 20000000 >/dev/null
  for spec in "60m 64 128" "350m 32 256" "1b 16 512"; do
    read -r m micro rank <<<"$spec"
    for opt in adamw grass; do
      args=(--set model=configs/models/llama_$m.json --set data.train=$shard --set device=cuda
            --set precision=bf16-mixed --set micro_batch_size=$micro --set total_batch_size=$micro
            --set seq_len=256 --set steps=12 --set log_every=4 --set optimizer.name=$opt
            --set out_dir=build-gpu/bench_${m}_$opt)
      [ $opt = grass ] && args+=(--set optimizer.rank=$rank --set optimizer.update_interval=200)
      log="$out/bench_${m}_$opt.log"
      build-gpu/grass train configs/runs/bench_60m.json "${args[@]}" >"$log" 2>&1 || status=1
      tok=$(sed -n 's/.*median \([0-9.]*\) tok\/s.*/\1/p' "$log")
      mfu=$(sed -n 's/.*tok\/s, MFU \([0-9.]*%\).*/\1/p' "$log")
      mem=$(grep '^step' "$log" | tail -1 | sed -n 's/.*| mem \([^|]*\).*/\1/p')
      label=$opt; [ $opt = grass ] && label="grass r=$rank"
      echo "| llama_$m | $label | $micro x 256 | ${tok:-failed} | ${mfu:-n/a} | ${mem:-} |" >>"$table"
    done
  done
fi
echo
echo "gpu_check: commit $commit, $(head -1 "$out/gpu.txt")"
echo "gpu tests: $(grep -E 'passed|failed' "$out/gpu_tests.log" | tail -1)"
echo "train 60m: $(grep -E '^eval' "$out/train_60m.log" | tail -1)"
cat "$table"
exit $status
