"""Where the numbers are: digit runs, place values and per-number sums.

Everything here works along the last (sequence) axis with the scans of
:mod:`ntil_jax.segments`: running maxima of positions (where each number
starts and ends, its decimal point, the leading digits and the differences
of two numbers are all the *nearest* position of some kind) and segmented
sums over the numbers, a few passes of a dozen ops each, whatever T, with
rows independent (a batch sharded over a mesh needs no communication).
A sequence sharded along T is made whole first (:func:`whole_sequence`).

Vocabulary: a *number* is a maximal run of consecutive positions whose label is
one of the ten digit tokens and whose ``digit_mask`` is true. Any other label
(another token, an ignore id such as -100) ends the run. With a
``decimal_point_mask``, a single point between two digits joins the integer and
fractional digits into one number ("3.14" is one number with places 0, -1, -2);
a run holding two or more such points ("1.2.3") is split at every point.
"""

import functools
from typing import NamedTuple, Optional

import chex
import jax
import jax.numpy as jnp
import numpy as np

from ntil_jax import arrays
from ntil_jax import segments

NUM_DIGITS = 10


class NumberLayout(NamedTuple):
  """Per-position description of the numbers in a label sequence.

  All fields are shaped like the labels, ``[..., T]``.

  Attributes:
    digit_values: the target digit 0..9 at digit positions, 0 elsewhere.
    is_digit: true at the digits of a number (decimal points excluded).
    is_last: true at the last digit of each number.
    starts: true where a segment starts: the first position of a number,
      and every position outside numbers.
    ends: true where a segment ends (mirror image of ``starts``).
    digits_right: how many digits of the same number stand to the right.
    places: the power of ten of the digit's place value (0 for units, -1 for
      tenths, ...).
    first: int32 index of the first position of the number (the segment)
      holding each position; the position's own index outside numbers.
    last: int32 index of its last position.
    point: int32 index of the number's decimal point, ``last + 1`` for a
      number without one: the digit at index ``j`` has the place
      ``point - j - (j < point)`` (:func:`place_of`).
    point_candidates: true at decimal-point labels between two digits;
      those alone in their run of digits and candidates are the numbers'
      points (``point``). ``None`` when no ``decimal_point_mask`` was given.
  """

  digit_values: chex.Array
  is_digit: chex.Array
  is_last: chex.Array
  starts: chex.Array
  ends: chex.Array
  digits_right: chex.Array
  places: chex.Array
  first: chex.Array
  last: chex.Array
  point: chex.Array
  point_candidates: Optional[chex.Array] = None


def sharding_spec(x) -> tuple:
  """The mesh axes each axis of ``x`` is split over (explicit sharding)."""
  spec = tuple(getattr(jax.typeof(x).sharding, "spec", ()))
  return spec + (None,) * (jnp.ndim(x) - len(spec))


def whole_sequence(x, axis: int = -1):
  """``x`` with its sequence ``axis`` whole on every device that holds it.

  Numbers may cross the shards of a sequence split over a mesh axis of type
  ``Explicit``, and the segmented sums here run along the whole axis: the
  per-token arrays they read are gathered along T, other axes stay split.
  A no-op where ``axis`` is not explicitly split (``Auto`` axes, where XLA
  places the collectives itself, or no mesh).
  """
  spec = list(sharding_spec(x))
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
  spec = list(sharding_spec(x))
  split = sharding_spec(like)[axis] if spec else None
  if not spec or spec[axis] == split:
    return x
  spec[axis] = split
  sharding = jax.typeof(x).sharding
  return jax.sharding.reshard(x, sharding.update(spec=jax.P(*spec)))


def gather_sequence(x, sequence_axis, axis: int = -1):
  """``x`` whole along ``axis`` inside ``shard_map``, where the sequence is
  split over the manual mesh axes ``sequence_axis`` (a name or a tuple of
  names, major to minor): each shard's part in order (``all_gather``; its
  gradient sums each shard's cotangents back onto the shard that holds
  the position)."""
  return jax.lax.all_gather(x, sequence_axis, axis=axis, tiled=True)


