"""Run as a script with 4 CPU devices: the sharded fused path equals 1 device.

A batch split over the mesh under ``jit`` (Explicit axes), and the loss of
each shard inside ``shard_map`` summed by ``psum``.

Prints OK on success; raises otherwise. Called by tests/test_sharded_fused.py.
"""

import functools
import os

os.environ.setdefault("JAX_NUM_CPU_DEVICES", "4")

import jax  # pylint: disable=g-import-not-at-top
import jax.numpy as jnp
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
import numpy as np
import optax

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
  check_each_implementation(mesh, put, replicate)
  check_batch_weightings(mesh, put, replicate)
  check_vocabulary_split_refused(mesh, hidden, unembedding, labels, put)
  check_sequence_split_with_a_kernel(mesh, hidden, unembedding, labels)
  print("OK")


def check_sequence_split_with_a_kernel(mesh, hidden, unembedding, labels):
  """A callable CE kernel on hidden states split along T alone: the
  kernel's [B * T, D] flattening raised JAX's ShardingTypeError (a reshape
  of a split T); T is made whole for it, and the result is the single
  device's, value and gradient."""
  hidden, labels = hidden[:, :36], labels[:, :36]  # T split in 4

  def total(h, w):
    return ntil_jax.fused_numeric_loss(
        h, w, labels, implementation=optax_ce
    ).sum()

  step = jax.value_and_grad(total, argnums=(0, 1))
  want, want_grads = jax.jit(step)(hidden, unembedding)
  split = NamedSharding(mesh, P(None, ("data", "fsdp")))
  with jax.set_mesh(mesh):
    got, got_grads = jax.jit(step)(
        jax.device_put(hidden, split),
        jax.device_put(unembedding, NamedSharding(mesh, P())),
    )
  assert got_grads[0].sharding.spec[1] == ("data", "fsdp"), got_grads[0]
  np.testing.assert_allclose(got, want, rtol=1e-5)
  for g, w_ in zip(got_grads, want_grads):
    np.testing.assert_allclose(g, w_, rtol=1e-5, atol=1e-6 * np.abs(w_).max())


def check_vocabulary_split_refused(mesh, hidden, unembedding, labels, put):
  """An unembedding split along V on explicit axes is refused by name (JAX
  raised a ShardingTypeError from a gather deep in the statistics); split
  along D it gives the single-device value."""
  want = jax.jit(ntil_jax.fused_numeric_loss)(hidden, unembedding, labels).sum()
  for spec in (P(None, "fsdp"), P("fsdp", None)):
    w = jax.device_put(unembedding, NamedSharding(mesh, spec))
    with jax.set_mesh(mesh):
      try:
        got = jax.jit(ntil_jax.fused_numeric_loss)(put(hidden), w, put(labels))
      except ValueError as error:
        assert spec[-1] is not None, error
        assert "split over the mesh axes 'fsdp' along V" in str(error), error
        continue
    assert spec[-1] is None, f"{spec}: a vocabulary split accepted"
    np.testing.assert_allclose(got.sum(), want, rtol=1e-5)


