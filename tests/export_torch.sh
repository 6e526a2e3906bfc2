#!/usr/bin/env bash
# The export round trip live, where PyTorch is installed (Debian python3-torch, /usr/bin/python3):
# tools/reference/make_export_fixture.py trains with the real binary, exports fp32 and bf16,
# loads each export as Hugging Face would and requires the reference's float64 validation loss to
# match the engine's within 1e-5. Without torch it reports "skipped" (exit 77): tests/test_export.cpp
# checks the committed fixture that the same script wrote, so CI needs no torch.
set -uo pipefail
: "${GRASS:?set GRASS to the grass binary}"
if ! /usr/bin/python3 -c "import torch" >/dev/null 2>&1; then
  echo "skipped: /usr/bin/python3 has no torch (apt-get install python3-torch)"
  exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
/usr/bin/python3 tools/reference/make_export_fixture.py --grass "$GRASS" --out "$tmp/fixture"
