r"""The most tokens a from-hidden step's plan fits in a memory budget.

    python -m benchmarks.largest_batch [--out=benchmarks/largest_batch.json]
        [--vocabs=32768,151936] [--memory_budget_gib=16]

For each vocabulary size, value + gradient of ``hidden @ W`` followed by
optax CE and of ``fused_numeric_loss(method="ntil")`` (the functions of
:func:`benchmarks.run.hidden_family`) is compiled, never run, at abstract
shapes of ``[B, --seq_len]`` tokens for larger and larger ``B``
(:func:`largest_batch`): the most whole rows whose XLA plan (arguments +
temp + output bytes) fits the budget. A plan does not depend on load, so
this can run beside other work; it is not linear in N (the fused path's
chunk buffers and ``[D, V]`` gradient do not grow with it), so one size's
plan scaled up understates how far the fused path goes.
"""

import datetime
import functools

from absl import app
from absl import flags
import jax
import jax.numpy as jnp

from benchmarks import run

FLAGS = flags.FLAGS
# --out, --seq_len, --hidden_dim, --dtype and --chunk_size are
# benchmarks.run's flags, with another default for --out here.
OUT = "benchmarks/largest_batch.json"
ROWS = ("hidden @ W + optax CE", "fused_numeric_loss ntil")
METHOD = (
    "the most whole rows whose XLA plan (arguments + temp + output, "
    "compiled at that size, not run) fits the budget, to within 0.1%"
)


def held_bytes(compiled):
  """XLA's plan for everything a call holds at once: arguments + temp +
  output bytes (no argument is donated here)."""
  stats = compiled.memory_analysis()
  return int(
      stats.argument_size_in_bytes
      + stats.temp_size_in_bytes
      + stats.output_size_in_bytes
  )


@functools.cache
def _held_bytes_at(fn, shapes) -> int:
  """:func:`held_bytes` of ``fn`` compiled at ``shapes`` (a tuple of
  ``jax.ShapeDtypeStruct``), compiled once per process: a plan does not
  change, and the searches of one function visit the same sizes."""
  return held_bytes(fn.lower(*shapes).compile())


def largest_batch(fn, args, budget, start=1, max_batch=2**24):
  """The most rows ``B`` for which ``fn``'s plan fits in ``budget`` bytes.

  ``fn`` is compiled, never run, at abstract shapes (``jax.ShapeDtypeStruct``:
  nothing is allocated) with ``args``' leading axis of every argument but
  the second (the unembedding) set to ``B``; a doubling from ``start`` then
  a bisection to within 0.1%. 0 if one row does not fit; ``max_batch`` if
  that does. ``args`` may be arrays or ``jax.ShapeDtypeStruct``.
  """

  def fits(batch):
    shapes = tuple(
        jax.ShapeDtypeStruct(
            a.shape if i == 1 else (batch, *a.shape[1:]), a.dtype
        )
        for i, a in enumerate(args)
    )
    return _held_bytes_at(fn, shapes) <= budget

  if not fits(1):
    return 0
  lo = 1
  hi = max(2, start)
  while fits(hi):
    lo = hi
    if hi >= max_batch:
      return max_batch
    hi = min(2 * hi, max_batch)
  while hi - lo > max(1, lo // 1000):
    mid = (lo + hi) // 2
    lo, hi = (mid, hi) if fits(mid) else (lo, mid)
  return lo


def budget_bytes(gib):
  """``gib`` GiB where positive, else the device's memory (16 GiB on CPU)."""
  if gib > 0:
    return int(gib * 2**30)
  stats = jax.devices()[0].memory_stats() or {}
  return int(stats.get("bytes_limit", 16 * 2**30))


def abstract_args(vocab, length, dim, dtype):
  """One row's hidden states, unembedding, labels and digit mask, as
  shapes (nothing allocated)."""
  return (
      jax.ShapeDtypeStruct((1, length, dim), dtype),
      jax.ShapeDtypeStruct((dim, vocab), dtype),
      jax.ShapeDtypeStruct((1, length), jnp.int32),
      jax.ShapeDtypeStruct((1, length), jnp.bool_),
  )


def search(vocabs, length, dim, dtype, budget, chunk_size=None):
  """``[{vocab, row: tokens, ...}]``: the most tokens (whole rows of
  ``length``) of each of :data:`ROWS` whose plan fits ``budget``."""
  family = run.hidden_family(chunk_size)
  out = []
  for vocab in vocabs:
    args = abstract_args(vocab, length, dim, dtype)
    found = {"vocab": vocab}
    for name in ROWS:
      found[name] = largest_batch(family[name], args, budget) * length
      print(
          f"V={vocab:>7}  {name:<24} {found[name]:>12,} tokens",
          flush=True,
      )
    out.append(found)
  return out


def define_flags():
  """This script's flags (defined when it runs, not when it is imported)."""
  flags.DEFINE_list(
      "vocabs", ["32768", "151936"], "Vocabulary sizes V to search at."
  )
  flags.DEFINE_float(
      "memory_budget_gib",
      0.0,
      "The budget (default: the device's memory, or 16 GiB on CPU).",
  )


def main(argv):
  del argv
  dtype = jnp.dtype(FLAGS.dtype)
  budget = budget_bytes(FLAGS.memory_budget_gib)
  device = jax.devices()[0]
  print(
      f"device: {device.platform}: {device.device_kind}, jax {jax.__version__};"
      f" budget {budget / 2**30:.2f} GiB, T={FLAGS.seq_len},"
      f" D={FLAGS.hidden_dim}, {FLAGS.dtype}",
      flush=True,
  )
  runs = search(
      [int(v) for v in FLAGS.vocabs],
      FLAGS.seq_len,
      FLAGS.hidden_dim,
      dtype,
      budget,
      FLAGS.chunk_size,
  )
  result = dict(
      device=f"{device.platform}: {device.device_kind}",
      jax=jax.__version__,
      date=datetime.date.today().isoformat(),
      dtype=FLAGS.dtype,
      seq_len=FLAGS.seq_len,
      hidden_dim=FLAGS.hidden_dim,
      chunk_size=FLAGS.chunk_size,
      budget_bytes=budget,
      method=METHOD,
      runs=runs,
  )
  out = FLAGS.out if FLAGS["out"].present else OUT
  run.write_json(out, result)


if __name__ == "__main__":
  define_flags()
  app.run(main)
