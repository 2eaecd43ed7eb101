"""The figures every experiment's report draws, from runs grouped by seed.

A report's runs are ``grouped``: ``{key: {seed: run}}``, a key being a
method or a variant. A panel is one `stats.Metric`, as the tables name it.
Colours are `labels.color`'s, so a method has one colour in every figure of
the project.
"""

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
import numpy as np

from experiments import labels
from experiments import stats
from train import plots


def save(fig, path, dpi=100) -> None:
  """Lays ``fig`` out, writes it to ``path`` and frees it."""
  fig.tight_layout()
  fig.savefig(path, dpi=dpi)
  plt.close(fig)


def panels_of(count, width, height, **options):
  """A figure of ``count`` panels side by side, each ``width`` x ``height``
  inches (``options`` for `plt.subplots`): the figure and its axes."""
  fig, axes = plt.subplots(1, count, figsize=(width * count, height), **options)
  return fig, np.atleast_1d(axes)


def better(higher) -> str:
  """'(higher is better)' or '(lower is better)'."""
  return f"({'higher' if higher else 'lower'} is better)"


def seed_bars(grouped, keys, panels, path, title, key_label, rotation=15):
  """One panel a metric: a bar a key at its mean over seeds (± sd), a dot a
  seed. Keys without runs are left out."""
  keys = [k for k in keys if grouped.get(k)]
  ticks = [key_label(k) for k in keys]
  fig, axes = panels_of(len(panels), 4.6, 3.8)
  for ax, (metric, name, scale, _, higher) in zip(axes, panels):
    for i, key in enumerate(keys):
      runs = [grouped[key][s] for s in sorted(grouped[key])]
      values = [scale * stats.value(r, metric) for r in runs]
      plots.seed_bar(ax, i, values, labels.color(key))
    ax.set_xticks(range(len(keys)), ticks, rotation=rotation, fontsize=8)
    ax.set_title(f"{name} {better(higher)}", fontsize=9)
    ax.grid(axis="y", alpha=0.3)
  fig.suptitle(f"{title}: mean ± sd over seeds (dots: seeds)")
  save(fig, path)


def mean_curves(
    grouped, keys, panels, path, key_label, mark_step=None, log_scale=()
):
  """One panel a metric: each key's learning curve, the mean over its
  seeds; a dotted line at ``mark_step``, a log axis for ``log_scale``."""
  fig, axes = panels_of(len(panels), 4.4, 3.7)
  for key in (k for k in keys if grouped.get(k)):
    runs = list(grouped[key].values())
    steps = runs[0]["curves"]["eval_steps"]
    style = dict(marker="o", label=key_label(key), color=labels.color(key))
    for ax, (metric, _, scale, *_) in zip(axes, panels):
      values = np.mean([r["curves"][metric] for r in runs], axis=0)
      ax.plot(steps, scale * values, **style)
  for ax, (metric, name, *_, higher) in zip(axes, panels):
    if mark_step:
      ax.axvline(mark_step, color="k", lw=0.8, ls=":")
    if metric in log_scale:
      ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("mean over seeds", fontsize=8)
    ax.set_title(f"test {name} {better(higher)}", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
  save(fig, path)


def paired_dots(
    grouped, keys, panels, path, title, key_label, methods, reference="ce"
):
  """Paired differences to ``reference``, a row a key with one on the first
  panel: a dot at the mean over common seeds, its bar their sd; methods
  blue, variants orange. Whether the figure was written."""
  base = grouped.get(reference, {})
  rows = []
  for key in (k for k in keys if k != reference and k in grouped):
    diffs = [stats.paired_in(grouped[key], base, m) for m in panels]
    if diffs[0] is not None:
      rows.append((key, diffs))
  if not rows:
    return False
  height = 0.45 * len(rows) + 1.4
  fig, axes = panels_of(len(panels), 5.5, height, sharey=True)
  for index, (ax, panel) in enumerate(zip(axes, panels)):
    for y, (key, diffs) in enumerate(rows):
      d = diffs[index]
      if d is None:
        continue
      std, color = np.nan_to_num(d["std"]), "C0" if key in methods else "C1"
      ax.errorbar(d["mean"], y, xerr=std, fmt="o", capsize=3, color=color)
    ax.axvline(0, color="k", lw=0.8)
    ax.set_title(f"Δ {panel.name} vs CE {better(panel.higher)}", fontsize=9)
    ax.grid(axis="x", alpha=0.3)
  axes[0].set_yticks(range(len(rows)), [key_label(k) for k, _ in rows])
  axes[0].invert_yaxis()
  fig.suptitle(
      f"{title}, paired by seed: mean ± sd of (run - CE on the same seed)",
      fontsize=10,
  )
  save(fig, path)
  return True


def finish(ax, xlabel, ylabel=None, empty="not run yet", fontsize=7) -> None:
  """A panel of lines: its axis labels, grid and legend (``empty`` written
  on it where no line has a label)."""
  ax.set_xlabel(xlabel)
  if ylabel:
    ax.set_ylabel(ylabel)
  ax.grid(alpha=0.3)
  if ax.get_legend_handles_labels()[0]:
    ax.legend(fontsize=fontsize)
  else:
    ax.text(0.5, 0.5, empty, transform=ax.transAxes, ha="center")
