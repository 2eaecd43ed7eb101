"""The digits grid's report: its helpers and its numbers, checked by hand.

Every expected number below is worked out by hand from the synthetic
problems and predictions (see the comments), not by the code under test.
"""

import fractions
import json
import math
import pathlib
import sys

import ml_collections
import pytest
from scipy import stats

from experiments import tables
from experiments.arithmetic_mix import answers
from experiments.arithmetic_mix import digits_report as dr
from train.tasks import arithmetic_mix as task

from tests import launch

ROOT = pathlib.Path(__file__).resolve().parents[1]

# ---------------------------------------------------------------------------
# Pure helpers, on hand examples.


@pytest.mark.parametrize(
    "answer, digits, bucket",
    [
        ("-153.97", 5, "5"),
        ("0.09", 3, "<=3"),
        ("1000", 4, "4"),
        ("-5", 1, "<=3"),
        ("12345678", 8, "8"),
        ("-123456.789", 9, ">=9"),
    ],
)
def test_answer_digits(answer, digits, bucket):
  assert answers.answer_digits(answer) == digits
  assert answers.digits_bucket(answer) == bucket


@pytest.mark.parametrize(
    "question, expected",
    [
        ("Add 0.03 and -154.", "add"),
        ("Sum 10 and -715.", "add"),
        ("Total of 1 and 2.", "add"),
        ("Put together 2 and 3.", "add"),
        ("Add together 0.3 and 5.", "add"),
        ("What is -0.3 plus 1662.361?", "add"),
        ("-20.3+-1891", "add"),
        ("Work out -3 + 4.", "add"),
        ("What is -0.201966 - 0?", "subtract"),
        ("Calculate -12 - 17801.", "subtract"),
        ("What is 44 - -46.6?", "subtract"),
        ("5-3", "subtract"),
        ("Subtract 100 from 1234.", "subtract"),
        ("What is 2 minus 1?", "subtract"),
        ("What is 2 take away 1?", "subtract"),
        ("What is 5 less than 3?", "subtract"),
        ("What is the distance between -159.33 and -3?", "subtract"),
        ("What is the difference between 0.41 and 0.4?", "subtract"),
        ("Calculate 7.", None),
    ],
)
def test_operation(question, expected):
  assert answers.operation(question) == expected


def test_decimals():
  assert answers.has_decimals("1.5") and answers.has_decimals("-0.201966")
  assert not answers.has_decimals("-15") and not answers.has_decimals("1000")
  assert answers.decimals_bucket("4.25") == "decimal"
  assert answers.decimals_bucket("42") == "integer"


def test_log10_error_and_within_1_percent():
  assert answers.log10_error("4.2", "4.25") == pytest.approx(math.log10(1.05))
  assert answers.log10_error("7", "6") == pytest.approx(math.log10(2.0))
  assert answers.log10_error("-2", "-2.5") == pytest.approx(math.log10(1.5))
  assert answers.log10_error("1/2", "0.5") == 0.0  # parsed as the scorer does
  assert answers.log10_error("x", "1") is None
  assert answers.log10_error("1.2.3", "1") is None
  assert answers.within_1_percent("99.5", "100")
  assert not answers.within_1_percent("98", "100")
  assert answers.within_1_percent("0", "0")
  assert not answers.within_1_percent("x", "1")


@pytest.mark.parametrize(
    "text",
    [
        "1e400",
        "1e1000000000",
        "1E5",
        "inf",
        "nan",
        "3/0",
        "1_000",
        "",
        "４２",  # full-width digits
        "٤٢",  # Arabic-Indic digits
    ],
)
def test_scorer_reads_only_the_answer_grammar(text):
  """Exponents, inf, nan and digit separators are not answers: a model that
  writes "1e1000000000" must not stall (or overflow) the evaluation. Nor
  are digits other than ASCII's (full-width, Arabic-Indic), which Python's
  ``\\d`` and `Fraction` read: "４２" scored as 42."""
  assert task.parse_number(text) is None
  sums = task.score_answers(
      [text], ["12"], ml_collections.ConfigDict(dict(max_answer_len=8))
  )
  assert sums["count"] == 1 and sums["parsed"] == 0 and sums["correct"] == 0


def test_scorer_reads_answers():
  assert task.parse_number(" -8/3 ") == fractions.Fraction(-8, 3)
  assert task.parse_number("0.5") == fractions.Fraction(1, 2)
  assert task.parse_number(".5") == fractions.Fraction(1, 2)
  assert task.parse_number("+7.") == 7
  assert task.parse_number("1.5/2") is None


