"""grounding: boxes and metrics, the renderer, the patch encoder, CLI + resume."""

import json
import pathlib
import sys

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import grounding as grounding_config
from train import decoding
from train import models
from train import tasks
from train import tokenizer
from train import train
from train.tasks import boxes
from train.tasks import grounding
from train.tasks import grounding_scenes as scenes

from tests import xla_settings
from tests import launch
from tests.test_train import logged  # {step: value} from metrics.jsonl

ROOT = pathlib.Path(__file__).resolve().parents[1]
SIZE = scenes.IMAGE_SIZE


# ----------------------------------------------------------------------------
# Boxes: IoU, parsing, matching.


@pytest.mark.parametrize(
    "a, b, expected",
    [
        ((3, 4, 20, 30), (3, 4, 20, 30), 1.0),  # identical
        ((0, 0, 0, 0), (0, 0, 0, 0), 1.0),  # one pixel: area 1, inclusive
        ((0, 0, 9, 9), (20, 20, 29, 29), 0.0),  # disjoint
        ((0, 0, 4, 4), (5, 0, 9, 4), 0.0),  # side by side: no shared pixel
        # Half of a 10x10 box (100 px) is the 5x10 box (50 px) inside it:
        # intersection 50, union 100.
        ((0, 0, 9, 9), (0, 0, 4, 9), 0.5),
        # Shifted by half its width: columns 5..9 shared, 5 x 10 = 50 px;
        # union 100 + 100 - 50 = 150.
        ((0, 0, 9, 9), (5, 0, 14, 9), 1 / 3),
        # Sharing one column of 5 pixels: 5 / (25 + 25 - 5).
        ((0, 0, 4, 4), (4, 0, 8, 4), 5 / 45),
        ((5, 5, 4, 9), (5, 5, 4, 9), 0.0),  # empty (x2 < x1)
    ],
)
def test_iou_of_hand_made_boxes(a, b, expected):
  assert boxes.iou(a, b) == pytest.approx(expected)
  assert boxes.iou(b, a) == pytest.approx(expected)


def test_area_counts_inclusive_pixels():
  assert boxes.area((0, 0, 47, 47)) == 48 * 48
  assert boxes.area((10, 10, 10, 12)) == 3
  assert boxes.area((10, 10, 9, 12)) == 0


@pytest.mark.parametrize(
    "text, parsed",
    [
        ("03,17,25,40", (3, 17, 25, 40)),
        (" 3,17,25,40 ", (3, 17, 25, 40)),  # one digit, spaces
        ("00,00,47,47", (0, 0, 47, 47)),
        ("30,17,25,40", (30, 17, 25, 40)),  # parses; an empty box
        ("03,17,25,48", None),  # outside the 48-pixel image
        ("03,17,25", None),
        ("03,17,25,40,41", None),
        ("03,17,25,400", None),
        ("-3,17,25,40", None),
        ("03 17 25 40", None),
        ("a,b,c,d", None),
        ("", None),
        ("\uff11\uff10,10,19,19", None),  # full-width digits: not ASCII
        ("\u0661\u0660,\u0661\u0660,\u0661\u0669,\u0661\u0669", None),
    ],
)
def test_parse_box(text, parsed):
  assert boxes.parse_box(text, SIZE) == parsed


def test_format_and_parse_boxes():
  text = boxes.format_boxes([(3, 17, 25, 40), (30, 5, 44, 20)])
  assert text == "03,17,25,40;30,05,44,20"
  assert boxes.parse_boxes(text, SIZE) == [(3, 17, 25, 40), (30, 5, 44, 20)]
  assert boxes.parse_boxes("03,17,25,40;", SIZE) == [(3, 17, 25, 40), None]
  assert boxes.parse_boxes("", SIZE) == []
  with pytest.raises(ValueError):
    boxes.format_box((3, 17, 25, 100))


