"""Where the numbers are: digit runs, place values and per-number sums.

Everything here works along the last (sequence) axis with segmented scans, so
the cost is O(T log T) elementwise work per row, there is no O(T^2) tensor, and
rows are independent (a batch sharded over a mesh needs no communication).

Vocabulary: a *number* is a maximal run of consecutive positions whose label is
one of the ten digit tokens and whose ``digit_mask`` is true. Any other label
(another token, an ignore id such as -100) ends the run. With a
``decimal_point_mask``, a single point between two digits joins the integer and
fractional digits into one number ("3.14" is one number with places 0, -1, -2);
a run holding two or more such points ("1.2.3") is split at every point.
"""

from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np

NUM_DIGITS = 10


class NumberLayout(NamedTuple):
  """Per-position description of the numbers in a label sequence.

  All fields are shaped like the labels, ``[..., T]``.

  Attributes:
    digit_values: the target digit 0..9 at digit positions, 0 elsewhere.
    is_digit: true at the digits of a number (decimal points excluded).
    is_last: true at the last digit of each number.
    starts: true where a scan segment starts: the first position of a number,
      and every position outside numbers.
    ends: true where a scan segment ends (mirror image of ``starts``).
    digits_right: how many digits of the same number stand to the right.
    places: the power of ten of the digit's place value (0 for units, -1 for
      tenths, ...).
  """

  digit_values: chex.Array
  is_digit: chex.Array
  is_last: chex.Array
  starts: chex.Array
  ends: chex.Array
  digits_right: chex.Array
  places: chex.Array


def match_digits(labels: chex.Array, digit_token_ids=None):
  """Returns ``(is_digit_label, digit_values)`` for integer ``labels``.

  ``digit_token_ids[k]`` is the token id of digit ``k``; ``None`` means ids
  0..9. Labels that are no digit token (including negative ignore ids) give
  ``False`` and value 0.
  """
  labels = jnp.asarray(labels)
  if digit_token_ids is None:
    is_digit = (labels >= 0) & (labels < NUM_DIGITS)
    return is_digit, jnp.where(is_digit, labels, 0).astype(jnp.int32)
  ids = jnp.asarray(digit_token_ids, dtype=labels.dtype)
  matches = labels[..., None] == ids
  return matches.any(-1), jnp.argmax(matches, axis=-1).astype(jnp.int32)


def _shift_right(x: chex.Array, fill) -> chex.Array:
  """x[..., t-1] at position t; ``fill`` at t = 0."""
  widths = [(0, 0)] * (x.ndim - 1) + [(1, 0)]
  return jnp.pad(x[..., :-1], widths, constant_values=fill)


def _shift_left(x: chex.Array, fill) -> chex.Array:
  """x[..., t+1] at position t; ``fill`` at the last position."""
  widths = [(0, 0)] * (x.ndim - 1) + [(0, 1)]
  return jnp.pad(x[..., 1:], widths, constant_values=fill)


def segmented_scan(op, values: chex.Array, starts: chex.Array) -> chex.Array:
  """Inclusive scan of ``op`` along the last axis, restarting where ``starts``.

  ``op`` must be associative (``jnp.add``, ``jnp.maximum``, ...).
  """

  def combine(left, right):
    left_value, left_start = left
    right_value, right_start = right
    value = jnp.where(right_start, right_value, op(left_value, right_value))
    return value, left_start | right_start

  scanned, _ = jax.lax.associative_scan(combine, (values, starts), axis=-1)
  return scanned


def reverse_segmented_scan(op, values, ends):
  """Like :func:`segmented_scan` but from the right; restarts where ``ends``."""
  flip = lambda x: jnp.flip(x, axis=-1)
  return flip(segmented_scan(op, flip(values), flip(ends)))


def segment_broadcast_max(values, starts, ends):
  """The maximum of ``values`` over each segment, at every position in it."""
  from_left = segmented_scan(jnp.maximum, values, starts)
  from_right = reverse_segmented_scan(jnp.maximum, values, ends)
  return jnp.maximum(from_left, from_right)


def _decimal_points(is_digit, decimal_point_mask):
  """Points that join two digits, in runs that hold exactly one of them."""
  between_digits = (decimal_point_mask & _shift_right(is_digit, False)
                    & _shift_left(is_digit, False))
  in_run = is_digit | between_digits
  starts = ~(in_run & _shift_right(in_run, False))
  ends = ~(in_run & _shift_left(in_run, False))
  count = between_digits.astype(jnp.int32)
  before = segmented_scan(jnp.add, count, starts)
  after = reverse_segmented_scan(jnp.add, count, ends)
  return between_digits & (before == 1) & (after == 1)


