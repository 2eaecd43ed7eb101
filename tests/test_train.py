"""End-to-end trainer tests: methods, resume, sharding, multi-process, errors."""

import collections
import copy
import json
import logging
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import arithmetic_mix
from train import arithmetic_data
from train import checkpoints
from train import train

from tests import launch
from tests import shared

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  """Made once for every worker: the two-process reference run below,
  shared too, must read the data under the same path as the runs it is
  compared with."""
  return str(
      shared.once(
          tmp_path_factory,
          "test_train_data",
          lambda directory: arithmetic_data.prepare(
              str(directory), train_size=400, test_size=40, seed=0
          ),
      )
  )


def make_config(data_dir, method="ntil", **overrides):
  config = arithmetic_mix.get_config(method)
  config.data_dir = data_dir
  config.model = "tiny"
  config.batch_size = 8
  config.train_steps = 6
  config.warmup_steps = 2
  config.log_every_steps = 1
  config.eval_every_steps = 0
  config.checkpoint_every_steps = 3
  config.eval_batch_size = 20
  config.eval_examples = 20
  config.max_question_len = 64
  config.max_answer_len = 8
  for name, value in overrides.items():
    config[name] = value
  return config


def test_every_method_shares_one_optimizer_and_its_init():
  """A grid's methods, seeds, lengths and learning rates build one optimizer
  (and trace its init once): the schedule is the update's argument; a
  setting the optimizer reads makes another."""
  make = train.step_lib.make_optimizer
  ce = make_config("unused", method="ce")
  assert make(ce) is make(make_config("unused", method="ntil", seed=3))
  assert make(ce) is make(
      make_config(
          "unused",
          method="ce",
          learning_rate=2 * ce.learning_rate,
          warmup_steps=3,
          lr_decay_steps=12,
          train_steps=40,
      )
  )
  for name, value in (
      ("grad_clip_norm", 0.5),
      ("weight_decay", 0.0),
  ):
    assert make(make_config("unused", method="ce", **{name: value})) is not (
        make(ce)
    ), name


def config_flags(config):
  """--config.X=Y flags that reproduce ``config`` on the command line."""
  defaults = arithmetic_mix.get_config(config.method)
  return [
      f"--config.{k}={v}"
      for k, v in config.items()
      if k != "method" and v != defaults[k]
  ]


def logged(workdir, key="loss"):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    records = [json.loads(line) for line in f]
  return {r["step"]: r[key] for r in records if key in r}


def run_cli(config, workdir, *extra, env=None, check=True, fork=True):
  command = [
      sys.executable,
      "-m",
      "train.main",
      f"--config={ROOT}/configs/arithmetic_mix.py:{config.method}",
      f"--workdir={workdir}",
      *config_flags(config),
      *extra,
  ]
  result = launch.run(
      command,
      cwd=ROOT,
      capture_output=True,
      text=True,
      timeout=600,
      env=dict(os.environ, **(env or {})),
      fork=fork,
  )
  if check:
    assert result.returncode == 0, result.stderr[-3000:]
  return result


@pytest.mark.parametrize("method", arithmetic_mix.METHODS)
def test_each_method_trains_and_evaluates(data_dir, tmp_path, method):
  config = make_config(
      data_dir, method, train_steps=12, learning_rate=3e-3, eval_every_steps=12
  )
  result = train.train_and_evaluate(config, str(tmp_path))
  losses = logged(str(tmp_path))
  assert sorted(losses) == list(range(1, 13))
  assert losses[12] < losses[1]  # it learns
  ce = logged(str(tmp_path), "ce")
  if method == "ce":
    assert losses == ce
  else:
    assert all(losses[s] > ce[s] for s in losses)  # the numeric term is on
  assert 0.0 <= result["eval"]["exact_match"] <= 1.0
  assert result["eval"]["num_examples"] == 20
  assert logged(str(tmp_path), "exact_match") == {
      12: result["eval"]["exact_match"]
  }
  assert os.listdir(tmp_path / "tensorboard")