def test_matching_is_one_to_one_and_maximal():
  a, b = (0, 0, 9, 9), (20, 0, 29, 9)
  assert boxes.count_matches([a, b], [a, b]) == 2
  assert boxes.count_matches([a, a], [a, b]) == 1  # a duplicate counts once
  assert boxes.count_matches([None, (0, 0, 9, 8)], [a]) == 1
  assert boxes.count_matches([(0, 0, 4, 9)], [a]) == 1  # IoU 0.5 counts
  assert boxes.count_matches([(0, 0, 3, 9)], [a]) == 0  # IoU 0.4
  # Prediction 0 could take either truth, prediction 1 only the first: a
  # greedy matching of 0 to the first loses one; the maximum is 2.
  truths = [(0, 0, 9, 9), (0, 0, 9, 7)]
  either, first_only = (0, 0, 9, 8), (0, 0, 13, 13)
  assert min(boxes.iou(either, t) for t in truths) >= 0.5
  assert boxes.iou(first_only, truths[0]) >= 0.5  # 100 / 196
  assert boxes.iou(first_only, truths[1]) < 0.5  # 80 / 196
  assert boxes.count_matches([either, first_only], truths) == 2
  assert boxes.count_matches([], truths) == 0


def test_single_box_scores_of_hand_made_answers():
  answers = ["00,00,09,09"] * 5
  predictions = [
      "00,00,09,09",  # exact: IoU 1, errors 0
      "00,00,04,09",  # IoU 0.5, errors (0, 0, 5, 0)
      "05,00,14,09",  # IoU 1/3, errors (5, 0, 5, 0)
      "20,20,29,29",  # IoU 0, errors 20 each
      "garbage",  # unparsed: IoU 0, error 48 per coordinate
  ]
  metrics = grounding.summarize(
      grounding.score_answers(predictions, answers, None)
  )
  assert metrics["acc_at_50"] == pytest.approx(2 / 5)
  assert metrics["acc_at_75"] == pytest.approx(1 / 5)
  assert metrics["mean_iou"] == pytest.approx((1 + 0.5 + 1 / 3) / 5)
  assert metrics["exact_match"] == pytest.approx(1 / 5)
  assert metrics["coordinate_accuracy"] == pytest.approx(
      (1 + 3 / 4 + 2 / 4) / 5
  )
  assert metrics["mean_coordinate_error"] == pytest.approx(
      (0 + 5 / 4 + 10 / 4 + 20 + 48) / 5
  )
  assert metrics["parsed_rate"] == pytest.approx(4 / 5)
  assert metrics["num_examples"] == 5
  with pytest.raises(ValueError, match="not a box"):
    grounding.score_answers(["00,00,09,09"], ["nonsense"], None)


def test_multi_box_f1_of_hand_made_answers():
  multi = tasks.get("grounding_multi")
  answers = [
      "00,00,09,09;20,00,29,09",
      "00,00,09,09",
      "00,00,09,09;20,00,29,09;40,00,47,09",
  ]
  predictions = [
      "00,00,09,09;20,00,29,09",  # both right, in order: exact
      "00,00,09,09;30,30,39,39",  # one right, one false positive
      "20,00,29,09;xx",  # one of three right, one malformed part
  ]
  metrics = multi.summarize(multi.score_answers(predictions, answers, None))
  # 6 true boxes, 6 predicted parts, 4 matched.
  assert metrics["precision_at_50"] == pytest.approx(4 / 6)
  assert metrics["recall_at_50"] == pytest.approx(4 / 6)
  assert metrics["f1_at_50"] == pytest.approx(4 / 6)
  assert metrics["exact_match"] == pytest.approx(1 / 3)
  assert metrics["count_accuracy"] == pytest.approx(1 / 3)  # 2 of 2 only
  assert metrics["parsed_rate"] == pytest.approx(2 / 3)
  nothing = multi.summarize(multi.score_answers([""], answers[:1], None))
  assert nothing["f1_at_50"] == 0.0 and nothing["recall_at_50"] == 0.0


# ----------------------------------------------------------------------------
# The renderer: the drawn objects are the labelled ones.


def _foreground(image):
  """Object pixels: any channel far above the dark, noisy background."""
  return image.max(-1) > 128


