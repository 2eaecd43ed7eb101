r"""What each loss costs to compile: seconds and optimized HLO instructions.

    python -m benchmarks.compile [--out=benchmarks/compile.json] [--hidden_dim=64]

For each method, value + gradient of the mean of ``numeric_token_loss``
(``[B, T, V]`` logits) and of ``fused_numeric_loss`` (``[B, T, D]`` hidden
states and a ``[D, V]`` unembedding) is lowered and compiled after
``jax.clear_caches()``, best of ``--repeats`` rounds (each compiles every
program once, so that a passing load meets them alike), with optax's
cross-entropy on the same logits (and ``hidden @ W`` then optax CE) compiled
in the same process as the reference; the best compile's phases are kept
(``phases_s``: tracing, lowering, XLA), and NTIL's XLA phase is set against
EMD's whole compile (``xla_vs_emd``). Counted in the optimized program
(``compiled.as_text()``): every instruction, fused computations included
(the program's size), the entry's ops (on a GPU, kernel launches) and its
fusions by kind (``kLoop``, ``kInput``, ``kCustom``, ...: what the backend
compiles as a kernel of its own). A third of the labels are digits, in
numbers of 1-8 digits.

What one kernel costs to compile on the backend (:func:`kernel_costs`) is
measured in the same process: the compile time of 21 barrier-separated
kernels of one kind less that of 1, per kernel, for an elementwise kernel
and for a row reduction (each kernel a different computation: a backend
compiles identical kernels once).
"""

import contextlib
import re
import time

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np
import optax

import ntil_jax
from benchmarks import run

FLAGS = flags.FLAGS
# --out and --hidden_dim are benchmarks.run's flags, with other defaults here.
OUT = "benchmarks/compile.json"
HIDDEN_DIM = 64
_OPCODE = re.compile(r" = (?:\([^)]*\)|\S+) ([\w-]+)\(")


def instructions(compiled) -> int:
  """Instructions of the optimized program, fused computations included.

  Those that compute nothing (parameters, constants, bitcasts, tuples; as
  :func:`benchmarks.run.launched_ops` leaves out) are not counted.
  """
  opcodes = (_OPCODE.search(line) for line in compiled.as_text().splitlines())
  return sum(m is not None and m.group(1) not in run.NO_OPS for m in opcodes)


_FUSION_KIND = re.compile(r" fusion\(.*kind=(k\w+)")


def fusion_kinds(compiled) -> dict:
  """``{kind: count}`` of the fusions in the optimized program: the entry's
  and those in the bodies and conditions of its loops (the fused path's
  chunk loop), each a kernel the backend compiles."""
  kinds = {}
  for m in _FUSION_KIND.finditer(compiled.as_text()):
    kinds[m.group(1)] = kinds.get(m.group(1), 0) + 1
  return dict(sorted(kinds.items()))


def _chain(count, kind):
  """``count`` kernels of ``kind``, each its own computation, in a row."""

  def f(x):
    for i in range(count):
      if kind == "reduction":
        x = x + jnp.sum(x * (1.0 + i), axis=-1, keepdims=True)
      else:
        x = x * 1.0001 + i
      x = jax.lax.optimization_barrier(x)
    return x

  return f


def kernel_costs(repeats, shape=(2, 2048, 10), count=21):
  """Seconds of compile per kernel, elementwise and reduction, and kinds.

  ``(t(count kernels) - t(1 kernel)) / (count - 1)``, each the best of
  ``repeats`` compiles after clearing caches; the fusion kinds the
  backend made of the longer chain.
  """
  x = jnp.ones(shape, jnp.float32)
  out = {}
  for kind in ("elementwise", "reduction"):
    best = {}
    for n in (1, count):
      for _ in range(repeats):
        seconds, compiled = compile_seconds(_chain(n, kind), (x,))
        best[n] = min(best.get(n, float("inf")), seconds)
    out[kind] = {
        "seconds_per_kernel": (best[count] - best[1]) / (count - 1),
        "fusion_kinds": fusion_kinds(compiled),
    }
    print(
        f"one {kind} kernel: {out[kind]['seconds_per_kernel'] * 1e3:.1f} ms"
        f" of compile ({out[kind]['fusion_kinds']} in a chain of {count})",
        flush=True,
    )
  return out


