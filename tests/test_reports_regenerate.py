"""Every committed report is what its committed results make.

Each experiment's ``results.md`` is generated from its ``results.json``
(and the predictions and test problems beside it). Regenerating it into a
temporary folder must give the committed file byte for byte: a change to
a report's code that changes its output shows here, and so does a
committed report left stale by new results. The plots are written too; their
names must be the committed ones (their pixels depend on matplotlib's
version).
"""

import pathlib
import sys

import pytest

from tests import launch

ROOT = pathlib.Path(__file__).resolve().parents[1]
EXPERIMENTS = ROOT / "experiments"
ARITHMETIC = EXPERIMENTS / "arithmetic_mix"

# (report command's arguments, the committed folder it writes by default).
REPORTS = {
    "clock_time": (
        ["experiments.clock_time.report"],
        EXPERIMENTS / "clock_time",
    ),
    "grounding": (["experiments.grounding.report"], EXPERIMENTS / "grounding"),
    "arithmetic_mix": (["experiments.arithmetic_mix.report"], ARITHMETIC),
    "digits": (
        ["experiments.arithmetic_mix.report", "--profile=digits"],
        ARITHMETIC / "digits",
    ),
    "digits_long": (
        ["experiments.arithmetic_mix.report", "--profile=digits_long"],
        ARITHMETIC / "digits" / "long",
    ),
    "llm": (
        ["experiments.arithmetic_mix.report", "--profile=llm"],
        ARITHMETIC / "llm" / "SmolLM2-135M-Instruct",
    ),
}


def plot_names(folder: pathlib.Path) -> set[str]:
  plots = folder / "plots"
  return {p.name for p in plots.iterdir()} if plots.is_dir() else set()


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(REPORTS))
def test_report_regenerates_from_its_committed_results(name, tmp_path):
  args, committed = REPORTS[name]
  result = launch.run(
      [sys.executable, "-m", *args, f"--out_dir={tmp_path}"],
      cwd=ROOT,
      capture_output=True,
      text=True,
      timeout=600,
  )
  assert result.returncode == 0, result.stderr[-3000:]
  want = (committed / "results.md").read_text()
  got = (tmp_path / "results.md").read_text()
  assert got == want, (
      f"{committed / 'results.md'} is not what its results make; run "
      f"`python -m {' '.join(args)}` and commit it (or fix the report)."
  )
  assert plot_names(tmp_path) <= plot_names(committed)
  assert plot_names(tmp_path), "the report wrote no plot"
