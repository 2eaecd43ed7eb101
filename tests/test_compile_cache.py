"""The command lines keep compiled programs between runs and restarts."""

import os
import pathlib

from absl import flags
from absl.testing import flagsaver
import jax
import pytest

from train import compile_cache

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(name="jax_settings")
def fixture_jax_settings():
  """JAX's cache settings as the test left them, restored after it.

  Nothing here compiles, so the process's cache (the test session's) is
  never opened under the settings a test tries.
  """
  before = (
      jax.config.jax_compilation_cache_dir,
      jax.config.jax_enable_compilation_cache,
  )
  yield
  jax.config.update("jax_compilation_cache_dir", before[0])
  jax.config.update("jax_enable_compilation_cache", before[1])


def settings():
  return (
      jax.config.jax_compilation_cache_dir,
      jax.config.jax_enable_compilation_cache,
  )


def test_without_a_folder_the_default_is_used(jax_settings, tmp_path):
  del jax_settings
  jax.config.update("jax_compilation_cache_dir", None)
  jax.config.update("jax_enable_compilation_cache", True)
  default = str(tmp_path / "default")
  assert compile_cache.use_persistent_cache(default) == default
  assert settings() == (default, True)


def test_the_callers_folder_is_kept(jax_settings, tmp_path):
  """JAX_COMPILATION_CACHE_DIR (or the caller's jax.config) comes first."""
  del jax_settings
  callers = str(tmp_path / "callers")
  jax.config.update("jax_compilation_cache_dir", callers)
  jax.config.update("jax_enable_compilation_cache", True)
  assert compile_cache.use_persistent_cache(str(tmp_path / "d")) == callers
  assert settings() == (callers, True)


def test_a_requested_folder_wins_and_turns_the_cache_on(jax_settings, tmp_path):
  del jax_settings
  jax.config.update("jax_compilation_cache_dir", str(tmp_path / "callers"))
  jax.config.update("jax_enable_compilation_cache", False)
  asked = str(tmp_path / "asked")
  assert compile_cache.use_persistent_cache(str(tmp_path / "d"), asked) == asked
  assert settings() == (asked, True)
  home = os.path.expanduser("~")
  got = compile_cache.use_persistent_cache("unused", "~/programs")
  assert got == os.path.join(home, "programs") == settings()[0]


def test_an_empty_request_turns_it_off(jax_settings, tmp_path):
  del jax_settings
  callers = str(tmp_path / "callers")
  jax.config.update("jax_compilation_cache_dir", callers)
  jax.config.update("jax_enable_compilation_cache", True)
  assert compile_cache.use_persistent_cache(str(tmp_path / "d"), "") is None
  assert settings() == (callers, False)


def test_a_cache_the_caller_turned_off_stays_off(jax_settings, tmp_path):
  del jax_settings
  jax.config.update("jax_compilation_cache_dir", None)
  jax.config.update("jax_enable_compilation_cache", False)
  assert compile_cache.use_persistent_cache(str(tmp_path / "d")) is None
  assert settings() == (None, False)


@pytest.mark.parametrize("requested", [None, "elsewhere", ""])
def test_train_main_sets_the_cache_before_it_trains(
    jax_settings, tmp_path, monkeypatch, requested
):
  """train.main keeps compiled programs in workdir/compilation_cache (which
  --start_over leaves in place: tests/test_run_safety.py), or where
  --compilation_cache_dir says, and sets the cache before anything is
  compiled (JAX opens it once)."""
  del jax_settings
  from train import main as main_lib  # pylint: disable=g-import-not-at-top

  jax.config.update("jax_compilation_cache_dir", None)
  jax.config.update("jax_enable_compilation_cache", True)
  seen = []

  def train_and_evaluate(config, workdir, start_over):
    del config, start_over
    seen.append((workdir, settings()))
    return dict(stopped_early=False, eval=None, step=0)

  monkeypatch.setattr(main_lib.train, "train_and_evaluate", train_and_evaluate)
  monkeypatch.setattr(main_lib.logs, "quiet_terminal", lambda: None)
  monkeypatch.setattr(main_lib.logs, "quiet_thread_errors", lambda: None)
  workdir = str(tmp_path / "run")
  argv = [
      "train.main",
      f"--workdir={workdir}",
      f"--config={ROOT / 'configs' / 'clock_time.py'}:ntil",
  ]
  if requested is not None:
    requested = requested and str(tmp_path / requested)
    argv.append(f"--compilation_cache_dir={requested}")
  with flagsaver.flagsaver():
    flags.FLAGS(argv)
    try:
      main_lib.main(["train.main"])
    finally:
      flags.FLAGS.unparse_flags()
  want = {
      None: (os.path.join(workdir, "compilation_cache"), True),
      "": (None, False),
  }.get(requested, (requested, True))
  assert seen == [(workdir, want)]


_COMPILE_TWICE = """
import sys
import warnings
import jax
import jax.numpy as jnp
from train import compile_cache
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
compile_cache.use_persistent_cache(sys.argv[1])
with warnings.catch_warnings(record=True) as caught:
  warnings.simplefilter("always")
  out = jax.jit(lambda x: jnp.sin(x) * 3.0 + 1.0)(jnp.arange(4.0))
print(float(out.sum()))
print("warned" if any("cache entry" in str(w.message) for w in caught) else "quiet")
"""


def test_an_entry_cut_short_by_a_crash_is_compiled_again(tmp_path):
  """JAX writes a cache entry in place: one cut short by a crash is read
  with a warning, the program compiled again and the run goes on (the
  entry stays until deleted; docs/troubleshooting.md)."""
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top

  folder = tmp_path / "programs"
  env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_")}

  def run():
    result = subprocess.run(
        [sys.executable, "-c", _COMPILE_TWICE, str(folder)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.split()

  value, warned = run()
  assert warned == "quiet"
  (entry,) = [p for p in folder.iterdir() if p.name.startswith("jit__lambda")]
  entry.write_bytes(entry.read_bytes()[: entry.stat().st_size // 2])
  assert run() == [value, "warned"]
