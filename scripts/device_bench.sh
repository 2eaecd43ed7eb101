#!/bin/bash
# Runs `make bench`'s measurements on a lent GPU machine (no network, at most
# 64 MiB carried a call) in one call, from what scripts/device_kit.sh
# prepared: carry [".devkit/whl", ".devkit/whl_bench"] (all of .devkit
# passes the 64 MiB a call carries), timeout_s 600:
#   bash scripts/device_bench.sh
# It installs the wheels (.devkit/whl and .devkit/whl_bench: tokamax and its
# small requirements), then times, each under its own limit, at the README's
# accelerator shapes (bfloat16, D = 1536, V = 151,936: Qwen2.5-1.5B's):
#   benchmarks.run             the losses on logits and from hidden states
#   benchmarks.step            a whole train step, Qwen2.5-1.5B-shaped
#   benchmarks.implementations the fused path's implementations side by side
#   benchmarks.compile         each loss's compile time and program size
# JSON and logs go to $OUT/bench/ (the logs hold every row printed, even of a
# benchmark cut at its limit; each appended to bench.log as it ends), with each
# compiled program's optimized HLO on the device in compile_hlo.txt (what
# its kernels are). Copy the JSON into benchmarks/ under names that say the
# device, as `python -m benchmarks.report` reads them: run.json as
# results_<device>_bf16.json, step.json as step_<device>_qwen2.5-1.5b.json,
# implementations.json as implementations_<device>.json and compile.json
# as compile_<device>.json (the plain names are the CPU's figures), then
# run `python -m benchmarks.report`. Environment: RUN_S, STEP_S, IMPL_S,
# COMPILE_S (each benchmark's seconds: 120, 230, 130, 75; on one H100 they
# took 82, more than 150 (four 30-35 s compiles before the first step),
# 93 and 42 s), each cut to what is left before DEADLINE (585 s after the
# start), so the script ends before the call's limit of 600 s.
set -uo pipefail
RUN_S=${RUN_S:-120}
STEP_S=${STEP_S:-230}
IMPL_S=${IMPL_S:-130}
COMPILE_S=${COMPILE_S:-75}
DEADLINE=${DEADLINE:-585}
OUT=${OUT:-/tmp/out}
SITE=/tmp/site
export PYTHONUNBUFFERED=1
start=$(date +%s)

python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
  --upgrade --target "$SITE" .devkit/whl/*.whl .devkit/whl_bench/*.whl || exit 1
# tokamax imports xprof's kernel-stats tool for its own profiling, which is
# not used here; xprof (32 MB) and its requirements (duckdb, Google Cloud
# Storage, ...) do not fit a call, so a stub stands in for that one name.
if ! PYTHONPATH=$SITE python3 -c "import xprof.cli.tools" 2>/dev/null; then
  mkdir -p "$SITE/xprof/cli"
  touch "$SITE/xprof/__init__.py" "$SITE/xprof/cli/__init__.py"
  echo "get_kernel_stats_tool = None  # stub: tokamax's profiling, unused" \
    >"$SITE/xprof/cli/tools.py"
fi
export PYTHONPATH=$SITE:$PWD
# On the GPU, or not at all: a CUDA plugin that failed to load leaves JAX on
# the CPU, where every benchmark would spend the call's time on nothing.
python3 -c "import jax; print('jax', jax.__version__, jax.devices())
assert jax.default_backend() == 'gpu', 'JAX is not on the GPU'" || exit 1
# Only benchmarks.implementations uses tokamax, and it leaves tokamax's rows
# out where tokamax does not import: the other benchmarks still run.
python3 -c "import tokamax" 2>/dev/null ||
  echo "warning: tokamax does not import; implementations runs without it"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader

mkdir -p "$OUT/bench"
bench() {  # name, seconds, module and flags
  local name=$1 seconds=$2
  shift 2
  local left=$(( DEADLINE - ($(date +%s) - start) ))
  if (( left < seconds )); then seconds=$left; fi
  if (( seconds < 5 )); then echo "== $name: no time left"; return; fi
  echo "== $name ($seconds s at most): $*"
  timeout "$seconds" python3 -m "$@" --out="$OUT/bench/$name.json" \
    >"$OUT/bench/$name.log" 2>&1
  echo "rc $? after $(( $(date +%s) - start )) s"
  grep -v "^I[0-9]\|^W[0-9]" "$OUT/bench/$name.log" | tail -40
  # At most 8 files come back from a call: the logs become one as they end.
  cat "$OUT/bench/$name.log" >>"$OUT/bench/bench.log" && rm -f "$OUT/bench/$name.log"
}
# A run of 10 calls back to back: the losses take 0.3-3.5 ms on an H200, and
# one call synchronized at a time measured the same function 10-20% apart.
bench run "$RUN_S" benchmarks.run --dtype=bfloat16 --hidden_dim=1536 \
  --blocks=9 --calls_per_run=10
bench step "$STEP_S" benchmarks.step --model=qwen2.5-1.5b --dtype=bfloat16 \
  --batch_size=64 --seq_len=128 --blocks=3 --per_block=2 \
  --variants=ce:logits,ntil:logits,ce:fused,ntil:fused
bench implementations "$IMPL_S" benchmarks.implementations --calls_per_run=5
bench compile "$COMPILE_S" benchmarks.compile --methods=ce,emd,ntil --repeats=1 \
  --hlo_out="$OUT/bench/compile_hlo.txt"
echo "done in $(( $(date +%s) - start )) s"
