"""CE + numeric loss straight from hidden states, never holding ``[N, V]`` logits.

Every loss in :mod:`ntil_jax.losses` reads the logits only through three small
per-token statistics: the log-normalizer over the vocabulary, the label's
logit and the ten digit logits (:class:`~ntil_jax.losses.TokenStatistics`).
Here the forward pass computes those chunk by chunk along the sequence from
``hidden @ unembedding``, so the peak holds one block of about
``chunk_size`` tokens by ``V`` instead of the whole ``[B, T, V]``. The
backward pass (a custom VJP) recomputes the logits tile by tile, a tile
spanning about as many tokens as vocabulary columns, turns each tile into its
gradient in one elementwise pass and multiplies it into the gradients of the
hidden states and of the unembedding. The number logic runs on the full
``[B, T, 10]`` digit logits, so numbers that cross chunk boundaries are
handled exactly.
"""

import functools
import math
from typing import Optional

import chex
import jax
import jax.numpy as jnp
import numpy as np

from ntil_jax import losses


def _chunk_statistics(hidden, labels, unembedding, digit_token_ids):
  """TokenStatistics of one ``[B, C, D]`` chunk."""
  logits = jnp.einsum(
      "bcd,dv->bcv", hidden, unembedding, preferred_element_type=jnp.float32
  )
  return losses.token_statistics(logits, labels, digit_token_ids)


# Default block: about 4M float32 logits (16 MiB) whatever the vocabulary.
DEFAULT_BLOCK_ELEMENTS = 2**22


