"""Token statistics from any per-token linear + softmax CE kernel.

A fused linear + softmax cross-entropy kernel returns, per token,
``ce = lse - <h, W[:, label]>`` with a VJP, never holding the ``[N, V]``
logits. That is all the statistics need besides eleven columns of ``W``:

* ``label_logit = <h, W[:, label]>``, a gather of ``N`` columns;
* ``log_norm = ce + label_logit`` (its gradient: the kernel's
  ``softmax - onehot`` plus the gather's ``onehot``, i.e. the softmax);
* ``digit_logits = h @ W[:, digit_ids]``, an ``[N, 10]`` matmul.

So every loss of :mod:`ntil_jax` rides the kernel: the vocabulary-wide work
(and its memory) is the kernel's alone.
"""

import math
from typing import Callable

import chex
import jax
import jax.numpy as jnp
import numpy as np

from ntil_jax import arrays
from ntil_jax import numbers
from ntil_jax import statistics

# (hidden [N, D], labels [N], unembedding [D, V]) -> per-token CE [N].
PerTokenCE = Callable[[chex.Array, chex.Array, chex.Array], chex.Array]


def _grads_in_dtype(ce_fn: PerTokenCE, dtype) -> PerTokenCE:
  """``ce_fn`` with its gradients cast to ``dtype``, its inputs' dtype.

  Some kernels return float32 gradients for bfloat16 inputs (tokamax 0.0.17's
  ``xla`` implementation does), which JAX cannot add to the bfloat16
  cotangents of the other uses of the same arrays.
  """

  @jax.custom_vjp
  def ce(hidden, labels, unembedding):
    return ce_fn(hidden, labels, unembedding)

  def fwd(hidden, labels, unembedding):
    out, vjp = jax.vjp(lambda h, w: ce_fn(h, labels, w), hidden, unembedding)
    return out, vjp

  def bwd(vjp, g):
    d_hidden, d_unembedding = vjp(g)
    return d_hidden.astype(dtype), None, d_unembedding.astype(dtype)

  ce.defvjp(fwd, bwd)
  return ce


def _token_axes(flat) -> tuple:
  """``(spec, axes, devices)``: the mesh axes the tokens of ``flat [N, D]``
  are split over on an Explicit mesh (as its spec's entry, and as a tuple)
  and how many devices that is; ``(None, (), 1)`` where they are not."""
  sharding = numbers.split_sharding(flat)
  rows = None if sharding is None else sharding.spec[0]
  if rows is None:
    return None, (), 1
  axes = rows if isinstance(rows, tuple) else (rows,)
  return rows, axes, math.prod(sharding.mesh.shape[axis] for axis in axes)


def _on_each_shard(ce_fn: PerTokenCE, flat) -> PerTokenCE:
  """``ce_fn`` run on each device's tokens where ``flat`` is split over a
  mesh's Explicit axes (`_token_axes`), else ``ce_fn``.

  A kernel written for one device (tokamax's backward among them) has no
  output sharding for a contraction over tokens split across devices; each
  device runs it on its own tokens with the whole unembedding, whose
  gradient autodiff sums over them.
  """
  rows, axes, _ = _token_axes(flat)
  if rows is None:
    return ce_fn

  def local(hidden, labels, unembedding):
    # Varying like the tokens before the kernel sees it (a kernel's own
    # custom VJP returns a varying gradient); the cast's transpose sums it.
    return ce_fn(hidden, labels, jax.lax.pcast(unembedding, axes, to="varying"))

  per_device = jax.shard_map(
      local,
      mesh=numbers.split_sharding(flat).mesh,
      in_specs=(jax.P(rows, None), jax.P(rows), jax.P()),
      out_specs=jax.P(rows),
  )

  def ce(hidden, labels, unembedding):
    hidden = jax.sharding.reshard(hidden, jax.P(rows, None))
    return per_device(
        hidden, labels, jax.sharding.reshard(unembedding, jax.P())
    )

  return ce


def _checked(ce_fn: PerTokenCE, num_tokens: int) -> PerTokenCE:
  """``ce_fn``, raising as soon as it is traced if it returns anything but
  one floating-point array of ``num_tokens`` values."""

  def ce(hidden, labels, unembedding):
    out = ce_fn(hidden, labels, unembedding)
    expected = (
        f"one floating-point array of shape ({num_tokens},), the per-token "
        "CE of (hidden [N, D], labels [N], unembedding [D, V])"
    )
    if not isinstance(out, (jax.Array, np.ndarray)):
      what = type(out).__name__
      if isinstance(out, (tuple, list)):
        what = f"a {what} of {len(out)} item(s)"
      raise TypeError(
          f"the CE implementation must return {expected}; it returned {what}."
      )
    if not jnp.issubdtype(out.dtype, jnp.floating):
      raise TypeError(
          f"the CE implementation must return {expected}; it returned "
          f"{out.dtype} values (no gradient flows through integers)."
      )
    if jnp.shape(out) != (num_tokens,):
      raise ValueError(
          f"the CE implementation must return one value per token, shape "
          f"({num_tokens},); it returned shape {jnp.shape(out)}."
      )
    return out

  return ce


