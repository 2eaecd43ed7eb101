r"""clock_time: read the time off a rendered analog clock (NTIL paper, Table 4).

An image of an analog clock in, the time out as text ``H_MM`` (hour 1..12,
two-digit minutes: ``2_05``, ``12_55``), as in the paper's TIME data. The
clocks are drawn here with NumPy (`render_clocks`), nothing is downloaded:

* times are uniform over 12 h x 60 min; the hour hand points at
  ``30 * (hour % 12 + minute / 60)`` degrees, the minute hand at
  ``6 * minute``, clockwise from 12 o'clock;
* what does not change the time varies: face position and size, ring and
  hand widths, hand lengths, tick length, light-on-dark or dark-on-light,
  contrast and Gaussian pixel noise. The face is never rotated, and the
  hour hand is always shorter and thicker than the minute hand.

``python -m train.prepare_data --task=clock_time --data_dir=D --train_size=N
--test_size=M --seed=S`` writes a TFDS ``array_record`` dataset at
``D/clock_time/train{N}_test{M}_seed{S}/1.0.0`` (``image``: uint8 [48, 48],
``answer``: text), deterministic for a seed (each split its own NumPy
stream, so the test split does not depend on ``train_size``), and a PNG grid
of sample test clocks with their labels at ``D/clock_time/<config>/samples.png``.

The model sees the image as a prefix of ``K`` tokens (`encoders.ImageEncoder`)
and then ``BOS SEP answer EOS``: the prompt is ``BOS SEP`` (an empty
question) and the loss is on the answer and EOS. Metrics: `score_answers`.
"""

from collections.abc import Iterator
import functools
import re
import time

from absl import logging
import numpy as np
import tensorflow_datasets as tfds

from train import input_pipeline
from train import generated_data
from train import models
from train import streams
from train import tasks
from train import tokenizer

DATASET_NAME = "clock_time"
VERSION = "1.0.0"
IMAGE_SIZE = 48
MAX_ANSWER_LEN = 5  # '12_55'
MAX_QUESTION_LEN = 1  # the question is empty; 1 keeps the shapes positive
MINUTES_PER_DIAL = 720
UNPARSED_GAP = 360  # the largest possible gap, for an unreadable answer
_SPLIT_STREAMS = {"train": 0, "test": 1}
_RENDER_CHUNK = 1000
# ASCII digits only: without re.ASCII, \d reads "２_０５" as 2_05.
_TIME_PATTERN = re.compile(r"^(\d{1,2})_(\d{2})$", re.ASCII)


# ----------------------------------------------------------------------------
# Times.


def format_time(hour: int, minute: int) -> str:
  """The label of a time, e.g. ``format_time(2, 5) == '2_05'``."""
  if not 1 <= hour <= 12 or not 0 <= minute <= 59:
    raise ValueError(
        f"need hour in 1..12 and minute in 0..59, got " f"{hour}, {minute}."
    )
  return f"{hour}_{minute:02d}"


def parse_time(text: str) -> tuple[int, int] | None:
  """(hour, minute) of a label such as ``'12_55'``; None if it is not one."""
  match = _TIME_PATTERN.match(text.strip())
  if not match:
    return None
  hour, minute = int(match.group(1)), int(match.group(2))
  if not 1 <= hour <= 12 or not 0 <= minute <= 59:
    return None
  return hour, minute


def time_gap_minutes(
    predicted: tuple[int, int], target: tuple[int, int]
) -> int:
  """Minutes between two dial times, the short way round (0..360).

  ``4_35`` vs ``6_20`` is 105; ``12_59`` vs ``1_00`` is 1; ``6_00`` vs
  ``12_00`` is 360.
  """
  a = (predicted[0] % 12) * 60 + predicted[1]
  b = (target[0] % 12) * 60 + target[1]
  gap = abs(a - b)
  return min(gap, MINUTES_PER_DIAL - gap)


# ----------------------------------------------------------------------------
# Rendering.


