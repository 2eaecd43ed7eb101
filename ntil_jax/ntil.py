"""NTIL: Numerical Token Integrity Loss (Fei et al., ACL 2025).

:func:`ntil_loss`, its parts (:func:`ntil_components`,
:class:`NTILComponents`) and the internals they share with the combined loss:
the place-value weighted EMD, the straight-through digits and the relative
and magnitude deviations of whole numbers.
"""

from typing import NamedTuple, Optional

import chex
import jax
import jax.numpy as jnp
import numpy as np

from ntil_jax import arrays
from ntil_jax import base
from ntil_jax import numbers
from ntil_jax import segments
from ntil_jax import statistics
from ntil_jax import validation

_LN10 = float(np.log(10.0))


class NTILComponents(NamedTuple):
  """The parts of NTIL, each ``[..., T]`` float32 and zero outside numbers.

  Attributes:
    emd: token-level EMD between the digit distribution and the target digit.
    weights: place-value weight ``(1 + sigma)**digits_right`` (1 outside),
      capped at 1e30 (from 379 digits to the right at ``sigma=0.2``).
    relative: relative deviation ``|X-Y| / (max(X,Y)+1)``, on each number's
      last digit.
    magnitude: magnitude deviation ``log((max(X,Y)+1) / (min(X,Y)+1))``, on
      each number's last digit.
    predicted_digits: the straight-through digit value (argmax in the forward
      pass) at digit positions.
  """

  emd: chex.Array
  weights: chex.Array
  relative: chex.Array
  magnitude: chex.Array
  predicted_digits: chex.Array


def _straight_through_digits(digit_logits_, *, tau, key, noise_scale):
  """``(hard, soft)``: the argmax digit and the tempered-softmax mean digit.

  The straight-through digit is ``hard + soft - sg(soft)``: the argmax in
  the forward pass (``soft - sg(soft)`` is exactly 0), the gradient of
  ``soft`` backward. ``hard`` is int32 (9 where the logits hold a NaN).
  """
  if key is not None:
    gumbel = jax.random.gumbel(key, digit_logits_.shape, jnp.float32)
    digit_logits_ = digit_logits_ + noise_scale * gumbel
  # The first maximum (argmax's variadic reduction is a larger program).
  top = jnp.max(digit_logits_, axis=-1, keepdims=True)
  hard = jnp.min(arrays.where(digit_logits_ == top, _DIGIT_IDS, 9), axis=-1)
  # Shifted by the maximum before the division: the largest is then exactly
  # 0 whatever tau, where ``logits / tau`` could round two ways in one
  # program (XLA turns the division into a product in some of its uses),
  # and jax.nn.softmax's own shift left exp(+1 ulp of 1e11) = inf, a NaN
  # gradient.
  shifted = (digit_logits_ - jax.lax.stop_gradient(top)) / tau
  soft = _softmax_of_shifted(shifted) @ base.DIGITS
  return hard, soft


_DIGIT_IDS = np.arange(numbers.NUM_DIGITS, dtype=np.int32)


@jax.custom_jvp
def _softmax_of_shifted(x):
  """``softmax(x)`` along the last axis for ``x`` whose maximum is 0: no
  shift of its own (``jax.nn.softmax``'s second maximum would be one more
  kernel), and jax.nn.softmax's derivative, exactly 0 where it is one-hot."""
  e = jnp.exp(x)
  return e / jnp.sum(e, axis=-1, keepdims=True)


@_softmax_of_shifted.defjvp
def _softmax_of_shifted_jvp(primals, tangents):
  (x,), (t,) = primals, tangents
  p = _softmax_of_shifted(x)
  return p, p * (t - jnp.sum(p * t, axis=-1, keepdims=True))


