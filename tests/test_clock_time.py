"""clock_time: renderer, metrics, data pipeline, model prefix, CLI and resume."""

import json
import os
import pathlib
import re
import sys

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import clock_time as clock_config
from train import decoding
from train import models
from train import tokenizer
from train import train
from train.tasks import clock_time

from tests.test_train import logged  # {step: value} from metrics.jsonl

from tests import launch

ROOT = pathlib.Path(__file__).resolve().parents[1]


# ----------------------------------------------------------------------------
# A geometric reader: recovers the time from the pixels of a clean render.


def _ray_lengths(image, angles_deg):
  """For each angle, how far ink runs unbroken from the image centre."""
  ink = 1.0 - image.astype(float) / 255.0  # clean: dark ink on white
  size = image.shape[0]
  radii = np.arange(1.5, size / 2, 0.25)
  radians = np.deg2rad(angles_deg)[:, None]
  x = size / 2 + radii * np.sin(radians) - 0.5  # in pixel-centre units
  y = size / 2 - radii * np.cos(radians) - 0.5
  dark = np.zeros(x.shape, bool)
  for dx in (0, 1):  # the 2x2 pixels around each point: thin lines stay whole
    for dy in (0, 1):
      xs = np.clip(np.floor(x).astype(int) + dx, 0, size - 1)
      ys = np.clip(np.floor(y).astype(int) + dy, 0, size - 1)
      dark |= ink[ys, xs] > 0.3
  unbroken = np.cumprod(dark, axis=1)
  return unbroken.sum(axis=1) * 0.25


def read_clock(image):
  """(hour, minute) read from a clean render's hands; no learning involved.

  The minute hand is the longest unbroken ray from the centre; the hour hand
  is then looked for where it must point for that minute, at each hour,
  preferring rays away from the minute hand (they coincide only when the
  hands overlap).
  """
  angles = np.arange(0.0, 360.0, 0.5)
  lengths = _ray_lengths(image, angles)
  longest = np.flatnonzero(lengths >= lengths.max() - 0.25)
  # The centre of the longest plateau, on the circle.
  centre = (
      np.rad2deg(np.angle(np.exp(1j * np.deg2rad(angles[longest])).mean()))
      % 360
  )
  minute = int(round(centre / 6.0)) % 60
  candidates = np.array([30.0 * (h % 12) + minute / 2.0 for h in range(1, 13)])
  hour_lengths = _ray_lengths(image, candidates)
  # The clean hour hand is 0.5 R = 10.8 px: a run of 8+ px along a candidate
  # clear of the minute hand's width (12 degrees at 8 px) is it; if there is
  # none, the hands overlap and the one candidate near the minute hand wins.
  away = np.abs((candidates - 6.0 * minute + 180.0) % 360.0 - 180.0) > 12.0
  if (hour_lengths * away).max() >= 8.0:
    hour_lengths = hour_lengths * away
  return int(np.argmax(hour_lengths)) + 1, minute


def test_reader_recovers_the_label_from_clean_renders():
  rng = np.random.default_rng(0)
  hours = rng.integers(1, 13, 300)
  minutes = rng.integers(0, 60, 300)
  images = clock_time.render_clocks(hours, minutes, rng, clean=True)
  read = [read_clock(image) for image in images]
  wrong = [(h, m, r) for h, m, r in zip(hours, minutes, read) if (h, m) != r]
  assert not wrong, wrong[:5]


def test_reader_tells_hands_apart_at_hard_times():
  # Overlapping hands, hands in a line, and the 12 o'clock boundary.
  times = [
      (12, 0),
      (6, 0),
      (3, 15),
      (9, 45),
      (12, 59),
      (1, 0),
      (6, 32),
      (11, 59),
      (4, 20),
  ]
  hours, minutes = np.array(times).T
  images = clock_time.render_clocks(
      hours, minutes, np.random.default_rng(1), clean=True
  )
  assert [read_clock(image) for image in images] == times


