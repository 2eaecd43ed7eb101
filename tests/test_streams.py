"""Streamed training (``train_stream``): rendered as read, never twice, exact.

A streamed run (clocks, grounding scenes) resumes bit for bit, whether a
shorter schedule, a SIGTERM (in an evaluation, after a checkpoint) or a
SIGKILL stopped it; it never repeats an example (a forced repeat is drawn
again), splits each global batch across hosts as one host would render
it, and cannot be resumed with ``train_stream`` changed; the test split
alone is prepared with ``--train_size=0``; the clock renderer paints what
the full-image painter painted; and adding ``train_stream`` to the config
leaves every recorded experiment cell's hash as it was.
"""

import base64
import functools
import hashlib
import json
import logging
import os
import pathlib
import signal
import sys
import threading

import jax
from jax.experimental.compilation_cache import compilation_cache
import numpy as np
import orbax.checkpoint as ocp
import pytest
import tensorflow_datasets as tfds

from configs import clock_time as clock_config
from configs import common as common_config
from configs import grounding as grounding_config
from tests.test_train import logged
from tests.test_train import ROOT
from train import checkpoints
from train import checks
from train import evaluate
from train import input_pipeline
from train import rundir
from train import streams
from train import train
from train.tasks import clock_time
from train.tasks import grounding
from train.tasks import grounding_scenes as scenes
from train.tasks import grounding_single

from tests import launch


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  """Test splits alone (train_size=0): 16 clocks, 16 scenes of one object
  and 16 of two to four."""
  directory = tmp_path_factory.mktemp("streamed")
  clock_time.prepare(str(directory), train_size=0, test_size=16, seed=0)
  grounding_single.prepare(str(directory), train_size=0, test_size=16)
  grounding.prepare(str(directory), train_size=0, test_size=16)
  return str(directory)


def _streamed(config, data_dir, overrides, **settings):
  """``config`` streamed from ``data_dir`` in batches of 8, with
  ``settings`` and then ``overrides``."""
  config.data_dir = data_dir
  config.train_stream = True
  config.batch_size = 8
  for name, value in {**settings, **overrides}.items():
    config[name] = value
  return config


# Six steps, a checkpoint every 3, the 16 test examples in two batches.
_SHORT_RUN = dict(
    train_steps=6,
    lr_decay_steps=6,
    warmup_steps=2,
    log_every_steps=1,
    checkpoint_every_steps=3,
    eval_batch_size=8,
    eval_examples=16,
)


def clock_stream_config(data_dir, **overrides):
  """Streamed clocks, never evaluated but at the end."""
  config = clock_config.get_config("ntil")
  return _streamed(
      config, data_dir, overrides, eval_every_steps=0, **_SHORT_RUN
  )


def single_stream_config(data_dir, **overrides):
  config = grounding_config.get_config("ntil", task="grounding_single")
  return _streamed(config, data_dir, overrides)


def grounding_stream_config(data_dir, **overrides):
  """Streamed grounding scenes, evaluated every 2 steps."""
  config = grounding_config.get_config("ntil", task="grounding")
  return _streamed(
      config, data_dir, overrides, eval_every_steps=2, **_SHORT_RUN
  )


# ----------------------------------------------------------------------------
# (a) A streamed run stopped at step k and resumed is the uninterrupted run:
# stopped by a shorter schedule, by SIGTERM (in an evaluation; just after a
# checkpoint) or killed outright (SIGKILL: from the last periodic checkpoint).

STREAM_CONFIGS = dict(
    clock_time=clock_stream_config, grounding=grounding_stream_config
)


@pytest.fixture
def shared_compilation(tmp_path):
  """The three runs of a test share their compiled steps (as the grids do)."""
  before = jax.config.jax_compilation_cache_dir
  compilation_cache.reset_cache()  # an earlier test may have started it
  jax.config.update("jax_compilation_cache_dir", str(tmp_path / "jax_cache"))
  yield
  jax.config.update("jax_compilation_cache_dir", before)
  compilation_cache.reset_cache()