def _segment_distance(xx, yy, x0, y0, x1, y1):
  """Distance of each pixel centre to the segment (x0, y0)-(x1, y1)."""
  dx, dy = x1 - x0, y1 - y0
  t = ((xx - x0) * dx + (yy - y0) * dy) / np.maximum(dx * dx + dy * dy, 1e-9)
  t = np.clip(t, 0.0, 1.0)
  return np.hypot(xx - (x0 + t * dx), yy - (y0 + t * dy))


def _stroke(distance, width):
  """Anti-aliased coverage of a line of ``width`` at ``distance``."""
  return np.clip(width / 2 + 0.5 - distance, 0.0, 1.0)


def hand_angles(hours, minutes) -> tuple[np.ndarray, np.ndarray]:
  """Hour and minute hand angles in degrees, clockwise from 12 o'clock."""
  hours, minutes = np.asarray(hours), np.asarray(minutes)
  return 30.0 * (hours % 12 + minutes / 60.0), 6.0 * minutes


def _check_times(hours, minutes) -> None:
  if hours.shape != minutes.shape or hours.ndim != 1:
    raise ValueError(
        f"hours and minutes must be [B], got {hours.shape} and "
        f"{minutes.shape}."
    )
  if hours.size and (
      hours.min() < 1
      or hours.max() > 12
      or minutes.min() < 0
      or minutes.max() > 59
  ):
    raise ValueError("hours must be in 1..12 and minutes in 0..59.")


def draw_looks(
    count: int,
    rng: np.random.Generator,
    *,
    size: int = IMAGE_SIZE,
    clean: bool = False,
) -> dict[str, np.ndarray]:
  """Everything of ``count`` clocks but the time, drawn from ``rng``.

  The draws, in order: radius, centre, ring, hand and tick sizes, polarity,
  contrast and noise, each ``[count, 1, 1]`` (the noise ``[count, size,
  size]``). `render_clocks` paints them; looks drawn one clock at a time
  and concatenated paint the same pixels as looks drawn together from the
  same draws.
  """

  def uniform(low, high):
    return rng.uniform(low, high, count)[:, None, None]

  radius = uniform(0.36, 0.47) * size
  slack = np.maximum(size / 2 - radius - 1.0, 0.0)
  looks = dict(
      radius=radius,
      centre_x=size / 2 + uniform(-1.0, 1.0) * slack,
      centre_y=size / 2 + uniform(-1.0, 1.0) * slack,
      ring_width=uniform(0.8, 2.0),
      hour_width=uniform(2.0, 3.2),
      minute_width=uniform(1.0, 1.8),
      hour_length=uniform(0.45, 0.6) * radius,
      minute_length=uniform(0.78, 0.95) * radius,
      tick_length=uniform(0.12, 0.2) * radius,
      background=uniform(0.0, 0.35),
      foreground=uniform(0.65, 1.0),
      inverted=rng.random(count)[:, None, None] < 0.5,
      noise_scale=uniform(0.0, 0.08),
      noise=rng.normal(0.0, 1.0, (count, size, size)),
  )
  if clean:  # canonical geometry too: the hands never touch the ticks
    radius = np.full_like(radius, 0.45 * size)
    ones = np.ones_like(radius)
    looks.update(
        radius=radius,
        hour_length=0.5 * radius,
        minute_length=0.9 * radius,
        hour_width=np.full_like(radius, 2.6),
        minute_width=np.full_like(radius, 1.4),
        ring_width=ones,
        tick_length=0.15 * radius,
        centre_x=np.full_like(radius, size / 2),
        centre_y=np.full_like(radius, size / 2),
        background=np.zeros_like(radius),
        foreground=ones,
        inverted=np.ones_like(looks["inverted"]),
        noise_scale=np.zeros_like(radius),
    )
  return looks


