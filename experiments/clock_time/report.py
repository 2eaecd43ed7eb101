r"""results.json -> results.md and plots. Every number comes from results.json.

  python -m experiments.clock_time.report

Per method: mean ± sd over seeds; per method and variant: the paired
difference to its reference (CE for the main grid and the controls, the main
NTIL runs for the ablations and sweeps) on the seeds both have, with how
many seeds it is better on and a paired t-test.
"""

import collections
import os

from absl import flags
import numpy as np

from configs import clock_time
from configs import common as config_common
from experiments import common
from experiments import figures
from experiments import labels
from experiments import prose
from experiments import regimes
from experiments import stats as stats_lib
from experiments.clock_time import grid
from train import plots
from train.tasks import clock_time as task

HERE = os.path.dirname(os.path.abspath(__file__))
FLAGS = flags.FLAGS


def define_flags():
  """The command's flags (`common.define_report_flags`)."""
  common.define_report_flags(HERE)


# The five losses of every grid, then NTIL's peers (their own groups, run by
# name): a peer's rows appear once it has a record.
METHODS = clock_time.METHODS + config_common.PEER_METHODS
LABELS = labels.LABELS
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
VARIANT_LABELS_SWEEP = ("sigma=0.1", "sigma=0.5", "lam=0.1", "lam=1.0")
# The NTIL paper's Table 4 (fine-tuned MLLMs on the TIME photographs):
# accuracy % and mean time gap in minutes for CE, EMD, NTIL.
PAPER_TABLE4 = (
    ("LLaVA-1.5 (7b)", (95.1, 95.3, 98.3), (8.52, 7.98, 4.14)),
    ("Qwen2-VL (7b)", (75.0, 78.7, 80.5), (30.84, 30.78, 27.72)),
    ("Qwen2-VL (2b)", (81.3, 81.7, 85.3), (32.34, 31.98, 24.66)),
    ("Yi-VL (6b)", (76.2, 75.1, 87.4), (56.58, 54.78, 26.58)),
)
# Table 6 (clock columns): accuracy with Exp/Rel/Mag off and all on.
PAPER_TABLE6 = (
    ("Qwen2-VL", 79.8, 79.0, 81.6, 85.3),
    ("Yi-VL", 83.4, 85.6, 87.6, 87.4),
)
# (metric, label, scale, digits, higher is better)
COLUMNS = (
    ("exact_match", "exact match %", 100, 1, True),
    ("mean_time_gap_minutes", "mean gap (min)", 1, 2, False),
    ("median_time_gap_minutes", "median gap (min)", 1, 1, False),
    ("within_5_minutes", "within 5 min %", 100, 1, True),
    ("hour_accuracy", "hour %", 100, 1, True),
    ("minute_accuracy", "minute %", 100, 1, True),
    ("parsed_rate", "parsed %", 100, 1, True),
)
PAIRED = (
    ("exact_match", "exact match", 100, True),
    ("mean_time_gap_minutes", "mean time gap (min)", 1, False),
)


EARLY, CONVERGED = "budget=600", "converged"
CHECKS = ("ce_8x_steps", "ntil_8x_steps")  # method_8x_steps


def regime_of(run) -> str:
  """'converged' for the 4x-budget runs and the 8x check, else 'budget=600'."""
  variant = run["variant"]
  if (
      variant == CONVERGED
      or variant in CHECKS
      or variant.endswith("_converged")
  ):
    return CONVERGED
  return EARLY


def recorded_methods(runs):
  return regimes.recorded_methods(METHODS, runs, clock_time.METHODS)


def group_runs(runs, regime=EARLY):
  """{variant or method: {seed: run}} of one regime.

  Main-grid runs are keyed by their method, controls by their variant
  without the ``_converged`` suffix, so both regimes share keys.
  """
  grouped = collections.defaultdict(dict)
  for run in runs:
    if regime_of(run) != regime:
      continue
    variant = run["variant"]
    if variant in ("main", CONVERGED):
      key = run["method"]
    else:
      key = variant.removesuffix("_converged")
    grouped[key][run["seed"]] = run
  return grouped


def steps_to(run, threshold=0.5):
  """The step where exact match first reaches ``threshold`` (NaN if never).

  Linear between evaluations (every 150 steps on the CPU profile).
  """
  steps = [0] + list(run["curves"]["eval_steps"])
  values = [0.0] + list(run["curves"]["exact_match"])
  for i in range(1, len(steps)):
    if values[i] >= threshold:
      fraction = (threshold - values[i - 1]) / max(
          values[i] - values[i - 1], 1e-12
      )
      return steps[i - 1] + fraction * (steps[i] - steps[i - 1])
  return float("nan")


