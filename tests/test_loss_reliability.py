"""Reliability of the loss library (issue 11, items 1-5).

Expected values come from exact integer / Fraction arithmetic, float64 NumPy
or tests/oracle.py, never from ntil_jax itself (except where a test checks
that two ways of calling ntil_jax agree).
"""

from fractions import Fraction
import functools
import math

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
from jax.sharding import AxisType
from jax.sharding import PartitionSpec as P
import numpy as np

import ntil_jax
from tests import oracle
from tests.test_losses import random_case

jax.config.update("jax_default_matmul_precision", "highest")

FILLER = 12  # a non-digit label
VOCAB = 16


# ----------------------------------------------------------------------------
# Item 1: long integers.


def exact_deviations(target, predicted):
  """(rel, mag) of two digit lists (most significant first), in float64."""
  y = int("".join(map(str, target)))
  x = int("".join(map(str, predicted)))
  hi, lo, diff = max(x, y), min(x, y), abs(x - y)
  rel = float(Fraction(diff, hi + 1))
  ratio = Fraction(diff, lo + 1)
  if ratio <= 1:
    mag = math.log1p(float(ratio))
  else:  # math.log is exact to float64 for Python integers of any size
    mag = math.log(hi + 1) - math.log(lo + 1)
  return rel, mag


def exact_place_gradient(target, predicted, alpha, beta):
  """d(alpha rel + beta mag)/d x_i for every predicted digit, as Fractions."""
  y = int("".join(map(str, target)))
  x = int("".join(map(str, predicted)))
  if x > y:
    d_value = alpha * Fraction(y + 1, (x + 1) ** 2) + beta * Fraction(1, x + 1)
  elif x < y:
    d_value = -alpha * Fraction(1, y + 1) - beta * Fraction(1, x + 1)
  else:
    d_value = Fraction(0)
  n = len(target)
  return [d_value * 10 ** (n - 1 - i) for i in range(n)]


def number_rows(rows, width):
  """Labels and logits for (target, predicted) digit lists, one row each.

  Digit logits are ``2 * onehot(predicted) + 0.5 * noise``: the argmax is the
  predicted digit, and the softmax at tau = 1 is soft enough for a gradient.
  """
  rng = np.random.default_rng(0)
  labels = np.full((len(rows), width), FILLER, np.int32)
  logits = 0.5 * rng.random((len(rows), width, VOCAB))
  for r, (target, predicted) in enumerate(rows):
    labels[r, : len(target)] = target
    logits[r, np.arange(len(predicted)), predicted] += 2.0
  return labels, logits.astype(np.float32)


def long_number_rows(lengths, seed=0):
  """Targets and predictions that cover the ways long numbers went wrong."""
  rng = np.random.default_rng(seed)
  rows = []
  for n in lengths:
    digits = lambda: [int(d) for d in rng.integers(0, 10, n)]
    target = digits()
    target[0] = int(rng.integers(1, 10))
    # A predicted leading 0 (the issue's repro class).
    predicted = digits()
    predicted[0] = 0
    rows.append((target, predicted))
    # 10**(n-1) against 10**(n-1) - 1 (written 0999...9).
    rows.append(([1] + [0] * (n - 1), [0] + [9] * (n - 1)))
    # The last digit off by one: a tiny relative deviation.
    close = list(target)
    close[-1] = (close[-1] + 1) % 10 if close[-1] != 9 else 8
    rows.append((target, close))
    # Targets with leading zeros, predictions all zeros or random.
    zeros = int(rng.integers(0, n))
    padded = [0] * zeros + target[zeros:]
    rows.append((padded, [0] * n))
    rows.append((padded, digits()))
    # Two numbers far apart: a prediction with many leading zeros.
    few = [0] * n
    few[-1] = int(rng.integers(1, 10))
    rows.append((target, few))
  return rows


LENGTHS = (
    1,
    2,
    5,
    18,
    19,
    20,
    21,
    25,
    30,
    31,
    38,
    39,
    40,
    45,
    46,
    50,
    64,
    100,
    250,
    1000,
)


