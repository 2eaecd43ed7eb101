"""Numeric token losses: NTIL and its baselines, as per-token JAX functions.

Every loss takes ``logits [..., T, V]``, integer ``labels [..., T]`` and a bool
``digit_mask [..., T]`` and returns an unreduced float32 array shaped like
``labels``: zero (with zero gradient) wherever the label is not a digit of a
number. The caller reduces, as in optax.

This module holds the public entry points that combine cross-entropy with a
numeric loss (:func:`numeric_token_loss`, :func:`loss_from_statistics`,
:func:`check_method`) and re-exports the public names of the modules they
draw on: :mod:`ntil_jax.ntil`, :mod:`ntil_jax.baselines`,
:mod:`ntil_jax.statistics` and :mod:`ntil_jax.validation`.

References:
  NTIL: Fei et al., "Advancing Sequential Numerical Prediction in
  Autoregressive Models", ACL 2025 (arXiv:2505.13077).
  Soft labels: Wang et al., "Enhancing Numerical Prediction of MLLMs with Soft
  Labeling" (Amazon AGI).
  NTL: Zausinger et al., "Regress, Don't Guess: A Regression-like Loss on
  Number Tokens for Language Models", ICML 2025.
"""

import functools

import chex
import jax
import jax.numpy as jnp

from ntil_jax import arrays
from ntil_jax import base
from ntil_jax import baselines
from ntil_jax import digit_entropy
from ntil_jax import ntil
from ntil_jax import number_level
from ntil_jax import numbers
from ntil_jax import smmd
from ntil_jax import validation
from ntil_jax.baselines import cross_entropy
from ntil_jax.baselines import emd_loss
from ntil_jax.baselines import ntl_mse_loss
from ntil_jax.baselines import soft_digit_targets
from ntil_jax.baselines import soft_label_cross_entropy
from ntil_jax.digit_entropy import del_loss
from ntil_jax.ntil import NTILComponents
from ntil_jax.ntil import ntil_components
from ntil_jax.ntil import ntil_loss
from ntil_jax.number_level import nl_ntl_loss
from ntil_jax.smmd import smmd_loss
from ntil_jax.statistics import digit_logits
from ntil_jax.statistics import token_statistics
from ntil_jax.statistics import TokenStatistics
from ntil_jax.validation import check_parameters
from ntil_jax.validation import LossArgumentError

__all__ = [
    "check_method",
    "check_parameters",
    "cross_entropy",
    "del_loss",
    "digit_logits",
    "emd_loss",
    "loss_from_statistics",
    "LOSS_KEYWORDS",
    "LossArgumentError",
    "nl_ntl_loss",
    "ntil_components",
    "ntil_loss",
    "NTILComponents",
    "ntl_mse_loss",
    "NUM_DIGITS",
    "NUMERIC_LOSSES",
    "numeric_token_loss",
    "PEER_LOSSES",
    "smmd_loss",
    "soft_digit_targets",
    "soft_label_cross_entropy",
    "token_statistics",
    "TokenStatistics",
    "WEIGHTINGS",
]

NUM_DIGITS = numbers.NUM_DIGITS


# ----------------------------------------------------------------------------
# The combined loss a train step calls.

