"""CE + numeric loss straight from hidden states, never holding ``[N, V]`` logits.

Every loss in :mod:`ntil_jax.losses` reads the logits only through three small
per-token statistics: the log-normalizer over the vocabulary, the label's
logit and the ten digit logits (:class:`~ntil_jax.TokenStatistics`).
Here the forward pass computes those chunk by chunk along the sequence from
``hidden @ unembedding``, so the peak holds one block of about
``chunk_size`` tokens by ``V`` instead of the whole ``[B, T, V]``. The
backward pass (a custom VJP) recomputes the logits tile by tile, a tile
spanning about as many tokens as vocabulary columns, turns each tile into its
gradient in one elementwise pass and multiplies it into the gradients of the
hidden states and of the unembedding. The number logic runs on the full
``[B, T, 10]`` digit logits, so numbers that cross chunk boundaries are
handled exactly.

The vocabulary-wide matmuls take the inputs' dtype (bf16 stays bf16) and
accumulate in float32 (``preferred_element_type``), as XLA's own
``hidden @ W`` does; the block size depends on the backend
(:func:`default_chunk_size`).
"""

import functools
import math
from typing import Optional

import chex
import jax
import jax.numpy as jnp
import numpy as np

from ntil_jax import base
from ntil_jax import losses
from ntil_jax import numbers
from ntil_jax import statistics
from ntil_jax import validation


def _chunk_statistics(hidden, labels, unembedding, digit_token_ids):
  """TokenStatistics of one ``[B, C, D]`` chunk."""
  logits = jnp.einsum(
      "bcd,dv->bcv", hidden, unembedding, preferred_element_type=jnp.float32
  )
  return statistics.token_statistics(logits, labels, digit_token_ids)


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


def _check_fused_inputs(hidden, unembedding, labels, digit_token_ids, masks):
  """Raises ValueError as :func:`ntil_jax.numeric_token_loss` would.

  Checks the shapes and dtypes of ``hidden [..., T, D]``, ``unembedding
  [D, V]`` and the ``(name, mask)`` pairs in ``masks``, the labels and the
  digit ids against a logits shape that is never built; all at trace time.
  """
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
  for name, x in (("hidden", hidden), ("unembedding", unembedding)):
    validation._check_logits_dtype(x, name)
  logits_shape = jax.ShapeDtypeStruct(
      hidden.shape[:-1] + unembedding.shape[1:], jnp.float32
  )
  validation._check_inputs(logits_shape, labels, None, digit_token_ids, masks)