def test_score_and_breakdown():
  problems = [("Add 1 and 2.", "3"), ("5 - 7.5", "-2.5"), ("1+1", "2")]
  predictions = ["3", "-2", "oops"]
  scores = answers.score(predictions, problems)
  assert scores["exact_match"] == pytest.approx(1 / 3)
  assert scores["within_1_percent"] == pytest.approx(1 / 3)
  # Parsed: errors 0 and 0.5; "oops" excluded and counted.
  assert scores["log_error"] == pytest.approx(math.log10(1.5) / 2)
  assert scores["unparsed"] == 1
  by_operation = answers.breakdown(
      predictions, problems, lambda q, a: answers.operation(q)
  )
  assert by_operation == {"add": (1, 2), "subtract": (0, 1)}


# ---------------------------------------------------------------------------
# A synthetic grid, every figure worked out by hand.

# Problem: operation, digits bucket, decimals.
PROBLEMS = [
    ("Add 12 and 30.", "42"),  # 1: add, <=3, integer
    ("What is 5 - 7.5?", "-2.5"),  # 2: subtract, <=3, decimal
    ("Subtract 100 from 1234.", "1134"),  # 3: subtract, 4, integer
    ("1.25+3", "4.25"),  # 4: add, <=3, decimal
    ("What is the distance between 10 and 4?", "6"),  # 5: subtract, <=3
    ("Sum 999 and 1.", "1000"),  # 6: add, 4, integer
]
ANSWERS = [a for _, a in PROBLEMS]


def predictions(wrong):
  """The answers, with {problem number (1-based): wrong prediction}."""
  return [wrong.get(i + 1, a) for i, a in enumerate(ANSWERS)]


# name: (group, method, seed, wrong predictions, exact match curve)
CELLS = {
    # CE s0: 3/6 right; 4 off by 0.05, 5 off by 1, 6 unparseable.
    "ce-s0": ("main", "ce", 0, {4: "4.2", 5: "7", 6: "x"}, [0.1, 0.2, 0.4]),
    # CE s1: 3/6; 2 off by 0.5, 4 off by 0.05, 6 off by 1.
    "ce-s1": (
        "main",
        "ce",
        1,
        {2: "-2", 4: "4.3", 6: "1001"},
        [0.1, 0.25, 0.45],
    ),
    # CE s2: 4/6; 3 off by 10, 4 unparseable.
    "ce-s2": ("main", "ce", 2, {3: "1144", 4: "??"}, [0.2, 0.3, 0.5]),
    # NTIL s0: 4/6; s1: 5/6; s2: 5/6.
    "ntil-s0": (
        "main",
        "ntil",
        0,
        {5: "5", 6: "1000.5"},
        [0.3, 0.4, 0.5],
    ),
    "ntil-s1": ("main", "ntil", 1, {4: "4.35"}, [0.2, 0.4, 0.6]),
    "ntil-s2": ("main", "ntil", 2, {6: "999"}, [0.25, 0.4, 0.6]),
    # One control seed: nothing to test.
    "ce-digit-weight-s0": ("control", "ce", 0, {1: "41"}, [0.1, 0.2, 0.3]),
    # Ablation s0 as CE s0 (3/6), s1 all right (6/6).
    "ntil-no-exp-s0": (
        "ablation",
        "ntil",
        0,
        {4: "4.2", 5: "7", 6: "x"},
        [0.1, 0.2, 0.3],
    ),
    "ntil-no-exp-s1": ("ablation", "ntil", 1, {}, [0.1, 0.2, 0.3]),
}


def record(name, cells=None):
  group, method, seed, wrong, curve = (cells or CELLS)[name]
  preds = predictions(wrong)
  right = sum(p == a for p, a in zip(preds, ANSWERS))
  return dict(
      name=name,
      group=group,
      method=method,
      seed=seed,
      overrides={},
      profile="digits",
      model="small",
      steps=800,
      batch_size=128,
      exact_match=right / 6,
      parsed_rate=1.0,  # recomputed from the predictions
      mean_abs_error=0.0,
      mean_log10_abs_error=0.0,
      num_test_examples=6,
      within_1_percent=0.0,
      device="cpu:cpu x1",
      host="test",
      data=dict(module="arithmetic__add_or_sub", difficulty="easy"),
      problems_seen=102400,
      predictions=preds,
      curves=dict(
          steps=[800],
          loss=[1.0],
          ce=[1.0],
          eval_steps=[200, 400, 600, 800],
          exact_match=[*curve, right / 6],
      ),
  )


def sections(report):
  """{heading: text} of the report's ## and ### sections."""
  out, heading = {}, ""
  for line in report.splitlines():
    if line.startswith("#"):
      heading = line.lstrip("#").strip()
      out[heading] = []
    else:
      out.setdefault(heading, []).append(line)
  return {h: "\n".join(lines) for h, lines in out.items()}


def row(text, first_cell):
  """The cells of the table row whose first cell is ``first_cell``."""
  for line in text.splitlines():
    cells = [c.strip() for c in line.strip().strip("|").split("|")]
    if line.startswith("|") and cells[0] == first_cell:
      return cells[1:]
  raise AssertionError(f"no row {first_cell!r} in:\n{text}")


