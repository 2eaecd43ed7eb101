r"""SMMD: Smooth Maximum Mean Discrepancy (ICML 2026), as a per-token loss.

Reference: "Enhancing Numerical Prediction in LLMs via Smooth MMD
Alignment", ICML 2026, arXiv:2606.27731; code at
https://github.com/Zuozhuo/smmd-loss, ``smmd/loss.py`` (``SMMDLoss``),
``smmd/kernels.py`` (``build_kernel_matrix``, ``squash_distances``) and
``smmd/digit_tokens.py`` (commit 581fde6a38a07e75a3c7102e126bd702733df299).
Written here from that code, in JAX.
"""

import chex
import jax
import jax.numpy as jnp
import numpy as np

from ntil_jax import arrays
from ntil_jax import base
from ntil_jax import numbers
from ntil_jax import statistics

MODES = ("smmd", "mmd", "smooth")
KERNELS = ("gaussian", "laplace")


def _concrete(value):
  """``value`` as a float64 NumPy array, or None if it is traced."""
  try:
    array = np.asarray(value)
  except (jax.errors.TracerArrayConversionError, TypeError):
    return None
  if not (np.issubdtype(array.dtype, np.number) and np.isrealobj(array)):
    raise ValueError(f"must be real numbers, got {value!r}.")
  return array.astype(np.float64)


def check_smmd_parameters(
    *,
    mode: str = "smmd",
    kernel: str = "gaussian",
    sigmas=(2.0,),
    squash_factor=9.0,
    smooth_weight=None,
) -> None:
  """Raises ValueError, naming the argument, for an SMMD setting out of range.

  ``mode`` one of ``MODES``, ``kernel`` one of ``KERNELS``, ``sigmas`` a
  non-empty 1-D sequence of finite bandwidths ``>= 1e-30``, ``squash_factor``
  None or finite, ``smooth_weight`` None (the authors' automatic weight) or
  finite and ``>= 0``. Traced numbers are not checked.
  """
  if not isinstance(mode, str) or mode not in MODES:
    raise ValueError(f"mode must be one of {MODES}, got {mode!r}.")
  if not isinstance(kernel, str) or kernel not in KERNELS:
    raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}.")
  if np.ndim(sigmas) != 1 or np.shape(sigmas)[0] == 0:
    raise ValueError(
        f"sigmas must be a non-empty 1-D sequence of bandwidths, got "
        f"{sigmas!r}."
    )
  checks = (
      (
          "sigmas",
          sigmas,
          lambda v: v >= 1e-30,
          ">= 1e-30 (kernel bandwidths; below, float32's distances in"
          " bandwidths turn 0/0)",
      ),
      ("squash_factor", squash_factor, lambda v: v == v, "a real number"),
      ("smooth_weight", smooth_weight, lambda v: v >= 0, ">= 0"),
  )
  for name, value, test, rule in checks:
    if value is None:
      continue
    try:
      array = _concrete(value)
    except ValueError as error:
      raise ValueError(f"{name} {error}") from None
    if array is None:
      continue
    with np.errstate(invalid="ignore"):
      ok = np.all(test(array))
    if not ok:
      raise ValueError(f"{name} must be {rule}, got {value!r}.")
    if not np.all(np.isfinite(array)):
      raise ValueError(f"{name} must be finite, got {value!r}.")


def smmd_kernel(
    *, kernel: str = "gaussian", sigmas=(2.0,), squash_factor=9.0
) -> chex.Array:
  r"""The ``[10, 10]`` float32 kernel :math:`K` over the digit values 0..9.

  .. math:: K_{ij} = \frac{1}{|\Sigma|} \sum_{s \in \Sigma}
            \kappa_s(d_{ij}), \quad
            \kappa_s(d) = e^{-d^2 / 2 s^2} \text{ (gaussian) or }
            e^{-|d| / s} \text{ (laplace)},

  clipped to ``[0, 1]``, with :math:`d_{ij}` the value distance
  :math:`|i - j|` rescaled by their ``squash_distances`` when
  ``squash_factor > 1``: the smallest non-zero distance to 1, the largest
  to ``squash_factor``, linearly (``1 + (|i-j| - 1) (f - 1) / 8`` for the
  ten digits, so the default 9 leaves the distances as they are). As
  ``build_kernel_matrix`` of ``smmd/kernels.py`` in mode
  ``value_distance``, float32 as there. Numbers may be traced.
  """
  values = np.arange(numbers.NUM_DIGITS, dtype=np.float32)
  dist = jnp.asarray(np.abs(values[:, None] - values[None, :]))
  if squash_factor is not None:
    factor = jnp.asarray(squash_factor, jnp.float32)
    # min non-zero distance 1, max 9; their 1e-10 vanishes in float32.
    span = jnp.float32(numbers.NUM_DIGITS - 2) + jnp.float32(1e-10)
    squashed = 1.0 + (dist - 1.0) * ((factor - 1.0) / span)
    squashed = arrays.where(dist == 0, 0.0, squashed)
    dist = arrays.where(factor > 1.0, squashed, dist)
  widths = jnp.asarray(sigmas, jnp.float32)[:, None, None]
  if kernel == "gaussian":
    # The distance in bandwidths, then squared: widths**2 underflows to 0
    # from 1e-20 (0/0 on the diagonal).
    values = jnp.exp(-0.5 * (dist / widths) ** 2)
  elif kernel == "laplace":
    values = jnp.exp(-jnp.abs(dist) / widths)
  else:
    raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}.")
  return jnp.clip(jnp.mean(values, axis=0), 0.0, 1.0)