NUMERIC_LOSSES = {
    "ce": None,
    "emd": emd_loss,
    "ntl_mse": ntl_mse_loss,
    "soft_label": soft_label_cross_entropy,
    "ntil": ntil_loss,
    "del": del_loss,
    "smmd": smmd_loss,
    "nl_ntl": nl_ntl_loss,
}
# The losses of NTIL's peers, not in the paper's tables: DEL
# (arXiv:2605.20369), SMMD (ICML 2026, arXiv:2606.27731) and the
# number-level NTL of ntloss 0.2.3.
PEER_LOSSES = ("del", "smmd", "nl_ntl")
_FROM_STATISTICS = {
    "ce": None,
    "emd": baselines.emd_from_layout,
    "ntl_mse": baselines.ntl_mse_from_layout,
    "soft_label": baselines.soft_label_from_layout,
    "ntil": ntil.ntil_from_layout,
    "del": digit_entropy.del_from_layout,
    "smmd": smmd.smmd_from_layout,
    "nl_ntl": number_level.nl_ntl_from_layout,
}
WEIGHTINGS = ("sum", "reference", "authors")
# Methods whose loss is a term per number, not per digit.
_NUMBER_LEVEL = ("nl_ntl",)
# Methods whose loss at a digit reads that position alone: on a sequence
# split inside shard_map they need nothing from other shards.
_PER_DIGIT = ("emd", "ntl_mse", "soft_label", "smmd")
# The keyword arguments each method's loss takes through numeric_token_loss.
LOSS_KEYWORDS = {
    "ce": (),
    "emd": (),
    "ntl_mse": (),
    "soft_label": ("eta", "width"),
    "ntil": ("sigma", "alpha", "beta", "tau", "key", "noise_scale"),
    "del": (),
    "smmd": ("mode", "kernel", "sigmas", "squash_factor", "smooth_weight"),
    "nl_ntl": ("reweigh",),
}
# Checks of the settings that check_parameters does not know.
_METHOD_CHECKS = {
    "smmd": smmd.check_smmd_parameters,
    "nl_ntl": number_level.check_nl_ntl_parameters,
}