@jax.custom_vjp
def _number_deviations(soft_digits, x_digits, layout, comparison):
  """Relative and magnitude deviations of each number, on its last digit.

  X and Y are never formed (they overflow float32 past 38 digits, and their
  difference cancels): every quantity is a sum of digits times powers of ten
  relative to a number's leading place, O(1) in size. With ``L`` the larger
  leading place, ``|X - Y| / 10**L`` is summed from the digits of ``|X - Y|``
  (:func:`numbers.compare_numbers`), so close numbers keep their precision
  (``10**19`` vs ``10**19 - 1`` gives 1e-19), and the gradient of a number
  predicted exactly right is zero (``|x|`` flat at 0). The magnitude
  deviation is ``log1p(|X-Y| / (min+1))`` while that ratio is at most 1, else
  ``log(max+1) - log(min+1)`` with each log taken at its number's own scale,
  exact for any length. Each branch is computed everywhere and selected
  with a ``where``: a value of the branch not taken may be infinite (the
  "+1" at the larger number's scale underflows past 45 digits), but it is
  never selected, and no autodiff runs through it (the gradient is written
  out), so it cannot turn into a NaN.

  X is written with ``x_digits`` (int32, the argmax digits; 0 outside
  numbers), and its gradient is that of the straight-through digits
  ``x_digits + soft_digits - sg(soft_digits)``: the returned deviations
  are differentiated with respect to ``soft_digits`` as if X's digits were
  those. ``layout``: a :class:`numbers.NumberLayout`, not differentiated.
  The gradient is written out (:func:`_deviations_backward`): per number, the
  derivatives with respect to ``X / 10**x_place`` and ``|X - Y| / 10**L``,
  read at every digit of it (one gather at the number's last digit) and
  scaled by the digit's place.
  """
  return _deviations_forward(soft_digits, x_digits, layout, comparison)[0]


def _deviations_forward(soft_digits, x_digits, layout, comparison):
  del soft_digits  # Only its gradient counts (_deviations_backward).
  x_place, y_place, sign, correction = comparison
  x_larger = sign > 0
  big_place = arrays.where(x_larger, x_place, y_place)  # the larger leading one
  small_place = arrays.where(x_larger, y_place, x_place)
  # The larger number at its leading place, B = big / 10**big_place, and the
  # smaller, S = small / 10**small_place: in [1, 10), or below 1 when the
  # number is (leading places are clamped at 0); D = |X - Y| / 10**big_place
  # from the digits of |X - Y| (exact integers 0..9), zero when X = Y. With
  # their digits' powers of ten: the "+1" at the larger number's scale and
  # at the smaller one's, and the smaller number at the larger one's scale.
  places = layout.places
  powers = jax.lax.optimization_barrier(
      numbers.pow10(
          jnp.stack(
              [
                  places - big_place,
                  places - small_place,
                  -big_place,
                  -small_place,
                  small_place - big_place,
              ]
          )
      )
  )
  big_scale, small_own_scale, offset, small_offset, small_scale = powers
  y_digits = layout.digit_values
  difference_digits = sign * (x_digits - y_digits) + correction
  # Each number's sums, at its last digit (every term is 0 outside numbers).
  big, small, difference = segments.segmented_sums(
      (
          arrays.where(x_larger, x_digits, y_digits) * big_scale,
          arrays.where(x_larger, y_digits, x_digits) * small_own_scale,
          difference_digits * big_scale,
      ),
      layout.first,
  )
  # Unguarded: values away from last digits are masked out, coefficients are
  # only read at them, and a branch's value is only read where it is taken.
  big_plus_one = big + offset
  by_big = 1.0 / big_plus_one
  relative = difference * by_big
  small_plus_one = small * small_scale + offset
  close = difference <= small_plus_one
  ratio = difference * (1.0 / small_plus_one)
  own_plus_one = small + small_offset
  log_ratio = (
      (big_place - small_place).astype(jnp.float32) * _LN10
      + jnp.log(big_plus_one)
      - jnp.log(own_plus_one)
  )
  magnitude = arrays.where(close, jnp.log1p(ratio), log_ratio)
  # Derivatives with respect to D and to X at its own scale, B or S.
  by_close_difference = arrays.where(
      close, 1.0 / (small_plus_one + difference), 0.0
  )
  coefficients = (
      by_big,  # relative by difference
      by_close_difference,  # magnitude by difference
      arrays.where(x_larger, -relative * by_big, 0.0),  # relative by X
      arrays.where(  # magnitude by X
          close,
          arrays.where(
              x_larger, 0.0, -ratio * small_scale * by_close_difference
          ),
          arrays.where(x_larger, by_big, -1.0 / own_plus_one),
      ),
  )
  # d(X / 10**x_place) and d(D) by each digit of X.
  slopes = (
      arrays.where(x_larger, big_scale, small_own_scale),
      sign.astype(jnp.float32) * big_scale,
  )
  last = layout.is_last
  deviations = (base.masked(relative, last), base.masked(magnitude, last))
  # With the deviations, in one kernel (the backward would recompute them).
  stacked = jax.lax.optimization_barrier(jnp.stack(deviations + coefficients))
  return tuple(stacked[:2]), (
      tuple(stacked[2:]),
      slopes,
      layout.last,
      layout.is_digit,
  )


