"""The trainer's failure paths: bad config, failed saves, NaN, locks, noise.

Each test reproduces a fault a user can cause (or a machine can), and checks
that the run ends the way docs/troubleshooting.md promises: one ``error:`` line and a
non-zero exit, good checkpoints kept, no hang, no library noise.
"""

import contextlib
import errno
import fcntl
import importlib
import json
import logging
import os
import pathlib
import re
import signal
import subprocess
import sys
import threading
import time
import types

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest

from configs import arithmetic_mix
from tests.test_train import config_flags
from tests.test_train import logged
from tests.test_train import make_config
from tests.test_train import ROOT
from tests.test_train import run_cli
from train import arithmetic_data
from train import checkpoints
from train import checks
from train import errors
from train import evaluate
from train import logs
from train import rundir
from train import signals
from train import train

from tests import launch


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  directory = tmp_path_factory.mktemp("data")
  arithmetic_data.prepare(str(directory), train_size=400, test_size=40, seed=0)
  return str(directory)


@contextlib.contextmanager
def running(command):
  """A training process that is killed if the test fails first."""
  process = launch.popen(
      command,
      cwd=ROOT,
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      text=True,
  )
  try:
    yield process
  finally:
    if process.poll() is None:
      process.kill()
      process.communicate()


def error_lines(stderr):
  return [line for line in stderr.splitlines() if line.startswith("error:")]


def assert_one_error(result, message, returncode=2):
  assert result.returncode == returncode, result.stderr[-3000:]
  assert "Traceback" not in result.stderr, result.stderr[-3000:]
  errors = error_lines(result.stderr)
  assert len(errors) == 1 and message in errors[0], result.stderr[-3000:]


# ----------------------------------------------------------------------------
# Bad configs and paths: refused before anything compiles.


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("batch_size", 0, "batch_size must be >= 1"),
        ("eval_batch_size", 0, "eval_batch_size must be >= 1"),
        ("checkpoint_every_steps", 0, "checkpoint_every_steps must be >= 1"),
        ("log_every_steps", -1, "log_every_steps must be >= 1"),
        ("fsdp", 0, "fsdp must be >= 1"),
        ("keep_checkpoints", 0, "keep_checkpoints must be >= 1"),
        ("max_question_len", 0, "max_question_len must be >= 1"),
        ("max_answer_len", 0, "max_answer_len must be >= 1"),
        ("train_steps", -5, "train_steps must be >= 1"),
        # 0 trained and evaluated nothing, and exited 0.
        ("train_steps", 0, "train_steps must be >= 1"),
        ("warmup_steps", 3 * 10**9, "warmup_steps must be < 2**31"),
        ("lam", -0.3, "lam must be >= 0"),
        ("learning_rate", 0.0, "learning_rate must be > 0"),
        ("learning_rate", -1e-3, "learning_rate must be > 0"),
        ("dtype", "float8", "unknown dtype 'float8'"),
        ("param_dtype", "int8", "unknown param_dtype 'int8'"),
        ("lam", float("nan"), "must be finite numbers, got lam=nan"),
        ("learning_rate", float("inf"), "got learning_rate=inf"),
        ("tau", 0.0, "tau must be >= 1e-30"),
        ("tau", 1e-50, "tau must be >= 1e-30"),
        ("sigma", -2.0, "sigma must be > -1"),
        ("soft_label_eta", 1.5, "soft_label_eta must be in [0, 1]"),
        ("soft_label_width", 0.0, "soft_label_width must be >= 1e-30"),
        ("gumbel_noise", -0.1, "gumbel_noise must be >= 0"),
    ],
)
def test_bad_number_refused_before_compiling(
    data_dir, tmp_path, field, value, message
):
  config = make_config(data_dir, **{field: value})
  started = time.perf_counter()
  with pytest.raises(train.ConfigError, match=re.escape(message)):
    train.train_and_evaluate(config, str(tmp_path / "w"))
  assert time.perf_counter() - started < 10  # nothing was compiled
  assert not (tmp_path / "w" / "checkpoints").exists()


@pytest.mark.parametrize(
    "config_module, overrides, message",
    [
        ("clock_time", dict(image_channels=(16, 0)), "image_channels positive"),
        ("grounding", dict(patch_size=0), "patch_size must be >= 1, got 0"),
        ("arithmetic_mix", dict(method="ntil", digit_ce_weight=0.3), "control"),
        (
            "arithmetic_mix",
            dict(task="arithmetic_mix_llm"),
            "needs its own config's fields",
        ),
        # Passed every check, then crashed at the first step's trace (tokamax
        # NotImplementedError: "Not supported on cpu").
        (
            "arithmetic_mix",
            dict(fused_loss="tokamax:mosaic_tpu"),
            "tokamax's TPU kernel; this run's devices are 'cpu'",
        ),
    ],
)
def test_a_model_or_task_the_config_cannot_make_is_one_error(
    config_module, overrides, message
):
  """Each crashed with a raw traceback (ValueError once the model was built,
  ZeroDivisionError, AttributeError) instead of one ConfigError line."""
  config = importlib.import_module(f"configs.{config_module}").get_config("ce")
  for name, value in overrides.items():
    config[name] = value
  with pytest.raises(errors.ConfigError, match=re.escape(message)):
    checks.check_config(config, data=False)


