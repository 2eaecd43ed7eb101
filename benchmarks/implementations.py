r"""The fused path's implementations side by side, from hidden states.

    python -m benchmarks.implementations --out=benchmarks/implementations.json

In one process, on one device, for float32 and bfloat16 and two shapes (a
small one and Qwen2.5-1.5B's D=1536, V=151936), the value + gradient w.r.t.
the hidden states and the unembedding of:

* ``hidden @ W + optax CE``: XLA's matmul and CE alone, the reference every
  ratio is to;
* ``hidden @ W + numeric_token_loss ntil``: the logits path (CE + 0.3 NTIL);
* ``fused ntil, <implementation>``: ``ntil_jax.fused_numeric_loss`` (CE + 0.3
  NTIL) with each implementation of :mod:`ntil_jax.kernels` the backend
  offers: ``chunked`` (the project's own), ``tokamax:xla``,
  ``tokamax:chunked_xla`` (only where V is a multiple of 2048; tokamax 0.0.17
  gets other V wrong) and, on TPU, ``tokamax:mosaic_tpu``;
* ``tokamax CE alone, <name>``: tokamax's own CE for the backend's default
  tokamax implementation, to show what NTIL adds on top of the kernel.

Time: the median over ``--blocks`` blocks of each function's best of
``--per_block`` runs, functions taking turns in every block (the order
rotated by one per block). Memory: XLA's plan for the compiled function
(temp + output bytes). Rows that cannot run record why.
"""

import platform

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import optax

import ntil_jax
from benchmarks import run as bench
from ntil_jax.kernels import from_ce
from ntil_jax.kernels import tokamax_ce

FLAGS = flags.FLAGS
# --out, --blocks, --per_block, --calls_per_run, --seq_len and
# --digit_fraction are
# benchmarks.run's flags (imported with its helpers), with defaults for here.
FLAGS.set_default("out", "benchmarks/implementations.json")
FLAGS.set_default("blocks", 3)
FLAGS.set_default("per_block", 1)
FLAGS.set_default("seq_len", 256)
flags.DEFINE_list(
    "shapes",
    None,
    "N:D:V triples. Default: 2048:256:32768 and N:1536:151936 with N 256 on "
    "CPU and 8192 on an accelerator.",
)
flags.DEFINE_list("dtypes", ["float32", "bfloat16"], "dtypes to measure.")

LAM = 0.3
REFERENCE = "hidden @ W + optax CE"


def default_shapes(backend):
  qwen_tokens = 256 if backend == "cpu" else 8192
  return ((2048, 256, 32768), (qwen_tokens, 1536, 151936))


def implementations(backend, vocab):
  """``{name: implementation}`` the backend offers, and ``{name: why not}``."""
  names = ["chunked"]
  skipped = {}
  if tokamax_ce.available():
    names.append("tokamax:xla")
    if vocab % tokamax_ce.CHUNKED_XLA_VOCAB_MULTIPLE == 0:
      names.append("tokamax:chunked_xla")
    else:
      skipped["fused ntil, tokamax:chunked_xla"] = (
          f"V={vocab} is not a multiple of "
          f"{tokamax_ce.CHUNKED_XLA_VOCAB_MULTIPLE}: tokamax 0.0.17's "
          "chunked_xla counts its zero padding in the normaliser"
      )
    if backend == "tpu":
      names.append("tokamax:mosaic_tpu")
  else:
    skipped["fused ntil, tokamax"] = "tokamax is not installed"
  return names, skipped


