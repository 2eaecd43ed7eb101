r"""results.json -> results.md and plots. Every number comes from results.json.

  python -m experiments.clock_time.report

A `report_engine.Spec` (its metrics, variants) and the clock task's own
sections: budgets, time-gap bins, convergence, predictions.
"""

import functools
import os

import numpy as np

from experiments import figures
from experiments import labels
from experiments import prose
from experiments import regimes
from experiments import report_engine
from experiments import stats
from experiments import tables
from experiments.clock_time import grid
from train import plots
from train.tasks import clock_time as task

HERE = os.path.dirname(os.path.abspath(__file__))
Metric = stats.Metric


METHODS = report_engine.METHODS
VARIANT_LABELS = {
    **labels.VARIANT_LABELS,
    "sigma=0.1": "NTIL, sigma = 0.1",
    "sigma=0.5": "NTIL, sigma = 0.5",
    "lam=0.1": "NTIL, lambda = 0.1",
    "lam=1.0": "NTIL, lambda = 1.0",
    "ce_2x_steps": "CE, twice the steps",
    "ntil_2x_steps": "CE + NTIL, twice the steps",
    "ce_8x_steps": "CE, 8x the steps (convergence check)",
    "ntil_8x_steps": "CE + NTIL, 8x the steps (convergence check)",
}
LONG = ("ce_2x_steps", "ntil_2x_steps")
SWEEP = ("sigma=0.1", "sigma=0.5", "lam=0.1", "lam=1.0")
EXACT = Metric("exact_match", "exact match %")
GAP = Metric("mean_time_gap_minutes", "mean gap (min)", 1, 2, False)
SPEC = report_engine.Spec(
    columns=(
        EXACT,
        GAP,
        Metric("median_time_gap_minutes", "median gap (min)", 1, 1, False),
        Metric("within_5_minutes", "within 5 min %"),
        Metric("hour_accuracy", "hour %"),
        Metric("minute_accuracy", "minute %"),
        Metric("parsed_rate", "parsed %"),
    ),
    paired=(
        EXACT._replace(name="exact match"),
        GAP._replace(name="mean time gap (min)"),
    ),
    variant_labels=VARIANT_LABELS,
)
label = SPEC.label

EARLY, CONVERGED = "budget=600", "converged"
EARLY_TITLE = "600 steps"  # how the report names the early regime
CHECKS = ("ce_8x_steps", "ntil_8x_steps")  # method_8x_steps


def regime_of(run) -> str:
  """'converged' for the 4x-budget runs and the 8x check, else 'budget=600'."""
  variant = run["variant"]
  converged = variant in (CONVERGED, *CHECKS) or variant.endswith("_converged")
  return CONVERGED if converged else EARLY


def group_runs(runs, regime=EARLY):
  """{variant or method: {seed: run}} of one regime (`stats.main_key`: the
  regimes share keys)."""
  return stats.group_runs(r for r in runs if regime_of(r) == regime)


def steps_to(run, threshold=0.5):
  """The step where exact match first reaches ``threshold`` (NaN if never).

  Linear between evaluations (every 150 steps on the CPU profile).
  """
  steps = [0, *run["curves"]["eval_steps"]]
  values = [0.0, *run["curves"]["exact_match"]]
  for i in range(1, len(steps)):
    if values[i] >= threshold:
      rise = max(values[i] - values[i - 1], 1e-12)
      fraction = (threshold - values[i - 1]) / rise
      return steps[i - 1] + fraction * (steps[i] - steps[i - 1])
  return float("nan")


GAP_BINS = (
    (0, 0, "exact"),
    (1, 2, "1-2 min"),
    (3, 10, "3-10 min"),
    (11, 50, "11-50 min"),
    (51, 70, "51-70 min (an hour)"),
    (71, 360, "71+ min or unreadable"),
)


def readings(run, labels):
  """Each test clock's ``(time read or None, time shown)`` in one run, and
  the gap between them in minutes (`task.UNPARSED_GAP` if unreadable)."""
  for guess, target in zip(run["predictions"], labels):
    guess, target = task.parse_time(guess), task.parse_time(target)
    unread = guess is None
    gap = task.UNPARSED_GAP if unread else task.time_gap_minutes(guess, target)
    yield guess, target, gap


def gap_table(grouped, labels):
  """Where the errors are: % of test clocks per time-gap bin, mean over
  seeds, and the share of the mean gap from clocks 51+ minutes off."""

  def shares(run):
    run_gaps = np.array([gap for *_, gap in readings(run, labels)])
    large = run_gaps[run_gaps >= 51].sum() / max(run_gaps.sum(), 1)
    bins = [(run_gaps >= a) & (run_gaps <= b) for a, b, _ in GAP_BINS]
    return [*map(np.mean, bins), large]

  head = ["method", *(name for *_, name in GAP_BINS)]
  head.append("share of mean gap from 51+ min")
  lines = tables.shares_table(grouped, SPEC.rows(METHODS), head, shares, True)
  return lines + hour_slips(grouped, labels)


