"""The experiment runner resumes, records every cell, and the report renders."""

import json
import logging
import math
import os
import pathlib
import shutil
import sys

import ml_collections
import pytest

from experiments import common as results_io
from experiments import stats
from experiments import tables
from train import errors

from tests import launch

ROOT = pathlib.Path(__file__).resolve().parents[1]


def run(module, *args):
  result = launch.run(
      [sys.executable, "-m", module, *args],
      cwd=ROOT,
      capture_output=True,
      text=True,
      timeout=900,
  )
  assert result.returncode == 0, result.stderr[-3000:]
  return result.stdout


@pytest.mark.slow
def test_digits_profile_records_what_its_report_needs(tmp_path):
  common = [
      "experiments.arithmetic_mix.run",
      f"--results={tmp_path / 'results.json'}",
      f"--runs_dir={tmp_path / 'runs'}",
      f"--data_dir={tmp_path / 'data'}",
      "--profile=digits_smoke",
  ]
  run(*common, "--groups=control,ablation", "--max_cells=2")
  runs = results_io.load_results(tmp_path / "results.json")
  assert [r["name"] for r in runs] == ["ce-digit-weight-s0", "ntil-no-exp-s0"]
  assert runs[0]["overrides"] == {"digit_ce_weight": 0.3}
  assert runs[1]["overrides"] == {"sigma": 0.0}
  for record in runs:
    assert record["data"] == dict(
        module="arithmetic__add_or_sub", difficulty="easy"
    )
    assert record["problems_seen"] == 3 * 8  # each problem read once
    assert len(record["predictions"]) == record["num_test_examples"] == 20
    assert 0.0 <= record["within_1_percent"] <= 1.0
  # Its own dataset: multi-digit answers, named by module and difficulty.
  (prepared,) = (tmp_path / "data" / "arithmetic_mix").iterdir()
  assert prepared.name == "add_or_sub-easy_train24_test20_seed0"
  # The chunk group: the same problems in tokens of 1-3 digits; --methods
  # leaves the other losses' cells (CE's first) for later.
  run(*common, "--groups=chunks", "--methods=emd", "--max_cells=1")
  chunked = results_io.load_results(tmp_path / "results.json")[-1]
  assert chunked["name"] == "emd-chunks-s0" and chunked["group"] == "chunks"
  assert chunked["method"] == "emd"
  assert chunked["overrides"] == {"digit_chunks": True}
  assert len(chunked["predictions"]) == chunked["num_test_examples"] == 20
  assert len({r["config_hash"] for r in runs + [chunked]}) == 3


@pytest.mark.slow
def test_grid_resumes_and_report_renders(tmp_path):
  common = [
      f"--results={tmp_path / 'results.json'}",
      f"--runs_dir={tmp_path / 'runs'}",
      f"--data_dir={tmp_path / 'data'}",
      "--profile=smoke",
      "--groups=main",
  ]
  run("experiments.arithmetic_mix.run", *common, "--max_cells=3")
  first = results_io.load_results(tmp_path / "results.json")
  assert [r["name"] for r in first] == ["ce-s0", "emd-s0", "ntl_mse-s0"]
  # The rest by two processes at once, each taking the next unclaimed cell.
  out = run("experiments.arithmetic_mix.run", *common, "--workers=2")
  runs = results_io.load_results(tmp_path / "results.json")
  assert len(runs) == 10 and runs[:3] == first  # finished cells are skipped
  assert sorted(r["name"] for r in runs) == sorted(
      f"{m}-s{s}"
      for m in ("ce", "emd", "ntl_mse", "soft_label", "ntil")
      for s in (0, 1)
  )  # every cell once: no two workers ran the same one
  assert "[1/10]" not in out
  for record in runs:
    assert 0.0 <= record["exact_match"] <= 1.0
    assert record["steps"] == 3 and record["num_test_examples"] == 20
    assert len(record["curves"]["loss"]) == 1
  assert len({r["config_hash"] for r in runs}) == 10
  # Every run read the one prepared dataset, and says so (both workers).
  (read,) = {json.dumps(r["prepared_data"], sort_keys=True) for r in runs}
  assert json.loads(read)["dataset"].startswith("arithmetic_mix/train"), read
  run(
      "experiments.arithmetic_mix.report",
      f"--results={tmp_path / 'results.json'}",
      f"--out_dir={tmp_path}",
  )
  report = (tmp_path / "results.md").read_text()
  for label in (
      "| CE |",
      "| CE + EMD |",
      "| CE + NTL-MSE |",
      "| CE + soft labels |",
      "| CE + NTIL |",
  ):
    assert label in report
  for name in ("exact_match.png", "curves.png", "by_answer_length.png"):
    assert (tmp_path / "plots" / name).stat().st_size > 1000
  # The table's numbers are those of results.json.
  ntil = [100 * r["exact_match"] for r in runs if r["method"] == "ntil"]
  assert f"{sum(ntil) / 2:.2f} ±" in report


@pytest.mark.slow
def test_clock_grid_pairs_seeds_and_report_renders(tmp_path):
  common = [
      f"--results={tmp_path / 'results.json'}",
      f"--runs_dir={tmp_path / 'runs'}",
      f"--data_dir={tmp_path / 'data'}",
      "--profile=smoke",
  ]
  run(
      "experiments.clock_time.run",
      *common,
      "--groups=main,control",
      "--max_runs=2",
  )
  first = results_io.load_results(tmp_path / "results.json")
  assert [(r["method"], r["seed"]) for r in first] == [("ce", 0), ("emd", 0)]
  run("experiments.clock_time.run", *common)
  runs = results_io.load_results(tmp_path / "results.json")
  # smoke: 5 methods x 2 seeds, 2 controls x 2 seeds, 3 ablations + 4
  # sweeps + 2 long x 1 seed; the same 5 x 2 and 2 x 2 at the converged
  # budget and a CE and NTIL check x 2 seeds; finished runs are not run
  # again.
  assert len(runs) == 10 + 4 + 9 + 10 + 4 + 4 and runs[:2] == first
  assert {r["steps"] for r in runs if r["group"] == "long"} == {4}
  assert {
      r["steps"]
      for r in runs
      if r["group"] in ("converged", "converged_control")
  } == {8}
  assert {r["steps"] for r in runs if r["group"] == "convergence_check"} == {16}
  converged = {
      (r["method"], r["seed"]) for r in runs if r["group"] == "converged"
  }
  assert converged == {
      (m, s)
      for m in ("ce", "emd", "ntl_mse", "soft_label", "ntil")
      for s in (0, 1)
  }
  assert len({r["config_hash"] for r in runs}) == len(runs)
  assert {r["prepared_data"]["dataset"] for r in runs} == {
      "clock_time/train64_test16_seed0/1.0.0"
  }
  variants = {(r["variant"], r["method"]) for r in runs}
  assert {
      ("ce_digit_weighted", "ce"),
      ("ntil_reference", "ntil"),
      ("exp_off", "ntil"),
      ("sigma=0.5", "ntil"),
      ("lam=1.0", "ntil"),
  } <= variants
  for record in runs:
    assert record["num_test_examples"] == record["test_split_examples"] == 16
    assert len(record["predictions"]) == 16
    assert 0 <= record["mean_time_gap_minutes"] <= 360
    # Evals every 2 steps, up to the run's last.
    assert record["curves"]["eval_steps"] == list(
        range(2, record["steps"] + 1, 2)
    )
  run(
      "experiments.clock_time.report",
      f"--results={tmp_path / 'results.json'}",
      f"--out_dir={tmp_path}",
  )
  report = (tmp_path / "results.md").read_text()
  for label in (
      "| CE |",
      "| CE + EMD |",
      "| CE + NTIL |",
      "CE, digit tokens weighted 1 + 0.3",
      "NTIL, Exp off",
      "NTIL, lambda = 1.0",
      "Qwen2-VL (2b)",
      "## Two regimes",
      "steps to 50% exact",
      "final exact match %",
      "## Converged budget (8 steps)",
      "Doubling the budget again (16 steps), CE:",
      "Doubling the budget again (16 steps), CE + NTIL:",
      "NTIL - CE on the same seed, at the converged budget -> at twice it",
  ):
    assert label in report, label
  for name in (
      "main.png",
      "main_600.png",
      "curves.png",
      "paired.png",
      "paired_600.png",
      "predictions.png",
  ):
    assert (tmp_path / "plots" / name).stat().st_size > 1000
  # The table's numbers are those of results.json.
  ntil = [r for r in runs if r["variant"] == "main" and r["method"] == "ntil"]
  gap = sum(r["mean_time_gap_minutes"] for r in ntil) / len(ntil)
  assert "| CE + NTIL | 2 | " in report and f"{gap:.2f} ±" in report
  assert "No streamed run recorded yet." in report
  check_stream_section(
      "experiments.clock_time.report",
      tmp_path,
      runs,
      lambda r: r["group"] in ("main", "converged"),
      "exact_match",
      {
          "### 2 steps": "regimes_paired_600.png",
          "### 8 steps": "regimes_paired.png",
      },
      lambda r: r["group"] == "main",
  )


