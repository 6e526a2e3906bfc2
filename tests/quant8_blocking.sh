#!/usr/bin/env bash
# tools/quant8_blocking (issue 27's block-layout measurement) on a real checkpoint: a 3-step GRASS
# run of the tiny model, then the table of errors for flat and per-feature blocks, with a row per
# target kind and one for all; and its refusal of a run whose states are already 8-bit.
# Run by ctest with GRASS and QUANT8_BLOCKING set, from the source directory.
set -euo pipefail
: "${GRASS:?set GRASS to the grass binary}" "${QUANT8_BLOCKING:?set QUANT8_BLOCKING}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$(dirname "$GRASS")/make_synthetic_shard" --out "$tmp/train.bin" --vocab 512 --tokens 8000 >/dev/null
run() {
  "$GRASS" train configs/runs/bench_tiny.json --set data.train="$tmp/train.bin" --set steps=3 \
    --set optimizer.name=grass --set optimizer.rank=8 --set checkpoint_every=3 \
    --set out_dir="$tmp/$1" "${@:2}" >/dev/null
}
run fp32
out=$("$QUANT8_BLOCKING" "$tmp/fp32/checkpoints/step_00000003")
echo "$out"
for kind in all q_proj k_proj v_proj o_proj gate_proj up_proj down_proj; do
  grep -Eq "^\| $kind \| [0-9.]+ / [0-9.]+ \|" <<< "$out" || { echo "FAIL: no row for $kind"; exit 1; }
done
run q8 --set optimizer.state_dtype=q8
if "$QUANT8_BLOCKING" "$tmp/q8/checkpoints/step_00000003" 2>"$tmp/err"; then
  echo "FAIL: a q8 checkpoint was measured"; exit 1
fi
grep -q "not a GRASS run with unquantized states" "$tmp/err" || { cat "$tmp/err"; exit 1; }
echo "quant8_blocking: ok"
