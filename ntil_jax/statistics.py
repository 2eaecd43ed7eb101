"""Token statistics: what every loss reads from the ``[..., T, V]`` logits.

:class:`TokenStatistics` (log-normalizer, label logit, ten digit logits),
:func:`token_statistics` with its one-pass custom VJP, :func:`digit_logits`,
and the helpers that find, pick and scatter into the digit columns.
"""

import functools
from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np

from ntil_jax import arrays
from ntil_jax import chunks
from ntil_jax import numbers
from ntil_jax import validation
from ntil_jax import vocab


def digit_logits(logits, digit_token_ids=None) -> chex.Array:
  """The logits of the ten digit tokens, ``[..., T, 10]``, in float32.

  With a :class:`~ntil_jax.NumberTokens` as ``digit_token_ids``, the
  logits of its ``K`` number tokens, ``[..., T, K]``, in the order
  :mod:`ntil_jax.chunks` reads them (by width, then value, then id).

  Concrete ``digit_token_ids`` are checked (ValueError if repeated or out of
  ``[0, V)``, as are the default ids 0..9 when ``V < 10``, and logits that
  are not floating point). Traced ids cannot be checked before run time: if
  any is repeated or out of ``[0, V)``, every digit logit is NaN, so the
  loss is NaN at every digit instead of silently wrong.

  Example:
    Digits at ids 5..14 of a vocabulary of 16:

    >>> import jax.numpy as jnp
    >>> logits = jnp.arange(16.0)[None, :]
    >>> digit_logits(logits, digit_token_ids=range(5, 15)).tolist()
    [[5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0, 13.0, 14.0]]
  """
  logits = jnp.asarray(logits)
  if logits.ndim < 1:
    raise ValueError(
        f"logits must be [..., V] (rank >= 1), got shape {logits.shape}."
    )
  validation.check_logits_dtype(logits)
  columns, traced_ids = digit_column_ids(digit_token_ids, logits.shape[-1])
  picked, valid_ids = _pick_digits(logits, columns, traced_ids)
  picked = picked.astype(jnp.float32)
  if valid_ids is not None:
    picked = arrays.where(valid_ids, picked, jnp.nan)
  # Materialized, and so is its cotangent under autodiff (the barrier's
  # transpose is a barrier): otherwise XLA fuses a loss's whole per-token
  # gradient into the [..., V] add of `ce + lam * loss`, where it is
  # recomputed for every column (1.16-1.22x CE's time instead of ~1.0x).
  (picked,) = jax.lax.optimization_barrier((picked,))
  return picked


class TokenStatistics(NamedTuple):
  """What every loss here needs from the logits, ``[..., T]`` each.

  Attributes:
    log_norm: ``logsumexp`` of the logits over the vocabulary.
    label_logits: the logit of each label; a label outside ``[0, V)``
      (an ignore id) reads the column it is clipped to (0 for ``-100``),
      and a position outside the ``mask`` given reads 0. The losses never
      read either.
    digit_logits: ``[..., T, 10]`` logits of the digit tokens
      (``[..., T, K]`` with a :class:`~ntil_jax.NumberTokens`, as
      :func:`digit_logits`).
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

  Example:
    >>> import jax.numpy as jnp
    >>> logits = jnp.zeros((1, 2, 12)).at[0, 0, 5].set(1.0)
    >>> stats = token_statistics(logits, jnp.array([[5, 11]]))
    >>> stats.label_logits.tolist(), stats.digit_logits.shape
    ([[1.0, 0.0]], (1, 2, 10))
    >>> [round(x, 4) for x in stats.log_norm[0].tolist()]  # log(e + 11), log 12
    [2.6187, 2.4849]
  """
  logits = jnp.asarray(logits)
  labels = numbers.label_array(labels)
  mask = None if mask is None else jnp.asarray(mask)
  validation.check_inputs(
      logits, labels, None, digit_token_ids, (("mask", mask),)
  )
  labels, mask = numbers.reshard_like(logits, labels, mask)
  columns, traced_ids = digit_column_ids(digit_token_ids, logits.shape[-1])
  if mask is not None:
    mask = jnp.asarray(mask, bool)
  return statistics_from_columns(
      logits,
      labels,
      mask,
      traced_ids,
      columns,
      logits.dtype == jnp.float32 or jax.default_backend() == "cpu",
  )


