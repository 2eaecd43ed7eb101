"""Numeric token losses: NTIL and its baselines, as per-token JAX functions.

Every loss takes ``logits [..., T, V]``, integer ``labels [..., T]`` and a bool
``digit_mask [..., T]`` and returns an unreduced float32 array shaped like
``labels``: zero (with zero gradient) wherever the label is not a digit of a
number. The caller reduces, as in optax.

References:
  NTIL: Fei et al., "Advancing Sequential Numerical Prediction in
  Autoregressive Models", ACL 2025 (arXiv:2505.13077).
  Soft labels: Wang et al., "Enhancing Numerical Prediction of MLLMs with Soft
  Labeling" (Amazon AGI).
  NTL: Zausinger et al., "Regress, Don't Guess: A Regression-like Loss on
  Number Tokens for Language Models", ICML 2025.
"""

from typing import NamedTuple, Optional

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax

from ntil_jax import numbers

NUM_DIGITS = numbers.NUM_DIGITS
_DIGITS = np.arange(NUM_DIGITS, dtype=np.float32)


# ----------------------------------------------------------------------------
# Input checks and shared pieces.


def _check_inputs(logits, labels, digit_mask, digit_token_ids, extra_masks=()):
  """Raises ValueError on shapes or dtypes that cannot be right."""
  logits = jnp.asarray(logits) if not hasattr(logits, "shape") else logits
  if logits.ndim < 2:
    raise ValueError(
        f"logits must be [..., T, V] (rank >= 2), got shape {logits.shape}.")
  if tuple(labels.shape) != tuple(logits.shape[:-1]):
    raise ValueError(
        f"labels shape {labels.shape} must equal logits shape without the "
        f"vocabulary axis, {logits.shape[:-1]} (logits {logits.shape}).")
  if not jnp.issubdtype(labels.dtype, jnp.integer):
    raise ValueError(f"labels must be integer token ids, got {labels.dtype}.")
  for name, mask in (("digit_mask", digit_mask),) + tuple(extra_masks):
    if mask is not None and tuple(mask.shape) != tuple(labels.shape):
      raise ValueError(
          f"{name} shape {mask.shape} must equal labels shape {labels.shape}.")
  vocab_size = logits.shape[-1]
  if digit_token_ids is None:
    if vocab_size < NUM_DIGITS:
      raise ValueError(
          f"default digit ids 0..9 need a vocabulary of >= 10, got V="
          f"{vocab_size}; pass digit_token_ids.")
    return
  if tuple(np.shape(digit_token_ids)) != (NUM_DIGITS,):
    raise ValueError("digit_token_ids must hold the 10 ids of the digits 0..9, "
                     f"got shape {np.shape(digit_token_ids)}.")
  try:
    ids = np.asarray(digit_token_ids)
  except (jax.errors.TracerArrayConversionError, TypeError):
    return  # traced ids: cannot be checked before run time
  if ids.min() < 0 or ids.max() >= vocab_size:
    raise ValueError(
        f"digit_token_ids {ids.tolist()} out of range for a vocabulary of "
        f"V={vocab_size} (the logits' last axis).")


def digit_logits(logits, digit_token_ids=None) -> chex.Array:
  """The logits of the ten digit tokens, ``[..., T, 10]``, in float32."""
  if digit_token_ids is None:
    picked = logits[..., :NUM_DIGITS]
  else:
    picked = jnp.take(logits, jnp.asarray(digit_token_ids), axis=-1)
  return picked.astype(jnp.float32)


class TokenStatistics(NamedTuple):
  """What every loss here needs from the logits, ``[..., T]`` each.

  Attributes:
    log_norm: ``logsumexp`` of the logits over the vocabulary.
    label_logits: the logit of each label (0 where the label is not in
      ``[0, V)``).
    digit_logits: ``[..., T, 10]`` logits of the digit tokens.
  """

  log_norm: chex.Array
  label_logits: chex.Array
  digit_logits: chex.Array


