"""Fixed training set vs stream, side by side: tables and plots for reports.

A fixed-set run trains on a prepared split seen many times; a streamed run
(``train_stream``) on examples rendered as read, each seen once. The same
model, steps, batch and seeds in both regimes, so for every loss the table
shows both regimes' value mid-way through the budget (the learning curve's
middle, where a faster learner leads) and at its end (the trained model),
each with its paired difference to CE of the same regime and seed.

Pure functions of the records: ``groupings`` is ``{regime: {key: {seed:
run}}}`` with ``regime`` in `REGIMES`; ``key`` a loss method or a control's
name, ``"ce"`` the reference.
"""

import collections
import functools
import os

from configs import common as config_common
from experiments import figures
from experiments import labels
from experiments import prose
from experiments import report_engine
from experiments import stats
from experiments import tables

REGIMES = ("fixed", "stream")
REGIME_LABELS = dict(fixed="fixed set", stream="stream (each seen once)")


def common_eval_steps(groupings) -> list[int]:
  """The eval steps that every run of every regime has, in order."""
  steps = [
      set(run["curves"]["eval_steps"])
      for grouped in groupings.values()
      for runs in grouped.values()
      for run in runs.values()
  ]
  return sorted(set.intersection(*steps) if steps else ())


def mid_eval_step(groupings) -> int | None:
  """The common eval step nearest half the budget, before the last one.

  The first eval is often at the floor for every loss (clocks: about 0% at
  step 150 of 600), so the "mid-curve" column reads the curve where it
  rises. With one common step, that step.
  """
  steps = common_eval_steps(groupings)
  if not steps:
    return None
  candidates = steps[:-1] or steps
  return min(candidates, key=lambda s: (abs(s - steps[-1] / 2), s))


def recorded_methods(runs):
  """The methods of the rows, in order: every grid's five, NTIL's peers
  (which run by name) only where ``runs`` hold one."""
  seen = {r["method"] for r in runs} | set(config_common.METHODS)
  return [m for m in report_engine.METHODS if m in seen]


# One budget of a "Fixed set vs stream" section (`budget_section`).
Budget = collections.namedtuple(
    "Budget",
    "heading group suffix metric name note prefix",
    defaults=("exact_match", "exact match", "", ""),
)


def stream_section(intro, fixed, streamed, out_dir, parts):
  """A report's "Fixed set vs stream" section: ``intro``, then each of
  ``parts(rows)``, ``rows`` the table rows of those recorded
  (`recorded_methods`, then the digit-weighted control): a `Budget`, its
  `budget_section`, or lines as they are; a line saying so without a
  streamed run."""
  if not streamed:
    return intro + ["", "No streamed run recorded yet.", ""]
  keys = [*recorded_methods(fixed + streamed), "ce_digit_weighted"]
  table_rows = [(k, labels.label(k)) for k in keys]
  lines = intro + [""]
  for part in parts(table_rows):
    if isinstance(part, Budget):
      part = budget_section(part, fixed, streamed, table_rows, out_dir)
    lines += part
  return lines


def side_by_side(groupings, rows, metric):
  """A markdown table: rows ``(key, label)`` are losses, columns regime x
  (mid-curve, end); each cell ``mean ± sd`` over seeds and, but for CE
  (``"ce"``), the paired Δ to CE of the same regime (`regime_table`).
  Without a run, one line saying so."""
  present = [r for r in REGIMES if any(groupings.get(r, {}).values())]
  if not present:
    return ["No runs recorded yet."]
  mid = mid_eval_step({r: groupings[r] for r in present})
  columns = []
  for regime in present:
    for step, when in ((mid, f"step {mid}"), (None, "end")):
      read = functools.partial(stats.at_step, metric=metric, step=step)
      name = f"{REGIME_LABELS[regime]}, {when}"
      columns.append((stats.Metric(read, name), regime))
  return regime_table(groupings, columns, rows, "loss", apart=False)


def regime_table(groupings, columns, rows, first="", apart=True):
  """Rows ``(key, label)`` by ``columns`` ``(metric, regime)``, each named
  by its metric: mean ± sd over the regime's seeds and, but on CE's row,
  the paired Δ to CE there (seeds better, p), in a column of its own with
  ``apart``, else in the cell (and rows without runs left out)."""
  head = [first]
  for column, _ in columns:
    head += [column.name, "Δ vs CE (seeds better, p)"][: 1 + apart]
  body = []
  for key, label in rows:
    if not (apart or any(key in groupings[r] for _, r in columns)):
      continue
    cells = [label]
    for metric, regime in columns:
      runs, ce = groupings[regime].get(key, {}), groupings[regime].get("ce")
      text = tables.fmt_metric(runs.values(), metric)
      paired = key != "ce" and text != "–" and ce
      d = paired and stats.paired(runs, ce, metric)
      if not d:  # no value, reference (CE's row) or common seed
        cells += [text, ""][: 1 + apart]
        continue
      delta = tables.delta(d, metric.digits, stats.p_equals)
      inline = f"{text} ({delta.replace(' (', ': ', 1)}"  # text (Δ: b/n, p)
      cells += [text, delta] if apart else [inline]
    body.append(cells)
  return tables.table(head, body)


def seed_counts(groupings, rows) -> str:
  """``label: fixed n, stream m`` for each row: how complete each regime is."""
  parts = []
  for key, label in rows:
    counts = [len(groupings.get(r, {}).get(key, {})) for r in REGIMES]
    if any(counts):
      counted = ", ".join(f"{r} {n}" for r, n in zip(REGIMES, counts))
      parts.append(f"{label}: {counted}")
  return "; ".join(parts)


def plot_paired_by_regime(groupings, rows, metric, path, title):
  """`figures.paired_curves` of ``rows`` (``(key, label)``) in ``metric``,
  a panel per regime with CE and another loss; whether there is one."""
  drawn = lambda regime: "ce" in regime and len(regime) > 1
  present = [r for r in REGIMES if drawn(groupings.get(r, {}))]
  panels = [(REGIME_LABELS[r], groupings[r], dict(rows)) for r in present]
  if panels:
    figures.paired_curves(panels, path, dict(rows).get, metric, title)
  return bool(panels)


def budget_section(budget, fixed, streamed, rows, out_dir):
  """A `Budget`'s report section, titled its ``heading`` and ``note``: the
  runs ``group(runs)`` of each regime compared in ``metric`` (called
  ``name``) in a table, seed counts, CE's last gain, and the paired-Δ plot
  ``out_dir/plots/regimes_paired{suffix}.png`` (titled after ``prefix``)."""
  groupings = dict(zip(REGIMES, (budget.group(fixed), budget.group(streamed))))
  title, metric = budget.heading + budget.note, budget.metric
  plot = f"regimes_paired{budget.suffix}.png"
  plot_title = f"{budget.prefix}{budget.heading}: paired Δ {budget.name} vs CE"
  # Whether CE's curve has flattened at the budget (a lead where CE still
  # rises is a faster learner, not a better trained model).
  ce = groupings["stream"].get("ce", {})
  gain = tables.last_gain(ce, metric, "Streamed CE")
  path = os.path.join(out_dir, "plots", plot)
  paired = stats.Metric(metric, budget.name)
  drawn = plot_paired_by_regime(groupings, rows, paired, path, plot_title)
  image = prose.section(__file__, "plot", title=title, plot=plot)
  return prose.section(
      __file__,
      "budget",
      title=title,
      table=side_by_side(groupings, rows, metric),
      counts=seed_counts(groupings, rows),
      gain=[gain, ""] if gain else [],
      plot=[*image, ""] if drawn else [],
  )
