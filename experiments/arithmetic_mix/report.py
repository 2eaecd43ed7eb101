r"""results.json -> results.md and plots. Every number comes from results.json.

python -m experiments.arithmetic_mix.report
python -m experiments.arithmetic_mix.report --profile=digits  # digits/
python -m experiments.arithmetic_mix.report --profile=llm     # llm/<snapshot>/

The digits profile's report (``digits/results.json`` -> ``digits/results.md``
and ``digits/plots/``) is `experiments.arithmetic_mix.digits_report`; the
pretrained-LLM grid's (``llm/<snapshot>/results.json``) is
`experiments.arithmetic_mix.llm_report`.
"""

import os

from absl import flags
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
import numpy as np

from configs import arithmetic_mix
from experiments import common
from experiments import figures
from experiments import labels
from experiments import prose
from experiments import report_engine
from experiments import stats
from experiments.arithmetic_mix import digits_report
from experiments.arithmetic_mix import llm_report
from train import plots

HERE = os.path.dirname(os.path.abspath(__file__))
FLAGS = flags.FLAGS
flags.DEFINE_enum(
    "profile",
    "default",
    ["default", "digits", "digits_long", "llm"],
    "Which grid's report: default (results.json of the cpu, accelerator or "
    "smoke profile), digits (digits/results.json), digits_long "
    "(digits/results_long.json -> digits/long/) or llm "
    "(llm/<--snapshot>/results.json).",
)
flags.DEFINE_string(
    "snapshot",
    llm_report.DEFAULT_SNAPSHOT,
    "--profile=llm: the snapshot folder's name under llm/.",
)
flags.DEFINE_string(
    "results",
    None,
    "Input; default results.json, digits/results.json for --profile=digits.",
)
flags.DEFINE_string(
    "out_dir",
    None,
    "Where results.md and plots/ go; default this folder, digits/ for "
    "--profile=digits.",
)
flags.DEFINE_string(
    "data_dir",
    "data",
    "The prepared data (digits: the test problems, for the breakdowns).",
)

METHODS = arithmetic_mix.METHODS
LABELS = labels.LABELS
# (group, cell name prefix, label): the NTIL variants run on seed 0.
VARIANTS = (
    ("ablation", "ntil-no-exp", "Exp off (sigma=0)"),
    ("ablation", "ntil-no-rel", "Rel off (alpha=0)"),
    ("ablation", "ntil-no-mag", "Mag off (beta=0)"),
    ("sweep", "ntil-sigma0.1", "sigma=0.1"),
    ("sweep", "ntil-sigma0.5", "sigma=0.5"),
    ("sweep", "ntil-lam0.1", "lambda=0.1"),
    ("sweep", "ntil-lam1.0", "lambda=1.0"),
)


def fmt(values, scale=100.0, digits=2):
  mean, std = stats.mean_std(np.asarray(values) * scale)
  return f"{mean:.{digits}f} ± {std:.{digits}f}"


def by_method(runs):
  """{method: its main-grid runs, by seed}, in `METHODS` order."""
  key = lambda r: r["method"] if r["group"] == "main" else None
  main = stats.group_runs(runs, key)
  return {
      m: [main[m][s] for s in sorted(main[m])] for m in METHODS if m in main
  }


def plot_curves(main, path):
  """Train CE (smoothed) and test exact match vs step, mean over seeds."""
  fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.8))
  for method, runs in main.items():
    style = dict(label=LABELS[method], color=labels.color(method))
    ce = np.mean([r["curves"]["ce"] for r in runs], axis=0)
    left.plot(runs[0]["curves"]["steps"], plots.smooth(ce, 8), **style)
    em = np.mean([r["curves"]["exact_match"] for r in runs], axis=0)
    right.plot(runs[0]["curves"]["eval_steps"], 100 * em, marker="o", **style)
  ylabel = "train CE per answer token (mean over seeds)"
  figures.finish(left, "step", ylabel, fontsize=8)
  ylabel = "test exact match (%, mean over seeds)"
  figures.finish(right, "step", ylabel, fontsize=8)
  figures.save(fig, path, dpi=110)


def plot_by_length(main, path):
  """Exact match by the answer's length in characters, mean over seeds."""
  fig, ax = plt.subplots(figsize=(7, 3.6))
  for method, runs in main.items():
    by_length = [r["exact_match_by_answer_length"] for r in runs]
    lengths = sorted({int(k) for lengths in by_length for k in lengths})
    values = [
        100 * np.mean([b.get(str(k), 0.0) for b in by_length]) for k in lengths
    ]
    ax.plot(
        lengths,
        values,
        marker="o",
        label=LABELS[method],
        color=labels.color(method),
    )
  figures.finish(
      ax,
      "answer length (characters, e.g. '-8/3' is 4)",
      "exact match (%, mean over seeds)",
      fontsize=8,
  )
  figures.save(fig, path, dpi=110)


