"""Where the numbers are: digit runs, place values and per-number sums.

Everything here works along the last (sequence) axis with segmented scans, so
the cost is O(T log T) elementwise work per row, there is no O(T^2) tensor, and
rows are independent (a batch sharded over a mesh needs no communication).
A sequence sharded along T is made whole first (:func:`whole_sequence`).

Vocabulary: a *number* is a maximal run of consecutive positions whose label is
one of the ten digit tokens and whose ``digit_mask`` is true. Any other label
(another token, an ignore id such as -100) ends the run. With a
``decimal_point_mask``, a single point between two digits joins the integer and
fractional digits into one number ("3.14" is one number with places 0, -1, -2);
a run holding two or more such points ("1.2.3") is split at every point.
"""

import functools
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


def _spec(x) -> tuple:
  """The mesh axes each axis of ``x`` is split over (explicit sharding)."""
  spec = tuple(getattr(jax.typeof(x).sharding, "spec", ()))
  return spec + (None,) * (jnp.ndim(x) - len(spec))


def whole_sequence(x, axis: int = -1):
  """``x`` with its sequence ``axis`` whole on every device that holds it.

  Numbers may cross the shards of a sequence split over a mesh axis of type
  ``Explicit``, and the segmented scans here run along the whole axis: the
  per-token arrays they read are gathered along T, other axes stay split.
  A no-op where ``axis`` is not explicitly split (``Auto`` axes, where XLA
  places the collectives itself, or no mesh).
  """
  spec = list(_spec(x))
  if not spec or spec[axis] is None:
    return x
  spec[axis] = None
  sharding = jax.typeof(x).sharding
  return jax.sharding.reshard(x, sharding.update(spec=jax.P(*spec)))


def split_like(x, like, axis: int = -1):
  """``x`` with its ``axis`` split over the mesh as ``like``'s is.

  Undoes :func:`whole_sequence` (each device keeps its part, no
  communication); the other axes are left as they are.
  """
  spec = list(_spec(x))
  split = _spec(like)[axis] if spec else None
  if not spec or spec[axis] == split:
    return x
  spec[axis] = split
  sharding = jax.typeof(x).sharding
  return jax.sharding.reshard(x, sharding.update(spec=jax.P(*spec)))


def check_digit_token_ids(digit_token_ids, vocab_size=None):
  """Validates digit token ids; returns them as a NumPy array, None if traced.

  Args:
    digit_token_ids: ``[10]`` integer ids of the digits 0..9.
    vocab_size: if given, every id must be below it.

  Returns:
    The ids as a NumPy array, or ``None`` when they are traced (inside
    ``jit``) and cannot be checked before run time; see :func:`match_digits`
    and :func:`ntil_jax.digit_logits` for what invalid traced ids do.

  Raises:
    ValueError: for a shape other than ``[10]``, non-integer ids, negative or
      (with ``vocab_size``) too large ids, or an id given to two digits.
  """
  if tuple(np.shape(digit_token_ids)) != (NUM_DIGITS,):
    raise ValueError(
        "digit_token_ids must hold the 10 ids of the digits 0..9, "
        f"got shape {np.shape(digit_token_ids)}."
    )
  try:
    ids = np.asarray(digit_token_ids)
  except (jax.errors.TracerArrayConversionError, TypeError):
    return None
  if not np.issubdtype(ids.dtype, np.integer):
    raise ValueError(
        f"digit_token_ids must be integer token ids, got dtype {ids.dtype}."
    )
  if ids.min() < 0 or (vocab_size is not None and ids.max() >= vocab_size):
    limit = "" if vocab_size is None else f" for a vocabulary of V={vocab_size}"
    raise ValueError(
        f"digit_token_ids {ids.tolist()} out of range{limit} "
        "(the logits' last axis)."
    )
  values, counts = np.unique(ids, return_counts=True)
  if (counts > 1).any():
    shared = "; ".join(
        f"token {v} for digits {np.flatnonzero(ids == v).tolist()}"
        for v in values[counts > 1]
    )
    raise ValueError(
        f"digit_token_ids {ids.tolist()} hold duplicates "
        f"({shared}); each digit needs its own token id."
    )
  return ids


def match_digits(labels: chex.Array, digit_token_ids=None):
  """Returns ``(is_digit_label, digit_values)`` for integer ``labels``.

  ``digit_token_ids[k]`` is the token id of digit ``k``; ``None`` means ids
  0..9. Labels that are no digit token (including negative ignore ids) give
  ``False`` and value 0. Labels and ids are compared as at least 32-bit
  integers, so a narrow label dtype never wraps onto an id (uint8 label 44 is
  not token 300). Traced ids are not checked: with a repeated id, the label
  matches the first digit that has it.
  """
  labels = jnp.asarray(labels)
  if digit_token_ids is None:
    is_digit = (labels >= 0) & (labels < NUM_DIGITS)
    return is_digit, jnp.where(is_digit, labels, 0).astype(jnp.int32)
  wide = jnp.int64 if labels.dtype.itemsize > 4 else jnp.int32
  ids = jnp.asarray(digit_token_ids).astype(wide)
  matches = labels.astype(wide)[..., None] == ids
  return matches.any(-1), jnp.argmax(matches, axis=-1).astype(jnp.int32)


