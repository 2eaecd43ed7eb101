"""train.step.batch_loss: unscored positions cannot reach the loss or gradient.

A model may put NaN or inf at positions the batch does not score (padding,
question tokens); the trainer masks them out of the token statistics, on the
logits path and on the fused path alike.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import arithmetic_mix
from train import step

VOCAB, DIM, BATCH, LENGTH = 24, 8, 2, 10


class FakeModel:
  """What batch_loss reads of a model: logits, or hidden states and W.

  Its outputs (hidden states for the fused path, logits for the logits path)
  are NaN where ``poison`` is true.
  """

  class config:  # pylint: disable=invalid-name
    vocab_size = VOCAB

  def __init__(self, hidden, unembedding, poison):
    self.hidden, self.unembedding, self.poison = hidden, unembedding, poison

  def hidden_states(self, inputs, images):
    del inputs, images
    return jnp.where(self.poison[..., None], jnp.nan, self.hidden)

  def __call__(self, inputs, images):
    del inputs, images
    # Added, not selected: the NaN's cotangent flows back into h and W, so
    # only a zero gradient at those logits keeps them finite.
    offset = jnp.where(self.poison[..., None], jnp.nan, 0.0)
    return self.hidden @ self.unembedding + offset


def make_batch(seed):
  rng = np.random.default_rng(seed)
  targets = rng.integers(0, VOCAB, (BATCH, LENGTH)).astype(np.int32)
  loss_mask = np.zeros((BATCH, LENGTH), bool)
  loss_mask[:, 4:8] = True  # an answer in the middle, padding after it
  targets[:, 4:7] = rng.integers(0, 10, (BATCH, 3))
  return dict(
      inputs=jnp.asarray(targets),
      targets=jnp.asarray(targets),
      loss_mask=jnp.asarray(loss_mask),
      digit_mask=jnp.asarray(targets < 10),
  )


@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("method", ["ce", "ntil"])
def test_nan_outputs_at_unscored_positions(fused, method):
  config = arithmetic_mix.get_config(method)
  config.fused_loss = fused
  batch = make_batch(0)
  rng = np.random.default_rng(1)
  hidden = rng.normal(size=(BATCH, LENGTH, DIM)).astype(np.float32)
  unembedding = rng.normal(size=(DIM, VOCAB)).astype(np.float32)
  unscored = ~np.asarray(batch["loss_mask"])

  def loss(h, w, poison):
    value, _ = step.batch_loss(FakeModel(h, w, poison), batch, config, None)
    return value

  grad = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))
  clean_value, (clean_dh, clean_dw) = grad(
      hidden, unembedding, np.zeros_like(unscored)
  )
  value, (dh, dw) = grad(hidden, unembedding, unscored)
  assert np.isfinite(clean_value) and clean_value > 0
  # The same loss and gradients as with finite outputs there, and no
  # gradient into the unscored positions.
  np.testing.assert_allclose(value, clean_value, rtol=1e-6)
  np.testing.assert_allclose(dw, clean_dw, rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(dh, clean_dh, rtol=1e-5, atol=1e-7)
  assert np.all(np.asarray(dh)[unscored] == 0)
  assert np.abs(np.asarray(dh)[~unscored]).sum() > 0