@pytest.mark.parametrize("name", sorted(scenes.VARIANTS))
def test_answer_boxes_are_the_named_objects_pixels(name):
  variant = scenes.VARIANTS[name]
  checked = 0
  for scene in scenes.generate_scenes(variant, "test", 150, seed=5):
    foreground = _foreground(scene.image)
    padded = np.pad(foreground, 1)
    answer = boxes.parse_boxes(scene.answer, SIZE)
    assert answer == [scene.objects[i].box for i in scene.targets]
    for box, index in zip(answer, scene.targets):
      target = scene.objects[index]
      x1, y1, x2, y2 = box
      inside = foreground[y1 : y2 + 1, x1 : x2 + 1]
      # Touches all four sides of its box, nothing in the ring around it.
      assert inside[0].any() and inside[-1].any()
      assert inside[:, 0].any() and inside[:, -1].any()
      ring = padded[y1 : y2 + 3, x1 : x2 + 3].copy()
      ring[1:-1, 1:-1] = False
      assert not ring.any()
      # Exactly the pixels of the named shape at the box's width.
      shape = scenes.shape_mask(target.shape, x2 - x1 + 1)
      sx1, sy1, sx2, sy2 = scenes.mask_box(shape)
      np.testing.assert_array_equal(inside, shape[sy1 : sy2 + 1, sx1 : sx2 + 1])
      # Of the named colour: the nearest of the palette to its mean colour.
      mean = scene.image[y1 : y2 + 1, x1 : x2 + 1][inside].mean(0)
      nearest = min(
          scenes.COLORS,
          key=lambda c: np.sum((np.array(scenes.COLORS[c]) - mean) ** 2),
      )
      assert nearest == target.color
      assert scene.question.startswith(target.color)
      if not variant.multi:
        assert scene.question == f"{target.color} {target.shape}"
      checked += 1
  assert checked >= 150


def test_queries_need_both_words_and_multi_answers_every_box_of_a_colour():
  for scene in scenes.generate_scenes(
      scenes.VARIANTS["grounding"], "train", 300, seed=1
  ):
    target, *others = scene.objects
    assert 2 <= len(scene.objects) <= 4
    for other in others:  # exactly one of colour and shape shared
      assert (other.color == target.color) != (other.shape == target.shape)
  for scene in scenes.generate_scenes(
      scenes.VARIANTS["grounding_single"], "train", 50, seed=1
  ):
    assert len(scene.objects) == 1
  counts = set()
  for scene in scenes.generate_scenes(
      scenes.VARIANTS["grounding_multi"], "train", 300, seed=1
  ):
    named = [o.box for o in scene.objects if o.color == scene.question]
    assert boxes.parse_boxes(scene.answer, SIZE) == sorted(named)
    assert len(scene.objects) > len(named)  # at least one distractor
    counts.add(len(named))
  assert counts == {1, 2, 3}


def test_objects_never_touch():
  for scene in scenes.generate_scenes(
      scenes.VARIANTS["grounding_multi"], "test", 200, seed=2
  ):
    for i, a in enumerate(scene.objects):
      for b in scene.objects[i + 1 :]:
        grown = (
            a.box[0] - scenes.GAP,
            a.box[1] - scenes.GAP,
            a.box[2] + scenes.GAP,
            a.box[3] + scenes.GAP,
        )
        assert (
            boxes.area(
                (
                    max(grown[0], b.box[0]),
                    max(grown[1], b.box[1]),
                    min(grown[2], b.box[2]),
                    min(grown[3], b.box[3]),
                )
            )
            == 0
        )


def test_scenes_are_deterministic_per_seed_and_split():
  variant = scenes.VARIANTS["grounding"]

  def draw(split, seed):
    return list(scenes.generate_scenes(variant, split, 30, seed))

  first, again = draw("train", 3), draw("train", 3)
  assert all(
      np.array_equal(a.image, b.image) and a.answer == b.answer
      for a, b in zip(first, again)
  )
  assert [s.answer for s in draw("train", 4)] != [s.answer for s in first]
  assert [s.answer for s in draw("test", 3)] != [s.answer for s in first]
  assert first[0].image.shape == (SIZE, SIZE, 3)
  assert first[0].image.dtype == np.uint8


