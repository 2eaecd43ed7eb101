"""Run as a script with 4 CPU devices: losses on a sequence split over a mesh.

Every numeric loss on ``[B, T, V]`` logits split along T (sequence
parallelism), on Explicit and on Auto mesh axes, equals the single-device
result, value and gradient, with numbers (and decimal points) across the
shards; so does ``number_layout``. Prints OK on success; raises otherwise. Called by
tests/test_sharding.py.
"""

import os

os.environ.setdefault("JAX_NUM_CPU_DEVICES", "4")

import functools  # pylint: disable=g-import-not-at-top
import re  # pylint: disable=g-import-not-at-top

import jax
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
import numpy as np

import ntil_jax
from tests.test_losses import random_case

VOCAB = 48


def collected_shapes(program) -> list[str]:
  """The dims of every array an all-gather or all-to-all of the optimized
  ``program`` outputs ("2,16,10"), tuple outputs included."""
  shapes = []
  for line in program.splitlines():
    found = re.search(r"= (.*?) (all-gather|all-to-all)(-start)?\(", line)
    if found:
      shapes += re.findall(r"\w+\[([\d,]*)\]", found.group(1))
  return shapes


def per_token_loss(name, logits, labels, loss_mask, digit_mask, point):
  """A loss by name: both ways into the number logic.

  A method of ``numeric_token_loss`` goes through ``loss_from_statistics``;
  ``soft_label_cross_entropy``, a loss on logits, through its own checks.
  """
  if name == "soft_label_cross_entropy":
    return ntil_jax.soft_label_cross_entropy(logits, labels, digit_mask)
  return ntil_jax.numeric_token_loss(
      logits,
      labels,
      loss_mask=loss_mask,
      digit_mask=digit_mask,
      method=name,
      decimal_point_mask=point,
  )


# Every loss, and one loss on logits (through its own checks).
NAMES = (*ntil_jax.NUMERIC_LOSSES, "soft_label_cross_entropy")


def values_and_grads(logits, *rest):
  """Each loss of :data:`NAMES`: ``{name: (per-token loss, gradient of its
  sum in the logits)}``, and the compiled program's text.

  All in one program: one compile of the eight took about half the time of
  a program each (2.4 s against 1.45 s on the 2-core CPU).
  """

  def every_loss(z, *rest_):
    out = {}
    for name in NAMES:

      def total(z_, name=name):
        loss = per_token_loss(name, z_, *rest_)
        return loss.sum(), loss

      (_, loss), grad = jax.value_and_grad(total, has_aux=True)(z)
      out[name] = loss, grad
    return out

  compiled = jax.jit(every_loss).lower(logits, *rest).compile()
  return compiled(logits, *rest), compiled.as_text()


def main():
  assert jax.device_count() == 4, jax.devices()
  logits, labels, digit_mask = random_case(7, batch=4, length=16, vocab=VOCAB)
  # Decimal points among the digits: "3.14"-like numbers across shards.
  point = (labels >= 10) & (np.random.default_rng(7).random(labels.shape) < 0.5)
  inputs = (logits, labels, labels >= 0, digit_mask, point)
  meshes = {
      axis_type: jax.make_mesh(
          (2, 2), ("data", "seq"), axis_types=(axis_type,) * 2
      )
      for axis_type in (AxisType.Explicit, AxisType.Auto)
  }
  single_device, _ = values_and_grads(*inputs)
  for axis_type, spec in (
      (AxisType.Explicit, P("data", "seq")),
      (AxisType.Explicit, P(None, "seq")),
      (AxisType.Auto, P("data", "seq")),
  ):
    mesh = meshes[axis_type]
    with jax.set_mesh(mesh):
      sharded = [jax.device_put(x, NamedSharding(mesh, spec)) for x in inputs]
      results, program = values_and_grads(*sharded)
    for name in NAMES:
      where = f"{name} on {axis_type} {spec}"
      (want, want_grad), (got, got_grad) = single_device[name], results[name]
      # Split as the inputs are, the gradient as the logits.
      assert got.sharding.spec == spec, (where, got.sharding)
      grad_spec = tuple(got_grad.sharding.spec)
      grad_spec += (None,) * (3 - len(grad_spec))
      assert grad_spec == (*spec, None), (where, got_grad.sharding)
      np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7, err_msg=where)
      # Fused otherwise, the sharded program rounds otherwise: a few float32
      # ulps of the largest entries (up to about 6).
      np.testing.assert_allclose(
          got_grad, want_grad, rtol=1e-5, atol=1e-6, err_msg=where
      )
    # Only [B, T] and [B, T, 10] arrays are gathered, never the logits.
    gathered = collected_shapes(program)
    assert gathered, (axis_type, spec)
    assert not any(s.endswith(f",{VOCAB}") for s in gathered), gathered
  check_number_tokens(meshes[AxisType.Explicit])
  check_shard_map(meshes[AxisType.Auto], inputs)
  check_layout(meshes, labels, digit_mask, point)
  print("OK")


