#!/usr/bin/env bash
# Step times of the features added after the first GPU run, on a lent GPU, after
# scripts/gpu_first_run.sh has built build-gpu/ (docs/gpu-status.md). Each run is LLaMA-1B in
# bf16-mixed, 16 x 256 tokens a step, a few steps, on the engine's attention kernels (pinned, so the
# rows compare with the figures before attention "auto" became the default; `cudnn` and `auto`
# name theirs); the table gives each step's time, tok/s, host waits and device memory from
# metrics.jsonl, so a refresh step stands beside a plain one.
#
#   tools/gpu/timing_runs.sh [--budget SECONDS] [--runs NAME,...]
#
#   plain        AdamW, activation_checkpointing "none"  (the reference for the next three)
#   elementwise  activation_checkpointing "elementwise"  (n1, n2 and SwiGLU recomputed)
#   wta-crs      activations {"sample": "wta-crs", "keep": 0.5}: drawn on the device with no
#                host wait, beside the compute on a side stream (issue 46 item 2)
#   wta-crs-inline the same with GRASS_SIDE_STREAM=0: the draws on the compute stream (the side
#                stream's A/B in one build)
#   q8           optimizer.state_dtype "q8" (8-bit moments; issue 27's kernels)
#   galore       GaLore r=512, a device refresh (cuSOLVER) at steps 0, 2 and 4
#   grass-whole  GRASS r=512 (its refresh at step 0), inputs kept whole
#   grass-columns the same, n2 kept as gate's and up's selected columns (issue 28)
#   cudnn        AdamW with attention "cudnn" (RoPE rotated in place in the packed q, k, v)
#   auto         AdamW with attention "auto", the default: cuDNN's where it builds (issue 45 item 1)
#   t5-adamw     AdamW at T5's batch: 512 x 256 tokens a step in micro-batches of 64
#   t5-grass     GRASS r=512 at the same batch (refresh at step 0; q|k|v's G_C one stacked GEMM,
#                issue 45 item 3): not run by default; --runs t5-adamw,t5-grass --rounds 3
#                alternates them on one warm GPU (the GRASS-against-AdamW figure)
# --runs keeps the named runs only (tools/gpu/ab_timing.sh runs them against another commit's
# build in alternating rounds); --rounds N runs the selection N times over, its runs named
# NAME#k from the second round.
# Output: one line per step on stdout and in $OUT/timing_runs.log when OUT is set.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
budget=150 only="" rounds=1
while [ $# -gt 0 ]; do
  case $1 in
    --budget) budget=${2:?--budget needs seconds}; shift 2 ;;
    --runs) only=${2:?--runs needs names}; shift 2 ;;
    --rounds) rounds=${2:?--rounds needs a count}; shift 2 ;;
    *) echo "timing_runs: unknown argument $1" >&2; exit 2 ;;
  esac
done
BUILD=${GRASS_BUILD_DIR:-build-gpu}
shard=$BUILD/first_run_v32000.bin
work=$BUILD/timing_runs
log=${OUT:-$work}/timing_runs.log
mkdir -p "$work" "$(dirname "$log")"
: >"$log"
[ -x "$BUILD/grass" ] || { echo "timing_runs: no $BUILD/grass (run scripts/gpu_first_run.sh first)" | tee -a "$log"; exit 1; }
[ -s "$shard" ] || "$BUILD"/make_synthetic_shard --out "$shard" --vocab 32000 --tokens 4000000 >/dev/null ||
  { echo "timing_runs: no shard" | tee -a "$log"; exit 1; }
# shellcheck source=tools/gpu/nvidia_lib_path.sh
. tools/gpu/nvidia_lib_path.sh
add_nvidia_lib_path "${PYTHON:-python3}"  # cuDNN's engines, for the cudnn run
deadline=$((SECONDS + budget))
base=(configs/runs/bench_60m.json --set model=configs/models/llama_1b.json --set "data.train=$shard"
      --set device=cuda --set precision=bf16-mixed --set micro_batch_size=16
      --set total_batch_size=16 --set seq_len=256 --set log_every=1 --set steps=4
      --set activation_checkpointing=none --set attention=grass)
runs=(
  "plain|"
  "elementwise|--set activation_checkpointing=elementwise"
  "wta-crs|--set activations.sample=wta-crs --set activations.keep=0.5"
  "wta-crs-inline|GRASS_SIDE_STREAM=0 --set activations.sample=wta-crs --set activations.keep=0.5"
  "q8|--set optimizer.state_dtype=q8"
  "galore|--set optimizer.name=galore --set optimizer.rank=512 --set optimizer.update_interval=2 --set steps=5"
  "grass-whole|--set optimizer.name=grass --set optimizer.rank=512 --set activations.selected_columns=off"
  "grass-columns|--set optimizer.name=grass --set optimizer.rank=512 --set activations.selected_columns=on"
  "cudnn|--set attention=cudnn"
  "auto|--set attention=auto"
  "t5-adamw|--set micro_batch_size=64 --set total_batch_size=512"
  "t5-grass|--set micro_batch_size=64 --set total_batch_size=512 --set optimizer.name=grass --set optimizer.rank=512"
)
default_off=",t5-adamw,t5-grass,"  # minutes of steps: only when named
printf '%-14s %4s %10s %9s %6s %s\n' run step step_ms tok/s waits loss | tee -a "$log"
for round in $(seq "$rounds"); do
for r in "${runs[@]}"; do
  name=${r%%|*}
  if [ -n "$only" ]; then [[ ",$only," != *",$name,"* ]] && continue
  elif [[ $default_off == *",$name,"* ]]; then continue; fi
  [ "$round" -gt 1 ] && name=$name#$round
  read -ra extra <<<"${r#*|}"
  envs=()  # a run's leading NAME=VALUE words: its environment
  while [ ${#extra[@]} -gt 0 ] && [[ ${extra[0]} =~ ^[A-Z_]+= ]]; do
    envs+=("${extra[0]}")
    extra=("${extra[@]:1}")
  done
  left=$((deadline - SECONDS))
  [ "$left" -lt 20 ] && { echo "$name: skipped (budget)" | tee -a "$log"; continue; }
  rm -rf "${work:?}/$name"
  timeout -k 5 "$left" env "${envs[@]}" "$BUILD"/grass train "${base[@]}" "${extra[@]}" \
    --set "out_dir=$work/$name" \
    >"$work/$name.out" 2>&1
  rc=$?
  if [ $rc != 0 ]; then
    echo "$name: exit $rc: $(grep -v '^step' "$work/$name.out" | tail -3 | tr '\n' ' ')" | tee -a "$log"
    continue
  fi
  python3 - "$name" "$work/$name/metrics.jsonl" <<'EOF' | tee -a "$log"
import json, sys
name, path = sys.argv[1], sys.argv[2]
for line in open(path):
    m = json.loads(line)
    if "step_ms" not in m:
        continue
    print(f"{name:<14} {m['step']:>4} {m['step_ms']:>10.1f} {m.get('tokens_per_s', 0):>9.0f} "
          f"{m.get('host_waits', -1):>6} {m.get('loss', float('nan')):.4f}")
EOF
  grep -E 'memory in use|late allocation|warning' "$work/$name.out" | head -2 | sed "s/^/$name: /" | tee -a "$log"
done
done
