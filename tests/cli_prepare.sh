#!/usr/bin/env bash
# `grass tokenizer` and `grass prepare` as a user meets them: a tokenizer trained from JSON lines,
# shards prepared with it, the summary on stdout, and one-line errors (exit 2) for bad input.
# Run by ctest with GRASS=<path to the grass binary>, from the source directory.
set -uo pipefail
: "${GRASS:?set GRASS to the grass binary}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0
passes=0

fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# expect <exit code> <substring of stdout+stderr> -- <grass args...>; a user error must be one line
expect() {
  local want_code=$1 want_msg=$2
  shift 3
  "$GRASS" "$@" >"$tmp/stdout" 2>"$tmp/err"
  local code=$?
  if [ "$code" != "$want_code" ]; then
    fail "grass $* exited $code, expected $want_code"; cat "$tmp/err"; return
  fi
  if [ -n "$want_msg" ] && ! grep -qF -- "$want_msg" "$tmp/stdout" "$tmp/err"; then
    fail "grass $*: output lacks \"$want_msg\":"; cat "$tmp/stdout" "$tmp/err"; return
  fi
  if [ "$want_code" = 2 ] && [ "$(wc -l <"$tmp/err")" != 1 ]; then
    fail "grass $*: expected one error line:"; cat "$tmp/err"; return
  fi
  passes=$((passes + 1))
}

# 2,000 C4-style records of English-like text, made by awk (no python needed)
awk 'BEGIN {
  srand(7); n = split("the of and to in a is that for it as was with be by on not this are or from at which but have an they you were there been one all would when will more about people time year new could first water city river music garden review report price school house small great world data 2024", w, " ");
  for (d = 0; d < 2000; d++) {
    len = 10 + int(rand() * 60); text = "";
    for (i = 0; i < len; i++) text = text (i ? " " : "") w[1 + int(rand() * n)];
    printf "{\"text\": \"%s.\", \"timestamp\": \"2019-04-25T12:57:54Z\", \"url\": \"https://example.com/%d\"}\n", text, d
  }
}' >"$tmp/c4-train.00000-of-01024.json"
gzip -c "$tmp/c4-train.00000-of-01024.json" >"$tmp/c4-train.00000-of-01024.json.gz"
head -n 1000 "$tmp/c4-train.00000-of-01024.json" | gzip -c >"$tmp/c4-train.00001-of-01024.json.gz"

expect 0 "usage: grass prepare" -- prepare --help
expect 0 "usage: grass tokenizer" -- tokenizer --help
expect 0 "trained $tmp/tok.model: 300 pieces" -- tokenizer train --input "$tmp/c4-train.00000-of-01024.json.gz" --vocab-size 300 --out "$tmp/tok.model"
expect 0 "vocab_size 300, unk_id 0, bos_id 1, eos_id 2" -- tokenizer info "$tmp/tok.model"
# tokenizer encode agrees with SentencePiece's own command-line encoder, where it is installed
if command -v spm_encode >/dev/null 2>&1; then
  ours=$("$GRASS" tokenizer encode --tokenizer "$tmp/tok.model" "the river city 2024 café")
  theirs=$(echo "the river city 2024 café" | spm_encode --model "$tmp/tok.model" --output_format=id)
  [ "$ours" = "$theirs" ] && passes=$((passes + 1)) || fail "encode: '$ours' != spm_encode '$theirs'"
fi

# shards hold exactly what spm_encode gives for the same lines (without BOS/EOS: ids only)
if command -v spm_encode >/dev/null 2>&1; then
  sed -n 's/^{"text": "\([^"]*\)".*/\1/p' "$tmp/c4-train.00000-of-01024.json" | head -n 300 >"$tmp/lines.txt"
  "$GRASS" prepare --input "$tmp/lines.txt" --tokenizer "$tmp/tok.model" --out "$tmp/plain" --no-bos --no-eos --quiet >/dev/null
  od -An -v -tu2 -j 256 "$tmp/plain/shard_00000.bin" | tr -s ' ' '\n' | sed '/^$/d' >"$tmp/ours.ids"
  spm_encode --model "$tmp/tok.model" --output_format=id <"$tmp/lines.txt" | tr ' ' '\n' >"$tmp/theirs.ids"
  cmp -s "$tmp/ours.ids" "$tmp/theirs.ids" && passes=$((passes + 1)) || fail "shard tokens differ from spm_encode's"
fi

# a glob over both files (quoted: grass expands it), two shards of 20,000 tokens at most
expect 0 "prepared 3000 documents from 2 files (0 bad records skipped)" -- prepare --input "$tmp/c4-train.*.json.gz" --tokenizer "$tmp/tok.model" --out "$tmp/out" --shard-tokens 20000 --threads 2
[ -f "$tmp/out/shard.manifest.json" ] && [ -f "$tmp/out/shard_00000.bin" ] && passes=$((passes + 1)) || fail "prepare wrote no manifest or shard"
expect 2 "already holds" -- prepare --input "$tmp/c4-train.*.json.gz" --tokenizer "$tmp/tok.model" --out "$tmp/out"
expect 0 "prepared 5 documents" -- prepare --input "$tmp/c4-train.00000-of-01024.json" --tokenizer "$tmp/tok.model" --out "$tmp/out" --prefix five --max-docs 5 --quiet

# bad input: each one line naming the file (and line), exit 2, nothing left in --out
expect 2 "matches no files" -- prepare --input "$tmp/nothing-*.json.gz" --tokenizer "$tmp/tok.model" --out "$tmp/bad"
expect 2 "$tmp/none.model: cannot open tokenizer" -- prepare --input "$tmp/c4-train.00000-of-01024.json" --tokenizer "$tmp/none.model" --out "$tmp/bad"
expect 2 "not a SentencePiece model" -- prepare --input "$tmp/c4-train.00000-of-01024.json" --tokenizer "$tmp/c4-train.00000-of-01024.json" --out "$tmp/bad"
{ head -n 100 "$tmp/c4-train.00000-of-01024.json"; echo '{"text": "no end'; } >"$tmp/broken.jsonl"
expect 2 "$tmp/broken.jsonl:101: malformed JSON" -- prepare --input "$tmp/broken.jsonl" --tokenizer "$tmp/tok.model" --out "$tmp/bad"
expect 0 "prepared 100 documents from 1 files (1 bad records skipped)" -- prepare --input "$tmp/broken.jsonl" --tokenizer "$tmp/tok.model" --out "$tmp/skip" --skip-bad-records
head -c 20000 "$tmp/c4-train.00000-of-01024.json.gz" >"$tmp/cut.json.gz"
expect 2 "$tmp/cut.json.gz: truncated gzip" -- prepare --input "$tmp/cut.json.gz" --tokenizer "$tmp/tok.model" --out "$tmp/bad"
: >"$tmp/empty.jsonl"
expect 2 "$tmp/empty.jsonl: empty input" -- prepare --input "$tmp/empty.jsonl" --tokenizer "$tmp/tok.model" --out "$tmp/bad"
expect 2 "--threads 0" -- prepare --input "$tmp/empty.jsonl" --tokenizer "$tmp/tok.model" --out "$tmp/bad" --threads 0
expect 2 "missing --out" -- prepare --input "$tmp/empty.jsonl" --tokenizer "$tmp/tok.model"
[ ! -e "$tmp/bad" ] && passes=$((passes + 1)) || fail "a failed prepare left $tmp/bad behind"

echo "$passes passed, $failures failed"
[ "$failures" = 0 ]