@pytest.mark.parametrize(
    "method, overrides, named",
    [
        ("ntil", {}, []),
        ("ntil", dict(sigma=0.5, tau=0.3, fused_loss="auto"), []),
        ("ntil", dict(fused_loss=True, fused_chunk_size=8), []),
        ("ntil", dict(soft_label_width=3.0), ["soft_label_width=3.0"]),
        ("emd", dict(gumbel_noise=1.0), ["gumbel_noise=1.0"]),
        ("soft_label", dict(tau=0.5, soft_label_eta=0.2), ["tau=0.5"]),
        (
            "ce",
            dict(sigma=0.9, lam=0.7, weighting="authors"),
            ["sigma=0.9", "lam=0.7", "weighting='authors'"],
        ),
        ("ntil", dict(fused_chunk_size=7), ["fused_chunk_size=7"]),
    ],
)
def test_settings_the_run_does_not_read_are_named(method, overrides, named):
  """Another method's loss settings (and lam with CE, a chunk size off the
  fused path) were dropped without a word: a run trained something other
  than its config read."""
  config = arithmetic_mix.get_config(method)
  for name, value in overrides.items():
    config[name] = value
  checks.check_config(config, data=False)  # still a valid config
  warning = checks.unused_settings_warning(config)
  if not named:
    assert warning is None
  else:
    for setting in named:
      assert setting in warning
    assert warning.count("(") == len(named)


def test_metric_sums_over_hosts_stay_float64(monkeypatch):
  """Two hosts' sums: process_allgather puts its input on a device, where
  float64 became float32 (x64 off), so an error sum of 2.5e38 per host
  came back inf and every sum rounded to 1e-7."""
  monkeypatch.setattr(jax, "process_count", lambda: 2)

  def allgather(x):  # two hosts with the same sums, through a device
    on_device = np.asarray(jnp.asarray(x))
    return np.stack([on_device, on_device])

  monkeypatch.setattr(evaluate.multihost_utils, "process_allgather", allgather)
  sums = dict(
      abs_error=2.5e38,
      fine=1.0 + 2.0**-40,
      count=3,
      by_length=np.asarray([1.0, 2.0, 5.0]),
  )
  total = evaluate._sum_over_hosts(sums)  # pylint: disable=protected-access
  assert total["abs_error"] == 5e38
  assert total["fine"] == 2.0 + 2.0**-39
  assert total["count"] == 6
  np.testing.assert_array_equal(total["by_length"], [2.0, 4.0, 10.0])


def test_workdir_checks(data_dir, tmp_path):
  config = make_config(data_dir)
  with pytest.raises(train.ConfigError, match="--workdir is empty"):
    train.train_and_evaluate(config, "")
  (tmp_path / "file").write_text("x")
  with pytest.raises(train.ConfigError, match="is a file"):
    train.train_and_evaluate(config, str(tmp_path / "file"))
  (tmp_path / "w").mkdir()
  (tmp_path / "w" / "checkpoints").write_text("x")
  with pytest.raises(train.ConfigError, match="checkpoints is a file"):
    train.train_and_evaluate(config, str(tmp_path / "w"))
  with pytest.raises(train.ConfigError, match="data_dir .* is a file"):
    train.train_and_evaluate(
        make_config(str(tmp_path / "file")), str(tmp_path / "w2")
    )


def test_too_little_data_is_refused_before_the_model_is_built(
    data_dir, tmp_path, monkeypatch
):
  def never(*args, **kwargs):
    raise AssertionError("the model was built before the data was checked")

  monkeypatch.setattr(train.models, "create_model", never)
  # 400 training examples, fewer than one batch of 512.
  with pytest.raises(train.ConfigError) as raised:
    train.train_and_evaluate(
        make_config(data_dir, batch_size=512), str(tmp_path / "w")
    )
  assert "512" in str(raised.value)