def test_rendering_is_deterministic_per_seed():
  def clocks(split, size, seed):
    return list(clock_time.generate_clocks(split, size, seed))

  first = clocks("train", 40, seed=3)
  again = clocks("train", 40, seed=3)
  assert all(
      np.array_equal(a[0], b[0]) and a[1] == b[1] for a, b in zip(first, again)
  )
  other = clocks("train", 40, seed=4)
  assert [label for _, label in first] != [label for _, label in other]
  test = clocks("test", 40, seed=3)
  assert [label for _, label in test] != [label for _, label in first]
  image, label = first[0]
  assert image.shape == (48, 48) and image.dtype == np.uint8
  assert clock_time.parse_time(label) is not None


def test_labels_cover_the_dial_uniformly():
  labels = [label for _, label in clock_time.generate_clocks("train", 3000, 0)]
  times = [clock_time.parse_time(label) for label in labels]
  hours = np.bincount([h for h, _ in times], minlength=13)[1:]
  minutes = np.bincount([m for _, m in times], minlength=60)
  assert hours.min() > 3000 / 12 * 0.75 and minutes.min() > 3000 / 60 * 0.5
  assert "12_" in " ".join(labels) and any(m < 10 for _, m in times)
  assert all(len(label.split("_")[1]) == 2 for label in labels)


def test_render_rejects_impossible_times():
  rng = np.random.default_rng(0)
  with pytest.raises(ValueError, match="hours must be in 1..12"):
    clock_time.render_clocks([0], [5], rng)
  with pytest.raises(ValueError, match="minutes"):
    clock_time.render_clocks([3], [60], rng)


# ----------------------------------------------------------------------------
# Metrics.


@pytest.mark.parametrize(
    "predicted, target, gap",
    [
        ("4_35", "6_20", 105),
        ("12_59", "1_00", 1),
        ("6_00", "12_00", 360),
        ("1_00", "12_59", 1),
        ("3_15", "3_15", 0),
        ("11_50", "12_10", 20),
    ],
)
def test_time_gap(predicted, target, gap):
  assert (
      clock_time.time_gap_minutes(
          clock_time.parse_time(predicted), clock_time.parse_time(target)
      )
      == gap
  )


@pytest.mark.parametrize(
    "text, parsed",
    [
        ("2_05", (2, 5)),
        ("12_55", (12, 55)),
        (" 7_00 ", (7, 0)),
        ("13_00", None),
        ("0_10", None),
        ("2_5", None),
        ("2_60", None),
        ("", None),
        ("2:05", None),
        ("2_055", None),
        ("\uff12_\uff10\uff15", None),  # full-width digits: not ASCII
        ("\u0662_\u0660\u0665", None),  # Arabic-Indic digits
    ],
)
def test_parse_time(text, parsed):
  assert clock_time.parse_time(text) == parsed


def test_score_and_summarize_hand_made_cases():
  answers = ["4_35", "12_59", "6_00", "3_15", "3_15"]
  predictions = ["6_20", "1_00", "12_00", "garbage", "3_13"]
  # Gaps: 105, 1, 360, 360 (unparsed), 2.
  metrics = clock_time.summarize(
      clock_time.score_answers(predictions, answers, None)
  )
  assert metrics["exact_match"] == 0.0
  assert metrics["mean_time_gap_minutes"] == pytest.approx(828 / 5)
  assert metrics["median_time_gap_minutes"] == 105
  assert metrics["within_5_minutes"] == pytest.approx(2 / 5)
  assert metrics["hour_accuracy"] == pytest.approx(1 / 5)  # 3_13
  assert metrics["minute_accuracy"] == pytest.approx(1 / 5)  # 12_00
  assert metrics["parsed_rate"] == pytest.approx(4 / 5)
  even = clock_time.summarize(
      clock_time.score_answers(["4_35", "3_15"], ["6_20", "3_15"], None)
  )
  assert even["median_time_gap_minutes"] == 52.5  # (0 + 105) / 2
  assert even["exact_match"] == 0.5


# ----------------------------------------------------------------------------
# Data, model, trainer.


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  directory = tmp_path_factory.mktemp("clocks")
  clock_time.prepare(str(directory), train_size=96, test_size=24, seed=0)
  return str(directory)


def make_config(data_dir, method="ntil", **overrides):
  config = clock_config.get_config(method)
  config.data_dir = data_dir
  config.batch_size = 8
  config.train_steps = 6
  config.warmup_steps = 2
  config.log_every_steps = 1
  config.eval_every_steps = 0
  config.checkpoint_every_steps = 3
  config.eval_batch_size = 12
  config.eval_examples = 24
  for name, value in overrides.items():
    config[name] = value
  return config


