"""The device scripts (scripts/*.sh) parse, and every Python module they run
takes the flags they pass: a lent GPU machine's few minutes are no place to
find a misspelt flag."""

import pathlib
import re
import shlex
import subprocess
import sys

import pytest

from tests import launch

ROOT = pathlib.Path(__file__).resolve().parent.parent
SCRIPTS = sorted((ROOT / "scripts").glob("*.sh"))
# What a module's flags are checked with, in a process of its own (modules
# define flags of the same names): the module's flags at import, or its
# `define_flags()` (the scripts' convention), then absl's parser on the
# literal values; a value the shell fills in (`--x="$X"`) checks the name.
CHECK = """
import importlib, sys
from absl import flags
module = importlib.import_module(sys.argv[1])
getattr(module, "define_flags", lambda: None)()
passed = sys.argv[2:]
flags.FLAGS(["check", *(a for a in passed if "$" not in a)])
names = [a.split("=")[0].removeprefix("--") for a in passed]
missing = [name for name in names if name not in flags.FLAGS]
assert not missing, f"{sys.argv[1]} has no flag {missing}"
"""


def invocations(text):
  """``(module, flags)`` of each ``python3 -m MODULE`` of ours, and of each
  ``bench NAME SECONDS MODULE`` call, in a script's text."""
  joined = re.sub(r"\\\n\s*", " ", text)
  found = []
  for line in joined.splitlines():
    line = line.strip()
    match = re.search(
        r"(?:python3 -m |^bench \S+ \S+ )"
        r"((?:benchmarks|experiments|train)\.[\w.]+)([^&|>]*)",
        line,
    )
    if match and not line.startswith("#"):
      args = shlex.split(match.group(2))
      found.append((match.group(1), [a for a in args if a.startswith("--")]))
  return found


def test_invocations_are_read_across_continued_lines():
  text = (
      "# python3 -m benchmarks.old --x=1\n"
      'bench run "$S" benchmarks.run --a=1 \\\n  --b="$B"\n'
      "python3 -m experiments.e --c=2 >log 2>&1 &\n"
      "python3 -m pip install x\n"
  )
  assert invocations(text) == [
      ("benchmarks.run", ["--a=1", "--b=$B"]),
      ("experiments.e", ["--c=2"]),
  ]


def check_flags(module, passed):
  """`CHECK` of ``module`` with the flags ``passed``: its completed process."""
  args = [sys.executable, "-c", CHECK, module, *passed]
  return launch.run(args, cwd=ROOT, capture_output=True, text=True)


def test_every_script_parses():
  assert SCRIPTS
  for script in SCRIPTS:
    result = subprocess.run(
        ["bash", "-n", str(script)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, (script.name, result.stderr)


@pytest.mark.parametrize(
    "module, passed",
    [
        call
        for script in SCRIPTS
        for call in invocations(script.read_text())
        if script.name.startswith("device_")
    ],
)
def test_device_scripts_pass_only_flags_their_modules_define(module, passed):
  result = check_flags(module, passed)
  assert result.returncode == 0, result.stderr[-2000:]


def test_a_misspelt_flag_is_caught():
  result = check_flags("benchmarks.run", ["--calls_per_runs=10"])
  assert result.returncode != 0
  assert "calls_per_runs" in result.stderr
