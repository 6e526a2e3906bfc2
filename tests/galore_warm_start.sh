#!/usr/bin/env bash
# tools/galore_warm_start (issue 46's warm-start study) on a real run: a 4-step GaLore run of the
# tiny model with checkpoints at steps 2 and 4, then the table: a row per target kind and one for
# all, every score a share in [0, 1] (the exact SVD's P is the optimum, so no method's energy may
# exceed it beyond rounding), the fresh refresh with two power iterations within 1% of it; and its
# refusal of a single checkpoint.
# Run by ctest with GRASS and GALORE_WARM_START set, from the source directory.
set -euo pipefail
: "${GRASS:?set GRASS to the grass binary}" "${GALORE_WARM_START:?set GALORE_WARM_START}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$(dirname "$GRASS")/make_synthetic_shard" --out "$tmp/train.bin" --vocab 512 --tokens 8000 >/dev/null
"$GRASS" train configs/runs/bench_tiny.json --set data.train="$tmp/train.bin" --set steps=4 \
  --set optimizer.name=galore --set optimizer.rank=8 --set optimizer.update_interval=2 \
  --set checkpoint_every=2 --set checkpoint_keep_every=2 --set out_dir="$tmp/run" >/dev/null
study() {
  "$GALORE_WARM_START" configs/runs/bench_tiny.json --set data.train="$tmp/train.bin" \
    --set optimizer.name=galore --set optimizer.rank=8 "$@"
}
out=$(study --weights "$tmp/run/checkpoints/step_00000002" \
            --weights "$tmp/run/checkpoints/step_00000004/model.safetensors")
echo "$out"
for kind in q_proj k_proj v_proj o_proj gate_proj up_proj down_proj; do
  grep -Eq "^step_00000004 +$kind( +[0-9.]+){12}$" <<< "$out" || { echo "FAIL: no row for $kind"; exit 1; }
done
# the mean row "all": energy and cos2 for each of the 6 methods
all=$(grep -E "^all " <<< "$out") || { echo "FAIL: no row for all"; exit 1; }
awk '{ if (NF != 13) { print "FAIL: " NF " fields in: " $0; exit 1 }
       for (i = 2; i <= 13; i++) if ($i < 0 || $i > 1.000001) { print "FAIL: score " $i " outside [0, 1]"; exit 1 }
       if ($6 < 0.99) { print "FAIL: fresh, 2 power iterations keeps " $6 " of the optimum"; exit 1 } }' <<< "$all"
if study --weights "$tmp/run/checkpoints/step_00000002" 2>"$tmp/err"; then
  echo "FAIL: one checkpoint was measured"; exit 1
fi
grep -q "at least two checkpoints" "$tmp/err" || { cat "$tmp/err"; exit 1; }
echo "galore_warm_start: ok"
