r"""DEL: Digit Entropy Loss (Zheng et al., 2026), as a per-token loss.

Reference: Zheng, He, Wang, Li, Cheng, Zhang, "DEL: Digit Entropy Loss for
Numerical Learning of Large Language Models", arXiv:2605.20369; code at
https://github.com/PolyU-VCLab/DEL, function ``DEL`` (with
``generate_place``) inside ``custom_compute_loss`` of
``train-qwen-deepseek.py`` and ``train-codellama-mistral.py`` (commit
68c3d4dcc74e7f1918b9e41c4630adac9ffc2f56). Written here from that code, in
JAX. The two files hold the same loss with another weight in the total
(0.01 and 0.1), but the second's ``DEL`` does not run as published: it
multiplies by ``probs_digit``, a name it never defines (it computes the
same softmax as ``probs``); the parity fixtures come from the first.
"""

import chex
import jax
import jax.numpy as jnp

from ntil_jax import arrays
from ntil_jax import base
from ntil_jax import numbers
from ntil_jax import statistics

# The authors' place weights: 2 * place for integer digits (units 1, tens 2,
# ...), FRACTION_BASE ** (place - 1) for fractional ones (tenths -1, ...).
INTEGER_SCALE = 2.0
FRACTION_BASE = 1.02
# The weight of their loss in their total, ``mle + WEIGHT * mean_digits``:
# train-qwen-deepseek.py (Qwen2.5, DeepSeek-Math) and
# train-codellama-mistral.py (CodeLlama, Mistral; see above).
AUTHORS_WEIGHTS = {"qwen-deepseek": 0.01, "codellama-mistral": 0.1}


def del_place_weights(layout: numbers.NumberLayout) -> chex.Array:
  r"""The authors' place weight of each digit, ``[..., T]`` float32.

  .. math:: w_t = \begin{cases} 2\,(e_t + 1) & e_t \ge 0 \\
            1.02^{\,e_t - 1} & e_t < 0 \end{cases}

  with :math:`e_t` the place of the digit (``layout.places``: 0 units, 1
  tens, -1 tenths): their ``generate_place`` counts integer places from 1
  at the units and doubles them, and weighs the fractional digits
  :math:`1.02^{-2}, 1.02^{-3}, \dots` from the point on. 0 outside numbers.
  Their code reaches the integer weights through ``log(1.02**k) /
  log(1.02)`` in float32, up to about 1e-5 (relative) off the integers
  (1.999982 for a units digit); here they are exact.
  """
  places = layout.places.astype(jnp.float32)
  integer = INTEGER_SCALE * (places + 1.0)
  fraction = jnp.power(jnp.float32(FRACTION_BASE), jnp.minimum(places, 0) - 1)
  weights = arrays.where(places >= 0, integer, fraction)
  return base.masked(weights, layout.is_digit)


def del_from_layout(stats: statistics.TokenStatistics, layout):
  """DEL from :class:`TokenStatistics` (only the ten digit logits)."""
  logits = base.digits_in_numbers(stats.digit_logits, layout)
  probs = jax.nn.softmax(logits, axis=-1)
  target = jax.nn.one_hot(
      layout.digit_values, numbers.NUM_DIGITS, dtype=jnp.bool_
  )
  # Binary cross-entropy of each digit's own logit: -log sigmoid(z) for the
  # target digit, -log(1 - sigmoid(z)) for the nine others.
  bce = jax.nn.softplus(arrays.where(target, -logits, logits))
  # A digit ruled out (logit -inf, probability 0) adds 0, the limit of
  # p * BCE, not 0 * inf = NaN: the target digit's BCE is inf there.
  bce = arrays.where(probs > 0, bce, 0.0)
  per_digit = jnp.mean(probs * bce, axis=-1)
  return base.masked(del_place_weights(layout) * per_digit, layout.is_digit)


