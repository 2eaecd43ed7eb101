"""ntil_jax losses against the float64 oracle in tests/oracle.py."""

import functools
import logging

from absl.testing import absltest
from absl.testing import parameterized
import chex
import jax
import jax.numpy as jnp
from jax import test_util as jtu
import numpy as np
import optax

import ntil_jax
from tests import fuzz
from tests import oracle

jax.config.update("jax_default_matmul_precision", "highest")

PERMUTED_IDS = (17, 3, 25, 9, 30, 11, 4, 28, 20, 7)


def random_case(
    seed,
    batch=3,
    length=24,
    vocab=32,
    digit_ids=range(10),
    ignore_frac=0.1,
    scale=2.0,
):
  """Logits, labels, digit mask with runs touching both sequence ends."""
  rng = np.random.default_rng(seed)
  ids = np.asarray(list(digit_ids))
  others = np.setdiff1d(np.arange(vocab), ids)
  is_digit = rng.random((batch, length)) < 0.7
  is_digit[:, 0] = is_digit[:, -1] = True
  labels = np.where(
      is_digit,
      rng.choice(ids, (batch, length)),
      rng.choice(others, (batch, length)),
  )
  labels = np.where(rng.random((batch, length)) < ignore_frac, -100, labels)
  digit_mask = rng.random((batch, length)) < 0.9
  logits = (scale * rng.standard_normal((batch, length, vocab))).astype(
      np.float32
  )
  return logits, labels.astype(np.int32), digit_mask


class HandComputedTest(absltest.TestCase):
  """The worked example: target "30", digit logits given, prediction "31"."""

  def test_target_thirty(self):
    logits = np.zeros((1, 3, 12), np.float32)
    logits[0, 0, :10] = [0, 0, 1, 3, 1, 0, 0, 0, 0, 0]
    logits[0, 1, :10] = [1, 3, 0, 0, 0, 0, 0, 0, 0, 0]
    labels = np.array([[3, 0, 11]])
    mask = np.array([[True, True, True]])
    parts = ntil_jax.ntil_components(logits, labels, mask)
    np.testing.assert_allclose(parts.emd[0], [0.935873, 2.080441, 0], atol=1e-6)
    np.testing.assert_allclose(parts.weights[0, :2], [1.2, 1.0], rtol=1e-6)
    np.testing.assert_array_equal(parts.predicted_digits[0, :2], [3, 1])
    np.testing.assert_allclose(parts.relative[0], [0, 1 / 32, 0], rtol=1e-6)
    np.testing.assert_allclose(
        parts.magnitude[0], [0, np.log(32 / 31), 0], rtol=1e-6
    )
    loss = ntil_jax.ntil_loss(logits, labels, mask)
    expected_first = 1.2 * 0.935873
    expected_last = 2.080441 + 0.2 / 32 + 0.2 * np.log(32 / 31)
    np.testing.assert_allclose(
        loss[0], [expected_first, expected_last, 0], rtol=1e-5
    )