def _paint_segments(ink, x0, y0, x1, y1, width):
  """``ink = max(ink, stroke of each clock's segment)``, near the segments.

  A stroke is 0 farther than ``width / 2 + 0.5`` from its segment, so only
  a window around each clock's segment (one side for the batch, enough for
  the longest) is computed: the pixels, and their coordinates, are those of
  the whole image, so the result is the whole image's to the bit.

  Args:
    ink: float [B, S, S], updated in place.
    x0: float [B, 1, 1], and so are ``y0``, ``x1``, ``y1`` and ``width``.
    y0: the segments' first ends' rows.
    x1: the segments' other ends' columns.
    y1: the segments' other ends' rows.
    width: the strokes' widths.
  """
  count, size = ink.shape[0], ink.shape[-1]
  reach = (np.broadcast_to(width, x0.shape) / 2 + 0.5).reshape(count)
  starts, extents = [], []
  for a, b in ((x0, x1), (y0, y1)):
    a, b = a.reshape(count), b.reshape(count)
    # Pixel i's centre is i + 0.5; a margin of one pixel each side.
    first = np.floor(np.minimum(a, b) - reach - 0.5).astype(np.int64) - 1
    last = np.ceil(np.maximum(a, b) + reach - 0.5).astype(np.int64) + 1
    starts.append(first)
    extents.append(last - first + 1)
  side = int(min(size, max(extents[0].max(), extents[1].max())))
  offsets = np.arange(side)
  columns = np.clip(starts[0], 0, size - side)[:, None, None] + offsets
  rows = np.clip(starts[1], 0, size - side)[:, None, None] + offsets[:, None]
  xx = columns.astype(np.float32) + 0.5  # as the whole image's centres
  yy = rows.astype(np.float32) + 0.5
  stroke = _stroke(_segment_distance(xx, yy, x0, y0, x1, y1), width)
  index = (np.arange(count)[:, None, None], rows, columns)
  ink[index] = np.maximum(ink[index], stroke)


def paint_clocks(hours, minutes, looks: dict[str, np.ndarray]) -> np.ndarray:
  """The clocks showing ``hours:minutes`` with `draw_looks`' ``looks``.

  Returns:
    uint8 [B, size, size] grayscale images.
  """
  hours, minutes = np.asarray(hours), np.asarray(minutes)
  _check_times(hours, minutes)
  size = looks["noise"].shape[-1]
  centre_x, centre_y = looks["centre_x"], looks["centre_y"]
  radius, tick_length = looks["radius"], looks["tick_length"]
  ring_width = looks["ring_width"]
  yy, xx = np.mgrid[0:size, 0:size].astype(np.float32) + 0.5
  ink = _stroke(
      np.abs(np.hypot(xx - centre_x, yy - centre_y) - radius), ring_width
  )
  for tick in range(12):  # longer, thicker ticks at 12, 3, 6 and 9
    major = tick % 3 == 0
    sin, cos = np.sin(np.deg2rad(30 * tick)), np.cos(np.deg2rad(30 * tick))
    inner = radius - tick_length * (1.6 if major else 1.0)
    _paint_segments(
        ink,
        centre_x + inner * sin,
        centre_y - inner * cos,
        centre_x + radius * sin,
        centre_y - radius * cos,
        ring_width * (1.4 if major else 1),
    )
  hour_angle, minute_angle = hand_angles(hours, minutes)
  for angle, length, width in (
      (hour_angle, looks["hour_length"], looks["hour_width"]),
      (minute_angle, looks["minute_length"], looks["minute_width"]),
  ):
    radians = np.deg2rad(angle)[:, None, None]
    _paint_segments(
        ink,
        centre_x,
        centre_y,
        centre_x + length * np.sin(radians),
        centre_y - length * np.cos(radians),
        width,
    )
  inverted = looks["inverted"]
  background = np.where(
      inverted, 1.0 - looks["background"], looks["background"]
  )
  foreground = np.where(
      inverted, 1.0 - looks["foreground"], looks["foreground"]
  )
  image = (
      background
      + (foreground - background) * ink
      + looks["noise"] * looks["noise_scale"]
  )
  return np.clip(np.round(image * 255.0), 0, 255).astype(np.uint8)