def token_statistics(logits, labels, digit_token_ids=None) -> TokenStatistics:
  """Reduces ``[..., T, V]`` logits to :class:`TokenStatistics` in float32."""
  logits = jnp.asarray(logits)
  vocab_size = logits.shape[-1]
  index = jnp.clip(jnp.asarray(labels), 0, vocab_size - 1)[..., None]
  label_logits = jnp.take_along_axis(logits, index, axis=-1)[..., 0]
  return TokenStatistics(
      log_norm=jax.nn.logsumexp(logits.astype(jnp.float32), axis=-1),
      label_logits=label_logits.astype(jnp.float32),
      digit_logits=digit_logits(logits, digit_token_ids))


def _layout(labels, digit_mask, digit_token_ids, decimal_point_mask=None):
  return numbers.number_layout(
      labels, digit_mask, digit_token_ids=digit_token_ids,
      decimal_point_mask=decimal_point_mask)


def _prepare(logits, labels, digit_mask, digit_token_ids,
             decimal_point_mask=None):
  """Validates inputs; returns (digit logits, layout)."""
  labels = jnp.asarray(labels)
  digit_mask = None if digit_mask is None else jnp.asarray(digit_mask)
  decimal_point_mask = (None if decimal_point_mask is None
                        else jnp.asarray(decimal_point_mask))
  _check_inputs(logits, labels, digit_mask, digit_token_ids,
                (("decimal_point_mask", decimal_point_mask),))
  layout = _layout(labels, digit_mask, digit_token_ids, decimal_point_mask)
  return digit_logits(logits, digit_token_ids), layout


def _digit_distance(layout) -> chex.Array:
  """``|k - y|`` for every digit k, ``[..., T, 10]``."""
  target = layout.digit_values.astype(jnp.float32)[..., None]
  return jnp.abs(_DIGITS - target)


def _masked(values, mask):
  return jnp.where(mask, values, 0.0)


# ----------------------------------------------------------------------------
# NTIL.


class NTILComponents(NamedTuple):
  """The parts of NTIL, each ``[..., T]`` float32 and zero outside numbers.

  Attributes:
    emd: token-level EMD between the digit distribution and the target digit.
    weights: place-value weight ``(1 + sigma)**digits_right`` (1 outside).
    relative: relative deviation ``|X-Y| / (max(X,Y)+1)``, on each number's
      last digit.
    magnitude: magnitude deviation ``log((max(X,Y)+1) / (min(X,Y)+1))``, on
      each number's last digit.
    predicted_digits: the straight-through digit value (argmax in the forward
      pass) at digit positions.
  """

  emd: chex.Array
  weights: chex.Array
  relative: chex.Array
  magnitude: chex.Array
  predicted_digits: chex.Array


def _straight_through_digits(digit_logits_, *, tau, key, noise_scale):
  """Argmax digit in the forward pass, tempered-softmax gradient backward."""
  if key is not None:
    gumbel = jax.random.gumbel(key, digit_logits_.shape, jnp.float32)
    digit_logits_ = digit_logits_ + noise_scale * gumbel
  hard = jnp.argmax(digit_logits_, axis=-1).astype(jnp.float32)
  soft = jax.nn.softmax(digit_logits_ / tau, axis=-1) @ _DIGITS
  # soft - sg(soft) is exactly 0, so the forward value is exactly the argmax.
  return hard + (soft - jax.lax.stop_gradient(soft))


def _abs_flat_at_zero(x):
  """|x| with gradient 0 at x = 0: a right number is not pushed either way."""
  return jnp.where(x == 0, 0.0, jnp.abs(x))


def _number_deviations(predicted, layout):
  """Relative and magnitude deviations of each number, on its last digit."""
  target = layout.digit_values.astype(jnp.float32)
  predicted_values = jnp.rint(jax.lax.stop_gradient(predicted)).astype(jnp.int32)
  log_x, x_scaled, x_place = numbers.log1p_number(predicted, predicted_values,
                                                  layout)
  log_y, y_scaled, y_place = numbers.log1p_number(target, layout.digit_values,
                                                  layout)
  # |X - Y| from digit differences, so long numbers keep their precision.
  joint_place = jnp.maximum(x_place, y_place)
  difference = _abs_flat_at_zero(
      numbers.scaled_number_sum(predicted - target, joint_place, layout))
  x_joint = x_scaled * numbers.pow10(x_place - joint_place)
  y_joint = y_scaled * numbers.pow10(y_place - joint_place)
  offset = numbers.pow10(-joint_place)  # the "+1", in units of 10**joint_place
  relative = difference / (jnp.maximum(x_joint, y_joint) + offset)
  # log1p(|X-Y| / (min+1)) is precise for close numbers; past 1e30 the offset
  # underflows and the difference of logs (exact at that scale) takes over.
  representable = joint_place <= numbers.MAX_DECIMAL_EXPONENT
  smaller = jnp.where(representable, jnp.minimum(x_joint, y_joint) + offset, 1.0)
  magnitude = jnp.where(representable, jnp.log1p(difference / smaller),
                        _abs_flat_at_zero(log_x - log_y))
  return (_masked(relative, layout.is_last), _masked(magnitude, layout.is_last))


