#!/usr/bin/env bash
# CPU training throughput of grass against the PyTorch reference (tools/reference/bench_torch.py)
# on the same model, batch and sequence length, run alternately on this machine.
#
#   scripts/bench_cpu.sh [model ...]      default: tiny 60m; needs /usr/bin/python3 with torch
#                                         (apt-get install python3-torch)
# Env: BATCH (4), SEQ_LEN (256), STEPS (8: the first is warm-up for both), ROUNDS (3),
#      TORCH_PYTHONS ("/usr/bin/python3"): the interpreters whose PyTorch to run, each its own
#      column (e.g. add a virtual environment with PyPI's torch 2.x).
# Each engine's figure per round is the median tokens/s of its steps after the first. The rounds
# alternate grass and every PyTorch so drifts in machine speed hit all; the table gives the
# median round of each and grass's ratio to it, and the ratio of the best rounds.
set -euo pipefail
cd "$(dirname "$0")/.."
batch=${BATCH:-4}; seq_len=${SEQ_LEN:-256}; steps=${STEPS:-8}; rounds=${ROUNDS:-3}
models=("$@"); [ ${#models[@]} -eq 0 ] && models=(tiny 60m)
threads=$(nproc)
scripts/build.sh >/dev/null

best() { sort -g | tail -1; }
median() { sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
echo "fp32 GEMM ceiling of this machine (build/bench_gemm):" >&2
build/bench_gemm >&2
read -r -a pythons <<<"${TORCH_PYTHONS:-/usr/bin/python3}"
header="| model | batch x seq | grass tok/s (median) |"
rule="|---|---|---|"
for py in "${pythons[@]}"; do
  v=$("$py" -c 'import torch; print(torch.__version__)')
  header+=" PyTorch $v tok/s (median) | ratio | ratio of best rounds |"
  rule+="---|---|---|"
done
echo "$header"
echo "$rule"
for m in "${models[@]}"; do
  cfg=configs/models/llama_$m.json
  vocab=$(/usr/bin/python3 -c "import json; print(json.load(open('$cfg'))['vocab_size'])")
  shard=data/synthetic/bench_v$vocab.bin
  mkdir -p data/synthetic
  [ -f "$shard" ] || build/make_synthetic_shard --out "$shard" --vocab "$vocab" --tokens 2000000 >/dev/null
  g=(); t=()  # t[k * rounds + r]: interpreter k's round r
  for ((r = 0; r < rounds; r++)); do
    rm -rf "runs/bench_$m"  # a fresh run each round, never a resumed or refused one
    g+=("$(build/grass train configs/runs/bench_tiny.json --set model="$cfg" --set data.train="$shard" \
          --set micro_batch_size="$batch" --set total_batch_size="$batch" --set seq_len="$seq_len" \
          --set steps="$steps" --set out_dir=runs/bench_$m \
        | sed -n 's/.*median \([0-9.]*\) tok\/s.*/\1/p')")
    for k in "${!pythons[@]}"; do
      t[k * rounds + r]="$("${pythons[k]}" tools/reference/bench_torch.py --model "$cfg" --batch "$batch" \
            --seq-len "$seq_len" --steps "$steps" --warmup 1 --threads "$threads" \
          | sed -n 's/^torch_tok_per_s \([0-9.]*\)/\1/p')"
    done
  done
  gm=$(printf '%s\n' "${g[@]}" | median); gb=$(printf '%s\n' "${g[@]}" | best)
  row=$(printf '| %s | %d x %d | %.1f |' "$m" "$batch" "$seq_len" "$gm")
  for k in "${!pythons[@]}"; do
    mine=("${t[@]:k * rounds:rounds}")
    tm=$(printf '%s\n' "${mine[@]}" | median); tb=$(printf '%s\n' "${mine[@]}" | best)
    row+=$(printf ' %.1f | %.2fx | %.2fx |' "$tm" "$(echo "$gm / $tm" | bc -l)" "$(echo "$gb / $tb" | bc -l)")
    echo "  rounds: ${pythons[k]}: ${mine[*]}" >&2
  done
  echo "$row"
  echo "  rounds: grass ${g[*]}" >&2
done
