"""The baselines NTIL is compared with, as per-token losses.

EMD (:func:`emd_loss`), NTL-MSE (Zausinger et al., ICML 2025,
:func:`ntl_mse_loss`), soft-label cross-entropy (Wang et al., Amazon AGI,
:func:`soft_label_cross_entropy`, :func:`soft_digit_targets`) and plain token
cross-entropy (:func:`cross_entropy`).
"""

import chex
import jax
import jax.numpy as jnp
import optax

from ntil_jax import arrays
from ntil_jax import base
from ntil_jax import numbers
from ntil_jax import statistics
from ntil_jax import validation


def emd_from_layout(stats: statistics.TokenStatistics, layout):
  probs = jax.nn.softmax(base.digits_in_numbers(stats.digit_logits, layout), -1)
  return base.masked(
      jnp.sum(probs * base.digit_distance(layout), -1), layout.is_digit
  )


def ntl_mse_from_layout(stats: statistics.TokenStatistics, layout):
  probs = jax.nn.softmax(base.digits_in_numbers(stats.digit_logits, layout), -1)
  expected = probs @ base.DIGITS
  error = expected - layout.digit_values.astype(jnp.float32)
  return base.masked(error**2, layout.is_digit)


def soft_label_from_layout(
    stats: statistics.TokenStatistics,
    layout,
    *,
    eta: float = 0.5,
    width: float = 1.0,
):
  log_probs = stats.digit_logits - stats.log_norm[..., None]
  targets = soft_digit_targets(layout.digit_values, eta=eta, width=width)
  # 0 log 0 = 0: a digit the model rules out (logit -inf) that the target
  # gives no weight costs nothing, not a NaN.
  terms = arrays.where(targets > 0, targets * log_probs, 0.0)
  return base.masked(-jnp.sum(terms, -1), layout.is_digit)


def emd_loss(
    logits, labels, digit_mask=None, *, digit_token_ids=None, sequence_axis=None
) -> chex.Array:
  r"""Earth Mover's Distance between the digit distribution and the target.

  .. math:: \ell_t = \sum_{k=0}^{9} p_{tk} |k - y_t|, \quad
            p_t = \mathrm{softmax}(z_t^{\text{digits}})

  The "EMD" baseline of the NTIL paper; for single-digit tokens it equals the
  Wasserstein variant NTL-WAS of the Number Token Loss paper. Arguments and
  result as in :func:`ntil_loss`.
  Per digit, so a sequence split inside ``shard_map`` needs nothing
  from other shards: ``sequence_axis`` is checked, and gathers nothing.

  Example:
    Ten digit ids 0..9 and two other tokens; the model is sure of '4'
    (probability 1 - 1e-12), so each digit costs its distance to 4:

    >>> import jax.numpy as jnp
    >>> logits = jnp.zeros((1, 3, 12)).at[:, :, 4].set(30.0)
    >>> labels = jnp.array([[3, 9, 10]])  # '3', '9', then no digit
    >>> emd_loss(logits, labels)[0].tolist()
    [1.0, 5.0, 0.0]
  """
  _, labels, digit_mask, _, digit_logits_ = base.prepare(
      logits, labels, digit_mask, digit_token_ids
  )
  numbers.check_sequence_axis(sequence_axis)
  return base.number_loss(
      emd_from_layout,
      base.digit_statistics(digit_logits_),
      labels,
      digit_mask,
      digit_token_ids,
  )


def ntl_mse_loss(
    logits, labels, digit_mask=None, *, digit_token_ids=None, sequence_axis=None
) -> chex.Array:
  r"""Number Token Loss, MSE variant: squared error of the expected digit.

  .. math:: \ell_t = \Big(\sum_{k=0}^{9} k\, p_{tk} - y_t\Big)^2

  with :math:`p_t` the softmax over the ten digit logits (Zausinger et al.,
  2025). Arguments and result as in :func:`ntil_loss`.
  Per digit, so a sequence split inside ``shard_map`` needs nothing
  from other shards: ``sequence_axis`` is checked, and gathers nothing.

  Example:
    The model is sure of '4', so it expects the digit 4:

    >>> import jax.numpy as jnp
    >>> logits = jnp.zeros((1, 3, 12)).at[:, :, 4].set(30.0)
    >>> ntl_mse_loss(logits, jnp.array([[3, 9, 10]]))[0].tolist()
    [1.0, 25.0, 0.0]
  """
  _, labels, digit_mask, _, digit_logits_ = base.prepare(
      logits, labels, digit_mask, digit_token_ids
  )
  numbers.check_sequence_axis(sequence_axis)
  return base.number_loss(
      ntl_mse_from_layout,
      base.digit_statistics(digit_logits_),
      labels,
      digit_mask,
      digit_token_ids,
  )


