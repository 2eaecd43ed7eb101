"""The test session's XLA settings: fast CPU compiles, one shared cache.

XLA:CPU compiles the tests' programs at LLVM optimisation level 0
(``--xla_backend_optimization_level=0``; the default is 2) and without
LLVM's expensive passes (``--xla_llvm_disable_expensive_passes``; the two
are what JAX's ``jax_disable_most_optimizations`` sets). The tests' models
are tiny, so compiling is most of their time: at level 0 a clock model's
initialiser compiles in half the time and its NTIL train step in two
thirds, while 20 of its steps run 1.5x slower; without the expensive passes
NTIL's value and gradient on [2, 512, 1024] compiled in 2.0 s instead of
2.6 s at level 0 (3.5 s at XLA's default), its run time unchanged (measured
on the 2-core CPU). The programs are the same HLO; only the machine code differs, and with
it the last bit of some float32 results, which no test depends on (each
compares runs of the same session, or holds a tolerance; the one that
checks a model's initial parameters to the last bit computes them in a
process with the users' settings, `xla_settings.users_environment`).
Benchmarks and users' runs keep XLA's default. An ``XLA_FLAGS`` that
already sets the level is left alone.

One persistent JAX compilation cache for the whole test session.

Many tests train the same small models (in this process, in xdist workers
and in subprocesses): each compiles the same programs, NTIL's train step
for several seconds on a CPU. The controller points ``JAX_COMPILATION_CACHE_DIR``
at one temporary folder before the workers start, so every process after the
first loads the compiled program instead. A cached program is the compiled
program itself, so no result changes. Programs that compile in 0.2 s or
more are kept (JAX's default: 1 s). The cache is locked for reading and
writing (``JAX_COMPILATION_CACHE_MAX_SIZE`` turns on JAX's file lock), so two
processes never read an entry half written; without ``filelock`` there is no
shared cache. A cache the caller set up is kept, and left in place.

One bytecode cache too. With ``PYTHONDONTWRITEBYTECODE`` set (as on the
development machine), every one of the session's several hundred processes
would compile the project's modules from source again (0.4 s of CPU for all
of them). The session's processes write their bytecode under a temporary
``PYTHONPYCACHEPREFIX`` instead, removed at the end, so nothing is written
beside the sources; a prefix the caller set is kept.
"""

import importlib.util
import os
import shutil
import tempfile

import pytest

from tests import compile_log
from tests import xla_settings

_OWNED = []
_COMPILE_LOG = []


def pytest_configure(config):
  if hasattr(config, "workerinput"):  # an xdist worker: the controller did it
    return
  flags = os.environ.get("XLA_FLAGS", "")
  if "xla_backend_optimization_level" not in flags:
    os.environ["XLA_FLAGS"] = f"{flags} {xla_settings.FAST_COMPILES}".strip()
  if not os.environ.get("PYTHONPYCACHEPREFIX"):
    path = tempfile.mkdtemp(prefix="ntil-jax-tests-pycache-")
    _OWNED.append(path)
    os.environ["PYTHONPYCACHEPREFIX"] = path
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
  if os.environ.get("JAX_COMPILATION_CACHE_DIR"):
    return
  if importlib.util.find_spec("filelock") is None:
    return
  path = tempfile.mkdtemp(prefix="ntil-jax-tests-xla-cache-")
  _OWNED.append(path)
  os.environ["JAX_COMPILATION_CACHE_DIR"] = path
  os.environ.setdefault("JAX_COMPILATION_CACHE_MAX_SIZE", str(8 << 30))
  # JAX keeps only programs that took 1 s to compile; the tests' many
  # processes each compile the same smaller ones (an optimizer's init, an
  # eval step: 0.3-0.9 s each) again.
  os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.2")


def pytest_sessionstart(session):
  """With NTIL_TEST_COMPILE_LOG=DIR, each process logs its compile time."""
  folder = os.environ.get("NTIL_TEST_COMPILE_LOG")
  if not folder:
    return
  os.makedirs(folder, exist_ok=True)
  worker = getattr(session.config, "workerinput", {}).get("workerid", "main")
  log = compile_log.CompileLog(os.path.join(folder, f"{worker}.jsonl"))
  log.register()
  _COMPILE_LOG.append(log)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
  del nextitem
  for log in _COMPILE_LOG:
    log.start()
  yield
  for log in _COMPILE_LOG:
    log.finish(item.nodeid)


def pytest_collection_modifyitems(config, items):
  """The tests marked slow first, the rest in their order.

  With ``make test``'s ``--dist worksteal`` the two workers then share out
  the long tests at the start and end on short ones, instead of one worker
  running a three-minute grid test while the other waits.
  """
  del config
  items.sort(key=lambda item: item.get_closest_marker("slow") is None)


def pytest_unconfigure(config):
  del config
  for path in _OWNED:
    shutil.rmtree(path, ignore_errors=True)
  for key in ("JAX_COMPILATION_CACHE_DIR", "PYTHONPYCACHEPREFIX"):
    if any(os.environ.get(key) == path for path in _OWNED):
      os.environ.pop(key, None)
