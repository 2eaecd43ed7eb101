"""The decoder's layers: parameters annotated with their mesh partition,
rotary position embedding, RMSNorm, causal self-attention with its KV cache,
SwiGLU and the pre-norm block that `train.models.Transformer` stacks."""

import math
from typing import NamedTuple, TYPE_CHECKING

from flax import nnx
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

if TYPE_CHECKING:
  from train import models  # pylint: disable=g-bad-import-order

# Mesh axis the parameters are sharded over (FSDP); the batch splits on it too.
FSDP_AXIS = "fsdp"
ROPE_BASE = 10_000.0


# ----------------------------------------------------------------------------
# Parameters and sharding.


def param(initializer, key, shape, param_dtype, partition) -> nnx.Param:
  """A `nnx.Param` annotated with its mesh partition.

  The value is sharded as it is created when a mesh is set
  (``jax.set_mesh``); without one it stays where it is, annotation kept.
  """
  mesh_is_set = not jax.sharding.get_abstract_mesh().empty
  return nnx.Param(
      initializer(key, shape, param_dtype),
      out_sharding=partition,
      eager_sharding=None if mesh_is_set else False,
  )


def gathered(weight: jax.Array) -> jax.Array:
  """The full (replicated) weight, all-gathered if it is sharded explicitly.

  Under an Explicit mesh a matmul between a batch-sharded activation and a
  weight sharded on the same axis is ambiguous, so FSDP gathers the weight
  first (its gradient becomes a reduce-scatter). Elsewhere this is identity.
  """
  sharding = jax.typeof(weight).sharding
  mesh = getattr(sharding, "mesh", None)
  if mesh is None or mesh.empty:
    return weight
  if jax.sharding.AxisType.Explicit not in mesh.axis_types:
    return weight
  if all(axis is None for axis in sharding.spec):
    return weight
  return jax.sharding.reshard(
      weight, jax.sharding.NamedSharding(mesh, PartitionSpec())
  )


def kernel_init(in_axis, out_axis):
  """Fan-in scaled truncated normal for a kernel with grouped axes."""
  return nnx.initializers.variance_scaling(
      1.0, "fan_in", "truncated_normal", in_axis=in_axis, out_axis=out_axis
  )


# ----------------------------------------------------------------------------
# Rotary position embedding.


def apply_rope(
    x: jax.Array, positions: jax.Array, base: float = ROPE_BASE
) -> jax.Array:
  """Rotates pairs of features of ``x`` by position-dependent angles (RoPE).

  Feature ``i`` and ``i + K/2`` form a pair rotated by the angle
  ``positions * base ** (-2i / K)``:

  .. math::
    (x_i, x_{i+K/2}) \\mapsto (x_i \\cos\\theta - x_{i+K/2} \\sin\\theta,\\;
                              x_{i+K/2} \\cos\\theta + x_i \\sin\\theta)

  so the dot product of a rotated query and key depends on their positions
  only through their difference (Su et al., "RoFormer", arXiv:2104.09864).

  Args:
    x: [B, L, H, K] queries or keys, K even.
    positions: [B, L] integer positions.
    base: the wavelength base.

  Returns:
    [B, L, H, K], dtype of ``x``; computed in float32.
  """
  if x.ndim != 4 or x.shape[-1] % 2:
    raise ValueError(f"x must be [B, L, H, K] with K even, got {x.shape}.")
  if positions.shape != x.shape[:2]:
    raise ValueError(
        f"positions shape {positions.shape} must be x's [B, L] {x.shape[:2]}."
    )
  half = x.shape[-1] // 2
  inverse_wavelengths = base ** (-jnp.arange(half, dtype=jnp.float32) / half)
  angles = positions.astype(jnp.float32)[..., None] * inverse_wavelengths
  sin = jnp.sin(angles)[:, :, None, :]  # [B, L, 1, K/2], shared by heads
  cos = jnp.cos(angles)[:, :, None, :]
  first, second = jnp.split(x.astype(jnp.float32), 2, axis=-1)
  rotated = jnp.concatenate(
      [first * cos - second * sin, second * cos + first * sin], axis=-1
  )
  return rotated.astype(x.dtype)


