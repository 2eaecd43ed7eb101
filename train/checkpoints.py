"""Checkpoints: the model, optimizer and data iterator saved together.

orbax saves asynchronously; a save that cannot be written stops the run at
once (`save_checkpoint`), and a checkpoint that cannot be read or holds NaN
or inf is moved aside with one warning (`restore_latest`).
"""

import os
import shutil

from absl import logging
from flax import nnx
import grain
import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp

from train import errors
from train import rundir


def checkpoint_manager(workdir, config) -> ocp.CheckpointManager:
  return ocp.CheckpointManager(
      os.path.join(os.path.abspath(workdir), "checkpoints"),
      options=ocp.CheckpointManagerOptions(
          max_to_keep=config.keep_checkpoints,
          create=True,
          enable_async_checkpointing=True,
      ),
  )


def save_checkpoint(manager, step, model, optimizer, train_iter, *, wait=False):
  """Starts an async save of step ``step``; TrainingError if it cannot.

  A directory that cannot be written makes orbax wait out a 300 s barrier
  in a background thread, so a probe write goes first: a failed save stops
  the run at once with the reason.
  """
  directory = str(manager.directory)
  try:
    if jax.process_index() == 0:
      rundir.probe_writable(directory)
    state = nnx.to_pure_dict(nnx.state((model, optimizer)))
    manager.save(
        step,
        args=ocp.args.Composite(
            state=ocp.args.StandardSave(state),
            train_iter=grain.checkpoint.CheckpointSave(train_iter),
        ),
        force=True,
    )
    if wait:
      manager.wait_until_finished()
  except (errors.Interrupted, errors.TrainingError):
    raise
  except Exception as error:  # pylint: disable=broad-except
    raise errors.TrainingError(
        f"saving checkpoint {step} into {directory} failed "
        f"({type(error).__name__}: {errors.first_line(error)}); the run stops. "
        "Free the directory and rerun to resume from the last "
        "checkpoint."
    ) from error


def all_finite(tree) -> bool:
  """Whether every floating-point leaf of ``tree`` is finite."""
  leaves = [
      x
      for x in jax.tree.leaves(tree)
      if jnp.issubdtype(jnp.asarray(x).dtype, jnp.floating)
  ]
  return all(bool(jnp.isfinite(x).all()) for x in leaves)


def restore_latest(manager, model, optimizer, train_iter, workdir) -> int:
  """Restores the newest good checkpoint; returns its step (0 if none).

  A checkpoint that fails to restore, or holds a non-finite value, is moved
  aside (``corrupt-<step>``, kept for inspection) with one warning line, and
  the previous one is tried.
  """
  state = nnx.state((model, optimizer))
  target = jax.tree.map(
      ocp.utils.to_shape_dtype_struct, nnx.to_pure_dict(state)
  )
  steps = sorted(manager.all_steps(), reverse=True)
  for step in steps:
    try:
      restored = manager.restore(
          step,
          args=ocp.args.Composite(
              state=ocp.args.StandardRestore(target),
              train_iter=grain.checkpoint.CheckpointRestore(train_iter),
          ),
      )
      if not all_finite(restored["state"]):
        raise ValueError("it holds NaN or inf values")
    except Exception as error:  # pylint: disable=broad-except
      logging.warning(
          "checkpoint %d is unreadable (%s: %s); moved aside to "
          "corrupt-%d, falling back to the previous one.",
          step,
          type(error).__name__,
          errors.first_line(error),
          step,
      )
      if jax.process_index() == 0:
        directory = os.path.join(workdir, "checkpoints")
        shutil.move(
            os.path.join(directory, str(step)),
            os.path.join(directory, f"corrupt-{step}"),
        )
      manager.reload()
      continue
    nnx.replace_by_pure_dict(state, restored["state"])
    nnx.update((model, optimizer), state)
    return step
  if steps:
    logging.warning(
        "no readable checkpoint among steps %s: training "
        "restarts from step 0.",
        sorted(steps),
    )
  return 0
