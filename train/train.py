"""Train a decoder on any task with CE + a numeric token loss.

`train_and_evaluate` checks everything, builds the model, optimizer and data
iterator, resumes from the workdir's newest good checkpoint, then loops:
step, log, evaluate, checkpoint. The task (``config.task``, see
train/tasks) supplies the data, the model's input fields and the metrics;
nothing here names one. The pieces live beside this file, each with one
concern:

* `train.checks`: config, data and workdir, before anything compiles;
* `train.step`: mesh, optimizer, loss and the jit-compiled step;
* `train.checkpoints`: orbax save and restore, corrupt checkpoints;
* `train.rundir`: the workdir's lock, metrics.jsonl, predictions.jsonl;
* `train.signals`: SIGTERM/SIGINT and failures in orbax's threads;
* `train.errors`: the exceptions and the CLI's exit statuses;
* `train.evaluate`: greedy decoding and the task's metrics.

See configs/common.py for every shared knob.
"""

import contextlib
import os
import sys
import time

from absl import logging
from flax import nnx
import jax
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding, PartitionSpec as P
import numpy as np
import tqdm

from train import checkpoints
from train import checks
from train import errors
from train import evaluate
from train import logs
from train import models
from train import rundir
from train import signals
from train import step as step_lib

# The names entry points use, where they have always been.
ConfigError = errors.ConfigError
TrainingError = errors.TrainingError
Interrupted = errors.Interrupted
exit_on_error = errors.exit_on_error
exit_if_stopped = errors.exit_if_stopped
get_task = checks.get_task
read_predictions = rundir.read_predictions


def train_and_evaluate(config, workdir: str, *, start_over=False) -> dict:
  """Trains, evaluates and checkpoints; resumes from ``workdir`` if it can.

  Everything is validated before anything is compiled. Library log lines go
  to ``workdir/train.log``. The run's resolved config is recorded in
  ``workdir/config.json``: a later run in the same workdir resumes only with
  the same config, up to `checks.RESUMABLE_FIELDS` (schedule length,
  cadences, layout), and is refused otherwise with the workdir untouched.
  ``start_over`` moves the old run aside under
  ``workdir/previous-runs/<date>`` and starts afresh; nothing is deleted.

  Returns:
    A dict with the final ``step``, the last logged ``train`` metrics, the
    last ``eval`` metrics (also written to ``workdir/metrics.jsonl``), and
    ``stopped_early``/``signal`` when a signal stopped the run.

  Raises:
    ConfigError: a bad config, data or workdir, a workdir in use, or one
      that holds a run with another config.
    TrainingError: a non-finite loss, or a checkpoint that cannot be saved;
      the last good checkpoints are kept.
    Interrupted: a signal where the run could not stop cleanly.
  """
  config = checks.name_dataset(config, workdir, start_over=start_over)
  task = checks.check_config(config)
  workdir = checks.check_workdir(workdir)
  changes = [] if start_over else checks.check_resumable(config, workdir)
  mesh = step_lib.make_mesh(config, task)
  lock = rundir.WorkdirLock(workdir) if jax.process_index() == 0 else None
  with contextlib.ExitStack() as stack:
    if lock is not None:
      stack.enter_context(lock)
    moved = rundir.move_run_aside(workdir) if start_over else None
    if start_over and jax.process_count() > 1:
      multihost_utils.sync_global_devices("start_over")
    stack.enter_context(logs.log_file(workdir, jax.process_index()))
    stack.enter_context(logs.drop_closed_loop_errors())
    if moved:
      logging.warning("--start_over: moved the previous run to %s", moved)
    warnings = [
        checks.schedule_warning(config),
        checks.unused_settings_warning(config),
        checks.evaluation_warning(config),
        None if start_over else checks.unrecorded_run_warning(workdir),
        checks.legacy_dataset_warning(changes, config),
        checks.horizon_warning(changes, config),
    ]
    stack.enter_context(jax.set_mesh(mesh))
    return _train(
        config, task, workdir, mesh, [w for w in warnings if w], changes
    )


def _log_start(warnings, changes):
  """The config's warnings and resumed changes, once a restore succeeded.

  Logged after the restore, so that a run refused at its start (a restore
  that fails on a busy device or a full disk) leaves its workdir, logs
  included, as it found it.
  """
  for warning in warnings:
    logging.warning("%s", warning)
  if changes:
    logging.info(
        "resuming with a changed schedule, cadence, layout or location: %s",
        ", ".join(f"{name} {old!r} -> {new!r}" for name, old, new in changes),
    )


