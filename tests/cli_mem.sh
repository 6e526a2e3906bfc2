#!/usr/bin/env bash
# `grass mem` answers first: its first line is the verdict (fits or not, on which card or limit,
# with what, the largest micro-batch), the GPU's allowance outside the plan is stated, the weights
# are named as the floor when nothing fits, the exit code is 0 when the run fits (or no limit was
# asked) and 3 when it does not, and the data-parallel rows appear only with --ranks. Planning is
# arithmetic on a planning arena: 13B takes milliseconds and nothing here needs a data shard.
# Run by ctest with GRASS=<path to the grass binary>, from the source directory.
set -uo pipefail
: "${GRASS:?set GRASS to the grass binary}"
source "$(dirname "$0")/cli_lib.sh"

# mem <want exit code> <grass mem args...>: runs it into $tmp/out, $tmp/err and $tmp/first (the
# first line)
mem() {
  local want=$1
  shift
  "$GRASS" mem "$@" >"$tmp/out" 2>"$tmp/err"
  local code=$?
  head -1 "$tmp/out" >"$tmp/first"
  if [ "$code" != "$want" ]; then
    fail "grass mem $* exited $code, expected $want"; cat "$tmp/out" "$tmp/err"; return 1
  fi
  pass
}
# first_starts <text>, first_has <text>, out_has <text>, out_lacks <text>
first_starts() {
  case "$(cat "$tmp/first")" in
    "$1"*) pass ;;
    *) fail "first line should start with \"$1\": $(cat "$tmp/first")" ;;
  esac
}
first_has() { grep -qF -- "$1" "$tmp/first" && pass || fail "first line lacks \"$1\": $(cat "$tmp/first")"; }
out_has() { grep -qF -- "$1" "$tmp/out" && pass || { fail "output lacks \"$1\":"; cat "$tmp/out"; }; }
out_lacks() { grep -qF -- "$1" "$tmp/out" && { fail "output should not have \"$1\":"; cat "$tmp/out"; } || pass; }

# GRASS r=256, pure bf16, 1 x 256 tokens: 28.40 GiB planned (attention "auto": with cuDNN's
# workspace, 14.0 MiB; 28.39 GiB with the engine's kernels)
big=configs/runs/llama_13b_grass.json

# the issue's command: 13B under 24 GiB does not fit resident; streamed layers (offload "auto")
# would fit it
mem 3 "$big" --memory-limit 24GiB
first_starts "does not fit memory_limit 24.00 GiB: LLaMA 13.016B, grass r=256, pure bf16, 1 x 256 tokens"
first_has "needs 29.66 GiB (5.66 GiB over)"
first_has 'not even micro_batch_size 1 fits; offload "auto" fits it with optimizer states in the host tier, 7 layers'"'"' weights streamed from the host tier: 22.57 GiB on the device'
out_has "  29.66 GiB = 28.40 GiB planned + 1.01 GiB the CUDA context and libraries take outside the plan (measured on an H200) + 256.0 MiB the reservation leaves free beside it"
out_lacks "data-parallel"
[ -s "$tmp/err" ] && fail "a run that does not fit is an answer, not an error: $(cat "$tmp/err")" || pass
# in bf16-mixed no layer streams: the weights are the floor
mem 3 "$big" --memory-limit 24GiB --set precision=bf16-mixed
first_has "the bf16 weights alone take 24.24 GiB: no placement trains this model under 24.00 GiB with every weight on the device: stream some layers' (offload.layers, with precision \"bf16\" or \"fp32\")"
# nor with GaLore's refresh pass (svd_batch "layer"), which the verdict and offload "auto" name
mem 3 "$big" --memory-limit 24GiB --set offload=auto \
  --set optimizer='{"name": "galore", "rank": 256, "svd_batch": "layer"}'
