#!/usr/bin/env bash
# Curves of grass runs: the training and validation loss, the validation perplexity and the
# tokens per second of each run, from its <out_dir>/metrics.jsonl, in one PNG.
#   scripts/plot.sh runs/quickstart                     # writes runs/quickstart/curves.png
#   scripts/plot.sh --out cmp.png runs/a runs/b         # several runs in one figure
# Draws with Debian's python3-matplotlib through /usr/bin/python3 and installs it when missing
# (as scripts/install_deps.sh installs the build's packages: as root, or through sudo). The runs
# are read and checked before anything is installed; bad input is one error line, exit 2.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
plotter=$root/tools/plot_curves.py
python=/usr/bin/python3

if [ $# -eq 0 ]; then
  echo "usage: scripts/plot.sh [--out FILE.png] RUN_DIR..." >&2
  exit 2
fi
for arg in "$@"; do
  case $arg in -h|--help) exec "$python" "$plotter" --help ;; esac
done
if [ -x "$python" ]; then
  "$python" "$plotter" --check "$@"
fi
if ! "$python" -c "import matplotlib" 2>/dev/null; then
  "$root/scripts/install_deps.sh" python3-matplotlib
fi
exec "$python" "$plotter" "$@"
