"""experiments/arithmetic_mix/llm_report.py on records built here."""

import numpy as np
import pytest

PROBLEMS = {
    "add_or_sub": [
        ("What is 1.5 + 2?", "3.5"),
        ("Calculate 10 - 3.", "7"),
        ("Sum 123 and 456.", "579"),
        ("What is 0.25 - 1?", "-0.75"),
    ],
    "arithmetic_mix": [
        ("Evaluate (-3)/7*1.", "-3/7"),
        ("What is 2 + (4 - 1)?", "5"),
        ("Calculate 12/4 - 1.", "2"),
        ("What is 1/2 + 1/3?", "5/6"),
    ],
}
METHODS = ("ce", "emd", "ntl_mse", "soft_label", "ntil")


def record(dataset, method, seed, right, early=0.0):
  """A fine-tuned cell whose predictions are right at the ``right`` indices
  and off by 1 elsewhere."""
  problems = PROBLEMS[dataset]
  predictions = [
      a if i in right else str(int(float(a.split("/")[0])) + 1)
      for i, (_, a) in enumerate(problems)
  ]
  exact = len(right) / len(problems)
  return dict(
      name=f"{method}-s{seed}",
      group="main",
      method=method,
      seed=seed,
      dataset=dataset,
      snapshot="Tiny-LM",
      data={},
      steps=300,
      batch_size=32,
      learning_rate=1e-4,
      problems_seen=9600,
      exact_match=exact,
      parsed_rate=1.0,
      mean_log10_abs_error=0.1,
      within_1_percent=exact,
      num_test_examples=len(problems),
      steps_per_second=0.125,
      wall_seconds=2700.0,
      device="cpu:cpu x1",
      host="vm",
      curves=dict(eval_steps=[150, 300], exact_match=[early, exact]),
      predictions=predictions,
  )


def zero_shot(dataset):
  return dict(
      name="zero-shot",
      group="zero_shot",
      method=None,
      seed=None,
      dataset=dataset,
      snapshot="Tiny-LM",
      exact_match=0.0,
      parsed_rate=0.25,
      mean_log10_abs_error=2.5,
      within_1_percent=0.0,
      num_test_examples=4,
      predictions=["The answer is"] * 4,
  )


def test_llm_report_sections_tables_and_breakdowns(tmp_path):
  from experiments.arithmetic_mix import llm_report  # pylint: disable=g-import-not-at-top

  runs = [zero_shot("add_or_sub"), zero_shot("arithmetic_mix")]
  # add_or_sub: CE right on 2 then 4 of 4; NTIL on 3 and 4: NTIL - CE =
  # +25 and 0 points (mean +12.5, better on 1 of 2 seeds).
  right = dict(ce=[{0, 1}, {0, 1, 2, 3}], ntil=[{0, 1, 2}, {0, 1, 2, 3}])
  for seed in (0, 1):
    for method in METHODS:
      cells = right.get(method, [{0}, {0}])[seed]
      runs.append(record("add_or_sub", method, seed, cells, early=0.25))
  # arithmetic_mix: only CE seed 0, right on the two integers 5 and 2.
  runs.append(record("arithmetic_mix", "ce", 0, {1, 2}))
  path = llm_report.write_report(runs, PROBLEMS, str(tmp_path))
  text = open(path).read()
  add, mix = text.split("## arithmetic_mix")
  assert "## add_or_sub" in add
  assert "| Tiny-LM | 0.00 | 0.00 | 25.00 | 2.500 | 4 |" in add
  assert "**10 of the 25 fine-tuned cells recorded**" in add
  assert "**1 of the 15 fine-tuned cells recorded**" in mix
  # CE's end exact match: 50% and 100% -> 75.00 ± 35.36; NTIL 87.50 ± 17.68.
  assert "| CE | 2 (0,1) | 25.00 ± 0.00 | 75.00 ± 35.36 |" in add
  assert "| CE + NTIL | 2 (0,1) | 25.00 ± 0.00 | 87.50 ± 17.68 |" in add
  assert "| CE + NTIL − CE | +12.50 ± 17.68 | 1/2 |" in add
  assert (
      "- Hardware: cpu:cpu x1 (vm): 0.125 steps/s at the median (8.0 s" in add
  )
  assert "other hardware" not in text
  # Breakdowns by answer digits, operation and decimals on add_or_sub; by
  # how the answer is written on arithmetic_mix (no operation words).
  assert "### By operation, as the question writes it" in add
  assert "### By whether the answer has decimals" in add
  assert "### By how the answer is written" in mix
  assert "### By operation" not in mix
  # CE seed 0 on arithmetic_mix: both integers right, both fractions wrong.
  form = mix.split("### By how the answer is written")[1]
  assert "| integer (n=2) | fraction (n=2) |" in form
  assert "| CE | 1 | 100.00 | 0.00 |" in form
  assert "(tmp_path)" not in text
  for name in ("add_or_sub", "arithmetic_mix"):
    assert (tmp_path / "plots" / f"{name}_exact_match_curve.png").stat().st_size
  assert "Partial grid" in add


def test_cells_on_two_devices_are_named(tmp_path):
  """A grid finished on a GPU: each device's speed, and the pairs across
  devices flagged."""
  from experiments.arithmetic_mix import llm_report  # pylint: disable=g-import-not-at-top

  runs = [zero_shot("add_or_sub")]
  for seed in (0, 1):
    for method in ("ce", "emd", "ntil"):
      cell = record("add_or_sub", method, seed, {0, 1})
      if (method, seed) not in (("ce", 0), ("emd", 0)):  # the CPU's cells
        cell.update(device="gpu:H100 x1", host="box", steps_per_second=4.0)
      runs.append(cell)
  text = open(llm_report.write_report(runs, PROBLEMS, str(tmp_path))).read()
  assert "- Hardware: 2 cells on cpu:cpu x1 (vm): 0.125 steps/s" in text
  assert "- Hardware: 4 cells on gpu:H100 x1 (box): 4.000 steps/s" in text
  # Seed 0: NTIL on the GPU against CE on the CPU; seed 1 all on the GPU.
  assert (
      "**1 paired cell(s) ran on other hardware than CE's cell of the same "
      "seed** (CE + NTIL s0)"
  ) in text


