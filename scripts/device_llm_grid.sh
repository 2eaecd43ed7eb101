#!/bin/bash
# Runs the SmolLM2 grid on a lent GPU machine, from what scripts/device_kit.sh
# prepared (read its header first): installs the wheels, joins and checks the
# GGUF, converts it, runs the add_or_sub grid (5 losses x 5 seeds), then
# arithmetic_mix (5 x 3) while time is left, WORKERS processes sharing the
# GPU, and copies the results to $OUT/llm/. Every finished cell is recorded at
# once, so a grid cut short resumes in the next call or session. Cells the
# carried results.json already holds (from this CPU) are not run again; the
# report names each pair whose two cells ran on different hardware.
# Environment: STEPS, BATCH, TEST_SIZE, LR (the schedule and test set, as
# device_kit.sh's data), WORKERS (6), BUDGET_S (seconds for the grids, 360),
# SIGNAL (INT: unfinished cells save a checkpoint to resume from; KILL skips
# those saves, 1.6 GB a cell, where the machine and its disk go back anyway),
# FRESH (1: run every cell here, ignoring the carried results.json, so that
# the grid runs on one kind of hardware), GRIDS (which datasets and seeds, in
# order: "add_or_sub:0,1,2,3,4 arithmetic_mix:0,1,2"), METHODS (the losses,
# e.g. ce,ntil; default all five), RESULTS_JSON (the results file; another
# schedule needs its own, e.g. .../paper/results.json for the paper's
# budget: STEPS=3000 LR=1e-5, with device_kit.sh's data at STEPS=3000).
set -uo pipefail
KIT=.devkit
STEPS=${STEPS:-300}
BATCH=${BATCH:-32}
TEST_SIZE=${TEST_SIZE:-2000}
LR=${LR:-1e-4}
WORKERS=${WORKERS:-6}
BUDGET_S=${BUDGET_S:-360}
SIGNAL=${SIGNAL:-INT}
FRESH=${FRESH:-0}
OUT=${OUT:-/tmp/out}
SNAPSHOT=${SNAPSHOT:-/tmp/models/SmolLM2-135M-Instruct}
RESULTS=experiments/arithmetic_mix/llm/SmolLM2-135M-Instruct
RESULTS_JSON=${RESULTS_JSON:-$RESULTS/results.json}
PREDICTIONS=${RESULTS_JSON%.json}_predictions
GRIDS=${GRIDS:-add_or_sub:0,1,2,3,4 arithmetic_mix:0,1,2}
METHODS=${METHODS:-}
export PYTHONUNBUFFERED=1
start=$(date +%s)

source scripts/device_site.sh || exit 1

if [ ! -d "$SNAPSHOT" ]; then
  cat /tmp/kit/part-00 /tmp/kit/part-01 >/tmp/smollm2.gguf 2>/dev/null
  if [ "$(sha256sum /tmp/smollm2.gguf | cut -d' ' -f1)" != "$(cat $KIT/gguf.sha256)" ]; then
    echo "the GGUF halves in /tmp/kit are missing or wrong (calls 1-2 of device_kit.sh):"
    ls -l /tmp/kit
    exit 1
  fi
  python3 -m train.gguf_to_hf --gguf=/tmp/smollm2.gguf --out="$SNAPSHOT" || exit 1
fi
[ "$FRESH" = 1 ] && rm -rf "$RESULTS_JSON" "$PREDICTIONS"

# What is under $OUT comes back even when the call is cut at its time limit:
# copy the results there every few seconds, not only at the end (the
# predictions first, so results.json never names predictions not yet there;
# both files are replaced whole when written, never half written).
mkdir -p "$OUT/llm"
save() {
  cp -r "$PREDICTIONS" "$OUT/llm/" 2>/dev/null
  cp "$RESULTS_JSON" "$OUT/llm/" 2>/dev/null
}
(while sleep 10; do save; done) &
saver=$!

grid() {  # dataset, seeds, seconds
  python3 -m experiments.arithmetic_mix.run --profile=llm \
    --pretrained="$SNAPSHOT" --dataset="$1" --seeds="$2" \
    --learning_rate="$LR" --train_steps="$STEPS" --batch_size="$BATCH" \
    --test_size="$TEST_SIZE" --data_dir="$KIT/data" --data_workers=1 --workers="$WORKERS" \
    --results="$RESULTS_JSON" ${METHODS:+--methods="$METHODS"} &
  local pid=$!
  (sleep "$3"; pkill -"$SIGNAL" -f experiments.arithmetic_mix.run) &
  local timer=$!
  wait "$pid"
  kill "$timer" 2>/dev/null
}
for entry in $GRIDS; do  # dataset:seeds, while more than 90 s are left
  left=$(( BUDGET_S - ($(date +%s) - start) ))
  [ "$left" -gt 90 ] && grid "${entry%%:*}" "${entry#*:}" "$left"
done

kill "$saver" 2>/dev/null
save
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv
echo "done in $(( $(date +%s) - start )) s"
