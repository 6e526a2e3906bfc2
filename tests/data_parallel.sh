#!/usr/bin/env bash
# Data parallelism over MPI, end to end with the real binary (docs/distributed.md): runs of 2 and
# 4 CPU ranks under mpirun must match the one-process run with the same global batch, step for
# step (loss and gradient norm within 1e-6 relative: only the order of the sums differs), for
# AdamW, GRASS (refreshes included), GaLore and FLORA, deferred and fused; the bytes each rank
# sums must equal `grass mem`'s plan of them; a rerun must repeat its
# bits; a 2-rank run resumed from its checkpoint must equal the uninterrupted 2-rank run byte for
# byte and a resume on another rank count is refused; a batch the ranks cannot split is refused
# with one line; and a rank killed mid-run, or stopped, ends the whole job within a timeout,
# leaving the checkpoints it wrote verifiable.
# The one-process twin of a run of W ranks with micro-batches of m reads micro-batches of m x W:
# rank r takes positions r, r + W, ... of each epoch's order, so the i-th micro-batches of the
# ranks together hold exactly the one-process run's i-th micro-batch (GRASS's refresh selects on
# the first micro-batch, so this twin is the one that matches it exactly).
# The CUDA path runs too, on the emulator: 2 ranks of grass_emu with device cuda, summing through
# the emulated NCCL. Run by ctest with GRASS, GRASS_EMU and DIST_SELFTEST set to those binaries,
# from the source directory.
set -uo pipefail
: "${GRASS:?set GRASS to the grass binary}"
: "${DIST_SELFTEST:?set DIST_SELFTEST to the dist_selftest binary}"
: "${GRASS_EMU:?set GRASS_EMU to grass on the CUDA emulator (tests/cuda_emu)}"
command -v mpirun >/dev/null || { echo "FAIL: mpirun not found (apt-get install openmpi-bin)"; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
export OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Several ranks on 2 cores: oversubscribed ranks must yield the core while they wait.
mpi=(mpirun --oversubscribe --mca mpi_yield_when_idle 1 --mca btl self,vader)

# The communicator alone: its sums and its refusal of values that differ between ranks.
for n in 2 4; do
  "${mpi[@]}" -np $n "$DIST_SELFTEST" >"$tmp/selftest$n.log" 2>&1 ||
    { fail "dist_selftest on $n ranks"; cat "$tmp/selftest$n.log"; }
done

"$(dirname "$GRASS")/make_synthetic_shard" --out "$tmp/train.bin" --vocab 512 --tokens 40000 >/dev/null
cat >"$tmp/run.json" <<JSON
{"model": "configs/models/llama_tiny.json",
 "data": {"train": "$tmp/train.bin"},
 "optimizer": {"name": "adamw", "lr": 3e-3},
 "schedule": {"name": "cosine", "warmup_steps": 2},
 "micro_batch_size": 4, "total_batch_size": 16, "seq_len": 32, "steps": 7,
 "log_every": 1, "out_dir": "$tmp/unused"}
JSON

# compare A B [TOL]: every step's loss and gradient norm within TOL (1e-6) relative
compare() {
  python3 - "$1/metrics.jsonl" "$2/metrics.jsonl" "${3:-1e-6}" <<'PY'
import json, sys
tol = float(sys.argv[3])
rows = [[json.loads(l) for l in open(p) if '"loss"' in l] for p in sys.argv[1:3]]
assert len(rows[0]) == len(rows[1]) > 0, f"{len(rows[0])} against {len(rows[1])} steps"
for a, b in zip(*rows):
    for key in ("loss", "grad_norm"):
        rel = abs(a[key] - b[key]) / abs(a[key])
        assert rel <= tol, f"step {a['step']}: {key} {a[key]!r} against {b[key]!r} ({rel:.2e})"
PY
}

# case NAME RANKS MICRO OPTIONS...: W ranks with micro-batches of MICRO against one process, with
# the binary $bin (default $GRASS) and the tolerance $tol (default 1e-6)
case_run() {
  local name=$1 ranks=$2 micro=$3 binary=${bin:-$GRASS}
  shift 3
  "$binary" train "$tmp/run.json" --set out_dir="$tmp/$name.one" --set micro_batch_size=$((micro * ranks)) \
    "$@" >"$tmp/$name.one.log" 2>&1 || { fail "$name: the one-process run failed"; cat "$tmp/$name.one.log"; return; }
  "${mpi[@]}" -np "$ranks" "$binary" train "$tmp/run.json" --set out_dir="$tmp/$name.dp" \
    --set micro_batch_size="$micro" "$@" >"$tmp/$name.dp.log" 2>&1 ||
    { fail "$name: the $ranks-rank run failed"; cat "$tmp/$name.dp.log"; return; }
  grep -q "ranks .*$ranks ranks" "$tmp/$name.dp.log" || fail "$name: the run table does not show $ranks ranks"
  compare "$tmp/$name.one" "$tmp/$name.dp" "${tol:-1e-6}" || fail "$name: $ranks ranks differ from one process"
}

grass=(--set optimizer.name=grass --set optimizer.rank=8 --set optimizer.update_interval=3)
lowrank=(--set optimizer.rank=8 --set optimizer.update_interval=3)
case_run adamw2 2 2
case_run adamw4 4 2
case_run grass2 2 4 "${grass[@]}"
case_run grass4_multinomial 4 2 "${grass[@]}" --set optimizer.selection=multinomial
case_run galore2 2 2 --set optimizer.name=galore "${lowrank[@]}"
case_run flora2 2 2 --set optimizer.name=flora "${lowrank[@]}"
# GaLore's refresh pass (svd_batch "layer"): each rank's pass sums the full gradients it sketches
batched=(--set optimizer.name=galore --set optimizer.svd=randomized --set optimizer.svd_batch=layer)
case_run galore2_batched 2 2 "${batched[@]}" "${lowrank[@]}"
# fused updates: one micro-batch per rank and step
case_run fused_adamw2 2 8 --set fused_update=on
case_run fused_grass2 2 8 --set fused_update=on "${grass[@]}"

# The CUDA path on the emulator (tests/cuda_emu): grass_emu with device cuda, each rank on its own
# emulated GPU, the gradients summed through the emulated NCCL. Held to bf16's tolerance: the
# order of the fp32 sums moves the master weights in their last bits, and a bf16 weight rounded
# the other way changes the next forward (bf16-mixed, 1e-3; measured 1.4e-5); pure bf16 sums
# bf16 gradients, each rank's rounded before the sum (1e-2).
# GRASS_BUCKET_MB=0: each gradient's sum starts the moment the step hands it over, so a sum started
# before its gradient is complete would miss a part.
# Four steps (GRASS refreshes at steps 1 and 4): the emulator takes about a second a step.
export GRASS_BUCKET_MB=0
emu=(--set device=cuda --set precision=bf16-mixed --set steps=4 "${grass[@]}")
bin=$GRASS_EMU tol=1e-3 case_run emu_grass2 2 2 "${emu[@]}"
grep -q "gradients through NCCL" "$tmp/emu_grass2.dp.log" || fail "emu_grass2: the gradients did not go through NCCL"
bin=$GRASS_EMU tol=1e-2 case_run emu_bf16_fused2 2 8 --set device=cuda --set precision=bf16 --set steps=4 \
  "${grass[@]}"
grep -q "updates fused into the backward" "$tmp/emu_bf16_fused2.dp.log" || fail "emu_bf16_fused2: not fused"
# And once more with deferred, adversarial streams (tests/cuda_emu/streams.h): each rank's sums
# run when their stream gets to them, so they must wait for the backward's kernels through the
# sum stream's event, whatever order the emulator runs the two streams in.
export CUDA_EMU_STREAMS=deferred:1
mpi_plain=("${mpi[@]}")
mpi+=(-x CUDA_EMU_STREAMS)
bin=$GRASS_EMU tol=1e-3 case_run emu_grass2_deferred 2 2 "${emu[@]}"
mpi=("${mpi_plain[@]}")
unset CUDA_EMU_STREAMS
# Nothing takes device memory after the reservation: the emulated NCCL connects lazily as NCCL
# 2.22+ does, so without NCCL_RUNTIME_CONNECT=0 and the warm-up sum each rank would warn here.
for name in emu_grass2 emu_bf16_fused2; do
  if grep -q "memory in use grew" "$tmp/$name.dp.log"; then
    fail "$name: device memory allocated after the reservation"
    grep "memory in use grew" "$tmp/$name.dp.log"
  fi
done
unset GRASS_BUCKET_MB

# The bytes each rank summed, counted in the run, equal the plan's (grass mem): every step, plus
# the full gradients at GRASS's and GaLore's refreshes (steps 1, 4, 7 at K = 3).
bytes_match() {
  local name=$1
  shift
  "$GRASS" mem "$tmp/run.json" --device cpu --json "$@" >"$tmp/$name.plan.json" ||
    { fail "$name: grass mem failed"; return; }
  python3 - "$tmp/$name.plan.json" "$tmp/$name.dp/metrics.jsonl" <<'PY' || fail "$name: comm_bytes differ from the plan"
import json, sys
plan = json.load(open(sys.argv[1]))
for row in (json.loads(l) for l in open(sys.argv[2]) if '"loss"' in l):
    want = plan["step_sum_bytes"] + (plan["refresh_sum_bytes"] if (row["step"] - 1) % 3 == 0 else 0)
    assert row["comm_bytes"] == want, f"step {row['step']}: {row['comm_bytes']} bytes, the plan says {want}"
PY
}
bytes_match adamw2
bytes_match grass2 "${grass[@]}"
bytes_match galore2 --set optimizer.name=galore "${lowrank[@]}"
bytes_match flora2 --set optimizer.name=flora "${lowrank[@]}"
bytes_match galore2_batched "${batched[@]}" "${lowrank[@]}"

# The same bits on a rerun.
"${mpi[@]}" -np 2 "$GRASS" train "$tmp/run.json" --set out_dir="$tmp/grass2.again" --set micro_batch_size=4 \
  "${grass[@]}" >"$tmp/again.log" 2>&1 || fail "the rerun failed"
python3 -c "
import json, sys
strip = lambda p: [{k: v for k, v in json.loads(l).items() if k in ('step', 'loss', 'grad_norm')} for l in open(p)]
sys.exit(strip('$tmp/grass2.dp/metrics.jsonl') != strip('$tmp/grass2.again/metrics.jsonl'))" ||
  fail "a rerun of 2 ranks gives other losses or norms"

# Resume: 2 ranks stopped after step 4 (its checkpoint) and resumed equal the uninterrupted run
# (a constant rate: the cosine's depends on `steps`, which the first part sets to 4).
ckpt=(--set checkpoint_every=4 "${grass[@]}" --set micro_batch_size=4 --set schedule.name=constant
      --set schedule.warmup_steps=0)
"${mpi[@]}" -np 2 "$GRASS" train "$tmp/run.json" --set out_dir="$tmp/resume" "${ckpt[@]}" --set steps=4 \
  >"$tmp/resume1.log" 2>&1 || fail "the run to step 4 failed"
"${mpi[@]}" -np 2 "$GRASS" train "$tmp/run.json" --set out_dir="$tmp/resume" "${ckpt[@]}" \
  >"$tmp/resume2.log" 2>&1 || { fail "the resumed run failed"; cat "$tmp/resume2.log"; }
grep -q "resume .*step 4 of 7" "$tmp/resume2.log" || fail "the second run did not resume from step 4"
"${mpi[@]}" -np 2 "$GRASS" train "$tmp/run.json" --set out_dir="$tmp/straight" "${ckpt[@]}" \
  >"$tmp/straight.log" 2>&1 || fail "the uninterrupted run failed"
for f in model.safetensors state.safetensors; do
  cmp -s "$tmp/resume/checkpoints/step_00000007/$f" "$tmp/straight/checkpoints/step_00000007/$f" ||
    fail "resumed on 2 ranks: $f differs from the uninterrupted run's"
done
"$GRASS" train "$tmp/run.json" --set out_dir="$tmp/resume" "${ckpt[@]}" --set steps=9 \
  --set micro_batch_size=8 --resume "$tmp/resume" >"$tmp/resume_one.log" 2>&1
if [ $? -ne 2 ] || ! grep -q "written by a run of 2 rank(s); this run has 1" "$tmp/resume_one.log"; then
  fail "a 2-rank checkpoint resumed by one process is not refused with one line"; cat "$tmp/resume_one.log"
fi

# A batch the ranks cannot split: one error line (per rank), exit 2, nothing written.
"${mpi[@]}" -np 4 "$GRASS" train "$tmp/run.json" --set out_dir="$tmp/split" --set micro_batch_size=8 \
  >"$tmp/split.log" 2>&1
rc=$?
grep -q "error (rank 0 of 4): .*total_batch_size: 16 must be a multiple of micro_batch_size x ranks = 8 x 4" \
  "$tmp/split.log" || { fail "an unsplittable batch is not named"; cat "$tmp/split.log"; }
[ $rc -ne 0 ] || fail "an unsplittable batch exits 0"
[ ! -e "$tmp/split" ] || fail "an unsplittable batch created out_dir"

# An out_dir holding another run: rank 0 alone checks it (the other ranks must not race its lock
# and files, as they did once), refuses in one line, exits non-zero and touches nothing.
cp "$tmp/grass2.dp/metrics.jsonl" "$tmp/grass2.before"
"${mpi[@]}" -np 2 "$GRASS" train "$tmp/run.json" --set out_dir="$tmp/grass2.dp" --set micro_batch_size=4 \
  --set seed=7 >"$tmp/foreign.log" 2>&1 && fail "a 2-rank run into another run's out_dir exits 0"
grep -q "error (rank 0 of 2): $tmp/grass2.dp: out_dir holds another run (" \
  "$tmp/foreign.log" || { fail "another run's out_dir is not named by rank 0"; cat "$tmp/foreign.log"; }
cmp -s "$tmp/grass2.dp/metrics.jsonl" "$tmp/grass2.before" ||
  fail "a refused 2-rank run changed the other run's metrics.jsonl"

# A timeout that is not a number: one line, before MPI starts.
GRASS_TIMEOUT_S=abc "${mpi[@]}" -x GRASS_TIMEOUT_S -np 2 "$GRASS" train "$tmp/run.json" \
  --set out_dir="$tmp/badtimeout" >"$tmp/badtimeout.log" 2>&1 && fail "GRASS_TIMEOUT_S=abc exits 0"
grep -q "error: GRASS_TIMEOUT_S: 'abc' is not a positive number of seconds" "$tmp/badtimeout.log" ||
  { fail "GRASS_TIMEOUT_S=abc is not named"; cat "$tmp/badtimeout.log"; }

# fault NAME SIGNAL: a 2-rank job whose rank 1 gets SIGNAL 4 s in must end within 60 s, not with
# exit 0, and leave its newest checkpoint verifiable; the job's log is $tmp/NAME.log.
fault() {
  local name=$1 signal=$2 start=$SECONDS job newest
  "${mpi[@]}" -x GRASS_TIMEOUT_S -np 2 bash -c '
    if [ "$OMPI_COMM_WORLD_RANK" = 1 ]; then (sleep 4; kill -'"$signal"' $$) & fi
    exec "$0" train "$1" --set out_dir="$2" --set steps=100000 --set checkpoint_every=5 --set checkpoint_keep=1 \
      --set micro_batch_size=4' "$GRASS" "$tmp/run.json" "$tmp/$name" >"$tmp/$name.log" 2>&1 &
  job=$!
  while kill -0 $job 2>/dev/null && [ $((SECONDS - start)) -lt 60 ]; do sleep 1; done
  if kill -0 $job 2>/dev/null; then
    fail "$name: the job still runs after 60 s"; kill -9 $job
  else
    wait $job && fail "$name: the job exits 0"
  fi
  pkill -9 -f "$tmp/$name" 2>/dev/null  # a stopped rank mpirun left behind
  newest=$(ls -1 "$tmp/$name/checkpoints" 2>/dev/null | grep -E '^step_[0-9]{8}$' | sort | tail -1)
  if [ -z "$newest" ]; then
    fail "$name: no checkpoint before the fault"; cat "$tmp/$name.log"
  else
    "$GRASS" export --checkpoint "$tmp/$name/checkpoints/$newest" --out "$tmp/${name}_export" >/dev/null 2>&1 ||
      fail "$name: the checkpoint left by the job does not verify"
  fi
}

# A rank killed mid-run ends the job through mpirun.
export GRASS_TIMEOUT_S=600  # the watchdog must not be what ends it
fault killed 9
# A rank that stops answering (SIGSTOP: alive, never joining the next sum) ends the job through
# the waiting rank's watchdog, with one line naming the rank that waited and what it waited in.
export GRASS_TIMEOUT_S=3
fault stopped STOP
grep -q "error (rank 0 of 2): .* has waited [0-9]* s for the other ranks (GRASS_TIMEOUT_S = 3): another rank has stopped or died" \
  "$tmp/stopped.log" || { fail "a stopped rank is not reported by the rank that waited"; cat "$tmp/stopped.log"; }
unset GRASS_TIMEOUT_S

if [ $failures -gt 0 ]; then echo "$failures failure(s)"; exit 1; fi
echo "data parallel: 12 rank/optimizer cases (3 on the emulated GPU, one with deferred streams) match one process; bytes as planned; rerun, resume, refusals, a killed and a stopped rank checked"