class NTILOracleTest(chex.TestCase, parameterized.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.named_parameters(
      ("default_ids", 0, tuple(range(10)), 32, 1, 24),
      ("permuted_ids", 1, PERMUTED_IDS, 32, 3, 24),
      ("long_rows", 2, tuple(range(10)), 16, 2, 97),
      ("single_token", 3, PERMUTED_IDS, 40, 4, 1),
  )
  def test_value_and_gradient(self, seed, ids, vocab, batch, length):
    logits, labels, mask = random_case(seed, batch, length, vocab, ids)
    ids_arg = None if ids == tuple(range(10)) else jnp.asarray(ids)
    fn = self.variant(
        functools.partial(ntil_jax.ntil_loss, digit_token_ids=ids_arg)
    )
    want, want_grad, _ = oracle.ntil(logits, labels, mask, ids)
    np.testing.assert_allclose(
        fn(logits, labels, mask), want, rtol=2e-5, atol=2e-6
    )
    grad = jax.grad(lambda z: fn(z, labels, mask).sum())(logits)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-4, atol=2e-5)

  @parameterized.parameters((0.0, 0.2, 0.2), (0.2, 0.0, 0.5), (0.5, 0.3, 0.0))
  def test_hyperparameters_and_ablations(self, sigma, alpha, beta):
    logits, labels, mask = random_case(7)
    want, want_grad, _ = oracle.ntil(
        logits, labels, mask, sigma=sigma, alpha=alpha, beta=beta, tau=0.5
    )
    fn = lambda z: ntil_jax.ntil_loss(
        z, labels, mask, sigma=sigma, alpha=alpha, beta=beta, tau=0.5
    )
    np.testing.assert_allclose(fn(logits), want, rtol=2e-5, atol=2e-6)
    grad = jax.grad(lambda z: fn(z).sum())(logits)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-4, atol=2e-5)

  def test_gumbel_noise_uses_key(self):
    logits, labels, mask = random_case(8, scale=0.02)  # noise can flip argmax
    key = jax.random.key(3)
    noise = 0.05 * np.asarray(jax.random.gumbel(key, logits.shape[:-1] + (10,)))
    want, want_grad, _ = oracle.ntil(logits, labels, mask, noise=noise)
    fn = lambda z: ntil_jax.ntil_loss(
        z, labels, mask, key=key, noise_scale=0.05
    )
    np.testing.assert_allclose(fn(logits), want, rtol=2e-5, atol=2e-6)
    grad = jax.grad(lambda z: fn(z).sum())(logits)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-4, atol=2e-5)
    no_noise, _, _ = oracle.ntil(logits, labels, mask)
    self.assertFalse(np.allclose(want, no_noise))  # the noise mattered

  def test_reverse_mode_only(self):
    # The deviations' gradient is written out (a custom VJP): jax.vjp gives
    # the oracle's gradient under a per-token cotangent, jax.jvp is refused
    # with JAX's own error, as the docstring says.
    logits, labels, mask = random_case(10)
    _, want_grad, _ = oracle.ntil(logits, labels, mask)
    fn = lambda z: ntil_jax.ntil_loss(z, labels, mask)
    values, pullback = jax.vjp(fn, jnp.asarray(logits))
    (grad,) = pullback(jnp.ones_like(values))
    np.testing.assert_allclose(grad, want_grad, rtol=1e-4, atol=2e-5)
    with self.assertRaisesRegex(TypeError, "forward-mode"):
      jax.jvp(fn, (jnp.asarray(logits),), (jnp.asarray(logits),))

  def test_components_sum_to_loss(self):
    logits, labels, mask = random_case(9)
    parts = ntil_jax.ntil_components(logits, labels, mask)
    _, _, want = oracle.ntil(logits, labels, mask)
    for name, got in (
        ("emd", parts.emd),
        ("weights", parts.weights),
        ("rel", parts.relative),
        ("mag", parts.magnitude),
    ):
      np.testing.assert_allclose(
          got, want[name], rtol=2e-5, atol=2e-6, err_msg=name
      )

  @parameterized.parameters(
      (2, 63), (0, 64), (1, 65), (5, 129), (1, 300), (2, 300)
  )
  def test_long_nearly_right_numbers_across_blocks(self, seed, length):
    # Numbers of up to 70 digits, mostly predicted right (X close to Y: long
    # borrow chains in |X - Y|), leading zeros and decimal points, in rows
    # cut into blocks of 8, 16 and 32 positions (`segments.block_size`)
    # that numbers cross, against the oracle's exact fractions. sigma = 0:
    # the place weights of 70-digit numbers (1.5**69 = 1e12 at sigma = 0.5)
    # scale float32's rounding in the softmax's gradient past this
    # per-element tolerance (7e-4 relative, seen at sigma = 0.5).
    logits, labels, mask, point, kwargs = long_numbers_case(seed, length)
    want, want_grad, parts = oracle.ntil(
        logits, labels, mask, decimal_mask=point, sigma=0.0, **kwargs
    )
    # A number predicted all but right: a relative deviation below 1e-3.
    self.assertTrue(((parts["rel"] > 0) & (parts["rel"] < 1e-3)).any())

    def total(z):
      per_token = ntil_jax.ntil_loss(
          z, labels, mask, decimal_point_mask=point, sigma=0.0, **kwargs
      )
      return per_token.sum(), per_token

    (_, got), grad = jax.jit(jax.value_and_grad(total, has_aux=True))(logits)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-4, atol=2e-5)

  def test_the_fuzzer_runs_its_cases(self):
    # `make fuzz` runs hundreds by hand; two here keep it working.
    self.assertEqual(fuzz.run_checks(["ntil"], 0, 2), 0)


def long_numbers_case(seed, length, batch=2):
  """:func:`fuzz.nearly_right` (numbers of up to 70 digits, mostly
  predicted right) and NTIL's alpha, beta and tau."""
  rng = np.random.default_rng(seed)
  logits, labels, mask, point = fuzz.nearly_right(rng, batch, length)
  kwargs = dict(
      alpha=float(rng.choice([0.2, 1.0])),
      beta=float(rng.choice([0.2, 1.0])),
      tau=float(rng.choice([0.1, 0.5])),
  )
  return logits, labels, mask, point, kwargs