@pytest.mark.slow
def test_fused_loss_matches_logits_path(data_dir, tmp_path):
  plain = train.train_and_evaluate(
      make_config(data_dir, train_steps=3), str(tmp_path / "plain")
  )
  fused = train.train_and_evaluate(
      make_config(
          data_dir, train_steps=3, fused_loss=True, fused_chunk_size=100
      ),
      str(tmp_path / "fused"),
  )
  for step, loss in logged(str(tmp_path / "plain")).items():
    assert logged(str(tmp_path / "fused"))[step] == pytest.approx(
        loss, rel=1e-5
    )
  assert fused["step"] == plain["step"] == 3


def test_resume_equals_straight_run(data_dir, tmp_path):
  straight = make_config(data_dir, train_steps=8, lr_decay_steps=8)
  train.train_and_evaluate(straight, str(tmp_path / "straight"))
  first_half = make_config(data_dir, train_steps=4, lr_decay_steps=8)
  train.train_and_evaluate(first_half, str(tmp_path / "resumed"))
  assert sorted(os.listdir(tmp_path / "resumed" / "checkpoints")) == ["3", "4"]
  resumed = train.train_and_evaluate(straight, str(tmp_path / "resumed"))
  assert resumed["step"] == 8
  want = logged(str(tmp_path / "straight"))
  got = logged(str(tmp_path / "resumed"))
  assert sorted(got) == list(range(1, 9))
  assert got == want  # bitwise on CPU: params, optimizer, data and rng resume


def test_seeds_and_weights_share_one_traced_step_and_keep_their_own_runs(
    data_dir, tmp_path, monkeypatch
):
  """A grid's runs that differ only in their seed, length, learning-rate
  schedule or loss weights trace the step once (the seed's key, the weights
  and the schedule are arguments), and each run is bitwise the one it makes
  with the step traced afresh."""
  traces = []
  keyed = train.step_lib._keyed_step

  def counting(config):
    step = keyed(config)

    def counted(*args):
      traces.append((config.seed, config.sigma))
      return step(*args)

    return counted

  monkeypatch.setattr(train.step_lib, "_keyed_step", counting)
  monkeypatch.setattr(train.step_lib, "_SHARED", collections.OrderedDict())
  # The second run: another seed, other weights, a longer run on another
  # schedule (peak, warmup and horizon), another eval cadence.
  first = make_config(data_dir, seed=0, train_steps=3, lr_decay_steps=4)
  second = make_config(
      data_dir, seed=1, sigma=0.5, lam=1.0, alpha=0.0, train_steps=4
  )
  second.learning_rate = 3 * first.learning_rate
  second.warmup_steps = 1
  second.lr_decay_steps = 0  # the run's length
  second.checkpoint_every_steps = 2
  runs = {}
  for name, config in (("first", first), ("second", second)):
    train.train_and_evaluate(config, str(tmp_path / name))
    runs[name] = logged(str(tmp_path / name))
  assert traces == [(0, 0.2)]  # traced for the first, reused
  assert runs["first"] != {k: runs["second"][k] for k in runs["first"]}
  train.step_lib._SHARED.clear()
  train.train_and_evaluate(second, str(tmp_path / "alone"))
  assert traces == [(0, 0.2), (1, 0.5)]
  # The shared step trained with the second run's own key, weights and
  # schedule.
  assert logged(str(tmp_path / "alone")) == runs["second"]
  # Left out of the key: the seed, the weights (the digit-weighted CE
  # control's too), the schedule and the run's length, and the trainer's
  # cadence; any other setting is another program.
  key = train.step_lib._program_key
  assert key(first) == key(second)
  control = make_config(data_dir, method="ce", digit_ce_weight=0.3)
  assert key(control) == key(make_config(data_dir, method="ce"))
  for name, value in (
      ("lam", 0.0),  # no numeric loss: the step leaves it out
      ("tau", 0.5),
      ("weighting", "reference"),
      ("weight_decay", 0.0),
      ("batch_size", 2 * first.batch_size),
  ):
    changed = copy.deepcopy(first)
    changed[name] = value
    assert key(changed) != key(first), name