def shard_of_sequence(x, length: int, sequence_axis, axis: int = -1):
  """This shard's ``length`` positions of ``x`` along ``axis``: undoes
  :func:`gather_sequence` (a slice at the shard's index, no
  communication)."""
  start = jax.lax.axis_index(sequence_axis) * length
  return jax.lax.dynamic_slice_in_dim(x, start, length, axis)


def whole_rows(labels, sequence_axis=None) -> tuple:
  """``(whole, split)`` for the number logic on the rows of ``labels``.

  ``whole(x)`` makes an array ``[..., T, ...]`` aligned with ``labels``
  whole along T (:func:`whole_sequence`, or inside ``shard_map``
  :func:`gather_sequence` over ``sequence_axis``); ``split(y)`` cuts a
  result on the whole rows back to ``labels``'s positions
  (:func:`split_like`, or :func:`shard_of_sequence`).
  """
  axis = labels.ndim - 1
  if sequence_axis is None:
    return (
        functools.partial(whole_sequence, axis=axis),
        lambda x: split_like(x, labels, axis),
    )
  return (
      functools.partial(
          gather_sequence, sequence_axis=sequence_axis, axis=axis
      ),
      functools.partial(
          shard_of_sequence,
          length=labels.shape[-1],
          sequence_axis=sequence_axis,
          axis=axis,
      ),
  )


def axis_names(axes) -> tuple:
  """Mesh axis names as a tuple: ``None`` none, a name one, a tuple as is.

  >>> axis_names(None), axis_names("seq"), axis_names(("data", "seq"))
  ((), ('seq',), ('data', 'seq'))
  """
  if axes is None:
    return ()
  return (axes,) if isinstance(axes, str) else tuple(axes)


def check_sequence_axis(sequence_axis) -> None:
  """Refuses a ``sequence_axis`` that names no manual axis of the mesh.

  Raises:
    ValueError: for a value that is not a name or a tuple of names, and for
      names that are not manual axes here (outside ``shard_map``, where a
      sequence split over a mesh needs no argument).
  """
  if sequence_axis is None:
    return
  names = ()
  if isinstance(sequence_axis, (str, tuple)):
    names = axis_names(sequence_axis)
  if not names or not all(isinstance(n, str) for n in names):
    raise ValueError(
        "sequence_axis must be a mesh axis name or a non-empty tuple of "
        f"names, got {sequence_axis!r}."
    )
  manual = tuple(jax.sharding.get_abstract_mesh().manual_axes)
  unknown = [n for n in names if n not in manual]
  if unknown:
    raise ValueError(
        f"sequence_axis names {unknown}, which are not manual mesh axes "
        f"here (manual axes: {manual}): pass it inside jax.shard_map, "
        "naming the axes T is split over. Under jit, a sequence split "
        "over a mesh needs no argument."
    )


def reshard_like(like, *arrays) -> tuple:
  """Each array split over the mesh as ``like``'s leading axes are.

  On a mesh with ``Explicit`` axes, labels or masks given whole beside
  batch-sharded logits cannot meet them in one ``where``: each ``[..., T]``
  array is resharded to the layout of ``like``'s first axes (the logits'
  ``[..., T]`` or statistics shaped like the labels). ``None`` stays
  ``None``; a no-op where nothing is explicitly sharded.
  """
  out = []
  for x in arrays:
    if x is not None:
      target = sharding_spec(like)[: jnp.ndim(x)]
      if len(target) == jnp.ndim(x) and sharding_spec(x) != target:
        sharding = jax.typeof(like).sharding
        x = jax.sharding.reshard(x, sharding.update(spec=jax.P(*target)))
    out.append(x)
  return tuple(out)


def check_id_range(ids: np.ndarray, vocab_size, name: str) -> None:
  """ValueError naming ``name`` unless ``ids`` are integers in ``[0, V)``
  (``[0, inf)`` without ``vocab_size``)."""
  if not np.issubdtype(ids.dtype, np.integer):
    raise ValueError(
        f"{name} must be integer token ids, got dtype {ids.dtype}."
    )
  if ids.min() < 0 or (vocab_size is not None and ids.max() >= vocab_size):
    limit = "" if vocab_size is None else f" for a vocabulary of V={vocab_size}"
    raise ValueError(f"{name} out of range{limit} (the logits' last axis).")


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
  if hasattr(digit_token_ids, "widths"):  # a vocab.NumberTokens
    raise ValueError(
        "digit_token_ids here must be the 10 ids of the digits 0..9; a "
        "NumberTokens (numbers in tokens of several digits) is taken by the "
        "losses (ntil_jax.chunks), not by this function."
    )
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
  check_id_range(ids, vocab_size, f"digit_token_ids {ids.tolist()}")
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


