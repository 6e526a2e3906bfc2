#!/usr/bin/env bash
# CPU step time of AdamW against GRASS at r = m/8 and m/4 (m: hidden size, the selectable side of
# the attention projections), for llama_tiny and llama_60m, with the FLOP ratio GRASS.md predicts
# (docs/experiments.md). Batch 4 x 256, 8 steps (median of steps 2-8), no refresh inside the run
# except step 0's.
#   scripts/experiments/grass_step_time.sh [model ...]
set -euo pipefail
cd "$(dirname "$0")/../.."
models=("$@"); [ ${#models[@]} -eq 0 ] && models=(tiny 60m)
scripts/build.sh >/dev/null
mkdir -p data/synthetic
echo "| model | optimizer | FLOPs/token | FLOP ratio | step ms | time ratio |"
echo "|---|---|---|---|---|---|"
for m in "${models[@]}"; do
  cfg=configs/models/llama_$m.json
  hidden=$(sed -n 's/.*"hidden_size": *\([0-9]*\).*/\1/p' "$cfg")
  vocab=$(sed -n 's/.*"vocab_size": *\([0-9]*\).*/\1/p' "$cfg")
  shard=data/synthetic/bench_v$vocab.bin
  [ -f "$shard" ] || build/make_synthetic_shard --out "$shard" --vocab "$vocab" --tokens 2000000 >/dev/null
  base_flops=""; base_ms=""
  for setting in "adamw" "grass $((hidden / 8))" "grass $((hidden / 4))"; do
    read -r name rank <<<"$setting"
    args=(--set model="$cfg" --set data.train="$shard" --set micro_batch_size=4
          --set total_batch_size=4 --set seq_len=256 --set steps=8 --set out_dir=runs/grass_step_time
          --set optimizer.name="$name" --set optimizer.lr=1e-3)
    [ "$name" = grass ] && args+=(--set optimizer.rank="$rank" --set optimizer.update_interval=1000)
    rm -rf runs/grass_step_time  # a fresh run each setting, never a resumed or refused one
    out=$(build/grass train configs/runs/bench_tiny.json "${args[@]}")
    flops=$(echo "$out" | sed -n 's/^  FLOPs\/token *\([0-9.e+]*\).*/\1/p')
    tok_s=$(echo "$out" | sed -n 's/.*median \([0-9.]*\) tok\/s.*/\1/p')
    ms=$(awk -v t="$tok_s" 'BEGIN { print 1024 / t * 1000 }')
    [ -z "$base_flops" ] && base_flops=$flops && base_ms=$ms
    label=$name; [ "$name" = grass ] && label="grass r=$rank"
    awk -v m="$m" -v l="$label" -v f="$flops" -v bf="$base_flops" -v ms="$ms" -v bms="$base_ms" \
      'BEGIN { printf "| %s | %s | %.4g | %.3f | %.1f | %.3f |\n", m, l, f, f / bf, ms, ms / bms }' 
  done
done
