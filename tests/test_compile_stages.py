"""benchmarks.compile_stages: NTIL cut after each stage, and restored."""

from benchmarks import compile_stages
from benchmarks import report
from ntil_jax import ntil


def test_each_stage_adds_kernels_and_ntil_is_restored():
  deviations = ntil._number_deviations  # pylint: disable=protected-access
  compare = ntil.numbers.compare_numbers
  stages = compile_stages.measure((1, 64, 32), repeats=1)
  assert list(stages) == ["place", "digits", "comparison", "ntil"]
  loops = [kernels for _, kernels in stages.values()]
  assert loops == sorted(loops) and loops[0] < loops[-1]
  assert all(ratio > 0 for ratio, _ in stages.values())
  assert ntil._number_deviations is deviations  # pylint: disable=protected-access
  assert ntil.numbers.compare_numbers is compare


def test_the_report_renders_a_stages_file():
  results = dict(
      device="cpu",
      jax="0.0",
      date="2026-11-29",
      repeats=2,
      shapes={
          "1x64x32": {
              stage: dict(ntil_over_emd=1.0 + i / 4, loop_kernels=20 + i)
              for i, stage in enumerate(compile_stages.STAGES)
          }
      },
  )
  text = "\n".join(report.stages_section(results, "compile_stages.json"))
  assert "best of 2 rounds" in text
  assert "| 1x64x32: x EMD, loop kernels |" in text
  assert "(all of NTIL) | 1.75x, 23 |" in text
  assert text.count("\n| ") == 5  # the header and the four stages
