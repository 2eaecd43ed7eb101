"""train.step.batch_loss: unscored positions cannot reach the loss or gradient.

A model may put NaN or inf at positions the batch does not score (padding,
question tokens); the trainer masks them out of the token statistics, on the
logits path and on the fused path alike.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ntil_jax

from configs import arithmetic_mix
from train import step

VOCAB, DIM, BATCH, LENGTH = 24, 8, 2, 10


class FakeModel:
  """What batch_loss reads of a model: hidden states, W and the projection.

  Its hidden states are NaN where ``poison`` is true.
  """

  class config:  # pylint: disable=invalid-name
    vocab_size = VOCAB

  def __init__(self, hidden, unembedding, poison):
    self.hidden, self.unembedding, self.poison = hidden, unembedding, poison

  def hidden_states(self, inputs, images):
    del inputs, images
    return jnp.where(self.poison[..., None], jnp.nan, self.hidden)

  def project(self, hidden):
    return hidden @ self.unembedding


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


@pytest.mark.parametrize("fused", [False, True, "tokamax", "chunked"])
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


@pytest.mark.parametrize("fused", [False, True, "tokamax"])
def test_decimal_points_join_numbers(fused):
  """'3.25' is one number with places 0, -1, -2, not the integer 325."""
  config = arithmetic_mix.get_config("ntil")
  config.fused_loss = fused
  point = 11  # the fake model's '.' token
  # Answers "3.25" and "40.9" after a three-token question, then padding.
  targets = np.array(
      [
          [20, 21, 22, 3, point, 2, 5, 12, 12, 12],
          [20, 21, 22, 4, 0, point, 9, 12, 12, 12],
      ],
      np.int32,
  )
  loss_mask = np.zeros((BATCH, LENGTH), bool)
  loss_mask[:, 3:8] = True
  batch = dict(
      inputs=jnp.asarray(targets),
      targets=jnp.asarray(targets),
      loss_mask=jnp.asarray(loss_mask),
      digit_mask=jnp.asarray(targets < 10),
  )
  rng = np.random.default_rng(2)
  hidden = rng.normal(size=(BATCH, LENGTH, DIM)).astype(np.float32)
  unembedding = rng.normal(size=(DIM, VOCAB)).astype(np.float32)
  model = FakeModel(hidden, unembedding, np.zeros((BATCH, LENGTH), bool))
  model.decimal_point_token_id = point
  value, metrics = step.batch_loss(model, batch, config, None)

  logits = hidden @ unembedding
  ce = ntil_jax.cross_entropy(logits, targets, loss_mask)
  kwargs = dict(sigma=config.sigma, alpha=config.alpha, beta=config.beta)
  kwargs.update(tau=config.tau, noise_scale=config.gumbel_noise)
  digits = loss_mask & (targets < 10)
  decimal = ntil_jax.ntil_loss(
      logits, targets, digits, decimal_point_mask=targets == point, **kwargs
  )
  integer = ntil_jax.ntil_loss(logits, targets, digits, **kwargs)
  want = (ce.sum() + config.lam * decimal.sum()) / loss_mask.sum()
  np.testing.assert_allclose(value, want, rtol=1e-5)
  np.testing.assert_allclose(
      metrics["numeric"], decimal.sum() / digits.sum(), rtol=1e-5
  )
  # The decimals change the loss: "3.25" scored as 325 would differ.
  assert abs(float(decimal.sum()) - float(integer.sum())) > 1e-3
  # The reference weighting logs the same plain auxiliary loss (it logged
  # the CE rescaled, sg(CE / aux) * aux).
  config.weighting = "reference"
  _, reference = step.batch_loss(model, batch, config, None)
  np.testing.assert_allclose(
      reference["numeric"], metrics["numeric"], rtol=1e-5
  )
  # The authors' loss splits "3.25" at the point, as their code does; its
  # value is (1 + lam) times the CE.
  config.weighting = "authors"
  value, authors = step.batch_loss(model, batch, config, None)
  np.testing.assert_allclose(
      authors["numeric"], integer.sum() / digits.sum(), rtol=1e-5
  )
  np.testing.assert_allclose(
      value, (1 + config.lam) * ce.sum() / loss_mask.sum(), rtol=1e-5
  )
  # A peer under the NTIL authors' aggregation still reads '.' as its own
  # code does (DEL's place weights for 3.25; it was scored as 3 and 25).
  config.method = "del"
  _, peer = step.batch_loss(model, batch, config, None)
  joined = ntil_jax.del_loss(
      logits, targets, digits, decimal_point_mask=targets == point
  )
  split = ntil_jax.del_loss(logits, targets, digits)
  np.testing.assert_allclose(
      peer["numeric"], joined.sum() / digits.sum(), rtol=1e-5
  )
  assert abs(float(joined.sum()) - float(split.sum())) > 1e-3


def test_fused_implementations_agree():
  """fused_loss=True / 'chunked' / 'tokamax' / False: one loss, one gradient."""
  batch = make_batch(3)
  rng = np.random.default_rng(4)
  hidden = rng.normal(size=(BATCH, LENGTH, DIM)).astype(np.float32)
  unembedding = rng.normal(size=(DIM, VOCAB)).astype(np.float32)
  poison = np.zeros((BATCH, LENGTH), bool)
  results = {}
  for fused in (False, True, "chunked", "tokamax"):
    config = arithmetic_mix.get_config("ntil")
    config.fused_loss = fused

    def loss(h, w, config=config):
      value, _ = step.batch_loss(FakeModel(h, w, poison), batch, config, None)
      return value

    results[fused] = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))(
        hidden, unembedding
    )
  want = jax.tree.leaves(results[False])
  for fused in (True, "chunked", "tokamax"):
    for got, exact in zip(jax.tree.leaves(results[fused]), want):
      np.testing.assert_allclose(got, exact, rtol=2e-5, atol=1e-6)


@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("method", ["ce", "ntil", "emd"])
def test_score_positions_give_the_same_loss_and_gradient(fused, method):
  """Unembedding only a window of positions that holds every scored one."""
  config = arithmetic_mix.get_config(method)
  config.fused_loss = fused
  batch = make_batch(3)  # positions 4-7 scored in both rows
  rng = np.random.default_rng(4)
  hidden = rng.normal(size=(BATCH, LENGTH, DIM)).astype(np.float32)
  unembedding = rng.normal(size=(DIM, VOCAB)).astype(np.float32)
  no_poison = np.zeros((BATCH, LENGTH), bool)
  # Each row's window differs and holds unscored positions, in order.
  windowed = dict(
      batch,
      score_positions=jnp.asarray([[2, 3, 4, 5, 6, 7], [4, 5, 6, 7, 8, 9]]),
  )

  def loss(h, w, data):
    model = FakeModel(h, w, no_poison)
    return step.batch_loss(model, data, config, None)

  grad = jax.jit(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True))
  (value, metrics), (dh, dw) = grad(hidden, unembedding, batch)
  (win_value, win_metrics), (win_dh, win_dw) = grad(
      hidden, unembedding, windowed
  )
  assert value > 0
  np.testing.assert_allclose(win_value, value, rtol=1e-6)
  for name in ("ce", "numeric"):
    np.testing.assert_allclose(win_metrics[name], metrics[name], rtol=1e-6)
  np.testing.assert_allclose(win_dw, dw, rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(win_dh, dh, rtol=1e-5, atol=1e-7)
  # A window that misses a scored position loses its loss: the window
  # must hold every scored position (the task's contract).
  short = dict(batch, score_positions=jnp.asarray([[4, 5, 6], [4, 5, 6]]))
  (short_value, _), _ = grad(hidden, unembedding, short)
  assert not np.isclose(short_value, value, rtol=1e-3)
  if method == "ntil":  # NTIL reads numbers from adjacent digits, in order
    shuffled = dict(
        batch, score_positions=jnp.asarray([[7, 2, 3, 4, 6, 5]] * BATCH)
    )
    (shuffled_value, _), _ = grad(hidden, unembedding, shuffled)
    assert not np.isclose(shuffled_value, value, rtol=1e-5)


def test_scored_window_gathers_labels_per_row():
  batch = make_batch(5)
  positions = np.array([[1, 4, 7], [0, 9, 5]])
  window = step.scored_window(dict(batch, score_positions=positions))
  for name in step.LABEL_KEYS:
    full = np.asarray(batch[name])
    expected = np.stack([full[0, [1, 4, 7]], full[1, [0, 9, 5]]])
    np.testing.assert_array_equal(window[name], expected)
  assert step.scored_window(batch)["targets"] is batch["targets"]
