"""benchmarks.compile_stages: NTIL cut after each stage, and restored."""

from benchmarks import compile_stages
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
