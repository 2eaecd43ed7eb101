"""Boxes as text, and how predicted boxes are scored (IoU, F1 at IoU 0.5).

A box is ``(x1, y1, x2, y2)`` in inclusive integer pixel coordinates: it
covers the pixel columns ``x1..x2`` and rows ``y1..y2``, so its area is
``(x2 - x1 + 1) * (y2 - y1 + 1)``; a box with ``x2 < x1`` or ``y2 < y1`` is
empty (area 0). As text a box is four two-digit numbers, ``'03,17,25,40'``,
and several boxes are ``;``-separated.

Scores are sums over examples (hosts add them) turned into rates by
`summarize_single` / `summarize_multi`:

* one box per answer: ``acc_at_50`` (share of boxes with IoU >= 0.5, the
  NTIL paper's Acc@0.5), ``acc_at_75``, ``mean_iou``, ``exact_match`` (all
  four numbers), ``coordinate_accuracy`` (share of the numbers exactly
  right), ``mean_coordinate_error`` (mean absolute error of the four numbers,
  pixels) and ``parsed_rate``. An answer that is not a box within the image
  has IoU 0, is wrong everywhere and counts as an error of the image's side in
  pixels per coordinate (more than any box in the image can be off);
* several boxes per answer: each predicted box is matched to at most one
  true box with IoU >= 0.5 (a maximum matching); ``precision_at_50`` is the
  share of predicted boxes matched, ``recall_at_50`` the share of true boxes
  matched, ``f1_at_50`` their harmonic mean, all pooled over the test set.
  A ``;``-separated part that is not a box counts as a predicted box that
  matches nothing. ``exact_match`` is the whole list right, in order.
"""

from collections.abc import Sequence
import re

import numpy as np

Box = tuple[int, int, int, int]
BOX_TEXT_LEN = 11  # '03,17,25,40'
SEPARATOR = ";"
# ASCII digits only: without re.ASCII, \d reads "１０" and "١٠" as 10.
_BOX_PATTERN = re.compile(
    r"^(\d{1,2}),(\d{1,2}),(\d{1,2}),(\d{1,2})$", re.ASCII
)


def format_box(box: Sequence[int]) -> str:
  """``(3, 17, 25, 40)`` -> ``'03,17,25,40'``."""
  if len(box) != 4 or not all(0 <= int(v) <= 99 for v in box):
    raise ValueError(f"a box is four integers in 0..99, got {box!r}.")
  return ",".join(f"{int(v):02d}" for v in box)


def format_boxes(boxes: Sequence[Sequence[int]]) -> str:
  """Boxes as text, ``;``-separated, in the order given."""
  return SEPARATOR.join(format_box(box) for box in boxes)


def parse_box(text: str, size: int) -> Box | None:
  """The box of ``'x1,y1,x2,y2'``, or None unless each is in 0..size-1.

  One- or two-digit numbers are read; surrounding spaces are ignored.
  """
  match = _BOX_PATTERN.match(text.strip())
  if not match:
    return None
  box = tuple(int(v) for v in match.groups())
  if max(box) >= size:
    return None
  return box


def parse_boxes(text: str, size: int) -> list[Box | None]:
  """Each ``;``-separated part of ``text`` parsed (None where it is not a box).

  An empty text has no boxes: ``[]``.
  """
  if not text.strip():
    return []
  return [parse_box(part, size) for part in text.split(SEPARATOR)]


def area(box: Sequence[int]) -> int:
  """Pixels in an inclusive box (0 if it is empty)."""
  x1, y1, x2, y2 = box
  return max(0, x2 - x1 + 1) * max(0, y2 - y1 + 1)


def iou(a: Sequence[int], b: Sequence[int]) -> float:
  """Intersection over union of two inclusive pixel boxes (0 if both empty)."""
  overlap = area(
      (max(a[0], b[0]), max(a[1], b[1]), min(a[2], b[2]), min(a[3], b[3]))
  )
  union = area(a) + area(b) - overlap
  return overlap / union if union else 0.0