# Mean exact match over training (the area under the learning curve / steps).
curve_area = stats_lib.curve_area


def main_table(grouped):
  rows = [(m, LABELS[m]) for m in METHODS]
  return stats_lib.values_table(grouped, rows, COLUMNS)


def paired_table(grouped, rows, reference_key):
  """Rows: (key, label); each compared with grouped[reference_key]."""
  return stats_lib.paired_table(grouped, rows, reference_key, PAIRED)


# The variant table's columns: (field, header, scale, digits).
VARIANT_COLUMNS = (
    ("exact_match", "exact match %", 100, 1),
    ("mean_time_gap_minutes", "mean gap (min)", 1, 2),
)


def variant_table(grouped, keys):
  """Absolute mean ± sd of exact match and gap for variants (and NTIL)."""
  rows = [(k, label(k)) for k in keys if k in grouped]
  return stats_lib.values_table(grouped, rows, VARIANT_COLUMNS, first="run")


def label(key) -> str:
  return LABELS.get(key) or VARIANT_LABELS[key]


def plot_paired(grouped, path, title):
  """Paired differences of every run type to CE: exact match and gap."""
  keys = [*METHODS] + [k for k in VARIANT_LABELS if k not in (*LONG, *CHECKS)]
  figures.paired_dots(grouped, keys, PAIRED, path, title, label, METHODS)


GAP_BINS = (
    (0, 0, "exact"),
    (1, 2, "1-2 min"),
    (3, 10, "3-10 min"),
    (11, 50, "11-50 min"),
    (51, 70, "51-70 min (an hour)"),
    (71, 360, "71+ min or unreadable"),
)


def test_labels(grouped):
  """The test split's labels, rendered again (deterministic for seed 0)."""
  run = next(iter(next(iter(grouped.values())).values()))
  size = run["num_test_examples"]
  return [label for _, label in task.generate_clocks("test", size, 0)]


def gap_shares(run, labels):
  """Share of test clocks in each `GAP_BINS` bin, for one run."""
  gaps = []
  for predicted, answer in zip(run["predictions"], labels):
    guess = task.parse_time(predicted)
    gaps.append(
        task.UNPARSED_GAP
        if guess is None
        else task.time_gap_minutes(guess, task.parse_time(answer))
    )
  gaps = np.asarray(gaps)
  return [np.mean((gaps >= low) & (gaps <= high)) for low, high, _ in GAP_BINS]


def gap_table(grouped, labels):
  """Where the errors are: % of test clocks per time-gap bin, mean over seeds.

  Also the share of the mean gap that clocks 51+ minutes off contribute.
  """
  head = (
      ["method"]
      + [name for _, _, name in GAP_BINS]
      + ["share of mean gap from 51+ min"]
  )
  lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  for method in METHODS:
    if method not in grouped:
      continue
    runs = list(grouped[method].values())
    shares = np.mean([gap_shares(r, labels) for r in runs], axis=0)
    large = []
    for run in runs:
      gaps = np.array(
          [
              task.UNPARSED_GAP
              if task.parse_time(p) is None
              else task.time_gap_minutes(task.parse_time(p), task.parse_time(a))
              for p, a in zip(run["predictions"], labels)
          ]
      )
      large.append(gaps[gaps >= 51].sum() / max(gaps.sum(), 1))
    lines.append(
        f"| {LABELS[method]} | "
        + " | ".join(f"{100 * x:.1f}" for x in shares)
        + f" | {100 * np.mean(large):.0f}% |"
    )
  slips = hour_slips(grouped, labels)
  if slips:
    lines += ["", *prose.section(__file__, "slips", **slips)]
  return lines


def hour_slips(grouped, labels):
  """Statistics of the readings 51-70 minutes off, pooled over main runs."""
  count = near = toward = 0
  for method in METHODS:
    for run in grouped.get(method, {}).values():
      for predicted, answer in zip(run["predictions"], labels):
        guess, target = task.parse_time(predicted), task.parse_time(answer)
        if (
            guess is None
            or not 51 <= task.time_gap_minutes(guess, target) <= 70
        ):
          continue
        count += 1
        near += target[1] >= 45 or target[1] <= 15
        nearest = target[0] % 12 + (1 if target[1] >= 30 else -1)
        toward += guess[0] % 12 == nearest % 12
  if not count:
    return None
  return dict(count=count, near=near / count, toward=toward / count)