def render_clocks(
    hours,
    minutes,
    rng: np.random.Generator,
    *,
    size: int = IMAGE_SIZE,
    clean: bool = False,
) -> np.ndarray:
  """Draws analog clocks showing ``hours:minutes``.

  Args:
    hours: int [B], 1..12.
    minutes: int [B], 0..59.
    rng: draws everything that does not change the time (position, size,
      widths, lengths, polarity, contrast, noise; `draw_looks`), in a fixed
      order, so the same generator state gives the same images.
    size: the image side in pixels.
    clean: no noise, dark ink on white, centred, one fixed geometry (for
      tests that read the hands back).

  Returns:
    uint8 [B, size, size] grayscale images.
  """
  hours, minutes = np.asarray(hours), np.asarray(minutes)
  _check_times(hours, minutes)
  looks = draw_looks(len(hours), rng, size=size, clean=clean)
  return paint_clocks(hours, minutes, looks)


def draw_clock(rng: np.random.Generator) -> tuple[int, int, dict]:
  """(hour, minute, looks) of one clock, all drawn from ``rng``.

  The draws: the hour, the minute, then `draw_looks` of one clock. The train
  stream draws each example from its own generator this way and paints a
  batch of them at once (`render_clock_batch`).
  """
  hour, minute = int(rng.integers(1, 13)), int(rng.integers(0, 60))
  return hour, minute, draw_looks(1, rng)


def render_clock_batch(rngs) -> tuple[np.ndarray, list[str]]:
  """One clock from each generator (`draw_clock`): images [B, S, S], labels."""
  hours, minutes, looks = zip(*(draw_clock(rng) for rng in rngs))
  looks = {k: np.concatenate([one[k] for one in looks]) for k in looks[0]}
  images = paint_clocks(np.array(hours), np.array(minutes), looks)
  return images, [format_time(h, m) for h, m in zip(hours, minutes)]


def generate_clocks(
    split: str, size: int, seed: int
) -> Iterator[tuple[np.ndarray, str]]:
  """Yields ``size`` (image, label) pairs of ``split``, deterministic for seed.

  Each split draws from its own NumPy stream (``SeedSequence(seed,
  spawn_key=(split,))``), in chunks of 1000 clocks.
  """
  if split not in _SPLIT_STREAMS:
    raise ValueError(
        f"split must be one of {sorted(_SPLIT_STREAMS)}, got " f"{split!r}."
    )
  rng = np.random.default_rng(
      np.random.SeedSequence(seed, spawn_key=(_SPLIT_STREAMS[split],))
  )
  start = time.monotonic()
  for first in range(0, size, _RENDER_CHUNK):
    count = min(_RENDER_CHUNK, size - first)
    hours = rng.integers(1, 13, count)
    minutes = rng.integers(0, 60, count)
    images = render_clocks(hours, minutes, rng)
    for image, hour, minute in zip(images, hours, minutes):
      yield image, format_time(int(hour), int(minute))
    logging.info(
        "%s: %d/%d clocks (%.0f/s)",
        split,
        first + count,
        size,
        (first + count) / max(time.monotonic() - start, 1e-9),
    )


# ----------------------------------------------------------------------------
# The TFDS dataset.


config_name = generated_data.config_name


class ClockTime(generated_data.GeneratedBuilder, skip_registration=True):
  """Rendered analog clocks and their ``H_MM`` labels.

  Not registered by name; read it with ``tfds.builder_from_directory``.
  """

  VERSION = tfds.core.Version(VERSION)
  BUILDER_CONFIG_CLASS = generated_data.SplitSizes

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
        builder=self,
        description="Analog clocks rendered with NumPy, labelled H_MM.",
        features=tfds.features.FeaturesDict(
            {
                # Raw bytes, decoded by NumPy alone (no image codec needed).
                "image": tfds.features.Tensor(
                    shape=(IMAGE_SIZE, IMAGE_SIZE), dtype=np.uint8
                ),
                "answer": tfds.features.Text(),
            }
        ),
        disable_shuffling=True,
        metadata=tfds.core.MetadataDict(
            image_size=IMAGE_SIZE,
            train_size=self.builder_config.train_size,
            test_size=self.builder_config.test_size,
            seed=self.builder_config.seed,
        ),
    )

  def _generate_examples(self, split, size, seed):
    for index, (image, answer) in enumerate(generate_clocks(split, size, seed)):
      yield index, {"image": image, "answer": answer}


