"""Markdown tables of runs grouped by seed, and the statements they support.

``grouped`` is ``{key: {seed: run}}``, a key being a method or a variant;
columns are `stats.Metric`s, rows ``(key, label)`` pairs.
"""

import numpy as np

from experiments import prose
from experiments import stats


def table(head, rows):
  """Markdown table lines from a header and rows of cells."""
  return [row(head), "|" + "---|" * len(head), *map(row, rows)]


def row(cells) -> str:
  """A Markdown table's line of ``cells``."""
  return "| " + " | ".join(cells) + " |"


def paired_cells(runs, reference, metric, short=False):
  """Three table cells of a `stats.Metric`: ``Δ ± sd``, ``better/n`` and
  ``t (p = ...)`` (``short``: ``p``, and '-' below two paired seeds);
  ``sign (p = ...)`` (``short``: ``sign p``) where the seeds' differences
  have no spread and the p is the sign test's."""
  d, digits = stats.paired(runs, reference, metric), metric.digits
  none = "-" if short else "–"
  if d is None or (short and d["n"] < 2):
    return [none] * 3
  std = "" if np.isnan(d["std"]) else f" ± {d['std']:.{digits}f}"
  statistic = "sign" if np.isnan(d["t"]) else f"{d['t']:+.2f}"
  if np.isnan(d["p"]):
    test = none
  elif short:
    test = stats.p_value(d["p"])
    test = f"sign {test}" if statistic == "sign" else test
  else:
    test = f"{statistic} ({stats.p_equals(d['p'])})"
  return [f"{d['mean']:+.{digits}f}{std}", f"{d['better']}/{d['n']}", test]


def reading(grouped, metrics, methods, labels):
  """Markdown list lines computed from the numbers: per metric, the
  ranking of ``methods`` by mean over seeds, then each one's paired
  difference to CE and its `verdict` (``labels``: their names)."""
  lines = []
  reference = grouped.get("ce", {})
  present = [m for m in methods if m in grouped]
  for metric, name, scale, digits, higher in metrics:
    # Over each method's finite seeds, as the tables' cells are (a seed
    # recorded as None or NaN left out, not a NaN mean ranked anywhere).
    means = {}
    for m in present:
      finite, _ = finite_values(grouped[m].values(), metric)
      if finite:
        means[m] = scale * np.mean(finite)
    ranked = sorted(means, key=lambda m: -means[m] if higher else means[m])
    ranking = ", ".join(f"{labels[m]} {means[m]:.{digits}f}" for m in ranked)
    short = name.split(" (")[0]
    lines += prose.section(__file__, "ranking", name=short, ranking=ranking)
    for method in (m for m in present if m != "ce"):
      d = stats.paired(grouped[method], reference, metric, scale, higher)
      if d is not None and not np.isnan(d["p"]):
        text = verdict(d, higher, "_vs_ce")
        mean = f"{d['mean']:+.{digits}f}"
        said = dict(d, label=labels[method], name=name, verdict=text, mean=mean)
        lines += prose.section(__file__, "versus_ce", **said)
  return lines


def last_gain(runs, metric, who) -> str:
  """``who`` changed by how much over its last eval interval, the range
  over ``runs`` ({seed: run}, a share in ``metric``); "" with one eval."""
  curves = [run["curves"].get(metric, []) for run in runs.values()]
  gains = [100 * (c[-1] - c[-2]) for c in curves if len(c) > 1]
  if not gains:
    return ""
  steps = next(iter(runs.values()))["curves"]["eval_steps"]
  return (
      f"{who} changed by {min(gains):+.1f} to {max(gains):+.1f} points (mean "
      f"{np.mean(gains):+.1f}, {prose.count(len(gains), 'seed')}) over its "
      f"last {steps[-1] - steps[-2]:,} steps ({steps[-2]:,} -> {steps[-1]:,})."
  )


def ce_budget(runs, metric, name) -> str:
  """Where CE's ``runs`` ({seed: run}) ended in ``metric`` (a share, called
  ``name``): seed by seed, the mean, and its `last_gain`."""
  if not runs:
    return "CE has no runs yet."
  values = ", ".join(
      f"{100 * runs[s][metric]:.1f}% (seed {s})" for s in sorted(runs)
  )
  mean = 100 * np.mean([r[metric] for r in runs.values()])
  gain = last_gain(runs, metric, "It")
  return f"CE's test {name}: {values}; mean {mean:.1f}%. {gain}".strip()


def shares_table(grouped, rows, head, shares, percent_last=False):
  """A row per ``(key, label)`` recorded: ``shares(run)``, fractions of a
  run's test examples, in % and mean over seeds (the last as ``NN%`` with
  ``percent_last``)."""
  body = []
  for key, label in rows:
    if key in grouped:
      means = np.mean([shares(r) for r in grouped[key].values()], axis=0)
      cells = [f"{100 * x:.1f}" for x in means]
      if percent_last:
        cells[-1] = f"{100 * means[-1]:.0f}%"
      body.append([label] + cells)
  return table(head, body)


