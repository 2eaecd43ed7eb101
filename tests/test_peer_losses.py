"""NTIL's peers (DEL, SMMD, the number-level NTL): against their authors'
code and an oracle.

Parity: ``tests/fixtures/peers/*.npz`` hold the authors' PyTorch losses and
gradients on random inputs (``scripts/make_peer_fixtures.py``, run by hand
with torch); here the JAX losses, reduced as their code reduces them, must
give the same value and gradient at float32 tolerance. Then the float64
oracle of tests/oracle.py, and the library's guarantees: zero with zero
gradient outside numbers, finite on extreme logits, ``jit``, traced digit
ids, ``loss_from_statistics`` and every fused implementation equal to the
logits path, the trainer's config and loss.
"""

import functools
import json
import pathlib

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np

from configs import arithmetic_mix
from configs import common
import ntil_jax
from ntil_jax import digit_entropy
from ntil_jax import smmd
from tests import oracle
from tests import test_batch_loss
from tests import test_kernels
from tests.test_losses import PERMUTED_IDS
from tests.test_losses import random_case
from train import checks
from train import step

jax.config.update("jax_default_matmul_precision", "highest")

FIXTURES = pathlib.Path(__file__).parent / "fixtures" / "peers"
# Their DEL's weight in their total (train-qwen-deepseek.py).
DEL_WEIGHT = 0.01
RTOL, ATOL = 1e-5, 1e-6
LOSSES = dict(
    del_loss=ntil_jax.del_loss,
    smmd_loss=ntil_jax.smmd_loss,
    nl_ntl_loss=ntil_jax.nl_ntl_loss,
)


def smmd_kwargs(authors):
  """``smmd_loss`` keywords for ``SMMDLoss`` keywords."""
  fixed = authors.get("tau_mode") == "fixed"
  return dict(
      mode=authors.get("loss_mode", "smmd"),
      kernel=authors.get("kernel_type", "gaussian"),
      sigmas=tuple(authors.get("sigmas", (2.0,))),
      squash_factor=authors.get("squash_factor", 9.0),
      smooth_weight=authors.get("tau_fixed", 1.0) if fixed else None,
  )


def assert_gradient_close(got, want):
  """``RTOL`` per element, ``ATOL`` relative to the largest: the authors'
  means make gradients of 1e-3 and less, where 1e-6 would be no test."""
  np.testing.assert_allclose(
      got, want, rtol=RTOL, atol=ATOL * np.abs(want).max()
  )


class FixtureTest(parameterized.TestCase):
  """Loads ``FIXTURE`` of tests/fixtures/peers: its arrays, digit ids and
  decimal point id."""

  FIXTURE = ""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.data = np.load(FIXTURES / cls.FIXTURE)
    cls.ids = cls.data["digit_ids"]
    cls.point = int(cls.data["point_id"])


