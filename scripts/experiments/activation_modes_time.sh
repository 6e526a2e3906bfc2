#!/usr/bin/env bash
# Table E's time column (docs/experiments.md): the step time of each way of keeping activations at
# its Table E micro-batch (runs/compare/e/MODEL/batches.txt, written by compare_optimizers.sh e),
# AdamW on the bundled sample, one thread, 14 steps (median of steps 5-14), in alternating rounds
# so that the machine's drift falls on every mode alike. --set passes a run key to every run (another
# optimizer: --set optimizer.name=grass ...), --tag names that variant's folder (DIR/e_time<TAG>).
#   scripts/experiments/activation_modes_time.sh [--out DIR] [--rounds 3] [--tag T] [--set k=v ...]
#                                                [model ...]
set -euo pipefail
cd "$(dirname "$0")/../.."
out=runs/compare rounds=3 models=() extra=() tag=
while [ $# -gt 0 ]; do
  case $1 in
    --out) out=$2; shift ;;
    --rounds) rounds=$2; shift ;;
    --tag) tag=$2; shift ;;
    --set) extra+=(--set "$2"); shift ;;
    *) models+=("$1") ;;
  esac
  shift
done
[ ${#models[@]} -gt 0 ] || models=(quickstart_tied quickstart)
[ -x build/grass ] || scripts/build.sh >/dev/null
median_ms() {  # the median step_ms of steps 5.. in a metrics.jsonl
  /usr/bin/python3 -c 'import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if "\"step_ms\"" in l]
print(statistics.median(r["step_ms"] for r in rows if r["step"] >= 5))' "$1"
}
declare -A times
for model in "${models[@]}"; do
  batches=$out/e/$model/batches.txt
  [ -f "$batches" ] || { echo "$batches is missing: run compare_optimizers.sh e first" >&2; exit 2; }
  for ((round = 1; round <= rounds; round++)); do
    while read -r mode micro _; do
      case $mode in
        wta-crs_*) sets=(--set activations.sample=wta-crs --set activations.keep="${mode#wta-crs_}") ;;
        none) sets=(--set activation_checkpointing=none --set activations.selected_columns=off) ;;
        columns) sets=(--set activation_checkpointing=none --set activations.selected_columns=on) ;;
        *) sets=(--set activation_checkpointing="$mode") ;;
      esac
      dir=$out/e_time$tag/$model/$mode
      rm -rf "$dir"
      OMP_NUM_THREADS=1 build/grass train configs/runs/quickstart.json \
        --set model=configs/models/llama_$model.json --set micro_batch_size="$micro" \
        --set total_batch_size="$micro" --set steps=14 --set eval_every=0 --set eval_tokens=1 \
        --set log_every=100 --set checkpoint_every=0 --set out_dir="$dir" ${extra[@]+"${extra[@]}"} \
        "${sets[@]}" >/dev/null
      times[$model/$mode]+=" $(median_ms "$dir/metrics.jsonl")"
      echo "[e time] $model $mode round $round: ${times[$model/$mode]##* } ms" >&2
    done <"$batches"
  done
done
echo "| model | activations | sequences | step ms, each round | tok/s (median round) |"
echo "|---|---|---|---|---|"
for model in "${models[@]}"; do
  while read -r mode micro _; do
    read -r -a ms <<<"${times[$model/$mode]}"
    median=$(printf '%s\n' "${ms[@]}" | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }')
    awk -v m="$model" -v mode="$mode" -v b="$micro" -v all="$(printf '%.0f ' "${ms[@]}")" -v med="$median" \
      'BEGIN { printf "| %s | %s | %d | %s | %.0f |\n", m, mode, b, all, b * 128 * 1000 / med }'
  done <"$out/e/$model/batches.txt"
done
