"""tokamax's fused linear + softmax CE as a per-token CE kernel.

``tokamax.linear_softmax_cross_entropy_loss(..., reduction="none")`` (openxla
tokamax) returns the per-token CE of ``x @ W`` with its own VJP: on TPU a
Pallas Mosaic kernel that never holds the ``[N, V]`` logits, elsewhere XLA
(``"xla"`` holds them; ``"chunked_xla"`` walks blocks of 1024 tokens by
2048 columns). tokamax is an optional dependency: ``pip install
'ntil-jax[tokamax]'``.
"""

from typing import Optional

# tokamax's implementations of the op (tokamax 0.0.17); ``mosaic_tpu`` exists
# only where its Pallas TPU modules import.
NAMES = ("mosaic_tpu", "xla", "chunked_xla")
# tokamax 0.0.17's ``chunked_xla`` pads V with zero columns up to a multiple of
# its vocabulary block (2048 in its default config) and never masks them: each
# adds exp(0) to the normaliser, so it is exact only when V is a multiple.
CHUNKED_XLA_VOCAB_MULTIPLE = 2048


def _tokamax():
  try:
    import tokamax  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise ImportError(
        "implementation='tokamax' needs the tokamax package: "
        "pip install 'ntil-jax[tokamax]'."
    ) from e
  _read_tokamax_flags()
  return tokamax


def _read_tokamax_flags() -> None:
  """Lets tokamax read its ``--tokamax_*`` flags before its first call.

  It reads them by parsing absl's flags the first time it needs one, which
  also validates every flag the process defines: a host program's required
  flag left unset (a CLI's ``--config``, its module imported but not run)
  failed tokamax's first call, its own flags read all the same (absl marks
  the flags parsed before validating them). That failure is the host's, not
  tokamax's: passed over here, where nothing else has run yet.
  """
  from absl import flags  # pylint: disable=g-import-not-at-top

  if flags.FLAGS.is_parsed():
    return
  try:
    from tokamax._src import config  # pylint: disable=g-import-not-at-top

    _ = config.cross_compile.value  # the read that parses, tokamax 0.0.17
  except (ImportError, AttributeError):
    return  # another tokamax: it reads its flags its own way
  except flags.IllegalFlagValueError:
    if not flags.FLAGS.is_parsed():
      raise


def available() -> bool:
  """Whether tokamax imports here."""
  try:
    _tokamax()
  except ImportError:
    return False
  return True


def check_vocab_size(name: Optional[str], vocab_size: int) -> None:
  """Raises ValueError where implementation ``name`` is wrong for ``V``.

  tokamax 0.0.17's ``chunked_xla`` needs ``V`` a multiple of
  :data:`CHUNKED_XLA_VOCAB_MULTIPLE`; the others take any ``V``.
  """
  if name == "chunked_xla" and vocab_size % CHUNKED_XLA_VOCAB_MULTIPLE:
    raise ValueError(
        f"tokamax's chunked_xla (0.0.17) is wrong for V={vocab_size}: it "
        f"pads V with zero columns to a multiple of "
        f"{CHUNKED_XLA_VOCAB_MULTIPLE} and counts each in the "
        f"log-normaliser. Use 'tokamax' or 'chunked' instead."
    )


def per_token_ce(name: Optional[str] = None):
  """A ``(hidden [N, D], labels [N], unembedding [D, V]) -> [N]`` kernel.

  Args:
    name: one of :data:`NAMES`, or None for tokamax's own choice for the
      backend (Mosaic TPU on TPU, else XLA).

  Raises:
    ImportError: if tokamax is not installed.
    ValueError: for a name tokamax does not have; the kernel raises it for
      ``chunked_xla`` where ``V`` is not a multiple of
      :data:`CHUNKED_XLA_VOCAB_MULTIPLE` (tokamax 0.0.17 gets it wrong).
  """
  if name is not None and name not in NAMES:
    raise ValueError(
        f"tokamax has no implementation {name!r}; it has {', '.join(NAMES)}."
    )
  tokamax = _tokamax()

  def ce(hidden, labels, unembedding):
    check_vocab_size(name, unembedding.shape[-1])
    return tokamax.linear_softmax_cross_entropy_loss(
        hidden, labels, unembedding, reduction="none", implementation=name
    )

  return ce
