#!/usr/bin/env bash
# Optimizer comparisons (issue 15; docs/experiments.md). One table per command:
#   scripts/experiments/compare_optimizers.sh a [--out DIR] [--jobs N] [--methods M1,M2,...]
#     Table A, quality: AdamW, AdamW with GRASS's learning-rate split, GRASS top_r /
#     multinomial_nr / uniform_nr, GaLore and FLORA on the quickstart model and on a tied 8-layer
#     variant whose projections hold 73% of the weights (configs/models/llama_quickstart_tied.json).
#     Each method: a learning-rate grid at seed 42 (extended past an edge that holds the best rate,
#     up to 3 more rates), then seeds 1 and 2 at its best rate. --methods runs only those (names
#     as in `methods` below), --models only those models; the table shows every method whose
#     runs DIR holds.
#   scripts/experiments/compare_optimizers.sh clipoff [--out DIR] [--jobs N] [--methods M1,...]
#     The clip-off controls (run a first): every Table A method on both models at its best Table A
#     rate with grad_clip 0, seeds 42, 1, 2, beside its clip-1.0 runs and how often those clipped.
#   scripts/experiments/compare_optimizers.sh d [--out DIR] [--jobs N] [--methods M1,...]
#     Table D, 8-bit optimizer states (issue 27): AdamW, GRASS uniform_nr and GaLore (--methods:
#     others of Table A's) with q8 states against the precision's own, on both models. In fp32: a
#     q8 grid at Table A's best rate and its two neighbours (seed 42, extended past an edge), seeds
#     1 and 2 at q8's best, fp32 states at Table A's rate (3 seeds); in pure bf16: bf16 and q8
#     states at Table A's rate (3 seeds each). Table A's rates come from DIR/a, else its table.
#   scripts/experiments/compare_optimizers.sh e [--out DIR] [--jobs N] [--methods M1,...]
#                                               [--modes MODE1,...]
#     Table E, activations at equal activation memory (issue 28): the budget is the plan's
#     activations with sampled rows at keep 0.5 and Table A's 16 sequences; each way of keeping
#     activations (none, elementwise, layer, wta-crs at keep 0.5 and 0.3, and for GRASS methods
#     columns: the inputs of its `cols` targets kept as their selected columns) trains at the
#     largest micro-batch (one per step) whose activations fit it, AdamW (--methods: others of
#     Table A's; --modes: only those modes) on both models: a grid at Table A's best rate and its
#     two neighbours (seed 42, extended once past an edge), then seeds 1 and 2 at each mode's best.
#   scripts/experiments/compare_optimizers.sh b [--out DIR] [--jobs N]
#     Table B, GRASS ablations on the quickstart model at Table A's best top_r rate (run a first):
#     rank x K, rho in the update or not, with and without replacement, staggered refresh; 3 seeds.
#     --methods runs only the variants it names (r32_K40, uniform_rho_true, ...).
#   scripts/experiments/compare_optimizers.sh peers [--out DIR] [--jobs N]
#     The peers beside grass (run a first): the GaLore authors' galore-torch and FLORA's flora-opt
#     through the PyTorch reference model (tools/peers/train_peer.py, in tools/peers/setup_venv.sh
#     torch2's environment or PEERS_PYTHON), against grass's GaLore and FLORA at Table A's best
#     rates; both read the data in stream order (data.shuffle = false), 3 seeds each.
#   scripts/experiments/compare_optimizers.sh prox [--out DIR] [--jobs N]
#     The small-batch proximal method (docs/proximal.md) where it claims to help: one sequence of
#     128 tokens per step, 1,600 steps (warmup 120), AdamW and GRASS top_r (r 32, K 40) with and
#     without it, lambda = 0.1 x lr (the reference code's default), AdamW's inner loops of 10
#     steps (the reference's S) and GRASS's of K; lr 3e-4, 1e-3, 3e-3, 1e-2 (extended past an
#     edge that holds a best rate, as Table A's grid), each at seeds 42, 1, 2.
#   scripts/experiments/compare_optimizers.sh c [--out DIR]
#     Table C, cost: for every method at llama_60m on this machine's CPU (fp32, 4 x 256 tokens a
#     step, rank 128, a refresh every 5 steps, 11 steps), the median time of an ordinary step and
#     of a refresh step (steps 6 and 11: step 1 also warms up), and the arena's measured peak
#     beside `grass mem`'s plan for the CPU.
# Tables A and B share one protocol: the bundled C4-format sample (run scripts/run.sh once first),
# 400 steps of one micro-batch of 16 x 128 tokens (819,200 tokens), cosine schedule with 30 warmup
# steps, clip 1.0, rank 32 = d/4 and K = 40 (10 refreshes) for the projected methods, scale 0.25,
# validation loss on the whole validation shard (128,238 targets) every 100 steps. Each run uses
# one thread (OMP_NUM_THREADS=1: the CPU's sums depend on the thread count) and --jobs runs (default
# 2, one per core) go at once.
# Resumable: each run goes to its own folder under DIR (default runs/compare) and is skipped when
# it finished; delete a folder to redo that run. One progress line per run on stderr; the markdown
# tables on stdout and in DIR/<table>.md, the plots in docs/img/.
#
# Your own run config instead of the bundled models: --config RUN_JSON with tables a and clipoff
# (clipoff after a, with the same --config and --out), e.g.
#   scripts/experiments/compare_optimizers.sh a --config my_run.json --methods adamw,grass_top_r,galore
# Every run is `grass train RUN_JSON` as you would run it (from the directory you are in, so its
# relative paths mean what they mean to you), with its model, data, batch, steps, schedule,
# precision, device and evaluations, and these changes only: out_dir (one folder a run), seed,
# checkpoint_every 0 (clipoff: grad_clip 0 too), and the optimizer, replaced by
# the method's with the learning rate of the grid; the config's betas, eps and weight_decay stay,
# and for the projected methods its rank, update_interval, scale and targets (else the engine's
# defaults, docs/configs.md). The methods are ranked by the final validation loss, so
# the config needs data.val. Its runs go to DIR/a/NAME/... (NAME: the config's file name without
# .json), its tables to DIR/<table>.md and its plots to DIR, not docs/img. One run at a time (on
# a GPU, two would share its memory) and OMP_NUM_THREADS as you set it: --jobs N for more at once.
set -euo pipefail
user_pwd=$PWD
cd "$(dirname "$0")/../.."
usage() { echo "usage: $0 a|b|c|d|e|clipoff|peers|prox [--out DIR] [--jobs N] [--methods M1,M2,...] [--models quickstart,quickstart_tied] [--modes MODE1,...] [--config RUN_JSON]" >&2; exit 2; }
table= out=runs/compare jobs= only= model_list= mode_list= config=
while [ $# -gt 0 ]; do
  case $1 in
    --out) out=$2; shift ;;
    --jobs) jobs=$2; shift ;;
    --methods) only=$2; shift ;;
    --models) model_list=$2; shift ;;
    --modes) mode_list=$2; shift ;;
    --config) config=$2; shift ;;
    -*) usage ;;
    *) [ -z "$table" ] || usage; table=$1 ;;
  esac
  shift
