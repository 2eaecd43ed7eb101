r"""Time and memory of the numeric losses, as ratios to optax cross-entropy.

    python -m benchmarks.run --out=benchmarks/results.json

Two families, each measured in one process on one device:

* **logits path**: value+grad w.r.t. ``[B, T, V]`` logits of optax CE alone
  (the reference), of ``ntil_jax.numeric_token_loss`` (``CE + 0.3 * loss``,
  the function a train step calls) for each method, and of optax CE plus
  ``0.3 * ntil_loss`` added by hand;
* **from hidden states**: value+grad w.r.t. hidden ``[B, T, D]`` and the
  unembedding ``[D, V]`` of ``hidden @ W`` followed by optax CE (the
  reference), of ``hidden @ W`` followed by ``numeric_token_loss`` and of
  ``ntil_jax.fused_numeric_loss``, which never holds the ``[B, T, V]``
  logits.

Logits, hidden states and the unembedding are in ``--dtype`` (float32 or
bfloat16; the losses compute in float32 whatever it is). Labels and masks
are arguments of the compiled functions (as in training), not constants XLA
could fold. Time estimator: the median over ``--blocks``
blocks of each function's minimum over ``--per_block`` consecutive runs
(``--hidden_blocks`` and ``--hidden_per_block`` for the second family; a
run is ``--calls_per_run`` calls dispatched back to back, its time divided
by them, which on a GPU keeps the host's latency out of figures under a
millisecond), the
functions taking turns within every block (the order rotated by one per
block), so drifts in machine load hit all alike and a busy moment costs one
block, not the estimate. Memory is XLA's plan for the compiled function
(``memory_analysis()``: temp + output bytes), which does not depend on load;
so do XLA's count of the bytes the compiled function reads and writes
(``cost_analysis()``, recorded as ``bytes_accessed``) and the number of ops
(kernels, on a GPU) of the optimized program (``ops``), both for programs
without a loop (XLA counts a loop's body once; the fused path gets none).
Ratios are to the first row of each family. Beyond ``--full_max_elements``
logits only the core rows are timed. The largest N a memory budget holds is
``benchmarks.largest_batch``'s.
"""

import json
import platform
import re
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
flags.DEFINE_integer(
    "blocks", 7, "Logits path: blocks per size (the median is taken)."
)
flags.DEFINE_integer(
    "per_block",
    3,
    "Logits path: runs of each function per block (the minimum is taken).",
)
flags.DEFINE_integer(
    "calls_per_run",
    1,
    "Calls dispatched back to back in each timed run, its time divided by "
    "them: above 1 an accelerator's queue stays full, so the host's "
    "dispatch and synchronization stay out of sub-millisecond figures.",
)
flags.DEFINE_integer("hidden_blocks", 5, "From hidden states: blocks.")
flags.DEFINE_integer(
    "hidden_per_block", 1, "From hidden states: runs per block."
)
flags.DEFINE_list(
    "sizes",
    None,
    "N:V pairs, e.g. 2048:32768,8192:151936. Default: the full grid.",
)
flags.DEFINE_integer("seq_len", 512, "T; N tokens are laid out as [N/T, T].")
flags.DEFINE_integer("hidden_dim", 256, "D for the from-hidden family.")
flags.DEFINE_enum(
    "dtype",
    "float32",
    ["float32", "bfloat16"],
    "dtype of the logits, hidden states and unembedding.",
)
flags.DEFINE_integer(
    "chunk_size",
    None,
    "Fused path: tokens per chunk "
    "(default: ntil_jax.default_chunk_size for the backend).",
)
flags.DEFINE_float(
    "digit_fraction",
    0.3,
    "Fraction of label positions that are digits of numbers.",
)
flags.DEFINE_integer(
    "full_max_elements",
    2**30,
    "Beyond this N * V, time only optax CE and numeric_token_loss (ce, "
    "ntil) on the logits path, and not the from-hidden family (on CPU a "
    "run of those takes seconds to tens of seconds there).",
)

FULL_GRID = ((2048, 32768), (8192, 32768), (2048, 151936), (8192, 151936))
LAM = 0.3
ESTIMATOR = (
    "median over {blocks} blocks of the per-block minimum of {per_block} "
    "consecutive runs; in every block each function runs in turn, the "
    "order rotated by one per block"
)
PIPELINED = (
    "; a run is {calls} calls dispatched back to back, its time / {calls}"
)


def estimator(blocks, per_block, calls_per_run=1):
  """The time estimator's description, as results JSON records it."""
  text = ESTIMATOR.format(blocks=blocks, per_block=per_block)
  return text + (
      PIPELINED.format(calls=calls_per_run) if calls_per_run > 1 else ""
  )


