r"""results.json -> results.md and plots. Every number comes from results.json.

  python -m experiments.grounding.report

One section per task in the results (``grounding``, ``grounding_single``,
``grounding_multi``). Per method: mean ± sd over seeds; per method and
variant: the paired difference to its reference (CE for the main grid and
the controls, the main NTIL runs for the ablations) on the seeds both have,
with how many seeds it is better on and a paired t-test. The test scenes are
rendered again (deterministic for seed 0) to say where each miss went.
"""

import os

from absl import flags
import numpy as np

from configs import common as config_common
from configs import grounding
from experiments import common
from experiments import figures
from experiments import labels
from experiments import prose
from experiments import regimes
from experiments import stats
from experiments.grounding import grid
from train import plots
from train.tasks import boxes
from train.tasks import grounding_scenes as scenes

HERE = os.path.dirname(os.path.abspath(__file__))
FLAGS = flags.FLAGS


def define_flags():
  """The command's flags (`common.define_report_flags` and the budget)."""
  common.define_report_flags(HERE)
  flags.DEFINE_string(
      "budget",
      os.path.join(HERE, "budget.md"),
      "Hand-written record of the pilots that chose the budget, appended if "
      "it exists.",
  )


# The five losses of every grid, then NTIL's peers (their own groups, run by
# name): a peer's rows appear once it has a record.
METHODS = grounding.METHODS + config_common.PEER_METHODS
LABELS = labels.LABELS
VARIANT_LABELS = labels.VARIANT_LABELS
TASK_TITLES = {
    "grounding": "grounding: the box of the object a query names (2-4 "
    "objects; the paper's Table 1)",
    "grounding_single": "grounding_single: one object, its box (only the "
    "coordinates at stake)",
    "grounding_multi": "grounding_multi: every box of a colour, F1 at IoU "
    "0.5 (the paper's Table 2)",
}
# (metric, label, scale, digits, higher is better), per kind of task.
SINGLE_COLUMNS = (
    ("acc_at_50", "Acc@0.5 %", 100, 1, True),
    ("acc_at_75", "Acc@0.75 %", 100, 1, True),
    ("mean_iou", "mean IoU %", 100, 1, True),
    ("exact_match", "exact %", 100, 1, True),
    ("coordinate_accuracy", "coordinates exact %", 100, 1, True),
    ("mean_coordinate_error", "coordinate error (px)", 1, 2, False),
    ("parsed_rate", "parsed %", 100, 1, True),
)
MULTI_COLUMNS = (
    ("f1_at_50", "F1@0.5 %", 100, 1, True),
    ("precision_at_50", "precision %", 100, 1, True),
    ("recall_at_50", "recall %", 100, 1, True),
    ("exact_match", "exact %", 100, 1, True),
    ("count_accuracy", "box count right %", 100, 1, True),
    ("parsed_rate", "parsed %", 100, 1, True),
)
# (metric, label, scale, higher is better): the paired comparisons.
SINGLE_PAIRED = (
    ("acc_at_50", "Acc@0.5 (points)", 100, True),
    ("mean_iou", "mean IoU (points)", 100, True),
    ("exact_match", "exact match (points)", 100, True),
    ("mean_coordinate_error", "coordinate error (px)", 1, False),
)
MULTI_PAIRED = (
    ("f1_at_50", "F1@0.5 (points)", 100, True),
    ("exact_match", "exact match (points)", 100, True),
)
# The NTIL paper's Table 1 (fine-tuned MLLMs, RefCOCO/+/g): Acc@0.5
# averaged over its 8 splits, for CE, EMD, NTIL.
PAPER_TABLE1 = (
    ("PaliGemma (3b)", (0.785, 0.789, 0.795)),
    ("LLaVA-1.5 (7b)", (0.818, 0.820, 0.822)),
    ("Yi-VL (6b)", (0.733, 0.740, 0.744)),
    ("Qwen2-VL (2b)", (0.863, 0.859, 0.866)),
    ("Qwen2-VL (7b)", (0.860, 0.855, 0.862)),
)
# Table 2 (scene text detection: CTW1500, ICDAR2015, TD500, Total-Text):
# its metric, Acc@0.5, averaged over the 4 data sets. Our copy of the paper
# garbles the first model's name; PaliGemma (3b) is the one model of
# Table 1 not otherwise in Table 2.
PAPER_TABLE2 = (
    ("PaliGemma (3b)?", (0.193, 0.241, 0.263)),
    ("Yi-VL (6b)", (0.586, 0.594, 0.597)),
    ("Qwen2-VL (2b)", (0.720, 0.718, 0.732)),
    ("Qwen2-VL (7b)", (0.764, 0.751, 0.770)),
    ("LLaVA-1.5 (7b)", (0.675, 0.690, 0.698)),
)


