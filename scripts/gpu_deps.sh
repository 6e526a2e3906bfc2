#!/usr/bin/env bash
# The build's Debian packages for a lent GPU machine, which has nvcc, cmake and PyTorch but no
# network and maybe not the -dev packages grass builds with (docs/gpu-status.md).
#
#   scripts/gpu_deps.sh            HERE, before a GPU session (needs apt and the network):
#                                  downloads the .deb files into build-deps/debs (ignored by
#                                  .gitignore's /build-*/; about 15 MiB), and bitsandbytes into
#                                  build-deps/python (about 10 MiB). Then, on the device:
#                                  run(carry=[build-deps]) scripts/gpu_first_run.sh
#   scripts/gpu_deps.sh --setup    ON THE DEVICE (gpu_first_run.sh calls it): for each dependency
#                                  the system lacks, unpacks its .deb files with dpkg -x into
#                                  build-deps/root (never into /), and writes build-deps/env.sh,
#                                  which exports PATH, LD_LIBRARY_PATH, PKG_CONFIG_PATH and
#                                  GRASS_DEPS_CMAKE_ARGS (the -D options CMake needs to find them).
#                                  GRASS_DEPS_LOCAL=1 unpacks every one, present or not (how the
#                                  path is tested on a machine that has them all).
# Exit status: 0 done; 1 a download or an unpack failed, or a dependency is missing with no .deb.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
deps=build-deps
debs=$deps/debs
root=$PWD/$deps/root
arch=x86_64-linux-gnu

# dependency -> the packages unpacked for it (dev package first, then what it needs at run time)
declare -A PKGS=(
  [nlohmann_json]="nlohmann-json3-dev"
  [catch2]="catch2"
  [sentencepiece]="libsentencepiece-dev libsentencepiece0"
  [openblas]="libopenblas-openmp-dev libopenblas0-openmp"
  [gfortran]="libgfortran5 libquadmath0"
  [zlib]="zlib1g-dev zlib1g"
  [pkgconf]="pkgconf pkgconf-bin libpkgconf3"
  [ninja]="ninja-build"
)
ORDER=(nlohmann_json catch2 sentencepiece openblas gfortran zlib pkgconf ninja)

download() {
  local all=() d
  for d in "${ORDER[@]}"; do read -ra p <<<"${PKGS[$d]}"; all+=("${p[@]}"); done
  rm -rf "$deps/root" "$deps/env.sh"  # the .debs travel (and bitsandbytes), not what --setup unpacked
  mkdir -p "$debs"
  echo "gpu_deps: downloading ${#all[@]} packages into $debs"
  if ! (cd "$debs" && apt-get download "${all[@]}" >/dev/null 2>"../download.log"); then
    echo "gpu_deps: apt-get download failed; trying apt-get update first"
    { apt-get update -qq && (cd "$debs" && apt-get download "${all[@]}" >/dev/null 2>"../download.log"); } ||
      { cat "$deps/download.log"; echo "gpu_deps: download failed"; return 1; }
  fi
  local p missing=0
  for p in "${all[@]}"; do
    compgen -G "$debs/${p}_*.deb" >/dev/null || { echo "gpu_deps: no .deb for $p"; missing=1; }
  done
  copy_bitsandbytes
  local mib
  mib=$(du -sm "$deps" | cut -f1)
  ls -1 "$debs" >"$deps/MANIFEST"
  echo "gpu_deps: $(wc -l <"$deps/MANIFEST") .deb files, ${mib} MiB in $deps (limit of a carry: 64 MiB with the tree)"
  [ "$mib" -le 60 ] || { echo "gpu_deps: over 60 MiB"; missing=1; }
  return $missing
}

# bitsandbytes for gpu_first_run.sh's T10 (one 8-bit Adam step against its CUDA kernel), from
# tools/peers' torch2 environment when it exists: the package with only its CPU and CUDA 13
# libraries (about 10 MiB; the device's PyTorch must be a CUDA 13 build for it to load).
copy_bitsandbytes() {
  local src
  src=$(compgen -G "build/torch2-venv/lib/python3*/site-packages/bitsandbytes" | head -1)
  rm -rf "$deps/python"
  if [ -z "$src" ]; then
    echo "gpu_deps: no bitsandbytes in build/torch2-venv (tools/peers/setup_venv.sh torch2): T10 will skip"
    return
  fi
  mkdir -p "$deps/python"
  cp -r "$src" "$deps/python/"
  find "$deps/python/bitsandbytes" -name 'libbitsandbytes_*.so' ! -name '*_cpu.so' \
    ! -name '*_cuda13*.so' -delete
  find "$deps/python" -name __pycache__ -type d -prune -exec rm -rf {} +
  echo "gpu_deps: bitsandbytes copied into $deps/python ($(du -sm "$deps/python" | cut -f1) MiB)"
}