class NumberEdgeCaseTest(parameterized.TestCase):

  def _check(self, logits, labels, mask, **kwargs):
    """Compares values and gradients with the oracle.

    The weighted EMD gradient ``W p_j (d_j - EMD)`` cancels when p is peaked,
    so its float32 rounding is about ``eps * W * max|d|``; with W as large as
    1.2**59 ~ 5e4 that term joins the tolerance (4 ulps of W * 9).
    """
    want, want_grad, parts = oracle.ntil(logits, labels, mask, **kwargs)
    rounding = 4 * np.finfo(np.float32).eps * 9 * parts["weights"][..., None]
    oracle_kwargs = dict(kwargs)
    if "decimal_mask" in oracle_kwargs:
      oracle_kwargs["decimal_point_mask"] = oracle_kwargs.pop("decimal_mask")
    fn = jax.jit(lambda z: ntil_jax.ntil_loss(z, labels, mask, **oracle_kwargs))
    got = fn(logits)
    grad = jax.grad(lambda z: fn(z).sum())(logits)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)
    np.testing.assert_array_less(
        np.abs(grad - want_grad), 2e-5 + 1e-4 * np.abs(want_grad) + rounding
    )
    self.assertTrue(np.isfinite(grad).all())
    return got

  @parameterized.parameters(1, 2, 3)
  def test_sixty_digit_number(self, seed):
    rng = np.random.default_rng(seed)
    length = 64
    labels = np.full((1, length), 12)
    labels[0, 2:62] = rng.integers(0, 10, 60)
    labels[0, 2] = rng.integers(1, 10)
    logits = rng.standard_normal((1, length, 16)).astype(np.float32)
    logits[0, 2, :10] -= 5.0
    logits[0, 2, 1 + seed] += 10.0  # a non-zero leading predicted digit
    mask = np.ones_like(labels, bool)
    got = self._check(logits, labels, mask)
    self.assertGreater(got[0, 61], 0.0)

  def test_long_numbers_with_leading_zeros(self):
    # Exact zero predictions and targets with many leading zeros: values must
    # stay exact where float32 powers of ten would underflow or overflow.
    length = 70
    labels = np.zeros((2, length), np.int64)
    labels[0, -1] = 7  # "000...07"
    labels[1, 0] = 9  # "9000...0"
    logits = np.zeros((2, length, 10), np.float32)
    logits[..., 0] = 4.0  # predicts all zeros
    mask = np.ones((2, length), bool)
    parts = ntil_jax.ntil_components(logits, labels, mask)
    np.testing.assert_allclose(parts.relative[:, -1], [7 / 8, 1.0], rtol=1e-6)
    np.testing.assert_allclose(
        parts.magnitude[:, -1],
        [np.log(8), np.log(9.0) + 69 * np.log(10)],
        rtol=1e-6,
    )
    grad = jax.grad(lambda z: ntil_jax.ntil_loss(z, labels, mask).sum())(logits)
    self.assertTrue(np.isfinite(grad).all())

  def test_ignore_ids_split_numbers(self):
    labels = np.array([[1, 2, -100, 3, 4, 15, 5]])
    logits = (
        np.random.default_rng(0).standard_normal((1, 7, 16)).astype(np.float32)
    )
    mask = np.ones_like(labels, bool)
    got = self._check(logits, labels, mask)
    self.assertEqual(got[0, 2], 0.0)
    self.assertEqual(got[0, 5], 0.0)
    layout = ntil_jax.number_layout(labels, mask)
    np.testing.assert_array_equal(layout.digits_right[0], [1, 0, 0, 1, 0, 0, 0])
    np.testing.assert_array_equal(layout.is_last[0], [0, 1, 0, 0, 1, 0, 1])

  def test_digit_mask_splits_numbers(self):
    labels = np.array([[1, 2, 3, 4]])
    mask = np.array([[True, True, False, True]])
    layout = ntil_jax.number_layout(labels, mask)
    np.testing.assert_array_equal(layout.is_digit[0], [1, 1, 0, 1])
    np.testing.assert_array_equal(layout.places[0], [1, 0, 0, 0])
    logits = (
        np.random.default_rng(1).standard_normal((1, 4, 10)).astype(np.float32)
    )
    self._check(logits, labels, mask)

  def test_decimal_points(self):
    #            3  .  1  4  _  1  .  2  .  3  _  5  .  _  .  7
    labels = np.array(
        [[3, 10, 1, 4, 11, 1, 10, 2, 10, 3, 11, 5, 10, 11, 10, 7]]
    )
    point = labels == 10
    mask = np.ones_like(labels, bool)
    layout = ntil_jax.number_layout(labels, mask, decimal_point_mask=point)
    np.testing.assert_array_equal(
        layout.places[0], [0, 0, -1, -2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]
    )
    np.testing.assert_array_equal(
        layout.digits_right[0], [2, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]
    )
    np.testing.assert_array_equal(
        np.flatnonzero(layout.is_last[0]), [3, 5, 7, 9, 11, 15]
    )
    logits = (
        np.random.default_rng(2).standard_normal((1, 16, 12)).astype(np.float32)
    )
    self._check(logits, labels, mask, decimal_mask=point)
    # Without the mask, '.' splits: "3", "14".
    default = ntil_jax.number_layout(labels, mask)
    np.testing.assert_array_equal(default.places[0, :4], [0, 0, 1, 0])

  def test_random_decimals(self):
    rng = np.random.default_rng(5)
    labels = rng.choice([0, 1, 2, 5, 9, 10, 10, 11], (3, 40))
    point = labels == 10
    mask = rng.random((3, 40)) < 0.95
    logits = rng.standard_normal((3, 40, 12)).astype(np.float32)
    self._check(logits, labels, mask, decimal_mask=point)

  def test_bfloat16_logits(self):
    logits, labels, mask = random_case(11)
    logits_bf16 = jnp.asarray(logits, jnp.bfloat16)
    want, _, _ = oracle.ntil(np.asarray(logits_bf16, np.float32), labels, mask)
    got = jax.jit(ntil_jax.ntil_loss)(logits_bf16, labels, mask)
    self.assertEqual(got.dtype, jnp.float32)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)
    grad = jax.grad(lambda z: ntil_jax.ntil_loss(z, labels, mask).sum())(
        logits_bf16
    )
    self.assertEqual(grad.dtype, jnp.bfloat16)
    self.assertTrue(np.isfinite(np.asarray(grad, np.float32)).all())


