"""The experiment runner resumes, records every cell, and the report renders."""

import json
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def run(module, *args):
  result = subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=900)
  assert result.returncode == 0, result.stderr[-3000:]
  return result.stdout


def test_grid_resumes_and_report_renders(tmp_path):
  common = [f"--results={tmp_path / 'results.json'}",
            f"--runs_dir={tmp_path / 'runs'}", f"--data_dir={tmp_path / 'data'}",
            "--profile=smoke", "--groups=main"]
  run("experiments.arithmetic_mix.run", *common, "--max_cells=3")
  first = json.loads((tmp_path / "results.json").read_text())["runs"]
  assert [r["name"] for r in first] == ["ce-s0", "emd-s0", "ntl_mse-s0"]
  out = run("experiments.arithmetic_mix.run", *common)
  runs = json.loads((tmp_path / "results.json").read_text())["runs"]
  assert len(runs) == 10 and runs[:3] == first  # finished cells are skipped
  assert "[1/10]" not in out
  for record in runs:
    assert 0.0 <= record["exact_match"] <= 1.0
    assert record["steps"] == 3 and record["num_test_examples"] == 20
    assert len(record["curves"]["loss"]) == 1
  assert len({r["config_hash"] for r in runs}) == 10
  run("experiments.arithmetic_mix.report",
      f"--results={tmp_path / 'results.json'}", f"--out_dir={tmp_path}")
  report = (tmp_path / "results.md").read_text()
  for label in ("| CE |", "| CE + EMD |", "| CE + NTL-MSE |",
                "| CE + soft labels |", "| CE + NTIL |"):
    assert label in report
  for name in ("exact_match.png", "curves.png", "by_answer_length.png"):
    assert (tmp_path / "plots" / name).stat().st_size > 1000
  # The table's numbers are those of results.json.
  ntil = [100 * r["exact_match"] for r in runs if r["method"] == "ntil"]
  assert f"{sum(ntil) / 2:.2f} ±" in report