@pytest.fixture(scope="module")
def straight_run(data_dir, tmp_path_factory):
  """``straight_run(task)``: (workdir, result) of the task's streamed run,
  uninterrupted; made once for the module."""
  runs = {}

  def straight(task):
    if task not in runs:
      workdir = tmp_path_factory.mktemp(f"straight_{task}")
      config = STREAM_CONFIGS[task](data_dir)
      runs[task] = workdir, train.train_and_evaluate(config, str(workdir))
    return runs[task]

  return straight


def stream_state(workdir, step):
  """(next batch, digests seen) of the stream in checkpoint ``step``."""
  (saved,) = (workdir / "checkpoints" / str(step) / "train_iter").glob("*.json")
  state = json.loads(saved.read_text())
  seen = np.frombuffer(base64.b64decode(state["seen"]), "<u8").tolist()
  assert len(seen) == len(set(seen))
  return state["next_batch"], set(seen)


def final_state(workdir):
  """``{path: array}``: the parameters and optimizer state last saved."""
  step = rundir.saved_steps(str(workdir))[-1]
  with ocp.StandardCheckpointer() as checkpointer:
    state = checkpointer.restore(workdir / "checkpoints" / str(step) / "state")
  flat = jax.tree_util.tree_flatten_with_path(state)[0]
  return {jax.tree_util.keystr(path): np.asarray(x) for path, x in flat}


def what_a_run_left(workdir):
  """Its records but their speed, its predictions, its stream's state."""
  records = [
      {k: v for k, v in record.items() if k != "steps_per_second"}
      for record in rundir.read_metrics(workdir / "metrics.jsonl")
  ]
  predictions = workdir / "predictions.jsonl"
  last = rundir.saved_steps(str(workdir))[-1]
  return dict(
      records=records,
      predictions=predictions.read_text() if predictions.exists() else None,
      last_checkpoint=last,
      stream=stream_state(workdir, last),
  )


def evaluated_steps(workdir):
  """The steps of the evaluations in ``metrics.jsonl``, in its order."""
  records = rundir.read_metrics(workdir / "metrics.jsonl")
  return [r["step"] for r in records if "loss" not in r]


# The trainer's command line in a child, killed outright (SIGKILL: the
# out-of-memory killer, a lost machine) in the evaluation at step 4, before
# its second batch, once checkpoint 3 is committed: nothing more is saved.
_KILLED_IN_AN_EVALUATION = """
import os, runpy, signal, sys, time
from train import evaluate, rundir
workdir = sys.argv[1]
decode, calls = evaluate._decode, []

def decode_then_die(*args):
  calls.append(1)
  if len(calls) == 4:  # two batches at step 2, then the second at step 4
    while 3 not in rundir.saved_steps(workdir):
      time.sleep(0.05)
    os.kill(os.getpid(), signal.SIGKILL)
  return decode(*args)

evaluate._decode = decode_then_die
sys.argv = ["train.main", f"--workdir={workdir}", *sys.argv[2:]]
runpy.run_module("train.main", run_name="__main__")
"""


