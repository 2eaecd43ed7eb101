"""A decoder-only transformer in Flax NNX for character-level arithmetic.

The model is a stack of pre-norm blocks::

  x = embedding[tokens]
  for each block:
    x = x + Attention(RMSNorm(x))    # causal, rotary position embedding
    x = x + SwiGLU(RMSNorm(x))
  hidden = RMSNorm(x)                # `Transformer.hidden_states`, float32
  logits = hidden @ unembedding      # untied [embed_dim, vocab_size], float32

The layers are in `train.layers`, the image encoders of the image tasks in
`train.encoders`. Decoding (`train.decoding.greedy_decode`) uses a KV cache:
`Transformer.prefill` then one `Transformer.extend` per generated token.

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
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from train import encoders
from train import layers

# Mesh axis the parameters are sharded over (FSDP); the batch splits on it too.
FSDP_AXIS = layers.FSDP_AXIS
ROPE_BASE = layers.ROPE_BASE


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
    image_encoder: ``'conv'`` (`encoders.ImageEncoder`: stride-2 convs) or
      ``'patch'`` (`encoders.PatchEncoder`: one token per patch, with coordinates).
    pixel_channels: channels C of each pixel: 1 for grayscale images
      [B, S, S]; more (e.g. 3 for RGB) for images [B, S, S, C].
    patch_size: side P of the `encoders.PatchEncoder`'s patches (P divides S).
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

  `encoders.ImageEncoder` ('conv'): the side halved by each of its convs, squared;
  `encoders.PatchEncoder` ('patch'): ``(image_size / patch_size) ** 2``.
  """
  if not image_size:
    return 0
  if image_encoder == "patch":
    if patch_size < 1:
      raise ValueError(f"patch_size must be >= 1, got {patch_size}.")
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


class Transformer(nnx.Module):
  """Decoder-only transformer: tokens [B, L] -> logits [B, L, V].

  With ``config.image_size`` set, every call also takes ``images`` [B, S, S]
  (or [B, S, S, C]): their encoder's tokens (`encoders.ImageEncoder` or
  `encoders.PatchEncoder`) occupy positions 0..K-1 and the text positions
  K.., so the text attends to the image. Outputs (hidden states, logits)
  cover the text positions only, and ``positions`` given to `extend` count
  text tokens, as without an image.

  Right padding needs no mask: the causal mask keeps padding from reaching
  the positions before it.
  """

  def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
    self.config = config
    v, d = config.vocab_size, config.embed_dim
    self.embedding = layers.param(
        nnx.initializers.normal(1.0),
        rngs.params(),
        (v, d),
        config.param_dtype,
        (None, FSDP_AXIS),
    )
    encoder = (
        encoders.PatchEncoder
        if config.image_encoder == "patch"
        else encoders.ImageEncoder
    )
    self.image_encoder = (
        encoder(config, rngs=rngs) if config.image_size else None
    )
    self.blocks = nnx.List(
        [layers.Block(config, rngs=rngs) for _ in range(config.num_layers)]
    )
    self.final_norm = layers.RMSNorm(
        d, param_dtype=config.param_dtype, rngs=rngs
    )
    self.unembed = layers.param(
        layers.kernel_init(0, 1),
        rngs.params(),
        (d, v),
        config.param_dtype,
        (FSDP_AXIS, None),
    )

  @property
  def unembedding(self) -> jax.Array:
    """The [D, V] unembedding matrix (gathered if sharded explicitly)."""
    return layers.gathered(self.unembed[...])

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
  ) -> tuple[jax.Array, tuple[layers.LayerCache, ...]]:
    """Hidden states of a [B, T] token buffer, and every layer's cache.

    Returns:
      float32 [B, T, D] hidden states (as `hidden_states`) and one
      `layers.LayerCache` per layer (over the K image and T text slots), for
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
      cache: tuple[layers.LayerCache, ...],
  ) -> tuple[jax.Array, tuple[layers.LayerCache, ...]]:
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
        layers.gathered(self.embedding[...]).astype(self.config.dtype),
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
