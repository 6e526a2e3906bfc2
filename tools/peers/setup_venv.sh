#!/usr/bin/env bash
# Makes the virtual environment the peer checks run in (tools/peers/README.md): build/peers-venv,
# on Debian's python3 with its python3-torch (1.13, CPU), plus Hugging Face transformers from
# PyPI. Never a requirement of the tests: the ctest that uses it reports "skipped" without it.
#   tools/peers/setup_venv.sh [VENV_DIR]
set -euo pipefail
cd "$(dirname "$0")/../.."
venv=${1:-build/peers-venv}
# transformers 4.40 is the last line that supports torch 1.13 (Debian's); safetensors comes with it.
transformers_pin="transformers==4.40.2"
if ! /usr/bin/python3 -c "import torch" 2>/dev/null; then
  echo "setup_venv: /usr/bin/python3 has no torch: apt-get install python3-torch python3-venv" >&2
  exit 1
fi
/usr/bin/python3 -m venv --system-site-packages "$venv"
"$venv/bin/pip" install --quiet --disable-pip-version-check "$transformers_pin"
"$venv/bin/python" -c "import torch, transformers; print('peers venv:', '$venv', 'torch', torch.__version__, 'transformers', transformers.__version__)"