def _deviations_backward(residuals, cotangents):
  (by_difference, by_difference_m, by_x, by_x_m), slopes, last, is_digit = (
      residuals
  )
  relative, magnitude = cotangents
  # Each number's derivatives, at its last digit, read at all its digits.
  per_number = jnp.stack(
      [
          relative * by_difference + magnitude * by_difference_m,
          relative * by_x + magnitude * by_x_m,
      ],
      -1,
  )
  per_number = segments.read_at(per_number, last)
  grad = per_number[..., 1] * slopes[0] + per_number[..., 0] * slopes[1]
  return base.masked(grad, is_digit), None, None, None


_number_deviations.defvjp(_deviations_forward, _deviations_backward)


def ntil_parts_from_layout(
    stats: statistics.TokenStatistics,
    layout,
    *,
    sigma: float = 0.2,
    tau: float = 0.1,
    key: Optional[chex.PRNGKey] = None,
    noise_scale: float = 0.01,
) -> NTILComponents:
  digit_logits_ = base.digits_in_numbers(stats.digit_logits, layout)
  probs = jax.nn.softmax(digit_logits_, axis=-1)
  emd = jnp.sum(probs * base.digit_distance(layout), axis=-1)
  hard, soft = _straight_through_digits(
      digit_logits_, tau=tau, key=key, noise_scale=noise_scale
  )
  hard = arrays.where(layout.is_digit, hard, 0)
  # The layout's places from the comparison's pass (one pass, not two).
  layout, comparison = numbers.compare_numbers(hard, layout)
  relative, magnitude = _number_deviations(soft, hard, layout, comparison)
  predicted = hard + (soft - jax.lax.stop_gradient(soft))
  exponent = layout.digits_right.astype(jnp.float32)
  # Capped so that absurdly long numbers give large, finite weights (the
  # docstrings say so). Below the cap, float32's power of the rounded
  # 1 + sigma: about n x 4e-8 relative (1.2e-5 at n = 299, sigma = 0.2).
  weights = jnp.minimum(jnp.power(1.0 + sigma, exponent), 1e30)
  return NTILComponents(
      emd=base.masked(emd, layout.is_digit),
      weights=arrays.where(layout.is_digit, weights, 1.0),
      relative=relative,
      magnitude=magnitude,
      predicted_digits=predicted,
  )


def ntil_from_layout(
    stats: statistics.TokenStatistics,
    layout,
    *,
    alpha: float = 0.2,
    beta: float = 0.2,
    **kwargs,
):
  parts = ntil_parts_from_layout(stats, layout, **kwargs)
  return (
      parts.weights * parts.emd
      + alpha * parts.relative
      + beta * parts.magnitude
  )


