#!/usr/bin/env bash
# Optimizer comparisons (issue 15; docs/experiments.md). One table per command:
#   scripts/experiments/compare_optimizers.sh c [--out DIR]
#     Table C, cost: for every method at llama_60m on this machine's CPU (fp32, 4 x 256 tokens a
#     step, rank 128, a refresh every 5 steps, 11 steps), the median time of an ordinary step and
#     of a refresh step (steps 6 and 11: step 1 also warms up), and the arena's measured peak
#     beside `grass mem`'s plan for the CPU.
# Resumable: each run goes to DIR/<table>/<method>/ (default DIR: runs/compare) and is skipped
# when its metrics are complete; delete a run's folder to redo it. One progress line per run on
# stderr; the markdown table on stdout and in DIR/<table>.md.
# (Tables A and B, the learning-rate grids and seeds, are still to come.)
set -euo pipefail
cd "$(dirname "$0")/../.."
usage() { echo "usage: $0 c [--out DIR]" >&2; exit 2; }
[ $# -ge 1 ] || usage
table=$1; shift
out=runs/compare
while [ $# -gt 0 ]; do
  case $1 in
    --out) out=$2; shift ;;
    *) usage ;;
  esac
  shift
done
[ "$table" = c ] || usage
[ -x build/grass ] || scripts/build.sh >/dev/null

# The methods of Tables A and C: name, then the optimizer's --set arguments.
methods=(
  "adamw|optimizer.name=adamw"
  "adamw_split|optimizer.name=adamw optimizer.target_lr_scale=0.25"
  "grass_top_r|optimizer.name=grass optimizer.selection=top_r"
  "grass_multinomial_nr|optimizer.name=grass optimizer.selection=multinomial_nr"
  "grass_uniform_nr|optimizer.name=grass optimizer.selection=uniform_nr"
  "galore|optimizer.name=galore"
  "flora|optimizer.name=flora"
)

model=configs/models/llama_60m.json
steps=11 interval=5 rank=128
mkdir -p data/synthetic "$out/c"
shard=data/synthetic/bench_v32000.bin
[ -f "$shard" ] || build/make_synthetic_shard --out "$shard" --vocab 32000 --tokens 2000000 >/dev/null

table_md="$out/c.md"
{
  echo "| method | step (ms) | refresh step (ms) | refresh cost | arena peak | planned (CPU) |"
  echo "|---|---|---|---|---|---|"
} >"$table_md"
i=0
for entry in "${methods[@]}"; do
  i=$((i + 1))
  name=${entry%%|*}
  read -r -a opt <<<"${entry#*|}"
  run_dir="$out/c/$name"
  args=(--set model="$model" --set data.train="$shard" --set device=cpu --set precision=fp32
        --set micro_batch_size=4 --set total_batch_size=4 --set seq_len=256 --set steps=$steps
        --set log_every=1 --set out_dir="$run_dir" --set checkpoint_every=0)
  for o in "${opt[@]}"; do args+=(--set "$o"); done
  case $name in grass*|galore|flora)
    args+=(--set optimizer.rank=$rank --set optimizer.update_interval=$interval) ;;
  esac
  if [ -f "$run_dir/metrics.jsonl" ] && [ "$(grep -c '"step_ms"' "$run_dir/metrics.jsonl")" -ge $steps ]; then
    echo "[$i/${#methods[@]}] $name: done before, kept" >&2
  else
    rm -rf "$run_dir"
    start=$SECONDS
    build/grass train configs/runs/bench_60m.json "${args[@]}" >"$out/c/$name.log" 2>&1 ||
      { echo "[$i/${#methods[@]}] $name: failed (log: $out/c/$name.log)" >&2; exit 1; }
    echo "[$i/${#methods[@]}] $name: $steps steps in $((SECONDS - start)) s" >&2
  fi
  plan=$(build/grass mem configs/runs/bench_60m.json --device cpu --json "${args[@]}" |
         python3 -c 'import json, sys; print(json.load(sys.stdin)["total"])')
  python3 - "$run_dir/metrics.jsonl" "$name" "$interval" "$plan" >>"$table_md" <<'PY'
import json, statistics, sys
path, name, interval, plan = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
rows = [json.loads(l) for l in open(path) if '"step_ms"' in l]
projected = not name.startswith("adamw")
# 1-based steps; a refresh at step 1, 1 + interval, ...; step 1 also warms up and is left out
refresh = [r["step_ms"] for r in rows if projected and r["step"] > 1 and (r["step"] - 1) % interval == 0]
plain = [r["step_ms"] for r in rows if r["step"] > 1 and not (projected and (r["step"] - 1) % interval == 0)]
step = statistics.median(plain)
mib = lambda b: f"{b / 2**20:.0f} MiB"
peak = max(r["mem_bytes"] for r in rows)
if refresh:
    ref = statistics.median(refresh)
    extra = ref - step
    cols = [f"{ref:.0f}", f"{extra:+.0f} ms ({extra / step:+.0%}); {extra / 200 / step:+.2%} a step at K = 200"]
else:
    cols = ["-", "-"]
print(f"| {name} | {step:.0f} | {cols[0]} | {cols[1]} | {mib(peak)} | {mib(plan)} |")
PY
done
cat "$table_md"