class LongIntegerTest(parameterized.TestCase):

  def test_issue_reproduction_has_finite_gradient(self):
    # n=20; labels=[[1]+[0]*(n-1)]; logits=4*one_hot([[0]+[9]*(n-1)], 16),
    # one row per length (the filler after each number ends it).
    lengths = (20, 21, 31, 64, 200)
    labels = np.full((len(lengths), 201), FILLER)
    predicted = np.full((len(lengths), 201), FILLER)
    for r, n in enumerate(lengths):
      labels[r, :n] = [1] + [0] * (n - 1)
      predicted[r, :n] = [0] + [9] * (n - 1)
    logits = 4 * jax.nn.one_hot(predicted, 16)
    row_loss = lambda z, y: ntil_jax.ntil_loss(z[None], y[None]).sum()
    with jax.debug_nans(True):
      value, grad = jax.jit(jax.vmap(jax.value_and_grad(row_loss)))(
          logits, labels
      )
    self.assertTrue(np.isfinite(value).all())
    self.assertTrue(np.isfinite(grad).all())

  def test_ten_to_the_nineteen_minus_one(self):
    # 10**19 against 10**19 - 1: rel = 1 / (10**19 + 1), mag = log1p(1e-19).
    labels = np.array([[1] + [0] * 19])
    logits = 4 * np.eye(16, dtype=np.float32)[[[0] + [9] * 19]]
    parts = ntil_jax.ntil_components(logits, labels)
    np.testing.assert_allclose(
        parts.relative[0, -1], float(Fraction(1, 10**19 + 1)), rtol=1e-5
    )
    np.testing.assert_allclose(
        parts.magnitude[0, -1], math.log1p(1e-19), rtol=1e-5
    )

  def test_values_against_exact_arithmetic(self):
    rows = long_number_rows(LENGTHS)
    width = max(LENGTHS) + 1
    labels, logits = number_rows(rows, width)
    parts = jax.jit(ntil_jax.ntil_components)(logits, labels)
    for r, (target, predicted) in enumerate(rows):
      n = len(target)
      np.testing.assert_array_equal(parts.predicted_digits[r, :n], predicted)
      rel, mag = exact_deviations(target, predicted)
      msg = f"row {r}, {n} digits"
      np.testing.assert_allclose(
          parts.relative[r, n - 1], rel, rtol=1e-5, atol=1e-37, err_msg=msg
      )
      np.testing.assert_allclose(
          parts.magnitude[r, n - 1], mag, rtol=1e-5, atol=1e-37, err_msg=msg
      )
    self.assertTrue(np.isfinite(parts.relative).all())
    self.assertTrue(np.isfinite(parts.magnitude).all())

  def test_every_length_up_to_a_thousand(self):
    # Every length 1..1000, a predicted leading zero (and a leading target
    # zero on odd lengths): exact values, a finite gradient.
    rng = np.random.default_rng(7)
    rows = []
    for n in range(1, 1001):
      target = [int(d) for d in rng.integers(0, 10, n)]
      target[0] = 0 if n % 2 and n > 1 else int(rng.integers(1, 10))
      predicted = [int(d) for d in rng.integers(0, 10, n)]
      predicted[0] = 0
      rows.append((target, predicted))
    labels, logits = number_rows(rows, 1001)
    loss = lambda z: ntil_jax.ntil_loss(z, labels).sum()
    parts, grad = jax.jit(
        lambda z: (ntil_jax.ntil_components(z, labels), jax.grad(loss)(z))
    )(logits)
    want = np.array([exact_deviations(t, p) for t, p in rows])
    last = np.arange(1000)
    np.testing.assert_allclose(
        parts.relative[last, last], want[:, 0], rtol=1e-5, atol=1e-37
    )
    np.testing.assert_allclose(
        parts.magnitude[last, last], want[:, 1], rtol=1e-5, atol=1e-37
    )
    self.assertTrue(np.isfinite(grad).all())

  def test_gradients_against_exact_arithmetic(self):
    rows = long_number_rows(LENGTHS, seed=1)
    width = max(LENGTHS) + 1
    labels, logits = number_rows(rows, width)
    alpha, beta, tau = 0.3, 0.2, 1.0
    loss = lambda z: ntil_jax.ntil_loss(
        z, labels, sigma=0.0, alpha=alpha, beta=beta, tau=tau
    ).sum()
    with jax.debug_nans(True):
      grad = np.asarray(jax.jit(jax.grad(loss))(logits), np.float64)
    self.assertTrue(np.isfinite(grad).all())
    z = logits.astype(np.float64)[..., :10]
    k = np.arange(10)
    eps = np.finfo(np.float32).eps
    for r, (target, predicted) in enumerate(rows):
      n = len(target)
      # Unweighted EMD: p (|k - y| - EMD); straight-through: dX/dz = J.
      p = np.exp(z[r, :n]) / np.exp(z[r, :n]).sum(-1, keepdims=True)
      dist = np.abs(k - np.asarray(target)[:, None])
      emd = (p * dist).sum(-1, keepdims=True)
      s = np.exp(z[r, :n] / tau) / np.exp(z[r, :n] / tau).sum(-1, keepdims=True)
      jac = s * (k - (s @ k)[:, None]) / tau
      place_grads = exact_place_gradient(
          target, predicted, Fraction(alpha), Fraction(beta)
      )
      for i, g in enumerate(place_grads):
        if abs(g) > 10**25:  # past float32's comfortable range: finite only
          continue
        want = p[i] * (dist[i] - emd[i]) + float(g) * jac[i]
        # The softmax backward cancels terms of size |g| * 9 * s / tau: a
        # float32 rounding of a few ulps of that.
        rounding = 16 * eps * (abs(float(g)) * 9 * s[i] / tau + 9)
        np.testing.assert_array_less(
            np.abs(grad[r, i, :10] - want),
            2e-5 + 1e-4 * np.abs(want) + rounding,
            err_msg=f"row {r}, {n} digits, digit {i}",
        )
      np.testing.assert_array_equal(grad[r, n:], 0.0)

  @parameterized.parameters(20, 23, 26, 31)
  def test_predicted_leading_zero_against_oracle(self, length):
    # The issue's failing class: 20-31 digits, a predicted leading 0.
    rng = np.random.default_rng(length)
    labels = np.full((8, length + 2), FILLER)
    labels[:, 1:-1] = rng.integers(0, 10, (8, length))
    labels[:, 1] = rng.integers(1, 10, 8)
    logits = rng.standard_normal((8, length + 2, VOCAB)).astype(np.float32)
    logits[:, 1, 0] += 6.0
    mask = np.ones(labels.shape, bool)
    want, want_grad, parts = oracle.ntil(logits, labels, mask)
    fn = jax.jit(lambda z: ntil_jax.ntil_loss(z, labels, mask))
    got = fn(logits)
    grad = jax.grad(lambda z: fn(z).sum())(logits)
    self.assertTrue(np.isfinite(grad).all())
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)
    rounding = 4 * np.finfo(np.float32).eps * 9 * parts["weights"][..., None]
    np.testing.assert_array_less(
        np.abs(grad - want_grad), 2e-5 + 1e-4 * np.abs(want_grad) + rounding
    )

  def test_long_decimal_numbers(self):
    # 25 integer digits, a point, 20 fractional digits; a leading 0 predicted.
    rng = np.random.default_rng(3)
    labels = np.full((4, 48), FILLER)
    labels[:, 1:26] = rng.integers(0, 10, (4, 25))
    labels[:, 26] = 10  # the point
    labels[:, 27:47] = rng.integers(0, 10, (4, 20))
    labels[:, 1] = rng.integers(1, 10, 4)
    point = labels == 10
    logits = rng.standard_normal((4, 48, VOCAB)).astype(np.float32)
    logits[:2, 1, 0] += 6.0
    mask = np.ones(labels.shape, bool)
    want, want_grad, parts = oracle.ntil(
        logits, labels, mask, decimal_mask=point
    )
    fn = jax.jit(
        lambda z: ntil_jax.ntil_loss(z, labels, mask, decimal_point_mask=point)
    )
    np.testing.assert_allclose(fn(logits), want, rtol=2e-5, atol=2e-6)
    grad = jax.jit(jax.grad(lambda z: fn(z).sum()))(logits)
    self.assertTrue(np.isfinite(grad).all())
    rounding = 4 * np.finfo(np.float32).eps * 9 * parts["weights"][..., None]
    np.testing.assert_array_less(
        np.abs(grad - want_grad), 2e-5 + 1e-4 * np.abs(want_grad) + rounding
    )


# ----------------------------------------------------------------------------
# Item 2: parameters.


def small_case():
  rng = np.random.default_rng(0)
  logits = rng.standard_normal((1, 5, 12)).astype(np.float32)
  labels = np.array([[1, 2, 3, 11, 4]])
  return logits, labels


def _stats_call(**kwargs):
  logits, labels = small_case()
  stats = ntil_jax.token_statistics(logits, labels)
  return ntil_jax.loss_from_statistics(stats, labels, vocab_size=12, **kwargs)


def _fused_call(**kwargs):
  rng = np.random.default_rng(1)
  hidden = rng.standard_normal((1, 5, 4)).astype(np.float32)
  unembedding = rng.standard_normal((4, 12)).astype(np.float32)
  return ntil_jax.fused_numeric_loss(
      hidden, unembedding, small_case()[1], **kwargs
  )


def _call(fn_name, **kwargs):
  if fn_name == "loss_from_statistics":
    return _stats_call(**kwargs)
  if fn_name == "fused_numeric_loss":
    return _fused_call(**kwargs)
  if fn_name == "check_method":
    method = kwargs.pop("method", "ntil")
    return ntil_jax.losses.check_method(method, "sum", kwargs)
  return getattr(ntil_jax, fn_name)(*small_case(), **kwargs)


BAD_PARAMETERS = (
    ("ntil_loss", dict(tau=0.0), "tau"),
    ("ntil_loss", dict(tau=-0.5), "tau"),
    ("ntil_loss", dict(tau=1e-38), "tau"),  # its gradient was NaN
    ("ntil_loss", dict(tau=float("nan")), "tau"),
    ("ntil_components", dict(tau=0.0), "tau"),
    ("ntil_loss", dict(sigma=-1.0), "sigma"),
    ("ntil_components", dict(sigma=-3.0), "sigma"),
    ("ntil_loss", dict(alpha=-0.1), "alpha"),
    ("ntil_loss", dict(beta=-0.1), "beta"),
    ("ntil_loss", dict(noise_scale=-0.01), "noise_scale"),
    ("ntil_components", dict(noise_scale=-1.0), "noise_scale"),
    ("soft_label_cross_entropy", dict(width=0.0), "width"),
    ("soft_label_cross_entropy", dict(width=-1.0), "width"),
    ("soft_label_cross_entropy", dict(eta=1.5), "eta"),
    ("soft_label_cross_entropy", dict(eta=-0.1), "eta"),
    ("numeric_token_loss", dict(method="ntil", tau=0.0), "tau"),
    ("numeric_token_loss", dict(method="ntil", lam=-1.0), "lam"),
    ("numeric_token_loss", dict(method="emd", lam=-0.5), "lam"),
    # None: named, not a TypeError from None * an array.
    ("numeric_token_loss", dict(method="ntil", lam=None), "lam must be a"),
    ("fused_numeric_loss", dict(method="emd", lam=None), "lam must be a"),
    ("numeric_token_loss", dict(method="soft_label", width=0.0), "width"),
    ("numeric_token_loss", dict(method="soft_label", eta=2.0), "eta"),
    (
        "numeric_token_loss",
        dict(method="ntil", sigma=np.float32(-1.5)),
        "sigma",
    ),
    ("fused_numeric_loss", dict(method="ntil", tau=0.0), "tau"),
    ("fused_numeric_loss", dict(method="ntil", lam=-1.0), "lam"),
    ("fused_numeric_loss", dict(method="soft_label", width=-2.0), "width"),
    ("loss_from_statistics", dict(method="ntil", tau=0.0), "tau"),
    ("loss_from_statistics", dict(method="ntil", lam=-0.1), "lam"),
    ("loss_from_statistics", dict(method="ntil", beta=-1.0), "beta"),
    ("check_method", dict(method="ntil", tau=0.0), "tau"),
    ("check_method", dict(method="ntil", noise_scale=-1.0), "noise_scale"),
    ("check_method", dict(method="soft_label", eta=1.01), "eta"),
    # Arrays of several values: refused by name, not a TypeError deep inside.
    ("ntil_loss", dict(sigma=[0.2, 0.3]), "sigma must be a scalar"),
    ("numeric_token_loss", dict(method="emd", lam=np.ones(2)), "lam"),
)


