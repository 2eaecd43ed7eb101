"""The fused path on a batch sharded over a 4-device mesh equals 1 device."""

import os
import pathlib
import sys

from tests import launch

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_sharded_fused_equals_single_device():
  env = dict(os.environ, JAX_NUM_CPU_DEVICES="4", JAX_PLATFORMS="cpu")
  result = launch.run(
      [sys.executable, "-m", "tests.sharded_fused_main"],
      cwd=ROOT,
      env=env,
      capture_output=True,
      text=True,
      timeout=600,
  )
  assert result.returncode == 0, result.stdout + result.stderr[-3000:]
  assert result.stdout.strip().endswith("OK")
