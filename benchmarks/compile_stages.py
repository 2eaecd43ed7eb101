"""Where NTIL's compile time goes: its logits program cut after each stage.

    python -m benchmarks.compile_stages [--repeats=6] [--out=benchmarks/compile_stages.json]

The value + gradient of `benchmarks.compile`'s logits program, compiled
with NTIL's number logic cut after a stage (the cut programs compute
something else: they exist only to be timed), against EMD's, each the best
of ``--repeats`` rounds of compiles after ``jax.clear_caches()``:

* ``place``: EMD weighted by place and the number layout its weights need
  (no straight-through digits, no deviations);
* ``digits``: and the straight-through digits, their deviations zero;
* ``comparison``: and the comparison of the two numbers, read by the
  deviations through a product that keeps it;
* ``ntil``: all of NTIL.
"""

import contextlib
import datetime

from absl import app
from absl import flags
import jax
import jax.numpy as jnp

from benchmarks import compile as compile_bench
from ntil_jax import ntil

_REPEATS = flags.DEFINE_integer("repeats", 6, "Rounds of compiles.")
SHAPES = ((2, 2048, 1024), (1, 8192, 256))


def _place(soft, hard, layout, comparison):
  del hard, layout, comparison
  return jnp.zeros_like(soft), jnp.zeros_like(soft)


def _digits(soft, hard, layout, comparison):
  del hard, layout, comparison
  return soft * 0.0, soft * 0.0


def _comparison(soft, hard, layout, comparison):
  del hard, layout
  kept = sum(field.astype(jnp.float32) for field in comparison)
  return soft * kept, soft * kept


# Each stage's deviations, and whether it compares the numbers first.
STAGES = {
    "place": (_place, False),
    "digits": (_digits, False),
    "comparison": (_comparison, True),
    "ntil": (None, True),
}


@contextlib.contextmanager
def _cut(stage):
  """NTIL's number logic cut after ``stage`` (nothing cut for ``ntil``)."""
  deviations, compares = STAGES[stage]
  saved = ntil._number_deviations, ntil.numbers.compare_numbers  # pylint: disable=protected-access
  if deviations is not None:
    ntil._number_deviations = deviations  # pylint: disable=protected-access
  if not compares:
    ntil.numbers.compare_numbers = lambda hard, layout: (layout, None)
  try:
    yield
  finally:
    ntil._number_deviations, ntil.numbers.compare_numbers = saved  # pylint: disable=protected-access


def measure(shape, repeats):
  """``{stage: NTIL's compile / EMD's}`` at ``shape``, and the loop kernels."""
  batch, length, vocab = shape
  logits, _, _, labels, mask, point = compile_bench.inputs(
      batch, length, vocab, 64
  )
  args = (jnp.asarray(logits), labels, mask, point)
  rows = compile_bench.programs(["emd", "ntil"])
  emd = rows["numeric_token_loss emd"][0]
  ntil_program = rows["numeric_token_loss ntil"][0]
  best, kernels = {}, {}
  for _ in range(repeats):
    seconds, _ = compile_bench.compile_seconds(emd, args)
    best["emd"] = min(best.get("emd", float("inf")), seconds)
    for stage in STAGES:
      with _cut(stage):
        seconds, compiled = compile_bench.compile_seconds(ntil_program, args)
      best[stage] = min(best.get(stage, float("inf")), seconds)
      kernels[stage] = compile_bench.fusion_kinds(compiled).get("kLoop", 0)
  return {
      stage: (best[stage] / best["emd"], kernels[stage]) for stage in STAGES
  }


def main(argv):
  del argv
  shapes = {}
  for shape in SHAPES:
    name = "x".join(map(str, shape))
    shapes[name] = {}
    for stage, (ratio, loops) in measure(shape, _REPEATS.value).items():
      shapes[name][stage] = dict(
          ntil_over_emd=round(ratio, 3), loop_kernels=loops
      )
      print(
          f"{name:>12}  {stage:<10}  {ratio:5.2f}x EMD's"
          f" compile  {loops} loop kernels",
          flush=True,
      )
  # --out is benchmarks.run's flag (imported with benchmarks.compile):
  # written only where given.
  out = flags.FLAGS.out if flags.FLAGS["out"].present else None
  if out:
    result = dict(
        device=str(jax.devices()[0].device_kind),
        jax=jax.__version__,
        date=datetime.date.today().isoformat(),
        repeats=_REPEATS.value,
        shapes=shapes,
    )
    compile_bench.run.write_json(out, result)


if __name__ == "__main__":
  app.run(main)