def check_number_tokens(mesh):
  """Numbers in tokens of 1-2 digits across the shards of a sequence: the
  ``[B, T, K]`` number-token logits are reduced to each token's digit cells
  before the gather, as the logits are never gathered."""
  pieces = [str(d) for d in range(10)] + [f"{v:02d}" for v in range(100)]
  pieces += ["+", "=", "x"] + [f"<{i}>" for i in range(15)]
  ids = ntil_jax.number_tokens(pieces)
  rng = np.random.default_rng(11)
  logits = rng.normal(size=(4, 16, len(pieces))).astype(np.float32)
  labels = rng.integers(-1, len(pieces), (4, 16)).astype(np.int32)

  def total(z, labels_):
    loss = ntil_jax.numeric_token_loss(z, labels_, digit_token_ids=ids)
    return loss.sum(), loss

  step = jax.jit(jax.value_and_grad(total, has_aux=True))
  (_, want), want_grad = step(logits, labels)
  spec = P("data", "seq")
  with jax.set_mesh(mesh):
    sharded = [
        jax.device_put(x, NamedSharding(mesh, spec)) for x in (logits, labels)
    ]
    compiled = step.lower(*sharded).compile()
    (_, got), got_grad = compiled(*sharded)
  np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
  np.testing.assert_allclose(got_grad, want_grad, rtol=1e-5, atol=1e-6)
  gathered = collected_shapes(compiled.as_text())
  assert gathered, "nothing gathered: the numbers were cut at the shards"
  widths = {int(s.rsplit(",", 1)[-1]) for s in gathered if "," in s}
  assert not widths & {110, len(pieces)}, gathered


def weighted(method, weighting):
  """``method`` with ``weighting``, as a case of :func:`check_shard_map`."""

  def loss(z, labels, loss_mask, digit_mask, point, axes):
    del point
    return ntil_jax.numeric_token_loss(
        z,
        labels,
        loss_mask=loss_mask,
        digit_mask=digit_mask,
        method=method,
        weighting=weighting,
        **axes,
    )

  return loss