class ParameterTest(parameterized.TestCase):

  @parameterized.parameters(*BAD_PARAMETERS)
  def test_bad_value_names_the_argument(self, fn_name, kwargs, name):
    with self.assertRaisesRegex(ValueError, rf"\b{name}\b"):
      _call(fn_name, **kwargs)

  def test_soft_digit_targets(self):
    with self.assertRaisesRegex(ValueError, r"\bwidth\b"):
      ntil_jax.soft_digit_targets(np.arange(10), eta=0.5, width=0.0)
    with self.assertRaisesRegex(ValueError, r"\beta\b"):
      ntil_jax.soft_digit_targets(np.arange(10), eta=-1.0, width=1.0)

  def test_extreme_temperature_and_width_stay_finite(self):
    logits, labels = small_case()
    logits = 5.0 * logits
    grad = jax.grad(lambda z: ntil_jax.ntil_loss(z, labels, tau=1e-30).sum())
    self.assertTrue(np.isfinite(grad(logits)).all())
    # A width of 1e-20 is the one-hot target: the soft-label CE is the CE on
    # digits (width**2 underflowed: the loss was 0, its gradient NaN).
    fn = lambda z: ntil_jax.soft_label_cross_entropy(z, labels, width=1e-20)
    digits = np.asarray(labels) < 10
    ce = ntil_jax.cross_entropy(logits, labels)
    np.testing.assert_allclose(
        np.asarray(fn(logits))[digits], np.asarray(ce)[digits], rtol=1e-6
    )
    self.assertTrue(np.isfinite(jax.grad(lambda z: fn(z).sum())(logits)).all())

  def test_the_smallest_widths_allowed_are_one_hot_and_below_are_refused(self):
    # Below 1e-30 the distances in widths turned 0/0 (a soft-label CE of 0
    # with a NaN gradient at 1e-39; SMMD NaN from sigmas of 1e-20, whose
    # squares underflowed).
    logits, labels = small_case()
    digits = np.asarray(labels) < 10
    ce = np.asarray(ntil_jax.cross_entropy(logits, labels))[digits]
    soft = lambda z: ntil_jax.soft_label_cross_entropy(z, labels, width=1e-30)
    np.testing.assert_allclose(np.asarray(soft(logits))[digits], ce, rtol=1e-6)
    self.assertTrue(
        np.isfinite(jax.grad(lambda z: soft(z).sum())(logits)).all()
    )
    # SMMD with a one-hot kernel, at uniform digit logits: 1 - 2/10 + 1/10.
    uniform = jnp.zeros((1, 2, 12))
    two_digits = jnp.array([[3, 4]])
    for kernel in ("gaussian", "laplace"):
      for sigma in (1e-20, 1e-30):
        smmd = ntil_jax.smmd_loss(
            uniform, two_digits, sigmas=(sigma,), kernel=kernel
        )
        np.testing.assert_allclose(smmd, [[0.9, 0.9]], rtol=1e-6)
    with self.assertRaisesRegex(ValueError, r"sigmas must be >= 1e-30"):
      ntil_jax.smmd_loss(uniform, two_digits, sigmas=(1e-31,))
    with self.assertRaisesRegex(ValueError, r"width must be >= 1e-30"):
      ntil_jax.soft_label_cross_entropy(uniform, two_digits, width=1e-31)

  def test_edge_values_are_accepted(self):
    logits, labels = small_case()
    for kwargs in (
        dict(sigma=0.0),
        dict(sigma=-0.5),
        dict(alpha=0.0),
        dict(beta=0.0),
        dict(noise_scale=0.0),
        dict(tau=1e-3),
    ):
      self.assertTrue(
          np.isfinite(ntil_jax.ntil_loss(logits, labels, **kwargs)).all()
      )
    for eta in (0.0, 1.0):
      self.assertTrue(
          np.isfinite(
              ntil_jax.soft_label_cross_entropy(logits, labels, eta=eta)
          ).all()
      )
    self.assertTrue(
        np.isfinite(ntil_jax.numeric_token_loss(logits, labels, lam=0.0)).all()
    )

  def test_traced_values_are_not_checked(self):
    logits, labels = small_case()
    fn = jax.jit(
        lambda tau, lam: ntil_jax.numeric_token_loss(
            logits, labels, lam=lam, tau=tau
        )
    )
    want = ntil_jax.numeric_token_loss(logits, labels, lam=0.3, tau=0.1)
    np.testing.assert_allclose(fn(0.1, 0.3), want, rtol=1e-6)
    width_fn = jax.jit(
        lambda w: ntil_jax.soft_label_cross_entropy(logits, labels, width=w)
    )
    self.assertTrue(np.isfinite(width_fn(2.0)).all())

  @parameterized.parameters(
      "numeric_token_loss",
      "fused_numeric_loss",
      "loss_from_statistics",
      "check_method",
  )
  def test_misspelled_keyword(self, fn_name):
    with self.assertRaisesRegex(ValueError, r"sgima") as caught:
      _call(fn_name, method="ntil", sgima=0.1)
    message = str(caught.exception)
    self.assertIn("ntil_loss", message)
    for valid in ("sigma", "alpha", "beta", "tau", "key", "noise_scale"):
      self.assertIn(valid, message)
    self.assertNotIn("ntil_parts_from_layout", message)
    with self.assertRaisesRegex(
        ValueError, r"soft_label_cross_entropy.*eta.*width"
    ):
      _call(fn_name, method="soft_label", sigma=0.1)
    with self.assertRaisesRegex(ValueError, r"emd_loss"):
      _call(fn_name, method="emd", tau=0.1)

  def test_misspelled_keyword_is_also_a_type_error(self):
    # Python's own unexpected-keyword error is a TypeError: catch either.
    with self.assertRaises(TypeError):
      _call("numeric_token_loss", method="ntil", sgima=0.1)


# ----------------------------------------------------------------------------
# Item 3: digit ids.

DUPLICATE_IDS = (0, 1, 2, 2, 4, 5, 6, 7, 8, 9)


