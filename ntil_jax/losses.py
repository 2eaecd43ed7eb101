"""Numeric token losses: NTIL and its baselines, as per-token JAX functions.

Every loss takes ``logits [..., T, V]``, integer ``labels [..., T]`` and a bool
``digit_mask [..., T]`` and returns an unreduced float32 array shaped like
``labels``: zero (with zero gradient) wherever the label is not a digit of a
number. The caller reduces, as in optax.

References:
  NTIL: Fei et al., "Advancing Sequential Numerical Prediction in
  Autoregressive Models", ACL 2025 (arXiv:2505.13077).
  Soft labels: Wang et al., "Enhancing Numerical Prediction of MLLMs with Soft
  Labeling" (Amazon AGI).
  NTL: Zausinger et al., "Regress, Don't Guess: A Regression-like Loss on
  Number Tokens for Language Models", ICML 2025.
"""

import functools
from typing import NamedTuple, Optional

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax

from ntil_jax import numbers

NUM_DIGITS = numbers.NUM_DIGITS
_DIGITS = np.arange(NUM_DIGITS, dtype=np.float32)
_LN10 = float(np.log(10.0))


# ----------------------------------------------------------------------------
# Input checks and shared pieces.


def _check_inputs(logits, labels, digit_mask, digit_token_ids, extra_masks=()):
  """Raises ValueError on shapes or dtypes that cannot be right.

  ``logits`` may be a ``jax.ShapeDtypeStruct`` (the fused path checks
  against logits it never builds). Everything checked is static: nothing
  is left to run time.
  """
  logits = jnp.asarray(logits) if not hasattr(logits, "shape") else logits
  if logits.ndim < 2:
    raise ValueError(
        f"logits must be [..., T, V] (rank >= 2), got shape {logits.shape}."
    )
  _check_logits_dtype(logits)
  if tuple(labels.shape) != tuple(logits.shape[:-1]):
    raise ValueError(
        f"labels shape {labels.shape} must equal logits shape without the "
        f"vocabulary axis, {logits.shape[:-1]} (logits {logits.shape})."
    )
  if not jnp.issubdtype(labels.dtype, jnp.integer):
    raise ValueError(f"labels must be integer token ids, got {labels.dtype}.")
  for name, mask in (("digit_mask", digit_mask),) + tuple(extra_masks):
    if mask is not None and tuple(jnp.shape(mask)) != tuple(labels.shape):
      raise ValueError(
          f"{name} shape {jnp.shape(mask)} must equal labels shape "
          f"{labels.shape}."
      )
  _check_digit_ids(digit_token_ids, logits.shape[-1])


def _check_logits_dtype(logits, name="logits") -> None:
  if not jnp.issubdtype(logits.dtype, jnp.floating):
    raise ValueError(f"{name} must be floating point, got {logits.dtype}.")


def _check_digit_ids(digit_token_ids, vocab_size):
  """Checks digit ids (``None``: 0..9) against a vocabulary of ``V`` tokens.

  Returns what :func:`numbers.check_digit_token_ids` returns (``None`` for
  the default ids).
  """
  if digit_token_ids is None:
    if vocab_size < NUM_DIGITS:
      raise ValueError(
          f"default digit ids 0..9 need a vocabulary of >= 10, got V="
          f"{vocab_size}; pass digit_token_ids."
      )
    return None
  return numbers.check_digit_token_ids(digit_token_ids, vocab_size)


# Allowed values of the loss parameters: (test, description).
_PARAMETER_RULES = {
    "sigma": (lambda v: v > -1, "> -1 (place weights are (1 + sigma)**k)"),
    "alpha": (lambda v: v >= 0, ">= 0"),
    "beta": (lambda v: v >= 0, ">= 0"),
    "lam": (lambda v: v >= 0, ">= 0"),
    "noise_scale": (lambda v: v >= 0, ">= 0"),
    "tau": (lambda v: v > 0, "> 0 (a softmax temperature)"),
    "width": (lambda v: v > 0, "> 0 (a Gaussian's width)"),
    "eta": (lambda v: (v >= 0) & (v <= 1), "in [0, 1] (a mixing weight)"),
}


def check_parameters(**parameters) -> None:
  """Raises ValueError, naming the argument, for a loss parameter out of range.

  Checks the names in ``sigma, alpha, beta, lam, noise_scale, tau, width,
  eta``; others are ignored. Traced values (inside ``jit``) cannot be checked
  and are skipped.
  """
  for name, value in parameters.items():
    if name not in _PARAMETER_RULES or value is None:
      continue
    try:
      array = np.asarray(value)
    except (jax.errors.TracerArrayConversionError, TypeError):
      continue  # traced: cannot be checked before run time
    if not (np.issubdtype(array.dtype, np.number) and np.isrealobj(array)):
      raise ValueError(f"{name} must be a real number, got {value!r}.")
    test, rule = _PARAMETER_RULES[name]
    with np.errstate(invalid="ignore"):
      ok = np.all(test(array.astype(np.float64)))  # NaN fails every test
    if not ok:
      raise ValueError(f"{name} must be {rule}, got {value!r}.")


class LossArgumentError(ValueError, TypeError):
  """An unknown keyword argument of a numeric loss.

  A ValueError like the other argument checks, and a TypeError like Python's
  own unexpected-keyword error, so either ``except`` clause catches it.
  """