def digit_column_ids(digit_token_ids, vocab_size):
  """``(columns, traced_ids)``: the ten digit columns, static or traced.

  For :class:`~ntil_jax.NumberTokens`, the columns of every number token in
  their canonical order (:func:`ntil_jax.chunks.spec_and_ids`).

  ``columns`` is a tuple of the column ids when they are known at trace time
  (checked here), else None and ``traced_ids`` holds them as an array.
  """
  if isinstance(digit_token_ids, vocab.NumberTokens):
    _, ids, concrete = chunks.spec_and_ids(digit_token_ids, vocab_size)
    return (None, ids) if concrete is None else (tuple(concrete.tolist()), None)
  concrete = validation.check_digit_ids(digit_token_ids, vocab_size)
  if digit_token_ids is None:
    return tuple(range(numbers.NUM_DIGITS)), None
  if concrete is None:
    return None, jnp.asarray(digit_token_ids)
  return tuple(int(i) for i in concrete), None


def _pick_digits(logits, columns, traced_ids):
  """``[..., T, 10]`` digit logits and, for traced ids, their validity."""
  if columns is not None:
    start = columns[0]
    if columns == tuple(range(start, start + len(columns))):
      return _column_slice(logits, start, len(columns)), None
    return jnp.take(logits, np.asarray(columns), axis=-1), None
  picked = jnp.take(logits, traced_ids, axis=-1, mode="clip")
  return picked, ids_are_valid(traced_ids, logits.shape[-1])


@functools.partial(jax.custom_jvp, nondiff_argnums=(1, 2))
def _column_slice(logits, start, size):
  """``logits[..., start : start + size]``, differentiated as a gather.

  The slice's transpose is a pad, which XLA fuses into the ``[..., V]``
  addition of this cotangent to another (CE's, in ``ce + lam * loss``): a
  pass with a bounds check per logit. A gather's is a scatter-add, which XLA
  folds into that gradient in place (``size`` values a row).
  """
  return logits[..., start : start + size]


@_column_slice.defjvp
def _column_slice_jvp(start, size, primals, tangents):
  (logits,), (tangent,) = primals, tangents
  columns = np.arange(start, start + size)
  return _column_slice(logits, start, size), jnp.take(tangent, columns, axis=-1)


def ids_are_valid(traced_ids, vocab_size):
  """Whether traced digit ids are distinct and in ``[0, vocab_size)``."""
  in_range = jnp.all((traced_ids >= 0) & (traced_ids < vocab_size))
  distinct = (
      jnp.sum(traced_ids[:, None] == traced_ids[None, :]) == traced_ids.shape[0]
  )
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
    g_digits = arrays.where(ids_are_valid(traced_ids, vocab), g_digits, 0.0)
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
def statistics_from_columns(
    logits, labels, mask, traced_ids, columns, keep_exp
):
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
  amax = arrays.where(jnp.isfinite(amax), amax, 0.0)
  shifted = jnp.exp(logits.astype(jnp.float32) - amax[..., None])
  sum_exp = jnp.sum(shifted, axis=-1)
  log_norm = jnp.log(sum_exp) + amax
  index = jnp.clip(labels, 0, vocab_size - 1)
  label_logits = jnp.take_along_axis(logits, index[..., None], axis=-1)
  label_logits = label_logits[..., 0].astype(jnp.float32)
  digits, valid_ids = _pick_digits(logits, columns, traced_ids)
  digits = digits.astype(jnp.float32)
  if mask is not None:  # as if the logits there were zeros
    log_norm = arrays.where(mask, log_norm, jnp.log(jnp.float32(vocab_size)))
    label_logits = arrays.where(mask, label_logits, 0.0)
    digits = arrays.where(mask[..., None], digits, 0.0)
  if valid_ids is not None:
    # Traced ids cannot be checked before run time: invalid ones give NaN.
    digits = arrays.where(valid_ids, digits, jnp.nan)
  stats = TokenStatistics(log_norm, label_logits, digits)
  dense = (shifted, sum_exp) if keep_exp else (logits, log_norm)
  # A scalar of the logits' dtype, the gradient's.
  like = jnp.zeros((), logits.dtype)
  return stats, (dense, index, mask, traced_ids, like)


def _statistics_bwd(columns, keep_exp, residuals, cotangents):
  (big, per_token), index, mask, traced_ids, like = residuals
  g_norm, g_label, g_digits = cotangents
  if mask is not None:
    g_norm = arrays.where(mask, g_norm, 0.0)
    g_label = arrays.where(mask, g_label, 0.0)
    g_digits = arrays.where(mask[..., None], g_digits, 0.0)
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
    dense = arrays.where(mask[..., None], dense, 0.0)
  dense = dense.astype(like.dtype)
  # The label's and the digits' cotangents: 11 entries per token.
  sparse_columns, values = _sparse_cotangents(
      index, g_label, g_digits, columns, traced_ids, big.shape[-1]
  )
  grad = _add_to_columns(dense, sparse_columns, values)
  return grad, None, None, None


statistics_from_columns.defvjp(_statistics_fwd, _statistics_bwd)
