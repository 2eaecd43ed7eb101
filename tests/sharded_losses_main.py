"""Run as a script with 4 CPU devices: sharded losses equal single-device ones.

Prints OK on success; raises otherwise. Called by tests/test_sharding.py.
"""

import os

os.environ.setdefault("JAX_NUM_CPU_DEVICES", "4")

import jax  # pylint: disable=g-import-not-at-top
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
import numpy as np

import ntil_jax
from tests import test_chunks
from tests.test_losses import PERMUTED_IDS, random_case


def values_and_grads(logits, labels, loss_mask, digit_mask, ids):
  """``{method: ((sum, per-token loss), gradient)}`` of every method of
  ``numeric_token_loss``, in one program (one compile, about half the time
  of a program each)."""

  def every_method(z, labels, loss_mask, digit_mask):
    out = {}
    for method in ntil_jax.NUMERIC_LOSSES:

      def total(z_, method=method):
        per_token = ntil_jax.numeric_token_loss(
            z_,
            labels,
            loss_mask=loss_mask,
            digit_mask=digit_mask,
            method=method,
            digit_token_ids=ids,
        )
        return per_token.sum(), per_token

      out[method] = jax.value_and_grad(total, has_aux=True)(z)
    return out

  return jax.jit(every_method)(logits, labels, loss_mask, digit_mask)


def main():
  assert jax.device_count() == 4, jax.devices()
  mesh = jax.make_mesh(
      (2, 2), ("data", "fsdp"), axis_types=(AxisType.Explicit,) * 2
  )
  for ids in (None, np.asarray(PERMUTED_IDS)):
    logits, labels, digit_mask = random_case(
        50,
        batch=8,
        length=33,
        vocab=48,
        digit_ids=PERMUTED_IDS if ids is not None else range(10),
    )
    inputs = (logits, labels, labels >= 0, digit_mask)
    single_device = values_and_grads(*inputs, ids)
    with jax.set_mesh(mesh):
      batch_sharding = NamedSharding(mesh, P(("data", "fsdp")))
      sharded = values_and_grads(
          *(jax.device_put(x, batch_sharding) for x in inputs), ids
      )
    for method in ntil_jax.NUMERIC_LOSSES:
      (want, want_tokens), want_grad = single_device[method]
      (got, got_tokens), got_grad = sharded[method]
      assert got_tokens.sharding.spec[0] == (
          "data",
          "fsdp",
      ), got_tokens.sharding
      # The gradient (the custom VJP's scatter included) stays split
      # over the batch, never gathered onto every device.
      assert got_grad.sharding.spec[0] == (
          "data",
          "fsdp",
      ), got_grad.sharding
      np.testing.assert_allclose(got, want, rtol=1e-6, err_msg=method)
      np.testing.assert_allclose(
          got_tokens, want_tokens, rtol=1e-6, atol=1e-7, err_msg=method
      )
      np.testing.assert_allclose(
          got_grad, want_grad, rtol=1e-5, atol=1e-7, err_msg=method
      )
  unsharded_labels(mesh)
  number_tokens(mesh)
  rows_need_no_communication()
  print("OK")


# Collectives that move a shard's rows (or parts of them) to other devices.
_MOVING = ("all-gather", "all-to-all", "collective-permute")


def rows_need_no_communication():
  """Under ``jit`` with the batch split over an ``Auto`` mesh (XLA places
  the collectives), every loss's value and gradient, decimal points
  included, moves no row between devices: the number logic reads only its
  own row (a gather from rows flattened into one axis made the SPMD
  partitioner gather the whole operand onto every device). Only the sum
  over the batch is reduced across devices."""
  mesh = jax.make_mesh((4,), ("data",), axis_types=(AxisType.Auto,))
  logits, labels, digit_mask = random_case(52, batch=8, length=40, vocab=32)
  point = labels == 11
  split3 = NamedSharding(mesh, P("data", None, None))
  split2 = NamedSharding(mesh, P("data", None))

  def every_method(z, l, m, d):  # one program: one compile
    out = {}
    for method in ntil_jax.NUMERIC_LOSSES:

      def total(z_, method=method):
        return ntil_jax.numeric_token_loss(
            z_, l, digit_mask=m, decimal_point_mask=d, method=method
        ).sum()

      out[method] = jax.value_and_grad(total)(z)
    return out

  step = jax.jit(every_method, in_shardings=(split3,) + (split2,) * 3)
  text = step.lower(logits, labels, digit_mask, point).compile().as_text()
  moved = [op for op in _MOVING if f" {op}(" in text or f" {op}-start(" in text]
  assert not moved, moved
  assert " all-reduce" in text  # the batch's sums


