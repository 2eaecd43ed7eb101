r"""Running maxima and segmented sums along the last axis, in a few ops.

Everything :mod:`ntil_jax.numbers` computes about the numbers of a row of
``T`` positions is one of two scans:

* a **running maximum** of integer keys, from the left (``max_{j <= t}``) or
  from the right (``max_{j >= t}``), with no segments: where each number
  starts and ends, the nearest decimal point, the leading non-zero digits
  and the differences of two numbers are all the *nearest* position of some
  kind, found as the maximum of ``t`` (from the left) or of ``-t`` (from the
  right) over the positions of that kind (:func:`running_maxes`);
* an inclusive **segmented sum** of float fields over the numbers, a segment
  given by the index of its first position (:func:`segmented_sums`): the
  scaled sums of digits, whose terms must never meet another number's (no
  cancellation against them).

The row is cut into blocks of ``b`` positions (about ``sqrt(T)``, at most
:data:`BLOCK`; :func:`block_size`). A running maximum is one masked
reduction over a constant ``[b, b]`` triangle within each block (every field
at once, those maximized from the right reversed) and one over a constant
``[T/b, T/b]`` triangle across blocks. A
segmented sum is one batched matmul with a ``[b, b]`` mask within each block
(same segment, at or before the position) and one with a ``[T/b, T/b]`` mask
carrying each segment's sum over the blocks it crossed. So a scan is the same
dozen ops whatever ``T`` (``lax.associative_scan`` unrolls ``log2 T`` levels
of slices, pads and concatenates per field), on tensor cores or an MXU, with
O(T b) work per row and rows independent.

Maxima are exact (int32). Sums run at ``Precision.HIGHEST`` and are float32
sums of the same segment's terms only. The gradient of a sum is autodiff's:
the transposed masks, a sum from the other side.
"""

import math
from typing import Sequence

import chex
import jax
import jax.numpy as jnp
import numpy as np

from ntil_jax import arrays

# Positions per block: the side of each block's [b, b] mask.
BLOCK = 128
# What a running maximum is where nothing is maximized.
NO_MAXIMUM = -(2**30)
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


def _triangle(size: int, reverse: bool, strict: bool = False) -> np.ndarray:
  """``[size, size]`` bool: column j at (or strictly) before row i in order.

  The order runs from the left, or from the right with ``reverse``.
  """
  ones = np.ones((size, size), bool)
  if reverse:
    return np.triu(ones, 1 if strict else 0)
  return np.tril(ones, -1 if strict else 0)