first_has "no placement trains this model under 24.00 GiB with every weight on the device: stream some layers' (offload.layers, with precision \"bf16\" or \"fp32\" and GaLore's optimizer.svd_batch \"none\")"
out_has 'offload auto: no placement fits memory_limit 24.00 GiB'
out_has "(no layer streams: GaLore's optimizer.svd_batch \"layer\" does not stream yet; \"none\" streams)"

# one that fits: the largest micro-batch, counted with the allowance
mem 0 "$big" --memory-limit 40GiB
first_starts "fits memory_limit 40.00 GiB: LLaMA 13.016B, grass r=256"
# (62 sequences would fit a 40 GiB cap on the plan alone: 56 leave room for the 1.26 GiB beyond it)
first_has "needs 29.66 GiB (10.34 GiB to spare); the largest micro_batch_size that fits is 56 (14336 tokens)"
out_has 'attention "auto": cuDNN'"'"'s where it loads on the GPU, planned with its workspace, the larger: 14.0 MiB (grows as seq_len²)'
# the engine's kernels alone: their smaller workspace, and no cuDNN line
mem 0 "$big" --memory-limit 40GiB --set attention=grass
first_has "needs 29.65 GiB (10.35 GiB to spare); the largest micro_batch_size that fits is 60 (15360 tokens)"
out_lacks "cuDNN"

# not fitting, with a way out: offload "auto" is named, not the floor
mem 3 "$big" --memory-limit 28GiB
first_has 'not even micro_batch_size 1 fits; offload "auto" fits it with optimizer states in the host tier'
out_lacks "weights alone"

# --json: the same verdict and exit code, the old keys kept
mem 3 "$big" --memory-limit 24GiB --json
python3 - "$tmp/out" <<'PY' && pass || fail "--json verdict"
import json, sys
j = json.load(open(sys.argv[1]))
v = j["verdict"]
for key in ("total", "bytes", "fits", "largest_micro_batch", "memory_limit", "step_sum_bytes"):
    assert key in j, key
assert j["fits"] is False and v["fits"] is False and v["exit_code"] == 3, v
assert v["cuda_outside_plan_bytes"] == int(1.01 * 2**30), v
assert v["needed_bytes"] == j["total"] + v["cuda_outside_plan_bytes"] + v["reservation_headroom_bytes"]
assert v["exit_codes"]["3"].startswith("does not fit"), v["exit_codes"]
assert 'offload "auto" fits it with' in v["line"], v["line"]
PY

# no limit: the card sizes it fits, exit 0; no data-parallel rows for a one-GPU question
mem 0 "$big"
first_starts "fits a 32 GB card and larger, not a 24 GB card: LLaMA 13.016B"
out_has "a card sold as N GB counted as N GiB"
out_lacks "data-parallel"
out_lacks "summed over"
# ... and even when no card holds it, no limit was asked: exit 0
mem 0 "$big" --set optimizer='{"name": "adamw", "lr": 0.001}' --set precision=bf16-mixed
first_starts "fits no card up to 80 GB: LLaMA 13.016B, adamw, bf16-mixed"

# --ranks 2: one rank's verdict, and what each rank sums
mem 0 "$big" --ranks 2 --set total_batch_size=2
first_has ", one of 2 data-parallel ranks needs "
out_has "summed over the 2 data-parallel ranks, per rank:"

# the CPU backend: nothing outside the plan, the same exit codes
mem 0 configs/runs/quickstart.json --device cpu
first_starts "the CPU backend needs "
out_lacks "CUDA context"
mem 0 configs/runs/quickstart.json --device cpu --memory-limit 1GiB
first_starts "fits memory_limit 1.00 GiB: LLaMA "
mem 3 configs/runs/quickstart.json --device cpu --memory-limit 4MiB
first_has "the fp32 weights alone take "

# a user error is still 2, and --help documents the exit codes
mem 2 "$big" --memory-limit lots
mem 0 --help
out_has "Exit status: 0 the run fits (or no limit was asked), 3 it does not fit memory_limit"

finish cli_mem