def compile_phases(fn, args):
  """``({"trace_s", "lower_s", "xla_s"}, compiled)``: one compile of ``fn``
  after clearing caches, in its three phases (tracing in Python, lowering
  to StableHLO, XLA's compile)."""
  jax.clear_caches()
  start = time.perf_counter()
  traced = jax.jit(fn).trace(*args)
  traced_at = time.perf_counter()
  lowered = traced.lower()
  lowered_at = time.perf_counter()
  compiled = lowered.compile()
  phases = {
      "trace_s": traced_at - start,
      "lower_s": lowered_at - traced_at,
      "xla_s": time.perf_counter() - lowered_at,
  }
  return phases, compiled


def compile_seconds(fn, args):
  """``(seconds, compiled)``: one compile of ``fn`` after clearing caches."""
  phases, compiled = compile_phases(fn, args)
  return sum(phases.values()), compiled


def inputs(batch, length, vocab, dim):
  """Logits, hidden states, unembedding, labels and the two masks."""
  labels, digit_mask = run.text_with_numbers(0, batch, length, vocab, 1 / 3)
  rng = np.random.default_rng(1)
  logits = rng.standard_normal((batch, length, vocab), np.float32)
  hidden = rng.standard_normal((batch, length, dim), np.float32)
  unembedding = rng.standard_normal((dim, vocab), np.float32) / dim**0.5
  # A point after the second digit of every number of three or more.
  point = np.zeros_like(digit_mask)
  point[:, 2:] = digit_mask[:, :-2] & digit_mask[:, 1:-1] & digit_mask[:, 2:]
  point &= ~np.roll(point, 1, axis=1)
  return logits, hidden, unembedding, labels, digit_mask, point


def _loss_kwargs(method):
  name, _, extra = method.partition("+")
  return name, extra == "points"


def programs(methods):
  """``{row: (fn, which inputs)}``: value and gradient of each loss."""

  def optax_ce(logits, labels):
    return optax.softmax_cross_entropy_with_integer_labels(
        logits, labels
    ).mean()

  def hidden_ce(hidden, unembedding, labels):
    return optax_ce(hidden @ unembedding, labels)

  rows = {
      "optax CE": (jax.value_and_grad(optax_ce), "logits"),
      "hidden @ W + optax CE": (
          jax.value_and_grad(hidden_ce, argnums=(0, 1)),
          "hidden",
      ),
  }
  for method in methods:
    name, points = _loss_kwargs(method)

    def logits_loss(logits, labels, mask, point, name=name, points=points):
      return ntil_jax.numeric_token_loss(
          logits,
          labels,
          digit_mask=mask,
          decimal_point_mask=point if points else None,
          method=name,
          lam=run.LAM,
      ).mean()

    def fused_loss(
        hidden, unembedding, labels, mask, point, name=name, points=points
    ):
      return ntil_jax.fused_numeric_loss(
          hidden,
          unembedding,
          labels,
          mask,
          decimal_point_mask=point if points else None,
          method=name,
          lam=run.LAM,
      ).mean()

    rows[f"numeric_token_loss {method}"] = (
        jax.value_and_grad(logits_loss),
        "logits",
    )
    rows[f"fused_numeric_loss {method}"] = (
        jax.value_and_grad(fused_loss, argnums=(0, 1)),
        "hidden",
    )
  return rows


def measure(shape, methods, repeats, dim, hlo=None):
  """Each program's best compile time and size at ``shape``; with ``hlo``
  (an open text file), its optimized program appended there too."""
  batch, length, vocab = shape
  logits, hidden, unembedding, labels, mask, point = inputs(
      batch, length, vocab, dim
  )
  args = {
      "logits": (jnp.asarray(logits), labels),
      "hidden": (jnp.asarray(hidden), jnp.asarray(unembedding), labels),
  }
  rows = programs(methods)
  row_args = {
      row: args[kind] + (() if row.endswith("optax CE") else (mask, point))
      for row, (_, kind) in rows.items()
  }
  # One untimed compile of a program with the matmul first: XLA:GPU keeps
  # its autotuning results in the process past `jax.clear_caches`, so the
  # first program timed at a shape would pay for the rest (1 compile each
  # on a GPU: the device scripts' `--repeats=1`).
  row = next(r for r, (_, kind) in rows.items() if kind == "hidden")
  compile_seconds(rows[row][0], row_args[row])
  # In rounds, every program once a round: a load that comes and goes on a
  # shared machine meets the programs alike, and the best of each counts.
  best, phases, compiled = {}, {}, {}
  for _ in range(repeats):
    for row, (fn, _) in rows.items():
      times, compiled[row] = compile_phases(fn, row_args[row])
      seconds = sum(times.values())
      if seconds < best.get(row, float("inf")):
        best[row], phases[row] = seconds, times
  out = []
  for row in rows:
    size, ops = instructions(compiled[row]), run.launched_ops(compiled[row])
    kinds = fusion_kinds(compiled[row])
    out.append(
        {
            "row": row,
            "shape": list(shape),
            "compile_s": best[row],
            # The phases of that best compile.
            "phases_s": phases[row],
            "instructions": size,
            "entry_ops": ops,
            "fusion_kinds": kinds,
        }
    )
    if hlo is not None:
      hlo.write(f"# ===== {'x'.join(map(str, shape))} {row}\n")
      hlo.write(compiled[row].as_text() + "\n")
    print(
        f"{'x'.join(map(str, shape)):>12}  {row:<40} {best[row]:6.2f} s"
        f"  {size:6d} instr  {ops} entry ops  {kinds}",
        flush=True,
    )
  return out


