"""The fused path equals the logits path, values and gradients."""

import re
from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np

import ntil_jax
from ntil_jax import fused as fused_lib
from ntil_jax.kernels import chunked as chunked_lib
from tests.test_losses import PERMUTED_IDS, random_case

jax.config.update("jax_default_matmul_precision", "highest")


def hidden_case(seed, batch, length, dim, vocab, ids=range(10)):
  rng = np.random.default_rng(seed)
  hidden = rng.standard_normal((batch, length, dim)).astype(np.float32)
  unembedding = (rng.standard_normal((dim, vocab)) / np.sqrt(dim)).astype(
      np.float32
  ) * 3
  _, labels, digit_mask = random_case(seed, batch, length, vocab, ids)
  return hidden, unembedding, labels, digit_mask


def both_paths(
    method,
    hidden,
    unembedding,
    labels,
    digit_mask,
    chunk_size,
    ids=None,
    **kwargs,
):
  loss_mask = labels >= 0

  def logits_path(h, w):
    logits = jnp.einsum("...td,dv->...tv", h, w)
    return ntil_jax.numeric_token_loss(
        logits,
        labels,
        loss_mask=loss_mask,
        digit_mask=digit_mask,
        method=method,
        digit_token_ids=ids,
        **kwargs,
    )

  def fused_path(h, w):
    return ntil_jax.fused_numeric_loss(
        h,
        w,
        labels,
        digit_mask,
        loss_mask=loss_mask,
        method=method,
        digit_token_ids=ids,
        chunk_size=chunk_size,
        **kwargs,
    )

  results = []
  for fn in (logits_path, fused_path):
    value = jax.jit(fn)(hidden, unembedding)
    grads = jax.jit(
        jax.grad(lambda h, w, fn=fn: fn(h, w).sum(), argnums=(0, 1))
    )(hidden, unembedding)
    results.append((value, grads))
  return results


class FusedTest(parameterized.TestCase):

  @parameterized.product(
      method=("ce", "emd", "ntl_mse", "soft_label", "ntil"),
      chunk_size=(3, 16, 64, None),
  )
  def test_equals_logits_path(self, method, chunk_size):
    # Length 37 is no multiple of 3 or 16: numbers straddle chunk edges and
    # the last chunk is padded.
    case = hidden_case(1, 2, 37, 16, 48)
    (want, want_grads), (got, got_grads) = both_paths(
        method, *case, chunk_size=chunk_size
    )
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
    for g, w in zip(got_grads, want_grads):
      np.testing.assert_allclose(g, w, rtol=1e-3, atol=1e-5)

  def test_numbers_split_across_chunks(self):
    # One 12-digit number over chunks of 5: the number-level term needs it
    # whole; a per-chunk computation would see three numbers.
    hidden, unembedding, _, _ = hidden_case(2, 1, 16, 8, 20)
    labels = np.array(
        [[15] * 2 + [4, 0, 9, 1, 2, 3, 8, 7, 6, 5, 1, 2] + [16] * 2]
    )
    mask = np.ones_like(labels, bool)
    (want, want_grads), (got, got_grads) = both_paths(
        "ntil", hidden, unembedding, labels, mask, chunk_size=5
    )
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
    for g, w in zip(got_grads, want_grads):
      np.testing.assert_allclose(g, w, rtol=1e-3, atol=1e-5)
    parts = ntil_jax.ntil_components(hidden @ unembedding, labels, mask)
    self.assertEqual(int(np.count_nonzero(parts.relative + parts.magnitude)), 1)

  def test_permuted_ids_and_leading_batch_dims(self):
    hidden, unembedding, labels, mask = hidden_case(
        3, 4, 9, 8, 40, PERMUTED_IDS
    )
    reshape = lambda x: x.reshape((2, 2) + x.shape[1:])
    (want, want_grads), (got, got_grads) = both_paths(
        "ntil",
        reshape(hidden),
        unembedding,
        reshape(labels),
        reshape(mask),
        chunk_size=4,
        ids=np.asarray(PERMUTED_IDS),
        sigma=0.5,
    )
    self.assertEqual(got.shape, (2, 2, 9))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
    for g, w in zip(got_grads, want_grads):
      np.testing.assert_allclose(g, w, rtol=1e-3, atol=1e-5)

  @parameterized.parameters("ntil", "emd")
  def test_decimal_points_equal_logits_path(self, method):
    hidden, unembedding, labels, mask = hidden_case(8, 2, 30, 8, 24)
    # Points at some non-digit labels, many between two digits.
    point = (labels >= 10) & (
        np.random.default_rng(8).random(labels.shape) < 0.5
    )
    (want, want_grads), (got, got_grads) = both_paths(
        method,
        hidden,
        unembedding,
        labels,
        mask,
        chunk_size=16,
        decimal_point_mask=point,
    )
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    for g, w in zip(got_grads, want_grads):
      np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)
    with self.assertRaisesRegex(ValueError, r"decimal_point_mask shape"):
      ntil_jax.fused_numeric_loss(
          hidden, unembedding, labels, mask, decimal_point_mask=point[:1]
      )

  def test_peak_memory_is_a_fraction_of_the_logits_path(self):
    # XLA's planned memory (deterministic, not a timing): one chunk of logits
    # instead of all of them.
    hidden, unembedding, labels, mask = hidden_case(4, 2, 256, 32, 4096)

    def planned_bytes(fn):
      grad = jax.jit(jax.grad(lambda h, w: fn(h, w).sum(), argnums=(0, 1)))
      stats = grad.lower(hidden, unembedding).compile().memory_analysis()
      return stats.temp_size_in_bytes + stats.output_size_in_bytes

    logits_path = lambda h, w: ntil_jax.numeric_token_loss(
        h @ w, labels, digit_mask=mask
    )
    fused = lambda h, w: ntil_jax.fused_numeric_loss(
        h, w, labels, mask, chunk_size=32
    )
    self.assertLess(planned_bytes(fused), 0.25 * planned_bytes(logits_path))

  def test_bad_input(self):
    hidden, unembedding, labels, mask = hidden_case(5, 1, 4, 8, 12)
    with self.assertRaisesRegex(ValueError, "disagree on D"):
      ntil_jax.fused_numeric_loss(hidden, unembedding[:4], labels, mask)
    with self.assertRaisesRegex(ValueError, r"labels shape \(1, 3\)"):
      ntil_jax.fused_numeric_loss(hidden, unembedding, labels[:, :3], mask)
    with self.assertRaisesRegex(ValueError, "unknown method"):
      ntil_jax.fused_numeric_loss(
          hidden, unembedding, labels, mask, method="wasserstein"
      )
    with self.assertRaisesRegex(ValueError, "chunk_size"):
      ntil_jax.fused_numeric_loss(
          hidden, unembedding, labels, mask, chunk_size=0
      )