def numeric_token_loss(
    logits,
    labels,
    *,
    loss_mask=None,
    digit_mask=None,
    method: str = "ntil",
    lam: float = 0.3,
    weighting: str = "sum",
    digit_token_ids=None,
    decimal_point_mask=None,
    axis_name=None,
    sequence_axis=None,
    **loss_kwargs,
) -> chex.Array:
  r"""Cross-entropy on every scored token plus ``lam`` times a numeric loss.

  .. math:: \ell_t = \mathrm{CE}_t + \lambda\, w\, \mathrm{aux}_t

  with :math:`\mathrm{aux}` the loss named by ``method`` (``"ntil"``,
  ``"emd"``, ``"ntl_mse"``, ``"soft_label"``, the peers ``"del"``
  (:func:`del_loss`), ``"smmd"`` (:func:`smmd_loss`) and ``"nl_ntl"``
  (:func:`nl_ntl_loss`); ``"ce"`` for none)
  on the digit tokens of scored positions (``digit_mask & loss_mask``).

  ``weighting="sum"`` (default) uses :math:`w = 1`. ``weighting="reference"``
  takes the NTIL authors' scaling, ``CE + stop_gradient(CE/aux) * lam *
  aux``: :math:`w = \mathrm{sg}(\sum_t \mathrm{CE}_t / \sum_t
  \mathrm{aux}_t)` over the whole batch, so the auxiliary term's value is
  always ``lam`` times the CE and only its direction is learned (where aux
  sums to 0, with no digit scored or each one's loss below float32's
  range, the term is ``lam * sg(CE)``: that value, no direction). Their
  scaling, not their aggregation: their code averages ``aux`` per sample
  (the weighted EMD over the sample's digits, the relative and magnitude
  deviations over its numbers) and then over samples, where ``aux`` here is
  a sum over tokens; the value is the same (``lam`` times the CE), the
  direction is not wherever samples hold numbers of different lengths
  (here a 5-digit number weighs 5 times a 1-digit one, and the number-level
  terms weigh about 1/digits as much against the EMD as in their code).

  ``weighting="authors"`` is their loss whole: the same scaling of an
  ``aux`` aggregated as their code does, per sample (each row of the
  leading axes): the digit terms (NTIL's weighted EMD; the other methods'
  per-digit loss) averaged over the sample's digits, NTIL's relative and
  magnitude deviations averaged over its numbers, a sample without digits
  counting 0, then over samples. The per-token result sums to ``(1 + lam)``
  times the CE, and its gradient divided by the number of scored tokens is
  that of their ``mle + sg(mle / aux) * lam * aux`` with ``mle`` the mean
  CE. Their code splits numbers at every non-digit, '.' included: for their
  loss exactly, pass no ``decimal_point_mask``.

  For the peers (``"del"``, ``"smmd"``, ``"nl_ntl"``), ``"reference"`` and
  ``"authors"`` are still the NTIL authors' scaling and aggregation; the
  peers' own reductions (DEL's and SMMD's means over the batch's digits,
  NL-NTL's over its numbers) are described in :func:`del_loss`,
  :func:`smmd_loss` and :func:`nl_ntl_loss`.

  With ``method="soft_label"`` and ``w = 1``, ``CE + lam * CE_soft`` equals
  on digit tokens ``(1 + lam)`` times a soft-label CE with
  ``eta' = lam * eta / (1 + lam)`` (elsewhere it is the CE).

  Args:
    logits: ``[..., T, V]``.
    labels: ``[..., T]`` integer ids. Negative ids (e.g. -100) mark
      ignored positions and score 0. An id ``>= V`` where ``loss_mask`` is
      true (anywhere, without ``loss_mask``) is refused (ValueError) when
      labels and mask are concrete; under ``jit`` (traced) it cannot be
      checked and scores 0 with zero gradient.
    loss_mask: ``[..., T]`` bool (or integer, nonzero meaning true; a float
      mask is refused), positions to score (``None``: all valid).
    digit_mask: ``[..., T]`` bool (or integer, nonzero meaning true; a float
      mask is refused), where numbers may be (``None``: all).
    method: which numeric loss.
    lam: its weight (``>= 0``).
    weighting: ``"sum"``, ``"reference"`` or ``"authors"``.
    digit_token_ids: ``[10]`` digit token ids (``None``: 0..9). A
      :class:`~ntil_jax.NumberTokens` scores numbers written in tokens of
      1-3 digits (:mod:`ntil_jax.chunks`).
    decimal_point_mask: optional ``[..., T]`` bool (or integer), true at
      decimal-point labels that join integer and fractional digits into one
      number (see :func:`ntil_loss`). It changes only where numbers begin
      and end, so only NTIL's and DEL's place values and NTIL's number
      deviations; the per-digit losses of the other methods are the same
      with or without it.
    axis_name: inside ``jax.shard_map``, the mesh axis name (or tuple of
      names) the batch is split over: ``weighting="reference"`` and
      ``"authors"`` sum CE and ``aux`` over it (``psum``) for the batch's
      ratio ``w``; ``()`` when each shard holds the whole batch. Required
      by those weightings inside ``shard_map`` (ValueError without it: a
      shard's own ratio gives the right summed value and a wrong
      gradient); not needed under ``jit`` with sharded inputs, where the
      sums are global; unused by ``"sum"``. Under ``jax.vmap`` each slice
      takes its own ratio unless this names the vmap's ``axis_name``. A
      name bound by neither raises JAX's NameError.
    sequence_axis: inside ``jax.shard_map``, the mesh axis name (or tuple
      of names, major to minor) T is split over (sequence parallelism):
      the ``[..., T]`` and ``[..., T, 10]`` statistics and the masks are
      gathered over it for the number logic (never the logits), so that a
      number across two shards is one number, and each shard gets its own
      positions' loss; the weightings' sums run over it too. Without it a
      shard sees only its own positions: a number cut at a shard's edge
      would count as two, with no error (a shard cannot tell a split
      sequence from a split batch). ``None`` (default): each shard holds
      whole sequences. Not needed under ``jit`` with T split over a mesh.
      Name only axes that split T: one that splits the batch would join
      rows end to end, which no shard can detect.
    **loss_kwargs: keyword arguments of the numeric loss (``sigma``,
      ``alpha``, ``key``, ``eta``, ...; see ``LOSS_KEYWORDS``).

  Returns:
    ``[..., T]`` float32 per-token loss. Positions not scored (``loss_mask``
    false, labels outside ``[0, V)``) score 0 with zero gradient, even where
    their logits are NaN or inf.

  Raises:
    ValueError: as :func:`check_method` (a parameter that is NaN, inf or
      out of range), for bad shapes or digit ids, for a float mask (naming
      it and its dtype), for concrete labels ``>= V`` where
      ``loss_mask`` is true (anywhere, without ``loss_mask``), and for
      ``weighting="reference"`` or ``"authors"`` inside ``shard_map``
      without ``axis_name``, and for a ``sequence_axis`` that names no
      manual mesh axis.

  Example:
    One call gives cross-entropy plus ``lam`` times the chosen loss:

    >>> import jax.numpy as jnp
    >>> from ntil_jax import cross_entropy, emd_loss
    >>> logits = jnp.zeros((1, 3, 12)).at[:, :, 4].set(2.0)
    >>> labels = jnp.array([[3, 9, 10]])
    >>> one_call = numeric_token_loss(logits, labels, method="emd", lam=0.3)
    >>> by_hand = cross_entropy(logits, labels) + 0.3 * emd_loss(logits, labels)
    >>> bool(jnp.allclose(one_call, by_hand))
    True
  """
  labels, logits, loss_mask, digit_mask, decimal_point_mask = (
      base.asarrays_with_labels(
          labels, logits, loss_mask, digit_mask, decimal_point_mask
      )
  )
  labels, loss_mask, digit_mask, decimal_point_mask = numbers.reshard_like(
      logits, labels, loss_mask, digit_mask, decimal_point_mask
  )
  validation.check_inputs(
      logits,
      labels,
      digit_mask,
      digit_token_ids,
      (
          ("loss_mask", loss_mask),
          ("decimal_point_mask", decimal_point_mask),
      ),
  )
  check_method(method, weighting, loss_kwargs, lam=lam)
  stats = token_statistics(
      logits,
      labels,
      digit_token_ids,
      mask=base.scored(labels, logits.shape[-1], loss_mask),
  )
  return loss_from_statistics(
      stats,
      labels,
      vocab_size=logits.shape[-1],
      loss_mask=loss_mask,
      digit_mask=digit_mask,
      method=method,
      lam=lam,
      weighting=weighting,
      digit_token_ids=digit_token_ids,
      decimal_point_mask=decimal_point_mask,
      axis_name=axis_name,
      sequence_axis=sequence_axis,
      **loss_kwargs,
  )