def ntil_components(
    logits,
    labels,
    digit_mask=None,
    *,
    digit_token_ids=None,
    decimal_point_mask=None,
    sigma: float = 0.2,
    tau: float = 0.1,
    key: Optional[chex.PRNGKey] = None,
    noise_scale: float = 0.01,
    sequence_axis=None,
) -> NTILComponents:
  """The pieces of :func:`ntil_loss`, for logging and ablations.

  Arguments are those of :func:`ntil_loss` but ``alpha`` and ``beta``: the
  deviations come unweighted. Returns :class:`NTILComponents`.

  Example:
    A model sure of '4' everywhere predicts 44 for the target 33:

    >>> import math, jax.numpy as jnp
    >>> logits = jnp.zeros((1, 3, 12)).at[:, :, 4].set(30.0)
    >>> parts = ntil_components(logits, jnp.array([[3, 3, 10]]))
    >>> parts.predicted_digits[0].tolist(), parts.emd[0].tolist()
    ([4.0, 4.0, 0.0], [1.0, 1.0, 0.0])
    >>> [round(x, 4) for x in parts.weights[0].tolist()]  # (1 + sigma)**1
    [1.2, 1.0, 1.0]
    >>> [round(x, 4) for x in parts.relative[0].tolist()]  # 11 / 45
    [0.0, 0.2444, 0.0]
    >>> round(float(parts.magnitude[0, 1]), 4), round(math.log(45 / 34), 4)
    (0.2803, 0.2803)
  """
  validation.check_parameters(sigma=sigma, tau=tau, noise_scale=noise_scale)
  _, labels, digit_mask, decimal_point_mask, digit_logits_ = base.prepare(
      logits, labels, digit_mask, digit_token_ids, decimal_point_mask
  )
  return base.number_loss(
      ntil_parts_from_layout,
      base.digit_statistics(digit_logits_),
      labels,
      digit_mask,
      digit_token_ids,
      decimal_point_mask,
      sigma=sigma,
      tau=tau,
      key=key,
      noise_scale=noise_scale,
      sequence_axis=sequence_axis,
  )