class DigitIdTest(parameterized.TestCase):

  @parameterized.parameters(
      "ntil_loss",
      "ntil_components",
      "emd_loss",
      "ntl_mse_loss",
      "soft_label_cross_entropy",
      "numeric_token_loss",
      "number_layout",
  )
  def test_duplicate_ids_are_refused(self, fn_name):
    logits, _ = small_case()
    labels = np.array([[3, 3, 3, 11, 3]])
    fn = getattr(ntil_jax, fn_name)
    args = (labels,) if fn_name == "number_layout" else (logits, labels)
    for ids in (
        DUPLICATE_IDS,
        np.asarray(DUPLICATE_IDS),
        jnp.asarray(DUPLICATE_IDS),
    ):
      with self.assertRaisesRegex(ValueError, r"digit_token_ids.*(twice|dup)"):
        fn(*args, digit_token_ids=ids)

  def test_duplicate_ids_are_refused_by_the_fused_path(self):
    with self.assertRaisesRegex(ValueError, r"digit_token_ids.*(twice|dup)"):
      _fused_call(digit_token_ids=DUPLICATE_IDS)

  @parameterized.named_parameters(
      ("duplicate", DUPLICATE_IDS),
      ("too_large", tuple(range(5, 15))),
      ("negative", (-1,) + tuple(range(1, 10))),
  )
  def test_bad_traced_ids_give_nan_not_a_wrong_value(self, ids):
    logits, _ = small_case()
    filler = min(set(range(12)) - set(ids))
    labels = np.array([[ids[3], ids[3], ids[3], filler, ids[1]]])
    digits = np.array([[True, True, True, False, True]])
    for fn in (
        ntil_jax.ntil_loss,
        ntil_jax.emd_loss,
        ntil_jax.ntl_mse_loss,
        ntil_jax.soft_label_cross_entropy,
    ):
      got = jax.jit(lambda i, fn=fn: fn(logits, labels, digit_token_ids=i))(
          np.asarray(ids)
      )
      self.assertTrue(np.isnan(got[digits]).all(), fn.__name__)
      np.testing.assert_array_equal(got[~digits], 0.0)

  def test_good_traced_ids_still_work(self):
    logits, labels, mask = random_case(5, digit_ids=range(2, 12), vocab=16)
    want, _, _ = oracle.ntil(logits, labels, mask, range(2, 12))
    got = jax.jit(
        lambda i: ntil_jax.ntil_loss(logits, labels, mask, digit_token_ids=i)
    )(np.arange(2, 12))
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)

  @parameterized.parameters(np.uint8, np.int8, np.int16, np.uint16)
  def test_narrow_labels_do_not_wrap(self, dtype):
    # uint8 44 is not token 300 (300 mod 256 = 44).
    logits = (
        np.random.default_rng(0).standard_normal((1, 3, 320)).astype(np.float32)
    )
    ids = np.arange(300, 310)
    labels = np.array([[44, 45, 46]]).astype(dtype)
    for fn in (
        ntil_jax.ntil_loss,
        ntil_jax.emd_loss,
        ntil_jax.ntl_mse_loss,
        ntil_jax.soft_label_cross_entropy,
    ):
      np.testing.assert_array_equal(
          fn(logits, labels, digit_token_ids=ids), 0.0, err_msg=fn.__name__
      )
    layout = ntil_jax.number_layout(labels, digit_token_ids=ids)
    self.assertFalse(np.asarray(layout.is_digit).any())
    combined = ntil_jax.numeric_token_loss(logits, labels, digit_token_ids=ids)
    ce = -jax.nn.log_softmax(logits.astype(np.float64))[
        0, [0, 1, 2], [44, 45, 46]
    ]
    np.testing.assert_allclose(combined[0], ce, rtol=1e-5)

  @parameterized.parameters(np.int64, np.uint64)
  def test_wide_labels_do_not_wrap(self, dtype):
    # In JAX's 32-bit mode an int64 2**32 + 3 became int32 3, the digit '3',
    # and was scored; it is past any vocabulary, and refused where scored.
    logits = np.zeros((1, 2, 14), np.float32)
    labels = np.array([[2**32 + 3, 11]]).astype(dtype)
    for fn in (ntil_jax.ntil_loss, ntil_jax.numeric_token_loss):
      with self.assertRaisesRegex(ValueError, r"labels must be in \[0, V=14\)"):
        fn(logits, labels)
    # Not scored (loss_mask false there): 0, as any label >= V.
    got = ntil_jax.numeric_token_loss(
        logits, labels, loss_mask=np.array([[False, True]])
    )
    np.testing.assert_allclose(got[0], [0.0, np.log(14.0)], rtol=1e-6)
    if dtype == np.int64:  # below int32's range: a negative, ignored id
      labels = np.array([[-(2**32) + 3, 11]], dtype)
      np.testing.assert_allclose(
          ntil_jax.numeric_token_loss(logits, labels)[0],
          [0.0, np.log(14.0)],
          rtol=1e-6,
      )

  def test_narrow_labels_still_match_small_ids(self):
    logits, labels, mask = random_case(
        6, vocab=40, ignore_frac=0.0, digit_ids=range(20, 30)
    )
    want, _, _ = oracle.ntil(logits, labels, mask, range(20, 30))
    got = ntil_jax.ntil_loss(
        logits,
        labels.astype(np.uint8),
        mask,
        digit_token_ids=np.arange(20, 30, dtype=np.int64),
    )
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)

  @parameterized.parameters(
      (np.uint8, 300, 200), (np.int8, 200, 100), (np.int16, 32768, 1000)
  )
  def test_narrow_labels_are_scored(self, dtype, vocab, label):
    # In the label dtype, V wraps (uint8(300) == 44, int16(32768) < 0): the
    # comparison with V must not score real tokens as ignored.
    rng = np.random.default_rng(1)
    logits = rng.standard_normal((1, 3, vocab)).astype(np.float32)
    labels = np.array([[3, label, 7]])
    log_probs = jax.nn.log_softmax(logits.astype(np.float64))
    ce = -log_probs[0, [0, 1, 2], labels[0]]
    narrow = labels.astype(dtype)
    np.testing.assert_allclose(
        ntil_jax.cross_entropy(logits, narrow)[0], ce, rtol=1e-5
    )
    for method in ("ce", "ntil"):
      got = ntil_jax.numeric_token_loss(logits, narrow, method=method)
      want = ntil_jax.numeric_token_loss(logits, labels, method=method)
      np.testing.assert_allclose(got, want, rtol=1e-6, err_msg=method)
      self.assertGreater(float(got[0, 1]), 1.0)  # scored: about log V
    stats = ntil_jax.token_statistics(logits, narrow)
    np.testing.assert_allclose(
        stats.label_logits[0], logits[0, [0, 1, 2], labels[0]], rtol=1e-6
    )
    np.testing.assert_allclose(
        ntil_jax.loss_from_statistics(stats, narrow, vocab_size=vocab)[0],
        ntil_jax.numeric_token_loss(logits, labels)[0],
        rtol=1e-5,
    )
    hidden = rng.standard_normal((1, 3, 4)).astype(np.float32)
    unembedding = rng.standard_normal((4, vocab)).astype(np.float32)
    np.testing.assert_allclose(
        ntil_jax.fused_numeric_loss(hidden, unembedding, narrow),
        ntil_jax.numeric_token_loss(hidden @ unembedding, labels),
        rtol=1e-4,
        atol=1e-5,
    )


# ----------------------------------------------------------------------------
# Item 4: the fused path's edge cases, logits given as lists.


