"""CE + numeric loss straight from hidden states, never holding ``[N, V]`` logits.

Every loss in :mod:`ntil_jax.losses` reads the logits only through three small
per-token statistics: the log-normalizer over the vocabulary, the label's
logit and the ten digit logits (:class:`~ntil_jax.TokenStatistics`).
Here they come from ``hidden @ unembedding`` by one of the implementations
of :mod:`ntil_jax.kernels` (the project's chunked loop, tokamax's
kernels, or a per-token CE kernel of the caller's), so the peak holds a
block of the logits at most, never all of them. The number logic runs on the
full ``[B, T, 10]`` digit logits, so numbers that cross chunk boundaries are
handled exactly.
"""

from typing import Optional

import chex
import jax
import jax.numpy as jnp
import numpy as np

from ntil_jax import arrays
from ntil_jax import base
from ntil_jax import kernels
from ntil_jax import losses
from ntil_jax import numbers
from ntil_jax import statistics
from ntil_jax import validation
from ntil_jax.kernels import chunked

# The chunked implementation's block sizes, public here as before.
default_chunk_size = chunked.default_chunk_size
DEFAULT_BLOCK_ELEMENTS = chunked.DEFAULT_BLOCK_ELEMENTS
ACCELERATOR_BLOCK_BYTES = chunked.ACCELERATOR_BLOCK_BYTES


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
    validation.check_logits_dtype(x, name)
  logits_shape = jax.ShapeDtypeStruct(
      hidden.shape[:-1] + unembedding.shape[1:], jnp.float32
  )
  validation.check_inputs(logits_shape, labels, None, digit_token_ids, masks)
  _check_vocabulary_whole(unembedding)


def _check_vocabulary_whole(unembedding) -> None:
  """ValueError where the unembedding's V axis is split over explicit mesh
  axes (vocabulary parallelism): the statistics read whole rows of logits
  (the log-normaliser, the label's and the digits' columns) in each chunk,
  and JAX's sharding rules give their gathers no output sharding there."""
  spec = numbers.sharding_spec(unembedding)
  if spec and spec[-1] is not None:
    raise ValueError(
        f"the unembedding [D, V] is split over the mesh axes {spec[-1]!r} "
        "along V (explicit sharding, spec "
        f"{jax.P(*spec)}); the fused path needs each device to hold whole "
        "vocabulary rows. Replicate V first, e.g. "
        "jax.sharding.reshard(unembedding, jax.P(d, None)) with d the axes "
        "of D, or compute the logits and use numeric_token_loss."
    )


