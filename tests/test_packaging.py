"""Installation boundaries and the formatter's reach.

* Training and evaluation import nothing of the arithmetic generator
  (``mathematics_dataset`` and its pinned sympy 1.5.1, the
  ``arithmetic-data`` extra), so ``ntil-jax[train,llm]`` works beside
  PyTorch, whose sympy >= 1.13 breaks that generator. A subprocess blocks
  both packages with a ``sys.meta_path`` finder, imports every task and
  entry point, and trains on data prepared beforehand.
* pyink checks every tracked Python file (an unanchored exclude regex once
  skipped train/prepare_data.py).
"""

import json
import os
import pathlib
import subprocess
import sys

import pytest

from train import arithmetic_data

from tests import launch

ROOT = pathlib.Path(__file__).resolve().parents[1]
BLOCKED = ("mathematics_dataset", "sympy")

# Installs the blocker, then runs the code given after it.
_BLOCKER = f"""
import importlib.abc, sys
class Blocker(importlib.abc.MetaPathFinder):
  def find_spec(self, name, path=None, target=None):
    if name.split('.')[0] in {BLOCKED!r}:
      raise ImportError(f'{{name}} is blocked by the test')
    return None
sys.meta_path.insert(0, Blocker())
"""


def run_blocked(code, *args, check=True):
  result = launch.run(
      [sys.executable, "-c", _BLOCKER + code, *args],
      cwd=ROOT,
      capture_output=True,
      text=True,
      timeout=600,
  )
  if check:
    assert result.returncode == 0, result.stderr[-3000:]
  return result


def test_blocker_blocks():
  """The finder works: without it the test below would prove nothing."""
  result = run_blocked("import sympy", check=False)
  assert result.returncode != 0
  assert "sympy is blocked by the test" in result.stderr


def test_tasks_and_entry_points_import_without_the_generator():
  code = """
import importlib
from train import tasks
for name in sorted(tasks.TASKS):
  importlib.import_module(tasks.TASKS[name])
import train.main, train.prepare_data, train.pretrained, train.evaluate
import experiments.common
loaded = sorted(m for m in sys.modules if m.split('.')[0] in BLOCKED)
print('LOADED', loaded)
"""
  result = run_blocked(f"BLOCKED = {BLOCKED!r}\n" + code)
  assert "LOADED []" in result.stdout


@pytest.mark.slow
def test_arithmetic_train_runs_without_the_generator(tmp_path):
  data_dir = tmp_path / "data"
  arithmetic_data.prepare(str(data_dir), train_size=64, test_size=8, seed=0)
  workdir = tmp_path / "run"
  code = """
import runpy
sys.argv = ['train.main'] + sys.argv[1:]
runpy.run_module('train.main', run_name='__main__')
"""
  run_blocked(
      code,
      f"--config={ROOT}/configs/arithmetic_mix.py:ntil",
      f"--workdir={workdir}",
      f"--config.data_dir={data_dir}",
      "--config.model=tiny",
      "--config.batch_size=8",
      "--config.train_steps=2",
      "--config.warmup_steps=1",
      "--config.log_every_steps=1",
      "--config.eval_every_steps=2",
      "--config.eval_batch_size=8",
      "--config.eval_examples=8",
      "--config.num_samples=0",
  )
  with open(workdir / "metrics.jsonl") as f:
    records = [json.loads(line) for line in f]
  assert [r["step"] for r in records if "loss" in r] == [1, 2]
  assert any("exact_match" in r for r in records)


def test_generating_without_the_extra_says_which_extra(tmp_path):
  code = """
sys.argv = ['prepare_data'] + sys.argv[1:]
from absl import app
from train import prepare_data
prepare_data.define_flags()
app.run(prepare_data.main)
"""
  result = run_blocked(
      code,
      f"--data_dir={tmp_path}",
      "--train_size=4",
      "--test_size=2",
      check=False,
  )
  assert result.returncode == 1
  last = result.stderr.strip().splitlines()[-1]
  assert last.startswith("error: generating arithmetic_mix data needs")
  assert "arithmetic-data" in last
  assert "Traceback" not in result.stderr


def test_length_limits_match_mathematics_dataset():
  generate_settings = pytest.importorskip(
      "mathematics_dataset.generate_settings"
  )
  assert arithmetic_data.MAX_QUESTION_LENGTH == (
      generate_settings.MAX_QUESTION_LENGTH
  )
  assert arithmetic_data.MAX_ANSWER_LENGTH == (
      generate_settings.MAX_ANSWER_LENGTH
  )


def _tracked_python_files():
  try:
    listed = subprocess.run(
        ["git", "ls-files", "*.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
  except (OSError, subprocess.CalledProcessError):
    pytest.skip("not a git checkout")
  return {str(ROOT / name) for name in listed if (ROOT / name).exists()}


def test_device_wheels_satisfy_the_project_requirements():
  """scripts/device_*wheels.txt pin what a GPU machine gets: in range."""
  from packaging import requirements  # pylint: disable=g-import-not-at-top
  import tomllib  # pylint: disable=g-import-not-at-top

  project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
  wanted = {}
  for line in project["dependencies"] + [
      r for extra in project["optional-dependencies"].values() for r in extra
  ]:
    if not line.startswith("ntil-jax"):
      requirement = requirements.Requirement(line)
      wanted[requirement.name.lower().replace("_", "-")] = requirement
  pinned = {}
  for line in "\n".join(
      (ROOT / "scripts" / name).read_text()
      for name in (
          "device_wheels.txt",
          "device_bench_wheels.txt",
          "device_data_wheels.txt",
      )
  ).splitlines():
    if line.strip() and not line.startswith("#"):
      name, version = line.split("==")
      pinned[name.lower().replace("_", "-")] = version
  checked = sorted(set(pinned) & set(wanted))
  assert {
      "flax",
      "optax",
      "orbax-checkpoint",
      "google-tunix",
      "gguf",
      "tokamax",
      "mathematics-dataset",
      "sympy",
  } <= set(checked)
  for name in checked:
    assert wanted[name].specifier.contains(pinned[name]), (name, pinned[name])


def test_no_tracked_file_is_over_two_mib():
  try:
    listed = (
        subprocess.run(
            ["git", "ls-files", "-z"],
            cwd=ROOT,
            capture_output=True,
            check=True,
        )
        .stdout.decode()
        .split("\0")
    )
  except (OSError, subprocess.CalledProcessError):
    pytest.skip("not a git checkout")
  sizes = {
      name: (ROOT / name).stat().st_size
      for name in listed
      if name and (ROOT / name).is_file()
  }
  assert len(sizes) > 40
  assert "experiments/grounding/results.json" in sizes
  too_large = {name: size for name, size in sizes.items() if size > 2 << 20}
  assert not too_large, too_large


@pytest.mark.slow
def test_pyink_checks_every_tracked_python_file():
  tracked = _tracked_python_files()
  assert len(tracked) > 40  # the repository's own files, not an empty list
  result = subprocess.run(
      [sys.executable, "-m", "pyink", "--check", "--verbose", "."],
      cwd=ROOT,
      capture_output=True,
      text=True,
  )
  checked = set()
  for line in result.stderr.splitlines():
    for marker in (" already well formatted", " wasn't modified on disk"):
      if line.endswith(", good job.") or marker in line:
        checked.add(line.split(" ", 1)[0])
    if line.startswith("would reformat "):
      checked.add(line.removeprefix("would reformat ").strip())
  checked = {os.path.abspath(path) for path in checked}
  assert tracked - checked == set()