def digit_logits(logits, digit_token_ids=None) -> chex.Array:
  """The logits of the ten digit tokens, ``[..., T, 10]``, in float32.

  Concrete ``digit_token_ids`` are checked (ValueError if repeated or out of
  ``[0, V)``, as are the default ids 0..9 when ``V < 10``, and logits that
  are not floating point). Traced ids cannot be checked before run time: if
  any is repeated or out of ``[0, V)``, every digit logit is NaN, so the
  loss is NaN at every digit instead of silently wrong.
  """
  logits = jnp.asarray(logits)
  if logits.ndim < 1:
    raise ValueError(
        f"logits must be [..., V] (rank >= 1), got shape {logits.shape}."
    )
  _check_logits_dtype(logits)
  columns, traced_ids = _digit_columns(digit_token_ids, logits.shape[-1])
  picked, valid_ids = _pick_digits(logits, columns, traced_ids)
  picked = picked.astype(jnp.float32)
  if valid_ids is not None:
    picked = jnp.where(valid_ids, picked, jnp.nan)
  return picked


class TokenStatistics(NamedTuple):
  """What every loss here needs from the logits, ``[..., T]`` each.

  Attributes:
    log_norm: ``logsumexp`` of the logits over the vocabulary.
    label_logits: the logit of each label (0 where the label is not in
      ``[0, V)``).
    digit_logits: ``[..., T, 10]`` logits of the digit tokens.
  """

  log_norm: chex.Array
  label_logits: chex.Array
  digit_logits: chex.Array


def token_statistics(
    logits, labels, digit_token_ids=None, *, mask=None
) -> TokenStatistics:
  """Reduces ``[..., T, V]`` logits to :class:`TokenStatistics` in float32.

  ``mask`` (bool ``[..., T]``, optional) marks the positions whose
  statistics will be used; elsewhere the statistics are those of all-zero
  logits (``log V``, 0 and zeros), so that NaN or inf logits there give
  finite statistics and a zero gradient.

  The forward pass reads the logits for the log-normalizer as optax's
  cross-entropy does and picks the label's and the ten digit logits. The
  gradient is a custom VJP: ``d log_norm * softmax(logits)`` in one
  elementwise pass over ``[..., T, V]``, then the label's and the digits'
  cotangents added in place by one scatter of 11 entries per token, instead
  of autodiff's dense pass that recomputes the per-token arithmetic for
  every logit. It equals autodiff of the plain formulation up to float
  rounding. (Being a custom VJP, it supports reverse-mode differentiation
  only, not ``jax.jvp``.)

  The float32 ``exp(logits - max)`` of the forward pass is kept for the
  backward pass for float32 logits, and on CPU for any logits (XLA's CPU
  backend writes a float32 copy of narrower logits for the reductions
  anyway, so keeping the exponentials costs no memory and saves an exp per
  logit); narrower logits on a GPU or TPU have them recomputed, so that no
  float32 ``[..., V]`` buffer outlives the forward pass.

  Raises:
    ValueError: for labels or ``mask`` not shaped like the logits without
      their last axis, non-integer labels, non-float logits, or digit ids
      out of ``[0, V)`` (the default ids 0..9 need ``V >= 10``).
  """
  logits = jnp.asarray(logits)
  labels = jnp.asarray(labels)
  mask = None if mask is None else jnp.asarray(mask)
  _check_inputs(logits, labels, None, digit_token_ids, (("mask", mask),))
  columns, traced_ids = _digit_columns(digit_token_ids, logits.shape[-1])
  if mask is not None:
    mask = jnp.asarray(mask, bool)
  return _statistics(
      logits,
      labels,
      mask,
      traced_ids,
      columns,
      logits.dtype == jnp.float32 or jax.default_backend() == "cpu",
  )


def _digit_columns(digit_token_ids, vocab_size):
  """``(columns, traced_ids)``: the ten digit columns, static or traced.

  ``columns`` is a tuple of the column ids when they are known at trace time
  (checked here), else None and ``traced_ids`` holds them as an array.
  """
  concrete = _check_digit_ids(digit_token_ids, vocab_size)
  if digit_token_ids is None:
    return tuple(range(NUM_DIGITS)), None
  if concrete is None:
    return None, jnp.asarray(digit_token_ids)
  return tuple(int(i) for i in concrete), None


def _pick_digits(logits, columns, traced_ids):
  """``[..., T, 10]`` digit logits and, for traced ids, their validity."""
  if columns is not None:
    start = columns[0]
    if columns == tuple(range(start, start + NUM_DIGITS)):
      return logits[..., start : start + NUM_DIGITS], None
    return jnp.take(logits, np.asarray(columns), axis=-1), None
  picked = jnp.take(logits, traced_ids, axis=-1, mode="clip")
  return picked, _valid_ids(traced_ids, logits.shape[-1])


def _valid_ids(traced_ids, vocab_size):
  """Whether traced digit ids are distinct and in ``[0, vocab_size)``."""
  in_range = jnp.all((traced_ids >= 0) & (traced_ids < vocab_size))
  distinct = jnp.sum(traced_ids[:, None] == traced_ids[None, :]) == NUM_DIGITS
  return in_range & distinct


