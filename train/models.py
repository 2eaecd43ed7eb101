"""A decoder-only transformer in Flax NNX for character-level arithmetic.

The model is a stack of pre-norm blocks::

  x = embedding[tokens]
  for each block:
    x = x + Attention(RMSNorm(x))    # causal, rotary position embedding
    x = x + SwiGLU(RMSNorm(x))
  hidden = RMSNorm(x)                # `Transformer.hidden_states`, float32
  logits = hidden @ unembedding      # untied [embed_dim, vocab_size], float32

Decoding (`greedy_decode`) uses a KV cache: `Transformer.prefill` then one
`Transformer.extend` per generated token.

Sharding: every weight carries an ``out_sharding`` annotation naming the mesh
axis ``'fsdp'`` on one dimension (``None`` elsewhere), FSDP style: its largest
one, except that the [V, D] embeddings shard D (V is small and odd-sized);
norm scales are replicated. The batch is expected on ``('data', 'fsdp')``.
`create_model` with a mesh builds the model inside ``nnx.jit`` under
``jax.set_mesh(mesh)``, so each parameter is created directly with its
``NamedSharding`` (Flax's eager sharding). Under an Explicit mesh the weights
are all-gathered (``jax.sharding.reshard``) right before use; under an Auto
mesh XLA's partitioner decides.

Example::

  >>> config = model_config("tiny", vocab_size=99, max_len=64)
  >>> model = create_model(config, nnx.Rngs(0))
  >>> logits = model(jnp.zeros((2, 16), jnp.int32))   # float32 [2, 16, 99]
"""

import dataclasses
import functools
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import PartitionSpec

# Mesh axis the parameters are sharded over (FSDP); the batch splits on it too.
FSDP_AXIS = "fsdp"
ROPE_BASE = 10_000.0


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Shape and precision of a `Transformer`.

  Attributes:
    vocab_size: number of token ids V.
    num_layers: number of transformer blocks.
    num_heads: attention heads H.
    head_dim: size K of each head's queries, keys and values (even, for RoPE).
    embed_dim: residual stream width D.
    mlp_dim: hidden width F of the SwiGLU MLP.
    max_len: longest sequence the model is meant for (checked in `__call__`).
    dtype: compute dtype of the matmuls (softmax, norms and logits are float32).
    param_dtype: storage dtype of the parameters.
    dropout_rate: dropout on each residual branch while `model.train()`.
    image_size: side S of square images given as a prefix (0: a text-only
      model). The image encoder turns each image into ``num_image_tokens``
      tokens that precede the text tokens.
    image_channels: the encoder's hidden widths: for ``'conv'``, channels of
      its hidden conv layers (each conv, and the last to ``embed_dim``,
      halves the image side); for ``'patch'``, hidden layers of the MLP
      applied to each patch (``()``: one linear map).
    image_encoder: ``'conv'`` (`ImageEncoder`: stride-2 convs) or
      ``'patch'`` (`PatchEncoder`: one token per patch, with coordinates).
    pixel_channels: channels C of each pixel: 1 for grayscale images
      [B, S, S]; more (e.g. 3 for RGB) for images [B, S, S, C].
    patch_size: side P of the `PatchEncoder`'s patches (P divides S).
  """

  vocab_size: int
  num_layers: int
  num_heads: int
  head_dim: int
  embed_dim: int
  mlp_dim: int
  max_len: int
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32
  dropout_rate: float = 0.0
  image_size: int = 0
  image_channels: tuple[int, ...] = (16, 32, 64)
  image_encoder: str = "conv"
  pixel_channels: int = 1
  patch_size: int = 12

  @property
  def num_image_tokens(self) -> int:
    """K, the image tokens before the text (0 for a text-only model)."""
    return num_image_tokens(
        self.image_size,
        self.image_channels,
        image_encoder=self.image_encoder,
        patch_size=self.patch_size,
    )

  @property
  def image_shape(self) -> tuple[int, ...]:
    """One image's shape: (S, S) for grayscale, (S, S, C) otherwise."""
    side = (self.image_size, self.image_size)
    return side if self.pixel_channels == 1 else (*side, self.pixel_channels)

  def __post_init__(self):
    for name in (
        "vocab_size",
        "num_layers",
        "num_heads",
        "head_dim",
        "embed_dim",
        "mlp_dim",
        "max_len",
    ):
      value = getattr(self, name)
      if not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}.")
    if self.head_dim % 2:
      raise ValueError(
          f"head_dim must be even for rotary embeddings, got {self.head_dim}."
      )
    if self.image_size < 0 or any(c < 1 for c in self.image_channels):
      raise ValueError(
          f"image_size must be >= 0 and image_channels positive, got "
          f"{self.image_size} and {self.image_channels}."
      )
    if not 0.0 <= self.dropout_rate < 1.0:
      raise ValueError(
          f"dropout_rate must be in [0, 1), got {self.dropout_rate}."
      )
    if self.image_encoder not in IMAGE_ENCODERS:
      raise ValueError(
          f"image_encoder must be one of {IMAGE_ENCODERS}, got "
          f"{self.image_encoder!r}."
      )
    if self.pixel_channels < 1:
      raise ValueError(
          f"pixel_channels must be >= 1, got {self.pixel_channels}."
      )
    if self.image_encoder == "patch" and (
        self.patch_size < 1 or self.image_size % self.patch_size
    ):
      raise ValueError(
          f"patch_size must divide image_size, got {self.patch_size} and "
          f"{self.image_size}."
      )