def write(tmp_path, names, problems=PROBLEMS, cells=None):
  runs = [record(n, cells) for n in names]
  dr.write_report(runs, problems, str(tmp_path), "test problems")
  return (tmp_path / "results.md").read_text()


def test_report_numbers_by_hand(tmp_path):
  report = write(tmp_path, list(CELLS))
  parts = sections(report)

  # Coverage: 3 CE + 3 NTIL + 1 control + 2 ablation cells.
  coverage = parts["Grid coverage"]
  assert "9 of the 60 cells recorded" in coverage
  assert "(main 6/25, control 1/5, ablation 2/15, peers 0/15)" in coverage
  assert "- CE: 3 of 5 seeds (0, 1, 2)" in coverage
  assert "- CE + EMD: 0 of 5 seeds" in coverage
  assert "- CE, digit tokens weighted 1.3: 1 of 5 seeds (0)" in coverage

  # Regime: CE went from (0.4+0.45+0.5)/3 to (3/6+3/6+4/6)/3.
  regime = parts["Regime"]
  assert "45.00% at step 600 to 55.56% at step 800" in regime
  assert "higher at 800 on 3/3" in regime and "still rising" in regime
  assert "trained from scratch" in regime
  assert "each is seen once" in regime
  assert "6 problems" in regime

  # Main table: CE end 50, 50, 66.67 -> 55.56 ± 9.62; step 200: 10, 10, 20.
  main = parts["Main table"]
  ce = row(main, "CE")
  assert ce[0] == "3 (0,1,2)"
  assert ce[1] == "13.33 ± 5.77"
  assert ce[2] == "55.56 ± 9.62"
  # Within 1%: s0 3/6 (0.05 off 4.25 is not); s1 4/6 (1 off 1000 is, 0.5
  # off -2.5 and 0.05 off 4.25 are not); s2 5/6 (10 off 1134 is).
  assert ce[3] == "66.67 ± 16.67"
  # Log error over parsed: s0 (log 1.05 + log 2)/5, s1 (log 1.5 + log 1.05
  # + log 2)/6, s2 log 11/5.
  log_errors = [
      (math.log10(1.05) + math.log10(2)) / 5,
      (math.log10(1.5) + math.log10(1.05) + math.log10(2)) / 6,
      math.log10(11) / 5,
  ]
  mean = sum(log_errors) / 3
  sd = math.sqrt(sum((e - mean) ** 2 for e in log_errors) / 2)
  assert ce[4] == f"{mean:.3f} ± {sd:.3f}"
  assert ce[5] == "2"  # "x" and "??"
  ntil = row(main, "CE + NTIL")
  assert ntil[2] == "77.78 ± 9.62"  # 4/6, 5/6, 5/6
  assert ntil[5] == "0"

  # Paired vs CE: end +16.67, +33.33, +16.67; step 200 +20, +10, +5.
  paired = row(parts["Paired differences vs CE"], "CE + NTIL − CE")
  end_p = stats.ttest_rel([4 / 6, 5 / 6, 5 / 6], [3 / 6, 3 / 6, 4 / 6]).pvalue
  assert paired[0] == "+22.22 ± 9.62"
  assert paired[1] == "3/3"
  assert paired[2] == f"{end_p:.3f}"
  early_p = stats.ttest_rel([0.3, 0.2, 0.25], [0.1, 0.1, 0.2]).pvalue
  assert paired[3:6] == ["+11.67 ± 7.64", "3/3", f"{early_p:.3f}"]

  # By operation: add = problems 1, 4, 6; subtract = 2, 3, 5.
  # CE add 1/3, 1/3, 2/3; NTIL add 2/3, 2/3, 2/3.
  # CE subtract 2/3, 2/3, 2/3; NTIL subtract 2/3, 3/3, 3/3.
  operation = parts["By operation, as the question writes it"]
  assert "add (n=3)" in operation and "subtract (n=3)" in operation
  assert row(operation, "CE") == ["3", "44.44 ± 19.25", "66.67 ± 0.00"]
  assert row(operation, "CE + NTIL") == ["3", "66.67 ± 0.00", "88.89 ± 19.25"]
  assert row(operation, "CE + NTIL − CE, paired Δ (seeds better)") == [
      "",
      "+22.22 (2/3)",
      "+22.22 (2/3)",
  ]

  # By digits: <=3 = problems 1, 2, 4, 5; 4 = problems 3, 6.
  # CE <=3: 2/4, 2/4, 3/4; 4: 1/2, 1/2, 1/2.
  # NTIL <=3: 3/4, 3/4, 4/4; 4: 1/2, 2/2, 1/2.
  digits = parts[
      "By answer length in digits (sign and decimal point not counted)"
  ]
  assert "<=3 (n=4)" in digits and "4 (n=2)" in digits
  assert "5 (n=" not in digits  # empty buckets are left out
  assert row(digits, "CE") == ["3", "58.33 ± 14.43", "50.00 ± 0.00"]
  assert row(digits, "CE + NTIL") == ["3", "83.33 ± 14.43", "66.67 ± 28.87"]
  assert row(digits, "CE + NTIL − CE, paired Δ (seeds better)") == [
      "",
      "+25.00 (3/3)",
      "+16.67 (1/3)",
  ]

  # By decimals: decimal = problems 2, 4; integer = 1, 3, 5, 6.
  # CE integer 2/4, 3/4, 3/4; decimal 1/2, 0/2, 1/2.
  # NTIL integer 2/4, 4/4, 3/4; decimal 2/2, 1/2, 2/2.
  decimals = parts["By whether the answer has decimals"]
  assert "integer (n=4)" in decimals and "decimal (n=2)" in decimals
  assert row(decimals, "CE") == ["3", "66.67 ± 14.43", "33.33 ± 28.87"]
  assert row(decimals, "CE + NTIL") == ["3", "75.00 ± 25.00", "83.33 ± 28.87"]

  # The control has one seed: no paired figures.
  control = parts["Control: digit-weighted CE"]
  assert row(control, "CE, digit tokens weighted 1.3 − CE") == ["-"] * 12
  assert row(control, "CE + NTIL − (CE, digit tokens weighted 1.3)") == (
      ["-"] * 12
  )
  assert row(control, "CE, digit tokens weighted 1.3")[2] == "83.33"

  # Ablation - NTIL: 3/6 - 4/6, 6/6 - 5/6: mean 0, 1 of 2 better, t = 0.
  ablation = parts["Ablations of NTIL (paired against full NTIL)"]
  exp_off = row(
      ablation, "NTIL, place-value weighting off (sigma=0) − full NTIL"
  )
  assert exp_off[:3] == ["+0.00 ± 23.57", "1/2", "1.000"]

  # The reading: computed from the same numbers.
  reading = parts["What it shows"]
  assert "Best mean exact match at the end: **CE + NTIL** (77.78%)" in reading
  assert (
      "CE + NTIL − CE, exact match at the end: +22.22 points, better on 3/3 "
      f"seeds: better on average but within seed noise (p = {end_p:.3f})"
  ) in reading
  # NTIL is ahead of CE everywhere it is compared, but with 3 seeds
  # nothing passes p < 0.05 except where the spread is 0 (p undefined).
  assert "**Where NTIL does not beat CE** (3 seeds paired" in reading
  assert "behind or level on average: none;" in reading
  assert "answer digits <=3 (+25.00 pts)" in reading
  assert "NTIL beats CE beyond seed noise on: nothing." in reading
  assert "CE, digit tokens weighted 1.3 − CE" in reading  # one seed
  assert "untestable" in reading

  for name in ("exact_match_curve.png", "paired_delta_curve.png"):
    assert (tmp_path / "plots" / name).stat().st_size > 1000


