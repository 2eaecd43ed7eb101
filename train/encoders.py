"""The image encoders of the image tasks: a small conv net and ViT-style
patches, each mapping ``[B, S, S]`` or ``[B, S, S, C]`` pixels to image
tokens ``[B, num_image_tokens, D]`` that prefix the decoder's text."""

from typing import TYPE_CHECKING

from flax import nnx
import jax
import jax.numpy as jnp

from train import layers

if TYPE_CHECKING:
  from train import models  # pylint: disable=g-bad-import-order


def _scaled_pixels(images: jax.Array, pixel_channels: int) -> jax.Array:
  """[B, S, S] or [B, S, S, C] pixels in [0, 255] -> float32 [B, S, S, C]."""
  x = images.astype(jnp.float32) / 127.5 - 1.0
  return x[..., None] if pixel_channels == 1 else x


def _zero_biases(widths, config, rngs: nnx.Rngs) -> nnx.List:
  """One zero-initialised bias per layer of the given output widths."""
  return nnx.List(
      [
          layers.param(
              nnx.initializers.zeros,
              rngs.params(),
              (width,),
              config.param_dtype,
              (None,),
          )
          for width in widths
      ]
  )


def _token_embedding(config, rngs: nnx.Rngs) -> nnx.Param:
  """A learned ``[K, D]`` embedding added to the K image tokens."""
  return layers.param(
      nnx.initializers.normal(0.02),
      rngs.params(),
      (config.num_image_tokens, config.embed_dim),
      config.param_dtype,
      (None, layers.FSDP_AXIS),
  )


class ImageEncoder(nnx.Module):
  """Images [B, S, S] (or [B, S, S, C]) -> K = (S / 2^n)^2 tokens [B, K, D].

  A stack of 3x3 stride-2 convolutions with GELU (channels
  ``image_channels``, then ``embed_dim``), read out row by row, plus a learned
  embedding per grid cell so each token knows where it sits in the image.
  Pixels are scaled from [0, 255] to [-1, 1].
  """

  def __init__(self, config: "models.ModelConfig", *, rngs: nnx.Rngs):
    channels = (
        config.pixel_channels,
        *config.image_channels,
        config.embed_dim,
    )
    self.kernels = nnx.List(
        [
            layers.param(
                layers.kernel_init(in_axis=(0, 1, 2), out_axis=3),
                rngs.params(),
                (3, 3, c_in, c_out),
                config.param_dtype,
                (None, None, None, layers.FSDP_AXIS),
            )
            for c_in, c_out in zip(channels[:-1], channels[1:])
        ]
    )
    self.biases = _zero_biases(channels[1:], config, rngs)
    self.grid_embedding = _token_embedding(config, rngs)
    self.dtype = config.dtype
    self.pixel_channels = config.pixel_channels

  def __call__(self, images: jax.Array) -> jax.Array:
    """uint8 or float pixels in [0, 255] -> float32 [B, K, D]."""
    x = _scaled_pixels(images, self.pixel_channels)
    for index, (kernel, bias) in enumerate(zip(self.kernels, self.biases)):
      x = jax.lax.conv_general_dilated(
          x.astype(self.dtype),
          layers.gathered(kernel[...]).astype(self.dtype),
          window_strides=(2, 2),
          padding="SAME",
          dimension_numbers=("NHWC", "HWIO", "NHWC"),
          preferred_element_type=jnp.float32,
      )
      x = x + layers.gathered(bias[...]).astype(jnp.float32)
      if index < len(self.kernels) - 1:
        x = jax.nn.gelu(x)
    tokens = x.reshape(x.shape[0], -1, x.shape[-1])
    return tokens + layers.gathered(self.grid_embedding[...]).astype(
        jnp.float32
    )


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

  def __init__(self, config: "models.ModelConfig", *, rngs: nnx.Rngs):
    self.patch_size = p = config.patch_size
    self.pixel_channels = config.pixel_channels
    widths = (None, *config.image_channels, config.embed_dim)
    self.kernels = nnx.List(
        [
            layers.param(
                layers.kernel_init(
                    in_axis=tuple(range(len(shape) - 1)), out_axis=-1
                ),
                rngs.params(),
                shape,
                config.param_dtype,
                (None,) * (len(shape) - 1) + (layers.FSDP_AXIS,),
            )
            for shape in (  # [P, P, C + 2, W], then [W, W'] per layer
                (p, p, config.pixel_channels + 2, widths[1]),
                *zip(widths[1:-1], widths[2:]),
            )
        ]
    )
    self.biases = _zero_biases(widths[1:], config, rngs)
    self.patch_embedding = _token_embedding(config, rngs)
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
    first = layers.gathered(self.kernels[0][...]).astype(self.dtype)
    x = self._embed_patches(pixels, first[:, :, :channels])
    x = x + self._embed_patches(grid, first[:, :, channels:])[0]
    for index, (kernel, bias) in enumerate(zip(self.kernels, self.biases)):
      if index:
        x = jnp.einsum(
            "bkf,fw->bkw",
            x.astype(self.dtype),
            layers.gathered(kernel[...]).astype(self.dtype),
            preferred_element_type=jnp.float32,
        )
      x = x + layers.gathered(bias[...]).astype(jnp.float32)
      if index < len(self.kernels) - 1:
        x = jax.nn.gelu(x)
    return x + layers.gathered(self.patch_embedding[...]).astype(jnp.float32)