class DELParityTest(FixtureTest):
  """Against ``DEL`` of PolyU-VCLab/DEL's train-qwen-deepseek.py."""

  FIXTURE = "del.npz"

  def _cases(self):
    for i in range(5):
      yield (
          self.data[f"case{i}_logits"],
          self.data[f"case{i}_labels"],
          float(self.data[f"case{i}_value"]),
          self.data[f"case{i}_grad"],
      )

  def _their_reduction(self, logits, labels, case_of):
    """Each case's loss as theirs: 0.01 times the mean over its digits.

    All cases in one program: ``case_of`` ([R, T], -1 for no case) says
    which case each position belongs to. Returns each case's value and
    the gradient of the values w.r.t. ``logits``.
    """
    digits = np.isin(labels, self.ids)
    counts = np.array([np.sum(digits & (case_of == i)) for i in range(5)])
    scale = np.where(case_of >= 0, DEL_WEIGHT / counts[case_of], 0.0)

    @jax.jit
    def run(z):
      per_token, vjp = jax.vjp(
          lambda z: ntil_jax.del_loss(
              z,
              labels,
              digit_token_ids=self.ids,
              decimal_point_mask=labels == self.point,
          ),
          z,
      )
      return per_token, vjp(jnp.asarray(scale, jnp.float32))[0]

    per_token, grad = run(logits)
    scaled = np.asarray(per_token, np.float64) * scale
    values = [scaled[case_of == i].sum() for i in range(5)]
    return values, np.asarray(grad)

  def test_their_runs(self):
    # Their runs are those of the flattened scored positions: the same
    # value and gradient there, every case. The cases' flattened scored
    # positions in one row, each after a non-number token (0).
    logits, labels, case_of, where = [], [], [], []
    for i, (z, y, _, _) in enumerate(self._cases()):
      valid = y.reshape(-1) != -100
      logits += [np.zeros((1, z.shape[-1]), np.float32)]
      logits += [z.reshape(-1, z.shape[-1])[valid]]
      labels += [[0], y.reshape(-1)[valid]]
      case_of += [[-1], np.full(valid.sum(), i)]
      where.append(valid)
    values, grad = self._their_reduction(
        np.concatenate(logits)[None],
        np.concatenate(labels)[None],
        np.concatenate(case_of)[None],
    )
    start = 0
    for i, (z, _, want, want_grad) in enumerate(self._cases()):
      np.testing.assert_allclose(values[i], want, rtol=RTOL, atol=0)
      valid = where[i]
      start += 1  # the separator
      full = np.zeros((valid.size, z.shape[-1]), np.float32)
      full[valid] = grad[0, start : start + valid.sum()]
      start += valid.sum()
      assert_gradient_close(full.reshape(z.shape), want_grad)

  def test_batch(self):
    # In rows: the same where no number touches an ignored position or a
    # row's end; case 4 has numbers there, which their code joins (a
    # difference by design, see del_loss). The cases' rows in one batch,
    # padded with ignored positions to 64.
    cases = list(self._cases())
    pad = lambda x, value: np.pad(
        x,
        [(0, 0), (0, 64 - x.shape[1])] + [(0, 0)] * (x.ndim - 2),
        constant_values=value,
    )
    values, grad = self._their_reduction(
        np.concatenate([pad(z, 0.0) for z, _, _, _ in cases]),
        np.concatenate([pad(y, -100) for _, y, _, _ in cases]),
        np.concatenate(
            [
                pad(np.full(y.shape, i), i)
                for i, (_, y, _, _) in enumerate(cases)
            ]
        ),
    )
    row = 0
    for i, (z, _, want, want_grad) in enumerate(cases):
      rows = slice(row, row + z.shape[0])
      row += z.shape[0]
      if self.data[f"case{i}_touching"]:
        self.assertGreater(abs(values[i] - want), 1e-3 * want)
        continue
      np.testing.assert_allclose(values[i], want, rtol=RTOL, atol=0)
      assert_gradient_close(grad[rows, : z.shape[1]], want_grad)

  def test_place_weights(self):
    # Their generate_place reaches 2 * place through log(1.02**k) /
    # log(1.02) in float32: up to 9e-6 (relative) off the exact weights
    # here, which is most of the loss's difference. The five cases'
    # scored labels in one row, each after a non-number token (0).
    rows = [self.data[f"case{i}_labels"].reshape(-1) for i in range(5)]
    flat = np.concatenate([np.append(0, y[y != -100]) for y in rows])[None]

    @jax.jit
    def weights(labels):
      layout = ntil_jax.number_layout(
          labels,
          digit_token_ids=self.ids,
          decimal_point_mask=labels == self.point,
      )
      return digit_entropy.del_place_weights(layout), layout.is_digit

    ours, is_digit = weights(flat)
    ours = np.asarray(ours)[np.asarray(is_digit)]
    theirs = np.concatenate([self.data[f"case{i}_places"] for i in range(5)])
    np.testing.assert_allclose(ours, theirs, rtol=RTOL, atol=0)
    # Theirs are not exact: the reason.
    self.assertGreater(np.max(np.abs(ours - theirs) / ours), 1e-6)