def fused_token_statistics(
    hidden,
    unembedding,
    labels,
    *,
    digit_token_ids=None,
    chunk_size: Optional[int] = None,
    mask=None,
) -> statistics.TokenStatistics:
  """:class:`~ntil_jax.TokenStatistics` of ``hidden @ unembedding``.

  The forward pass computes the logits chunk by chunk along the sequence.
  The gradient is a custom VJP that walks tiles of about as many logits,
  vocabulary columns by token positions: each tile's logits are recomputed
  and turned into their gradient in one elementwise pass (softmax times the
  log-normalizer's cotangent, plus the label's and the digits' cotangents
  in their columns), cast to the inputs' dtype and multiplied into the
  hidden states' and the unembedding's gradients (float32 accumulation). A
  tile spans many tokens and many columns, so neither the ``[D, V]`` nor
  the ``[B, T, D]`` gradient is re-added once per handful of tokens or
  columns.

  Args:
    hidden: ``[B, T, D]`` final hidden states.
    unembedding: ``[D, V]`` output projection.
    labels: ``[B, T]`` integer labels.
    digit_token_ids: ``[10]`` digit ids (``None``: 0..9).
    chunk_size: tokens per chunk (``None``: :func:`default_chunk_size` for
      the default backend); a chunk covers about ``chunk_size // B``
      positions of every row, so the batch axis stays whole (and sharded,
      if it is). The backward tiles hold about ``chunk_size * V`` logits
      each.
    mask: optional ``[B, T]`` bool, the positions whose statistics will be
      used; hidden states elsewhere are replaced by zeros (a ``where`` on the
      ``[B, T, D]`` hidden states), so NaN or inf there gives finite
      statistics and a zero gradient.

  Returns:
    TokenStatistics with ``[B, T]`` / ``[B, T, 10]`` float32 fields.

  Raises:
    ValueError: for hidden states that are not ``[B, T, D]``, an
      unembedding that is not ``[D, V]`` (with the same ``D``), non-float
      hidden states or unembedding, labels or ``mask`` not ``[B, T]``,
      non-integer labels, digit ids out of ``[0, V)`` (the default ids 0..9
      need ``V >= 10``), or a bad ``chunk_size``.
  """
  _check_chunk_size(chunk_size)
  hidden = jnp.asarray(hidden)
  unembedding = jnp.asarray(unembedding)
  labels = jnp.asarray(labels)
  if hidden.ndim != 3:
    raise ValueError(
        f"hidden must be [B, T, D] (rank 3), got shape {hidden.shape}."
    )
  mask = None if mask is None else jnp.asarray(mask)
  _check_fused_inputs(
      hidden, unembedding, labels, digit_token_ids, (("mask", mask),)
  )
  if mask is not None:
    hidden = jnp.where(jnp.asarray(mask, bool)[..., None], hidden, 0)
  hidden, unembedding = _vary_alike(hidden, unembedding)
  batch, length, _ = hidden.shape
  if batch == 0 or length == 0:  # nothing to chunk: empty statistics
    return _chunk_statistics(hidden, labels, unembedding, digit_token_ids)
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
  columns, traced_ids = statistics._digit_columns(digit_token_ids, vocab_size)
  return _statistics(
      hidden,
      unembedding,
      labels,
      traced_ids,
      columns,
      _even_split(length, max(1, chunk_size // batch)),
      tile,
  )


def _vary_alike(*arrays):
  """The arrays, each varying over the manual axes that any one varies over.

  Inside ``shard_map`` a replicated unembedding meets batch-sharded hidden
  states: autodiff would cast it to varying where they meet (and sum its
  gradient over the shards); the custom VJP's carries and cotangents need
  that cast made before it. Outside ``shard_map`` nothing varies.
  """
  varying = [jax.typeof(x).mat.varying for x in arrays]
  union = frozenset().union(*varying)
  return tuple(
      jax.lax.pcast(x, tuple(sorted(union - v)), to="varying")
      for x, v in zip(arrays, varying)
  )


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
        ids,
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
      per_token[..., None] + jnp.zeros(numbers.NUM_DIGITS, jnp.float32),
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
  length = hidden.shape[1]
  vocab_size = unembedding.shape[-1]
  positions, width = tile
  # bf16 inputs give bf16 matmul operands; float32 accumulates them.
  compute_dtype = jnp.result_type(hidden.dtype, unembedding.dtype)
  hidden_sharding = jax.typeof(hidden).sharding
  labels = jnp.clip(labels, 0, vocab_size - 1).astype(jnp.int32)
  if columns is None:  # invalid traced ids made the digit logits NaN
    g_digits = jnp.where(
        statistics._valid_ids(traced_ids, vocab_size), g_digits, 0.0
    )
    digit_columns = jnp.clip(traced_ids, 0, vocab_size - 1)
  else:
    digit_columns = columns
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
        scale = jnp.where(new_row, scale, 0.0)
        label_scale = jnp.where(new_row, label_scale, 0.0)
        digit_scales = jnp.where(new_row[:, None], digit_scales, 0.0)
      norm = _slice(log_norm, start_t, positions, 1)
      # One elementwise pass: softmax times d log_norm, plus the label's
      # and the ten digits' cotangents in their columns (11 compares per
      # logit, no scatter).
      grad = jnp.exp(logits - norm[..., None]) * scale[..., None]
      grad = grad + jnp.where(
          column == label[..., None], label_scale[..., None], 0.0
      )
      for k in range(numbers.NUM_DIGITS):
        grad = grad + jnp.where(
            column == digit_columns[k] - start_v,
            digit_scales[..., k, None],
            0.0,
        )
      if ragged_columns:
        grad = jnp.where(column >= first - start_v, grad, 0.0)
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
  return d_hidden.astype(hidden.dtype), d_unembedding, None, None


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
    decimal_point_mask=None,
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
    hidden: ``[..., T, D]`` final hidden states (any float dtype; the
      matmuls take the inputs' dtype and accumulate the logits and the
      gradients in float32).
    unembedding: ``[D, V]`` output projection (``logits = hidden @ W``).
    labels: ``[..., T]`` integer ids; ids outside ``[0, V)`` score 0.
    digit_mask: ``[..., T]`` bool, where numbers may be (``None``: all).
    loss_mask: ``[..., T]`` bool, positions to score (``None``: all valid).
    lam: weight of the numeric loss.
    method: ``"ntil"``, ``"emd"``, ``"ntl_mse"``, ``"soft_label"`` or ``"ce"``.
    weighting: ``"sum"`` or ``"reference"`` (see ``numeric_token_loss``).
    digit_token_ids: ``[10]`` digit ids (``None``: 0..9).
    chunk_size: tokens per chunk (a positive int); ``None``:
      :func:`default_chunk_size` (about 4M logits per block on CPU, a
      512 MiB float32 block on GPU and TPU).
    decimal_point_mask: optional ``[..., T]`` bool, true at decimal-point
      labels that join integer and fractional digits into one number (see
      :func:`ntil_jax.numeric_token_loss`).
    **loss_kwargs: keyword arguments of the numeric loss.

  Returns:
    ``[..., T]`` float32 per-token loss; empty if the batch or T is 0.
    Positions not scored score 0 with zero gradient, even where their
    hidden states are NaN or inf.
  """
  hidden = jnp.asarray(hidden)
  unembedding = jnp.asarray(unembedding)
  labels = jnp.asarray(labels)
  masks = tuple(
      (n, None if m is None else jnp.asarray(m))
      for n, m in (
          ("digit_mask", digit_mask),
          ("loss_mask", loss_mask),
          ("decimal_point_mask", decimal_point_mask),
      )
  )
  _check_fused_inputs(hidden, unembedding, labels, digit_token_ids, masks)
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
      mask=base._scored(flat_labels, vocab_size, flat_loss_mask),
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
      decimal_point_mask=flatten_batch(decimal_point_mask),
      **loss_kwargs,
  )
  return per_token.reshape(labels.shape)