def ratio_rows(records):
  """Each record's ratios to optax CE (logits) or hidden @ W + CE (fused)."""
  by_shape = {}
  for r in records:
    by_shape.setdefault(tuple(r["shape"]), {})[r["row"]] = r
  for rows in by_shape.values():
    for r in rows.values():
      ref = rows[
          "hidden @ W + optax CE"
          if r["row"].startswith(("fused", "hidden"))
          else "optax CE"
      ]
      r["time_vs_ce"] = r["compile_s"] / ref["compile_s"]
      r["instructions_vs_ce"] = r["instructions"] / ref["instructions"]
      emd_name = r["row"].rsplit(" ", 1)[0] + " emd"
      if emd_name in rows and r["row"] != emd_name:
        emd = rows[emd_name]
        r["time_vs_emd"] = r["compile_s"] / emd["compile_s"]
        if "phases_s" in r:  # XLA's part alone against EMD's whole compile
          r["xla_vs_emd"] = r["phases_s"]["xla_s"] / emd["compile_s"]
        r["instructions_vs_emd"] = r["instructions"] / emd["instructions"]
  return records


def define_flags():
  """This script's flags (defined when it runs, not when it is imported)."""
  flags.DEFINE_integer(
      "repeats",
      2,
      "Rounds of compiles (every program once a round); the "
      "best of each program counts.",
  )
  flags.DEFINE_list(
      "shapes",
      ["2x512x1024", "2x2048x1024", "1x8192x256"],
      "B x T x V of each case.",
  )
  flags.DEFINE_list(
      "methods",
      [
          "ce",
          "emd",
          "ntl_mse",
          "soft_label",
          "del",
          "smmd",
          "nl_ntl",
          "ntil",
          "ntil+points",
      ],
      "Methods of numeric_token_loss; '+points' adds a decimal_point_mask.",
  )
  flags.DEFINE_string(
      "hlo_out",
      None,
      "If set, every program's optimized HLO (`compiled.as_text()`) is "
      "written to this one text file, each after a '# =====' header.",
  )


def main(argv):
  del argv
  # Compiled, not loaded: a persistent cache (JAX_COMPILATION_CACHE_DIR)
  # would serve every program over its threshold from disk.
  jax.config.update("jax_enable_compilation_cache", False)
  shapes = [tuple(int(n) for n in s.split("x")) for s in FLAGS.shapes]
  out = FLAGS.out if FLAGS["out"].present else OUT
  dim = FLAGS.hidden_dim if FLAGS["hidden_dim"].present else HIDDEN_DIM
  records = []
  with contextlib.ExitStack() as stack:
    hlo = FLAGS.hlo_out and stack.enter_context(open(FLAGS.hlo_out, "w"))
    for shape in shapes:
      records += measure(shape, FLAGS.methods, FLAGS.repeats, dim, hlo or None)
  records = ratio_rows(records)
  for r in records:
    if "time_vs_emd" in r:
      print(
          f"{'x'.join(map(str, r['shape'])):>12}  {r['row']:<40} "
          f"vs emd: {r['time_vs_emd']:.2f}x time, "
          f"{r['instructions_vs_emd']:.2f}x instructions; XLA's compile "
          f"alone {r['xla_vs_emd']:.2f}x EMD's whole compile"
      )
  result = {
      "device": str(jax.devices()[0].device_kind),
      "backend": jax.default_backend(),
      "jax": jax.__version__,
      "hidden_dim": dim,
      "repeats": FLAGS.repeats,
      "records": records,
  }
  # Written before the kernel costs too: a run cut at its time limit (the
  # device scripts') keeps the programs' figures.
  run.write_json(out, result)
  result["kernel_costs"] = kernel_costs(FLAGS.repeats)
  run.write_json(out, result)


if __name__ == "__main__":
  define_flags()
  app.run(main)
