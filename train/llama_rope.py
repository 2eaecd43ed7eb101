"""Llama 3's RoPE for tunix's Llama3: the config's base, Llama 3.1's scaling.

tunix 0.1.7's Llama3 runs RoPE with its default base and no frequency
scaling; :func:`llama_rope` swaps in the config's while a forward pass is
traced.
"""

import contextlib
import functools

import jax.numpy as jnp
import numpy as np

from train import tunix_models


@contextlib.contextmanager
def llama_rope(theta: float, scaling=None):
  """Makes tunix's Llama3 use the config's RoPE while tracing.

  tunix 0.1.7's Llama3 attention calls ``apply_rope`` without
  ``rope_theta``, so every Llama ran with its default base 1e6 instead of
  the config's (Llama 3: 5e5), and its logits were not the checkpoint's
  (1.4e-2 off on the test fixture; 8e-7 with this). It has no RoPE scaling
  either. The module's ``apply_rope`` is swapped for one with the right base
  (and, given ``scaling``, Llama 3.1's scaled frequencies) while the forward
  pass is traced, and put back afterwards.
  """
  module = tunix_models.module("llama3.model")
  original = module.apply_rope
  if scaling is None:
    module.apply_rope = functools.partial(original, rope_theta=theta)
  else:
    module.apply_rope = functools.partial(
        apply_scaled_rope, rope_theta=theta, scaling=scaling
    )
  try:
    yield
  finally:
    module.apply_rope = original


def llama3_inverse_frequencies(head_dim: int, theta: float, scaling):
  """float32 ``[head_dim // 2]`` RoPE frequencies with Llama 3.1's scaling.

  ``scaling`` is ``(factor, low_freq_factor, high_freq_factor,
  original_max_position_embeddings)``. Frequencies whose wavelength is
  shorter than ``context / high_freq_factor`` are kept, those longer than
  ``context / low_freq_factor`` divided by ``factor``, and those between
  interpolated (as transformers' ``rope_type="llama3"``).
  """
  factor, low, high, context = scaling
  exponents = np.arange(0, head_dim, 2, dtype=np.float32) / head_dim
  inverse = (1.0 / np.float32(theta) ** exponents).astype(np.float32)
  wavelength = 2 * np.pi / inverse
  smooth = (context / wavelength - low) / (high - low)
  smoothed = (1 - smooth) * inverse / factor + smooth * inverse
  scaled = np.where(
      wavelength < context / high,
      inverse,
      np.where(wavelength > context / low, inverse / factor, smoothed),
  )
  return scaled.astype(np.float32)


def apply_scaled_rope(inputs, positions, head_dim, rope_theta, scaling):
  """tunix's ``apply_rope`` (halves layout) with Llama 3.1's frequencies."""
  inverse = jnp.asarray(
      llama3_inverse_frequencies(head_dim, rope_theta, scaling)
  )
  angles = positions[..., None].astype(jnp.float32) * inverse
  angles = angles[..., None, :]  # [B, T, 1 (heads), head_dim // 2]
  sin, cos = jnp.sin(angles), jnp.cos(angles)
  first, second = jnp.split(inputs, 2, axis=-1)
  out = jnp.concatenate(
      [first * cos - second * sin, second * cos + first * sin], axis=-1
  )
  return out.astype(inputs.dtype)