def check_finite(metrics, step, manager):
  """TrainingError if the step's loss or gradient norm is NaN or inf."""
  values = {k: float(metrics[k]) for k in ("loss", "grad_norm")}
  bad = {k: v for k, v in values.items() if not np.isfinite(v)}
  if bad:
    manager.wait_until_finished()
    good = manager.latest_step()
    raise errors.Diverged(
        f"non-finite {', '.join(f'{k}={v}' for k, v in bad.items())} at step "
        f"{step}, not saved; "
        + (
            f"the last good checkpoint is step {good}. "
            if good
            else "no checkpoint was saved. "
        )
        + "Lower the learning rate or check the data, then rerun."
    )


def _create_state(config, task, mesh):
  """The model, its optimizer and the train iterator, before any restore.

  The iterator comes first: data that cannot fill a batch is refused
  before a model (a pretrained snapshot: seconds to minutes) is built.
  """
  try:
    train_iter = task.train_iterator(config)
  except ValueError as error:  # e.g. fewer examples than one batch
    raise errors.ConfigError(str(error)) from error
  try:
    return *_create_model(config, task, mesh), train_iter
  except BaseException:
    if hasattr(train_iter, "close"):
      train_iter.close()
    raise


def _create_model(config, task, mesh):
  """The model (its digit ids set) and its optimizer."""
  try:
    if hasattr(task, "create_model"):  # e.g. a pretrained snapshot
      model = task.create_model(config, mesh)
    else:
      model = models.create_model(
          step_lib.model_config(config, task),
          nnx.Rngs(params=config.seed),
          mesh,
      )
      ids = getattr(task, "digit_token_ids", lambda config: None)(config)
      if ids is not None:  # e.g. number tokens of 1-3 digits
        model.digit_token_ids = ids
  except ValueError as error:  # JAX's, for a dimension fsdp cannot split
    if "evenly divide" not in str(error):
      raise
    raise errors.ConfigError(
        f"fsdp={config.fsdp} does not divide every parameter dimension it "
        f"shards ({errors.first_line(error, limit=300)}); set "
        "--config.fsdp to a divisor of the model's dimensions."
    ) from error
  return model, step_lib.init_optimizer(model, config)


class _Progress:
  """The progress bar on a terminal, else log lines with steps/s and ETA."""

  def __init__(self, config, start_step):
    self.total = config.train_steps
    self.bar = tqdm.tqdm(
        total=config.train_steps,
        initial=start_step,
        unit="step",
        dynamic_ncols=True,
        disable=jax.process_index() != 0 or not sys.stderr.isatty(),
    )
    self.window_start, self.window_step = time.perf_counter(), start_step

  def steps_per_second(self, step) -> float:
    """Since the previous call; starts a new window."""
    elapsed = time.perf_counter() - self.window_start
    rate = (step - self.window_step) / max(elapsed, 1e-9)
    self.window_start, self.window_step = time.perf_counter(), step
    return rate

  def show(self, step, metrics, steps_per_second):
    self.bar.set_postfix(loss=f"{metrics['loss']:.4f}")
    if self.bar.disable and jax.process_index() == 0:
      eta = (self.total - step) / max(steps_per_second, 1e-9)
      logging.info(
          "step %d/%d loss %.4f ce %.4f (%.1f steps/s, ETA %ds)",
          step,
          self.total,
          metrics["loss"],
          metrics["ce"],
          steps_per_second,
          eta,
      )


