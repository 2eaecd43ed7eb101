"""Run as a script with 4 CPU devices: the sharded fused path equals 1 device.

A batch split over the mesh under ``jit`` (Explicit axes), and the loss of
each shard inside ``shard_map`` summed by ``psum``.

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


def shard_map_value_and_grad(mesh, hidden, unembedding, labels, digit_mask):
  """Per-shard losses summed by ``psum``, batch split over the whole mesh."""
  axes = mesh.axis_names

  def shard_total(h, w, shard_labels, shard_digit_mask):
    loss = ntil_jax.fused_numeric_loss(
        h,
        w,
        shard_labels,
        shard_digit_mask,
        loss_mask=shard_labels >= 0,
        chunk_size=16,
    )
    return jax.lax.psum(loss.sum(), axes)

  total = jax.shard_map(
      shard_total,
      mesh=mesh,
      in_specs=(P(axes), P(), P(axes), P(axes)),
      out_specs=P(),
  )
  return jax.jit(jax.value_and_grad(total, argnums=(0, 1)))(
      hidden, unembedding, labels, digit_mask
  )


def main():
  assert jax.device_count() == 4, jax.devices()
  mesh = jax.make_mesh(
      (2, 2), ("data", "fsdp"), axis_types=(AxisType.Explicit,) * 2
  )
  # 37 positions in chunks of 2 per row: the last chunk and tile are
  # shifted back, so the statistics are written where others already are.
  hidden, unembedding, labels, digit_mask = hidden_case(1, 8, 37, 16, 48)
  put = lambda x: jax.device_put(x, NamedSharding(mesh, P(("data", "fsdp"))))
  replicate = lambda x: jax.device_put(x, NamedSharding(mesh, P()))
  single_device = {}
  for dtype in (jnp.float32, jnp.bfloat16):
    h, w = jnp.asarray(hidden, dtype), jnp.asarray(unembedding, dtype)
    want, want_grads = value_and_grad(h, w, labels, digit_mask)
    single_device[dtype] = want, want_grads
    with jax.set_mesh(mesh):
      got, got_grads = value_and_grad(
          put(h), replicate(w), put(labels), put(digit_mask)
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
  # Inside shard_map the backward scans' carries must vary over the mesh as
  # the batch does, and the replicated unembedding's gradient is summed.
  with jax.set_mesh(mesh):
    got, got_grads = shard_map_value_and_grad(
        mesh, put(hidden), replicate(unembedding), put(labels), put(digit_mask)
    )
  want, want_grads = single_device[jnp.float32]
  np.testing.assert_allclose(got, want, rtol=1e-5)
  for g, w_ in zip(got_grads, want_grads):
    # psum adds the shards' unembedding gradients in another order: float32
    # rounding of the largest entries' size.
    scale = np.abs(w_).max()
    np.testing.assert_allclose(g, w_, rtol=1e-5, atol=1e-6 * scale)
  print("OK")


if __name__ == "__main__":
  main()
