"""Scenes of coloured shapes for the grounding tasks, rendered with NumPy.

A scene is an RGB image (uint8 [48, 48, 3]) of a few filled shapes
(`SHAPES`) in a few colours (`COLORS`) on a dark, slightly noisy background,
with a text query and the answer, boxes as text (`boxes.format_boxes`).
Shapes are drawn without anti-aliasing (a pixel is the shape's when its
centre is inside), so each object's box is exact: the smallest inclusive
pixel box ``(x1, y1, x2, y2)`` around its pixels. Objects never overlap or
touch: at least `GAP` background pixels separate their boxes.

What a variant asks (`VARIANTS`):

* ``grounding``: 2-4 objects; the query names one by colour and shape
  (``'red circle'``); every other object shares its colour or its shape
  (never both), so both words are needed. Answer: its box.
* ``grounding_single``: one object, named the same way (the query is
  trivial); only the coordinates are at stake. Answer: its box.
* ``grounding_multi``: 3-5 objects; the query names a colour (``'red'``)
  that 1-3 of them have. Answer: all their boxes, left to right (sorted by
  x1, then y1), ``;``-separated.

`generate_scenes` is deterministic for a seed, each split drawn from its own
NumPy stream (so the test split does not depend on the train size).
"""

from collections.abc import Iterator
import dataclasses
import functools
import time

from absl import logging
import numpy as np

from train.tasks import boxes as boxes_lib

IMAGE_SIZE = 48
PIXEL_CHANNELS = 3
# Distinct hues, each jittered by up to `COLOR_JITTER` per channel.
COLORS = {
    "red": (225, 45, 45),
    "green": (45, 190, 65),
    "blue": (55, 105, 240),
    "yellow": (235, 215, 45),
}
COLOR_JITTER = 20
SHAPES = ("square", "circle", "triangle", "cross")
MIN_SIDE, MAX_SIDE = 8, 18  # an object's side in pixels, inclusive
GAP = 2  # background pixels at least between two objects' boxes
_SPLIT_STREAMS = {"train": 0, "test": 1}
_PLACEMENT_TRIES = 50
_LOG_EVERY = 5000


@dataclasses.dataclass(frozen=True)
class Variant:
  """What a grounding variant's scenes hold and ask.

  Attributes:
    name: the task and TFDS dataset name.
    min_objects: fewest objects in a scene.
    max_objects: most objects in a scene.
    multi: the query is a colour and the answer every box of it; else the
      query is a colour and a shape and the answer one box.
    max_targets: most objects of the query colour (``multi`` only).
  """

  name: str
  min_objects: int
  max_objects: int
  multi: bool = False
  max_targets: int = 1

  @property
  def max_question_len(self) -> int:
    """Characters of the longest query."""
    colors = max(map(len, COLORS))
    return colors if self.multi else colors + 1 + max(map(len, SHAPES))

  @property
  def max_answer_len(self) -> int:
    """Characters of the longest answer (boxes of two-digit numbers)."""
    return self.max_targets * (boxes_lib.BOX_TEXT_LEN + 1) - 1


VARIANTS = {
    v.name: v
    for v in (
        Variant("grounding", 2, 4),
        Variant("grounding_single", 1, 1),
        Variant("grounding_multi", 3, 5, multi=True, max_targets=3),
    )
}


@dataclasses.dataclass(frozen=True)
class SceneObject:
  """One shape of a scene, with its exact inclusive pixel box."""

  color: str
  shape: str
  box: tuple[int, int, int, int]


@dataclasses.dataclass(frozen=True)
class Scene:
  """An image, its query and answer, and every object in it."""

  image: np.ndarray  # uint8 [S, S, 3]
  question: str
  answer: str
  objects: tuple[SceneObject, ...]
  targets: tuple[int, ...]  # indices into objects of the answer's boxes


# ----------------------------------------------------------------------------
# Shapes.


def shape_mask(shape: str, side: int) -> np.ndarray:
  """bool [side, side]: the pixels whose centres lie inside ``shape``.

  The shape fills the ``side`` x ``side`` square: a square fills it, a
  circle is inscribed, a triangle has its base on the bottom edge and its
  apex at the top middle, a cross is a plus of arms a third of the side
  thick (at least 2 pixels).
  """
  if shape not in SHAPES:
    raise ValueError(f"shape must be one of {SHAPES}, got {shape!r}.")
  if side < 2:
    raise ValueError(f"side must be >= 2, got {side}.")
  y, x = np.mgrid[0:side, 0:side] + 0.5  # pixel centres
  half = side / 2
  if shape == "square":
    return np.ones((side, side), bool)
  if shape == "circle":
    return np.hypot(x - half, y - half) <= half
  if shape == "triangle":  # apex (half, 0), base from (0, side) to (side, side)
    return np.abs(x - half) <= half * y / side
  thickness = max(2, round(side / 3))
  low = (side - thickness) / 2
  bar = (x >= low) & (x <= low + thickness)
  return bar | ((y >= low) & (y <= low + thickness))


def mask_box(mask: np.ndarray) -> tuple[int, int, int, int]:
  """The inclusive pixel box (x1, y1, x2, y2) of a non-empty bool mask."""
  rows, columns = np.flatnonzero(mask.any(1)), np.flatnonzero(mask.any(0))
  if not rows.size:
    raise ValueError("the mask is empty.")
  return int(columns[0]), int(rows[0]), int(columns[-1]), int(rows[-1])


