"""The learning-rate schedule, with its numbers as arguments of the step.

``optax.warmup_cosine_decay_schedule(0, peak, warmup, decay, 0.1 * peak)``
traces its numbers into the step as constants, so a run of another length
or learning rate compiled a step of its own: a grid's budgets, a
learning-rate sweep and a run resumed with more steps each paid a compile
of the whole step (seconds on a CPU, minutes for a large model). Here the
same schedule reads them from :class:`Values`, float32 and int32 scalars
the step takes as an argument and passes to the optimizer
(:func:`scale_by_learning_rate`, an optax transformation with extra
arguments), so every run with the same model, loss and optimizer shares
one compiled step.

The value at every step is bit for bit optax's: the same float32
operations in the same order on the same float32 numbers (the test suite
compares them step by step), and the optimizer state is optax's
(``ScaleByScheduleState``), so checkpoints written before load unchanged.
"""

from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax


class Values(NamedTuple):
  """A warmup + cosine decay schedule's numbers, as step arguments.

  The linear warmup goes from 0 to ``peak`` over ``warmup`` steps; the
  cosine decay from ``peak`` to ``alpha * peak`` over the next
  ``cosine_steps`` steps, and stays there. Every float is the float32 that
  optax's program holds as a constant: XLA turns a division by a constant
  into a product with its float32 reciprocal, so the reciprocals are here.

  Attributes:
    peak: float32, the learning rate at the end of the warmup.
    warmup: int32, the warmup's steps (0: none).
    inverse_warmup: float32, ``1 / warmup`` (1 without a warmup).
    cosine_steps: float32, the decay's steps after the warmup (> 0).
    inverse_cosine_steps: float32, ``1 / cosine_steps``.
    alpha: float32, the final learning rate's share of ``peak``.
    one_minus_alpha: float32, ``1 - alpha`` rounded once from float64, as
      optax computes it.
  """

  peak: chex.Array
  warmup: chex.Array
  inverse_warmup: chex.Array
  cosine_steps: chex.Array
  inverse_cosine_steps: chex.Array
  alpha: chex.Array
  one_minus_alpha: chex.Array


def values(peak, warmup_steps: int, decay_steps: int, end_value) -> Values:
  """The :class:`Values` of optax's ``warmup_cosine_decay_schedule``.

  Args:
    peak: the peak learning rate.
    warmup_steps: steps of the linear warmup from 0 (>= 0).
    decay_steps: the whole schedule's length, warmup included
      (> ``warmup_steps``).
    end_value: the learning rate after ``decay_steps``.

  Raises:
    ValueError: for a negative warmup or a decay that does not outlast it
      (optax's cosine decay needs positive steps).
  """
  if warmup_steps < 0 or decay_steps <= warmup_steps:
    raise ValueError(
        "the schedule needs 0 <= warmup_steps < decay_steps, got "
        f"warmup_steps={warmup_steps}, decay_steps={decay_steps}."
    )
  alpha = 0.0 if peak == 0.0 else end_value / peak  # float64, as optax
  one = np.float32(1)
  cosine_steps = np.float32(decay_steps - warmup_steps)
  return Values(
      peak=np.float32(peak),
      warmup=np.int32(warmup_steps),
      inverse_warmup=one / np.float32(max(warmup_steps, 1)),
      cosine_steps=cosine_steps,
      inverse_cosine_steps=one / cosine_steps,
      alpha=np.float32(alpha),
      one_minus_alpha=np.float32(1 - alpha),
  )


def short_run_warmup(
    warmup_steps: int, train_steps: int, minimum: int = 0
) -> int:
  """``warmup_steps``, at most a tenth of ``train_steps`` (at least ``minimum``).

  A short run (a demo, a grid's smoke profile) keeps its warmup well under
  its schedule's horizon; a run of ten times the warmup or more keeps it.
  ``minimum`` keeps a warmup of that many steps in runs shorter than ten
  times it (never more than ``warmup_steps``).

  >>> short_run_warmup(100, 3000)  # a long run keeps the config's warmup
  100
  >>> short_run_warmup(100, 300)  # a short one: a tenth of its steps
  30
  >>> short_run_warmup(100, 5), short_run_warmup(100, 5, minimum=1)
  (0, 1)
  """
  return min(warmup_steps, max(minimum, train_steps // 10))


def learning_rate(count: chex.Array, schedule: Values) -> chex.Array:
  """The learning rate at step ``count`` (int32), a float32 scalar.

  Optax's ``join_schedules`` of its ``linear_schedule`` (0 to peak) and
  ``cosine_decay_schedule``, written with the numbers as arrays, operation
  for operation as XLA compiles optax's.
  """
  # linear_schedule(0.0, peak, warmup); with no warmup the join below never
  # reads it (optax's is then the constant 0).
  ramp = jnp.clip(count, 0, schedule.warmup).astype(jnp.float32)
  fraction = 1 - ramp * schedule.inverse_warmup
  warming = fraction * (-schedule.peak) + schedule.peak
  # cosine_decay_schedule(peak, cosine_steps, alpha) at count - warmup.
  decay_count = jnp.minimum(
      (count - schedule.warmup).astype(jnp.float32), schedule.cosine_steps
  )
  angle = decay_count * jnp.float32(np.pi) * schedule.inverse_cosine_steps
  cosine = (jnp.cos(angle) + 1) * 0.5
  decayed = cosine * schedule.one_minus_alpha + schedule.alpha
  return jnp.where(count < schedule.warmup, warming, decayed * schedule.peak)


def scale_by_learning_rate() -> optax.GradientTransformationExtraArgs:
  """``optax.scale_by_learning_rate`` of the schedule its update is given.

  ``update(updates, state, params, *, schedule)`` scales by ``-``
  :func:`learning_rate` at the state's count, ``schedule`` a
  :class:`Values`; the state is optax's ``ScaleByScheduleState``.
  """

  def init_fn(params):
    del params
    return optax.ScaleByScheduleState(count=jnp.zeros([], jnp.int32))

  def update_fn(updates, state, params=None, *, schedule: Values, **extra):
    del params, extra
    step_size = -1 * learning_rate(state.count, Values(*schedule))
    updates = jax.tree.map(
        lambda g: jnp.array(step_size, dtype=g.dtype) * g, updates
    )
    return updates, optax.ScaleByScheduleState(
        count=optax.safe_increment(state.count)
    )

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)