def check_stream_section(
    module, tmp_path, runs, copied, metric, budgets, first_budget
):
  """Renders the report with ``copied`` runs again as streamed ones (same
  numbers), and checks the fixed set vs stream section against them."""
  streamed = [
      dict(r, regime="stream", name="stream-" + r["name"])
      for r in runs
      if copied(r)
  ]
  both = tmp_path / "both"
  both.mkdir()
  (both / "results.json").write_text(json.dumps(dict(runs=runs + streamed)))
  run(module, f"--results={both / 'results.json'}", f"--out_dir={both}")
  report = (both / "results.md").read_text()
  section = report.split("## Fixed set vs stream")[1].split("\n## ")[0]
  ce = [r for r in runs if copied(r) and first_budget(r)]
  ce = [r for r in ce if r["method"] == "ce" and r["variant"] == "main"]
  early = stats.fmt([100 * r["curves"][metric][0] for r in ce], 1)
  end = stats.fmt([100 * r["curves"][metric][-1] for r in ce], 1)
  # The same runs in both regimes: the same cells side by side.
  assert f"| CE | {early} | {end} | {early} | {end} |" in section
  assert "Runs per regime: CE: fixed 2, stream 2;" in section
  for title, plot in budgets.items():
    assert title in section, title
    assert (both / "plots" / plot).stat().st_size > 1000


@pytest.mark.slow
def test_clock_grid_runs_a_streamed_cell(tmp_path):
  common = [
      f"--results={tmp_path / 'results.json'}",
      f"--runs_dir={tmp_path / 'runs'}",
      f"--data_dir={tmp_path / 'data'}",
      "--profile=smoke",
  ]
  run(
      "experiments.clock_time.run",
      *common,
      "--groups=stream_control,stream",
      "--max_runs=1",
  )
  (record,) = results_io.load_results(tmp_path / "results.json")
  assert record["regime"] == "stream"
  assert (record["group"], record["variant"], record["method"]) == (
      "stream_control",
      "ce_digit_weighted",
      "ce",
  )
  assert record["overrides"] == {"digit_ce_weight": 0.3, "train_stream": True}
  assert record["name"] == "stream-ce_digit_weighted-s0"
  assert record["steps"] == 2 and len(record["predictions"]) == 16
  # The test split alone was prepared for it: no train clocks on disk.
  (prepared,) = (tmp_path / "data" / "clock_time").iterdir()
  assert prepared.name == "train0_test16_seed0"
  (workdir,) = (tmp_path / "runs" / "smoke").glob(f"{record['name']}-*")
  config = json.loads((workdir / "config.json").read_text())["config"]
  assert config["train_stream"] is True
  assert config["dataset_config"] == "train0_test16_seed0"


@pytest.mark.slow
def test_grounding_grid_runs_a_streamed_cell(tmp_path):
  run(
      "experiments.grounding.run",
      f"--results={tmp_path / 'results.json'}",
      f"--runs_dir={tmp_path / 'runs'}",
      f"--data_dir={tmp_path / 'data'}",
      "--profile=smoke",
      "--groups=stream_single",
      "--max_runs=1",
  )
  (record,) = results_io.load_results(tmp_path / "results.json")
  assert record["regime"] == "stream"
  assert (record["task"], record["method"], record["seed"]) == (
      "grounding_single",
      "ce",
      0,
  )
  assert record["name"] == "stream-grounding_single-ce-s0"
  assert record["overrides"] == {"train_stream": True}
  assert 0 <= record["acc_at_50"] <= 1
  (prepared,) = (tmp_path / "data" / "grounding_single").iterdir()
  assert prepared.name == "train0_test16_seed0"


def test_digits_grid_runs_ntils_peers_on_numbers_in_chunks_too():
  from experiments.arithmetic_mix import run as arithmetic  # pylint: disable=g-import-not-at-top

  cells = arithmetic.grid("digits")
  assert [c[1] for c in cells["chunks_peers"][:2]] == [
      "del-chunks-s0",
      "smmd-chunks-s0",
  ]
  assert len(cells["chunks_peers"]) == 15 and len(cells["chunks"]) == 15
  hashes = set()
  for group in ("peers", "chunks", "chunks_peers"):
    for _, name, method, seed, overrides in cells[group]:
      config = arithmetic.cell_config("digits", method, seed, overrides, "d")
      assert config.digit_chunks == (group != "peers")
      hashes.add((name, arithmetic.config_hash(config, "digits")))
  # No two cells share a name or a configuration.
  assert len({n for n, _ in hashes}) == len({h for _, h in hashes}) == 45
  # The 3,200-step grid has neither.
  assert "chunks_peers" not in arithmetic.grid("digits_long")


def test_grounding_long_stream_cells_double_the_steps_in_their_own_dirs():
  from experiments.grounding import grid  # pylint: disable=g-import-not-at-top

  cells = grid.grid("cpu")
  steps = grid.PROFILES["cpu"]["train_steps"]
  assert (
      len(cells["stream_long"]) == 25 and len(cells["stream_long_control"]) == 5
  )
  names = set()
  for group in ("stream", "stream_long", "stream_long_control"):
    for task, variant, method, seed, overrides in cells[group]:
      assert overrides["train_stream"] is True
      config = grid.cell_config("cpu", task, method, seed, overrides, "data")
      long = group != "stream"
      assert config.train_steps == (2 * steps if long else steps)
      assert config.dataset_config.startswith("train0_")
      name = grid.run_name(group, task, variant, method, seed)
      assert name.startswith("stream-long-" if long else "stream-grounding")
      names.add(name)
  assert len(names) == 25 + 25 + 5  # no two cells share a work directory
  assert grid.run_name("stream", "grounding", "main", "ce", 0) == (
      "stream-grounding-ce-s0"  # the recorded runs' names
  )


