"""Train a decoder on any task with CE + a numeric token loss.

One jit-compiled train step (logits or fused hidden-state loss -> optax
adamw), parameters and batches sharded over a ('data', 'fsdp') mesh, orbax
checkpoints holding the model, optimizer and data iterator together, and
evaluation by greedy decoding. The task (``config.task``, see train/tasks)
supplies the data, the model's input fields and the metrics; nothing here
names one. See configs/common.py for every shared knob.
"""

import _thread
import contextlib
import errno
import fcntl
import json
import logging as pylogging
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
import tqdm

from configs import common
import ntil_jax
from train import evaluate
from train import logs
from train import models
from train import tasks

BATCH_AXES = ("data", "fsdp")


# ----------------------------------------------------------------------------
# Set-up.


class ConfigError(ValueError):
  """A bad config, workdir or data directory; the message says what to do."""


class TrainingError(RuntimeError):
  """A run that cannot go on (non-finite loss, failed checkpoint save)."""


class Interrupted(Exception):  # pylint: disable=g-bad-exception-name
  """SIGTERM/SIGINT while the loop could not stop cleanly (or a second one)."""

  def __init__(self, signum):
    super().__init__(f"stopped by signal {signum}")
    self.signum = signum


def get_task(config):
  """The task module of ``config.task``; ConfigError if there is none."""
  try:
    return tasks.get(config.task)
  except ValueError as error:
    raise ConfigError(str(error)) from error


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
      raise ConfigError(f"{name} must be >= 1, got {config[name]}.")
  for name in _NON_NEGATIVE:
    if config[name] < 0:
      raise ConfigError(f"{name} must be >= 0, got {config[name]}.")
  for name in ("learning_rate", "grad_clip_norm"):
    if not config[name] > 0:
      raise ConfigError(f"{name} must be > 0, got {config[name]}.")


def check_directory(path: str, what: str) -> None:
  """ConfigError if ``path`` exists but is not a directory."""
  if os.path.exists(path) and not os.path.isdir(path):
    raise ConfigError(f"{what} {path} is a file, not a directory.")


def check_config(config) -> None:
  """Raises ConfigError with one line saying what to do for a bad config."""
  task = get_task(config)
  if config.method not in common.METHODS:
    raise ConfigError(
        f"unknown method {config.method!r}; use one of "
        f"{', '.join(common.METHODS)}."
    )
  if not hasattr(task, "create_model") and config.model not in (
      models.MODEL_SIZES
  ):
    raise ConfigError(
        f"unknown model size {config.model!r}; use one of "
        f"{', '.join(sorted(models.MODEL_SIZES))}."
    )
  if config.weighting not in ntil_jax.losses.WEIGHTINGS:
    raise ConfigError(
        f"unknown weighting {config.weighting!r}; use one of "
        f"{', '.join(ntil_jax.losses.WEIGHTINGS)}."
    )
  if config.dtype not in DTYPES:
    raise ConfigError(
        f"unknown dtype {config.dtype!r}; use one of " f"{', '.join(DTYPES)}."
    )
  _check_numbers(config)
  try:
    ntil_jax.losses.check_method(
        config.method, config.weighting, common.loss_kwargs(config)
    )
  except (ValueError, TypeError) as error:
    raise ConfigError(str(error)) from error
  devices = jax.device_count()
  if devices % config.fsdp:
    raise ConfigError(
        f"fsdp={config.fsdp} does not divide the {devices} "
        "devices; set --config.fsdp to a divisor."
    )
  for name in ("batch_size", "eval_batch_size"):
    if config[name] % devices:
      raise ConfigError(
          f"{name}={config[name]} is not divisible by the {devices} devices; "
          f"use a multiple of {devices}."
      )
  if not config.data_dir:
    raise ConfigError(
        "no data: pass --config.data_dir=DIR after running `python -m "
        f"train.prepare_data --task={config.task} --data_dir=DIR "
        "--train_size=N --test_size=M`."
    )
  try:  # the task's checks say how to create missing data
    task.check_config(config)
    task.check_data(config)
  except (ValueError, FileNotFoundError) as error:
    raise ConfigError(str(error)) from error