def number_layout(labels, digit_mask=None, *, digit_token_ids=None,
                  decimal_point_mask=None) -> NumberLayout:
  """Finds the numbers in ``labels`` and the place value of every digit.

  Args:
    labels: integer token ids, ``[..., T]``.
    digit_mask: bool ``[..., T]``; only positions where it is true can be
      digits of a number. ``None`` allows every position.
    digit_token_ids: ``[10]`` token ids of the digits 0..9 (``None``: 0..9).
    decimal_point_mask: optional bool ``[..., T]``, true where the label is a
      decimal point that may join integer and fractional digits.

  Returns:
    A :class:`NumberLayout`.
  """
  label_is_digit, digit_values = match_digits(labels, digit_token_ids)
  is_digit = label_is_digit
  if digit_mask is not None:
    is_digit = is_digit & jnp.asarray(digit_mask, bool)
  if decimal_point_mask is None:
    points = jnp.zeros_like(is_digit)
  else:
    points = _decimal_points(is_digit, jnp.asarray(decimal_point_mask, bool))
  in_run = is_digit | points
  starts = ~(in_run & _shift_right(in_run, False))
  ends = ~(in_run & _shift_left(in_run, False))

  digit_count = is_digit.astype(jnp.int32)
  digits_right = reverse_segmented_scan(jnp.add, digit_count, ends) - digit_count
  point_on_left = segmented_scan(jnp.logical_or, points, starts) & ~points
  fractional = is_digit & point_on_left
  frac_count = fractional.astype(jnp.int32)
  places = jnp.where(
      fractional,
      -segmented_scan(jnp.add, frac_count, starts),
      digits_right - reverse_segmented_scan(jnp.add, frac_count, ends))
  zero = jnp.zeros_like(digits_right)
  return NumberLayout(
      digit_values=jnp.where(is_digit, digit_values, 0),
      is_digit=is_digit,
      is_last=is_digit & ~_shift_left(in_run, False),
      starts=starts,
      ends=ends,
      digits_right=jnp.where(is_digit, digits_right, zero),
      places=jnp.where(is_digit, places, zero),
  )


# Exponents of ten kept within float32 range; 1e30 leaves headroom for sums.
MAX_DECIMAL_EXPONENT = 30
_LN10 = float(np.log(10.0))


def pow10(exponent):
  """10 ** exponent for integer exponents, capped at 1e30."""
  capped = jnp.minimum(exponent, MAX_DECIMAL_EXPONENT).astype(jnp.float32)
  return jnp.exp(capped * _LN10)


def leading_place(digit_values, layout: NumberLayout):
  """Place of each number's leading non-zero digit, clamped at >= 0.

  ``digit_values`` is any integer-valued array shaped like the layout (it may
  be a prediction); the result is constant over each number.
  """
  nonzero_place = jnp.where(
      layout.is_digit & (digit_values != 0), layout.places,
      jnp.iinfo(jnp.int32).min)
  top = segment_broadcast_max(nonzero_place, layout.starts, layout.ends)
  return jnp.maximum(top, 0)


def scaled_number_sum(digit_terms, scale_place, layout: NumberLayout):
  """Sum of ``digit_terms * 10**(place - scale_place)`` over each number.

  The result is valid at each number's last digit (``layout.is_last``).
  """
  factors = pow10(layout.places - scale_place)
  terms = jnp.where(layout.is_digit, digit_terms * factors, 0.0)
  return segmented_scan(jnp.add, terms, layout.starts)


def log1p_number(digit_terms, digit_values, layout: NumberLayout):
  """``log(Z + 1)`` of each number Z, exact in float32 for any length.

  ``digit_terms`` carries the gradient; ``digit_values`` (same values, no
  gradient needed) selects the leading place used to normalize. Valid at each
  number's last digit.

  Returns:
    ``(log1p_value, scaled_value, scale_place)`` where
    ``Z = scaled_value * 10**scale_place``.
  """
  scale_place = leading_place(digit_values, layout)
  scaled = scaled_number_sum(digit_terms, scale_place, layout)
  offset = pow10(-scale_place)
  return scale_place * _LN10 + jnp.log(scaled + offset), scaled, scale_place