def test_where_ntil_is_behind_is_named(tmp_path):
  # NTIL s1 and s2 both wrong on problem 2 only; CE s1 wrong on 4 only,
  # CE s2 on 3 and 4.
  cells = dict(
      CELLS,
      **{
          "ntil-s1": ("main", "ntil", 1, {2: "-2.4"}, [0.2, 0.4, 0.6]),
          "ntil-s2": ("main", "ntil", 2, {2: "-2.4"}, [0.25, 0.4, 0.6]),
          "ce-s1": ("main", "ce", 1, {4: "4.3"}, [0.1, 0.25, 0.45]),
      },
  )
  report = write(
      tmp_path, ["ce-s1", "ce-s2", "ntil-s1", "ntil-s2"], cells=cells
  )
  reading = sections(report)["What it shows"]
  behind = reading.split("ahead on average")[0].split("Where NTIL")[1]
  # Decimal answers (problems 2, 4): CE s1 1/2, s2 1/2; NTIL s1 1/2, s2
  # 1/2: level, so not in NTIL's favour.
  assert "answer decimal (+0.00 pts)" in behind
  # Subtraction (2, 3, 5): CE s1 3/3, s2 2/3; NTIL 2/3, 2/3: -33.33, 0.
  assert "operation subtract (-16.67 pts)" in behind
  # Addition (1, 4, 6): CE s1 2/3, s2 2/3; NTIL 3/3, 3/3: ahead.
  assert "operation add" not in behind


def test_partial_grid_of_one_cell(tmp_path):
  report = write(tmp_path, ["ce-s0"])
  parts = sections(report)
  assert "1 of the 60 cells recorded" in parts["Grid coverage"]
  assert (
      "(main 1/25, control 0/5, ablation 0/15, peers 0/15)"
      in parts["Grid coverage"]
  )
  assert "No seed paired yet." in parts["Paired differences vs CE"]
  assert "Not run yet." in parts["Control: digit-weighted CE"]
  assert "NTIL vs CE: no seed has both yet." in parts["What it shows"]
  assert row(parts["Main table"], "CE")[:3] == ["1 (0)", "10.00", "50.00"]


