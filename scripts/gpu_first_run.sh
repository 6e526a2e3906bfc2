#!/usr/bin/env bash
# The first minutes on a lent GPU, one command (../shared/GPU_FIRST_RUN.md, steps T0-T7, and T8;
# docs/gpu-status.md "Before and during a GPU session"). Under 10 minutes on an H100: every step
# has its own time limit, the whole run a deadline (--budget), and a step that fails, hangs or
# finds no time left is recorded and the next one runs.
#
#   T0     device facts: nvidia-smi, nvcc, SXM or PCIe, which profilers are there
#   T1     GEMM alignment probe through PyTorch (tools/gpu/gemm_align_probe.py): F = 5461 against
#          5464/5504/5632; runs in the background while grass builds
#   build  dependencies (scripts/gpu_deps.sh --setup unpacks carried .debs the system lacks),
#          then configure and build for sm_90 (CUDA_ARCH=...) in build-gpu/
#   T2     compute-sanitizer: racecheck on the attention tests, and on RMSNorm, cross-entropy and
#          GRASS; synccheck on attention, RMSNorm, cross-entropy; memcheck on GEMM, GRASS,
#          cross-entropy, embedding (Catch2's -# turns each test file into a tag,
#          [#test_gpu_attention]; RMSNorm and embedding by test name), and over 2 steps of
#          `grass train` (GRASS at 60M, pure bf16, fused)
#   T3     the GPU tests, compact reporter; failing files rerun at once with GRASS_CUDA_SYNC=1
#          (each launch checked where it is made), then under memcheck
#   T4     attention reference through PyTorch (tools/gpu/attention_probe.py), also in the
#          background during the build
#   T5     the headline: llama_1b bf16-mixed at GaLore's batch (micro-batch 64 x 256, 512 x 256
#          a step), the median of 3 steps after a warm-up, tok/s and MFU, with the engine's
#          attention, with cuDNN's, with "auto" (the default: what it took) and with the engine's
#          FA2-style kernels ("mma"), SM clock and
#          power sampled; host syncs per step (an LD_PRELOAD counter, tools/gpu/sync_count.c),
#          cublasGemmEx fallbacks, then a profile
#          (nsys if it works, else ncu over one step) read by tools/gpu/profile_shares.py:
#          GEMM / attention / other shares, the top 15 kernels, MFU without the optimizer, and
#          (nsys) the GPU's idle time in the last step: the "step" NVTX range against the union
#          of its kernels and copies (whether CUDA graphs could pay)
#   T6     large shapes: tests/gpu/test_gpu_large_shapes.cpp (hidden tag [large])
#   T7     13B GRASS headroom: configs/runs/llama_13b_grass.json for a few steps under
#          --memory-limit 40GiB; the step lines' memory beside `grass mem`'s plan (then, if time
#          is left, 2 steps with the cap at the plan itself); then 13B at a batch that fills the
#          GPU (issue 45 item 4): 16 x 256 and the largest micro-batch `grass mem` fits under
#          40 GiB, each with its plan, device peak, tok/s and MFU
#   T8     data parallelism through the real NCCL: `mpirun -np 1 grass train` on llama_60m (when
#          mpirun and a build with MPI are there; without them NCCL's one-rank path runs in T3's
#          tests/gpu/test_gpu_nccl.cpp)
#   T9     cuDNN's fused flash attention (`attention: "cudnn"`): its GPU tests ([cudnn], against
#          the engine's kernels) and the kernel lab's attention rows at 1B with --attention cudnn
#          ($OUT/kernel_bench_cudnn.csv), when the build found cudnn.h (the CUDA install's, or
#          PyTorch's nvidia/cudnn, whose lib/ then goes on LD_LIBRARY_PATH)
#   T11    GRASS against AdamW (issue 45 item 3): T5's 1B run with AdamW and with GRASS r=512
#          (its refresh at step 0, outside the median), in alternating rounds A B A B on the one
#          GPU; each run's median tok/s and MFU, and GRASS's tok/s over AdamW's (target >= 1.2x)
#   T10    the engine's 8-bit AdamW step at 1B's C x C and V x C tensors (the kernel lab's
#          adamw_update_q8 rows, target <= 40 us for 2048²) and one ncu profile of its kernel;
#          then one 8-bit Adam step against bitsandbytes' CUDA kernel, code for code, and
#          bitsandbytes' step timed on the same tensors (tools/peers/bitsandbytes_check.py with
#          build-gpu/quant8_codes; bitsandbytes from build-deps/python, which scripts/gpu_deps.sh
#          copies out of tools/peers' torch2 environment)
#   T12    weight streaming (issue 47, ../shared/WEIGHT_STREAMING.md §6; a call of its own:
#          --only build,T12): the pinned link both ways, alone and at once (PyTorch,
#          tools/gpu/link_probe.py), then 13B GRASS at 16 x 256 tokens resident and with
#          `--memory-limit 24GiB --set offload=auto` (layers streamed, states and inputs in pinned
#          memory), alternating, 4 steps each: the losses (equal) and tok/s, streamed over resident
#          (target >= 0.8x); each run's plan and device peak, and what the device holds beside
#          the plan with and without 11 GiB of pinned host memory (issue 47's 7B and 70B budgets)
#   T13    issue 46's features at the step they were measured at (1B bf16-mixed, 16 x 256 tokens,
#          the engine's attention; a call of its own with T12: --only build,T12,T13): AdamW plain,
#          with 8-bit states, with wta-crs sampled activations drawn beside the compute and on the
#          compute stream (GRASS_SIDE_STREAM=0), and GaLore r=512 refreshing every 3 steps with its
#          phase timers (GRASS_GALORE_TIMERS=1), all at once, staggered (refresh_stagger) and with
#          each layer's eigenproblems in one batched call (svd_batch "layer"): each run's median
#          tok/s, the ratios against plain (targets: q8 and wta-crs >= 0.95x), GaLore's last
#          refresh step (target <= 1 s) per target and batched, and the staggered run's slowest
#          step after the first
#   bench  the kernel lab (build-gpu/kernel_bench --model 60m,1b,13b --csv $OUT/kernel_bench.csv,
#          then its attention rows with --attention mma at 1B and 13B, B 16 and 64:
#          logs/kernel_bench_mma_b16.csv, _b64.csv, and at 1B B 64 with the backward's path B
#          forced, GRASS_MMA_BACKWARD=b: _pathb_b64.csv) when that target exists; last, being optional
# It ends with a markdown table (also $OUT/summary.md, rewritten after every step) to paste
# into docs/gpu-status.md; every measured figure is also a row of $OUT/figures.csv (step, run,
# figure, value, unit). Logs: build-gpu/first_run/logs/, packed after every step into
# $OUT/first_run_logs.tar.gz (the device tool returns at most 8 files from $OUT).
#
#   scripts/gpu_first_run.sh [--dry-run] [--only STEPS] [--skip STEPS] [--budget SECONDS]
#                            [--skip-build]
#     --dry-run      no GPU needed: parses arguments, checks the dependencies, configures and
#                    builds the CPU-side targets (grass, make_synthetic_shard; -DGRASS_CUDA=OFF),
#                    runs the Python probes' --dry-run and profile_shares' self-test, builds the
#                    sync counter, makes the shard, runs `grass mem` for the 13B plan, and prints
#                    each GPU step's commands instead of running them
#     --only/--skip  comma-separated step names from: T0,T1,T4,build,T3,T5,T11,T2,T9,T10,T6,T7,T8,T12,T13,
#                    bench
#     --budget       seconds for the whole run (default 560: the device tool allows 600 a call)
#     --skip-build   use the binaries already in build-gpu/
# Environment: OUT (where results go), CUDA_ARCH (default 90), CMAKE_ARGS (more -D options),
# PYTHON (default python3: the one with PyTorch), GRASS_DEPS_LOCAL=1 (unpack every carried .deb),
# GRASS_COMMIT (the commit to report where the tree has no .git), GRASS_BUILD_DIR (default
# build-gpu; tools/gpu/fake_device_check.sh points it at stand-ins for a test without a GPU).
# Exit status: 0 when every step that ran passed (skips included), 1 otherwise, 2 on bad usage.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
export PATH="/usr/local/cuda/bin:$PATH"

# In the order they run (docs/gpu-status.md): the GPU tests and the headline first, so a lease cut
# short still brings them back; T1 and T4 (PyTorch probes) run beside the build.
ALL_STEPS=(T0 T1 T4 build T3 T5 T11 T2 T9 T10 T6 T7 T8 T12 T13 bench)
dry=0 skip_build=0 budget=560 only="" skip=""
usage() { awk 'NR > 1 && !/^#/ { exit } NR > 1' "$0"; }  # the header above
while [ $# -gt 0 ]; do
  case $1 in
    --dry-run) dry=1 ;;
    --skip-build) skip_build=1 ;;
    --only) only=${2:-}; shift ;;
    --skip) skip=${2:-}; shift ;;
    --budget) budget=${2:-}; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "gpu_first_run: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