def fused_token_statistics(
    hidden,
    unembedding,
    labels,
    *,
    digit_token_ids=None,
    chunk_size: Optional[int] = None,
    mask=None,
    implementation=None,
) -> statistics.TokenStatistics:
  """:class:`~ntil_jax.TokenStatistics` of ``hidden @ unembedding``.

  With ``"chunked"`` the forward pass computes the logits chunk by chunk
  along the sequence and the gradient is a custom VJP that walks tiles of
  about as many logits, vocabulary columns by token positions: each tile's
  logits are recomputed and turned into their gradient in one elementwise
  pass, cast to the inputs' dtype and multiplied into the hidden states' and
  the unembedding's gradients (float32 accumulation). With a per-token CE
  kernel (``"tokamax"`` or a callable) the log-normaliser is the kernel's CE
  plus the label's logit, and the eleven other columns are small matmuls
  (:mod:`ntil_jax.kernels.from_ce`).

  Args:
    hidden: ``[B, T, D]`` final hidden states.
    unembedding: ``[D, V]`` output projection.
    labels: ``[B, T]`` integer labels.
    digit_token_ids: ``[10]`` digit ids (``None``: 0..9). A
      :class:`~ntil_jax.NumberTokens` scores numbers written in tokens of
      1-3 digits (:mod:`ntil_jax.chunks`).
    chunk_size: tokens per chunk of ``"chunked"`` (``None``:
      :func:`default_chunk_size` for the default backend); a chunk covers
      about ``chunk_size // B`` positions of every row, so the batch axis
      stays whole (and sharded, if it is). The backward tiles hold about
      ``chunk_size * V`` logits each.
    mask: optional ``[B, T]`` bool, the positions whose statistics will be
      used; hidden states elsewhere are replaced by zeros (a ``where`` on the
      ``[B, T, D]`` hidden states), so NaN or inf there gives finite
      statistics and a zero gradient.
    implementation: ``None`` (the backend's default,
      :func:`ntil_jax.kernels.default_implementation`; ``"chunked"``
      when ``chunk_size`` is given), ``"chunked"``, ``"tokamax"``,
      ``"tokamax:<name>"`` (``mosaic_tpu``, ``xla``, ``chunked_xla``) or a
      differentiable ``(hidden [N, D], labels [N], unembedding [D, V]) ->
      CE [N]`` (labels given in ``[0, V)``) that returns one floating-point
      array.

  Returns:
    TokenStatistics with ``[B, T]`` / ``[B, T, 10]`` float32 fields.

  Raises:
    ValueError: for hidden states that are not ``[B, T, D]``, an
      unembedding that is not ``[D, V]`` (with the same ``D``), non-float
      hidden states or unembedding, labels or ``mask`` not ``[B, T]``,
      non-integer labels, digit ids out of ``[0, V)`` (the default ids 0..9
      need ``V >= 10``), a bad ``chunk_size``, an unknown implementation
      or one wrong for ``V`` (``"tokamax:chunked_xla"``), an unembedding
      split along ``V`` over explicit mesh axes, and a callable
      implementation that returns an array of another shape than ``[N]``.
    TypeError: a callable implementation that returns anything but one
      floating-point array (a tuple, integers).
    ImportError: for ``"tokamax"`` where tokamax is not installed.

  Example:
    >>> import jax, jax.numpy as jnp
    >>> from ntil_jax import token_statistics
    >>> hidden = jax.random.normal(jax.random.key(0), (1, 5, 8))
    >>> unembedding = jax.random.normal(jax.random.key(1), (8, 16))
    >>> labels = jnp.array([[3, 1, 4, 12, 9]])
    >>> fused = fused_token_statistics(hidden, unembedding, labels, chunk_size=2)
    >>> plain = token_statistics(hidden @ unembedding, labels)
    >>> all(bool(jnp.allclose(f, p, atol=1e-5)) for f, p in zip(fused, plain))
    True
  """
  _check_chunk_size(chunk_size)
  kernels.check(implementation, chunk_size)
  hidden = jnp.asarray(hidden)
  unembedding = jnp.asarray(unembedding)
  labels = numbers.label_array(labels)
  if hidden.ndim != 3:
    raise ValueError(
        f"hidden must be [B, T, D] (rank 3), got shape {hidden.shape}."
    )
  mask = None if mask is None else jnp.asarray(mask)
  _check_fused_inputs(
      hidden, unembedding, labels, digit_token_ids, (("mask", mask),)
  )
  kernels.check(implementation, chunk_size, vocab_size=unembedding.shape[-1])
  labels, mask = numbers.reshard_like(hidden, labels, mask)
  if mask is not None:
    hidden = arrays.where(jnp.asarray(mask, bool)[..., None], hidden, 0)
  hidden, unembedding = _vary_alike(hidden, unembedding)
  unembedding = _on_mesh_of(hidden, unembedding)
  columns, traced_ids = statistics.digit_column_ids(
      digit_token_ids, unembedding.shape[-1]
  )
  stats_fn = kernels.select(implementation, chunk_size)
  return stats_fn(hidden, unembedding, labels, columns, traced_ids)