def _stop_early(how, make, workdir, monkeypatch):
  """Runs ``make()`` into ``workdir``, stopped ``how``; the step it resumes."""
  if how == "train_steps":  # a shorter schedule
    first = train.train_and_evaluate(make(train_steps=3), str(workdir))
    assert first["step"] == 3 and not first["stopped_early"]
    return 3
  if how == "sigkill_in_an_evaluation":
    config = make()
    defaults = grounding_config.get_config("ntil", task=config.task)
    flags = [f"--config.{k}={v}" for k, v in config.items() if v != defaults[k]]
    result = launch.run(
        [
            sys.executable,
            "-c",
            _KILLED_IN_AN_EVALUATION,
            workdir,
            f"--config={ROOT}/configs/grounding.py:ntil",
            *flags,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == -signal.SIGKILL, result.stderr[-3000:]
    assert rundir.saved_steps(str(workdir)) == [3]
    # Past the checkpoint: step 4's record, dropped when the run resumes.
    assert sorted(logged(str(workdir))) == [1, 2, 3, 4]
    assert evaluated_steps(workdir) == [2]
    return 3
  if threading.current_thread() is not threading.main_thread():
    pytest.skip("signal handlers need the main thread")
  with monkeypatch.context() as patch:
    if how == "sigterm_after_a_checkpoint":
      save = checkpoints.save_checkpoint

      def save_then_signal(manager, step, *args, **kwargs):
        save(manager, step, *args, **kwargs)
        if step == 3:
          os.kill(os.getpid(), signal.SIGTERM)

      patch.setattr(checkpoints, "save_checkpoint", save_then_signal)
      stopped_at = 3
    else:  # saved without its evaluation, made when the run resumes
      stopped_at = dict(
          sigterm_in_an_evaluation=4, sigterm_in_the_last_evaluation=6
      )[how]
      decode, calls = evaluate._decode, []  # pylint: disable=protected-access

      def decode_then_signal(*args):
        calls.append(1)
        if len(calls) == stopped_at - 1:  # two batches at each even step
          os.kill(os.getpid(), signal.SIGTERM)
        return decode(*args)

      patch.setattr(evaluate, "_decode", decode_then_signal)
    first = train.train_and_evaluate(make(), str(workdir))
  assert first["stopped_early"] and first["signal"] == signal.SIGTERM
  assert first["step"] == stopped_at
  assert rundir.saved_steps(str(workdir))[-1] == stopped_at
  assert max(logged(str(workdir))) == stopped_at
  assert evaluated_steps(workdir) == list(range(2, stopped_at, 2))
  return stopped_at


@pytest.mark.slow
@pytest.mark.parametrize(
    "task, how",
    [
        ("clock_time", "train_steps"),
        ("grounding", "sigterm_in_an_evaluation"),
        ("grounding", "sigterm_after_a_checkpoint"),
        ("grounding", "sigterm_in_the_last_evaluation"),
        ("grounding", "sigkill_in_an_evaluation"),
    ],
)
def test_stopped_and_resumed_stream_is_bitwise_the_straight_run(
    task,
    how,
    data_dir,
    straight_run,
    tmp_path,
    monkeypatch,
    caplog,
    shared_compilation,
):
  del shared_compilation
  make = functools.partial(STREAM_CONFIGS[task], data_dir)
  straight, straight_result = straight_run(task)
  resumed = tmp_path / "resumed"
  step = _stop_early(how, make, resumed, monkeypatch)
  # The stream's position and digests are saved beside the train state.
  next_batch, seen = stream_state(resumed, step)
  assert next_batch == step and len(seen) == step * 8
  assert seen <= stream_state(straight, 6)[1]
  caplog.set_level(logging.INFO, logger="absl")
  caplog.clear()
  again = train.train_and_evaluate(make(), str(resumed))
  assert again["step"] == 6 and not again["stopped_early"]
  # From that checkpoint, not from step 0 (where one found damaged sends
  # the run, which would end as the straight run too).
  assert f"resumed from step {step}\n" in caplog.text
  assert not list((resumed / "checkpoints").glob("corrupt-*"))
  assert logged(str(resumed)) == logged(str(straight))  # bitwise: floats
  assert sorted(logged(str(resumed))) == [1, 2, 3, 4, 5, 6]
  # Every record (evaluations included, once each), every prediction, and
  # the stream's 48 examples: none repeated, none skipped.
  left = what_a_run_left(resumed)
  assert left == what_a_run_left(straight)
  assert left["stream"][0] == 6 and len(left["stream"][1]) == 6 * 8
  assert {k: again[k] for k in ("train", "eval")} == {
      k: straight_result[k] for k in ("train", "eval")
  }
  # The parameters and the optimizer's state, to the bit.
  want, got = final_state(straight), final_state(resumed)
  assert want and want.keys() == got.keys()
  for path, array in want.items():
    assert got[path].dtype == array.dtype, path
    assert got[path].tobytes() == array.tobytes(), path


# ----------------------------------------------------------------------------
# (b) Never twice: digests unique over the budget; a repeat is drawn again.


@pytest.mark.parametrize("task", [clock_time, grounding_single])
def test_a_runs_budget_has_no_repeat_and_no_test_example(data_dir, task):
  make = clock_stream_config if task is clock_time else single_stream_config
  stream = task.train_iterator(
      make(data_dir, batch_size=64), process_index=0, process_count=1
  )
  test = tfds.builder_from_directory(
      input_pipeline.find_dataset_dir(data_dir, dataset_name=task.NAME)
  ).as_data_source(split="test")
  test_digests = streams.record_digests(test.__getitems__(list(range(16))))
  assert stream.excluded == test_digests and len(test_digests) == 16
  digests = []
  for _ in range(20):  # 1,280 examples
    digests += [streams.example_digest(r) for r in stream.next_records()]
  assert len(set(digests)) == len(digests) == 20 * 64
  assert not set(digests) & test_digests
  assert stream.seen == set(digests)


def test_a_test_record_digests_like_the_same_example_rendered(data_dir):
  test = tfds.builder_from_directory(
      input_pipeline.find_dataset_dir(data_dir, dataset_name="clock_time")
  ).as_data_source(split="test")
  (image, answer), *_ = clock_time.generate_clocks("test", 16, 0)
  rendered = streams.example_digest(dict(image=image, answer=answer))
  assert rendered == streams.example_digest(test[0])  # bytes text, same


def test_a_repeat_is_drawn_again_from_the_next_attempts_key():
  # Five distinct examples in all: each batch draws until it has new ones.
  def render(rngs):
    values = [int(rng.integers(5)) for rng in rngs]
    return [
        dict(image=np.full((2, 2), v, np.uint8), answer=str(v)) for v in values
    ]

  def encode(records):
    return dict(values=np.array([int(r["answer"]) for r in records]))

  stream = streams.StreamIterator(
      render,
      encode,
      seed=3,
      global_batch_size=5,
      process_index=0,
      process_count=1,
  )
  assert sorted(next(stream)["values"]) == [0, 1, 2, 3, 4]
  assert stream.redrawn > 0
  with pytest.raises(RuntimeError, match="too few distinct examples"):
    next(stream)


def test_a_clock_seen_or_in_the_test_split_is_replaced_deterministically():
  first = clock_time.render_stream([streams.example_rng(0, 0)])[0]
  retry = clock_time.render_stream([streams.example_rng(0, 0, 1)])[0]
  stream = streams.StreamIterator(
      clock_time.render_stream,
      lambda records: records,
      seed=0,
      global_batch_size=4,
      process_index=0,
      process_count=1,
      excluded=frozenset({streams.example_digest(first)}),
  )
  records = next(stream)
  assert np.array_equal(records[0]["image"], retry["image"])
  assert records[0]["answer"] == retry["answer"]
  assert stream.redrawn == 1
  # Rows 1-3 are the stream's own clocks, rendered one at a time or not.
  for position in (1, 2, 3):
    alone = clock_time.render_stream([streams.example_rng(0, position)])[0]
    assert np.array_equal(records[position]["image"], alone["image"])
  # The state restores the position and the digests: the same next batch.
  copy = streams.StreamIterator(
      clock_time.render_stream,
      lambda records: records,
      seed=0,
      global_batch_size=4,
      process_index=0,
      process_count=1,
  )
  copy.set_state(stream.get_state())
  assert copy.seen == stream.seen and copy.get_state() == stream.get_state()
  for a, b in zip(next(copy), next(stream)):
    assert np.array_equal(a["image"], b["image"]) and a["answer"] == b["answer"]


def test_reading_ahead_gives_the_batches_and_states_of_reading_on_demand():
  def make(prefetch):
    return streams.StreamIterator(
        clock_time.render_stream,
        lambda records: records,
        seed=1,
        global_batch_size=6,
        process_index=0,
        process_count=1,
        prefetch=prefetch,
    )

  def same(a, b):
    return all(
        np.array_equal(x["image"], y["image"]) and x["answer"] == y["answer"]
        for x, y in zip(a, b, strict=True)
    )

  ahead, on_demand = make(3), make(0)
  for _ in range(3):
    assert same(next(ahead), next(on_demand))
    assert ahead.get_state() == on_demand.get_state()
  state = on_demand.get_state()
  later = [next(on_demand) for _ in range(2)]
  next(ahead)  # its thread reads past ``state``; restoring drops that
  ahead.set_state(state)
  assert ahead.get_state() == state
  assert all(same(next(ahead), batch) for batch in later)
  ahead.close()
  assert ahead._reader is None  # pylint: disable=protected-access


@pytest.mark.parametrize("prefetch", [0, 2])
def test_a_batch_that_fails_leaves_the_state_as_it_was(prefetch):
  """An encoding that fails once: the state is that before the failed batch
  (it kept the failed batch's digests without read-ahead, and its retry then
  redrew every example of it), and the retry is the batch itself."""

  def render(rngs):
    values = [int(rng.integers(10**6)) for rng in rngs]
    return [dict(image=np.zeros(1, np.uint8), answer=str(v)) for v in values]

  calls = []

  def encode(records):
    calls.append(1)
    if len(calls) == 2:
      raise ValueError("a bad record")
    return [r["answer"] for r in records]

  def make(**kwargs):
    return streams.StreamIterator(
        render,
        encode,
        seed=1,
        global_batch_size=2,
        process_index=0,
        process_count=1,
        **kwargs,
    )

  stream = make(prefetch=prefetch)
  next(stream)
  state = stream.get_state()
  with pytest.raises(ValueError, match="a bad record"):
    next(stream)
  assert stream.get_state() == state
  straight = make(prefetch=0)
  calls.append(1)  # no failure for this one
  expected = [next(straight), next(straight)][1]
  assert next(stream) == expected
  assert stream.redrawn == 0


# ----------------------------------------------------------------------------
# (c) Hosts: two hosts' rows are the one host's batch.


@pytest.mark.parametrize("task", [clock_time, grounding_single])
def test_two_hosts_rows_make_the_one_host_batch(data_dir, task):
  make = clock_stream_config if task is clock_time else single_stream_config
  config = make(data_dir)
  one = task.train_iterator(config, process_index=0, process_count=1)
  hosts = [
      task.train_iterator(config, process_index=i, process_count=2)
      for i in (0, 1)
  ]
  for _ in range(3):
    whole = next(one)
    halves = [next(host) for host in hosts]
    assert set(whole) == {
        "inputs",
        "targets",
        "loss_mask",
        "digit_mask",
        "images",
    }
    for key, value in whole.items():
      np.testing.assert_array_equal(
          value, np.concatenate([half[key] for half in halves])
      )
  assert len(one.seen) == 3 * 8
  assert one.seen == hosts[0].seen | hosts[1].seen


# ----------------------------------------------------------------------------
# (d) train_stream cannot change on resume; old records count as False.


def test_changing_train_stream_on_resume_is_refused(data_dir, tmp_path):
  workdir = tmp_path / "run"
  (workdir / "checkpoints" / "3").mkdir(parents=True)
  fixed = clock_stream_config(data_dir, train_stream=False)
  rundir.write_config_record(str(workdir), fixed)
  with pytest.raises(train.ConfigError, match="another config") as raised:
    checks.check_resumable(clock_stream_config(data_dir), str(workdir))
  assert "train_stream: False -> True" in str(raised.value)
  assert "read other examples" in str(raised.value)
  # A run recorded before the field existed had the prepared split.
  record = json.loads((workdir / "config.json").read_text())
  del record["config"]["train_stream"]
  (workdir / "config.json").write_text(json.dumps(record))
  assert checks.check_resumable(fixed, str(workdir)) == []
  with pytest.raises(train.ConfigError, match="train_stream: False -> True"):
    checks.check_resumable(clock_stream_config(data_dir), str(workdir))


def test_a_task_without_a_stream_refuses_train_stream(tmp_path):
  from configs import arithmetic_mix  # pylint: disable=g-import-not-at-top

  config = arithmetic_mix.get_config("ce")
  config.data_dir = str(tmp_path)
  config.train_stream = True
  with pytest.raises(train.ConfigError, match="cannot render its examples"):
    checks.check_config(config)


def test_fixed_training_on_a_test_only_dataset_says_what_to_do(
    data_dir, tmp_path
):
  config = clock_stream_config(data_dir, train_stream=False)
  with pytest.raises(train.ConfigError, match="has no train split"):
    train.train_and_evaluate(config, str(tmp_path / "w"))


# ----------------------------------------------------------------------------
# (e) --train_size=0 writes the test split alone, the same test split.


def test_prepare_data_train_size_0_writes_the_test_split_alone(tmp_path):
  result = launch.run(
      [
          sys.executable,
          "-m",
          "train.prepare_data",
          "--task=clock_time",
          f"--data_dir={tmp_path}",
          "--train_size=0",
          "--test_size=12",
      ],
      cwd=ROOT,
      capture_output=True,
      text=True,
      timeout=300,
  )
  assert result.returncode == 0, result.stderr[-3000:]
  path = result.stdout.strip().splitlines()[-1]
  assert path.endswith("clock_time/train0_test12_seed0/1.0.0")
  builder = tfds.builder_from_directory(path)
  assert list(builder.info.splits) == ["test"]
  assert not list(pathlib.Path(path).glob("*train*"))
  alone = builder.as_data_source(split="test")
  with_train = tfds.builder_from_directory(
      clock_time.prepare(str(tmp_path), train_size=5, test_size=12)
  ).as_data_source(split="test")
  for a, b in zip(
      alone.__getitems__(range(12)), with_train.__getitems__(range(12))
  ):
    assert np.array_equal(a["image"], b["image"]) and a["answer"] == b["answer"]
  with pytest.raises(ValueError, match="train_size must be >= 0"):
    clock_time.prepare(str(tmp_path), train_size=-1, test_size=12)


# ----------------------------------------------------------------------------
# The renderer: the windowed painter paints what the full-image one did.


def _full_image_render(hours, minutes, rng, *, size=48, clean=False):
  """The renderer before windows (commit bff528f), for comparison."""
  count = len(hours)

  def uniform(low, high):
    return rng.uniform(low, high, count)[:, None, None]

  radius = uniform(0.36, 0.47) * size
  slack = np.maximum(size / 2 - radius - 1.0, 0.0)
  centre_x = size / 2 + uniform(-1.0, 1.0) * slack
  centre_y = size / 2 + uniform(-1.0, 1.0) * slack
  ring_width = uniform(0.8, 2.0)
  hour_width, minute_width = uniform(2.0, 3.2), uniform(1.0, 1.8)
  hour_length = uniform(0.45, 0.6) * radius
  minute_length = uniform(0.78, 0.95) * radius
  tick_length = uniform(0.12, 0.2) * radius
  background, foreground = uniform(0.0, 0.35), uniform(0.65, 1.0)
  inverted = rng.random(count)[:, None, None] < 0.5
  noise_scale = uniform(0.0, 0.08)
  noise = rng.normal(0.0, 1.0, (count, size, size))
  if clean:
    radius = np.full_like(radius, 0.45 * size)
    hour_length, minute_length = 0.5 * radius, 0.9 * radius
    hour_width = np.full_like(radius, 2.6)
    minute_width = np.full_like(radius, 1.4)
    ring_width, tick_length = np.ones_like(radius), 0.15 * radius
    centre_x = centre_y = np.full_like(radius, size / 2)
    background, foreground = np.zeros_like(radius), np.ones_like(radius)
    inverted = np.ones_like(inverted)
    noise_scale = np.zeros_like(radius)
  distance_to = clock_time._segment_distance  # pylint: disable=protected-access
  stroke = clock_time._stroke  # pylint: disable=protected-access
  yy, xx = np.mgrid[0:size, 0:size].astype(np.float32) + 0.5
  ink = stroke(
      np.abs(np.hypot(xx - centre_x, yy - centre_y) - radius), ring_width
  )
  for tick in range(12):
    major = tick % 3 == 0
    sin, cos = np.sin(np.deg2rad(30 * tick)), np.cos(np.deg2rad(30 * tick))
    inner = radius - tick_length * (1.6 if major else 1.0)
    distance = distance_to(
        xx,
        yy,
        centre_x + inner * sin,
        centre_y - inner * cos,
        centre_x + radius * sin,
        centre_y - radius * cos,
    )
    ink = np.maximum(ink, stroke(distance, ring_width * (1.4 if major else 1)))
  hour_angle, minute_angle = clock_time.hand_angles(hours, minutes)
  for angle, length, width in (
      (hour_angle, hour_length, hour_width),
      (minute_angle, minute_length, minute_width),
  ):
    radians = np.deg2rad(angle)[:, None, None]
    distance = distance_to(
        xx,
        yy,
        centre_x,
        centre_y,
        centre_x + length * np.sin(radians),
        centre_y - length * np.cos(radians),
    )
    ink = np.maximum(ink, stroke(distance, width))
  background = np.where(inverted, 1.0 - background, background)
  foreground = np.where(inverted, 1.0 - foreground, foreground)
  image = background + (foreground - background) * ink + noise * noise_scale
  return np.clip(np.round(image * 255.0), 0, 255).astype(np.uint8)


@pytest.mark.parametrize(
    "count, size, clean", [(300, 48, False), (40, 48, True), (60, 31, False)]
)
def test_windowed_clocks_are_the_full_image_clocks_to_the_bit(
    count, size, clean
):
  hours = np.random.default_rng(count).integers(1, 13, count)
  minutes = np.random.default_rng(count + 1).integers(0, 60, count)
  want = _full_image_render(
      hours, minutes, np.random.default_rng(7), size=size, clean=clean
  )
  got = clock_time.render_clocks(
      hours, minutes, np.random.default_rng(7), size=size, clean=clean
  )
  assert got.dtype == np.uint8 and np.array_equal(got, want)


def test_prepared_clocks_are_byte_for_byte_those_of_the_old_renderer():
  digest = hashlib.sha256()
  for split, size in (("test", 1000), ("train", 2000)):
    for image, label in clock_time.generate_clocks(split, size, 0):
      digest.update(image.tobytes())
      digest.update(label.encode())
  # Measured with the full-image renderer (commit bff528f).
  assert digest.hexdigest() == (
      "b261fa549cc3d25c9aa48c4c7760d50249df61f945c177155cde71fb4156cfa9"
  )


def test_prepared_scenes_are_byte_for_byte_those_before_the_shape_cache():
  digest = hashlib.sha256()
  for variant in scenes.VARIANTS.values():
    for split in ("test", "train"):
      for scene in scenes.generate_scenes(variant, split, 500, 0):
        digest.update(scene.image.tobytes())
        digest.update(scene.question.encode())
        digest.update(scene.answer.encode())
        digest.update(repr(scene.objects).encode())
  # Measured before shapes were cached (commit bff528f).
  assert digest.hexdigest() == (
      "b91fec93c1a9e0dba2a6e7b0b660cd6ccf984a62c5e12fce744b6e4d885e72f8"
  )


# ----------------------------------------------------------------------------
# (f) Every recorded cell keeps its config hash.

# A cell's hash reads every data_dir as `data` (common.HASHED_DATA_DIR):
# the grids were run with --data_dir=data and some (the clock grid's
# converged groups, the grounding grid) with /work/main/data, and a grid must
# find its recorded cells wherever its data is. Each cell is hashed with
# these spellings of the data's folder; all must agree.
DATA_DIRS = ("data", "./data", "/work/main/data", "/elsewhere/data")
_GRID_HASHES = """
import json, sys
which, data_dirs = sys.argv[1], sys.argv[2:]
per_cell = []
if which == "clock_time":
  from experiments.clock_time import grid
  for cells in grid.grid("cpu").values():
    for _, method, seed, overrides in cells:
      per_cell.append(
          {grid.cell_hash("cpu", method, seed, overrides, d) for d in data_dirs}
      )
elif which == "grounding":
  from experiments.grounding import grid
  for cells in grid.grid("cpu").values():
    for task, _, method, seed, overrides in cells:
      per_cell.append({
          grid.cell_hash("cpu", task, method, seed, overrides, d)
          for d in data_dirs
      })
else:
  from experiments.arithmetic_mix import run
  for profile in ("cpu", "digits", "digits_long"):
    for cells in run.grid(profile).values():
      for _, _, method, seed, overrides in cells:
        per_cell.append({
            run.config_hash(
                run.cell_config(profile, method, seed, overrides, d), profile
            )
            for d in data_dirs
        })
print(json.dumps([sorted(hashes) for hashes in per_cell]))
"""


def test_config_hash_leaves_out_added_fields_at_their_default():
  from experiments import common  # pylint: disable=g-import-not-at-top

  config = clock_config.get_config("ce")
  with_default = common.config_hash(config, "cpu", {})
  del config["train_stream"]
  assert common.config_hash(config, "cpu", {}) == with_default
  config.train_stream = True
  assert common.config_hash(config, "cpu", {}) != with_default


def _grid_hashes(which):
  result = launch.run(
      [sys.executable, "-c", _GRID_HASHES, which, *DATA_DIRS],
      cwd=ROOT,
      capture_output=True,
      text=True,
      timeout=300,
  )
  assert result.returncode == 0, result.stderr[-3000:]
  per_cell = json.loads(result.stdout.splitlines()[-1])
  # Where the data lies does not change a cell's hash.
  assert all(len(hashes) == 1 for hashes in per_cell), [
      h for h in per_cell if len(h) > 1
  ][:3]
  return {hashes[0] for hashes in per_cell}


@pytest.mark.parametrize(
    "which, results",
    [
        ("clock_time", ["experiments/clock_time/results.json"]),
        ("grounding", ["experiments/grounding/results.json"]),
        (
            "arithmetic_mix",
            [
                "experiments/arithmetic_mix/results.json",
                "experiments/arithmetic_mix/digits/results.json",
                "experiments/arithmetic_mix/digits/results_cpu.json",
                "experiments/arithmetic_mix/digits/results_long.json",
            ],
        ),
    ],
)
def test_recorded_cells_keep_their_config_hash(which, results):
  assert common_config.ADDED_FIELDS == {
      "train_stream": False,
      "param_dtype": "float32",
      "digit_chunks": False,
      "number_tokens": False,
      "tokenize_joined": False,
      "prompt_bos": "llama",
  }
  hashes = _grid_hashes(which)
  for path in results:
    runs = json.loads((ROOT / path).read_text())["runs"]
    assert runs
    missing = [r["name"] for r in runs if r["config_hash"] not in hashes]
    assert not missing, (path, missing[:5])
