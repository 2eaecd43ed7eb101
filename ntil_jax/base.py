"""The shared base of the per-token numeric losses.

Inputs made arrays and checked, the digit logits prepared, a loss run on the
number layout of whole sequences (:func:`number_loss`), and the small
helpers that mask, measure digit distances and pick the scored positions.
"""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np

from ntil_jax import arrays
from ntil_jax import chunks
from ntil_jax import numbers
from ntil_jax import statistics
from ntil_jax import validation
from ntil_jax import vocab

DIGITS = np.arange(numbers.NUM_DIGITS, dtype=np.float32)


def asarrays(*arrays):
  """``jnp.asarray`` of each array; ``None`` stays ``None``."""
  return tuple(None if x is None else jnp.asarray(x) for x in arrays)


def asarrays_with_labels(labels, *arrays):
  """:func:`numbers.label_array` of ``labels``, then :func:`asarrays`."""
  return (numbers.label_array(labels),) + asarrays(*arrays)


def number_loss(
    numeric_fn,
    stats: statistics.TokenStatistics,
    labels,
    digit_mask,
    digit_token_ids,
    decimal_point_mask=None,
    sequence_axis=None,
    **loss_kwargs,
):
  """``numeric_fn(stats, layout, **loss_kwargs)`` on whole sequences.

  The number logic sums along T, and a number may cross the shards of a
  sequence split over an ``Explicit`` mesh axis: its inputs are made whole
  along T (:func:`numbers.whole_sequence`: the labels, the masks, the
  ``[..., T]`` and ``[..., T, 10]`` statistics, never ``[..., T, V]``
  logits) and the per-token result is split along T as ``labels`` are.
  Inside ``shard_map`` no sharding says where T is split: ``sequence_axis``
  names the manual axes it is split over, and the same inputs are gathered
  over them (:func:`numbers.gather_sequence`), the result cut back to the
  shard's positions.

  Called outside ``jit`` (eagerly, or under ``jax.grad`` or ``jax.vmap``
  alone) and without a mesh, it runs as one compiled program
  (`_compiled_number_loss`): the number logic would otherwise run op by op,
  each of its hundreds of operations compiled on its own (12 s on a CPU for
  the first value and gradient of a [2, 70] batch, 5 s compiled). Traced
  into a caller's program (:func:`arrays.staged`: ``jit``, ``scan``, ...) it is
  traced in place, as XLA would inline that program anyway: a nested
  ``jit`` there only adds tracing (it is traced on its own, then again by
  ``jax.grad``'s linearization).
  Settings that are not arrays (floats, strings, ``None``) are compiled in
  as constants, as they are without the ``jit``; arrays (a traced weight, a
  PRNG key) are arguments. Under a mesh (``jax.set_mesh``) it is traced
  into the caller's program as it is, its shardings the caller's.
  """
  spec = None
  if isinstance(digit_token_ids, vocab.NumberTokens):
    spec, digit_token_ids, _ = chunks.spec_and_ids(digit_token_ids)
    if spec.narrow:  # ten single-digit tokens: the digit ids, in value order
      spec = None
  if digit_token_ids is not None and not isinstance(digit_token_ids, jax.Array):
    digit_token_ids = jnp.asarray(digit_token_ids)
  array_kwargs = {k: v for k, v in loss_kwargs.items() if _is_array(v)}
  settings = tuple(
      sorted((k, v) for k, v in loss_kwargs.items() if k not in array_kwargs)
  )
  try:
    hash((numeric_fn, settings))
    compiled = jax.sharding.get_abstract_mesh().empty
  except TypeError:  # a setting that cannot be a constant (a list)
    compiled = False
  inputs = (stats, labels, digit_mask, decimal_point_mask, array_kwargs)
  if compiled and any(arrays.staged(x) for x in jax.tree.leaves(inputs)):
    compiled = False
  numbers.check_sequence_axis(sequence_axis)
  if not compiled or sequence_axis is not None:
    return _whole_sequence_loss(
        numeric_fn,
        spec,
        stats,
        labels,
        digit_mask,
        digit_token_ids,
        decimal_point_mask,
        sequence_axis=sequence_axis,
        **loss_kwargs,
    )
  return _compiled_number_loss(
      numeric_fn,
      settings,
      spec,
      stats,
      labels,
      digit_mask,
      digit_token_ids,
      decimal_point_mask,
      array_kwargs,
  )