def soft_digit_targets(digit_values, *, eta: float, width: float):
  r"""Soft labels over the ten digits: ``(1-eta) onehot(y) + eta psi(y)``.

  .. math:: \psi_k(y) = \frac{e^{-(k-y)^2 / 2w^2}}{\sum_j e^{-(j-y)^2/2w^2}}

  Returns ``[..., 10]`` float32 rows that sum to 1. ``eta`` must be in
  ``[0, 1]`` and ``width >= 1e-30`` (ValueError otherwise, for concrete values).

  Example:
    >>> import jax.numpy as jnp
    >>> q = soft_digit_targets(jnp.array([3]), eta=0.5, width=1.0)
    >>> q.shape, round(float(q.sum()), 6)
    ((1, 10), 1.0)
    >>> int(q.argmax()), bool(q[0, 2] == q[0, 4])  # peaked at 3, symmetric
    (3, True)
    >>> soft_digit_targets(jnp.array([3]), eta=0.0, width=1.0)[0].tolist()[2:5]
    [0.0, 1.0, 0.0]
  """
  validation.check_parameters(eta=eta, width=width)
  target = jnp.asarray(digit_values, jnp.float32)[..., None]
  # The distance in widths, then squared: a width of 1e-20 is a one-hot
  # (width**2 underflowed to 0: 0/0 made the loss 0 and its gradient NaN).
  gaussian = jnp.exp(-0.5 * ((base.DIGITS - target) / width) ** 2)
  psi = gaussian / gaussian.sum(-1, keepdims=True)
  one_hot = jax.nn.one_hot(digit_values, numbers.NUM_DIGITS, dtype=jnp.float32)
  return (1.0 - eta) * one_hot + eta * psi


def soft_label_cross_entropy(
    logits,
    labels,
    digit_mask=None,
    *,
    digit_token_ids=None,
    eta: float = 0.5,
    width: float = 1.0,
    sequence_axis=None,
) -> chex.Array:
  r"""Cross-entropy of digit tokens against soft digit labels.

  .. math:: \ell_t = -\sum_{k=0}^{9} q_k(y_t) \log p_t(\text{digit } k),
            \quad q(y) = (1-\eta)\,\delta(y) + \eta\,\psi(y)

  :math:`p_t` is the softmax over the whole vocabulary and :math:`\psi` a
  Gaussian over digit distance with width ``width`` (see
  :func:`soft_digit_targets`), after the soft-labeling poster (Wang et al.,
  Amazon AGI). The poster does not give :math:`\eta` or the width; the
  defaults here are a reasonable middle (not tuned). Arguments and result as
  in :func:`ntil_loss`; ``eta`` in ``[0, 1]``, ``width >= 1e-30``.
  Per digit, so a sequence split inside ``shard_map`` needs nothing
  from other shards: ``sequence_axis`` is checked, and gathers nothing.

  Example:
    With ``eta=0`` the labels are one-hot: token cross-entropy on the digits.

    >>> import jax.numpy as jnp
    >>> logits = jnp.zeros((1, 3, 12)).at[:, :, 4].set(2.0)
    >>> labels = jnp.array([[3, 9, 10]])
    >>> soft = soft_label_cross_entropy(logits, labels, eta=0.0)
    >>> bool(jnp.allclose(soft[0, :2], cross_entropy(logits, labels)[0, :2]))
    True
    >>> float(soft[0, 2])  # no digit
    0.0
  """
  validation.check_parameters(eta=eta, width=width)
  logits, labels, digit_mask, _, digit_logits_ = base.prepare(
      logits, labels, digit_mask, digit_token_ids
  )
  log_norm = base.log_norm_in_numbers(
      logits, labels, digit_mask, digit_token_ids
  )
  numbers.check_sequence_axis(sequence_axis)
  return base.number_loss(
      soft_label_from_layout,
      base.digit_statistics(digit_logits_, log_norm),
      labels,
      digit_mask,
      digit_token_ids,
      eta=eta,
      width=width,
  )


def cross_entropy(logits, labels, loss_mask=None) -> chex.Array:
  """Token cross-entropy (optax), zero where ``loss_mask`` is false.

  Labels outside ``[0, V)`` (ignore ids such as -100) also score 0, with zero
  gradient even where the logits are NaN or inf.

  Example:
    Uniform logits over 12 tokens cost ``log 12`` per token:

    >>> import jax.numpy as jnp
    >>> ce = cross_entropy(jnp.zeros((1, 2, 12)), jnp.array([[5, -100]]))
    >>> [round(x, 4) for x in ce[0].tolist()]
    [2.4849, 0.0]
  """
  logits = jnp.asarray(logits)
  labels = numbers.label_array(labels)
  loss_mask = None if loss_mask is None else jnp.asarray(loss_mask)
  validation.check_inputs(
      logits, labels, None, None, (("loss_mask", loss_mask),)
  )
  labels, loss_mask = numbers.reshard_like(logits, labels, loss_mask)
  valid = base.scored(labels, logits.shape[-1], loss_mask)
  logits = arrays.where(valid[..., None], logits, 0)
  ce = optax.softmax_cross_entropy_with_integer_labels(
      logits.astype(jnp.float32), arrays.where(valid, labels, 0)
  )
  return base.masked(ce, valid)