def test_breakdowns_left_out_when_problems_do_not_match(tmp_path):
  # Shuffled answers do not reproduce the recorded exact match.
  shuffled = [(q, a) for (q, _), a in zip(PROBLEMS, ANSWERS[1:] + ANSWERS[:1])]
  report = write(tmp_path, ["ce-s0", "ntil-s0"], problems=shuffled)
  breakdowns = sections(report)["Breakdowns of exact match (end of training)"]
  assert "Not available" in breakdowns
  assert "did not reproduce the recorded exact match" in breakdowns
  # The main table falls back to the recorded figures.
  assert row(sections(report)["Main table"], "CE")[2] == "50.00"


def test_command_line_without_the_data(tmp_path):
  runs = [record(n) for n in ("ce-s0", "ce-s1", "ntil-s0", "ntil-s1")]
  (tmp_path / "results.json").write_text(json.dumps(dict(runs=runs)))
  result = launch.run(
      [
          sys.executable,
          "-m",
          "experiments.arithmetic_mix.report",
          "--profile=digits",
          f"--results={tmp_path / 'results.json'}",
          f"--out_dir={tmp_path}",
          f"--data_dir={tmp_path / 'no-data'}",
      ],
      cwd=ROOT,
      capture_output=True,
      text=True,
      timeout=300,
  )
  assert result.returncode == 0, result.stderr[-3000:]
  report = (tmp_path / "results.md").read_text()
  assert "4 of the 60 cells recorded" in report
  assert "Not available: they need the test problems (not found:" in report
  # The terminal says so too, with the command that prepares them.
  assert "warning: no test problems under" in result.stderr
  assert "python -m train.prepare_data --data_dir=" in result.stderr
  # Recorded figures: end 50, 50 vs 66.67, 83.33: +25 ± 11.79 on 2/2 seeds.
  paired = row(sections(report)["Paired differences vs CE"], "CE + NTIL − CE")
  assert paired[:2] == ["+25.00 ± 11.79", "2/2"]
  assert (tmp_path / "plots" / "exact_match_curve.png").exists()


def test_verdict_significant_on_average_but_not_every_seed():
  d = dict(mean=-13.28, n=5, better=1, p=0.024)
  assert tables.verdict(d) == (
      "worse on average (p = 0.024), but not on every seed"
  )
  assert not tables.beats(d, higher=False) and not tables.beats(d)
  assert tables.kind(d) == "significant"
  unanimous = dict(mean=-7.75, n=5, better=0, p=0.0004)
  assert tables.verdict(unanimous) == (
      "worse, beyond seed noise (p < 0.001, every seed)"
  )


def test_regime_tells_a_slow_rise_from_a_steep_one(tmp_path):
  runs = [record(n) for n in ("ce-s0", "ce-s1", "ntil-s0")]
  for run in runs:  # 1 point below the end at step 600, on every seed
    curve = run["curves"]["exact_match"]
    curve[-2] = curve[-1] - 0.01
  dr.write_report(runs, PROBLEMS, str(tmp_path), "test problems")
  regime = sections((tmp_path / "results.md").read_text())["Regime"]
  assert (
      "rising slowly at the end of the budget (+1.00 points over the "
      "last 200 steps" in regime
  )
  assert "still rising steeply" not in regime


def test_same_cells_on_another_device_are_compared(tmp_path):
  runs = [record(n) for n in ("ce-s0", "ntil-s0")]
  runs[0]["config_hash"], runs[1]["config_hash"] = "aaa", "bbb"
  runs[0]["device"] = runs[1]["device"] = "gpu:H100 x1"
  twin = dict(runs[0], device="cpu:cpu x1")
  twin["exact_match"] = runs[0]["exact_match"] - 0.05  # 5 points lower
  unrelated = dict(runs[1], config_hash="ccc")
  dr.write_report(
      runs,
      PROBLEMS,
      str(tmp_path),
      "test problems",
      "digits_long",
      other=[twin, unrelated],
  )
  report = (tmp_path / "results.md").read_text()
  section = sections(report)["The same cells on another device"]
  em = 100 * runs[0]["exact_match"]
  assert f"| ce-s0 | {em:.2f} | {em - 5:.2f} (cpu:cpu x1) | +5.00 |" in section
  assert "ntil-s0" not in section  # its hash has no twin
  assert "Mean absolute difference 5.00 points over 1 cells" in section
  assert "--profile=digits_long` from `digits/results_long.json`" in report


def prepared(data_dir, size):
  """A prepared dataset's folder of training size ``size`` (its records come
  from `fake_split`)."""
  folder = (
      data_dir / "arithmetic_mix" / f"add_or_sub-easy_train{size}_test6_seed0"
  )
  (folder / "1.0.0").mkdir(parents=True)
  (folder / "1.0.0" / "dataset_info.json").write_text("{}")
  return folder


