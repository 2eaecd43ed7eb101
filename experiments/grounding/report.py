r"""results.json -> results.md and plots. Every number comes from results.json.

  python -m experiments.grounding.report

A section per task in the results, from its `report_engine.Spec`, with the
task's own: early training, where the misses went (the test scenes rendered
again), predictions and the stream.
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
from experiments.grounding import grid
from train import plots
from train.tasks import boxes
from train.tasks import grounding_scenes as scenes

HERE = os.path.dirname(os.path.abspath(__file__))
Metric = stats.Metric


METHODS = report_engine.METHODS
PARSED = Metric("parsed_rate", "parsed %")
EXACT = Metric("exact_match", "exact %")
ERROR = Metric("mean_coordinate_error", "coordinate error (px)", 1, 2, False)
COORDINATES = Metric("coordinate_accuracy", "coordinates exact %")
# The metrics of each kind of task: its main table's, and those it pairs.
SINGLE = report_engine.Spec(
    columns=(
        Metric("acc_at_50", "Acc@0.5 %"),
        Metric("acc_at_75", "Acc@0.75 %"),
        Metric("mean_iou", "mean IoU %"),
        EXACT,
        COORDINATES,
        ERROR,
        PARSED,
    ),
    paired=(
        Metric("acc_at_50", "Acc@0.5 (points)"),
        Metric("mean_iou", "mean IoU (points)"),
        EXACT._replace(name="exact match (points)"),
        ERROR,
    ),
)
MULTI = report_engine.Spec(
    columns=(
        Metric("f1_at_50", "F1@0.5 %"),
        Metric("precision_at_50", "precision %"),
        Metric("recall_at_50", "recall %"),
        EXACT,
        Metric("count_accuracy", "box count right %"),
        PARSED,
    ),
    paired=(
        Metric("f1_at_50", "F1@0.5 (points)"),
        EXACT._replace(name="exact match (points)"),
    ),
)
label = SINGLE.label


def spec(task) -> report_engine.Spec:
  """The task's report specification."""
  return MULTI if task == "grounding_multi" else SINGLE


# How close the streamed boxes are at the end of the budget, where Acc@0.5
# is at its ceiling.
CLOSENESS = (ERROR._replace(digits=3), COORDINATES)
# A streamed headline this high leaves no room to lead: the report adds the
# exact-box comparison (grounding_single reads about 99% Acc@0.5 streamed).
CEILING = 0.9


def headline(task):
  """The task's headline metric (its spec's first paired): key and name."""
  metric = spec(task).paired[0]
  return metric.field, metric.name.removesuffix(" (points)")


def early_table(task, grouped):
  """Paired differences to CE early in training: at the first two evals and
  over the whole curve (its area / steps), the faster-learning regime."""
  metric, name = headline(task)
  if not grouped.get("ce"):
    return []
  steps = next(iter(grouped["ce"].values()))["curves"]["eval_steps"]
  if len(steps) < 2:
    return []
  at = lambda step: functools.partial(stats.at_step, metric=metric, step=step)
  measures = [Metric(at(s), f"{name} at step {s}") for s in steps[:2]]
  area = functools.partial(stats.curve_area, metric=metric)
  measures.append(Metric(area, f"mean {name} over training"))
  ce = grouped["ce"].values()
  absolute = ", ".join(
      f"{m.name} {100 * np.mean([m.field(r) for r in ce]):.1f}%"
      for m in measures
  )
  points = [m._replace(name=f"{m.name} (points)") for m in measures]
  table = tables.paired_table(grouped, SINGLE.rows(METHODS), "ce", points)
  return prose.section(__file__, "early", absolute=absolute, table=table) + [""]