def is_multi(task):
  return task == "grounding_multi"


def columns(task):
  return MULTI_COLUMNS if is_multi(task) else SINGLE_COLUMNS


def paired_metrics(task):
  return MULTI_PAIRED if is_multi(task) else SINGLE_PAIRED


def label(key):
  return LABELS.get(key) or VARIANT_LABELS[key]


# ----------------------------------------------------------------------------
# Tables.


def main_table(task, grouped):
  rows = [(m, LABELS[m]) for m in METHODS]
  return stats.values_table(grouped, rows, columns(task))


def paired_table(task, grouped, keys, reference_key):
  """Each of ``keys`` against grouped[reference_key], seed by seed."""
  rows = [(k, label(k)) for k in keys if k in grouped]
  return stats.paired_table(grouped, rows, reference_key, paired_metrics(task))


def variant_table(task, grouped, keys):
  """Absolute mean ± sd of the paired metrics for some run types."""
  metrics = [
      (field, name.split(" (")[0], scale, 2 if scale == 1 else 1)
      for field, name, scale, _ in paired_metrics(task)
  ]
  rows = [(k, label(k)) for k in keys if k in grouped]
  return stats.values_table(grouped, rows, metrics, first="run")


# A streamed headline this high leaves no room to lead: the report adds the
# exact-box comparison (grounding_single reads about 99% Acc@0.5 streamed).
CEILING = 0.9


def headline(task):
  """The task's headline metric: its key and name."""
  return ("f1_at_50", "F1@0.5") if is_multi(task) else ("acc_at_50", "Acc@0.5")


def at_eval(metric, index):
  """``metric`` at the ``index``-th evaluation of a run (a derived metric)."""
  return lambda run: run["curves"][metric][index]


def early_table(task, grouped):
  """Paired differences to CE early in training: at the first two evals and
  over the whole curve (its area / steps), the faster-learning regime."""
  metric, name = headline(task)
  if not grouped.get("ce"):
    return []
  steps = next(iter(grouped["ce"].values()))["curves"]["eval_steps"]
  if len(steps) < 2:
    return []
  measures = (
      (at_eval(metric, 0), f"{name} at step {steps[0]}"),
      (at_eval(metric, 1), f"{name} at step {steps[1]}"),
      (lambda run: stats.curve_area(run, metric), f"mean {name} over training"),
  )
  head = ["", "seeds"]
  for _, measure_name in measures:
    head += [f"Δ {measure_name} (points)", "seeds better", "paired t"]
  rows = []
  for method in METHODS:
    if method == "ce" or method not in grouped:
      continue
    runs = grouped[method]
    row = [LABELS[method], str(len(set(runs) & set(grouped["ce"])))]
    for measure, _ in measures:
      row += stats.paired_cells(runs, grouped["ce"], measure, 100, True, 1)
    rows.append(row)
  ce = grouped["ce"].values()
  absolute = ", ".join(
      f"{measure_name} {100 * np.mean([measure(r) for r in ce]):.1f}%"
      for measure, measure_name in measures
  )
  table = stats.table(head, rows)
  return prose.section(__file__, "early", absolute=absolute, table=table) + [""]


def ce_budget_sentence(task, grouped):
  """Where CE landed, seed by seed, and whether its curve had flattened."""
  runs = grouped.get("ce", {})
  if not runs:
    return "CE has no runs yet."
  metric, name = headline(task)
  values = ", ".join(
      f"{100 * runs[s][metric]:.1f}% (seed {s})" for s in sorted(runs)
  )
  late = []
  for run in runs.values():
    curve = run["curves"].get(metric, [])
    if len(curve) >= 2:
      late.append(100 * (curve[-1] - curve[-2]))
  change = (
      f"; over its last eval interval CE's {name} changed by "
      f"{np.mean(late):+.1f} points on average (seeds "
      f"{min(late):+.1f} to {max(late):+.1f})"
      if late
      else ""
  )
  return f"CE's test {name}: {values}{change}."


# ----------------------------------------------------------------------------
# Where the misses go (single-box tasks), from the re-rendered test scenes.

OUTCOMES = (
    ("hit", "hit (IoU >= 0.5)"),
    ("near", "near miss (0 < IoU < 0.5)"),
    ("other", "on another object"),
    ("elsewhere", "elsewhere"),
    ("unparsed", "unreadable"),
)