def prepare(
    data_dir: str, train_size: int, test_size: int, seed: int = 0
) -> str:
  """Renders the dataset under ``data_dir`` unless it exists; its directory.

  ``train_size=0`` writes the test split alone (for ``train_stream`` runs).
  Also writes ``samples.png`` (24 test clocks with their labels) beside it.
  """
  builder = ClockTime(
      data_dir=data_dir,
      config=generated_data.split_sizes(train_size, test_size, seed, "clocks"),
      file_format="array_record",
  )

  def plot_samples(records, path):
    from train import plots  # pylint: disable=g-import-not-at-top

    plots.plot_clock_grid(
        [r["image"] for r in records],
        [_as_str(r["answer"]) for r in records],
        path,
    )

  return generated_data.prepare(builder, plot_samples)


_as_str = generated_data.as_str


# ----------------------------------------------------------------------------
# The task interface (see train/tasks/__init__.py).

NAME = DATASET_NAME
dataset_config_name = config_name


def check_config(config) -> None:
  """Raises ValueError for fields this task cannot use."""
  if config.image_size != IMAGE_SIZE:
    raise ValueError(
        f"image_size must be {IMAGE_SIZE} (the rendered size), "
        f"got {config.image_size}."
    )
  if config.max_answer_len < MAX_ANSWER_LEN:
    raise ValueError(
        f"max_answer_len must be >= {MAX_ANSWER_LEN} for H_MM "
        f"answers, got {config.max_answer_len}."
    )


def _find(config):
  return input_pipeline.find_dataset_dir(
      config.data_dir,
      config_name=config.dataset_config or None,
      dataset_name=DATASET_NAME,
  )


def check_data(config) -> None:
  """Raises ValueError or FileNotFoundError unless the data can be read."""
  _find(config)


def _load(config, split):
  return input_pipeline.split_source(
      _find(config),
      split,
      prepare="set --config.train_stream=True to render the train clocks "
      "as the run reads them, or prepare a train split",
  )


def model_fields(config) -> dict:
  """The `models.model_config` fields this task fixes."""
  channels = tuple(int(c) for c in config.image_channels)
  num_image_tokens = models.num_image_tokens(config.image_size, channels)
  return dict(
      vocab_size=tokenizer.VOCAB_SIZE,
      image_size=config.image_size,
      image_channels=channels,
      max_len=num_image_tokens
      + input_pipeline.sequence_length(MAX_QUESTION_LEN, config.max_answer_len)
      + 1,
  )


def encode_records(records, *, max_answer_len: int) -> dict[str, np.ndarray]:
  """A train batch: `input_pipeline.encode_examples` of the labels + images."""
  answers = [_as_str(record["answer"]) for record in records]
  batch = input_pipeline.encode_examples(
      [""] * len(answers),
      answers,
      max_question_len=MAX_QUESTION_LEN,
      max_answer_len=max_answer_len,
  )
  batch["images"] = np.stack(
      [np.asarray(r["image"], np.uint8) for r in records]
  )
  return batch


def render_stream(rngs) -> list[dict]:
  """The train stream's records: one clock from each generator."""
  images, answers = render_clock_batch(rngs)
  return [dict(image=i, answer=a) for i, a in zip(images, answers)]


def train_iterator(config, *, process_index=None, process_count=None):
  """Checkpointable iterator over this host's train batches.

  The prepared train split, shuffled; with ``config.train_stream`` clocks
  rendered as they are read, none twice, none of the test split's
  (`train.streams`).
  """
  encode = functools.partial(
      encode_records, max_answer_len=config.max_answer_len
  )
  if config.get("train_stream", False):
    test = _load(config, "test")
    return streams.train_iterator(
        config,
        render_stream,
        encode,
        test.__getitems__(list(range(len(test)))),
        process_index=process_index,
        process_count=process_count,
    )
  source = _load(config, "train")
  return input_pipeline.task_train_iterator(
      config,
      source,
      np.arange(len(source)),
      encode,
      process_index=process_index,
      process_count=process_count,
  )