class NoNaNTest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_all_masked_is_zero(self):
    logits, labels, _ = random_case(12)
    mask = np.zeros_like(labels, bool)
    for fn in (
        ntil_jax.ntil_loss,
        ntil_jax.emd_loss,
        ntil_jax.ntl_mse_loss,
        ntil_jax.soft_label_cross_entropy,
    ):
      f = self.variant(fn)
      np.testing.assert_array_equal(f(logits, labels, mask), 0.0)
      grad = jax.grad(lambda z, f=f: f(z, labels, mask).sum())(logits)
      np.testing.assert_array_equal(grad, 0.0)

  def test_extreme_logits_stay_finite(self):
    logits, labels, mask = random_case(13, scale=1e4)
    for fn in (
        ntil_jax.ntil_loss,
        ntil_jax.emd_loss,
        ntil_jax.ntl_mse_loss,
        ntil_jax.soft_label_cross_entropy,
    ):
      value, grad = jax.jit(
          jax.value_and_grad(lambda z, fn=fn: fn(z, labels, mask).sum())
      )(logits)
      self.assertTrue(np.isfinite(value), fn.__name__)
      self.assertTrue(np.isfinite(grad).all(), fn.__name__)

  def test_outside_numbers_zero_gradient(self):
    logits, labels, mask = random_case(14)
    layout = ntil_jax.number_layout(labels, mask)
    grad = jax.grad(lambda z: ntil_jax.ntil_loss(z, labels, mask).sum())(logits)
    outside = ~np.asarray(layout.is_digit)
    np.testing.assert_array_equal(grad[outside], 0.0)
    self.assertTrue((np.abs(grad[~outside]).sum(-1) > 0).all())