[[ $budget =~ ^[0-9]+$ ]] || { echo "gpu_first_run: --budget needs seconds, got '$budget'" >&2; exit 2; }
for s in ${only//,/ } ${skip//,/ }; do
  [[ " ${ALL_STEPS[*]} " == *" $s "* ]] || { echo "gpu_first_run: unknown step '$s' (steps: ${ALL_STEPS[*]})" >&2; exit 2; }
done

BUILD=${GRASS_BUILD_DIR:-build-gpu}
work=$(realpath -m "$BUILD/first_run")  # absolute: LD_PRELOAD and cuBLASLt log paths
logs=$work/logs
out=${OUT:-$work}
PY=${PYTHON:-python3}
# shellcheck source=tools/gpu/nvidia_lib_path.sh
. tools/gpu/nvidia_lib_path.sh
start=$SECONDS
deadline=$((start + budget))
mkdir -p "$logs" "$out" || exit 2
rm -f "$logs"/*.log "$logs"/*.csv "$logs"/*.txt "$logs"/*.json
figures_csv=$out/figures.csv
echo "step,run,figure,value,unit" >"$figures_csv"
# the device's copy of the tree may have no .git: GRASS_COMMIT=<hash> names the commit then
if commit=$(git rev-parse --short HEAD 2>/dev/null); then
  git diff --quiet HEAD 2>/dev/null || commit="$commit+dirty"
else
  commit=${GRASS_COMMIT:-unknown}
fi
today=$(date -u +%Y-%m-%d)
device="(dry run)"
declare -A RESULT FIGURE
STEPS_DONE=()

wanted() {  # wanted STEP: selected by --only/--skip
  local s=$1
  [ -n "$only" ] && [[ ",$only," != *",$s,"* ]] && return 1
  [[ ",$skip," == *",$s,"* ]] && return 1
  return 0
}
left() { echo $((deadline - SECONDS)); }
# cap WANT: WANT seconds, or what is left of the budget less 15 s for the summary
cap() { local l=$(($(left) - 15)); [ "$l" -lt "$1" ] && echo "$l" || echo "$1"; }
quote() { printf '%q ' "$@"; }

# run_cmd LIMIT LOG CMD...: CMD under `timeout`, output appended to LOG. A dry run prints it.
# Returns CMD's status; 124 (or 137) when the limit killed it.
run_cmd() {
  local limit=$1 log=$2
  shift 2
  echo "\$ $(quote "$@")" >>"$log"
  if [ $dry = 1 ]; then
    echo "      would run (limit ${limit}s): $(quote "$@")"
    return 0
  fi
  timeout -k 10 "$limit" "$@" >>"$log" 2>&1
}

# record STEP RESULT FIGURE: one status line on stdout, the summary rewritten, the logs packed.
record() {
  RESULT[$1]=$2
  FIGURE[$1]=$3
  STEPS_DONE+=("$1")
  printf '[%-5s] %-18s %s\n' "$1" "$2" "$3"
  write_summary >/dev/null
  tar czf "$out/first_run_logs.tar.gz.tmp" -C "$work" logs 2>/dev/null &&
    mv "$out/first_run_logs.tar.gz.tmp" "$out/first_run_logs.tar.gz"
}
# figure_row STEP RUN FIGURE VALUE UNIT: one measured figure in figures.csv (none when empty)
figure_row() {
  [ -n "$4" ] && [ $dry = 0 ] && echo "$1,$2,$3,$4,$5" >>"$figures_csv"
  return 0
}
# run_figures STEP RUN LOG: a training run's median tok/s and MFU into figures.csv
run_figures() {
  figure_row "$1" "$2" tokens_per_s "$(done_field "$3")" tok/s
  local m
  m=$(mfu_field "$3")
  figure_row "$1" "$2" mfu "${m%\%}" %
}
# plan_gib ARGS...: the total of `grass mem ARGS --json` in GiB (two decimals); empty if it failed
plan_gib() {
  local bytes
  bytes=$("$BUILD"/grass mem "$@" --json 2>/dev/null | sed -n 's/.*"total":\([0-9]*\).*/\1/p')
  [ -n "$bytes" ] && awk -v b="$bytes" 'BEGIN { printf "%.2f", b / 2^30 }'
}
# device_peak LOG: the most device memory a run's step lines saw in use ("mem A GiB (device U/T
# GiB)": the arena, then the device's used memory, the CUDA context and libraries included)
device_peak() { grep '^step' "$1" | sed -n 's/.*(device \([0-9.]*\)\/.*/\1/p' | sort -n | tail -1; }
# one_b MICRO SEQUENCES: the 1B run the timed steps share (bench_60m's data and schedule with
# LLaMA-1B in bf16-mixed, 256-token sequences, a line a step) at MICRO x 256 tokens a micro-batch
# and SEQUENCES x 256 a step, in ONE_B.
one_b() {
  ONE_B=(configs/runs/bench_60m.json --set model=configs/models/llama_1b.json --set "data.train=$shard"
         --set device=cuda --set precision=bf16-mixed --set "micro_batch_size=$1"
         --set "total_batch_size=$2" --set seq_len=256 --set log_every=1)
}
# training_run STEP RUN LABEL LOG WANT MIN CMD...: a `grass train` of a timed step under
# `cap WANT`, its median tok/s and MFU into figures.csv as RUN. Returns 0 when it printed its median
# (and in a dry run), 1 when it failed, 2 when under MIN seconds were left; RUN_NOTE then says so
# for the step's figure ("LABEL fail (exit 1); ").
RUN_NOTE=""
training_run() {
  local step=$1 run=$2 label=$3 log=$4 want=$5 min=$6 rc
  shift 6
  RUN_NOTE=""
  if [ $dry = 0 ] && [ "$(cap "$want")" -lt "$min" ]; then RUN_NOTE="$label skipped (budget); "; return 2; fi
  run_cmd "$(cap "$want")" "$log" "$@"
  rc=$?
  [ $dry = 1 ] && return 0
  if [ $rc = 0 ] && [ -n "$(done_field "$log")" ]; then
    run_figures "$step" "$run" "$log"
    return 0
  fi
  RUN_NOTE="$label $(status_of $rc); "
  return 1
}
status_of() {  # status_of RC [what-skip-means]: pass / fail / timeout
  case $1 in
    0) echo pass ;;
    124|137) echo "fail (timeout)" ;;
    77) echo "skipped (no GPU)" ;;
    *) echo "fail (exit $1)" ;;
  esac
}
# begin STEP WANT MIN: sets LIM, the limit for STEP (WANT seconds, less near the deadline); fails
# when the step is not selected or under MIN seconds are left (recorded as skipped).
LIM=0
begin() {
  local step=$1 want=$2 min=${3:-20}
  wanted "$step" || { record "$step" "not selected" ""; return 1; }
  LIM=$(cap "$want")
  if [ $dry = 0 ] && [ "$LIM" -lt "$min" ]; then
    record "$step" "skipped (budget)" "$(left) s left of --budget $budget"
    return 1
  fi
  [ $dry = 1 ] && echo "[$step] dry run: the commands"
  return 0
}

# ---- T0 ------------------------------------------------------------------------------------------
step_t0() {
  local lim log=$logs/t0_device.log
  begin T0 30 5 || return
  lim=$LIM
  run_cmd "$lim" "$log" nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit --format=csv
  run_cmd "$lim" "$log" nvcc --version
  run_cmd "$lim" "$log" "$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no device')"
  local t
  for t in nsys ncu compute-sanitizer cmake ninja gcc pkg-config; do
    echo "tool $t: $(command -v "$t" || echo absent)" >>"$log"
  done
  find /opt/nvidia /usr/local/cuda*/ -maxdepth 5 -name nsys -type f 2>/dev/null | sed 's/^/nsys found: /' >>"$log"
  if [ $dry = 1 ]; then
    record T0 dry-run "commands printed; here: nvcc $(nvcc --version 2>/dev/null | grep -o 'release [0-9.]*' | cut -d' ' -f2), profilers: $(command -v nsys ncu compute-sanitizer | xargs -r -n1 basename | paste -sd, - | grep . || echo none)"
    return
  fi
  local q name mem power form
  q=$(grep -A1 '^name' "$log" | tail -1)
  name=$(echo "$q" | cut -d, -f1 | xargs)
  mem=$(echo "$q" | cut -d, -f3 | xargs)
  power=$(echo "$q" | cut -d, -f5 | xargs)
  form="?"
  case $name in
    *PCIe*) form=PCIe ;;
    *SXM*|*HBM3*|*H200*) form=SXM ;;
  esac
  if [ "$form" = "?" ] && [[ ${power%%.*} =~ ^[0-9]+$ ]]; then
    [ "${power%%.*}" -ge 500 ] && form=SXM || form=PCIe
  fi
  device="${name:-no GPU} ($form, ${mem:-?}, power limit ${power:-?})"
  local nv
  nv=$(grep -o 'release [0-9.]*' "$log" | head -1)
  if [ -n "$name" ]; then
    record T0 pass "$device; nvcc ${nv#release }; $(grep -o 'torch [^ ]* cuda [^ ]*' "$log" | head -1); nsys $(command -v nsys >/dev/null && echo yes || echo no), ncu $(command -v ncu >/dev/null && echo yes || echo no)"
  else
    device="no GPU"
    record T0 "fail" "nvidia-smi gave no device (log: logs/t0_device.log)"
  fi
}

# ---- T1 and T4: PyTorch probes, in the background while the build runs ---------------------------
bg_pid=""
start_probes() {
  local l1=0 l4=0
  if wanted T1; then l1=$(cap 150); fi
  if wanted T4; then l4=$(cap 90); fi
  if [ $dry = 1 ]; then
    wanted T1 && { echo "[T1] dry run: the probe's own --dry-run, then"; run_cmd 30 "$logs/t1_gemm_align.log" "$PY" tools/gpu/gemm_align_probe.py --json "$logs/t1_gemm_align.json"; timeout 60 "$PY" tools/gpu/gemm_align_probe.py --dry-run >>"$logs/t1_gemm_align.log" 2>&1; echo $? >"$work/.t1.rc"; }
    wanted T4 && { echo "[T4] dry run: the probe's own --dry-run, then"; run_cmd 30 "$logs/t4_attention.log" "$PY" tools/gpu/attention_probe.py --json "$logs/t4_attention.json"; timeout 60 "$PY" tools/gpu/attention_probe.py --dry-run >>"$logs/t4_attention.log" 2>&1; echo $? >"$work/.t4.rc"; }
    return
  fi
  rm -f "$work/.t1.rc" "$work/.t4.rc"
  (
    if [ "$l1" -gt 20 ]; then
      PYTHONUNBUFFERED=1 timeout -k 10 "$l1" "$PY" tools/gpu/gemm_align_probe.py --json "$logs/t1_gemm_align.json" >"$logs/t1_gemm_align.log" 2>&1
      echo $? >"$work/.t1.rc"
    fi
    if [ "$l4" -gt 20 ]; then
      PYTHONUNBUFFERED=1 timeout -k 10 "$l4" "$PY" tools/gpu/attention_probe.py --json "$logs/t4_attention.json" >"$logs/t4_attention.log" 2>&1
      echo $? >"$work/.t4.rc"
    fi
  ) &
  bg_pid=$!
}
finish_probes() {
  [ -n "$bg_pid" ] && wait "$bg_pid"
  bg_pid=""
  local s rc f
  for s in T1 T4; do
    wanted "$s" || { record "$s" "not selected" ""; continue; }
    local lower=${s,,} log
    log=$(compgen -G "$logs/${lower}_*.log" | head -1)
    rc=$(cat "$work/.$lower.rc" 2>/dev/null || echo none)
    if [ "$rc" = none ]; then record "$s" "skipped (budget)" ""; continue; fi
    f=$(sed -n 's/^SUMMARY: //p' "$log" 2>/dev/null | tail -1)
    [ "$s" = T1 ] && f="$f; $(sed -n 's/^VERDICT: //p' "$log" | tail -1)"
    if [ $dry = 1 ]; then
      if [ "$rc" = 0 ]; then
        record "$s" dry-run "--dry-run passed (argument check; needs torch with CUDA)"
      else
        record "$s" "fail (dry-run)" "exit $rc"
      fi
    elif [ "$rc" = 3 ]; then
      record "$s" "skipped (no torch/CUDA)" "$(tail -1 "$log")"
    else
      record "$s" "$(status_of "$rc")" "${f:-see logs/$(basename "$log")}"
    fi
  done
}