class SMMDParityTest(parameterized.TestCase):
  """Against ``SMMDLoss`` of Zuozhuo/smmd-loss, every recorded setting."""

  def test_every_case_and_setting(self):
    data = np.load(FIXTURES / "smmd.npz")
    ids = data["digit_ids"]
    settings = json.loads(str(data["settings"]))
    self.assertLen(settings, 6)
    # SMMD is per token: the three cases' tokens in one row, one call per
    # setting; each case's mean (theirs, over its numeric targets) is the
    # sum over its tokens divided by its count.
    cases = [
        (data[f"case{i}_logits"], data[f"case{i}_labels"]) for i in range(3)
    ]
    vocab = cases[0][0].shape[-1]
    logits = np.concatenate([z.reshape(-1, vocab) for z, _ in cases])[None]
    labels = np.concatenate([y.reshape(-1) for _, y in cases])[None]
    sizes = [y.size for _, y in cases]
    counts = np.array([np.isin(y, ids).sum() for _, y in cases])
    bounds = np.cumsum([0] + sizes)
    cotangent = np.repeat(1.0 / counts, sizes).astype(np.float32)[None]

    @jax.jit
    def every_setting(z):  # one program for all
      results = {}
      for name, authors in settings.items():
        fn = functools.partial(
            ntil_jax.smmd_loss,
            labels=labels,
            digit_token_ids=ids,
            **smmd_kwargs(authors),
        )
        per_token, vjp = jax.vjp(fn, z)
        results[name] = (per_token, vjp(jnp.asarray(cotangent))[0])
      return results

    for name, (per_token, grad) in every_setting(logits).items():
      for i, (case_logits, _) in enumerate(cases):
        message = f"case {i}, {name}"
        tokens = slice(bounds[i], bounds[i + 1])
        value = per_token[0, tokens].sum() / counts[i]
        want = float(data[f"case{i}_{name}_value"])
        np.testing.assert_allclose(
            value, want, rtol=RTOL, atol=0, err_msg=message
        )
        np.testing.assert_allclose(
            grad[0, tokens].reshape(case_logits.shape),
            data[f"case{i}_{name}_grad"],
            rtol=RTOL,
            atol=ATOL,
            err_msg=message,
        )


class NLNTLParityTest(FixtureTest):
  """Against ``NumberLevelLoss`` of ntloss 0.2.3."""

  FIXTURE = "nl_ntl.npz"

  def test_every_case_and_setting(self):
    settings = json.loads(str(self.data["settings"]))
    cases = sorted({k.split("_")[0] for k in self.data.files if "case" in k})
    self.assertLen(cases, 4)

    @functools.partial(jax.jit, static_argnames=("float_level", "reweigh"))
    def run(z, labels, float_level, reweigh):
      return value_and_grad_of_sum(
          lambda z: ntil_jax.nl_ntl_loss(
              z,
              labels,
              digit_token_ids=self.ids,
              decimal_point_mask=(labels == self.point)
              if float_level
              else None,
              reweigh=reweigh,
          )
      )(z)

    for case in cases:
      logits = self.data[f"{case}_logits"]
      labels = self.data[f"{case}_labels"]
      for name, kwargs in settings.items():
        per_token, grad = run(logits, labels, **kwargs)
        want = self.data[f"{case}_{name}_per_token"]
        # Each number's loss on its first digit, as their "none" puts it.
        np.testing.assert_allclose(
            per_token, want, rtol=RTOL, atol=ATOL, err_msg=f"{case} {name}"
        )
        # Gradients: theirs and this code's, each against the float64
        # oracle (two float32 computations differ by both their errors).
        _, exact = oracle.nl_ntl(
            logits,
            labels,
            np.ones(labels.shape, bool),
            self.ids,
            (labels == self.point) if kwargs["float_level"] else None,
            kwargs["reweigh"],
        )
        assert_gradient_close(self.data[f"{case}_{name}_grad"], exact)
        assert_gradient_close(grad, exact)
        self.assertGreater(np.count_nonzero(want), 3)
    # float_level joins "3.14" into one number: fewer numbers scored.
    integer = self.data["case1_integer_per_token"]
    joined = self.data["case1_float_level_per_token"]
    self.assertLess(np.count_nonzero(joined), np.count_nonzero(integer))


def value_and_grad_of_sum(fn):
  """``fn(z, *args)`` and the gradient of its sum w.r.t. ``z``, jitted."""

  @jax.jit
  def both(z, *args):
    value, vjp = jax.vjp(lambda z: fn(z, *args), z)
    return value, vjp(jnp.ones_like(value))[0]

  return both


