r"""What scoring numbers in tokens of 1-3 digits costs against ten digit ids.

    python -m benchmarks.number_tokens [--tokens=2048] [--vocab=32768]

Value + gradient of the mean of ``numeric_token_loss`` on ``[1, N, V]``
float32 logits for each ``--methods`` entry, once with the ten digit ids of a
vocabulary and once with its 1,110 number tokens of 1-3 digits (a Llama 3
style vocabulary: every digit string of 1 to 3 digits is a token), a third of
the labels number tokens. Printed: the run time (the estimator and the
``--blocks``/``--per_block`` flags of ``benchmarks.run``, every program
taking turns), the compile time after ``jax.clear_caches()`` and the
optimized program's instructions (``benchmarks.compile.instructions``),
with the ratio of number tokens to digit ids.
"""

import time

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np

import ntil_jax
from benchmarks import compile as compile_benchmark
from benchmarks import run

FLAGS = flags.FLAGS
flags.DEFINE_integer("tokens", 2048, "N, the positions of one row.")
flags.DEFINE_integer("vocab", 32768, "V, the logits' last axis.")
flags.DEFINE_list("methods", ["emd", "ntil"], "The losses measured.")


def vocabulary(size):
  """Pieces: the 1,110 digit strings of 1-3 digits, then filler tokens."""
  numbers = [str(d) for d in range(10)]
  numbers += [f"{v:02d}" for v in range(100)] + [
      f"{v:03d}" for v in range(1000)
  ]
  return [f"t{i}" for i in range(size - len(numbers))] + numbers


def programs(pieces):
  """Value + gradient of each method's mean loss, labels an argument (as
  constants, XLA would fold the number logic that reads them alone)."""
  ids = {
      "digit ids": ntil_jax.digit_token_ids(pieces),
      "number tokens": ntil_jax.number_tokens(pieces),
  }
  fns = {}
  for method in FLAGS.methods:
    for name, digit_ids in ids.items():

      def loss(z, labels, digit_ids=digit_ids, method=method):
        return ntil_jax.numeric_token_loss(
            z, labels, method=method, digit_token_ids=digit_ids
        ).mean()

      fns[f"{method}, {name}"] = jax.jit(jax.value_and_grad(loss))
  return fns


def main(argv):
  del argv
  pieces = vocabulary(FLAGS.vocab)
  rng = np.random.default_rng(0)
  first_number = FLAGS.vocab - 1110
  labels = rng.integers(0, first_number, (1, FLAGS.tokens)).astype(np.int32)
  labels[:, ::3] = rng.integers(first_number, FLAGS.vocab, labels[:, ::3].shape)
  logits = jnp.asarray(rng.standard_normal((1, FLAGS.tokens, FLAGS.vocab)))
  logits = logits.astype(jnp.float32)
  labels = jnp.asarray(labels)
  fns = programs(pieces)
  compiled = {}
  for name, fn in fns.items():
    jax.clear_caches()
    start = time.perf_counter()
    compiled[name] = fn.lower(logits, labels).compile()
    compiled[name] = (compiled[name], time.perf_counter() - start)
  seconds = run.interleaved_seconds(
      {n: c for n, (c, _) in compiled.items()},
      (logits, labels),
      FLAGS.blocks,
      FLAGS.per_block,
  )
  print(
      f"{jax.devices()[0].device_kind}, [1, {FLAGS.tokens}, {FLAGS.vocab}] "
      f"float32 logits, median over {FLAGS.blocks} blocks"
  )
  for method in FLAGS.methods:
    rows = {}
    for name in ("digit ids", "number tokens"):
      program, compile_seconds = compiled[f"{method}, {name}"]
      rows[name] = (
          1000 * seconds[f"{method}, {name}"][0],
          compile_seconds,
          compile_benchmark.instructions(program),
      )
      run_ms, compile_s, size = rows[name]
      print(
          f"{method:5s} {name:13s} {run_ms:8.1f} ms, compiled in "
          f"{compile_s:.2f} s, {size} instructions"
      )
    (a, b, c), (x, y, z) = rows["digit ids"], rows["number tokens"]
    print(
        f"{method:5s} number tokens / digit ids: {x / a:.2f}x time, "
        f"{y / b:.2f}x compile, {z / c:.2f}x instructions"
    )


if __name__ == "__main__":
  app.run(main)