def test_read_only_workdir(data_dir, tmp_path, monkeypatch):
  # As root, chmod does not stop writes; make the probe's open fail instead.
  real_open = os.open

  def refuse(path, *args, **kwargs):
    if ".write-probe" in str(path):
      raise PermissionError(13, "Permission denied", path)
    return real_open(path, *args, **kwargs)

  monkeypatch.setattr(os, "open", refuse)
  with pytest.raises(train.ConfigError, match="is not writable"):
    train.train_and_evaluate(make_config(data_dir), str(tmp_path / "w"))


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--workdir="], "--workdir is empty"),
        (["--config.eval_batch_size=0"], "eval_batch_size must be >= 1"),
        (["--config.dtype=float8"], "unknown dtype"),
        (["--config.lam=nan"], "must be finite numbers, got lam=nan"),
        (["--config.fused_loss=sometimes"], "fused_loss must be True, False"),
    ],
)
def test_bad_config_cli_one_line(data_dir, tmp_path, flags, message):
  result = run_cli(make_config(data_dir), tmp_path, *flags, check=False)
  assert_one_error(result, message)


def _strict_json(line):
  def refuse(constant):
    raise ValueError(f"non-strict JSON constant {constant}")

  return json.loads(line, parse_constant=refuse)


def test_lam_zero_logs_finite_strict_json(data_dir, tmp_path):
  config = make_config(data_dir, train_steps=2, lam=0.0)
  result = train.train_and_evaluate(config, str(tmp_path))
  records = [
      _strict_json(line)
      for line in (tmp_path / "metrics.jsonl").read_text().splitlines()
  ]
  assert [r["step"] for r in records] == [1, 2]
  for record in records:  # CE alone is trained; the numeric loss is logged
    assert record["loss"] == record["ce"]
    assert np.isfinite(record["numeric"]) and record["numeric"] > 0
  assert result["train"]["numeric"] == records[-1]["numeric"]


def test_non_finite_metric_is_written_as_null(tmp_path, caplog):
  writer = rundir.MetricsWriter(str(tmp_path), 0)
  writer.write(3, loss=1.5, exact_match=float("nan"), gap=float("inf"))
  writer.close()
  (line,) = (tmp_path / "metrics.jsonl").read_text().splitlines()
  assert _strict_json(line) == dict(
      step=3, loss=1.5, exact_match=None, gap=None
  )
  assert "metric exact_match is nan at step 3" in caplog.text


def test_a_record_written_in_parts_is_whole(tmp_path, monkeypatch):
  # A write may take only part of a line (a nearly full disk): the rest is
  # written after it, not left for the next record to tear.
  write = os.write
  monkeypatch.setattr(
      rundir.os, "write", lambda fd, data: write(fd, bytes(data[:7]))
  )
  writer = rundir.MetricsWriter(str(tmp_path), 0)
  writer.write(1, loss=1.25)
  writer.write(2, loss=0.5)
  writer.close()
  lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
  assert [_strict_json(line) for line in lines] == [
      dict(step=1, loss=1.25),
      dict(step=2, loss=0.5),
  ]


def test_an_evaluation_says_how_many_it_scored_of_how_many(
    data_dir, monkeypatch, caplog
):
  """max_answer_len below the longest answer used to cut the test split to
  the answers that fit, reported as "exact match ... on N problems"."""
  config = make_config(data_dir, max_answer_len=1, eval_examples=0)
  task = train.get_task(config)
  # No model: every prediction is empty (only the counts matter here).
  monkeypatch.setattr(
      evaluate,
      "_decode",
      lambda model, prompts, *args: np.zeros((prompts.shape[0], 2), np.int32),
  )
  model = types.SimpleNamespace(eval=lambda: None, train=lambda: None)
  with caplog.at_level(logging.WARNING, logger="absl"):
    metrics, _, _ = evaluate.evaluate(model, config, np.asarray, task)
  scored = metrics["num_examples"]
  assert 0 < scored < metrics["test_examples"] == 40
  assert f"on {scored} of 40 problems" in task.headline(metrics)
  (warning,) = [m for m in caplog.messages if "test examples" in m]
  assert f"scored {scored} of the 40 test examples" in warning
  assert "max_answer_len=1" in warning
  # A deliberate cut (eval_examples) is said, not warned about.
  caplog.clear()
  config = make_config(data_dir, eval_examples=20)
  metrics, _, _ = evaluate.evaluate(model, config, np.asarray, task)
  assert "on 20 of 40 problems" in task.headline(metrics)
  assert not [m for m in caplog.messages if "test examples" in m]


def test_a_kernel_wrong_for_the_vocabulary_is_refused_before_the_workdir(
    data_dir, tmp_path
):
  """tokamax's chunked_xla on a vocabulary it cannot take was refused only
  when the step was traced, after the workdir was made."""
  pytest.importorskip("tokamax")
  config = make_config(data_dir, fused_loss="tokamax:chunked_xla")
  with pytest.raises(train.ConfigError, match=r"chunked_xla.*is wrong for V="):
    train.train_and_evaluate(config, str(tmp_path / "w"))
  assert not (tmp_path / "w").exists()


