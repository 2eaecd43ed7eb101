#!/bin/bash
# Runs the digits grid's groups beyond the H100's main, control and
# ablation groups on a lent GPU machine: NTIL's peers (DEL, SMMD, NL-NTL x
# 5 seeds), the chunk group (CE, EMD, NTIL x 5 seeds on numbers in tokens
# of 1-3 digits) and NTIL's peers in those tokens (chunks_peers): 45 cells
# of 800 steps of 128, each paired by seed with the main group's records.
# From what scripts/device_kit.sh prepared (its .devkit/whl wheels and the
# digits data packed in .devkit/digits_data.tgz: the tree, the wheels and
# the unpacked data together pass 64 MiB): one call,
#   carry [".devkit/whl", ".devkit/digits_data.tgz"], timeout_s 540:
#   bash scripts/device_digits_grid.sh
# (On 2026-11-30 one H200 ran all 45 cells of these groups in 327 s, 8 at a
# time; a call now runs only cells results.json lacks.)
# WORKERS processes share the GPU (8 ran the 45-cell grid in 6 minutes on an
# H100). Every finished cell is recorded at once and copied to $OUT/digits/
# every few seconds, so a call cut short keeps them; cells the carried
# results.json already holds (from this CPU) are not run again, and the
# report names pairs whose cells ran on different hardware. Copy
# $OUT/digits/* over experiments/arithmetic_mix/digits/, regenerate the
# report (`python -m experiments.arithmetic_mix.report --profile=digits`)
# and the summary (`python -m experiments.summary --readme`), and commit.
# Environment: WORKERS (8), BUDGET_S (seconds for the grid, 420), GRID_GROUPS
# ("peers,chunks,chunks_peers"), SIGNAL (INT: unfinished cells save a checkpoint).
set -uo pipefail
KIT=.devkit
WORKERS=${WORKERS:-8}
BUDGET_S=${BUDGET_S:-420}
GRID_GROUPS=${GRID_GROUPS:-peers,chunks,chunks_peers}
SIGNAL=${SIGNAL:-INT}
OUT=${OUT:-/tmp/out}
RESULTS=experiments/arithmetic_mix/digits
export PYTHONUNBUFFERED=1
start=$(date +%s)

source scripts/device_site.sh || exit 1
DIGITS_DATA="$KIT"/data/arithmetic_mix/add_or_sub-easy_train102400_test2000_seed0
if [ ! -d "$DIGITS_DATA" ] && [ -f "$KIT/digits_data.tgz" ]; then
  mkdir -p "$KIT/data" && tar xzf "$KIT/digits_data.tgz" -C "$KIT/data"
fi
ls -d "$DIGITS_DATA" || {
  echo "no digits data in $KIT/data: run DIGITS=1 bash scripts/device_kit.sh"
  exit 1
}

mkdir -p "$OUT/digits"
save() {  # the predictions first: results.json never names missing ones
  cp -r "$RESULTS/results_predictions" "$OUT/digits/" 2>/dev/null
  cp "$RESULTS/results.json" "$OUT/digits/" 2>/dev/null
}
(while sleep 10; do save; done) &
saver=$!
python3 -m experiments.arithmetic_mix.run --profile=digits --groups="$GRID_GROUPS" \
  --data_dir="$KIT/data" --workers="$WORKERS" &
pid=$!
(sleep "$BUDGET_S"; pkill -"$SIGNAL" -f experiments.arithmetic_mix.run) &
timer=$!
wait "$pid"
kill "$timer" "$saver" 2>/dev/null
save
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv
echo "done in $(( $(date +%s) - start )) s"