def _ntil_parts(digit_logits_, layout, *, sigma: float = 0.2,
                tau: float = 0.1, key: Optional[chex.PRNGKey] = None,
                noise_scale: float = 0.01) -> NTILComponents:
  probs = jax.nn.softmax(digit_logits_, axis=-1)
  emd = jnp.sum(probs * _digit_distance(layout), axis=-1)
  exponent = layout.digits_right.astype(jnp.float32)
  # Capped so that absurdly long numbers give large, finite weights.
  weights = jnp.minimum(jnp.power(1.0 + sigma, exponent), 1e30)
  predicted = _straight_through_digits(digit_logits_, tau=tau, key=key,
                                       noise_scale=noise_scale)
  predicted = _masked(predicted, layout.is_digit)
  relative, magnitude = _number_deviations(predicted, layout)
  return NTILComponents(
      emd=_masked(emd, layout.is_digit),
      weights=jnp.where(layout.is_digit, weights, 1.0),
      relative=relative,
      magnitude=magnitude,
      predicted_digits=predicted,
  )


def _ntil(stats: TokenStatistics, layout, *, alpha: float = 0.2,
          beta: float = 0.2, **kwargs):
  parts = _ntil_parts(stats.digit_logits, layout, **kwargs)
  return (parts.weights * parts.emd + alpha * parts.relative
          + beta * parts.magnitude)


def _emd(stats: TokenStatistics, layout):
  probs = jax.nn.softmax(stats.digit_logits, axis=-1)
  return _masked(jnp.sum(probs * _digit_distance(layout), -1), layout.is_digit)


def _ntl_mse(stats: TokenStatistics, layout):
  expected = jax.nn.softmax(stats.digit_logits, axis=-1) @ _DIGITS
  error = expected - layout.digit_values.astype(jnp.float32)
  return _masked(error**2, layout.is_digit)


def _soft_label(stats: TokenStatistics, layout, *, eta: float = 0.5,
                width: float = 1.0):
  log_probs = stats.digit_logits - stats.log_norm[..., None]
  targets = soft_digit_targets(layout.digit_values, eta=eta, width=width)
  return _masked(-jnp.sum(targets * log_probs, -1), layout.is_digit)


def _digit_statistics(logits, digit_logits_, needs_log_norm=False):
  """Token statistics for losses that read only the digit logits."""
  log_norm = None
  if needs_log_norm:
    log_norm = jax.nn.logsumexp(jnp.asarray(logits).astype(jnp.float32), -1)
  return TokenStatistics(log_norm=log_norm, label_logits=None,
                         digit_logits=digit_logits_)


def ntil_components(logits, labels, digit_mask=None, *, digit_token_ids=None,
                    decimal_point_mask=None, sigma: float = 0.2,
                    tau: float = 0.1, key: Optional[chex.PRNGKey] = None,
                    noise_scale: float = 0.01) -> NTILComponents:
  """The pieces of :func:`ntil_loss`, for logging and ablations.

  Arguments are those of :func:`ntil_loss`. Returns :class:`NTILComponents`.
  """
  digit_logits_, layout = _prepare(logits, labels, digit_mask, digit_token_ids,
                                   decimal_point_mask)
  return _ntil_parts(digit_logits_, layout, sigma=sigma, tau=tau, key=key,
                     noise_scale=noise_scale)


