"""Array helpers that trace into the caller's program in place, and the
test of whether a value is being traced into one (:func:`staged`).

``jnp.where`` is a nested ``jit``: every call is traced as a program of its
own, and under ``jax.grad`` linearized as one too, before XLA inlines it.
The number logic makes about fifty such calls: NTIL's value and gradient
traced in 0.164 s with them and 0.139 s with :func:`where` (2 x 2048 x
1024 on the 2-core CPU, best of 8 in one process, 2026-12-03).
"""

import chex
import jax
from jax.interpreters import partial_eval
import jax.numpy as jnp


def where(condition, x, y) -> chex.Array:
  """``jnp.where(condition, x, y)``, traced in place (no nested ``jit``).

  The same dtype promotion (Python scalars weakly typed) and broadcasting,
  shardings included; ``condition`` is read as a bool.

  Example:
    >>> import jax.numpy as jnp
    >>> where(jnp.array([True, False]), jnp.array([1, 2]), 0.5).tolist()
    [1.0, 0.5]
  """
  dtype = jnp.result_type(x, y)
  condition, x, y = jnp.broadcast_arrays(
      jnp.asarray(condition, bool), jnp.asarray(x, dtype), jnp.asarray(y, dtype)
  )
  return jax.lax.select(condition, x, y)


def staged(x) -> bool:
  """Whether ``x`` is being traced into a program (``jit``, ``scan``, ...).

  The tracers of ``jax.grad`` and ``jax.vmap`` are looked through (their
  ``primal``, their ``val``): under ``jit(grad(f))`` the value inside is
  staged, under ``grad(f)`` alone it is concrete. A tracer of another kind
  counts as not staged (the number logic then runs as a program of its own,
  as it always may).
  """
  while isinstance(x, jax.core.Tracer):
    if isinstance(x, partial_eval.DynamicJaxprTracer):
      return True
    x = getattr(x, "primal", getattr(x, "val", None))
  return False