@pytest.fixture(name="fake_split")
def fixture_fake_split(monkeypatch):
  """`input_pipeline.load_split` reads PROBLEMS (as TFDS records: bytes)."""
  from train import input_pipeline  # pylint: disable=g-import-not-at-top

  reads = []

  class Split(list):

    def __getitems__(self, indices):
      return [self[i] for i in indices]

  def load_split(data_dir, split, config_name):
    reads.append((data_dir, split, config_name))
    return Split(
        dict(question=q.encode(), answer=a.encode()) for q, a in PROBLEMS
    )

  monkeypatch.setattr(input_pipeline, "load_split", load_split)
  return reads


def test_report_renders_whole_again_from_its_copy_of_the_test_problems(
    tmp_path, fake_split
):
  """Regenerated without the prepared data (a fresh clone), the report keeps
  its breakdowns: it reads the copy it wrote beside results.json."""
  runs = [record(n) for n in ("ce-s0", "ce-s1", "ntil-s0", "ntil-s1")]
  results = tmp_path / "grid" / "results.json"
  results.parent.mkdir()
  results.write_text(json.dumps(dict(runs=runs)))
  data = tmp_path / "data"
  prepared(data, 102400)
  out = tmp_path / "out"
  dr.main(str(results), str(out), str(data))
  with_data = (out / "results.md").read_text()
  assert len(fake_split) == 1
  copy = tmp_path / "grid" / "test_problems"
  copy /= "add_or_sub-easy_train102400_test6_seed0.json"
  assert [tuple(p) for p in json.loads(copy.read_text())] == PROBLEMS
  assert "### By answer length" in with_data

  dr.main(str(results), str(out), str(tmp_path / "no-data"))
  assert len(fake_split) == 1  # the data was not read again
  assert (out / "results.md").read_text() == with_data.replace(
      str(data), str(tmp_path / "no-data")
  )
  # A copy that does not match the runs is checked like the data.
  wrong = [[q, "0"] for q, _ in PROBLEMS]
  copy.write_text(json.dumps(wrong))
  dr.main(str(results), str(out), str(tmp_path / "no-data"))
  assert "### By answer length" not in (out / "results.md").read_text()
  assert (
      "did not reproduce the recorded exact match"
      in (out / "results.md").read_text()
  )


def test_another_training_size_gives_the_test_split_not_the_regime(
    tmp_path, fake_split
):
  """The test split is the same for any training size, so a dataset of 9,600
  problems lends its test problems but does not say the runs (102,400 read)
  saw some problems twice; the runs' own size is read first, even from the
  report's copy where only another size is prepared."""
  del fake_split
  runs = [record(n) for n in ("ce-s0", "ntil-s0")]
  results = tmp_path / "results.json"
  results.write_text(json.dumps(dict(runs=runs)))
  prepared(tmp_path / "data", 9600)
  dr.main(str(results), str(tmp_path), str(tmp_path / "data"))
  report = (tmp_path / "results.md").read_text()
  assert "seen twice" not in report and "9,600 generated" not in report
  assert "so **each is seen once**" in report
  assert "add_or_sub-easy_train9600_test6_seed0" in report  # its source

  kept = tmp_path / "test_problems"
  own = kept / "add_or_sub-easy_train102400_test6_seed0.json"
  own.write_text(
      (kept / "add_or_sub-easy_train9600_test6_seed0.json").read_text()
  )
  dr.main(str(results), str(tmp_path), str(tmp_path / "data"))
  report = (tmp_path / "results.md").read_text()
  assert "add_or_sub-easy_train102400_test6_seed0" in report
  assert "of 102,400 generated training problems" in report


# CE in chunks: s0 2/6 (CE s0 3/6), s1 3/6 (CE s1 3/6); NTIL in chunks: s0
# 5/6 (NTIL s0 4/6), s1 6/6 (NTIL s1 5/6).
CHUNK_CELLS = {
    "ce-chunks-s0": (
        "chunks",
        "ce",
        0,
        {1: "41", 4: "4.2", 5: "7", 6: "x"},
        [0.1, 0.2, 0.3],
    ),
    "ce-chunks-s1": (
        "chunks",
        "ce",
        1,
        {2: "-2", 4: "4.3", 6: "1001"},
        [0.1, 0.2, 0.3],
    ),
    "ntil-chunks-s0": ("chunks", "ntil", 0, {6: "999"}, [0.1, 0.2, 0.3]),
    "ntil-chunks-s1": ("chunks", "ntil", 1, {}, [0.1, 0.2, 0.3]),
}
# DEL in chunks (group chunks_peers): s0 4/6, s1 5/6.
PEER_CHUNK_CELLS = {
    "del-chunks-s0": ("chunks_peers", "del", 0, {1: "41", 6: "x"}, [0.1]),
    "del-chunks-s1": ("chunks_peers", "del", 1, {2: "-2"}, [0.1]),
}
# DEL: s0 5/6 (CE s0 3/6), s1 4/6 (CE s1 3/6).
PEER_CELLS = {
    "del-s0": ("peers", "del", 0, {4: "4.2"}, [0.1, 0.2, 0.3]),
    "del-s1": ("peers", "del", 1, {2: "-2", 4: "4.3"}, [0.1, 0.2, 0.3]),
}


