#!/usr/bin/env bash
# grass against Hugging Face transformers (tools/peers/transformers_check.py), both ways: an
# export's loss under LlamaForCausalLM.from_pretrained, and a model transformers saved under
# `grass eval` and init_from, must equal the other side's within 1e-5. Runs in each peers
# environment there is (tools/peers/setup_venv.sh): PEERS_VENV (transformers 4.40.2) and
# TF5_VENV (the newest transformers 5.x; default: tf5-venv beside PEERS_VENV). Without either,
# reports "skipped" (exit 77): transformers is never a requirement of the tests.
set -uo pipefail
: "${GRASS:?set GRASS to the grass binary}"
: "${PEERS_VENV:?set PEERS_VENV to the peers environment}"
TF5_VENV=${TF5_VENV:-$(dirname "$PEERS_VENV")/tf5-venv}
ran=0
failed=0
for venv in "$PEERS_VENV" "$TF5_VENV"; do
  if ! "$venv/bin/python" -c "import transformers" >/dev/null 2>&1; then
    echo "no peers environment at $venv (tools/peers/setup_venv.sh makes it): not run"
    continue
  fi
  ran=$((ran + 1))
  "$venv/bin/python" tools/peers/transformers_check.py --grass "$GRASS" || failed=1
done
if [ "$ran" -eq 0 ]; then
  echo "skipped: no peers environment at $PEERS_VENV or $TF5_VENV"
  exit 77
fi
exit "$failed"
