r"""The number logic's own cost: value+grad from TokenStatistics alone.

    python -m benchmarks.number_logic

``ntil_jax.loss_from_statistics`` for each method, differentiated w.r.t. the
statistics (``[N]``, ``[N]``, ``[N, 10]``), so no ``[N, V]`` array is
involved: what the numeric losses add on top of the vocabulary-wide work,
printed as a share of optax CE's value+grad on ``[N, V]`` logits timed
with them, taking its turn in every block (the estimator and its flags
``--blocks``/``--per_block`` of ``benchmarks.run``), with the number of ops of each optimized program (on a
GPU, kernel launches, whose latency a small op pays in full) and of optax
CE's.
"""

import functools

from absl import app
from absl import flags
import jax
import jax.numpy as jnp

import ntil_jax
from benchmarks import run

FLAGS = flags.FLAGS
flags.DEFINE_list("tokens", ["2048", "8192"], "N values.")
flags.DEFINE_integer("vocab", 32768, "V of the optax CE reference.")
METHODS = ("ce", "emd", "ntl_mse", "soft_label", "ntil")


def statistics_family():
  def from_statistics(method):
    def loss(stats, labels, mask):
      return ntil_jax.loss_from_statistics(
          stats,
          labels,
          vocab_size=FLAGS.vocab,
          digit_mask=mask,
          method=method,
          lam=run.LAM,
      ).mean()

    return jax.jit(jax.value_and_grad(loss))

  return {f"number logic {m}": from_statistics(m) for m in METHODS}


def compiled(fns, args):
  return {name: fn.lower(*args).compile() for name, fn in fns.items()}


def main(argv):
  del argv
  blocks, per_block = FLAGS.blocks, FLAGS.per_block
  print(
      "estimator: "
      f"{run.ESTIMATOR.format(blocks=blocks, per_block=per_block)}"
  )
  for tokens in (int(t) for t in FLAGS.tokens):
    batch = max(1, tokens // FLAGS.seq_len)
    length = tokens // batch
    labels, digit_mask = run.text_with_numbers(
        0, batch, length, FLAGS.vocab, FLAGS.digit_fraction
    )
    labels, digit_mask = jnp.asarray(labels), jnp.asarray(digit_mask)
    keys = jax.random.split(jax.random.key(2), 4)
    logits = jax.random.normal(keys[0], (batch, length, FLAGS.vocab))
    stats = ntil_jax.TokenStatistics(
        log_norm=jax.random.normal(keys[1], (batch, length)) + 10.0,
        label_logits=jax.random.normal(keys[2], (batch, length)),
        digit_logits=jax.random.normal(keys[3], (batch, length, 10)),
    )
    ce = {"optax CE": run.logits_family(core_only=True)["optax CE"]}
    ce = compiled(ce, (logits, labels, digit_mask))
    family = compiled(statistics_family(), (stats, labels, digit_mask))
    # optax CE takes its turn in every block with the number logic, as the
    # estimator says (its arguments bound: the two take different ones).
    bound = {"optax CE": functools.partial(ce["optax CE"], logits)}
    bound.update(
        {name: functools.partial(fn, stats) for name, fn in family.items()}
    )
    seconds = run.interleaved_seconds(
        bound, (labels, digit_mask), blocks, per_block
    )
    reference = seconds.pop("optax CE")[0]
    print(
        f"\nN={tokens}: optax CE on [N, {FLAGS.vocab}] logits "
        f"{reference * 1e3:.1f} ms, {run.launched_ops(ce['optax CE'])} ops"
    )
    for name, (estimate, _) in seconds.items():
      print(
          f"  {name:24s} {estimate * 1e3:7.2f} ms "
          f"{100 * estimate / reference:5.2f}% of optax CE, "
          f"{run.launched_ops(family[name])} ops"
      )


if __name__ == "__main__":
  app.run(main)
