"""The figures every experiment's report draws, from runs grouped by seed.

A report's runs are ``grouped``: ``{key: {seed: run}}``, a key being a
method or a variant. A panel is one `stats.Metric`, as the tables name it.
Colours are `labels.color`'s, so a method has one colour in every figure of
the project.
"""

import functools

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
import numpy as np

from experiments import labels
from experiments import stats
from train import plots

# Most lines a legend holds inside its panel; one of more goes below it,
# where it hides no line (a figure's eight losses covered a quarter of it).
LEGEND_INSIDE = 4


def save(fig, path, dpi=100) -> None:
  """Lays ``fig`` out, writes it to ``path`` and frees it (the canvas grown
  to take in legends below their panels: :func:`finish`)."""
  fig.tight_layout()
  legends = [ax.get_legend() for ax in fig.axes]
  below = [x for x in legends if x is not None and not x.get_in_layout()]
  for legend in below:  # left out of the layout, taken in by the canvas
    legend.set_in_layout(True)
  fig.savefig(path, dpi=dpi, bbox_inches="tight" if below else None)
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
  if len(keys) > 5:  # eight labels at 15 degrees overlapped
    rotation = max(rotation, 35)
  fig, axes = panels_of(len(panels), 4.6, 3.8)
  for ax, (metric, name, scale, _, higher) in zip(axes, panels):
    for i, key in enumerate(keys):
      runs = [grouped[key][s] for s in sorted(grouped[key])]
      values = [scale * stats.value(r, metric) for r in runs]
      plots.seed_bar(ax, i, values, labels.color(key))
    # Tilted labels end under their bar (anchored at their right end), so
    # that long neighbours do not overlap.
    ax.set_xticks(
        range(len(keys)),
        ticks,
        rotation=rotation,
        ha="right" if rotation else "center",
        rotation_mode="anchor",
        fontsize=8,
    )
    ax.set_title(f"{name} {better(higher)}", fontsize=9)
    ax.grid(axis="y", alpha=0.3)
  # Sized to fit over one panel (at 12 points it was cut at both ends).
  fig.suptitle(f"{title}: mean ± sd over seeds (dots: seeds)", fontsize=9)
  save(fig, path)


def line(key) -> dict:
  """How ``key``'s line looks where a figure says no other way."""
  return dict(color=labels.color(key))


def points(run, field) -> dict:
  """A run's curve: {eval step: value} of a learning curve's ``field``, or
  ``field(run)`` ({x: value}) where it is a function."""
  if callable(field):
    return field(run)
  return dict(zip(run["curves"]["eval_steps"], run["curves"][field]))


def curves(grouped, panels, path, label, style=line, start=(), **options):
  """Learning curves, the mean over seeds: a panel a ``(title, keys,
  metric)`` (a `stats.Metric`, its field's `points`), a line a key with
  runs (dots where it has 20 points at most), from the mean of ``start``
  (zero-shot scores) at step 0. ``options``: ``xlabel``, ``ylabel`` (of
  the first panel), ``mark_step`` (a dotted line), ``log_scale`` (fields)."""
  same = len({metric for *_, metric in panels}) == 1
  fig, axes = panels_of(len(panels), 5, 3.5, sharey=same)
  for ax, (title, keys, metric) in zip(axes, panels):
    for key in (k for k in keys if grouped.get(k)):
      each = [points(r, metric.field) for r in grouped[key].values()]
      xs = sorted(set().union(*each))
      ys = [np.nanmean([p.get(x, np.nan) for p in each]) for x in xs]
      xs, ys = ([0, *xs], [np.mean(start), *ys]) if start else (xs, ys)
      dots = dict(marker="o", ms=3) if len(xs) <= 20 else {}
      name = f"{label(key)} ({len(each)})"
      ax.plot(xs, metric.scale * np.array(ys), label=name, **dots, **style(key))
    if options.get("mark_step"):
      ax.axvline(options["mark_step"], color="k", lw=0.8, ls=":")
    if metric.field in options.get("log_scale", ()):
      ax.set_yscale("log")
    ax.set_title(title, fontsize=9)
    finish(ax, options.get("xlabel", "step"))
  axes[0].set_ylabel(options.get("ylabel", "mean over seeds"))
  save(fig, path, dpi=90)


def test_panels(keys, metrics):
  """`curves`' panels of ``keys``, one a metric, titled with its direction."""
  return [(f"test {m.name} {better(m.higher)}", keys, m) for m in metrics]


def paired_curves(panels, path, label, metric, title, style=line):
  """Paired differences to CE along the learning curve: a panel a
  ``(title, grouped, keys)``, a line a key, at each eval step the mean ±
  sd over seeds of (run - CE of the same seed) in ``metric`` (a
  `stats.Metric` of the curves), keys side by side; ``title`` above."""
  fig, axes = panels_of(len(panels), 5.5, 3.5)
  for ax, (heading, grouped, keys) in zip(axes, panels):
    reference = grouped.get("ce", {})
    keys = [k for k in keys if k != "ce" and k in grouped]
    steps = sorted(
        {s for r in reference.values() for s in r["curves"]["eval_steps"]}
    )
    for i, key in enumerate(keys):
      found = []
      for step in steps:
        read = functools.partial(stats.at_step, metric=metric.field, step=step)
        if d := stats.paired(grouped[key], reference, read, metric.scale, True):
          shifted = step + 6 * (i - len(keys) / 2)  # side by side
          found.append((shifted, d["mean"], np.nan_to_num(d["std"])))
      if found:
        xs, means, sds = zip(*found)
        n = len(set(grouped[key]) & set(reference))
        name = f"{label(key)} ({n} paired)"
        dots = dict(marker="o", ms=3, capsize=2)
        ax.errorbar(xs, means, yerr=sds, label=name, **dots, **style(key))
    ax.axhline(0, color="k", lw=0.8)
    ax.set_title(heading, fontsize=9)
    finish(ax, "step", empty="no seed paired with CE yet")
  axes[0].set_ylabel(f"Δ {metric.name} vs CE (points)")
  fig.suptitle(title, fontsize=9)
  save(fig, path, dpi=90)


def paired_dots(grouped, keys, panels, path, title, key_label, methods):
  """Paired differences to CE, a row a key with one on the first panel: a
  dot at the mean over common seeds, its bar their sd; methods blue,
  variants orange. Whether the figure was written."""
  base = grouped.get("ce", {})
  rows = []
  for key in (k for k in keys if k != "ce" and k in grouped):
    diffs = [stats.paired(grouped[key], base, m) for m in panels]
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


def finish(ax, xlabel, empty="not run yet") -> None:
  """A panel of lines: its x label, grid and legend (``empty`` written on
  it where no line has a label)."""
  ax.set_xlabel(xlabel)
  ax.grid(alpha=0.3)
  lines = len(ax.get_legend_handles_labels()[0])
  if 0 < lines <= LEGEND_INSIDE:
    ax.legend(fontsize=7)
  elif lines:
    legend = ax.legend(
        fontsize=7,
        ncol=2,
        loc="upper center",
        bbox_to_anchor=(0.5, -0.2),
        frameon=False,
    )
    legend.set_in_layout(False)  # the panel keeps its size
  else:
    ax.text(0.5, 0.5, empty, transform=ax.transAxes, ha="center")
