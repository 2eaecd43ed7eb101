"""Losses on a batch or sequence sharded over a 4-device mesh equal 1 device."""

import os
import pathlib
import sys

import pytest

from tests import launch

ROOT = pathlib.Path(__file__).resolve().parents[1]


def run_main(module):
  env = dict(os.environ, JAX_NUM_CPU_DEVICES="4", JAX_PLATFORMS="cpu")
  result = launch.run(
      [sys.executable, "-m", module],
      cwd=ROOT,
      env=env,
      capture_output=True,
      text=True,
      timeout=600,
  )
  assert result.returncode == 0, result.stdout + result.stderr[-3000:]
  assert result.stdout.strip().endswith("OK")


@pytest.mark.slow
def test_sharded_equals_single_device():
  run_main("tests.sharded_losses_main")


@pytest.mark.slow
def test_sequence_sharded_equals_single_device():
  """Every loss on logits split along T (sequence parallelism)."""
  run_main("tests.sequence_sharded_main")