def _sparse_cotangents(index, g_label, g_digits, columns, traced_ids, vocab):
  """The label's and the digits' cotangents as 11 (column, value) per token.

  ``index``: ``[..., T]`` clipped label ids. Returns ``[..., T, 11]`` int32
  columns and values, for :func:`_add_to_columns`. Invalid traced digit ids
  (which made the digit logits NaN) get zero cotangents.
  """
  if columns is not None:
    digit_columns = np.asarray(columns, np.int32)
  else:
    g_digits = jnp.where(_valid_ids(traced_ids, vocab), g_digits, 0.0)
    digit_columns = jnp.clip(traced_ids, 0, vocab - 1).astype(jnp.int32)
  index = index.astype(jnp.int32)[..., None]
  sparse_columns = jnp.concatenate(
      [index, jnp.zeros_like(index) + digit_columns], axis=-1
  )
  values = jnp.concatenate([g_label[..., None], g_digits], axis=-1)
  return sparse_columns, values


def _add_to_columns(
    dense,
    columns,
    updates,
    mode=jax.lax.GatherScatterMode.PROMISE_IN_BOUNDS,
):
  """``dense[..., t, columns[..., t, j]] += updates[..., t, j]``, in place.

  A scatter whose batch dimensions are the token axes, so a sharded batch
  stays sharded and the ``[..., T, V]`` operand is updated where it lies.
  With ``mode=FILL_OR_DROP``, updates at columns outside ``[0, V)`` are
  dropped.
  """
  token_axes = tuple(range(dense.ndim - 1))
  dimension_numbers = jax.lax.ScatterDimensionNumbers(
      update_window_dims=(),
      inserted_window_dims=(dense.ndim - 1,),
      scatter_dims_to_operand_dims=(dense.ndim - 1,),
      operand_batching_dims=token_axes,
      scatter_indices_batching_dims=token_axes,
  )
  return jax.lax.scatter_add(
      dense,
      columns[..., None],
      updates.astype(dense.dtype),
      dimension_numbers,
      mode=mode,
  )


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def _statistics(logits, labels, mask, traced_ids, columns, keep_exp):
  """:func:`token_statistics` with its one-pass VJP.

  Args:
    logits: ``[..., T, V]``.
    labels: ``[..., T]`` integer ids.
    mask: ``[..., T]`` bool or None.
    traced_ids: ``[10]`` digit ids when ``columns`` is None, else None.
    columns: static digit column ids (a tuple) or None.
    keep_exp: keep the float32 ``exp(logits - max)`` for the backward pass
      (it becomes the gradient in place, one exp per logit as in optax's
      CE), else recompute it there (no float32 ``[..., V]`` residual for
      narrower logits).
  """
  return _statistics_fwd(logits, labels, mask, traced_ids, columns, keep_exp)[0]


def _statistics_fwd(logits, labels, mask, traced_ids, columns, keep_exp):
  vocab_size = logits.shape[-1]
  # jax.nn.logsumexp step by step, so that the exponentials can be kept.
  # The maximum is exact in any dtype: taken on the logits as they are, so
  # that narrower logits are widened only inside the exp's pass, never
  # written out as a float32 [..., V] copy.
  amax = jnp.max(logits, axis=-1).astype(jnp.float32)
  amax = jnp.where(jnp.isfinite(amax), amax, 0.0)
  shifted = jnp.exp(logits.astype(jnp.float32) - amax[..., None])
  sum_exp = jnp.sum(shifted, axis=-1)
  log_norm = jnp.log(sum_exp) + amax
  index = jnp.clip(labels, 0, vocab_size - 1)
  label_logits = jnp.take_along_axis(logits, index[..., None], axis=-1)
  label_logits = label_logits[..., 0].astype(jnp.float32)
  digits, valid_ids = _pick_digits(logits, columns, traced_ids)
  digits = digits.astype(jnp.float32)
  if mask is not None:  # as if the logits there were zeros
    log_norm = jnp.where(mask, log_norm, jnp.log(jnp.float32(vocab_size)))
    label_logits = jnp.where(mask, label_logits, 0.0)
    digits = jnp.where(mask[..., None], digits, 0.0)
  if valid_ids is not None:
    # Traced ids cannot be checked before run time: invalid ones give NaN.
    digits = jnp.where(valid_ids, digits, jnp.nan)
  stats = TokenStatistics(log_norm, label_logits, digits)
  dense = (shifted, sum_exp) if keep_exp else (logits, log_norm)
  # A scalar of the logits' dtype, the gradient's.
  like = jnp.zeros((), logits.dtype)
  return stats, (dense, index, mask, traced_ids, like)


def _statistics_bwd(columns, keep_exp, residuals, cotangents):
  (big, per_token), index, mask, traced_ids, like = residuals
  g_norm, g_label, g_digits = cotangents
  if mask is not None:
    g_norm = jnp.where(mask, g_norm, 0.0)
    g_label = jnp.where(mask, g_label, 0.0)
    g_digits = jnp.where(mask[..., None], g_digits, 0.0)
  scale = g_norm / per_token if keep_exp else g_norm
  # Materialized here: the [..., V] loop then reads one number per token
  # instead of redoing the per-token arithmetic for every logit.
  scale, g_label, g_digits = jax.lax.optimization_barrier(
      (scale, g_label, g_digits)
  )
  if keep_exp:
    dense = big * scale[..., None]
  else:
    dense = jnp.exp(big.astype(jnp.float32) - per_token[..., None])
    dense = dense * scale[..., None]
  if mask is not None:  # NaN or inf logits of unused tokens: 0, not NaN
    dense = jnp.where(mask[..., None], dense, 0.0)
  dense = dense.astype(like.dtype)
  # The label's and the digits' cotangents: 11 entries per token.
  sparse_columns, values = _sparse_cotangents(
      index, g_label, g_digits, columns, traced_ids, big.shape[-1]
  )
  grad = _add_to_columns(dense, sparse_columns, values)
  return grad, None, None, None


