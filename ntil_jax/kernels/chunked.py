"""The project's own fused path: statistics from ``hidden @ W``, chunk by chunk.

The forward pass computes the :class:`~ntil_jax.TokenStatistics` chunk by
chunk along the sequence from ``hidden @ unembedding``, so the peak holds one
block of about ``chunk_size`` tokens by ``V`` instead of the whole
``[B, T, V]``. The backward pass (a custom VJP) recomputes the logits tile by
tile, a tile spanning about as many tokens as vocabulary columns, turns each
tile into its gradient in one elementwise pass and multiplies it into the
gradients of the hidden states and of the unembedding.

The vocabulary-wide matmuls take the inputs' dtype (bf16 stays bf16) and
accumulate in float32 (``preferred_element_type``), as XLA's own
``hidden @ W`` does; the block size depends on the backend
(:func:`default_chunk_size`). Pure XLA: it runs on every backend.
"""

import functools
import math
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from ntil_jax import arrays
from ntil_jax import numbers
from ntil_jax import statistics


def _chunk_statistics(hidden, labels, unembedding, columns, traced_ids):
  """TokenStatistics of one ``[B, C, D]`` chunk (inputs checked)."""
  logits = jnp.einsum(
      "bcd,dv->bcv", hidden, unembedding, preferred_element_type=jnp.float32
  )
  (labels,) = numbers.reshard_like(logits, labels)
  return statistics.statistics_from_columns(
      logits, labels, None, traced_ids, columns, True
  )


# CPU: a block of about 4M float32 logits (16 MiB) whatever the vocabulary.
DEFAULT_BLOCK_ELEMENTS = 2**22
# GPU and TPU: a float32 logits block of at most 512 MiB, in whole multiples
# of 256 tokens.
ACCELERATOR_BLOCK_BYTES = 2**29
ACCELERATOR_TOKEN_MULTIPLE = 256
# GPU and TPU: backward tiles span whole multiples of 128 columns.
ACCELERATOR_COLUMN_MULTIPLE = 128


