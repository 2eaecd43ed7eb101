"""The test session's XLA:CPU optimisation level, and the users' settings.

`conftest` compiles the session's programs at LLVM level 0 and without
LLVM's expensive passes (``FAST_COMPILES``, what JAX's
``jax_disable_most_optimizations`` sets). A test that checks numbers recorded under XLA's default
(a model's initial parameters to the last bit) runs its computation in a
process with `users_environment`.
"""

import os

FAST_COMPILES = (
    "--xla_backend_optimization_level=0 "
    "--xla_llvm_disable_expensive_passes=true"
)


def users_environment() -> dict:
  """``os.environ`` without the session's optimisation level."""
  flags = os.environ.get("XLA_FLAGS", "").split()
  env = dict(os.environ)
  fast = FAST_COMPILES.split()
  env["XLA_FLAGS"] = " ".join(f for f in flags if f not in fast)
  return env