def test_scenes(task, run):
  variant = scenes.VARIANTS[task]
  return list(
      scenes.generate_scenes(variant, "test", run["num_test_examples"], 0)
  )


def outcome(prediction, scene):
  """Which of `OUTCOMES` a predicted box is, for a single-box scene."""
  box = boxes.parse_box(prediction, scenes.IMAGE_SIZE)
  if box is None:
    return "unparsed"
  target = scene.objects[scene.targets[0]].box
  overlap = boxes.iou(box, target)
  if overlap >= 0.5:
    return "hit"
  others = [
      boxes.iou(box, o.box)
      for i, o in enumerate(scene.objects)
      if i != scene.targets[0]
  ]
  if others and max(others) >= 0.5:
    return "other"
  return "near" if overlap > 0 else "elsewhere"


def outcome_table(task, grouped, test):
  rows = []
  for method in METHODS:
    if method not in grouped:
      continue
    shares = []
    for run in grouped[method].values():
      kinds = [outcome(p, s) for p, s in zip(run["predictions"], test)]
      shares.append([np.mean([k == key for k in kinds]) for key, _ in OUTCOMES])
    shares = np.mean(shares, axis=0)
    rows.append([LABELS[method]] + [f"{100 * x:.1f}" for x in shares])
  del task
  return stats.table(["method"] + [name for _, name in OUTCOMES], rows)


def readable_measures(test):
  """Derived metrics on the readable boxes alone (single-box tasks).

  The recorded ``mean_coordinate_error`` counts an unreadable answer as 48 px,
  so a loss with a few more of them can look worse at locating boxes than it
  is; these separate the two.
  """
  targets = [np.array(s.objects[s.targets[0]].box) for s in test]
  cache = {}

  def deviations(run):
    key = run["config_hash"]
    if key not in cache:
      found = []
      for prediction, target in zip(run["predictions"], targets):
        box = boxes.parse_box(prediction, scenes.IMAGE_SIZE)
        if box is not None:
          found.append(np.abs(np.array(box) - target))
      cache[key] = np.array(found, float).reshape(-1, 4)
    return cache[key]

  return (
      (
          lambda run: float(np.mean(deviations(run))),
          "coordinate error, readable boxes (px)",
          1,
          False,
      ),
      (
          lambda run: float(np.mean(deviations(run) <= 1)),
          "coordinates within 1 px (points)",
          100,
          True,
      ),
  )


def readable_table(grouped, test):
  """Absolute values and paired differences to CE of `readable_measures`."""
  measures = readable_measures(test)
  head = ["method", "seeds"]
  for _, name, _, _ in measures:
    head += [
        name.replace("(points)", "%"),
        "Δ to CE",
        "seeds better",
        "paired t",
    ]
  rows = []
  for method in METHODS:
    if method not in grouped:
      continue
    runs = grouped[method]
    row = [LABELS[method], str(len(runs))]
    for measure, _, scale, higher in measures:
      digits = 2 if scale == 1 else 1
      row.append(stats.fmt([scale * measure(r) for r in runs.values()], digits))
      if method == "ce":
        row += ["", "", ""]
      else:
        row += stats.paired_cells(
            runs, grouped["ce"], measure, scale, higher, digits
        )
    rows.append(row)
  return stats.table(head, rows)


# ----------------------------------------------------------------------------
# Plots.


def plot_predictions(task, grouped, test, path, count=16):
  """Test scenes with CE's and NTIL's seed-0 boxes; disagreements first."""
  ce, ntil = grouped.get("ce", {}).get(0), grouped.get("ntil", {}).get(0)
  if not ce or not ntil:
    return None
  differ = [
      i
      for i in range(len(test))
      if ce["predictions"][i] != ntil["predictions"][i]
  ]
  same = [i for i in range(len(test)) if i not in set(differ)]
  chosen = (differ[: count - 4] + same[:4])[:count]

  def parse(text):
    return boxes.parse_boxes(text, scenes.IMAGE_SIZE)

  def note(i):
    truth = parse(test[i].answer)
    if is_multi(task):
      return " / ".join(
          f"{name} {boxes.count_matches(parse(run['predictions'][i]), truth)}"
          f"/{len(truth)}"
          for name, run in (("CE", ce), ("NTIL", ntil))
      )
    return " / ".join(
        f"{name} IoU "
        + (
            f"{boxes.iou(box[0], truth[0]):.2f}"
            if len(box) == 1 and box[0] is not None
            else "-"
        )
        for name, box in (
            ("CE", parse(ce["predictions"][i])),
            ("NTIL", parse(ntil["predictions"][i])),
        )
    )

  plots.plot_scene_grid(
      [test[i].image for i in chosen],
      [test[i].question for i in chosen],
      {
          "truth": [parse(test[i].answer) for i in chosen],
          "CE": [parse(ce["predictions"][i]) for i in chosen],
          "NTIL": [parse(ntil["predictions"][i]) for i in chosen],
      },
      path,
      notes=[note(i) for i in chosen],
      title=f"{task}, seed 0, scenes where CE and NTIL differ first",
  )
  return len(differ)


