r"""grounding: the box of the object a query names (NTIL paper, Tables 1-2).

An RGB scene of coloured shapes and a text query in, boxes out as text
``x1,y1,x2,y2`` (inclusive pixel coordinates, two digits each: ``03,17,25,40``).
The scenes are drawn here with NumPy (`grounding_scenes`), nothing is
downloaded. Three tasks share this module, one TFDS dataset each:

* ``grounding`` (this module): 2-4 objects; the query names one by colour
  and shape (``'red circle'``), the others share its colour or its shape;
  the answer is its box (referring expression comprehension, Table 1).
* ``grounding_single`` (train/tasks/grounding_single.py): one object, the
  same kind of query; pure localisation.
* ``grounding_multi`` (train/tasks/grounding_multi.py): the query names a
  colour (``'red'``), the answer is every box of that colour, left to right,
  ``;``-separated (scene text detection, Table 2), scored by F1 at IoU 0.5.

``python -m train.prepare_data --task=grounding --data_dir=D --train_size=N
--test_size=M --seed=S`` (or `prepare`) writes a TFDS ``array_record``
dataset at ``D/grounding/train{N}_test{M}_seed{S}/1.0.0`` (``image``: uint8
[48, 48, 3], ``question`` and ``answer``: text), deterministic for a seed,
the test split independent of ``train_size``, and ``samples.png`` beside it:
test scenes with their query and box drawn.

The model sees the image as a prefix of ``K`` tokens (a `encoders.PatchEncoder`
by default: 12 x 12 patches, 16 tokens) and then ``BOS query SEP answer
EOS``; the prompt is ``BOS query SEP`` and the loss is on the answer and
EOS. Each of the four numbers of a box is a digit run, so the numeric losses
score it as a number. Metrics: `train.tasks.boxes`.
"""

import functools

import numpy as np
import tensorflow_datasets as tfds

from train import input_pipeline
from train import generated_data
from train import models
from train import step
from train import streams
from train import tasks
from train import tokenizer
from train.tasks import boxes
from train.tasks import grounding_scenes as scenes

VERSION = "1.0.0"
IMAGE_SIZE = scenes.IMAGE_SIZE
NUM_SAMPLES = 24  # test scenes in samples.png


config_name = generated_data.config_name


class _SceneBuilder(generated_data.GeneratedBuilder, skip_registration=True):
  """Scenes of one `scenes.Variant` (``VARIANT``), with query and answer.

  Not registered by name; read it with ``tfds.builder_from_directory``.
  """

  VERSION = tfds.core.Version(VERSION)
  BUILDER_CONFIG_CLASS = generated_data.SplitSizes
  VARIANT: scenes.Variant

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
        builder=self,
        description=(
            "Scenes of coloured shapes rendered with NumPy, a query and "
            "the answer's boxes as x1,y1,x2,y2 text."
        ),
        features=tfds.features.FeaturesDict(
            {
                # Raw bytes, decoded by NumPy alone (no image codec needed).
                "image": tfds.features.Tensor(
                    shape=(IMAGE_SIZE, IMAGE_SIZE, scenes.PIXEL_CHANNELS),
                    dtype=np.uint8,
                ),
                "question": tfds.features.Text(),
                "answer": tfds.features.Text(),
            }
        ),
        disable_shuffling=True,
        metadata=tfds.core.MetadataDict(
            image_size=IMAGE_SIZE,
            variant=self.VARIANT.name,
            train_size=self.builder_config.train_size,
            test_size=self.builder_config.test_size,
            seed=self.builder_config.seed,
        ),
    )

  def _generate_examples(self, split, size, seed):
    for index, scene in enumerate(
        scenes.generate_scenes(self.VARIANT, split, size, seed)
    ):
      yield index, dict(
          image=scene.image, question=scene.question, answer=scene.answer
      )


# The TFDS dataset name is the class name in snake case: the task's name.
class Grounding(_SceneBuilder, skip_registration=True):
  VARIANT = scenes.VARIANTS["grounding"]


class GroundingSingle(_SceneBuilder, skip_registration=True):
  VARIANT = scenes.VARIANTS["grounding_single"]


class GroundingMulti(_SceneBuilder, skip_registration=True):
  VARIANT = scenes.VARIANTS["grounding_multi"]