def reading(main):
  """A plain reading of the main table, computed from the numbers."""
  means = {
      m: stats.mean_std([100 * r["exact_match"] for r in runs])
      for m, runs in main.items()
  }
  versus = []
  if "ntil" in means and "ce" in means:
    gap = means["ntil"][0] - means["ce"][0]
    # Standard error of the difference of two means over seeds.
    stderr = np.sqrt(
        sum(means[m][1] ** 2 / len(main[m]) for m in ("ntil", "ce"))
    )
    kind = "untestable" if np.isnan(stderr) else "noise"
    if abs(gap) > 2 * stderr:
      kind = "beyond"
    versus += prose.section(
        __file__,
        f"gap_{kind}",
        gap=gap,
        twice=2 * stderr,
        direction="better" if gap > 0 else "worse",
    )
  if "ntil" in means:
    better = [LABELS[m] for m in means if means[m][0] > means["ntil"][0]]
    if better:
      versus.append(
          f"- Methods with a higher mean than NTIL: {', '.join(better)}."
      )
  errors = {
      m: stats.mean_std([r["mean_log10_abs_error"] for r in runs])
      for m, runs in main.items()
  }
  best = max(mean for mean, _ in means.values())
  return prose.section(
      __file__,
      "reading",
      ranking=", ".join(
          f"{LABELS[m]} {means[m][0]:.2f}%"
          for m in sorted(means, key=lambda m: -means[m][0])
      ),
      spread=np.nanmean([s for _, s in means.values()]),
      versus=versus,
      errors=", ".join(
          f"{LABELS[m]} {errors[m][0]:.3f} ± {errors[m][1]:.3f}"
          for m in sorted(errors, key=lambda m: errors[m][0])
      ),
      caveat=prose.section(__file__, "caveat", best=best) if best < 5 else [],
  )


def ablation_rows(runs, main):
  """(label, runs) of NTIL on seed 0 and of each recorded variant."""
  ntil = [r for r in main.get("ntil", []) if r["seed"] == 0]
  rows = [("NTIL (all on, seed 0)", ntil)]
  for group, prefix, label in VARIANTS:
    named = [r for r in runs if r["name"].startswith(prefix + "-")]
    rows.append((label, [r for r in named if r["group"] == group]))
  return [(label, cells) for label, cells in rows if cells]


def write_report(runs, out_dir):
  plot_dir = os.path.join(out_dir, "plots")
  os.makedirs(plot_dir, exist_ok=True)
  main = by_method(runs)
  figures.seed_bars(
      {m: {r["seed"]: r for r in runs} for m, runs in main.items()},
      list(main),
      (stats.Metric("exact_match", "exact match (%)"),),
      os.path.join(plot_dir, "exact_match.png"),
      "arithmetic_mix test",
      LABELS.get,
  )
  plot_curves(main, os.path.join(plot_dir, "curves.png"))
  plot_by_length(main, os.path.join(plot_dir, "by_answer_length.png"))
  # Minutes include the three evaluations; runs that shared the machine with
  # other jobs took longer.
  main_rows = [
      f"| {LABELS[method]} | {len(method_runs)} | "
      f"{fmt([r['exact_match'] for r in method_runs])} | "
      f"{fmt([r['parsed_rate'] for r in method_runs], digits=1)} | "
      f"{fmt([r['mean_log10_abs_error'] for r in method_runs], 1, 3)} | "
      f"{np.mean([r['wall_seconds'] for r in method_runs]) / 60:.1f} |"
      for method, method_runs in main.items()
  ]
  # The set-up from the first record: profile, model, steps, batch_size,
  # num_test_examples, device and host.
  fields = dict(runs[0], main_rows=main_rows, reading=reading(main))
  lines = prose.section(__file__, "report", **fields) + [""]
  rows = ablation_rows(runs, main)
  if rows:
    lines += prose.section(
        __file__,
        "ablations",
        rows=[
            f"| {label} | {len(cells)} | "
            f"{fmt([r['exact_match'] for r in cells])} |"
            for label, cells in rows
        ],
    )
  else:
    lines.append("Not run yet.")
  lines += [""] + prose.section(__file__, "paper")
  report_engine.write(out_dir, lines, end="\n")


def main(argv):
  del argv
  # The llm and digits grids compare their cells with the same ones run on
  # the CPU (results_cpu.json), where some were first run.
  if FLAGS.profile == "llm":
    results = FLAGS.results or os.path.join(
        llm_report.HERE, FLAGS.snapshot, "results.json"
    )
    cpu = os.path.join(os.path.dirname(results), "results_cpu.json")
    path = llm_report.main(results, FLAGS.out_dir, FLAGS.data_dir, [cpu])
  elif FLAGS.profile in digits_report.PROFILES:
    name, folder = digits_report.PROFILES[FLAGS.profile]
    results = FLAGS.results or os.path.join(digits_report.HERE, name)
    out_dir = FLAGS.out_dir or os.path.join(digits_report.HERE, folder)
    cpu = os.path.join(digits_report.HERE, "results_cpu.json")
    path = digits_report.main(
        results, out_dir, FLAGS.data_dir, FLAGS.profile, [cpu]
    )
  else:
    results = FLAGS.results or os.path.join(HERE, "results.json")
    out_dir = FLAGS.out_dir or HERE
    write_report(report_engine.load(results), out_dir)
    path = os.path.join(out_dir, "results.md")
  common.note_failures(results, path)
  print(f"wrote {path} and plots/")


if __name__ == "__main__":
  common.run_main(main)