IMAGE_ENCODERS = ("conv", "patch")


def num_image_tokens(
    image_size: int,
    image_channels,
    *,
    image_encoder: str = "conv",
    patch_size: int = 12,
) -> int:
  """K, the image tokens of an image of side ``image_size``.

  `ImageEncoder` ('conv'): the side halved by each of its convs, squared;
  `PatchEncoder` ('patch'): ``(image_size / patch_size) ** 2``.
  """
  if not image_size:
    return 0
  if image_encoder == "patch":
    return (image_size // patch_size) ** 2
  return (-(-image_size // 2 ** (len(image_channels) + 1))) ** 2


# Parameter counts are for vocab_size=99 (train/tokenizer.py); see docs/trainer.md.
MODEL_SIZES: dict[str, dict] = {
    # ~0.1M: unit tests.
    "tiny": dict(
        num_layers=2, num_heads=4, head_dim=16, embed_dim=64, mlp_dim=192
    ),
    # ~1.8M: CPU experiments.
    "small": dict(
        num_layers=4, num_heads=6, head_dim=32, embed_dim=192, mlp_dim=512
    ),
    # ~26M: one accelerator.
    "base": dict(
        num_layers=8, num_heads=8, head_dim=64, embed_dim=512, mlp_dim=1408
    ),
    # ~99M: accelerators.
    "large": dict(
        num_layers=12, num_heads=12, head_dim=64, embed_dim=768, mlp_dim=2560
    ),
}


def model_config(
    size: str, vocab_size: int, max_len: int, **overrides: Any
) -> ModelConfig:
  """Returns the `ModelConfig` of a named size, with fields overridden.

  Args:
    size: a key of `MODEL_SIZES`: 'tiny', 'small', 'base' or 'large'.
    vocab_size: number of token ids.
    max_len: longest sequence the model is meant for.
    **overrides: any other `ModelConfig` field, e.g. ``dtype=jnp.bfloat16``.

  Raises:
    ValueError: on an unknown size or an unknown field.
  """
  if size not in MODEL_SIZES:
    raise ValueError(
        f"unknown model size {size!r}; valid sizes: {sorted(MODEL_SIZES)}."
    )
  field_names = {f.name for f in dataclasses.fields(ModelConfig)}
  unknown = sorted(set(overrides) - field_names)
  if unknown:
    raise ValueError(
        f"unknown ModelConfig fields {unknown}; valid: {sorted(field_names)}."
    )
  fields = dict(MODEL_SIZES[size], vocab_size=vocab_size, max_len=max_len)
  fields.update(overrides)
  return ModelConfig(**fields)


# ----------------------------------------------------------------------------
# Parameters and sharding.


def _param(initializer, key, shape, param_dtype, partition) -> nnx.Param:
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


def _gathered(weight: jax.Array) -> jax.Array:
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


def _kernel_init(in_axis, out_axis):
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
    self.scale = _param(
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
        * _gathered(self.scale[...].astype(jnp.float32))
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

  def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
    d, h, k = config.embed_dim, config.num_heads, config.head_dim
    in_init = _kernel_init(in_axis=0, out_axis=(1, 2))
    # [D, H, K] and [H, K, D]: shard D, the largest dim (H, K <= D).
    self.query = _param(
        in_init,
        rngs.params(),
        (d, h, k),
        config.param_dtype,
        (FSDP_AXIS, None, None),
    )
    self.key = _param(
        in_init,
        rngs.params(),
        (d, h, k),
        config.param_dtype,
        (FSDP_AXIS, None, None),
    )
    self.value = _param(
        in_init,
        rngs.params(),
        (d, h, k),
        config.param_dtype,
        (FSDP_AXIS, None, None),
    )
    self.output = _param(
        _kernel_init(in_axis=(0, 1), out_axis=2),
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
        _gathered(weight[...]).astype(self.dtype),
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
        _gathered(self.output[...]).astype(self.dtype),
    )
    return output, LayerCache(keys, values)


class SwiGLU(nnx.Module):
  """Gated MLP: ``down(silu(x @ gate) * (x @ up))`` (Shazeer, 2020)."""

  def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
    d, f = config.embed_dim, config.mlp_dim
    self.gate = _param(
        _kernel_init(0, 1),
        rngs.params(),
        (d, f),
        config.param_dtype,
        (None, FSDP_AXIS),
    )
    self.up = _param(
        _kernel_init(0, 1),
        rngs.params(),
        (d, f),
        config.param_dtype,
        (None, FSDP_AXIS),
    )
    self.down = _param(
        _kernel_init(0, 1),
        rngs.params(),
        (f, d),
        config.param_dtype,
        (FSDP_AXIS, None),
    )
    self.dtype = config.dtype

  def __call__(self, x: jax.Array) -> jax.Array:
    """[B, L, D] -> [B, L, D] (compute dtype)."""
    x = x.astype(self.dtype)
    gate = x @ _gathered(self.gate[...]).astype(self.dtype)
    up = x @ _gathered(self.up[...]).astype(self.dtype)
    return (jax.nn.silu(gate) * up) @ _gathered(self.down[...]).astype(
        self.dtype
    )


class Block(nnx.Module):
  """Pre-norm transformer block: attention then MLP, each residual."""

  def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
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


def _scaled_pixels(images: jax.Array, pixel_channels: int) -> jax.Array:
  """[B, S, S] or [B, S, S, C] pixels in [0, 255] -> float32 [B, S, S, C]."""
  x = images.astype(jnp.float32) / 127.5 - 1.0
  return x[..., None] if pixel_channels == 1 else x


class ImageEncoder(nnx.Module):
  """Images [B, S, S] (or [B, S, S, C]) -> K = (S / 2^n)^2 tokens [B, K, D].

  A stack of 3x3 stride-2 convolutions with GELU (channels
  ``image_channels``, then ``embed_dim``), read out row by row, plus a learned
  embedding per grid cell so each token knows where it sits in the image.
  Pixels are scaled from [0, 255] to [-1, 1].
  """

  def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
    channels = (
        config.pixel_channels,
        *config.image_channels,
        config.embed_dim,
    )
    self.kernels = nnx.List(
        [
            _param(
                _kernel_init(in_axis=(0, 1, 2), out_axis=3),
                rngs.params(),
                (3, 3, c_in, c_out),
                config.param_dtype,
                (None, None, None, FSDP_AXIS),
            )
            for c_in, c_out in zip(channels[:-1], channels[1:])
        ]
    )
    self.biases = nnx.List(
        [
            _param(
                nnx.initializers.zeros,
                rngs.params(),
                (c,),
                config.param_dtype,
                (None,),
            )
            for c in channels[1:]
        ]
    )
    self.grid_embedding = _param(
        nnx.initializers.normal(0.02),
        rngs.params(),
        (config.num_image_tokens, config.embed_dim),
        config.param_dtype,
        (None, FSDP_AXIS),
    )
    self.dtype = config.dtype
    self.pixel_channels = config.pixel_channels

  def __call__(self, images: jax.Array) -> jax.Array:
    """uint8 or float pixels in [0, 255] -> float32 [B, K, D]."""
    x = _scaled_pixels(images, self.pixel_channels)
    for index, (kernel, bias) in enumerate(zip(self.kernels, self.biases)):
      x = jax.lax.conv_general_dilated(
          x.astype(self.dtype),
          _gathered(kernel[...]).astype(self.dtype),
          window_strides=(2, 2),
          padding="SAME",
          dimension_numbers=("NHWC", "HWIO", "NHWC"),
          preferred_element_type=jnp.float32,
      )
      x = x + _gathered(bias[...]).astype(jnp.float32)
      if index < len(self.kernels) - 1:
        x = jax.nn.gelu(x)
    tokens = x.reshape(x.shape[0], -1, x.shape[-1])
    return tokens + _gathered(self.grid_embedding[...]).astype(jnp.float32)


class PatchEncoder(nnx.Module):
  """Images [B, S, S] (or [B, S, S, C]) -> K = (S / P)^2 tokens [B, K, D].

  Pixels are scaled from [0, 255] to [-1, 1] and given two more channels,
  their x and y coordinates in the image, also in [-1, 1]. Each P x P patch
  (``patch_size``; patches read row by row) of ``P * P * (C + 2)`` values is
  mapped to D by an MLP (hidden widths ``image_channels``, GELU; ``()`` is
  one linear map), plus a learned embedding per patch. The first layer is a
  [P, P, C + 2, W] kernel applied with stride P.

  Localising an object to the pixel needs its edges where they are: a
  patch's features see every pixel at its position in the patch, and the
  coordinate channels tell the token where in the image the patch is.
  """

  def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
    self.patch_size = p = config.patch_size
    self.pixel_channels = config.pixel_channels
    widths = (None, *config.image_channels, config.embed_dim)
    self.kernels = nnx.List(
        [
            _param(
                _kernel_init(in_axis=tuple(range(len(shape) - 1)), out_axis=-1),
                rngs.params(),
                shape,
                config.param_dtype,
                (None,) * (len(shape) - 1) + (FSDP_AXIS,),
            )
            for shape in (  # [P, P, C + 2, W], then [W, W'] per layer
                (p, p, config.pixel_channels + 2, widths[1]),
                *zip(widths[1:-1], widths[2:]),
            )
        ]
    )
    self.biases = nnx.List(
        [
            _param(
                nnx.initializers.zeros,
                rngs.params(),
                (w,),
                config.param_dtype,
                (None,),
            )
            for w in widths[1:]
        ]
    )
    self.patch_embedding = _param(
        nnx.initializers.normal(0.02),
        rngs.params(),
        (config.num_image_tokens, config.embed_dim),
        config.param_dtype,
        (None, FSDP_AXIS),
    )
    self.dtype = config.dtype

  def _embed_patches(self, x: jax.Array, kernel: jax.Array) -> jax.Array:
    """[B, S, S, C] by a [P, P, C, W] kernel -> [B, K, W]: a P-strided conv."""
    x = jax.lax.conv_general_dilated(
        x.astype(self.dtype),
        kernel,
        window_strides=(self.patch_size, self.patch_size),
        padding="VALID",
        dimension_numbers=("NHWC", "HWIO", "NHWC"),
        preferred_element_type=jnp.float32,
    )
    return x.reshape(x.shape[0], -1, x.shape[-1])

  def __call__(self, images: jax.Array) -> jax.Array:
    """uint8 or float pixels in [0, 255] -> float32 [B, K, D]."""
    pixels = _scaled_pixels(images, self.pixel_channels)
    size, channels = images.shape[1], self.pixel_channels
    coordinates = jnp.linspace(-1.0, 1.0, size, dtype=jnp.float32)
    x_channel = jnp.broadcast_to(coordinates[None, :], (size, size))
    grid = jnp.stack([x_channel, x_channel.T], axis=-1)[None]  # x, y
    # The first layer is linear, so the coordinate channels' part of it is
    # the same for every image: [K, W], added to the pixels' part [B, K, W]
    # (rather than concatenated to a batch-sharded input).
    first = _gathered(self.kernels[0][...]).astype(self.dtype)
    x = self._embed_patches(pixels, first[:, :, :channels])
    x = x + self._embed_patches(grid, first[:, :, channels:])[0]
    for index, (kernel, bias) in enumerate(zip(self.kernels, self.biases)):
      if index:
        x = jnp.einsum(
            "bkf,fw->bkw",
            x.astype(self.dtype),
            _gathered(kernel[...]).astype(self.dtype),
            preferred_element_type=jnp.float32,
        )
      x = x + _gathered(bias[...]).astype(jnp.float32)
      if index < len(self.kernels) - 1:
        x = jax.nn.gelu(x)
    return x + _gathered(self.patch_embedding[...]).astype(jnp.float32)


class Transformer(nnx.Module):
  """Decoder-only transformer: tokens [B, L] -> logits [B, L, V].

  With ``config.image_size`` set, every call also takes ``images`` [B, S, S]
  (or [B, S, S, C]): their encoder's tokens (`ImageEncoder` or
  `PatchEncoder`) occupy positions 0..K-1 and the text positions
  K.., so the text attends to the image. Outputs (hidden states, logits)
  cover the text positions only, and ``positions`` given to `extend` count
  text tokens, as without an image.

  Right padding needs no mask: the causal mask keeps padding from reaching
  the positions before it.
  """

  def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
    self.config = config
    v, d = config.vocab_size, config.embed_dim
    self.embedding = _param(
        nnx.initializers.normal(1.0),
        rngs.params(),
        (v, d),
        config.param_dtype,
        (None, FSDP_AXIS),
    )
    encoder = PatchEncoder if config.image_encoder == "patch" else ImageEncoder
    self.image_encoder = (
        encoder(config, rngs=rngs) if config.image_size else None
    )
    self.blocks = nnx.List(
        [Block(config, rngs=rngs) for _ in range(config.num_layers)]
    )
    self.final_norm = RMSNorm(d, param_dtype=config.param_dtype, rngs=rngs)
    self.unembed = _param(
        _kernel_init(0, 1),
        rngs.params(),
        (d, v),
        config.param_dtype,
        (FSDP_AXIS, None),
    )

  @property
  def unembedding(self) -> jax.Array:
    """The [D, V] unembedding matrix (gathered if sharded explicitly)."""
    return _gathered(self.unembed[...])

  def hidden_states(
      self, tokens: jax.Array, images: jax.Array | None = None
  ) -> jax.Array:
    """Final-normed hidden states, float32 [B, L, D], for int [B, L] tokens.

    ``hidden_states(tokens, images) @ unembedding`` equals
    ``self(tokens, images)``.
    """
    return self.prefill(tokens, images)[0]

  def prefill(
      self, tokens: jax.Array, images: jax.Array | None = None
  ) -> tuple[jax.Array, tuple[LayerCache, ...]]:
    """Hidden states of a [B, T] token buffer, and every layer's cache.

    Returns:
      float32 [B, T, D] hidden states (as `hidden_states`) and one
      `LayerCache` per layer (over the K image and T text slots), for
      `extend` to continue from.
    """
    self._check_tokens(tokens)
    num_prefix = self.config.num_image_tokens
    if (images is None) != (self.image_encoder is None):
      raise ValueError(
          "images are required by a model with image_size="
          f"{self.config.image_size} and refused by a text-only one; got "
          f"{'none' if images is None else 'images'}."
      )
    prefix = None
    if images is not None:
      expected = (tokens.shape[0], *self.config.image_shape)
      if images.shape != expected:
        raise ValueError(
            f"images must be [B, {', '.join(map(str, expected[1:]))}] with "
            f"B = {tokens.shape[0]}, got {images.shape}."
        )
      prefix = self.image_encoder(images)
    positions = jnp.broadcast_to(
        jnp.arange(num_prefix, num_prefix + tokens.shape[1], dtype=jnp.int32),
        tokens.shape,
    )
    return self._run(tokens, positions, [None] * len(self.blocks), prefix)

  def extend(
      self,
      tokens: jax.Array,
      positions: jax.Array,
      cache: tuple[LayerCache, ...],
  ) -> tuple[jax.Array, tuple[LayerCache, ...]]:
    """Hidden states of new tokens at given positions of a cached buffer.

    Equals the rows ``positions`` of `hidden_states` of the whole buffer,
    provided every slot before them was filled (by `prefill` or `extend`).

    Args:
      tokens: int [B, S] new tokens.
      positions: int [B, S] their text positions in the [B, T] buffer, < T.
      cache: the caches returned by `prefill` or `extend`.

    Returns:
      float32 [B, S, D] hidden states and the updated caches.
    """
    self._check_tokens(tokens)
    if positions.shape != tokens.shape:
      raise ValueError(
          f"positions shape {positions.shape} must equal tokens "
          f"shape {tokens.shape}."
      )
    if len(cache) != len(self.blocks):
      raise ValueError(
          f"cache has {len(cache)} layers, the model " f"{len(self.blocks)}."
      )
    return self._run(
        tokens,
        positions.astype(jnp.int32) + self.config.num_image_tokens,
        cache,
    )

  def _check_tokens(self, tokens: jax.Array) -> None:
    if tokens.ndim != 2:
      raise ValueError(f"tokens must be [B, L], got shape {tokens.shape}.")
    length = tokens.shape[1] + self.config.num_image_tokens
    if length > self.config.max_len:
      raise ValueError(
          f"sequence length {length} (with {self.config.num_image_tokens} "
          f"image tokens) exceeds max_len {self.config.max_len}."
      )
    if not jnp.issubdtype(tokens.dtype, jnp.integer):
      raise ValueError(f"tokens must be integer ids, got {tokens.dtype}.")

  def _run(self, tokens, positions, caches, prefix=None):
    """Embeds, runs the blocks (each with its cache or None), final norm.

    ``prefix`` (float32 [B, K, D], or None) is placed at positions 0..K-1
    before the tokens; the returned hidden states exclude it.
    """
    # A one-hot matmul rather than a gather: its sharding is unambiguous
    # under an Explicit mesh, and the vocabulary is small (characters).
    one_hot = jax.nn.one_hot(
        tokens, self.config.vocab_size, dtype=self.config.dtype
    )
    x = jnp.einsum(
        "blv,vd->bld",
        one_hot,
        _gathered(self.embedding[...]).astype(self.config.dtype),
    )
    x = x.astype(jnp.float32)
    num_prefix = 0
    if prefix is not None:
      num_prefix = prefix.shape[1]
      prefix_positions = jnp.broadcast_to(
          jnp.arange(num_prefix, dtype=jnp.int32),
          (positions.shape[0], num_prefix),
      )
      x = jnp.concatenate([prefix, x], axis=1)
      positions = jnp.concatenate([prefix_positions, positions], axis=1)
    new_caches = []
    for block, cache in zip(self.blocks, caches):
      x, cache = block(x, positions, cache)
      new_caches.append(cache)
    return self.final_norm(x[:, num_prefix:]), tuple(new_caches)

  def project(self, hidden: jax.Array) -> jax.Array:
    """float32 logits [..., V] of final hidden states [..., D]."""
    return hidden @ self.unembedding.astype(jnp.float32)

  def __call__(
      self, tokens: jax.Array, images: jax.Array | None = None
  ) -> jax.Array:
    """float32 logits [B, L, V] for integer tokens [B, L] (and images)."""
    return self.project(self.hidden_states(tokens, images))


# ----------------------------------------------------------------------------
# Construction, counting, decoding.


def create_model(
    config: ModelConfig, rngs: nnx.Rngs, mesh: jax.sharding.Mesh | None = None
) -> Transformer:
  """Builds a `Transformer`, each parameter sharded over ``mesh`` if given.

  With a mesh (axes ``('data', 'fsdp')``, all Explicit or all Auto) the model
  is built inside ``nnx.jit`` under ``jax.set_mesh(mesh)``: parameters are
  created sharded, never whole on one device. Keep the mesh set
  (``with jax.set_mesh(mesh):``) around code that uses the model.

  Args:
    config: the model shape.
    rngs: parameter initialisation keys (and 'dropout' if dropout_rate > 0).
    mesh: a mesh with an axis named 'fsdp', or None for no sharding.
  """
  if mesh is None:
    return Transformer(config, rngs=rngs)
  if FSDP_AXIS not in mesh.axis_names:
    raise ValueError(
        f"mesh must have an axis named {FSDP_AXIS!r}, got {mesh.axis_names}."
    )
  with jax.set_mesh(mesh):
    return _sharded_init(config, mesh)(rngs)


@functools.lru_cache(maxsize=8)
def _sharded_init(config: ModelConfig, mesh: jax.sharding.Mesh):
  """The compiled initialiser of ``config`` on ``mesh``: rngs -> model.

  One function object per (shape, mesh), so that the runs of a grid (seeds
  differ only in the rngs, an argument) reuse its trace and compiled program
  instead of tracing and lowering the model again each run.
  """
  return nnx.jit(lambda rngs: Transformer(config, rngs=rngs))


def count_params(model: nnx.Module) -> int:
  """Total number of scalars in the model's `nnx.Param`s."""
  params = nnx.state(model, nnx.Param)
  return sum(int(np.prod(p.shape)) for p in jax.tree.leaves(params))


def greedy_decode(
    model: Transformer,
    prompts: jax.Array,
    prompt_lengths: jax.Array,
    max_new_tokens: int,
    eos_id: int,
    pad_id: int,
    images: jax.Array | None = None,
) -> jax.Array:
  """Greedy continuation of right-padded prompts, with fixed shapes.

  Each row ``b`` continues from its own ``prompt_lengths[b]`` (>= 1) in a
  buffer of length ``P + max_new_tokens``: one `Transformer.prefill` of the
  buffer, then one `Transformer.extend` per token, writing the argmax just
  after the row's last filled position. A row that has emitted ``eos_id``
  emits ``pad_id`` from then on. Causal attention makes whatever follows
  each row's cursor irrelevant, so the prompts' padding needs no mask.

  Args:
    model: the transformer, in eval mode (``model.eval()``); wrap the call in
      ``nnx.jit`` (``static_argnums=(3, 4, 5)``) for speed.
    prompts: int [B, P] prompt tokens, right-padded.
    prompt_lengths: int [B] number of real tokens in each row, in [1, P],
      sharded like ``prompts``' batch axis.
    max_new_tokens: N, the number of tokens generated per row.
    eos_id: the token that ends a row.
    pad_id: the token emitted after EOS.
    images: [B, S, S] (or [B, S, S, C]) image prefixes, for a model with
      ``image_size``.

  Returns:
    int32 [B, N] generated tokens (EOS included, pad after it).
  """
  if prompts.ndim != 2:
    raise ValueError(f"prompts must be [B, P], got shape {prompts.shape}.")
  if prompt_lengths.shape != prompts.shape[:1]:
    raise ValueError(
        f"prompt_lengths shape {prompt_lengths.shape} must be "
        f"[B] = {prompts.shape[:1]}."
    )
  if max_new_tokens < 1:
    raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}.")
  prompt_len = prompts.shape[1]
  num_prefix = model.config.num_image_tokens
  if num_prefix + prompt_len + max_new_tokens > model.config.max_len:
    raise ValueError(
        f"{num_prefix} image tokens + prompt length {prompt_len} + "
        f"max_new_tokens {max_new_tokens} exceeds the model's max_len "
        f"{model.config.max_len}."
    )
  buffer = jnp.pad(
      prompts.astype(jnp.int32),
      ((0, 0), (0, max_new_tokens)),
      constant_values=pad_id,
  )
  unembedding = model.unembedding.astype(jnp.float32)

  def next_token(hidden, finished):
    """Argmax of [B, D] hidden states, pad where the row has finished."""
    token = jnp.argmax(hidden @ unembedding, axis=-1).astype(jnp.int32)
    token = jnp.where(finished, pad_id, token)
    return token, finished | (token == eos_id)

  hidden, cache = model.prefill(buffer, images)
  # Cursor: where the next token goes. Derived from prompt_lengths so that
  # the loop state shares its (batch) sharding.
  cursor = prompt_lengths.astype(jnp.int32)
  # A masked sum rather than a gather keeps shardings unambiguous.
  is_last = jnp.arange(buffer.shape[1]) == (cursor - 1)[:, None]
  last_hidden = jnp.sum(jnp.where(is_last[..., None], hidden, 0.0), axis=1)
  first, finished = next_token(last_hidden, jnp.zeros_like(cursor, bool))

  def step(carry, _):
    cache, token, cursor, finished = carry
    hidden, cache = model.extend(token[:, None], cursor[:, None], cache)
    token, finished = next_token(hidden[:, 0], finished)
    return (cache, token, cursor + 1, finished), token

  _, rest = jax.lax.scan(
      step, (cache, first, cursor, finished), None, length=max_new_tokens - 1
  )
  return jnp.concatenate([first[:, None], rest.T], axis=1)
