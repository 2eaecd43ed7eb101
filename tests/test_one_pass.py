"""The one-pass backward of token_statistics equals plain autodiff.

``ntil_jax.token_statistics`` has a custom VJP (one elementwise pass over the
logits plus an in-place scatter of the label's and digits' cotangents). Here
its gradients, and those of every loss built on it, are compared with JAX's
autodiff of straightforward formulations written in this file: the
statistics as ``where`` + ``logsumexp`` + ``take``, and the combined loss as
``log_softmax`` cross-entropy plus the standalone numeric losses (which read
the digit logits by plain indexing).
"""

import functools
import re
from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np
import optax

import ntil_jax
from ntil_jax import statistics
from tests.test_losses import PERMUTED_IDS, random_case

jax.config.update("jax_default_matmul_precision", "highest")

METHODS = ("ce", "emd", "ntl_mse", "soft_label", "ntil")
STANDALONE = {
    "emd": ntil_jax.emd_loss,
    "ntl_mse": ntil_jax.ntl_mse_loss,
    "soft_label": ntil_jax.soft_label_cross_entropy,
    "ntil": ntil_jax.ntil_loss,
}
LAM = 0.3


def plain_statistics(logits, labels, digit_token_ids=None, mask=None):
  """TokenStatistics by plain jnp ops, for autodiff."""
  logits = jnp.asarray(logits)
  if mask is not None:
    logits = jnp.where(mask[..., None], logits, 0)
  vocab_size = logits.shape[-1]
  index = jnp.clip(labels, 0, vocab_size - 1)[..., None]
  ids = np.arange(10) if digit_token_ids is None else digit_token_ids
  return ntil_jax.TokenStatistics(
      log_norm=jax.nn.logsumexp(logits.astype(jnp.float32), axis=-1),
      label_logits=jnp.take_along_axis(logits, index, -1)[..., 0].astype(
          jnp.float32
      ),
      digit_logits=jnp.take(logits, jnp.asarray(ids), axis=-1).astype(
          jnp.float32
      ),
  )


def independent_loss(logits, labels, loss_mask, digit_mask, method, weighting):
  """CE + lam * aux from log_softmax and the standalone numeric losses."""
  scored = (labels >= 0) & (labels < logits.shape[-1]) & loss_mask
  log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  index = jnp.where(scored, labels, 0)[..., None]
  ce = jnp.where(scored, -jnp.take_along_axis(log_probs, index, -1)[..., 0], 0)
  if method == "ce":
    return ce
  aux = STANDALONE[method](logits, labels, digit_mask & scored)
  if weighting == "reference":
    aux = jax.lax.stop_gradient(jnp.sum(ce) / jnp.sum(aux)) * aux
  return ce + LAM * aux


def token_weights(labels):
  """Distinct cotangents per token, so no error can hide in a plain sum."""
  rng = np.random.default_rng(7)
  return jnp.asarray(rng.uniform(0.5, 1.5, labels.shape), jnp.float32)


def assert_close(got, want, rtol=1e-5):
  got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
  scale = np.abs(want).max()
  assert scale > 0, "a gradient that is zero everywhere tests nothing"
  np.testing.assert_allclose(got, want, rtol=rtol, atol=1e-7 * scale)


