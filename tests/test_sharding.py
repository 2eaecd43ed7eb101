"""Losses on a batch sharded over a 4-device mesh equal the 1-device result."""

import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_sharded_equals_single_device():
  env = dict(os.environ, JAX_NUM_CPU_DEVICES="4", JAX_PLATFORMS="cpu")
  result = subprocess.run(
      [sys.executable, "-m", "tests.sharded_losses_main"],
      cwd=ROOT,
      env=env,
      capture_output=True,
      text=True,
      timeout=600,
  )
  assert result.returncode == 0, result.stdout + result.stderr
  assert result.stdout.strip().endswith("OK")
