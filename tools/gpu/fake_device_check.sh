#!/usr/bin/env bash
# Runs scripts/gpu_first_run.sh end to end WITHOUT a GPU, on stand-ins, to check the script
# itself: its steps, time limits, log parsing, summary and exit status. Not a check of any GPU
# code (the emulator tests do that); what runs where:
#   nvidia-smi          a stub printing an H100 SXM's query line
#   compute-sanitizer   a stub that runs the program it is given and reports no errors
#   ncu                 a stub that runs the program and writes a CSV of three kernel times
#   nsys                a stub (third call only) that runs the program, makes an empty report
#                       and prints canned tables for `nsys stats`: three kernels' times, the
#                       API calls, a trace of two steps' kernels and their NVTX "step" ranges
#   grass               grass_emu (the CLI on the CUDA emulator) with the models shrunk: the 1B
#                       and 13B runs train a 2-layer model of hidden 64 and vocab 32000
#   grass_gpu_tests     grass_gpu_emu_tests (the plain run filtered to two short tests; the
#                       large shapes at GRASS_LARGE_SCALE=small)
#   python              /usr/bin/python3 (Debian's CPU torch, python3-torch): T1's probe at toy
#                       sizes with --device cpu (without that package T1 reports skipped);
#                       T4 reports "skipped (no torch/CUDA)"
#   tools/gpu/fake_device_check.sh [BUILD_DIR]   (default build: it needs tests/cuda_emu/grass_emu,
#                                                 tests/grass_gpu_emu_tests, make_synthetic_shard)
# Then a second call, --only T12,T13 (weight streaming; issue 46's features), as a lease would
# make it, and a third, --only T5 with nsys on the path: the profile through nsys, with the GPU's
# idle time in a step; and a fourth, --only T10 with the emulator's kernel lab (--smoke) as
# kernel_bench: the 8-bit AdamW rows and the ncu profile it reads.
# Takes 4-6 minutes on 2 cores. Exit status 0 when the run's summary says what it should.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
emu=$(cd "${1:-build}" && pwd) || exit 1
for f in tests/cuda_emu/grass_emu tests/grass_gpu_emu_tests make_synthetic_shard; do
  [ -x "$emu/$f" ] || { echo "fake_device_check: $emu/$f missing (cmake --build $emu --target ${f##*/})"; exit 1; }
done
fake=$(mktemp -d /tmp/grass_fake_device.XXXXXX)
trap '[ "${KEEP:-0}" = 1 ] || rm -rf "$fake"' EXIT
mkdir -p "$fake/bin" "$fake/build/tests" "$fake/out"

cat >"$fake/bin/nvidia-smi" <<'EOF'
#!/bin/sh
case "$*" in *-lms*) printf '1755, 612.40\n1980, 650.10\n1980, 655.00\n'; exit 0 ;; esac  # T5's sampling
echo "name, driver_version, memory.total [MiB], clocks.max.sm [MHz], power.limit [W]"
echo "FAKE H100 80GB HBM3, 580.00.00, 81559 MiB, 1980 MHz, 700.00 W"
EOF
cat >"$fake/bin/compute-sanitizer" <<'EOF'
#!/bin/bash
while [[ $# -gt 0 && $1 == --* ]]; do
  case $1 in --tool|--racecheck-report|--leak-check|--error-exitcode) shift 2 ;; *) shift ;; esac
done
"$@"
rc=$?
echo "========= ERROR SUMMARY: 0 errors"
exit $rc
EOF
cat >"$fake/bin/ncu" <<'EOF'
#!/bin/bash
log=/dev/stdout
while [[ $# -gt 0 && $1 == --* ]]; do
  case $1 in
    --log-file) log=$2; shift 2 ;;
    --metrics|--clock-control|--target-processes|--kernel-name|--launch-count) shift 2 ;;
    *) shift ;;
  esac
