"""Train a decoder on any task with CE + a numeric token loss.

One jit-compiled train step (logits or fused hidden-state loss -> optax
adamw), parameters and batches sharded over a ('data', 'fsdp') mesh, orbax
checkpoints holding the model, optimizer and data iterator together, and
evaluation by greedy decoding. The task (``config.task``, see train/tasks)
supplies the data, the model's input fields and the metrics; nothing here
names one. See configs/common.py for every shared knob.
"""

import json
import os
import shutil
import signal
import sys
import time

from absl import logging
from flax import nnx
import grain
import jax
import jax.numpy as jnp
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
import numpy as np
import optax
import orbax.checkpoint as ocp
import tensorflow_datasets as tfds
import tqdm

from configs import common
import ntil_jax
from train import evaluate
from train import models
from train import tasks

BATCH_AXES = ("data", "fsdp")


# ----------------------------------------------------------------------------
# Set-up.


class ConfigError(ValueError):
  """A bad config or data directory; the message says what to do."""


def get_task(config):
  """The task module of ``config.task``; ConfigError if there is none."""
  try:
    return tasks.get(config.task)
  except ValueError as error:
    raise ConfigError(str(error)) from error


def check_config(config) -> None:
  """Raises ConfigError with one line saying what to do for a bad config."""
  task = get_task(config)
  if config.method not in common.METHODS:
    raise ConfigError(f"unknown method {config.method!r}; use one of "
                     f"{', '.join(common.METHODS)}.")
  if config.model not in models.MODEL_SIZES:
    raise ConfigError(f"unknown model size {config.model!r}; use one of "
                     f"{', '.join(sorted(models.MODEL_SIZES))}.")
  if config.weighting not in ntil_jax.losses.WEIGHTINGS:
    raise ConfigError(f"unknown weighting {config.weighting!r}; use one of "
                     f"{', '.join(ntil_jax.losses.WEIGHTINGS)}.")
  devices = jax.device_count()
  if devices % config.fsdp:
    raise ConfigError(f"fsdp={config.fsdp} does not divide the {devices} "
                     "devices; set --config.fsdp to a divisor.")
  for name in ("batch_size", "eval_batch_size"):
    if config[name] % devices:
      raise ConfigError(
          f"{name}={config[name]} is not divisible by the {devices} devices; "
          f"use a multiple of {devices}.")
  if config.digit_ce_weight < 0:
    raise ConfigError(f"digit_ce_weight must be >= 0, got "
                      f"{config.digit_ce_weight}.")
  if not config.data_dir:
    raise ConfigError(
        "no data: pass --config.data_dir=DIR after running `python -m "
        f"train.prepare_data --task={config.task} --data_dir=DIR "
        "--train_size=N --test_size=M`.")
  try:
    task.check_config(config)
    task.check_data(config)
  except (ValueError, FileNotFoundError) as error:
    raise ConfigError(str(error)) from error