_statistics.defvjp(_statistics_fwd, _statistics_bwd)


def _asarrays(*arrays):
  """``jnp.asarray`` of each array; ``None`` stays ``None``."""
  return tuple(None if x is None else jnp.asarray(x) for x in arrays)


def _number_loss(
    numeric_fn,
    stats: TokenStatistics,
    labels,
    digit_mask,
    digit_token_ids,
    decimal_point_mask=None,
    **loss_kwargs,
):
  """``numeric_fn(stats, layout, **loss_kwargs)`` on whole sequences.

  The number logic scans along T, and a number may cross the shards of a
  sequence split over an ``Explicit`` mesh axis: its inputs are made whole
  along T (:func:`numbers.whole_sequence`: the labels, the masks, the
  ``[..., T]`` and ``[..., T, 10]`` statistics, never ``[..., T, V]``
  logits) and the per-token result is split along T as ``labels`` are.
  """
  position_axis = labels.ndim - 1
  whole = functools.partial(numbers.whole_sequence, axis=position_axis)
  whole_stats = TokenStatistics(
      *(None if field is None else whole(field) for field in stats)
  )
  layout = numbers.number_layout(
      whole(labels),
      None if digit_mask is None else whole(digit_mask),
      digit_token_ids=digit_token_ids,
      decimal_point_mask=(
          None if decimal_point_mask is None else whole(decimal_point_mask)
      ),
  )
  result = numeric_fn(whole_stats, layout, **loss_kwargs)
  return jax.tree.map(
      lambda x: numbers.split_like(x, labels, position_axis), result
  )


def _prepare(
    logits, labels, digit_mask, digit_token_ids, decimal_point_mask=None
):
  """Validates inputs; returns them as arrays, and the digit logits."""
  logits, labels, digit_mask, decimal_point_mask = _asarrays(
      logits, labels, digit_mask, decimal_point_mask
  )
  _check_inputs(
      logits,
      labels,
      digit_mask,
      digit_token_ids,
      (("decimal_point_mask", decimal_point_mask),),
  )
  return (
      logits,
      labels,
      digit_mask,
      decimal_point_mask,
      digit_logits(logits, digit_token_ids),
  )


def _digit_distance(layout) -> chex.Array:
  """``|k - y|`` for every digit k, ``[..., T, 10]``."""
  target = layout.digit_values.astype(jnp.float32)[..., None]
  return jnp.abs(_DIGITS - target)


def _masked(values, mask):
  return jnp.where(mask, values, 0.0)


def _digits_in_numbers(digit_logits_, layout) -> chex.Array:
  """The ``[..., T, 10]`` digit logits, zero outside numbers.

  Outside numbers the loss is 0 by a ``where``, whose gradient would still be
  NaN there for NaN or inf logits (``0 * nan`` in the softmax's backward);
  this ``where`` on the digit block makes it exactly zero.
  """
  return jnp.where(layout.is_digit[..., None], digit_logits_, 0.0)


# ----------------------------------------------------------------------------
# NTIL.


class NTILComponents(NamedTuple):
  """The parts of NTIL, each ``[..., T]`` float32 and zero outside numbers.

  Attributes:
    emd: token-level EMD between the digit distribution and the target digit.
    weights: place-value weight ``(1 + sigma)**digits_right`` (1 outside).
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
  """Argmax digit in the forward pass, tempered-softmax gradient backward."""
  if key is not None:
    gumbel = jax.random.gumbel(key, digit_logits_.shape, jnp.float32)
    digit_logits_ = digit_logits_ + noise_scale * gumbel
  hard = jnp.argmax(digit_logits_, axis=-1).astype(jnp.float32)
  soft = jax.nn.softmax(digit_logits_ / tau, axis=-1) @ _DIGITS
  # soft - sg(soft) is exactly 0, so the forward value is exactly the argmax.
  return hard + (soft - jax.lax.stop_gradient(soft))


def _number_deviations(predicted, layout):
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
  exact for any length. Denominators and logs outside the branch used or away
  from last digits get 1 (a ``where`` before the operation), so their
  gradient is never ``0 * inf``.
  """
  target = layout.digit_values.astype(jnp.float32)
  x_digits = jnp.rint(jax.lax.stop_gradient(predicted)).astype(jnp.int32)
  x_place, y_place, sign, correction = numbers.compare_numbers(
      x_digits, layout.digit_values, layout
  )
  x_larger = sign > 0
  big_place = jnp.where(x_larger, x_place, y_place)  # the larger leading one
  small_place = jnp.where(x_larger, y_place, x_place)
  # Digits of |X - Y| (exact integers 0..9); the gradient is sign * dX.
  difference_digits = sign.astype(jnp.float32) * (
      predicted - target
  ) + correction.astype(jnp.float32)
  # X / 10**x_place and Y / 10**y_place: in [1, 10), or below 1 when the
  # number is (leading places are clamped at 0); |X - Y| / 10**big_place,
  # zero when X = Y.
  x_own, y_own, difference = numbers.scaled_number_sums(
      ((predicted, x_place), (target, y_place), (difference_digits, big_place)),
      layout,
  )
  big = jnp.where(x_larger, x_own, y_own)
  small = jnp.where(x_larger, y_own, x_own)
  offset = numbers.pow10(-big_place)  # the "+1"
  last = layout.is_last
  relative = difference / jnp.where(last, big + offset, 1.0)
  small_plus_one = small * numbers.pow10(small_place - big_place) + offset
  close = last & (
      jax.lax.stop_gradient(difference) <= jax.lax.stop_gradient(small_plus_one)
  )
  far = last & ~close
  ratio = difference / jnp.where(close, small_plus_one, 1.0)
  log_big = jnp.log(jnp.where(far, big + offset, 1.0))
  log_small = jnp.log(jnp.where(far, small + numbers.pow10(-small_place), 1.0))
  log_ratio = (
      (big_place - small_place).astype(jnp.float32) * _LN10
      + log_big
      - log_small
  )
  magnitude = jnp.where(close, jnp.log1p(ratio), log_ratio)
  return _masked(relative, last), _masked(magnitude, last)