def plot_predictions(grouped, path, title, count=18):
  """Test clocks with CE's and NTIL's seed-0 predictions side by side.

  Shows first the clocks where the two disagree, then others, in test order.
  """
  ce, ntil = grouped.get("ce", {}).get(0), grouped.get("ntil", {}).get(0)
  if not ce or not ntil:
    return None
  settings = grid.PROFILES[ce["profile"]]
  clocks = list(task.generate_clocks("test", settings["test_size"], 0))
  differ = [
      i
      for i in range(len(clocks))
      if ce["predictions"][i] != ntil["predictions"][i]
  ]
  same = [i for i in range(len(clocks)) if i not in set(differ)]
  chosen = (differ[: count - 4] + same[:4])[:count]
  plots.plot_clock_predictions(
      [clocks[i][0] for i in chosen],
      [clocks[i][1] for i in chosen],
      {
          "CE": [ce["predictions"][i] for i in chosen],
          "NTIL": [ntil["predictions"][i] for i in chosen],
      },
      path,
      title=f"{title}: test clocks, seed 0 (x: wrong); the first ones are "
      "those where CE and NTIL disagree",
  )
  return len(differ)


def ce_budget_sentence(grouped):
  """Where CE landed, seed by seed (the budget's check)."""
  runs = grouped.get("ce", {})
  if not runs:
    return "has no runs yet."
  values = ", ".join(
      f"{100 * runs[s]['exact_match']:.1f}% (seed {s})" for s in sorted(runs)
  )
  mean = 100 * np.mean([r["exact_match"] for r in runs.values()])
  inside = sum(40 <= 100 * r["exact_match"] <= 80 for r in runs.values())
  text = prose.section(
      __file__,
      "ce_budget",
      values=values,
      mean=mean,
      inside=inside,
      seeds=len(runs),
  )
  return text[0]


# (label, metric, scale, digits, higher is better, regime it is read from)
EARLY_COLUMNS = (
    ("exact match % at 600 steps", "exact_match", 100, 1, True, EARLY),
    ("steps to 50% exact", steps_to, 1, 0, False, CONVERGED),
    ("mean exact match % over training", curve_area, 100, 1, True, CONVERGED),
)
CONVERGED_COLUMNS = (
    ("final exact match %", "exact_match", 100, 1, True, CONVERGED),
    ("mean time gap (min)", "mean_time_gap_minutes", 1, 2, False, CONVERGED),
    ("within 5 min %", "within_5_minutes", 100, 1, True, CONVERGED),
    ("hour %", "hour_accuracy", 100, 1, True, CONVERGED),
)


def regime_table(groupings, columns, rows):
  """Per row and column: mean ± sd, and Δ to CE on the same seeds.

  Args:
    groupings: {regime: grouped runs}.
    columns: `EARLY_COLUMNS` or `CONVERGED_COLUMNS`.
    rows: (key, label) pairs.
  """
  head = [""]
  for label, *_ in columns:
    head += [label, "Δ vs CE (seeds better, p)"]
  lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  for key, label in rows:
    cells = [label]
    for _, metric, scale, digits, higher, regime in columns:
      grouped = groupings[regime]
      runs = grouped.get(key, {})
      values = [scale * stats_lib.value(r, metric) for r in runs.values()]
      values = [v for v in values if np.isfinite(v)]
      cells.append(stats_lib.fmt(values, digits) if values else "–")
      d = (
          stats_lib.paired(runs, grouped.get("ce", {}), metric, scale, higher)
          if key != "ce"
          else None
      )
      if d is None:
        cells.append("")
      else:
        p_value = "" if np.isnan(d["p"]) else f", p = {d['p']:.3f}"
        cells.append(
            f"{d['mean']:+.{digits}f} ({d['better']}/{d['n']}{p_value})"
        )
    lines.append("| " + " | ".join(cells) + " |")
  return lines