def label_array(labels) -> chex.Array:
  """``labels`` as an array, integers narrower than 32 bits widened to int32.

  Every comparison of a label with a vocabulary size or a token id then
  happens in at least 32 bits: in a uint8, int8 or int16 array, ``V =
  300``, ``200`` or ``32768`` would wrap (``uint8(300) == 44``) and score
  real tokens as ignored. Concrete 64-bit integers, which JAX narrows to
  int32 unless ``jax_enable_x64`` is set (``2**32 + 3`` would wrap onto
  the digit 3), are clipped to int32's range first, keeping what they mean:
  an id past it is past any vocabulary (refused where scored, 0 elsewhere),
  one below it a negative, ignored id. Other dtypes (non-integers included,
  which the validation refuses) are returned as they are.
  """
  if (
      isinstance(labels, (np.ndarray, np.generic))
      and np.issubdtype(labels.dtype, np.integer)
      and labels.dtype.itemsize > 4
      and not jax.config.jax_enable_x64
  ):
    int32 = np.iinfo(np.int32)
    if np.issubdtype(labels.dtype, np.signedinteger):
      labels = np.maximum(labels, int32.min)
    labels = np.minimum(labels, int32.max).astype(np.int32)
  labels = jnp.asarray(labels)
  if jnp.issubdtype(labels.dtype, jnp.integer) and labels.dtype.itemsize < 4:
    labels = labels.astype(jnp.int32)
  return labels


def match_digits(labels: chex.Array, digit_token_ids=None):
  """Returns ``(is_digit_label, digit_values)`` for integer ``labels``.

  ``digit_token_ids[k]`` is the token id of digit ``k``; ``None`` means ids
  0..9. Labels that are no digit token (including negative ignore ids) give
  ``False`` and value 0. Labels and ids are compared as at least 32-bit
  integers, so a narrow label dtype never wraps onto an id (uint8 label 44 is
  not token 300). Traced ids are not checked: with a repeated id, the label
  matches the first digit that has it.
  """
  labels = label_array(labels)
  if digit_token_ids is None:
    is_digit = (labels >= 0) & (labels < NUM_DIGITS)
    return is_digit, arrays.where(is_digit, labels, 0).astype(jnp.int32)
  wide = jnp.int64 if labels.dtype.itemsize > 4 else jnp.int32
  ids = jnp.asarray(digit_token_ids).astype(wide)
  matches = labels.astype(wide)[..., None] == ids
  return matches.any(-1), jnp.argmax(matches, axis=-1).astype(jnp.int32)


def _runs(in_run):
  """``(starts, ends)`` of the maximal runs where ``in_run`` is true.

  Every position outside a run is a segment of its own.
  """
  starts = ~(in_run & segments.shift_right(in_run, False))
  ends = ~(in_run & segments.shift_left(in_run, False))
  return starts, ends


def _nearest(starts, ends, kind=None, backward=()):
  """Where each run starts and ends, and the nearest ``kind`` on each side.

  One pass of running maxima over ``[..., T]`` bools (:func:`_runs`'
  ``starts`` and ``ends``): returns int32 ``(first, last, before, after)``,
  the index of the first and last position of each position's run, and of
  the nearest position where ``kind`` is true at or before it
  (:data:`segments.NO_MAXIMUM` for none) and at or after it (``2**30``
  for none); ``before`` and ``after`` are ``None`` without ``kind``. With
  ``backward`` integer fields, the same pass also returns their running
  maxima from the right, as a tuple after those four.
  """
  index = _positions(starts)
  none = segments.NO_MAXIMUM
  kinds = () if kind is None else (arrays.where(kind, index, none),)
  negated = () if kind is None else (arrays.where(kind, -index, none),)
  (first, *before), (last, *after) = segments.running_maxes(
      forward=(arrays.where(starts, index, none),) + kinds,
      backward=(arrays.where(ends, -index, none),) + negated + tuple(backward),
  )
  extra = tuple(after[len(negated) :])
  if kind is None:
    return first, -last, None, None, extra
  return first, -last, before[0], -after[0], extra