_BUILDERS = {
    b.VARIANT.name: b for b in (Grounding, GroundingSingle, GroundingMulti)
}


_as_str = generated_data.as_str


class GroundingTask:
  """The task interface (train/tasks/__init__.py) for one variant."""

  def __init__(self, name: str):
    self.variant = scenes.VARIANTS[name]
    self.builder_class = _BUILDERS[name]
    if self.builder_class.name != name:
      raise AssertionError(f"{self.builder_class.name} != {name}")
    self.name = name

  # --------------------------------------------------------------------------
  # Data.

  def prepare(
      self, data_dir: str, train_size: int, test_size: int, seed: int = 0
  ) -> str:
    """Renders the dataset under ``data_dir`` unless it exists; its directory.

    ``train_size=0`` writes the test split alone (for ``train_stream``
    runs). Also writes ``samples.png`` (test scenes with query and boxes)
    beside it.
    """
    builder = self.builder_class(
        data_dir=data_dir,
        config=generated_data.split_sizes(
            train_size, test_size, seed, "scenes"
        ),
        file_format="array_record",
    )

    def plot_samples(records, path):
      from train import plots  # pylint: disable=g-import-not-at-top

      answers = [_as_str(r["answer"]) for r in records]
      plots.plot_scene_grid(
          [r["image"] for r in records],
          [_as_str(r["question"]) for r in records],
          {"answer": [boxes.parse_boxes(a, IMAGE_SIZE) for a in answers]},
          path,
      )

    return generated_data.prepare(builder, plot_samples, NUM_SAMPLES)

  def dataset_config_name(self, train_size, test_size, seed) -> str:
    return config_name(train_size, test_size, seed)

  def check_config(self, config) -> None:
    """Raises ValueError for fields this task cannot use."""
    if config.image_size != IMAGE_SIZE:
      raise ValueError(
          f"image_size must be {IMAGE_SIZE} (the rendered size), "
          f"got {config.image_size}."
      )
    for field, needed, example in (
        ("max_question_len", self.variant.max_question_len, "queries"),
        ("max_answer_len", self.variant.max_answer_len, "answers"),
    ):
      if config[field] < needed:
        raise ValueError(
            f"{field} must be >= {needed} for {self.name} {example}, got "
            f"{config[field]}."
        )
    try:  # the model's own checks (patch size, encoder name)
      step.model_config(config, self)
    except ValueError as error:
      raise ValueError(f"{self.name}: {error}") from error

  def _find(self, config):
    return input_pipeline.find_dataset_dir(
        config.data_dir,
        config_name=config.dataset_config or None,
        dataset_name=self.name,
    )

  def check_data(self, config) -> None:
    """Raises ValueError or FileNotFoundError unless the data can be read."""
    self._find(config)

  def _load(self, config, split):
    return input_pipeline.split_source(
        self._find(config),
        split,
        prepare="set --config.train_stream=True to render the train scenes "
        "as the run reads them, or prepare a train split",
    )

  # --------------------------------------------------------------------------
  # Model and batches.

  def model_fields(self, config) -> dict:
    """The `models.model_config` fields this task fixes.

    The encoder comes from the config's ``image_encoder`` and ``patch_size``
    (configs/grounding.py; a patch encoder of 12 x 12 patches if absent) and
    ``image_channels``; pixels are RGB.
    """
    encoder = dict(
        image_channels=tuple(int(c) for c in config.image_channels),
        image_encoder=config.get("image_encoder", "patch"),
        patch_size=config.get("patch_size", 12),
    )
    num_image_tokens = models.num_image_tokens(config.image_size, **encoder)
    return dict(
        vocab_size=tokenizer.VOCAB_SIZE,
        max_len=num_image_tokens
        + input_pipeline.sequence_length(
            config.max_question_len, config.max_answer_len
        )
        + 1,
        image_size=config.image_size,
        pixel_channels=scenes.PIXEL_CHANNELS,
        **encoder,
    )

  def encode_records(self, records, *, config) -> dict[str, np.ndarray]:
    """A train batch: `input_pipeline.encode_examples` + images [B, S, S, 3]."""
    batch = input_pipeline.encode_examples(
        [_as_str(r["question"]) for r in records],
        [_as_str(r["answer"]) for r in records],
        max_question_len=config.max_question_len,
        max_answer_len=config.max_answer_len,
    )
    batch["images"] = np.stack(
        [np.asarray(r["image"], np.uint8) for r in records]
    )
    return batch

  def render_stream(self, rngs) -> list[dict]:
    """The train stream's records: one scene from each generator."""
    return [
        dict(image=scene.image, question=scene.question, answer=scene.answer)
        for scene in (scenes.render_scene(self.variant, rng) for rng in rngs)
    ]

  def train_iterator(self, config, *, process_index=None, process_count=None):
    """Checkpointable iterator over this host's train batches.

    The prepared train split, shuffled; with ``config.train_stream`` scenes
    rendered as they are read, none twice, none of the test split's
    (`train.streams`).
    """
    encode = functools.partial(self.encode_records, config=config)
    if config.get("train_stream", False):
      test = self._load(config, "test")
      return streams.train_iterator(
          config,
          self.render_stream,
          encode,
          test.__getitems__(list(range(len(test)))),
          process_index=process_index,
          process_count=process_count,
      )
    source = self._load(config, "train")
    return input_pipeline.task_train_iterator(
        config,
        source,
        np.arange(len(source)),
        encode,
        process_index=process_index,
        process_count=process_count,
    )

  def eval_batches(self, config, *, process_index=None, process_count=None):
    """This host's test batches: prompts ``BOS query SEP``, images, answers."""
    process_index, process_count = input_pipeline.resolve_process(
        process_index, process_count
    )
    batch_size = input_pipeline.per_host_batch_size(
        config.eval_batch_size, process_count
    )
    source = self._load(config, "test")
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
      questions = [_as_str(r["question"]) for r in records] + [""] * padding
      prompts, prompt_lengths = input_pipeline.encode_prompts(
          questions, max_question_len=config.max_question_len
      )
      images = np.zeros(
          (batch_size, IMAGE_SIZE, IMAGE_SIZE, scenes.PIXEL_CHANNELS), np.uint8
      )
      if records:
        images[: len(records)] = np.stack([r["image"] for r in records])
      yield dict(
          prompts=prompts,
          prompt_lengths=prompt_lengths,
          images=images,
          questions=questions,
          answers=[_as_str(r["answer"]) for r in records] + [""] * padding,
          indices=indices + [-1] * padding,
          valid=np.arange(batch_size) < len(records),
          test_examples=len(source),
      )

  # --------------------------------------------------------------------------
  # Metrics.

  def score_answers(self, predictions, answers, config) -> dict:
    """Sums over one host's examples (hosts add them; see `summarize`)."""
    del config
    score = boxes.score_multi if self.variant.multi else boxes.score_single
    return score(predictions, answers, IMAGE_SIZE)

  def summarize(self, sums: dict) -> dict:
    """Rates from (all hosts') summed scores; see `train.tasks.boxes`."""
    if self.variant.multi:
      return boxes.summarize_multi(sums)
    return boxes.summarize_single(sums)

  def headline(self, metrics: dict) -> str:
    """One line for the log."""
    if self.variant.multi:
      return (
          f"F1@0.5 {metrics['f1_at_50']:.4f} (precision "
          f"{metrics['precision_at_50']:.4f}, recall "
          f"{metrics['recall_at_50']:.4f}), exact match "
          f"{metrics['exact_match']:.4f} on {tasks.scored(metrics)} scenes"
      )
    return (
        f"Acc@0.5 {metrics['acc_at_50']:.4f}, mean IoU "
        f"{metrics['mean_iou']:.4f}, exact match "
        f"{metrics['exact_match']:.4f}, mean coordinate error "
        f"{metrics['mean_coordinate_error']:.2f} px on "
        f"{tasks.scored(metrics)} scenes"
    )


# ----------------------------------------------------------------------------
# The task interface of 'grounding' (train/tasks/__init__.py).

_TASK = GroundingTask("grounding")
NAME = _TASK.name
prepare = _TASK.prepare
dataset_config_name = _TASK.dataset_config_name
check_config = _TASK.check_config
check_data = _TASK.check_data
model_fields = _TASK.model_fields
train_iterator = _TASK.train_iterator
render_stream = _TASK.render_stream
eval_batches = _TASK.eval_batches
score_answers = _TASK.score_answers
summarize = _TASK.summarize
headline = _TASK.headline