def hour_slips(grouped, labels):
  """Statistics of the readings 51-70 minutes off, pooled over main runs:
  a paragraph after a blank line (none without one)."""
  slips = [
      (guess, target)
      for method in METHODS
      for run in grouped.get(method, {}).values()
      for guess, target, gap in readings(run, labels)
      if 51 <= gap <= 70
  ]
  if not slips:
    return []
  near = sum(minute >= 45 or minute <= 15 for _, (_, minute) in slips)
  # Those naming an hour next to the one shown, and of them, the one on the
  # side the hour hand leans to (the rest name the hour shown or another).
  sides = [
      (guess[0] - hour) % 12 == (1 if minute >= 30 else 11)
      for guess, (hour, minute) in slips
      if (guess[0] - hour) % 12 in (1, 11)
  ]
  count = len(slips)
  fields = dict(
      count=count,
      near=near / count,
      neighbour=len(sides),
      toward=sum(sides) / max(len(sides), 1),
  )
  return ["", *prose.section(__file__, "slips", **fields)]


def plot_predictions(grouped, clocks, path, title, count=18):
  """Test ``clocks`` with CE's and NTIL's seed-0 predictions side by side
  (`report_engine.predictions`)."""

  def draw(chosen, predicted):
    plots.plot_clock_predictions(
        [clocks[i][0] for i in chosen],
        [clocks[i][1] for i in chosen],
        predicted,
        path,
        title=f"{title}: test clocks, seed 0 (x: wrong); the first ones are "
        "those where CE and NTIL disagree",
    )

  return report_engine.predictions(grouped, count, draw)


# (column, the regime it is read from); a column's name is its header.
EARLY_COLUMNS = (
    (EXACT._replace(name="exact match % at 600 steps"), EARLY),
    (Metric(steps_to, "steps to 50% exact", 1, 0, False), CONVERGED),
    (Metric(stats.curve_area, "mean exact match % over training"), CONVERGED),
)
CONVERGED_COLUMNS = (
    (EXACT._replace(name="final exact match %"), CONVERGED),
    (GAP._replace(name="mean time gap (min)"), CONVERGED),
    (Metric("within_5_minutes", "within 5 min %"), CONVERGED),
    (Metric("hour_accuracy", "hour %"), CONVERGED),
)


def convergence_lines(converged):
  """How flat CE's curve is at the converged budget, and the 8x check."""
  ce = converged.get("ce", {})
  if not ce:
    return ["No converged runs recorded yet."]
  gains = []
  for seed in sorted(ce):
    curves = ce[seed]["curves"]
    steps, values = curves["eval_steps"], curves["exact_match"]
    i = int(np.argmin(np.abs(np.array(steps) - 0.75 * steps[-1])))
    gains.append((seed, steps[i], 100 * values[i], 100 * values[-1]))
  gain = "seed {}: {:.1f}% at step {} -> {:.1f}% ({:+.1f})".format
  text = "; ".join(gain(s, a, i, b, b - a) for s, i, a, b in gains)
  mean = np.mean([b - a for *_, a, b in gains])
  lines = prose.section(__file__, "convergence_ce", gains=text, mean=mean)
  exact = lambda runs, seed: 100 * runs[seed]["exact_match"]
  lead = lambda runs, base, s: 100 * (
      runs[s]["exact_match"] - base[s]["exact_match"]
  )
  for check_key in CHECKS:
    method = check_key.removesuffix("_8x_steps")
    check, base = converged.get(check_key, {}), converged.get(method, {})
    if pairs := sorted(set(check) & set(base)):
      text = lambda s: (
          f"{exact(base, s):.1f}% -> {exact(check, s):.1f}% "
          f"({lead(check, base, s):+.1f})"
      )
      said = dict(steps=check[pairs[0]]["steps"], label=label(method))
      said.update(pairs=by_seed(pairs, text))
      lines += prose.section(__file__, "convergence_check", **said)
  ce_check, ntil_check = (converged.get(k, {}) for k in CHECKS)
  ntil = converged.get("ntil", {})
  if pairs := sorted(set(ce_check) & set(ntil_check) & set(ce) & set(ntil)):
    text = lambda s: (
        f"{lead(ntil, ce, s):+.1f} -> "
        f"{lead(ntil_check, ce_check, s):+.1f} points"
    )
    pairs = by_seed(pairs, text)
    lines += prose.section(__file__, "convergence_lead", pairs=pairs)
  return lines


def by_seed(seeds, text) -> str:
  """``seed s: text(s)`` for each of ``seeds``, joined by semicolons."""
  return "; ".join(f"seed {s}: {text(s)}" for s in seeds)