def ntil_loss(logits, labels, digit_mask=None, *, digit_token_ids=None,
              decimal_point_mask=None, sigma: float = 0.2, alpha: float = 0.2,
              beta: float = 0.2, tau: float = 0.1,
              key: Optional[chex.PRNGKey] = None,
              noise_scale: float = 0.01) -> chex.Array:
  r"""Numerical Token Integrity Loss (Fei et al., ACL 2025), per token.

  For a target number :math:`Y` written with digits :math:`y_0 \dots y_{n-1}`
  and digit distributions :math:`p_i = \mathrm{softmax}(z_i)` over the ten
  digit logits only,

  .. math::

    \ell_i = (1+\sigma)^{n-i-1} \sum_{k=0}^{9} p_{ik} |k - y_i|
      + [i = n-1] \left( \alpha \frac{|X-Y|}{\max(X,Y)+1}
      + \beta \log\frac{\max(X,Y)+1}{\min(X,Y)+1} \right),

  where :math:`X = \sum_i \hat{x}_i 10^{e_i}` is the predicted value built from
  straight-through Gumbel-softmax digits :math:`\hat{x}_i` (argmax forward,
  gradient of :math:`\mathrm{softmax}((z_i + s g_i)/\tau)` backward, Gumbel
  noise :math:`g` scaled by ``noise_scale`` when ``key`` is given) and
  :math:`e_i` the place of digit :math:`i`. Summing the result counts every
  digit's weighted EMD and every number's deviations once.

  A number is a maximal run of positions where ``digit_mask`` is true and the
  label is a digit token; anything else (other tokens, ignore ids such as -100)
  ends the run and scores exactly 0. Values are computed in float32 and stay
  exact for numbers of any length (no overflow past 38 digits). Ablations of
  the paper's Table 6: ``sigma=0`` removes the place-value weighting,
  ``alpha=0`` the relative and ``beta=0`` the magnitude term.

  Args:
    logits: ``[..., T, V]`` logits (any float dtype; computed in float32).
    labels: ``[..., T]`` integer target token ids.
    digit_mask: ``[..., T]`` bool, where digits may be scored (``None``: all).
    digit_token_ids: ``[10]`` token ids of the digits 0..9; ``None`` means ids
      0..9. See :func:`ntil_jax.digit_token_ids` to get them from a vocabulary.
    decimal_point_mask: optional ``[..., T]`` bool, true at decimal-point
      labels that join integer and fractional digits into one number.
    sigma: place-value weighting base, weights are ``(1+sigma)**digits_right``.
    alpha: weight of the relative deviation.
    beta: weight of the magnitude deviation.
    tau: Gumbel-softmax temperature (only shapes the gradient).
    key: optional PRNG key for Gumbel noise; ``None`` means no noise.
    noise_scale: scale of the Gumbel noise when ``key`` is given.

  Returns:
    ``[..., T]`` float32 per-token loss.

  Example:
    >>> loss = ce + 0.3 * ntil_loss(logits, labels, digit_mask)
  """
  digit_logits_, layout = _prepare(logits, labels, digit_mask, digit_token_ids,
                                   decimal_point_mask)
  return _ntil(_digit_statistics(logits, digit_logits_), layout, sigma=sigma,
               alpha=alpha, beta=beta, tau=tau, key=key,
               noise_scale=noise_scale)


# ----------------------------------------------------------------------------
# Baselines.


def emd_loss(logits, labels, digit_mask=None, *,
             digit_token_ids=None) -> chex.Array:
  r"""Earth Mover's Distance between the digit distribution and the target.

  .. math:: \ell_t = \sum_{k=0}^{9} p_{tk} |k - y_t|, \quad
            p_t = \mathrm{softmax}(z_t^{\text{digits}})

  The "EMD" baseline of the NTIL paper; for single-digit tokens it equals the
  Wasserstein variant NTL-WAS of the Number Token Loss paper. Arguments and
  result as in :func:`ntil_loss`.
  """
  digit_logits_, layout = _prepare(logits, labels, digit_mask, digit_token_ids)
  return _emd(_digit_statistics(logits, digit_logits_), layout)