def convergence_lines(converged):
  """How flat CE's curve is at the converged budget, and the 8x check."""
  ce = converged.get("ce", {})
  if not ce:
    return ["No converged runs recorded yet."]
  lines = []
  gains = []
  for seed in sorted(ce):
    curves = ce[seed]["curves"]
    steps, values = curves["eval_steps"], curves["exact_match"]
    quarter = min(
        range(len(steps)), key=lambda i: abs(steps[i] - 0.75 * steps[-1])
    )
    gains.append(
        (seed, steps[quarter], 100 * values[quarter], 100 * values[-1])
    )
  lines.append(
      "CE's exact match over the last quarter of the converged runs: "
      + "; ".join(
          f"seed {seed}: {a:.1f}% at step {step} -> {b:.1f}% (+{b - a:.1f})"
          for seed, step, a, b in gains
      )
      + f"; mean gain {np.mean([b - a for *_, a, b in gains]):.1f} points."
  )
  for check_key in CHECKS:
    method = check_key.removesuffix("_8x_steps")
    check, base = converged.get(check_key, {}), converged.get(method, {})
    pairs = sorted(set(check) & set(base))
    if not pairs:
      continue
    lines.append(
        f"Doubling the budget again ({check[pairs[0]]['steps']} steps), "
        f"{LABELS[method]}: "
        + "; ".join(
            f"seed {s}: {100 * base[s]['exact_match']:.1f}% -> "
            f"{100 * check[s]['exact_match']:.1f}% "
            f"({100 * (check[s]['exact_match'] - base[s]['exact_match']):+.1f})"
            for s in pairs
        )
        + "."
    )
  ce_check, ntil_check = (converged.get(k, {}) for k in CHECKS)
  ntil = converged.get("ntil", {})
  pairs = sorted(set(ce_check) & set(ntil_check) & set(ce) & set(ntil))
  if pairs:

    def lead(ce_runs, ntil_runs, seed):
      return 100 * (
          ntil_runs[seed]["exact_match"] - ce_runs[seed]["exact_match"]
      )

    lines.append(
        "NTIL - CE on the same seed, at the converged budget -> at twice "
        "it: "
        + "; ".join(
            f"seed {s}: {lead(ce, ntil, s):+.1f} -> "
            f"{lead(ce_check, ntil_check, s):+.1f} points"
            for s in pairs
        )
        + "."
    )
  return lines


def regime_sections(grouped, title, out_dir, suffix, labels):
  """Main table, paired differences, error anatomy and controls of one
  regime; writes its plots. Returns the markdown lines."""
  figures.seed_bars(
      grouped,
      METHODS,
      PAIRED,
      os.path.join(out_dir, "plots", f"main{suffix}.png"),
      f"clock_time, {title}",
      label,
  )
  plot_paired(
      grouped, os.path.join(out_dir, "plots", f"paired{suffix}.png"), title
  )
  controls = [
      ("ce_digit_weighted", VARIANT_LABELS["ce_digit_weighted"]),
      ("ntil_reference", VARIANT_LABELS["ntil_reference"]),
  ]
  return prose.section(
      __file__,
      "regime",
      title=title,
      suffix=suffix,
      main_table=main_table(grouped),
      paired=paired_table(grouped, [(m, LABELS[m]) for m in METHODS], "ce"),
      reading=stats_lib.reading(grouped, PAIRED, METHODS, LABELS),
      gaps=gap_table(grouped, labels),
      controls_ce=paired_table(
          grouped, [*controls, ("ntil", LABELS["ntil"])], "ce"
      ),
      controls_ntil=paired_table(grouped, controls, "ntil"),
  ) + [""]


def stream_section(fixed, streamed, out_dir) -> list[str]:
  """Fixed set vs stream at both budgets: tables, plots, seed counts."""
  lines = prose.section(
      __file__, "stream", train_size=grid.PROFILES["cpu"]["train_size"]
  ) + [""]
  if not streamed:
    return lines + ["No streamed run recorded yet.", ""]
  rows = regimes.rows(
      LABELS, VARIANT_LABELS, recorded_methods(fixed + streamed)
  )
  for budget, suffix in ((EARLY, "_600"), (CONVERGED, "")):
    groupings = {
        common.FIXED: group_runs(fixed, budget),
        common.STREAM: group_runs(streamed, budget),
    }
    steps = sorted(
        {
            r["steps"]
            for r in streamed
            if regime_of(r) == budget and r["variant"] not in CHECKS
        }
    )
    if not steps:
      lines += [f"### {budget}", "", "No streamed run at this budget yet.", ""]
      continue
    title = f"{', '.join(f'{n:,}' for n in steps)} steps"
    lines += regimes.budget_section(
        title,
        groupings,
        rows,
        "exact_match",
        out_dir,
        f"regimes_paired{suffix}.png",
        f"clocks, {title}: paired Δ exact match vs CE",
    )
  return lines


