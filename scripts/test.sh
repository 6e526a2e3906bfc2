#!/usr/bin/env bash
# The tests: installs what is missing, builds, runs every test under ctest. GPU tests carry the
# label `gpu` and report "Skipped" on machines without a usable GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
cd build
ctest --output-on-failure -j "$(nproc)" "$@"