def ntl_mse_loss(logits, labels, digit_mask=None, *,
                 digit_token_ids=None) -> chex.Array:
  r"""Number Token Loss, MSE variant: squared error of the expected digit.

  .. math:: \ell_t = \Big(\sum_{k=0}^{9} k\, p_{tk} - y_t\Big)^2

  with :math:`p_t` the softmax over the ten digit logits (Zausinger et al.,
  2025). Arguments and result as in :func:`ntil_loss`.
  """
  digit_logits_, layout = _prepare(logits, labels, digit_mask, digit_token_ids)
  return _ntl_mse(_digit_statistics(logits, digit_logits_), layout)


def soft_digit_targets(digit_values, *, eta: float, width: float):
  r"""Soft labels over the ten digits: ``(1-eta) onehot(y) + eta psi(y)``.

  .. math:: \psi_k(y) = \frac{e^{-(k-y)^2 / 2w^2}}{\sum_j e^{-(j-y)^2/2w^2}}

  Returns ``[..., 10]`` float32 rows that sum to 1.
  """
  target = jnp.asarray(digit_values, jnp.float32)[..., None]
  gaussian = jnp.exp(-((_DIGITS - target)**2) / (2.0 * width**2))
  psi = gaussian / gaussian.sum(-1, keepdims=True)
  one_hot = jax.nn.one_hot(digit_values, NUM_DIGITS, dtype=jnp.float32)
  return (1.0 - eta) * one_hot + eta * psi


def soft_label_cross_entropy(logits, labels, digit_mask=None, *,
                             digit_token_ids=None, eta: float = 0.5,
                             width: float = 1.0) -> chex.Array:
  r"""Cross-entropy of digit tokens against soft digit labels.

  .. math:: \ell_t = -\sum_{k=0}^{9} q_k(y_t) \log p_t(\text{digit } k),
            \quad q(y) = (1-\eta)\,\delta(y) + \eta\,\psi(y)

  :math:`p_t` is the softmax over the whole vocabulary and :math:`\psi` a
  Gaussian over digit distance with width ``width`` (see
  :func:`soft_digit_targets`), after the soft-labeling poster (Wang et al.,
  Amazon AGI). The poster does not give :math:`\eta` or the width; the
  defaults here are a reasonable middle (not tuned). Arguments and result as
  in :func:`ntil_loss`.
  """
  digit_logits_, layout = _prepare(logits, labels, digit_mask, digit_token_ids)
  stats = _digit_statistics(logits, digit_logits_, needs_log_norm=True)
  return _soft_label(stats, layout, eta=eta, width=width)


def cross_entropy(logits, labels, loss_mask=None) -> chex.Array:
  """Token cross-entropy (optax), zero where ``loss_mask`` is false.

  Labels outside ``[0, V)`` (ignore ids such as -100) also score 0.
  """
  labels = jnp.asarray(labels)
  _check_inputs(logits, labels, None, None, (("loss_mask", loss_mask),))
  valid = _scored(labels, logits.shape[-1], loss_mask)
  ce = optax.softmax_cross_entropy_with_integer_labels(
      jnp.asarray(logits).astype(jnp.float32), jnp.where(valid, labels, 0))
  return _masked(ce, valid)


def _scored(labels, vocab_size, loss_mask):
  """Positions whose label is a real token and that the loss mask keeps."""
  valid = (labels >= 0) & (labels < vocab_size)
  if loss_mask is not None:
    valid = valid & jnp.asarray(loss_mask, bool)
  return valid


# ----------------------------------------------------------------------------
# The combined loss a train step calls.

NUMERIC_LOSSES = {
    "ce": None,
    "emd": emd_loss,
    "ntl_mse": ntl_mse_loss,
    "soft_label": soft_label_cross_entropy,
    "ntil": ntil_loss,
}
_FROM_STATISTICS = {
    "ce": None,
    "emd": _emd,
    "ntl_mse": _ntl_mse,
    "soft_label": _soft_label,
    "ntil": _ntil,
}
WEIGHTINGS = ("sum", "reference")