# ----------------------------------------------------------------------------
# The patch encoder, and the existing models unchanged.


@pytest.fixture(scope="module")
def patch_model():
  config = models.model_config(
      "tiny",
      vocab_size=tokenizer.VOCAB_SIZE,
      max_len=48,
      image_size=SIZE,
      image_encoder="patch",
      pixel_channels=3,
      patch_size=12,
      image_channels=(),
  )
  assert config.num_image_tokens == 16
  return models.create_model(config, nnx.Rngs(0))


@nnx.jit
def _encode(model, images):
  return model.image_encoder(images)


@nnx.jit
def _logits(model, tokens, images):
  return model(tokens, images)


def test_patch_encoder_matches_a_numpy_oracle(patch_model):
  images = np.random.default_rng(0).integers(0, 256, (2, SIZE, SIZE, 3))
  tokens = np.asarray(_encode(patch_model, jnp.asarray(images, jnp.uint8)))
  assert tokens.shape == (2, 16, 64) and tokens.dtype == np.float32
  # Oracle: pixels in [-1, 1] plus x and y channels, each 12x12 patch
  # flattened (row, column, channel) times the kernel, + bias + embedding.
  coordinates = np.linspace(-1, 1, SIZE)
  x = np.concatenate(
      [
          images / 127.5 - 1,
          np.broadcast_to(coordinates[None, :, None], (2, SIZE, SIZE, 1)),
          np.broadcast_to(coordinates[:, None, None], (2, SIZE, SIZE, 1)),
      ],
      axis=-1,
  )
  encoder = patch_model.image_encoder
  kernel = np.asarray(encoder.kernels[0][...], np.float64).reshape(-1, 64)
  expected = np.zeros((2, 16, 64))
  for row in range(4):
    for column in range(4):
      patch = x[:, 12 * row : 12 * row + 12, 12 * column : 12 * column + 12]
      expected[:, 4 * row + column] = patch.reshape(2, -1) @ kernel
  expected += np.asarray(encoder.biases[0][...]) + np.asarray(
      encoder.patch_embedding[...]
  )
  np.testing.assert_allclose(tokens, expected, rtol=1e-4, atol=1e-4)


def test_patch_model_decodes_like_its_full_forward(patch_model):
  images = jax.random.randint(jax.random.key(1), (3, SIZE, SIZE, 3), 0, 256)
  prompts = jnp.array([[tokenizer.BOS_ID, 5, tokenizer.SEP_ID]] * 3)
  decode = nnx.jit(decoding.greedy_decode, static_argnums=(3, 4, 5))
  out = decode(
      patch_model,
      prompts,
      jnp.array([3, 3, 3]),
      6,
      -1,
      tokenizer.PAD_ID,
      images,
  )
  buffer = jnp.concatenate([prompts, out], axis=1)
  logits = _logits(patch_model, buffer[:, :-1], images)
  np.testing.assert_array_equal(np.argmax(logits[:, 2:], -1), out)
  other = _logits(patch_model, buffer[:, :-1], images[::-1])
  assert not np.allclose(logits[0], other[0])
  with pytest.raises(ValueError, match=r"images must be \[B, 48, 48, 3\]"):
    _logits(patch_model, buffer, images[..., 0])
  with pytest.raises(ValueError, match="patch_size must divide"):
    models.model_config(
        "tiny",
        vocab_size=99,
        max_len=48,
        image_size=48,
        image_encoder="patch",
        patch_size=10,
    )
  with pytest.raises(ValueError, match="image_encoder must be one of"):
    models.model_config(
        "tiny", vocab_size=99, max_len=48, image_size=48, image_encoder="vit"
    )