def functions(backend, vocab):
  """Functions of (hidden, unembedding, labels, digit_mask), and skips."""

  def optax_ce(h, w, labels, mask):
    del mask
    logits = jnp.einsum("btd,dv->btv", h, w)
    return optax.softmax_cross_entropy_with_integer_labels(
        logits.astype(jnp.float32), labels
    ).mean()

  def through_logits(h, w, labels, mask):
    logits = jnp.einsum("btd,dv->btv", h, w)
    return ntil_jax.numeric_token_loss(
        logits, labels, digit_mask=mask, lam=LAM
    ).mean()

  def fused(implementation):
    return lambda h, w, labels, mask: ntil_jax.fused_numeric_loss(
        h, w, labels, mask, lam=LAM, implementation=implementation
    ).mean()

  family = {
      REFERENCE: optax_ce,
      "hidden @ W + numeric_token_loss ntil": through_logits,
  }
  names, skipped = implementations(backend, vocab)
  for name in names:
    family[f"fused ntil, {name}"] = fused(name)
  if tokamax_ce.available():
    ce_fn = tokamax_ce.per_token_ce()

    def tokamax_alone(h, w, labels, mask):
      del mask
      # Its gradients in the inputs' dtype, as every other row's (tokamax
      # 0.0.17 returns float32 ones for bfloat16 inputs).
      ce = from_ce._grads_in_dtype(ce_fn, h.dtype)  # pylint: disable=protected-access
      return ce(h.reshape(-1, h.shape[-1]), labels.reshape(-1), w).mean()

    family["tokamax CE alone, tokamax's default"] = tokamax_alone
  grad = lambda f: jax.jit(jax.value_and_grad(f, argnums=(0, 1)))
  return {name: grad(f) for name, f in family.items()}, skipped


def main(argv):
  del argv
  device = jax.devices()[0]
  backend = jax.default_backend()
  shapes = (
      tuple(tuple(int(x) for x in s.split(":")) for s in FLAGS.shapes)
      if FLAGS.shapes
      else default_shapes(backend)
  )
  results = dict(
      device=f"{device.platform}: {device.device_kind}",
      backend=backend,
      host=platform.node(),
      jax=jax.__version__,
      tokamax=_tokamax_version(),
      estimator=bench.estimator(
          FLAGS.blocks, FLAGS.per_block, FLAGS.calls_per_run
      ),
      digit_fraction=FLAGS.digit_fraction,
      runs=[],
  )
  print(
      f"device: {results['device']}, jax {jax.__version__}, tokamax "
      f"{results['tokamax']}; time: {results['estimator']}",
      flush=True,
  )
  for dtype_name in FLAGS.dtypes:
    dtype = jnp.dtype(dtype_name)
    for tokens, dim, vocab in shapes:
      batch = max(1, tokens // FLAGS.seq_len)
      length = tokens // batch
      labels, digit_mask = bench.text_with_numbers(
          0, batch, length, vocab, FLAGS.digit_fraction
      )
      key_hidden, key_w = jax.random.split(jax.random.key(1))
      hidden = jax.random.normal(key_hidden, (batch, length, dim), dtype)
      unembedding = jax.random.normal(key_w, (dim, vocab), jnp.float32)
      unembedding = (unembedding / dim**0.5).astype(dtype)
      fns, skipped = functions(backend, vocab)
      rows = bench.measure(
          fns,
          (hidden, unembedding, jnp.asarray(labels), jnp.asarray(digit_mask)),
          FLAGS.blocks,
          FLAGS.per_block,
          FLAGS.calls_per_run,
      )
      del hidden, unembedding
      run = dict(
          dtype=dtype_name,
          tokens=batch * length,
          hidden_dim=dim,
          vocab=vocab,
          rows=rows,
          skipped=skipped,
      )
      results["runs"].append(run)
      bench.write_results(results, FLAGS.out, complete=False)
      print(f"\n{dtype_name} N={batch * length} D={dim} V={vocab}")
      bench.print_rows(rows)
      for name, why in skipped.items():
        print(f"  {name}: not run ({why})")
  bench.write_results(results, FLAGS.out, complete=True)
  print(f"wrote {FLAGS.out}")


def _tokamax_version():
  if not tokamax_ce.available():
    return None
  import tokamax  # pylint: disable=g-import-not-at-top

  return getattr(tokamax, "__version__", "unknown")


if __name__ == "__main__":
  app.run(main)
