"""One persistent JAX compilation cache for the whole test session.

Many tests train the same small models (in this process, in xdist workers
and in subprocesses): each compiles the same programs, NTIL's train step
for several seconds on a CPU. The controller points ``JAX_COMPILATION_CACHE_DIR``
at one temporary folder before the workers start, so every process after the
first loads the compiled program instead. A cached program is the compiled
program itself, so no result changes. The cache is locked for reading and
writing (``JAX_COMPILATION_CACHE_MAX_SIZE`` turns on JAX's file lock), so two
processes never read an entry half written; without ``filelock`` there is no
shared cache. A cache the caller set up is kept, and left in place.

The tests' programs are compiled with LLVM's cheap optimisation level
(``FAST_COMPILE_XLA_FLAGS``, added to any ``XLA_FLAGS`` the caller set, unless
it names a backend optimisation level itself): their models are tiny, so
compiling is most of each run's time on a CPU and the compiled code's speed
hardly matters (the clock smoke grid's first five runs: 66 s -> 50 s). XLA's
graph passes are the same; the machine code may round differently in the
last bits (a tiny clock run's loss: 4.8606367 -> 4.8606362), and every test
compares runs made under the same flags, or against tolerances far above that.
"""

import importlib.util
import os
import shutil
import tempfile

_OWNED = []

FAST_COMPILE_XLA_FLAGS = (
    "--xla_backend_optimization_level=0",
    "--xla_llvm_disable_expensive_passes=true",
)


def _fast_compile():
  flags = os.environ.get("XLA_FLAGS", "")
  if "xla_backend_optimization_level" in flags:
    return
  os.environ["XLA_FLAGS"] = " ".join((flags, *FAST_COMPILE_XLA_FLAGS)).strip()


def pytest_configure(config):
  if hasattr(config, "workerinput"):  # an xdist worker: the controller did it
    return
  _fast_compile()
  if os.environ.get("JAX_COMPILATION_CACHE_DIR"):
    return
  if importlib.util.find_spec("filelock") is None:
    return
  path = tempfile.mkdtemp(prefix="ntil-jax-tests-xla-cache-")
  _OWNED.append(path)
  os.environ["JAX_COMPILATION_CACHE_DIR"] = path
  os.environ.setdefault("JAX_COMPILATION_CACHE_MAX_SIZE", str(8 << 30))


def pytest_unconfigure(config):
  del config
  for path in _OWNED:
    shutil.rmtree(path, ignore_errors=True)
    os.environ.pop("JAX_COMPILATION_CACHE_DIR", None)
