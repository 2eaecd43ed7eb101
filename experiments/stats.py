"""Runs paired by seed: means, paired differences, t-tests, markdown tables.

The arithmetic and the tables every experiment's report shares.
"""

import collections

import numpy as np
from scipy import stats


def mean_std(values):
  """Mean and sample standard deviation (nan for one value)."""
  values = np.asarray(values, float)
  return values.mean(), (
      values.std(ddof=1) if len(values) > 1 else float("nan")
  )


def fmt(values, digits):
  """``'mean ± sd'`` with ``digits`` decimals (one value: the value alone)."""
  mean, std = mean_std(values)
  if np.isnan(std):
    return f"{mean:.{digits}f}"
  return f"{mean:.{digits}f} ± {std:.{digits}f}"


def group_runs(runs, main_variant="main"):
  """{variant, or method for main runs: {seed: run}}."""
  grouped = collections.defaultdict(dict)
  for run in runs:
    key = run["method"] if run["variant"] == main_variant else run["variant"]
    grouped[key][run["seed"]] = run
  return grouped


def value(run, metric):
  """A recorded metric (a key) or one derived from the run (a function)."""
  return metric(run) if callable(metric) else run[metric]


def curve_area(run, metric="exact_match"):
  """Mean ``metric`` over training: the area under its learning curve
  (trapezoids, from 0 at step 0) divided by the number of steps."""
  steps = np.array([0] + list(run["curves"]["eval_steps"]), float)
  values = np.array([0.0] + list(run["curves"][metric]))
  area = np.sum(np.diff(steps) * (values[1:] + values[:-1]) / 2)
  return float(area / steps[-1])


def paired(runs, reference, metric, scale, higher_better):
  """Paired difference to ``reference`` on the seeds both have, or None.

  Args:
    runs: {seed: run record} of the runs compared.
    reference: {seed: run record} they are compared with.
    metric: the record field, or a function of the record.
    scale: multiplies the values (100 for percentages).
    higher_better: which sign of the difference counts as better.

  Returns:
    dict(n, mean, std, better, t, p): the number of common seeds where both
    values are finite, mean and sd of the differences, the seeds where
    ``runs`` is better, and a two-sided paired t-test (nan with one seed or
    identical differences). None without such seeds.
  """
  seeds = [
      s
      for s in sorted(set(runs) & set(reference))
      if np.isfinite(value(runs[s], metric))
      and np.isfinite(value(reference[s], metric))
  ]
  if not seeds:
    return None
  ours = np.array([scale * value(runs[s], metric) for s in seeds])
  theirs = np.array([scale * value(reference[s], metric) for s in seeds])
  diffs = ours - theirs
  better = int(np.sum(diffs > 0 if higher_better else diffs < 0))
  # Differences equal but for rounding (one problem out of 1,000 on every
  # seed: 0.4 - 0.3 and 0.5 - 0.4 in float) have no spread to test against:
  # t would be 1e16 and p 0.
  scale_of_values = max(np.abs(ours).max(), np.abs(theirs).max(), 1e-300)
  if len(seeds) > 1 and np.ptp(diffs) > 1e-9 * scale_of_values:
    result = stats.ttest_rel(ours, theirs)
    t, p = float(result.statistic), float(result.pvalue)
  else:
    t = p = float("nan")
  mean, std = mean_std(diffs)
  return dict(n=len(seeds), mean=mean, std=std, better=better, t=t, p=p)


def paired_cells(runs, reference, metric, scale, higher_better, digits):
  """Three table cells: ``Δ ± sd``, ``better/n`` and ``t (p = ...)``."""
  d = paired(runs, reference, metric, scale, higher_better)
  if d is None:
    return ["–"] * 3
  std = "" if np.isnan(d["std"]) else f" ± {d['std']:.{digits}f}"
  test = "–" if np.isnan(d["t"]) else f"{d['t']:+.2f} (p = {d['p']:.3f})"
  return [f"{d['mean']:+.{digits}f}{std}", f"{d['better']}/{d['n']}", test]