# Where the misses go (single-box tasks), from the re-rendered test scenes.
OUTCOMES = (
    ("hit", "hit (IoU >= 0.5)"),
    ("near", "near miss (0 < IoU < 0.5)"),
    ("other", "on another object"),
    ("elsewhere", "elsewhere"),
    ("unparsed", "unreadable"),
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
  others = [o.box for i, o in enumerate(scene.objects) if i != scene.targets[0]]
  if any(boxes.iou(box, other) >= 0.5 for other in others):
    return "other"
  return "near" if overlap > 0 else "elsewhere"


def outcome_table(grouped, test):
  """Where each method's boxes go: % of the test scenes per `OUTCOMES`."""

  def shares(run):
    kinds = [outcome(p, s) for p, s in zip(run["predictions"], test)]
    return [np.mean([k == key for k in kinds]) for key, _ in OUTCOMES]

  head = ["method"] + [name for _, name in OUTCOMES]
  return tables.shares_table(grouped, SINGLE.rows(METHODS), head, shares)


def readable_table(grouped, test):
  """Coordinate error and coordinates within 1 px of the readable boxes
  alone, against CE: the recorded ``mean_coordinate_error`` counts an
  unreadable answer as 48 px, so a loss with a few more of them can look
  worse at locating boxes than it is."""
  targets = [np.array(s.objects[s.targets[0]].box) for s in test]

  def deviations(run):  # of each readable box from its target
    found = zip(run["predictions"], targets)
    found = [(boxes.parse_box(p, scenes.IMAGE_SIZE), t) for p, t in found]
    found = [np.abs(np.array(b) - t) for b, t in found if b is not None]
    return np.array(found, float).reshape(-1, 4)

  runs = [run for seeds in grouped.values() for run in seeds.values()]
  readable = {run["config_hash"]: deviations(run) for run in runs}
  error = lambda run: float(np.mean(readable[run["config_hash"]]))
  within = lambda run: float(np.mean(readable[run["config_hash"]] <= 1))
  measures = (
      Metric(error, "coordinate error, readable boxes (px)", 1, 2, False),
      Metric(within, "coordinates within 1 px %"),
  )
  rows = SINGLE.rows(METHODS)
  return tables.values_table(grouped, rows, measures, versus=True)


def plot_predictions(task, grouped, test, path, count=16):
  """Test scenes with CE's and NTIL's seed-0 boxes; disagreements first."""

  parse = lambda text: boxes.parse_boxes(text, scenes.IMAGE_SIZE)

  def score(found, truth):  # how close a prediction is, for the notes
    if spec(task) is MULTI:
      return f"{boxes.count_matches(found, truth)}/{len(truth)}"
    one = len(found) == 1 and found[0] is not None
    return f"IoU {boxes.iou(found[0], truth[0]):.2f}" if one else "IoU -"

  def draw(chosen, predicted):
    truth = [parse(test[i].answer) for i in chosen]
    found = {name: list(map(parse, p)) for name, p in predicted.items()}
    notes = [
        " / ".join(f"{name} {score(found[name][j], t)}" for name in found)
        for j, t in enumerate(truth)
    ]
    plots.plot_scene_grid(
        [test[i].image for i in chosen],
        [test[i].question for i in chosen],
        {"truth": truth, **found},
        path,
        notes=notes,
        title=f"{task}, seed 0, scenes where CE and NTIL differ first",
    )

  return report_engine.predictions(grouped, count, draw)


def task_section(task, runs, out_dir):
  grouped = stats.group_runs(runs)
  size = runs[0]["num_test_examples"]  # the test scenes, rendered again
  test = list(scenes.generate_scenes(scenes.VARIANTS[task], "test", size, 0))
  task_spec = spec(task)
  path = os.path.join(out_dir, "plots", f"{task}_{{}}.png").format
  keys, first = [*METHODS, *labels.VARIANT_LABELS], task_spec.paired[:1]
  blocks = task_spec.section(grouped, path, task, keys, None, first, 25)
  curves = [m for m in task_spec.paired if m.field in grid.CURVE_METRICS[task]]
  panels = figures.test_panels(METHODS, curves)
  figures.curves(grouped, panels, path("curves"), label)
  disagreements = plot_predictions(task, grouped, test, path("predictions"))
  any_run = runs[0]
  fields = dict(
      any_run,  # its steps, batch_size and num_test_examples
      title=prose.text(__file__, f"title_{task}"),
      task=task,
      runs=len(runs),
      train_size=grid.PROFILES[any_run["profile"]]["train_size"][task],
      seconds=np.median([r["wall_seconds"] for r in runs]),
      ce_budget=tables.ce_budget(grouped.get("ce", {}), *headline(task)),
      differ=disagreements,
      **blocks,
  )

  def part(name, **more):  # a section of the Markdown, then a blank line
    return prose.section(__file__, name, **fields | more) + [""]

  lines = part("task") + early_table(task, grouped)
  if task_spec is SINGLE:
    outcomes = outcome_table(grouped, test)
    lines += part(
        "where", outcomes=outcomes, readable=readable_table(grouped, test)
    )
  if disagreements is not None:
    lines += part("predictions")
  if any(k in grouped for k in labels.CONTROLS):
    lines += part("controls")
  ablations = [k for k in ("exp_off", "rel_off", "mag_off") if k in grouped]
  if ablations:  # beside NTIL's: absolute values of the paired metrics
    plain = [m._replace(name=m.name.split(" (")[0]) for m in task_spec.paired]
    lines += part(
        "ablations",
        values=task_spec.variant_table(grouped, ["ntil", *ablations], plain),
        against_ntil=task_spec.paired_table(grouped, ablations, "ntil"),
        against_ce=task_spec.paired_table(grouped, ablations),
    )
  return lines


def stream_section(fixed, streamed, out_dir) -> list[str]:
  """Fixed set vs stream for each task with streamed runs."""

  def parts(rows):
    for task in grid.METRICS:
      metric, name = headline(task)
      train_size = grid.PROFILES["cpu"]["train_size"][task]
      budgets = sorted({r["steps"] for r in streamed if r["task"] == task})
      for index, steps in enumerate(budgets):
        group = lambda runs, at=(task, steps): stats.group_runs(
            [r for r in runs if (r["task"], r["steps"]) == at]
        )
        note, plot = f" ({name}; fixed set: {train_size:,} scenes)", f"_{task}"
        if index:  # the longer budgets, streamed only
          note, plot = f" ({name}; streamed only)", f"_{task}_{steps}"
        heading = f"{task}, {steps:,} steps"
        yield regimes.Budget(heading, group, plot, metric, name, note)
        ce = group(streamed).get("ce", {})
        ends = [r["curves"][metric][-1] for r in ce.values()]
        if ends and np.mean(ends) >= CEILING:
          # Every loss is at the ceiling: compare where they can differ.
          yield prose.section(
              __file__, "ceiling", name=name, ceiling=CEILING
          ) + [""]
          exact = dict(name="exact box", note=" (exact box)")
          yield regimes.Budget(heading, group, plot + "_exact", **exact)
          # How close the streamed boxes are (an unreadable box: 48 px).
          close = tables.values_table(
              group(streamed), rows, CLOSENESS, "loss", versus=True
          )
          yield [*prose.section(__file__, "closeness"), "", *close, ""]

  intro = prose.section(__file__, "stream")
  return regimes.stream_section(intro, fixed, streamed, out_dir, parts)


def write_report(runs, out_dir, discussion=None, budget=None):
  """Writes results.md and the plots; the path of results.md."""

  def sections(runs, streamed):
    lines = []
    for task in grid.METRICS:
      task_runs = [r for r in runs if r["task"] == task]
      if task_runs:
        lines += task_section(task, task_runs, out_dir)
    lines += stream_section(runs, streamed, out_dir)
    return {}, lines + prose.section(__file__, "paper") + [""]

  pilots = "Budget (pilots, written by hand)"
  hand = [(report_engine.DISCUSSION, discussion), (pilots, budget)]
  return report_engine.task_report(__file__, runs, out_dir, sections, hand)


if __name__ == "__main__":
  budget = "Hand-written record of the pilots that chose the budget, appended"
  budget = (os.path.join(HERE, "budget.md"), budget + " if it exists.")
  report_engine.run(HERE, write_report, budget=budget)