class BaselinesTest(chex.TestCase, parameterized.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.named_parameters(
      ("default_ids", tuple(range(10))), ("permuted", PERMUTED_IDS)
  )
  def test_against_oracle(self, ids):
    logits, labels, mask = random_case(20, digit_ids=ids)
    ids_arg = None if ids == tuple(range(10)) else np.asarray(ids)
    cases = [
        (ntil_jax.emd_loss, {}, oracle.emd(logits, labels, mask, ids)),
        (ntil_jax.ntl_mse_loss, {}, oracle.ntl_mse(logits, labels, mask, ids)),
        (
            ntil_jax.soft_label_cross_entropy,
            dict(eta=0.3, width=1.5),
            oracle.soft_label_ce(logits, labels, mask, ids, eta=0.3, width=1.5),
        ),
    ]
    for fn, kwargs, want in cases:
      got = self.variant(
          functools.partial(fn, digit_token_ids=ids_arg, **kwargs)
      )(logits, labels, mask)
      np.testing.assert_allclose(
          got, want, rtol=2e-5, atol=2e-6, err_msg=fn.__name__
      )

  @parameterized.parameters(
      "emd_loss", "ntl_mse_loss", "soft_label_cross_entropy"
  )
  def test_gradients(self, name):
    logits, labels, mask = random_case(21, batch=1, length=6, vocab=12)
    fn = getattr(ntil_jax, name)
    jtu.check_grads(
        lambda z: fn(z, labels, mask).sum(),
        (logits.astype(np.float64),),
        order=1,
        modes=("rev",),
        atol=5e-2,
        rtol=5e-2,
        eps=1e-2,
    )

  def test_emd_is_ntil_without_weights_and_deviations(self):
    logits, labels, mask = random_case(22)
    np.testing.assert_allclose(
        ntil_jax.emd_loss(logits, labels, mask),
        ntil_jax.ntil_loss(
            logits, labels, mask, sigma=0.0, alpha=0.0, beta=0.0
        ),
        rtol=1e-6,
    )

  def test_soft_targets(self):
    q = ntil_jax.soft_digit_targets(jnp.arange(10), eta=0.4, width=1.0)
    np.testing.assert_allclose(q.sum(-1), 1.0, rtol=1e-6)
    self.assertTrue((jnp.argmax(q, -1) == jnp.arange(10)).all())
    # Closer digits get more mass.
    self.assertGreater(q[3, 4], q[3, 6])
    np.testing.assert_allclose(q[3, 2], q[3, 4], rtol=1e-6)
    # eta = 0 is the one-hot target: plain cross-entropy on digits.
    logits, labels, mask = random_case(23)
    digits = mask & (labels >= 0) & (labels < 10)
    np.testing.assert_allclose(
        ntil_jax.soft_label_cross_entropy(logits, labels, mask, eta=0.0),
        ntil_jax.cross_entropy(logits, labels, digits),
        rtol=1e-5,
        atol=1e-6,
    )


class CombinedLossTest(parameterized.TestCase):

  def test_sum_weighting(self):
    logits, labels, mask = random_case(30)
    loss_mask = labels >= 0
    got = ntil_jax.numeric_token_loss(
        logits,
        labels,
        loss_mask=loss_mask,
        digit_mask=mask,
        method="ntil",
        lam=0.3,
    )
    ce = optax.softmax_cross_entropy_with_integer_labels(
        logits, np.where(loss_mask, labels, 0)
    )
    aux, _, _ = oracle.ntil(logits, labels, mask & loss_mask)
    np.testing.assert_allclose(
        got, np.where(loss_mask, ce, 0) + 0.3 * aux, rtol=2e-5, atol=2e-6
    )

  @parameterized.parameters("ce", "emd", "ntl_mse", "soft_label", "ntil")
  def test_methods_run_under_jit(self, method):
    logits, labels, mask = random_case(31)
    fn = jax.jit(functools.partial(ntil_jax.numeric_token_loss, method=method))
    value = fn(logits, labels, loss_mask=labels >= 0, digit_mask=mask)
    self.assertEqual(value.shape, labels.shape)
    self.assertTrue(np.isfinite(value).all())
    ce = ntil_jax.cross_entropy(logits, labels, labels >= 0)
    if method == "ce":
      np.testing.assert_allclose(value, ce, rtol=1e-6)
    else:
      self.assertGreater(float(value.sum()), float(ce.sum()))

  def test_reference_weighting(self):
    logits, labels, mask = random_case(32)
    kwargs = dict(loss_mask=labels >= 0, digit_mask=mask, lam=0.3)
    ref = lambda z: ntil_jax.numeric_token_loss(
        z, labels, weighting="reference", **kwargs
    ).sum()
    ce = lambda z: ntil_jax.cross_entropy(z, labels, labels >= 0).sum()
    aux = lambda z: ntil_jax.ntil_loss(z, labels, mask & (labels >= 0)).sum()
    # Value: the aux term equals lam * CE.
    np.testing.assert_allclose(ref(logits), 1.3 * ce(logits), rtol=1e-5)
    # Gradient: CE's plus aux's scaled by the stopped ratio.
    ratio = ce(logits) / aux(logits)
    want = jax.grad(ce)(logits) + 0.3 * ratio * jax.grad(aux)(logits)
    np.testing.assert_allclose(
        jax.grad(ref)(logits), want, rtol=1e-4, atol=1e-6
    )

  def test_soft_label_identity(self):
    # CE + lam * CE_soft(eta) == (1 + lam) * CE_soft(lam * eta / (1 + lam)).
    logits, labels, mask = random_case(33, ignore_frac=0.0)
    digits = mask & (labels < 10)
    combined = ntil_jax.numeric_token_loss(
        logits, labels, loss_mask=digits, method="soft_label", lam=0.5, eta=0.6
    )
    single = ntil_jax.soft_label_cross_entropy(
        logits, labels, digits, eta=0.5 * 0.6 / 1.5
    )
    np.testing.assert_allclose(combined, 1.5 * single, rtol=1e-5, atol=1e-6)


def authors_case(seed, batch=4, length=20, vocab=16):
  """Numbers of 1-4 digits between non-digits and ignored labels; row 2
  holds no digit (it counts 0 in the authors' mean over samples)."""
  rng = np.random.default_rng(seed)
  labels = np.full((batch, length), 12)
  for row in range(batch):
    t = int(rng.integers(0, 2))
    while t < length and row != 2:
      n = min(int(rng.integers(1, 5)), length - t)
      labels[row, t : t + n] = rng.integers(0, 10, n)
      t += n
      labels[row, t : t + 1] = rng.choice([10, 11, -100])
      t += 1 + int(rng.integers(0, 2))
  logits = (2.0 * rng.standard_normal((batch, length, vocab))).astype(
      np.float32
  )
  return logits, labels.astype(np.int32)


def authors_loss(logits, labels, *, lam, sigma, alpha, beta, tau):
  """The NTIL authors' loss, ``mle + sg(mle / aux) * lam * aux``, written
  out as their code computes it (loops over samples and digit runs, digits
  0..9 are ids 0..9, no Gumbel noise): aux is the mean over samples of the
  sample's place-weighted EMD averaged over its digits plus its relative
  and magnitude deviations averaged over its numbers."""
  valid = labels >= 0
  log_z = jax.nn.logsumexp(logits, -1)
  label_logits = jnp.take_along_axis(
      logits, np.maximum(labels, 0)[..., None], -1
  )[..., 0]
  mle = jnp.sum(jnp.where(valid, log_z - label_logits, 0.0)) / valid.sum()
  per_sample = []
  for row in range(labels.shape[0]):
    runs, run = [], []
    for t, label in enumerate(labels[row]):
      if 0 <= label < 10:
        run.append(t)
      elif run:
        runs.append(run)
        run = []
    if run:
      runs.append(run)
    if not runs:
      per_sample.append(jnp.asarray(0.0))
      continue
    emds, relative, magnitude = [], [], []
    for run in runs:
      z = logits[row, np.array(run), :10]
      y = labels[row, np.array(run)]
      places = np.arange(len(run) - 1, -1, -1)
      probs = jax.nn.softmax(z, -1)
      emd = jnp.sum(probs * np.abs(np.arange(10) - y[:, None]), -1)
      emds.append(emd * (1.0 + sigma) ** places)
      soft = jax.nn.softmax(z / tau, -1)
      hard = jax.nn.one_hot(jnp.argmax(soft, -1), 10)
      digits = hard - jax.lax.stop_gradient(soft) + soft
      x = jnp.sum((digits @ np.arange(10.0)) * 10.0**places)
      target = float(np.sum(y * 10.0**places))
      big, small = jnp.maximum(x, target), jnp.minimum(x, target)
      relative.append(
          jnp.where(x == target, 0.0, jnp.abs(x - target) / (big + 1.0))
      )
      magnitude.append(jnp.log((big + 1.0) / (small + 1.0)))
    per_sample.append(
        jnp.mean(jnp.concatenate(emds))
        + alpha * jnp.mean(jnp.stack(relative))
        + beta * jnp.mean(jnp.stack(magnitude))
    )
  aux = jnp.mean(jnp.stack(per_sample))
  return mle + jax.lax.stop_gradient(mle / aux) * lam * aux


class AuthorsWeightingTest(parameterized.TestCase):
  """``weighting="authors"`` against the authors' loss written out."""

  @parameterized.parameters(
      ("ntil", dict(sigma=0.2, alpha=0.2, beta=0.2)),
      ("ntil", dict(sigma=0.5, alpha=1.0, beta=0.0)),
      ("emd", dict(sigma=0.0, alpha=0.0, beta=0.0)),  # their EMD module
  )
  def test_value_and_gradient(self, method, parameters):
    logits, labels = authors_case(70)
    scored = (labels >= 0).sum()
    kwargs = parameters if method == "ntil" else {}

    def ours(z, weighting="authors"):
      return (
          ntil_jax.numeric_token_loss(
              z, labels, method=method, lam=0.3, weighting=weighting, **kwargs
          ).sum()
          / scored
      )

    # Each side's value and gradient compiled as one program: the authors'
    # loops, run op by op, compiled some 300 small programs.
    want = functools.partial(
        authors_loss, labels=labels, lam=0.3, tau=0.1, **parameters
    )
    value, grad = jax.jit(jax.value_and_grad(ours))(logits)
    want_value, want_grad = jax.jit(jax.value_and_grad(want))(logits)
    np.testing.assert_allclose(value, want_value, rtol=1e-5)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-4, atol=1e-6)
    # The token-summed aux of "reference" points elsewhere.
    reference = jax.jit(
        jax.grad(functools.partial(ours, weighting="reference"))
    )
    self.assertGreater(float(jnp.abs(reference(logits) - grad).max()), 1e-3)

  def test_fused_path_takes_it(self):
    logits, labels = authors_case(71)
    rng = np.random.default_rng(72)
    hidden = rng.standard_normal(logits.shape[:-1] + (8,)).astype(np.float32)
    unembedding = rng.standard_normal((8, logits.shape[-1])).astype(np.float32)
    fused = ntil_jax.fused_numeric_loss(
        hidden, unembedding, labels, weighting="authors", chunk_size=16
    )
    plain = ntil_jax.numeric_token_loss(
        hidden @ unembedding, labels, weighting="authors"
    )
    np.testing.assert_allclose(fused, plain, rtol=1e-5, atol=1e-6)