def reading(grouped, metrics, methods, labels):
  """Plain statements computed from the numbers (no adjectives chosen).

  Args:
    grouped: {method: {seed: run}}; ``'ce'`` is the reference.
    metrics: (field, name, scale, higher_better) per metric.
    methods: the methods in table order.
    labels: {method: its name in the text}.

  Returns:
    Markdown list lines: per metric, the ranking by mean over seeds, then
    each method's paired difference to CE with its verdict.
  """
  lines = []
  reference = grouped.get("ce", {})
  present = [m for m in methods if m in grouped]
  for metric, name, scale, higher in metrics:
    means = {
        m: scale * np.mean([r[metric] for r in grouped[m].values()])
        for m in present
    }
    ranked = sorted(present, key=lambda m: -means[m] if higher else means[m])
    lines.append(
        f"- Ranking by {name.split(' (')[0]} (mean over seeds, best first): "
        + ", ".join(f"{labels[m]} {means[m]:.2f}" for m in ranked)
        + "."
    )
    for method in present:
      if method == "ce":
        continue
      d = paired(grouped[method], reference, metric, scale, higher)
      if d is None or np.isnan(d["p"]):
        continue
      direction = "better" if (d["mean"] > 0) == higher else "worse"
      verdict = (
          f"{direction} than CE at p = {d['p']:.3f}"
          if d["p"] < 0.05
          else f"not distinguishable from CE (p = {d['p']:.2f})"
      )
      lines.append(
          f"  - {labels[method]}: {d['mean']:+.2f} on {name}, better on "
          f"{d['better']}/{d['n']} seeds: {verdict}."
      )
  return lines


def table(head, rows):
  """Markdown table lines from a header and rows of cells."""
  return [
      "| " + " | ".join(head) + " |",
      "|" + "---|" * len(head),
      *("| " + " | ".join(row) + " |" for row in rows),
  ]


def values_table(grouped, rows, columns, first="method"):
  """Mean ± sd over seeds of each row's runs in each column.

  Args:
    grouped: {key: {seed: run}}.
    rows: (key, label) pairs; keys not in ``grouped`` are left out.
    columns: (field, header, scale, digits, ...) per column.
    first: the header of the label column.

  Returns:
    Markdown table lines: label, number of seeds, then ``mean ± sd``.
  """
  body = []
  for key, label in rows:
    if key not in grouped:
      continue
    runs = list(grouped[key].values())
    body.append(
        [label, str(len(runs))]
        + [
            fmt([scale * r[field] for r in runs], digits)
            for field, _, scale, digits, *_ in columns
        ]
    )
  head = [first, "seeds"] + [header for _, header, *_ in columns]
  return table(head, body)


def paired_table(grouped, rows, reference_key, metrics):
  """Each row's runs against ``grouped[reference_key]``, seed by seed.

  Args:
    grouped: {key: {seed: run}}.
    rows: (key, label) pairs; keys not in ``grouped``, and the reference,
      are left out.
    reference_key: the runs compared with.
    metrics: (field, name, scale, higher_better) per metric; differences
      with 2 decimals where ``scale`` is 1, else 1.

  Returns:
    Markdown table lines: per metric ``Δ ± sd``, seeds better and the
    paired t-test (:func:`paired_cells`).
  """
  head = ["", "seeds"]
  for _, name, _, _ in metrics:
    head += [f"Δ {name}", "seeds better", "paired t"]
  reference = grouped.get(reference_key, {})
  body = []
  for key, label in rows:
    if key not in grouped or key == reference_key:
      continue
    runs = grouped[key]
    cells = [label, str(len(set(runs) & set(reference)))]
    for field, _, scale, higher in metrics:
      cells += paired_cells(
          runs, reference, field, scale, higher, 2 if scale == 1 else 1
      )
    body.append(cells)
  return table(head, body)