def edge_case(seed, ids=tuple(range(10)), vocab=16):
  """A random case with an all-ignored row and a row without digits."""
  logits, labels, mask = random_case(
      seed, batch=4, length=12, vocab=vocab, digit_ids=ids
  )
  others = np.setdiff1d(np.arange(vocab), ids)
  labels[2] = -100
  labels[3] = np.random.default_rng(seed).choice(others, labels.shape[1])
  return logits, labels, mask


class OracleTest(parameterized.TestCase):
  """Against the float64 loops of tests/oracle.py."""

  @parameterized.named_parameters(
      ("default_ids", 0, tuple(range(10))), ("permuted_ids", 1, PERMUTED_IDS)
  )
  def test_del(self, seed, ids):
    logits, labels, mask = edge_case(seed, ids, vocab=32)
    # Points at some non-digit labels, many between two digits.
    point = ~np.isin(labels, ids) & (
        np.random.default_rng(seed).random(labels.shape) < 0.5
    )
    both = value_and_grad_of_sum(
        lambda z, decimals: ntil_jax.del_loss(
            z,
            labels,
            mask,
            digit_token_ids=np.asarray(ids),
            decimal_point_mask=decimals,
        )
    )
    for decimals in (np.zeros_like(point), point):
      want, want_grad = oracle.del_loss(logits, labels, mask, ids, decimals)
      value, grad = both(logits, decimals)
      np.testing.assert_allclose(value, want, rtol=RTOL, atol=ATOL)
      np.testing.assert_allclose(grad, want_grad, rtol=RTOL, atol=ATOL)
      np.testing.assert_array_equal(value[2:], 0.0)
    self.assertTrue(
        np.any(want != oracle.del_loss(logits, labels, mask, ids)[0])
    )

  def test_smmd(self):
    settings = dict(
        default={},
        mmd=dict(mode="mmd"),
        smooth_laplace=dict(mode="smooth", kernel="laplace", sigmas=(1, 3)),
        squash_weight=dict(squash_factor=5.0, smooth_weight=0.3),
        no_squash=dict(squash_factor=None, sigmas=(0.7,)),
    )
    logits, labels, mask = edge_case(2, PERMUTED_IDS, vocab=32)
    ids = np.asarray(PERMUTED_IDS)

    @jax.jit
    def every_setting(z):  # one program for all
      return {
          name: value_and_grad_of_sum(
              lambda z, kwargs=kwargs: ntil_jax.smmd_loss(
                  z, labels, mask, digit_token_ids=ids, **kwargs
              )
          )(z)
          for name, kwargs in settings.items()
      }

    for name, (value, grad) in every_setting(logits).items():
      want, want_grad = oracle.smmd(
          logits, labels, mask, PERMUTED_IDS, **settings[name]
      )
      np.testing.assert_allclose(
          value, want, rtol=RTOL, atol=ATOL, err_msg=name
      )
      np.testing.assert_allclose(
          grad, want_grad, rtol=RTOL, atol=ATOL, err_msg=name
      )
      np.testing.assert_array_equal(value[2:], 0.0)

  @parameterized.named_parameters(
      ("integer", False, False),
      ("decimals", True, False),
      ("reweigh", False, True),
      ("decimals_reweigh", True, True),
  )
  def test_nl_ntl(self, decimals, reweigh):
    logits, labels, mask = edge_case(4, PERMUTED_IDS, vocab=32)
    ids = np.asarray(PERMUTED_IDS)
    point = None
    if decimals:
      point = ~np.isin(labels, ids) & (
          np.random.default_rng(4).random(labels.shape) < 0.5
      )
    got = jax.jit(
        lambda z: ntil_jax.nl_ntl_loss(
            z,
            labels,
            mask,
            digit_token_ids=ids,
            decimal_point_mask=point,
            reweigh=reweigh,
        )
    )(logits)
    want, _ = oracle.nl_ntl(logits, labels, mask, ids, point, reweigh)
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)
    np.testing.assert_array_equal(np.asarray(got)[2:], 0.0)
    self.assertGreater(np.count_nonzero(want), 3)

  def test_nl_ntl_by_hand(self):
    # "12" then "305" with every digit logit 0 (expected digit 4.5): 49.5
    # for 12, 499.5 for 305, each loss on the number's first digit.
    labels = np.array([[11, 1, 2, 11, 3, 0, 5]])
    got = ntil_jax.nl_ntl_loss(np.zeros((1, 7, 12), np.float32), labels)
    eps = np.finfo(np.float32).eps
    want = [0, 37.5 / (61.5 + eps), 0, 0, 194.5 / (804.5 + eps), 0, 0]
    np.testing.assert_allclose(got[0], want, rtol=1e-6)

  def test_nl_ntl_is_exact_for_long_numbers(self):
    # 60 digits: 10**59 is beyond float32 (their sums overflow to inf and
    # the loss is NaN); here the sums are at the first digit's scale.
    rng = np.random.default_rng(5)
    digits = rng.integers(0, 10, 60)
    digits[0] = 7
    labels = np.concatenate([[11], digits, [11]])[None]
    logits = rng.normal(size=(1, 62, 12)).astype(np.float32)
    logits[0, 1 : 1 + 59, :10] += 12.0 * np.eye(10)[digits[:59]]  # sure
    value, grad = value_and_grad_of_sum(
        lambda z: ntil_jax.nl_ntl_loss(z, labels)
    )(logits)
    want, want_grad = oracle.nl_ntl(logits, labels, np.ones(labels.shape, bool))
    self.assertGreater(want[0, 1], 0.0)
    np.testing.assert_allclose(value, want, rtol=1e-5, atol=1e-12)
    assert_gradient_close(grad, want_grad)
    # All zeros written and predicted beyond doubt: 0, and a finite
    # gradient (the floored denominator).
    zeros = np.array([[11] + [0] * 60 + [11]])
    sure = np.zeros((1, 62, 12), np.float32)
    sure[0, :, 0] = 200.0
    value, grad = value_and_grad_of_sum(
        lambda z: ntil_jax.nl_ntl_loss(z, zeros)
    )(sure)
    np.testing.assert_array_equal(value, 0.0)
    self.assertTrue(np.isfinite(grad).all())

  @parameterized.parameters(5, 19, 25, 30)
  def test_nl_ntl_with_leading_zeros_predicted_beyond_doubt(self, zeros):
    # "0...01" predicted as "0...02" with logits of 1000: X = 2, Y = 1 as
    # integers (the leading zeros' other digits have probability 0), so
    # the ratio is 1 / 3 however many zeros lead, up to the 30 documented.
    target = [0] * zeros + [1]
    labels = np.array([[11] + target + [11]])
    logits = np.zeros((1, zeros + 3, 12), np.float32)
    for t, digit in enumerate([0] * zeros + [2]):
      logits[0, 1 + t, digit] = 1000.0
    value, grad = value_and_grad_of_sum(
        lambda z: ntil_jax.nl_ntl_loss(z, labels)
    )(logits)
    eps = np.finfo(np.float32).eps
    np.testing.assert_allclose(value[0, 1], 1 / (3 + eps), rtol=1e-6)
    self.assertTrue(np.isfinite(grad).all())

  def test_nl_ntl_settings_checked(self):
    logits, labels, mask = random_case(7, 1, 4)
    for reweigh in (1, 1.0, "yes", None):
      with self.assertRaisesRegex(ValueError, "reweigh must be True or False"):
        ntil_jax.nl_ntl_loss(logits, labels, mask, reweigh=reweigh)
      with self.assertRaisesRegex(ValueError, "reweigh must be True or False"):
        ntil_jax.losses.check_method("nl_ntl", "sum", dict(reweigh=reweigh))
    with self.assertRaisesRegex(
        ntil_jax.losses.LossArgumentError, "nl_ntl_loss takes reweigh"
    ):
      ntil_jax.losses.check_method("nl_ntl", "sum", dict(sigma=0.2))

  def test_del_by_hand(self):
    #            3  2  5  _  3  .  1  4  _  5  .  _  .  2  5
    labels = np.array([[3, 2, 5, 11, 3, 10, 1, 4, 11, 5, 10, 11, 10, 2, 5]])
    want = np.array([6, 4, 2, 0, 2, 0, 1.02**-2, 1.02**-3, 0, 2, 0, 0, 0, 4, 2])
    # Uniform digit logits 0: p = 1/10, BCE = log 2 for every digit.
    logits = np.zeros((1, 15, 12), np.float32)

    @jax.jit
    def weights_and_loss(z):
      layout = ntil_jax.number_layout(labels, decimal_point_mask=labels == 10)
      return digit_entropy.del_place_weights(layout), ntil_jax.del_loss(
          z, labels, decimal_point_mask=labels == 10
      )

    weights, loss = weights_and_loss(logits)
    np.testing.assert_allclose(weights[0], want, rtol=1e-6)
    np.testing.assert_allclose(loss[0], want * np.log(2) / 10, rtol=1e-6)

  def test_smmd_default_kernel(self):
    # squash_factor 9 maps the digit distances 1..9 to themselves.
    d = np.abs(np.arange(10)[:, None] - np.arange(10)[None, :])
    np.testing.assert_allclose(
        smmd.smmd_kernel(), np.exp(-(d**2) / 8.0), rtol=1e-6, atol=1e-7
    )
    gram = np.exp(-(d**2) / 8.0)
    alpha = 1 / (2 * gram.sum(1).mean())
    laplacian = np.diag(gram.sum(1)) - gram
    np.testing.assert_allclose(
        smmd.smmd_matrix(), gram + alpha * laplacian, rtol=1e-5, atol=1e-7
    )


