#!/usr/bin/env bash
# scripts/plot.sh as a user meets it: the curves of a real 3-step `grass train` run of the tiny
# model drawn to a PNG (its signature and size checked, and the figure shown to follow the run's
# numbers: the same numbers draw the same bytes, other numbers other bytes), several runs in one
# figure, a run still writing its last row, and one error line (exit 2, no traceback, no PNG)
# for each kind of bad input. plot.sh installs python3-matplotlib when it is missing (as root or
# through sudo), so this test draws or fails: it never skips. Run by ctest with GRASS=<grass>
# and MAKE_SHARD=<make_synthetic_shard>, from the source directory.
set -uo pipefail
: "${GRASS:?set GRASS to the grass binary}" "${MAKE_SHARD:?set MAKE_SHARD to make_synthetic_shard}"
plot=$PWD/scripts/plot.sh
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0
passes=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
check() {  # check <description> <command...>
  local what=$1; shift
  if "$@"; then passes=$((passes + 1)); else fail "$what"; fi
}

# A real run: 3 steps of the tiny model, evaluated at steps 2 and 3.
"$MAKE_SHARD" --out "$tmp/train.bin" --vocab 512 --tokens 20000 >/dev/null
"$MAKE_SHARD" --out "$tmp/val.bin" --vocab 512 --tokens 4000 --seed 99 >/dev/null
train() {  # train <out_dir> <seed>
  "$GRASS" train configs/runs/bench_tiny.json \
    --set data.train="$tmp/train.bin" --set data.val="$tmp/val.bin" --set device=cpu \
    --set micro_batch_size=4 --set total_batch_size=4 --set seq_len=32 --set steps=3 \
    --set log_every=1 --set eval_every=2 --set eval_tokens=512 --set checkpoint_every=0 \
    --set seed="$2" --set out_dir="$1" >"$tmp/train.log" 2>&1 || { cat "$tmp/train.log"; exit 1; }
}
mkdir -p "$tmp/a" "$tmp/b"
train "$tmp/a/run" 42
train "$tmp/b/run" 7
check "the run logged 3 steps and 2 evaluations" \
  test "$(grep -c '"loss"' "$tmp/a/run/metrics.jsonl") $(grep -c '"eval":true' "$tmp/a/run/metrics.jsonl")" = "3 2"

# is_png <file>: PNG signature, a sane size, and the figure's pixel size in its IHDR chunk
is_png() {
  local size width height
  [ "$(head -c 8 "$1" | od -An -tx1 | tr -d ' \n')" = 89504e470d0a1a0a ] || { echo "$1: no PNG signature"; return 1; }
  size=$(stat -c %s "$1")
  [ "$size" -gt 20000 ] && [ "$size" -lt 2000000 ] || { echo "$1: $size bytes"; return 1; }
  read -r width height < <(od -An -tu1 -j16 -N8 "$1" |
    awk '{ print $1 * 16777216 + $2 * 65536 + $3 * 256 + $4, $5 * 16777216 + $6 * 65536 + $7 * 256 + $8 }')
  [ "$width" -ge 1000 ] && [ "$height" -ge 300 ] || { echo "$1: ${width}x$height pixels"; return 1; }
}

# One run, the default output: RUN_DIR/curves.png, its path and a summary on stdout. Both runs
# are drawn under the same label ("run"), so that only their numbers differ: the same run drawn
# again gives the same bytes, the other run other bytes.
if (cd "$tmp/a" && "$plot" run) >"$tmp/out" 2>"$tmp/err"; then
  check "one run: a PNG in the run's folder" is_png "$tmp/a/run/curves.png"
  check "one run: says where it wrote" grep -qx "wrote run/curves.png" "$tmp/out"
  check "one run: the summary line" grep -q "^run: 3 steps logged, last loss [0-9.]* at step 3, val loss [0-9.]* (ppl [0-9.]*) at step 3, median [0-9,]* tok/s$" "$tmp/out"
else
  fail "scripts/plot.sh run exited $?"; cat "$tmp/out" "$tmp/err"
fi
(cd "$tmp/a" && "$plot" --out "$tmp/a2.png" run && cd "$tmp/b" && "$plot" --out "$tmp/b.png" run) >/dev/null 2>&1
differ() { [ -s "$1" ] && [ -s "$2" ] && ! cmp -s "$1" "$2"; }
check "the same run draws the same bytes" cmp -s "$tmp/a/run/curves.png" "$tmp/a2.png"
check "another run's numbers draw other bytes" differ "$tmp/a/run/curves.png" "$tmp/b.png"

# Several runs in one figure, at --out; a run whose last row is still being written is read.
cp -r "$tmp/a/run" "$tmp/writing"
printf '{"step":4,"loss":5.1,"lr":0.0' >>"$tmp/writing/metrics.jsonl"
if "$plot" --out "$tmp/both.png" "$tmp/a/run" "$tmp/writing" >"$tmp/out" 2>"$tmp/err"; then
  check "two runs: one PNG at --out" is_png "$tmp/both.png"
  check "two runs: one summary line each" test "$(grep -c 'steps logged' "$tmp/out")" = 2
else
  fail "scripts/plot.sh with two runs exited $?"; cat "$tmp/out" "$tmp/err"
fi

# expect_error <substring> <plot.sh args...>: exit 2, one error line naming it, no traceback,
# nothing drawn
expect_error() {
  local want=$1; shift
  rm -f "$tmp/bad.png"
  "$plot" "$@" >"$tmp/out" 2>"$tmp/err"
  local code=$?
  if [ $code != 2 ]; then fail "plot.sh $* exited $code, expected 2"; cat "$tmp/out" "$tmp/err"; return; fi
  if [ "$(wc -l <"$tmp/err")" != 1 ] || ! grep -qF -- "$want" "$tmp/err"; then
    fail "plot.sh $*: expected one line with \"$want\":"; cat "$tmp/err"; return
  fi
  if grep -q Traceback "$tmp/err" || [ -e "$tmp/bad.png" ]; then fail "plot.sh $*: a traceback or a PNG"; return; fi
  passes=$((passes + 1))
}
mkdir -p "$tmp/not_a_run" "$tmp/empty" "$tmp/other" "$tmp/text"
: >"$tmp/empty/metrics.jsonl"
echo '{"name": "not grass", "value": 1}' >"$tmp/other/metrics.jsonl"
printf 'step loss\n1 5.0\n' >"$tmp/text/metrics.jsonl"
expect_error "usage: scripts/plot.sh"
expect_error "no metrics.jsonl here" --out "$tmp/bad.png" "$tmp/not_a_run"
expect_error "no such run directory" --out "$tmp/bad.png" "$tmp/missing"
expect_error "metrics.jsonl is empty" --out "$tmp/bad.png" "$tmp/empty"
expect_error "metrics.jsonl:1: a row without step and loss" --out "$tmp/bad.png" "$tmp/other"
expect_error "metrics.jsonl:1: not a JSON row" --out "$tmp/bad.png" "$tmp/text"
expect_error "no such run directory" --out "$tmp/bad.png" "$tmp/a/run" "$tmp/missing"
expect_error "no such directory" --out "$tmp/nowhere/bad.png" "$tmp/a/run"
expect_error "unrecognized arguments: --bogus" --bogus "$tmp/a/run"

echo "plot: $passes passed, $failures failed"
[ "$failures" -eq 0 ]
