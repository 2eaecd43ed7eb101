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
import numpy as np

from configs import arithmetic_mix
from experiments import common
from experiments import figures
from experiments import labels
from experiments import prose
from experiments import report_engine
from experiments import stats
from experiments import tables
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
EXACT = stats.Metric("exact_match", "exact match (%)", 100, 2)
SPEC = report_engine.Spec(
    columns=(
        EXACT,
        stats.Metric("parsed_rate", "parsed (%)"),
        stats.Metric(
            "mean_log10_abs_error", "mean log10(1+abs err)", 1, 3, False
        ),
        # Minutes include the three evaluations; runs that shared the machine
        # with other jobs took longer.
        stats.Metric("wall_seconds", "minutes / run", 1 / 60, 1, False),
    ),
    paired=(EXACT,),
    # The NTIL variants run on seed 0, by their cells' name prefix.
    variant_labels={
        "ntil-seed0": "NTIL (all on, seed 0)",
        "ntil-no-exp": "Exp off (sigma=0)",
        "ntil-no-rel": "Rel off (alpha=0)",
        "ntil-no-mag": "Mag off (beta=0)",
        "ntil-sigma0.1": "sigma=0.1",
        "ntil-sigma0.5": "sigma=0.5",
        "ntil-lam0.1": "lambda=0.1",
        "ntil-lam1.0": "lambda=1.0",
    },
)
label = SPEC.label


def train_ce(run) -> dict:
  """Train CE per answer token by step (smoothed): a curve of the plots."""
  curves = run["curves"]
  return dict(zip(curves["steps"], plots.smooth(curves["ce"], 8)))


def by_length(run) -> dict:
  """Exact match by the answer's length in characters: a plotted curve."""
  return {int(k): v for k, v in run["exact_match_by_answer_length"].items()}


# The plotted curves: a panel each, titled with its name.
CURVES = (
    stats.Metric(train_ce, "train CE per answer token (smoothed)", 1),
    EXACT._replace(name="test exact match (%)"),
)
BY_LENGTH = stats.Metric(by_length, "test exact match (%) by answer length")
LENGTH = "answer length (characters, e.g. '-8/3' is 4)"


def group_runs(runs):
  """{method or variant: {seed: run}}: main-grid runs by method, the
  ablations' and sweeps' by their name prefix (`digits_report.cell_key`),
  and NTIL's seed 0 apart."""
  grouped = stats.group_runs(runs, digits_report.cell_key)
  if 0 in grouped.get("ntil", {}):
    grouped["ntil-seed0"] = {0: grouped["ntil"][0]}
  return grouped


def reading(grouped):
  """The main table's reading (`tables.reading`: rankings, each method
  against CE paired by seed) and, near the floor, a caveat."""
  runs = [grouped[m].values() for m in METHODS if m in grouped]
  means = [100 * np.mean([r["exact_match"] for r in rs]) for rs in runs]
  best = max(means, default=0.0)
  caveat = prose.section(__file__, "caveat", best=best) if best < 5 else []
  metrics = (EXACT, SPEC.columns[2])
  return tables.reading(grouped, metrics, METHODS, labels.LABELS) + caveat


def write_report(runs, out_dir):
  """Writes results.md and the plots; the path of results.md."""

  def sections(runs, _):
    grouped = group_runs(runs)
    path = os.path.join(out_dir, "plots", "{}.png").format
    title = "arithmetic_mix test"
    figures.seed_bars(
        grouped, METHODS, (EXACT,), path("exact_match"), title, label
    )
    panels = [(m.name, METHODS, m) for m in CURVES]
    figures.curves(grouped, panels, path("curves"), label)
    panels = [(BY_LENGTH.name, METHODS, BY_LENGTH)]
    by = path("by_answer_length")
    figures.curves(grouped, panels, by, label, xlabel=LENGTH)
    variants = [k for k in SPEC.variant_labels if k in grouped]
    ablations = ["Not run yet."]
    if variants:
      ablations = SPEC.variant_table(grouped, variants, (EXACT,))
      ablations += [""] + prose.section(__file__, "ablations")
    main = tables.values_table(grouped, SPEC.rows(METHODS), SPEC.columns)
    fields = dict(
        main_table=main, reading=reading(grouped), ablations=ablations
    )
    return fields, prose.section(__file__, "paper") + [""]

  return report_engine.task_report(__file__, runs, out_dir, sections, ())


def main(argv):
  del argv
  # The llm and digits grids compare their cells with the same ones run on
  # the CPU (results_cpu.json), where some were first run.
  if FLAGS.profile == "llm":
    snapshot = os.path.join(llm_report.HERE, FLAGS.snapshot, "results.json")
    results = FLAGS.results or snapshot
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
    path = write_report(report_engine.load(results), out_dir)
  common.note_grid(results, path)
  print(f"wrote {path} and plots/")


if __name__ == "__main__":
  common.run_main(main)