class ChunkSizeTest(parameterized.TestCase):

  @parameterized.parameters(
      # CPU: about 4M float32 logits per block.
      ("cpu", 151936, 27),
      ("cpu", 32768, 128),
      ("cpu", 2**23, 1),
      # GPU and TPU: a 512 MiB float32 block, in multiples of 256 tokens,
      # at least 256.
      ("gpu", 151936, 768),
      ("gpu", 32768, 4096),
      ("tpu", 151936, 768),
      ("tpu", 256000, 512),
      ("gpu", 2**22, 256),
  )
  def test_rule_per_backend(self, backend, vocab_size, want):
    got = fused_lib.default_chunk_size(vocab_size, backend=backend)
    self.assertEqual(got, want)
    if backend != "cpu":
      self.assertEqual(got % 256, 0)
      self.assertLessEqual(
          got * vocab_size * 4, max(2**29, 256 * vocab_size * 4)
      )

  def test_capped_by_the_tokens(self):
    self.assertEqual(
        fused_lib.default_chunk_size(32768, num_tokens=1000, backend="gpu"),
        1000,
    )
    self.assertEqual(
        fused_lib.default_chunk_size(32768, num_tokens=100, backend="cpu"),
        100,
    )
    self.assertEqual(
        fused_lib.default_chunk_size(32768, num_tokens=10**6, backend="gpu"),
        4096,
    )

  def test_default_backend(self):
    self.assertEqual(
        fused_lib.default_chunk_size(151936),
        fused_lib.default_chunk_size(151936, backend=jax.default_backend()),
    )
    with self.assertRaisesRegex(ValueError, "vocab_size"):
      fused_lib.default_chunk_size(0)

  @parameterized.parameters(None, 8)
  def test_accelerator_geometry_equals_logits_path(self, chunk_size):
    # With jax reporting a GPU, tiles span whole multiples of 128 columns
    # and the default chunk covers every token; the values and gradients
    # are still the logits path's.
    case = hidden_case(6, 2, 37, 16, 300)
    # chunk_size=8: three tiles of 19 positions by 128 columns, the last
    # ones shifted back to end at the edges.
    self.assertEqual(chunked_lib._tiles(37, 300, 2, 8 * 300, 128), (19, 128))
    with mock.patch.object(jax, "default_backend", return_value="gpu"):
      (want, want_grads), (got, got_grads) = both_paths(
          "ntil", *case, chunk_size=chunk_size
      )
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
    for g, w in zip(got_grads, want_grads):
      np.testing.assert_allclose(g, w, rtol=1e-3, atol=1e-5)


