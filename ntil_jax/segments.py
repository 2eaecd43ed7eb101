r"""Segmented sums along the last axis, as a few matmuls.

A row of ``T`` positions is cut into segments (each number of
:mod:`ntil_jax.numbers` is one) by a boolean ``starts``, true at the first
position of every segment. The inclusive segmented sum of ``v`` is

.. math::

  s_t = \sum_{j \le t,\ \mathrm{seg}(j) = \mathrm{seg}(t)} v_j ,

and the reverse one sums over :math:`j \ge t` instead, with segments cut
where ``ends`` is true. Everything :mod:`ntil_jax.numbers` computes (where a
number is, each digit's place, leading digits, borrows, scaled sums) is such
a sum.

The row is cut into blocks of ``b`` positions (:data:`BLOCK`). Within a
block, a ``[b, b]`` mask (same segment, earlier or same position) times the
block's values is one batched matmul; across blocks, a ``[T/b, T/b]`` mask
carries each segment's sum over the blocks it crossed, one more matmul. The
segment of a position is the count of starts up to it, itself a matmul
with a triangular matrix. So a sum is the same dozen ops whatever ``T``
(``lax.associative_scan`` unrolls ``log2 T`` levels of slices, pads and
concatenates per field), on tensor cores or an MXU, with O(T b) work and
memory per row (``b = 128``: 512 bytes a position), and rows independent.

Matmuls run at ``Precision.HIGHEST``: integer sums (counts, places) are
exact below ``2**24``, and float sums are float32 sums of the same segment's
terms only (no cancellation against other numbers). The gradient of a sum
is autodiff's: the transposed masks, a sum from the other side.
"""

from typing import Sequence

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
  """Positions per block for rows of ``length``: :data:`BLOCK` or fewer."""
  return max(1, min(BLOCK, length))


def _lower_triangle(size: int) -> np.ndarray:
  """``[size, size]`` float32, 1 where the column is at or before the row."""
  return np.tril(np.ones((size, size), np.float32))


def _forward(values: chex.Array, starts: chex.Array) -> chex.Array:
  """Inclusive segmented sums of ``values [..., T, F]`` (float32).

  ``starts [..., T]`` cuts the segments; position 0 always starts one.
  """
  length = starts.shape[-1]
  block = block_size(length)
  num_blocks = -(-length // block)
  pad = num_blocks * block - length
  batch = starts.shape[:-1]
  if pad:
    starts = jnp.pad(
        starts, [(0, 0)] * len(batch) + [(0, pad)], constant_values=True
    )
    values = jnp.pad(values, [(0, 0)] * len(batch) + [(0, pad), (0, 0)])
  starts = starts.reshape(batch + (num_blocks, block)).astype(jnp.float32)
  values = values.reshape(batch + (num_blocks, block, values.shape[-1]))
  within = _lower_triangle(block)
  # Segment of each position within its block: starts up to it (0: the
  # segment that came in from the blocks before).
  local = jnp.einsum("...i,ji->...j", starts, within, precision=_HIGHEST)
  same = (local[..., :, None] == local[..., None, :]) & (within > 0)
  sums = jnp.einsum(
      "...ij,...jf->...if",
      same.astype(jnp.float32),
      values,
      precision=_HIGHEST,
  )
  # Across blocks: block k's open positions (local 0) continue the segment
  # that ends block k - 1; it holds the tail sum of every block j < k whose
  # last segment is that one (no start in blocks j+1 .. k-1).
  tails = sums[..., -1, :]  # [..., nb, F]
  across = _lower_triangle(num_blocks)
  seen = jnp.einsum(
      "...i,ji->...j", local[..., -1], across, precision=_HIGHEST
  )  # starts in blocks 0..k
  before = shift_right(seen, -1.0)  # starts in blocks 0..k-1
  carried = (seen[..., None, :] == before[..., :, None]) & (
      across - np.eye(num_blocks, dtype=np.float32) > 0
  )
  carry = jnp.einsum(
      "...kj,...jf->...kf",
      carried.astype(jnp.float32),
      tails,
      precision=_HIGHEST,
  )
  sums = sums + jnp.where(local[..., None] == 0, carry[..., None, :], 0.0)
  sums = sums.reshape(batch + (num_blocks * block, -1))
  return sums[..., :length, :]


def segmented_sums(
    groups: Sequence[tuple[Sequence[chex.Array], chex.Array, bool]],
) -> tuple:
  """Inclusive segmented sums of several groups of fields, in one pass.

  Args:
    groups: ``(fields, boundaries, reverse)`` triples. ``fields`` are
      ``[..., T]`` arrays (cast to float32) summed over the segments that
      ``boundaries`` (bool ``[..., T]``, like every field) cuts: from the
      left, restarting where ``boundaries`` (the starts) is true; with
      ``reverse``, from the right, restarting where it (the ends) is true.
      Every group has the same shape.

  Returns:
    A tuple with a tuple of float32 sums for each group, shaped like its
    fields.
  """
  if not groups:
    return ()
  width = max(len(fields) for fields, _, _ in groups)
  stacked_values, stacked_bounds = [], []
  for fields, bounds, reverse in groups:
    flip = (lambda x: jnp.flip(x, -1)) if reverse else (lambda x: x)
    columns = [flip(jnp.asarray(f, jnp.float32)) for f in fields]
    columns += [jnp.zeros_like(columns[0])] * (width - len(columns))
    stacked_values.append(jnp.stack(columns, axis=-1))
    stacked_bounds.append(flip(jnp.asarray(bounds, bool)))
  shape = stacked_bounds[0].shape
  if shape[-1] == 0:
    return tuple(
        tuple(jnp.zeros(shape, jnp.float32) for _ in fields)
        for fields, _, _ in groups
    )
  sums = _forward(jnp.stack(stacked_values), jnp.stack(stacked_bounds))
  out = []
  for g, (fields, _, reverse) in enumerate(groups):
    group = sums[g]
    if reverse:
      group = jnp.flip(group, -2)
    out.append(tuple(group[..., f] for f in range(len(fields))))
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