class GradientEqualityTest(parameterized.TestCase):

  @parameterized.product(method=METHODS, weighting=("sum", "reference"))
  def test_against_independent_formulation(self, method, weighting):
    # Ignore ids (-100) and a loss mask that drops some real tokens.
    logits, labels, digit_mask = random_case(60, batch=2, length=20, vocab=40)
    loss_mask = np.random.default_rng(61).random(labels.shape) < 0.85
    weights = token_weights(labels)

    def ours(z):
      return ntil_jax.numeric_token_loss(
          z,
          labels,
          loss_mask=loss_mask,
          digit_mask=digit_mask,
          method=method,
          lam=LAM,
          weighting=weighting,
      )

    def theirs(z):
      return independent_loss(
          z, labels, loss_mask, digit_mask, method, weighting
      )

    total = lambda fn: jax.jit(
        jax.value_and_grad(lambda z: jnp.sum(weights * fn(z)))
    )
    (got_value, got), (want_value, want) = (
        total(ours)(logits),
        total(theirs)(logits),
    )
    np.testing.assert_allclose(got_value, want_value, rtol=1e-6)
    assert_close(got, want)
    # Every token that is scored has a gradient; the others have none.
    scored = loss_mask & (labels >= 0)
    self.assertTrue((np.abs(got).sum(-1)[scored] > 0).all())
    np.testing.assert_array_equal(np.asarray(got)[~scored], 0.0)

  @parameterized.named_parameters(
      ("default_ids", None, False, True),
      ("permuted_ids", PERMUTED_IDS, False, True),
      ("traced_ids", PERMUTED_IDS, True, True),
      ("recomputed_exp", PERMUTED_IDS, False, False),
      ("traced_recomputed", tuple(range(20, 30)), True, False),
  )
  def test_statistics_against_plain_autodiff(self, ids, traced, keep_exp):
    logits, labels, _ = random_case(
        62, batch=2, length=16, vocab=40, digit_ids=ids or range(10)
    )
    mask = np.random.default_rng(63).random(labels.shape) < 0.8
    ids = None if ids is None else np.asarray(ids)
    rng = np.random.default_rng(64)
    # Cotangents for all three statistics, as the losses produce them.
    cotangents = ntil_jax.TokenStatistics(
        *(
            jnp.asarray(rng.standard_normal(shape), jnp.float32)
            for shape in (labels.shape, labels.shape, labels.shape + (10,))
        )
    )

    def ours(z, i):
      columns, traced_ids = statistics.digit_column_ids(i, z.shape[-1])
      return statistics.statistics_from_columns(
          z, labels, jnp.asarray(mask), traced_ids, columns, keep_exp
      )

    def plain(z, i):
      return plain_statistics(z, labels, i, jnp.asarray(mask))

    def value_and_vjp(fn, z, i):
      value, vjp = jax.vjp(lambda x: fn(x, i), z)
      return value, vjp(cotangents)[0]

    if traced:  # ids as an argument of jit: unknown until run time
      run = lambda fn: jax.jit(functools.partial(value_and_vjp, fn))(
          logits, ids
      )
    else:
      run = lambda fn: value_and_vjp(fn, logits, ids)
    (got_value, got), (want_value, want) = run(ours), run(plain)
    for g, w in zip(got_value, want_value):
      np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)
    assert_close(got, want)

  @parameterized.parameters("ntil", "soft_label")
  def test_padded_vocabulary(self, method):
    # A model's logits are wider than its vocabulary (padded to a multiple
    # of 128, say): the normalizer runs over every column, labels at or past
    # vocab_size are not scored.
    logits, labels, digit_mask = random_case(65, batch=2, length=16, vocab=48)
    vocab_size = 40
    labels = np.where(labels >= vocab_size, vocab_size + 3, labels)
    self.assertTrue((labels == vocab_size + 3).any())
    weights = token_weights(labels)

    def total(statistics_fn, z):
      stats = statistics_fn(z, labels)
      per_token = ntil_jax.loss_from_statistics(
          stats,
          labels,
          vocab_size=vocab_size,
          digit_mask=digit_mask,
          method=method,
          lam=LAM,
      )
      return jnp.sum(weights * per_token)

    grad = lambda fn: jax.jit(jax.grad(functools.partial(total, fn)))(logits)
    got, want = grad(ntil_jax.token_statistics), grad(plain_statistics)
    assert_close(got, want)
    np.testing.assert_array_equal(got[labels == vocab_size + 3], 0.0)

  @parameterized.product(
      method=("ce", "soft_label", "ntil"),
      # The CPU keeps the float32 exponentials, a GPU recomputes them.
      backend=("cpu", "gpu"),
  )
  def test_bfloat16_logits(self, method, backend):
    logits, labels, digit_mask = random_case(66, batch=2, length=16, vocab=40)
    logits = jnp.asarray(logits, jnp.bfloat16)
    weights = token_weights(labels)
    loss_mask = labels >= 0

    def total(fn, z):
      return jnp.sum(weights * fn(z))

    ours = functools.partial(
        ntil_jax.numeric_token_loss,
        labels=labels,
        loss_mask=loss_mask,
        digit_mask=digit_mask,
        method=method,
    )
    grad = jax.jit(jax.grad(functools.partial(total, ours)))
    with mock.patch.object(jax, "default_backend", return_value=backend):
      got = grad(logits)
    self.assertEqual(got.dtype, jnp.bfloat16)
    # The exact gradient: float32 autodiff of the same (bfloat16) values.
    exact = grad(logits.astype(jnp.float32))
    plain = functools.partial(
        independent_loss,
        labels=labels,
        loss_mask=loss_mask,
        digit_mask=digit_mask,
        method=method,
        weighting="sum",
    )
    plain_bf16 = jax.jit(jax.grad(functools.partial(total, plain)))(logits)
    # bfloat16 keeps 8 bits: within two roundings of the largest entry.
    tolerance = 2 * 2.0**-8 * float(np.abs(exact).max())
    for candidate in (got, plain_bf16):
      np.testing.assert_allclose(
          np.asarray(candidate, np.float32), exact, rtol=0, atol=tolerance
      )

  @parameterized.product(
      keep_exp=(True, False), dtype=(jnp.float32, jnp.bfloat16)
  )
  def test_unscored_nan_logits(self, keep_exp, dtype):
    logits, labels, _ = random_case(67, batch=2, length=12, vocab=24)
    logits = np.asarray(jnp.asarray(logits, dtype))
    mask = np.random.default_rng(68).random(labels.shape) < 0.6
    poisoned = logits.copy()
    poisoned[~mask] = np.nan
    poisoned[~mask, 3] = np.inf
    cotangents = ntil_jax.TokenStatistics(
        jnp.ones(labels.shape),
        -jnp.ones(labels.shape),
        jnp.ones(labels.shape + (10,)),
    )

    def gradient(z):
      columns, _ = statistics.digit_column_ids(None, z.shape[-1])
      fn = lambda x: statistics.statistics_from_columns(
          x, labels, jnp.asarray(mask), None, columns, keep_exp
      )
      value, vjp = jax.vjp(fn, z)
      return value, vjp(cotangents)[0]

    value, grad = gradient(poisoned)
    clean_value, clean_grad = gradient(logits)
    for v, c in zip(value, clean_value):
      np.testing.assert_array_equal(v, c)
    self.assertEqual(grad.dtype, dtype)
    self.assertTrue(np.isfinite(grad).all())
    np.testing.assert_array_equal(grad[~mask], 0.0)
    np.testing.assert_array_equal(grad, clean_grad)