def _shift_right(x: chex.Array, fill, distance: int = 1) -> chex.Array:
  """x[..., t - distance] at position t; ``fill`` where t < distance."""
  # A slice of x padded by its own length: every distance slices the same
  # pad, which XLA then computes once and fuses each slice into its user.
  length = x.shape[-1]
  widths = [(0, 0)] * (x.ndim - 1) + [(length, 0)]
  padded = jnp.pad(x, widths, constant_values=fill)
  return padded[..., length - distance : 2 * length - distance]


def _shift_left(x: chex.Array, fill, distance: int = 1) -> chex.Array:
  """x[..., t + distance] at position t; ``fill`` in the last ``distance``."""
  length = x.shape[-1]
  widths = [(0, 0)] * (x.ndim - 1) + [(0, length)]
  padded = jnp.pad(x, widths, constant_values=fill)
  return padded[..., distance : length + distance]


def segmented_scans(scans, starts: chex.Array) -> tuple:
  """Several inclusive segmented scans along the last axis, in one pass.

  Args:
    scans: ``(op, values)`` pairs; each ``op`` must be associative
      (``jnp.add``, ``jnp.maximum``, ...) and each ``values`` shaped like
      ``starts``.
    starts: bool, where every scan restarts.

  Returns:
    A tuple with the scan of each pair.
  """
  return _segmented_scans(scans, starts, reverse=False)


def reverse_segmented_scans(scans, ends: chex.Array) -> tuple:
  """Like :func:`segmented_scans` but from the right; restarts at ``ends``."""
  return _segmented_scans(scans, ends, reverse=True)


# Positions combined per step of a scan: ceil(log_8(T)) steps.
SCAN_RADIX = 8


def _scan_steps(length):
  """``(distance, [j for the j * distance < length])`` of every step."""
  distance = 1
  while distance < length:
    yield distance, [j for j in range(1, SCAN_RADIX) if j * distance < length]
    distance *= SCAN_RADIX


def _segment_offsets(boundaries, reverse):
  """How far each position is from its segment's first one (scan order)."""
  length = boundaries.shape[-1]
  shift = _shift_left if reverse else _shift_right
  # Positions counted from the edge the scan starts at, which starts a
  # segment; a running maximum of the starts' positions finds the first.
  order = jnp.arange(length)
  if reverse:
    order = length - 1 - order
  order = jnp.broadcast_to(order, boundaries.shape)
  first = jnp.where(boundaries, order, 0)
  for distance, blocks in _scan_steps(length):
    first = functools.reduce(
        jnp.maximum, [first] + [shift(first, 0, j * distance) for j in blocks]
    )
  return order - first


def _segmented_scans(scans, boundaries, reverse) -> tuple:
  """The scans, in the form that suits the default backend.

  A CPU runs ``lax.associative_scan``'s many small ops at little cost each
  and its O(T) work is the least; on a GPU or TPU every op is a kernel
  launch of microseconds however small its ``[..., T]`` operands, so
  :func:`_radix_scans` does the same in a few wide ops.
  """
  if jax.default_backend() == "cpu":
    return _associative_scans(scans, boundaries, reverse)
  return _radix_scans(scans, boundaries, reverse)


def _associative_scans(scans, boundaries, reverse) -> tuple:
  """Segmented scans by ``lax.associative_scan`` (O(T) work)."""
  ops = tuple(op for op, _ in scans)

  def combine(left, right):
    left_values, left_start = left
    right_values, right_start = right
    values = tuple(
        jnp.where(right_start, r, op(l, r))
        for op, l, r in zip(ops, left_values, right_values)
    )
    return values, left_start | right_start

  flip = (lambda x: jnp.flip(x, axis=-1)) if reverse else (lambda x: x)
  values = tuple(flip(jnp.asarray(v)) for _, v in scans)
  scanned, _ = jax.lax.associative_scan(
      combine, (values, flip(boundaries)), axis=-1
  )
  return tuple(flip(x) for x in scanned)