def _train(config, task, workdir, mesh, warnings=(), changes=()):
  batch_sharding = NamedSharding(mesh, P(step_lib.BATCH_AXES))

  def to_global(local):
    return jax.make_array_from_process_local_data(
        batch_sharding, np.asarray(local)
    )

  model, optimizer, train_iter = _create_state(config, task, mesh)
  manager = checkpoints.checkpoint_manager(workdir, config)
  recorded = rundir.read_config_record(workdir) is not None
  start_step = checkpoints.restore_latest(
      manager, model, optimizer, train_iter, workdir, require_digest=recorded
  )
  _log_start(warnings, changes)
  if start_step > config.train_steps > 0:
    logging.warning(
        "the workdir's last checkpoint is at step %d, past train_steps=%d:"
        " nothing is trained, and the step-%d model is evaluated and"
        " reported.",
        start_step,
        config.train_steps,
        start_step,
    )
  elif start_step:
    logging.info("resumed from step %d", start_step)
  rundir.write_config_record(
      workdir, config, checks.snapshot_record(config, workdir)
  )
  writer = rundir.MetricsWriter(workdir, start_step)
  train_step = step_lib.make_train_step(config)
  stop = signals.StopOnSignal()
  logging.info(
      "model %s: %d parameters; mesh %s; %d steps of %d examples",
      config.get("pretrained") or config.model,
      models.count_params(model),
      dict(mesh.shape),
      config.train_steps,
      config.batch_size,
  )
  progress = _Progress(config, start_step)
  last_train, last_eval = {}, {}
  step = start_step

  def run_eval(is_last, record=True, stop_requested=None):
    """The eval metrics; None if ``stop_requested`` cut the eval short."""
    evaluated = evaluate.evaluate(
        model,
        config,
        to_global,
        task,
        num_samples=config.num_samples if is_last else 0,
        stop=stop_requested,
    )
    if evaluated is None:
      logging.warning("step %d: evaluation stopped by a signal", step)
      return None
    metrics, samples, predictions = evaluated
    if record:
      writer.write(step, **metrics)
    logging.info("step %d: %s", step, task.headline(metrics))
    # A finished run evaluated again (record=False) keeps the predictions of
    # the eval metrics.jsonl holds: a rerun with other eval settings (or
    # code) would have replaced them, the two files then disagreeing.
    keep = not record and rundir.has_predictions(workdir)
    if is_last and jax.process_index() == 0 and not keep:
      rundir.write_predictions(workdir, step, predictions)
    if is_last and jax.process_index() == 0 and samples:
      print_samples(samples)
    return metrics

  def save(metrics, logged):
    if not logged:  # never save a state a non-finite step produced
      check_finite(metrics, step, manager)
    with stop.grace():
      checkpoints.save_checkpoint(manager, step, model, optimizer, train_iter)

  interrupted = False
  watch = signals.watch_background_failures(stop)
  try:
    watch.__enter__()
    saved_step = start_step
    in_flight = None
    final_eval = False  # the run's last evaluation made, whole
    agreed = None  # the signal that stops every process at this step
    agreement = signals.StopAgreement(
        to_global, config.batch_size // jax.process_count()
    )

    def stop_requested():
      return agreement.poll(stop.signum) is not None

    if _eval_cut_short(config, workdir, start_step):
      # A signal stopped the run in this step's evaluation (or in the step
      # before it): the evaluation the uninterrupted run made, made now.
      evaluated = run_eval(False, stop_requested=stop_requested)
      if evaluated is None:
        agreed = agreement.agreed
      else:
        last_eval = evaluated
    while agreed is None and step < config.train_steps:
      agreed = agreement.poll(stop.signum)
      if agreed is not None:
        break
      stop.check()
      batch = jax.tree.map(to_global, next(train_iter))
      metrics = train_step(model, optimizer, batch, step)
      # At most two steps in flight: wait for the one before this. Without
      # a bound, dispatch runs ahead to the next logged step and the main
      # thread then waits there in C++, where Python cannot run the signal
      # handler: a SIGTERM (a preemption's notice) went unseen for 25 steps
      # of a 135M model on a CPU (4 minutes), past any grace period.
      if in_flight is not None:
        jax.block_until_ready(in_flight)
      in_flight = metrics
      step += 1
      progress.bar.update(1)
      is_last = step == config.train_steps
      logged = step % config.log_every_steps == 0 or is_last
      if logged:
        last_train = {k: float(v) for k, v in jax.device_get(metrics).items()}
        check_finite(last_train, step, manager)
        steps_per_second = progress.steps_per_second(step)
        writer.write(step, **last_train, steps_per_second=steps_per_second)
        progress.show(step, last_train, steps_per_second)
      if config.eval_every_steps and (
          step % config.eval_every_steps == 0 or is_last
      ):
        # A signal during the eval stops it, and the run, at this step.
        evaluated = run_eval(is_last, stop_requested=stop_requested)
        if evaluated is None:
          agreed = agreement.agreed
          break
        last_eval = evaluated
        final_eval = is_last
      if step % config.checkpoint_every_steps == 0 or is_last:
        save(metrics, logged)
        saved_step = step
    if agreed is None:  # a signal in the last step or eval, or none
      agreed = signals.agreed_signal(stop.signum)
    if agreed is not None and saved_step != step:
      save(metrics, logged=False)
    if start_step >= config.train_steps > 0:
      # Already finished (say, stopped by a signal during its final eval):
      # the training metrics it logged last, and the final model evaluated
      # again, so a rerun returns what the run did; recorded only if a
      # signal cut the final evaluation short. A signal stops this
      # evaluation too (a pretrained model's takes minutes), as it does the
      # run's own, before its next batch.
      last_train = _last_logged_train(workdir, start_step)
      if config.eval_every_steps and agreed is None:
        evaluated = run_eval(
            True,
            record=not _eval_logged(workdir, start_step),
            stop_requested=stop_requested,
        )
        if evaluated is None:
          agreed = agreement.agreed
        else:
          last_eval = evaluated
          final_eval = True
    with stop.grace():
      manager.wait_until_finished()
    stop.check()
    if agreed is None and stop.requested:  # a signal while the last save ended
      agreed = stop.signum
    if (
        agreed is not None
        and step >= config.train_steps
        and (final_eval or not config.eval_every_steps)
    ):
      # Trained, evaluated and saved to the end: the signal stopped nothing
      # (a rerun would only evaluate the finished run again).
      logging.warning(
          "signal %d arrived as the run ended; it is complete at step %d.",
          agreed,
          step,
      )
      agreed = None
  except (errors.Interrupted, errors.TrainingError):
    interrupted = True
    raise
  except Exception as error:  # pylint: disable=broad-except
    if jax.process_count() == 1 or not _peer_failed(error):
      raise
    # Another process died (SIGKILL, out of memory) and a computation
    # shared with it failed. This one used to end in jax.distributed's
    # shutdown barrier, waiting out the dead peer's heartbeat timeout
    # (100 s) with the workdir's lock and the coordinator's port held, and
    # then abort: it stops now, its saves left to the exit (a save under
    # way waits at a barrier for the dead process).
    interrupted = True
    raise errors.TrainingError(
        f"a computation across the {jax.process_count()} processes failed "
        f"at step {step} ({errors.first_line(error)}); another process has "
        "probably died (its log says why). Stop every process, then rerun "
        "the same command on all of them to resume from the last checkpoint."
    ) from error
  finally:
    watch.__exit__(None, None, None)
    stop.restore()
    if not interrupted:  # else a save may hang: leave it to the exit
      manager.wait_until_finished()
      checkpoints.seal_finished(manager)
      manager.close()
    progress.bar.close()
    writer.close()
    if hasattr(train_iter, "close"):
      train_iter.close()
  if agreed is not None:
    logging.warning(
        "stopped by signal %d at step %d; checkpoint saved. Rerun "
        "the same command to resume.",
        agreed,
        step,
    )
  return dict(
      step=step,
      train=last_train,
      eval=last_eval,
      stopped_early=agreed is not None,
      signal=agreed,
  )