def test_prepare_writes_the_dataset_and_a_sample_grid(data_dir):
  config = make_config(data_dir)
  batch = next(
      clock_time.train_iterator(config, process_index=0, process_count=1)
  )
  assert batch["images"].shape == (8, 48, 48)
  assert batch["images"].dtype == np.uint8
  # BOS SEP answer EOS: the loss covers the answer and EOS, digits scored.
  answers = [tokenizer.decode(row[1:]) for row in batch["targets"]]
  assert all(clock_time.parse_time(a) for a in answers)
  assert (batch["loss_mask"].sum(1) == [len(a) + 1 for a in answers]).all()
  assert (batch["digit_mask"].sum(1) == [len(a) - 1 for a in answers]).all()
  grid = pathlib.Path(data_dir) / "clock_time" / "train96_test24_seed0"
  assert (grid / "samples.png").stat().st_size > 5000


@pytest.mark.slow
def test_image_prefix_decoding_matches_the_full_forward():
  config = models.model_config(
      "tiny", vocab_size=tokenizer.VOCAB_SIZE, max_len=32, image_size=48
  )
  assert config.num_image_tokens == 9
  model = models.create_model(config, nnx.Rngs(0))
  images = jax.random.randint(jax.random.key(1), (3, 48, 48), 0, 256)
  prompts = jnp.array([[tokenizer.BOS_ID, tokenizer.SEP_ID]] * 3)
  out = decoding.greedy_decode(
      model,
      prompts,
      jnp.array([2, 2, 2]),
      5,
      eos_id=-1,
      pad_id=tokenizer.PAD_ID,
      images=images,
  )
  # Teacher-forced: each generated token is the argmax of the full forward.
  buffer = jnp.concatenate([prompts, out], axis=1)
  logits = model(buffer[:, :-1], images)
  np.testing.assert_array_equal(np.argmax(logits[:, 1:], -1), out)
  # The image matters: other images, other logits.
  other = model(buffer[:, :-1], images[::-1])
  assert not np.allclose(logits[0], other[0])
  with pytest.raises(ValueError, match="images are required"):
    model(buffer)


@pytest.mark.slow
def test_cli_trains_and_resumes_exactly(data_dir, tmp_path):
  straight = make_config(data_dir, train_steps=8, lr_decay_steps=8)
  train.train_and_evaluate(straight, str(tmp_path / "straight"))
  command = [
      sys.executable,
      "-m",
      "train.main",
      f"--config={ROOT}/configs/clock_time.py:ntil",
      f"--workdir={tmp_path / 'resumed'}",
      f"--config.data_dir={data_dir}",
      "--config.batch_size=8",
      "--config.warmup_steps=2",
      "--config.log_every_steps=1",
      "--config.checkpoint_every_steps=3",
      "--config.eval_batch_size=12",
      "--config.eval_examples=24",
      "--config.lr_decay_steps=8",
  ]
  first = launch.run(
      command + ["--config.train_steps=4", "--config.eval_every_steps=4"],
      cwd=ROOT,
      capture_output=True,
      text=True,
      timeout=600,
  )
  assert first.returncode == 0, first.stderr[-3000:]
  assert "mean time gap" in first.stdout
  resumed = train.train_and_evaluate(straight, str(tmp_path / "resumed"))
  assert resumed["step"] == 8
  assert logged(str(tmp_path / "resumed")) == logged(str(tmp_path / "straight"))
  evals = logged(str(tmp_path / "resumed"), "mean_time_gap_minutes")
  assert list(evals) == [4]
  assert 0 <= evals[4] <= 360


@pytest.mark.slow
def test_each_method_learns_and_reports_clock_metrics(data_dir, tmp_path):
  for method in clock_config.METHODS:
    config = make_config(
        data_dir,
        method,
        train_steps=10,
        learning_rate=3e-3,
        eval_every_steps=10,
    )
    result = train.train_and_evaluate(config, str(tmp_path / method))
    losses = logged(str(tmp_path / method))
    assert losses[10] < losses[1], method
    for key in (
        "exact_match",
        "within_5_minutes",
        "hour_accuracy",
        "minute_accuracy",
        "parsed_rate",
    ):
      assert 0.0 <= result["eval"][key] <= 1.0
    assert 0 <= result["eval"]["median_time_gap_minutes"] <= 360
    with open(tmp_path / method / "predictions.jsonl") as f:
      predictions = [json.loads(line) for line in f]
    assert [p["index"] for p in predictions] == list(range(24))