def test_chunk_cells_are_paired_with_their_single_digit_runs(tmp_path):
  cells = {**CELLS, **CHUNK_CELLS}
  report = write(tmp_path, list(cells), cells=cells)
  part = sections(report)["Numbers in tokens of 1-3 digits"]
  assert "4 of the 30 cells recorded" in part
  assert "hardware alone" not in part  # every cell on one device
  assert row(part, "CE, 1-3 digit tokens")[:3] == [
      "2 (0,1)",
      "10.00 ± 0.00",
      "41.67 ± 11.79",  # 2/6 and 3/6
  ]
  # CE: -1/6 and 0 on the two seeds: -8.33 ± 11.79, t = -1, p = 0.5 (1 df).
  assert row(part, "CE, 1-3 digit tokens − CE")[:3] == [
      "-8.33 ± 11.79",
      "0/2",
      "0.500",
  ]
  # NTIL: +1/6 on both seeds against itself on digits; +3/6 on both
  # against CE in chunks (no spread: no t-test; the sign test's 2 / 2**2).
  assert row(part, "CE + NTIL, 1-3 digit tokens − CE + NTIL")[:3] == [
      "+16.67 ± 0.00",
      "2/2",
      "sign 0.500",
  ]
  assert row(part, "CE + NTIL, 1-3 digit tokens − (CE, both in chunks)")[
      :3
  ] == ["+50.00 ± 0.00", "2/2", "sign 0.500"]
  # Without chunk cells the section says so.
  plain = write(tmp_path, list(CELLS))
  assert "Not run yet (groups `chunks` and `chunks_peers`, 30 cells)." in plain


def test_what_it_shows_reads_the_chunk_cells_against_ce_in_chunks(tmp_path):
  third = {
      # CE in chunks s2: 2/6; DEL in chunks s2: 5/6.
      "ce-chunks-s2": (
          "chunks",
          "ce",
          2,
          {1: "41", 2: "-2", 3: "1", 4: "4.2"},
          [0.1, 0.2, 0.3],
      ),
      "del-chunks-s2": ("chunks_peers", "del", 2, {6: "x"}, [0.1]),
  }
  cells = {**CELLS, **CHUNK_CELLS, **PEER_CHUNK_CELLS, **third}
  shows = sections(write(tmp_path, list(cells), cells=cells))["What it shows"]
  shows = " ".join(shows.split())
  # DEL - CE in chunks: +2/6, +2/6, +3/6 on seeds 0-2: 38.89 points, sd
  # 9.62, t = 7 on 2 df, p = 1 - 7 / sqrt(51) = 0.020, better on every seed.
  assert (
      "CE + DEL, 1-3 digit tokens − CE in the same tokens, exact match at"
      " the end: +38.89 points, better on 3/3 seeds" in shows
  )
  assert (
      "CE + DEL, 1-3 digit tokens, exact match at the end (+38.89 pts,"
      " better on every seed, p = 0.020)" in shows
  )
  # NTIL in chunks: +3/6 on both seeds, no spread: the sign test's 0.5.
  assert (
      "CE + NTIL, 1-3 digit tokens − CE in the same tokens, exact match at"
      " the end: +50.00 points, better on 2/2 seeds" in shows
  )
  assert "CE + NTIL, 1-3 digit tokens, exact match at the end (" not in shows
  # Without chunk cells nothing is said of them.
  plain = sections(write(tmp_path, list(CELLS)))["What it shows"]
  assert "1-3 digit tokens" not in plain


def test_peer_cells_are_rows_of_the_main_tables(tmp_path):
  cells = {**CELLS, **PEER_CELLS}
  parts = sections(write(tmp_path, list(cells), cells=cells))
  assert (
      "(main 6/25, control 1/5, ablation 2/15, peers 2/15)"
      in parts["Grid coverage"]
  )
  assert "- CE + DEL: 2 of 5 seeds (0, 1)" in parts["Grid coverage"]
  assert row(parts["Main table"], "CE + DEL")[:3] == [
      "2 (0,1)",
      "10.00 ± 0.00",
      "75.00 ± 11.79",  # 5/6 and 4/6
  ]
  # +2/6 and +1/6 against CE: +25.00 ± 11.79, t = 3 on 1 df, p = 0.205.
  assert row(parts["Paired differences vs CE"], "CE + DEL − CE")[:3] == [
      "+25.00 ± 11.79",
      "2/2",
      "0.205",
  ]


