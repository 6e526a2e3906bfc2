#!/usr/bin/env bash
# This tree against another commit: step times in alternating rounds on one warm GPU (the A/B
# figures of docs/benchmarks.md). Two halves:
#
#   tools/gpu/ab_timing.sh --prepare REV
#       here, before the device call: REV's tree into build-deps/ab-old, which travels with
#       build-deps (the device machine's copy of the tree has no history)
#   tools/gpu/ab_timing.sh [--runs plain,cudnn] [--rounds 2] [--budget SECONDS]
#       on the GPU, after scripts/gpu_first_run.sh built build-gpu/: builds the old tree the
#       same way (its own gpu_first_run.sh, this tree's build-deps), then runs
#       tools/gpu/timing_runs.sh --runs ... (this tree's script, copied into the old tree too)
#       new, old, new, old, ...
#
# Output: timing_runs' lines prefixed "new" or "old", then each run's median step time on each
# side over steps 2 and later and their ratio, on stdout and in $OUT/ab_timing.log.
# Afterwards: rm -rf build-deps/ab-old (else every later call carries it).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
old=build-deps/ab-old
if [ "${1:-}" = --prepare ]; then
  rev=${2:?--prepare needs a commit}
  rm -rf "$old" && mkdir -p "$old" && git archive "$rev" | tar -x -C "$old" || exit 1
  git rev-parse --short "$rev" >"$old/.ab_commit"
  echo "ab_timing: $(cat "$old/.ab_commit") in $old ($(du -sm "$old" | cut -f1) MiB); carry build-deps"
  exit 0
fi
runs=plain rounds=2 budget=420
while [ $# -gt 0 ]; do
  case $1 in
    --runs) runs=${2:?--runs needs names}; shift 2 ;;
    --rounds) rounds=${2:?--rounds needs a count}; shift 2 ;;
    --budget) budget=${2:?--budget needs seconds}; shift 2 ;;
    *) echo "ab_timing: unknown argument $1" >&2; exit 2 ;;
  esac
done
log=${OUT:-build-gpu}/ab_timing.log
mkdir -p "$(dirname "$log")" && : >"$log"
say() { echo "$*" | tee -a "$log"; }
[ -f "$old/.ab_commit" ] || { say "ab_timing: no $old (tools/gpu/ab_timing.sh --prepare REV, here)"; exit 1; }
[ -x build-gpu/grass ] || { say "ab_timing: no build-gpu/grass (scripts/gpu_first_run.sh --only T0,build)"; exit 1; }
deadline=$((SECONDS + budget))
ln -sfn "$PWD/build-deps" "$old/build-deps"
cp tools/gpu/timing_runs.sh "$old/tools/gpu/timing_runs.sh"
cp tools/gpu/nvidia_lib_path.sh "$old/tools/gpu/nvidia_lib_path.sh"
say "ab_timing: new $(git rev-parse --short HEAD 2>/dev/null || echo "${GRASS_COMMIT:-this tree}"), old $(cat "$old/.ab_commit"): building the old tree"
(cd "$old" && OUT="$PWD/build-gpu/first_run" GRASS_COMMIT=$(cat .ab_commit) \
   scripts/gpu_first_run.sh --only build --budget $((deadline - SECONDS)) >/dev/null 2>&1)
[ -x "$old/build-gpu/grass" ] || { say "ab_timing: the old tree did not build (its build-gpu/first_run/logs)"; exit 1; }
say "ab_timing: built in $SECONDS s; $rounds rounds of --runs $runs"
for ((i = 1; i <= rounds; i++)); do
  for side in new old; do
    dir=.
    [ $side = old ] && dir=$old
    slots=$((2 * (rounds - i) + 1))  # the calls still to run, this one included
    [ $side = new ] && slots=$((slots + 1))
    left=$(((deadline - SECONDS) / slots))
    [ "$left" -lt 30 ] && { say "$side round $i: skipped (budget)"; continue; }
    (cd "$dir" && OUT='' tools/gpu/timing_runs.sh --runs "$runs" --budget "$left") |
      sed "s/^/$side /" | tee -a "$log"
  done
done
python3 - "$log" <<'PY' | tee -a "$log.summary"
import statistics, sys
times = {}
for line in open(sys.argv[1]):
    f = line.split()
    if len(f) >= 7 and f[0] in ("new", "old") and f[2].isdigit() and int(f[2]) >= 2:
        times.setdefault((f[1], f[0]), []).append(float(f[3]))
for run in sorted({r for r, _ in times}):
    new, old = times.get((run, "new")), times.get((run, "old"))
    if new and old:
        n, o = statistics.median(new), statistics.median(old)
        print(f"{run}: step median {n:.1f} ms (new, {len(new)} steps) against {o:.1f} ms (old, "
              f"{len(old)} steps): new/old {n / o:.3f}")
PY
cat "$log.summary" >>"$log" && rm -f "$log.summary"