def _radix_scans(scans, boundaries, reverse) -> tuple:
  """Segmented scans in ``ceil(log_8(T))`` elementwise steps.

  At step ``k`` every position combines its value with those ``d``, ``2d``,
  ... ``7d`` before it (``d = 8**k``, in scan order) that lie in its
  segment, so after the step it holds its segment's scan over the last
  ``8d`` positions (Hillis and Steele's scan, radix 8); whether they lie in
  it is one comparison with the position's offset in its segment. A scan
  is then one elementwise op per step (3 at T = 512) where
  ``lax.associative_scan`` emits dozens of small ones. O(T log T) work, on
  ``[..., T]`` arrays only.
  """
  values = tuple(jnp.asarray(v) for _, v in scans)
  length = boundaries.shape[-1]
  if length == 0:
    return values
  shift = _shift_left if reverse else _shift_right
  offsets = _segment_offsets(boundaries, reverse)
  for distance, blocks in _scan_steps(length):
    new_values = []
    for (op, _), value in zip(scans, values):
      total = value
      for j in blocks:
        earlier = shift(value, 0, j * distance)
        total = jnp.where(offsets >= j * distance, op(earlier, total), total)
      new_values.append(total)
    values = tuple(new_values)
  return values


def segmented_scan(op, values: chex.Array, starts: chex.Array) -> chex.Array:
  """Inclusive scan of ``op`` along the last axis, restarting where ``starts``.

  ``op`` must be associative (``jnp.add``, ``jnp.maximum``, ...).
  """
  return segmented_scans(((op, values),), starts)[0]


def reverse_segmented_scan(op, values, ends):
  """Like :func:`segmented_scan` but from the right; restarts where ``ends``."""
  return reverse_segmented_scans(((op, values),), ends)[0]


def segment_broadcast_max(values, starts, ends):
  """The maximum of ``values`` over each segment, at every position in it."""
  from_left = segmented_scan(jnp.maximum, values, starts)
  from_right = reverse_segmented_scan(jnp.maximum, values, ends)
  return jnp.maximum(from_left, from_right)


def _decimal_points(is_digit, decimal_point_mask):
  """Points that join two digits, in runs that hold exactly one of them."""
  between_digits = (
      decimal_point_mask
      & _shift_right(is_digit, False)
      & _shift_left(is_digit, False)
  )
  in_run = is_digit | between_digits
  starts = ~(in_run & _shift_right(in_run, False))
  ends = ~(in_run & _shift_left(in_run, False))
  count = between_digits.astype(jnp.int32)
  before = segmented_scan(jnp.add, count, starts)
  after = reverse_segmented_scan(jnp.add, count, ends)
  return between_digits & (before == 1) & (after == 1)