def write_report(runs, out_dir, discussion=None):
  # The prepared-train-split runs make the main report; streamed ones
  # (regime "stream") are set beside them in their own section.
  streamed = [r for r in runs if common.regime(r) == common.STREAM]
  runs = [r for r in runs if common.regime(r) == common.FIXED]
  early = group_runs(runs, EARLY)
  converged = group_runs(runs, CONVERGED)
  groupings = {EARLY: early, CONVERGED: converged}
  os.makedirs(os.path.join(out_dir, "plots"), exist_ok=True)
  # The curves and predictions of the longest regime recorded.
  latest = converged if converged.get("ce") else early
  curve_runs = {m: latest[m] for m in METHODS if m in latest}
  figures.mean_curves(
      curve_runs,
      METHODS,
      PAIRED,
      os.path.join(out_dir, "plots", "curves.png"),
      label,
      mark_step=min(
          (r["steps"] for r in runs if regime_of(r) == EARLY), default=None
      )
      if latest is converged
      else None,
      log_scale=("mean_time_gap_minutes",),
  )
  disagreements = plot_predictions(
      latest,
      os.path.join(out_dir, "plots", "predictions.png"),
      "converged" if latest is converged else "600 steps",
  )
  any_run = runs[0]
  settings = grid.PROFILES[any_run["profile"]]
  labels = test_labels(early or converged)
  steps = {
      regime: ", ".join(
          str(n)
          for n in sorted(
              {
                  r["steps"]
                  for r in runs
                  if regime_of(r) == regime
                  and r["variant"] in ("main", CONVERGED)
              }
          )
      )
      for regime in (EARLY, CONVERGED)
  }
  seconds = {
      regime: np.median(
          [r["wall_seconds"] for r in runs if regime_of(r) == regime] or [0]
      )
      for regime in (EARLY, CONVERGED)
  }
  method_rows = [(m, LABELS[m]) for m in recorded_methods(runs)]
  control_rows = [
      ("ce_digit_weighted", VARIANT_LABELS["ce_digit_weighted"]),
      ("ntil_reference", VARIANT_LABELS["ntil_reference"]),
  ]
  tuned = ("exp_off", "rel_off", "mag_off", *VARIANT_LABELS_SWEEP)
  lines = prose.section(
      __file__,
      "report",
      runs=len(runs),
      device=any_run["device"],
      model=any_run["model"],
      train_size=settings["train_size"],
      batch_size=any_run["batch_size"],
      test_size=any_run["num_test_examples"],
      early_steps=steps[EARLY],
      early_seconds=seconds[EARLY],
      converged_steps=steps[CONVERGED],
      converged_seconds=seconds[CONVERGED],
      convergence=" ".join(convergence_lines(converged)),
      early_table=regime_table(
          groupings, EARLY_COLUMNS, method_rows + control_rows
      ),
      converged_table=regime_table(
          groupings, CONVERGED_COLUMNS, method_rows + control_rows
      ),
      converged=regime_sections(converged, "converged", out_dir, "", labels),
      disagreements=(
          f"On seed 0, CE and NTIL give different answers on {disagreements} "
          f"of {any_run['num_test_examples']} test clocks."
          if disagreements is not None
          else ""
      ),
      ce_budget=ce_budget_sentence(early),
      early=regime_sections(early, "600 steps", out_dir, "_600", labels),
      ablation_values=variant_table(early, ["ntil", *tuned]),
      ablation_paired=paired_table(
          early, [(k, VARIANT_LABELS[k]) for k in tuned], "ntil"
      ),
      long_values=variant_table(early, ["ce", "ntil", *LONG]),
      long_paired=paired_table(
          early,
          [("ntil_2x_steps", VARIANT_LABELS["ntil_2x_steps"])],
          "ce_2x_steps",
      ),
      stream=stream_section(runs, streamed, out_dir),
      paper_table4=[
          f"| {name} | {' / '.join(map(str, acc))} | "
          f"{' / '.join(map(str, gap))} |"
          for name, acc, gap in PAPER_TABLE4
      ],
      paper_table6=[
          f"| {name} | {a} | {b} | {c} | {d} |"
          for name, a, b, c, d in PAPER_TABLE6
      ],
  ) + [""]
  if discussion and os.path.exists(discussion):
    with open(discussion) as f:
      lines += [
          "## Discussion (written by hand from the numbers above)",
          "",
          f.read(),
      ]
  with open(os.path.join(out_dir, "results.md"), "w") as f:
    f.write("\n".join(lines))
  return os.path.join(out_dir, "results.md")


def main(argv):
  del argv
  runs = common.load_results(FLAGS.results)
  path = write_report(runs, FLAGS.out_dir, FLAGS.discussion)
  common.note_failures(FLAGS.results, path)
  print(path)


if __name__ == "__main__":
  define_flags()
  common.run_main(main)