# ---- build ---------------------------------------------------------------------------------------
built=0
step_build() {
  local lim log=$logs/build.log deps_note=""
  if [ $skip_build = 1 ]; then
    # the carried build-deps/ replaces the one the last call unpacked: unpack again, so that a
    # target built later (CMake reconfigures when the tree's copy is newer) finds the headers
    if compgen -G "build-deps/debs/*.deb" >/dev/null && scripts/gpu_deps.sh --setup >/dev/null 2>&1; then
      # shellcheck disable=SC1091
      source build-deps/env.sh
    fi
    [ -x "$BUILD"/grass ] && built=1
    record build "skipped (--skip-build)" "$( [ $built = 1 ] && echo "using $BUILD/" || echo "no $BUILD/grass: binary steps will fail")"
    return
  fi
  begin build 300 60 || return
  lim=$LIM
  # dependencies: carried .debs for what the system lacks
  if compgen -G "build-deps/debs/*.deb" >/dev/null; then
    scripts/gpu_deps.sh --setup >>"$log" 2>&1 || deps_note="gpu_deps --setup failed; "
    # shellcheck disable=SC1091
    [ -f build-deps/env.sh ] && source build-deps/env.sh
    deps_note+="unpacked: ${GRASS_DEPS_UNPACKED:-nothing}"
  else
    deps_note="no build-deps/debs carried (scripts/gpu_deps.sh makes them)"
  fi
  echo "deps: $deps_note" >>"$log"
  local gen=Ninja
  command -v ninja >/dev/null || gen="Unix Makefiles"
  local cfg=(-S . -B "$BUILD" -G "$gen" -DCMAKE_BUILD_TYPE=Release)
  local targets=(grass make_synthetic_shard quant8_codes)
  if [ $dry = 1 ]; then
    cfg+=(-DGRASS_CUDA=OFF)  # the CPU-side targets only: no nvcc pass here
  else
    cfg+=(-DGRASS_CUDA=ON "-DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCH:-90}")
    targets+=(grass_gpu_tests)
  fi
  if command -v ccache >/dev/null; then
    cfg+=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
    export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$PWD}
  fi
  # cuDNN's headers for attention "cudnn" (T9): the CUDA install's, else PyTorch's nvidia/cudnn
  if [ $dry = 0 ] && [ ! -f /usr/local/cuda/include/cudnn.h ]; then
    local cudnn_dir
    cudnn_dir=$("$PY" -c 'import nvidia.cudnn, os; print(os.path.dirname(nvidia.cudnn.__file__))' 2>/dev/null)
    if [ -n "$cudnn_dir" ] && [ -f "$cudnn_dir/include/cudnn.h" ]; then
      cfg+=("-DCUDNN_INCLUDE_DIR=$cudnn_dir/include")
      export LD_LIBRARY_PATH="$cudnn_dir/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
      deps_note+="; cuDNN from $cudnn_dir"
    fi
  fi
  # cuDNN opens its engines and NVRTC at run time: every pip nvidia/*/lib on the path
  if [ $dry = 0 ]; then
    add_nvidia_lib_path "$PY"
    echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}" >>"$log"
  fi
  # shellcheck disable=SC2206
  cfg+=(${GRASS_DEPS_CMAKE_ARGS:-} ${CMAKE_ARGS:-})
  local t0=$SECONDS rc
  echo "\$ cmake $(quote "${cfg[@]}")" >>"$log"
  [ $dry = 1 ] && echo "      (a dry run configures and builds the CPU-side targets for real)"
  timeout -k 10 "$lim" cmake "${cfg[@]}" >>"$log" 2>&1
  rc=$?
  if [ $rc = 0 ]; then
    # not `| grep -q`: under pipefail, grep's early exit kills cmake with SIGPIPE and the test fails
    [ $dry = 0 ] && [[ $(cmake --build "$BUILD" --target help 2>/dev/null) == *kernel_bench* ]] && targets+=(kernel_bench)
    echo "\$ cmake --build $BUILD --target ${targets[*]}" >>"$log"
    timeout -k 10 "$(cap $((lim - (SECONDS - t0))))" cmake --build "$BUILD" -j "$(nproc)" --target "${targets[@]}" >>"$log" 2>&1
    rc=$?
  fi
  if [ $rc = 0 ]; then
    built=1
    record build "$([ $dry = 1 ] && echo "pass (CPU targets)" || echo pass)" "$((SECONDS - t0)) s, ${targets[*]}; $deps_note"
  else
    tail -20 "$log" | sed 's/^/      /'
    record build "$(status_of $rc)" "$deps_note; log: logs/build.log"
  fi
}
need_build() {  # need_build STEP: records STEP as skipped when there is nothing to run
  if [ $built = 0 ] && [ $dry = 0 ]; then record "$1" "skipped (no build)" ""; return 1; fi
  return 0
}

# ---- T2 ------------------------------------------------------------------------------------------
step_t2() {
  begin T2 200 30 || return
  need_build T2 || return
  local bin=$BUILD/tests/grass_gpu_tests san
  san=$(command -v compute-sanitizer || echo compute-sanitizer)
  local -a runs=(
    "racecheck|90|--tool racecheck --racecheck-report all|[#test_gpu_attention]"
    "racecheck_reduce|50|--tool racecheck --racecheck-report all|gpu rmsnorm*,[#test_gpu_cross_entropy],[#test_gpu_grass]"
    "synccheck|50|--tool synccheck|[#test_gpu_attention],gpu rmsnorm*,[#test_gpu_cross_entropy]"
    "memcheck|70|--tool memcheck --leak-check no|[#test_gpu_gemm],[#test_gpu_grass],[#test_gpu_cross_entropy],gpu embedding*"
  )
  local r tool want opts spec rc figure="" worst=0 log
  for r in "${runs[@]}"; do
    IFS='|' read -r tool want opts spec <<<"$r"
    log=$logs/t2_$tool.log
    local c
    c=$(cap "$want")
    if [ $dry = 0 ] && [ "$c" -lt 15 ]; then figure+="$tool skipped (budget); "; continue; fi
    # shellcheck disable=SC2086
    run_cmd "$c" "$log" "$san" $opts --error-exitcode 99 "$bin" -# "$spec" --reporter compact
    rc=$?
    [ $dry = 1 ] && continue
    local errs
    errs=$(grep -Eo '(ERROR SUMMARY: [0-9]+ error|RACECHECK SUMMARY: [0-9]+ hazard)' "$log" | grep -Eo '[0-9]+' | tail -1)
    case $rc in
      0) figure+="$tool ${errs:-0} reports; " ;;
      99) figure+="$tool ${errs:-some} REPORTS; "; worst=1 ;;
      124|137) figure+="$tool timeout (${c}s); "; worst=1 ;;
      77) figure+="$tool no GPU; " ;;
      *) figure+="$tool exit $rc (tests failed: $(grep -Eo 'Failed [0-9]+ test case' "$log" | head -1)); "; worst=1 ;;
    esac
  done
  # and the whole trainer: 2 steps of GRASS at 60M, pure bf16 with fused updates, under memcheck
  if ensure_shard; then
    local c
    c=$(cap 90)
    if [ $dry = 1 ] || [ "$c" -ge 30 ]; then
      log=$logs/t2_memcheck_train.log
      rm -rf "$work/t2_train"
      run_cmd "$c" "$log" "$san" --tool memcheck --leak-check no --error-exitcode 99 "$BUILD"/grass \
        train configs/runs/bench_60m.json --set "data.train=$shard" --set device=cuda \
        --set precision=bf16 --set optimizer.name=grass --set optimizer.rank=64 \
        --set optimizer.update_interval=1 --set steps=2 --set "out_dir=$work/t2_train"
      rc=$?
      if [ $dry = 0 ]; then
        case $rc in
          0) figure+="memcheck over 2 training steps clean; " ;;
          99) figure+="memcheck over 2 training steps REPORTS; "; worst=1 ;;
          124|137) figure+="memcheck training timeout (${c}s); "; worst=1 ;;
          *) figure+="memcheck training exit $rc; "; worst=1 ;;
        esac
      fi
    else
      figure+="memcheck training skipped (budget); "
    fi
  fi
  if [ $dry = 1 ]; then record T2 dry-run "4 sanitizer runs over tests and one over 2 training steps printed"; return; fi
  record T2 "$([ $worst = 0 ] && echo pass || echo fail)" "${figure%; }"
}