def _ntil_parts(
    stats: TokenStatistics,
    layout,
    *,
    sigma: float = 0.2,
    tau: float = 0.1,
    key: Optional[chex.PRNGKey] = None,
    noise_scale: float = 0.01,
) -> NTILComponents:
  digit_logits_ = _digits_in_numbers(stats.digit_logits, layout)
  probs = jax.nn.softmax(digit_logits_, axis=-1)
  emd = jnp.sum(probs * _digit_distance(layout), axis=-1)
  exponent = layout.digits_right.astype(jnp.float32)
  # Capped so that absurdly long numbers give large, finite weights.
  weights = jnp.minimum(jnp.power(1.0 + sigma, exponent), 1e30)
  predicted = _straight_through_digits(
      digit_logits_, tau=tau, key=key, noise_scale=noise_scale
  )
  predicted = _masked(predicted, layout.is_digit)
  relative, magnitude = _number_deviations(predicted, layout)
  return NTILComponents(
      emd=_masked(emd, layout.is_digit),
      weights=jnp.where(layout.is_digit, weights, 1.0),
      relative=relative,
      magnitude=magnitude,
      predicted_digits=predicted,
  )


def _ntil(
    stats: TokenStatistics,
    layout,
    *,
    alpha: float = 0.2,
    beta: float = 0.2,
    **kwargs,
):
  parts = _ntil_parts(stats, layout, **kwargs)
  return (
      parts.weights * parts.emd
      + alpha * parts.relative
      + beta * parts.magnitude
  )


def _emd(stats: TokenStatistics, layout):
  probs = jax.nn.softmax(_digits_in_numbers(stats.digit_logits, layout), -1)
  return _masked(jnp.sum(probs * _digit_distance(layout), -1), layout.is_digit)


def _ntl_mse(stats: TokenStatistics, layout):
  probs = jax.nn.softmax(_digits_in_numbers(stats.digit_logits, layout), -1)
  expected = probs @ _DIGITS
  error = expected - layout.digit_values.astype(jnp.float32)
  return _masked(error**2, layout.is_digit)


def _soft_label(
    stats: TokenStatistics, layout, *, eta: float = 0.5, width: float = 1.0
):
  log_probs = stats.digit_logits - stats.log_norm[..., None]
  targets = soft_digit_targets(layout.digit_values, eta=eta, width=width)
  return _masked(-jnp.sum(targets * log_probs, -1), layout.is_digit)