def del_loss(
    logits,
    labels,
    digit_mask=None,
    *,
    digit_token_ids=None,
    decimal_point_mask=None,
    sequence_axis=None,
) -> chex.Array:
  r"""Digit Entropy Loss (DEL, Zheng et al., 2026), per token.

  For a digit with target :math:`y_t`, raw digit logits :math:`z_{tk}` and
  :math:`p_t = \mathrm{softmax}(z_t)` over the ten digit logits only,

  .. math::

    \ell_t = \frac{w_t}{10} \sum_{k=0}^{9} p_{tk}\,
      \mathrm{BCE}\big(z_{tk}, [k = y_t]\big), \qquad
    \mathrm{BCE}(z, 1) = -\log\sigma(z), \;
    \mathrm{BCE}(z, 0) = -\log(1 - \sigma(z)),

  the binary cross-entropy of each digit's own logit (a sigmoid of the raw
  logit, not of the softmax) weighted by that digit's conditional
  probability, both differentiated, times the place weight :math:`w_t`
  of :func:`del_place_weights` (``2 (e + 1)`` for an integer digit of place
  ``e``, ``1.02 ** (e - 1)`` for a fractional one).

  As in the authors' code (``DEL`` in ``train-qwen-deepseek.py`` of
  https://github.com/PolyU-VCLab/DEL; arXiv:2605.20369), this is their
  ``criterion_entropy * place`` averaged over the ten digits; their loss is
  the mean of :math:`\ell_t` over all digits of the batch times 0.01
  (Qwen2.5, DeepSeek-Math; 0.1 in ``train-codellama-mistral.py``, whose
  copy of ``DEL`` names an undefined ``probs_digit`` and does not run as
  published), added to the token-mean CE. Reduce the result that way for
  their loss; the trainer's ``lam`` and token sum weigh it otherwise.
  Decimal points score nothing themselves (the paper's abstract says DEL
  "incorporates decimal points"; in the code the points only set the
  places of the digits).

  Where this differs from their code, by design: their numbers are runs
  of digit and '.' labels in the batch flattened with its ignored
  positions removed, so a number continues across an ignored position or
  from one row into the next; here a number ends there, as in every loss
  of this library (for their runs exactly, concatenate the rows' scored
  positions into one row). Their first '.' of a run is its decimal point
  whatever follows (``1.2.3``: tenths and thousandths; ``1..5``: ``5`` a
  hundredth; ``.3.14`` all integer); here ``decimal_point_mask`` joins one
  point between two digits and splits a run with two or more (see
  :func:`ntil_jax.number_layout`). Runs such as ``3.14``, ``5.``, ``.25``
  and ``3.14.`` are the same in both. Their code scores every digit label;
  ``digit_mask`` restricts that here.

  Args:
    logits: ``[..., T, V]`` logits (any float dtype; computed in float32).
    labels: ``[..., T]`` integer target ids.
    digit_mask: ``[..., T]`` bool, where digits may be scored (``None``:
      all).
    digit_token_ids: ``[10]`` token ids of the digits 0..9 (``None``: 0..9). A
      :class:`~ntil_jax.NumberTokens` scores numbers written in tokens of
      1-3 digits (:mod:`ntil_jax.chunks`).
    decimal_point_mask: optional ``[..., T]`` bool, true at '.' labels. Pass
      it for the authors' decimals: without it every digit counts as an
      integer digit of a number that ends at the '.', so ``3.14`` scores
      as ``3`` and ``14``.
    sequence_axis: inside ``jax.shard_map``, the mesh axes T is split over
      (see :func:`ntil_jax.numeric_token_loss`); ``None``: each shard holds
      whole sequences.

  Returns:
    ``[..., T]`` float32 per-token loss, zero (with zero gradient) outside
    the digits of numbers.

  Raises:
    ValueError: for mismatched shapes, non-integer labels, non-float logits,
      a float mask, or digit ids that are repeated or out of the vocabulary.

  Example:
    With every digit logit 0, each of the ten digits has probability 0.1
    and BCE ``log 2``, so a digit costs ``w log(2) / 10``: ``w = 4`` for the
    tens of "12", 2 for its units.

    >>> import math, jax.numpy as jnp
    >>> loss = del_loss(jnp.zeros((1, 3, 12)), jnp.array([[1, 2, 11]]))
    >>> [round(x / math.log(2), 4) for x in loss[0].tolist()]
    [0.4, 0.2, 0.0]
  """
  _, labels, digit_mask, decimal_point_mask, digit_logits_ = base.prepare(
      logits, labels, digit_mask, digit_token_ids, decimal_point_mask
  )
  return base.number_loss(
      del_from_layout,
      base.digit_statistics(digit_logits_),
      labels,
      digit_mask,
      digit_token_ids,
      decimal_point_mask,
      sequence_axis=sequence_axis,
  )