def count_matches(
    predicted: Sequence[Box | None],
    truth: Sequence[Box],
    threshold: float = 0.5,
) -> int:
  """Size of a maximum one-to-one matching with IoU >= ``threshold``.

  Kuhn's augmenting paths over the (few) boxes; None predictions match
  nothing.
  """
  pairs = [
      [
          t
          for t, true_box in enumerate(truth)
          if box is not None and iou(box, true_box) >= threshold
      ]
      for box in predicted
  ]
  owner = [-1] * len(truth)  # owner[t]: the prediction matched to truth t

  def augment(p, seen):
    for t in pairs[p]:
      if t not in seen:
        seen.add(t)
        if owner[t] < 0 or augment(owner[t], seen):
          owner[t] = p
          return True
    return False

  return sum(augment(p, set()) for p in range(len(predicted)))


# ----------------------------------------------------------------------------
# One box per answer.


def score_single(
    predictions: Sequence[str], answers: Sequence[str], size: int
) -> dict:
  """Sums over examples whose answer is one box (see the module docstring)."""
  sums = dict(
      count=0.0,
      parsed=0.0,
      hit_50=0.0,
      hit_75=0.0,
      iou=0.0,
      exact=0.0,
      coordinates_right=0.0,
      coordinate_error=0.0,
  )
  for predicted, answer in zip(predictions, answers, strict=True):
    truth = parse_box(answer, size)
    if truth is None:
      raise ValueError(f"reference answer {answer!r} is not a box.")
    guess = parse_box(predicted, size)
    sums["count"] += 1
    if guess is None:
      sums["coordinate_error"] += size
      continue
    overlap = iou(guess, truth)
    errors = np.abs(np.subtract(guess, truth))
    sums["parsed"] += 1
    sums["hit_50"] += overlap >= 0.5
    sums["hit_75"] += overlap >= 0.75
    sums["iou"] += overlap
    sums["exact"] += guess == truth
    sums["coordinates_right"] += float(np.mean(errors == 0))
    sums["coordinate_error"] += float(np.mean(errors))
  return sums


def summarize_single(sums: dict) -> dict:
  """Rates from (all hosts') `score_single` sums."""
  count = max(sums["count"], 1.0)
  return dict(
      acc_at_50=float(sums["hit_50"] / count),
      acc_at_75=float(sums["hit_75"] / count),
      mean_iou=float(sums["iou"] / count),
      exact_match=float(sums["exact"] / count),
      coordinate_accuracy=float(sums["coordinates_right"] / count),
      mean_coordinate_error=float(sums["coordinate_error"] / count),
      parsed_rate=float(sums["parsed"] / count),
      num_examples=int(sums["count"]),
  )


# ----------------------------------------------------------------------------
# Several boxes per answer.


def score_multi(
    predictions: Sequence[str], answers: Sequence[str], size: int
) -> dict:
  """Sums over examples whose answer lists boxes (see the module docstring)."""
  sums = dict(
      count=0.0,
      parsed=0.0,
      exact=0.0,
      right_count=0.0,
      true_boxes=0.0,
      predicted_boxes=0.0,
      matched=0.0,
  )
  for predicted, answer in zip(predictions, answers, strict=True):
    truth = parse_boxes(answer, size)
    if not truth or None in truth:
      raise ValueError(f"reference answer {answer!r} is not a box list.")
    guesses = parse_boxes(predicted, size)
    sums["count"] += 1
    sums["parsed"] += bool(guesses) and None not in guesses
    sums["exact"] += guesses == truth
    sums["right_count"] += len(guesses) == len(truth)
    sums["true_boxes"] += len(truth)
    sums["predicted_boxes"] += len(guesses)
    sums["matched"] += count_matches(guesses, truth)
  return sums


def summarize_multi(sums: dict) -> dict:
  """Rates from (all hosts') `score_multi` sums; F1 pooled over boxes."""
  count = max(sums["count"], 1.0)
  precision = sums["matched"] / max(sums["predicted_boxes"], 1.0)
  recall = sums["matched"] / max(sums["true_boxes"], 1.0)
  f1 = 2 * precision * recall / (precision + recall) if sums["matched"] else 0
  return dict(
      f1_at_50=float(f1),
      precision_at_50=float(precision),
      recall_at_50=float(recall),
      exact_match=float(sums["exact"] / count),
      count_accuracy=float(sums["right_count"] / count),
      parsed_rate=float(sums["parsed"] / count),
      num_examples=int(sums["count"]),
  )