def numeric_token_loss(logits, labels, *, loss_mask=None, digit_mask=None,
                       method: str = "ntil", lam: float = 0.3,
                       weighting: str = "sum", digit_token_ids=None,
                       **loss_kwargs) -> chex.Array:
  r"""Cross-entropy on every scored token plus ``lam`` times a numeric loss.

  .. math:: \ell_t = \mathrm{CE}_t + \lambda\, w\, \mathrm{aux}_t

  with :math:`\mathrm{aux}` the loss named by ``method`` (``"ntil"``,
  ``"emd"``, ``"ntl_mse"``, ``"soft_label"``; ``"ce"`` for none) on the digit
  tokens of scored positions (``digit_mask & loss_mask``).

  ``weighting="sum"`` (default) uses :math:`w = 1`. ``weighting="reference"``
  reproduces the NTIL authors' code, ``CE + stop_gradient(CE/aux) * lam *
  aux``: :math:`w = \mathrm{sg}(\sum_t \mathrm{CE}_t / \sum_t
  \mathrm{aux}_t)` over the whole batch, so the auxiliary term's value is
  always ``lam`` times the CE and only its direction is learned.

  With ``method="soft_label"`` and ``w = 1``, ``CE + lam * CE_soft`` equals
  ``(1 + lam)`` times a soft-label CE with ``eta' = lam * eta / (1 + lam)``.

  Args:
    logits: ``[..., T, V]``.
    labels: ``[..., T]`` integer ids; ids outside ``[0, V)`` score 0.
    loss_mask: ``[..., T]`` bool, positions to score (``None``: all valid).
    digit_mask: ``[..., T]`` bool, where numbers may be (``None``: all).
    method: which numeric loss.
    lam: its weight.
    weighting: ``"sum"`` or ``"reference"``.
    digit_token_ids: ``[10]`` digit token ids (``None``: 0..9).
    **loss_kwargs: keyword arguments of the numeric loss (``sigma``,
      ``alpha``, ``key``, ``eta``, ...).

  Returns:
    ``[..., T]`` float32 per-token loss.
  """
  labels = jnp.asarray(labels)
  _check_inputs(logits, labels, digit_mask, digit_token_ids,
                (("loss_mask", loss_mask),))
  check_method(method, weighting, loss_kwargs)
  stats = token_statistics(logits, labels, digit_token_ids)
  return loss_from_statistics(
      stats, labels, vocab_size=logits.shape[-1], loss_mask=loss_mask,
      digit_mask=digit_mask, method=method, lam=lam, weighting=weighting,
      digit_token_ids=digit_token_ids, **loss_kwargs)


def check_method(method: str, weighting: str, loss_kwargs) -> None:
  """Raises ValueError for an unknown method or weighting."""
  if method not in NUMERIC_LOSSES:
    raise ValueError(f"unknown method {method!r}; choose one of "
                     f"{sorted(NUMERIC_LOSSES)}.")
  if weighting not in WEIGHTINGS:
    raise ValueError(f"unknown weighting {weighting!r}; choose one of "
                     f"{WEIGHTINGS}.")
  if method == "ce" and loss_kwargs:
    raise ValueError(f"method 'ce' takes no loss arguments, got "
                     f"{sorted(loss_kwargs)}.")


def loss_from_statistics(stats: TokenStatistics, labels, *, vocab_size: int,
                         loss_mask=None, digit_mask=None, method: str = "ntil",
                         lam: float = 0.3, weighting: str = "sum",
                         digit_token_ids=None, **loss_kwargs) -> chex.Array:
  """:func:`numeric_token_loss` from precomputed :class:`TokenStatistics`.

  The logits path and the fused path (:mod:`ntil_jax.fused`) both end here,
  so they compute the same loss by construction.
  """
  labels = jnp.asarray(labels)
  scored = _scored(labels, vocab_size, loss_mask)
  ce = _masked(stats.log_norm - stats.label_logits, scored)
  numeric_fn = _FROM_STATISTICS[method]
  if numeric_fn is None:
    return ce
  mask = scored if digit_mask is None else scored & jnp.asarray(digit_mask,
                                                                 bool)
  aux = numeric_fn(stats, _layout(labels, mask, digit_token_ids),
                   **loss_kwargs)
  if weighting == "reference":
    aux_total = jnp.sum(aux)
    ratio = jnp.where(aux_total > 0, jnp.sum(ce) / jnp.where(
        aux_total > 0, aux_total, 1.0), 0.0)
    aux = jax.lax.stop_gradient(ratio) * aux
  return ce + lam * aux