def eval_batches(config, *, process_index=None, process_count=None):
  """This host's test batches: prompts ``BOS SEP``, images and answers."""
  process_index, process_count = input_pipeline.resolve_process(
      process_index, process_count
  )
  batch_size = input_pipeline.per_host_batch_size(
      config.eval_batch_size, process_count
  )
  source = _load(config, "test")
  usable = np.arange(len(source))
  if config.eval_examples:
    usable = usable[: config.eval_examples]
  for records, indices in input_pipeline.host_eval_records(
      source,
      usable,
      global_batch_size=config.eval_batch_size,
      process_index=process_index,
      process_count=process_count,
  ):
    padding = batch_size - len(records)
    prompts, prompt_lengths = input_pipeline.encode_prompts(
        [""] * batch_size, max_question_len=MAX_QUESTION_LEN
    )
    images = np.zeros(
        (batch_size, config.image_size, config.image_size), np.uint8
    )
    if records:
      images[: len(records)] = np.stack([r["image"] for r in records])
    yield dict(
        prompts=prompts,
        prompt_lengths=prompt_lengths,
        images=images,
        questions=[""] * batch_size,
        answers=[_as_str(r["answer"]) for r in records] + [""] * padding,
        indices=indices + [-1] * padding,
        valid=np.arange(batch_size) < len(records),
        test_examples=len(source),
    )


def score_answers(predictions, answers, config) -> dict:
  """Sums over one host's examples (hosts add them; see `summarize`).

  An answer that does not parse as ``H_MM`` counts as wrong in every
  accuracy and as a gap of 360 minutes (the largest possible).
  """
  del config
  sums = dict(
      count=0.0,
      correct=0.0,
      parsed=0.0,
      hour_correct=0.0,
      minute_correct=0.0,
      within_5=0.0,
      gap=0.0,
      gap_histogram=np.zeros(UNPARSED_GAP + 1),
  )
  for predicted, answer in zip(predictions, answers):
    target, guess = parse_time(answer), parse_time(predicted)
    if target is None:
      raise ValueError(f"reference answer {answer!r} is not a H_MM time.")
    gap = UNPARSED_GAP if guess is None else time_gap_minutes(guess, target)
    sums["count"] += 1
    sums["correct"] += guess == target
    sums["parsed"] += guess is not None
    sums["hour_correct"] += guess is not None and guess[0] == target[0]
    sums["minute_correct"] += guess is not None and guess[1] == target[1]
    sums["within_5"] += gap <= 5
    sums["gap"] += gap
    sums["gap_histogram"][gap] += 1
  return sums


def summarize(sums: dict) -> dict:
  """Rates and gaps from (all hosts') summed scores."""
  count = max(sums["count"], 1.0)
  cumulative = np.cumsum(sums["gap_histogram"])
  total = int(round(cumulative[-1]))

  def gap_of_rank(rank):  # the rank-th smallest gap, 0-based
    return float(np.searchsorted(cumulative, rank + 1 - 0.5))

  median = (
      0.5 * (gap_of_rank((total - 1) // 2) + gap_of_rank(total // 2))
      if total
      else 0.0
  )
  return dict(
      exact_match=float(sums["correct"] / count),
      mean_time_gap_minutes=float(sums["gap"] / count),
      median_time_gap_minutes=median,
      within_5_minutes=float(sums["within_5"] / count),
      hour_accuracy=float(sums["hour_correct"] / count),
      minute_accuracy=float(sums["minute_correct"] / count),
      parsed_rate=float(sums["parsed"] / count),
      num_examples=int(sums["count"]),
  )


def headline(metrics: dict) -> str:
  """One line for the log."""
  return (
      f"exact match {metrics['exact_match']:.4f}, mean time gap "
      f"{metrics['mean_time_gap_minutes']:.1f} min on "
      f"{tasks.scored(metrics)} clocks"
  )