def number_layout(
    labels, digit_mask=None, *, digit_token_ids=None, decimal_point_mask=None
) -> NumberLayout:
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

  Raises:
    ValueError: for digit ids that :func:`check_digit_token_ids` refuses.
  """
  if digit_token_ids is not None:
    check_digit_token_ids(digit_token_ids)
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
  digits_right = (
      reverse_segmented_scan(jnp.add, digit_count, ends) - digit_count
  )
  if decimal_point_mask is None:
    # No fractional digits: the three scans below would give digits_right,
    # and XLA does not fold them away.
    places = digits_right
  else:
    point_on_left = segmented_scan(jnp.logical_or, points, starts) & ~points
    fractional = is_digit & point_on_left
    frac_count = fractional.astype(jnp.int32)
    places = jnp.where(
        fractional,
        -segmented_scan(jnp.add, frac_count, starts),
        digits_right - reverse_segmented_scan(jnp.add, frac_count, ends),
    )
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
# ln 10 split so that exponent * _LN10_HIGH is exact in float32 for
# |exponent| < 2**11 (a 13-bit mantissa), and the rest is small.
_LN10_HIGH = 4716.0 / 2048.0
_LN10_LOW = _LN10 - _LN10_HIGH


def pow10(exponent):
  """10 ** exponent for integer exponents, capped at 1e30.

  Accurate to a few float32 ulps (``exp`` of an exactly rounded argument
  times a correction close to 1), and 0 below float32's range.
  """
  capped = jnp.clip(
      exponent, -2 * MAX_DECIMAL_EXPONENT, MAX_DECIMAL_EXPONENT
  ).astype(jnp.float32)
  return jnp.exp(capped * _LN10_HIGH) * jnp.exp(capped * _LN10_LOW)


def leading_place(digit_values, layout: NumberLayout):
  """Place of each number's leading non-zero digit, clamped at >= 0.

  ``digit_values`` is any integer-valued array shaped like the layout (it may
  be a prediction); the result is constant over each number.
  """
  nonzero_place = jnp.where(
      layout.is_digit & (digit_values != 0),
      layout.places,
      jnp.iinfo(jnp.int32).min,
  )
  top = segment_broadcast_max(nonzero_place, layout.starts, layout.ends)
  return jnp.maximum(top, 0)


def scaled_number_sum(digit_terms, scale_place, layout: NumberLayout):
  """Sum of ``digit_terms * 10**(place - scale_place)`` over each number.

  The result is valid at each number's last digit (``layout.is_last``).
  """
  return scaled_number_sums(((digit_terms, scale_place),), layout)[0]


def scaled_number_sums(terms_and_places, layout: NumberLayout) -> tuple:
  """:func:`scaled_number_sum` of several ``(digit_terms, scale_place)``.

  One segmented scan computes them all.
  """
  terms = []
  for digit_terms, scale_place in terms_and_places:
    factors = pow10(layout.places - scale_place)
    terms.append(jnp.where(layout.is_digit, digit_terms * factors, 0.0))
  return segmented_sums(tuple(terms), layout.starts, layout.ends)


@jax.custom_vjp
def segmented_sums(values: tuple, starts: chex.Array, ends: chex.Array):
  """Segmented sums along the last axis (:func:`segmented_scans` of add).

  ``ends`` must mark the last position of every segment (where the next
  one starts, and the last position). Differentiable in ``values``: the
  gradient is the same sum from the right, restarting at ``ends``, where
  autodiff would transpose every step of the scan on its own.
  """
  return segmented_scans(tuple((jnp.add, v) for v in values), starts)


def _segmented_sums_fwd(values, starts, ends):
  return segmented_sums(values, starts, ends), ends


def _segmented_sums_bwd(ends, cotangents):
  grads = reverse_segmented_scans(tuple((jnp.add, c) for c in cotangents), ends)
  return grads, None, None


segmented_sums.defvjp(_segmented_sums_fwd, _segmented_sums_bwd)


def _first_nonzero(left, right):
  return jnp.where(left != 0, left, right)


def _last_nonzero(left, right):
  return jnp.where(right != 0, right, left)


class NumberComparison(NamedTuple):
  """Two numbers X, Y per layout number, compared digit by digit.

  All fields are int32 shaped like the layout and constant over each number
  except ``correction``.

  Attributes:
    x_place: place of X's leading non-zero digit, clamped at >= 0.
    y_place: the same for Y.
    sign: the sign of ``X - Y``, -1, 0 or 1.
    correction: the borrows of ``|X - Y|``: ``sign * (x - y) + correction``
      is the digit 0..9 of ``|X - Y|`` in each place (0 outside numbers).
  """

  x_place: chex.Array
  y_place: chex.Array
  sign: chex.Array
  correction: chex.Array


def compare_numbers(x_digits, y_digits, layout: NumberLayout):
  """Leading places, sign and exact difference digits of two numbers.

  ``|X - Y|`` of two long numbers is not the float sum of ``(x - y) *
  10**place`` (``1000 - 999`` cancels to rounding noise); written with
  borrows, its digits are integers 0..9 whose float sum has no cancellation.
  Two segmented scans (one each way) find everything.

  Args:
    x_digits: integer digit values of X, shaped like the layout.
    y_digits: integer digit values of Y (X's and Y's are 0 outside numbers).
    layout: the :class:`NumberLayout` both are written in.

  Returns:
    A :class:`NumberComparison`.
  """
  int_min = jnp.iinfo(jnp.int32).min
  x_nonzero = jnp.where(
      layout.is_digit & (x_digits != 0), layout.places, int_min
  )
  y_nonzero = jnp.where(
      layout.is_digit & (y_digits != 0), layout.places, int_min
  )
  step = jnp.where(layout.is_digit, jnp.sign(x_digits - y_digits), 0).astype(
      jnp.int32
  )
  # Forward: leading places so far and the most significant difference at or
  # left of each position; backward: the same from the right, where the
  # nearest difference at or right of a position is the nearest less
  # significant one.
  x_left, y_left, from_left = segmented_scans(
      (
          (jnp.maximum, x_nonzero),
          (jnp.maximum, y_nonzero),
          (_first_nonzero, step),
      ),
      layout.starts,
  )
  x_right, y_right, from_right = reverse_segmented_scans(
      (
          (jnp.maximum, x_nonzero),
          (jnp.maximum, y_nonzero),
          (_last_nonzero, step),
      ),
      layout.ends,
  )
  sign = jnp.where(from_left != 0, from_left, from_right)
  strictly_right = jnp.where(layout.ends, 0, _shift_left(from_right, 0))
  # A place borrows from the next one when the nearest difference at or below
  # it goes the wrong way (the larger number's digit is the smaller there).
  borrow_out = (sign * from_right < 0).astype(jnp.int32)
  borrow_in = (sign * strictly_right < 0).astype(jnp.int32)
  return NumberComparison(
      x_place=jnp.maximum(jnp.maximum(x_left, x_right), 0),
      y_place=jnp.maximum(jnp.maximum(y_left, y_right), 0),
      sign=sign,
      correction=jnp.where(layout.is_digit, 10 * borrow_out - borrow_in, 0),
  )