done
"$@" >/dev/null
rc=$?
{
  echo '"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"'
  echo '"0","1","grass","h","nvjet_tst_128x256_64x4_2x1_v_bz_TNT","1","7","(384, 1, 1)","(66, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","usecond","600.00"'
  echo '"1","1","grass","h","attention_forward_kernel","1","7","(256, 1, 1)","(4, 32, 16)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","usecond","300.00"'
  echo '"2","1","grass","h","rmsnorm_forward_kernel","1","7","(256, 1, 1)","(100, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","usecond","100.00"'
} >"$log"
exit $rc
EOF
mkdir -p "$fake/nsys_bin"
cat >"$fake/nsys_bin/nsys" <<'EOF'
#!/bin/bash
case $1 in
  profile)
    shift
    out=""
    while [[ $# -gt 0 && $1 == -* ]]; do
      case $1 in -o) out=$2; shift 2 ;; -t|--force-overwrite) shift 2 ;; *) shift ;; esac
    done
    "$@" >/dev/null
    rc=$?
    [ -n "$out" ] && : >"$out.nsys-rep"
    exit $rc ;;
  stats)
    report=""
    while [[ $# -gt 0 ]]; do case $1 in --report) report=$2; shift 2 ;; *) shift ;; esac; done
    case $report in
      cuda_gpu_kern_sum)
        echo '"Time (%)","Total Time (ns)","Instances","Avg (ns)","Med (ns)","Min (ns)","Max (ns)","StdDev (ns)","Name"'
        echo '60.0,600000,2,1,1,1,1,0,"nvjet_tst_128x256_64x4_2x1_v_bz_TNT"'
        echo '30.0,300000,2,1,1,1,1,0,"attention_forward_kernel"'
        echo '10.0,100000,2,1,1,1,1,0,"rmsnorm_forward_kernel"' ;;
      cuda_api_sum)
        echo '"Time (%)","Total Time (ns)","Num Calls","Avg (ns)","Med (ns)","Min (ns)","Max (ns)","StdDev (ns)","Name"'
        echo '90.0,100,4,1,1,1,1,0,"cudaStreamSynchronize"' ;;
      cuda_gpu_trace)  # step 2: 0.3 + 0.2 + 0.3 ms of kernels, a 0.1 ms gap, 0.1 ms before
        echo '"Start (ns)","Duration (ns)","CorrId","Strm","Name"'
        echo '1000000,500000,1,7,"nvjet_tst_128x256_64x4_2x1_v_bz_TNT"'
        echo '1500000,400000,2,7,"attention_forward_kernel"'
        echo '3100000,300000,3,7,"nvjet_tst_128x256_64x4_2x1_v_bz_TNT"'
        echo '3400000,200000,4,7,"attention_forward_kernel"'
        echo '3700000,300000,5,7,"rmsnorm_forward_kernel"' ;;
      nvtx_pushpop_trace)
        echo '"Start (ns)","End (ns)","Duration (ns)","Name","RangeId"'
        echo '900000,2000000,1100000,"step",1'
        echo '3000000,4000000,1000000,"step",2' ;;
    esac ;;
esac
EOF
# a 2-layer model with the real vocabulary, for the 1B and 13B runs
cat >"$fake/model.json" <<'EOF'
{"architectures": ["LlamaForCausalLM"], "hidden_act": "silu", "hidden_size": 64,
 "initializer_range": 0.02, "intermediate_size": 172, "max_position_embeddings": 2048,
 "model_type": "llama", "num_attention_heads": 4, "num_hidden_layers": 2,
 "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "rope_theta": 10000.0,
 "tie_word_embeddings": false, "vocab_size": 32000}
EOF
cat >"$fake/build/grass" <<EOF
#!/bin/bash
args=()
for a in "\$@"; do
  case \$a in
    model=configs/models/llama_1b.json) a=model=$fake/model.json ;;
    total_batch_size=512) a=total_batch_size=4 ;;
    micro_batch_size=*|total_batch_size=*) a=\${a%=*}=2 ;;  # T7's 16 and 59 too
    optimizer.rank=*) a=optimizer.rank=8 ;;  # the shrunk model's k/v are 32 wide
    seq_len=256) a=seq_len=64 ;;
  esac
  args+=("\$a")