# ---- T3 ------------------------------------------------------------------------------------------
step_t3() {
  local lim log=$logs/t3_gpu_tests.log rc
  begin T3 180 30 || return
  lim=$LIM
  need_build T3 || return
  run_cmd "$lim" "$log" "$BUILD"/tests/grass_gpu_tests --reporter compact
  rc=$?
  [ $dry = 1 ] && { record T3 dry-run "GPU tests printed"; return; }
  local tail_line fallbacks rerun=""
  tail_line=$(grep -E '^(Passed|Failed|All tests|test cases)' "$log" | tail -1)
  fallbacks=$(grep -c 'using cublasGemmEx' "$log")
  if [ $rc != 0 ]; then
    # The failing files once more with every launch checked at once (GRASS_CUDA_SYNC=1), so this
    # call already names the kernel; then under memcheck if time is left.
    local files
    files=$(grep -Eo 'test_gpu_[a-z0-9_]+\.cpp:[0-9]+: failed' "$log" | sed 's/\.cpp.*//' | sort -u |
            sed 's/.*/[#&]/' | paste -sd, -)
    if [ -n "$files" ]; then
      run_cmd "$(cap 60)" "$logs/t3_rerun_sync.log" env GRASS_CUDA_SYNC=1 "$BUILD"/tests/grass_gpu_tests \
        -# "$files" --reporter compact
      rerun="; rerun with GRASS_CUDA_SYNC=1 ($files): $(grep -E '^(Passed|Failed|All tests|test cases)' "$logs/t3_rerun_sync.log" | tail -1)"
      if [ "$(cap 60)" -ge 30 ] && command -v compute-sanitizer >/dev/null; then
        run_cmd "$(cap 60)" "$logs/t3_rerun_memcheck.log" compute-sanitizer --tool memcheck \
          --leak-check no "$BUILD"/tests/grass_gpu_tests -# "$files" --reporter compact
        rerun+="; memcheck: $(grep -Eo 'ERROR SUMMARY: [0-9]+ error' "$logs/t3_rerun_memcheck.log" | tail -1)"
      fi
    fi
  fi
  record T3 "$(status_of $rc)" "${tail_line:-see logs/t3_gpu_tests.log}; $fallbacks cublasGemmEx fallback lines$rerun"
}

# ---- T9 ------------------------------------------------------------------------------------------
step_t9() {
  local lim log=$logs/t9_cudnn.log rc
  begin T9 120 20 || return
  lim=$LIM
  need_build T9 || return
  if [ $dry = 0 ] && ! grep -q 'cuDNN attention /' "$logs/build.log" 2>/dev/null; then
    record T9 "skipped (no cuDNN)" "the build found no cudnn.h (logs/build.log)"; return
  fi
  run_cmd "$(cap $((lim / 2)))" "$log" "$BUILD"/tests/grass_gpu_tests "[cudnn]" --reporter compact
  rc=$?
  if [ -x "$BUILD"/kernel_bench ] || [ $dry = 1 ]; then
    run_cmd "$(cap $((lim / 2)))" "$logs/t9_cudnn_bench.log" "$BUILD"/kernel_bench --model 1b \
      --ops attention --attention cudnn --csv "$out/kernel_bench_cudnn.csv"
  fi
  [ $dry = 1 ] && { record T9 dry-run "cuDNN attention tests and lab rows printed"; return; }
  local tail_line rows
  tail_line=$(grep -E '^(Passed|Failed|All tests|test cases)' "$log" | tail -1)
  rows=$(grep -E '^attention\.(fwd|bwd)' "$logs/t9_cudnn_bench.log" 2>/dev/null |
         awk '{printf "%s %s ms; ", $1, $(NF-6)}')
  record T9 "$(status_of $rc)" "${tail_line:-see logs/t9_cudnn.log}; cuDNN at 1B: ${rows:-no lab rows}"
}