def test_rerun_of_a_finished_run_returns_what_it_did(
    data_dir, tmp_path, caplog
):
  """A grid reruns a finished workdir whose record was lost (a signal in
  its final eval): it must get the run's metrics, not a KeyError."""
  config = make_config(data_dir, train_steps=4, lr_decay_steps=4)
  first = train.train_and_evaluate(config, str(tmp_path))
  again = train.train_and_evaluate(config, str(tmp_path))
  assert again["step"] == 4 and not again["stopped_early"]
  assert set(first["train"]) >= {"loss", "ce"}
  assert again["train"] == first["train"]
  assert again["eval"] == first["eval"]
  assert sorted(logged(str(tmp_path))) == [1, 2, 3, 4]  # nothing re-logged
  # Rerun with a shorter schedule: the step-4 model, said in a warning.
  config.train_steps = 2
  with caplog.at_level(logging.WARNING):
    shorter = train.train_and_evaluate(config, str(tmp_path))
  assert shorter["step"] == 4 and shorter["eval"] == first["eval"]
  assert "at step 4, past train_steps=2" in caplog.text


def test_rerun_of_a_finished_run_keeps_its_predictions(data_dir, tmp_path):
  """Evaluated again on more examples (a setting a resume accepts): the
  predictions of the eval metrics.jsonl records stay; the new eval's
  replaced them, and the two files disagreed."""
  config = make_config(
      data_dir, train_steps=2, lr_decay_steps=2, eval_every_steps=2
  )
  train.train_and_evaluate(config, str(tmp_path))
  predictions = (tmp_path / "predictions.jsonl").read_text()
  assert len(predictions.splitlines()) == 20
  metrics = (tmp_path / "metrics.jsonl").read_text()
  config.eval_examples = 40
  train.train_and_evaluate(config, str(tmp_path))
  assert (tmp_path / "predictions.jsonl").read_text() == predictions
  assert (tmp_path / "metrics.jsonl").read_text() == metrics


def test_corrupt_newest_checkpoint_falls_back(data_dir, tmp_path, caplog):
  config = make_config(
      data_dir, train_steps=6, lr_decay_steps=9, checkpoint_every_steps=3
  )
  train.train_and_evaluate(config, str(tmp_path / "run"))
  newest = tmp_path / "run" / "checkpoints" / "6"
  for path in (newest / "state").rglob("*"):
    if path.is_file():
      path.write_bytes(b"garbage")
  resumed = train.train_and_evaluate(
      make_config(data_dir, train_steps=9, lr_decay_steps=9),
      str(tmp_path / "run"),
  )
  assert "checkpoint 6 is unreadable" in caplog.text
  assert (tmp_path / "run" / "checkpoints" / "corrupt-6").is_dir()
  assert resumed["step"] == 9
  straight = make_config(data_dir, train_steps=9, lr_decay_steps=9)
  train.train_and_evaluate(straight, str(tmp_path / "straight"))
  assert logged(str(tmp_path / "run")) == logged(str(tmp_path / "straight"))


def test_sigterm_checkpoints_and_stops(data_dir, tmp_path):
  config = make_config(
      data_dir, train_steps=100000, checkpoint_every_steps=100000
  )
  command = [
      sys.executable,
      "-m",
      "train.main",
      f"--config={ROOT}/configs/arithmetic_mix.py:ntil",
      f"--workdir={tmp_path}",
      *config_flags(config),
  ]
  process = launch.popen(
      command,
      cwd=ROOT,
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      text=True,
  )
  metrics = tmp_path / "metrics.jsonl"
  deadline = time.time() + 300
  while time.time() < deadline and process.poll() is None:
    if metrics.exists() and metrics.read_text().count("\n") >= 3:
      break
    time.sleep(0.2)
  process.send_signal(signal.SIGTERM)
  _, stderr = process.communicate(timeout=300)
  # Exit 143 (128 + SIGTERM): a scheduler can tell it from a finished run.
  assert process.returncode == 128 + signal.SIGTERM, stderr[-3000:]
  assert "rerun the same command to resume" in stderr
  steps = [int(s) for s in os.listdir(tmp_path / "checkpoints")]
  assert len(steps) == 1 and 3 <= steps[0] < 100000
  assert max(logged(str(tmp_path))) <= steps[0]


