#!/usr/bin/env bash
# The main job: installs what is missing, builds, tokenizes the bundled C4-format sample
# (data/c4_sample, see data/README.md) when its shards are missing, trains the quickstart model
# on it, and prints the validation perplexity of the trained model against the untrained one's.
# A few minutes on 2 cores. Extra arguments go to `grass train` (e.g. --set steps=100). Each run
# starts afresh: an earlier run's out_dir is moved aside to <out_dir>.old-N (--overwrite), never
# deleted.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh grass  # the tests and tools are scripts/test.sh's to build

sample=data/c4_sample
tokens=$sample/tokens
if [ ! -f "$tokens/train.manifest.json" ] || [ ! -f "$tokens/val.manifest.json" ]; then
  rm -rf "$tokens"
  build/grass prepare --input "$sample/c4-train.00000-of-00001.json.gz" \
    --tokenizer "$sample/tokenizer.model" --out "$tokens" --prefix train
  build/grass prepare --input "$sample/c4-validation.00000-of-00001.json.gz" \
    --tokenizer "$sample/tokenizer.model" --out "$tokens" --prefix val
fi

run=configs/runs/quickstart.json
# The untrained model: the seeded initial weights that training starts from.
untrained=$(build/grass eval "$run" "$@")
echo "$untrained"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
build/grass train "$run" --overwrite "$@" | tee "$log"

ppl_of() { sed -n 's/.*| ppl \([0-9.]*\) |.*/\1/p' | tail -n 1; }
echo "validation perplexity: untrained $(echo "$untrained" | ppl_of) -> trained $(ppl_of < "$log")" \
  "(first $(sed -n 's/.*| \([0-9]*\) tokens$/\1/p' <<< "$untrained") tokens of $run's data.val)"