# ---- T10 -----------------------------------------------------------------------------------------
# Issue 46 item 1: the engine's 8-bit AdamW step on LLaMA-1B's tensors (the kernel lab's
# adamw_update_q8 rows: C x C = 4,194,304 and V x C = 65,536,000 elements; target <= 40 us for
# the first) and one ncu profile of its kernel (its time, DRAM and SM throughput); then one step
# against bitsandbytes' CUDA kernel, code for code, and bitsandbytes' own step timed on the same
# tensors (the engine's must be no slower).
step_t10() {
  local log=$logs/t10_bitsandbytes.log rc figure="" ok=1
  begin T10 150 30 || return
  need_build T10 || return
  local n_small="" eng_small="" n_large="" eng_large="" ncu_fig=""
  if [ -x "$BUILD"/kernel_bench ] || [ $dry = 1 ]; then
    run_cmd "$(cap $((LIM / 3)))" "$logs/t10_kernel_bench_q8.log" "$BUILD"/kernel_bench --model 1b \
      --ops adamw --state-dtype q8 --csv "$logs/t10_q8.csv" || ok=0
    if command -v ncu >/dev/null || [ $dry = 1 ]; then
      run_cmd "$(cap $((LIM / 3)))" "$logs/t10_ncu.log" ncu --kernel-name regex:adamw_q8 --launch-count 1 \
        --metrics gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__throughput.avg.pct_of_peak_sustained_elapsed \
        --csv --log-file "$logs/t10_ncu.csv" "$BUILD"/kernel_bench --model 1b --ops adamw --state-dtype q8 --repeat 1
    fi
    if [ $dry = 0 ] && [ -s "$logs/t10_q8.csv" ]; then
      # "n=4194304 (C x C), blocks of 256": each tensor's elements and microseconds
      read -r n_small eng_small n_large eng_large < <(python3 -c 'import csv, sys
rows = {r["shape"].split(" (")[1].split(")")[0]: (r["shape"].split(" ")[0][2:], float(r["ms"]) * 1000)
        for r in csv.DictReader(open(sys.argv[1])) if r["op"] == "adamw_update_q8"}
print(" ".join("%s %.1f" % rows[k] if k in rows else "? -" for k in ("C x C", "V x C")))' "$logs/t10_q8.csv")
      eng_small=${eng_small#-} eng_large=${eng_large#-}
    fi
    if [ $dry = 0 ] && [ -s "$logs/t10_ncu.csv" ]; then
      ncu_fig=$(python3 -c 'import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 14 and "adamw_q8" in r[4]]
m = {r[12]: (r[14], r[13]) for r in rows}
names = (("gpu__time_duration.sum", "time"), ("dram__throughput.avg.pct_of_peak_sustained_elapsed", "DRAM"),
         ("sm__throughput.avg.pct_of_peak_sustained_elapsed", "SM"))
print(", ".join("%s %s %s" % (label, *m[k]) for k, label in names if k in m))' "$logs/t10_ncu.csv")
    fi
    figure_row T10 engine adamw_q8_us_CxC "$eng_small" us
    figure_row T10 engine adamw_q8_us_VxC "$eng_large" us
    figure+="engine 8-bit AdamW step (kernel lab, 1B): ${n_small:-?} elements ${eng_small:-?} us (target <= 40 us at 4194304), ${n_large:-?} elements ${eng_large:-?} us; ncu: ${ncu_fig:-none}; "
  fi
  if [ ! -d build-deps/python/bitsandbytes ]; then
    [ -n "$eng_small" ] && { record T10 "$([ $ok = 1 ] && echo pass || echo fail)" "${figure}bitsandbytes: not here (scripts/gpu_deps.sh copies it into build-deps/python)"; return; }
    record T10 "skipped (no bitsandbytes)" "${figure}scripts/gpu_deps.sh copies it into build-deps/python from tools/peers/setup_venv.sh torch2's environment"
    return
  fi
  run_cmd "$(cap $((LIM / 3)))" "$log" env PYTHONPATH="$PWD/build-deps/python${PYTHONPATH:+:$PYTHONPATH}" \
    "$PY" tools/peers/bitsandbytes_check.py --tool "$BUILD"/quant8_codes
  rc=$?
  [ $dry = 1 ] && { record T10 dry-run "the kernel lab's 8-bit rows, ncu, the bitsandbytes check and timing printed"; return; }
  if [ $rc = 77 ]; then
    record T10 "skipped (no bitsandbytes)" "${figure}$(tail -1 "$log")"; return
  fi
  local cuda_line bnb_small bnb_large
  cuda_line=$(grep 'adam step on cuda' "$log" | head -1 | cut -c1-400)
  if [ $rc = 0 ] && [ -z "$cuda_line" ]; then
    record T10 "skipped (torch saw no GPU)" "${figure}the CPU kernel's step passed; logs/t10_bitsandbytes.log"
    return
  fi
  bnb_small=$(sed -n 's/^bitsandbytes 8-bit adam step on cuda: 4194304 elements \([0-9.]*\) us.*/\1/p' "$log")
  bnb_large=$(sed -n 's/^bitsandbytes 8-bit adam step on cuda: .*, 65536000 elements \([0-9.]*\) us.*/\1/p' "$log")
  figure_row T10 bitsandbytes adamw_q8_us_CxC "$bnb_small" us
  figure_row T10 bitsandbytes adamw_q8_us_VxC "$bnb_large" us
  figure+="bitsandbytes' step: 4194304 elements ${bnb_small:-?} us, 65536000 elements ${bnb_large:-?} us; ${cuda_line:-see logs/t10_bitsandbytes.log}"
  [ $ok = 1 ] || rc=1
  record T10 "$(status_of $rc)" "$figure"
}

# ---- bench ---------------------------------------------------------------------------------------
step_bench() {
  local lim log=$logs/kernel_bench.log rc
  begin bench 90 20 || return
  lim=$LIM
  if [ ! -x "$BUILD"/kernel_bench ] && [ $dry = 0 ]; then
    record bench "not built" "no kernel_bench target in this tree (tools/kernel_lab)"
    return
  fi
  run_cmd "$(cap $((lim * 2 / 3)))" "$log" "$BUILD"/kernel_bench --model 60m,1b,13b --csv "$out/kernel_bench.csv"
  rc=$?
  # the engine's FA2-style attention (issue 45 item 2) at the shapes it is for, B 16 and 64
  local b
  for b in 16 64; do
    run_cmd "$(cap $((lim / 6)))" "$logs/kernel_bench_mma_b$b.log" "$BUILD"/kernel_bench --model 1b,13b \
      --ops attention --attention mma --batch $b --csv "$logs/kernel_bench_mma_b$b.csv"
  done
  # the mma backward's path B (a dK/dV kernel per key block, a dQ kernel per query block), which
  # the 13B rows above run (HD 128), at 1B B 64 against path A there
  run_cmd "$(cap $((lim / 8)))" "$logs/kernel_bench_mma_pathb_b64.log" env GRASS_MMA_BACKWARD=b \
    "$BUILD"/kernel_bench --model 1b --ops attention --attention mma --batch 64 \
    --csv "$logs/kernel_bench_mma_pathb_b64.csv"
  [ $dry = 1 ] && { record bench dry-run "$([ -x "$BUILD"/kernel_bench ] && echo "built" || echo "not built here (CPU-side targets only)")"; return; }
  local rows=0
  [ -f "$out/kernel_bench.csv" ] && rows=$(($(wc -l <"$out/kernel_bench.csv") - 1))
  record bench "$(status_of $rc)" "$rows rows in kernel_bench.csv"
}

# ---- shared by T5 and T7: a synthetic shard of vocab 32000 -------------------------------------------
shard=$BUILD/first_run_v32000.bin
ensure_shard() {
  [ -s "$shard" ] && return 0
  [ -x "$BUILD"/make_synthetic_shard ] || return 1
  "$BUILD"/make_synthetic_shard --out "$shard" --vocab 32000 --tokens 4000000 >>"$logs/shard.log" 2>&1
}
# step_line_field LOG: "tok/s" etc. helpers
done_field() { sed -n "s/.*median \([0-9.]*\) tok\/s.*/\1/p" "$1" | tail -1; }
mfu_field() { sed -n 's/.*tok\/s, MFU \([0-9.]*%\).*/\1/p' "$1" | tail -1; }

# ---- T8 ------------------------------------------------------------------------------------------
# Data parallelism's GPU path through the real NCCL (issue 16; docs/distributed.md): one rank under
# mpirun, so the gradients' sums go through ncclAllReduce on the sum stream: AdamW in bf16-mixed
# (deferred: the started sums in 25 MiB buckets), then GRASS top_r in pure bf16 (fused: one sum per
# tensor, and a refresh's full-gradient chunks every 2 steps). Needs mpirun and a build with MPI;
# the device machine may have neither (then: skipped, and why).
step_t8() {
  local rc log=$logs/t8_nccl.log
  begin T8 60 20 || return  # each of its two runs
  need_build T8 || return
  if ! command -v mpirun >/dev/null; then
    record T8 "skipped (no mpirun)" "OpenMPI is not on this machine (NCCL's one-rank path without MPI ran in T3: tests/gpu/test_gpu_nccl.cpp)"; return
  fi
  if [ $dry = 0 ] && [[ $(ldd "$BUILD"/grass 2>/dev/null) != *libmpi* ]]; then
    record T8 "skipped (no MPI)" "$BUILD/grass is not linked with MPI (built without libopenmpi-dev)"; return
  fi
  ensure_shard || { record T8 "fail (no shard)" "log: logs/shard.log"; return; }
  rm -rf "$work/t8_nccl"
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 run_cmd "$LIM" "$log" mpirun -np 1 \
    "$BUILD"/grass train configs/runs/bench_60m.json --set "data.train=$shard" --set device=cuda \
    --set precision=bf16-mixed --set steps=4 --set log_every=1 --set "out_dir=$work/t8_nccl"
  rc=$?
  if [ $rc = 0 ]; then
    rm -rf "$work/t8_nccl_grass"
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 run_cmd "$LIM" "$logs/t8_nccl_grass.log" \
      mpirun -np 1 "$BUILD"/grass train configs/runs/bench_60m.json --set "data.train=$shard" \
      --set device=cuda --set precision=bf16 --set optimizer.name=grass --set optimizer.rank=128 \
      --set optimizer.update_interval=2 --set steps=4 --set log_every=1 --set "out_dir=$work/t8_nccl_grass"
    rc=$?
  fi
  [ $dry = 1 ] && { record T8 dry-run "mpirun -np 1 printed"; return; }
  if [ $rc = 0 ] && ! grep -q "gradients through NCCL" "$log"; then
    record T8 "fail" "the run did not sum through NCCL (log: logs/t8_nccl.log)"; return
  fi
  record T8 "$(status_of $rc)" "$(grep -o 'gradients through NCCL [0-9.]*' "$log" | head -1); $(grep '^step' "$log" | sed -n 's/.*| comm \([^|]*\).*/comm \1/p' | tail -1); $(done_field "$log") tok/s"
}

# ---- T5 ------------------------------------------------------------------------------------------
# The headline: LLaMA-1B bf16-mixed AdamW at GaLore's batch (micro-batch 64 x 256, 512 x 256 per
# step: 8 micro-batches), 4 steps, whose median covers the 3 after the warm-up; the same with
# cuDNN's attention; SM clock and power sampled beside it. Host syncs per step from a 2-step run
# against the 4-step one (an LD_PRELOAD counter); then a 2-step profile (nsys, else ncu over one
# step) read by tools/gpu/profile_shares.py: GEMM / attention / other, the top 15 kernels, the
# optimizer's share, which gives the MFU without the optimizer, and from nsys' trace the GPU's
# idle time in each step.
step_t5() {
  local rc
  begin T5 270 60 || return
  need_build T5 || return
  ensure_shard || { record T5 "fail (no shard)" "log: logs/shard.log"; return; }
  local shim=$BUILD/libsync_count.so
  gcc -shared -fPIC -O2 -o "$shim" tools/gpu/sync_count.c -ldl >>"$logs/t5_syncs.log" 2>&1 || shim=""
  one_b 64 512
  local base=("${ONE_B[@]}" --set optimizer.name=adamw --set attention=grass)
  local counts=$logs/t5_sync_counts.txt n figure="" c smi=""
  rm -f "$counts"
  for n in 2 4; do  # two runs that differ only in steps: syncs per step = difference / 2
    rm -rf "$work/t5_1b_$n"
    c=$(cap 90)
    local pre=()
    [ -n "$shim" ] && pre=(env "SYNC_COUNT_OUT=$counts" "LD_PRELOAD=$(realpath "$shim")")
    [ $n = 4 ] && pre+=(env CUBLASLT_LOG_LEVEL=2 "CUBLASLT_LOG_FILE=$logs/t5_cublaslt_%i.log")
    if [ $n = 4 ] && [ $dry = 0 ] && command -v nvidia-smi >/dev/null; then
      nvidia-smi --query-gpu=clocks.sm,power.draw --format=csv,noheader,nounits -lms 500 \
        >"$logs/t5_smi.csv" 2>/dev/null &
      smi=$!
    fi
    run_cmd "$c" "$logs/t5_train_${n}steps.log" "${pre[@]}" "$BUILD"/grass train "${base[@]}" \
      --set steps=$n --set "out_dir=$work/t5_1b_$n"
    rc=$?
    [ -n "$smi" ] && { kill "$smi" 2>/dev/null; wait "$smi" 2>/dev/null; smi=""; }
    [ $dry = 0 ] && [ $rc != 0 ] && figure+="${n}-step run $(status_of $rc); "
  done
  local cudnn_rc=none  # cuDNN's attention, where the build found cudnn.h (T9 tests it)
  if [ $dry = 1 ] || grep -q 'cuDNN attention /' "$logs/build.log" 2>/dev/null; then
    rm -rf "$work/t5_1b_cudnn"
    run_cmd "$(cap 90)" "$logs/t5_train_cudnn.log" "$BUILD"/grass train "${base[@]}" \
      --set attention=cudnn --set steps=4 --set "out_dir=$work/t5_1b_cudnn"
    cudnn_rc=$?
  fi
  # attention "auto", the default (issue 45 item 1): what it took, and its speed
  rm -rf "$work/t5_1b_auto"
  run_cmd "$(cap 90)" "$logs/t5_train_auto.log" "$BUILD"/grass train "${base[@]}" \
    --set attention=auto --set steps=4 --set "out_dir=$work/t5_1b_auto"
  local auto_rc=$?
  # the engine's FA2-style kernels (issue 45 item 2, attention "mma"): never run on a GPU before
  rm -rf "$work/t5_1b_mma"
  run_cmd "$(cap 90)" "$logs/t5_train_mma.log" "$BUILD"/grass train "${base[@]}" \
    --set attention=mma --set steps=4 --set "out_dir=$work/t5_1b_mma"
  local mma_rc=$?
  local log4=$logs/t5_train_4steps.log syncs="n/a" mfu=""
  if [ $dry = 0 ]; then
    if [ -n "$shim" ] && [ "$(wc -l <"$counts" 2>/dev/null || echo 0)" -ge 2 ]; then
      local a b
      a=$(sed -n 1p "$counts" | grep -o 'total [0-9]*' | grep -o '[0-9]*')
      b=$(sed -n 2p "$counts" | grep -o 'total [0-9]*' | grep -o '[0-9]*')
      syncs=$(( (b - a) / 2 ))
    fi
    mfu=$(mfu_field "$log4")
    figure+="1B, 512x256 tokens/step in micro-batches of 64x256: $(done_field "$log4") tok/s, MFU ${mfu:-n/a}; "
    case $cudnn_rc in  # not T5's verdict: T9 is cuDNN's
      0) figure+="cuDNN attention: $(done_field "$logs/t5_train_cudnn.log") tok/s, MFU $(mfu_field "$logs/t5_train_cudnn.log"); " ;;
      none) figure+="cuDNN attention: not in this build; " ;;
      *) figure+="cuDNN attention: no figure (exit $cudnn_rc, log t5_train_cudnn.log); " ;;
    esac
    if [ $auto_rc = 0 ]; then
      figure+="attention auto took $(sed -n 's/^  attention  *//p' "$logs/t5_train_auto.log" | head -1 | cut -c1-80 | grep . || echo "the engine's kernels"): $(done_field "$logs/t5_train_auto.log") tok/s, MFU $(mfu_field "$logs/t5_train_auto.log" | grep . || echo n/a); "
      run_figures T5 adamw-auto "$logs/t5_train_auto.log"
    else
      figure+="attention auto: no figure (exit $auto_rc, log t5_train_auto.log); "
    fi
    if [ $mma_rc = 0 ]; then
      figure+="attention mma: $(done_field "$logs/t5_train_mma.log") tok/s, MFU $(mfu_field "$logs/t5_train_mma.log" | grep . || echo n/a); "
      run_figures T5 adamw-mma "$logs/t5_train_mma.log"
    else
      figure+="attention mma: no figure (exit $mma_rc, log t5_train_mma.log); "
    fi
    if [ -s "$logs/t5_smi.csv" ]; then  # "clock, power" every 0.5 s during the 4-step run
      figure+="$(sort -t, -k1 -n "$logs/t5_smi.csv" | awk -F', *' '{c[NR]=$1; p+=$2} END {
        if (NR) printf "SM clock min %d median %d MHz, power mean %.0f W over %d samples; ", c[1], c[int((NR+1)/2)], p/NR, NR}')"
    fi
    figure+="host syncs/step $syncs; $(grep -c 'using cublasGemmEx' "$log4") cublasGemmEx fallback lines; "
    run_figures T5 adamw "$log4"
    [ "$cudnn_rc" = 0 ] && run_figures T5 adamw-cudnn "$logs/t5_train_cudnn.log"
    figure_row T5 adamw host_syncs_per_step "${syncs/n\/a/}" syncs
  fi

  # the profile: nsys when it makes a report, else ncu over one step
  local nsys_bin prof_rc=1 plog=$logs/t5_profile.log prof_steps=2
  # (not the nsys inside nsight-compute's folder: seen there writing a .qdstrm but no report)
  nsys_bin=$(command -v nsys || compgen -G "/opt/nvidia/nsight-systems*/*/bin/nsys" | head -1)
  c=$(cap 150)
  if [ -n "$nsys_bin" ]; then
    rm -rf "$work/t5_1b_prof" "$work/t5_profile.nsys-rep"
    run_cmd "$c" "$plog" "$nsys_bin" profile -t cuda,nvtx --force-overwrite true -o "$work/t5_profile" \
      "$BUILD"/grass train "${base[@]}" --set steps=$prof_steps --set "out_dir=$work/t5_1b_prof"
    if [ $dry = 1 ] || [ -f "$work/t5_profile.nsys-rep" ]; then
      run_cmd 60 "$logs/t5_nsys_kern.csv" "$nsys_bin" stats -q --report cuda_gpu_kern_sum --format csv --output - "$work/t5_profile.nsys-rep"
      run_cmd 60 "$logs/t5_nsys_api.csv" "$nsys_bin" stats -q --report cuda_api_sum --format csv --output - "$work/t5_profile.nsys-rep"
      # every GPU activity and the NVTX ranges: the GPU's idle time in each step (issue 45 item 5)
      run_cmd 60 "$logs/t5_nsys_trace.csv" "$nsys_bin" stats -q --report cuda_gpu_trace --format csv --output - "$work/t5_profile.nsys-rep"
      run_cmd 60 "$logs/t5_nsys_nvtx.csv" "$nsys_bin" stats -q --report nvtx_pushpop_trace --format csv --output - "$work/t5_profile.nsys-rep"
      run_cmd 30 "$plog" "$PY" tools/gpu/profile_shares.py --nsys-kern "$logs/t5_nsys_kern.csv" \
        --nsys-api "$logs/t5_nsys_api.csv" --steps $prof_steps --layers 24 \
        --nsys-trace "$logs/t5_nsys_trace.csv" --nsys-nvtx "$logs/t5_nsys_nvtx.csv"
      prof_rc=$?
      [ $prof_rc = 0 ] && figure+="nsys: "
    else
      echo "nsys made no report; trying ncu" >>"$plog"
    fi
  fi
  if [ $prof_rc != 0 ] && { command -v ncu >/dev/null || [ $dry = 1 ]; }; then
    c=$(cap 150)
    rm -rf "$work/t5_1b_ncu"
    run_cmd "$c" "$plog" ncu --metrics gpu__time_duration.sum --csv --log-file "$logs/t5_ncu.csv" \
      --clock-control none --target-processes all \
      "$BUILD"/grass train "${base[@]}" --set steps=1 --set "out_dir=$work/t5_1b_ncu"
    run_cmd 30 "$plog" "$PY" tools/gpu/profile_shares.py --ncu "$logs/t5_ncu.csv" --steps 1 --layers 24
    prof_rc=$?
    [ $prof_rc = 0 ] && figure+="ncu (kernel times, serialised): "
  fi
  if [ $dry = 1 ]; then
    if timeout 30 "$PY" tools/gpu/profile_shares.py --self-test >>"$plog" 2>&1 && [ -n "$shim" ]; then
      record T5 dry-run "sync counter built, profile_shares self-test passed, runs printed"
    else
      record T5 "fail (dry-run)" "sync counter or profile_shares self-test (logs: t5_syncs.log, t5_profile.log)"
    fi
    return
  fi
  if [ $prof_rc = 0 ]; then
    local summary opt idle
    summary=$(sed -n 's/^SUMMARY: //p' "$plog" | tail -1)
    figure+="$summary; top kernel: $(sed -n 's/^TOP  *//p' "$plog" | head -1 | cut -c1-90)"
    idle=$(sed -n 's/^IDLE_SUMMARY: //p' "$plog" | tail -1)
    if [ -n "$idle" ]; then  # nsys only: ncu serialises the kernels
      figure+="; GPU idle in $idle"
      figure_row T5 adamw gpu_idle_last_step "$(echo "$idle" | sed -n 's/.*idle [0-9.]* ms (\([0-9.]*\)%).*/\1/p')" "%"
    fi
    opt=$(echo "$summary" | sed -n 's/.*optimizer \([0-9.]*\)%.*/\1/p')
    if [ -n "$mfu" ] && [ -n "$opt" ]; then  # the step's time less the optimizer kernels' share
      figure+="; MFU without the optimizer $(awk -v m="${mfu%\%}" -v o="$opt" 'BEGIN { printf "%.1f%%", m / (1 - o / 100) }')"
    fi
  else
    figure+="no profile (no nsys report, no ncu)"
  fi
  local result=pass
  [[ $figure == *fail* ]] && result=fail
  [ -z "$(done_field "$log4")" ] && result=fail
  record T5 "$result" "$figure"
}