def token_statistics(
    ce_fn: PerTokenCE, hidden, unembedding, labels, columns, traced_ids
) -> statistics.TokenStatistics:
  """Statistics of ``hidden [B, T, D] @ unembedding [D, V]`` via ``ce_fn``.

  Args:
    ce_fn: the per-token CE kernel. It is given float hidden states and an
      unembedding of one dtype, and labels in ``[0, V)`` (int32).
    hidden: ``[B, T, D]`` hidden states (already zero where not scored).
    unembedding: ``[D, V]``.
    labels: ``[B, T]`` integer labels; ids outside ``[0, V)`` (ignored
      positions) are given to the kernel as 0, and their statistics are
      those of label 0 (the losses never read them).
    columns: the digit columns as a static tuple, or None with
      ``traced_ids`` (``statistics.digit_column_ids``).
    traced_ids: ``[10]`` traced digit ids when ``columns`` is None; invalid
      ones make the digit logits NaN, as on the logits path.

  Returns:
    TokenStatistics with ``[B, T]`` / ``[B, T, 10]`` float32 fields.

  Raises:
    TypeError: if the kernel returns anything but one floating-point array
      (a tuple, integers), when it is traced.
    ValueError: if it returns an array of another shape than ``[N]``.
  """
  # The kernel takes the tokens flattened, [B * T, D]: a sequence split
  # over explicit mesh axes cannot be flattened in place (a block of T is
  # no block of B * T), so T is made whole first and the statistics split
  # as the labels were (the hidden states gathered along T, as the chunked
  # path's flattening does).
  split_labels = labels
  hidden = numbers.whole_sequence(hidden, axis=1)
  labels = numbers.whole_sequence(labels, axis=1)
  stats = _whole_sequence_statistics(
      ce_fn, hidden, unembedding, labels, columns, traced_ids
  )
  return statistics.TokenStatistics(
      numbers.split_like(stats.log_norm, split_labels, axis=1),
      numbers.split_like(stats.label_logits, split_labels, axis=1),
      numbers.split_like(stats.digit_logits, split_labels, axis=1),
  )


def _whole_sequence_statistics(
    ce_fn, hidden, unembedding, labels, columns, traced_ids
) -> statistics.TokenStatistics:
  """:func:`token_statistics` on hidden states whole along T."""
  batch, length, dim = hidden.shape
  vocab_size = unembedding.shape[-1]
  if batch * length == 0:  # nothing to give the kernel
    count = traced_ids.shape[0] if columns is None else len(columns)
    per_token = jnp.zeros((batch, length), jnp.float32)
    return statistics.TokenStatistics(
        per_token, per_token, jnp.zeros((batch, length, count), jnp.float32)
    )
  dtype = jnp.result_type(hidden.dtype, unembedding.dtype)
  flat = hidden.reshape(batch * length, dim).astype(dtype)
  unembedding = unembedding.astype(dtype)
  valid = (labels >= 0) & (labels < vocab_size)
  safe = arrays.where(valid, labels, 0).astype(jnp.int32).reshape(-1)
  # Checked on the tokens each device gives it.
  ce_fn = _checked(ce_fn, batch * length // _token_axes(flat)[2])
  ce = _grads_in_dtype(_on_each_shard(ce_fn, flat), dtype)(
      flat, safe, unembedding
  )
  # Each label's row of W^T, split over a mesh as the tokens are.
  label_rows = unembedding.T.at[safe].get(
      out_sharding=numbers.split_sharding(flat)
  )
  label_logit = jnp.einsum(
      "nd,nd->n", flat, label_rows, preferred_element_type=jnp.float32
  )
  if columns is not None:
    digit_columns = jnp.take(unembedding, np.asarray(columns), axis=1)
  else:
    digit_columns = jnp.take(unembedding, traced_ids, axis=1, mode="clip")
  digits = jnp.einsum(
      "nd,dk->nk", flat, digit_columns, preferred_element_type=jnp.float32
  )
  if columns is None:
    digits = arrays.where(
        statistics.ids_are_valid(traced_ids, vocab_size), digits, jnp.nan
    )
  log_norm = ce.astype(jnp.float32) + label_logit
  return statistics.TokenStatistics(
      log_norm.reshape(batch, length),
      label_logit.reshape(batch, length),
      digits.reshape(batch, length, -1),
  )