class GuaranteesTest(parameterized.TestCase):
  """What every loss of the library promises."""

  @parameterized.parameters(*LOSSES)
  def test_zero_outside_numbers_even_for_nan_logits(self, name):
    fn = LOSSES[name]
    logits, labels, mask = edge_case(3)
    outside = np.ones(labels.shape, bool)
    for b in range(labels.shape[0]):
      for number in oracle.find_numbers(labels[b], mask[b], range(10)):
        outside[b, [t for t, _, _ in number]] = False
    poisoned = logits.copy()
    poisoned[outside] = np.where(
        np.arange(logits.shape[-1]) % 3 == 0, np.nan, np.inf
    )
    both = value_and_grad_of_sum(lambda z: fn(z, labels, mask))
    value, grad = both(poisoned)
    clean_value, clean_grad = both(logits)
    np.testing.assert_array_equal(np.asarray(value)[outside], 0.0)
    np.testing.assert_allclose(value, clean_value, rtol=1e-6)
    self.assertTrue(np.isfinite(grad).all())
    np.testing.assert_array_equal(grad[outside], 0.0)
    np.testing.assert_allclose(grad, clean_grad, rtol=1e-6, atol=1e-7)
    self.assertTrue((np.abs(grad[~outside]).sum(-1) > 0).all())

  @parameterized.parameters(*LOSSES)
  def test_extreme_logits_stay_finite(self, name):
    fn = LOSSES[name]
    logits, labels, mask = random_case(4, batch=2, length=12, scale=1e4)
    logits[0, :, :5] = 1e30
    logits[1, :, 3:8] = -1e30
    value, grad = jax.jit(
        jax.value_and_grad(lambda z: fn(z, labels, mask).sum())
    )(logits)
    self.assertTrue(np.isfinite(value))
    self.assertTrue(np.isfinite(grad).all())

  @parameterized.parameters(*LOSSES)
  def test_jit_and_traced_ids(self, name):
    fn = LOSSES[name]
    logits, labels, mask = random_case(5, 2, 12, 32, PERMUTED_IDS)
    static = jax.jit(
        lambda z: fn(z, labels, mask, digit_token_ids=PERMUTED_IDS)
    )
    traced = jax.jit(lambda z, ids: fn(z, labels, mask, digit_token_ids=ids))
    want = static(logits)
    np.testing.assert_allclose(
        traced(logits, jnp.asarray(PERMUTED_IDS)), want, rtol=1e-6, atol=1e-7
    )
    self.assertGreater(float(want.sum()), 0.0)
    # Repeated traced ids cannot be checked: NaN at digits, not wrong.
    repeated = np.asarray(PERMUTED_IDS)
    repeated[1] = repeated[0]
    self.assertTrue(np.isnan(traced(logits, jnp.asarray(repeated))).any())

  @parameterized.parameters(*LOSSES)
  def test_input_checks(self, name):
    fn = LOSSES[name]
    logits, labels, mask = random_case(6, 1, 4)
    for args, kwargs, message in (
        ((logits, labels[:, :3], mask), {}, "labels shape"),
        ((logits, labels.astype(np.float32), mask), {}, "integer token ids"),
        ((logits, labels, mask.astype(np.float32)), {}, "digit_mask must"),
        ((logits, labels, mask), dict(digit_token_ids=(1,) * 10), "dupl"),
        ((logits.astype(np.int32), labels, mask), {}, "floating point"),
    ):
      with self.assertRaisesRegex(ValueError, message):
        fn(*args, **kwargs)

  def test_smmd_settings_checked(self):
    logits, labels, mask = random_case(7, 1, 4)
    for kwargs, message in (
        (dict(mode="kl"), "mode must be one of"),
        (dict(kernel="cosine"), "kernel must be one of"),
        (dict(sigmas=()), "sigmas must be a non-empty"),
        (dict(sigmas=(2.0, 0.0)), "sigmas must be >= 1e-30"),
        (dict(sigmas=(np.inf,)), "sigmas must be finite"),
        (dict(squash_factor=np.nan), "squash_factor must be a real"),
        (dict(smooth_weight=-1.0), "smooth_weight must be >= 0"),
    ):
      with self.assertRaisesRegex(ValueError, message):
        ntil_jax.smmd_loss(logits, labels, mask, **kwargs)
      with self.assertRaisesRegex(ValueError, message):
        ntil_jax.losses.check_method("smmd", "sum", kwargs)
    with self.assertRaisesRegex(
        ntil_jax.losses.LossArgumentError, "del_loss takes no keyword"
    ):
      ntil_jax.losses.check_method("del", "sum", dict(mode="smmd"))

  def test_smmd_traced_settings(self):
    logits, labels, mask = random_case(8, 1, 8)
    kwargs = dict(sigmas=(1.5, 3.0), squash_factor=5.0, smooth_weight=0.25)
    traced = jax.jit(
        lambda s, f, w: ntil_jax.smmd_loss(
            logits, labels, mask, sigmas=s, squash_factor=f, smooth_weight=w
        )
    )(jnp.asarray(kwargs["sigmas"]), 5.0, 0.25)
    want, _ = oracle.smmd(logits, labels, mask, **kwargs)
    np.testing.assert_allclose(traced, want, rtol=RTOL, atol=ATOL)