# ---- T11 -----------------------------------------------------------------------------------------
# GRASS against AdamW, the paper's speed claim (issue 45 item 3; ../shared/GPU_PERF.md §2.3): T5's
# run (1B bf16-mixed, 512 x 256 tokens a step in micro-batches of 64) with AdamW and with GRASS
# r=512, in alternating rounds on the one GPU so that a clock or thermal drift falls on both. Each
# run's median covers the steps after the first (GRASS's refresh step is step 1).
step_t11() {
  begin T11 200 60 || return
  need_build T11 || return
  ensure_shard || { record T11 "fail (no shard)" "log: logs/shard.log"; return; }
  one_b 64 512
  local base=("${ONE_B[@]}" --set steps=4)
  local -A extra=([adamw]="--set optimizer.name=adamw"
                  [grass]="--set optimizer.name=grass --set optimizer.rank=512")
  local round opt rc figure="" failed=0 ran=0
  for round in 1 2; do
    for opt in adamw grass; do
      rm -rf "$work/t11_$opt"
      # shellcheck disable=SC2086
      training_run T11 "$opt-round$round" "$opt round $round" "$logs/t11_${opt}_$round.log" 60 45 \
        "$BUILD"/grass train "${base[@]}" ${extra[$opt]} --set "out_dir=$work/t11_$opt"
      rc=$?
      figure+=$RUN_NOTE
      [ $rc = 0 ] && [ $dry = 0 ] && ran=$((ran + 1))
      [ $rc = 1 ] && failed=1
    done
  done
  [ $dry = 1 ] && { record T11 dry-run "AdamW and GRASS r=512 at 1B, two alternating rounds, printed"; return; }
  # each optimizer's best round (the other round's figure is in figures.csv), and the ratio
  local a g
  a=$(grep -h 'median' "$logs"/t11_adamw_*.log 2>/dev/null | sed -n 's/.*median \([0-9.]*\) tok\/s.*/\1/p' | sort -n | tail -1)
  g=$(grep -h 'median' "$logs"/t11_grass_*.log 2>/dev/null | sed -n 's/.*median \([0-9.]*\) tok\/s.*/\1/p' | sort -n | tail -1)
  if [ -n "$a" ] && [ -n "$g" ]; then
    local ratio
    ratio=$(awk -v g="$g" -v a="$a" 'BEGIN { printf "%.3f", g / a }')
    figure="1B, 512x256 tokens/step, $ran runs in alternating rounds: AdamW $a tok/s, GRASS r=512 $g tok/s (best round each): GRASS/AdamW ${ratio}x (target >= 1.2x); $figure"
    figure_row T11 grass-over-adamw tokens_per_s_ratio "$ratio" x
  fi
  record T11 "$([ $failed = 0 ] && [ -n "$a" ] && [ -n "$g" ] && echo pass || echo fail)" "${figure%; }"
}

# ---- T6 ------------------------------------------------------------------------------------------
step_t6() {
  local lim log=$logs/t6_large.log rc
  begin T6 180 60 || return  # an H200 needed about 45 s before a third CPU model joined the test
  lim=$LIM
  need_build T6 || return
  run_cmd "$lim" "$log" env GRASS_LARGE_SCALE=full "$BUILD"/tests/grass_gpu_tests "[large]" --reporter compact
  rc=$?
  [ $dry = 1 ] && { record T6 dry-run "large-shape tests printed (their logic: GRASS_LARGE_SCALE=small on the emulator)"; return; }
  local f
  f="$(grep -Eo 'sum_squares over [0-9]+ bf16 elements in [0-9.]+ ms' "$log" | head -1); $(grep -Eo 'worst gradient rel error [^ ]+ \([^)]*\)' "$log" | tail -1); $(grep -E '^(Passed|Failed|All tests)' "$log" | tail -1)"
  record T6 "$(status_of $rc)" "$f"
}