def _bfloat16_case(dim):
  hidden, unembedding, labels, digit_mask = hidden_case(7, 2, 24, dim, 160)
  return (
      jnp.asarray(hidden, jnp.bfloat16),
      jnp.asarray(unembedding, jnp.bfloat16),
      labels,
      digit_mask,
  )


def _tensor_types(signature):
  """``[(shape, dtype)]`` of every ``tensor<AxBxdtype>`` in a signature."""
  types = []
  for spec in re.findall(r"tensor<([^>]*)>", signature):
    *dims, dtype = spec.split("x")
    types.append((tuple(int(d) for d in dims), dtype))
  return types


class BFloat16Test(parameterized.TestCase):

  def test_vocabulary_wide_matmuls_take_bfloat16(self):
    # D = 48 is no other dimension of the program, so every tensor with a
    # 48 is the hidden states, the unembedding, a slice of either or their
    # gradient. The lowered program is read, before XLA's CPU backend
    # rewrites bf16 dots for its own kernels.
    dim = 48
    hidden, unembedding, labels, digit_mask = _bfloat16_case(dim)

    def loss(h, w):
      return ntil_jax.fused_numeric_loss(
          h, w, labels, digit_mask, chunk_size=16
      ).mean()

    text = (
        jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))
        .lower(hidden, unembedding)
        .as_text()
    )
    dots = [
        _tensor_types(line.split(" : ")[-1])
        for line in text.splitlines()
        if "stablehlo.dot_general" in line
    ]
    wide = [d for d in dots if any(dim in shape for shape, _ in d[:2])]
    # Forward logits, recomputed logits, d hidden and d W.
    self.assertLen(wide, 4, dots)
    for lhs, rhs, out in wide:
      self.assertEqual((lhs[1], rhs[1], out[1]), ("bf16", "bf16", "f32"))
    upcasts = [
        types
        for line in text.splitlines()
        if "stablehlo.convert" in line
        for types in [_tensor_types(line.split(" : ")[-1])]
        if types[0][1] == "bf16"
        and types[-1][1] == "f32"
        and dim in types[0][0]
    ]
    self.assertEqual(upcasts, [])

  def test_gradients_close_to_float32(self):
    hidden, unembedding, labels, digit_mask = _bfloat16_case(32)
    loss_mask = labels >= 0

    def loss(h, w):
      return ntil_jax.fused_numeric_loss(
          h, w, labels, digit_mask, loss_mask=loss_mask, chunk_size=16
      ).sum()

    grad = jax.jit(jax.grad(loss, argnums=(0, 1)))
    got = grad(hidden, unembedding)
    self.assertEqual([g.dtype for g in got], [jnp.bfloat16] * 2)
    # The exact gradient: float32 of the same (bf16-valued) inputs.
    h32, w32 = hidden.astype(jnp.float32), unembedding.astype(jnp.float32)
    exact = grad(h32, w32)
    # ... and the gradient G of the loss w.r.t. the float32 logits.
    logits_grad = jax.grad(
        lambda z: ntil_jax.numeric_token_loss(
            z, labels, loss_mask=loss_mask, digit_mask=digit_mask
        ).sum()
    )(jnp.einsum("btd,dv->btv", h32, w32))
    # bf16 keeps 8 bits, so the path rounds twice, each time by at most
    # 2**-9 relative: G before the two matmuls (an error of at most
    # 2**-9 * |G| @ |W|^T in d hidden, 2**-9 * |H|^T @ |G| in d W) and the
    # float32 result at the end (2**-9 * |exact|). Allowed: twice that.
    bounds = (
        jnp.einsum("btv,dv->btd", jnp.abs(logits_grad), jnp.abs(w32)),
        jnp.einsum("btd,btv->dv", jnp.abs(h32), jnp.abs(logits_grad)),
    )
    for g, e, bound in zip(got, exact, bounds):
      error = np.abs(np.asarray(g, np.float32) - np.asarray(e))
      allowed = 2 * 2.0**-9 * (np.asarray(bound) + np.abs(np.asarray(e)))
      self.assertTrue(np.all(error <= allowed), np.max(error - allowed))
      # Not vacuous: the bound is well below the gradient's own size.
      self.assertLess(np.median(allowed), 0.1 * np.abs(e).max())


if __name__ == "__main__":
  absltest.main()
