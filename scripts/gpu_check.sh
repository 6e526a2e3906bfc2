#!/usr/bin/env bash
# GPU verification on a machine with an NVIDIA GPU: builds for the GPU present (sm_90 on
# H100/H200 by default; CUDA_ARCH=80 for A100) in build-gpu/ and runs the GPU-labelled tests,
# then the quickstart. Record the result in docs/gpu-status.md.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/cuda/bin:$PATH"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
gen=Ninja; command -v ninja >/dev/null || gen="Unix Makefiles"
cmake -S . -B build-gpu -G "$gen" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCH:-90}" >/dev/null
cmake --build build-gpu -j "$(nproc)"
(cd build-gpu && ctest --output-on-failure -L gpu)
git rev-parse --short HEAD 2>/dev/null | sed 's/^/commit /' || true