def test_fused_loss_auto_on_a_task_config_cli(data_dir, tmp_path):
  result = run_cli(
      make_config(data_dir, train_steps=2),
      tmp_path,
      "--config.fused_loss=auto",
  )
  assert "Traceback" not in result.stderr
  assert rundir.read_config_record(str(tmp_path))["fused_loss"] == "auto"
  assert sorted(logged(str(tmp_path))) == [1, 2]


def test_checkpoints_path_is_a_file_cli(data_dir, tmp_path):
  (tmp_path / "checkpoints").write_text("not a directory")
  started = time.perf_counter()
  result = run_cli(make_config(data_dir), tmp_path, check=False)
  assert time.perf_counter() - started < 120  # was: a 300 s orbax timeout
  assert_one_error(result, "is a file")


# ----------------------------------------------------------------------------
# Failed saves, signals, exit codes.


def test_save_failing_mid_run_stops_at_once(data_dir, tmp_path):
  config = make_config(data_dir, train_steps=100000, checkpoint_every_steps=4)
  command = [
      sys.executable,
      "-m",
      "train.main",
      f"--config={ROOT}/configs/arithmetic_mix.py:ntil",
      f"--workdir={tmp_path}",
      *config_flags(config),
  ]
  with running(command) as process:
    checkpoints = tmp_path / "checkpoints"
    deadline = time.time() + 300
    while time.time() < deadline and process.poll() is None:
      if (checkpoints / "4" / "commit_success.txt").exists():
        break
      time.sleep(0.1)
    # The disk "goes away": the checkpoint directory becomes a file. A save
    # under way may make the directory again between the two: moved again.
    for attempt in range(100):
      if checkpoints.is_dir():
        checkpoints.rename(tmp_path / f"moved{attempt}")
      try:
        fd = os.open(checkpoints, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
      except FileExistsError:
        continue
      os.write(fd, b"gone")
      os.close(fd)
      break
    assert checkpoints.is_file()
    started = time.time()
    _, stderr = process.communicate(timeout=240)
  assert time.time() - started < 60, "the failed save hung"
  assert process.returncode == 1, stderr[-3000:]
  errors = error_lines(stderr)
  assert len(errors) == 1, stderr[-3000:]
  assert re.search(r"(saving|writing a) checkpoint.* failed", errors[0])
  assert "Traceback" not in stderr


@pytest.mark.parametrize(
    "error, is_failure",
    [
        (OSError(28, "No space left on device"), True),
        # A second signal raised in orbax's wait, which logs it on the way
        # out: the stop itself, reported as the signal (exit 128 + N), not
        # as a failed write that tells the user to free the disk.
        (train.Interrupted(signal.SIGTERM), False),
        (KeyboardInterrupt(), False),
    ],
)
def test_what_orbax_logs_counts_as_a_failed_write(error, is_failure):
  failures = []
  handler = signals._BackgroundFailures(
      types.SimpleNamespace(fail=failures.append)
  )
  for path in (f"{os.sep}orbax{os.sep}checkpoint_manager.py", "elsewhere.py"):
    record = logging.LogRecord(
        "orbax",
        logging.ERROR,
        path,
        1,
        "failed",
        (),
        (type(error), error, None),
    )
    handler.emit(record)
  assert failures == ([error] if is_failure else [])


def _exit_on(error, monkeypatch):
  """What ``errors.exit_on_error`` does with ``error``: (message, status)."""
  exits = []

  def record_exit(message, code):
    exits.append((message, code))
    raise SystemExit(code)

  monkeypatch.setattr(errors, "_exit_now", record_exit)
  with pytest.raises(SystemExit), errors.exit_on_error():
    raise error
  return exits[0]


def test_a_full_disk_is_one_error_line(monkeypatch):
  # The metrics write fails, then the clean-up's write fails again and
  # hides it: the full disk is found in the chain.
  full = OSError(errno.ENOSPC, "No space left on device", "/w/metrics.jsonl")
  try:
    try:
      raise full
    finally:
      raise RuntimeError("sealing the last checkpoint failed")
  except RuntimeError as chained:
    message, code = _exit_on(chained, monkeypatch)
  assert code == 1
  assert message.startswith(
      "error: writing /w/metrics.jsonl failed (No space left on device); "
  )
  assert "rerun the same command to resume" in message
  read_only = OSError(errno.EROFS, "Read-only file system")
  message, code = _exit_on(read_only, monkeypatch)
  assert code == 1 and "a write failed (Read-only file system)" in message
  # Any other error is not the disk's: it goes on up as it was.
  with pytest.raises(FileNotFoundError), errors.exit_on_error():
    raise FileNotFoundError(errno.ENOENT, "No such file", "/data")


def test_the_workdir_probe_writes(tmp_path, monkeypatch):
  # A full disk still makes empty files: only a write finds it full.
  rundir.probe_writable(str(tmp_path))
  assert not list(tmp_path.iterdir())

  def full(fd, data):
    raise OSError(errno.ENOSPC, "No space left on device")

  monkeypatch.setattr(os, "write", full)
  with pytest.raises(errors.ConfigError, match="No space left on device"):
    checks.check_workdir(str(tmp_path / "run"))
  assert not list((tmp_path / "run").iterdir())


def test_sigterm_during_a_hung_save_ends_at_once(
    data_dir, tmp_path, monkeypatch
):
  if threading.current_thread() is not threading.main_thread():
    pytest.skip("signal handlers need the main thread")

  def hang(*args, **kwargs):
    del args, kwargs
    while True:
      time.sleep(0.05)

  monkeypatch.setattr(ocp.CheckpointManager, "save", hang)
  # The save may finish for this long after the signal, then the run ends.
  monkeypatch.setattr(signals, "SAVE_GRACE_SECONDS", 1.0)
  config = make_config(data_dir, train_steps=6, checkpoint_every_steps=2)
  timer = threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGTERM))
  original = checkpoints.save_checkpoint

  def save_then_signal(*args, **kwargs):
    timer.start()  # signal arrives while the save hangs
    return original(*args, **kwargs)

  monkeypatch.setattr(checkpoints, "save_checkpoint", save_then_signal)
  started = time.perf_counter()
  with pytest.raises(train.Interrupted) as raised:
    train.train_and_evaluate(config, str(tmp_path))
  assert raised.value.signum == signal.SIGTERM
  assert time.perf_counter() - started < 120