class CombinedTest(parameterized.TestCase):
  """numeric_token_loss, loss_from_statistics, the fused path, the trainer."""

  @parameterized.parameters("del", "smmd", "nl_ntl")
  def test_numeric_token_loss_and_statistics(self, method):
    logits, labels, mask = edge_case(9, PERMUTED_IDS, vocab=32)
    ids = np.asarray(PERMUTED_IDS)
    loss_mask = labels >= 0
    point = ~np.isin(labels, ids) & (labels % 2 == 0)
    kwargs = dict(digit_token_ids=ids)
    if method in ("del", "nl_ntl"):
      kwargs["decimal_point_mask"] = point
    if method == "nl_ntl":  # the log-normalizer's mass too
      kwargs["reweigh"] = True

    def combined(z):
      return ntil_jax.numeric_token_loss(
          z,
          labels,
          loss_mask=loss_mask,
          digit_mask=mask,
          method=method,
          lam=0.5,
          **kwargs,
      )

    def separate(z):
      alone = ntil_jax.NUMERIC_LOSSES[method](
          z, labels, mask & loss_mask, **kwargs
      )
      return ntil_jax.cross_entropy(z, labels, loss_mask) + 0.5 * alone

    def from_statistics(z):
      return ntil_jax.loss_from_statistics(
          ntil_jax.token_statistics(z, labels, ids, mask=loss_mask),
          labels,
          vocab_size=z.shape[-1],
          loss_mask=loss_mask,
          digit_mask=mask,
          method=method,
          lam=0.5,
          **kwargs,
      )

    @jax.jit
    def all_three(z):
      return [value_and_grad_of_sum(fn)(z) for fn in (combined, separate)] + [
          from_statistics(z)
      ]

    (value, grad), (want, want_grad), from_stats = all_three(logits)
    np.testing.assert_allclose(value, want, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(from_stats, value, rtol=1e-6, atol=1e-6)

  def test_nl_ntl_authors_weighting_averages_over_numbers(self):
    # Row 0 holds two numbers, row 1 one: the NTIL authors' aggregation
    # takes each row's mean over its numbers (not its digits), scaled so
    # that the numeric part sums to lam times the CE.
    labels = np.array([[11, 1, 2, 11, 3, 0, 5, 11], [11, 4, 11] + [11] * 5])
    logits = np.random.default_rng(3).normal(size=(2, 8, 12))
    logits = logits.astype(np.float32)
    full = ntil_jax.numeric_token_loss(
        logits, labels, method="nl_ntl", weighting="authors", lam=0.3
    )
    ce = ntil_jax.cross_entropy(logits, labels)
    aux = np.asarray(ntil_jax.nl_ntl_loss(logits, labels), np.float64)
    per_sample = aux.sum(-1) / np.array([2, 1])
    scale = 0.3 * float(ce.sum()) / per_sample.sum()
    want = np.asarray(ce) + scale * aux / np.array([[2], [1]])
    np.testing.assert_allclose(full, want, rtol=1e-5, atol=1e-6)

  @parameterized.product(
      method=("del", "smmd", "nl_ntl"),
      implementation=tuple(test_kernels.IMPLEMENTATIONS),
  )
  def test_fused_equals_logits_path(self, method, implementation):
    # test_kernels' comparison: value, d hidden and d W, ignored positions,
    # digit ids 700..709 and decimal points, 1e-5 relative (in norm, and no
    # element off by more).
    test_kernels.ImplementationsTest._compare(
        self, implementation, method, jnp.float32, 1e-5
    )

  @parameterized.parameters("del", "smmd", "nl_ntl")
  def test_trainer(self, method):
    config = arithmetic_mix.get_config(method)
    self.assertEqual(config.method, method)
    checks.check_config(config, data=False)
    self.assertEqual(
        common.METHODS, ("ce", "emd", "ntl_mse", "soft_label", "ntil")
    )
    # The grids and the trainer take every peer.
    self.assertEqual(common.PEER_METHODS, ("del", "smmd", "nl_ntl"))
    self.assertEqual(
        common.TRAINER_METHODS, common.METHODS + ntil_jax.losses.PEER_LOSSES
    )
    # The trainer's loss: CE + lam * the method's loss over scored tokens,
    # '.' joining decimals.
    batch = test_batch_loss.make_batch(0)
    point_id = 12  # the model's '.'
    targets = np.asarray(batch["targets"]).copy()
    targets[:, 5] = point_id
    batch["targets"] = jnp.asarray(targets)
    rng = np.random.default_rng(1)
    shape = (test_batch_loss.BATCH, test_batch_loss.LENGTH)
    hidden = rng.normal(size=shape + (test_batch_loss.DIM,))
    unembedding = rng.normal(size=(test_batch_loss.DIM, test_batch_loss.VOCAB))
    model = test_batch_loss.FakeModel(
        hidden.astype(np.float32),
        unembedding.astype(np.float32),
        np.zeros(shape, bool),
    )
    model.decimal_point_token_id = point_id
    loss_mask = np.asarray(batch["loss_mask"])

    @jax.jit
    def trainer_and_library():
      value, _ = step.batch_loss(model, batch, config, None)
      logits = model.project(model.hidden)
      per_token = ntil_jax.numeric_token_loss(
          logits,
          targets,
          loss_mask=loss_mask,
          digit_mask=batch["digit_mask"],
          method=method,
          lam=config.lam,
          decimal_point_mask=targets == point_id,
      )
      ce = ntil_jax.cross_entropy(logits, targets, loss_mask)
      return value, per_token.sum() / loss_mask.sum(), ce.sum()

    value, want, ce = trainer_and_library()
    np.testing.assert_allclose(value, want, rtol=1e-6)
    self.assertGreater(float(value), float(ce / loss_mask.sum()))


if __name__ == "__main__":
  absltest.main()