def split_sharding(x):
  """``x``'s sharding where it is split over a mesh, else None (an output
  sharding to give an op whose operands are split, or JAX's default)."""
  sharding = getattr(jax.typeof(x), "sharding", None)
  spec = getattr(sharding, "spec", None)
  return sharding if spec is not None and any(spec) else None


def _positions(like):
  """int32 ``[..., T]``: each position's index along the last axis.

  Split over a mesh as ``like`` is (on an explicit mesh, a replicated iota
  cannot meet sharded arrays in one ``where``).
  """
  return jax.lax.broadcasted_iota(
      jnp.int32, like.shape, like.ndim - 1, out_sharding=split_sharding(like)
  )


def place_of(index, point):
  """The power of ten of the place of the digit at ``index``.

  ``index`` and ``point`` (:attr:`NumberLayout.point`) are int32 indices
  into the same row, the digit's and its number's point's.
  """
  return point - index - (index < point).astype(jnp.int32)


def number_layout(
    labels,
    digit_mask=None,
    *,
    digit_token_ids=None,
    decimal_point_mask=None,
    sequence_axis=None,
) -> NumberLayout:
  """Finds the numbers in ``labels`` and the place value of every digit.

  The numbers are found along whole rows, as the losses find them: under a
  mesh that splits T (an ``Explicit`` axis) the labels and masks are made
  whole along T and every field comes back split as ``labels`` are; inside
  ``jax.shard_map``, ``sequence_axis`` names the manual axes T is split
  over. Either way ``first``, ``last`` and ``point`` are positions in the
  whole row. Called outside ``jit`` and without a mesh, it runs as one
  compiled program rather than op by op.

  Args:
    labels: integer token ids, ``[..., T]``.
    digit_mask: bool ``[..., T]``; only positions where it is true can be
      digits of a number. ``None`` allows every position.
    digit_token_ids: ``[10]`` token ids of the digits 0..9 (``None``: 0..9).
    decimal_point_mask: optional bool ``[..., T]``, true where the label is a
      decimal point that may join integer and fractional digits.
    sequence_axis: inside ``jax.shard_map``, the manual mesh axis (or tuple
      of axes, major to minor) that T is split over: the labels and masks
      are gathered along T (``all_gather``) and each shard gets its own
      positions' fields. ``None``: each shard holds whole sequences.

  Returns:
    A :class:`NumberLayout`.

  Raises:
    ValueError: for digit ids that :func:`check_digit_token_ids` refuses,
      and for a ``sequence_axis`` that names no manual mesh axis.

  Example:
    "12.5+7" with digits at ids 0..9, '.' at 10 and '+' at 11:

    >>> import jax.numpy as jnp
    >>> labels = jnp.array([1, 2, 10, 5, 11, 7])
    >>> layout = number_layout(labels, decimal_point_mask=labels == 10)
    >>> layout.places.tolist(), layout.digits_right.tolist()
    ([1, 0, 0, -1, 0, 0], [2, 1, 0, 0, 0, 0])
    >>> layout.is_last.tolist()
    [False, False, False, True, False, True]
  """
  if digit_token_ids is not None:
    check_digit_token_ids(digit_token_ids)
  check_sequence_axis(sequence_axis)
  labels = label_array(labels)
  inputs = (labels, digit_mask, digit_token_ids, decimal_point_mask)
  if (
      sequence_axis is None
      and jax.sharding.get_abstract_mesh().empty
      and not any(arrays.staged(x) for x in jax.tree.leaves(inputs))
  ):
    return _compiled_layout(*inputs)
  whole, split = whole_rows(labels, sequence_axis)
  digit_mask, decimal_point_mask = (
      None if x is None else whole(jnp.asarray(x))
      for x in (digit_mask, decimal_point_mask)
  )
  layout = layout_of_rows(
      whole(labels),
      digit_mask,
      digit_token_ids=digit_token_ids,
      decimal_point_mask=decimal_point_mask,
  )
  return jax.tree.map(split, layout)