class FusedGradientTest(parameterized.TestCase):

  @parameterized.parameters(
      ("ntil", "sum", PERMUTED_IDS), ("soft_label", "reference", None)
  )
  def test_fused_against_plain_autodiff(self, method, weighting, ids):
    # 19 positions and 50 columns in tiles of 7 by 17: the last tile of each
    # axis overlaps the one before, whose share must not count twice.
    rng = np.random.default_rng(70)
    hidden = rng.standard_normal((2, 19, 16)).astype(np.float32)
    unembedding = (rng.standard_normal((16, 50)) * 0.5).astype(np.float32)
    _, labels, digit_mask = random_case(
        71, batch=2, length=19, vocab=50, digit_ids=ids or range(10)
    )
    ids = None if ids is None else np.asarray(ids)
    loss_mask = labels >= 0
    weights = token_weights(labels)
    kwargs = dict(
        loss_mask=loss_mask,
        digit_mask=digit_mask,
        method=method,
        lam=LAM,
        weighting=weighting,
        digit_token_ids=ids,
    )

    def fused(h, w):
      per_token = ntil_jax.fused_numeric_loss(
          h, w, labels, chunk_size=6, **kwargs
      )
      return jnp.sum(weights * per_token)

    def plain(h, w):
      logits = jnp.einsum("btd,dv->btv", h, w)
      stats = plain_statistics(logits, labels, ids, mask=loss_mask)
      per_token = ntil_jax.loss_from_statistics(
          stats, labels, vocab_size=50, **kwargs
      )
      return jnp.sum(weights * per_token)

    grad = lambda fn: jax.jit(jax.grad(fn, argnums=(0, 1)))(hidden, unembedding)
    for got, want in zip(grad(fused), grad(plain)):
      assert_close(got, want)


