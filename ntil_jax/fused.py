"""CE + numeric loss straight from hidden states, never holding ``[N, V]`` logits.

Every loss in :mod:`ntil_jax.losses` reads the logits only through three small
per-token statistics: the log-normalizer over the vocabulary, the label's
logit and the ten digit logits (:class:`~ntil_jax.losses.TokenStatistics`).
Here those are computed chunk by chunk along the sequence from
``hidden @ unembedding``; each chunk is rematerialized in the backward pass
(``jax.checkpoint`` inside ``lax.scan``), so the peak holds one block of
about ``chunk_size`` tokens by ``V`` instead of the whole ``[B, T, V]``.
The number logic then runs on the full ``[B, T, 10]`` digit logits, so numbers that cross
chunk boundaries are handled exactly.
"""

import functools
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

  Args:
    hidden: ``[B, T, D]`` final hidden states.
    unembedding: ``[D, V]`` output projection.
    labels: ``[B, T]`` integer labels.
    digit_token_ids: ``[10]`` digit ids (``None``: 0..9).
    chunk_size: tokens per chunk (``None``: :func:`default_chunk_size`); a
      chunk covers ``max(1, chunk_size // B)`` positions of every row, so
      the batch axis stays whole (and sharded, if it is).
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
  if chunk_size is None:
    chunk_size = default_chunk_size(unembedding.shape[-1])
  positions = max(1, min(chunk_size // batch, length))
  num_chunks = -(-length // positions)
  padded = num_chunks * positions
  if padded != length:
    hidden = jnp.pad(hidden, ((0, 0), (0, padded - length), (0, 0)))
    labels = jnp.pad(labels, ((0, 0), (0, padded - length)))

  def to_chunks(x):  # [B, T, ...] -> [num_chunks, B, chunk, ...]
    x = x.reshape((batch, num_chunks, positions) + x.shape[2:])
    return jnp.moveaxis(x, 1, 0)

  body = jax.checkpoint(
      functools.partial(
          _chunk_statistics,
          unembedding=unembedding,
          digit_token_ids=digit_token_ids,
      )
  )
  stats = jax.lax.map(
      lambda xs: body(*xs), (to_chunks(hidden), to_chunks(labels))
  )

  def from_chunks(x):  # [num_chunks, B, chunk, ...] -> [B, T, ...]
    x = jnp.moveaxis(x, 0, 1)
    return x.reshape((batch, padded) + x.shape[3:])[:, :length]

  return jax.tree.map(from_chunks, stats)


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
  block of about ``chunk_size`` tokens by ``V`` (a few copies of it in the
  backward pass) besides the ``[D, V]`` gradient.

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