def ntil_loss(
    logits,
    labels,
    digit_mask=None,
    *,
    digit_token_ids=None,
    decimal_point_mask=None,
    sigma: float = 0.2,
    alpha: float = 0.2,
    beta: float = 0.2,
    tau: float = 0.1,
    key: Optional[chex.PRNGKey] = None,
    noise_scale: float = 0.01,
    sequence_axis=None,
) -> chex.Array:
  r"""Numerical Token Integrity Loss (Fei et al., ACL 2025), per token.

  For a target number :math:`Y` written with digits :math:`y_0 \dots y_{n-1}`
  and digit distributions :math:`p_i = \mathrm{softmax}(z_i)` over the ten
  digit logits only,

  .. math::

    \ell_i = (1+\sigma)^{n-i-1} \sum_{k=0}^{9} p_{ik} |k - y_i|
      + [i = n-1] \left( \alpha \frac{|X-Y|}{\max(X,Y)+1}
      + \beta \log\frac{\max(X,Y)+1}{\min(X,Y)+1} \right),

  where :math:`X = \sum_i \hat{x}_i 10^{e_i}` is the predicted value built from
  straight-through Gumbel-softmax digits :math:`\hat{x}_i` (argmax forward,
  gradient of :math:`\mathrm{softmax}((z_i + s g_i)/\tau)` backward, Gumbel
  noise :math:`g` scaled by ``noise_scale`` when ``key`` is given) and
  :math:`e_i` the place of digit :math:`i`. Summing the result counts every
  digit's weighted EMD and every number's deviations once.

  A number is a maximal run of positions where ``digit_mask`` is true and the
  label is a digit token; anything else (other tokens, ignore ids such as -100)
  ends the run and scores exactly 0. Values are computed in float32 and stay
  exact for numbers of any length (no overflow past 38 digits; a deviation
  below float32's smallest normal number, about 1.2e-38, is 0, as for two
  39-digit numbers one apart); the one
  bound is the place weight's, capped at 1e30 so that the weighted EMD
  stays finite (at ``sigma=0.2``, the digits with 379 or more to their
  right of one number weigh 1e30 each). Ablations of
  the paper's Table 6: ``sigma=0`` removes the place-value weighting,
  ``alpha=0`` the relative and ``beta=0`` the magnitude term.

  Args:
    logits: ``[..., T, V]`` logits (any float dtype; computed in float32).
    labels: ``[..., T]`` integer target token ids.
    digit_mask: ``[..., T]`` bool, where digits may be scored (``None``: all).
    digit_token_ids: ``[10]`` token ids of the digits 0..9; ``None`` means ids
      0..9. See :func:`ntil_jax.digit_token_ids` to get them from a vocabulary. A
      :class:`~ntil_jax.NumberTokens` scores numbers written in tokens of
      1-3 digits (:mod:`ntil_jax.chunks`).
    decimal_point_mask: optional ``[..., T]`` bool, true at decimal-point
      labels that join integer and fractional digits into one number.
    sigma: place-value weighting base, weights are ``(1+sigma)**digits_right``
      (``> -1``), at most 1e30.
    alpha: weight of the relative deviation (``>= 0``).
    beta: weight of the magnitude deviation (``>= 0``).
    tau: Gumbel-softmax temperature, ``>= 1e-30`` (only shapes the gradient).
    key: optional PRNG key for Gumbel noise; ``None`` means no noise.
    noise_scale: scale of the Gumbel noise when ``key`` is given (``>= 0``).
    sequence_axis: inside ``jax.shard_map``, the mesh axes T is split over
      (see :func:`ntil_jax.numeric_token_loss`); ``None``: each shard holds
      whole sequences.

  Returns:
    ``[..., T]`` float32 per-token loss. Differentiable in reverse mode
    (``jax.grad``, ``jax.vjp``); the deviations' gradient is written out (a
    custom VJP), so forward mode (``jax.jvp``) is not supported.

  Raises:
    ValueError: for a parameter out of range (checked where it is a concrete
      number, not a traced value), mismatched shapes, or digit ids that are
      repeated or out of the vocabulary.

  Example:
    Ten digit ids 0..9, then other tokens; the target is the number 33.

    >>> import jax.numpy as jnp, optax
    >>> logits = jnp.zeros((1, 4, 12)).at[:, :, 4].set(5.0)  # '4' expected
    >>> labels = jnp.array([[3, 3, 10, 11]])
    >>> digit_mask = labels < 10
    >>> ce = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
    >>> loss = ce + 0.3 * ntil_loss(logits, labels, digit_mask)
    >>> loss.shape
    (1, 4)
    >>> ntil_loss(logits, labels, digit_mask)[0, 2:].tolist()  # no number
    [0.0, 0.0]

    A near miss costs less than a far one, which cross-entropy cannot tell
    apart ('4' is as wrong as '9' for it):

    >>> far = jnp.zeros((1, 4, 12)).at[:, :, 9].set(5.0)
    >>> bool(ntil_loss(logits, labels).sum() < ntil_loss(far, labels).sum())
    True
    >>> ce_far = optax.softmax_cross_entropy_with_integer_labels(far, labels)
    >>> bool(jnp.allclose(ce, ce_far))
    True
  """
  validation.check_parameters(
      sigma=sigma, alpha=alpha, beta=beta, tau=tau, noise_scale=noise_scale
  )
  _, labels, digit_mask, decimal_point_mask, digit_logits_ = base.prepare(
      logits, labels, digit_mask, digit_token_ids, decimal_point_mask
  )
  return base.number_loss(
      ntil_from_layout,
      base.digit_statistics(digit_logits_),
      labels,
      digit_mask,
      digit_token_ids,
      decimal_point_mask,
      sigma=sigma,
      alpha=alpha,
      beta=beta,
      tau=tau,
      key=key,
      noise_scale=noise_scale,
      sequence_axis=sequence_axis,
  )