# Whether the system already has dependency $1 (a file or a command, not the package name: the
# device is Ubuntu, and its cmake and ninja come from pip).
have() {
  local inc=(/usr/include /usr/local/include) lib=("/usr/lib/$arch" "/lib/$arch" /usr/lib /usr/local/lib)
  case $1 in
    nlohmann_json) [ -f /usr/include/nlohmann/json.hpp ] || [ -f /usr/local/include/nlohmann/json.hpp ] ;;
    catch2) [ -f /usr/include/catch2/catch.hpp ] || [ -f /usr/local/include/catch2/catch.hpp ] ;;  # v2's header
    sentencepiece) [ -f /usr/include/sentencepiece_processor.h ] && compgen -G "/usr/lib/$arch/pkgconfig/sentencepiece.pc" >/dev/null ;;
    openblas)
      local d f=0
      for d in "${inc[@]}" "/usr/include/$arch" /usr/include/openblas; do [ -f "$d/cblas.h" ] && f=1; done
      [ $f = 1 ] && { for d in "${lib[@]}"; do [ -e "$d/libopenblas.so" ] && return 0; done; return 1; } ;;
    gfortran) [[ $(ldconfig -p 2>/dev/null) == *'libgfortran.so.5 '* ]] ;;  # not | grep -q: pipefail
    zlib) [ -f /usr/include/zlib.h ] && { [ -e /usr/lib/$arch/libz.so ] || [ -e /lib/$arch/libz.so ]; } ;;
    pkgconf) command -v pkg-config >/dev/null || command -v pkgconf >/dev/null ;;
    ninja) command -v ninja >/dev/null ;;
    *) return 1 ;;
  esac
}

setup() {
  rm -rf "$root"
  mkdir -p "$root"
  local d p deb unpacked=() failed=0
  for d in "${ORDER[@]}"; do
    if [ "${GRASS_DEPS_LOCAL:-0}" != 1 ] && have "$d"; then continue; fi
    # openblas needs libgfortran5 at run time: unpack it too where the system lacks it
    [ "$d" = gfortran ] && [[ ! " ${unpacked[*]} " == *" openblas "* ]] && [ "${GRASS_DEPS_LOCAL:-0}" != 1 ] && continue
    for p in ${PKGS[$d]}; do
      deb=$(compgen -G "$debs/${p}_*.deb" | head -1)
      if [ -z "$deb" ]; then
        echo "gpu_deps: $d is missing and $debs has no $p .deb (run scripts/gpu_deps.sh where apt works, then carry build-deps)"
        failed=1
        continue 2
      fi
      dpkg-deb -x "$deb" "$root" || { echo "gpu_deps: dpkg-deb -x $deb failed"; failed=1; }
    done
    unpacked+=("$d")
  done
  # Absolute symlinks point at the system (zlib1g-dev's libz.so -> /lib/.../libz.so.1.2.13):
  # make them point into the prefix where it holds the target.
  local link target
  while IFS= read -r link; do
    target=$(readlink "$link")
    [[ $target == /* ]] && [ -e "$root$target" ] && ln -sfn "$root$target" "$link"
  done < <(find "$root" -type l)
  # pkg-config files say prefix=/usr
  for p in "$root/usr/lib/$arch"/pkgconfig/*.pc "$root/usr/lib/$arch"/openblas-openmp/pkgconfig/*.pc; do
    [ -f "$p" ] && sed -i "s|^prefix=/usr\$|prefix=$root/usr|" "$p"
  done

  local args=() ldpath=() 
  if [ ${#unpacked[@]} -gt 0 ]; then
    args+=("-DCMAKE_PREFIX_PATH=$root/usr")
    ldpath+=("$root/usr/lib/$arch" "$root/lib/$arch")
  fi
  if [[ " ${unpacked[*]} " == *" openblas "* ]]; then
    args+=("-DCBLAS_INCLUDE_DIR=$root/usr/include/$arch/openblas-openmp"
           "-DOPENBLAS_LIBRARY=$root/usr/lib/$arch/openblas-openmp/libopenblas.so")
    ldpath+=("$root/usr/lib/$arch/openblas-openmp")
  fi
  if [[ " ${unpacked[*]} " == *" zlib "* ]]; then
    args+=("-DZLIB_INCLUDE_DIR=$root/usr/include" "-DZLIB_LIBRARY=$root/usr/lib/$arch/libz.so")
  fi
  if [[ " ${unpacked[*]} " == *" pkgconf "* ]]; then
    args+=("-DPKG_CONFIG_EXECUTABLE=$root/usr/bin/pkgconf")
  fi
  {
    echo "# written by scripts/gpu_deps.sh --setup; unpacked: ${unpacked[*]:-nothing}"
    echo "export GRASS_DEPS_UNPACKED=\"${unpacked[*]:-}\""
    if [ ${#unpacked[@]} -gt 0 ]; then
      echo "export PATH=\"$root/usr/bin:\$PATH\""
      echo "export LD_LIBRARY_PATH=\"$(IFS=:; echo "${ldpath[*]}")\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}\""
      echo "export PKG_CONFIG_PATH=\"$root/usr/lib/$arch/pkgconfig:$root/usr/share/pkgconfig\${PKG_CONFIG_PATH:+:\$PKG_CONFIG_PATH}\""
    fi
    echo "export GRASS_DEPS_CMAKE_ARGS=\"${args[*]:-}\""
  } >"$deps/env.sh"
  echo "gpu_deps: unpacked ${unpacked[*]:-nothing} into $root; environment in $deps/env.sh"
  return $failed
}

case "${1:-}" in
  "") download ;;
  --setup) setup ;;
  -h|--help) sed -n '2,20p' "$0" ;;
  *) echo "usage: scripts/gpu_deps.sh [--setup]" >&2; exit 2 ;;
esac