def check_batch_weightings(mesh, put, replicate):
  """The NTIL authors' weightings scale by the whole batch's CE / aux.

  Inside ``shard_map`` a shard's own ratio gives the same summed value and
  another gradient: the sums are added over ``axis_name``, and without it
  the call is refused.
  """
  axes = mesh.axis_names
  hidden, unembedding, labels, digit_mask = hidden_case(5, 8, 21, 16, 48)
  cases = [("fused", "authors"), ("logits", "reference")]
  for path, weighting in cases:

    def loss(
        h, w, labels_, digit_mask_, axis_name, path=path, weighting=weighting
    ):
      kwargs = dict(
          loss_mask=labels_ >= 0, weighting=weighting, axis_name=axis_name
      )
      if path == "fused":
        return ntil_jax.fused_numeric_loss(
            h, w, labels_, digit_mask_, chunk_size=16, **kwargs
        )
      return ntil_jax.numeric_token_loss(
          h @ w, labels_, digit_mask=digit_mask_, **kwargs
      )

    def shard_total(h, w, labels_, digit_mask_, axis_name, loss=loss):
      return jax.lax.psum(
          loss(h, w, labels_, digit_mask_, axis_name).sum(), axes
      )

    want, want_grads = jax.jit(
        jax.value_and_grad(
            lambda h, w, loss=loss: loss(h, w, labels, digit_mask, None).sum(),
            argnums=(0, 1),
        )
    )(hidden, unembedding)
    args = (put(hidden), replicate(unembedding), put(labels), put(digit_mask))
    for axis_name in (axes, None):
      total = jax.shard_map(
          functools.partial(shard_total, axis_name=axis_name),
          mesh=mesh,
          in_specs=(P(axes), P(), P(axes), P(axes)),
          out_specs=P(),
      )
      step = jax.jit(jax.value_and_grad(total, argnums=(0, 1)))
      with jax.set_mesh(mesh):
        if axis_name is None:
          try:
            step(*args)
          except ValueError as error:
            assert "need axis_name" in str(error), error
          else:
            raise AssertionError(f"{path} {weighting}: no axis_name accepted")
          continue
        got, got_grads = step(*args)
      np.testing.assert_allclose(got, want, rtol=1e-5)
      for g, w_ in zip(got_grads, want_grads):
        scale = np.abs(w_).max()
        np.testing.assert_allclose(
            g, w_, rtol=1e-5, atol=1e-6 * scale, err_msg=f"{path} {weighting}"
        )


def check_each_implementation(mesh, put, replicate):
  """Every implementation on a batch split over the mesh, numbers in
  digits and in tokens of 1-2 digits: a kernel written for one device runs
  on each device's tokens; the chunked backward's digit columns get an
  output sharding."""
  pieces = [str(d) for d in range(10)] + [f"{v:02d}" for v in range(100)]
  pieces += ["+", "=", "x"] + [f"<{i}>" for i in range(15)]
  rng = np.random.default_rng(3)
  hidden = jnp.asarray(rng.normal(size=(8, 12, 16)), jnp.float32)
  unembedding = jnp.asarray(rng.normal(size=(16, len(pieces))), jnp.float32)
  labels = jnp.asarray(rng.integers(-1, len(pieces), (8, 12)), jnp.int32)
  implementations = {"chunked": "chunked", "optax_ce": optax_ce}
  if ntil_jax.kernels.tokamax_ce.available():
    implementations["tokamax"] = "tokamax"
  numbers = {"digits": None, "tokens": ntil_jax.number_tokens(pieces)}

  @jax.jit
  def every_case(h, w):  # one program: one compile
    out = {}
    for name, implementation in implementations.items():
      for written, ids in numbers.items():

        def total(h_, w_, implementation=implementation, ids=ids):
          return ntil_jax.fused_numeric_loss(
              h_,
              w_,
              labels,
              loss_mask=labels >= 0,
              digit_token_ids=ids,
              implementation=implementation,
          ).sum()

        out[name, written] = jax.value_and_grad(total, argnums=(0, 1))(h, w)
    return out

  single_device = every_case(hidden, unembedding)
  with jax.set_mesh(mesh):
    sharded = every_case(put(hidden), replicate(unembedding))
  for case, (want, want_grads) in single_device.items():
    got, got_grads = sharded[case]
    np.testing.assert_allclose(got, want, rtol=1e-5, err_msg=str(case))
    for g, w_ in zip(got_grads, want_grads):
      scale = np.abs(w_).max()
      np.testing.assert_allclose(
          g, w_, rtol=1e-5, atol=1e-6 * scale, err_msg=str(case)
      )


def optax_ce(hidden, labels, unembedding):
  """A user's per-token CE kernel: optax on the logits."""
  return optax.softmax_cross_entropy_with_integer_labels(
      hidden @ unembedding, labels
  )


if __name__ == "__main__":
  main()