@functools.cache
def _authors_aggregation(method):
  """`_per_sample_means` of ``method``: one function per method, so that
  the compiled number loss is reused (`base.number_loss`)."""
  return functools.partial(_per_sample_means, method)


def _per_sample_means(method, stats, layout, **loss_kwargs):
  """The NTIL authors' aggregation of ``method``'s loss, per token.

  Each sample's (each ``[T]`` row's) digit terms divided by its digit
  count, and the number terms (NTIL's deviations, the number-level NTL) by
  its number count, so that a row sums to the authors' per-sample loss.
  """
  if method == "ntil":
    alpha = loss_kwargs.pop("alpha", 0.2)
    beta = loss_kwargs.pop("beta", 0.2)
    parts = ntil.ntil_parts_from_layout(stats, layout, **loss_kwargs)
    digit_terms = parts.weights * parts.emd
    number_terms = alpha * parts.relative + beta * parts.magnitude
  elif method in _NUMBER_LEVEL:  # a term per number, on its first digit
    number_terms = _FROM_STATISTICS[method](stats, layout, **loss_kwargs)
    digit_terms = jnp.zeros_like(number_terms)
  else:
    digit_terms = _FROM_STATISTICS[method](stats, layout, **loss_kwargs)
    number_terms = jnp.zeros_like(digit_terms)
  digits = jnp.sum(layout.is_digit, axis=-1, keepdims=True)
  count = jnp.sum(layout.is_last, axis=-1, keepdims=True)
  return digit_terms / jnp.maximum(digits, 1) + number_terms / jnp.maximum(
      count, 1
  )


# check_method's ``lam`` when it is not to be checked (None is refused).
_UNCHECKED = object()


