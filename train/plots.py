"""Plots from metrics.jsonl files (matplotlib, no display needed)."""

import json

import numpy as np


def pyplot():
  """matplotlib.pyplot on the Agg backend, imported on first use: the grids
  and the trainer read metrics through this module without paying pyplot's
  import (about a second) in every process."""
  import matplotlib  # pylint: disable=g-import-not-at-top

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  return plt


def read_metrics(path):
  """(train records, eval records) of a metrics.jsonl file."""
  with open(path) as f:
    records = [json.loads(line) for line in f]
  return (
      [r for r in records if "loss" in r],
      [r for r in records if "exact_match" in r],
  )


def smooth(values, window):
  """Trailing moving average (window clipped at the start)."""
  values = np.asarray(values, float)
  cumulative = np.cumsum(np.insert(values, 0, 0.0))
  starts = np.maximum(np.arange(1, len(values) + 1) - window, 0)
  return (cumulative[1:] - cumulative[starts]) / (
      np.arange(1, len(values) + 1) - starts
  )


def seed_bar(ax, position, values, color):
  """A bar at the mean of ``values`` (error bar: their sample sd) with one
  black dot per value (a seed's run)."""
  values = np.asarray(values, float)
  std = values.std(ddof=1) if len(values) > 1 else 0.0
  ax.bar(position, values.mean(), yerr=std, capsize=4, alpha=0.6, color=color)
  ax.scatter([position] * len(values), values, color="k", s=12, zorder=3)


def plot_training(metrics_path, out_path, title=""):
  """Loss, CE and exact match over steps of one run, saved as a PNG."""
  plt = pyplot()
  train, evals = read_metrics(metrics_path)
  steps = [r["step"] for r in train]
  window = max(1, len(steps) // 25)
  fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.6))
  for key, label in (("loss", "total loss"), ("ce", "cross-entropy")):
    left.plot(steps, smooth([r[key] for r in train], window), label=label)
  left.set_xlabel("step")
  left.set_ylabel(f"per answer token (moving avg, {window} logs)")
  left.legend()
  left.grid(alpha=0.3)
  if evals:
    right.plot(
        [r["step"] for r in evals],
        [100 * r["exact_match"] for r in evals],
        marker="o",
    )
  right.set_xlabel("step")
  right.set_ylabel("exact match on test (%)")
  right.grid(alpha=0.3)
  fig.suptitle(title)
  fig.tight_layout()
  fig.savefig(out_path, dpi=110)
  plt.close(fig)
  return out_path


def _show_clock(axis, image):
  axis.imshow(np.asarray(image), cmap="gray", vmin=0, vmax=255)
  axis.set_xticks([])
  axis.set_yticks([])