def decimal_case(seed, batch=3, length=40, vocab=14):
  """Digits 0..9, points (token 10) and fillers; some unscored positions."""
  rng = np.random.default_rng(seed)
  labels = rng.choice([0, 1, 2, 5, 9, 3, 10, 10, 11, 12], (batch, length))
  labels = np.where(rng.random(labels.shape) < 0.05, -100, labels)
  logits = rng.standard_normal((batch, length, vocab)).astype(np.float32)
  digit_mask = rng.random(labels.shape) < 0.95
  loss_mask = rng.random(labels.shape) < 0.9
  return logits, labels, digit_mask, loss_mask, labels == 10


class DecimalPointTest(parameterized.TestCase):
  """``decimal_point_mask`` through numeric_token_loss and its statistics."""

  def test_numeric_token_loss_is_ce_plus_ntil(self):
    logits, labels, digit_mask, loss_mask, point = decimal_case(60)
    scored = loss_mask & (labels >= 0)

    def combined(z):
      return ntil_jax.numeric_token_loss(
          z,
          labels,
          loss_mask=loss_mask,
          digit_mask=digit_mask,
          lam=0.3,
          decimal_point_mask=point,
      )

    def separate(z):
      return ntil_jax.cross_entropy(
          z, labels, loss_mask
      ) + 0.3 * ntil_jax.ntil_loss(
          z, labels, digit_mask & scored, decimal_point_mask=point
      )

    np.testing.assert_allclose(
        combined(logits), separate(logits), rtol=1e-6, atol=1e-6
    )
    grad = lambda fn: jax.grad(lambda z: fn(z).sum())(logits)
    np.testing.assert_allclose(
        grad(combined), grad(separate), rtol=1e-5, atol=1e-6
    )
    # "3.25" is no longer scored as the integer 325.
    integers = ntil_jax.numeric_token_loss(
        logits, labels, loss_mask=loss_mask, digit_mask=digit_mask, lam=0.3
    )
    self.assertGreater(np.abs(combined(logits) - integers).max(), 1e-3)

  @parameterized.parameters("ce", "emd", "ntl_mse", "soft_label")
  def test_other_methods_score_each_digit_alike(self, method):
    logits, labels, digit_mask, loss_mask, point = decimal_case(61)
    fn = lambda **kw: ntil_jax.numeric_token_loss(
        logits,
        labels,
        loss_mask=loss_mask,
        digit_mask=digit_mask,
        method=method,
        **kw,
    )
    np.testing.assert_array_equal(fn(decimal_point_mask=point), fn())

  def test_masks_and_labels_may_be_lists(self):
    # Array-likes, as everywhere else: a list digit_mask used to fail in
    # numeric_token_loss alone ("Cannot determine dtype").
    logits, labels, digit_mask, loss_mask, point = decimal_case(64)
    masks = dict(
        loss_mask=loss_mask, digit_mask=digit_mask, decimal_point_mask=point
    )
    lists = {name: np.asarray(m).tolist() for name, m in masks.items()}
    np.testing.assert_array_equal(
        ntil_jax.numeric_token_loss(logits, labels.tolist(), **lists),
        ntil_jax.numeric_token_loss(logits, labels, **masks),
    )

  def test_loss_from_statistics_takes_it(self):
    logits, labels, digit_mask, loss_mask, point = decimal_case(62)
    stats = ntil_jax.token_statistics(logits, labels, mask=loss_mask)
    got = ntil_jax.loss_from_statistics(
        stats,
        labels,
        vocab_size=logits.shape[-1],
        loss_mask=loss_mask,
        digit_mask=digit_mask,
        decimal_point_mask=point,
    )
    want = ntil_jax.numeric_token_loss(
        logits,
        labels,
        loss_mask=loss_mask,
        digit_mask=digit_mask,
        decimal_point_mask=point,
    )
    np.testing.assert_array_equal(got, want)

  def test_none_is_the_default(self):
    logits, labels, digit_mask, loss_mask, _ = decimal_case(63)
    fn = lambda **kw: ntil_jax.numeric_token_loss(
        logits, labels, loss_mask=loss_mask, digit_mask=digit_mask, **kw
    )
    np.testing.assert_array_equal(fn(decimal_point_mask=None), fn())

  def test_shape_is_checked(self):
    logits, labels, digit_mask, _, point = decimal_case(64)
    with self.assertRaisesRegex(ValueError, r"decimal_point_mask shape"):
      ntil_jax.numeric_token_loss(
          logits, labels, digit_mask=digit_mask, decimal_point_mask=point[:1]
      )
    stats = ntil_jax.token_statistics(logits, labels)
    with self.assertRaisesRegex(ValueError, r"decimal_point_mask shape"):
      ntil_jax.loss_from_statistics(
          stats, labels, vocab_size=14, decimal_point_mask=point[:, :5]
      )