done
[ "\$1" = train ] && [[ "\$2" == *13b* ]] && args+=(--set model=$fake/model.json --set seq_len=64 --set optimizer.rank=8)
[ "\$1" = train ] && [[ "\$2" == *bench_60m* ]] && args+=(--set model=$fake/model.json --set seq_len=64)
exec "$emu/tests/cuda_emu/grass_emu" "\${args[@]}"
EOF
cat >"$fake/build/tests/grass_gpu_tests" <<EOF
#!/bin/bash
export OMP_WAIT_POLICY=PASSIVE
[ "\${GRASS_LARGE_SCALE:-}" = full ] && export GRASS_LARGE_SCALE=small
[ "\$*" = "--reporter compact" ] && set -- "gpu sum_squares*,gpu f32_to_bf16*" "\$@"
exec "$emu/tests/grass_gpu_emu_tests" "\$@"
EOF
cat >"$fake/python" <<'EOF'
#!/bin/bash
case "$*" in
  *gemm_align_probe.py*) exec /usr/bin/python3 "$@" --device cpu --n 128 --c 64 --iters 2 ;;
  *) exec /usr/bin/python3 "$@" ;;
esac
EOF
chmod +x "$fake"/bin/* "$fake/nsys_bin/nsys" "$fake/build/grass" "$fake/build/tests/grass_gpu_tests" "$fake/python"
ln -s "$emu/make_synthetic_shard" "$fake/build/make_synthetic_shard"
[ -x "$emu/quant8_codes" ] && ln -s "$emu/quant8_codes" "$fake/build/quant8_codes"  # T10's tool

echo "fake_device_check: running scripts/gpu_first_run.sh on stand-ins in $fake"
PATH="$fake/bin:$PATH" OUT="$fake/out" GRASS_BUILD_DIR="$fake/build" PYTHON="$fake/python" \
  OMP_NUM_THREADS=2 scripts/gpu_first_run.sh --skip-build --budget 900 >"$fake/run.log" 2>&1
rc=$?
cat "$fake/run.log"
fails=0
expect() {  # expect DESCRIPTION GREP-PATTERN: a line of the summary matches
  if grep -Eq "$2" "$fake/out/summary.md"; then echo "ok: $1"; else echo "FAIL: $1 ($2)"; fails=$((fails + 1)); fi
}
expect "T0 reads the device and calls it SXM" '^\| T0 \| pass \| FAKE H100 80GB HBM3 \(SXM, 81559 MiB'
if /usr/bin/python3 -c "import torch" 2>/dev/null; then
  expect "T1 prints the alignment verdict" '^\| T1 \| pass \| 5461/5504 slowdown .*row-pitch padding'
else  # python3-torch is not installed here: T1 must say so, not fail
  expect "T1 is skipped without torch" '^\| T1 \| skipped \(no torch/CUDA\) \| gemm_align_probe: torch is not importable'
fi
expect "T4 is skipped without SDPA/CUDA" '^\| T4 \| skipped \(no torch/CUDA\)'
expect "T2 runs the sanitizers" '^\| T2 \| pass \| racecheck 0 reports; racecheck_reduce 0 reports; synccheck 0 reports; memcheck 0 reports; memcheck over 2 training steps clean'
expect "T3 reports Catch's totals" '^\| T3 \| pass \| (Passed|All tests)'
expect "T5 measures tok/s, clocks, syncs and the shares" '^\| T5 \| pass \| 1B, 512x256 tokens/step.*tok/s.*SM clock min 1755 median 1980 MHz, power mean 639 W over 3 samples; host syncs/step [0-9]+.*GEMM 60\.0%, attention 30\.0%, other 10\.0%.*optimizer 0\.0%; top kernel: 60\.0%.*nvjet'
expect "T5 runs attention auto and says what it took" '^\| T5 \| pass \| .*attention auto took the engine.s kernels .*: [0-9.]+ tok/s'
expect "T6 runs the large-shape tests" '^\| T6 \| pass \| .*worst gradient rel error'
expect "T7 sets the step lines beside the plan" '^\| T7 \| pass \| plan 28\.40 GiB; arena [0-9.]+ GiB; device peak [0-9.]+ GiB'
expect "T7 runs 13B at 16x256 and the largest micro-batch" '^\| T7 \| pass \| .*13B at 16x256: pass, plan [0-9.]+ GiB, device peak [0-9.]+ GiB, [0-9.]+ tok/s, MFU ([0-9.]+%|n/a); 13B at 56x256: pass'
expect "T11 times GRASS against AdamW in rounds" '^\| T11 \| pass \| 1B, 512x256 tokens/step, 4 runs in alternating rounds: AdamW [0-9.]+ tok/s, GRASS r=512 [0-9.]+ tok/s \(best round each\): GRASS/AdamW [0-9.]+x'
expect "T10 skips without bitsandbytes and a GPU" '^\| T10 \| (skipped|pass)'
expect "bench says not built" '^\| bench \| not built'
expect "T12 waits for a call of its own when the first has no time left" '^\| T12 \| (skipped \(budget\)|pass) '
expect "T13 waits for a call of its own when the first has no time left" '^\| T13 \| (skipped \(budget\)|pass) '
expect "a history row" '^\| [0-9-]+ \| [^|]+ \| FAKE H100 .* \| \*\*gpu_first_run passed\.\*\*'
# figures.csv: a header, then one row per figure (T5's three runs, T11's four and their ratio,
# T7's three runs)
csv_rows() { grep -c "$1" "$fake/out/figures.csv" 2>/dev/null || echo 0; }
rows_result() {  # rows_result DESCRIPTION STATUS: the rows' test passed (0), or FAIL and the file
  if [ "$2" = 0 ]; then echo "ok: $1"; else
    echo "FAIL: $1"; cat "$fake/out/figures.csv" 2>/dev/null; fails=$((fails + 1))
  fi
}
exit_result() {  # exit_result WHAT: the last call's exit status ($rc) was 0
  if [ $rc = 0 ]; then echo "ok: $1: exit 0"; else echo "FAIL: $1: exit $rc"; fails=$((fails + 1)); fi
}
# further_call LOG BIN_DIR ARGS...: the script again with these arguments and BIN_DIR's stand-ins
# first on the path, figures.csv afresh; its output shown, its status in rc
further_call() {
  local log=$1 bins=$2
  shift 2
  rm -f "$fake/out/figures.csv"
  PATH="$bins:$PATH" OUT="$fake/out" GRASS_BUILD_DIR="$fake/build" PYTHON="$fake/python" \
    OMP_NUM_THREADS=2 scripts/gpu_first_run.sh --skip-build "$@" >"$log" 2>&1
  rc=$?
  cat "$log"
}
[ "$(head -1 "$fake/out/figures.csv" 2>/dev/null)" = "step,run,figure,value,unit" ] &&
  [ "$(csv_rows '^T5,adamw,tokens_per_s,[0-9.]*,tok/s$')" = 1 ] &&
  [ "$(csv_rows '^T5,adamw-auto,tokens_per_s,[0-9.]*,tok/s$')" = 1 ] &&
  [ "$(csv_rows '^T11,[a-z]*-round[12],tokens_per_s,')" = 4 ] &&
  [ "$(csv_rows '^T11,grass-over-adamw,tokens_per_s_ratio,[0-9.]*,x$')" = 1 ] &&
  [ "$(csv_rows '^T7,13b-[0-9x]*,device_peak_gib,[0-9.]*,GiB$')" = 3 ]
rows_result "figures.csv" $?
if [ -s "$fake/out/first_run_logs.tar.gz" ]; then echo "ok: logs packed"; else echo "FAIL: no logs tarball"; fails=$((fails + 1)); fi
exit_result "the first call"
# the call of its own (T12, T13): the link probe (skipped without CUDA), then the two 13B runs
# (the shrunk model: offload auto has nothing to move) with equal losses and a ratio; then the
# seven 1B runs of issue 46 (shrunk), their ratios, GaLore's refresh steps and its staggered run
further_call "$fake/run_t12.log" "$fake/bin" --only T12,T13 --budget 600
expect "T12 runs 13B resident against streamed, losses equal" '^\| T12 \| pass \| link: (skipped \(no (torch|CUDA)\)|[0-9]+ MiB H2D).*13B GRASS 16x256: resident [0-9.]+ tok/s, streamed \(.*\) [0-9.]+ tok/s: [0-9.]+x \(target >= 0\.8x\); losses equal: yes'
expect "T12 states what the device holds beside each plan" '^\| T12 \| pass \| .*resident: plan [0-9.]+, device peak [0-9.]+, beside the plan -?[0-9.]+ GiB; streamed: plan [0-9.]+, device peak [0-9.]+, beside the plan -?[0-9.]+ GiB; 13B GRASS'
[ "$(csv_rows '^T12,13b-16x256-[a-z]*,tokens_per_s,')" = 2 ] &&
  [ "$(csv_rows '^T12,13b-16x256-[a-z]*,device_beside_plan_gib,-*[0-9.]*,GiB$')" = 2 ] &&
  [ "$(csv_rows '^T12,streamed-over-resident,tokens_per_s_ratio,[0-9.]*,x$')" = 1 ]
rows_result "T12's figures.csv rows" $?
expect "T13 times q8, wta-crs (side stream and inline) and GaLore's refresh" '^\| T13 \| pass \| 1B 16x256: plain [0-9.]+ tok/s; q8 [0-9.]+ \([0-9.]+x, target >= 0\.95x\); wta-crs [0-9.]+ \([0-9.]+x, target >= 0\.95x; on the compute stream [0-9.]+: side stream [0-9.]+x\); GaLore r=512: refresh step [0-9]+ [0-9.]+ ms \(target <= 1000 ms\), range finder [0-9.]+ ms, eigensolver [0-9.]+ ms; batched per layer \(svd_batch "layer"\): refresh step [0-9]+ [0-9.]+ ms, range finder [0-9.]+ ms, eigensolver [0-9.]+ ms; staggered, the slowest step after the first [0-9.]+ ms'
[ "$(csv_rows '^T13,[a-z0-9-]*,tokens_per_s,')" = 7 ] &&
  [ "$(csv_rows '^T13,[a-z0-9-]*-over-[a-z]*,tokens_per_s_ratio,[0-9.]*,x$')" = 3 ] &&
  [ "$(csv_rows '^T13,galore-refresh,[a-z_]*,[0-9.]*,ms$')" = 3 ] &&
  [ "$(csv_rows '^T13,galore-batched,[a-z_]*,[0-9.]*,ms$')" = 3 ] &&
  [ "$(csv_rows '^T13,galore-staggered,slowest_step_ms,[0-9.]*,ms$')" = 1 ]
rows_result "T13's figures.csv rows" $?
exit_result "T12 and T13"
# the third call: T5 with nsys, whose tables give the shares and the last step's idle time (1 ms
# of wall, 0.8 ms of kernels, one 0.1 ms gap between them)
further_call "$fake/run_t5.log" "$fake/nsys_bin:$fake/bin" --only T5 --budget 400
expect "T5 profiles with nsys and says how long the GPU idles" '^\| T5 \| pass \| .*nsys: GEMM 60\.0%, attention 30\.0%, other 10\.0%.*; GPU idle in the last step: wall 1\.00 ms, GPU busy 0\.80 ms, idle 0\.20 ms \(20\.0%\), 0\.10 ms of it between kernels \(gaps: 1\)'
[ "$(csv_rows '^T5,adamw,gpu_idle_last_step,20\.0,%$')" = 1 ]
rows_result "T5's idle row in figures.csv" $?
exit_result "T5 with nsys"
# the fourth call: T10 with a kernel lab (the emulator's, at --smoke shapes), whose 8-bit AdamW
# rows and ncu profile it reads; still no bitsandbytes here
if [ -x "$emu/kernel_bench_emu" ]; then
  printf '#!/bin/bash\nexec %q --smoke "$@"\n' "$emu/kernel_bench_emu" >"$fake/build/kernel_bench"
  chmod +x "$fake/build/kernel_bench"
  further_call "$fake/run_t10.log" "$fake/bin" --only T10 --budget 300
  expect "T10 reads the kernel lab's 8-bit AdamW rows" '^\| T10 \| pass \| engine 8-bit AdamW step \(kernel lab, 1B\): [0-9]+ elements [0-9.]+ us \(target <= 40 us at 4194304\), [0-9]+ elements [0-9.]+ us; ncu: [^;]*; bitsandbytes: not here'
  [ "$(csv_rows '^T10,engine,adamw_q8_us_[CV]xC,[0-9.]*,us$')" = 2 ]
  rows_result "T10's figures.csv rows" $?
  exit_result "T10"
else
  echo "FAIL: $emu/kernel_bench_emu missing (cmake --build $emu --target kernel_bench_emu)"; fails=$((fails + 1))
fi
echo "fake_device_check: $fails failure(s)"
[ $fails = 0 ]