class FusedEdgeCaseTest(parameterized.TestCase):

  @parameterized.parameters(
      ((2, 0),), ((0, 5),), ((0, 0),), ((3, 0, 4),), ((0, 2, 4),)
  )
  def test_empty_batch_or_sequence(self, shape):
    rng = np.random.default_rng(0)
    hidden = rng.standard_normal(shape + (8,)).astype(np.float32)
    unembedding = rng.standard_normal((8, 12)).astype(np.float32)
    labels = np.zeros(shape, np.int32)
    for method in ("ce", "ntil", "soft_label"):
      got = ntil_jax.fused_numeric_loss(
          hidden, unembedding, labels, method=method
      )
      self.assertEqual(got.shape, shape)
      self.assertEqual(got.dtype, jnp.float32)
      want = ntil_jax.numeric_token_loss(
          hidden @ unembedding, labels, method=method
      )
      self.assertEqual(want.shape, shape)
      grad = jax.grad(
          lambda w, m=method: ntil_jax.fused_numeric_loss(
              hidden, w, labels, method=m
          ).sum()
      )(unembedding)
      np.testing.assert_array_equal(grad, 0.0)
    if len(shape) == 2:
      stats = ntil_jax.fused_token_statistics(hidden, unembedding, labels)
      self.assertEqual(stats.digit_logits.shape, shape + (10,))

  @parameterized.parameters(("8",), (2.5,), (True,), ([4],), (np.float32(4.0),))
  def test_chunk_size_type(self, chunk_size):
    with self.assertRaisesRegex(ValueError, "chunk_size"):
      _fused_call(chunk_size=chunk_size)
    rng = np.random.default_rng(0)
    with self.assertRaisesRegex(ValueError, "chunk_size"):
      ntil_jax.fused_token_statistics(
          rng.standard_normal((1, 5, 4)),
          rng.standard_normal((4, 12)),
          np.zeros((1, 5), np.int32),
          chunk_size=chunk_size,
      )

  def test_integer_chunk_sizes_are_accepted(self):
    want = _fused_call()
    for chunk_size in (1, np.int64(3), np.int32(100)):
      np.testing.assert_allclose(
          _fused_call(chunk_size=chunk_size), want, rtol=1e-5, atol=1e-6
      )

  @parameterized.parameters(
      "ntil_loss",
      "ntil_components",
      "emd_loss",
      "ntl_mse_loss",
      "soft_label_cross_entropy",
      "numeric_token_loss",
      "cross_entropy",
      "token_statistics",
  )
  def test_logits_as_python_lists(self, fn_name):
    logits, labels = small_case()
    fn = getattr(ntil_jax, fn_name)
    want = fn(logits, labels)
    got = fn(logits.tolist(), labels.tolist())
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
      np.testing.assert_allclose(g, w, rtol=1e-6)


# ----------------------------------------------------------------------------
# Inputs that used to be taken: float masks, labels outside the vocabulary
# where the loss mask scores, infinite loss weights.

ENTRY_POINTS = (
    "numeric_token_loss",
    "fused_numeric_loss",
    "loss_from_statistics",
)
# Every loss on logits alone (each as ``fn(logits, labels, **kwargs)``).
LOGITS_LOSSES = (
    "ntil_loss",
    "ntil_components",
    "emd_loss",
    "ntl_mse_loss",
    "soft_label_cross_entropy",
    "del_loss",
    "smmd_loss",
    "nl_ntl_loss",
)


def _entry_call(fn_name, labels, **kwargs):
  """``fn_name`` on `small_case`'s logits (V=12) with ``labels``."""
  logits, _ = small_case()
  if fn_name == "numeric_token_loss":
    return ntil_jax.numeric_token_loss(logits, labels, **kwargs)
  if fn_name == "fused_numeric_loss":
    rng = np.random.default_rng(1)
    hidden = rng.standard_normal((1, 5, 4)).astype(np.float32)
    unembedding = rng.standard_normal((4, 12)).astype(np.float32)
    return ntil_jax.fused_numeric_loss(hidden, unembedding, labels, **kwargs)
  stats = ntil_jax.token_statistics(logits, jnp.maximum(labels, 0) % 12)
  return ntil_jax.loss_from_statistics(stats, labels, vocab_size=12, **kwargs)


class RefusedInputTest(parameterized.TestCase):

  @parameterized.parameters(*ENTRY_POINTS)
  def test_float_masks_are_refused(self, fn_name):
    labels = small_case()[1]
    for name in ("digit_mask", "loss_mask", "decimal_point_mask"):
      for mask in (np.ones(labels.shape), np.full(labels.shape, np.nan)):
        with self.assertRaisesRegex(
            ValueError, rf"{name} must be a bool array .*float(32|64)"
        ):
          _entry_call(fn_name, labels, **{name: mask})

  @parameterized.parameters(*ENTRY_POINTS, "ntil_loss", "nl_ntl_loss")
  def test_a_point_mask_on_a_digit_is_refused(self, fn_name):
    labels = np.array([[1, 10, 5, 3, 11]])  # "1.53", '.' is id 10
    points = labels == 10
    call = functools.partial(_entry_call, fn_name)
    if fn_name in ("ntil_loss", "nl_ntl_loss"):
      fn = getattr(ntil_jax, fn_name)
      call = lambda labels, **kw: fn(small_case()[0], labels, **kw)
    call(labels, decimal_point_mask=points)  # the point: accepted
    points[0, 2] = True  # and the digit 5
    with self.assertRaisesRegex(
        ValueError, r"decimal_point_mask marks .* label 5 at index \(0, 2\)"
    ):
      call(labels, decimal_point_mask=points)
    # Traced, it cannot be checked: a mark on a digit is ignored ("123" as
    # it is; its 2 was taken as a digit and a point at once, places 0 0 -1).
    labels = np.array([[1, 2, 3, 11, 11]])
    traced = jax.jit(lambda p: call(labels, decimal_point_mask=p))
    np.testing.assert_array_equal(
        traced(jnp.asarray(labels == 2)), traced(jnp.asarray(labels == 10))
    )

  @parameterized.parameters(*ENTRY_POINTS, *LOGITS_LOSSES, "number_layout")
  def test_a_sequence_axis_that_is_no_manual_axis_is_refused(self, fn_name):
    logits, labels = small_case()
    call = functools.partial(_entry_call, fn_name, labels)
    if fn_name == "number_layout":
      call = functools.partial(ntil_jax.number_layout, labels)
    elif fn_name not in ENTRY_POINTS:
      call = functools.partial(getattr(ntil_jax, fn_name), logits, labels)
    for axis, message in (
        ("seq", r"names \['seq'\], which are not manual mesh axes here"),
        (("data", 3), "must be a mesh axis name or a non-empty tuple"),
        ((), "must be a mesh axis name or a non-empty tuple"),
    ):
      with self.assertRaisesRegex(ValueError, message):
        call(sequence_axis=axis)

  def test_a_sequence_axis_of_one_shard_is_the_unsharded_loss(self):
    """Inside ``shard_map`` on one device: T whole on its one shard; a
    name that is not among the manual axes is refused by name."""
    logits, labels = small_case()
    mesh = jax.make_mesh((1,), ("seq",), axis_types=(AxisType.Auto,))

    def sharded(axis):
      return jax.jit(
          jax.shard_map(
              lambda z, l: ntil_jax.ntil_loss(z, l, sequence_axis=axis),
              mesh=mesh,
              in_specs=(P(None, "seq"),) * 2,
              out_specs=P(None, "seq"),
          )
      )(logits, labels)

    np.testing.assert_allclose(
        sharded("seq"), ntil_jax.ntil_loss(logits, labels), rtol=1e-6
    )
    with self.assertRaisesRegex(ValueError, r"manual axes: \('seq',\)"):
      sharded("data")

  def test_integer_masks_count_nonzero_as_true(self):
    logits, labels = small_case()
    keep = np.array([[True, True, False, True, True]])
    loss = jax.jit(
        lambda loss_mask, digit_mask: ntil_jax.numeric_token_loss(
            logits, labels, loss_mask=loss_mask, digit_mask=digit_mask
        )
    )
    np.testing.assert_array_equal(
        loss(keep.astype(np.int32), keep.astype(np.int8)), loss(keep, keep)
    )

  @parameterized.parameters(*ENTRY_POINTS)
  def test_labels_outside_the_vocabulary_where_scored_are_refused(
      self, fn_name
  ):
    labels = small_case()[1].copy()
    labels[0, 2] = 12  # V=12: no such token
    scored = np.ones(labels.shape, bool)
    with self.assertRaisesRegex(
        ValueError, r"labels must be in \[0, V=12\).*label 12 at index \(0, 2\)"
    ):
      _entry_call(fn_name, labels, loss_mask=scored)
    # Without a loss_mask every position is scored.
    with self.assertRaisesRegex(
        ValueError,
        r"labels must be in \[0, V=12\) anywhere \(no loss_mask is given\)"
        r".*label 12 at index \(0, 2\)",
    ):
      _entry_call(fn_name, labels)

  def test_labels_outside_the_vocabulary_where_not_scored_score_0(self):
    fn_name = "numeric_token_loss"
    labels = small_case()[1].copy()
    labels[0, 2] = 12  # V=12: no such token
    scored = np.ones(labels.shape, bool)
    # Not scored there, or an ignore id (-100): accepted, scores 0.
    unscored = scored.copy()
    unscored[0, 2] = False
    self.assertEqual(_entry_call(fn_name, labels, loss_mask=unscored)[0, 2], 0)
    labels[0, 2] = -100
    self.assertEqual(_entry_call(fn_name, labels, loss_mask=scored)[0, 2], 0)
    # Traced labels cannot be checked: the position scores 0 (documented).
    labels[0, 2] = 12
    traced = jax.jit(lambda y: _entry_call(fn_name, y, loss_mask=scored))
    self.assertEqual(traced(labels)[0, 2], 0)

  @parameterized.parameters(*ENTRY_POINTS)
  def test_loss_weights_must_be_finite_and_non_negative(self, fn_name):
    labels = small_case()[1]
    for lam, message in (
        (float("inf"), "lam must be finite, got inf"),
        (float("nan"), "lam must be >= 0, got nan"),
        (-1.0, "lam must be >= 0"),
    ):
      with self.assertRaisesRegex(ValueError, message):
        _entry_call(fn_name, labels, lam=lam)
    for name in ("alpha", "beta", "sigma", "tau", "noise_scale"):
      with self.assertRaisesRegex(ValueError, rf"{name} must be finite"):
        _entry_call(fn_name, labels, **{name: float("inf")})