def test_a_signal_before_a_stalled_background_save_ends_it_in_the_grace(
    data_dir, tmp_path, monkeypatch
):
  """SIGTERM while training, a background save stalled (a hung filesystem):
  the grace's clock started only for a signal inside a save, so the run
  waited for that save past the scheduler's notice."""
  if threading.current_thread() is not threading.main_thread():
    pytest.skip("signal handlers need the main thread")
  monkeypatch.setattr(signals, "SAVE_GRACE_SECONDS", 1.0)
  release, sent = threading.Event(), []
  original = ocp.CheckpointManager._finalize  # pylint: disable=protected-access

  def stalled(self, step, *args, **kwargs):
    if not sent:  # the first background save, in its own thread
      sent.append(time.perf_counter())
      os.kill(os.getpid(), signal.SIGTERM)
      release.wait(60)
    return original(self, step, *args, **kwargs)

  monkeypatch.setattr(ocp.CheckpointManager, "_finalize", stalled)
  config = make_config(data_dir, train_steps=8, checkpoint_every_steps=2)
  try:
    with pytest.raises(train.Interrupted) as raised:
      train.train_and_evaluate(config, str(tmp_path))
    ended = time.perf_counter()
  finally:
    release.set()
  assert raised.value.signum == signal.SIGTERM
  assert ended - sent[0] < 30


def test_sigterm_during_a_save_lets_it_finish_and_stops_there(
    data_dir, tmp_path, monkeypatch
):
  """A preemption's SIGTERM during a checkpoint save (hashing the last
  checkpoint, writing this one): the save finishes and the run stops at its
  step, instead of dropping it and resuming a checkpoint interval back."""
  if threading.current_thread() is not threading.main_thread():
    pytest.skip("signal handlers need the main thread")
  config = make_config(data_dir, train_steps=6, checkpoint_every_steps=2)
  original = checkpoints.save_checkpoint

  def signal_then_save(manager, step, *args, **kwargs):
    if step in (4, 6):  # the signal arrives while this save is under way
      os.kill(os.getpid(), signal.SIGTERM)
      time.sleep(0.2)
    return original(manager, step, *args, **kwargs)

  monkeypatch.setattr(checkpoints, "save_checkpoint", signal_then_save)
  result = train.train_and_evaluate(config, str(tmp_path))
  assert result["stopped_early"] and result["signal"] == signal.SIGTERM
  assert result["step"] == 4
  assert rundir.saved_steps(str(tmp_path))[-1] == 4
  # In the last save, after the last evaluation: the run is complete, and
  # is not reported stopped (exit 128 + N: a scheduler would run it again).
  resumed = train.train_and_evaluate(config, str(tmp_path))
  assert not resumed["stopped_early"] and resumed["step"] == 6
  assert rundir.saved_steps(str(tmp_path))[-1] == 6


