r"""Time and memory of the numeric losses, as ratios to optax cross-entropy.

    python -m benchmarks.run --out=benchmarks/results.json

Two families, each measured in one run on one device:

* **logits path**: value+grad w.r.t. ``[B, T, V]`` logits of optax CE alone
  (the reference) and of ``CE + 0.3 * loss`` for each numeric loss;
* **from hidden states**: value+grad w.r.t. hidden ``[B, T, D]`` and the
  unembedding ``[D, V]`` of CE + 0.3 * NTIL through the logits (``h @ W``
  then the loss) and through ``ntil_jax.fused_numeric_loss``.

Times are medians over interleaved repeats (each function once per round, in
turn, so drifts in machine load hit all alike). Memory is XLA's plan for the
compiled function (``memory_analysis()``: temp + output bytes), which does not
depend on load. Ratios are to the first row of each family.
"""

import json
import platform
import statistics
import time

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np
import optax

import ntil_jax

FLAGS = flags.FLAGS
flags.DEFINE_string("out", "benchmarks/results.json", "Where to write JSON.")
flags.DEFINE_integer("repeats", 7, "Interleaved rounds per size.")
flags.DEFINE_list(
    "sizes",
    None,
    "N:V pairs, e.g. 2048:32768,8192:151936. Default: the full "
    "grid on an accelerator, a CPU-sized subset on CPU.",
)
flags.DEFINE_integer("seq_len", 512, "T; N tokens are laid out as [N/T, T].")
flags.DEFINE_integer("hidden_dim", 256, "D for the from-hidden family.")
flags.DEFINE_integer(
    "chunk_size",
    None,
    "Fused path: tokens per chunk "
    "(default: ntil_jax.fused.default_chunk_size(V)).",
)
flags.DEFINE_float(
    "digit_fraction",
    0.3,
    "Fraction of label positions that are digits of numbers.",
)
flags.DEFINE_float(
    "memory_budget_gib",
    0.0,
    "Budget for the largest-batch estimate (default: the "
    "device's memory, or 16 GiB on CPU).",
)

FULL_GRID = ((2048, 32768), (8192, 32768), (2048, 151936), (8192, 151936))
# N=8192 x V=151936 needs ~15 GB of logits+grad in float32: too much for the
# 2-core, 24 GiB CPU machines this project runs on.
CPU_GRID = ((2048, 32768), (8192, 32768), (2048, 151936))
LAM = 0.3


def text_with_numbers(seed, batch, length, vocab, digit_fraction):
  """Labels where about ``digit_fraction`` of positions are digits.

  Numbers are runs of 1-8 digits separated by Poisson-length text gaps.
  """
  rng = np.random.default_rng(seed)
  labels = rng.integers(10, vocab, (batch, length))
  if digit_fraction > 0:
    mean_gap = 4.5 * (1.0 - digit_fraction) / digit_fraction
    for b in range(batch):
      t = int(rng.poisson(mean_gap))
      while t < length:
        run = int(rng.integers(1, 9))
        labels[b, t : t + run] = rng.integers(
            0, 10, len(labels[b, t : t + run])
        )
        t += run + int(rng.poisson(mean_gap))
  labels = labels.astype(np.int32)
  return labels, labels < 10


def logits_family(labels, digit_mask):
  ce = lambda z: optax.softmax_cross_entropy_with_integer_labels(z, labels)
  family = {"optax CE": lambda z: ce(z).mean()}
  for name, fn in (
      ("CE + 0.3 NTIL", ntil_jax.ntil_loss),
      ("CE + 0.3 EMD", ntil_jax.emd_loss),
      ("CE + 0.3 NTL-MSE", ntil_jax.ntl_mse_loss),
      ("CE + 0.3 soft-label CE", ntil_jax.soft_label_cross_entropy),
  ):
    family[name] = lambda z, fn=fn: (
        ce(z) + LAM * fn(z, labels, digit_mask)
    ).mean()
  return {name: jax.jit(jax.value_and_grad(fn)) for name, fn in family.items()}


def hidden_family(labels, digit_mask, chunk_size):
  def through_logits(h, w):
    logits = jnp.einsum("btd,dv->btv", h, w)
    return ntil_jax.numeric_token_loss(
        logits, labels, digit_mask=digit_mask, lam=LAM
    ).mean()

  def fused(h, w):
    return ntil_jax.fused_numeric_loss(
        h, w, labels, digit_mask, lam=LAM, chunk_size=chunk_size
    ).mean()

  grad = lambda f: jax.jit(jax.value_and_grad(f, argnums=(0, 1)))
  return {
      "CE+NTIL via logits": grad(through_logits),
      "CE+NTIL fused": grad(fused),
  }


def planned_bytes(fn, *args):
  stats = fn.lower(*args).compile().memory_analysis()
  return int(stats.temp_size_in_bytes + stats.output_size_in_bytes)