class TracingTest(absltest.TestCase):
  """Where the number logic is a program of its own, and where it is not."""

  def setUp(self):
    super().setUp()
    logits, labels, mask = random_case(80, batch=1, length=12, vocab=14)

    def loss(z):
      return ntil_jax.ntil_loss(z, labels, mask).sum()

    self.loss, self.logits = loss, logits

  def test_traced_in_place_under_jit(self):
    # A nested jit would be traced twice under value_and_grad, for nothing:
    # XLA inlines it.
    names = []

    def collect(jaxpr):
      for eqn in jaxpr.eqns:
        names.append(eqn.params.get("name"))
        for param in eqn.params.values():
          inner = getattr(param, "jaxpr", param)
          if hasattr(inner, "eqns"):
            collect(inner)

    collect(jax.make_jaxpr(jax.value_and_grad(self.loss))(self.logits).jaxpr)
    self.assertNotIn("_compiled_number_loss", names)
    self.assertIn("_where", names)  # nested jits are seen

  def test_one_program_under_grad_alone(self):
    # Eagerly, op by op, the number logic compiles some 200 programs (23 s
    # on the 2-core CPU); as one program of its own, 47 in all.
    compiles, grad = _compiles(lambda: jax.grad(self.loss)(self.logits + 0.5))
    self.assertTrue(np.isfinite(grad).all())
    self.assertBetween(compiles, 1, 100)

  def test_number_layout_is_one_program_eagerly(self):
    # Op by op it compiled 59 programs here (counted by hand with the code
    # before 2026-12-03; a first call of 1.8 s against 0.4 s on the 2-core
    # CPU, timed by hand). A shape no other test uses: nothing is cached.
    labels = np.array([[1, 2, 10, 5, 11, 7, 7, 10, 3, 3, 11]])
    compiles, layout = _compiles(
        lambda: ntil_jax.number_layout(labels, decimal_point_mask=labels == 10)
    )
    self.assertBetween(compiles, 1, 5)
    # "12.5+77.33": the two numbers' places, as ntil_loss reads them.
    self.assertEqual(
        layout.places.tolist(), [[1, 0, 0, -1, 0, 1, 0, 0, -1, -2, 0]]
    )
    # Under jit it is traced in place, with the same fields.
    jaxpr = jax.make_jaxpr(
        lambda l: ntil_jax.number_layout(l, decimal_point_mask=l == 10)
    )(labels)
    self.assertNotIn(
        "_compiled_layout", [e.params.get("name") for e in jaxpr.eqns]
    )
    traced = jax.jit(
        lambda l: ntil_jax.number_layout(l, decimal_point_mask=l == 10)
    )(labels)
    for field, got, want in zip(layout._fields, traced, layout):
      np.testing.assert_array_equal(got, want, err_msg=field)


def _compiles(fn):
  """``(programs compiled, fn())``, counted in jax's compile log."""
  compiles = []

  class Count(logging.Handler):

    def emit(self, record):
      compiles.append("Compiling" in record.getMessage())

  logger = logging.getLogger("jax")
  handler, level = Count(), logger.level
  logger.addHandler(handler)
  logger.setLevel(logging.DEBUG)
  try:
    with jax.log_compiles(True):
      out = fn()
  finally:
    logger.removeHandler(handler)
    logger.setLevel(level)
  return sum(compiles), out