def make_mesh(config) -> jax.sharding.Mesh:
  devices = jax.device_count()
  return jax.make_mesh((devices // config.fsdp, config.fsdp), BATCH_AXES,
                       axis_types=(AxisType.Explicit,) * 2)


def make_optimizer(config) -> optax.GradientTransformation:
  decay_steps = config.lr_decay_steps or config.train_steps
  schedule = optax.warmup_cosine_decay_schedule(
      init_value=0.0, peak_value=config.learning_rate,
      warmup_steps=config.warmup_steps,
      decay_steps=max(decay_steps, config.warmup_steps + 1),
      end_value=0.1 * config.learning_rate)
  return optax.chain(
      optax.clip_by_global_norm(config.grad_clip_norm),
      optax.adamw(schedule, weight_decay=config.weight_decay))


def model_config(config) -> models.ModelConfig:
  return models.model_config(config.model, dtype=config.dtype,
                             **get_task(config).model_fields(config))


# ----------------------------------------------------------------------------
# The train step.


def batch_loss(model, batch, config, key):
  """Mean loss over scored tokens and per-component metrics."""
  inputs, targets = batch["inputs"], batch["targets"]
  images = batch.get("images")
  if config.fused_loss:
    stats = ntil_jax.fused_token_statistics(
        model.hidden_states(inputs, images), model.unembedding, targets,
        chunk_size=config.fused_chunk_size or None)
  else:
    stats = ntil_jax.token_statistics(model(inputs, images), targets)
  shared = dict(vocab_size=model.config.vocab_size,
                loss_mask=batch["loss_mask"])
  kwargs = common.loss_kwargs(config)
  if config.method == "ntil" and config.gumbel_noise > 0:
    kwargs["key"] = key
  per_token = ntil_jax.loss_from_statistics(
      stats, targets, digit_mask=batch["digit_mask"], method=config.method,
      lam=config.lam, weighting=config.weighting, **shared, **kwargs)
  ce = ntil_jax.loss_from_statistics(stats, targets, method="ce", **shared)
  scored = batch["loss_mask"].sum()
  digit_tokens = batch["loss_mask"] & batch["digit_mask"]
  digits = digit_tokens.sum()
  numeric = (per_token - ce).sum() / (config.lam * jnp.maximum(digits, 1))
  if config.digit_ce_weight:  # the control: extra CE weight on digits
    per_token = per_token + config.digit_ce_weight * jnp.where(
        digit_tokens, ce, 0.0)
  loss = per_token.sum() / jnp.maximum(scored, 1)
  return loss, dict(loss=loss, ce=ce.sum() / jnp.maximum(scored, 1),
                    numeric=numeric if config.method != "ce" else 0.0 * loss)


def make_train_step(config):
  """The jit-compiled step: (model, optimizer, batch, step) -> metrics."""
  base_key = jax.random.key(config.seed + 1)

  @nnx.jit(donate_argnums=(0, 1))
  def train_step(model, optimizer, batch, step):
    key = jax.random.fold_in(base_key, step)
    grad_fn = nnx.value_and_grad(batch_loss, has_aux=True)
    (_, metrics), grads = grad_fn(model, batch, config, key)
    optimizer.update(model, grads)
    metrics["grad_norm"] = optax.global_norm(grads)
    return metrics

  return train_step


# ----------------------------------------------------------------------------
# Checkpoints.


def checkpoint_manager(workdir, config) -> ocp.CheckpointManager:
  return ocp.CheckpointManager(
      os.path.join(os.path.abspath(workdir), "checkpoints"),
      options=ocp.CheckpointManagerOptions(
          max_to_keep=config.keep_checkpoints, create=True,
          enable_async_checkpointing=True))


def save_checkpoint(manager, step, model, optimizer, train_iter, *,
                    wait=False):
  state = nnx.to_pure_dict(nnx.state((model, optimizer)))
  manager.save(step, args=ocp.args.Composite(
      state=ocp.args.StandardSave(state),
      train_iter=grain.checkpoint.CheckpointSave(train_iter)), force=True)
  if wait:
    manager.wait_until_finished()


def restore_latest(manager, model, optimizer, train_iter, workdir) -> int:
  """Restores the newest readable checkpoint; returns its step (0 if none).

  A checkpoint that fails to restore is moved aside (``corrupt-<step>``, kept
  for inspection) with a warning, and the previous one is tried.
  """
  state = nnx.state((model, optimizer))
  target = jax.tree.map(ocp.utils.to_shape_dtype_struct,
                        nnx.to_pure_dict(state))
  for step in sorted(manager.all_steps(), reverse=True):
    try:
      restored = manager.restore(step, args=ocp.args.Composite(
          state=ocp.args.StandardRestore(target),
          train_iter=grain.checkpoint.CheckpointRestore(train_iter)))
    except Exception as error:  # pylint: disable=broad-except
      logging.warning("checkpoint %d is unreadable (%s: %s); falling back "
                      "to the previous one.", step, type(error).__name__,
                      str(error).splitlines()[0] if str(error) else "")
      if jax.process_index() == 0:
        directory = os.path.join(workdir, "checkpoints")
        shutil.move(os.path.join(directory, str(step)),
                    os.path.join(directory, f"corrupt-{step}"))
      manager.reload()
      continue
    nnx.replace_by_pure_dict(state, restored["state"])
    nnx.update((model, optimizer), state)
    return step
  return 0


# ----------------------------------------------------------------------------
# Logging.


class _QuietLibraries:
  """Keeps INFO lines of orbax, grain and tfds (dozens per checkpoint) out."""

  def filter(self, record):
    noisy = any(f"/{name}/" in record.pathname
                for name in ("orbax", "grain", "tensorflow_datasets"))
    return record.levelno >= logging.WARNING or not noisy


def quiet_library_logs():
  """Drops library INFO records from the terminal (absl's handler).

  The filter sits on the handler: orbax and tfds log through Python loggers
  of their own, whose records reach it without passing the absl logger.
  """
  # ABSLHandler.handle delegates to its python_handler, skipping its own
  # filters, so the filter goes on the inner handler.
  logging.get_absl_handler().python_handler.addFilter(_QuietLibraries())
  logging.get_absl_logger().addFilter(_QuietLibraries())
  tfds.disable_progress_bar()


class MetricsWriter:
  """metrics.jsonl (one JSON object per line) and TensorBoard, on host 0."""

  def __init__(self, workdir, resume_step):
    self.enabled = jax.process_index() == 0
    self.path = os.path.join(workdir, "metrics.jsonl")
    self.tensorboard = None
    if not self.enabled:
      return
    os.makedirs(workdir, exist_ok=True)
    # Records past the restored step were made by a run that then stopped
    # before checkpointing them; they are replayed now, so drop them.
    kept = []
    if os.path.exists(self.path):
      with open(self.path) as f:
        kept = [line for line in f if json.loads(line)["step"] <= resume_step]
    with open(self.path, "w") as f:
      f.writelines(kept)
    from tensorboardX import SummaryWriter  # pylint: disable=g-import-not-at-top
    self.tensorboard = SummaryWriter(os.path.join(workdir, "tensorboard"),
                                     purge_step=resume_step + 1)

  def write(self, step, **values):
    if not self.enabled:
      return
    record = dict(step=int(step), **values)
    with open(self.path, "a") as f:
      f.write(json.dumps(record) + "\n")
    for name, value in values.items():
      if isinstance(value, (int, float)):
        self.tensorboard.add_scalar(name, value, step)
    self.tensorboard.flush()

  def close(self):
    if self.tensorboard is not None:
      self.tensorboard.close()


class StopOnSignal:
  """Turns SIGTERM/SIGINT into a flag, so the loop can checkpoint and stop."""

  def __init__(self):
    self.requested = False
    self._previous = {}
    for sig in (signal.SIGTERM, signal.SIGINT):
      try:
        self._previous[sig] = signal.signal(sig, self._handle)
      except ValueError:  # not the main thread
        pass

  def _handle(self, signum, frame):
    del frame
    logging.warning("signal %d: checkpointing and stopping.", signum)
    self.requested = True

  def restore(self):
    for sig, handler in self._previous.items():
      signal.signal(sig, handler)


# ----------------------------------------------------------------------------
# The loop.


def train_and_evaluate(config, workdir: str) -> dict:
  """Trains, evaluates and checkpoints; resumes from ``workdir`` if it can.

  Returns:
    A dict with the final ``step``, the last logged ``train`` metrics and the
    last ``eval`` metrics (also written to ``workdir/metrics.jsonl``).
  """
  check_config(config)
  mesh = make_mesh(config)
  workdir = os.path.abspath(workdir)
  with jax.set_mesh(mesh):
    return _train(config, workdir, mesh)


def _train(config, workdir, mesh):
  batch_sharding = NamedSharding(mesh, P(BATCH_AXES))

  def to_global(local):
    return jax.make_array_from_process_local_data(batch_sharding,
                                                  np.asarray(local))

  task = get_task(config)
  model = models.create_model(model_config(config),
                              nnx.Rngs(params=config.seed), mesh)
  tx = make_optimizer(config)
  optimizer = nnx.jit(lambda m: nnx.Optimizer(m, tx, wrt=nnx.Param))(model)
  train_iter = task.train_iterator(config)
  manager = checkpoint_manager(workdir, config)
  start_step = restore_latest(manager, model, optimizer, train_iter, workdir)
  if start_step:
    logging.info("resumed from step %d", start_step)
  writer = MetricsWriter(workdir, start_step)
  train_step = make_train_step(config)
  stop = StopOnSignal()
  logging.info("model %s: %d parameters; mesh %s; %d steps of %d examples",
               config.model, models.count_params(model), dict(mesh.shape),
               config.train_steps, config.batch_size)
  progress = tqdm.tqdm(
      total=config.train_steps, initial=start_step, unit="step",
      dynamic_ncols=True,
      disable=jax.process_index() != 0 or not sys.stderr.isatty())
  last_train, last_eval = {}, {}
  step = start_step
  window_start, window_step = time.perf_counter(), start_step

  def run_eval(is_last, record=True):
    metrics, samples, predictions = evaluate.evaluate(
        model, config, to_global, task,
        num_samples=config.num_samples if is_last else 0)
    if record:
      writer.write(step, **metrics)
    logging.info("step %d: %s", step, task.headline(metrics))
    if is_last and jax.process_index() == 0:
      write_predictions(workdir, step, predictions)
      if samples:
        print_samples(samples)
    return metrics

  try:
    while step < config.train_steps and not stop.requested:
      batch = jax.tree.map(to_global, next(train_iter))
      metrics = train_step(model, optimizer, batch, step)
      step += 1
      progress.update(1)
      is_last = step == config.train_steps
      if step % config.log_every_steps == 0 or is_last:
        last_train = {k: float(v) for k, v in jax.device_get(metrics).items()}
        elapsed = time.perf_counter() - window_start
        steps_per_second = (step - window_step) / max(elapsed, 1e-9)
        window_start, window_step = time.perf_counter(), step
        writer.write(step, **last_train, steps_per_second=steps_per_second)
        progress.set_postfix(loss=f"{last_train['loss']:.4f}")
        if progress.disable and jax.process_index() == 0:
          eta = (config.train_steps - step) / max(steps_per_second, 1e-9)
          logging.info("step %d/%d loss %.4f ce %.4f (%.1f steps/s, ETA %ds)",
                       step, config.train_steps, last_train["loss"],
                       last_train["ce"], steps_per_second, eta)
      if config.eval_every_steps and (step % config.eval_every_steps == 0
                                      or is_last):
        last_eval = run_eval(is_last)
      if (step % config.checkpoint_every_steps == 0 or is_last
          or stop.requested):
        save_checkpoint(manager, step, model, optimizer, train_iter)
    if start_step >= config.train_steps > 0 and config.eval_every_steps:
      # Already finished: evaluate the final model again (it was logged).
      last_eval = run_eval(True, record=False)
  finally:
    manager.wait_until_finished()
    manager.close()
    progress.close()
    writer.close()
    stop.restore()
    if hasattr(train_iter, "close"):
      train_iter.close()
  return dict(step=step, train=last_train, eval=last_eval,
              stopped_early=stop.requested)


def write_predictions(workdir, step, predictions):
  """predictions.jsonl: (test index, answer, prediction) of the final eval.

  With several hosts it holds process 0's share of the test split.
  """
  path = os.path.join(workdir, "predictions.jsonl")
  with open(path + ".tmp", "w") as f:
    for index, answer, prediction in predictions:
      f.write(json.dumps(dict(step=step, index=int(index), answer=answer,
                              prediction=prediction)) + "\n")
  os.replace(path + ".tmp", path)


def read_predictions(workdir) -> list[str]:
  """The final eval's predictions (predictions.jsonl), in test order."""
  with open(os.path.join(workdir, "predictions.jsonl")) as f:
    records = sorted((json.loads(line) for line in f),
                     key=lambda r: r["index"])
  return [r["prediction"] for r in records]


def print_samples(samples):
  print("sample predictions (question | answer | prediction):")
  for question, answer, prediction in samples:
    mark = "ok " if prediction.strip() == answer.strip() else "   "
    print(f"  {mark}{question} | {answer} | {prediction}")
