"""Everything a run checks before it compiles: config, data and workdir.

Each check raises `errors.ConfigError` with one line that says what to do.
"""

import os

import jax

from configs import common
import ntil_jax
from train import errors
from train import models
from train import rundir
from train import step
from train import tasks


def get_task(config):
  """The task module of ``config.task``; ConfigError if there is none."""
  try:
    return tasks.get(config.task)
  except ValueError as error:
    raise errors.ConfigError(str(error)) from error


DTYPES = ("float32", "bfloat16", "float16")
# Fields that must be >= 1, and fields that must be >= 0.
_POSITIVE = (
    "batch_size",
    "eval_batch_size",
    "checkpoint_every_steps",
    "log_every_steps",
    "fsdp",
    "keep_checkpoints",
    "max_question_len",
    "max_answer_len",
)
_NON_NEGATIVE = (
    "train_steps",
    "eval_every_steps",
    "eval_examples",
    "warmup_steps",
    "lr_decay_steps",
    "num_samples",
    "lam",
    "weight_decay",
    "gumbel_noise",
    "digit_ce_weight",
    "worker_count",
    "fused_chunk_size",
)


def _check_numbers(config) -> None:
  for name in _POSITIVE:
    if config[name] < 1:
      raise errors.ConfigError(f"{name} must be >= 1, got {config[name]}.")
  for name in _NON_NEGATIVE:
    if config[name] < 0:
      raise errors.ConfigError(f"{name} must be >= 0, got {config[name]}.")
  for name in ("learning_rate", "grad_clip_norm"):
    if not config[name] > 0:
      raise errors.ConfigError(f"{name} must be > 0, got {config[name]}.")


def check_directory(path: str, what: str) -> None:
  """ConfigError if ``path`` exists but is not a directory."""
  if os.path.exists(path) and not os.path.isdir(path):
    raise errors.ConfigError(f"{what} {path} is a file, not a directory.")


def check_config(config):
  """The config's task module; ConfigError (one line: what to do) if bad."""
  task = get_task(config)
  if config.method not in common.METHODS:
    raise errors.ConfigError(
        f"unknown method {config.method!r}; use one of "
        f"{', '.join(common.METHODS)}."
    )
  if not hasattr(task, "create_model") and config.model not in (
      models.MODEL_SIZES
  ):
    raise errors.ConfigError(
        f"unknown model size {config.model!r}; use one of "
        f"{', '.join(sorted(models.MODEL_SIZES))}."
    )
  if config.weighting not in ntil_jax.losses.WEIGHTINGS:
    raise errors.ConfigError(
        f"unknown weighting {config.weighting!r}; use one of "
        f"{', '.join(ntil_jax.losses.WEIGHTINGS)}."
    )
  if config.dtype not in DTYPES:
    raise errors.ConfigError(
        f"unknown dtype {config.dtype!r}; use one of " f"{', '.join(DTYPES)}."
    )
  _check_numbers(config)
  try:
    step.fused_mode(config.fused_loss)
  except ValueError as error:
    raise errors.ConfigError(str(error)) from error
  try:
    ntil_jax.losses.check_method(
        config.method, config.weighting, common.loss_kwargs(config)
    )
  except (ValueError, TypeError) as error:
    raise errors.ConfigError(str(error)) from error
  devices = jax.device_count()
  if devices % config.fsdp:
    raise errors.ConfigError(
        f"fsdp={config.fsdp} does not divide the {devices} "
        "devices; set --config.fsdp to a divisor."
    )
  for name in ("batch_size", "eval_batch_size"):
    if config[name] % devices:
      raise errors.ConfigError(
          f"{name}={config[name]} is not divisible by the {devices} devices; "
          f"use a multiple of {devices}."
      )
  if not config.data_dir:
    raise errors.ConfigError(
        "no data: pass --config.data_dir=DIR after running `python -m "
        f"train.prepare_data --task={config.task} --data_dir=DIR "
        "--train_size=N --test_size=M`."
    )
  try:  # the task's checks say how to create missing data
    task.check_config(config)
    task.check_data(config)
  except (ValueError, FileNotFoundError) as error:
    raise errors.ConfigError(str(error)) from error
  return task


def check_workdir(workdir: str) -> str:
  """Creates ``workdir`` if needed; returns its absolute path.

  Raises:
    ConfigError: the path is empty, is a file, holds a ``checkpoints`` file,
      or cannot be written.
  """
  if not workdir or not workdir.strip():
    raise errors.ConfigError(
        "--workdir is empty; name a directory for the "
        "checkpoints and metrics."
    )
  workdir = os.path.abspath(workdir)
  check_directory(workdir, "workdir")
  check_directory(os.path.join(workdir, "checkpoints"), "checkpoint path")
  try:
    os.makedirs(workdir, exist_ok=True)
    rundir.probe_writable(workdir)
  except OSError as error:
    raise errors.ConfigError(
        f"workdir {workdir} is not writable " f"({error.strerror or error})."
    ) from error
  return workdir
