#!/usr/bin/env bash
# Makes a virtual environment the peer checks run in (tools/peers/README.md). Never a requirement
# of the tests: the ctest that uses one reports "skipped" without it.
#   tools/peers/setup_venv.sh [transformers]   build/peers-venv: Debian's python3 and its
#       python3-torch (1.13, CPU) plus Hugging Face transformers 4.40.2 from PyPI
#       (transformers_check.py)
#   tools/peers/setup_venv.sh tf5              build/tf5-venv: PyPI's torch 2.x (several GB) plus
#       the newest transformers 5.x (transformers_check.py, against the current release line)
#   tools/peers/setup_venv.sh torch2           build/torch2-venv: PyPI's torch 2.x (with its CUDA
#       libraries: several GB) plus galore-torch, flora-opt and what they import (train_peer.py,
#       compare_optimizers.sh peers, and bench_cpu.sh's PyTorch 2 anchor)
# VENV_DIR=<dir> puts the environment in <dir> instead of build/: the build directory whose
# ctest runs peers_transformers looks for <its build dir>/peers-venv and tf5-venv.
set -euo pipefail
cd "$(dirname "$0")/../.."
quiet=(--quiet --disable-pip-version-check)
venv_dir=${VENV_DIR:-build}
case ${1:-transformers} in
  transformers)
    venv=$venv_dir/peers-venv
    # transformers 4.40 is the last line that supports torch 1.13 (Debian's); safetensors comes with it.
    if ! /usr/bin/python3 -c "import torch" 2>/dev/null; then
      echo "setup_venv: /usr/bin/python3 has no torch: apt-get install python3-torch python3-venv" >&2
      exit 1
    fi
    /usr/bin/python3 -m venv --system-site-packages "$venv"
    "$venv/bin/pip" install "${quiet[@]}" "transformers==4.40.2"
    "$venv/bin/python" -c "import torch, transformers; print('peers venv:', '$venv', 'torch', torch.__version__, 'transformers', transformers.__version__)"
    ;;
  tf5)
    venv=$venv_dir/tf5-venv
    python3 -m venv "$venv"
    "$venv/bin/pip" install "${quiet[@]}" torch numpy "transformers>=5,<6"
    "$venv/bin/python" -c "import torch, transformers; print('tf5 venv:', '$venv', 'torch', torch.__version__, 'transformers', transformers.__version__)"
    ;;
  torch2)
    venv=$venv_dir/torch2-venv
    python3 -m venv "$venv"
    "$venv/bin/pip" install "${quiet[@]}" torch numpy "transformers<5"
    # Their declared requirements would pull more than they import on a CPU (galore-torch lists
    # bitsandbytes for its 8-bit optimizer; flora-opt imports bitsandbytes and accelerate at the
    # top): install them without their dependencies, then exactly what they import.
    "$venv/bin/pip" install "${quiet[@]}" --no-deps galore-torch==1.0 flora-opt==0.0.3 bitsandbytes accelerate
    "$venv/bin/pip" install "${quiet[@]}" psutil pyyaml
    "$venv/bin/python" -c "import torch, galore_torch, flora_opt; print('torch2 venv:', '$venv', 'torch', torch.__version__)" 2>&1 |
      grep -v "kernels-community"
    ;;
  *) echo "usage: $0 [transformers|tf5|torch2]" >&2; exit 2 ;;
esac