# ----------------------------------------------------------------------------
# Layers.


class RMSNorm(nnx.Module):
  """Root-mean-square layer norm with a learned scale, computed in float32."""

  def __init__(
      self, dim: int, *, param_dtype, rngs: nnx.Rngs, epsilon: float = 1e-6
  ):
    self.scale = param(
        nnx.initializers.ones, rngs.params(), (dim,), param_dtype, (None,)
    )
    self.epsilon = epsilon

  def __call__(self, x: jax.Array) -> jax.Array:
    """[..., D] -> float32 [..., D]."""
    x = x.astype(jnp.float32)
    mean_square = jnp.mean(jnp.square(x), axis=-1, keepdims=True)
    return (
        x
        * jax.lax.rsqrt(mean_square + self.epsilon)
        * gathered(self.scale[...].astype(jnp.float32))
    )


class LayerCache(NamedTuple):
  """One layer's attention keys and values for a [B, T] token buffer."""

  keys: jax.Array  # [B, T, H, K], rotated (RoPE), compute dtype
  values: jax.Array  # [B, T, H, K]


def _write_at(
    buffer: jax.Array, update: jax.Array, positions: jax.Array
) -> jax.Array:
  """Writes ``update[b, s]`` into ``buffer[b, positions[b, s]]``.

  ``buffer`` is [B, T, ...], ``update`` [B, S, ...], ``positions`` int [B, S]
  (distinct within a row). A one-hot contraction rather than a scatter, so
  that batch-sharded operands need no collectives; it is exact.
  """
  slots = positions[:, :, None] == jnp.arange(buffer.shape[1])  # [B, S, T]
  written = jnp.einsum("bst,bs...->bt...", slots.astype(update.dtype), update)
  is_written = jnp.any(slots, axis=1)  # [B, T]
  is_written = is_written.reshape(is_written.shape + (1,) * (buffer.ndim - 2))
  return jnp.where(is_written, written, buffer)


class CausalSelfAttention(nnx.Module):
  """Multi-head causal self-attention with rotary positions."""

  def __init__(self, config: "models.ModelConfig", *, rngs: nnx.Rngs):
    d, h, k = config.embed_dim, config.num_heads, config.head_dim
    in_init = kernel_init(in_axis=0, out_axis=(1, 2))
    # [D, H, K] and [H, K, D]: shard D, the largest dim (H, K <= D).
    self.query = param(
        in_init,
        rngs.params(),
        (d, h, k),
        config.param_dtype,
        (FSDP_AXIS, None, None),
    )
    self.key = param(
        in_init,
        rngs.params(),
        (d, h, k),
        config.param_dtype,
        (FSDP_AXIS, None, None),
    )
    self.value = param(
        in_init,
        rngs.params(),
        (d, h, k),
        config.param_dtype,
        (FSDP_AXIS, None, None),
    )
    self.output = param(
        kernel_init(in_axis=(0, 1), out_axis=2),
        rngs.params(),
        (h, k, d),
        config.param_dtype,
        (None, None, FSDP_AXIS),
    )
    self.dtype = config.dtype

  def _project(self, weight, x):
    return jnp.einsum(
        "bld,dhk->blhk",
        x.astype(self.dtype),
        gathered(weight[...]).astype(self.dtype),
    )

  def __call__(
      self, x: jax.Array, positions: jax.Array, cache: LayerCache | None = None
  ) -> tuple[jax.Array, LayerCache]:
    """Attends from ``x`` to itself, or to ``cache`` updated with ``x``.

    Args:
      x: [B, S, D] activations.
      positions: [B, S] their positions.
      cache: None to attend causally within ``x``; or the keys and values of
        a [B, T] buffer, into which ``x``'s are written at ``positions``
        before attending to every slot at or before each query's position.

    Returns:
      [B, S, D] (compute dtype) and the keys and values attended to.
    """
    query = apply_rope(self._project(self.query, x), positions)
    key = apply_rope(self._project(self.key, x), positions)
    value = self._project(self.value, x)
    if cache is None:
      keys, values, key_positions = key, value, positions
    else:
      keys = _write_at(cache.keys, key, positions)
      values = _write_at(cache.values, value, positions)
      key_positions = jnp.arange(keys.shape[1], dtype=jnp.int32)[None, :]
    scores = jnp.einsum(
        "bqhk,bshk->bhqs", query, keys, preferred_element_type=jnp.float32
    )
    scores = scores / math.sqrt(query.shape[-1])
    visible = key_positions[:, None, :] <= positions[:, :, None]  # [B, S, T]
    scores = jnp.where(visible[:, None], scores, jnp.finfo(jnp.float32).min)
    weights = jax.nn.softmax(scores, axis=-1)
    attended = jnp.einsum("bhqs,bshk->bqhk", weights.astype(self.dtype), values)
    output = jnp.einsum(
        "blhk,hkd->bld",
        attended,
        gathered(self.output[...]).astype(self.dtype),
    )
    return output, LayerCache(keys, values)


