#!/bin/bash
# Runs cells of the digits grids on a lent GPU machine, 8 at a time.
# PROFILE=digits (default): the groups beyond the H100's main, control and
# ablation groups: NTIL's peers (DEL, SMMD, NL-NTL x 5 seeds), the chunk
# group (CE, EMD, NTIL x 5 seeds on numbers in tokens of 1-3 digits) and
# NTIL's peers in those tokens (chunks_peers): 45 cells of 800 steps of 128,
# each paired by seed with the main group's records. From what
# scripts/device_kit.sh prepared (its .devkit/whl wheels and the digits data
# packed in .devkit/digits_data.tgz: the tree, the wheels and the unpacked
# data together pass 64 MiB): one call,
#   carry [".devkit/whl", ".devkit/digits_data.tgz"], timeout_s 540:
#   bash scripts/device_digits_grid.sh
# (On 2026-11-30 one H200 ran all 45 cells of these groups in 327 s.)
# PROFILE=digits_long: the 3,200-step grid's cells results_long.json lacks
# (6 of its ablation cells on 2026-11-30). Its 409,600 problems do not fit a
# call, so they are generated there from the wheels of .devkit/whl_data
# (mathematics_dataset and its sympy), after a check that the same code
# draws the 800-step grid's 102,400 problems there as here, in order
# (.devkit/digits_data.digest): else the cells would not be paired. One call,
#   carry [".devkit/whl", ".devkit/whl_data", ".devkit/digits_data.digest"],
#   timeout_s 560: PROFILE=digits_long BUDGET_S=420 bash scripts/device_digits_grid.sh
# A call runs only the cells the carried results file lacks. Every finished
# cell is recorded at once and copied to $OUT/digits/ every few seconds, so
# a call cut short keeps them; the report names pairs whose cells ran on
# different hardware. Copy $OUT/digits/* over experiments/arithmetic_mix/digits/,
# regenerate the report (`python -m experiments.arithmetic_mix.report
# --profile=$PROFILE`) and the summary (`python -m experiments.summary
# --readme`), and commit.
# Environment: PROFILE (digits), WORKERS (8), BUDGET_S (seconds for the grid,
# 420), GRID_GROUPS (digits: "peers,chunks,chunks_peers"; digits_long:
# "main,control,ablation"), DATA_WORKERS (16: processes generating data),
# SIGNAL (INT: unfinished cells save a checkpoint).
set -uo pipefail
KIT=.devkit
PROFILE=${PROFILE:-digits}
WORKERS=${WORKERS:-8}
BUDGET_S=${BUDGET_S:-420}
DATA_WORKERS=${DATA_WORKERS:-16}
SIGNAL=${SIGNAL:-INT}
OUT=${OUT:-/tmp/out}
RESULTS=experiments/arithmetic_mix/digits
export PYTHONUNBUFFERED=1
start=$(date +%s)
case "$PROFILE" in
  digits) NAME=results; GROUPS_DEFAULT=peers,chunks,chunks_peers ;;
  digits_long) NAME=results_long; GROUPS_DEFAULT=main,control,ablation ;;
  *) echo "PROFILE=$PROFILE: digits or digits_long"; exit 1 ;;
esac
GRID_GROUPS=${GRID_GROUPS:-$GROUPS_DEFAULT}

source scripts/device_site.sh || exit 1
DIGITS=arithmetic_mix/add_or_sub-easy_train102400_test2000_seed0
if [ "$PROFILE" = digits ]; then
  if [ ! -d "$KIT/data/$DIGITS" ] && [ -f "$KIT/digits_data.tgz" ]; then
    mkdir -p "$KIT/data" && tar xzf "$KIT/digits_data.tgz" -C "$KIT/data"
  fi
  ls -d "$KIT/data/$DIGITS" || {
    echo "no digits data in $KIT/data: run DIGITS=1 bash scripts/device_kit.sh"
    exit 1
  }
else  # generated here: first the check that this machine draws the same
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --upgrade --target /tmp/site "$KIT"/whl_data/*.whl || exit 1
  python3 -c "import json; from train import arithmetic_data as d; print(json.dumps(d.problems_digest(d.prepare('/tmp/check', 800 * 128, 2000, module='arithmetic__add_or_sub', difficulty='easy', workers=$DATA_WORKERS)), sort_keys=True))" \
    2>/tmp/check.log >/tmp/check.digest || { tail -5 /tmp/check.log; exit 1; }
  if cmp /tmp/check.digest "$KIT/digits_data.digest"; then
    echo "the 102,400 problems drawn here are the kit's: $(cat /tmp/check.digest)"
  else
    echo "the problems drawn here differ from the kit's: not paired, not run"
    exit 1
  fi
fi

mkdir -p "$OUT/digits"
save() {  # the predictions first: the results never name missing ones
  cp -r "$RESULTS/${NAME}_predictions" "$OUT/digits/" 2>/dev/null
  cp "$RESULTS/$NAME.json" "$OUT/digits/" 2>/dev/null
}
(while sleep 10; do save; done) &
saver=$!
python3 -m experiments.arithmetic_mix.run --profile="$PROFILE" \
  --groups="$GRID_GROUPS" --data_dir="$KIT/data" --workers="$WORKERS" \
  --data_workers="$DATA_WORKERS" &
pid=$!
(sleep "$BUDGET_S"; pkill -"$SIGNAL" -f experiments.arithmetic_mix.run) &
timer=$!
wait "$pid"
kill "$timer" "$saver" 2>/dev/null
save
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv
echo "done in $(( $(date +%s) - start )) s"
