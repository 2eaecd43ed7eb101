"""A forked command behaves as the same command in a new interpreter."""

import os
import pathlib
import signal
import subprocess
import sys

import pytest

from tests import launch

ROOT = pathlib.Path(__file__).resolve().parents[1]

_SCRIPT = """
import atexit, os, sys, threading, time
import jax
atexit.register(lambda: print("atexit ran", flush=True))
# A thread the interpreter waits for before atexit.
threading.Thread(target=lambda: (time.sleep(0.2), print("thread done"))).start()
print("argv", sys.argv[1:], "devices", jax.device_count())
print("cwd", os.getcwd())
print("to stderr", file=sys.stderr)
sys.exit(int(sys.argv[1]))
"""


def both(args, **kwargs):
  """``launch.run`` forked, then in a real subprocess: both results."""
  kwargs = dict(capture_output=True, text=True, timeout=120, **kwargs)
  forked = launch.run(args, **kwargs)
  env = dict(kwargs.pop("env", None) or os.environ, NTIL_TESTS_NO_FORK="1")
  real = launch.run(args, env=env, **kwargs)
  return forked, real


def test_forked_script_equals_a_new_interpreter(tmp_path):
  env = dict(os.environ, JAX_NUM_CPU_DEVICES="3")
  forked, real = both(
      [sys.executable, "-c", _SCRIPT, "3", "x y"], cwd=tmp_path, env=env
  )
  for result in (forked, real):
    assert result.returncode == 3
    assert result.stdout.splitlines() == [
        "argv ['3', 'x y'] devices 3",
        f"cwd {tmp_path}",
        "thread done",
        "atexit ran",
    ]
    assert result.stderr.strip().endswith("to stderr")


def test_forked_module_errors_as_a_new_interpreter(tmp_path):
  args = [
      sys.executable,
      "-m",
      "experiments.clock_time.run",
      "--max_runs=-1",
      f"--results={tmp_path / 'r.json'}",
  ]
  forked, real = both(args, cwd=ROOT)
  assert forked.returncode == real.returncode == 2
  assert forked.stderr == real.stderr and "error:" in forked.stderr
  forked, real = both([sys.executable, "-c", "raise ValueError('boom')"])
  assert forked.returncode == real.returncode == 1
  for result in (forked, real):
    assert "Traceback" in result.stderr
    assert result.stderr.splitlines()[-1] == "ValueError: boom"


def test_settings_read_at_start_get_a_real_interpreter():
  code = "import sys; print(hash('ntil'))"
  env = dict(os.environ, PYTHONHASHSEED="7")
  forked, real = both([sys.executable, "-c", code], env=env)
  assert forked.stdout == real.stdout


def test_popen_signals_and_pipes():
  code = (
      "import signal, sys, time\n"
      "signal.signal(signal.SIGTERM, lambda *a: sys.exit(143))\n"
      "print('ready', flush=True)\n"
      "time.sleep(60)\n"
  )
  process = launch.popen(
      [sys.executable, "-c", code],
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      text=True,
  )
  assert isinstance(process, launch.Forked)
  assert process.stdout.readline() == "ready\n"
  assert process.poll() is None
  with pytest.raises(subprocess.TimeoutExpired):
    process.communicate(timeout=0.5)
  process.send_signal(signal.SIGTERM)
  out, err = process.communicate(timeout=60)
  assert (process.returncode, out, err) == (143, "", "")
  killed = launch.popen([sys.executable, "-c", "import time; time.sleep(60)"])
  killed.kill()
  assert killed.wait(timeout=60) == -signal.SIGKILL


def test_a_hung_command_times_out():
  with pytest.raises(subprocess.TimeoutExpired):
    launch.run([sys.executable, "-c", "import time; time.sleep(60)"], timeout=1)
