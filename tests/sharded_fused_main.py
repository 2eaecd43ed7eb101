"""Run as a script with 4 CPU devices: the sharded fused path equals 1 device.

Prints OK on success; raises otherwise. Called by tests/test_sharded_fused.py.
"""

import os

os.environ.setdefault("JAX_NUM_CPU_DEVICES", "4")

import jax  # pylint: disable=g-import-not-at-top
import jax.numpy as jnp
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
import numpy as np

import ntil_jax
from tests.test_fused import hidden_case


def value_and_grad(hidden, unembedding, labels, digit_mask):
  def total(h, w):
    return ntil_jax.fused_numeric_loss(
        h, w, labels, digit_mask, loss_mask=labels >= 0, chunk_size=16
    ).sum()

  return jax.jit(jax.value_and_grad(total, argnums=(0, 1)))(hidden, unembedding)


def main():
  assert jax.device_count() == 4, jax.devices()
  mesh = jax.make_mesh(
      (2, 2), ("data", "fsdp"), axis_types=(AxisType.Explicit,) * 2
  )
  # 37 positions in chunks of 2 per row: the last chunk and tile are
  # shifted back, so the statistics are written where others already are.
  hidden, unembedding, labels, digit_mask = hidden_case(1, 8, 37, 16, 48)
  for dtype in (jnp.float32, jnp.bfloat16):
    h, w = jnp.asarray(hidden, dtype), jnp.asarray(unembedding, dtype)
    want, want_grads = value_and_grad(h, w, labels, digit_mask)
    with jax.set_mesh(mesh):
      batch = NamedSharding(mesh, P(("data", "fsdp")))
      put = lambda x, b=batch: jax.device_put(x, b)
      got, got_grads = value_and_grad(
          put(h),
          jax.device_put(w, NamedSharding(mesh, P())),
          put(labels),
          put(digit_mask),
      )
      # The hidden states' gradient stays split over the batch.
      spec = got_grads[0].sharding.spec
      assert spec[0] == ("data", "fsdp"), spec
    tolerance = 1e-5 if dtype == jnp.float32 else 1e-2
    np.testing.assert_allclose(got, want, rtol=tolerance)
    for g, w_ in zip(got_grads, want_grads):
      np.testing.assert_allclose(
          np.asarray(g, np.float32),
          np.asarray(w_, np.float32),
          rtol=tolerance,
          atol=tolerance * 0.1,
      )
  print("OK")


if __name__ == "__main__":
  main()