def default_chunk_size(vocab_size: int) -> int:
  """Tokens per chunk so that one block holds ~4M logits."""
  return max(1, DEFAULT_BLOCK_ELEMENTS // vocab_size)


def _check_chunk_size(chunk_size) -> None:
  """Raises ValueError unless ``chunk_size`` is None or a positive int."""
  if chunk_size is None:
    return
  if isinstance(chunk_size, (bool, np.bool_)) or not isinstance(
      chunk_size, (int, np.integer)
  ):
    raise ValueError(
        f"chunk_size must be a positive int or None, got "
        f"{chunk_size!r} ({type(chunk_size).__name__})."
    )
  if chunk_size < 1:
    raise ValueError(f"chunk_size must be >= 1, got {chunk_size}.")


def fused_token_statistics(
    hidden,
    unembedding,
    labels,
    *,
    digit_token_ids=None,
    chunk_size: Optional[int] = None,
    mask=None,
) -> losses.TokenStatistics:
  """:class:`~ntil_jax.losses.TokenStatistics` of ``hidden @ unembedding``.

  The forward pass computes the logits chunk by chunk along the sequence.
  The gradient is a custom VJP that walks tiles of about as many logits,
  vocabulary columns by token positions: each tile's logits are recomputed,
  turned into their gradient in one pass (softmax times the log-normalizer's
  cotangent, plus the label's and digits' cotangents) and multiplied into
  the hidden states' and the unembedding's gradients. A tile spans many
  tokens and many columns, so neither the ``[D, V]`` nor the ``[B, T, D]``
  gradient is re-added once per handful of tokens or columns.

  Args:
    hidden: ``[B, T, D]`` final hidden states.
    unembedding: ``[D, V]`` output projection.
    labels: ``[B, T]`` integer labels.
    digit_token_ids: ``[10]`` digit ids (``None``: 0..9).
    chunk_size: tokens per chunk (``None``: :func:`default_chunk_size`); a
      chunk covers ``max(1, chunk_size // B)`` positions of every row, so
      the batch axis stays whole (and sharded, if it is). The backward
      tiles hold about ``chunk_size * V`` logits each.
    mask: optional ``[B, T]`` bool, the positions whose statistics will be
      used; hidden states elsewhere are replaced by zeros (a ``where`` on the
      ``[B, T, D]`` hidden states), so NaN or inf there gives finite
      statistics and a zero gradient.

  Returns:
    TokenStatistics with ``[B, T]`` / ``[B, T, 10]`` fields.
  """
  _check_chunk_size(chunk_size)
  hidden = jnp.asarray(hidden)
  unembedding = jnp.asarray(unembedding)
  labels = jnp.asarray(labels)
  if mask is not None:
    hidden = jnp.where(jnp.asarray(mask, bool)[..., None], hidden, 0)
  batch, length, _ = hidden.shape
  if batch == 0 or length == 0:  # nothing to chunk: empty statistics
    return _chunk_statistics(hidden, labels, unembedding, digit_token_ids)
  vocab_size = unembedding.shape[-1]
  if chunk_size is None:
    chunk_size = default_chunk_size(vocab_size)
  columns, traced_ids = losses._digit_columns(digit_token_ids, vocab_size)
  return _statistics(
      hidden, unembedding, labels, traced_ids, columns, int(chunk_size)
  )


def _digit_ids(columns, traced_ids):
  return traced_ids if columns is None else np.asarray(columns)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def _statistics(hidden, unembedding, labels, traced_ids, columns, chunk_size):
  """:func:`fused_token_statistics` after its checks; custom VJP."""
  return _statistics_fwd(
      hidden, unembedding, labels, traced_ids, columns, chunk_size
  )[0]


def _statistics_fwd(
    hidden, unembedding, labels, traced_ids, columns, chunk_size
):
  batch, length, _ = hidden.shape
  positions = max(1, min(chunk_size // batch, length))
  num_chunks = -(-length // positions)
  padded = num_chunks * positions
  chunk_hidden, chunk_labels = hidden, labels
  if padded != length:
    chunk_hidden = jnp.pad(hidden, ((0, 0), (0, padded - length), (0, 0)))
    chunk_labels = jnp.pad(labels, ((0, 0), (0, padded - length)))

  def to_chunks(x):  # [B, T, ...] -> [num_chunks, B, chunk, ...]
    x = x.reshape((batch, num_chunks, positions) + x.shape[2:])
    return jnp.moveaxis(x, 1, 0)

  ids = _digit_ids(columns, traced_ids)
  stats = jax.lax.map(
      lambda xs: _chunk_statistics(*xs, unembedding, ids),
      (to_chunks(chunk_hidden), to_chunks(chunk_labels)),
  )

  def from_chunks(x):  # [num_chunks, B, chunk, ...] -> [B, T, ...]
    x = jnp.moveaxis(x, 0, 1)
    return x.reshape((batch, padded) + x.shape[3:])[:, :length]

  stats = jax.tree.map(from_chunks, stats)
  return stats, (hidden, unembedding, labels, traced_ids, stats.log_norm)


def _tiles(length, vocab_size, batch, elements):
  """Positions and columns per backward tile of about ``elements`` logits.

  About as many tokens as columns (the gradients re-added per tile are
  ``[B, positions, D]`` and ``[D, columns]``), and tiles that split each
  axis evenly, so the last one overlaps the one before by little.
  """
  side = max(1, math.isqrt(elements))
  positions = _even_split(length, max(1, side // batch))
  columns = _even_split(vocab_size, max(1, elements // (batch * positions)))
  return positions, columns


def _even_split(total, most):
  """The smallest size of ``ceil(total / most)`` near-equal parts."""
  parts = -(-total // max(1, min(total, most)))
  return -(-total // parts)


def _slice(x, start, size, axis):
  return jax.lax.dynamic_slice_in_dim(x, start, size, axis=axis)


def _add_slice(x, update, start, axis):
  """``x`` with ``update`` added at ``start`` along ``axis`` (in place)."""
  current = _slice(x, start, update.shape[axis], axis)
  return jax.lax.dynamic_update_slice_in_dim(x, current + update, start, axis)


def _statistics_bwd(columns, chunk_size, residuals, cotangents):
  hidden, unembedding, labels, traced_ids, log_norm = residuals
  g_norm, g_label, g_digits = cotangents
  batch, length, _ = hidden.shape
  vocab_size = unembedding.shape[-1]
  # The label's and the digits' cotangents: 11 sparse entries per token.
  sparse_columns, sparse_values = losses._sparse_cotangents(
      jnp.clip(labels, 0, vocab_size - 1),
      g_label,
      g_digits,
      columns,
      traced_ids,
      vocab_size,
  )
  positions, width = _tiles(length, vocab_size, batch, chunk_size * vocab_size)
  # The last tile of each axis is shifted back to end at the edge; the part
  # it shares with the tile before is masked out, never counted twice.
  ragged_rows = length % positions != 0
  ragged_columns = vocab_size % width != 0
  hidden_type = jax.typeof(hidden)
  unembedding_type = jax.typeof(unembedding)

  def vocabulary_step(carry, j):
    d_hidden, d_unembedding = carry
    first = j * width
    start_v = jnp.minimum(first, vocab_size - width)
    w = _slice(unembedding, start_v, width, 1)
    new_column = start_v + jnp.arange(width) >= first

    def token_step(carry, t):
      d_hidden, d_w = carry
      first_t = t * positions
      start_t = jnp.minimum(first_t, length - positions)
      h = _slice(hidden, start_t, positions, 1)
      logits = jnp.einsum(
          "bcd,dv->bcv", h, w, preferred_element_type=jnp.float32
      )
      scale = _slice(g_norm, start_t, positions, 1)
      if ragged_rows:
        new_row = start_t + jnp.arange(positions) >= first_t
        scale = jnp.where(new_row, scale, 0.0)
      norm = _slice(log_norm, start_t, positions, 1)
      grad = jnp.exp(logits - norm[..., None]) * scale[..., None]
      if ragged_columns:
        grad = jnp.where(new_column, grad, 0.0)
      # Sparse entries in this tile's new columns (others are dropped).
      local = _slice(sparse_columns, start_t, positions, 1) - start_v
      keep = (local >= first - start_v) & (local < width)
      if ragged_rows:
        keep = keep & new_row[:, None]
      grad = losses._add_to_columns(
          grad,
          jnp.where(keep, local, width),
          _slice(sparse_values, start_t, positions, 1),
          mode=jax.lax.GatherScatterMode.FILL_OR_DROP,
      )
      d_h = jnp.einsum(
          "bcv,dv->bcd",
          grad,
          w.astype(jnp.float32),
          out_sharding=hidden_type.sharding,
      )
      d_w = d_w + jnp.einsum(
          "bcd,bcv->dv",
          h.astype(jnp.float32),
          grad,
          out_sharding=jax.typeof(w).sharding,
      )
      return (_add_slice(d_hidden, d_h, start_t, 1), d_w), None

    (d_hidden, d_w), _ = jax.lax.scan(
        token_step,
        (d_hidden, jnp.zeros_like(w, jnp.float32)),
        jnp.arange(-(-length // positions)),
    )
    return (d_hidden, _add_slice(d_unembedding, d_w, start_v, 1)), None

  (d_hidden, d_unembedding), _ = jax.lax.scan(
      vocabulary_step,
      (
          jnp.zeros_like(hidden, jnp.float32),
          jnp.zeros_like(unembedding, jnp.float32),
      ),
      jnp.arange(-(-vocab_size // width)),
  )
  return (
      d_hidden.astype(hidden_type.dtype),
      d_unembedding.astype(unembedding_type.dtype),
      None,
      None,
  )


_statistics.defvjp(_statistics_fwd, _statistics_bwd)


def fused_numeric_loss(
    hidden,
    unembedding,
    labels,
    digit_mask=None,
    *,
    loss_mask=None,
    lam: float = 0.3,
    method: str = "ntil",
    weighting: str = "sum",
    digit_token_ids=None,
    chunk_size: Optional[int] = None,
    **loss_kwargs,
) -> chex.Array:
  r"""Per-token ``CE + lam * numeric loss`` from hidden states.

  Equal to :func:`ntil_jax.numeric_token_loss` on
  ``logits = hidden @ unembedding`` (up to float rounding), without ever
  holding the ``[..., T, V]`` logits or their gradient: the peak holds one
  block of about ``chunk_size * V`` logits (a chunk of tokens by ``V``
  forward, a tile of about as many tokens as columns backward; see
  :func:`fused_token_statistics`) besides the ``[D, V]`` gradient.

  Args:
    hidden: ``[..., T, D]`` final hidden states (any float dtype; the logits
      are accumulated in float32).
    unembedding: ``[D, V]`` output projection (``logits = hidden @ W``).
    labels: ``[..., T]`` integer ids; ids outside ``[0, V)`` score 0.
    digit_mask: ``[..., T]`` bool, where numbers may be (``None``: all).
    loss_mask: ``[..., T]`` bool, positions to score (``None``: all valid).
    lam: weight of the numeric loss.
    method: ``"ntil"``, ``"emd"``, ``"ntl_mse"``, ``"soft_label"`` or ``"ce"``.
    weighting: ``"sum"`` or ``"reference"`` (see ``numeric_token_loss``).
    digit_token_ids: ``[10]`` digit ids (``None``: 0..9).
    chunk_size: tokens per chunk (a positive int); ``None`` picks ~4M logits
      per block.
    **loss_kwargs: keyword arguments of the numeric loss.

  Returns:
    ``[..., T]`` float32 per-token loss; empty if the batch or T is 0.
    Positions not scored score 0 with zero gradient, even where their
    hidden states are NaN or inf.
  """
  hidden = jnp.asarray(hidden)
  unembedding = jnp.asarray(unembedding)
  labels = jnp.asarray(labels)
  if hidden.ndim < 2 or unembedding.ndim != 2:
    raise ValueError(
        f"hidden must be [..., T, D] and unembedding [D, V], got "
        f"{hidden.shape} and {unembedding.shape}."
    )
  if hidden.shape[-1] != unembedding.shape[0]:
    raise ValueError(
        f"hidden {hidden.shape} and unembedding "
        f"{unembedding.shape} disagree on D."
    )
  # Shape checks of labels and masks, against a logits shape never built.
  logits_shape = jax.ShapeDtypeStruct(
      hidden.shape[:-1] + unembedding.shape[1:], jnp.float32
  )
  masks = tuple(
      (n, None if m is None else jnp.asarray(m))
      for n, m in (("digit_mask", digit_mask), ("loss_mask", loss_mask))
  )
  losses._check_inputs(logits_shape, labels, None, digit_token_ids, masks)
  losses.check_method(method, weighting, loss_kwargs, lam=lam)
  _check_chunk_size(chunk_size)

  leading = labels.ndim - 1
  batch = int(np.prod(labels.shape[:leading], dtype=np.int64))

  def flatten_batch(x):  # [..., T, ...] -> [B, T, ...]
    return (
        None
        if x is None
        else jnp.reshape(jnp.asarray(x), (batch,) + jnp.shape(x)[leading:])
    )

  flat_labels = flatten_batch(labels)
  flat_loss_mask = flatten_batch(loss_mask)
  vocab_size = unembedding.shape[1]
  stats = fused_token_statistics(
      flatten_batch(hidden),
      unembedding,
      flat_labels,
      digit_token_ids=digit_token_ids,
      chunk_size=chunk_size,
      mask=losses._scored(flat_labels, vocab_size, flat_loss_mask),
  )
  per_token = losses.loss_from_statistics(
      stats,
      flat_labels,
      vocab_size=vocab_size,
      loss_mask=flat_loss_mask,
      digit_mask=flatten_batch(digit_mask),
      method=method,
      lam=lam,
      weighting=weighting,
      digit_token_ids=digit_token_ids,
      **loss_kwargs,
  )
  return per_token.reshape(labels.shape)
