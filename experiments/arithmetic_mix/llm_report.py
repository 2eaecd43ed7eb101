r"""The pretrained-LLM grid's report: llm/<snapshot>/results.json -> results.md.

  python -m experiments.arithmetic_mix.report --profile=llm \
      [--snapshot=SmolLM2-135M-Instruct] [--data_dir=data]

The grid (``run.py --profile=llm --pretrained=SNAPSHOT``, per
``--dataset``): the snapshot's zero-shot score, then each loss fine-tuned
per seed, every training problem read once. Each dataset of results.json
gets its section, from `digits_report`'s tables and reading, so both grids
are read by the same definitions; any subset of the cells renders.
"""

import math
import os
import textwrap

import numpy as np

from experiments import common
from experiments import prose
from experiments import report_engine
from experiments.arithmetic_mix import answers
from experiments.arithmetic_mix import digits_report as dr

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "llm")
DEFAULT_SNAPSHOT = "SmolLM2-135M-Instruct"
# The datasets in report order, with their seeds per cell (issue 27's grid:
# 5 on the multi-digit task, 3 on arithmetic_mix as the paper); their titles
# are llm_report.md's sections ``title_<dataset>``.
DATASETS = {"add_or_sub": 5, "arithmetic_mix": 3}

# Per dataset: the breakdowns of exact match that apply to its questions
# (operation words are add_or_sub's; arithmetic_mix mixes operations).
BREAKDOWNS = {
    "add_or_sub": answers.BREAKDOWNS,
    "arithmetic_mix": (answers.BREAKDOWNS[0], answers.FORM),
}


def split_runs(runs) -> dict:
  """{dataset: (zero-shot records, fine-tuned records)}, datasets ordered
  as `DATASETS` (others after them)."""
  found = {}
  for run in runs:
    zero, tuned = found.setdefault(run.get("dataset", "?"), ([], []))
    (zero if run["group"] == "zero_shot" else tuned).append(run)
  order = dict.fromkeys([*DATASETS, *sorted(found)])
  return {d: found[d] for d in order if d in found}


def _pct(value) -> str:
  known = value is not None and math.isfinite(value)
  return f"{100 * value:.2f}" if known else "-"


def zero_shot_lines(records, problems) -> list[str]:
  """The snapshot before fine-tuning: one row per zero-shot record."""
  if not records:
    return ["Zero-shot: not recorded (`--groups=zero_shot`)."]
  rows = []
  for record in records:
    within = record.get("within_1_percent")
    predictions = record.get("predictions") or []
    if problems is not None and len(predictions) == len(problems):
      within = answers.score(predictions, problems)["within_1_percent"]
    rows.append(
        f"| {record.get('snapshot', '?')} | {_pct(record['exact_match'])} | "
        f"{_pct(within)} | {_pct(record.get('parsed_rate'))} | "
        f"{record.get('mean_log10_abs_error', float('nan')):.3f} | "
        f"{record['num_test_examples']:,} |"
    )
  return prose.section(__file__, "zero_shot", rows=rows)


def setup_lines(tuned, grid, source) -> list[str]:
  """What the fine-tuned cells share: schedule, data, hardware, speed."""
  first = tuned[0]
  # The llm grid generates as many training problems as a run reads (each
  # seen once); the test split's dataset may be another size's (the split
  # does not depend on it), which says nothing of the runs' own.
  fields = dict(
      first,  # its steps, batch_size and num_test_examples
      snapshot=first.get("snapshot", "?"),
      seen=first.get("problems_seen", first["steps"] * first["batch_size"]),
      rate=first.get("learning_rate", float("nan")),
      eval_steps=", ".join(str(s) for s in grid.steps),
  )
  lines = prose.section(__file__, "setup", **fields)
  if grid.problems:
    ranged = answers.digit_range(grid.problems)
    lines += prose.section(__file__, "answers", **ranged, source=source)
  return lines + hardware_lines(tuned)


