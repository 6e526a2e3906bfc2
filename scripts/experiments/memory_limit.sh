#!/usr/bin/env bash
# The memory-limit experiment (docs/experiments.md): for llama_60m ... llama_13b and full AdamW
# (bf16-mixed and pure bf16) against GRASS (pure bf16, r = 128, 256, 512) and GaLore and FLORA
# (pure bf16, r = 256), at a token batch of
# 1 x 256 with per-layer activation checkpointing: the planned peak (and without checkpointing),
# whether it fits in 24/32/40/80 GiB, and the largest token batch under a 40 GiB cap. Prints a
# markdown table; writes the rows as JSON lines and a PNG chart.
#
#   scripts/experiments/memory_limit.sh [--measure] [--out DIR]
#
# Planning allocates nothing, so the table takes seconds on any machine. --measure also trains
# two steps of every row whose plan fits the GPU (on the bundled sample, which scripts/run.sh
# tokenizes) and adds the measured arena peak and the device memory in use (cudaMemGetInfo) next
# to the plan; without a usable GPU the measured columns say "no GPU".
# --out DIR: where memory_limit.jsonl and memory_limit.png go (default docs/img).
set -euo pipefail
cd "$(dirname "$0")/../.."
measure=0
out=docs/img
while [ $# -gt 0 ]; do
  case $1 in
    --measure) measure=1 ;;
    --out) out=$2; shift ;;
    *) echo "usage: $0 [--measure] [--out DIR]" >&2; exit 2 ;;
  esac
  shift
done
[ -x build/grass ] || scripts/build.sh >/dev/null
mkdir -p "$out"
rows="$out/memory_limit.jsonl"
: >"$rows"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

gpu_memory=0  # bytes of the GPU, when --measure finds one
if [ "$measure" = 1 ] && command -v nvidia-smi >/dev/null && nvidia-smi >/dev/null 2>&1; then
  gpu_memory=$(( $(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1) * 1024 * 1024 ))
  [ -f data/c4_sample/tokens/train_00000.bin ] || { echo "--measure: run scripts/run.sh first (it tokenizes the sample)" >&2; exit 2; }
fi

base=configs/runs/llama_13b_grass.json  # pure bf16, GRASS r=256, checkpointing per layer
GiB=$((1024 * 1024 * 1024))
gib() { awk -v b="$1" 'BEGIN { printf "%.2f", b / 1073741824 }'; }
field() { sed -n "s/.*\"$1\":\([^,}]*\).*/\1/p" <<<"$2" | tr -d '"'; }  # a flat JSON line
# a top-level key of grass mem --json (its "verdict" object repeats some names)
plan_key() { python3 -c 'import json, sys; print(json.loads(sys.argv[2])[sys.argv[1]])' "$1" "$2"; }

echo "| model | optimizer | precision | peak GiB (checkpointing) | peak GiB (none) | 24 | 32 | 40 | 80 | largest token batch under 40 GiB | measured GiB (arena / device) |"
echo "|---|---|---|---|---|---|---|---|---|---|---|"
for m in 60m 130m 350m 1b 7b 13b; do
  for opt in "adamw bf16-mixed" "adamw bf16" "grass128 bf16" "grass256 bf16" "grass512 bf16" \
             "galore256 bf16" "flora256 bf16"; do
    read -r name precision <<<"$opt"
    args=(--set model=configs/models/llama_$m.json --set precision="$precision")
    case $name in
      grass*) args+=(--set optimizer.rank="${name#grass}"); label="GRASS r=${name#grass}" ;;
      galore*) args+=(--set optimizer="{\"name\":\"galore\",\"lr\":0.01,\"rank\":${name#galore}}")
               label="GaLore r=${name#galore}" ;;
      flora*) args+=(--set optimizer="{\"name\":\"flora\",\"lr\":0.01,\"rank\":${name#flora}}")
              label="FLORA r=${name#flora}" ;;
      *) args+=(--set optimizer='{"name":"adamw","lr":0.001}'); label=AdamW ;;
    esac
    # exit 3: the run does not fit 40 GiB, still a plan
    plan=$(build/grass mem "$base" "${args[@]}" --device cuda --memory-limit 40GiB --json) || [ $? = 3 ]
    none=$(build/grass mem "$base" "${args[@]}" --device cuda --set activation_checkpointing=none --json)
    total=$(plan_key total "$plan")
    largest=$(plan_key largest_micro_batch "$plan")
    fits=""
    for cap in 24 32 40 80; do fits="$fits | $([ "$total" -le $((cap * GiB)) ] && echo yes || echo no)"; done
    measured="no GPU"
    if [ "$gpu_memory" -gt 0 ]; then
      measured="does not fit"
      if [ "$total" -lt "$gpu_memory" ]; then
        build/grass train "$base" "${args[@]}" --set device=cuda --set steps=2 \
          --set data.train=data/c4_sample/tokens/train_00000.bin --set out_dir="$tmp/run" \
          --set log_every=1 >"$tmp/log" 2>&1 || { tail -3 "$tmp/log" >&2; measured="failed"; }
        if [ -f "$tmp/run/metrics.jsonl" ] && [ "$measured" != failed ]; then
          last=$(tail -1 "$tmp/run/metrics.jsonl")
          measured="$(gib "$(field mem_bytes "$last")") / $(gib "$(field mem_device_used_bytes "$last")")"
        fi
        rm -rf "$tmp/run"
      fi
    fi
    echo "| llama_$m | $label | $precision | $(gib "$total") | $(gib "$(plan_key total "$none")")$fits | $((largest * 256)) | $measured |"
    echo "{\"model\":\"llama_$m\",\"optimizer\":\"$label\",\"precision\":\"$precision\",\"total\":$total,\"total_no_checkpointing\":$(plan_key total "$none"),\"largest_tokens_40gib\":$((largest * 256)),\"measured\":\"$measured\"}" >>"$rows"
  done
done
if /usr/bin/python3 -c "import matplotlib" 2>/dev/null; then
  /usr/bin/python3 tools/plot_memory.py "$rows" "$out/memory_limit.png"
else
  echo "(no chart: /usr/bin/python3 lacks matplotlib; apt-get install python3-matplotlib)" >&2
fi