def _blocked(x: chex.Array, block: int, fill) -> chex.Array:
  """``x [..., T, F]`` padded with ``fill`` to ``[..., T/b, b, F]``."""
  length = x.shape[-2]
  num_blocks = -(-length // block)
  pad = num_blocks * block - length
  widths = [(0, 0)] * (x.ndim - 2) + [(0, pad), (0, 0)]
  x = jnp.pad(x, widths, constant_values=fill)
  return x.reshape(x.shape[:-2] + (num_blocks, block, x.shape[-1]))


def _unblocked(x: chex.Array, length: int) -> chex.Array:
  """The inverse of :func:`_blocked`: ``[..., T, F]``."""
  num_blocks, block, fields = x.shape[-3:]
  return x.reshape(x.shape[:-3] + (num_blocks * block, fields))[..., :length, :]


def _running_max(values: chex.Array) -> chex.Array:
  """Inclusive running maxima from the left of ``values [..., T/b, b, F]``.

  One masked reduction over a constant ``[b, b]`` triangle within the
  blocks and one over a ``[T/b, T/b]`` triangle across them, every field at
  once (a trailing axis of each reduction).
  """

  def masked_max(x, triangle):
    chosen = arrays.where(triangle[:, :, None], x[..., None, :, :], NO_MAXIMUM)
    return jnp.max(chosen, axis=-2)

  within = masked_max(values, _triangle(values.shape[-2], False))
  # Each block's maximum (at its last position), carried to the blocks after.
  across = masked_max(
      within[..., -1, :], _triangle(values.shape[-3], False, strict=True)
  )
  return jnp.maximum(within, across[..., None, :])


def running_maxes(
    forward: Sequence[chex.Array] = (), backward: Sequence[chex.Array] = ()
) -> tuple[tuple, tuple]:
  """Inclusive running maxima of integer fields along the last axis.

  Args:
    forward: ``[..., T]`` integer fields maximized from the left:
      ``out[..., t] = max_{j <= t} x[..., j]``.
    backward: fields maximized from the right: ``max_{j >= t}``.

  Returns:
    ``(forward maxima, backward maxima)``, tuples of int32 arrays shaped like
    the fields, exact. :data:`NO_MAXIMUM` is the maximum of nothing (fields
    should hold values above it). The backward fields run reversed, so that
    every field shares one reduction within the blocks and one across them;
    the maxima are computed once (an optimization barrier: XLA would
    otherwise recompute their last steps inside every op that reads them).
  """
  fields = tuple(forward) + tuple(backward)
  if not fields:
    return (), ()
  length = fields[0].shape[-1]
  if length == 0:
    zeros = tuple(jnp.zeros(f.shape, jnp.int32) for f in fields)
    return zeros[: len(forward)], zeros[len(forward) :]
  values = jnp.stack([jnp.asarray(f).astype(jnp.int32) for f in fields], -1)

  def reverse_backward(x):
    if not backward:
      return x
    split = len(forward)
    return jnp.concatenate([x[..., :split], x[..., ::-1, split:]], -1)

  values = _blocked(reverse_backward(values), block_size(length), NO_MAXIMUM)
  maxes = reverse_backward(_unblocked(_running_max(values), length))
  maxes = jax.lax.optimization_barrier(maxes)
  out = tuple(maxes[..., f] for f in range(len(fields)))
  return out[: len(forward)], out[len(forward) :]


def segmented_sums(fields: Sequence[chex.Array], firsts: chex.Array) -> tuple:
  """Inclusive segmented sums from the left of float fields.

  Args:
    fields: ``[..., T]`` arrays (cast to float32).
    firsts: ``[..., T]`` integers, the index of the first position of the
      segment each position belongs to (segments are contiguous runs; every
      position of a segment holds the same index, as
      :func:`running_maxes` of ``where(starts, iota, NO_MAXIMUM)`` gives).

  Returns:
    A tuple of float32 arrays shaped like the fields: ``out[..., t]`` is the
    sum of the field over the positions ``j <= t`` of ``t``'s segment. The
    sums are computed once (an optimization barrier).
  """
  firsts = jnp.asarray(firsts, jnp.int32)
  length = firsts.shape[-1]
  if length == 0:
    return tuple(jnp.zeros(firsts.shape, jnp.float32) for _ in fields)
  block = block_size(length)
  values = jnp.stack([jnp.asarray(f).astype(jnp.float32) for f in fields], -1)
  values = _blocked(values, block, 0.0)
  # Padding is a segment of its own (no real position starts at -1).
  ids = _blocked(firsts[..., None], block, -1)[..., 0]
  same = (ids[..., :, None] == ids[..., None, :]) & _triangle(block, False)
  sums = jnp.einsum(
      "...ij,...jf->...if",
      same.astype(jnp.float32),
      values,
      precision=_HIGHEST,
  )
  # Block k opens with the segment block j (before k) closes with: j's sum
  # of it (at j's last position) is carried to k's positions in it.
  opening, closing = ids[..., 0], ids[..., -1]
  carried = (opening[..., :, None] == closing[..., None, :]) & _triangle(
      ids.shape[-2], False, strict=True
  )
  carry = jnp.einsum(
      "...kj,...jf->...kf",
      carried.astype(jnp.float32),
      sums[..., -1, :],
      precision=_HIGHEST,
  )
  is_open = (ids == opening[..., None])[..., None]
  sums = sums + arrays.where(is_open, carry[..., None, :], 0.0)
  sums = jax.lax.optimization_barrier(_unblocked(sums, length))
  return tuple(sums[..., f] for f in range(len(fields)))


def read_at(x: chex.Array, index: chex.Array) -> chex.Array:
  """``x[..., index[..., t], :]`` at each ``t``: one gather.

  Args:
    x: ``[..., T, F]``.
    index: ``[..., T]`` integers in ``[0, T)``, positions of the same row
      (not checked: XLA may return anything for one outside).

  Returns:
    ``[..., T, F]``, each position's fields read at its ``index``. The leading
    axes are the gather's batching axes (no index arrays are built for them).
  """
  batch = x.ndim - 2
  dimensions = jax.lax.GatherDimensionNumbers(
      offset_dims=(x.ndim - 1,),
      collapsed_slice_dims=(batch,),
      start_index_map=(batch,),
      operand_batching_dims=tuple(range(batch)),
      start_indices_batching_dims=tuple(range(batch)),
  )
  return jax.lax.gather(
      x,
      jnp.asarray(index, jnp.int32)[..., None],
      dimensions,
      slice_sizes=(1,) * (batch + 1) + (x.shape[-1],),
      mode=jax.lax.GatherScatterMode.PROMISE_IN_BOUNDS,
  )