def test_signal_is_seen_within_two_steps_of_slow_steps(
    data_dir, tmp_path, monkeypatch
):
  """Slow steps (50 ms each on the device side, dispatch much faster) and
  metrics read only at the end: a SIGTERM that arrives while step 5 runs
  stops the run at step 6 or 7, not at the next logged step (the last,
  40), where an unbounded dispatch would first let the handler run."""
  make_step = train.step_lib.make_train_step

  def on_device(loss, step):
    time.sleep(0.05)
    if int(step) == 5:
      os.kill(os.getpid(), signal.SIGTERM)
    return loss

  slow = jax.jit(
      lambda loss, step: jax.pure_callback(
          on_device, jax.ShapeDtypeStruct(loss.shape, loss.dtype), loss, step
      )
  )

  def make_slow_step(config):
    real = make_step(config)

    def step_fn(model, optimizer, batch, step):
      metrics = real(model, optimizer, batch, step)
      return dict(metrics, loss=slow(metrics["loss"], jnp.int32(step)))

    return step_fn

  monkeypatch.setattr(train.step_lib, "make_train_step", make_slow_step)
  config = make_config(
      data_dir, train_steps=40, log_every_steps=40, checkpoint_every_steps=40
  )
  result = train.train_and_evaluate(config, str(tmp_path))
  assert result["stopped_early"] and result["signal"] == signal.SIGTERM
  assert 6 <= result["step"] <= 7, result["step"]
  # The state of the step it stopped at is saved, to resume from.
  assert os.listdir(tmp_path / "checkpoints") == [str(result["step"])]


def _free_port():
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _two_processes(config, workdir):
  """Two `train.main` processes of one run (jax.distributed), started."""
  command = [
      sys.executable,
      "-m",
      "train.main",
      f"--config={ROOT}/configs/arithmetic_mix.py:ntil",
      f"--workdir={workdir}",
      *config_flags(config),
      f"--coordinator_address=127.0.0.1:{_free_port()}",
      "--num_processes=2",
  ]
  return [
      launch.popen(
          command + [f"--process_id={i}"],
          cwd=ROOT,
          env=dict(os.environ, JAX_NUM_CPU_DEVICES="1"),
          stdout=subprocess.PIPE,
          stderr=subprocess.PIPE,
          text=True,
      )
      for i in range(2)
  ]


def _finish(processes, timeout=600):
  """Each process's stderr, once all exited 0; they are killed on a hang."""
  try:
    outputs = [p.communicate(timeout=timeout)[1] for p in processes]
  finally:
    for process in processes:
      process.kill()
  tails = "\n".join(f"process {i}: {e[-2000:]}" for i, e in enumerate(outputs))
  assert all(p.returncode == 0 for p in processes), tails
  return outputs


@pytest.mark.slow
def test_four_devices_equal_one(data_dir, tmp_path, caplog):
  config = make_config(data_dir, train_steps=4, fsdp=2, lr_decay_steps=6)
  run_cli(config, tmp_path / "four", env={"JAX_NUM_CPU_DEVICES": "4"})
  train.train_and_evaluate(
      make_config(data_dir, train_steps=4, lr_decay_steps=6),
      str(tmp_path / "one"),
  )
  one, four = logged(str(tmp_path / "one")), logged(str(tmp_path / "four"))
  assert sorted(four) == [1, 2, 3, 4]
  for step in one:
    assert four[step] == pytest.approx(one[step], rel=1e-5, abs=1e-6)
  # Saved FSDP-sharded over 4 devices, resumed on 1: the digest, computed
  # on the devices, does not depend on the sharding.
  resumed = train.train_and_evaluate(
      make_config(data_dir, train_steps=6, lr_decay_steps=6),
      str(tmp_path / "four"),
  )
  assert resumed["step"] == 6
  assert "unreadable" not in caplog.text
  assert sorted(logged(str(tmp_path / "four"))) == list(range(1, 7))