def smmd_matrix(
    *,
    mode: str = "smmd",
    kernel: str = "gaussian",
    sigmas=(2.0,),
    squash_factor=9.0,
    smooth_weight=None,
) -> chex.Array:
  r"""The ``[10, 10]`` matrix :math:`M` with SMMD's loss :math:`r^\top M r`.

  :math:`M = K` (``"mmd"``), :math:`\alpha L` (``"smooth"``) or
  :math:`K + \alpha L` (``"smmd"``), with :math:`K` of :func:`smmd_kernel`,
  :math:`L = D - K` its graph Laplacian (:math:`D` the diagonal of the
  degrees :math:`\deg_i = \sum_j K_{ij}`) and :math:`\alpha` =
  ``smooth_weight``, by default the authors' :math:`1 / (2\,
  \mathrm{mean}_i \deg_i)`.
  """
  check_smmd_parameters(
      mode=mode,
      kernel=kernel,
      sigmas=sigmas,
      squash_factor=squash_factor,
      smooth_weight=smooth_weight,
  )
  gram = smmd_kernel(kernel=kernel, sigmas=sigmas, squash_factor=squash_factor)
  if mode == "mmd":
    return gram
  degrees = jnp.sum(gram, axis=1)
  if smooth_weight is None:
    alpha = 0.5 / jnp.maximum(jnp.mean(degrees), 1e-12)
  else:
    alpha = jnp.asarray(smooth_weight, jnp.float32)
  smooth = alpha * (jnp.diag(degrees) - gram)
  return smooth if mode == "smooth" else gram + smooth


def smmd_from_layout(
    stats: statistics.TokenStatistics,
    layout,
    *,
    mode: str = "smmd",
    kernel: str = "gaussian",
    sigmas=(2.0,),
    squash_factor=9.0,
    smooth_weight=None,
):
  """SMMD from :class:`TokenStatistics` (only the ten digit logits)."""
  matrix = smmd_matrix(
      mode=mode,
      kernel=kernel,
      sigmas=sigmas,
      squash_factor=squash_factor,
      smooth_weight=smooth_weight,
  )
  logits = base.digits_in_numbers(stats.digit_logits, layout)
  residual = jax.nn.softmax(logits, axis=-1) - jax.nn.one_hot(
      layout.digit_values, numbers.NUM_DIGITS, dtype=jnp.float32
  )
  mixed = jnp.einsum(
      "...j,ij->...i",
      residual,
      matrix,
      precision=jax.lax.Precision.HIGHEST,
  )
  # r^T M r >= 0 (M is positive semi-definite); relu as the authors' code,
  # against float rounding below 0 (its gradient is 0 there).
  loss = jax.nn.relu(jnp.sum(residual * mixed, axis=-1))
  return base.masked(loss, layout.is_digit)