def layout_of_rows(
    labels, digit_mask=None, *, digit_token_ids=None, decimal_point_mask=None
) -> NumberLayout:
  """:func:`number_layout` of rows whole along T (no sharding handled, no
  checks): what the losses run once they have made their inputs whole."""
  label_is_digit, digit_values = match_digits(labels, digit_token_ids)
  is_digit = label_is_digit
  if digit_mask is not None:
    is_digit = is_digit & jnp.asarray(digit_mask, bool)
  if decimal_point_mask is None:
    candidates = None
  else:
    # Decimal-point labels between two digits; a digit label is never one
    # (refused where concrete; under jit the mark is ignored, as a number
    # token's is in ntil_jax.chunks).
    candidates = (
        jnp.asarray(decimal_point_mask, bool)
        & ~label_is_digit
        & segments.shift_right(is_digit, False)
        & segments.shift_left(is_digit, False)
    )
  layout = NumberLayout(
      digit_values=arrays.where(is_digit, digit_values, 0),
      is_digit=is_digit,
      is_last=None,
      starts=None,
      ends=None,
      digits_right=None,
      places=None,
      first=None,
      last=None,
      point=None,
      point_candidates=candidates,
  )
  return _located(layout)[0]


@jax.jit
def _compiled_layout(labels, digit_mask, digit_token_ids, decimal_point_mask):
  return layout_of_rows(
      labels,
      digit_mask,
      digit_token_ids=digit_token_ids,
      decimal_point_mask=decimal_point_mask,
  )


def _located(layout: NumberLayout, backward=()):
  """``layout`` with the fields one pass of running maxima finds.

  Where each number starts and ends, its point, ``digits_right`` and
  ``places``, from ``is_digit`` and ``point_candidates``; the same pass also
  maximizes the ``backward`` fields from the right. Returns ``(layout,
  their maxima)``.

  With decimal points, the pass runs over the runs of digits and candidate
  points: a candidate alone in its run (no other candidate between the
  run's ends, read from the nearest candidates before and after it) joins
  the run's digits into one number; a run holding two or more is cut at
  each of them (a number then ends before its nearest candidate on each
  side). Whether a position's run holds exactly one is read at its nearest
  candidate (one gather).
  """
  is_digit, candidates = layout.is_digit, layout.point_candidates
  index = _positions(is_digit)
  if candidates is None:
    starts, ends = _runs(is_digit)
    first, last, _, _, extra = _nearest(starts, ends, None, backward)
    point = last + 1
    digits_right = last - index  # also the place: point - index - 1
  else:
    run_first, run_last, before, after, extra = _nearest(
        *_runs(is_digit | candidates), candidates, backward
    )
    # A candidate alone in its run: the one before it (strictly) lies before
    # the run, and the one after it after the run.
    previous = segments.shift_right(before, segments.NO_MAXIMUM)
    following = segments.shift_left(after, -segments.NO_MAXIMUM)
    alone = candidates & (previous < run_first) & (following > run_last)
    has_after, has_before = after <= run_last, before >= run_first
    nearest = arrays.where(
        has_after, after, arrays.where(has_before, before, index)
    )
    some = has_after | has_before
    one = some & (
        segments.read_at(alone[..., None].astype(jnp.int32), nearest)[..., 0]
        > 0
    )
    several = some & ~one
    # A candidate that is not a point stands alone, outside numbers.
    rejected = candidates & ~alone
    first = arrays.where(
        rejected,
        index,
        arrays.where(several & has_before, before + 1, run_first),
    )
    last = arrays.where(
        rejected, index, arrays.where(several & has_after, after - 1, run_last)
    )
    # Computed once: every later pass and sum reads them.
    first, last, point = _materialized(
        (first, last, arrays.where(one, nearest, last + 1))
    )
    starts, ends = first == index, last == index
    point_on_right = (index < point) & (point <= last)
    digits_right = last - index - point_on_right.astype(jnp.int32)
  layout = layout._replace(
      is_last=is_digit & ends,
      starts=starts,
      ends=ends,
      digits_right=arrays.where(is_digit, digits_right, 0),
      places=arrays.where(
          is_digit,
          digits_right if candidates is None else place_of(index, point),
          0,
      ),
      first=first,
      last=last,
      point=point,
  )
  return layout, extra