def _probe_writable(directory: str) -> None:
  """Creates and removes a file in ``directory``; OSError if it cannot."""
  probe = os.path.join(directory, f".write-probe-{os.getpid()}")
  os.close(os.open(probe, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644))
  os.remove(probe)


def check_workdir(workdir: str) -> str:
  """Creates ``workdir`` if needed; returns its absolute path.

  Raises:
    ConfigError: the path is empty, is a file, holds a ``checkpoints`` file,
      or cannot be written.
  """
  if not workdir or not workdir.strip():
    raise ConfigError(
        "--workdir is empty; name a directory for the "
        "checkpoints and metrics."
    )
  workdir = os.path.abspath(workdir)
  check_directory(workdir, "workdir")
  check_directory(os.path.join(workdir, "checkpoints"), "checkpoint path")
  try:
    os.makedirs(workdir, exist_ok=True)
    _probe_writable(workdir)
  except OSError as error:
    raise ConfigError(
        f"workdir {workdir} is not writable " f"({error.strerror or error})."
    ) from error
  return workdir


class WorkdirLock:
  """An exclusive lock on a workdir, so that two runs never share one.

  ``flock`` on ``workdir/.lock``: the kernel releases it when the holding
  process exits, however it exits, so a lock left by a dead run is never
  stale. The file holds the holder's pid, for the error message.
  """

  def __init__(self, workdir: str):
    self.path = os.path.join(workdir, ".lock")
    self.fd = None

  def __enter__(self):
    fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as error:
      holder = os.read(fd, 32).decode(errors="replace").strip() or "unknown"
      os.close(fd)
      if error.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
        raise
      raise ConfigError(
          f"workdir {os.path.dirname(self.path)} is in use by another run "
          f"(pid {holder}); wait for it to end or use another "
          "--workdir."
      ) from None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    self.fd = fd
    return self

  def __exit__(self, *exc):
    if self.fd is not None:
      os.close(self.fd)  # releases the lock
      self.fd = None