def unsharded_labels(mesh):
  """Batch-sharded logits (or hidden states) beside labels and masks given
  whole, as numpy constants: every entry point reshards them to the logits'
  layout, for every loss and the fused path alike (once a ShardingTypeError).
  """
  logits, labels, digit_mask = random_case(51, batch=8, length=12, vocab=32)
  rng = np.random.default_rng(51)
  hidden = rng.normal(size=(8, 12, 6)).astype(np.float32)
  unembedding = rng.normal(size=(6, 32)).astype(np.float32)
  point = labels == 11
  loss_mask = labels >= 0
  cases = dict(
      numeric_token_loss=lambda z: ntil_jax.numeric_token_loss(
          z,
          labels,
          loss_mask=loss_mask,
          digit_mask=digit_mask,
          decimal_point_mask=point,
      ),
      ntil_loss=lambda z: ntil_jax.ntil_loss(
          z, labels, digit_mask, decimal_point_mask=point
      ),
      emd_loss=lambda z: ntil_jax.emd_loss(z, labels, digit_mask),
      ntl_mse_loss=lambda z: ntil_jax.ntl_mse_loss(z, labels, digit_mask),
      soft_label=lambda z: ntil_jax.soft_label_cross_entropy(
          z, labels, digit_mask
      ),
      cross_entropy=lambda z: ntil_jax.cross_entropy(z, labels, loss_mask),
      token_statistics=lambda z: ntil_jax.token_statistics(
          z, labels, mask=loss_mask
      ).log_norm,
  )
  fused = lambda h: ntil_jax.fused_numeric_loss(
      h, unembedding, labels, digit_mask, loss_mask=loss_mask
  )

  @jax.jit
  def every_case(z, h):  # one program: one compile
    grads = {
        name: jax.value_and_grad(lambda x, f=f: f(x).sum())(z)
        for name, f in cases.items()
    }
    return dict(grads, fused=jax.value_and_grad(lambda x: fused(x).sum())(h))

  want = every_case(logits, hidden)
  with jax.set_mesh(mesh):
    split = NamedSharding(mesh, P(("data", "fsdp")))
    got = every_case(*(jax.device_put(x, split) for x in (logits, hidden)))
  for name in want:
    for g, w in zip(got[name], want[name]):
      np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6, err_msg=name)


def number_tokens(mesh):
  """NTIL on numbers in tokens of 1-3 digits (the digit slots of
  ntil_jax.chunks), batch- or sequence-sharded, equals it on one device."""
  pieces, logits, labels, mask, decimal = test_chunks.case()
  tokens = ntil_jax.number_tokens(pieces)
  rows = np.arange(4) % len(labels)  # 4 rows, one a device
  logits, labels, mask, decimal = (
      x[rows] for x in (logits, labels, mask, decimal)
  )

  def loss(z, labels, mask, decimal):
    return ntil_jax.numeric_token_loss(
        z,
        labels,
        loss_mask=mask,
        digit_mask=mask,
        digit_token_ids=tokens,
        decimal_point_mask=decimal,
    )

  grad = jax.jit(jax.value_and_grad(lambda *a: loss(*a).sum()))
  want = grad(logits, labels, mask, decimal)
  for spec in (P(("data", "fsdp")), P(None, ("data", "fsdp"))):
    with jax.set_mesh(mesh):
      put = lambda x, spec=spec: jax.device_put(x, NamedSharding(mesh, spec))
      got = grad(*map(put, (logits, labels, mask, decimal)))
      split = tuple(got[1].sharding.spec)[: len(spec)]
      assert split == tuple(spec), got[1].sharding
    np.testing.assert_allclose(got[0], want[0], rtol=1e-6, err_msg=str(spec))
    np.testing.assert_allclose(
        got[1], want[1], rtol=1e-5, atol=1e-7, err_msg=str(spec)
    )


if __name__ == "__main__":
  main()