@functools.cache
def _shape_pixels(shape: str, side: int):
  """(read-only `shape_mask`, its `mask_box`): a few dozen shapes, drawn once."""
  mask = shape_mask(shape, side)
  mask.setflags(write=False)
  return mask, mask_box(mask)


# ----------------------------------------------------------------------------
# Scenes.


def _choose_objects(variant: Variant, rng: np.random.Generator):
  """(colours, shapes, target indices, question) of one scene."""
  colors, shapes = list(COLORS), list(SHAPES)
  count = int(rng.integers(variant.min_objects, variant.max_objects + 1))
  if variant.multi:
    color = colors[rng.integers(len(colors))]
    others = [c for c in colors if c != color]
    targets = int(rng.integers(1, min(variant.max_targets, count - 1) + 1))
    chosen = [color] * targets + [
        others[i] for i in rng.integers(len(others), size=count - targets)
    ]
    kinds = [shapes[i] for i in rng.integers(len(shapes), size=count)]
    return chosen, kinds, tuple(range(targets)), color
  color = colors[rng.integers(len(colors))]
  shape = shapes[rng.integers(len(shapes))]
  chosen, kinds = [color], [shape]
  for _ in range(count - 1):  # share exactly one of colour and shape
    if rng.random() < 0.5:
      chosen.append(color)
      kinds.append(rng.choice([s for s in shapes if s != shape]))
    else:
      chosen.append(rng.choice([c for c in colors if c != color]))
      kinds.append(shape)
  return (
      [str(c) for c in chosen],
      [str(k) for k in kinds],
      (0,),
      f"{color} {shape}",
  )


def _place(sides, rng, size):
  """Top-left corners of squares of ``sides``, apart by `GAP`; or None."""
  corners, placed = [], []
  for side in sides:
    for _ in range(_PLACEMENT_TRIES):
      x, y = (int(v) for v in rng.integers(0, size - side + 1, 2))
      if all(
          x > right + GAP
          or x + side - 1 + GAP < left
          or y > bottom + GAP
          or y + side - 1 + GAP < top
          for left, top, right, bottom in placed
      ):
        corners.append((x, y))
        placed.append((x, y, x + side - 1, y + side - 1))
        break
    else:
      return None
  return corners


def render_scene(
    variant: Variant, rng: np.random.Generator, *, size: int = IMAGE_SIZE
) -> Scene:
  """Draws one scene of ``variant``; everything comes from ``rng``.

  The draws, in order: which objects (`_choose_objects`), their sides and
  positions (redrawn together until they fit apart), the background level
  and noise, each object's colour jitter, the pixel noise.
  """
  colors, shapes, targets, question = _choose_objects(variant, rng)
  while True:
    sides = [int(s) for s in rng.integers(MIN_SIDE, MAX_SIDE + 1, len(shapes))]
    corners = _place(sides, rng, size)
    if corners is not None:
      break
  background = rng.uniform(0.0, 60.0)
  noise_scale = rng.uniform(0.0, 6.0)
  jitter = rng.integers(-COLOR_JITTER, COLOR_JITTER + 1, (len(shapes), 3))
  noise = rng.normal(0.0, 1.0, (size, size, PIXEL_CHANNELS))
  image = np.full((size, size, PIXEL_CHANNELS), background)
  objects = []
  for color, shape, side, (x, y), shift in zip(
      colors, shapes, sides, corners, jitter
  ):
    mask, (x1, y1, x2, y2) = _shape_pixels(shape, side)
    window = image[y : y + side, x : x + side]
    window[mask] = np.asarray(COLORS[color]) + shift
    objects.append(SceneObject(color, shape, (x + x1, y + y1, x + x2, y + y2)))
  image = np.clip(np.round(image + noise * noise_scale), 0, 255)
  target_boxes = [objects[i].box for i in targets]
  if variant.multi:  # left to right
    order = sorted(range(len(targets)), key=lambda i: target_boxes[i])
    targets = tuple(targets[i] for i in order)
    target_boxes = [target_boxes[i] for i in order]
  return Scene(
      image=image.astype(np.uint8),
      question=question,
      answer=boxes_lib.format_boxes(target_boxes),
      objects=tuple(objects),
      targets=targets,
  )


def generate_scenes(
    variant: Variant, split: str, size: int, seed: int
) -> Iterator[Scene]:
  """Yields ``size`` scenes of ``split``, deterministic for ``seed``.

  Each split draws from its own NumPy stream (``SeedSequence(seed,
  spawn_key=(split,))``), so the test scenes do not depend on how many
  train scenes there are.
  """
  if split not in _SPLIT_STREAMS:
    raise ValueError(
        f"split must be one of {sorted(_SPLIT_STREAMS)}, got {split!r}."
    )
  rng = np.random.default_rng(
      np.random.SeedSequence(seed, spawn_key=(_SPLIT_STREAMS[split],))
  )
  start = time.monotonic()
  for index in range(size):
    yield render_scene(variant, rng)
    if (index + 1) % _LOG_EVERY == 0 or index + 1 == size:
      logging.info(
          "%s %s: %d/%d scenes (%.0f/s)",
          variant.name,
          split,
          index + 1,
          size,
          (index + 1) / max(time.monotonic() - start, 1e-9),
      )