def test_a_signal_during_an_evaluation_stops_it(
    data_dir, tmp_path, monkeypatch
):
  """SIGTERM during an evaluation: the run stops before the next batch of
  it and saves the step; it used to finish the evaluation first (minutes
  for a pretrained model's test set, past a scheduler's grace period)."""
  if threading.current_thread() is not threading.main_thread():
    pytest.skip("signal handlers need the main thread")
  config = make_config(
      data_dir,
      train_steps=4,
      eval_every_steps=2,
      checkpoint_every_steps=4,
      eval_batch_size=8,
      eval_examples=40,
  )
  decoded = []
  original = evaluate._decode

  def decode_then_signal(*args):
    decoded.append(1)
    if len(decoded) == 1:
      os.kill(os.getpid(), signal.SIGTERM)
    return original(*args)

  monkeypatch.setattr(evaluate, "_decode", decode_then_signal)
  result = train.train_and_evaluate(config, str(tmp_path))
  assert result["stopped_early"] and result["signal"] == signal.SIGTERM
  assert result["step"] == 2
  assert len(decoded) == 1  # of 5 batches
  assert os.listdir(tmp_path / "checkpoints") == ["2"]
  assert 2 not in logged(str(tmp_path), "exact_match")
  resumed = train.train_and_evaluate(config, str(tmp_path))
  assert resumed["step"] == 4 and not resumed["stopped_early"]
  # The evaluation the signal cut short is made when the run resumes (it
  # was lost for good), once, as the uninterrupted run made it.
  assert sorted(logged(str(tmp_path), "exact_match")) == [2, 4]
  records = rundir.read_metrics(tmp_path / "metrics.jsonl")
  assert [r["step"] for r in records if "exact_match" in r] == [2, 4]
  # In the final evaluation: the run is finished, and a rerun evaluates it
  # and records that evaluation, once.
  decoded.clear()
  config.train_steps = 6
  stopped = train.train_and_evaluate(config, str(tmp_path))
  assert stopped["stopped_early"] and stopped["step"] == 6
  assert 6 not in logged(str(tmp_path), "exact_match")
  rerun = train.train_and_evaluate(config, str(tmp_path))
  assert rerun["step"] == 6 and not rerun["stopped_early"]
  assert logged(str(tmp_path), "exact_match")[6] == rerun["eval"]["exact_match"]
  again = train.train_and_evaluate(config, str(tmp_path))
  assert again["eval"] == rerun["eval"]
  records = rundir.read_metrics(tmp_path / "metrics.jsonl")
  assert sum(r["step"] == 6 and "exact_match" in r for r in records) == 1
  # A signal during a finished run's evaluation stops it too, before its
  # next batch (it used to run to the end), leaving the record as it was.
  predictions = (tmp_path / "predictions.jsonl").read_bytes()
  decoded.clear()
  cut = train.train_and_evaluate(config, str(tmp_path))
  assert cut["stopped_early"] and cut["signal"] == signal.SIGTERM
  assert cut["step"] == 6 and len(decoded) == 1
  assert rundir.read_metrics(tmp_path / "metrics.jsonl") == records
  assert (tmp_path / "predictions.jsonl").read_bytes() == predictions


def test_stop_agreement_answers_one_poll_late_and_never_waits():
  """The agreement used on several processes, run on one: each poll answers
  with the signal seen at the poll before, without waiting for the step
  dispatched since (an all-gather at each step waited for it)."""

  @jax.jit
  def step(x):  # about half a second or more on 2 cores
    return jax.lax.fori_loop(0, 40, lambda i, y: jnp.tanh(y @ y), x)

  x = jnp.full((1024, 1024), 1e-3)
  step(x).block_until_ready()
  agreement = signals.StopAgreement(jax.device_put, 4, pipelined=True)
  assert agreement.poll(None) is None
  running_step = step(x)
  assert agreement.poll(signal.SIGTERM) is None  # the poll before saw none
  assert not running_step.is_ready(), "the poll waited for the step"
  assert agreement.poll(None) == signal.SIGTERM
  alone = signals.StopAgreement(jax.device_put, 4, pipelined=False)
  assert alone.poll(None) is None and alone.poll(signal.SIGINT) == signal.SIGINT


# ----------------------------------------------------------------------------
# Non-finite values.


def test_diverging_run_stops_and_keeps_good_checkpoints(
    data_dir, tmp_path, caplog
):
  config = make_config(
      data_dir,
      train_steps=3,
      warmup_steps=0,
      lr_decay_steps=12,
      log_every_steps=100,
  )
  train.train_and_evaluate(config, str(tmp_path))
  diverging = make_config(
      data_dir,
      train_steps=12,
      warmup_steps=0,
      lr_decay_steps=12,
      log_every_steps=100,
      learning_rate=1e30,
  )
  # A changed learning rate resumes only without the run's config record,
  # and says so.
  (tmp_path / rundir.CONFIG_RECORD).unlink()
  with pytest.raises(
      train.TrainingError, match=r"non-finite loss=nan.* at step 6.*step 3"
  ):
    train.train_and_evaluate(diverging, str(tmp_path))
  assert "holds checkpoints but no config.json: resuming" in caplog.text
  assert os.listdir(tmp_path / "checkpoints") == ["3"]
  # The good checkpoint still resumes.
  (tmp_path / rundir.CONFIG_RECORD).unlink()
  resumed = train.train_and_evaluate(
      make_config(data_dir, train_steps=6, warmup_steps=0, lr_decay_steps=12),
      str(tmp_path),
  )
  assert resumed["step"] == 6


