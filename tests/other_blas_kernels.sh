#!/usr/bin/env bash
# The CPU tests again under two OpenBLAS kernel families other than this machine's own.
# OpenBLAS picks its sgemm kernels by CPU at run time, and two families sum the same GEMM in
# different orders: an assertion of bits that holds only for the kernels a fixture was recorded
# with, or only because two different computations happen to be blocked alike, then fails here on
# whatever machine runs the suite, not only on a user's machine of another make.
# Families, newest first: SkylakeX (AVX-512), Haswell (AVX2 + FMA; AMD's Zen runs the same
# kernels), Sandybridge (AVX), Nehalem (SSE); a family runs only where the CPU has its
# instructions. Usage: other_blas_kernels.sh GRASS_TESTS_BINARY
set -euo pipefail
tests=$1

# The family OpenBLAS runs (it names it on stderr at load with OPENBLAS_VERBOSE=2).
core_of() {
  local said
  said=$(env OPENBLAS_VERBOSE=2 OPENBLAS_CORETYPE="$1" "$tests" --list-test-names-only 2>&1 >/dev/null)
  sed -n 's/^Core: //p' <<<"$said" | sed -n 1p
}
# Kernel families that compute alike count as one.
group_of() {
  case "$1" in
    SkylakeX | Cooperlake | SapphireRapids) echo avx512 ;;
    Haswell | Zen) echo avx2 ;;
    Sandybridge | Bulldozer | Piledriver | Steamroller | Excavator) echo avx ;;
    *) echo "$1" ;;
  esac
}
flags=$(grep -m 1 '^flags' /proc/cpuinfo)
has() { [[ " $flags " == *" $1 "* ]]; }

own=$(core_of "")
[ -n "$own" ] || { echo "error: OpenBLAS did not name its kernels (OPENBLAS_VERBOSE=2)"; exit 1; }
candidates=()
has avx512f && has avx512bw && has avx512vl && candidates+=(SkylakeX)
has avx2 && has fma && candidates+=(Haswell)
has avx && candidates+=(Sandybridge)
candidates+=(Nehalem)
families=()
for f in "${candidates[@]}"; do
  [ "$(group_of "$f")" = "$(group_of "$own")" ] && continue
  families+=("$f")
  [ ${#families[@]} -eq 2 ] && break
done
echo "this machine's OpenBLAS kernels: $own; the CPU tests again under ${families[*]}"

status=0
for f in "${families[@]}"; do
  ran=$(core_of "$f")
  if [ "$ran" != "$f" ]; then
    echo "$f: FAILED: OpenBLAS ran $ran instead"
    status=1
    continue
  fi
  log=$(mktemp)
  if OPENBLAS_CORETYPE=$f "$tests" --warn NoTests >"$log" 2>&1; then
    echo "$f: $(grep -E '^All tests passed' "$log" | tail -n 1)"
  else
    echo "$f: FAILED"
    { grep -E -B 2 -A 12 'FAILED:$' "$log" || true; } | sed -n '1,200p'  # sed reads to the end
    grep -E '^test cases:' "$log" || true
    status=1
  fi
  rm -f "$log"
done
exit $status
