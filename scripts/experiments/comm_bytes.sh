#!/usr/bin/env bash
# What one rank of a data-parallel run sums with the others per optimizer step (docs/experiments.md,
# "Communication"), from `grass mem`'s plan (the CPU runs count the same bytes: tests/data_parallel.sh
# checks them equal): llama_60m ... llama_13b in pure bf16 (bf16 gradients), AdamW against GRASS
# top_r, GaLore and FLORA at GaLore's ranks (60M 128, 130M 256, 350M 256, 1B 512, 7B 1024) and
# GRASS's 256 at 13B; every step, at a refresh (GRASS's and GaLore's full fp32 gradients), and the
# mean over K = 200 steps. Prints a markdown table; planning allocates nothing, so it takes seconds.
#   scripts/experiments/comm_bytes.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
[ -x build/grass ] || scripts/build.sh >/dev/null
K=200
echo "| model | rank | AdamW | GRASS top_r | GaLore | FLORA | GRASS at a refresh | GRASS, mean over K = $K | AdamW / GRASS mean |"
echo "|---|---|---|---|---|---|---|---|---|"
for entry in 60m:128 130m:256 350m:256 1b:512 7b:1024 13b:256; do
  size=${entry%%:*} rank=${entry#*:}
  declare -A step refresh
  for opt in adamw grass galore flora; do
    if [ $opt = adamw ]; then optimizer='{"name":"adamw","lr":0.001}'
    else optimizer="{\"name\":\"$opt\",\"lr\":0.01,\"rank\":$rank,\"update_interval\":$K}"; fi
    json=$(build/grass mem configs/runs/llama_13b_grass.json --json --device cuda \
           --set model=configs/models/llama_$size.json --set optimizer="$optimizer")
    step[$opt]=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["step_sum_bytes"])' "$json")
    refresh[$opt]=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["refresh_sum_bytes"])' "$json")
  done
  python3 - "$size" "$rank" "$K" "${step[adamw]}" "${step[grass]}" "${step[galore]}" "${step[flora]}" "${refresh[grass]}" <<'PY'
import sys
size, rank, K = sys.argv[1], sys.argv[2], int(sys.argv[3])
adamw, grass, galore, flora, refresh = map(int, sys.argv[4:])
gib = lambda b: f"{b / 2**30:.2f} GiB" if b >= 2**30 else f"{b / 2**20:.0f} MiB"
mean = grass + refresh / K
print(f"| {size.upper()} | {rank} | {gib(adamw)} | {gib(grass)} | {gib(galore)} | {gib(flora)} | "
      f"+{gib(refresh)} | {gib(mean)} | {adamw / mean:.1f}x |")
PY
done
