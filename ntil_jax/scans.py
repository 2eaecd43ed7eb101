"""Segmented scans along the last axis, in the form that suits the backend.

A segmented scan is an inclusive scan of an associative ``op`` (``jnp.add``,
``jnp.maximum``, ...) that restarts wherever a boolean ``starts`` is true
(``ends`` for scans from the right). :mod:`ntil_jax.numbers` runs every
per-number computation with them: each number is one segment.

On a CPU they are ``lax.associative_scan`` (O(T) work in many small ops); on a
GPU or TPU, where every op is a kernel launch, they are radix-8 Hillis-Steele
scans of ``ceil(log_8(T))`` wide elementwise steps (O(T log T) work). Either
way they work on ``[..., T]`` arrays only, with no O(T^2) tensor, and rows are
independent. :func:`segmented_sums` has a custom VJP: the gradient of a sum
from the left is the same sum from the right.
"""

import functools

import chex
import jax
import jax.numpy as jnp


def shift_right(x: chex.Array, fill, distance: int = 1) -> chex.Array:
  """x[..., t - distance] at position t; ``fill`` where t < distance."""
  # A slice of x padded by its own length: every distance slices the same
  # pad, which XLA then computes once and fuses each slice into its user.
  length = x.shape[-1]
  widths = [(0, 0)] * (x.ndim - 1) + [(length, 0)]
  padded = jnp.pad(x, widths, constant_values=fill)
  return padded[..., length - distance : 2 * length - distance]


def shift_left(x: chex.Array, fill, distance: int = 1) -> chex.Array:
  """x[..., t + distance] at position t; ``fill`` in the last ``distance``."""
  length = x.shape[-1]
  widths = [(0, 0)] * (x.ndim - 1) + [(0, length)]
  padded = jnp.pad(x, widths, constant_values=fill)
  return padded[..., distance : length + distance]


def first_nonzero(left, right):
  """Associative op: the first non-zero value of a scan (0 if none yet)."""
  return jnp.where(left != 0, left, right)


def last_nonzero(left, right):
  """Associative op: the last non-zero value of a scan (0 if none yet)."""
  return jnp.where(right != 0, right, left)


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
  shift = shift_left if reverse else shift_right
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
  shift = shift_left if reverse else shift_right
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
