#!/usr/bin/env bash
# The engine's 8-bit codes against bitsandbytes, live (tools/peers/bitsandbytes_check.py), in the
# torch2 peers environment (tools/peers/setup_venv.sh torch2). Without it, or without
# bitsandbytes there, reports "skipped" (exit 77): bitsandbytes is never a requirement of the tests.
set -uo pipefail
: "${QUANT8_CODES:?set QUANT8_CODES to the quant8_codes binary}"
: "${TORCH2_VENV:?set TORCH2_VENV to the torch2 peers environment}"
if ! "$TORCH2_VENV/bin/python" -c "import bitsandbytes" >/dev/null 2>&1; then
  echo "skipped: no bitsandbytes in $TORCH2_VENV (tools/peers/setup_venv.sh torch2 makes it)"
  exit 77
fi
exec "$TORCH2_VENV/bin/python" tools/peers/bitsandbytes_check.py --tool "$QUANT8_CODES"