# ---- T7 ------------------------------------------------------------------------------------------
step_t7() {
  local lim rc log=$logs/t7_13b.log plan_log=$logs/t7_13b_plan.log
  begin T7 180 100 || return  # an H200 needed 87 s (13B's init, the plan, 5 steps): less times out
  lim=$LIM
  need_build T7 || return
  ensure_shard || { record T7 "fail (no shard)" "log: logs/shard.log"; return; }
  local run_cfg=configs/runs/llama_13b_grass.json
  local sets=(--set "data.train=$shard" --set device=cuda)
  # the plan (runs on the CPU: also in a dry run)
  "$BUILD"/grass mem "$run_cfg" --device cuda --memory-limit 40GiB "${sets[@]}" >"$plan_log" 2>&1
  local plan_total
  plan_total=$("$BUILD"/grass mem "$run_cfg" --device cuda --json "${sets[@]}" 2>>"$plan_log" | sed -n 's/.*"total":\([0-9]*\).*/\1/p')
  local plan_gib="?"
  [ -n "$plan_total" ] && plan_gib=$(awk -v b="$plan_total" 'BEGIN { printf "%.2f", b / 2^30 }')
  rm -rf "$work/t7_13b"
  run_cmd "$lim" "$log" "$BUILD"/grass train "$run_cfg" --memory-limit 40GiB "${sets[@]}" --set steps=5 \
    --set log_every=1 --set "out_dir=$work/t7_13b"
  rc=$?
  if [ $dry = 1 ]; then
    if [ -n "$plan_total" ]; then
      record T7 dry-run "grass mem: 13B GRASS plan ${plan_gib} GiB; its verdict: $(head -1 "$plan_log" | cut -d';' -f1); run printed"
    else
      record T7 "fail (dry-run)" "grass mem failed (log: logs/t7_13b_plan.log)"
    fi
    return
  fi
  local arena peak
  arena=$(grep '^step' "$log" | sed -n 's/.*| mem \([0-9.]*\) GiB (device.*/\1/p' | tail -1)
  peak=$(device_peak "$log")
  local figure
  figure="plan ${plan_gib} GiB; arena ${arena:-?} GiB; device peak ${peak:-?} GiB (CUDA context and library memory included); $(grep -c '^step' "$log") step lines; $(done_field "$log") tok/s"
  figure_row T7 13b-1x256 plan_gib "$plan_gib" GiB
  figure_row T7 13b-1x256 device_peak_gib "$peak" GiB
  run_figures T7 13b-1x256 "$log"
  # then under a cap equal to the plan, if there is time: the plan's own gate at its edge
  if [ $rc = 0 ] && [ -n "$plan_total" ] && [ "$(cap 120)" -ge 90 ]; then
    rm -rf "$work/t7_13b_cap"
    run_cmd "$(cap 120)" "$logs/t7_13b_cap.log" "$BUILD"/grass train "$run_cfg" --memory-limit "$plan_total" \
      "${sets[@]}" --set steps=2 --set log_every=1 --set "out_dir=$work/t7_13b_cap"
    figure+="; with the cap at the plan: $(status_of $?)"
  fi
  # 13B at a batch that fills the GPU (issue 45 item 4): 16 x 256, and the largest micro-batch the
  # plan fits under 40 GiB, each one micro-batch a step
  local largest mb
  largest=$(sed -n 's/.*largest micro_batch_size that fits is \([0-9]*\).*/\1/p' "$plan_log" | head -1)
  for mb in 16 $largest; do
    if [ $rc != 0 ] || [ "$(cap 120)" -lt 100 ]; then figure+="; 13B at ${mb}x256: skipped"; continue; fi
    local blog=$logs/t7_13b_mb$mb.log bplan
    bplan=$(plan_gib "$run_cfg" --device cuda "${sets[@]}" --set micro_batch_size=$mb --set total_batch_size=$mb)
    rm -rf "$work/t7_13b_mb$mb"
    run_cmd "$(cap 120)" "$blog" "$BUILD"/grass train "$run_cfg" --memory-limit 40GiB "${sets[@]}" \
      --set micro_batch_size=$mb --set total_batch_size=$mb --set steps=4 --set log_every=1 \
      --set "out_dir=$work/t7_13b_mb$mb"
    local brc=$? bpeak
    bpeak=$(device_peak "$blog")
    figure+="; 13B at ${mb}x256: $(status_of $brc), plan ${bplan:-?} GiB, device peak ${bpeak:-?} GiB, $(done_field "$blog") tok/s, MFU $(mfu_field "$blog" | grep . || echo n/a)"
    figure_row T7 "13b-${mb}x256" plan_gib "$bplan" GiB
    figure_row T7 "13b-${mb}x256" device_peak_gib "$bpeak" GiB
    run_figures T7 "13b-${mb}x256" "$blog"
  done
  record T7 "$(status_of $rc)" "$figure"
}

# ---- T12 -----------------------------------------------------------------------------------------
# Weight streaming (issue 47): the link, then 13B at 16 x 256 resident against streamed.
step_t12() {
  local plan_log=$logs/t12_plan.log link_log=$logs/t12_link.log
  begin T12 420 200 || return  # two 13B runs: an H200 needed 87 s for one at 1 x 256 with init
  need_build T12 || return
  ensure_shard || { record T12 "fail (no shard)" "log: logs/shard.log"; return; }
  local figure="" link rc
  run_cmd "$(cap 60)" "$link_log" "$PY" tools/gpu/link_probe.py --json "$logs/t12_link.json"
  rc=$?
  link=$(sed -n 's/^link: //p' "$link_log" | tail -1)
  [ $dry = 0 ] && figure="link: ${link:-$(grep -h 'link_probe: skipped' "$link_log" | tail -1 | sed 's/link_probe: //' | grep . || echo "$(status_of $rc)")}; "
  if [ -f "$logs/t12_link.json" ]; then
    local way
    for way in h2d_gbps d2h_gbps both_gbps_each_way; do
      figure_row T12 link-pinned "$way" "$(sed -n "s/.*\"$way\": \([0-9.]*\).*/\1/p" "$logs/t12_link.json" | tail -1)" GB/s
    done
  fi
  local run_cfg=configs/runs/llama_13b_grass.json
  local sets=(--set "data.train=$shard" --set device=cuda --set micro_batch_size=16
              --set total_batch_size=16 --set steps=4 --set log_every=1)
  local streamed=(--memory-limit 24GiB --set offload=auto)
  "$BUILD"/grass mem "$run_cfg" --device cuda "${sets[@]}" "${streamed[@]}" >"$plan_log" 2>&1
  local choice
  choice=$(grep -m1 '^offload auto: ' "$plan_log" | sed 's/^offload auto: //; s/, the fastest placement.*: \([0-9.]* GiB\) on the device.*/: \1 on the device/')
  local run ok=1
  local -A plan
  for run in resident streamed; do
    rm -rf "$work/t12_$run"
    local placed=()
    [ $run = streamed ] && placed=("${streamed[@]}")
    plan[$run]=$(plan_gib "$run_cfg" --device cuda "${sets[@]}" "${placed[@]}")
    training_run T12 "13b-16x256-$run" "$run" "$logs/t12_$run.log" 180 120 \
      "$BUILD"/grass train "$run_cfg" "${sets[@]}" "${placed[@]}" --set "out_dir=$work/t12_$run" || ok=0
    figure+=$RUN_NOTE
  done
  [ $dry = 1 ] && { record T12 dry-run "the link probe and 13B at 16x256 resident (plan ${plan[resident]:-?} GiB) against ${choice:-streamed} (plan ${plan[streamed]:-?} GiB), printed"; return; }
  # What the device holds beside the plan, with and without a pinned host tier: the planner keeps
  # 1.26 GiB (an H200's 1.01 outside the arena, and 256 MiB headroom); issue 47's 7B and 70B
  # budgets keep more. Pinning may cost device memory (the GPU's page tables for host pages).
  local beside=""
  for run in resident streamed; do
    local peak
    peak=$(device_peak "$logs/t12_$run.log")
    figure_row T12 "13b-16x256-$run" plan_gib "${plan[$run]}" GiB
    figure_row T12 "13b-16x256-$run" device_peak_gib "$peak" GiB
    if [ -n "$peak" ] && [ -n "${plan[$run]}" ]; then
      local gib
      gib=$(awk -v p="$peak" -v q="${plan[$run]}" 'BEGIN { printf "%.2f", p - q }')
      figure_row T12 "13b-16x256-$run" device_beside_plan_gib "$gib" GiB
      beside+="$run: plan ${plan[$run]}, device peak $peak, beside the plan $gib GiB; "
    fi
  done
  figure+=$beside
  local r s same=n/a
  r=$(done_field "$logs/t12_resident.log")
  s=$(done_field "$logs/t12_streamed.log")
  if [ -s "$work/t12_resident/metrics.jsonl" ] && [ -s "$work/t12_streamed/metrics.jsonl" ]; then
    # the step rows' losses, to the last printed digit
    if cmp -s <(grep -o '"loss":[^,]*' "$work/t12_resident/metrics.jsonl") \
              <(grep -o '"loss":[^,]*' "$work/t12_streamed/metrics.jsonl"); then same=yes; else same=NO; ok=0; fi
  fi
  if [ -n "$r" ] && [ -n "$s" ]; then
    local ratio
    ratio=$(awk -v s="$s" -v r="$r" 'BEGIN { printf "%.3f", s / r }')
    figure+="13B GRASS 16x256: resident $r tok/s, streamed (${choice:-offload auto}) $s tok/s: ${ratio}x (target >= 0.8x); losses equal: $same"
    figure_row T12 streamed-over-resident tokens_per_s_ratio "$ratio" x
  fi
  record T12 "$([ $ok = 1 ] && [ "$same" = yes ] && echo pass || echo fail)" "${figure%; }"
}

