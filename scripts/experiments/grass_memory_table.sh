#!/usr/bin/env bash
# `grass mem` for llama_60m ... llama_13b, full AdamW against GRASS r=256, as a markdown table
# (docs/experiments.md). Token batch: micro-batch 1 x 256. Nothing is allocated.
#   scripts/experiments/grass_memory_table.sh [rank]
set -euo pipefail
cd "$(dirname "$0")/../.."
rank=${1:-256}
[ -x build/grass ] || scripts/build.sh >/dev/null
echo "| model | params | AdamW: weights + grads + states | GRASS r=$rank: weights + grads + states | AdamW total | GRASS total |"
echo "|---|---|---|---|---|---|"
for m in 60m 130m 350m 1b 7b 13b; do
  out=$(build/grass mem configs/runs/llama_13b_grass.json --set model=configs/models/llama_$m.json \
          --set optimizer.rank="$rank")
  params=$(echo "$out" | sed -n 's/^model \([0-9.]* [MB]\) parameters.*/\1/p')
  # columns: label, GRASS value+unit, AdamW value+unit
  sum() { echo "$out" | awk -v col="$1" '
    function gib(v, u) { return u == "GiB" ? v : u == "MiB" ? v / 1024 : u == "KiB" ? v / 1048576 : v / 1073741824 }
    /^(weights|gradients|optimizer states)/ { n = split($0, f, /  +/); s += gib(f[col] + 0, substr(f[col], index(f[col], " ") + 1)) }
    END { printf "%.2f GiB", s }'; }
  total() { echo "$out" | awk -v col="$1" '/^total/ { n = split($0, f, /  +/); print f[col] }'; }
  echo "| llama_$m | $params | $(sum 3) | $(sum 2) | $(total 3) | $(total 2) |"
done