@pytest.mark.slow
def test_two_processes_equal_one(data_dir, tmp_path):
  config = make_config(data_dir, train_steps=4, eval_every_steps=4)
  _finish(_two_processes(config, tmp_path / "two"))
  single = train.train_and_evaluate(config, str(tmp_path / "one"))
  one, two = logged(str(tmp_path / "one")), logged(str(tmp_path / "two"))
  assert sorted(two) == [1, 2, 3, 4]
  for step in one:
    assert two[step] == pytest.approx(one[step], rel=1e-5, abs=1e-6)
  assert logged(str(tmp_path / "two"), "exact_match")[4] == pytest.approx(
      single["eval"]["exact_match"]
  )


@pytest.mark.slow
def test_a_checkpoint_one_process_cannot_read_is_skipped_by_both(
    data_dir, tmp_path
):
  """Process 1 alone cannot read checkpoint 4 (its own data position is
  garbage): both processes set it aside and resume from checkpoint 2
  together. Each used to decide alone: process 0 resumed at step 4 while
  process 1 went back to step 2, and their collectives no longer paired."""
  kept = dict(checkpoint_every_steps=2, eval_every_steps=0, lr_decay_steps=6)
  _finish(
      _two_processes(make_config(data_dir, train_steps=4, **kept), tmp_path)
  )
  checkpoint = tmp_path / "checkpoints" / "4"
  (checkpoint / checkpoints.FILE_DIGESTS).unlink()  # no seal to vouch for it
  (checkpoint / "train_iter" / "process_1-of-2.json").write_text("{garbage")
  _finish(
      _two_processes(make_config(data_dir, train_steps=6, **kept), tmp_path),
      timeout=300,
  )
  for name in ("train.log", "train.1.log"):
    text = (tmp_path / name).read_text()
    assert "resumed from step 2" in text and "from step 4" not in text, name
  assert "corrupt-4" in os.listdir(tmp_path / "checkpoints")
  assert sorted(logged(str(tmp_path))) == list(range(1, 7))


@pytest.mark.slow
def test_a_signal_to_one_process_stops_both_at_one_step(data_dir, tmp_path):
  """SIGTERM to process 0 alone: both processes stop at the same step, save
  it together and exit 143. A stop seen by one host alone left the other
  in the next step's collectives: the run hung, its save lost."""
  config = make_config(
      data_dir,
      train_steps=100000,
      log_every_steps=1,
      eval_every_steps=0,
      checkpoint_every_steps=100000,
  )
  workdir = tmp_path / "two"
  processes = _two_processes(config, workdir)
  try:
    deadline = time.time() + 300
    metrics = workdir / "metrics.jsonl"
    while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 3):
      assert time.time() < deadline, "no training steps logged"
      assert all(p.poll() is None for p in processes)
      time.sleep(0.05)
    processes[0].send_signal(signal.SIGTERM)
    outputs = [p.communicate(timeout=120)[1] for p in processes]
  finally:
    for process in processes:
      process.kill()
  for process, stderr in zip(processes, outputs):
    assert process.returncode == 128 + signal.SIGTERM, stderr[-3000:]
  stops = [
      [
          line
          for line in stderr.splitlines()
          if "stopped by signal 15 at" in line
      ]
      for stderr in outputs
  ]
  assert all(stops), outputs[1][-3000:]
  (saved,) = os.listdir(workdir / "checkpoints")
  assert 3 <= int(saved) < 100000
  for lines in stops:  # both at the step that was saved
    assert f"at step {saved}" in lines[-1], lines


def _kill_config(data_dir):
  """A two-process run long enough to be killed mid-way: 16 steps, a
  checkpoint every 4 (so 12 and 16 are kept, and a resume replays steps),
  an evaluation at 8 and 16."""
  return make_config(
      data_dir,
      train_steps=16,
      lr_decay_steps=16,
      log_every_steps=1,
      eval_every_steps=8,
      checkpoint_every_steps=4,
  )


@pytest.fixture(scope="module")
def straight_two_processes(data_dir, tmp_path_factory):
  """The workdir of a two-process `_kill_config` run never killed (made
  once for every worker; tests only read it)."""
  return shared.once(
      tmp_path_factory,
      "test_train_straight_two_processes",
      lambda workdir: _finish(_two_processes(_kill_config(data_dir), workdir)),
  )