def kind(d) -> str:
  """How a paired difference (`stats.paired`) stands: ``untestable`` (one
  seed), ``unanimous`` (p < 0.05 and every seed on the mean's side; a level
  seed is on neither), ``significant`` (p < 0.05) or ``noise``."""
  if d["n"] < 2:
    return "untestable"
  if d["p"] < 0.05:
    worse = d.get("worse", d["n"] - d["better"])
    return "unanimous" if d["n"] in (d["better"], worse) else "significant"
  return "noise"


def direction(d, higher=True) -> str:
  """Whether a paired difference is ``better``, ``worse`` or ``level``."""
  if d["mean"] == 0:
    return "level"
  return "better" if (d["mean"] > 0) == higher else "worse"


def beats(d, higher=True) -> bool:
  """Better beyond seed noise: p < 0.05 and better on every seed."""
  unanimous = d is not None and kind(d) == "unanimous"
  return unanimous and direction(d, higher) == "better"


def verdict(d, higher=True, style="") -> str:
  """A paired difference in words: `tables.md`'s section
  ``verdict{style}_{kind}`` with its `direction`."""
  p_text = "p = -" if np.isnan(d["p"]) else stats.p_equals(d["p"])
  said = dict(direction=direction(d, higher), p_text=p_text)
  return prose.text(__file__, f"verdict{style}_{kind(d)}", **said)


def values_table(
    grouped,
    rows,
    columns,
    first="method",
    missing="–",
    listed=False,
    totals=(),
    versus=False,
):
  """Mean ± sd over seeds of each row's runs (those in ``grouped``) in
  each column (``missing`` where none is finite), after the label (``first``
  heads it) and the seeds (``listed``: which); with ``versus``, each
  column's `paired_cells` to CE (blank on CE's own row); then the sums over
  seeds of the columns ``totals``."""
  head, body = [first, "seeds"], []
  for column in columns:
    head += [column.name] + ["Δ to CE", "seeds better", "paired t"] * versus
  for key, label in rows:
    if key not in grouped:
      continue
    runs = grouped[key]
    seeds = ",".join(map(str, sorted(runs)))
    cells = [label, f"{len(runs)} ({seeds})" if listed else str(len(runs))]
    for column in columns:
      cells.append(fmt_metric(runs.values(), column, missing))
      if versus:
        own = key == "ce"
        cells += [""] * 3 if own else paired_cells(runs, grouped["ce"], column)
    for total in totals:
      value = sum(stats.value(r, total.field) for r in runs.values())
      cells.append(f"{total.scale * value:.{total.digits}f}")
    body.append(cells)
  return table(head + [t.name for t in totals], body)


def fmt_metric(runs, metric, missing="–"):
  """``mean ± sd`` of a `stats.Metric` over the finite values of ``runs`` (a
  list), ``missing`` without one; ``(k of n)`` after it where only k of the
  n runs have one (a seed that never reached a threshold)."""
  finite, total = finite_values(runs, metric.field, metric.scale)
  if not finite:
    return missing
  text = stats.fmt(finite, metric.digits)
  if len(finite) < total:
    text += f" ({len(finite)} of {total})"
  return text


def finite_values(runs, field, scale=1.0):
  """``scale`` times ``field`` of each of ``runs``, the finite ones only (a
  seed recorded as None or NaN left out), and how many runs there were.

  >>> finite_values([{"a": 0.5}, {"a": None}, {"a": float("nan")}], "a", 100)
  ([50.0], 3)
  """
  values = [scale * stats.value(r, field) for r in runs]
  return [v for v in values if np.isfinite(v)], len(values)


def delta(d, digits=2, p=None) -> str:
  """A paired difference (`stats.paired`) in one cell: ``Δ (better/n)``,
  and ``, p(d["p"])`` inside where ``p`` (a function) says the test's p."""
  tested = "" if p is None or np.isnan(d["p"]) else ", " + p(d["p"])
  return f"{d['mean']:+.{digits}f} ({d['better']}/{d['n']}{tested})"


def _paired_seeds(runs, reference, metrics) -> int:
  """The seeds of both ``runs`` and ``reference`` where some metric is
  finite in both (those `stats.paired` can pair)."""

  def finite(run, metric):
    return np.isfinite(stats.value(run, metric.field))

  return sum(
      any(finite(runs[s], m) and finite(reference[s], m) for m in metrics)
      for s in set(runs) & set(reference)
  )


def paired_table(grouped, rows, reference_key, metrics, short=False):
  """Each row's runs (but the reference's) against
  ``grouped[reference_key]`` (a row ``(key, label, reference_key)``: its
  own), seed by seed: `paired_cells` per metric; ``short``, the rows with a
  paired seed in short cells and no seeds column (none: a sentence)."""
  head = ["comparison"] if short else ["", "seeds"]
  tests = ("better", "p") if short else ("seeds better", "paired t")
  for metric in metrics:
    head += [f"Δ {metric.name}", *tests]
  body = []
  for key, label, *own in rows:
    ref = own[0] if own else reference_key
    runs, reference = grouped.get(key), grouped.get(ref, {})
    paired = _paired_seeds(runs or {}, reference, metrics)
    if key not in grouped or key == ref or short and not paired:
      continue
    cells = [label] + [str(paired)] * (not short)
    for metric in metrics:
      cells += paired_cells(runs, reference, metric, short)
    body.append(cells)
  return table(head, body) if body or not short else ["No seed paired yet."]