# ----------------------------------------------------------------------------
# Item 5: NaN/inf logits at positions that are not scored.


def poisoned_case():
  """A case, its unscored positions, and logits with NaN/inf there."""
  logits, labels, mask = random_case(
      50, batch=2, length=12, vocab=16, ignore_frac=0.2
  )
  layout = ntil_jax.number_layout(labels, mask)
  unscored = ~np.asarray(layout.is_digit)
  poisoned = logits.copy()
  rows, cols = np.nonzero(unscored)
  fills = (np.nan, np.inf, -np.inf)
  for j, (b, t) in enumerate(zip(rows, cols)):
    poisoned[b, t, j % VOCAB] = fills[j % 3]
    if j % 2:
      poisoned[b, t] = fills[(j // 2) % 3]
  return logits, poisoned, labels, mask, unscored


class UnscoredNaNTest(parameterized.TestCase):

  @parameterized.parameters(
      "ntil_loss", "emd_loss", "ntl_mse_loss", "soft_label_cross_entropy"
  )
  def test_numeric_losses(self, fn_name):
    clean, poisoned, labels, mask, unscored = poisoned_case()
    self.assertGreater(unscored.sum(), 3)
    fn = getattr(ntil_jax, fn_name)
    kwargs = dict(key=jax.random.key(0)) if fn_name == "ntil_loss" else {}
    value_and_grad = jax.jit(
        jax.value_and_grad(lambda z: fn(z, labels, mask, **kwargs).sum())
    )
    for wrapped in (False, True):
      f = (
          (lambda z: fn(z, labels, mask, **kwargs))
          if not wrapped
          else (jax.jit(lambda z: fn(z, labels, mask, **kwargs)))
      )
      np.testing.assert_allclose(f(poisoned), f(clean), rtol=1e-6)
    _, grad = value_and_grad(poisoned)
    _, clean_grad = value_and_grad(clean)
    self.assertTrue(np.isfinite(grad).all())
    np.testing.assert_array_equal(grad[unscored], 0.0)
    np.testing.assert_allclose(grad, clean_grad, rtol=1e-6, atol=1e-7)

  @parameterized.product(
      bad=("-inf", "nan", "+inf"), reweigh=(False, True), jit=(False, True)
  )
  def test_a_broken_number_leaves_the_others_of_its_row(
      self, bad, reweigh, jit
  ):
    # NL-NTL sums each number by masked matmuls, where a scored digit with
    # no distribution (all ten logits -inf, a NaN, +inf) spread 0 * NaN to
    # every number of the row, values and gradients.
    labels = np.array([[1, 2, 11, 4, 5, 11, 7]])  # 12, 45 and 7
    clean = np.random.default_rng(0).standard_normal((1, 7, 16))
    clean = clean.astype(np.float32)
    broken = clean.copy()
    if bad == "+inf":
      broken[0, 0, 3] = np.inf
    else:
      broken[0, 0, :10] = float(bad)
    fn = lambda z: ntil_jax.nl_ntl_loss(z, labels, reweigh=reweigh)
    fn = jax.jit(fn) if jit else fn
    got, want = np.asarray(fn(broken))[0], np.asarray(fn(clean))[0]
    self.assertTrue(np.isnan(got[0]))  # the broken number's own
    np.testing.assert_allclose(got[1:], want[1:], rtol=1e-6)
    self.assertGreater(want[3], 0.0)
    grad = jax.grad(lambda z: jnp.nansum(fn(z)))
    got, want = np.asarray(grad(broken))[0], np.asarray(grad(clean))[0]
    self.assertTrue(np.isfinite(got[1:]).all())
    np.testing.assert_allclose(got[2:], want[2:], rtol=1e-5, atol=1e-7)

  @parameterized.parameters("ce", "emd", "ntl_mse", "soft_label", "ntil")
  def test_numeric_token_loss(self, method):
    clean, poisoned, labels, mask, unscored = poisoned_case()
    # Here CE scores every real token: poison only what loss_mask leaves out.
    loss_mask = ~unscored
    fn = lambda z: ntil_jax.numeric_token_loss(
        z, labels, loss_mask=loss_mask, digit_mask=mask, method=method
    )
    np.testing.assert_allclose(fn(poisoned), fn(clean), rtol=1e-6)
    grad = jax.grad(lambda z: fn(z).sum())(poisoned)
    self.assertTrue(np.isfinite(grad).all())
    np.testing.assert_array_equal(grad[unscored], 0.0)
    np.testing.assert_allclose(
        grad, jax.grad(lambda z: fn(z).sum())(clean), rtol=1e-6, atol=1e-7
    )

  def test_cross_entropy(self):
    clean, poisoned, labels, _, unscored = poisoned_case()
    fn = lambda z: ntil_jax.cross_entropy(z, labels, ~unscored)
    np.testing.assert_allclose(fn(poisoned), fn(clean), rtol=1e-6)
    grad = jax.grad(lambda z: fn(z).sum())(poisoned)
    self.assertTrue(np.isfinite(grad).all())
    np.testing.assert_array_equal(grad[unscored], 0.0)

  def test_fused_hidden_states(self):
    rng = np.random.default_rng(51)
    hidden = rng.standard_normal((2, 12, 8)).astype(np.float32)
    unembedding = rng.standard_normal((8, 16)).astype(np.float32)
    _, _, labels, mask, unscored = poisoned_case()
    poisoned = hidden.copy()
    poisoned[unscored] = np.nan
    fn = jax.jit(
        lambda h, w: ntil_jax.fused_numeric_loss(
            h, w, labels, mask, loss_mask=~unscored, chunk_size=8
        )
    )
    np.testing.assert_allclose(
        fn(poisoned, unembedding), fn(hidden, unembedding), rtol=1e-5, atol=1e-6
    )
    grads = jax.jit(jax.grad(lambda h, w: fn(h, w).sum(), argnums=(0, 1)))(
        poisoned, unembedding
    )
    self.assertTrue(all(np.isfinite(g).all() for g in grads))
    np.testing.assert_array_equal(grads[0][unscored], 0.0)


# ----------------------------------------------------------------------------
# The low-level API checks its inputs as the losses do.


def _low_level_case(vocab=12):
  rng = np.random.default_rng(2)
  logits = rng.standard_normal((2, 5, vocab)).astype(np.float32)
  labels = np.array([[1, 2, 3, 11, 4], [5, 6, 11, 7, 8]]) % vocab
  hidden = rng.standard_normal((2, 5, 4)).astype(np.float32)
  unembedding = rng.standard_normal((4, vocab)).astype(np.float32)
  return logits, labels, hidden, unembedding


def _bad_low_level_calls():
  """``(name, fn, args, kwargs, pattern)``: ``fn(*args, **kwargs)`` raises.

  ``args`` and ``kwargs`` hold arrays only (traced by ``jax.eval_shape``);
  static arguments are bound into ``fn``.
  """
  logits, labels, hidden, unembedding = _low_level_case()
  small_logits, small_labels, small_hidden, small_unembedding = _low_level_case(
      vocab=5
  )
  stats = ntil_jax.token_statistics(logits, labels)
  mask = np.ones(labels.shape, bool)
  bad_ids = np.arange(5, 15)
  token_statistics = ntil_jax.token_statistics
  digit_logits = ntil_jax.digit_logits
  fused = ntil_jax.fused_token_statistics
  from_stats = functools.partial(ntil_jax.loss_from_statistics, vocab_size=12)
  as_int = lambda x: x.astype(np.int32)
  as_float = lambda x: x.astype(np.float32)
  vocab_5 = r"vocabulary of >= 10.*V=5"
  ids_12 = r"digit_token_ids.*out of range.*V=12"
  return (
      # A plain tuple or None for the statistics: named, not AttributeError.
      (
          "from_stats_plain_tuple",
          from_stats,
          (tuple(ntil_jax.token_statistics(logits, labels)), labels),
          {},
          r"stats must be a TokenStatistics.*got tuple without log_norm",
      ),
      (
          "from_stats_none",
          from_stats,
          (None, labels),
          {},
          r"stats must be a TokenStatistics.*got NoneType",
      ),
      # token_statistics
      (
          "stats_vocab_5",
          token_statistics,
          (small_logits, small_labels),
          {},
          vocab_5,
      ),
      (
          "stats_ids_out_of_range",
          functools.partial(token_statistics, digit_token_ids=bad_ids),
          (logits, labels),
          {},
          ids_12,
      ),
      (
          "stats_labels_shape",
          token_statistics,
          (logits, labels[:, :3]),
          {},
          r"labels shape \(2, 3\)",
      ),
      (
          "stats_mask_shape",
          token_statistics,
          (logits, labels),
          dict(mask=mask[:1]),
          r"\bmask shape \(1, 5\)",
      ),
      (
          "stats_float_labels",
          token_statistics,
          (logits, as_float(labels)),
          {},
          r"labels must be integer",
      ),
      (
          "stats_int_logits",
          token_statistics,
          (as_int(logits), labels),
          {},
          r"logits must be floating",
      ),
      # digit_logits
      ("digits_vocab_5", digit_logits, (small_logits,), {}, vocab_5),
      (
          "digits_ids_out_of_range",
          functools.partial(digit_logits, digit_token_ids=bad_ids),
          (logits,),
          {},
          ids_12,
      ),
      (
          "digits_int_logits",
          digit_logits,
          (as_int(logits),),
          {},
          r"logits must be floating",
      ),
      # loss_from_statistics
      (
          "from_stats_vocab_5",
          functools.partial(ntil_jax.loss_from_statistics, vocab_size=5),
          (stats, labels),
          {},
          vocab_5,
      ),
      (
          "from_stats_ids_out_of_range",
          functools.partial(from_stats, digit_token_ids=bad_ids),
          (stats, labels),
          {},
          ids_12,
      ),
      (
          "from_stats_vocab_not_int",
          functools.partial(ntil_jax.loss_from_statistics, vocab_size=12.0),
          (stats, labels),
          {},
          r"vocab_size must be a positive int",
      ),
      (
          "from_stats_labels_shape",
          from_stats,
          (stats, labels[:, :3]),
          {},
          r"stats\.log_norm shape \(2, 5\)",
      ),
      (
          "from_stats_float_labels",
          from_stats,
          (stats, as_float(labels)),
          {},
          r"labels must be integer",
      ),
      (
          "from_stats_loss_mask",
          from_stats,
          (stats, labels),
          dict(loss_mask=mask[:, :3]),
          r"loss_mask shape \(2, 3\)",
      ),
      (
          "from_stats_digit_mask",
          from_stats,
          (stats, labels),
          dict(digit_mask=mask[:1]),
          r"digit_mask shape \(1, 5\)",
      ),
      (
          "from_stats_decimal_point_mask",
          from_stats,
          (stats, labels),
          dict(decimal_point_mask=mask[:1]),
          r"decimal_point_mask shape",
      ),
      (
          "from_stats_label_logits",
          from_stats,
          (stats._replace(label_logits=stats.label_logits[:, :3]), labels),
          {},
          r"stats\.label_logits shape \(2, 3\)",
      ),
      (
          "from_stats_digit_logits",
          from_stats,
          (stats._replace(digit_logits=stats.digit_logits[..., :9]), labels),
          {},
          r"stats\.digit_logits shape \(2, 5, 9\)",
      ),
      (
          "from_stats_int_statistics",
          from_stats,
          (stats._replace(log_norm=as_int(stats.log_norm)), labels),
          {},
          r"stats\.log_norm must be floating",
      ),
      # fused_token_statistics
      (
          "fused_vocab_5",
          fused,
          (small_hidden, small_unembedding, small_labels),
          {},
          vocab_5,
      ),
      (
          "fused_ids_out_of_range",
          functools.partial(fused, digit_token_ids=bad_ids),
          (hidden, unembedding, labels),
          {},
          ids_12,
      ),
      (
          "fused_labels_shape",
          fused,
          (hidden, unembedding, labels[:, :3]),
          {},
          r"labels shape \(2, 3\)",
      ),
      (
          "fused_mask_shape",
          fused,
          (hidden, unembedding, labels),
          dict(mask=mask[:1]),
          r"\bmask shape \(1, 5\)",
      ),
      (
          "fused_float_labels",
          fused,
          (hidden, unembedding, as_float(labels)),
          {},
          r"labels must be integer",
      ),
      (
          "fused_int_hidden",
          fused,
          (as_int(hidden), unembedding, labels),
          {},
          r"hidden must be floating",
      ),
      (
          "fused_hidden_rank",
          fused,
          (hidden[0], unembedding, labels[0]),
          {},
          r"hidden must be \[B, T, D\]",
      ),
      (
          "fused_d_mismatch",
          fused,
          (hidden, unembedding[:3], labels),
          {},
          r"disagree on D",
      ),
  )


class ExtremeLogitTest(parameterized.TestCase):

  @parameterized.product(
      weighting=("reference", "authors"),
      method=("ntil", "emd", "nl_ntl", "smmd"),
  )
  def test_scaled_term_is_lam_times_ce_where_aux_sums_to_zero(
      self, weighting, method
  ):
    # Digits predicted at a margin of 90: every aux underflows to 0, and the
    # ratio's guard had dropped the term (2.48 for 1.3 x 2.48); a batch with
    # no digit the same. The value is lam times the CE, the gradient CE's.
    logits = np.zeros((1, 3, 12), np.float32)
    logits[0, 0, 3] = logits[0, 1, 4] = 90.0
    for labels in ([[3, 4, 11]], [[11, 10, 11]]):
      labels = np.array(labels)
      fn = lambda z, labels=labels: ntil_jax.numeric_token_loss(
          z, labels, method=method, weighting=weighting, lam=0.3
      ).sum()
      ce = lambda z, labels=labels: ntil_jax.cross_entropy(z, labels).sum()
      np.testing.assert_allclose(fn(logits), 1.3 * ce(logits), rtol=1e-6)
      np.testing.assert_allclose(
          jax.grad(fn)(logits), jax.grad(ce)(logits), atol=1e-7
      )

  """Logits of +-inf or far beyond exp's range where a loss is scored."""

  @parameterized.parameters((0.0, 1.0), (0.5, 0.3))
  def test_soft_labels_with_a_digit_ruled_out(self, eta, width):
    # '9' impossible (logit -inf) and given no weight by the target (eta = 0,
    # or a Gaussian that underflows 6 digits away): 0 log 0 = 0, and every
    # other token of 12 is equally likely, so the loss is log 11.
    logits = np.zeros((1, 2, 12), np.float32)
    logits[0, :, 9] = -np.inf
    labels = np.array([[3, 4]])
    fn = lambda z: ntil_jax.soft_label_cross_entropy(
        z, labels, eta=eta, width=width
    )
    np.testing.assert_allclose(fn(logits)[0], [np.log(11.0)] * 2, rtol=1e-6)
    got = ntil_jax.numeric_token_loss(
        logits, labels, method="soft_label", eta=eta, width=width
    )
    self.assertTrue(np.isfinite(got).all())
    self.assertTrue(np.isfinite(jax.grad(lambda z: fn(z).sum())(logits)).all())

  @parameterized.parameters(3e9, 1e10, 1e15, 1e30)
  def test_ntil_with_a_huge_finite_digit_logit(self, big):
    # Target "33", '4' at a logit far beyond exp's range on both digits.
    # The straight-through digits' tempered softmax divided the logits by
    # tau before its shift, and XLA rounded logits / tau two ways in one
    # program: exp(+1 ulp) = inf, and every gradient NaN from 3e9 up. The
    # distribution is one-hot in float32 from logit 200: the same gradient.
    # Under jit, as in a train step (called eagerly at this session's XLA
    # level the division was rounded one way only).
    labels = np.array([[3, 3]])
    logits = np.zeros((1, 2, 12), np.float32)
    logits[0, :, 4] = big
    moderate = logits.copy()
    moderate[0, :, 4] = 200.0
    fn = lambda z: ntil_jax.ntil_loss(z, labels).sum()
    for grad_fn in (jax.jit(jax.grad(fn)), jax.grad(fn)):
      grad = grad_fn(logits)
      self.assertTrue(np.isfinite(grad).all())
      np.testing.assert_allclose(grad, grad_fn(moderate), atol=1e-6)
    np.testing.assert_allclose(fn(logits), fn(moderate), rtol=1e-6)

  @parameterized.parameters(1e-30, 1e-10)
  def test_ntil_at_the_least_temperatures(self, tau):
    # A digit 0.3 above the others: at tau <= 1e-6 the tempered softmax is
    # one-hot in float32 and its gradient 0 (NaN at 1e-10 and below before
    # the shift came ahead of the division).
    labels = np.array([[3, 3]])
    logits = np.zeros((1, 2, 12), np.float32)
    logits[0, :, 4] = 0.3
    grad = lambda t: jax.jit(
        jax.grad(lambda z: ntil_jax.ntil_loss(z, labels, tau=t).sum())
    )(logits)
    self.assertTrue(np.isfinite(grad(tau)).all())
    np.testing.assert_allclose(grad(tau), grad(1e-6), atol=1e-6)

  def test_del_with_the_target_digit_ruled_out(self):
    # Target '3' at logit -inf, the other digits at 0: DEL's softmax over
    # the ten digit logits puts 1/9 on each of the nine others. The target
    # adds lim p * BCE = 0 (was 0 * inf = NaN); the nine others 1/9 *
    # softplus(0) each: log 2 / 10 per digit, times the units' place
    # weight 2.
    logits = np.zeros((1, 2, 12), np.float32)
    logits[0, 0, 3] = -np.inf
    labels = np.array([[3, 11]])
    fn = lambda z: ntil_jax.del_loss(z, labels)
    want = 2.0 * np.log(2.0) / 10
    np.testing.assert_allclose(fn(logits)[0, 0], want, rtol=1e-6)
    grad = jax.grad(lambda z: fn(z).sum())(logits)
    self.assertTrue(np.isfinite(grad).all())

  def test_nl_ntl_reweighed_with_a_sure_later_digit(self):
    # "12": the first digit uniform over 12 tokens (expected digit 4.5, mass
    # 10/12 on digits), the second '2' at logit 100 (exp overflows float32):
    # X = 47, Y = 12, 35 / 59 reweighed.
    labels = np.array([[1, 2, 11]])
    logits = np.zeros((1, 3, 12), np.float32)
    logits[0, 1, 2] = 100.0
    mass = 10 / 12
    want = 35 / 59 * mass + 1.01 * (1 - mass)
    fns = (
        lambda z: ntil_jax.nl_ntl_loss(z, labels, reweigh=True),
        lambda z: ntil_jax.numeric_token_loss(
            z, labels, method="nl_ntl", reweigh=True, lam=1.0
        )
        - ntil_jax.cross_entropy(z, labels),
    )
    for fn in fns:
      np.testing.assert_allclose(fn(logits)[0, 0], want, rtol=1e-5)
      grad = jax.grad(lambda z, f=fn: f(z).sum())(logits)
      self.assertTrue(np.isfinite(grad).all())
      # At logit 80 exp does not overflow; '2' is as sure.
      below = logits.copy()
      below[0, 1, 2] = 80.0
      np.testing.assert_allclose(
          grad, jax.grad(lambda z, f=fn: f(z).sum())(below), atol=1e-6
      )


class LowLevelInputTest(parameterized.TestCase):

  @parameterized.named_parameters(*_bad_low_level_calls())
  def test_bad_input_names_the_argument(self, fn, args, kwargs, pattern):
    with self.assertRaisesRegex(ValueError, pattern):
      fn(*args, **kwargs)

  @parameterized.named_parameters(*_bad_low_level_calls())
  def test_checked_at_trace_time(self, fn, args, kwargs, pattern):
    # Static shapes and dtypes: refused while tracing, before any run.
    with self.assertRaisesRegex(ValueError, pattern):
      jax.eval_shape(fn, *args, **kwargs)

  def test_good_input_is_accepted(self):
    logits, labels, hidden, unembedding = _low_level_case()
    stats = ntil_jax.token_statistics(logits, labels)
    self.assertEqual(ntil_jax.digit_logits(logits).shape, (2, 5, 10))
    per_token = ntil_jax.loss_from_statistics(
        stats, labels, vocab_size=np.int64(12)
    )
    self.assertEqual(per_token.shape, labels.shape)
    fused = ntil_jax.fused_token_statistics(hidden, unembedding, labels)
    want = ntil_jax.token_statistics(hidden @ unembedding, labels)
    for got, expected in zip(fused, want):
      np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


if __name__ == "__main__":
  absltest.main()