def test_grounding_stream_section_keeps_budgets_apart(tmp_path):
  from experiments.grounding import report  # pylint: disable=g-import-not-at-top

  def record(method, seed, regime, steps, curve):
    return dict(
        task="grounding",
        variant="main",
        method=method,
        seed=seed,
        regime=regime,
        steps=steps,
        curves=dict(eval_steps=[steps // 2, steps], acc_at_50=curve),
    )

  fixed = [
      record(m, s, "fixed", 1200, [0.1, 0.2])
      for m in ("ce", "ntil")
      for s in (0, 1)
  ]
  streamed = [
      record("ce", 0, "stream", 1200, [0.1, 0.3]),
      record("ce", 1, "stream", 1200, [0.1, 0.4]),
      record("ntil", 0, "stream", 1200, [0.1, 0.35]),
      record("ntil", 1, "stream", 1200, [0.1, 0.45]),
      record("ce", 0, "stream", 2400, [0.3, 0.5]),
      record("ce", 1, "stream", 2400, [0.4, 0.5]),
  ]
  (tmp_path / "plots").mkdir()
  lines = report.stream_section(fixed, streamed, str(tmp_path))
  text = "\n".join(lines)
  short = text.index("### grounding, 1,200 steps")
  long = text.index("### grounding, 2,400 steps (Acc@0.5; streamed only)")
  assert short < long
  # 1,200 steps: both regimes; NTIL is +5 points on both streamed seeds.
  assert "| CE | 10.0 ± 0.0 | 20.0 ± 0.0 | 10.0 ± 0.0 | 35.0 ± 7.1 |" in text
  # The same +5 on both seeds: no t, the sign test (2 / 2**2).
  assert "| 40.0 ± 7.1 (+5.0: 2/2, p = 0.500) |" in text[short:long]
  # CE's last interval: +20 and +30 points at 1,200; +20 and +10 at 2,400.
  assert "+20.0 to +30.0 points (mean +25.0, 2 seeds)" in text[short:long]
  assert (
      "+10.0 to +20.0 points (mean +15.0, 2 seeds) over its last 1,200 "
      "steps (1,200 -> 2,400)" in text[long:]
  )
  # No fixed-set run has 2,400 steps: the long table is streamed only, and
  # its CE row holds the 2,400-step runs alone.
  table = text[long:].split("\n\n")[1]
  assert "fixed set" not in table and "NTIL" not in table
  assert "| CE | 35.0 ± 7.1 | 50.0 ± 0.0 |" in table


def test_grounding_stream_at_the_ceiling_adds_the_exact_box(tmp_path):
  from experiments.grounding import report  # pylint: disable=g-import-not-at-top

  def record(method, seed, regime, acc, exact, error=0.0, coordinates=0.0):
    return dict(
        task="grounding_single",
        variant="main",
        method=method,
        seed=seed,
        regime=regime,
        steps=1200,
        curves=dict(eval_steps=[600, 1200], acc_at_50=acc, exact_match=exact),
        mean_coordinate_error=error,
        coordinate_accuracy=coordinates,
    )

  fixed = [record("ce", s, "fixed", [0.6, 0.65], [0.0, 0.0]) for s in (0, 1)]
  streamed = [
      record("ce", 0, "stream", [0.9, 0.99], [0.1, 0.5], 0.2, 0.8),
      record("ce", 1, "stream", [0.9, 0.99], [0.1, 0.4], 0.3, 0.7),
      record("emd", 0, "stream", [0.9, 0.98], [0.2, 0.6], 0.1, 0.9),
      record("emd", 1, "stream", [0.9, 0.98], [0.2, 0.5], 0.25, 0.7),
  ]
  (tmp_path / "plots").mkdir()
  text = "\n".join(report.stream_section(fixed, streamed, str(tmp_path)))
  exact = text.index("### grounding_single, 1,200 steps (exact box)")
  assert "Acc@0.5 >= 90%" in text[:exact]
  # EMD: one point below CE at Acc@0.5, ten above on the exact box.
  assert "| 98.0 ± 0.0 (-1.0: 0/2" in text[:exact]
  assert "| 55.0 ± 7.1 (+10.0: 2/2" in text[exact:]
  assert (
      tmp_path / "plots" / "regimes_paired_grounding_single_exact.png"
  ).exists()
  # How close the boxes are: CE 0.2, 0.3 px; EMD 0.1, 0.25, lower (better)
  # on both seeds: Δ -0.1, -0.05 (mean -0.075, sd 0.035, t = -3 with 1
  # degree of freedom: p = 1 - 2 atan(3) / pi = 0.205). Coordinates exact:
  # CE 80, 70 %; EMD 90, 70: Δ +10, 0 (mean +5, sd 7.1, better on 1 of 2,
  # t = 1, p = 0.5).
  closeness = text[text.index("How close the streamed boxes") :]
  assert "| CE | 2 | 0.250 ± 0.071 |  |  |  | 75.0 ± 7.1 |" in closeness
  assert (
      "| CE + EMD | 2 | 0.175 ± 0.106 | -0.075 ± 0.035 | 2/2 | -3.00 (p = 0.205)"
      " | 80.0 ± 14.1 | +5.0 ± 7.1 | 1/2 | +1.00 (p = 0.500) |"
  ) in closeness
  # Below the ceiling there is no exact-box section.
  for run in streamed:
    run["curves"]["acc_at_50"] = [0.5, 0.8]
  text = "\n".join(report.stream_section(fixed, streamed, str(tmp_path)))
  assert "(exact box)" not in text


def test_learning_speed_metrics_by_hand():
  from experiments.clock_time import report  # pylint: disable=g-import-not-at-top

  run_record = dict(
      curves=dict(
          eval_steps=[150, 300, 450, 600], exact_match=[0, 0.2, 0.6, 0.8]
      )
  )
  # 50% is crossed between step 300 (20%) and 450 (60%): 300 + 150 * 0.75.
  assert report.steps_to(run_record) == 412.5
  assert math.isnan(report.steps_to(run_record, threshold=0.9))
  # Trapezoids from (0, 0): 0 + 15 + 60 + 105 = 180 over 600 steps.
  assert stats.curve_area(run_record) == 0.3  # the clock report's metric


@pytest.mark.slow
def test_grounding_grid_pairs_seeds_and_report_renders(tmp_path):
  common = [
      f"--results={tmp_path / 'results.json'}",
      f"--runs_dir={tmp_path / 'runs'}",
      f"--data_dir={tmp_path / 'data'}",
      "--profile=smoke",
  ]
  run(
      "experiments.grounding.run",
      *common,
      "--groups=main,control,multi",
      "--max_runs=2",
  )
  first = results_io.load_results(tmp_path / "results.json")
  assert [(r["method"], r["seed"]) for r in first] == [("ce", 0), ("emd", 0)]
  run("experiments.grounding.run", *common, "--groups=main,control,multi")
  runs = results_io.load_results(tmp_path / "results.json")
  # smoke: 5 methods x 2 seeds, 2 controls x 2 seeds, CE and NTIL x 2 seeds
  # on grounding_multi; finished runs are not run again.
  assert len(runs) == 10 + 4 + 4 and runs[:2] == first
  assert {r["method"] for r in runs if r["task"] == "grounding_multi"} == {
      "ce",
      "ntil",
  }
  assert len({r["config_hash"] for r in runs}) == len(runs)
  assert {r["task"] for r in runs} == {"grounding", "grounding_multi"}
  assert {("ntil_reference", "ntil"), ("main", "emd")} <= {
      (r["variant"], r["method"]) for r in runs
  }
  for record in runs:
    assert record["num_test_examples"] == 16
    assert len(record["predictions"]) == 16
    assert record["curves"]["eval_steps"] == [1, 2]
    if record["task"] == "grounding":
      assert 0 <= record["acc_at_50"] <= 1
      assert 0 <= record["mean_coordinate_error"] <= 48
    else:
      assert 0 <= record["f1_at_50"] <= 1
  run(
      "experiments.grounding.report",
      f"--results={tmp_path / 'results.json'}",
      f"--out_dir={tmp_path}",
  )
  report = (tmp_path / "results.md").read_text()
  for label in (
      "| CE |",
      "| CE + NTIL |",
      "CE, digit tokens weighted 1 + 0.3",
      "Qwen2-VL (2b)",
      "on another object",
      "F1@0.5 %",
  ):
    assert label in report, label
  for task in ("grounding", "grounding_multi"):
    for name in ("main", "curves", "paired", "predictions"):
      assert (tmp_path / "plots" / f"{task}_{name}.png").stat().st_size > 1000
  # The table's numbers are those of results.json.
  ntil = [
      100 * r["acc_at_50"]
      for r in runs
      if r["task"] == "grounding"
      and r["variant"] == "main"
      and r["method"] == "ntil"
  ]
  assert f"| CE + NTIL | 2 | {sum(ntil) / 2:.1f} ±" in report
  # Early in training: NTIL - CE at the first eval, paired by seed.
  first_eval = {
      (r["method"], r["seed"]): 100 * r["curves"]["acc_at_50"][0]
      for r in runs
      if r["task"] == "grounding" and r["variant"] == "main"
  }
  early = report.split("### Early in training")[1].split("###")[0]
  delta = sum(first_eval["ntil", s] - first_eval["ce", s] for s in (0, 1)) / 2
  assert "Acc@0.5 at step 1" in early
  assert f"| CE + NTIL | 2 | {delta:+.1f}" in early
  check_stream_section(
      "experiments.grounding.report",
      tmp_path,
      runs,
      lambda r: r["task"] == "grounding",
      "acc_at_50",
      {"### grounding, 2 steps (Acc@0.5": "regimes_paired_grounding.png"},
      lambda r: True,
  )


def test_results_file_is_one_line_per_run_and_round_trips(tmp_path):
  path = str(tmp_path / "results.json")
  runs = [
      dict(name="a", curves=dict(steps=[1, 2], loss=[0.5, 0.25])),
      dict(name="b", predictions=["01,02,03,04", "x"], value=float("nan")),
  ]
  results_io.save_results(path, runs)
  lines = pathlib.Path(path).read_text().splitlines()
  assert len(lines) == 2 + len(runs)  # the opening, a line per run, the end
  loaded = results_io.load_results(path)
  assert loaded[0] == runs[0]
  assert loaded[1]["predictions"] == runs[1]["predictions"]
  assert math.isnan(loaded[1]["value"])
  results_io.save_results(path, loaded + [dict(name="c")])
  assert [r["name"] for r in results_io.load_results(path)] == ["a", "b", "c"]
  assert not pathlib.Path(path + ".tmp").exists()


def test_workers_share_one_gpu_memory_and_cpu_threads(monkeypatch):
  started = []

  class Process:

    def __init__(self, command, env):
      started.append((command, env))

    def wait(self):
      return 0

  monkeypatch.setattr(results_io.subprocess, "Popen", Process)
  monkeypatch.delenv("XLA_PYTHON_CLIENT_MEM_FRACTION", raising=False)
  argv = ["run.py", "--groups=main", "--workers=3"]
  assert results_io.spawn_workers("experiments.x.run", argv, 3) == 0
  assert len(started) == 3
  for command, env in started:
    assert command[-3:] == ["experiments.x.run", "--groups=main", "--workers=1"]
    assert env["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.30"  # 0.9 / 3
    assert results_io.ONE_THREAD_XLA in env["XLA_FLAGS"]
  # A fraction the user set is kept.
  started.clear()
  monkeypatch.setenv("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.2")
  results_io.spawn_workers("experiments.x.run", argv, 3)
  assert {env["XLA_PYTHON_CLIENT_MEM_FRACTION"] for _, env in started} == {
      "0.2"
  }


def test_a_cell_limit_is_the_commands_not_each_workers(monkeypatch):
  started = []

  class Process:

    def __init__(self, command, env):
      del env
      started.append(command)

    def wait(self):
      return 0

  monkeypatch.setattr(results_io.subprocess, "Popen", Process)
  for argv, workers, limits in (
      (["run.py", "--max_cells=1", "--workers=2"], 2, ["--max_cells=1"]),
      (["run.py", "--max_runs", "5"], 2, ["--max_runs=3", "--max_runs=2"]),
      (["run.py", "--max_cells=0"], 2, ["--max_cells=0"] * 2),
  ):
    started.clear()
    results_io.spawn_workers("experiments.x.run", argv, workers)
    assert [c[-2] for c in started] == limits, started


def test_grids_with_other_results_files_get_runs_of_their_own(tmp_path):
  """The CPU's results beside the accelerator's in one folder: the second
  grid found the first's finished runs by config hash and recorded them as
  its own, evaluated again."""
  runs, default = str(tmp_path / "runs"), str(tmp_path / "results.json")
  cpu = str(tmp_path / "results_cpu.json")
  own = results_io.grid_runs_dir(runs, cpu, default, False)
  assert own.startswith(os.path.join(runs, "results_cpu-")) and own != runs
  assert results_io.grid_runs_dir(runs, default, default, False) == runs
  assert results_io.grid_runs_dir(runs, cpu, default, True) == runs  # given


def test_predictions_are_kept_apart_one_file_per_group(tmp_path):
  path = str(tmp_path / "results.json")
  runs = [
      dict(name="a", group="main", config_hash="h1", predictions=["1", "2"]),
      dict(name="b", group="stream", config_hash="h2", predictions=["3"]),
      dict(name="c", group="stream", config_hash="h3", predictions=["4"]),
  ]
  results_io.save_results(path, [dict(run) for run in runs])
  assert "predictions" not in pathlib.Path(path).read_text()
  folder = tmp_path / "results_predictions"
  assert sorted(p.name for p in folder.iterdir()) == [
      "main.json",
      "stream.json",
  ]
  stream = json.loads((folder / "stream.json").read_text())
  assert stream == {"h2": ["3"], "h3": ["4"]}
  assert results_io.load_results(path) == runs
  # A rewrite without a group's runs leaves no stale file behind.
  results_io.save_results(path, [dict(runs[1])])
  assert [p.name for p in folder.iterdir()] == ["stream.json"]
  assert results_io.load_results(path) == [runs[1]]
  # Records written before the split (predictions inline) still load.
  pathlib.Path(path).write_text(json.dumps({"runs": [runs[0]]}))
  assert results_io.load_results(path) == [runs[0]]
  # A half-finished append (predictions written, record not) loads nothing.
  results_io.save_results(path, [])
  assert results_io.load_results(path) == []


def test_append_keeps_every_run_and_its_predictions(tmp_path):
  path = str(tmp_path / "results.json")
  for i in range(3):
    results_io.append_result(
        path,
        dict(
            name=f"r{i}",
            group="g",
            config_hash=f"h{i}",
            predictions=[str(i)] * 3,
        ),
    )
  loaded = results_io.load_results(path)
  assert [r["predictions"] for r in loaded] == [["0"] * 3, ["1"] * 3, ["2"] * 3]
  # The same cell recorded again (another grid process ran it too): the
  # first record stands.
  again = dict(name="r1", group="g", config_hash="h1", predictions=["9"] * 3)
  results_io.append_result(path, again)
  assert results_io.load_results(path) == loaded


def test_a_resumed_run_records_the_seconds_of_every_session(
    tmp_path, monkeypatch
):
  # A first session stopped by a signal after 30 s (its checkpoint saved),
  # the second resumes and finishes in 5 s: the record says 35 s, not 5.
  workdir = tmp_path / "run"
  clock = iter([100.0, 130.0, 200.0, 205.0, 300.0, 307.0])
  monkeypatch.setattr(
      results_io, "time", type("Clock", (), {"time": lambda: next(clock)})
  )
  sessions = [dict(stopped_early=b) for b in (True, False, False)]

  def train_and_evaluate(config, workdir):
    del config
    (pathlib.Path(workdir) / "checkpoints" / "10").mkdir(parents=True)
    return sessions.pop(0)

  monkeypatch.setattr(
      results_io.train, "train_and_evaluate", train_and_evaluate
  )
  with pytest.raises(KeyboardInterrupt):
    results_io.train_once(None, str(workdir))
  monkeypatch.setattr(
      results_io.train,
      "train_and_evaluate",
      lambda config, workdir: sessions.pop(0),
  )
  _, seconds = results_io.train_once(None, str(workdir))
  assert seconds == 35.0
  assert (workdir / results_io.WALL_SECONDS).read_text() == "35.0\n"
  # Its checkpoints deleted (an LLM grid's, once recorded), the run trained
  # again from step 0 takes its own 7 s, not 42.
  shutil.rmtree(workdir / "checkpoints")
  _, seconds = results_io.train_once(None, str(workdir))
  assert seconds == 7.0


def _grid(
    tmp_path,
    executed,
    fail_append=False,
    monkeypatch=None,
    raises=None,
    results_name="results.json",
    runs_dir=None,
):
  """A two-cell grid whose runs are recorded by hand: cell -> record.

  ``raises`` maps a cell to the exception its run raises.
  """
  results = tmp_path / results_name

  def execute(cell, digest):
    executed.append(cell)
    if raises and cell in raises:
      raise raises[cell]
    return dict(
        name=cell,
        group="main",
        config_hash=digest,
        wall_seconds=1.0,
        score=len(cell),
        predictions=[cell.upper()],
    )

  if fail_append:

    def crash(path, record):
      raise RuntimeError("killed between the run and its record")

    monkeypatch.setattr(results_io, "append_result", crash)
  results_io.run_grid(
      ["ab", "cde"],
      lambda cell: f"hash-{cell}",
      execute,
      lambda r: r["name"],
      str(results),
      runs_dir=runs_dir,
  )
  return results


def test_a_grid_with_its_own_runs_is_not_held_by_another_grids_claim(
    tmp_path,
):
  """Claims used to sit beside results.json whatever the runs folder: a
  second grid in the folder (another --results and --runs_dir) skipped the
  cells the first was running, and ended without them."""
  held = []
  with results_io.claim(str(tmp_path / "runs" / ".claims"), "hash-ab") as mine:
    assert mine  # the default grid is running cell "ab"
    executed = []
    _grid(
        tmp_path,
        executed,
        results_name="results_repeat.json",
        runs_dir=str(tmp_path / "runs_repeat"),
    )
    held.append(executed)
  assert held == [["ab", "cde"]]
  # The same runs folder: the cell's work directory is the one held, so
  # the other grid waits its turn (it skips the cell this time).
  with results_io.claim(str(tmp_path / "runs" / ".claims"), "hash-ab"):
    executed = []
    _grid(tmp_path, executed, results_name="results_other.json")
  assert executed == ["cde"]


def _kept(tmp_path, digest):
  """The file that keeps run ``digest``'s record for the default grid."""
  (path,) = (tmp_path / "runs" / ".records").glob(f"{digest}-*.json")
  return path


def test_a_reverted_results_file_is_restored_without_rerunning(tmp_path):
  executed = []
  results = _grid(tmp_path, executed)
  first = results.read_text()
  assert executed == ["ab", "cde"]
  # results.json is tracked by git: a checkout (or a copied tree) reverts it.
  results.write_text('{"runs": []}\n')
  _grid(tmp_path, executed)
  assert executed == ["ab", "cde"]  # nothing ran again
  assert results.read_text() == first
  records = results_io.load_results(results)
  assert [(r["name"], r["predictions"]) for r in records] == [
      ("ab", ["AB"]),
      ("cde", ["CDE"]),
  ]
  # Deleting a kept record runs its cell again; so does an unreadable one.
  _kept(tmp_path, "hash-ab").unlink()
  _kept(tmp_path, "hash-cde").write_text('{"na')
  results.write_text('{"runs": []}\n')
  _grid(tmp_path, executed)
  assert executed == ["ab", "cde", "ab", "cde"]


def test_data_that_differs_from_the_recorded_runs_is_refused(tmp_path):
  """A grid refuses to start where a prepared dataset is not the one its
  recorded runs read (a generator changed since), naming the dataset and
  the runs; ``--accept_changed_data`` lets it go on. Data a record does
  not name, records without a fingerprint (made before them) and datasets
  not prepared here are not checked."""
  from experiments import data_fingerprints  # pylint: disable=g-import-not-at-top
  from train.tasks import clock_time  # pylint: disable=g-import-not-at-top

  data = tmp_path / "data"
  found = clock_time.prepare(str(data), 6, 3)
  again = clock_time.prepare(str(tmp_path / "again"), 6, 3)
  other = clock_time.prepare(str(tmp_path / "other"), 6, 3, seed=1)
  now = data_fingerprints.fingerprint(str(found))
  # The same generator twice: the same fingerprint; other clocks: another.
  assert data_fingerprints.fingerprint(str(again)) == now
  assert data_fingerprints.fingerprint(str(other)) != now
  config = ml_collections.ConfigDict(
      dict(task="clock_time", data_dir=str(data), dataset_config="")
  )
  read = data_fingerprints.dataset_of(config)
  assert read == dict(
      dataset="clock_time/train6_test3_seed0/1.0.0", fingerprint=now
  )

  def record(name, fingerprint, dataset=read["dataset"]):
    return dict(
        name=name,
        config_hash=name,
        wall_seconds=1.0,
        prepared_data=dict(dataset=dataset, fingerprint=fingerprint),
    )

  results = tmp_path / "results.json"
  fine = [
      record("same", now),
      record(
          "elsewhere", "0" * 16, dataset="clock_time/train9_test9_seed0/1.0.0"
      ),
      dict(name="older", config_hash="older"),  # no fingerprint kept
  ]
  ran = []

  def grid(records, accept=False):
    results.write_text(json.dumps(dict(runs=records)))
    results_io.run_grid(
        ["new"],
        lambda cell: "hash-" + cell,
        lambda cell, digest: ran.append(cell) or record(cell, now),
        lambda r: r["name"],
        str(results),
        data_dir=str(data),
        accept_changed_data=accept,
    )

  grid(fine)
  assert ran == ["new"]
  changed = fine + [record("a", "f" * 16), record("b", "f" * 16)]
  with pytest.raises(errors.ConfigError) as refused:
    grid(changed)
  message = str(refused.value)
  assert f"{data / read['dataset']} (fingerprint {now})" in message, message
  assert "2 recorded run(s) read (fingerprint ffff" in message, message
  assert "a, b" in message and "--accept_changed_data" in message, message
  assert ran == ["new"]  # refused before any cell
  grid(changed, accept=True)
  assert ran == ["new", "new"]
  # The report says its tables hold runs on two versions of the data.
  report = tmp_path / "results.md"
  report.write_text("# report\n")
  results_io.note_grid(str(results), str(report))
  text = report.read_text()
  assert "## Runs on other versions of the data" in text, text
  counts = ", ".join(f"2 run(s) on `{f}`" for f in sorted([now, "f" * 16]))
  assert f"- `{read['dataset']}`: {counts}" in text, text
  results.write_text(json.dumps(dict(runs=fine)))
  report.write_text("# report\n")
  results_io.note_grid(str(results), str(report))
  assert report.read_text() == "# report\n"  # one version each: no note


def test_a_crash_before_the_record_is_saved_loses_no_finished_run(
    tmp_path, monkeypatch
):
  executed = []
  try:
    _grid(tmp_path, executed, fail_append=True, monkeypatch=monkeypatch)
  except RuntimeError:
    pass
  assert executed == ["ab"]
  monkeypatch.undo()
  results = _grid(tmp_path, executed)
  assert executed == ["ab", "cde"]  # "ab" finished before the crash
  assert [r["name"] for r in results_io.load_results(results)] == ["ab", "cde"]


def test_a_diverging_cell_is_listed_and_the_grid_goes_on(tmp_path):
  """A cell whose loss goes non-finite diverges on every rerun: it used to
  stop the grid there each time, and no later cell ever ran."""
  executed = []
  nan = errors.Diverged("non-finite loss=nan at step 6")
  results = _grid(tmp_path, executed, raises={"ab": nan})
  assert executed == ["ab", "cde"]
  assert [r["name"] for r in results_io.load_results(results)] == ["cde"]
  failed = {"hash-ab": dict(cell="ab", error="non-finite loss=nan at step 6")}
  assert results_io.load_failures(str(results)) == failed
  _grid(tmp_path, executed, raises={"ab": nan})
  assert executed == ["ab", "cde"]  # skipped, not run again
  (tmp_path / "failed.json").write_text("{}")  # the entry deleted: retried
  _grid(tmp_path, executed)
  assert executed == ["ab", "cde", "ab"]
  assert len(results_io.load_results(results)) == 2
  # Any other failure (a full disk, a bug) stops the grid at once.
  with pytest.raises(errors.TrainingError, match="disk"):
    _grid(
        tmp_path / "other",
        executed,
        raises={"ab": errors.TrainingError("saving failed: disk full")},
    )


def test_each_results_file_keeps_its_own_failures(tmp_path):
  """The CPU's grid beside the accelerator's in one folder: the same cell
  has one hash on both, and one failed.json for both had the CPU's grid
  skip a cell that diverged on the accelerator (and its report list it)."""
  executed = []
  nan = errors.Diverged("non-finite loss=nan at step 6")
  _grid(tmp_path, executed, raises={"ab": nan})
  cpu = _grid(tmp_path, executed, results_name="results_cpu.json")
  assert executed == ["ab", "cde", "ab", "cde"]
  assert [r["name"] for r in results_io.load_results(cpu)] == ["ab", "cde"]
  assert results_io.failures_path(str(cpu)) == str(
      tmp_path / "results_cpu_failed.json"
  )
  assert results_io.load_failures(str(cpu)) == {}
  report = tmp_path / "report.md"
  report.write_text("")
  results_io.note_failures(str(cpu), str(report))
  assert report.read_text() == ""
  results_io.note_failures(str(tmp_path / "results.json"), str(report))
  assert "- ab: non-finite loss=nan at step 6" in report.read_text()
  # A cell listed as failed but recorded since (a rerun by hand) is not
  # called diverged in the report.
  (tmp_path / "results_cpu_failed.json").write_text(
      '{"hash-ab": {"cell": "ab", "error": "non-finite"}}'
  )
  report.write_text("")
  results_io.note_failures(str(cpu), str(report))
  assert report.read_text() == ""


def test_a_cell_another_worker_found_diverging_is_not_run_again(tmp_path):
  """failed.json was read once, at the start: a cell that another worker
  listed since was trained again, to the same non-finite loss."""
  results, executed = str(tmp_path / "results.json"), []

  def execute(cell, digest):
    executed.append(cell)
    if cell == "ab":  # meanwhile, another worker finds "cde" diverging
      results_io._record_failure(results, "hash-cde", "cde", "nan")  # pylint: disable=protected-access
    return dict(name=cell, config_hash=digest, wall_seconds=1.0)

  results_io.run_grid(
      ["ab", "cde"], lambda cell: f"hash-{cell}", execute, str, results
  )
  assert executed == ["ab"]


@pytest.mark.parametrize(
    "groups, message",
    [
        # An empty --groups= ran no cell and exited 0 (after making the
        # whole profile's data, for the arithmetic grid).
        ([], "--groups= (empty): the smoke grid has main, control."),
        (
            ["main", "sweep"],
            "--groups=sweep: the smoke grid has main, control.",
        ),
    ],
)
def test_groups_must_name_some_of_the_grid(groups, message):
  from absl import app  # pylint: disable=g-import-not-at-top

  with pytest.raises(app.UsageError) as error:
    results_io.check_groups(groups, ["main", "control"], "smoke")
  assert str(error.value) == message
  results_io.check_groups(["control"], ["main", "control"], "smoke")


def test_results_that_name_a_directory_are_refused(tmp_path):
  """An IsADirectoryError traceback from read_json, else."""
  with pytest.raises(errors.ConfigError, match="is a directory; name a file"):
    results_io.check_results(str(tmp_path))


def test_a_record_without_a_config_hash_is_refused_by_name(tmp_path):
  """A record merged by hand without its hash raised a bare KeyError."""
  results = tmp_path / "results.json"
  results.write_text(json.dumps({"runs": [{"name": "ab", "accuracy": 0.5}]}))
  executed = []
  with pytest.raises(errors.ConfigError, match="record 0 .* no config_hash"):
    results_io.run_grid(
        ["ab"],
        lambda cell: f"hash-{cell}",
        lambda cell, digest: executed.append(cell),
        str,
        str(results),
    )
  assert not executed


def test_reports_name_the_cells_that_diverged(tmp_path):
  executed = []
  nan = errors.Diverged("non-finite loss=nan at step 6")
  results = _grid(tmp_path, executed, raises={"ab": nan})
  report = tmp_path / "results.md"
  report.write_text("# Results\n")
  results_io.note_failures(str(results), str(report))
  text = report.read_text()
  assert text.startswith("# Results\n")
  assert "## Cells that diverged" in text
  assert "- ab: non-finite loss=nan at step 6" in text
  clean = tmp_path / "clean"
  clean.mkdir()
  (clean / "results.md").write_text("# Results\n")
  results_io.note_failures(
      str(clean / "results.json"), str(clean / "results.md")
  )
  assert (clean / "results.md").read_text() == "# Results\n"


def test_after_keep_runs_once_the_record_is_kept(tmp_path):
  """A run's checkpoints may go only once its record is safe: a crash
  between the two would otherwise leave neither."""
  results = tmp_path / "results.json"
  kept = tmp_path / "runs" / ".records"
  seen = []

  def execute(cell, digest):
    assert not list(kept.glob(f"{digest}-*.json"))
    return dict(name=cell, group="main", config_hash=digest, wall_seconds=1.0)

  def after_keep(cell, digest):
    assert _kept(tmp_path, digest).is_file()  # the record is safe
    seen.append(cell)

  results_io.run_grid(
      ["ab", "cde"],
      lambda cell: f"hash-{cell}",
      execute,
      lambda r: r["name"],
      str(results),
      after_keep=after_keep,
  )
  assert seen == ["ab", "cde"]
  assert len(results_io.load_results(results)) == 2


def test_another_grid_in_the_folder_trains_its_own_cells(tmp_path):
  """A new --results and --runs_dir beside a finished grid used to train
  nothing: every record was copied from that grid's kept records."""
  executed = []
  _grid(tmp_path, executed)
  assert executed == ["ab", "cde"]
  other = _grid(
      tmp_path,
      executed,
      results_name="other.json",
      runs_dir=str(tmp_path / "other_runs"),
  )
  assert executed == ["ab", "cde", "ab", "cde"]  # run again, not copied
  assert [r["name"] for r in results_io.load_results(other)] == ["ab", "cde"]
  # Each grid restores its own reverted results from its own records.
  for name, runs_dir in (
      ("results.json", None),
      ("other.json", str(tmp_path / "other_runs")),
  ):
    (tmp_path / name).write_text('{"runs": []}\n')
    _grid(tmp_path, executed, results_name=name, runs_dir=runs_dir)
    assert len(results_io.load_results(tmp_path / name)) == 2
  assert len(executed) == 4
  # Another runs folder for the same results file: not that grid's either.
  (tmp_path / "results.json").write_text('{"runs": []}\n')
  _grid(tmp_path, executed, runs_dir=str(tmp_path / "elsewhere"))
  assert len(executed) == 6


def test_a_record_kept_by_an_older_version_is_reused_loudly(tmp_path, caplog):
  """A kept record that does not say which grid it was made for is reused
  only with a warning that names the file it came from."""
  record = dict(name="ab", group="main", config_hash="hash-ab", wall_seconds=9)
  legacy = tmp_path / "runs" / ".records" / "hash-ab.json"
  legacy.parent.mkdir(parents=True)
  legacy.write_text(json.dumps(record))
  executed = []
  with caplog.at_level(logging.WARNING, logger="absl"):
    results = _grid(tmp_path, executed)
  assert executed == ["cde"]
  assert results_io.load_results(results)[0]["wall_seconds"] == 9
  (warning,) = [m for m in caplog.messages if "NOT RUN" in m]
  assert str(legacy) in warning


def test_a_results_file_that_is_not_json_is_named(tmp_path, capsys):
  results = tmp_path / "results.json"
  results.write_text('{"runs": [\n{"name": "a"},\n')  # cut off mid-write
  with pytest.raises(errors.ConfigError, match=str(results)):
    results_io.load_results(results)
  main = results_io.cli_main(lambda argv: results_io.load_results(results))
  with pytest.raises(SystemExit) as exited:
    main([])
  assert exited.value.code == 2
  (line,) = capsys.readouterr().err.splitlines()
  assert line.startswith("error: ") and str(results) in line
  results.write_text('{"runs": {}}')
  with pytest.raises(errors.ConfigError, match="holds no"):
    results_io.load_results(results)
  results.write_text('{"runs": []}')
  (tmp_path / "failed.json").write_text("{")
  with pytest.raises(errors.ConfigError, match="failed.json is not valid"):
    _grid(tmp_path, [])


@pytest.mark.parametrize(
    "module, refused",
    [
        ("experiments.clock_time.run", "max_runs"),
        ("experiments.clock_time.run", "results"),
        ("experiments.grounding.run", "results"),
        ("experiments.arithmetic_mix.run", "results"),
    ],
)
def test_grid_refuses_bad_input_before_any_work(tmp_path, module, refused):
  """--max_runs=-1 used to prepare the data and run nothing, exit 0; a
  results.json that is not JSON was refused after the data was made."""
  results = tmp_path / "results.json"
  args = ["--max_runs=-1"] if refused == "max_runs" else []
  if refused == "results":
    results.write_text("{bad")
  if module.endswith("arithmetic_mix.run"):
    args.append("--profile=smoke")
  result = launch.run(
      [
          sys.executable,
          "-m",
          module,
          *args,
          f"--results={results}",
          f"--runs_dir={tmp_path / 'runs'}",
          f"--data_dir={tmp_path / 'data'}",
      ],
      cwd=ROOT,
      capture_output=True,
      text=True,
      timeout=120,
  )
  assert result.returncode == 2, result.stderr[-3000:]
  assert "Traceback" not in result.stderr
  (line,) = [l for l in result.stderr.splitlines() if l.startswith("error:")]
  assert ("--max_runs=-1" if refused == "max_runs" else str(results)) in line
  # No data prepared, nothing written.
  assert [p.name for p in tmp_path.iterdir()] == (
      ["results.json"] if refused == "results" else []
  )
  with pytest.raises(ValueError, match="max_runs must be >= 0"):
    _grid_with_max_runs(tmp_path, -1)


def test_a_metric_recorded_as_none_is_left_out_like_nan():
  # A run that scored no example records None for a median: the tables
  # pass it over instead of crashing.
  ours = {0: dict(m=0.5), 1: dict(m=None), 2: dict(m=0.7)}
  theirs = {0: dict(m=0.4), 1: dict(m=0.3), 2: dict(m=0.4)}
  d = stats.paired(ours, theirs, "m", 100, True)
  assert d["n"] == 2 and math.isclose(d["mean"], 20.0)
  metric = stats.Metric("m", "m", 100, 1, True)
  # The mean of the two that have one, and how many of the three that is.
  assert (
      tables.fmt_metric(list(ours.values()), metric) == "60.0 ± 14.1 (2 of 3)"
  )
  assert tables.fmt_metric([ours[0], ours[2]], metric) == "60.0 ± 14.1"
  # The ranking sentence ranks by the same mean (it read "CE 36.7, NTIL
  # nan", or crashed on the None), and the paired table counts the 2 seeds
  # its test pairs, not the 3 both have.
  grouped = dict(ce=theirs, ntil=ours)
  labels = dict(ce="CE", ntil="NTIL")
  lines = tables.reading(grouped, [metric], ["ce", "ntil"], labels)
  assert any("NTIL 60.0, CE 36.7" in line for line in lines), lines
  (row,) = [
      line
      for line in tables.paired_table(
          grouped, [("ntil", "NTIL")], "ce", [metric]
      )
      if line.startswith("| NTIL")
  ]
  assert row.startswith("| NTIL | 2 | +20.0 ± 14.1 | 2/2 |"), row


def test_paired_differences_equal_but_for_rounding_take_the_sign_test():
  # Exact match 0.3/0.4 and 0.4/0.5 of 1,000 problems: +0.1 points on both
  # seeds, apart by 1e-14 in float; a t-test there said p = 0.000.
  ours = {0: dict(m=0.004), 1: dict(m=0.005)}
  theirs = {0: dict(m=0.003), 1: dict(m=0.004)}
  d = stats.paired(ours, theirs, "m", 100, True)
  assert (d["n"], d["better"]) == (2, 2)
  assert math.isclose(d["mean"], 0.1)
  # No t; the exact two-sided sign test: both seeds on one side, 2 / 2**2.
  assert math.isnan(d["t"]) and d["p"] == 0.5
  ours[2], theirs[2] = dict(m=0.0065), dict(m=0.0055)  # +0.1 on a third
  assert stats.paired(ours, theirs, "m", 100, True)["p"] == 0.25
  # A real spread is still tested.
  ours[1] = dict(m=0.006)
  d = stats.paired(ours, theirs, "m", 100, True)
  assert 0 < d["p"] < 1 and not math.isnan(d["t"])


def test_a_level_seed_is_neither_better_nor_worse():
  # -1 point on four seeds and level on the fifth: worse on average beyond
  # seed noise (t = -4, 4 degrees of freedom), but not on every seed.
  theirs = {s: dict(m=0.5) for s in range(5)}
  ours = {s: dict(m=0.49 if s < 4 else 0.5) for s in range(5)}
  d = stats.paired(ours, theirs, "m", 100, True)
  assert (d["n"], d["better"], d["worse"]) == (5, 0, 4)
  assert math.isclose(d["p"], 0.01613, rel_tol=1e-3)
  assert tables.kind(d) == "significant"
  assert tables.verdict(d) == (
      "worse on average (p = 0.016), but not on every seed"
  )
  assert not tables.beats(d, higher=False)
  # Lower is better: the same differences are better on four seeds only.
  d = stats.paired(ours, theirs, "m", 100, False)
  assert (d["better"], d["worse"]) == (4, 0)
  assert tables.kind(d) == "significant" and not tables.beats(d, False)
  # Worse on all five seeds: every seed.
  ours[4] = dict(m=0.485)
  d = stats.paired(ours, theirs, "m", 100, True)
  assert (d["better"], d["worse"]) == (0, 5) and tables.kind(d) == "unanimous"


def test_differences_of_float_rounding_are_level_on_every_seed():
  # 0.1 + 0.2 against 0.3 is 5.6e-17 apart: level, not better on 5/5.
  ours = {s: dict(m=0.1 + 0.2) for s in range(5)}
  theirs = {s: dict(m=0.3) for s in range(5)}
  d = stats.paired(ours, theirs, "m", 1, True)
  assert (d["mean"], d["better"], d["worse"], d["p"]) == (0.0, 0, 0, 1.0)
  assert tables.delta(d, 2).startswith("+0.00 (0/5")


def test_a_sign_test_is_named_in_short_cells_too():
  # +1 point on all three seeds: no spread, the sign test's p = 2 / 2**3.
  ours = {s: dict(m=0.02 + 0.01 * s) for s in range(3)}
  theirs = {s: dict(m=0.01 + 0.01 * s) for s in range(3)}
  metric = stats.Metric("m", "exact")
  assert tables.paired_cells(ours, theirs, metric) == [
      "+1.0 ± 0.0",
      "3/3",
      "sign (p = 0.250)",
  ]
  assert tables.paired_cells(ours, theirs, metric, short=True) == [
      "+1.0 ± 0.0",
      "3/3",
      "sign 0.250",
  ]
  ours[2] = dict(m=0.05)  # a spread: the t-test's p, unmarked when short
  cell = tables.paired_cells(ours, theirs, metric, short=True)[2]
  assert not cell.startswith("sign") and 0 < float(cell) < 1


def test_a_difference_that_is_zero_but_for_rounding_is_level():
  # +0.3, -0.5, +0.3, -0.4, +0.3 points sum to 0, as -2.8e-17 in float: the
  # table printed -0.0 and called it worse.
  theirs = {s: dict(m=0.5) for s in range(5)}
  ours = {
      s: dict(m=0.5 + x / 100)
      for s, x in enumerate([0.3, -0.5, 0.3, -0.4, 0.3])
  }
  d = stats.paired(ours, theirs, "m", 100, True)
  assert d["mean"] == 0.0 and d["t"] == 0.0 and math.isclose(d["p"], 1.0)
  assert tables.direction(d) == "level"
  assert tables.delta(d, 1).startswith("+0.0 (3/5")
  # Every seed level: nothing to test, p = 1.
  d = stats.paired(theirs, dict(theirs), "m", 100, True)
  assert (d["mean"], d["better"], d["p"]) == (0.0, 0, 1.0)


def _grid_with_max_runs(tmp_path, max_runs):
  results_io.run_grid(
      ["ab"],
      lambda cell: f"hash-{cell}",
      lambda cell, digest: {},
      str,
      str(tmp_path / "results.json"),
      max_runs=max_runs,
  )


@pytest.mark.slow
@pytest.mark.parametrize(
    "experiment, groups, task, peers_group",
    [
        ("clock_time", "main", None, "peers"),
        ("grounding", "single", "grounding_single", "single_peers"),
    ],
)
def test_peer_groups_are_paired_with_ce_and_reported(
    tmp_path, experiment, groups, task, peers_group
):
  # NTIL's peers run by name, as their method's cells of the grid: paired
  # by seed with CE's, and a row each in the report.
  common = [
      f"--results={tmp_path / 'results.json'}",
      f"--runs_dir={tmp_path / 'runs'}",
      f"--data_dir={tmp_path / 'data'}",
      "--profile=smoke",
  ]
  module = f"experiments.{experiment}.run"
  run(module, *common, f"--groups={groups}", "--max_runs=1")
  run(module, *common, f"--groups={peers_group}", "--max_runs=2")
  runs = results_io.load_results(tmp_path / "results.json")
  assert [(r["variant"], r["method"], r["seed"]) for r in runs] == [
      ("main", "ce", 0),
      ("main", "del", 0),
      ("main", "smmd", 0),
  ]
  assert len({r["config_hash"] for r in runs}) == 3
  if task:
    assert {r["task"] for r in runs} == {task}
  run(
      f"experiments.{experiment}.report",
      f"--results={tmp_path / 'results.json'}",
      f"--out_dir={tmp_path}",
  )
  report = (tmp_path / "results.md").read_text()
  for label in ("| CE |", "| CE + DEL |", "| CE + SMMD |"):
    assert label in report, label


def test_a_grid_stopped_by_a_signal_says_so_in_one_line(capsys):
  def main(argv):
    del argv
    raise KeyboardInterrupt("ce-s0 stopped by a signal; rerun to resume")

  with pytest.raises(SystemExit) as stopped:
    results_io.cli_main(main)(["run"])
  assert stopped.value.code == 130
  err = capsys.readouterr().err
  assert err == "stopped: ce-s0 stopped by a signal; rerun to resume\n"


def test_a_seed_added_to_a_profile_leaves_recorded_cells_done(monkeypatch):
  """The seed lists were hashed with every cell: one seed more in a profile
  changed every recorded cell's hash (219 clock cells pending again)."""
  from experiments.arithmetic_mix import run as arithmetic  # pylint: disable=g-import-not-at-top
  from experiments.clock_time import grid as clock  # pylint: disable=g-import-not-at-top
  from experiments.grounding import grid as grounding  # pylint: disable=g-import-not-at-top

  def hashes():
    config = arithmetic.cell_config("digits", "ntil", 0, {}, "data")
    return (
        clock.cell_hash("cpu", "ntil", 0, {}, "data"),
        grounding.cell_hash("cpu", "grounding", "ntil", 0, {}, "data"),
        arithmetic.config_hash(config, "digits"),
    )

  # Recorded in results.json (clock, grounding) and digits/results.json.
  recorded = ("83f25515b2d0", "702ba89ee3bb", "0a921b2130aa")
  assert hashes() == recorded
  for module, key in ((clock, "main_seeds"), (grounding, "main_seeds")):
    grown = dict(module.PROFILES["cpu"])
    grown[key] += (5, 6)
    monkeypatch.setitem(module.PROFILES, "cpu", grown)
  grown = dict(arithmetic.PROFILES["digits"], seeds=(0, 1, 2, 3, 4, 5))
  monkeypatch.setitem(arithmetic.PROFILES, "digits", grown)
  assert hashes() == recorded
  # A profile made since hashes no seeds at all.
  settings = dict(train_steps=3, seeds=(0, 1))
  assert results_io.hashed_settings(settings) == dict(train_steps=3)