def hardware_lines(tuned) -> list[str]:
  """Each device's cells and speed; the pairs whose seeds ran on two
  devices (they differ in the arithmetic as well as in the loss)."""
  devices = {}
  for r in tuned:
    devices.setdefault((r.get("device", "?"), r.get("host", "?")), []).append(r)
  lines = []
  for (device, host), runs in devices.items():
    speeds = [r["steps_per_second"] for r in runs if r.get("steps_per_second")]
    walls = [r["wall_seconds"] for r in runs if r.get("wall_seconds")]
    if not speeds:
      continue
    speed, wall = np.median(speeds), np.median(walls)
    wall = f"{wall:.0f} s" if wall < 120 else f"{wall / 60:.0f} minutes"
    cells = f"{len(runs)} cells on " if len(devices) > 1 else ""
    fields = dict(cells=cells, device=device, host=host, speed=speed, wall=wall)
    lines += prose.section(__file__, "hardware", step=1 / speed, **fields)
  ce = {r["seed"]: r.get("device") for r in tuned if r["method"] == "ce"}
  mixed = sorted(
      f"{dr.label(r['method'])} s{r['seed']}"
      for r in tuned
      if r["method"] != "ce"
      and r["seed"] in ce
      and r.get("device") != ce[r["seed"]]
  )
  if mixed:
    fields = dict(count=len(mixed), cells=", ".join(mixed))
    lines += prose.section(__file__, "mixed", **fields)
  return lines


def dataset_section(dataset, zero, tuned, plot_dir, problems, source, hint):
  """The lines of one dataset's section (and its plots, if fine-tuned)."""
  seeds, title = DATASETS.get(dataset, 5), dataset
  if dataset in DATASETS:
    title = prose.text(__file__, f"title_{dataset}")
  lines = [f"## {title}", "", *zero_shot_lines(zero, problems), ""]
  if not tuned:
    return lines + ["Fine-tuned cells: none recorded yet."]
  breakdowns = BREAKDOWNS.get(dataset, answers.BREAKDOWNS[:1])
  grid = dr.Grid(tuned, problems, breakdowns)
  plot = os.path.join(plot_dir, f"{dataset}_{{}}.png").format
  # Exact match vs step, mean over seeds, from the zero-shot score at step 0.
  panels = [("\n".join(textwrap.wrap(title, 70)), grid.keys)]
  start = [r["exact_match"] for r in zero]
  dr.plot_curves(grid, plot, panels, start, "fine-tuning step (0: zero-shot)")
  if grid.computed:
    breakdowns = grid.breakdown_sections()
  else:
    hint = prose.text(__file__, "prepare", command=hint) if hint else ""
    no_breakdowns = prose.section(
        __file__, "no_breakdowns", source=source, hint=hint
    )
    breakdowns = ["", *no_breakdowns]
  return lines + prose.section(
      __file__,
      "tuned",
      setup=setup_lines(tuned, grid, source),
      recorded=sum(len(grid.grouped[k]) for k in grid.keys),
      cells=len(dr.METHODS) * seeds,
      losses=len(dr.METHODS),
      seeds=seeds,
      counts=", ".join(
          f"{dr.label(m)} {len(grid.grouped.get(m, {}))}" for m in dr.METHODS
      ),
      values=grid.values(grid.keys),
      paired=grid.versus_ce(),
      dataset=dataset,
      breakdowns=breakdowns,
      reading=grid.reading(seeds),
  )


def write_report(
    runs, problems, out_dir, sources=None, other=(), hints=None
) -> str:
  """Writes results.md and plots/ under ``out_dir``; returns results.md.

  ``problems``, ``sources`` and ``hints`` are per dataset: its test split
  ((question, answer) pairs, or None), where it came from, and the command
  that prepares it; ``other``, the same cells run on another device."""
  sources, hints = sources or {}, hints or {}
  plot_dir = os.path.join(out_dir, "plots")
  os.makedirs(plot_dir, exist_ok=True)
  snapshots = sorted({r.get("snapshot", "?") for r in runs})
  lines = prose.section(__file__, "report", snapshots=", ".join(snapshots))
  for dataset, (zero, tuned) in split_runs(runs).items():
    data = problems.get(dataset), sources.get(dataset, "?"), hints.get(dataset)
    lines += ["", *dataset_section(dataset, zero, tuned, plot_dir, *data)]
  check = dr.device_check([r for r in runs if r.get("method")], other)
  lines += check and ["", *check]
  return report_engine.write(out_dir, ["\n".join(lines).rstrip("\n")], "\n")


def main(results, out_dir, data_dir, other_results=()) -> str:
  """Writes the report of ``results`` (and of ``other_results``, the same
  cells on another device, where they exist); the path of results.md."""
  runs = report_engine.load(results)
  problems, sources, hints = {}, {}, {}
  for dataset, (zero, tuned) in split_runs(runs).items():
    loaded = answers.load(tuned or zero, data_dir, results, dataset=dataset)
    problems[dataset], sources[dataset], hints[dataset] = loaded
  other = [r for path in other_results for r in common.load_results(path)]
  out_dir = out_dir or os.path.dirname(results)
  return write_report(runs, problems, out_dir, sources, other, hints)