def check_method(
    method: str, weighting: str, loss_kwargs, lam=_UNCHECKED
) -> None:
  """Checks the arguments of :func:`numeric_token_loss` besides the arrays.

  Args:
    method: a key of ``NUMERIC_LOSSES``.
    weighting: one of ``WEIGHTINGS``.
    loss_kwargs: the keyword arguments for the method's loss.
    lam: the numeric loss's weight, if it is to be checked (not given: not
      checked).

  Raises:
    ValueError: for an unknown method or weighting, or a parameter value out
      of range (:func:`check_parameters`).
    LossArgumentError: (a ValueError and a TypeError) for a keyword the
      method's loss does not take; the message names that loss and its
      keywords.
  """
  if method not in NUMERIC_LOSSES:
    raise ValueError(
        f"unknown method {method!r}; choose one of "
        f"{sorted(NUMERIC_LOSSES)}."
    )
  if weighting not in WEIGHTINGS:
    raise ValueError(
        f"unknown weighting {weighting!r}; choose one of " f"{WEIGHTINGS}."
    )
  valid = LOSS_KEYWORDS[method]
  unknown = sorted(set(loss_kwargs) - set(valid))
  if method == "ce" and unknown:
    raise LossArgumentError(
        f"method 'ce' takes no loss arguments, got " f"{unknown}."
    )
  if unknown:
    loss_name = NUMERIC_LOSSES[method].__name__
    takes = (
        f"takes {', '.join(valid)}"
        if valid
        else "takes no keyword arguments here"
    )
    raise LossArgumentError(
        f"unknown loss argument(s) {unknown} for method {method!r}: "
        f"{loss_name} {takes}."
    )
  if lam is None:
    raise ValueError("lam must be a real number, got None.")
  weight = {} if lam is _UNCHECKED else dict(lam=lam)
  check_parameters(**weight, **loss_kwargs)
  if method in _METHOD_CHECKS:
    _METHOD_CHECKS[method](**loss_kwargs)