@pytest.mark.parametrize(
    "answer, form",
    [("-3/7", "fraction"), ("0.5", "decimal"), ("12", "integer")],
)
def test_answer_form(answer, form):
  from experiments.arithmetic_mix import answers  # pylint: disable=g-import-not-at-top

  assert answers.answer_form(answer) == form


def test_runs_split_by_dataset_in_report_order():
  from experiments.arithmetic_mix import llm_report  # pylint: disable=g-import-not-at-top

  runs = [
      record("arithmetic_mix", "ce", 0, {0}),
      zero_shot("add_or_sub"),
      record("add_or_sub", "ntil", 1, {0}),
  ]
  split = llm_report.split_runs(runs)
  assert list(split) == ["add_or_sub", "arithmetic_mix"]
  zero, tuned = split["add_or_sub"]
  assert [r["name"] for r in zero] == ["zero-shot"]
  assert [r["name"] for r in tuned] == ["ntil-s1"]
  assert np.isclose(split["arithmetic_mix"][1][0]["exact_match"], 0.25)


@pytest.mark.parametrize(
    "data, prefix",
    [({}, ""), ({"module": "arithmetic__add_or_sub"}, "add_or_sub-easy_")],
)
def test_report_reads_the_test_split_the_cells_trained_beside(
    tmp_path, data, prefix
):
  """Of several prepared sizes, the one whose training size the cells read."""
  from experiments.arithmetic_mix import answers  # pylint: disable=g-import-not-at-top

  for size in (96000, 9600, 960):
    info = tmp_path / "arithmetic_mix" / f"{prefix}train{size}_test2000_seed0"
    (info / "1.0.0").mkdir(parents=True)
    (info / "1.0.0" / "dataset_info.json").write_text("{}")
  tuned = [dict(data=data, num_test_examples=2000, problems_seen=9600)]
  pattern = answers.dataset_pattern(tuned, str(tmp_path))
  config = answers.prepared_configs(pattern, 9600)[0]
  assert config == f"{prefix}train9600_test2000_seed0"


def test_the_same_cells_run_elsewhere_are_compared(tmp_path):
  """Cells run again on a GPU (same hash) beside the CPU's runs of them."""
  from experiments import common  # pylint: disable=g-import-not-at-top
  from experiments.arithmetic_mix import llm_report  # pylint: disable=g-import-not-at-top

  gpu = [dict(zero_shot("add_or_sub"), config_hash="z", device="gpu:H100")]
  for method in ("ce", "emd"):
    gpu.append(
        dict(
            record("add_or_sub", method, 0, {0, 1}),  # 50%
            config_hash=method,
            device="gpu:H100 x1",
            host="box",
        )
    )
  cpu = [dict(zero_shot("add_or_sub"), config_hash="z")]
  cpu.append(dict(record("add_or_sub", "ce", 0, {0, 1, 2}), config_hash="ce"))
  cpu.append(dict(record("add_or_sub", "ntil", 0, {0}), config_hash="other"))
  common.save_results(str(tmp_path / "results.json"), gpu)
  common.save_results(str(tmp_path / "results_cpu.json"), cpu)
  text = open(
      llm_report.main(
          str(tmp_path / "results.json"),
          str(tmp_path),
          str(tmp_path / "no-data"),
          [str(tmp_path / "results_cpu.json"), str(tmp_path / "absent.json")],
      )
  ).read()
  section = text.split("## The same cells on another device")[1]
  # Only the fine-tuned cell run on both: 50% on the GPU, 75% on the CPU.
  assert "| ce-s0 | 50.00 | 75.00 (cpu:cpu x1) | -25.00 |" in section
  assert "zero-shot" not in section and "ntil" not in section
  assert "Mean absolute difference 25.00 points over 1 cells" in section


def test_missing_test_problems_name_the_command_that_prepares_them(
    tmp_path, capsys
):
  from experiments import common  # pylint: disable=g-import-not-at-top
  from experiments.arithmetic_mix import answers  # pylint: disable=g-import-not-at-top
  from experiments.arithmetic_mix import llm_report  # pylint: disable=g-import-not-at-top

  mix = [record("arithmetic_mix", "ce", 0, {0})]
  digits = [record("add_or_sub", "ce", 0, {0})]
  digits[0]["data"] = dict(module="arithmetic__add_or_sub", difficulty="easy")
  # The paper's arithmetic__mixed: no module or difficulty flags.
  assert answers.prepare_command(mix, "d") == (
      "python -m train.prepare_data --data_dir=d --train_size=9600 "
      "--test_size=4 --workers=2"
  )
  assert answers.prepare_command(digits, "d") == (
      "python -m train.prepare_data --data_dir=d "
      "--module=arithmetic__add_or_sub --difficulty=easy --train_size=9600 "
      "--test_size=4 --workers=2"
  )
  results = tmp_path / "results.json"
  common.save_results(str(results), mix + digits)
  path = llm_report.main(str(results), str(tmp_path), str(tmp_path / "none"))
  text = open(path).read()
  warnings = capsys.readouterr().err
  for runs in (mix, digits):
    command = answers.prepare_command(runs, str(tmp_path / "none"))
    assert f"prepare them with `{command}` and run the report again." in text
    assert command in warnings
  assert "### By answer length" not in text
