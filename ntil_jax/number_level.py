r"""NL-NTL: the number-level Number Token Loss, as a per-token loss.

Reference: ``NumberLevelLoss`` of ``ntloss`` 0.2.3 (``ntloss/core.py``;
https://github.com/AI4SD/number-token-loss, the package of Zausinger et
al., "Regress, Don't Guess: A Regression-like Loss on Number Tokens for
Language Models", ICML 2025), the number-level sibling of NTL-MSE and
NTL-WAS. Written here from that code, in JAX.
"""

import chex
import jax
import jax.numpy as jnp
import numpy as np

from ntil_jax import arrays
from ntil_jax import base
from ntil_jax import numbers
from ntil_jax import segments
from ntil_jax import statistics

# The authors' epsilon in the denominator: float32's, at the scale of the
# number written as an integer.
EPSILON = float(np.finfo(np.float32).eps)
# Their reweighing's worst loss (a symmetric MAPE is at most 1) and the
# factor on it.
MAX_DISTANCE = 1.0
REWEIGH_FACTOR = 1.01
# The least denominator, at the scale of a number's first digit.
SMALLEST_DENOMINATOR = 1e-30


def check_nl_ntl_parameters(*, reweigh: bool = False) -> None:
  """ValueError unless ``reweigh`` is a bool (a setting, not an array)."""
  if not isinstance(reweigh, (bool, np.bool_)):
    raise ValueError(f"reweigh must be True or False, got {reweigh!r}.")


def nl_ntl_from_layout(
    stats: statistics.TokenStatistics, layout, *, reweigh: bool = False
):
  """NL-NTL from :class:`TokenStatistics` (the ten digit logits; with
  ``reweigh``, the log-normalizer too).

  Each number's sums are taken at the scale of its first digit (digit
  ``t`` weighs ``10**-left_t``, ``left_t`` the number's digits to its left),
  where they are at most 10: the authors' values times ``10**-(n - 1)``
  for ``n`` digits, a ratio that does not change; their epsilon is scaled
  the same way. The difference is one sum of each digit's miss
  (``sum_k p_k (k - y)``), not a difference of two sums.
  """
  logits = base.digits_in_numbers(stats.digit_logits, layout)
  probs = jax.nn.softmax(logits, axis=-1)
  expected = probs @ base.DIGITS
  target = layout.digit_values.astype(jnp.float32)
  # expected - target as a sum of small terms (the target's is 0): a model
  # sure of a digit misses it by its other digits' mass, which the
  # difference of two numbers near the digit would round away.
  miss = jnp.sum(probs * (base.DIGITS - target[..., None]), axis=-1)
  index = jax.lax.broadcasted_iota(
      jnp.int32, layout.first.shape, layout.first.ndim - 1
  )
  left = index - layout.first - (layout.point < index).astype(jnp.int32)
  scale = base.masked(numbers.pow10(-left), layout.is_digit)
  # A digit whose logits give no distribution (all -inf, a NaN, +inf) makes
  # its own number NaN, not the others: the sums are masked matmuls, where
  # 0 * NaN would reach every number of the row, and its gradient too.
  finite = jnp.isfinite(expected) & jnp.isfinite(miss)
  predicted, written, difference, broken = segments.segmented_sums(
      (
          arrays.where(finite, expected * scale, 0.0),
          target * scale,
          arrays.where(finite, miss * scale, 0.0),
          (~finite).astype(jnp.float32),
      ),
      layout.first,
  )
  # At each number's last digit, where its sums are whole; the scale there
  # is 10**-(n - 1).
  denominator = jnp.abs(predicted) + jnp.abs(written) + EPSILON * scale
  # Floored (0 outside numbers), and both sides divided by its value before
  # the ratio: autodiff's |D| / denominator**2 would overflow float32 below
  # 1e-19, while this gradient stays below about 1e31. The floor binds only
  # where both numbers are below 1e-30 of their first digit's place, 30 or
  # more leading zeros written and predicted.
  denominator = jnp.maximum(denominator, SMALLEST_DENOMINATOR)
  unit = jax.lax.stop_gradient(1.0 / denominator)
  ratio = (jnp.abs(difference) * unit) / (denominator * unit)
  per_number = arrays.where(
      layout.is_last, arrays.where(broken > 0, jnp.nan, ratio), 0.0
  )
  # On the number's first digit, as their "none" reduction places it.
  first_digit = layout.is_digit & layout.starts
  loss = segments.read_at(per_number[..., None], layout.last)[..., 0]
  if reweigh:
    if stats.log_norm is None:
      raise ValueError(
          "reweigh needs the log-normalizer of the whole vocabulary "
          "(TokenStatistics.log_norm)."
      )
    # Both zeroed away from first digits: a large logit there would make
    # exp overflow, and the masked-out inf a NaN gradient.
    log_norm = arrays.where(first_digit, stats.log_norm, 0.0)
    at_first = arrays.where(first_digit[..., None], logits, 0.0)
    mass = jnp.sum(jnp.exp(at_first - log_norm[..., None]), axis=-1)
    loss = loss * mass + REWEIGH_FACTOR * MAX_DISTANCE * (1.0 - mass)
  return base.masked(loss, first_digit)