def _records(workdir):
  """metrics.jsonl's records, without their speed."""
  with open(workdir / "metrics.jsonl") as f:
    records = [json.loads(line) for line in f]
  return [
      {k: v for k, v in r.items() if k != "steps_per_second"} for r in records
  ]


def _gist(stderr):
  """A process's stderr without its info lines and its thread dumps."""
  lines = [
      l
      for l in stderr.splitlines()
      if l.startswith(("error:", "E", "F", "Traceback", "jax.errors"))
      and not l.startswith("Extension modules")
  ]
  return "\n".join(lines)[-3000:]


def _saving(workdir, steps):
  """Whether orbax is writing a checkpoint of one of ``steps``."""
  folder = workdir / "checkpoints"
  names = os.listdir(folder) if folder.is_dir() else []
  return any(
      n.endswith(".orbax-checkpoint-tmp") and int(n.split(".")[0]) in steps
      for n in names
  )


@pytest.mark.slow
@pytest.mark.parametrize("killed", ["process1", "process0", "both_saving"])
def test_a_two_process_run_killed_resumes_as_if_never_killed(
    data_dir, tmp_path, straight_two_processes, killed
):
  """SIGKILL (the out-of-memory killer's) to one process of two mid-run,
  or to both while they save a checkpoint: the other process exits by
  itself within seconds, and the same command on both then resumes and
  ends with the straight run's losses, evaluations, predictions and final
  parameters, bit for bit. Process 0 used to take JAX's 100 s heartbeat
  timeout to notice its peer's death (a traceback, then a SIGABRT), its
  workdir lock and coordinator port held all the while."""
  config = _kill_config(data_dir)
  workdir = tmp_path / "killed"
  processes = _two_processes(config, workdir)
  metrics = workdir / "metrics.jsonl"
  try:
    deadline = time.time() + 300
    while not (
        _saving(workdir, (8, 12))  # not 16: it may be committed before the kill
        if killed == "both_saving"
        else metrics.exists() and len(metrics.read_text().splitlines()) >= 5
    ):
      assert time.time() < deadline, "no training steps logged"
      assert all(p.poll() is None for p in processes)
      time.sleep(0.005)
    victims = {"process0": [0], "process1": [1], "both_saving": [0, 1]}
    victims = victims[killed]
    for i in victims:
      processes[i].kill()
    start = time.time()
    survivors = [i for i in range(2) if i not in victims]
    outputs = [p.communicate(timeout=120)[1] for p in processes]
    waited = time.time() - start
  finally:
    for process in processes:
      process.kill()
  for i in victims:
    assert processes[i].returncode == -signal.SIGKILL
  assert "16" not in os.listdir(workdir / "checkpoints")  # killed mid-way
  for i in survivors:  # the killed peer's collectives fail at once
    assert processes[i].returncode != 0, _gist(outputs[i])
    assert waited < 30, (waited, _gist(outputs[i]))
    if i == 0:  # it sees the failure: one line says what to do
      lines = [l for l in outputs[i].splitlines() if l.startswith("error:")]
      assert processes[i].returncode == 1, _gist(outputs[i])
      assert len(lines) == 1 and "rerun" in lines[0], _gist(outputs[i])
  _finish(_two_processes(config, workdir), timeout=300)
  straight = straight_two_processes
  # Every loss, gradient norm and evaluation, bit for bit.
  records = [_records(run) for run in (workdir, straight)]
  assert records[0] == records[1]
  assert sorted(logged(str(workdir))) == list(range(1, 17))
  assert sorted(logged(str(workdir), "exact_match")) == [8, 16]
  assert train.read_predictions(str(workdir)) == train.read_predictions(
      str(straight)
  )
  names = os.listdir(workdir / "checkpoints")
  assert not [n for n in names if "corrupt" in n or "tmp" in n], names
  assert sorted(n for n in names if n.isdigit()) == ["12", "16", "8"]
  for run in (workdir, straight):  # every checkpoint now sealed
    assert (run / "checkpoints" / "16" / checkpoints.FILE_DIGESTS).exists()
  # The final parameters, optimizer state and data positions, bit for bit.
  digest = "checkpoints/16/digest/metadata"
  assert (workdir / digest).read_text() == (straight / digest).read_text()


