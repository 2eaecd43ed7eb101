"""Fixed set vs stream tables and plots (experiments/regimes.py), by hand."""

from experiments import labels
from experiments import regimes
from experiments import stats


def run(curve, steps=(100, 200)):
  return dict(curves=dict(eval_steps=list(steps), exact_match=list(curve)))


# {regime: {key: {seed: run}}}: two seeds each.
GROUPINGS = dict(
    fixed=dict(
        ce={0: run([0.1, 0.5]), 1: run([0.2, 0.6])},
        ntil={0: run([0.3, 0.5]), 1: run([0.2, 0.8])},
    ),
    stream=dict(
        ce={0: run([0.1, 0.4]), 1: run([0.1, 0.4])},
        ntil={0: run([0.1, 0.5]), 1: run([0.2, 0.3])},
    ),
)
ROWS = [("ce", "CE"), ("ntil", "CE + NTIL"), ("emd", "CE + EMD")]


def cells(lines, label):
  for line in lines:
    parts = [c.strip() for c in line.strip().strip("|").split("|")]
    if parts[0] == label:
      return parts[1:]
  raise AssertionError(f"no row {label!r}")


def test_side_by_side_by_hand():
  lines = regimes.side_by_side(GROUPINGS, ROWS, "exact_match")
  assert lines[0] == (
      "| loss | fixed set, step 100 | fixed set, end | stream (each seen "
      "once), step 100 | stream (each seen once), end |"
  )
  # CE: the values alone. Fixed 10, 20 and 50, 60; stream 10, 10; 40, 40.
  assert cells(lines, "CE") == [
      "15.0 ± 7.1",
      "55.0 ± 7.1",
      "10.0 ± 0.0",
      "40.0 ± 0.0",
  ]
  # NTIL - CE per seed. Fixed step 100: +20, 0 (mean 10, sd 14.14, t = 1,
  # p = 0.5, better on 1). End: 0, +20. Stream step 100: 0, +10 (t = 1);
  # end: +10, -10 (mean 0, t = 0, p = 1).
  assert cells(lines, "CE + NTIL") == [
      "25.0 ± 7.1 (+10.0: 1/2, p = 0.500)",
      "65.0 ± 21.2 (+10.0: 1/2, p = 0.500)",
      "15.0 ± 7.1 (+5.0: 1/2, p = 0.500)",
      "40.0 ± 14.1 (+0.0: 1/2, p = 1.000)",
  ]
  assert not any("CE + EMD" in line for line in lines)  # no runs: no row


def test_one_regime_and_a_missing_mid_step():
  only_fixed = dict(fixed=GROUPINGS["fixed"], stream={})
  lines = regimes.side_by_side(only_fixed, ROWS, "exact_match")
  assert "stream" not in lines[0]
  assert regimes.side_by_side({}, ROWS, "exact_match") == [
      "No runs recorded yet."
  ]
  # The mid-curve column reads a step every run has: here only 200 and 300
  # are common, and the last (the end column) is not a mid step.
  later = dict(fixed=dict(ce={0: run([0.3, 0.4], steps=(200, 300))}))
  lines = regimes.side_by_side(later, ROWS, "exact_match")
  assert "step 200" in lines[0]
  assert cells(lines, "CE") == ["30.0", "40.0"]
  assert stats.at_step(later["fixed"]["ce"][0], "exact_match", 100) != (
      stats.at_step(later["fixed"]["ce"][0], "exact_match", 100)
  )  # NaN where the curve has no such step


def test_seed_counts_and_plot(tmp_path):
  assert regimes.seed_counts(GROUPINGS, ROWS) == (
      "CE: fixed 2, stream 2; CE + NTIL: fixed 2, stream 2"
  )
  path = tmp_path / "paired.png"
  metric = stats.Metric("exact_match", "exact match")
  assert regimes.plot_paired_by_regime(
      GROUPINGS, ROWS, metric, str(path), "test"
  )
  assert path.stat().st_size > 1000
  assert not regimes.plot_paired_by_regime(
      dict(fixed=dict(ce=GROUPINGS["fixed"]["ce"])),
      ROWS,
      metric,
      str(tmp_path / "none.png"),
      "test",
  )


def test_mid_eval_step_is_half_the_budget_not_the_first_eval():
  four = (150, 300, 450, 600)  # the clock grid's evals at 600 steps
  g = dict(
      fixed=dict(ce={0: run([0.0, 0.1, 0.3, 0.4], steps=four)}),
      stream=dict(ce={0: run([0.0, 0.1, 0.2, 0.3], steps=four)}),
  )
  assert regimes.mid_eval_step(g) == 300
  lines = regimes.side_by_side(g, ROWS, "exact_match")
  assert "fixed set, step 300" in lines[0]
  assert cells(lines, "CE") == ["10.0", "40.0", "10.0", "30.0"]
  # Six evals of 200 to 1,200 (grounding): 600; evals at 100, 300 and 400
  # (half is 200, a tie) take the earlier; one common step: that step.
  six = tuple(range(200, 1201, 200))
  assert (
      regimes.mid_eval_step(dict(fixed=dict(ce={0: run([0] * 6, six)}))) == 600
  )
  assert regimes.common_eval_steps(g) == list(four)
  tie = dict(fixed=dict(ce={0: run([0, 0, 0], steps=(100, 300, 400))}))
  assert regimes.mid_eval_step(tie) == 100
  one = dict(fixed=dict(ce={0: run([0.5], steps=(50,))}))
  assert regimes.mid_eval_step(one) == 50
  assert regimes.mid_eval_step({}) is None


def test_label_names_methods_then_variants():
  variants = dict(ce_digit_weighted="CE, digits x 1.3")
  keys = ["ce", "ntil", "ce_digit_weighted"]
  assert [labels.label(k, variants) for k in keys] == [
      "CE",
      "CE + NTIL",
      "CE, digits x 1.3",
  ]
  weighted = labels.VARIANT_LABELS["ce_digit_weighted"]
  assert labels.label("ce_digit_weighted") == weighted