def _on_mesh_of(hidden, unembedding):
  """The unembedding replicated over the hidden states' mesh, if on none.

  A constant ``W`` (no mesh) beside explicitly sharded hidden states leaves
  the gradient's ``[D, V]`` contraction over the sharded batch without an
  output sharding; sharded or replicated on the mesh already, it stays.
  """
  mesh = jax.typeof(hidden).sharding.mesh
  if not mesh.axis_names or jax.typeof(unembedding).sharding.mesh.axis_names:
    return unembedding
  spec = jax.P(*([None] * unembedding.ndim))
  return jax.sharding.reshard(
      unembedding, jax.typeof(hidden).sharding.update(spec=spec)
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
    implementation=None,
    axis_name=None,
    sequence_axis=None,
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
    labels: ``[..., T]`` integer ids, as in
      :func:`ntil_jax.numeric_token_loss`: negative ids are ignored, an id
      ``>= V`` where ``loss_mask`` is true is refused when concrete.
    digit_mask: ``[..., T]`` bool (or integer; float refused), where
      numbers may be (``None``: all).
    loss_mask: ``[..., T]`` bool (or integer; float refused), positions to
      score (``None``: all valid).
    lam: weight of the numeric loss.
    method: ``"ntil"``, ``"emd"``, ``"ntl_mse"``, ``"soft_label"``,
      ``"del"``, ``"smmd"``, ``"nl_ntl"`` or ``"ce"``.
    weighting: ``"sum"``, ``"reference"`` or ``"authors"`` (see
      ``numeric_token_loss``).
    digit_token_ids: ``[10]`` digit ids (``None``: 0..9). A
      :class:`~ntil_jax.NumberTokens` scores numbers written in tokens of
      1-3 digits (:mod:`ntil_jax.chunks`).
    chunk_size: tokens per chunk (a positive int); ``None``:
      :func:`default_chunk_size` (about 4M logits per block on CPU, a
      512 MiB float32 block on GPU and TPU).
    decimal_point_mask: optional ``[..., T]`` bool, true at decimal-point
      labels that join integer and fractional digits into one number (see
      :func:`ntil_jax.numeric_token_loss`).
    implementation: how the vocabulary-wide statistics are computed: see
      :func:`fused_token_statistics` (``None``: the backend's default).
    axis_name: inside ``jax.shard_map``, the mesh axes the batch is split
      over, for ``weighting="reference"`` and ``"authors"`` (see
      :func:`ntil_jax.numeric_token_loss`).
    sequence_axis: inside ``jax.shard_map``, the mesh axes T is split over
      (see :func:`ntil_jax.numeric_token_loss`): the number logic's
      ``[..., T]`` and ``[..., T, 10]`` statistics are gathered over them,
      never the hidden states or logits.
    **loss_kwargs: keyword arguments of the numeric loss.

  Returns:
    ``[..., T]`` float32 per-token loss; empty if the batch or T is 0.
    Positions not scored score 0 with zero gradient, even where their
    hidden states are NaN or inf.

  Example:
    The loss of ``hidden @ unembedding``, in chunks of 2 tokens:

    >>> import jax, jax.numpy as jnp
    >>> from ntil_jax import numeric_token_loss
    >>> hidden = jax.random.normal(jax.random.key(0), (1, 5, 8))
    >>> unembedding = jax.random.normal(jax.random.key(1), (8, 16))
    >>> labels = jnp.array([[3, 1, 4, 12, 9]])
    >>> fused = fused_numeric_loss(hidden, unembedding, labels, chunk_size=2)
    >>> plain = numeric_token_loss(hidden @ unembedding, labels)
    >>> bool(jnp.allclose(fused, plain, rtol=1e-5, atol=1e-5))
    True
  """
  hidden = jnp.asarray(hidden)
  unembedding = jnp.asarray(unembedding)
  labels = numbers.label_array(labels)
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
  kernels.check(implementation, chunk_size, vocab_size=unembedding.shape[-1])

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
      mask=base.scored(flat_labels, vocab_size, flat_loss_mask),
      implementation=implementation,
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
      axis_name=axis_name,
      sequence_axis=sequence_axis,
      **loss_kwargs,
  )
  return per_token.reshape(labels.shape)
