r"""How many of a snapshot's weights a bfloat16 parameter cannot update.

    python -m benchmarks.bf16_updates --snapshot=PATH [--learning_rates=...]

An AdamW step moves a weight by about the learning rate. A bfloat16 weight
keeps 8 significant bits, so ``w + lr`` rounds back to ``w`` wherever ``lr``
is below half the spacing of bfloat16 numbers at ``w``. For each learning
rate this prints the share of the snapshot's parameters (every element of
every floating tensor the model loads, the tied embedding once) for which
``bfloat16(bfloat16(w) + lr) == bfloat16(w)``, the sum taken in float32: the
weights that `--config.param_dtype=bfloat16` would leave untrained. The
trainer's default (float32 parameters under bfloat16 computation) has no
such loss. The figure in docs/llm.md for SmolLM2-135M-Instruct is this command on
the converted snapshot (``make experiments-llm`` writes it).
"""

import json

from absl import app
from absl import flags
import jax
import ml_dtypes
import numpy as np

FLAGS = flags.FLAGS


def define_flags():
  """The command's flags, defined when it runs (the functions below are
  imported beside other benchmarks, whose ``--out`` this would clash with)."""
  flags.DEFINE_string("snapshot", None, "A local Hugging Face snapshot.")
  flags.DEFINE_list("learning_rates", ["1e-5", "1e-4", "1e-3"], "Added values.")
  flags.DEFINE_string("out", None, "Optional JSON file for the shares.")


def unchanged_count(weights, learning_rate: float) -> int:
  """Elements of ``weights`` that a bfloat16 store leaves unchanged when
  ``learning_rate`` is added in float32."""
  stored = np.asarray(weights, np.float32).astype(ml_dtypes.bfloat16)
  updated = (stored.astype(np.float32) + np.float32(learning_rate)).astype(
      ml_dtypes.bfloat16
  )
  return int(np.count_nonzero(updated == stored))


def _is_floating(dtype) -> bool:
  return np.issubdtype(dtype, np.floating) or dtype == ml_dtypes.bfloat16


def unchanged_shares(arrays, learning_rates) -> dict:
  """{learning rate: share of all elements of ``arrays`` left unchanged}."""
  arrays = [a for a in map(np.asarray, arrays) if _is_floating(a.dtype)]
  total = sum(int(np.size(a)) for a in arrays)
  if not total:
    raise ValueError("no floating-point weights to measure.")
  return {
      float(lr): sum(unchanged_count(a, float(lr)) for a in arrays) / total
      for lr in learning_rates
  }


def snapshot_weights(path: str) -> list:
  """The parameters of a snapshot as the trainer loads them (float32)."""
  from flax import nnx  # pylint: disable=g-import-not-at-top
  from train import pretrained  # pylint: disable=g-import-not-at-top

  lm = pretrained.load(path, dtype="float32")
  return [
      np.asarray(x) for x in jax.tree.leaves(nnx.state(lm.model, nnx.Param))
  ]


def main(argv):
  del argv
  if not FLAGS.snapshot:
    raise app.UsageError("--snapshot is required.")
  weights = snapshot_weights(FLAGS.snapshot)
  count = sum(int(np.size(w)) for w in weights)
  shares = unchanged_shares(weights, [float(x) for x in FLAGS.learning_rates])
  print(f"{FLAGS.snapshot}: {count:,} parameters")
  for lr, share in shares.items():
    print(f"+{lr:g}: {100 * share:.1f}% unchanged in bfloat16")
  if FLAGS.out:
    with open(FLAGS.out, "w") as f:
      json.dump(
          dict(
              snapshot=FLAGS.snapshot,
              parameters=count,
              unchanged={f"{lr:g}": s for lr, s in shares.items()},
          ),
          f,
          indent=1,
      )


if __name__ == "__main__":
  define_flags()
  app.run(main)
