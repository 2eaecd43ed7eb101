"""The vocabulary-wide half of the fused path, one module per implementation.

Every loss of :mod:`ntil_jax` reads the logits only through the
log-normaliser, the label's logit and the ten digit logits
(:class:`~ntil_jax.TokenStatistics`). The fused path gets them from the hidden
states by one of:

* ``"chunked"`` (:mod:`.chunked`): the project's own chunked XLA loop with a
  custom VJP; runs on every backend, memory bounded by its block size.
* ``"tokamax"`` or ``"tokamax:<name>"`` (:mod:`.tokamax_ce`): tokamax's
  linear + softmax CE (its choice per backend, or ``mosaic_tpu``, ``xla``,
  ``chunked_xla``), plus eleven columns of ``W`` (:mod:`.from_ce`).
* a callable ``(hidden [N, D], labels [N], unembedding [D, V]) -> CE [N]``,
  differentiable, returning one floating-point array (anything else is
  refused when it is traced, with a TypeError or ValueError that says what
  was expected): the user's own kernel, through :mod:`.from_ce` likewise.
* ``None``: :func:`default_implementation` for the backend.

:func:`select` turns any of these into one function of the checked inputs.
"""

from typing import Optional

import jax

from ntil_jax.kernels import chunked
from ntil_jax.kernels import from_ce
from ntil_jax.kernels import tokamax_ce

NAMES = ("chunked", "tokamax") + tuple(
    f"tokamax:{name}" for name in tokamax_ce.NAMES
)


def default_implementation(backend: Optional[str] = None) -> str:
  """The implementation ``implementation=None`` takes on a backend.

  On TPU ``"tokamax"`` (its Pallas Mosaic kernel) where tokamax is
  installed: tokamax's own autotuning data for TPU7x (bf16, H=4096,
  V=151936, 16,384 tokens, forward) has it at 25.5 ms and 1.38 GB against
  29.9 ms and 6.4 GB for XLA's matmul + CE; not measured by this project.
  Everywhere else ``"chunked"``: on this project's CPU it planned the least
  memory in three of four settings and was the fastest in bfloat16 (in
  float32 at Qwen2.5's shape tokamax's ``xla`` was faster, holding the
  logits; ``python -m benchmarks.implementations``, benchmarks/results.md);
  on GPU tokamax's default is its ``xla`` implementation, which holds the
  ``[N, V]`` logits (the memory the fused path exists to save), and its
  ``chunked_xla`` has not been measured against ours on a GPU yet.
  """
  if backend is None:
    backend = jax.default_backend()
  if backend == "tpu" and tokamax_ce.available():
    return "tokamax"
  return "chunked"


def check(implementation, chunk_size=None, vocab_size=None) -> None:
  """Raises ValueError for an implementation :func:`select` would refuse.

  With ``vocab_size`` (``V``, the unembedding's columns) it also refuses an
  implementation that is wrong for that ``V`` (tokamax's ``chunked_xla``
  unless ``V`` is a multiple of
  :data:`~ntil_jax.kernels.tokamax_ce.CHUNKED_XLA_VOCAB_MULTIPLE`), as the
  kernel would when traced: a trainer checks it before it starts.
  """
  if implementation is None:
    return
  if not callable(implementation) and (
      not isinstance(implementation, str) or implementation not in NAMES
  ):
    raise ValueError(
        f"implementation must be None, a callable or one of "
        f"{', '.join(NAMES)}; got {implementation!r}."
    )
  if chunk_size is not None and implementation != "chunked":
    raise ValueError(
        f"chunk_size applies to implementation='chunked' only, not "
        f"{implementation!r}."
    )
  if callable(implementation):
    return
  _, _, name = implementation.partition(":")
  if vocab_size is not None and name:
    tokamax_ce.check_vocab_size(name, vocab_size)


def select(implementation=None, chunk_size: Optional[int] = None):
  """``stats(hidden, unembedding, labels, columns, traced_ids)``.

  Args:
    implementation: ``None``, ``"chunked"``, ``"tokamax"``,
      ``"tokamax:<name>"`` or a per-token CE callable (see the module).
    chunk_size: tokens per block of ``"chunked"``; with ``None`` as the
      implementation it selects ``"chunked"``.

  Raises:
    ValueError: for an unknown implementation, or a ``chunk_size`` given
      with another implementation than ``"chunked"``.
    ImportError: for ``"tokamax"`` without tokamax installed.
  """
  check(implementation, chunk_size)
  if implementation is None:
    implementation = (
        "chunked" if chunk_size is not None else default_implementation()
    )
  if implementation == "chunked":
    return lambda h, w, labels, columns, ids: chunked.token_statistics(
        h, w, labels, columns, ids, chunk_size
    )
  if callable(implementation):
    ce_fn = implementation
  else:
    _, _, name = implementation.partition(":")
    ce_fn = tokamax_ce.per_token_ce(name or None)
  return lambda h, w, labels, columns, ids: from_ce.token_statistics(
      ce_fn, h, w, labels, columns, ids
  )
