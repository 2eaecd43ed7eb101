r"""Segmented sums along the last axis, as a few matmuls.

A row of ``T`` positions is cut into segments (each number of
:mod:`ntil_jax.numbers` is one) by a boolean ``starts``, true at the first
position of every segment. The inclusive segmented sum of ``v`` is

.. math::

  s_t = \sum_{j \le t,\ \mathrm{seg}(j) = \mathrm{seg}(t)} v_j ,

and the reverse one sums over :math:`j \ge t` instead, with segments cut
where ``ends`` is true. Everything :mod:`ntil_jax.numbers` computes is such
a sum (each digit's place, the scaled sums) or the same scan with the
maximum in place of the sum (leading digits, the sign, borrows:
:func:`segmented_maxes`).

The row is cut into blocks of ``b`` positions (about ``sqrt(T)``, at most
:data:`BLOCK`; :func:`block_size`). Within a block, a ``[b, b]`` mask (same
segment, earlier or same position) times the block's values is one batched
matmul; across blocks, a ``[T/b, T/b]`` mask carries each segment's sum over
the blocks it crossed, one more matmul. The segment of a position is the
count of starts up to it, itself a matmul with a triangular matrix. So a
sum is the same dozen ops whatever ``T`` (``lax.associative_scan`` unrolls
``log2 T`` levels of slices, pads and concatenates per field), on tensor
cores or an MXU, with O(T b) work and memory per row (at most 512 bytes a
position), and rows independent. The masks of a segmentation are built once
and shared by every sum over it (XLA merges the identical computations).

A segmented maximum takes the same masks: a masked maximum within each
block and one across blocks, reductions where the sum has matmuls, in int32.

Matmuls run at ``Precision.HIGHEST``: integer sums (counts, places) are
exact below ``2**24``, and float sums are float32 sums of the same segment's
terms only (no cancellation against other numbers). The gradient of a sum
is autodiff's: the transposed masks, a sum from the other side.
"""

import math
from typing import NamedTuple, Sequence

import chex
import jax
import jax.numpy as jnp
import numpy as np

# Positions per block: the side of each block's [b, b] mask.
BLOCK = 128
_HIGHEST = jax.lax.Precision.HIGHEST


def shift_right(x: chex.Array, fill, distance: int = 1) -> chex.Array:
  """x[..., t - distance] at position t; ``fill`` where t < distance."""
  widths = [(0, 0)] * (x.ndim - 1) + [(distance, 0)]
  return jnp.pad(x, widths, constant_values=fill)[..., : x.shape[-1]]


def shift_left(x: chex.Array, fill, distance: int = 1) -> chex.Array:
  """x[..., t + distance] at position t; ``fill`` in the last ``distance``."""
  widths = [(0, 0)] * (x.ndim - 1) + [(0, distance)]
  return jnp.pad(x, widths, constant_values=fill)[..., distance:]


def block_size(length: int) -> int:
  """Positions per block for rows of ``length``: about ``sqrt(length)``.

  A power of two from ``sqrt(length)`` up to :data:`BLOCK`, so the ``[b, b]``
  masks within blocks (``T b`` a row) and the ``[T/b, T/b]`` one across them
  stay small together; never more than ``length``.
  """
  side = 1 << max(0, math.ceil(math.log2(max(1, length)) / 2))
  return max(1, min(BLOCK, side, length))


class _Blocks(NamedTuple):
  """How a row's segments lie in its blocks, for sums in one direction.

  Attributes:
    same: ``[..., nb, b, b]`` float32, 1 where column j is in row i's
      segment and at or before it in the scan's order.
    carried: ``[..., nb, nb]`` float32, 1 where the segment that block k
      opens with holds block j's last segment (j before k).
    open: ``[..., nb, b]`` bool, the positions of the segment a block opens
      with (the one that came in from the blocks before).
    reverse: whether the scan runs from the right.
  """

  same: chex.Array
  carried: chex.Array
  open: chex.Array
  reverse: bool


def _triangle(size: int, reverse: bool) -> np.ndarray:
  """``[size, size]``: 1 where column j is at or before row i in scan order."""
  ones = np.ones((size, size), np.float32)
  return np.triu(ones) if reverse else np.tril(ones)


