#!/usr/bin/env bash
# GPU verification, one command for a machine with an NVIDIA GPU (docs/gpu-status.md):
#   1. builds for the GPU present (sm_90 for H100/H200 by default; CUDA_ARCH=80 for A100) in
#      build-gpu/, and runs the GPU tests (ctest label gpu: every kernel and the whole model
#      against the CPU reference);
#   2. trains llama_60m on the bundled C4-format sample for STEPS (default 300) steps, bf16-mixed;
#   3. benchmarks tokens/s and MFU of llama_60m, 350m and 1b, AdamW against GRASS at GaLore's
#      ranks (128, 256, 512), at GaLore's shape: seq_len 256 and a token batch of 512 x 256
#      per optimizer step (gradient accumulation over micro-batches of 64, 32 and 32 x 256), on a
#      synthetic token shard. Stepping the optimizer every micro-batch instead (16 x 256 = 4,096
#      tokens for 1B) would make the optimizer about 20% of the step and understate the MFU of
#      the setting the papers report.
# Prints a table last. With $OUT set (the device tool), every log goes there too. Where the
# machine lacks the build's -dev packages, carry build-deps/ (scripts/gpu_deps.sh makes it).
#   scripts/gpu_check.sh [--skip-bench]
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
export PATH="/usr/local/cuda/bin:$PATH"
out=${OUT:-build-gpu/check}
mkdir -p "$out"
bench=1; [ "${1:-}" = "--skip-bench" ] && bench=0
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/gpu.txt"
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
echo "commit $commit" | tee -a "$out/gpu.txt"

# carried .debs (scripts/gpu_deps.sh) for what the system lacks
if compgen -G "build-deps/debs/*.deb" >/dev/null && scripts/gpu_deps.sh --setup >"$out/deps.log" 2>&1; then
  # shellcheck disable=SC1091
  source build-deps/env.sh
fi
gen=Ninja; command -v ninja >/dev/null || gen="Unix Makefiles"
# shellcheck disable=SC2086
if ! { cmake -S . -B build-gpu -G "$gen" -DCMAKE_BUILD_TYPE=Release \
         -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCH:-90}" ${GRASS_DEPS_CMAKE_ARGS:-} ${CMAKE_ARGS:-} \
         >"$out/configure.log" 2>&1 &&
       cmake --build build-gpu -j "$(nproc)" >"$out/build.log" 2>&1; }; then
  tail -30 "$out/configure.log" "$out/build.log" 2>/dev/null
  echo "gpu_check: build failed (logs: $out/configure.log, $out/build.log)"
  exit 1
fi

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
rm -rf build-gpu/check_60m  # a fresh run, never a resumed one
build-gpu/grass train configs/runs/quickstart.json --set model=configs/models/llama_60m.json \
  --set precision=bf16-mixed --set device=cuda --set steps="${STEPS:-300}" --set eval_every=100 \
  --set micro_batch_size=32 --set total_batch_size=64 --set seq_len=256 --set optimizer.lr=1e-3 \
  --set log_every=50 --set out_dir=build-gpu/check_60m >"$out/train_60m.log" 2>&1 || status=1
grep -E "^(step|eval|done)" "$out/train_60m.log" | tail -6

table="$out/bench.md"
total=512  # GaLore's token batch: 512 sequences of 256 per optimizer step
echo "| model | optimizer | token batch (micro-batch x accumulation) | tok/s (median) | MFU | memory (arena peak) |" >"$table"
echo "|---|---|---|---|---|---|" >>"$table"
if [ $bench = 1 ]; then
  shard=build-gpu/bench_v32000.bin
  [ -f $shard ] || build-gpu/make_synthetic_shard --out $shard --vocab 32000 --tokens 20000000 >/dev/null
  for spec in "60m 64 128" "350m 32 256" "1b 32 512"; do
    read -r m micro rank <<<"$spec"
    for opt in adamw grass; do
      dir=build-gpu/bench_${m}_$opt
      rm -rf "$dir"  # a fresh run, never a resumed one
      args=(--set "model=configs/models/llama_$m.json" --set "data.train=$shard" --set device=cuda
            --set precision=bf16-mixed --set "micro_batch_size=$micro" --set "total_batch_size=$total"
            --set seq_len=256 --set steps=6 --set log_every=1 --set "optimizer.name=$opt"
            --set "out_dir=$dir")
      [ $opt = grass ] && args+=(--set "optimizer.rank=$rank" --set optimizer.update_interval=200)
      log="$out/bench_${m}_$opt.log"
      build-gpu/grass train configs/runs/bench_60m.json "${args[@]}" >"$log" 2>&1 || status=1
      tok=$(sed -n 's/.*median \([0-9.]*\) tok\/s.*/\1/p' "$log")
      mfu=$(sed -n 's/.*tok\/s, MFU \([0-9.]*%\).*/\1/p' "$log")
      mem=$(grep '^step' "$log" | tail -1 | sed -n 's/.*| mem \([^|]*\).*/\1/p')
      label=$opt; [ $opt = grass ] && label="grass r=$rank"
      echo "| llama_$m | $label | $total x 256 ($micro x 256 x $((total / micro))) | ${tok:-failed} | ${mfu:-n/a} | ${mem:-} |" >>"$table"
    done
  done
fi
echo
echo "gpu_check: commit $commit, $(head -1 "$out/gpu.txt")"
echo "gpu tests: $(grep -iE 'passed|failed' "$out/gpu_tests.log" | tail -1)"
echo "train 60m: $(grep -E '^eval' "$out/train_60m.log" | tail -1)"
cat "$table"
exit $status