@pytest.mark.slow
def test_fused_loss_and_digit_weight_control(data_dir, tmp_path):
  plain = make_config(data_dir, train_steps=3)
  train.train_and_evaluate(plain, str(tmp_path / "plain"))
  train.train_and_evaluate(
      make_config(
          data_dir, train_steps=3, fused_loss=True, fused_chunk_size=20
      ),
      str(tmp_path / "fused"),
  )
  for step, loss in logged(str(tmp_path / "plain")).items():
    assert logged(str(tmp_path / "fused"))[step] == pytest.approx(
        loss, rel=1e-5
    )
  # CE with weight 1 + w on digit tokens: at step 1 (same init, same batch)
  # the loss is CE + w * (digit CE) / scored tokens, above plain CE.
  train.train_and_evaluate(
      make_config(data_dir, "ce", train_steps=1), str(tmp_path / "ce")
  )
  train.train_and_evaluate(
      make_config(data_dir, "ce", train_steps=1, digit_ce_weight=0.3),
      str(tmp_path / "weighted"),
  )
  ce = logged(str(tmp_path / "ce"))[1]
  weighted = logged(str(tmp_path / "weighted"))
  assert weighted[1] > ce
  assert logged(str(tmp_path / "weighted"), "ce")[1] == pytest.approx(ce)
  # Answers 'H_MM' have 4-5 tokens + EOS, 3-4 digits: the extra weight is
  # 0.3 times a share of about 2/3 of the CE sum.
  assert 1.1 < weighted[1] / ce < 1.3


@pytest.mark.slow
def test_four_devices_equal_one(data_dir, tmp_path):
  config = make_config(data_dir, train_steps=3)
  train.train_and_evaluate(config, str(tmp_path / "one"))
  command = [
      sys.executable,
      "-m",
      "train.main",
      f"--config={ROOT}/configs/clock_time.py:ntil",
      f"--workdir={tmp_path / 'four'}",
      f"--config.data_dir={data_dir}",
      "--config.batch_size=8",
      "--config.train_steps=3",
      "--config.warmup_steps=2",
      "--config.log_every_steps=1",
      "--config.eval_every_steps=3",
      "--config.eval_batch_size=12",
      "--config.eval_examples=24",
      "--config.fsdp=2",
  ]
  env = dict(os.environ, JAX_NUM_CPU_DEVICES="4", JAX_PLATFORMS="cpu")
  result = launch.run(
      command, cwd=ROOT, capture_output=True, text=True, timeout=600, env=env
  )
  assert result.returncode == 0, result.stderr[-3000:]
  one, four = logged(str(tmp_path / "one")), logged(str(tmp_path / "four"))
  assert sorted(four) == [1, 2, 3]
  assert "on 24 of 24 clocks" in result.stdout  # sharded decoding, images
  for step in one:
    assert four[step] == pytest.approx(one[step], rel=1e-4)


@pytest.mark.parametrize(
    "data, message",
    [
        ("missing", "data_dir .*missing does not exist"),
        ("", "--config.data_dir"),
        ("file", "is a file"),
    ],
)
def test_bad_data_dir_is_one_error_line(tmp_path, data, message):
  if data == "file":
    (tmp_path / "file").write_text("x")
  path = "" if not data else str(tmp_path / data)
  result = launch.run(
      [
          sys.executable,
          "-m",
          "train.main",
          f"--config={ROOT}/configs/clock_time.py:ntil",
          f"--workdir={tmp_path / 'w'}",
          f"--config.data_dir={path}",
      ],
      cwd=ROOT,
      capture_output=True,
      text=True,
      timeout=300,
  )
  assert result.returncode == 2
  errors = [
      line for line in result.stderr.splitlines() if line.startswith("error:")
  ]
  assert len(errors) == 1 and "Traceback" not in result.stderr
  assert "task=clock_time" in errors[0]
  assert re.search(message, errors[0]), errors[0]