def test_a_hidden_patch_layer_and_a_colour_conv_encoder():
  images = jnp.zeros((2, SIZE, SIZE, 3), jnp.uint8)
  for overrides, kernel_shape, tokens in (
      (dict(image_encoder="patch", image_channels=(32,)), (12, 12, 5, 32), 16),
      (dict(), (3, 3, 3, 16), 9),  # the conv encoder on RGB pixels
  ):
    config = models.model_config(
        "tiny",
        vocab_size=99,
        max_len=48,
        image_size=SIZE,
        pixel_channels=3,
        **overrides,
    )
    model = nnx.eval_shape(lambda c=config: models.create_model(c, nnx.Rngs(0)))
    assert model.image_encoder.kernels[0].shape == kernel_shape
    assert jax.eval_shape(
        lambda m, x: m.image_encoder(x), model, images
    ).shape == (2, tokens, 64)


# Sums of every parameter and of their absolute values, and of the logits
# (and their absolute values) of the tiny text and clock models, initialised
# with nnx.Rngs(0), recorded before the patch encoder was added (the check at
# the time was bitwise, on every array): these models must initialise and
# compute as they did.
_BEFORE_PATCH_ENCODER = {
    "text": (
        396.9556518813147,
        15895.330319736666,
        35.92884042370133,
        1956.5412345414516,
    ),
    "clock": (
        350.93263246765827,
        18474.317782259273,
        -129.06949572374288,
        1844.0187778219843,
    ),
}


def model_fingerprint(name) -> list[float]:
  """Sum and absolute sum of the tiny ``name`` model's initial parameters,
  then of its logits on fixed tokens (and images)."""
  image_size = 48 if name == "clock" else 0
  config = models.model_config(
      "tiny",
      vocab_size=tokenizer.VOCAB_SIZE,
      max_len=32,
      image_size=image_size,
  )
  model = models.create_model(config, nnx.Rngs(0))
  params = [
      np.asarray(p, np.float64)
      for p in jax.tree.leaves(nnx.state(model, nnx.Param))
  ]
  tokens = jax.random.randint(
      jax.random.key(1), (2, 12), 0, tokenizer.VOCAB_SIZE
  )
  images = (
      jax.random.randint(jax.random.key(2), (2, 48, 48), 0, 256)
      if image_size
      else None
  )
  # Recorded eagerly; jit may round the last bit of a logit differently.
  logits = np.asarray(_logits(model, tokens, images), np.float64)
  return [
      float(sum(p.sum() for p in params)),
      float(sum(np.abs(p).sum() for p in params)),
      float(logits.sum()),
      float(np.abs(logits).sum()),
  ]


@pytest.mark.parametrize("name", sorted(_BEFORE_PATCH_ENCODER))
def test_existing_models_initialise_and_compute_as_before(name):
  # Under the users' XLA settings, not the session's fast compiles: the
  # recorded sums are of the initial parameters to the last bit.
  result = launch.run(
      [
          sys.executable,
          "-c",
          "import json, sys; from tests import test_grounding as t; "
          "print(json.dumps(t.model_fingerprint(sys.argv[1])))",
          name,
      ],
      cwd=ROOT,
      env=xla_settings.users_environment(),
      capture_output=True,
      text=True,
      timeout=300,
  )
  assert result.returncode == 0, result.stderr[-3000:]
  param_sum, param_magnitude, total, magnitude = json.loads(
      result.stdout.splitlines()[-1]
  )
  np.testing.assert_allclose(
      [param_sum, param_magnitude], _BEFORE_PATCH_ENCODER[name][:2], rtol=1e-12
  )
  recorded_total, recorded_magnitude = _BEFORE_PATCH_ENCODER[name][2:]
  assert magnitude == pytest.approx(recorded_magnitude, rel=1e-6)
  assert total == pytest.approx(recorded_total, abs=1e-6 * recorded_magnitude)


# ----------------------------------------------------------------------------
# Data, trainer, CLI.


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  directory = tmp_path_factory.mktemp("scenes")
  grounding.prepare(str(directory), train_size=64, test_size=24, seed=0)
  return str(directory)


