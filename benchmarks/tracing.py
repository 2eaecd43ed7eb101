r"""What NTIL costs before XLA compiles anything: tracing, and eager calls.

    python -m benchmarks.tracing [--out=benchmarks/tracing.json]

Two costs that ``benchmarks.compile`` does not separate:

* **Tracing and lowering** of value + gradient of the mean of
  ``numeric_token_loss`` on ``[B, T, V]`` logits, for each method: seconds
  (``jax.jit(f).trace(...).lower()`` after ``jax.clear_caches()``, best of
  ``--repeats`` rounds, every method once a round) and the Python function
  calls it makes (``cProfile``'s count, from one more round: a figure that
  does not depend on the load).
* **The first eager call**: value + gradient by ``jax.value_and_grad``
  alone, no ``jit``, on a small batch, each in a fresh process (nothing
  cached): seconds and the programs XLA compiles for it (JAX's compile
  events). The number logic then runs as one compiled program of its own
  (``ntil_jax.base``); the row ``op by op`` runs it the other way, each
  operation compiled on its own (``ntil_jax.base._staged`` answering
  "staged" everywhere, as the code did before 2026-11-27), to show what
  that program saves. That row is a counterfactual, timed only.
"""

import cProfile
import json
import pstats
import subprocess
import sys
import time

from absl import app
from absl import flags
import jax
from jax import monitoring
import jax.numpy as jnp
import numpy as np

import ntil_jax
from ntil_jax import base
from benchmarks import compile as compile_bench
from benchmarks import run

FLAGS = flags.FLAGS
OUT = "benchmarks/tracing.json"
_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
EAGER_SHAPE = (2, 70, 64)


def trace_and_lower(fn, args):
  """Seconds to trace and lower ``jax.jit(fn)`` after clearing caches."""
  jax.clear_caches()
  start = time.perf_counter()
  jax.jit(fn).trace(*args).lower()
  return time.perf_counter() - start


def python_calls(fn, args) -> int:
  """Python function calls made while tracing and lowering ``jax.jit(fn)``."""
  jax.clear_caches()
  profile = cProfile.Profile()
  profile.enable()
  jax.jit(fn).trace(*args).lower()
  profile.disable()
  return pstats.Stats(profile).total_calls


def measure_tracing(shape, methods, repeats):
  """One record per method: tracing seconds and Python calls at ``shape``."""
  batch, length, vocab = shape
  logits, _, _, labels, mask, point = compile_bench.inputs(
      batch, length, vocab, 1
  )
  args = (jnp.asarray(logits), labels, mask, point)
  rows = compile_bench.programs(methods)
  names = [f"numeric_token_loss {m}" for m in methods]
  best = {}
  for _ in range(repeats):
    for name in names:
      seconds = trace_and_lower(rows[name][0], args)
      best[name] = min(best.get(name, float("inf")), seconds)
  records = []
  for name in names:
    calls = python_calls(rows[name][0], args)
    records.append(
        {
            "row": name,
            "shape": list(shape),
            "trace_lower_s": best[name],
            "python_calls": calls,
        }
    )
    print(
        f"{'x'.join(map(str, shape)):>12}  {name:<32} "
        f"{best[name]:6.3f} s  {calls:9,d} Python calls",
        flush=True,
    )
  return records


def eager_first_call(row):
  """``{seconds, programs}`` of the first eager value + gradient of ``row``.

  Run in this process: call it in a fresh one (``--eager_child``).
  """
  method, _, how = row.partition(" ")
  if how == "op by op":
    # The counterfactual: every call counts as staged, so the number logic
    # is never compiled as one program.
    base._staged = lambda x: True  # pylint: disable=protected-access
  batch, length, vocab = EAGER_SHAPE
  labels, mask = run.text_with_numbers(0, batch, length, vocab, 1 / 3)
  logits = np.random.default_rng(1).standard_normal(
      (batch, length, vocab), np.float32
  )

  def loss(z):
    return ntil_jax.numeric_token_loss(
        z, labels, digit_mask=mask, method=method, lam=run.LAM
    ).mean()

  compiles = []
  # Each program XLA compiles reports its compile time once.
  monitoring.register_event_duration_secs_listener(
      lambda event, seconds, **kw: compiles.append(event == _COMPILE_EVENT)
  )
  logits = jnp.asarray(logits)
  jax.block_until_ready(logits)
  compiles.clear()
  start = time.perf_counter()
  value, grad = jax.value_and_grad(loss)(logits)
  jax.block_until_ready((value, grad))
  seconds = time.perf_counter() - start
  if not (np.isfinite(value) and np.isfinite(grad).all()):
    raise RuntimeError(f"{row}: a value or gradient is not finite")
  return {"row": row, "seconds": seconds, "programs": sum(compiles)}


def measure_eager(rows):
  """Each row's first eager call, each in a fresh process."""
  records = []
  for row in rows:
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.tracing", f"--eager_child={row}"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    record = json.loads(out.strip().splitlines()[-1])
    record["shape"] = list(EAGER_SHAPE)
    records.append(record)
    print(
        f"{'x'.join(map(str, EAGER_SHAPE)):>12}  first eager call, "
        f"{row:<16} {record['seconds']:6.2f} s  "
        f"{record['programs']:4d} programs compiled",
        flush=True,
    )
  return records


def define_flags():
  """This script's flags (defined when it runs, not when it is imported)."""
  flags.DEFINE_integer(
      "repeats", 5, "Rounds of tracing (every method once a round)."
  )
  flags.DEFINE_list(
      "shapes", ["2x2048x1024", "1x8192x256"], "B x T x V of each case."
  )
  flags.DEFINE_list(
      "methods",
      ["ce", "emd", "ntil", "ntil+points"],
      "Methods of numeric_token_loss; '+points' adds a decimal_point_mask.",
  )
  flags.DEFINE_list(
      "eager_rows",
      ["emd", "ntil", "ntil op by op"],
      "Methods whose first eager call is timed, each in a fresh process; "
      "'ntil op by op' runs NTIL's number logic operation by operation.",
  )
  flags.DEFINE_string(
      "eager_child",
      None,
      "Internal: time this row's first eager call and print it as JSON.",
  )


def main(argv):
  del argv
  if FLAGS.eager_child:
    print(json.dumps(eager_first_call(FLAGS.eager_child)))
    return
  shapes = [tuple(int(n) for n in s.split("x")) for s in FLAGS.shapes]
  out = FLAGS.out if FLAGS["out"].present else OUT
  tracing = []
  for shape in shapes:
    tracing += measure_tracing(shape, FLAGS.methods, FLAGS.repeats)
  result = {
      "device": str(jax.devices()[0].device_kind),
      "backend": jax.default_backend(),
      "jax": jax.__version__,
      "date": time.strftime("%Y-%m-%d"),
      "repeats": FLAGS.repeats,
      "tracing": tracing,
      "eager": measure_eager(FLAGS.eager_rows),
  }
  run.write_json(out, result)


if __name__ == "__main__":
  define_flags()
  app.run(main)