def smmd_loss(
    logits,
    labels,
    digit_mask=None,
    *,
    digit_token_ids=None,
    mode: str = "smmd",
    kernel: str = "gaussian",
    sigmas=(2.0,),
    squash_factor=9.0,
    smooth_weight=None,
    sequence_axis=None,
) -> chex.Array:
  r"""Smooth Maximum Mean Discrepancy (SMMD, ICML 2026), per token.

  On every digit, with :math:`p_t = \mathrm{softmax}(z_t)` over the ten
  digit logits only, :math:`q_t` the one-hot target digit and
  :math:`r_t = p_t - q_t`,

  .. math::

    \ell_t = \max\!\big(0,\; r_t^\top K r_t + \alpha\, r_t^\top L r_t\big),
    \qquad L = D - K,\; D = \mathrm{diag}\Big(\sum_j K_{ij}\Big),

  the discrete MMD between the prediction and the target under a kernel
  :math:`K` over the digit values (:func:`smmd_kernel`; Gaussian of
  bandwidth 2 in ``|i - j|`` by default) plus :math:`\alpha` times the
  graph smoothness (Dirichlet energy) :math:`r^\top L r = \frac12
  \sum_{ij} K_{ij} (r_i - r_j)^2`, :math:`\alpha = 1 / (2\,\mathrm{mean}
  \deg)` unless ``smooth_weight`` is given. ``mode="mmd"`` keeps the first
  term, ``mode="smooth"`` the second (:func:`smmd_matrix`).

  As ``SMMDLoss`` of https://github.com/Zuozhuo/smmd-loss
  (``smmd/loss.py``, arXiv:2606.27731), whose loss is the mean of
  :math:`\ell_t` over the batch's positions whose target is numeric, with
  its defaults (``loss_mode="smmd"``, ``kernel_type="gaussian"``,
  ``sigmas=(2.0,)``, ``squash_factor=9.0``, ``tau_mode="auto"``; their
  ``tau_fixed`` is ``smooth_weight`` here). Their code computes
  :math:`r^\top K r` and :math:`r^\top L r` expanded in :math:`p` (no
  :math:`r` formed); here :math:`r^\top M r` is taken from :math:`r`
  directly, equal up to float rounding, without the cancellation near
  :math:`p = q`. Their numeric sub-vocabulary is the tokenizer's
  single-token integers 0..999 (a restriction of the paper's Algorithm 1,
  which parses every token, as their docstring says); here it is the ten
  digit tokens, what their code builds for a digit-level tokenizer (Qwen2.5,
  Llama-2 style); numbers in tokens of 1-3 digits (a
  :class:`~ntil_jax.NumberTokens`) are scored digit by digit, as by every
  loss here (:mod:`ntil_jax.chunks`), which their code does not do. Their
  ablation kernels (``random_kernel``, ``shuffled_mapping``,
  drawn with torch's generator) are not implemented. Their code scores
  every position whose label is numeric; ``digit_mask`` restricts that
  here.

  Args:
    logits: ``[..., T, V]`` logits (any float dtype; computed in float32).
    labels: ``[..., T]`` integer target ids.
    digit_mask: ``[..., T]`` bool, where digits may be scored (``None``:
      all).
    digit_token_ids: ``[10]`` token ids of the digits 0..9 (``None``: 0..9). A
      :class:`~ntil_jax.NumberTokens` scores numbers written in tokens of
      1-3 digits (:mod:`ntil_jax.chunks`).
    mode: ``"smmd"`` (MMD + smoothness), ``"mmd"`` or ``"smooth"``.
    kernel: ``"gaussian"`` or ``"laplace"``.
    sigmas: kernel bandwidths (``>= 1e-30``); several give the mean of their
      kernels.
    squash_factor: the largest rescaled distance (``> 1`` rescales, else
      the raw ``|i - j|``; ``None`` as 1).
    smooth_weight: :math:`\alpha` (``>= 0``); ``None``: the authors'
      :math:`1 / (2\,\mathrm{mean}\deg)`.
    sequence_axis: inside ``jax.shard_map``, the mesh axes T is split over
      (see :func:`ntil_jax.numeric_token_loss`). Per digit, so a sequence
      split needs nothing from other shards: it is checked, and gathers
      nothing.

  Returns:
    ``[..., T]`` float32 per-token loss, zero (with zero gradient) outside
    the digits of numbers.

  Raises:
    ValueError: for a setting out of range (:func:`check_smmd_parameters`),
      mismatched shapes, non-integer labels, non-float logits, a float mask,
      or digit ids that are repeated or out of the vocabulary.

  Example:
    A sure, right digit costs nothing; a near miss less than a far one.

    >>> import jax.numpy as jnp
    >>> def sure_of(digit):
    ...   return jnp.zeros((1, 1, 12)).at[..., digit].set(30.0)
    >>> labels = jnp.array([[3]])
    >>> round(float(smmd_loss(sure_of(3), labels)[0, 0]), 6)
    0.0
    >>> near, far = (float(smmd_loss(sure_of(d), labels)[0, 0]) for d in (4, 9))
    >>> 0.0 < near < far
    True
  """
  check_smmd_parameters(
      mode=mode,
      kernel=kernel,
      sigmas=sigmas,
      squash_factor=squash_factor,
      smooth_weight=smooth_weight,
  )
  _, labels, digit_mask, _, digit_logits_ = base.prepare(
      logits, labels, digit_mask, digit_token_ids
  )
  numbers.check_sequence_axis(sequence_axis)
  return base.number_loss(
      smmd_from_layout,
      base.digit_statistics(digit_logits_),
      labels,
      digit_mask,
      digit_token_ids,
      mode=mode,
      kernel=kernel,
      sigmas=sigmas,
      squash_factor=squash_factor,
      smooth_weight=smooth_weight,
  )
