"""The learning-rate schedule as step arguments is optax's, bit for bit."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from configs import arithmetic_mix
from train import schedule
from train import step as step_lib

# (peak, warmup_steps, decay_steps): with and without a warmup, a decay one
# step past it, a zero peak, and the trainer's usual shapes.
SCHEDULES = (
    (3e-3, 10, 100),
    (1e-3, 0, 7),
    (1e-4, 200, 2400),
    (3e-3, 1, 2),
    (0.0, 5, 9),
    (2.5e-4, 30, 31),
    (1e-3, 16, 1200),
    (7e-5, 3, 50),
)


def _bits(x):
  return np.asarray(x, np.float32).view(np.int32)


def test_every_step_is_optaxs_value():
  """Each step's rate, from 0 to past the decay, in one program with the
  numbers as arguments, equals optax's schedule traced with them as
  constants (in its own program) to the last bit."""
  traced = jax.jit(
      jax.vmap(lambda c, v: schedule.learning_rate(c, v), in_axes=(0, None))
  )
  for peak, warmup, decay in SCHEDULES:
    reference = optax.warmup_cosine_decay_schedule(
        0.0, peak, warmup, decay, 0.1 * peak
    )
    counts = jnp.arange(decay + 20, dtype=jnp.int32)
    expected = jax.jit(jax.vmap(reference))(counts)
    got = traced(counts, schedule.values(peak, warmup, decay, 0.1 * peak))
    np.testing.assert_array_equal(
        _bits(got), _bits(expected), err_msg=f"{peak, warmup, decay}"
    )
    assert float(got[warmup]) == pytest.approx(peak, rel=1e-6)
    assert float(got[-1]) == pytest.approx(0.1 * peak, rel=1e-5)


def _config():
  """The trainer's optimizer settings, on a short schedule."""
  config = arithmetic_mix.get_config("ce")
  config.learning_rate, config.warmup_steps, config.lr_decay_steps = 3e-3, 2, 6
  return config


def _adamw(traced):
  """The trainer's optimizer, or optax.adamw with the same schedule inside."""
  config = _config()
  if traced:
    return step_lib.make_optimizer(config)
  return optax.chain(
      optax.clip_by_global_norm(config.grad_clip_norm),
      optax.adamw(
          optax.warmup_cosine_decay_schedule(
              0.0, 3e-3, 2, 6, 0.1 * config.learning_rate
          ),
          weight_decay=config.weight_decay,
      ),
  )


def test_adamw_updates_and_state_are_optaxs():
  """Eight updates (warmup, decay and after it) of the trainer's optimizer
  (`train.step.make_optimizer`, the schedule an argument) are optax.adamw's
  bit for bit, and its state has the same structure
  and values, so checkpoints of either load into the other."""
  rng = np.random.default_rng(0)
  params = {
      "w": jnp.asarray(rng.normal(size=(4, 3)), jnp.float32),
      "b": jnp.asarray(rng.normal(size=(3,)), jnp.float32),
  }
  values = step_lib.schedule_values(_config())
  results = {}
  for traced in (False, True):
    tx = _adamw(traced)
    extra = dict(schedule=values) if traced else {}

    @jax.jit
    def step(params, state, grads, extra=extra, tx=tx):
      updates, state = tx.update(grads, state, params, **extra)
      return optax.apply_updates(params, updates), state

    p, state = params, tx.init(params)
    for i in range(8):
      grads = jax.tree.map(
          lambda x, i=i: jnp.sin(x * (i + 1)) * 3.0, p
      )  # norms above and below the clip
      p, state = step(p, state, grads)
    results[traced] = (p, state)
  (p0, s0), (p1, s1) = results[False], results[True]
  assert jax.tree.structure(s0) == jax.tree.structure(s1)
  for a, b in zip(jax.tree.leaves((p0, s0)), jax.tree.leaves((p1, s1))):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert not np.allclose(p0["w"], params["w"])  # it trained


@pytest.mark.parametrize("warmup, decay", [(-1, 5), (5, 5), (5, 4)])
def test_a_schedule_that_cannot_decay_is_refused(warmup, decay):
  with pytest.raises(ValueError, match="warmup_steps < decay_steps"):
    schedule.values(1e-3, warmup, decay, 1e-4)


@pytest.mark.parametrize(
    "warmup, decay, steps, expected",
    [
        (100, 0, 2000, None),
        (0, 0, 5, None),
        (10, 5, 2000, "lr_decay_steps=5: the learning rate does not decay."),
        (10, 0, 10, "train_steps=10: the learning rate does not decay and"),
        (100, 0, 3, "the 3 steps end before it reaches learning_rate"),
        (100, 300, 50, "the 50 steps end before it reaches learning_rate"),
    ],
)
def test_a_schedule_that_does_not_decay_is_named(
    warmup, decay, steps, expected
):
  from train import checks  # pylint: disable=g-import-not-at-top

  config = arithmetic_mix.get_config("ce")
  config.warmup_steps, config.lr_decay_steps = warmup, decay
  config.train_steps = steps
  warning = checks.schedule_warning(config)
  if expected is None:
    assert warning is None
  else:
    assert expected in warning and f"warmup_steps={warmup}" in warning


def test_a_run_never_evaluated_is_named():
  """eval_every_steps=0 skipped the final evaluation too, in silence."""
  from train import checks  # pylint: disable=g-import-not-at-top

  config = arithmetic_mix.get_config("ce")
  assert checks.evaluation_warning(config) is None
  config.eval_every_steps = 0
  assert "never evaluated, not even at its last step" in (
      checks.evaluation_warning(config)
  )


@pytest.mark.parametrize(
    "changes, decay, expected",
    [
        ([("train_steps", 100, 200)], 0, "decay now ends at step 200, not 100"),
        ([("train_steps", 100, 200)], 100, None),  # the schedule fixed
        ([("train_steps", 100, 200), ("lr_decay_steps", 0, 150)], 150, None),
        ([("eval_every_steps", 10, 20)], 0, None),
        ([], 0, None),
    ],
)
def test_a_resumed_run_whose_decay_moves_with_train_steps_is_named(
    changes, decay, expected
):
  """Extending train_steps with lr_decay_steps=0 changed the schedule of the
  remaining steps with only an INFO line."""
  from train import checks  # pylint: disable=g-import-not-at-top

  config = arithmetic_mix.get_config("ce")
  config.lr_decay_steps = decay
  warning = checks.horizon_warning(changes, config)
  if expected is None:
    assert warning is None
  else:
    assert expected in warning and "--config.lr_decay_steps=100" in warning


@pytest.mark.parametrize(
    "warmup, steps, minimum, expected",
    [
        (100, 2000, 0, 100),  # ten times the warmup or more: kept
        (100, 1000, 0, 100),
        (100, 999, 0, 99),
        (100, 40, 0, 4),
        (100, 9, 0, 0),  # under ten steps: no warmup
        (100, 9, 1, 1),  # ... unless a minimum is asked for
        (0, 9, 1, 0),  # never more than the config's
        (3, 400, 1, 3),
    ],
)
def test_a_short_run_keeps_its_warmup_under_a_tenth(
    warmup, steps, minimum, expected
):
  assert schedule.short_run_warmup(warmup, steps, minimum) == expected
  if expected > 0:  # and the schedule it gives can decay
    schedule.values(1e-3, expected, steps, 1e-4)
