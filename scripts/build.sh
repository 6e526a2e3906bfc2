#!/usr/bin/env bash
# Configures (once) and builds grass in build/: every target, or only those named as arguments
# (scripts/run.sh builds just `grass`; the tests, the CUDA emulator and the tools take most of a
# full build's time). CUDA is enabled when nvcc is found (on PATH or in /usr/local/cuda); pass
# -DGRASS_CUDA=OFF in CMAKE_ARGS to force it off.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi
gen=Ninja; command -v ninja >/dev/null || gen="Unix Makefiles"
if [ ! -f build/CMakeCache.txt ]; then
  cmake -S . -B build -G "$gen" -DCMAKE_BUILD_TYPE=Release ${CMAKE_ARGS:-} >/dev/null
fi
targets=()
for t in "$@"; do targets+=(--target "$t"); done
cmake --build build -j "$(nproc)" "${targets[@]}"
