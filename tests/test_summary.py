"""The "what holds where" table (experiments/summary.py), by hand."""

import json
import math
import pathlib

import numpy as np
import pytest

from experiments import stats
from experiments import summary

ROOT = pathlib.Path(__file__).resolve().parents[1]


def clock(method, seed, curve, group="main", variant="main", steps=600):
  return dict(
      name=f"{group}-{method}-s{seed}",
      group=group,
      variant=variant,
      method=method,
      seed=seed,
      steps=steps,
      batch_size=100,
      curves=dict(eval_steps=[steps // 2, steps], exact_match=list(curve)),
  )


def parse(lines):
  """{(task, training data, steps): cells} of a table's rows."""
  rows = {}
  for line in lines[2:]:
    parts = [c.strip() for c in line.strip().strip("|").split("|")]
    rows[tuple(parts[:3])] = parts[3:]
  return rows


def write(root, path, runs):
  target = root / path
  target.parent.mkdir(parents=True, exist_ok=True)
  target.write_text(json.dumps(dict(runs=runs)))


def test_clock_rows_by_hand(tmp_path):
  runs = [
      # CE: ends 0.50 and 0.60; NTIL: 0.60, 0.60 (+10, 0: better on 1 of
      # 2, t = 1, p = 0.5); the control ends 0.40 on seed 0 (one seed: no
      # p).
      clock("ce", 0, [0.2, 0.5]),
      clock("ce", 1, [0.2, 0.6]),
      clock("ntil", 0, [0.41, 0.6]),
      clock("ntil", 1, [0.3, 0.6]),
      clock("ce", 0, [0.1, 0.4], "control", "ce_digit_weighted"),
      clock("ntil", 0, [0.1, 0.4], "control", "ntil_reference"),  # not shown
      # Streamed, 2,400 steps: CE alone.
      clock("ce", 0, [0.7, 0.8], "stream_converged", "converged", 2400),
  ]
  write(tmp_path, "experiments/clock_time/results.json", runs)
  lines = summary.table(str(tmp_path))
  rows = parse(lines)
  assert len(rows) == 2  # no other task's file: no rows
  # 600 steps x 100 = 60,000 examples over 20,000 clocks: 3 passes.
  fixed = rows[("clocks", "fixed set of 20,000, about 3 passes", "600")]
  assert fixed[0] == "exact match 55.0 ± 7.1 (2 seeds)"
  names = [label for _, label in summary.LOSSES]
  cell = dict(zip(names + ["curve"], fixed[1:]))
  assert cell["EMD"] == "–"
  assert cell["NTIL"] == "+5.0 (1/2, p = 0.50)"
  assert cell["digits x 1.3"] == "-10.0 (0/1)"
  # Mean over training from 0 at step 0 (trapezoids, halves of 300 steps):
  # seed 0, CE (0.1 + 0.35) / 2 = 0.225, NTIL (0.205 + 0.505) / 2 = 0.355
  # (+13.0); seed 1, CE (0.1 + 0.4) / 2 = 0.25, NTIL (0.15 + 0.45) / 2 =
  # 0.30 (+5.0): mean +9.0, better on both.
  assert cell["curve"].startswith("+9.0 (2/2, p = ")
  streamed = rows[("clocks", "each seen once (240,000 examples)", "2,400")]
  assert streamed[0] == "exact match 80.0 (1 seed)"
  assert streamed[1:] == ["–"] * (len(summary.LOSSES) + 1)


def test_interval_and_figure(tmp_path):
  # NTIL - CE: +10 and 0 points on 2 seeds: mean 5, sd 5 * sqrt(2); the
  # 97.5% point of Student's t with 1 degree of freedom is 12.7062, so the
  # half width is 12.7062 * 5 * sqrt(2) / sqrt(2) = 63.53.
  d = dict(n=2, mean=5.0, std=5.0 * 2**0.5, t=1.0)
  assert summary.interval(d) == pytest.approx(63.531, abs=1e-3)
  # One seed has no interval.
  assert math.isnan(
      summary.interval(dict(n=1, mean=5.0, std=float("nan"), t=float("nan")))
  )
  runs = [
      clock("ce", 0, [0.2, 0.5]),
      clock("ce", 1, [0.2, 0.6]),
      clock("ntil", 0, [0.41, 0.6]),
      clock("ntil", 1, [0.3, 0.6]),
  ]
  write(tmp_path, "experiments/clock_time/results.json", runs)
  out = summary.figure(str(tmp_path / "out" / "summary.png"), str(tmp_path))
  assert pathlib.Path(out).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_p_shows_which_side_of_005_it_is():
  # 0.048 and 0.052 both printed "p = 0.05", one bold and one not.
  assert stats.p_equals(0.048) == "p = 0.048"
  assert stats.p_equals(0.052) == "p = 0.052"
  assert stats.p_equals(0.0061) == "p = 0.006"
  assert stats.p_equals(0.42, coarse=True) == "p = 0.42"
  assert stats.p_equals(0.42) == "p = 0.420"
  assert stats.p_equals(0.0004) == "p < 0.001"
  # Rounding never carries a p onto 0.05 or 0.1 from below (0.0496 read
  # "p = 0.050" in bold), nor prints "0.000" for p < 0.001.
  assert stats.p_equals(0.0496) == "p = 0.0496"
  assert stats.p_equals(0.0996, coarse=True) == "p = 0.0996"
  assert stats.p_equals(0.0501) == "p = 0.050"
  assert stats.p_value(0.0002) == "< 0.001"
  # Nor with four decimals: 0.04996 read "0.0500", beside a bold verdict.
  assert stats.p_value(0.04996) == "0.04996"
  assert stats.p_value(0.09996, coarse=True) == "0.09996"
  assert stats.p_value(0.0499999) == "0.0499999"


def test_no_spread_draws_no_interval():
  """Every seed's difference the same: a zero-width t interval would read
  as certain, where the p is the sign test's (0.25 with 3 seeds)."""
  d = dict(n=3, mean=-0.05, std=0.0, t=float("nan"), p=0.25)
  assert np.isnan(summary.interval(d))
  d = dict(n=3, mean=1.0, std=0.5, t=3.46, p=0.07)
  assert summary.interval(d) > 0


def test_readme_shows_the_figure():
  text = (ROOT / "README.md").read_text()
  assert f"]({summary.FIGURE})" in text
  assert (ROOT / summary.FIGURE).exists()


def test_arithmetic_control_and_bold(tmp_path):
  def arith(method, seed, end, group="main", weight=None):
    run = clock(method, seed, [end / 2, end], steps=800)
    del run["variant"]  # arithmetic records have none
    run.update(
        group=group, overrides=dict(digit_ce_weight=weight) if weight else {}
    )
    return run

  runs = [arith("ce", s, 0.5 + 0.01 * s) for s in range(3)]
  # NTIL 10, 10 and 10.5 points above on 3 seeds: significant, bold.
  runs += [
      arith("ntil", s, 0.6 + 0.01 * s + 0.005 * (s == 2)) for s in range(3)
  ]
  runs += [arith("ce", 0, 0.3, group="control", weight=0.3)]
  runs += [arith("ntil", 0, 0.9, group="ablation")]  # not a row key
  write(tmp_path, "experiments/arithmetic_mix/digits/results.json", runs)
  rows = parse(summary.table(str(tmp_path)))
  (cells,) = rows.values()
  # The control's CE run is not a CE run.
  assert cells[0] == "exact match 51.0 ± 1.0 (3 seeds)"
  assert cells[4] == "**+10.2 (3/3, p < 0.001)**"
  assert cells[5] == "-20.0 (0/1)"


def cpu_run(method, seed, end, group="chunks"):
  """A digits-grid record of the CPU's file."""
  run = clock(method, seed, [end / 2, end], steps=800)
  del run["variant"]
  run.update(group=group, overrides={})
  return run


def test_chunk_row_from_the_cpu_records(tmp_path):
  arith = cpu_run
  runs = [arith("ce", s, 0.1 + 0.01 * s) for s in range(2)]
  runs += [arith("emd", s, 0.12 + 0.02 * s) for s in range(2)]
  # The file's single-digit runs (group main) are not the chunk row's.
  runs += [arith("ce", 0, 0.5, group="main"), arith("ntil", 0, 0.9, "main")]
  write(tmp_path, "experiments/arithmetic_mix/digits/results_cpu.json", runs)
  rows = parse(summary.table(str(tmp_path)))
  once = "each seen once (80,000 examples)"
  (cells,) = rows.values()
  assert list(rows) == [(summary.CHUNKED + ", CPU", once, "800")]
  assert cells[0] == "exact match 10.5 ± 0.7 (2 seeds)"
  # Paired differences 2 and 3 points: t = 5 with 1 degree of freedom,
  # p = 1 - 2 atan(5) / pi = 0.126.
  assert cells[1] == "+2.5 (2/2, p = 0.13)"
  assert cells[4] == "–"  # NTIL: only a single-digit run


def test_a_difference_across_devices_is_marked_and_explained(tmp_path):
  def run(method, seed, end, device, group="chunks"):
    return dict(cpu_run(method, seed, end, group), device=device)

  # CE and EMD on one GPU; DEL (chunks_peers) on another.
  runs = [run("ce", s, 0.1 + 0.01 * s, "gpu:A") for s in range(2)]
  runs += [run("emd", s, 0.12 + 0.02 * s, "gpu:A") for s in range(2)]
  runs += [run("del", s, 0.1, "gpu:B", "chunks_peers") for s in range(2)]
  write(tmp_path, "experiments/arithmetic_mix/digits/results.json", runs)
  lines = summary.table(str(tmp_path))
  assert lines[-2:] == ["", summary.ACROSS_NOTE]
  (cells,) = parse(lines[:-2]).values()
  assert cells[1] == "+2.5 (2/2, p = 0.13)"  # EMD: same device, no mark
  # DEL: 0 and -1 point: t = -1 with 1 degree of freedom, p = 0.5.
  assert cells[6] == "-0.5 (0/2, p = 0.50)" + summary.ACROSS
  grouped = summary.recorded(str(tmp_path))[0][1]
  assert summary.across(grouped) == ["DEL"]
  assert summary.describe(summary.CELLS[1], grouped, None).endswith(
      "\n† DEL: other devices than CE's"
  )
  # Both on the CPU and the GPU, but EMD's seed 1 on the CPU paired with
  # CE's seed 1 on the GPU: the same sets of devices, marked all the same.
  mixed = [run("ce", 0, 0.1, "cpu"), run("ce", 1, 0.11, "gpu:A")]
  mixed += [run("emd", 0, 0.12, "gpu:A"), run("emd", 1, 0.14, "cpu")]
  write(tmp_path, "experiments/arithmetic_mix/digits/results.json", mixed)
  (cells,) = parse(summary.table(str(tmp_path))[:-2]).values()
  assert cells[1] == "+2.5 (2/2, p = 0.13)" + summary.ACROSS
  assert summary.across(summary.recorded(str(tmp_path))[0][1]) == ["EMD"]
  # One device throughout: no mark, no note.
  write(tmp_path, "experiments/arithmetic_mix/digits/results.json", runs[:4])
  lines = summary.table(str(tmp_path))
  assert summary.ACROSS_NOTE not in lines
  assert not any(summary.ACROSS in line for line in lines)
  assert not summary.across(summary.recorded(str(tmp_path))[0][1])


def test_llm_rows_by_dataset(tmp_path):
  def llm(method, seed, end, dataset="add_or_sub", group="main"):
    run = clock(method, seed, [end / 2, end], steps=300)
    del run["variant"]
    run.update(group=group, dataset=dataset, overrides={}, batch_size=32)
    return run

  runs = [llm("ce", 0, 0.2), llm("ce", 1, 0.3), llm("ntil", 0, 0.25)]
  runs += [llm("ntil", 1, 0.3), llm("ce", 0, 0.1, "arithmetic_mix")]
  zero = llm("ce", 0, 0.0, group="zero_shot")  # not a fine-tuned run
  runs.append(dict(zero, method=None, seed=None))
  write(
      tmp_path,
      "experiments/arithmetic_mix/llm/SmolLM2-135M-Instruct/results.json",
      runs,
  )
  rows = parse(summary.table(str(tmp_path)))
  once = "each seen once (9,600 examples)"
  add = rows[
      ("SmolLM2-135M fine-tuned: multi-digit sums (add_or_sub)", once, "300")
  ]
  assert add[0] == "exact match 25.0 ± 7.1 (2 seeds)"
  assert add[4] == "+2.5 (1/2, p = 0.50)"
  mix = rows[("SmolLM2-135M fine-tuned: arithmetic_mix", once, "300")]
  assert mix[0] == "exact match 10.0 (1 seed)"


def test_replace_block():
  text = f"a\n{summary.START}\nold\n{summary.END}\nb\n"
  assert summary.replace_block(text, ["x", "y"]) == (
      f"a\n{summary.START}\nx\ny\n{summary.END}\nb\n"
  )
  with pytest.raises(ValueError, match="no"):
    summary.replace_block("no markers", ["x"])


@pytest.mark.parametrize("page", summary.PAGES)
def test_readme_table_is_the_recorded_one(page):
  """The table in the README and in docs/experiments.md is what the
  committed results give: regenerate both with ``python -m
  experiments.summary --readme`` after recording runs."""
  text = (ROOT / page).read_text()
  block = text.split(summary.START, 1)[1].split(summary.END, 1)[0]
  assert block.strip().splitlines() == summary.table(str(ROOT))


def test_every_loss_has_its_own_colour_in_every_figure():
  from experiments import labels  # pylint: disable=g-import-not-at-top

  keys = [*labels.LABELS, "ce_digit_weighted", "ntil_reference"]
  ablations = ["ntil-no-exp", "ntil-no-rel", "ntil-no-mag"]
  colours = [labels.color(k, ablations) for k in keys + ablations]
  assert len(set(colours)) == len(colours)
  # A key's colour does not depend on which other keys a figure holds.
  assert labels.color("ntil") == labels.color("ntil", ablations)
  assert labels.color("ntil-no-mag", ablations) == labels.color(
      "ntil-no-mag", ["ntil", *ablations]
  )


def test_single_digit_row_of_the_cpu_waits_for_two_ce_seeds(tmp_path):
  path = "experiments/arithmetic_mix/digits/results_cpu.json"
  runs = [cpu_run("ce", 0, 0.5, "main"), cpu_run("emd", 0, 0.52, "main")]
  runs += [cpu_run("del", s, 0.48 + 0.01 * s, "peers") for s in range(2)]
  write(tmp_path, path, runs)
  assert not parse(summary.table(str(tmp_path)))  # one CE seed: no row
  write(tmp_path, path, runs + [cpu_run("ce", 1, 0.55, "main")])
  rows = parse(summary.table(str(tmp_path)))
  once = "each seen once (80,000 examples)"
  assert list(rows) == [(summary.SUMS + ", CPU", once, "800")]
  (cells,) = rows.values()
  assert cells[0] == "exact match 52.5 ± 3.5 (2 seeds)"
  assert cells[1] == "+2.0 (1/1)"  # EMD: seed 0 alone, no test
  # DEL - CE: 48 - 50 and 49 - 55 points, -2 and -6: mean -4, sd 2.83,
  # t = -2 on 1 degree of freedom, p = 1 - 2 atan(2) / pi = 0.295.
  assert cells[6] == "-4.0 (0/2, p = 0.30)"
  assert cells[7] == "–"  # SMMD: not run
  assert cells[8] == "–"  # NL-NTL: not run
