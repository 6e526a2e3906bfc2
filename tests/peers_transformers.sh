#!/usr/bin/env bash
# grass against Hugging Face transformers (tools/peers/transformers_check.py): an export's loss
# under LlamaForCausalLM.from_pretrained must equal `grass eval`'s within 1e-5. Runs in the peers
# environment (tools/peers/setup_venv.sh); without it, reports "skipped" (exit 77): transformers
# is never a requirement of the tests.
set -uo pipefail
: "${GRASS:?set GRASS to the grass binary}"
: "${PEERS_VENV:?set PEERS_VENV to the peers environment}"
if ! "$PEERS_VENV/bin/python" -c "import transformers" >/dev/null 2>&1; then
  echo "skipped: no peers environment at $PEERS_VENV (tools/peers/setup_venv.sh makes it)"
  exit 77
fi
exec "$PEERS_VENV/bin/python" tools/peers/transformers_check.py --grass "$GRASS"