def loss_from_statistics(
    stats: TokenStatistics,
    labels,
    *,
    vocab_size: int,
    loss_mask=None,
    digit_mask=None,
    method: str = "ntil",
    lam: float = 0.3,
    weighting: str = "sum",
    digit_token_ids=None,
    decimal_point_mask=None,
    axis_name=None,
    sequence_axis=None,
    **loss_kwargs,
) -> chex.Array:
  """:func:`numeric_token_loss` from precomputed :class:`TokenStatistics`.

  The logits path and the fused path (:mod:`ntil_jax.fused`) both end here,
  so they compute the same loss by construction. For a zero gradient where
  the logits of unscored positions are NaN or inf, compute ``stats`` with
  ``token_statistics(..., mask=...)`` of the scored positions.

  Args:
    stats: :class:`TokenStatistics` of the logits, ``log_norm`` and
      ``label_logits`` shaped like ``labels``, ``digit_logits`` like
      ``labels`` plus a last axis of 10.
    labels: ``[..., T]`` integer ids; ids outside ``[0, vocab_size)`` score 0.
    vocab_size: ``V``, the logits' vocabulary size.
    loss_mask: as in :func:`numeric_token_loss`.
    digit_mask: as in :func:`numeric_token_loss`.
    method: as in :func:`numeric_token_loss`.
    lam: as in :func:`numeric_token_loss`.
    weighting: as in :func:`numeric_token_loss`.
    axis_name: as in :func:`numeric_token_loss`.
    sequence_axis: as in :func:`numeric_token_loss`.
    digit_token_ids: as in :func:`numeric_token_loss`.
    decimal_point_mask: as in :func:`numeric_token_loss`.
    **loss_kwargs: as in :func:`numeric_token_loss`.

  Returns:
    ``[..., T]`` float32 per-token loss.

  Raises:
    ValueError: as :func:`numeric_token_loss`, for a ``vocab_size`` that is
      no positive int, and for statistics not shaped like ``labels`` or not
      floating point.

  Example:
    The loss of :func:`numeric_token_loss`, from the statistics alone:

    >>> import jax.numpy as jnp
    >>> from ntil_jax import numeric_token_loss, token_statistics
    >>> logits = jnp.zeros((1, 3, 12)).at[:, :, 4].set(2.0)
    >>> labels = jnp.array([[3, 9, 10]])
    >>> stats = token_statistics(logits, labels)
    >>> from_stats = loss_from_statistics(stats, labels, vocab_size=12)
    >>> bool(jnp.allclose(from_stats, numeric_token_loss(logits, labels)))
    True
  """
  check_method(method, weighting, loss_kwargs, lam=lam)
  numbers.check_sequence_axis(sequence_axis)
  labels, loss_mask, digit_mask, decimal_point_mask = base.asarrays_with_labels(
      labels, loss_mask, digit_mask, decimal_point_mask
  )
  validation.check_statistics(stats, labels, vocab_size, digit_token_ids)
  labels, loss_mask, digit_mask, decimal_point_mask = numbers.reshard_like(
      stats.log_norm, labels, loss_mask, digit_mask, decimal_point_mask
  )
  validation.check_inputs(
      jax.ShapeDtypeStruct(labels.shape + (vocab_size,), jnp.float32),
      labels,
      digit_mask,
      digit_token_ids,
      (
          ("loss_mask", loss_mask),
          ("decimal_point_mask", decimal_point_mask),
      ),
  )
  scored = base.scored(labels, vocab_size, loss_mask)
  ce = base.masked(stats.log_norm - stats.label_logits, scored)
  numeric_fn = _FROM_STATISTICS[method]
  if numeric_fn is None:
    return ce
  mask = scored if digit_mask is None else scored & digit_mask.astype(bool)
  if weighting == "authors":
    numeric_fn = _authors_aggregation(method)
  gathered_over = sequence_axis
  if method in _PER_DIGIT and weighting != "authors":
    gathered_over = None  # nothing to gather: each digit's loss is its own
  aux = base.number_loss(
      numeric_fn,
      stats,
      labels,
      mask,
      digit_token_ids,
      decimal_point_mask,
      sequence_axis=gathered_over,
      **loss_kwargs,
  )
  if weighting in ("reference", "authors"):
    ratio, some = jax.lax.stop_gradient(
        _batch_ratio(ce, aux, axis_name, sequence_axis)
    )
    # Where aux sums to 0 (no digit scored, or each one's loss below
    # float32's range), the term is still lam times the CE, with no
    # direction: the limit of the ratio times aux.
    aux = arrays.where(some, ratio * aux, jax.lax.stop_gradient(ce))
  return ce + lam * aux


def _batch_ratio(ce, aux, axis_name, sequence_axis=None):
  """``(sum(ce) / sum(aux), sum(aux) > 0)`` over the whole batch (the
  ratio 0 where ``aux`` sums to 0).

  Inside ``shard_map`` each shard holds part of the batch: the two sums are
  added over ``axis_name`` first, so that every shard scales by the batch's
  ratio (a shard's own ratio gives the same summed value and another
  gradient); and over ``sequence_axis``, where each holds part of T.
  """
  totals = jnp.stack([jnp.sum(ce), jnp.sum(aux)])
  if axis_name is None:
    manual = tuple(jax.sharding.get_abstract_mesh().manual_axes)
    if manual:
      raise ValueError(
          "inside shard_map (manual mesh axes "
          f"{manual}), weighting='reference' and 'authors' need axis_name:"
          " the mesh axes the batch is split over, whose shards' sums"
          " of CE and aux make the batch's ratio (a shard's own ratio"
          " gives the same value and a wrong gradient); axis_name=() if"
          " each shard holds the whole batch."
      )
  axes = numbers.axis_names(axis_name) + numbers.axis_names(sequence_axis)
  if axes:
    totals = jax.lax.psum(totals, axes)
  ce_total, aux_total = totals[0], totals[1]
  some = aux_total > 0
  return (
      arrays.where(some, ce_total / arrays.where(some, aux_total, 1.0), 0.0),
      some,
  )