def regime_sections(grouped, title, out_dir, suffix, labels):
  """Main table, paired differences, error anatomy and controls of one
  regime; writes its plots. Returns the markdown lines."""
  plot = os.path.join(out_dir, "plots", "{}" + suffix + ".png").format
  keys = [*METHODS] + [k for k in VARIANT_LABELS if k not in (*LONG, *CHECKS)]
  blocks = SPEC.section(grouped, plot, title, keys, f"clock_time, {title}")
  blocks.update(title=title, suffix=suffix, gaps=gap_table(grouped, labels))
  return prose.section(__file__, "regime", **blocks) + [""]


def stream_section(fixed, streamed, out_dir) -> list[str]:
  """Fixed set vs stream at both budgets: tables, plots, seed counts."""

  def parts(_):
    for budget, suffix in ((EARLY, "_600"), (CONVERGED, "")):
      steps = {
          r["steps"]
          for r in streamed
          if regime_of(r) == budget and r["variant"] not in CHECKS
      }
      if not steps:
        yield prose.section(__file__, "no_stream", budget=budget) + [""]
        continue
      heading = f"{', '.join(f'{n:,}' for n in sorted(steps))} steps"
      group = functools.partial(group_runs, regime=budget)
      yield regimes.Budget(heading, group, suffix, prefix="clocks, ")

  train_size = grid.PROFILES["cpu"]["train_size"]
  intro = prose.section(__file__, "stream", train_size=train_size)
  return regimes.stream_section(intro, fixed, streamed, out_dir, parts)


def write_report(runs, out_dir, discussion=None):
  """Writes results.md and the plots; the path of results.md."""
  # Every section is a field of the Markdown's report section.
  sections = lambda runs, streamed: (report_fields(runs, streamed, out_dir), [])
  hand = [(report_engine.DISCUSSION, discussion)]
  return report_engine.task_report(__file__, runs, out_dir, sections, hand)


def report_fields(runs, streamed, out_dir):
  """The fields of the Markdown's ``report`` section; draws its plots."""
  early, converged = (group_runs(runs, r) for r in (EARLY, CONVERGED))
  groupings = {EARLY: early, CONVERGED: converged}
  # The curves and predictions of the longest regime recorded.
  latest = converged if converged.get("ce") else early
  mark = min((r["steps"] for r in runs if regime_of(r) == EARLY), default=0)
  mark, title = (
      (mark, "converged") if latest is converged else (None, EARLY_TITLE)
  )
  plot = os.path.join(out_dir, "plots", "{}.png").format
  panels = figures.test_panels(METHODS, SPEC.paired)
  options = dict(mark_step=mark, log_scale=("mean_time_gap_minutes",))
  figures.curves(latest, panels, plot("curves"), label, **options)
  any_run, budgets = runs[0], {}
  test_size = any_run["num_test_examples"]
  # The test split, rendered again (deterministic for seed 0).
  clocks = list(task.generate_clocks("test", test_size, 0))
  answers = [a for _, a in clocks]
  disagreements = plot_predictions(latest, clocks, plot("predictions"), title)
  for name, regime in (("early", EARLY), ("converged", CONVERGED)):
    of_regime = [r for r in runs if regime_of(r) == regime]
    main = {
        r["steps"] for r in of_regime if r["variant"] in ("main", CONVERGED)
    }
    budgets[f"{name}_steps"] = ", ".join(map(str, sorted(main)))
    seconds = [r["wall_seconds"] for r in of_regime] or [0]
    budgets[f"{name}_seconds"] = np.median(seconds)
  ce = early.get("ce", {})
  rows = SPEC.rows([*regimes.recorded_methods(runs), *labels.CONTROLS])
  tuned = ("exp_off", "rel_off", "mag_off", *SWEEP)
  two = SPEC.columns[:2]  # exact match and mean gap
  return dict(
      train_size=grid.PROFILES[any_run["profile"]]["train_size"],
      test_size=test_size,
      **budgets,
      convergence=" ".join(convergence_lines(converged)),
      early_table=regimes.regime_table(groupings, EARLY_COLUMNS, rows),
      converged_table=regimes.regime_table(groupings, CONVERGED_COLUMNS, rows),
      converged=regime_sections(converged, "converged", out_dir, "", answers),
      disagreements=""
      if disagreements is None
      else prose.text(__file__, "differ", differ=disagreements, size=test_size),
      ce_budget=tables.ce_budget(ce, "exact_match", "exact match"),
      inside=sum(40 <= 100 * r["exact_match"] <= 80 for r in ce.values()),
      seeds=len(ce),
      early=regime_sections(early, EARLY_TITLE, out_dir, "_600", answers),
      ablation_values=SPEC.variant_table(early, ["ntil", *tuned], two),
      ablation_paired=SPEC.paired_table(early, tuned, "ntil"),
      long_values=SPEC.variant_table(early, ["ce", "ntil", *LONG], two),
      long_paired=SPEC.paired_table(early, ["ntil_2x_steps"], "ce_2x_steps"),
      stream=stream_section(runs, streamed, out_dir),
  )


if __name__ == "__main__":
  report_engine.run(HERE, write_report)