def interleaved_median_seconds(fns, args, repeats):
  for fn in fns.values():  # compile and warm up
    jax.block_until_ready(fn(*args))
  samples = {name: [] for name in fns}
  for _ in range(repeats):
    for name, fn in fns.items():
      start = time.perf_counter()
      jax.block_until_ready(fn(*args))
      samples[name].append(time.perf_counter() - start)
  return {name: statistics.median(s) for name, s in samples.items()}


def measure(fns, args, repeats):
  seconds = interleaved_median_seconds(fns, args, repeats)
  memory = {name: planned_bytes(fn, *args) for name, fn in fns.items()}
  reference = next(iter(fns))
  return [
      dict(
          name=name,
          seconds=seconds[name],
          bytes=memory[name],
          time_ratio=seconds[name] / seconds[reference],
          memory_ratio=memory[name] / memory[reference],
      )
      for name in fns
  ]


def memory_budget_bytes():
  if FLAGS.memory_budget_gib > 0:
    return FLAGS.memory_budget_gib * 2**30
  stats = jax.devices()[0].memory_stats() or {}
  return stats.get("bytes_limit", 16 * 2**30)


def largest_tokens(rows, tokens, budget):
  """Tokens that fit in the budget, from the plan (linear in N, so scaled)."""
  return {row["name"]: int(budget / row["bytes"] * tokens) for row in rows}


def main(argv):
  del argv
  device = jax.devices()[0]
  on_cpu = device.platform == "cpu"
  grid = (
      tuple(tuple(int(x) for x in s.split(":")) for s in FLAGS.sizes)
      if FLAGS.sizes
      else (CPU_GRID if on_cpu else FULL_GRID)
  )
  results = dict(
      device=f"{device.platform}: {device.device_kind}",
      host=platform.node(),
      jax=jax.__version__,
      repeats=FLAGS.repeats,
      seq_len=FLAGS.seq_len,
      hidden_dim=FLAGS.hidden_dim,
      chunk_size=FLAGS.chunk_size,
      digit_fraction=FLAGS.digit_fraction,
      skipped=([f"{n}:{v}" for n, v in FULL_GRID if (n, v) not in grid]),
      runs=[],
  )
  budget = memory_budget_bytes()
  print(
      f"device: {results['device']}; median of {FLAGS.repeats} interleaved "
      f"runs; memory = XLA plan (temp + output); "
      f"{100 * FLAGS.digit_fraction:.0f}% digit labels"
  )
  for tokens, vocab in grid:
    batch = max(1, tokens // FLAGS.seq_len)
    length = tokens // batch
    labels, digit_mask = text_with_numbers(
        0, batch, length, vocab, FLAGS.digit_fraction
    )
    rng = np.random.default_rng(1)
    logits = jnp.asarray(
        rng.standard_normal((batch, length, vocab)), jnp.float32
    )
    logit_rows = measure(
        logits_family(labels, digit_mask), (logits,), FLAGS.repeats
    )
    del logits
    hidden = jnp.asarray(
        rng.standard_normal((batch, length, FLAGS.hidden_dim)), jnp.float32
    )
    unembedding = jnp.asarray(
        rng.standard_normal((FLAGS.hidden_dim, vocab)) / FLAGS.hidden_dim**0.5,
        jnp.float32,
    )
    hidden_rows = measure(
        hidden_family(labels, digit_mask, FLAGS.chunk_size),
        (hidden, unembedding),
        FLAGS.repeats,
    )
    run = dict(
        tokens=tokens,
        vocab=vocab,
        logits_path=logit_rows,
        from_hidden=hidden_rows,
        largest_tokens_in_budget=dict(
            budget_bytes=int(budget),
            **largest_tokens(hidden_rows, tokens, budget),
        ),
    )
    results["runs"].append(run)
    print(f"\nN={tokens} V={vocab}")
    print(f"  {'':28s} {'time':>9s} {'x CE':>6s} {'memory':>10s} {'x CE':>6s}")
    for rows in (logit_rows, hidden_rows):
      for row in rows:
        print(
            f"  {row['name']:28s} {row['seconds'] * 1e3:7.1f}ms "
            f"{row['time_ratio']:6.2f} {row['bytes'] / 2**20:8.1f}MB "
            f"{row['memory_ratio']:6.2f}"
        )
    fits = run["largest_tokens_in_budget"]
    print(
        f"  largest N in {budget / 2**30:.0f} GiB (from the plan): "
        f"via logits {fits['CE+NTIL via logits']}, fused "
        f"{fits['CE+NTIL fused']}"
    )
  if results["skipped"]:
    print(f"\nskipped on this device: {', '.join(results['skipped'])}")
  with open(FLAGS.out, "w") as f:
    json.dump(results, f, indent=1)
  print(f"wrote {FLAGS.out}")


if __name__ == "__main__":
  app.run(main)
