#!/usr/bin/env bash
# Validation loss of AdamW against GRASS (top_r and multinomial_nr, r = 32 = d/4) for the
# quickstart model on the bundled C4-format sample, at equal steps: a table and
# docs/img/grass_curves.png (docs/experiments.md). Run scripts/run.sh once first (it prepares
# the sample's shards). GRASS uses GaLore's lr 0.01 with scale 0.25 (the dense embeddings, norms
# and lm_head train at 0.01); AdamW runs at the quickstart's 3e-3 and at 0.01, so the learning
# rate and the method can be told apart.
set -euo pipefail
cd "$(dirname "$0")/../.."
[ -f data/c4_sample/tokens/train.manifest.json ] || { echo "run scripts/run.sh first" >&2; exit 2; }
common=(--set eval_every=100 --set steps=600)
build/grass train configs/runs/quickstart.json "${common[@]}" --set out_dir=runs/curves_adamw >/dev/null
build/grass train configs/runs/quickstart.json "${common[@]}" --set out_dir=runs/curves_adamw_lr01 \
  --set optimizer.lr=0.01 >/dev/null
for sel in top_r multinomial_nr; do
  build/grass train configs/runs/quickstart.json "${common[@]}" --set out_dir=runs/curves_$sel \
    --set optimizer.name=grass --set optimizer.rank=32 --set optimizer.update_interval=200 \
    --set optimizer.scale=0.25 --set optimizer.lr=0.01 --set optimizer.selection=$sel >/dev/null
done
mkdir -p docs/img
/usr/bin/python3 tools/plot_curves.py --out docs/img/grass_curves.png \
  --title "quickstart model on the C4-format sample: AdamW vs GRASS r=32" \
  "AdamW lr 3e-3=runs/curves_adamw/metrics.jsonl" "AdamW lr 1e-2=runs/curves_adamw_lr01/metrics.jsonl" \
  "GRASS top_r=runs/curves_top_r/metrics.jsonl" \
  "GRASS multinomial_nr=runs/curves_multinomial_nr/metrics.jsonl"
