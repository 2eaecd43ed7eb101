"""Runs paired by seed: means, paired differences, t-tests.

The arithmetic every experiment's report shares, and `Metric`, how a report
names what it compares.
"""

import collections
from typing import Any, NamedTuple

import numpy as np
from scipy import stats


class Metric(NamedTuple):
  """One compared quantity of a run: ``field``, a key of its record (and
  curves) or a function of it (`value`); its ``name`` in tables and
  figures, the ``scale`` of its values (100: a share in points), the
  ``digits`` shown, and whether ``higher`` is better."""

  field: Any
  name: str
  scale: float = 100
  digits: int = 1
  higher: bool = True


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


def group_runs(runs, key=None, view=None):
  """{key(run): {seed: view(run)}}, a later run of a seed replacing one
  before it; ``key`` None leaves a run out (default: `main_key`), ``view``
  defaults to the record."""
  grouped = collections.defaultdict(dict)
  for run in runs:
    k = key(run) if key else main_key(run)
    if k is not None:
      grouped[k][run["seed"]] = view(run) if view else run
  return grouped


def main_key(run):
  """The method of a main-grid run (variant ``main`` or ``converged``),
  else the run's variant less ``_converged`` (both budgets share keys)."""
  if run["variant"] in ("main", "converged"):
    return run["method"]
  return run["variant"].removesuffix("_converged")


def value(run, metric):
  """A recorded metric (a key) or one derived from the run (a function);
  NaN where it was recorded as None (a median of no example scored)."""
  got = metric(run) if callable(metric) else run[metric]
  return float("nan") if got is None else got


def at_step(run, metric, step=None) -> float:
  """``metric`` of ``run``'s learning curve at eval ``step`` (NaN if none;
  None: its last)."""
  curves = run["curves"]
  if step is None:
    return float(curves[metric][-1])
  if step in curves["eval_steps"]:
    return float(curves[metric][curves["eval_steps"].index(step)])
  return float("nan")


def curve_area(run, metric="exact_match"):
  """Mean ``metric`` over training: the area under its learning curve
  (trapezoids, from 0 at step 0) divided by the number of steps."""
  steps = np.array([0] + list(run["curves"]["eval_steps"]), float)
  values = np.array([0.0] + list(run["curves"][metric]))
  area = np.sum(np.diff(steps) * (values[1:] + values[:-1]) / 2)
  return float(area / steps[-1])


def p_value(p, coarse=False) -> str:
  """``< 0.001``, ``0.003``, ``0.048`` or ``0.420`` (``coarse``: ``0.42``,
  two decimals from 0.1 up): three decimals below 0.1, so that the side of
  0.05 shows, and more where rounding would carry a p onto 0.05 or 0.1
  from below (0.0496, not 0.050; 0.04996, not 0.0500)."""
  if p < 0.001:
    return "< 0.001"
  text = f"{p:.2f}" if coarse and p >= 0.1 else f"{p:.3f}"
  decimals = 4
  while decimals <= 9 and any(
      (p < line) != (float(text) < line) for line in (0.05, 0.1)
  ):
    text = f"{p:.{decimals}f}"
    decimals += 1
  return text


def p_equals(p, coarse=False) -> str:
  """``p < 0.001`` or ``p = `` and `p_value`."""
  text = p_value(p, coarse)
  return f"p {text}" if text.startswith("<") else f"p = {text}"


def paired(runs, reference, metric, scale=100, higher_better=True):
  """Paired difference of ``runs`` to ``reference`` ({seed: run}) in
  ``metric`` (`value`; a `Metric`: its field, scale and direction) times
  ``scale``, or None without a seed where both are finite: dict(n, mean,
  std, better, worse, t, p), the seeds, mean and sd of the differences, the
  seeds where ``runs`` is better and where it is worse (beyond float
  rounding: a level seed is neither), and a two-sided paired t-test (t and
  p nan with one seed). Where every seed's difference is the same there is
  no spread for a t-test: t is nan and p the exact two-sided sign test's (1
  where the differences are all 0). A mean that is 0 but for float rounding
  is 0."""
  if isinstance(metric, Metric):
    metric, scale, higher_better = metric.field, metric.scale, metric.higher
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
  # Differences equal but for rounding (one problem out of 1,000 on every
  # seed: 0.4 - 0.3 and 0.5 - 0.4 in float) have no spread to test against:
  # t would be 1e16 and p 0.
  rounding = 1e-9 * max(np.abs(ours).max(), np.abs(theirs).max(), 1e-300)
  # A seed is better or worse only beyond rounding; a level seed is neither.
  ahead = int(np.sum(diffs > rounding))
  behind = int(np.sum(diffs < -rounding))
  better, worse = (ahead, behind) if higher_better else (behind, ahead)
  mean, std = mean_std(diffs)
  if abs(mean) <= rounding:  # 0.3 - 0.5 + 0.2 is -2.8e-17, not "worse"
    mean = 0.0
  t = p = float("nan")
  if len(seeds) > 1 and np.ptp(diffs) > rounding:
    result = stats.ttest_rel(ours, theirs)
    t, p = float(result.statistic), float(result.pvalue)
    t = 0.0 if mean == 0 else t
  elif len(seeds) > 1:  # every seed on one side (or all level)
    p = 1.0 if mean == 0 else min(1.0, 2 * 0.5 ** len(seeds))
  return dict(
      n=len(seeds), mean=mean, std=std, better=better, worse=worse, t=t, p=p
  )