class BadInputTest(parameterized.TestCase):

  def test_shapes(self):
    logits = np.zeros((2, 5, 12), np.float32)
    labels = np.zeros((2, 5), np.int32)
    mask = np.ones((2, 5), bool)
    with self.assertRaisesRegex(ValueError, r"labels shape \(2, 4\)"):
      ntil_jax.ntil_loss(logits, labels[:, :4], mask[:, :4])
    with self.assertRaisesRegex(ValueError, r"digit_mask shape \(2, 4\)"):
      ntil_jax.emd_loss(logits, labels, mask[:, :4])
    with self.assertRaisesRegex(ValueError, r"rank >= 2"):
      ntil_jax.ntil_loss(np.zeros(12), labels[0, 0], mask[0, 0])
    with self.assertRaisesRegex(ValueError, r"integer"):
      ntil_jax.ntil_loss(logits, labels.astype(np.float32), mask)
    with self.assertRaisesRegex(ValueError, r"out of range.*V=12"):
      ntil_jax.ntil_loss(logits, labels, mask, digit_token_ids=np.arange(5, 15))
    with self.assertRaisesRegex(ValueError, r"10 ids"):
      ntil_jax.ntil_loss(logits, labels, mask, digit_token_ids=np.arange(9))
    # number_layout finds numbers of single digits: a NumberTokens is named
    # (it read as an array of shape (4, M)).
    tokens = ntil_jax.number_tokens([str(d) for d in range(10)] + ["12"])
    with self.assertRaisesRegex(ValueError, r"a NumberTokens .* losses"):
      ntil_jax.number_layout(labels, mask, digit_token_ids=tokens)
    with self.assertRaisesRegex(ValueError, r"V=8"):
      ntil_jax.ntil_loss(np.zeros((2, 5, 8)), labels, mask)
    with self.assertRaisesRegex(ValueError, r"unknown method 'mse'"):
      ntil_jax.numeric_token_loss(logits, labels, method="mse")
    with self.assertRaisesRegex(ValueError, r"loss_mask shape"):
      ntil_jax.numeric_token_loss(logits, labels, loss_mask=mask[:1])

  def test_traced_digit_ids_are_accepted(self):
    logits, labels, mask = random_case(40, digit_ids=PERMUTED_IDS)
    fn = jax.jit(
        lambda ids: ntil_jax.ntil_loss(
            logits, labels, mask, digit_token_ids=ids
        )
    )
    want, _, _ = oracle.ntil(logits, labels, mask, PERMUTED_IDS)
    np.testing.assert_allclose(
        fn(np.asarray(PERMUTED_IDS)), want, rtol=2e-5, atol=2e-6
    )


class DigitTokenIdsTest(parameterized.TestCase):

  def test_spellings(self):
    hf = {"hello": 0, **{str(d): 100 + d for d in range(10)}, "\u01201": 5}
    np.testing.assert_array_equal(
        ntil_jax.digit_token_ids(hf), np.arange(100, 110)
    )
    sentencepiece = ["<unk>", "<s>", "\u25813"] + [str(d) for d in range(10)]
    np.testing.assert_array_equal(
        ntil_jax.digit_token_ids(sentencepiece), np.arange(3, 13)
    )
    wordpiece = {"1": 4, **{f"##{d}": 20 + d for d in range(10)}}
    np.testing.assert_array_equal(
        ntil_jax.digit_token_ids(wordpiece), [20, 4, *range(22, 30)]
    )
    byte_fallback = {f"<0x3{d}>": 3 + d for d in range(10)}
    np.testing.assert_array_equal(
        ntil_jax.digit_token_ids(byte_fallback), np.arange(3, 13)
    )

  @parameterized.parameters("\u2581", "\u0120", " ")
  def test_digits_written_only_as_word_starts_are_refused(self, marker):
    # Each such token starts a word: "▁1▁2" is " 1 2", two numbers, which
    # ten digit ids would score as 12 (against 13: 1/14, not 2 vs 3's 1/4).
    pieces = ["<s>", "</s>", *(f"{marker}{d}" for d in range(10)), "+"]
    with self.assertRaisesRegex(ValueError, "only as word starts.*number_tok"):
      ntil_jax.digit_token_ids(pieces)
    labels = jnp.array([[3, 4]])
    logits = jnp.full((1, 2, 13), -10.0).at[0, 0, 3].set(10.0)
    logits = logits.at[0, 1, 5].set(10.0)  # " 1 3"
    parts = ntil_jax.ntil_components(
        logits, labels, digit_token_ids=ntil_jax.number_tokens(pieces)
    )
    np.testing.assert_allclose(parts.relative, [[0.0, 0.25]], rtol=1e-6)

  def test_missing_digits(self):
    vocab = {str(d): d for d in range(10) if d not in (4, 7)}
    with self.assertRaisesRegex(ValueError, r"digit\(s\) 4, 7"):
      ntil_jax.digit_token_ids(vocab)

  def test_model_vocab_larger_than_tokenizer(self):
    vocab = {"a": 0, **{str(d): 10 - d for d in range(10)}}  # ids 1..10
    ids = ntil_jax.digit_token_ids(vocab)
    logits, labels, mask = random_case(41, vocab=64, digit_ids=ids)
    want, _, _ = oracle.ntil(logits, labels, mask, ids)
    np.testing.assert_allclose(
        ntil_jax.ntil_loss(logits, labels, mask, digit_token_ids=ids),
        want,
        rtol=2e-5,
        atol=2e-6,
    )


if __name__ == "__main__":
  absltest.main()
