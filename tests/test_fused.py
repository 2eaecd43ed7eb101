"""The fused path equals the logits path, values and gradients."""

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np

import ntil_jax
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


if __name__ == "__main__":
  absltest.main()