# ----------------------------------------------------------------------------
# The report.


def task_section(task, runs, out_dir):
  grouped = stats.group_runs(runs)
  plot_dir = os.path.join(out_dir, "plots")
  test = test_scenes(task, runs[0])
  metrics = paired_metrics(task)
  path = os.path.join(plot_dir, f"{task}_{{}}.png").format
  figures.seed_bars(grouped, METHODS, metrics, path("main"), task, label, 25)
  curves = [m for m in metrics if m[0] in grid.CURVE_METRICS[task]]
  figures.mean_curves(grouped, METHODS, curves, path("curves"), label)
  keys = [*METHODS, *VARIANT_LABELS]
  figures.paired_dots(
      grouped, keys, metrics[:1], path("paired"), task, label, METHODS
  )
  disagreements = plot_predictions(
      task, grouped, test, os.path.join(plot_dir, f"{task}_predictions.png")
  )
  any_run = runs[0]
  seconds = np.median([r["wall_seconds"] for r in runs])
  lines = prose.section(
      __file__,
      "task",
      title=TASK_TITLES[task],
      task=task,
      runs=len(runs),
      steps=any_run["steps"],
      batch_size=any_run["batch_size"],
      train_size=grid.PROFILES[any_run["profile"]]["train_size"][task],
      test_size=any_run["num_test_examples"],
      seconds=seconds,
      ce_budget=ce_budget_sentence(task, grouped),
      main_table=main_table(task, grouped),
      paired=paired_table(task, grouped, METHODS, "ce"),
      reading=stats.reading(grouped, paired_metrics(task), METHODS, LABELS),
  ) + ["", *early_table(task, grouped)]
  if not is_multi(task):
    lines += prose.section(
        __file__,
        "where",
        outcomes=outcome_table(task, grouped, test),
        readable=readable_table(grouped, test),
    ) + [""]
  if disagreements is not None:
    lines += prose.section(
        __file__,
        "predictions",
        differ=disagreements,
        test_size=len(test),
        task=task,
    ) + [""]
  controls = [
      k for k in ("ce_digit_weighted", "ntil_reference") if k in grouped
  ]
  if controls:
    lines += prose.section(
        __file__,
        "controls",
        against_ce=paired_table(task, grouped, [*controls, "ntil"], "ce"),
        against_ntil=paired_table(task, grouped, controls, "ntil"),
    ) + [""]
  ablations = [k for k in ("exp_off", "rel_off", "mag_off") if k in grouped]
  if ablations:
    lines += prose.section(
        __file__,
        "ablations",
        values=variant_table(task, grouped, ["ntil", *ablations]),
        against_ntil=paired_table(task, grouped, ablations, "ntil"),
        against_ce=paired_table(task, grouped, ablations, "ce"),
    ) + [""]
  return lines


def paper_tables():
  lines = prose.section(__file__, "paper") + [""]
  for title, rows in (
      ("Table 1, grounding: Acc@0.5, mean of 8 splits", PAPER_TABLE1),
      (
          "Table 2, scene text detection: Acc@0.5, mean of 4 data sets",
          PAPER_TABLE2,
      ),
  ):
    lines += stats.table(
        [f"model (paper, {title})", "CE", "EMD", "NTIL", "NTIL - CE"],
        [
            [
                name,
                *(f"{100 * v:.1f}" for v in values),
                f"{100 * (values[2] - values[0]):+.1f}",
            ]
            for name, values in rows
        ],
    ) + [""]
  return lines