def make_config(data_dir, method="ntil", **overrides):
  config = grounding_config.get_config(method)
  config.data_dir = data_dir
  config.batch_size = 8
  config.train_steps = 8
  config.lr_decay_steps = 8
  config.warmup_steps = 2
  config.log_every_steps = 1
  config.eval_every_steps = 0
  config.checkpoint_every_steps = 4
  config.eval_batch_size = 12
  config.eval_examples = 24
  for name, value in overrides.items():
    config[name] = value
  return config


def test_all_three_tasks_are_registered():
  for name in ("grounding", "grounding_single", "grounding_multi"):
    task = tasks.get(name)
    assert task.NAME == name
    config = grounding_config.get_config("ce", task=name)
    task.check_config(config)
    fields = task.model_fields(config)
    assert fields["pixel_channels"] == 3 and fields["image_encoder"] == "patch"
    assert (
        fields["max_len"]
        == 16 + config.max_question_len + (config.max_answer_len) + 3
    )
  config = grounding_config.get_config("ce", task="grounding_multi")
  config.max_answer_len = 11
  with pytest.raises(ValueError, match="max_answer_len must be >= 35"):
    tasks.get("grounding_multi").check_config(config)


def test_dataset_batches_and_test_split_independent_of_train_size(
    data_dir, tmp_path
):
  config = make_config(data_dir)
  batch = next(
      grounding.train_iterator(config, process_index=0, process_count=1)
  )
  assert batch["images"].shape == (8, SIZE, SIZE, 3)
  assert batch["images"].dtype == np.uint8
  # BOS query SEP answer EOS: loss on the 11 answer characters and EOS,
  # digits on its 8.
  assert (batch["loss_mask"].sum(1) == 12).all()
  assert (batch["digit_mask"].sum(1) == 8).all()
  root = pathlib.Path(data_dir) / "grounding" / "train64_test24_seed0"
  assert (root / "samples.png").stat().st_size > 5000
  # The test split of another train size is the same scenes.
  grounding.prepare(str(tmp_path), train_size=32, test_size=24, seed=0)
  other = make_config(str(tmp_path))
  ours = next(grounding.eval_batches(config, process_index=0, process_count=1))
  theirs = next(grounding.eval_batches(other, process_index=0, process_count=1))
  np.testing.assert_array_equal(ours["images"], theirs["images"])
  assert ours["answers"] == theirs["answers"]
  assert ours["questions"][0] in {
      f"{c} {s}" for c in scenes.COLORS for s in scenes.SHAPES
  }


@pytest.mark.slow
def test_cli_trains_and_resumes_exactly(data_dir, tmp_path):
  straight = make_config(data_dir)
  train.train_and_evaluate(straight, str(tmp_path / "straight"))
  command = [
      sys.executable,
      "-m",
      "train.main",
      f"--config={ROOT}/configs/grounding.py:ntil",
      f"--workdir={tmp_path / 'resumed'}",
      f"--config.data_dir={data_dir}",
      "--config.batch_size=8",
      "--config.warmup_steps=2",
      "--config.log_every_steps=1",
      "--config.checkpoint_every_steps=4",
      "--config.eval_batch_size=12",
      "--config.eval_examples=24",
      "--config.lr_decay_steps=8",
      "--config.train_steps=4",
      "--config.eval_every_steps=4",
  ]
  first = launch.run(
      command, cwd=ROOT, capture_output=True, text=True, timeout=600
  )
  assert first.returncode == 0, first.stderr[-3000:]
  assert "Acc@0.5" in first.stdout
  resumed = train.train_and_evaluate(straight, str(tmp_path / "resumed"))
  assert resumed["step"] == 8
  assert logged(str(tmp_path / "resumed")) == logged(str(tmp_path / "straight"))
  workdir = str(tmp_path / "resumed")
  assert list(logged(workdir, "acc_at_50")) == [4]  # the first run's eval
  for key in ("acc_at_50", "mean_iou", "exact_match", "parsed_rate"):
    assert 0 <= logged(workdir, key)[4] <= 1
  assert 0 <= logged(workdir, "mean_coordinate_error")[4] <= SIZE