def test_peers_on_other_hardware_than_ce_are_named(tmp_path):
  cells = {**CELLS, **PEER_CELLS}
  runs = [record(n, cells) for n in cells]
  for run in runs:
    run["device"] = "gpu:B x1" if run["group"] == "peers" else "gpu:A x1"
  twins = [  # each device's ce-s0 / del-s0 again on the CPU, 1 / 3 below
      dict(r, device="cpu:cpu x1", exact_match=r["exact_match"] - d)
      for r, d in ((runs[0], 0.01), (runs[-1], 0.03))
  ]
  for run, twin in zip((runs[0], runs[-1]), twins):
    run["config_hash"] = twin["config_hash"] = run["name"]
  dr.write_report(runs, PROBLEMS, str(tmp_path), "test problems", other=twins)
  parts = sections((tmp_path / "results.md").read_text())
  assert (
      "Hardware: gpu:A x1 (groups main, control, ablation), gpu:B x1"
      " (groups peers)." in parts["Regime"].replace("\n  ", " ")
  )
  assert (
      "CE + DEL ran on gpu:B x1, CE on gpu:A x1: hardware alone moves a run"
      in parts["Paired differences vs CE"].replace("\n", " ")
  )
  check = parts["The same cells on another device"].replace("\n", " ")
  assert "| cell | this grid | other device | Δ (pts) |" in check
  em = 100 * runs[-1]["exact_match"]
  assert (
      f"| {runs[-1]['name']} | {em:.2f} (gpu:B x1) | {em - 3:.2f} (cpu:cpu x1)"
      " | +3.00 |" in check
  )
  assert (
      "Mean absolute difference 2.00 points over 2 cells (1.00 over 1"
      " between gpu:A x1 and cpu:cpu x1; 3.00 over 1 between gpu:B x1 and"
      " cpu:cpu x1)" in check
  )


def test_cells_of_another_device_are_shown_apart(tmp_path):
  # The CPU's records: CE s0 and s1 on single digits (3/6 each), CE s0 in
  # chunks (2/6), DEL s0 (5/6) and s1 (4/6), and DEL in chunks s0 (4/6)
  # and s1 (5/6).
  cells = {**CELLS, **CHUNK_CELLS, **PEER_CELLS, **PEER_CHUNK_CELLS}
  names = ["ce-s0", "ce-s1", "ce-chunks-s0", "del-s0", "del-s1"]
  names += ["ce-chunks-s1", "del-chunks-s0", "del-chunks-s1"]
  other = [record(n, cells) for n in names]
  for run in other:
    run["device"] = "cpu:other x1"
  runs = [record(n) for n in CELLS]
  dr.write_report(runs, PROBLEMS, str(tmp_path), "test problems", other=other)
  parts = sections((tmp_path / "results.md").read_text())
  part = parts["Cells run on cpu:other x1"]
  assert row(part, "CE")[:3] == ["2 (0,1)", "10.00 ± 0.00", "50.00 ± 0.00"]
  assert row(part, "CE, 1-3 digit tokens")[:3] == [
      "2 (0,1)",
      "10.00 ± 0.00",
      "41.67 ± 11.79",  # 2/6 and 3/6
  ]
  assert row(part, "CE + DEL")[:3] == [
      "2 (0,1)",
      "10.00 ± 0.00",
      "75.00 ± 11.79",
  ]
  # DEL against that device's CE: +2/6 and +1/6, t = 3 on 1 df, p = 0.205.
  assert row(part, "CE + DEL − CE")[:3] == ["+25.00 ± 11.79", "2/2", "0.205"]
  # CE in chunks against CE: -1/6 and 0 (t = -1 on 1 df, p = 0.5).
  assert row(part, "CE, 1-3 digit tokens − CE")[:3] == [
      "-8.33 ± 11.79",
      "0/2",
      "0.500",
  ]
  # DEL in chunks against DEL on digits: -1/6 and +1/6 (t = 0, p = 1);
  # against CE in chunks: +2/6 on both seeds (no spread: the sign test).
  assert row(part, "CE + DEL, 1-3 digit tokens − CE + DEL")[:3] == [
      "+0.00 ± 23.57",
      "1/2",
      "1.000",
  ]
  assert row(part, "CE + DEL, 1-3 digit tokens − (CE, both in chunks)")[:3] == [
      "+33.33 ± 0.00",
      "2/2",
      "sign 0.500",
  ]
  # This report's own hardware has no chunk or peer cell yet: the chunk
  # section points to the device that ran them.
  chunks = parts["Numbers in tokens of 1-3 digits"]
  assert "Not run yet" not in chunks
  assert "the cells run on cpu:other x1 are in their own section" in chunks
  assert "CE + DEL" not in parts["Main table"]
  assert "peers 0/15" in parts["Grid coverage"]