def _materialized(fields):
  """``fields`` computed once, not again inside each op that reads them.

  XLA fuses cheap elementwise work into every consumer; the number logic's
  outputs feed dozens, and recomputing them in each multiplied the program.
  Fields of one dtype are stacked first, so each dtype is one kernel (an
  optimization barrier on separate arrays makes one kernel per array).
  ``fields``: a tuple or a NamedTuple of arrays of one shape, returned as
  the same type.
  """
  values = [jnp.asarray(f) for f in fields]
  groups = {}
  for i, value in enumerate(values):
    groups.setdefault(value.dtype, []).append(i)
  stacked = jax.lax.optimization_barrier(
      [jnp.stack([values[i] for i in group]) for group in groups.values()]
  )
  for group, array in zip(groups.values(), stacked):
    for k, i in enumerate(group):
      values[i] = array[k]
  return tuple(values) if type(fields) is tuple else type(fields)(*values)


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
  times a correction close to 1), and 0 below float32's range. Elementwise
  (a lookup table would be one gather, but a gather from a replicated table
  by sharded indices has no output sharding JAX can infer on an explicit
  mesh).
  """
  capped = jnp.clip(
      exponent, -2 * MAX_DECIMAL_EXPONENT, MAX_DECIMAL_EXPONENT
  ).astype(jnp.float32)
  return jnp.exp(capped * _LN10_HIGH) * jnp.exp(capped * _LN10_LOW)


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


def compare_numbers(x_digits, layout: NumberLayout):
  """Leading places, sign and exact difference digits of X and the target.

  ``|X - Y|`` of two long numbers is not the float sum of ``(x - y) *
  10**place`` (``1000 - 999`` cancels to rounding noise); written with
  borrows, its digits are integers 0..9 whose float sum has no cancellation.

  Everything is the nearest position of some kind at or after another,
  exact in int32, found by running maxima from the right (of ``-index``
  where the kind is) and read at the number's first position (one gather):
  X's and Y's leading non-zero digits, and their first difference, whose
  direction is the sign (the key ``2 * index + (x < y)`` carries it). Read
  at each position instead, the nearest difference at or after it: the
  place borrows from the next one up when that difference goes the wrong
  way (the larger number's digit is the smaller there). These maxima share
  one pass with the layout's own (where each number starts and ends), which
  is run again here: XLA drops the first one when nothing else reads it.

  Args:
    x_digits: integer digit values of X, shaped like the layout (0 outside
      numbers).
    layout: the :class:`NumberLayout` X is written in; Y is its target.

  Returns:
    ``(layout, comparison)``: the layout (its fields from this pass) and a
    :class:`NumberComparison`.
  """
  none = segments.NO_MAXIMUM
  index = _positions(x_digits)
  y_digits = layout.digit_values
  step = arrays.where(layout.is_digit, x_digits - y_digits, 0)
  keys = (
      arrays.where(layout.is_digit & (x_digits != 0), -index, none),
      arrays.where(layout.is_digit & (y_digits != 0), -index, none),
      arrays.where(step != 0, -2 * index - (step < 0), none),
  )
  layout, nearest = _located(layout, keys)
  at_first = segments.read_at(jnp.stack(nearest, -1), layout.first)
  x_lead, y_lead, first_difference = (-at_first[..., f] for f in range(3))

  def leading_place(lead):
    if layout.point_candidates is None:  # no fractional digits
      place = layout.last - lead
    else:
      place = jnp.maximum(place_of(lead, layout.point), 0)
    return arrays.where(lead <= layout.last, place, 0)

  def direction(key):
    """-1 or 1 for a difference key in the number, 0 for none."""
    return arrays.where(
        key >> 1 <= layout.last, arrays.where(key & 1 == 1, -1, 1), 0
    )

  sign = direction(first_difference)
  borrow_out = ((sign != 0) & (direction(-nearest[2]) == -sign)).astype(
      jnp.int32
  )
  borrow_in = arrays.where(layout.ends, 0, segments.shift_left(borrow_out, 0))
  return layout, _materialized(
      NumberComparison(
          x_place=leading_place(x_lead),
          y_place=leading_place(y_lead),
          sign=sign,
          correction=arrays.where(
              layout.is_digit, 10 * borrow_out - borrow_in, 0
          ),
      )
  )