def make_mesh(config) -> jax.sharding.Mesh:
  """The task's mesh if it has one, else ('data', 'fsdp'), Explicit."""
  task = get_task(config)
  if hasattr(task, "make_mesh"):
    return task.make_mesh(config)
  devices = jax.device_count()
  return jax.make_mesh(
      (devices // config.fsdp, config.fsdp),
      BATCH_AXES,
      axis_types=(AxisType.Explicit,) * 2,
  )


def make_optimizer(config) -> optax.GradientTransformation:
  decay_steps = config.lr_decay_steps or config.train_steps
  schedule = optax.warmup_cosine_decay_schedule(
      init_value=0.0,
      peak_value=config.learning_rate,
      warmup_steps=config.warmup_steps,
      decay_steps=max(decay_steps, config.warmup_steps + 1),
      end_value=0.1 * config.learning_rate,
  )
  return optax.chain(
      optax.clip_by_global_norm(config.grad_clip_norm),
      optax.adamw(schedule, weight_decay=config.weight_decay),
  )


def model_config(config) -> models.ModelConfig:
  return models.model_config(
      config.model, dtype=config.dtype, **get_task(config).model_fields(config)
  )


# ----------------------------------------------------------------------------
# The train step.


def batch_loss(model, batch, config, key):
  """Mean loss over scored tokens and per-component metrics."""
  inputs, targets = batch["inputs"], batch["targets"]
  images = batch.get("images")
  # A pretrained model's digits are its tokenizer's; ours are ids 0..9.
  digit_ids = getattr(model, "digit_token_ids", None)
  # Unscored positions (padding, questions) are masked out of the
  # statistics, so a NaN or inf output there cannot reach loss or gradient.
  scored_mask = batch["loss_mask"]
  if config.fused_loss:
    stats = ntil_jax.fused_token_statistics(
        model.hidden_states(inputs, images),
        model.unembedding,
        targets,
        digit_token_ids=digit_ids,
        chunk_size=config.fused_chunk_size or None,
        mask=scored_mask,
    )
  else:
    stats = ntil_jax.token_statistics(
        model(inputs, images), targets, digit_ids, mask=scored_mask
    )
  shared = dict(
      vocab_size=model.config.vocab_size,
      loss_mask=batch["loss_mask"],
      digit_token_ids=digit_ids,
  )
  kwargs = common.loss_kwargs(config)
  if config.method == "ntil" and config.gumbel_noise > 0:
    kwargs["key"] = key
  per_token = ntil_jax.loss_from_statistics(
      stats,
      targets,
      digit_mask=batch["digit_mask"],
      method=config.method,
      lam=config.lam,
      weighting=config.weighting,
      **shared,
      **kwargs,
  )
  ce = ntil_jax.loss_from_statistics(stats, targets, method="ce", **shared)
  scored = batch["loss_mask"].sum()
  digit_tokens = batch["loss_mask"] & batch["digit_mask"]
  digits = digit_tokens.sum()
  numeric = (per_token - ce).sum() / (config.lam * jnp.maximum(digits, 1))
  if config.digit_ce_weight:  # the control: extra CE weight on digits
    per_token = per_token + config.digit_ce_weight * jnp.where(
        digit_tokens, ce, 0.0
    )
  loss = per_token.sum() / jnp.maximum(scored, 1)
  return loss, dict(
      loss=loss,
      ce=ce.sum() / jnp.maximum(scored, 1),
      numeric=numeric if config.method != "ce" else 0.0 * loss,
  )


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
      _probe_writable(directory)
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
  except (Interrupted, TrainingError):
    raise
  except Exception as error:  # pylint: disable=broad-except
    raise TrainingError(
        f"saving checkpoint {step} into {directory} failed "
        f"({type(error).__name__}: {_first_line(error)}); the run stops. "
        "Free the directory and rerun to resume from the last "
        "checkpoint."
    ) from error


def _first_line(error, limit=200) -> str:
  """The gist of an error: its first line, without tensorstore's specs."""
  text = str(error).strip()
  text = text.splitlines()[0] if text else ""
  for tail in (" [tensorstore_spec", " See full TensorStore details"):
    text = text.split(tail)[0]
  return text if len(text) <= limit else text[: limit - 3] + "..."


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
          _first_line(error),
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


# ----------------------------------------------------------------------------
# Logging.


class MetricsWriter:
  """metrics.jsonl (one JSON object per line) and TensorBoard, on host 0.

  Each record is one ``write`` of one line to a file opened for appending,
  so a crash cannot leave half of it; a torn last line left by an older
  writer (or a full disk) is dropped with a warning when the run resumes.
  """

  def __init__(self, workdir, resume_step):
    self.enabled = jax.process_index() == 0
    self.path = os.path.join(workdir, "metrics.jsonl")
    self.tensorboard = None
    if not self.enabled:
      return
    os.makedirs(workdir, exist_ok=True)
    # Records past the restored step were made by a run that then stopped
    # before checkpointing them; they are replayed now, so drop them.
    kept = [
        json.dumps(record) + "\n"
        for record in read_metrics(self.path)
        if record["step"] <= resume_step
    ]
    with open(self.path + ".tmp", "w") as f:
      f.writelines(kept)
    os.replace(self.path + ".tmp", self.path)
    from tensorboardX import SummaryWriter  # pylint: disable=g-import-not-at-top

    self.tensorboard = SummaryWriter(
        os.path.join(workdir, "tensorboard"), purge_step=resume_step + 1
    )

  def write(self, step, **values):
    if not self.enabled:
      return
    line = json.dumps(dict(step=int(step), **values)) + "\n"
    fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
      os.write(fd, line.encode())
    finally:
      os.close(fd)
    for name, value in values.items():
      if isinstance(value, (int, float)):
        self.tensorboard.add_scalar(name, value, step)
    self.tensorboard.flush()

  def close(self):
    if self.tensorboard is not None:
      self.tensorboard.close()


def read_metrics(path) -> list[dict]:
  """The records of a metrics.jsonl; a torn line is dropped with a warning."""
  if not os.path.exists(path):
    return []
  records = []
  with open(path) as f:
    for number, line in enumerate(f, 1):
      try:
        records.append(json.loads(line))
      except json.JSONDecodeError:
        logging.warning(
            "%s: dropping torn line %d (%r).", path, number, line[:60]
        )
  return records


class StopOnSignal:
  """Turns SIGTERM/SIGINT into a flag, so the loop can checkpoint and stop.

  Where the loop cannot look at the flag (inside a checkpoint save, or when
  a signal comes a second time), the handler raises :class:`Interrupted`
  instead, so the process always ends within seconds. A checkpoint write
  that fails in one of orbax's threads is reported the same way
  (:meth:`fail`), as a :class:`TrainingError`: orbax itself would wait out
  a 300 s barrier for the thread that died.
  """

  def __init__(self):
    self.signum = None
    self.failure = None
    self.blocking = False  # set around waits the loop cannot break out of
    self._previous = {}
    for sig in (signal.SIGTERM, signal.SIGINT):
      try:
        self._previous[sig] = signal.signal(sig, self._handle)
      except ValueError:  # not the main thread
        pass

  @property
  def requested(self) -> bool:
    return self.signum is not None

  def fail(self, error: BaseException) -> None:
    """From any thread: stops the run with ``error`` as its reason."""
    if self.failure is None:
      self.failure = error
      if self._previous:
        _thread.interrupt_main(signal.SIGINT)  # wakes a blocked main thread

  def check(self) -> None:
    """Raises the failure reported by :meth:`fail`, if any."""
    if self.failure is not None:
      raise TrainingError(
          "writing a checkpoint failed ("
          f"{type(self.failure).__name__}: {_first_line(self.failure)}); "
          "the run stops. Free the checkpoint directory and rerun to resume "
          "from the last checkpoint."
      ) from self.failure

  def _handle(self, signum, frame):
    del frame
    self.check()
    if self.blocking or self.requested:
      self.signum = signum
      raise Interrupted(signum)
    logging.warning("signal %d: checkpointing and stopping.", signum)
    self.signum = signum

  def restore(self):
    for sig, handler in self._previous.items():
      signal.signal(sig, handler)


class _BackgroundFailures(pylogging.Handler):
  """Passes errors that orbax's threads log (and swallow) to ``stop.fail``."""

  def __init__(self, stop: StopOnSignal):
    super().__init__(pylogging.ERROR)
    self.stop = stop

  def emit(self, record):
    if record.exc_info and f"{os.sep}orbax{os.sep}" in record.pathname:
      self.stop.fail(record.exc_info[1])


@contextlib.contextmanager
def watch_background_failures(stop: StopOnSignal):
  handler = _BackgroundFailures(stop)
  pylogging.getLogger().addHandler(handler)
  try:
    yield
  finally:
    pylogging.getLogger().removeHandler(handler)


# ----------------------------------------------------------------------------
# The loop.


def train_and_evaluate(config, workdir: str) -> dict:
  """Trains, evaluates and checkpoints; resumes from ``workdir`` if it can.

  Everything is validated before anything is compiled. Library log lines go
  to ``workdir/train.log``.

  Returns:
    A dict with the final ``step``, the last logged ``train`` metrics, the
    last ``eval`` metrics (also written to ``workdir/metrics.jsonl``), and
    ``stopped_early``/``signal`` when a signal stopped the run.

  Raises:
    ConfigError: a bad config, data or workdir, or a workdir in use.
    TrainingError: a non-finite loss, or a checkpoint that cannot be saved;
      the last good checkpoints are kept.
    Interrupted: a signal where the run could not stop cleanly.
  """
  check_config(config)
  workdir = check_workdir(workdir)
  mesh = make_mesh(config)
  lock = WorkdirLock(workdir) if jax.process_index() == 0 else None
  with contextlib.ExitStack() as stack:
    if lock is not None:
      stack.enter_context(lock)
    stack.enter_context(logs.log_file(workdir, jax.process_index()))
    stack.enter_context(logs.drop_closed_loop_errors())
    stack.enter_context(jax.set_mesh(mesh))
    return _train(config, workdir, mesh)


def _check_finite(metrics, step, manager):
  """TrainingError if the step's loss or gradient norm is NaN or inf."""
  values = {k: float(metrics[k]) for k in ("loss", "grad_norm")}
  bad = {k: v for k, v in values.items() if not np.isfinite(v)}
  if bad:
    manager.wait_until_finished()
    good = manager.latest_step()
    raise TrainingError(
        f"non-finite {', '.join(f'{k}={v}' for k, v in bad.items())} at step "
        f"{step}, not saved; "
        + (
            f"the last good checkpoint is step {good}. "
            if good
            else "no checkpoint was saved. "
        )
        + "Lower the learning rate or check the data, then rerun."
    )


def _train(config, workdir, mesh):
  batch_sharding = NamedSharding(mesh, P(BATCH_AXES))

  def to_global(local):
    return jax.make_array_from_process_local_data(
        batch_sharding, np.asarray(local)
    )

  task = get_task(config)
  if hasattr(task, "create_model"):  # e.g. a pretrained snapshot
    model = task.create_model(config, mesh)
  else:
    model = models.create_model(
        model_config(config), nnx.Rngs(params=config.seed), mesh
    )
  tx = make_optimizer(config)
  optimizer = nnx.jit(lambda m: nnx.Optimizer(m, tx, wrt=nnx.Param))(model)
  try:
    train_iter = task.train_iterator(config)
  except ValueError as error:  # e.g. fewer examples than one batch
    raise ConfigError(str(error)) from error
  manager = checkpoint_manager(workdir, config)
  start_step = restore_latest(manager, model, optimizer, train_iter, workdir)
  if start_step:
    logging.info("resumed from step %d", start_step)
  writer = MetricsWriter(workdir, start_step)
  train_step = make_train_step(config)
  stop = StopOnSignal()
  logging.info(
      "model %s: %d parameters; mesh %s; %d steps of %d examples",
      config.get("pretrained") or config.model,
      models.count_params(model),
      dict(mesh.shape),
      config.train_steps,
      config.batch_size,
  )
  progress = tqdm.tqdm(
      total=config.train_steps,
      initial=start_step,
      unit="step",
      dynamic_ncols=True,
      disable=jax.process_index() != 0 or not sys.stderr.isatty(),
  )
  last_train, last_eval = {}, {}
  step = start_step
  window_start, window_step = time.perf_counter(), start_step

  def run_eval(is_last, record=True):
    metrics, samples, predictions = evaluate.evaluate(
        model,
        config,
        to_global,
        task,
        num_samples=config.num_samples if is_last else 0,
    )
    if record:
      writer.write(step, **metrics)
    logging.info("step %d: %s", step, task.headline(metrics))
    if is_last and jax.process_index() == 0:
      write_predictions(workdir, step, predictions)
      if samples:
        print_samples(samples)
    return metrics

  interrupted = False
  watch = watch_background_failures(stop)
  try:
    watch.__enter__()
    saved_step = start_step
    while step < config.train_steps and not stop.requested:
      stop.check()
      batch = jax.tree.map(to_global, next(train_iter))
      metrics = train_step(model, optimizer, batch, step)
      step += 1
      progress.update(1)
      is_last = step == config.train_steps
      logged = step % config.log_every_steps == 0 or is_last
      if logged:
        last_train = {k: float(v) for k, v in jax.device_get(metrics).items()}
        _check_finite(last_train, step, manager)
        elapsed = time.perf_counter() - window_start
        steps_per_second = (step - window_step) / max(elapsed, 1e-9)
        window_start, window_step = time.perf_counter(), step
        writer.write(step, **last_train, steps_per_second=steps_per_second)
        progress.set_postfix(loss=f"{last_train['loss']:.4f}")
        if progress.disable and jax.process_index() == 0:
          eta = (config.train_steps - step) / max(steps_per_second, 1e-9)
          logging.info(
              "step %d/%d loss %.4f ce %.4f (%.1f steps/s, ETA %ds)",
              step,
              config.train_steps,
              last_train["loss"],
              last_train["ce"],
              steps_per_second,
              eta,
          )
      if config.eval_every_steps and (
          step % config.eval_every_steps == 0 or is_last
      ):
        last_eval = run_eval(is_last)
      if step % config.checkpoint_every_steps == 0 or is_last or stop.requested:
        if not logged:  # never save a state a non-finite step produced
          _check_finite(metrics, step, manager)
        stop.blocking = True
        save_checkpoint(manager, step, model, optimizer, train_iter)
        stop.blocking = False
        saved_step = step
    if stop.requested and saved_step != step:  # signal after the last check
      _check_finite(metrics, step, manager)
      stop.blocking = True
      save_checkpoint(manager, step, model, optimizer, train_iter)
    if start_step >= config.train_steps > 0 and config.eval_every_steps:
      # Already finished: evaluate the final model again (it was logged).
      last_eval = run_eval(True, record=False)
    stop.blocking = True
    manager.wait_until_finished()
    stop.check()
  except (Interrupted, TrainingError):
    interrupted = True
    raise
  finally:
    watch.__exit__(None, None, None)
    stop.restore()
    if not interrupted:  # else a save may hang: leave it to the exit
      manager.wait_until_finished()
      manager.close()
    progress.close()
    writer.close()
    if hasattr(train_iter, "close"):
      train_iter.close()
  if stop.requested:
    logging.warning(
        "stopped by signal %d at step %d; checkpoint saved. Rerun "
        "the same command to resume.",
        stop.signum,
        step,
    )
  return dict(
      step=step,
      train=last_train,
      eval=last_eval,
      stopped_early=stop.requested,
      signal=stop.signum,
  )


@contextlib.contextmanager
def exit_on_error():
  """For command-line entry points: a known failure is one ``error:`` line.

  Exit status 2 for a bad config, 1 for a run that failed, 128 + N for
  signal N (130 for Ctrl-C, 143 for SIGTERM), as shells report them.
  """
  try:
    yield
  except ConfigError as error:
    print(f"error: {error}", file=sys.stderr)
    sys.exit(2)
  except TrainingError as error:
    _exit_now(f"error: {error}", 1)
  except Interrupted as error:
    _exit_now(
        f"error: {error} before the run could checkpoint; rerun to "
        "resume from the last checkpoint.",
        128 + error.signum,
    )


def _exit_now(message, code):
  """Exits without waiting for threads: a failed save may hold some."""
  print(message, file=sys.stderr)
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(code)  # pylint: disable=protected-access


def exit_if_stopped(result) -> None:
  """Exits with 128 + N if signal N stopped the run (after checkpointing)."""
  if result["stopped_early"]:
    print(
        f"stopped by signal {result['signal']} at step {result['step']}; "
        "rerun the same command to resume.",
        file=sys.stderr,
    )
    sys.exit(128 + result["signal"])


def write_predictions(workdir, step, predictions):
  """predictions.jsonl: (test index, answer, prediction) of the final eval.

  With several hosts it holds process 0's share of the test split.
  """
  path = os.path.join(workdir, "predictions.jsonl")
  with open(path + ".tmp", "w") as f:
    for index, answer, prediction in predictions:
      f.write(
          json.dumps(
              dict(
                  step=step,
                  index=int(index),
                  answer=answer,
                  prediction=prediction,
              )
          )
          + "\n"
      )
  os.replace(path + ".tmp", path)


def read_predictions(workdir) -> list[str]:
  """The final eval's predictions (predictions.jsonl), in test order."""
  with open(os.path.join(workdir, "predictions.jsonl")) as f:
    records = sorted((json.loads(line) for line in f), key=lambda r: r["index"])
  return [r["prediction"] for r in records]


def print_samples(samples):
  print("sample predictions (question | answer | prediction):")
  for question, answer, prediction in samples:
    mark = "ok " if prediction.strip() == answer.strip() else "   "
    print(f"  {mark}{question} | {answer} | {prediction}")