def _blocks(bounds: chex.Array, reverse: bool) -> _Blocks:
  """The :class:`_Blocks` of the segments that ``bounds [..., T]`` cut."""
  length = bounds.shape[-1]
  block = block_size(length)
  num_blocks = -(-length // block)
  pad = num_blocks * block - length
  batch = bounds.shape[:-1]
  # Padding is a segment a position; a reverse scan's last real position
  # then still ends its segment where the caller said.
  bounds = jnp.pad(
      bounds, [(0, 0)] * len(batch) + [(0, pad)], constant_values=True
  )
  bounds = bounds.reshape(batch + (num_blocks, block)).astype(jnp.float32)
  within = _triangle(block, reverse)
  # Segment of each position within its block: the bounds up to it in scan
  # order (0: the segment that came in from the blocks before).
  local = jnp.einsum("...j,ij->...i", bounds, within, precision=_HIGHEST)
  same = (local[..., :, None] == local[..., None, :]) & (within > 0)
  # Bounds in blocks up to k, and up to the block before k (-1 for none).
  across = _triangle(num_blocks, reverse)
  count = local[..., 0] if reverse else local[..., -1]
  seen = jnp.einsum("...j,kj->...k", count, across, precision=_HIGHEST)
  shift = shift_left if reverse else shift_right
  before = shift(seen, -1.0)
  # Block k's open segment holds block j's last one if no bound lies in
  # between: j before k, and as many bounds up to j as up to k's neighbour.
  strictly = across - np.eye(num_blocks, dtype=np.float32) > 0
  carried = (before[..., :, None] == seen[..., None, :]) & strictly
  return _Blocks(
      same=same.astype(jnp.float32),
      carried=carried.astype(jnp.float32),
      open=local == 0,
      reverse=reverse,
  )


def _blocked(values: chex.Array, blocks: _Blocks, fill) -> chex.Array:
  """``values [..., T, F]`` padded with ``fill``, as ``[..., nb, b, F]``.

  Padding ends the last real segment of a reverse scan only where the
  caller's bounds say so, so its values must add nothing: ``fill``.
  """
  num_blocks, block = blocks.open.shape[-2:]
  batch = values.shape[:-2]
  pad = num_blocks * block - values.shape[-2]
  values = jnp.pad(
      values,
      [(0, 0)] * len(batch) + [(0, pad), (0, 0)],
      constant_values=fill,
  )
  return values.reshape(batch + (num_blocks, block, values.shape[-1]))


def _unblocked(blocked: chex.Array, length: int) -> chex.Array:
  """The inverse of :func:`_blocked`: ``[..., T, F]``."""
  num_blocks, block, fields = blocked.shape[-3:]
  shape = blocked.shape[:-3] + (num_blocks * block, fields)
  return blocked.reshape(shape)[..., :length, :]


def _sums(blocks: _Blocks, values: chex.Array) -> chex.Array:
  """Inclusive segmented sums of ``values [..., T, F]`` (float32)."""
  blocked = _blocked(values, blocks, 0.0)
  sums = jnp.einsum(
      "...ij,...jf->...if", blocks.same, blocked, precision=_HIGHEST
  )
  # Each block's sum of the segment it closes with (in scan order), carried
  # to the blocks whose open segment it is.
  tails = sums[..., 0, :] if blocks.reverse else sums[..., -1, :]
  carry = jnp.einsum(
      "...kj,...jf->...kf", blocks.carried, tails, precision=_HIGHEST
  )
  sums = sums + jnp.where(blocks.open[..., None], carry[..., None, :], 0.0)
  return _unblocked(sums, values.shape[-2])


# What a segmented maximum is where nothing is maximized.
NO_MAXIMUM = -(2**30)


def _masked_max(mask: chex.Array, values: chex.Array) -> chex.Array:
  """``out[..., i, f] = max_j values[..., j, f]`` over ``mask[..., i, j]``.

  One variadic reduction over the fields (one operand each). XLA:CPU splits
  a single-operand reduction over more than 32 elements in two (a
  reduce-window, then a reduce: its TreeReductionRewriter, for the
  precision of float sums) but not a variadic one, so the maxima stay one
  op at every block size; XLA:GPU does not split maxima at all.
  """
  chosen = tuple(
      jnp.where(mask > 0, values[..., None, :, f], NO_MAXIMUM)
      for f in range(values.shape[-1])
  )
  maxes = jax.lax.reduce(
      chosen,
      tuple(np.int32(NO_MAXIMUM) for _ in chosen),
      lambda a, b: tuple(jnp.maximum(x, y) for x, y in zip(a, b)),
      (chosen[0].ndim - 1,),
  )
  return jnp.stack(maxes, -1)


def _maxes(blocks: _Blocks, values: chex.Array) -> chex.Array:
  """Inclusive segmented maxima of ``values [..., T, F]`` (int32).

  The same blocks as :func:`_sums`, with a masked maximum where it has a
  matmul: one reduction within the blocks, one across them.
  """
  maxes = _masked_max(blocks.same, _blocked(values, blocks, NO_MAXIMUM))
  tails = maxes[..., 0, :] if blocks.reverse else maxes[..., -1, :]
  carry = _masked_max(blocks.carried, tails)
  maxes = jnp.where(
      blocks.open[..., None], jnp.maximum(maxes, carry[..., None, :]), maxes
  )
  return _unblocked(maxes, values.shape[-2])


def segmented_maxes(
    groups: Sequence[tuple[Sequence[chex.Array], chex.Array, bool]],
) -> tuple:
  """Inclusive segmented maxima of groups of integer fields.

  As :func:`segmented_sums`, with the maximum instead of the sum: int32
  fields, exact, and :data:`NO_MAXIMUM` is the maximum of nothing (fields
  should hold values above it).
  """
  return _scanned(groups, jnp.int32, _maxes)


def segmented_sums(
    groups: Sequence[tuple[Sequence[chex.Array], chex.Array, bool]],
) -> tuple:
  """Inclusive segmented sums of several groups of fields.

  Args:
    groups: ``(fields, boundaries, reverse)`` triples. ``fields`` are
      ``[..., T]`` arrays (cast to float32) summed over the segments that
      ``boundaries`` (bool ``[..., T]``, like every field) cuts: from the
      left, restarting where ``boundaries`` (the starts) is true; with
      ``reverse``, from the right, restarting where it (the ends) is true.

  Returns:
    A tuple with a tuple of float32 sums for each group, shaped like its
    fields. The sums are computed once (an optimization barrier): XLA
    would otherwise recompute their last elementwise steps inside every op
    that reads them.
  """
  return _scanned(groups, jnp.float32, _sums)


def _scanned(groups, dtype, scan) -> tuple:
  """``scan(blocks, stacked fields)`` of each group, computed once."""
  out = []
  for fields, bounds, reverse in groups:
    bounds = jnp.asarray(bounds, bool)
    if bounds.shape[-1] == 0:
      out.append(tuple(jnp.zeros(bounds.shape, dtype) for _ in fields))
      continue
    values = jnp.stack([jnp.asarray(f).astype(dtype) for f in fields], -1)
    result = jax.lax.optimization_barrier(
        scan(_blocks(bounds, reverse), values)
    )
    out.append(tuple(result[..., f] for f in range(len(fields))))
  return tuple(out)


def forward_sums(fields: Sequence[chex.Array], starts: chex.Array) -> tuple:
  """Segmented sums from the left of each field, restarting at ``starts``."""
  return segmented_sums(((fields, starts, False),))[0]


def reverse_sums(fields: Sequence[chex.Array], ends: chex.Array) -> tuple:
  """Segmented sums from the right of each field, restarting at ``ends``."""
  return segmented_sums(((fields, ends, True),))[0]


def segment_totals(
    fields: Sequence[chex.Array], starts: chex.Array, ends: chex.Array
) -> tuple:
  """Each field's sum over its whole segment, at every position of it.

  ``starts`` and ``ends`` must cut the same segments. Exact for integer
  fields; for float fields it is a difference of two sums (use
  :func:`forward_sums` at the segments' last positions where that matters).
  """
  from_left, from_right = segmented_sums(
      ((fields, starts, False), (fields, ends, True))
  )
  return tuple(
      l + r - jnp.asarray(f, jnp.float32)
      for l, r, f in zip(from_left, from_right, fields)
  )