@pytest.mark.parametrize(
    "case, overrides, env, message",
    [
        (
            "missing data",
            dict(data_dir="/nonexistent/data"),
            None,
            "train.prepare_data",
        ),
        ("no data_dir", dict(data_dir=""), None, "--config.data_dir"),
        (
            "unknown model",
            dict(model="huge"),
            None,
            "unknown model size 'huge'",
        ),
        (
            "unknown weighting",
            dict(weighting="mean"),
            None,
            "unknown weighting",
        ),
        (
            "batch vs devices",
            dict(batch_size=6),
            {"JAX_NUM_CPU_DEVICES": "4"},
            "batch_size=6 is not divisible by the 4 devices",
        ),
        (
            "fsdp vs a parameter dimension",  # the tiny model's are 2**k
            dict(fsdp=3, batch_size=6, eval_batch_size=6),
            {"JAX_NUM_CPU_DEVICES": "3"},
            "fsdp=3 does not divide every parameter dimension",
        ),
    ],
)
def test_bad_input_one_clear_line(
    data_dir, tmp_path, case, overrides, env, message
):
  del case
  overrides = dict(overrides)
  config = make_config(overrides.pop("data_dir", data_dir), **overrides)
  result = run_cli(config, tmp_path, env=env, check=False)
  assert result.returncode == 2
  assert "Traceback" not in result.stderr
  error_lines = [
      l for l in result.stderr.splitlines() if l.startswith("error:")
  ]
  assert len(error_lines) == 1 and message in error_lines[0], result.stderr


@pytest.mark.parametrize(
    "flag, message",
    [
        ("--config=configs/arithmetic_mix.py:mse", "unknown method 'mse'"),
        ("--config.nosuch=3", "unknown config field 'nosuch';"),
        (
            "--config.trian_steps=3",
            """unknown config field 'trian_steps' (Did you mean "train""",
        ),
        # A traceback, as config_flags loads the file only when it is read.
        ("--config=configs/nope.py", "No such file or directory"),
    ],
)
def test_bad_flags_one_clear_line(tmp_path, flag, message):
  command = [
      sys.executable,
      "-m",
      "train.main",
      f"--workdir={tmp_path}",
      "--config=configs/arithmetic_mix.py:ntil",
      flag,
  ]
  result = launch.run(
      command, cwd=ROOT, capture_output=True, text=True, timeout=300
  )
  assert result.returncode == 2
  assert "Traceback" not in result.stderr
  assert result.stderr.strip().splitlines()[-1].startswith("error: ")
  assert message in result.stderr


def test_empty_data_dir(tmp_path):
  (tmp_path / "data").mkdir()
  config = make_config(str(tmp_path / "data"))
  with pytest.raises(train.ConfigError, match="prepare_data"):
    train.train_and_evaluate(config, str(tmp_path / "w"))


def test_unknown_method_variant():
  with pytest.raises(ValueError, match="unknown method 'mse'"):
    arithmetic_mix.get_config("mse")


def test_digit_chunks_train_and_score_every_answer_number(data_dir, tmp_path):
  # Numbers in tokens of 1-3 digits (as Llama 3 writes them): the model's
  # logits cover the chunks, every loss reads them as numbers, and the
  # answers it decodes are text again.
  config = make_config(
      data_dir,
      "ntil",
      digit_chunks=True,
      train_steps=8,
      learning_rate=3e-3,
      eval_every_steps=8,
  )
  result = train.train_and_evaluate(config, str(tmp_path))
  losses, numeric = logged(str(tmp_path)), logged(str(tmp_path), "numeric")
  assert sorted(losses) == list(range(1, 9))
  assert all(np.isfinite(v) for v in losses.values())
  assert np.mean([losses[7], losses[8]]) < np.mean([losses[1], losses[2]])
  assert all(v > 0 for v in numeric.values())
  assert result["eval"]["num_examples"] == 20
  with open(tmp_path / "predictions.jsonl") as f:
    predictions = [json.loads(line)["prediction"] for line in f]
  assert all(isinstance(p, str) for p in predictions)