def stream_section(fixed, streamed, out_dir) -> list[str]:
  """Fixed set vs stream for each task with streamed runs."""
  lines = prose.section(__file__, "stream") + [""]
  if not streamed:
    return lines + ["No streamed run recorded yet.", ""]
  rows = regimes.rows(
      LABELS,
      VARIANT_LABELS,
      regimes.recorded_methods(METHODS, fixed + streamed, grounding.METHODS),
  )
  for task in grid.METRICS:
    metric, name = headline(task)
    train_size = grid.PROFILES["cpu"]["train_size"][task]
    budgets = sorted({r["steps"] for r in streamed if r["task"] == task})
    for index, steps in enumerate(budgets):
      at_budget = [
          r for r in fixed if r["task"] == task and r["steps"] == steps
      ]
      groupings = {
          common.FIXED: stats.group_runs(at_budget),
          common.STREAM: stats.group_runs(
              [r for r in streamed if r["task"] == task and r["steps"] == steps]
          ),
      }
      title = (
          f"{task}, {steps:,} steps ({name}; fixed set: {train_size:,} scenes)"
      )
      plot = f"regimes_paired_{task}.png"
      if index:  # the longer budgets, streamed only
        title = f"{task}, {steps:,} steps ({name}; streamed only)"
        plot = f"regimes_paired_{task}_{steps}.png"
      lines += regimes.budget_section(
          title,
          groupings,
          rows,
          metric,
          out_dir,
          plot,
          f"{task}, {steps:,} steps: paired Δ {name} vs CE",
      )
      ce = groupings[common.STREAM].get("ce", {})
      ends = [r["curves"][metric][-1] for r in ce.values()]
      if ends and np.mean(ends) >= CEILING:
        # Every loss is at the ceiling: compare where they can differ.
        lines += [
            *prose.section(__file__, "ceiling", name=name, ceiling=CEILING),
            "",
            *regimes.budget_section(
                f"{task}, {steps:,} steps (exact box)",
                groupings,
                rows,
                "exact_match",
                out_dir,
                plot.replace(".png", "_exact.png"),
                f"{task}, {steps:,} steps: paired Δ exact box vs CE",
            ),
            *stream_closeness(groupings[common.STREAM], rows),
        ]
  return lines


# (record field, label, scale, digits, higher is better): how close the
# streamed boxes are at the end of the budget, where Acc@0.5 is at its
# ceiling.
CLOSENESS = (
    ("mean_coordinate_error", "coordinate error (px)", 1, 3, False),
    ("coordinate_accuracy", "coordinates exact %", 100, 1, True),
)


def stream_closeness(grouped, rows) -> list[str]:
  """End-of-budget table: how close each loss's streamed boxes are, paired
  with CE's of the same seed (an unreadable box counts 48 px)."""
  if "ce" not in grouped:
    return []
  head = ["loss"]
  for _, label, _, _, _ in CLOSENESS:
    head += [label, "Δ vs CE", "seeds better", "paired t"]
  lines = [
      *prose.section(__file__, "closeness"),
      "",
      "| " + " | ".join(head) + " |",
      "|" + "---|" * len(head),
  ]
  for key, label in rows:
    runs = grouped.get(key)
    if not runs:
      continue
    row = [label]
    for metric, _, scale, digits, higher in CLOSENESS:
      row.append(stats.fmt([scale * r[metric] for r in runs.values()], digits))
      if key == "ce":
        row += [""] * 3
      else:
        row += stats.paired_cells(
            runs, grouped["ce"], metric, scale, higher, digits
        )
    lines.append("| " + " | ".join(row) + " |")
  return lines + [""]


def write_report(runs, out_dir, discussion=None, budget=None):
  # The prepared-train-split runs make the main report; streamed ones
  # (regime "stream") are set beside them in their own section.
  streamed = [r for r in runs if common.regime(r) == common.STREAM]
  runs = [r for r in runs if common.regime(r) == common.FIXED]
  os.makedirs(os.path.join(out_dir, "plots"), exist_ok=True)
  any_run = runs[0]
  lines = prose.section(
      __file__,
      "report",
      runs=len(runs),
      device=any_run["device"],
      model=any_run["model"],
  ) + [""]
  for task in grid.METRICS:
    task_runs = [r for r in runs if r["task"] == task]
    if task_runs:
      lines += task_section(task, task_runs, out_dir)
  lines += stream_section(runs, streamed, out_dir)
  lines += paper_tables()
  for title, source in (
      ("Discussion (written by hand from the numbers above)", discussion),
      ("Budget (pilots, written by hand)", budget),
  ):
    if source and os.path.exists(source):
      with open(source) as f:
        lines += [f"## {title}", "", f.read()]
  path = os.path.join(out_dir, "results.md")
  with open(path, "w") as f:
    f.write("\n".join(lines))
  return path


def main(argv):
  del argv
  runs = common.load_results(FLAGS.results)
  path = write_report(runs, FLAGS.out_dir, FLAGS.discussion, FLAGS.budget)
  common.note_failures(FLAGS.results, path)
  print(path)


if __name__ == "__main__":
  define_flags()
  common.run_main(main)