# Rows timed at every size; the others only up to --full_max_elements.
CORE_ROWS = ("optax CE", "numeric_token_loss ce", "numeric_token_loss ntil")
# The acceptance targets of numeric_token_loss(method="ntil") against optax
# CE on the logits path (issue 12).
TARGET_ROW = "numeric_token_loss ntil"
TIME_TARGET = 1.03
MEMORY_TARGET = 1.01


def text_with_numbers(seed, batch, length, vocab, digit_fraction):
  """Labels where about ``digit_fraction`` of positions are digits.

  Numbers are runs of 1-8 digits separated by Poisson-length text gaps of
  mean ``4.5 (1 - f) / f``: at ``f = 0.9`` 61% of the gaps are empty, and
  runs join into numbers of dozens of digits.
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


def _optax_ce(logits, labels):
  return optax.softmax_cross_entropy_with_integer_labels(logits, labels)


def logits_family(core_only=False):
  """Functions of (logits, labels, digit_mask), each a mean over tokens."""

  def numeric(method, **kwargs):
    return lambda z, labels, mask: ntil_jax.numeric_token_loss(
        z, labels, digit_mask=mask, method=method, lam=LAM, **kwargs
    ).mean()

  family = {
      "optax CE": lambda z, labels, mask: _optax_ce(z, labels).mean(),
      "numeric_token_loss ce": numeric("ce"),
      TARGET_ROW: numeric("ntil"),
      "numeric_token_loss ntil, reference weighting": numeric(
          "ntil", weighting="reference"
      ),
      "numeric_token_loss emd": numeric("emd"),
      "numeric_token_loss ntl_mse": numeric("ntl_mse"),
      "numeric_token_loss soft_label": numeric("soft_label"),
      "numeric_token_loss del": numeric("del"),
      "numeric_token_loss smmd": numeric("smmd"),
      "numeric_token_loss nl_ntl": numeric("nl_ntl"),
      "optax CE + 0.3 ntil_loss by hand": lambda z, labels, mask: (
          _optax_ce(z, labels) + LAM * ntil_jax.ntil_loss(z, labels, mask)
      ).mean(),
      # The same value; what the two-call form costs beyond CE with the NTIL
      # term's [..., V] gradient (zero outside the digit columns) left out.
      "optax CE + 0.3 ntil_loss by hand, its gradient stopped": (
          lambda z, labels, mask: (
              _optax_ce(z, labels)
              + LAM * jax.lax.stop_gradient(ntil_jax.ntil_loss(z, labels, mask))
          ).mean()
      ),
  }
  return {
      name: jax.jit(jax.value_and_grad(f))
      for name, f in family.items()
      if name in CORE_ROWS or not core_only
  }


def hidden_family(chunk_size):
  """Functions of (hidden, unembedding, labels, digit_mask)."""

  def optax_ce(h, w, labels, mask):
    del mask
    return _optax_ce(jnp.einsum("btd,dv->btv", h, w), labels).mean()

  def through_logits(h, w, labels, mask):
    logits = jnp.einsum("btd,dv->btv", h, w)
    return ntil_jax.numeric_token_loss(
        logits, labels, digit_mask=mask, lam=LAM
    ).mean()

  def fused(h, w, labels, mask):
    return ntil_jax.fused_numeric_loss(
        h, w, labels, mask, lam=LAM, chunk_size=chunk_size
    ).mean()

  grad = lambda f: jax.jit(jax.value_and_grad(f, argnums=(0, 1)))
  return {
      "hidden @ W + optax CE": grad(optax_ce),
      "hidden @ W + numeric_token_loss ntil": grad(through_logits),
      "fused_numeric_loss ntil": grad(fused),
  }


def planned_bytes(compiled):
  stats = compiled.memory_analysis()
  return int(stats.temp_size_in_bytes + stats.output_size_in_bytes)


# Instructions that launch nothing: they name, bundle or reinterpret buffers.
NO_OPS = ("parameter", "constant", "tuple", "get-tuple-element", "bitcast")


def launched_ops(compiled):
  """Ops of the optimized program's entry (fusions, dots, scatters, ...).

  Each is one kernel launch on a GPU, whose latency matters for the small
  ``[N]`` and ``[N, 10]`` ops of the number logic. None for a program with a
  loop (its body's ops run once per trip).
  """
  text = compiled.as_text()
  if "while(" in text:
    return None
  entry = text[text.index("\nENTRY ") :].split("\n}")[0].splitlines()[1:]
  pattern = re.compile(r" = (?:\([^)]*\)|\S+) ([\w-]+)\(")
  opcodes = [pattern.search(line) for line in entry]
  return sum(m is not None and m.group(1) not in NO_OPS for m in opcodes)


def accessed_bytes(compiled):
  """XLA's count of bytes read and written; None for a program with a loop.

  ``cost_analysis()`` counts a while loop's body once, not once per trip.
  """
  if "while(" in compiled.as_text():
    return None
  analysis = compiled.cost_analysis()
  if isinstance(analysis, (list, tuple)):  # older jax: one dict per program
    analysis = analysis[0]
  accessed = (analysis or {}).get("bytes accessed")
  return None if accessed is None else int(accessed)


def interleaved_seconds(fns, args, blocks, per_block, calls_per_run=1):
  """Per function: (estimate, per-block minima); see `estimator`."""
  for fn in fns.values():  # warm up
    jax.block_until_ready(fn(*args))
  minima = {name: [] for name in fns}
  names = list(fns)
  for block in range(blocks):
    # Each block starts one function later, so none always runs first.
    shift = block % len(names)
    for name in names[shift:] + names[:shift]:
      fn = fns[name]
      best = float("inf")
      for _ in range(per_block):
        start = time.perf_counter()
        outs = [fn(*args) for _ in range(calls_per_run)]
        jax.block_until_ready(outs)
        best = min(best, (time.perf_counter() - start) / calls_per_run)
      minima[name].append(best)
  return {name: (statistics.median(m), m) for name, m in minima.items()}


def measure(fns, args, blocks, per_block, calls_per_run=1):
  fns = {name: fn.lower(*args).compile() for name, fn in fns.items()}
  memory = {name: planned_bytes(fn) for name, fn in fns.items()}
  accessed = {name: accessed_bytes(fn) for name, fn in fns.items()}
  ops = {name: launched_ops(fn) for name, fn in fns.items()}
  seconds = interleaved_seconds(fns, args, blocks, per_block, calls_per_run)
  reference = next(iter(fns))
  reference_accessed = accessed[reference]
  return [
      dict(
          name=name,
          seconds=seconds[name][0],
          block_minima=[round(s, 6) for s in seconds[name][1]],
          bytes=memory[name],
          time_ratio=seconds[name][0] / seconds[reference][0],
          memory_ratio=memory[name] / memory[reference],
          bytes_accessed=accessed[name],
          ops=ops[name],
          bytes_accessed_ratio=(
              None
              if accessed[name] is None or not reference_accessed
              else accessed[name] / reference_accessed
          ),
      )
      for name in fns
  ]


def available_host_bytes():
  """MemAvailable of /proc/meminfo (None where there is none)."""
  try:
    with open("/proc/meminfo") as f:
      for line in f:
        if line.startswith("MemAvailable:"):
          return int(line.split()[1]) * 1024
  except OSError:
    pass
  return None


def target_check(rows):
  row = next(r for r in rows if r["name"] == TARGET_ROW)
  return dict(
      time_ratio=row["time_ratio"],
      memory_ratio=row["memory_ratio"],
      time_target=TIME_TARGET,
      memory_target=MEMORY_TARGET,
      met=bool(
          row["time_ratio"] <= TIME_TARGET
          and row["memory_ratio"] <= MEMORY_TARGET
      ),
  )


def print_rows(rows):
  for row in rows:
    accessed = row["bytes_accessed_ratio"]
    accessed = "-" if accessed is None else f"{accessed:.3f}"
    ops = "-" if row["ops"] is None else row["ops"]
    print(
        f"  {row['name']:46s} {row['seconds'] * 1e3:8.1f}ms "
        f"{row['time_ratio']:6.3f} {row['bytes'] / 2**20:9.1f}MiB "
        f"{row['memory_ratio']:6.3f} {accessed:>8s} {ops:>5}",
        flush=True,
    )


def write_json(path, result):
  """Writes ``result`` to ``path`` as indented JSON, and says so."""
  with open(path, "w") as f:
    json.dump(result, f, indent=1)
  print(f"wrote {path}")


def write_results(results, path, complete):
  """Writes ``results`` as JSON; ``complete`` False after each size, so a
  run cut at its time limit keeps the sizes it finished."""
  results["complete"] = complete
  with open(path, "w") as f:
    json.dump(results, f, indent=1)


def main(argv):
  del argv
  device = jax.devices()[0]
  on_cpu = device.platform == "cpu"
  dtype = jnp.dtype(FLAGS.dtype)
  grid = (
      tuple(tuple(int(x) for x in s.split(":")) for s in FLAGS.sizes)
      if FLAGS.sizes
      else FULL_GRID
  )
  estimators = dict(
      logits_path=estimator(FLAGS.blocks, FLAGS.per_block, FLAGS.calls_per_run),
      from_hidden=estimator(
          FLAGS.hidden_blocks, FLAGS.hidden_per_block, FLAGS.calls_per_run
      ),
  )
  results = dict(
      device=f"{device.platform}: {device.device_kind}",
      backend=jax.default_backend(),
      device_kind=device.device_kind,
      host=platform.node(),
      jax=jax.__version__,
      date=time.strftime("%Y-%m-%d"),
      dtype=FLAGS.dtype,
      estimators=estimators,
      seq_len=FLAGS.seq_len,
      hidden_dim=FLAGS.hidden_dim,
      chunk_size=FLAGS.chunk_size,
      default_chunk_sizes={},
      digit_fraction=FLAGS.digit_fraction,
      full_max_elements=FLAGS.full_max_elements,
      skipped=[],
      runs=[],
  )
  print(
      f"device: {results['device']}, jax {jax.__version__}, {FLAGS.dtype}; "
      f"time: {estimators['logits_path']} "
      f"(from hidden states: {FLAGS.hidden_blocks} blocks of "
      f"{FLAGS.hidden_per_block}); memory: XLA plan (temp + output); "
      f"{100 * FLAGS.digit_fraction:.0f}% digit labels",
      flush=True,
  )
  for tokens, vocab in grid:
    batch = max(1, tokens // FLAGS.seq_len)
    length = tokens // batch
    tokens = batch * length  # what is measured (N - N % batch of --sizes)
    # Logits, their gradient and the random bits that make them.
    needed = tokens * vocab * (4 + 2 * dtype.itemsize) + 2**31
    available = available_host_bytes() if on_cpu else None
    if available is not None and available < needed:
      print(
          f"\nN={tokens} V={vocab}: skipped, needs ~{needed / 2**30:.0f} GiB"
          f" of host memory, {available / 2**30:.0f} GiB available"
      )
      results["skipped"].append(f"{tokens}:{vocab}")
      continue
    full = tokens * vocab <= FLAGS.full_max_elements
    labels, digit_mask = text_with_numbers(
        0, batch, length, vocab, FLAGS.digit_fraction
    )
    labels, digit_mask = jnp.asarray(labels), jnp.asarray(digit_mask)
    key_logits, key_hidden, key_w = jax.random.split(jax.random.key(1), 3)
    logits = jax.random.normal(key_logits, (batch, length, vocab), dtype)
    logit_rows = measure(
        logits_family(core_only=not full),
        (logits, labels, digit_mask),
        FLAGS.blocks,
        FLAGS.per_block,
        FLAGS.calls_per_run,
    )
    del logits
    run = dict(
        tokens=tokens,
        vocab=vocab,
        logits_path=logit_rows,
        target=target_check(logit_rows),
    )
    print(f"\nN={tokens} V={vocab}")
    print(
        f"  {'value + grad of':46s} {'time':>10s} {'x ref':>6s} "
        f"{'memory':>12s} {'x ref':>6s} {'bytes x':>8s} {'ops':>5s}"
    )
    print_rows(logit_rows)
    target = run["target"]
    print(
        f"  target {TARGET_ROW} <= {TIME_TARGET}x time, <= {MEMORY_TARGET}x "
        f"memory: {target['time_ratio']:.3f}x / "
        f"{target['memory_ratio']:.3f}x, "
        f"{'met' if target['met'] else 'NOT met'}",
        flush=True,
    )
    if full:
      dim = FLAGS.hidden_dim
      hidden = jax.random.normal(key_hidden, (batch, length, dim), dtype)
      unembedding = jax.random.normal(key_w, (dim, vocab), jnp.float32)
      unembedding = (unembedding / dim**0.5).astype(dtype)
      results["default_chunk_sizes"][f"{tokens}:{vocab}"] = (
          ntil_jax.default_chunk_size(vocab, num_tokens=tokens)
      )
      hidden_args = (hidden, unembedding, labels, digit_mask)
      hidden_rows = measure(
          hidden_family(FLAGS.chunk_size),
          hidden_args,
          FLAGS.hidden_blocks,
          FLAGS.hidden_per_block,
          FLAGS.calls_per_run,
      )
      run["from_hidden"] = hidden_rows
      print_rows(hidden_rows)
      del hidden, unembedding, hidden_args
    else:
      print(
          f"  (N * V > {FLAGS.full_max_elements}: core rows only, from-hidden"
          " family not measured)"
      )
    results["runs"].append(run)
    write_results(results, FLAGS.out, complete=False)
  if results["skipped"]:
    print(f"\nskipped: {', '.join(results['skipped'])}")
  write_results(results, FLAGS.out, complete=True)
  print(f"wrote {FLAGS.out}")


if __name__ == "__main__":
  app.run(main)