def plot_clock_grid(images, labels, out_path, columns=8):
  """A grid of clock images, each titled with its label; saved as a PNG."""
  plt = pyplot()
  rows = -(-len(images) // columns)
  fig, axes = plt.subplots(
      rows, columns, figsize=(1.3 * columns, 1.5 * rows), squeeze=False
  )
  for axis in axes.flat:
    axis.axis("off")
  for axis, image, label in zip(axes.flat, images, labels):
    axis.axis("on")
    _show_clock(axis, image)
    axis.set_title(label, fontsize=9)
  fig.tight_layout()
  fig.savefig(out_path, dpi=90)
  plt.close(fig)
  return out_path


def plot_clock_predictions(
    images, answers, predictions, out_path, *, columns=6, title=""
):
  """Test clocks with several methods' predictions under each.

  Args:
    images: [N] clock images.
    answers: [N] true labels.
    predictions: {method label: [N] predicted labels}; a wrong one is shown
      in red with an ``x``, a right one in green.
    out_path: the PNG to write.
    columns: clocks per row.
    title: the figure's title.
  """
  plt = pyplot()
  rows = -(-len(images) // columns)
  height = 1.45 + 0.22 * len(predictions)
  fig, axes = plt.subplots(
      rows, columns, figsize=(1.75 * columns, height * rows), squeeze=False
  )
  for axis in axes.flat:
    axis.axis("off")
  for n, (axis, image, answer) in enumerate(zip(axes.flat, images, answers)):
    axis.axis("on")
    _show_clock(axis, image)
    axis.set_title(f"true {answer}", fontsize=9)
    for k, (label, guesses) in enumerate(predictions.items()):
      right = guesses[n] == answer
      axis.text(
          0.5,
          -0.1 - 0.17 * k,
          f"{label}: {guesses[n] or '?'} {'' if right else 'x'}",
          transform=axis.transAxes,
          ha="center",
          va="top",
          fontsize=8,
          color="tab:green" if right else "tab:red",
      )
  if title:
    fig.suptitle(title)
  fig.tight_layout()
  fig.savefig(out_path, dpi=90)
  plt.close(fig)
  return out_path


# Edge colours of drawn boxes, in the order of the ``boxes`` dict; none is
# a colour of the grounding scenes' objects (red, green, blue, yellow).
BOX_COLORS = ("white", "magenta", "cyan", "orange")


def _draw_box(axis, box, color, linestyle):
  """An inclusive pixel box (x1, y1, x2, y2) around its pixels."""
  from matplotlib import patches  # pylint: disable=g-import-not-at-top

  x1, y1, x2, y2 = box
  axis.add_patch(
      patches.Rectangle(
          (x1 - 0.5, y1 - 0.5),
          x2 - x1 + 1,
          y2 - y1 + 1,
          fill=False,
          edgecolor=color,
          linestyle=linestyle,
          linewidth=1.2,
      )
  )


def plot_scene_grid(
    images, titles, boxes, out_path, *, columns=8, notes=None, title=""
):
  """RGB scenes, each titled, with boxes drawn on them; saved as a PNG.

  Args:
    images: [N] uint8 [S, S, 3] images.
    titles: [N] titles (the queries).
    boxes: {label: [N] lists of boxes (x1, y1, x2, y2), inclusive pixels,
      None for an unreadable one}; the first label's boxes are drawn solid,
      the others dashed, each in its colour of `BOX_COLORS` (legend below).
    out_path: the PNG to write.
    columns: scenes per row.
    notes: optional [N] lines of text under each scene.
    title: the figure's title.
  """
  plt = pyplot()
  rows = -(-len(images) // columns)
  height = 1.5 + (0.3 if notes else 0.0)
  fig, axes = plt.subplots(
      rows,
      columns,
      figsize=(1.5 * columns, height * rows + 0.4),
      squeeze=False,
  )
  for axis in axes.flat:
    axis.axis("off")
  for n, (axis, image) in enumerate(zip(axes.flat, images)):
    axis.imshow(np.asarray(image), interpolation="nearest")
    side = np.asarray(image).shape[0]  # a margin keeps edge boxes visible
    axis.set_xlim(-1.5, side + 0.5)
    axis.set_ylim(side + 0.5, -1.5)
    axis.set_xticks([])
    axis.set_yticks([])
    axis.set_title(titles[n], fontsize=8)
    for k, (label, per_image) in enumerate(boxes.items()):
      for box in per_image[n]:
        if box is not None:
          _draw_box(axis, box, BOX_COLORS[k], "-" if k == 0 else "--")
    if notes:
      axis.text(
          0.5,
          -0.06,
          notes[n],
          transform=axis.transAxes,
          ha="center",
          va="top",
          fontsize=6,
      )
  legend = ", ".join(
      f"{label}: {BOX_COLORS[k]}{'' if k == 0 else ' dashed'}"
      for k, label in enumerate(boxes)
  )
  fig.suptitle(f"{title}{' ' if title else ''}(boxes: {legend})", fontsize=9)
  fig.tight_layout()
  fig.savefig(out_path, dpi=90)
  plt.close(fig)
  return out_path