done
case $table in a|b|c|d|e|clipoff|peers|prox) ;; *) usage ;; esac
report() { /usr/bin/python3 scripts/experiments/compare_report.py "$@"; }
threads=1  # the bundled tables' runs: one thread each (the CPU's sums depend on the thread count)
if [ -n "$config" ]; then
  case $table in a|clipoff) ;; *)
    echo "error: --config applies to tables a and clipoff; table $table is an experiment on the bundled models" >&2
    exit 2 ;;
  esac
  [ -z "$model_list" ] || { echo "error: --models names bundled models; with --config the model is the config's" >&2; exit 2; }
  case $config in /*) ;; *) config=$user_pwd/$config ;; esac
  [ -f "$config" ] || { echo "error: --config $config: no such file" >&2; exit 2; }
  out=$(realpath -m "$out")  # the runs start in $user_pwd: their out_dir must not be relative
  model_list=$(basename "$config" .json) jobs=${jobs:-1} threads=${OMP_NUM_THREADS:-}
  export COMPARE_PLOTS=$out
fi
model_list=${model_list:-quickstart,quickstart_tied} jobs=${jobs:-2}
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
if [ -n "$only" ] && [ "$table" != b ] && [ "$table" != d ] && [ "$table" != e ]; then  # --methods: keep those, in the table's order
  kept=()
  for entry in "${methods[@]}"; do
    case ",$only," in *",${entry%%|*},"*) kept+=("$entry") ;; esac
  done
  for name in ${only//,/ }; do
    case " ${kept[*]} " in *" $name|"*) ;; *) echo "unknown method $name" >&2; exit 2 ;; esac
  done
  methods=("${kept[@]}")
fi
# named_entries LIST WHAT ENTRY...: the entries "NAME|..." among ENTRY... whose NAME the
# comma-separated LIST holds, one a line, in ENTRY's order; fails naming WHAT when none.
named_entries() {
  local list=$1 what=$2 entry found=0
  shift 2
  for entry in "$@"; do
    case ",$list," in *",${entry%%|*},"*) printf '%s\n' "$entry"; found=1 ;; esac
  done
  [ $found = 1 ] || { echo "no $what is named in $list" >&2; return 1; }
}
# entry_sets NAME ENTRY...: the --set arguments (one per line) of the entry "NAME|k=v k=v" among
# ENTRY... (the tables of methods, formats and modes below); fails when none is named NAME.
entry_sets() {
  local name=$1 entry o
  shift
  for entry in "$@"; do
    [ "${entry%%|*}" = "$name" ] || continue
    for o in ${entry#*|}; do printf -- '--set\n%s\n' "$o"; done
    return 0
  done
  return 1
}
method_args() {  # the --set arguments of method $1
  entry_sets "$1" "${methods[@]}" || { echo "unknown method $1" >&2; exit 2; }
}

# --- Tables A and B: quality runs on the bundled sample ---------------------------------------
steps=400 interval=40 rank=32 eval_tokens=128238 lr_grid=(1e-3 3e-3 1e-2 3e-2)
# A best rate on the grid's edge extends the grid along this ladder, one rate at a time.
lr_ladder=(1e-4 3e-4 1e-3 3e-3 1e-2 3e-2 1e-1 3e-1)
quality_args=(--set steps=$steps --set micro_batch_size=16 --set total_batch_size=16
              --set eval_every=100 --set eval_tokens=$eval_tokens --set log_every=50
              --set checkpoint_every=0)
projected_args=(--set optimizer.rank=$rank --set optimizer.update_interval=$interval)
grass_train=(build/grass train configs/runs/quickstart.json)

finished() { [ -f "$1/metrics.jsonl" ] && grep -q "\"eval\":true,\"step\":$steps," "$1/metrics.jsonl"; }
if [ -n "$config" ]; then  # its steps are the config's: whether the run evaluated at its last
  finished() { report finished "$1"; }
fi

# A queue of runs, each "label|dir|command...", run $jobs at a time (the command writes to dir).
queue=()
enqueue() { local IFS='|'; queue+=("$*"); }
run_queue() {
  local total=${#queue[@]} n=0 entry failed=0
  for entry in "${queue[@]}"; do
    n=$((n + 1))
    IFS='|' read -r -a f <<<"$entry"
    local label=${f[0]} dir=${f[1]}
    if finished "$dir"; then
      echo "[$table $n/$total] $label: done before, kept" >&2; continue
    fi
    while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n || failed=1; done
    (
      rm -rf "$dir"; mkdir -p "$dir"
      start=$SECONDS
      if env ${threads:+OMP_NUM_THREADS=$threads} "${f[@]:2}" >"$dir.log" 2>&1 && finished "$dir"; then
        echo "[$table $n/$total] $label: $((SECONDS - start)) s, val loss $(report last-val "$dir")" >&2
      else
        echo "[$table $n/$total] $label: FAILED (log: $dir.log)" >&2; exit 1
      fi
    ) &
  done
  while [ "$(jobs -rp | wc -l)" -gt 0 ]; do wait -n || failed=1; done
  queue=()
  [ $failed = 0 ] || { echo "some runs failed; rerun the command to retry them" >&2; exit 1; }
}

quality_prereqs() {
  if [ -n "$config" ]; then  # the config's errors, in grass's own line, before any run starts
    report check-config "$config"
    env -C "$user_pwd" "$PWD/build/grass" mem "$config" >/dev/null || exit 2
    mkdir -p "$out"
    return
  fi
  [ -f data/c4_sample/tokens/train.manifest.json ] ||
    { echo "the sample's shards are missing: run scripts/run.sh once first" >&2; exit 2; }
}

# enqueue_a MODEL METHOD LR SEED [NOTE]: one Table A run, in $a_root/MODEL/METHOD/lr<LR>_s<SEED>
# (a_root defaults to $out/a; a_dir, when set, replaces $a_root/MODEL/METHOD), with the --set
# arguments of a_extra after the method's.
enqueue_a() {
  local model=$1 name=$2 lr=$3 seed=$4 note=${5:-} root=${a_root:-$out/a} margs extra=()
  local dir=${a_dir:-$root/$1/$2}/lr$3_s$4
  mapfile -t margs < <(method_args "$name")
  if [ -n "$config" ]; then  # the user's run, its optimizer replaced by the method's (above)
    local kind=projected
    case $name in adamw*) kind=dense ;; esac
    enqueue "$model $name lr $lr seed $seed$note" "$dir" env -C "$user_pwd" "$PWD/build/grass" train \
      "$config" --set out_dir="$dir" --set checkpoint_every=0 \
      --set optimizer="$(report optimizer-base "$config" $kind)" "${margs[@]}" \
      --set optimizer.lr="$lr" --set seed="$seed" ${a_extra[@]+"${a_extra[@]}"}
    return
  fi
  case $name in adamw*) ;; *) extra=("${projected_args[@]}") ;; esac
  enqueue "$model $name lr $lr seed $seed$note" "$dir" "${grass_train[@]}" --set out_dir="$dir" \
    --set model=configs/models/llama_$model.json "${quality_args[@]}" "${margs[@]}" "${extra[@]}" \
    --set optimizer.lr="$lr" --set seed="$seed" ${a_extra[@]+"${a_extra[@]}"}
}

# extend_edges ROUNDS PATTERN ENQUEUE NAME...: up to ROUNDS times, for each model and NAME whose
# best seed-42 rate in PATTERN (a folder, @MODEL@ and @NAME@ substituted) lies on its grid's edge,
# ENQUEUE MODEL NAME LR the next rate of the ladder past it, and run them.
extend_edges() {
  local rounds=$1 pattern=$2 enqueue_fn=$3 round model name dir lr
  shift 3
  for ((round = 0; round < rounds; round++)); do
    for model in "${models[@]}"; do
      for name in "$@"; do
        dir=${pattern//@MODEL@/$model}
        lr=$(report next-lr "${dir//@NAME@/$name}" "${lr_ladder[@]}")
        [ -z "$lr" ] || "$enqueue_fn" "$model" "$name" "$lr"
      done
    done
    [ ${#queue[@]} -gt 0 ] || break
    run_queue
  done
}

if [ "$table" = a ]; then
  quality_prereqs
  models=(${model_list//,/ })
  for model in "${models[@]}"; do
    for entry in "${methods[@]}"; do
      for lr in "${lr_grid[@]}"; do enqueue_a "$model" "${entry%%|*}" "$lr" 42; done
    done
  done
  run_queue
  enqueue_a_edge() { enqueue_a "$1" "$2" "$3" 42 " (past the grid's edge)"; }
  extend_edges 3 "$out/a/@MODEL@/@NAME@" enqueue_a_edge "${methods[@]%%|*}"
  for model in "${models[@]}"; do
    for entry in "${methods[@]}"; do
      lr=$(report best-lr "$out/a/$model/${entry%%|*}")
      for seed in 1 2; do enqueue_a "$model" "${entry%%|*}" "$lr" "$seed"; done
    done
  done
  run_queue
  report table-a "$out/a" "${models[@]}" | tee "$out/a.md"
  exit 0
fi

if [ "$table" = clipoff ]; then
  quality_prereqs
  models=(${model_list//,/ })
  a_root=$out/clipoff a_extra=(--set grad_clip=0)  # enqueue_a's runs go there, unclipped
  for model in "${models[@]}"; do
    for entry in "${methods[@]}"; do
      name=${entry%%|*}
      [ -d "$out/a/$model/$name" ] || { echo "run table a first: $out/a/$model/$name is missing" >&2; exit 2; }
      lr=$(report best-lr "$out/a/$model/$name")
      for seed in 42 1 2; do
        enqueue_a "$model" "$name" "$lr" "$seed" " (clip off)"
      done
    done
  done
  run_queue
  report table-clipoff "$out/a" "$out/clipoff" "${models[@]}" | tee "$out/clipoff.md"
  exit 0
fi

# Table A's best rate of METHOD on MODEL: from $out/a when it holds the runs, else the rate
# docs/experiments.md's Table A reports.
a_best() {
  if [ -d "$out/a/$1/$2" ]; then report best-lr "$out/a/$1/$2"; return; fi
  case $1/$2 in
    */adamw) echo 3e-3 ;;
    quickstart/grass_uniform_nr | quickstart/galore) echo 3e-2 ;;
    quickstart_tied/grass_uniform_nr | quickstart_tied/galore) echo 1e-2 ;;
    *) echo "no Table A rate for $2 on $1: run table a first" >&2; exit 2 ;;
  esac
}
ladder_around() {  # the ladder's rates next to $1, and $1
  local i
  for i in "${!lr_ladder[@]}"; do
    [ "${lr_ladder[i]}" = "$1" ] && echo "${lr_ladder[i - 1]} $1 ${lr_ladder[i + 1]}"
  done
}
if [ "$table" = d ]; then
  quality_prereqs
  models=(${model_list//,/ })
  d_methods=(adamw grass_uniform_nr galore)
  [ -z "$only" ] || d_methods=(${only//,/ })
  for name in "${d_methods[@]}"; do method_args "$name" >/dev/null; done  # unknown names stop here
  # Each state format: its name, then its --set arguments. q8 runs keep their last checkpoint,
  # whose v codes the table counts (the fraction at the smallest positive code).
  formats=(
    "fp32|precision=fp32"
    "fp32_q8|precision=fp32 optimizer.state_dtype=q8 checkpoint_every=$steps checkpoint_keep=1"
    "bf16|precision=bf16"
    "bf16_q8|precision=bf16 optimizer.state_dtype=q8 checkpoint_every=$steps checkpoint_keep=1"
  )
  enqueue_d() {  # MODEL METHOD FORMAT LR SEED: in $out/d/MODEL/METHOD/FORMAT/lr<LR>_s<SEED>
    local fargs
    mapfile -t fargs < <(entry_sets "$3" "${formats[@]}")
    case $3/$2 in  # projected q8 states blocked per feature (the default, set where it applies)
      *_q8/adamw*) ;;
      *_q8/*) fargs+=(--set optimizer.state_blocking=feature) ;;
    esac
    a_dir=$out/d/$1/$2/$3 a_extra=("${fargs[@]}")
    enqueue_a "$1" "$2" "$4" "$5" " $3 states"
    unset a_dir a_extra
  }
  # The q8 grid around Table A's best rate (seed 42) and the fp32 reference's three seeds there.
  for model in "${models[@]}"; do
    for name in "${d_methods[@]}"; do
      best=$(a_best "$model" "$name")
      for lr in $(ladder_around "$best"); do enqueue_d "$model" "$name" fp32_q8 "$lr" 42; done
      for seed in 42 1 2; do enqueue_d "$model" "$name" fp32 "$best" "$seed"; done
    done
  done
  run_queue
  enqueue_d_edge() { enqueue_d "$1" "$2" fp32_q8 "$3" 42; }  # a best q8 rate on the edge
  extend_edges 2 "$out/d/@MODEL@/@NAME@/fp32_q8" enqueue_d_edge "${d_methods[@]}"
  # q8's own best rate at seeds 1 and 2; pure bf16 with bf16 and q8 states at Table A's rate.
  for model in "${models[@]}"; do
    for name in "${d_methods[@]}"; do
      lr=$(report best-lr "$out/d/$model/$name/fp32_q8")
      for seed in 1 2; do enqueue_d "$model" "$name" fp32_q8 "$lr" "$seed"; done
      best=$(a_best "$model" "$name")
      for format in bf16 bf16_q8; do
        for seed in 42 1 2; do enqueue_d "$model" "$name" "$format" "$best" "$seed"; done
      done
    done
  done
  run_queue
  report table-d "$out/d" "${models[@]}" | tee "$out/d.md"
  exit 0
fi

if [ "$table" = e ]; then
  quality_prereqs
  models=(${model_list//,/ })
  e_methods=(adamw)
  [ -z "$only" ] || e_methods=(${only//,/ })
  for name in "${e_methods[@]}"; do method_args "$name" >/dev/null; done
  # Each way of keeping activations: its name, then its --set arguments. columns: GRASS only
  # (its activations planned with grass_top_r's arguments, which any GRASS method shares).
  modes=(
    "none|activation_checkpointing=none activations.selected_columns=off"
    "elementwise|activation_checkpointing=elementwise"
    "layer|activation_checkpointing=layer"
    "wta-crs_0.5|activations.sample=wta-crs activations.keep=0.5"
    "wta-crs_0.3|activations.sample=wta-crs activations.keep=0.3"
    "columns|activation_checkpointing=none activations.selected_columns=on"
  )
  if [ -n "$mode_list" ]; then
    kept=$(named_entries "$mode_list" "mode of table e" "${modes[@]}") || exit 2
    mapfile -t modes <<<"$kept"
  fi
  activation_bytes() {  # MODEL MODE MICRO: the plan's activation bytes
    local sets grass=()
    mapfile -t sets < <(entry_sets "$2" "${modes[@]}")
    [ "$2" = columns ] && mapfile -t grass < <(method_args grass_top_r; printf -- '%s\n' "${projected_args[@]}")
    build/grass mem configs/runs/quickstart.json --set model=configs/models/llama_$1.json \
      --set micro_batch_size="$3" --set total_batch_size="$3" ${grass[@]+"${grass[@]}"} "${sets[@]}" --json |
      /usr/bin/python3 -c 'import json, sys; print(json.load(sys.stdin)["bytes"]["activations"])'
  }
  # whether METHOD runs MODE: columns is GRASS's
  runs_mode() {
    [ "$2" != columns ] && return 0
    case " $(method_args "$1" | tr '\n' ' ') " in *" optimizer.name=grass "*) return 0 ;; esac
    return 1
  }
  # The budget: the activations of sampled rows at keep 0.5 with Table A's 16 sequences; each
  # mode gets the largest micro-batch (at most 64) whose activations fit it.
  enqueue_e() {  # MODEL METHOD MODE LR SEED: in $out/e/MODEL/METHOD/MODE/lr<LR>_s<SEED>
    local sets micro
    mapfile -t sets < <(entry_sets "$3" "${modes[@]}")
    micro=$(awk -v m="$3" '$1 == m { print $2 }' "$out/e/$1/batches.txt")
    a_dir=$out/e/$1/$2/$3 a_extra=("${sets[@]}" --set micro_batch_size="$micro" --set total_batch_size="$micro")
    enqueue_a "$1" "$2" "$4" "$5" " $3, $micro sequences"
    unset a_dir a_extra
  }
  for model in "${models[@]}"; do
    mkdir -p "$out/e/$model"
    if [ ! -f "$out/e/$model/batches.txt" ] || ! awk '{ print $1 }' "$out/e/$model/batches.txt" |
        diff -q - <(for entry in "${modes[@]}"; do echo "${entry%%|*}"; done) >/dev/null; then
      budget=$(modes=("wta-crs_0.5|activations.sample=wta-crs activations.keep=0.5")
               activation_bytes "$model" wta-crs_0.5 16)
      for entry in "${modes[@]}"; do
        mode=${entry%%|*} micro=1
        while [ $micro -lt 64 ] && [ "$(activation_bytes "$model" "$mode" $((micro + 1)))" -le "$budget" ]; do
          micro=$((micro + 1))
        done
        echo "$mode $micro $(activation_bytes "$model" "$mode" $micro) $budget"
      done >"$out/e/$model/batches.txt.tmp"
      mv "$out/e/$model/batches.txt.tmp" "$out/e/$model/batches.txt"
    fi
    echo "[e] $model: mode, micro-batch, activation bytes, budget:" >&2
    cat "$out/e/$model/batches.txt" >&2
    for name in "${e_methods[@]}"; do
      for entry in "${modes[@]}"; do
        runs_mode "$name" "${entry%%|*}" || continue
        for lr in $(ladder_around "$(a_best "$model" "$name")"); do
          enqueue_e "$model" "$name" "${entry%%|*}" "$lr" 42
        done
      done
    done
  done
  run_queue
  for entry in "${modes[@]}"; do  # a best rate on the grid's edge: one more rate past it
    e_mode=${entry%%|*} e_names=()
    for name in "${e_methods[@]}"; do runs_mode "$name" "$e_mode" && e_names+=("$name"); done
    [ ${#e_names[@]} -gt 0 ] || continue
    enqueue_e_edge() { enqueue_e "$1" "$2" "$e_mode" "$3" 42; }
    extend_edges 1 "$out/e/@MODEL@/@NAME@/$e_mode" enqueue_e_edge "${e_names[@]}"
  done
  for model in "${models[@]}"; do
    for name in "${e_methods[@]}"; do
      for entry in "${modes[@]}"; do
        runs_mode "$name" "${entry%%|*}" || continue
        lr=$(report best-lr "$out/e/$model/$name/${entry%%|*}")
        for seed in 1 2; do enqueue_e "$model" "$name" "${entry%%|*}" "$lr" "$seed"; done
      done
    done
  done
  run_queue
  report table-e "$out/e" "${models[@]}" | tee "$out/e.md"
  exit 0
fi

if [ "$table" = b ]; then
  quality_prereqs
  [ -d "$out/a/quickstart/grass_top_r" ] || { echo "run table a first: table b uses its best top_r rate" >&2; exit 2; }
  lr=$(report best-lr "$out/a/quickstart/grass_top_r")
  base=(--set model=configs/models/llama_quickstart.json "${quality_args[@]}" --set optimizer.name=grass
        --set optimizer.lr=$lr)
  variants=()
  for r in 16 32 64; do
    for k in 10 40 160; do
      variants+=("r${r}_K$k|optimizer.selection=top_r optimizer.rank=$r optimizer.update_interval=$k")
    done
  done
  for sel in multinomial uniform; do
    for rho in false true; do
      variants+=("${sel}_rho_$rho|optimizer.selection=$sel optimizer.rho_in_update=$rho")
    done
    variants+=("${sel}_nr|optimizer.selection=${sel}_nr")
  done
  variants+=("top_r_stagger|optimizer.selection=top_r optimizer.refresh_stagger=true")
  if [ -n "$only" ]; then  # --methods names variants here
    kept=$(named_entries "$only" "variant of table b" "${variants[@]}") || exit 2
    mapfile -t variants <<<"$kept"
  fi
  for variant in "${variants[@]}"; do
    name=${variant%%|*}
    vargs=("${projected_args[@]}")  # rank and K first: a variant's own values come later and win
    for o in ${variant#*|}; do vargs+=(--set "$o"); done
    for seed in 42 1 2; do
      dir=$out/b/$name/s$seed
      enqueue "$name seed $seed" "$dir" "${grass_train[@]}" --set out_dir="$dir" "${base[@]}" "${vargs[@]}" \
        --set seed=$seed
    done
  done
  run_queue
  report table-b "$out/b" "$lr" | tee "$out/b.md"
  exit 0
fi

if [ "$table" = peers ]; then
  quality_prereqs
  py=${PEERS_PYTHON:-build/torch2-venv/bin/python}
  "$py" -c "import galore_torch, flora_opt" 2>/dev/null ||
    { echo "$py cannot import galore_torch and flora_opt: run tools/peers/setup_venv.sh torch2" >&2; exit 2; }
  peer_args=(--model configs/models/llama_quickstart.json --train data/c4_sample/tokens/train_00000.bin
             --val data/c4_sample/tokens/val_00000.bin --steps $steps --batch 16 --seq-len 128
             --eval-every 100 --eval-tokens $eval_tokens --rank $rank --interval $interval)
  base=(--set model=configs/models/llama_quickstart.json "${quality_args[@]}" "${projected_args[@]}"
        --set data.shuffle=false)
  for pair in galore:galore-torch flora:flora-opt; do
    name=${pair%%:*} peer=${pair#*:}
    [ -d "$out/a/quickstart/$name" ] || { echo "run table a first: the peers run at its best rates" >&2; exit 2; }
    lr=$(report best-lr "$out/a/quickstart/$name")
    mapfile -t margs < <(method_args "$name")
    for seed in 42 1 2; do
      dir=$out/peers/grass_$name/s$seed
      enqueue "grass $name lr $lr seed $seed" "$dir" "${grass_train[@]}" --set out_dir="$dir" \
        "${base[@]}" "${margs[@]}" --set optimizer.lr=$lr --set seed=$seed
      dir=$out/peers/$peer/s$seed
      enqueue "$peer lr $lr seed $seed" "$dir" "$py" tools/peers/train_peer.py --optimizer $peer \
        --out "$dir" "${peer_args[@]}" --lr $lr --seed $seed
    done
  done
  run_queue
  report table-peers "$out/peers" | tee "$out/peers.md"
  exit 0
fi

if [ "$table" = prox ]; then
  quality_prereqs
  steps=1600  # `finished` looks for the evaluation at this step
  base=(--set model=configs/models/llama_quickstart.json --set steps=$steps --set micro_batch_size=1
        --set total_batch_size=1 --set schedule.warmup_steps=120 --set eval_every=800
        --set eval_tokens=$eval_tokens --set log_every=200 --set checkpoint_every=0)
  variants=(
    "adamw|optimizer.name=adamw"
    "adamw_proximal|optimizer.name=adamw optimizer.proximal.inner_steps=10"
    "grass_top_r|optimizer.name=grass optimizer.selection=top_r"
    "grass_top_r_proximal|optimizer.name=grass optimizer.selection=top_r"
  )
  enqueue_prox() {  # VARIANT LR: its runs at seeds 42, 1, 2 in $out/prox/NAME/lr<LR>_s<SEED>
    local name=${1%%|*} lr=$2 o seed vargs=() pargs=()
    for o in ${1#*|}; do vargs+=(--set "$o"); done
    case $name in grass*) vargs+=("${projected_args[@]}") ;; esac
    case $name in *_proximal)  # lambda = 0.1 x lr, the reference code's default
      pargs=(--set optimizer.proximal.lambda=$(python3 -c "print(0.1 * $lr)")) ;;
    esac
    for seed in 42 1 2; do
      local dir=$out/prox/$name/lr${lr}_s$seed
      enqueue "$name lr $lr seed $seed" "$dir" "${grass_train[@]}" --set out_dir="$dir" \
        "${base[@]}" "${vargs[@]}" ${pargs[@]+"${pargs[@]}"} --set optimizer.lr=$lr --set seed=$seed
    done
  }
  for variant in "${variants[@]}"; do
    for lr in 3e-4 1e-3 3e-3 1e-2; do enqueue_prox "$variant" "$lr"; done
  done
  run_queue
  # A best rate (seed 42) on the grid's edge extends it along the ladder, for both variants of
  # the pair (with and without the method), so each pair is compared over the same rates.
  for _ in 1 2; do
    for i in 0 2; do
      rates=" "
      for variant in "${variants[i]}" "${variants[i + 1]}"; do
        lr=$(report next-lr "$out/prox/${variant%%|*}" "${lr_ladder[@]}")
        case "$rates" in *" $lr "*) ;; *) rates+="$lr " ;; esac
      done
      for lr in $rates; do enqueue_prox "${variants[i]}" "$lr"; enqueue_prox "${variants[i + 1]}" "$lr"; done
    done
    [ ${#queue[@]} -gt 0 ] || break
    run_queue
  done
  report table-prox "$out/prox" | tee "$out/prox.md"
  exit 0
fi

# --- Table C: cost at 60M ---------------------------------------------------------------------
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
  mapfile -t margs < <(method_args "$name")
  run_dir="$out/c/$name"
  args=(--set model="$model" --set data.train="$shard" --set device=cpu --set precision=fp32
        --set micro_batch_size=4 --set total_batch_size=4 --set seq_len=256 --set steps=$steps
        --set log_every=1 --set out_dir="$run_dir" --set checkpoint_every=0 "${margs[@]}")
  case $name in grass*|galore|flora)
    args+=(--set optimizer.rank=$rank --set optimizer.update_interval=$interval) ;;
  esac
  if [ -f "$run_dir/metrics.jsonl" ] && [ "$(grep -c '"step_ms"' "$run_dir/metrics.jsonl")" -ge $steps ]; then
    echo "[c $i/${#methods[@]}] $name: done before, kept" >&2
  else
    rm -rf "$run_dir"
    start=$SECONDS
    build/grass train configs/runs/bench_60m.json "${args[@]}" >"$out/c/$name.log" 2>&1 ||
      { echo "[c $i/${#methods[@]}] $name: failed (log: $out/c/$name.log)" >&2; exit 1; }
    echo "[c $i/${#methods[@]}] $name: $steps steps in $((SECONDS - start)) s" >&2
  fi
  plan=$(build/grass mem configs/runs/bench_60m.json --device cpu --json "${args[@]}" |
         python3 -c 'import json, sys; print(json.load(sys.stdin)["total"])')
  report table-c-row "$run_dir/metrics.jsonl" "$name" "$interval" "$plan" >>"$table_md"
done
cat "$table_md"
