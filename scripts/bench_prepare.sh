#!/usr/bin/env bash
# Tokenization throughput of `grass prepare` (1 and 2 threads) against SentencePiece's own
# single-threaded command-line encoder, spm_encode, on the same text and tokenizer.
#
#   scripts/bench_prepare.sh [input.json.gz]   default: data/c4_sample/c4-train.00000-of-00001.json.gz
# Env: GRASS (default build/grass, built by scripts/build.sh), TOKENIZER (a .model; default: one
# trained here on the input with VOCAB pieces, VOCAB default 32000), ROUNDS (3; the table gives the
# median round).
#
# spm_encode reads lines, so the documents' text is also written out as paragraphs.txt: one line
# per paragraph of a document (C4 text holds newlines), the same bytes less the JSON. Rows:
#   spm_encode      paragraphs.txt -> token ids as text (to /dev/null)
#   grass .txt      paragraphs.txt -> shards (each line a document: BOS + tokens + EOS)
#   grass .json.gz  the C4 file itself: gunzip, JSON parse, whole documents -> shards
# MB/s counts the UTF-8 bytes of document text; tokens/s counts each tool's own output tokens.
set -euo pipefail
cd "$(dirname "$0")/.."
input=${1:-data/c4_sample/c4-train.00000-of-00001.json.gz}
rounds=${ROUNDS:-3}
if [ -z "${GRASS:-}" ]; then scripts/build.sh >/dev/null; GRASS=build/grass; fi
command -v spm_encode >/dev/null || { echo "error: spm_encode missing: apt-get install sentencepiece" >&2; exit 2; }
[ -f "$input" ] || { echo "error: $input: no such file (see data/README.md)" >&2; exit 2; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
tokenizer=${TOKENIZER:-}
if [ -z "$tokenizer" ]; then
  tokenizer=$tmp/bench.model
  "$GRASS" tokenizer train --input "$input" --vocab-size "${VOCAB:-32000}" --out "$tokenizer" >&2
fi
# paragraphs.txt, and the UTF-8 bytes of the documents' text (no separators) on stdout
text_bytes=$(python3 - "$input" "$tmp/paragraphs.txt" <<'PY'
import gzip, json, sys
total = 0
with gzip.open(sys.argv[1], "rt", encoding="utf-8") as src, open(sys.argv[2], "w", encoding="utf-8") as out:
    for line in src:
        if line.strip():
            text = json.loads(line)["text"]
            total += len(text.encode("utf-8"))
            out.write(text + "\n")
print(total)
PY
)

median() { sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
now() { date +%s.%N; }

# run_rounds <label> <tokens> <command...>: prints a table row from the median of `rounds` timings
run_rounds() {
  local label=$1 tokens=$2 times=() t0
  shift 2
  for ((r = 0; r < rounds; r++)); do
    rm -rf "$tmp/out"
    t0=$(now)
    "$@" >/dev/null
    times+=("$(echo "$(now) - $t0" | bc -l)")
  done
  local t
  t=$(printf '%s\n' "${times[@]}" | median)
  printf '| %s | %.2f | %.2f | %.0f |\n' "$label" "$t" "$(echo "$text_bytes / $t / 1000000" | bc -l)" \
    "$(echo "$tokens / $t" | bc -l)"
  echo "  $label rounds (s): ${times[*]}" >&2
}

grass_tokens() {  # tokens of a grass prepare run on $1 with the tokenizer, BOS/EOS included
  rm -rf "$tmp/out"
  "$GRASS" prepare --input "$1" --tokenizer "$tokenizer" --out "$tmp/out" --quiet |
    sed -n 's/.* -> \([0-9]*\) tokens.*/\1/p'
}

spm_tokens=$(spm_encode --model "$tokenizer" --output_format=id <"$tmp/paragraphs.txt" | wc -w)
txt_tokens=$(grass_tokens "$tmp/paragraphs.txt")
gz_tokens=$(grass_tokens "$input")

echo "input: $input ($(printf '%.2f' "$(echo "$text_bytes / 1000000" | bc -l)") MB of text," \
  "$(wc -l <"$tmp/paragraphs.txt") paragraphs); tokenizer: $("$GRASS" tokenizer info "$tokenizer")"
echo "machine: $(nproc) cores, $(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1); load before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo
echo "| encoder | seconds | MB/s of text | tokens/s |"
echo "|---|---|---|---|"
run_rounds "spm_encode (1 thread), paragraphs.txt" "$spm_tokens" \
  spm_encode --model "$tokenizer" --output_format=id --output "$tmp/ids.txt" "$tmp/paragraphs.txt"
for threads in 1 2; do
  run_rounds "grass prepare --threads $threads, paragraphs.txt" "$txt_tokens" \
    "$GRASS" prepare --input "$tmp/paragraphs.txt" --tokenizer "$tokenizer" --out "$tmp/out" --threads "$threads" --quiet
done
for threads in 1 2; do
  run_rounds "grass prepare --threads $threads, $(basename "$input")" "$gz_tokens" \
    "$GRASS" prepare --input "$input" --tokenizer "$tokenizer" --out "$tmp/out" --threads "$threads" --quiet
done
echo
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