def _digit_statistics(digit_logits_, log_norm=None):
  """Token statistics for losses that read only the digit logits."""
  return TokenStatistics(
      log_norm=log_norm, label_logits=None, digit_logits=digit_logits_
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
) -> NTILComponents:
  """The pieces of :func:`ntil_loss`, for logging and ablations.

  Arguments are those of :func:`ntil_loss`. Returns :class:`NTILComponents`.
  """
  check_parameters(sigma=sigma, tau=tau, noise_scale=noise_scale)
  _, labels, digit_mask, decimal_point_mask, digit_logits_ = _prepare(
      logits, labels, digit_mask, digit_token_ids, decimal_point_mask
  )
  return _number_loss(
      _ntil_parts,
      _digit_statistics(digit_logits_),
      labels,
      digit_mask,
      digit_token_ids,
      decimal_point_mask,
      sigma=sigma,
      tau=tau,
      key=key,
      noise_scale=noise_scale,
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
  exact for numbers of any length (no overflow past 38 digits). Ablations of
  the paper's Table 6: ``sigma=0`` removes the place-value weighting,
  ``alpha=0`` the relative and ``beta=0`` the magnitude term.

  Args:
    logits: ``[..., T, V]`` logits (any float dtype; computed in float32).
    labels: ``[..., T]`` integer target token ids.
    digit_mask: ``[..., T]`` bool, where digits may be scored (``None``: all).
    digit_token_ids: ``[10]`` token ids of the digits 0..9; ``None`` means ids
      0..9. See :func:`ntil_jax.digit_token_ids` to get them from a vocabulary.
    decimal_point_mask: optional ``[..., T]`` bool, true at decimal-point
      labels that join integer and fractional digits into one number.
    sigma: place-value weighting base, weights are ``(1+sigma)**digits_right``
      (``> -1``).
    alpha: weight of the relative deviation (``>= 0``).
    beta: weight of the magnitude deviation (``>= 0``).
    tau: Gumbel-softmax temperature, ``> 0`` (only shapes the gradient).
    key: optional PRNG key for Gumbel noise; ``None`` means no noise.
    noise_scale: scale of the Gumbel noise when ``key`` is given (``>= 0``).

  Returns:
    ``[..., T]`` float32 per-token loss.

  Raises:
    ValueError: for a parameter out of range (checked where it is a concrete
      number, not a traced value), mismatched shapes, or digit ids that are
      repeated or out of the vocabulary.

  Example:
    >>> loss = ce + 0.3 * ntil_loss(logits, labels, digit_mask)
  """
  check_parameters(
      sigma=sigma, alpha=alpha, beta=beta, tau=tau, noise_scale=noise_scale
  )
  _, labels, digit_mask, decimal_point_mask, digit_logits_ = _prepare(
      logits, labels, digit_mask, digit_token_ids, decimal_point_mask
  )
  return _number_loss(
      _ntil,
      _digit_statistics(digit_logits_),
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
  )


# ----------------------------------------------------------------------------
# Baselines.


def emd_loss(
    logits, labels, digit_mask=None, *, digit_token_ids=None
) -> chex.Array:
  r"""Earth Mover's Distance between the digit distribution and the target.

  .. math:: \ell_t = \sum_{k=0}^{9} p_{tk} |k - y_t|, \quad
            p_t = \mathrm{softmax}(z_t^{\text{digits}})

  The "EMD" baseline of the NTIL paper; for single-digit tokens it equals the
  Wasserstein variant NTL-WAS of the Number Token Loss paper. Arguments and
  result as in :func:`ntil_loss`.
  """
  _, labels, digit_mask, _, digit_logits_ = _prepare(
      logits, labels, digit_mask, digit_token_ids
  )
  return _number_loss(
      _emd,
      _digit_statistics(digit_logits_),
      labels,
      digit_mask,
      digit_token_ids,
  )


def ntl_mse_loss(
    logits, labels, digit_mask=None, *, digit_token_ids=None
) -> chex.Array:
  r"""Number Token Loss, MSE variant: squared error of the expected digit.

  .. math:: \ell_t = \Big(\sum_{k=0}^{9} k\, p_{tk} - y_t\Big)^2

  with :math:`p_t` the softmax over the ten digit logits (Zausinger et al.,
  2025). Arguments and result as in :func:`ntil_loss`.
  """
  _, labels, digit_mask, _, digit_logits_ = _prepare(
      logits, labels, digit_mask, digit_token_ids
  )
  return _number_loss(
      _ntl_mse,
      _digit_statistics(digit_logits_),
      labels,
      digit_mask,
      digit_token_ids,
  )


def soft_digit_targets(digit_values, *, eta: float, width: float):
  r"""Soft labels over the ten digits: ``(1-eta) onehot(y) + eta psi(y)``.

  .. math:: \psi_k(y) = \frac{e^{-(k-y)^2 / 2w^2}}{\sum_j e^{-(j-y)^2/2w^2}}

  Returns ``[..., 10]`` float32 rows that sum to 1. ``eta`` must be in
  ``[0, 1]`` and ``width > 0`` (ValueError otherwise, for concrete values).
  """
  check_parameters(eta=eta, width=width)
  target = jnp.asarray(digit_values, jnp.float32)[..., None]
  gaussian = jnp.exp(-((_DIGITS - target) ** 2) / (2.0 * width**2))
  psi = gaussian / gaussian.sum(-1, keepdims=True)
  one_hot = jax.nn.one_hot(digit_values, NUM_DIGITS, dtype=jnp.float32)
  return (1.0 - eta) * one_hot + eta * psi


def soft_label_cross_entropy(
    logits,
    labels,
    digit_mask=None,
    *,
    digit_token_ids=None,
    eta: float = 0.5,
    width: float = 1.0,
) -> chex.Array:
  r"""Cross-entropy of digit tokens against soft digit labels.

  .. math:: \ell_t = -\sum_{k=0}^{9} q_k(y_t) \log p_t(\text{digit } k),
            \quad q(y) = (1-\eta)\,\delta(y) + \eta\,\psi(y)

  :math:`p_t` is the softmax over the whole vocabulary and :math:`\psi` a
  Gaussian over digit distance with width ``width`` (see
  :func:`soft_digit_targets`), after the soft-labeling poster (Wang et al.,
  Amazon AGI). The poster does not give :math:`\eta` or the width; the
  defaults here are a reasonable middle (not tuned). Arguments and result as
  in :func:`ntil_loss`; ``eta`` in ``[0, 1]``, ``width > 0``.
  """
  check_parameters(eta=eta, width=width)
  logits, labels, digit_mask, _, digit_logits_ = _prepare(
      logits, labels, digit_mask, digit_token_ids
  )
  is_digit, _ = numbers.match_digits(labels, digit_token_ids)
  if digit_mask is not None:
    is_digit = is_digit & digit_mask.astype(bool)
  # Logits outside numbers are zeroed so that NaN/inf there gives no NaN
  # gradient through the log-normalizer.
  in_numbers = jnp.where(is_digit[..., None], logits, 0)
  log_norm = jax.nn.logsumexp(in_numbers.astype(jnp.float32), -1)
  return _number_loss(
      _soft_label,
      _digit_statistics(digit_logits_, log_norm),
      labels,
      digit_mask,
      digit_token_ids,
      eta=eta,
      width=width,
  )


def cross_entropy(logits, labels, loss_mask=None) -> chex.Array:
  """Token cross-entropy (optax), zero where ``loss_mask`` is false.

  Labels outside ``[0, V)`` (ignore ids such as -100) also score 0, with zero
  gradient even where the logits are NaN or inf.
  """
  logits = jnp.asarray(logits)
  labels = jnp.asarray(labels)
  loss_mask = None if loss_mask is None else jnp.asarray(loss_mask)
  _check_inputs(logits, labels, None, None, (("loss_mask", loss_mask),))
  valid = _scored(labels, logits.shape[-1], loss_mask)
  logits = jnp.where(valid[..., None], logits, 0)
  ce = optax.softmax_cross_entropy_with_integer_labels(
      logits.astype(jnp.float32), jnp.where(valid, labels, 0)
  )
  return _masked(ce, valid)


def _scored(labels, vocab_size, loss_mask):
  """Positions whose label is a real token and that the loss mask keeps."""
  valid = (labels >= 0) & (labels < vocab_size)
  if loss_mask is not None:
    valid = valid & jnp.asarray(loss_mask, bool)
  return valid


# ----------------------------------------------------------------------------
# The combined loss a train step calls.

NUMERIC_LOSSES = {
    "ce": None,
    "emd": emd_loss,
    "ntl_mse": ntl_mse_loss,
    "soft_label": soft_label_cross_entropy,
    "ntil": ntil_loss,
}
_FROM_STATISTICS = {
    "ce": None,
    "emd": _emd,
    "ntl_mse": _ntl_mse,
    "soft_label": _soft_label,
    "ntil": _ntil,
}
WEIGHTINGS = ("sum", "reference")
# The keyword arguments each method's loss takes through numeric_token_loss.
LOSS_KEYWORDS = {
    "ce": (),
    "emd": (),
    "ntl_mse": (),
    "soft_label": ("eta", "width"),
    "ntil": ("sigma", "alpha", "beta", "tau", "key", "noise_scale"),
}


def numeric_token_loss(
    logits,
    labels,
    *,
    loss_mask=None,
    digit_mask=None,
    method: str = "ntil",
    lam: float = 0.3,
    weighting: str = "sum",
    digit_token_ids=None,
    decimal_point_mask=None,
    **loss_kwargs,
) -> chex.Array:
  r"""Cross-entropy on every scored token plus ``lam`` times a numeric loss.

  .. math:: \ell_t = \mathrm{CE}_t + \lambda\, w\, \mathrm{aux}_t

  with :math:`\mathrm{aux}` the loss named by ``method`` (``"ntil"``,
  ``"emd"``, ``"ntl_mse"``, ``"soft_label"``; ``"ce"`` for none) on the digit
  tokens of scored positions (``digit_mask & loss_mask``).

  ``weighting="sum"`` (default) uses :math:`w = 1`. ``weighting="reference"``
  reproduces the NTIL authors' code, ``CE + stop_gradient(CE/aux) * lam *
  aux``: :math:`w = \mathrm{sg}(\sum_t \mathrm{CE}_t / \sum_t
  \mathrm{aux}_t)` over the whole batch, so the auxiliary term's value is
  always ``lam`` times the CE and only its direction is learned.

  With ``method="soft_label"`` and ``w = 1``, ``CE + lam * CE_soft`` equals
  ``(1 + lam)`` times a soft-label CE with ``eta' = lam * eta / (1 + lam)``.

  Args:
    logits: ``[..., T, V]``.
    labels: ``[..., T]`` integer ids; ids outside ``[0, V)`` score 0.
    loss_mask: ``[..., T]`` bool, positions to score (``None``: all valid).
    digit_mask: ``[..., T]`` bool, where numbers may be (``None``: all).
    method: which numeric loss.
    lam: its weight (``>= 0``).
    weighting: ``"sum"`` or ``"reference"``.
    digit_token_ids: ``[10]`` digit token ids (``None``: 0..9).
    decimal_point_mask: optional ``[..., T]`` bool, true at decimal-point
      labels that join integer and fractional digits into one number (see
      :func:`ntil_loss`). It changes only where numbers begin and end, so
      only NTIL's place values and number deviations; the per-digit losses
      of the other methods are the same with or without it.
    **loss_kwargs: keyword arguments of the numeric loss (``sigma``,
      ``alpha``, ``key``, ``eta``, ...; see ``LOSS_KEYWORDS``).

  Returns:
    ``[..., T]`` float32 per-token loss. Positions not scored (``loss_mask``
    false, labels outside ``[0, V)``) score 0 with zero gradient, even where
    their logits are NaN or inf.

  Raises:
    ValueError: as :func:`check_method`, and for bad shapes or digit ids.
  """
  logits, labels, loss_mask, decimal_point_mask = _asarrays(
      logits, labels, loss_mask, decimal_point_mask
  )
  _check_inputs(
      logits,
      labels,
      digit_mask,
      digit_token_ids,
      (
          ("loss_mask", loss_mask),
          ("decimal_point_mask", decimal_point_mask),
      ),
  )
  check_method(method, weighting, loss_kwargs, lam=lam)
  stats = token_statistics(
      logits,
      labels,
      digit_token_ids,
      mask=_scored(labels, logits.shape[-1], loss_mask),
  )
  return loss_from_statistics(
      stats,
      labels,
      vocab_size=logits.shape[-1],
      loss_mask=loss_mask,
      digit_mask=digit_mask,
      method=method,
      lam=lam,
      weighting=weighting,
      digit_token_ids=digit_token_ids,
      decimal_point_mask=decimal_point_mask,
      **loss_kwargs,
  )


def check_method(method: str, weighting: str, loss_kwargs, lam=None) -> None:
  """Checks the arguments of :func:`numeric_token_loss` besides the arrays.

  Args:
    method: a key of ``NUMERIC_LOSSES``.
    weighting: one of ``WEIGHTINGS``.
    loss_kwargs: the keyword arguments for the method's loss.
    lam: the numeric loss's weight, if it is to be checked.

  Raises:
    ValueError: for an unknown method or weighting, or a parameter value out
      of range (:func:`check_parameters`).
    LossArgumentError: (a ValueError and a TypeError) for a keyword the
      method's loss does not take; the message names that loss and its
      keywords.
  """
  if method not in NUMERIC_LOSSES:
    raise ValueError(
        f"unknown method {method!r}; choose one of "
        f"{sorted(NUMERIC_LOSSES)}."
    )
  if weighting not in WEIGHTINGS:
    raise ValueError(
        f"unknown weighting {weighting!r}; choose one of " f"{WEIGHTINGS}."
    )
  valid = LOSS_KEYWORDS[method]
  unknown = sorted(set(loss_kwargs) - set(valid))
  if method == "ce" and unknown:
    raise LossArgumentError(
        f"method 'ce' takes no loss arguments, got " f"{unknown}."
    )
  if unknown:
    loss_name = NUMERIC_LOSSES[method].__name__
    takes = (
        f"takes {', '.join(valid)}"
        if valid
        else "takes no keyword arguments here"
    )
    raise LossArgumentError(
        f"unknown loss argument(s) {unknown} for method {method!r}: "
        f"{loss_name} {takes}."
    )
  check_parameters(lam=lam, **loss_kwargs)


def loss_from_statistics(
    stats: TokenStatistics,
    labels,
    *,
    vocab_size: int,
    loss_mask=None,
    digit_mask=None,
    method: str = "ntil",
    lam: float = 0.3,
    weighting: str = "sum",
    digit_token_ids=None,
    decimal_point_mask=None,
    **loss_kwargs,
) -> chex.Array:
  """:func:`numeric_token_loss` from precomputed :class:`TokenStatistics`.

  The logits path and the fused path (:mod:`ntil_jax.fused`) both end here,
  so they compute the same loss by construction. For a zero gradient where
  the logits of unscored positions are NaN or inf, compute ``stats`` with
  ``token_statistics(..., mask=...)`` of the scored positions.

  Args:
    stats: :class:`TokenStatistics` of the logits, ``log_norm`` and
      ``label_logits`` shaped like ``labels``, ``digit_logits`` like
      ``labels`` plus a last axis of 10.
    labels: ``[..., T]`` integer ids; ids outside ``[0, vocab_size)`` score 0.
    vocab_size: ``V``, the logits' vocabulary size.
    loss_mask: as in :func:`numeric_token_loss`.
    digit_mask: as in :func:`numeric_token_loss`.
    method: as in :func:`numeric_token_loss`.
    lam: as in :func:`numeric_token_loss`.
    weighting: as in :func:`numeric_token_loss`.
    digit_token_ids: as in :func:`numeric_token_loss`.
    decimal_point_mask: as in :func:`numeric_token_loss`.
    **loss_kwargs: as in :func:`numeric_token_loss`.

  Returns:
    ``[..., T]`` float32 per-token loss.

  Raises:
    ValueError: as :func:`numeric_token_loss`, for a ``vocab_size`` that is
      no positive int, and for statistics not shaped like ``labels`` or not
      floating point.
  """
  check_method(method, weighting, loss_kwargs, lam=lam)
  labels, loss_mask, digit_mask, decimal_point_mask = _asarrays(
      labels, loss_mask, digit_mask, decimal_point_mask
  )
  _check_statistics(stats, labels, vocab_size)
  _check_inputs(
      jax.ShapeDtypeStruct(labels.shape + (vocab_size,), jnp.float32),
      labels,
      digit_mask,
      digit_token_ids,
      (
          ("loss_mask", loss_mask),
          ("decimal_point_mask", decimal_point_mask),
      ),
  )
  scored = _scored(labels, vocab_size, loss_mask)
  ce = _masked(stats.log_norm - stats.label_logits, scored)
  numeric_fn = _FROM_STATISTICS[method]
  if numeric_fn is None:
    return ce
  mask = scored if digit_mask is None else scored & digit_mask.astype(bool)
  aux = _number_loss(
      numeric_fn,
      stats,
      labels,
      mask,
      digit_token_ids,
      decimal_point_mask,
      **loss_kwargs,
  )
  if weighting == "reference":
    aux_total = jnp.sum(aux)
    ratio = jnp.where(
        aux_total > 0,
        jnp.sum(ce) / jnp.where(aux_total > 0, aux_total, 1.0),
        0.0,
    )
    aux = jax.lax.stop_gradient(ratio) * aux
  return ce + lam * aux


def _check_statistics(stats, labels, vocab_size) -> None:
  """Raises ValueError unless ``stats`` fit ``labels`` and ``vocab_size``."""
  if isinstance(vocab_size, (bool, np.bool_)) or not isinstance(
      vocab_size, (int, np.integer)
  ):
    raise ValueError(
        f"vocab_size must be a positive int, got {vocab_size!r} "
        f"({type(vocab_size).__name__})."
    )
  if vocab_size < 1:
    raise ValueError(f"vocab_size must be a positive int, got {vocab_size}.")
  shapes = {
      "log_norm": labels.shape,
      "label_logits": labels.shape,
      "digit_logits": labels.shape + (NUM_DIGITS,),
  }
  for name, shape in shapes.items():
    field = jnp.asarray(getattr(stats, name))
    if field.shape != shape:
      raise ValueError(
          f"stats.{name} shape {field.shape} must be {shape} (labels shape "
          f"{labels.shape}{' + (10,)' if name == 'digit_logits' else ''})."
      )
    _check_logits_dtype(field, f"stats.{name}")