def _is_array(value) -> bool:
  return isinstance(value, (jax.Array, np.ndarray, np.generic))


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def _compiled_number_loss(
    numeric_fn,
    settings,
    spec,
    stats,
    labels,
    digit_mask,
    digit_token_ids,
    decimal_point_mask,
    array_kwargs,
):
  return _whole_sequence_loss(
      numeric_fn,
      spec,
      stats,
      labels,
      digit_mask,
      digit_token_ids,
      decimal_point_mask,
      **dict(settings),
      **array_kwargs,
  )


def _whole_sequence_loss(
    numeric_fn,
    spec,
    stats,
    labels,
    digit_mask,
    digit_token_ids,
    decimal_point_mask=None,
    sequence_axis=None,
    **loss_kwargs,
):
  whole, split = numbers.whole_rows(labels, sequence_axis)
  if spec is not None:  # [..., T, K] -> [..., T, C, 10] before any gather
    stats = stats._replace(
        digit_logits=chunks.token_digit_logits(
            stats.digit_logits, labels, digit_mask, digit_token_ids, spec
        )
    )
  whole_stats = statistics.TokenStatistics(
      *(None if field is None else whole(field) for field in stats)
  )
  labels_, digit_mask, decimal_point_mask = (
      None if x is None else whole(x)
      for x in (labels, digit_mask, decimal_point_mask)
  )
  if spec is not None:  # number tokens of several digits: digit slots
    slots = chunks.digit_slots(
        whole_stats,
        labels_,
        digit_mask,
        digit_token_ids,
        spec,
        decimal_point_mask,
    )
    result = chunks.slot_loss(
        numeric_fn, numbers.layout_of_rows, slots, loss_kwargs
    )
  else:
    layout = numbers.layout_of_rows(
        labels_,
        digit_mask,
        digit_token_ids=digit_token_ids,
        decimal_point_mask=decimal_point_mask,
    )
    result = numeric_fn(whole_stats, layout, **loss_kwargs)
  return jax.tree.map(split, result)


def prepare(
    logits, labels, digit_mask, digit_token_ids, decimal_point_mask=None
):
  """Validates inputs; returns them as arrays, and the digit logits."""
  labels, logits, digit_mask, decimal_point_mask = asarrays_with_labels(
      labels, logits, digit_mask, decimal_point_mask
  )
  labels, digit_mask, decimal_point_mask = numbers.reshard_like(
      logits, labels, digit_mask, decimal_point_mask
  )
  validation.check_inputs(
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
      statistics.digit_logits(logits, digit_token_ids),
  )


def log_norm_in_numbers(logits, labels, digit_mask, digit_token_ids):
  """The log-normalizer of ``logits`` over the whole vocabulary, ``[..., T]``
  float32, at the positions whose label is a digit (or number) token that
  ``digit_mask`` allows; that of zero logits elsewhere, so that NaN or inf
  logits there give no NaN gradient through it."""
  ids = digit_token_ids
  if isinstance(ids, vocab.NumberTokens):  # any number token's position
    ids = ids.ids
  is_digit, _ = numbers.match_digits(labels, ids)
  if digit_mask is not None:
    is_digit = is_digit & digit_mask.astype(bool)
  in_numbers = arrays.where(is_digit[..., None], logits, 0)
  return jax.nn.logsumexp(in_numbers.astype(jnp.float32), -1)


def digit_distance(layout) -> chex.Array:
  """``|k - y|`` for every digit k, ``[..., T, 10]``."""
  target = layout.digit_values.astype(jnp.float32)[..., None]
  return jnp.abs(DIGITS - target)


def masked(values, mask):
  return arrays.where(mask, values, 0.0)


def digits_in_numbers(digit_logits_, layout) -> chex.Array:
  """The ``[..., T, 10]`` digit logits, zero outside numbers.

  Outside numbers the loss is 0 by a ``where``, whose gradient would still be
  NaN there for NaN or inf logits (``0 * nan`` in the softmax's backward);
  this ``where`` on the digit block makes it exactly zero.
  """
  return arrays.where(layout.is_digit[..., None], digit_logits_, 0.0)


def digit_statistics(digit_logits_, log_norm=None):
  """Token statistics for losses that read only the digit logits."""
  return statistics.TokenStatistics(
      log_norm=log_norm, label_logits=None, digit_logits=digit_logits_
  )


def scored(labels, vocab_size, loss_mask):
  """Positions whose label is a real token and that the loss mask keeps."""
  valid = (labels >= 0) & (labels < vocab_size)
  if loss_mask is not None:
    valid = valid & jnp.asarray(loss_mask, bool)
  return valid