class MemoryTest(parameterized.TestCase):

  @parameterized.parameters(jnp.float32, jnp.bfloat16)
  def test_no_more_memory_than_optax_cross_entropy(self, dtype):
    # XLA's plan (deterministic, not a timing): the gradient of CE + NTIL
    # needs no [N, V] buffer beyond the one optax's CE needs (bf16 on CPU:
    # the float32 exponentials kept stand where XLA's float32 copy of the
    # logits would).
    shapes = (
        jax.ShapeDtypeStruct((4, 128, 32768), dtype),
        jax.ShapeDtypeStruct((4, 128), jnp.int32),
        jax.ShapeDtypeStruct((4, 128), jnp.bool_),
    )

    def planned_bytes(fn):
      compiled = jax.jit(jax.value_and_grad(fn)).lower(*shapes).compile()
      stats = compiled.memory_analysis()
      return stats.temp_size_in_bytes + stats.output_size_in_bytes

    optax_ce = planned_bytes(
        lambda z, y, m: optax.softmax_cross_entropy_with_integer_labels(
            z, y
        ).mean()
    )
    ntil = planned_bytes(
        lambda z, y, m: ntil_jax.numeric_token_loss(z, y, digit_mask=m).mean()
    )
    self.assertLessEqual(ntil, 1.01 * optax_ce)


def _vocabulary_fusion_size(fn, shapes):
  """Instructions in the optimized program's fusions of ``[..., V]`` output.

  What XLA computes for every logit of value + gradient of ``fn``: a
  per-token quantity fused in there is computed once per column.
  """
  vocab = shapes[0].shape[-1]
  text = jax.jit(jax.value_and_grad(fn)).lower(*shapes).compile().as_text()
  entry = text[text.index("\nENTRY ") :].split("\n}")[0]
  fusion = re.compile(
      rf"= \w+\[[\d,]*,{vocab}\]\{{[\d,]*\}} fusion\(.*calls=(%[\w.\-]+)"
  )
  size = 0
  for line in entry.splitlines():
    match = fusion.search(line)
    if match:
      body = text[text.index(f"\n{match.group(1)} ") :].split("\n}")[0]
      size += sum(" = " in op for op in body.splitlines()[1:])
  return size


class TwoCallTest(parameterized.TestCase):
  """``ce + lam * loss(logits, ...)`` by hand: the loss's gradient per token."""

  @parameterized.parameters(
      "ntil_loss",
      "emd_loss",
      "ntl_mse_loss",
      "del_loss",
      "smmd_loss",
      "nl_ntl_loss",
  )
  def test_per_token_gradient_not_computed_per_column(self, name):
    # XLA's plan (deterministic, not a timing). The loss reads ten digit
    # logits; its gradient reaches the [N, V] gradient as ten columns added
    # to CE's. Fused into that addition, NTIL's per-token gradient was
    # computed for every column: 97 instructions there against CE's 21, and
    # 1.16-1.22x CE's time on the 2-core CPU where the one-call
    # numeric_token_loss took 1.0x.
    shapes = (
        jax.ShapeDtypeStruct((2, 64, 4096), jnp.float32),
        jax.ShapeDtypeStruct((2, 64), jnp.int32),
        jax.ShapeDtypeStruct((2, 64), jnp.bool_),
    )
    loss = getattr(ntil_jax, name)

    def optax_ce(z, y, m):
      del m
      return optax.softmax_cross_entropy_with_integer_labels(z, y).mean()

    def by_hand(z, y, m):
      return optax_ce(z, y, m) + 0.3 * loss(z, y, m).mean()

    self.assertLessEqual(
        _vocabulary_fusion_size(by_hand, shapes),
        _vocabulary_fusion_size(optax_ce, shapes) + 8,
    )


if __name__ == "__main__":
  absltest.main()