class SwiGLU(nnx.Module):
  """Gated MLP: ``down(silu(x @ gate) * (x @ up))`` (Shazeer, 2020)."""

  def __init__(self, config: "models.ModelConfig", *, rngs: nnx.Rngs):
    d, f = config.embed_dim, config.mlp_dim
    self.gate = param(
        kernel_init(0, 1),
        rngs.params(),
        (d, f),
        config.param_dtype,
        (None, FSDP_AXIS),
    )
    self.up = param(
        kernel_init(0, 1),
        rngs.params(),
        (d, f),
        config.param_dtype,
        (None, FSDP_AXIS),
    )
    self.down = param(
        kernel_init(0, 1),
        rngs.params(),
        (f, d),
        config.param_dtype,
        (FSDP_AXIS, None),
    )
    self.dtype = config.dtype

  def __call__(self, x: jax.Array) -> jax.Array:
    """[B, L, D] -> [B, L, D] (compute dtype)."""
    x = x.astype(self.dtype)
    gate = x @ gathered(self.gate[...]).astype(self.dtype)
    up = x @ gathered(self.up[...]).astype(self.dtype)
    return (jax.nn.silu(gate) * up) @ gathered(self.down[...]).astype(
        self.dtype
    )


class Block(nnx.Module):
  """Pre-norm transformer block: attention then MLP, each residual."""

  def __init__(self, config: "models.ModelConfig", *, rngs: nnx.Rngs):
    self.attention_norm = RMSNorm(
        config.embed_dim, param_dtype=config.param_dtype, rngs=rngs
    )
    self.attention = CausalSelfAttention(config, rngs=rngs)
    self.mlp_norm = RMSNorm(
        config.embed_dim, param_dtype=config.param_dtype, rngs=rngs
    )
    self.mlp = SwiGLU(config, rngs=rngs)
    # Without dropout, no RNG state is stored in the model.
    dropout_rngs = rngs if config.dropout_rate > 0 else None
    self.dropout = nnx.Dropout(config.dropout_rate, rngs=dropout_rngs)

  def __call__(
      self, x: jax.Array, positions: jax.Array, cache: LayerCache | None = None
  ) -> tuple[jax.Array, LayerCache]:
    """float32 [B, S, D] residual stream -> float32 [B, S, D], and the cache.

    See `CausalSelfAttention` for ``positions`` and ``cache``.
    """
    attended, cache = self.attention(self.attention_norm(x), positions, cache)
    x = x + self.dropout(attended)
    return x + self.dropout(self.mlp(self.mlp_norm(x))), cache