def nl_ntl_loss(
    logits,
    labels,
    digit_mask=None,
    *,
    digit_token_ids=None,
    decimal_point_mask=None,
    reweigh: bool = False,
    sequence_axis=None,
) -> chex.Array:
  r"""Number-level NTL (``ntloss``'s ``NumberLevelLoss``), per token.

  For a target number :math:`Y = \sum_j y_j 10^{o_j}` written with digits
  :math:`y_j` (:math:`o_j` the digits to the right of digit :math:`j` in
  its number) and the model's expected digits
  :math:`\hat{x}_j = \sum_{k=0}^{9} k\, \mathrm{softmax}(z_j)_k` over the
  ten digit logits only, :math:`\hat{X} = \sum_j \hat{x}_j 10^{o_j}`, the
  number scores the symmetric MAPE

  .. math::

    \ell = \frac{|\hat{X} - Y|}{|\hat{X}| + |Y| + \epsilon} \in [0, 1],

  with :math:`\epsilon` float32's epsilon, on the number's first digit
  (where the authors' ``reduction="none"`` puts it; their ``"sum"`` is the
  sum of this array, their ``"mean"`` that over the number of numbers).
  With ``reweigh``, :math:`\ell m + 1.01 (1 - m)`, :math:`m` the
  probability mass the whole vocabulary's softmax puts on the ten digit
  tokens at that first digit (with number tokens of several digits, on the
  tokens of the target's width there; their class's default is
  ``reweigh=True``; their docstring notes the ICML paper does not use it).

  A decimal point between two digits joins the number when
  ``decimal_point_mask`` marks it (their ``float_level=True``): "12.34" is
  one number, scored as their 1234 is (the same ratio). Values are exact
  for numbers of any length: each number's sums are taken at the scale of
  its first digit, where their float32 sums overflow past 38 digits. The
  one limit: a number written with more than 30 leading zeros that the
  model also predicts as zeros (both below 1e-30 of the first digit's
  place) scores less than their ratio (its denominator is floored there).

  Where this differs from their code, by design: a number that starts a
  row is one number here; their loop never closes it, and scores each of
  its digits alone. A run holding two points ("1.2.3") is three numbers
  here and their 123; a leading point (".25") is not part of the number
  here, and their loss stands on that point (the same value without
  ``reweigh``; with it, their digit mass is read at the point, here at the
  first digit, so the two differ). ``digit_mask``
  restricts the digits scored; their code scores every digit label.

  Args:
    logits: ``[..., T, V]`` logits (any float dtype; computed in float32).
    labels: ``[..., T]`` integer target ids.
    digit_mask: ``[..., T]`` bool, where digits may be scored (``None``:
      all).
    digit_token_ids: ``[10]`` token ids of the digits 0..9 (``None``:
      0..9). A :class:`~ntil_jax.NumberTokens` scores numbers written in
      tokens of 1-3 digits (:mod:`ntil_jax.chunks`).
    decimal_point_mask: optional ``[..., T]`` bool, true at '.' labels that
      join integer and fractional digits into one number.
    reweigh: scale by the digit tokens' probability mass (see above).
    sequence_axis: inside ``jax.shard_map``, the mesh axes T is split over
      (see :func:`ntil_jax.numeric_token_loss`); ``None``: each shard holds
      whole sequences.

  Returns:
    ``[..., T]`` float32 per-token loss, zero (with zero gradient) except on
    the first digit of each number.

  Raises:
    ValueError: for mismatched shapes, non-integer labels, non-float logits,
      a float mask, digit ids that are repeated or out of the vocabulary,
      or a ``reweigh`` that is not a bool.

  Example:
    With every digit logit 0 each expected digit is 4.5, so the prediction
    for "12" is 49.5: ``37.5 / 61.5``.

    >>> import jax.numpy as jnp
    >>> loss = nl_ntl_loss(jnp.zeros((1, 4, 12)), jnp.array([[10, 1, 2, 11]]))
    >>> [round(x, 4) for x in loss[0].tolist()]
    [0.0, 0.6098, 0.0, 0.0]
  """
  check_nl_ntl_parameters(reweigh=reweigh)
  logits, labels, digit_mask, decimal_point_mask, digit_logits_ = base.prepare(
      logits, labels, digit_mask, digit_token_ids, decimal_point_mask
  )
  log_norm = None
  if reweigh:
    log_norm = base.log_norm_in_numbers(
        logits, labels, digit_mask, digit_token_ids
    )
  return base.number_loss(
      nl_ntl_from_layout,
      base.digit_statistics(digit_logits_, log_norm),
      labels,
      digit_mask,
      digit_token_ids,
      decimal_point_mask,
      reweigh=reweigh,
      sequence_axis=sequence_axis,
  )