# ---- T13 -----------------------------------------------------------------------------------------
# Issue 46 (../shared/GPU_PERF.md §2.4-2.6): what 8-bit states, sampled activations and GaLore's
# refresh cost at the step the H100 measured them at (plain 88-90 ms; q8 +40%, wta-crs +50%, a
# GaLore refresh 4.1-4.4 s). wta-crs runs twice: its draws beside the compute (the default) and
# on the compute stream (GRASS_SIDE_STREAM=0), the side stream's A/B in one build.
step_t13() {
  begin T13 240 90 || return
  need_build T13 || return
  ensure_shard || { record T13 "fail (no shard)" "log: logs/shard.log"; return; }
  one_b 16 16
  local base=("${ONE_B[@]}" --set steps=6 --set activation_checkpointing=none --set attention=grass)
  local sample=(--set activations.sample=wta-crs --set activations.keep=0.5)
  local -A extra=([plain]="" [q8]="--set optimizer.state_dtype=q8" [wta-crs]="${sample[*]}"
                  [wta-crs-inline]="${sample[*]}"
                  [galore]="--set optimizer.name=galore --set optimizer.rank=512 --set optimizer.update_interval=3"
                  [galore-staggered]="--set optimizer.name=galore --set optimizer.rank=512 --set optimizer.update_interval=3 --set optimizer.refresh_stagger=true"
                  [galore-batched]="--set optimizer.name=galore --set optimizer.rank=512 --set optimizer.update_interval=3 --set optimizer.svd_batch=layer")
  local -A envs=([wta-crs-inline]=GRASS_SIDE_STREAM=0 [galore]=GRASS_GALORE_TIMERS=1
                 [galore-staggered]=GRASS_GALORE_TIMERS=1 [galore-batched]=GRASS_GALORE_TIMERS=1)
  local run figure="" ok=1
  for run in plain q8 wta-crs wta-crs-inline galore galore-staggered galore-batched; do
    rm -rf "$work/t13_$run"
    # shellcheck disable=SC2086
    training_run T13 "$run" "$run" "$logs/t13_$run.log" 60 30 \
      env ${envs[$run]:-} "$BUILD"/grass train "${base[@]}" ${extra[$run]} --set "out_dir=$work/t13_$run" || ok=0
    figure+=$RUN_NOTE
  done
  [ $dry = 1 ] && { record T13 dry-run "plain, q8, wta-crs (side stream and inline) and GaLore r=512 (all at once, staggered and batched per layer) at 1B 16x256, printed"; return; }
  local -A tps
  for run in plain q8 wta-crs wta-crs-inline; do tps[$run]=$(done_field "$logs/t13_$run.log"); done
  t13_ratio() { [ -n "$1" ] && [ -n "$2" ] && awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", a / b }'; }
  local q w side
  q=$(t13_ratio "${tps[q8]}" "${tps[plain]}")
  w=$(t13_ratio "${tps[wta-crs]}" "${tps[plain]}")
  side=$(t13_ratio "${tps[wta-crs]}" "${tps[wta-crs-inline]}")
  figure_row T13 q8-over-plain tokens_per_s_ratio "$q" x
  figure_row T13 wta-crs-over-plain tokens_per_s_ratio "$w" x
  figure_row T13 side-stream-over-inline tokens_per_s_ratio "$side" x
  figure+="1B 16x256: plain ${tps[plain]:-?} tok/s; q8 ${tps[q8]:-?} (${q:-?}x, target >= 0.95x); "
  figure+="wta-crs ${tps[wta-crs]:-?} (${w:-?}x, target >= 0.95x; on the compute stream ${tps[wta-crs-inline]:-?}: side stream ${side:-?}x)"
  # GaLore: its last refresh step's time (metrics.jsonl) and range finder (the phase timers), per
  # target and batched per layer (svd_batch "layer": the step includes its refresh pass)
  t13_refresh() {  # run -> "step ms finder_ms eigensolver_ms" of its last refresh
    local at finder eig ms=""
    at=$(sed -n 's/^galore refresh at step \([0-9]*\):.*/\1/p' "$logs/t13_$1.log" | tail -1)
    finder=$(sed -n 's/^galore refresh at step [0-9]*: .*, \([0-9.]*\) ms in the range finder/\1/p' "$logs/t13_$1.log" | tail -1)
    eig=$(sed -n 's/^galore refresh phase eigensolver *\([0-9.]*\) ms/\1/p' "$logs/t13_$1.log" | tail -1)
    if [ -n "$at" ] && [ -s "$work/t13_$1/metrics.jsonl" ]; then
      ms=$(python3 -c 'import json, sys
for line in open(sys.argv[1]):
    m = json.loads(line)
    if m.get("step") == int(sys.argv[2]) and "step_ms" in m: print("%.1f" % m["step_ms"])' \
        "$work/t13_$1/metrics.jsonl" "$at" | tail -1)
    fi
    echo "${at:-?} ${ms:--} ${finder:--} ${eig:--}"
  }
  local at ms finder eig b_at b_ms b_finder b_eig
  read -r at ms finder eig <<<"$(t13_refresh galore)"
  read -r b_at b_ms b_finder b_eig <<<"$(t13_refresh galore-batched)"
  local run_name v
  for run_name in galore-refresh galore-batched; do  # "-": not found
    [ "$run_name" = galore-refresh ] && v=("$ms" "$finder" "$eig") || v=("$b_ms" "$b_finder" "$b_eig")
    figure_row T13 "$run_name" step_ms "${v[0]#-}" ms
    figure_row T13 "$run_name" range_finder_ms "${v[1]#-}" ms
    figure_row T13 "$run_name" eigensolver_ms "${v[2]#-}" ms
  done
  ms=${ms#-} b_ms=${b_ms#-}
  figure+="; GaLore r=512: refresh step $at ${ms:-?} ms (target <= 1000 ms), range finder ${finder#-} ms, eigensolver ${eig#-} ms"
  figure+="; batched per layer (svd_batch \"layer\"): refresh step $b_at ${b_ms:-?} ms, range finder ${b_finder#-} ms, eigensolver ${b_eig#-} ms"
  # refresh_stagger: after step 1 (every target) each step refreshes a third of them; its slowest
  local worst=""
  if [ -s "$work/t13_galore-staggered/metrics.jsonl" ]; then
    worst=$(python3 -c 'import json, sys
ms = [m["step_ms"] for m in map(json.loads, open(sys.argv[1])) if m.get("step", 0) >= 2 and "step_ms" in m]
print("%.1f" % max(ms) if ms else "")' "$work/t13_galore-staggered/metrics.jsonl")
  fi
  figure_row T13 galore-staggered slowest_step_ms "$worst" ms
  figure+="; staggered, the slowest step after the first ${worst:-?} ms"
  [ -n "$q" ] && [ -n "$w" ] && [ -n "$side" ] && [ -n "${ms:-}" ] && [ -n "${b_ms:-}" ] && [ -n "$worst" ] || ok=0
  record T13 "$([ $ok = 1 ] && echo pass || echo fail)" "${figure%; }"
}

# ---- summary -------------------------------------------------------------------------------------
write_summary() {
  local s f row="" overall
  {
    echo "# gpu_first_run: $today, commit $commit"
    echo
    echo "Device: $device. Budget ${budget} s, used $((SECONDS - start)) s.$([ $dry = 1 ] && echo " DRY RUN: nothing ran on a GPU.")"
    echo
    echo "| step | result | key figures |"
    echo "|---|---|---|"
    for s in "${STEPS_DONE[@]}"; do
      f=${FIGURE[$s]//|/\/}
      echo "| $s | ${RESULT[$s]} | $f |"
      case ${RESULT[$s]} in
        "not selected") ;;
        *) row+="$s ${RESULT[$s]}: $f; " ;;
      esac
    done
    overall=$(overall_result)
    echo
    echo "For the history table of docs/gpu-status.md:"
    echo
    echo "| date | commit | device | result |"
    echo "|---|---|---|---|"
    echo "| $today | $commit | $device | **gpu_first_run $overall.** ${row//|/\/} |"
    local rest=()
    for s in "${STEPS_DONE[@]}"; do [[ ${RESULT[$s]} == "skipped (budget)" ]] && rest+=("$s"); done
    if [ ${#rest[@]} -gt 0 ]; then
      echo
      echo "Out of budget before: ${rest[*]}. In the next call: scripts/gpu_first_run.sh --only build,$(IFS=,; echo "${rest[*]}")"
    fi
  } >"$out/summary.md"
  cat "$out/summary.md"
}
overall_result() {
  local s what=passed
  for s in "${STEPS_DONE[@]}"; do [[ ${RESULT[$s]} == fail* ]] && what="with failures"; done
  [ $dry = 1 ] && what="dry run $what"
  echo "$what"
}

echo "gpu_first_run: commit $commit, budget ${budget}s, logs in $logs, results in $out$([ $dry = 1 ] && echo ' (DRY RUN)')"
step_t0
start_probes
step_build
finish_probes
step_t3  # the GPU tests: the first failures
step_t5  # the headline: 1B's step time and MFU
step_t11  # GRASS against AdamW at the headline's run
step_t2
step_t9
step_t10
step_t6
step_t7
step_t8
step_t12  # weight streaming: a call of its own (--only build,T12,T13); in the first, out of budget
step_t13  # issue 46's features: with T12
step_bench  # last: the kernel lab is optional, T6/T7 run nowhere else
echo
write_summary
if [ $dry = 1 ] && [ -d build-deps ] && [ "$(du -sm build-deps | cut -f1)" -gt 60 ]; then
  echo "note: build-deps/ is $(du -sm build-deps | cut -f1) MiB with the unpacked root: run scripts/gpu_deps.sh again before carrying it (it keeps only the .debs)"
fi
[[ "$(overall_result)" == *"with failures" ]] && exit 1
exit 0