def check_shard_map(mesh, inputs):
  """Inside ``shard_map``, T split over one mesh axis or two: with
  ``sequence_axis`` each shard's loss and gradient are the unsharded
  ones' at its positions, for the logits path (every weighting; the
  ratios summed over batch and sequence shards), number tokens and the
  fused path; without it numbers are cut at the shards' edges."""
  logits, labels, loss_mask, digit_mask, point = inputs
  hidden = np.random.default_rng(5).normal(size=(4, 16, 8)).astype(np.float32)
  unembedding = np.random.default_rng(6).normal(size=(8, VOCAB))
  unembedding = unembedding.astype(np.float32)
  pieces = [str(d) for d in range(10)] + [f"{v:02d}" for v in range(100)]
  pieces += [f"<{i}>" for i in range(VOCAB - len(pieces) % VOCAB)]
  wide = ntil_jax.number_tokens(pieces)
  wide_logits = np.random.default_rng(8).normal(size=(4, 16, len(pieces)))
  wide_labels = np.random.default_rng(9).integers(-1, len(pieces), (4, 16))
  cases = {
      # name: (loss of (x, labels, loss_mask, digit_mask, point, axes), x)
      "ntil, decimal points": (
          lambda z, l, m, d, p, axes: ntil_jax.numeric_token_loss(
              z, l, loss_mask=m, digit_mask=d, decimal_point_mask=p, **axes
          ),
          logits,
          labels,
      ),
      "del, authors": (weighted("del", "authors"), logits, labels),
      "nl_ntl, reference": (weighted("nl_ntl", "reference"), logits, labels),
      "ntil, number tokens": (
          lambda z, l, m, d, p, axes: ntil_jax.numeric_token_loss(
              z, l, digit_token_ids=wide, **axes
          ),
          wide_logits.astype(np.float32),
          wide_labels.astype(np.int32),
      ),
      "fused ntil": (
          lambda h, l, m, d, p, axes: ntil_jax.fused_numeric_loss(
              h, unembedding, l, d, loss_mask=m, chunk_size=8, **axes
          ),
          hidden,
          labels,
      ),
  }
  # spec, the batch's axes, T's axes: each case on one split (the
  # weightings' ratios then sum over batch and T, or over T's two axes).
  splits = (
      (P("data", "seq"), "data", "seq"),
      (P(None, ("data", "seq")), (), ("data", "seq")),
  )

  def every_case(xs, split):
    """``{name: (per-token loss, gradient of its sum)}`` of every case, in
    one program (one compile), its T split inside shard_map or not."""
    out = {}
    for k, (name, (loss, _, labels_)) in enumerate(cases.items()):
      rest = (labels_, labels_ >= 0, digit_mask, point)
      per_token = functools.partial(loss, axes={})
      if split:
        spec, batch_axes, sequence_axis = splits[k % 2]
        axes = dict(axis_name=batch_axes, sequence_axis=sequence_axis)
        per_token = jax.shard_map(
            functools.partial(loss, axes=axes),
            mesh=mesh,
            in_specs=(spec,) * 5,
            out_specs=spec,
        )

      def total(x_, per_token=per_token, rest=rest):
        losses = per_token(x_, *rest)
        return losses.sum(), losses

      (_, losses), grad = jax.value_and_grad(total, has_aux=True)(xs[name])
      out[name] = losses, grad
    return out

  xs = {name: x for name, (_, x, _) in cases.items()}
  want = jax.jit(functools.partial(every_case, split=False))(xs)
  compiled = (
      jax.jit(functools.partial(every_case, split=True)).lower(xs).compile()
  )
  got = compiled(xs)
  for k, name in enumerate(cases):
    where = f"{name}, T over {splits[k % 2][2]}"
    for g, w in zip(got[name], want[name]):
      np.testing.assert_allclose(g, w, rtol=1e-5, atol=2e-6, err_msg=where)
  # The number logic's inputs are gathered, never the logits or the hidden
  # states.
  gathered = collected_shapes(compiled.as_text())
  widths = {x.shape[-1] for x in xs.values()}
  assert gathered and not any(
      int(g.rsplit(",", 1)[-1]) in widths for g in gathered
  ), gathered
  # Without sequence_axis a number across two shards is cut in two.
  cut = jax.jit(
      jax.shard_map(
          lambda z, l: ntil_jax.ntil_loss(z, l),
          mesh=mesh,
          in_specs=(P("data", "seq"),) * 2,
          out_specs=P("data", "seq"),
      )
  )(logits, labels)
  whole = ntil_jax.ntil_loss(logits, labels)
  assert not np.allclose(cut, whole, rtol=1e-3), "no number crosses a shard"


def check_layout(meshes, labels, digit_mask, point):
  """``number_layout`` of a sequence split over a mesh: on an Explicit axis
  under jit, and inside shard_map with ``sequence_axis`` (one axis or two),
  every field equals the unsharded one, its positions (``first``, ``last``,
  ``point``) those of the whole row; under jit the fields come split as the
  labels are."""
  want = ntil_jax.number_layout(labels, digit_mask, decimal_point_mask=point)
  fields = [f for f, x in zip(want._fields, want) if x is not None]
  # A number across the middle of the rows, the edge of two shards.
  assert (want.is_digit[:, 8] & (want.first[:, 8] < 8)).any()

  def layout(labels_, digit_mask_, point_, **axes):
    return ntil_jax.number_layout(
        labels_, digit_mask_, decimal_point_mask=point_, **axes
    )

  mesh = meshes[AxisType.Explicit]
  with jax.set_mesh(mesh):
    for spec in (P("data", "seq"), P(None, "seq")):
      args = [
          jax.device_put(x, NamedSharding(mesh, spec))
          for x in (labels, digit_mask, point)
      ]
      got = jax.jit(layout)(*args)
      for field in fields:
        x = getattr(got, field)
        np.testing.assert_array_equal(x, getattr(want, field), err_msg=field)
        assert x.sharding.spec == spec, (field, spec, x.sharding)
  mesh = meshes[AxisType.Auto]
  for spec, sequence_axis in (
      (P("data", "seq"), "seq"),
      (P(None, ("data", "seq")), ("data", "seq")),
  ):
    got = jax.jit(
        jax.shard_map(
            functools.partial(layout, sequence_axis=sequence_axis),
            mesh=mesh,
            in_specs=(spec,) * 3,
            out_specs=spec,
        )
    )(labels, digit_mask, point)
    for field in fields:
      np.testing.assert_array_equal(
          getattr(got, field),
          getattr(want, field),
          err_msg=f"{field}, T over {sequence_axis}",
      )


if __name__ == "__main__":
  main()