# What a computation shared with the other processes raises when one of them
# has died: its connections closed (Gloo's on CPUs, NCCL's on GPUs), or the
# dead process's heartbeats missed. JAX raises some as JaxRuntimeError, some
# (a dispatch after the failure) as ValueError.
_PEER_FAILURE_MARKERS = ("Gloo", "NCCL", "by peer", "heartbeat timeout")


def _peer_failed(error: BaseException) -> bool:
  """Whether ``error`` says a collective with another process failed."""
  text = str(error)
  return any(marker in text for marker in _PEER_FAILURE_MARKERS)


def _eval_cut_short(config, workdir, step) -> bool:
  """Whether the run resumes at an intermediate eval step that it saved
  without that evaluation (a signal during it or the step before).

  Process 0's answer on every process (the evaluation is collective; only
  process 0 writes metrics.jsonl).
  """
  cut_short = (
      0 < step < config.train_steps
      and config.eval_every_steps > 0
      and step % config.eval_every_steps == 0
      and not _eval_logged(workdir, step)
  )
  if jax.process_count() > 1:
    cut_short = multihost_utils.broadcast_one_to_all(np.asarray(cut_short))
  return bool(cut_short)


def _eval_logged(workdir, step) -> bool:
  """Whether ``metrics.jsonl`` holds an evaluation at ``step``."""
  path = os.path.join(workdir, "metrics.jsonl")
  return any(
      record["step"] == step and "loss" not in record
      for record in rundir.read_metrics(path)
  )


def _last_logged_train(workdir, step) -> dict:
  """The training metrics last logged at or before ``step`` ({} if none)."""
  records = [
      record
      for record in rundir.read_metrics(os.path.join(workdir, "metrics.jsonl"))
      if "loss" in record and record["step"] <= step
  ]
  if not records:
    return {}
  skip = ("step", "steps_per_second")
  return {k: v for k, v in records[-1].items() if k not in skip}


def print_samples(samples):
  print("sample predictions (question | answer | prediction):")
  for question, answer, prediction in samples:
    mark = "ok " if prediction.strip() == answer.strip() else "   "
    print(f"  {mark}{question} | {answer} | {prediction}")