def default_chunk_size(
    vocab_size: int,
    *,
    num_tokens: Optional[int] = None,
    backend: Optional[str] = None,
) -> int:
  """Tokens per chunk of the fused path, for a backend.

  On ``"cpu"`` a block holds about ``DEFAULT_BLOCK_ELEMENTS`` (4M) float32
  logits, a cache-sized block: on this project's 2-core CPU it measured
  fastest (issue 12), and at ``V = 151936`` it is 27 tokens. On a GPU or TPU
  such a block makes skinny matmuls that leave the chip idle (27 tokens at
  ``V = 151936`` cost 9.7x ``hidden @ W`` + optax CE on an H100, issue 18),
  so any other backend gets as many tokens as fit a float32 logits block of
  ``ACCELERATOR_BLOCK_BYTES`` (512 MiB), rounded down to a multiple of
  ``ACCELERATOR_TOKEN_MULTIPLE`` (256, a whole number of matmul tiles) and
  at least that multiple: 768 tokens at ``V = 151936``, 4096 at
  ``V = 32768``. The block is float32 whatever the inputs' dtype, since the
  logits are accumulated in float32.

  Args:
    vocab_size: ``V``, the unembedding's columns.
    num_tokens: if given, the chunk is capped at it (a batch smaller than
      one block is one block).
    backend: ``"cpu"``, ``"gpu"``, ``"tpu"``, ...; ``None``:
      ``jax.default_backend()``.

  Returns:
    A positive int, tokens per chunk.

  Example:
    A 512 MiB float32 block, in multiples of 256 tokens, on an accelerator;
    about 4M logits on a CPU; never more than the batch:

    >>> default_chunk_size(151936, backend="gpu")
    768
    >>> default_chunk_size(32768, backend="tpu")
    4096
    >>> default_chunk_size(151936, backend="cpu")
    27
    >>> default_chunk_size(151936, num_tokens=16, backend="cpu")
    16
  """
  if vocab_size < 1:
    raise ValueError(f"vocab_size must be >= 1, got {vocab_size}.")
  if backend is None:
    backend = jax.default_backend()
  if backend == "cpu":
    chunk = max(1, DEFAULT_BLOCK_ELEMENTS // vocab_size)
  else:
    chunk = ACCELERATOR_BLOCK_BYTES // (4 * vocab_size)
    chunk -= chunk % ACCELERATOR_TOKEN_MULTIPLE
    chunk = max(ACCELERATOR_TOKEN_MULTIPLE, chunk)
  if num_tokens is not None:
    chunk = max(1, min(chunk, num_tokens))
  return chunk


def token_statistics(
    hidden, unembedding, labels, columns, traced_ids, chunk_size=None
) -> statistics.TokenStatistics:
  """Statistics of ``hidden [B, T, D] @ unembedding [D, V]``, inputs checked.

  ``columns``/``traced_ids``: the digit columns
  (``statistics.digit_column_ids``); ``chunk_size``: tokens per forward block
  (``None``: :func:`default_chunk_size` for the default backend); the
  backward tiles hold about ``chunk_size * V`` logits each.
  """
  batch, length, _ = hidden.shape
  if batch == 0 or length == 0:  # nothing to chunk: empty statistics
    return _chunk_statistics(hidden, labels, unembedding, columns, traced_ids)
  vocab_size = unembedding.shape[-1]
  backend = jax.default_backend()
  if chunk_size is None:
    chunk_size = default_chunk_size(
        vocab_size, num_tokens=batch * length, backend=backend
    )
  column_multiple = 1 if backend == "cpu" else ACCELERATOR_COLUMN_MULTIPLE
  tile = _tiles(
      length, vocab_size, batch, chunk_size * vocab_size, column_multiple
  )
  return _statistics(
      hidden,
      unembedding,
      labels,
      traced_ids,
      columns,
      positions_per_chunk(batch, length, chunk_size),
      tile,
  )


def positions_per_chunk(batch: int, length: int, chunk_size: int) -> int:
  """Positions of each row in one forward chunk of ``chunk_size`` tokens.

  A chunk spans every row of the batch: ``chunk_size // batch`` positions
  a row at most, evened out over ``length`` (so a chunk holds ``batch``
  times this, which can be fewer tokens than ``chunk_size``).

  Example:
    27 tokens over 4 rows of 512: 6 positions a row, 24 tokens a chunk.

    >>> positions_per_chunk(4, 512, 27)
    6
  """
  return _even_split(length, max(1, chunk_size // batch))


def _digit_ids(columns, traced_ids):
  return traced_ids if columns is None else np.asarray(columns)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6))
def _statistics(hidden, unembedding, labels, traced_ids, columns, rows, tile):
  """:func:`fused_token_statistics` after its checks; custom VJP.

  ``rows``: positions of each row per forward chunk; ``tile``: positions and
  columns per backward tile (:func:`_tiles`).
  """
  return _statistics_fwd(
      hidden, unembedding, labels, traced_ids, columns, rows, tile
  )[0]


def _statistics_fwd(
    hidden, unembedding, labels, traced_ids, columns, rows, tile
):
  del tile  # backward only
  length = hidden.shape[1]
  ids = _digit_ids(columns, traced_ids)

  # The last chunk is shifted back to end at the edge; the positions it
  # shares with the chunk before are computed twice, to the same values.
  def chunk_step(stats, i):
    start = jnp.minimum(i * rows, length - rows)
    chunk = _chunk_statistics(
        _slice(hidden, start, rows, 1),
        _slice(labels, start, rows, 1),
        unembedding,
        columns,
        traced_ids,
    )
    stats = jax.tree.map(
        lambda s, c: jax.lax.dynamic_update_slice_in_dim(s, c, start, 1),
        stats,
        chunk,
    )
    return stats, None

  # Sharded as the hidden states are (the statistics' chunks are).
  per_token = jnp.zeros_like(hidden[..., 0], jnp.float32)
  empty = statistics.TokenStatistics(
      per_token,
      per_token,
      per_token[..., None] + jnp.zeros(ids.shape[0], jnp.float32),
  )
  stats, _ = jax.lax.scan(chunk_step, empty, jnp.arange(-(-length // rows)))
  return stats, (hidden, unembedding, labels, traced_ids, stats.log_norm)


def _tiles(length, vocab_size, batch, elements, column_multiple=1):
  """Positions and columns per backward tile of about ``elements`` logits.

  About as many tokens as columns (the gradients re-added per tile are
  ``[B, positions, D]`` and ``[D, columns]``), and tiles that split each
  axis evenly, so the last one overlaps the one before by little. Columns
  are rounded up to a multiple of ``column_multiple`` (at most ``V``).
  """
  side = max(1, math.isqrt(elements))
  positions = _even_split(length, max(1, side // batch))
  columns = _even_split(vocab_size, max(1, elements // (batch * positions)))
  columns = min(vocab_size, -(-columns // column_multiple) * column_multiple)
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


def _statistics_bwd(columns, rows, tile, residuals, cotangents):
  del rows  # forward only
  hidden, unembedding, labels, traced_ids, log_norm = residuals
  g_norm, g_label, g_digits = cotangents
  # Cotangents of a loss summed whole arrive unsplit: split them as the
  # statistics (and the hidden states) are, on an Explicit mesh.
  g_norm, g_label = numbers.reshard_like(log_norm, g_norm, g_label)
  (g_digits,) = numbers.reshard_like(log_norm[..., None], g_digits)
  length = hidden.shape[1]
  vocab_size = unembedding.shape[-1]
  positions, width = tile
  # bf16 inputs give bf16 matmul operands; float32 accumulates them.
  compute_dtype = jnp.result_type(hidden.dtype, unembedding.dtype)
  hidden_sharding = jax.typeof(hidden).sharding
  labels = jnp.clip(labels, 0, vocab_size - 1).astype(jnp.int32)
  if columns is None:  # invalid traced ids made the digit logits NaN
    g_digits = arrays.where(
        statistics.ids_are_valid(traced_ids, vocab_size), g_digits, 0.0
    )
    digit_columns = jnp.clip(traced_ids, 0, vocab_size - 1)
  else:
    digit_columns = columns
  # Number tokens of several digits (hundreds of columns): their cotangents
  # by two matmuls after the loop instead of a compare per column and logit.
  many = g_digits.shape[-1] > numbers.NUM_DIGITS
  # The last tile of each axis is shifted back to end at the edge; the part
  # it shares with the tile before is masked out, never counted twice.
  ragged_rows = length % positions != 0
  ragged_columns = vocab_size % width != 0
  column = jnp.arange(width)

  def vocabulary_step(carry, j):
    d_hidden, d_unembedding = carry
    first = j * width
    start_v = jnp.minimum(first, vocab_size - width)
    w = _slice(unembedding, start_v, width, 1)

    def token_step(carry, t):
      d_hidden, d_w = carry
      first_t = t * positions
      start_t = jnp.minimum(first_t, length - positions)
      h = _slice(hidden, start_t, positions, 1)
      logits = jnp.einsum(
          "bcd,dv->bcv", h, w, preferred_element_type=jnp.float32
      )
      scale = _slice(g_norm, start_t, positions, 1)
      label = _slice(labels, start_t, positions, 1) - start_v
      label_scale = _slice(g_label, start_t, positions, 1)
      digit_scales = _slice(g_digits, start_t, positions, 1)
      if ragged_rows:
        new_row = start_t + jnp.arange(positions) >= first_t
        scale = arrays.where(new_row, scale, 0.0)
        label_scale = arrays.where(new_row, label_scale, 0.0)
        digit_scales = arrays.where(new_row[:, None], digit_scales, 0.0)
      norm = _slice(log_norm, start_t, positions, 1)
      # One elementwise pass: softmax times d log_norm, plus the label's
      # and the ten digits' cotangents in their columns (11 compares per
      # logit, no scatter).
      grad = jnp.exp(logits - norm[..., None]) * scale[..., None]
      grad = grad + arrays.where(
          column == label[..., None], label_scale[..., None], 0.0
      )
      for k in range(0 if many else numbers.NUM_DIGITS):
        grad = grad + arrays.where(
            column == digit_columns[k] - start_v,
            digit_scales[..., k, None],
            0.0,
        )
      if ragged_columns:
        grad = arrays.where(column >= first - start_v, grad, 0.0)
      grad = grad.astype(compute_dtype)
      d_h = jnp.einsum(
          "bcv,dv->bcd",
          grad,
          w,
          preferred_element_type=jnp.float32,
          out_sharding=hidden_sharding,
      )
      d_w = d_w + jnp.einsum(
          "bcd,bcv->dv",
          h,
          grad,
          preferred_element_type=jnp.float32,
          out_sharding=jax.typeof(w).sharding,
      )
      return (_add_slice(d_hidden, d_h, start_t, 1), d_w), None

    (d_hidden, d_w), _ = jax.lax.scan(
        token_step,
        (d_hidden, jnp.zeros_like(w, jnp.float32)),
        jnp.arange(-(-length // positions)),
    )
    # Each column's gradient is complete here: rounded once to W's dtype
    # (the shared columns of a shifted last tile add exact zeros).
    d_w = d_w.astype(d_unembedding.dtype)
    return (d_hidden, _add_slice(d_unembedding, d_w, start_v, 1)), None

  (d_hidden, d_unembedding), _ = jax.lax.scan(
      vocabulary_step,
      (jnp.zeros_like(hidden, jnp.float32), jnp.zeros_like(unembedding)),
      jnp.arange(-(-vocab_size // width)),
  )
  if many:
    w_digits = jnp.take(unembedding, jnp.asarray(digit_columns), axis=1)
    d_hidden = d_hidden + jnp.einsum(
        "btk,dk->btd",
        g_digits,
        w_digits,
        preferred_element_type=jnp.float32,
        out_sharding=hidden_sharding,
    )
    d_digits = jnp.einsum(
        "btd,btk->dk",
        hidden,
        g_digits,
        preferred_element_type=jnp.float32,
        out_sharding=jax.typeof(w_digits).sharding,
    )
    d_unembedding = d_unembedding.at[:, jnp.asarray(digit_columns)].add(
        d_digits.astype(d_unembedding.dtype)
    )
  return d_hidden.astype(hidden.dtype), d_unembedding, None, None


_statistics.defvjp(_statistics_fwd, _statistics_bwd)