def test_non_finite_checkpoint_is_moved_aside(
    data_dir, tmp_path, monkeypatch, caplog
):
  overrides = dict(warmup_steps=0, lr_decay_steps=12, log_every_steps=100)
  train.train_and_evaluate(
      make_config(data_dir, train_steps=3, **overrides), str(tmp_path)
  )
  # A trainer without the check saves a NaN state at step 6 (as silent
  # corruption of the files would). A changed learning rate resumes only
  # without the run's config record.
  (tmp_path / rundir.CONFIG_RECORD).unlink()
  with monkeypatch.context() as patch:
    patch.setattr(train, "check_finite", lambda *args: None)
    train.train_and_evaluate(
        make_config(data_dir, train_steps=6, learning_rate=1e30, **overrides),
        str(tmp_path),
    )
  assert sorted(os.listdir(tmp_path / "checkpoints")) == ["3", "6"]
  (tmp_path / rundir.CONFIG_RECORD).unlink()
  resumed = train.train_and_evaluate(
      make_config(data_dir, train_steps=9, **overrides), str(tmp_path)
  )
  assert "checkpoint 6 is unreadable" in caplog.text
  assert "NaN or inf" in caplog.text
  assert (tmp_path / "checkpoints" / "corrupt-6").is_dir()
  assert resumed["step"] == 9 and resumed["train"]["loss"] < 100


# ----------------------------------------------------------------------------
# Two runs, one workdir; torn metrics.


def test_second_run_on_a_workdir_is_refused(data_dir, tmp_path):
  with rundir.WorkdirLock(str(tmp_path)):
    with pytest.raises(
        train.ConfigError,
        match=f"in use by another run \\(pid {os.getpid()}\\)",
    ):
      train.train_and_evaluate(make_config(data_dir), str(tmp_path))
  assert not (tmp_path / "metrics.jsonl").exists()


def test_lock_of_a_live_process_and_of_a_dead_one(data_dir, tmp_path):
  holder = launch.popen(
      [
          sys.executable,
          "-c",
          "import sys, time; from train import rundir; "
          "lock = rundir.WorkdirLock(sys.argv[1]).__enter__(); "
          "print('locked', flush=True); time.sleep(600)",
          str(tmp_path),
      ],
      cwd=ROOT,
      stdout=subprocess.PIPE,
      text=True,
  )
  try:
    assert holder.stdout.readline().strip() == "locked"
    result = run_cli(
        make_config(data_dir, train_steps=2), tmp_path, check=False
    )
  finally:
    holder.kill()
    holder.wait()
  assert_one_error(result, f"in use by another run (pid {holder.pid})")
  # The dead holder's pid is still in the file; its lock is gone.
  assert (tmp_path / ".lock").read_text().strip() == str(holder.pid)
  train.train_and_evaluate(make_config(data_dir, train_steps=2), str(tmp_path))
  assert sorted(logged(str(tmp_path))) == [1, 2]


def test_lock_is_released_after_a_run(data_dir, tmp_path):
  train.train_and_evaluate(make_config(data_dir, train_steps=1), str(tmp_path))
  with open(tmp_path / ".lock") as f:
    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)  # would raise if held


def test_torn_metrics_line_is_dropped_on_resume(data_dir, tmp_path, caplog):
  overrides = dict(lr_decay_steps=6)
  train.train_and_evaluate(
      make_config(data_dir, train_steps=3, **overrides), str(tmp_path)
  )
  with open(tmp_path / "metrics.jsonl", "a") as f:
    f.write('{"step": 21, "ce": 2.1')  # a crash in the middle of a write
  train.train_and_evaluate(
      make_config(data_dir, train_steps=6, **overrides), str(tmp_path)
  )
  assert "dropping torn line" in caplog.text
  assert sorted(logged(str(tmp_path))) == list(range(1, 7))
  straight = tmp_path / "straight"
  train.train_and_evaluate(
      make_config(data_dir, train_steps=6, **overrides), str(straight)
  )
  assert logged(str(tmp_path)) == logged(str(straight))


# ----------------------------------------------------------------------------
# Corrupt checkpoints, quietly.


