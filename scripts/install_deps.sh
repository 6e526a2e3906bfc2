#!/usr/bin/env bash
# Installs the Debian packages grass builds with, if any are missing; with arguments, those
# packages instead (scripts/plot.sh: python3-matplotlib). Idempotent; silent when all are
# present. CUDA is not installed here: when /usr/local/cuda exists the build uses it.
set -euo pipefail

packages=(cmake ninja-build g++ pkg-config nlohmann-json3-dev catch2 zlib1g-dev
          libopenblas-openmp-dev libsentencepiece-dev sentencepiece libopenmpi-dev openmpi-bin)
[ $# -eq 0 ] || packages=("$@")

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "install_deps: installing ${missing[*]}" >&2
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then SUDO=sudo; else
    echo "error: missing packages (${missing[*]}); run as root: apt-get install ${missing[*]}" >&2
    exit 2
  fi
else
  SUDO=
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq >/dev/null
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