def _destroy(checkpoint: pathlib.Path):
  for path in (checkpoint / "state").rglob("*"):
    if path.is_file() and path.parent.name == "d":
      path.write_bytes(b"trunc")
  (checkpoint / "state" / "manifest.ocdbt").unlink()


def test_left_over_asyncio_errors_stay_off_the_terminal():
  try:
    raise ValueError("NOT_FOUND: Error opening zarr driver")
  except ValueError:
    record = logging.getLogger("asyncio").makeRecord(
        "asyncio",
        logging.ERROR,
        "/usr/lib/python3.12/asyncio/base_events.py",
        1,
        "Task exception was never retrieved",
        (),
        sys.exc_info(),
    )
  assert not logs.TerminalFilter().filter(record)
  warning = logging.getLogger("orbax").makeRecord(
      "orbax",
      logging.WARNING,
      "/x/orbax/checkpoint/a.py",
      1,
      "careful",
      (),
      None,
  )
  assert logs.TerminalFilter().filter(warning)


def test_corrupt_checkpoints_one_warning_each_then_step_0(data_dir, tmp_path):
  config = make_config(data_dir, train_steps=6, lr_decay_steps=6)
  train.train_and_evaluate(config, str(tmp_path))
  for step in ("3", "6"):
    _destroy(tmp_path / "checkpoints" / step)
  # A fresh interpreter, whose shutdown (asyncio's loops) is part of the test.
  result = run_cli(config, tmp_path, fork=False)
  assert "Traceback" not in result.stderr, result.stderr[-3000:]
  assert "Event loop is closed" not in result.stderr
  warnings = [
      line for line in result.stderr.splitlines() if "is unreadable" in line
  ]
  assert len(warnings) == 2, result.stderr[-3000:]
  assert "training restarts from step 0" in result.stderr
  assert sorted(logged(str(tmp_path))) == list(range(1, 7))


# ----------------------------------------------------------------------------
# What the terminal shows.

_OWN_FILES = {
    path.name
    for package in ("train", "configs", "experiments", "ntil_jax")
    for path in (ROOT / package).rglob("*.py")
}
_LOG_LINE = re.compile(r"^([IWEF])\d{4} [\d:.]+ +\d+ ([\w.]+):\d+\]")


def library_info_lines(text):
  """absl-format INFO lines logged from files that are not this project's."""
  found = []
  for line in text.splitlines():
    match = _LOG_LINE.match(line)
    if match and match.group(1) == "I" and match.group(2) not in _OWN_FILES:
      found.append(line)
  return found


def test_trainer_terminal_has_no_library_info(data_dir, tmp_path):
  result = run_cli(
      make_config(
          data_dir, train_steps=3, checkpoint_every_steps=1, eval_every_steps=3
      ),
      tmp_path,
  )
  assert not library_info_lines(
      result.stderr + result.stdout
  ), library_info_lines(result.stderr + result.stdout)[:5]
  assert "exact match" in result.stdout
  log = (tmp_path / logs.LOG_FILE).read_text()
  assert "checkpoint_manager.py" in log  # the library lines are kept there


@pytest.mark.slow
def test_demo_terminal_is_quiet(tmp_path):
  command = [
      sys.executable,
      "-m",
      "train.demo",
      f"--workdir={tmp_path / 'demo'}",
      f"--data_dir={tmp_path / 'data'}",
      "--train_size=256",
      "--test_size=16",
      "--steps=2",
  ]
  # A fresh interpreter: what the libraries print while imported counts.
  result = launch.run(
      command,
      cwd=ROOT,
      capture_output=True,
      text=True,
      timeout=900,
      fork=False,
  )
  assert result.returncode == 0, result.stderr[-3000:]
  output = result.stdout + result.stderr
  assert not library_info_lines(output), library_info_lines(output)[:5]
  assert "downloaded and prepared" not in output
  assert "Downloading and preparing" not in output
  assert "examples/s" not in output  # TFDS's progress bars
  assert "exact match" in result.stdout
  assert "predictions.png" in result.stdout


def test_a_background_thread_failure_is_one_line(capsys):
  from unittest import mock  # pylint: disable=g-import-not-at-top
  import threading  # pylint: disable=g-import-not-at-top
  from train import logs  # pylint: disable=g-import-not-at-top

  previous = threading.excepthook
  logs.quiet_thread_errors()
  try:
    with mock.patch.object(logs.logging, "warning") as warning:

      def fail():
        raise ValueError("disk gone\nsecond line")

      thread = threading.Thread(target=fail, name="saver")
      thread.start()
      thread.join()
  finally:
    threading.excepthook = previous
  (call,) = warning.call_args_list
  assert call.args[1:] == ("saver", "ValueError", "disk gone")
  assert "Traceback" not in capsys.readouterr().err
