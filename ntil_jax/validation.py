"""Input checks of the numeric losses.

Shapes and dtypes of logits, labels and masks, digit token ids against the
vocabulary, the allowed ranges of the loss parameters
(:func:`check_parameters`), the error for an unknown loss keyword
(:class:`LossArgumentError`) and the checks of precomputed token statistics.
Everything checked here is static: nothing is left to run time.
"""

import jax
import jax.numpy as jnp
import numpy as np

from ntil_jax import chunks
from ntil_jax import numbers
from ntil_jax import vocab


def check_inputs(logits, labels, digit_mask, digit_token_ids, extra_masks=()):
  """Raises ValueError on shapes or dtypes that cannot be right.

  ``logits`` may be a ``jax.ShapeDtypeStruct`` (the fused path checks
  against logits it never builds). Everything checked is static: nothing
  is left to run time.
  """
  logits = jnp.asarray(logits) if not hasattr(logits, "shape") else logits
  if logits.ndim < 2:
    raise ValueError(
        f"logits must be [..., T, V] (rank >= 2), got shape {logits.shape}."
    )
  check_logits_dtype(logits)
  if tuple(labels.shape) != tuple(logits.shape[:-1]):
    raise ValueError(
        f"labels shape {labels.shape} must equal logits shape without the "
        f"vocabulary axis, {logits.shape[:-1]} (logits {logits.shape})."
    )
  if not jnp.issubdtype(labels.dtype, jnp.integer):
    raise ValueError(f"labels must be integer token ids, got {labels.dtype}.")
  for name, mask in (("digit_mask", digit_mask),) + tuple(extra_masks):
    if mask is None:
      continue
    if tuple(jnp.shape(mask)) != tuple(labels.shape):
      raise ValueError(
          f"{name} shape {jnp.shape(mask)} must equal labels shape "
          f"{labels.shape}."
      )
    _check_mask_dtype(name, mask)
  check_digit_ids(digit_token_ids, logits.shape[-1])
  masks = dict(extra_masks)
  _check_scored_labels(
      labels, masks.get("loss_mask", masks.get("mask")), logits.shape[-1]
  )
  _check_points_are_not_digits(
      labels, masks.get("decimal_point_mask"), digit_token_ids
  )


def _check_mask_dtype(name, mask) -> None:
  """Masks are bool, or integer with nonzero meaning true; never float."""
  dtype = jnp.result_type(mask)
  if not (dtype == jnp.bool_ or jnp.issubdtype(dtype, jnp.integer)):
    raise ValueError(
        f"{name} must be a bool array (or integer, nonzero meaning true), "
        f"got dtype {dtype}: a float mask would count every nonzero value, "
        "NaN included, as true."
    )


def _concrete(x):
  """``x`` as a NumPy array; None if it is traced (inside ``jit``) or not
  on this process whole."""
  if isinstance(x, jax.core.Tracer):
    return None
  if isinstance(x, jax.Array) and not x.is_fully_addressable:
    return None
  return np.asarray(x)


def _check_scored_labels(labels, loss_mask, vocab_size) -> None:
  """ValueError for a label id ``>= V`` at a scored position.

  Scored: where ``loss_mask`` is true, or anywhere without a ``loss_mask``.
  Such a position would score 0 while it is meant to be scored (a tokenizer
  larger than the model's vocabulary, say). Only concrete labels and masks
  can be checked; under ``jit`` the position scores 0 with zero gradient.
  Negative ids (e.g. -100) mark ignored positions and are never refused.
  """
  labels = _concrete(labels)
  if labels is None:
    return
  if loss_mask is None:
    scored, where_scored = True, "anywhere (no loss_mask is given)"
  else:
    scored = _concrete(loss_mask)
    if scored is None:
      return
    scored, where_scored = scored.astype(bool), "where loss_mask is true"
  outside = (labels >= vocab_size) & scored
  if outside.any():
    where = tuple(int(i) for i in np.argwhere(outside)[0])
    raise ValueError(
        f"labels must be in [0, V={vocab_size}) {where_scored}; negative "
        f"ids mark ignored positions. {int(outside.sum())} are not, e.g. "
        f"label {int(labels[where])} at index {where}."
    )


def _check_points_are_not_digits(labels, points, digit_token_ids) -> None:
  """ValueError where ``decimal_point_mask`` marks a digit (or number)
  token's label: a position cannot be a number's digit and its point.
  Checked where the labels, the mask and the ids are concrete; traced, the
  mark is ignored there (`numbers.number_layout`)."""
  if points is None:
    return
  if isinstance(digit_token_ids, vocab.NumberTokens):
    digit_token_ids = digit_token_ids.ids
  ids = np.arange(numbers.NUM_DIGITS)
  if digit_token_ids is not None:
    ids = _concrete(digit_token_ids)
  labels, points = _concrete(labels), _concrete(points)
  if labels is None or points is None or ids is None:
    return
  both = np.isin(labels, ids) & points.astype(bool)
  if both.any():
    where = tuple(int(i) for i in np.argwhere(both)[0])
    raise ValueError(
        "decimal_point_mask marks positions whose label is a digit token "
        f"({int(both.sum())}, e.g. label {int(labels[where])} at index "
        f"{where}); it should mark the decimal point tokens."
    )


def check_logits_dtype(logits, name="logits") -> None:
  if not jnp.issubdtype(logits.dtype, jnp.floating):
    raise ValueError(f"{name} must be floating point, got {logits.dtype}.")


def check_digit_ids(digit_token_ids, vocab_size):
  """Checks digit ids (``None``: 0..9) against a vocabulary of ``V`` tokens.

  Returns what :func:`numbers.check_digit_token_ids` returns (``None`` for
  the default ids); for :class:`~ntil_jax.NumberTokens`, their ids in
  canonical order (:func:`chunks.spec_and_ids`), ``None`` if traced.
  """
  if isinstance(digit_token_ids, vocab.NumberTokens):
    return chunks.spec_and_ids(digit_token_ids, vocab_size)[2]
  if digit_token_ids is None:
    if vocab_size < numbers.NUM_DIGITS:
      raise ValueError(
          f"default digit ids 0..9 need a vocabulary of >= 10, got V="
          f"{vocab_size}; pass digit_token_ids."
      )
    return None
  return numbers.check_digit_token_ids(digit_token_ids, vocab_size)


# Allowed values of the loss parameters: (test, description).
_PARAMETER_RULES = {
    "sigma": (lambda v: v > -1, "> -1 (place weights are (1 + sigma)**k)"),
    "alpha": (lambda v: v >= 0, ">= 0"),
    "beta": (lambda v: v >= 0, ">= 0"),
    "lam": (lambda v: v >= 0, ">= 0"),
    "noise_scale": (lambda v: v >= 0, ">= 0"),
    "tau": (
        lambda v: v >= 1e-30,
        ">= 1e-30 (a softmax temperature; below, float32 logits / tau "
        "overflow and the gradient is NaN)",
    ),
    "width": (
        lambda v: v >= 1e-30,
        ">= 1e-30 (a Gaussian's width; below, float32's distances in widths"
        " turn 0/0)",
    ),
    "eta": (lambda v: (v >= 0) & (v <= 1), "in [0, 1] (a mixing weight)"),
}


def check_parameters(**parameters) -> None:
  """Raises ValueError, naming the argument, for a loss parameter out of range.

  Checks the names in ``sigma, alpha, beta, lam, noise_scale, tau, width,
  eta``; others are ignored. Every one must be a finite scalar (NaN, inf
  and arrays of several values are refused) in its range. Traced values
  (inside ``jit``) cannot be checked and are skipped.
  """
  for name, value in parameters.items():
    if name not in _PARAMETER_RULES or value is None:
      continue
    try:
      array = np.asarray(value)
    except (jax.errors.TracerArrayConversionError, TypeError):
      continue  # traced: cannot be checked before run time
    if not (np.issubdtype(array.dtype, np.number) and np.isrealobj(array)):
      raise ValueError(f"{name} must be a real number, got {value!r}.")
    if array.ndim:
      raise ValueError(
          f"{name} must be a scalar, got shape {array.shape}: {value!r}."
      )
    test, rule = _PARAMETER_RULES[name]
    values = array.astype(np.float64)
    with np.errstate(invalid="ignore"):
      ok = np.all(test(values))  # NaN fails every test
    if not ok:
      raise ValueError(f"{name} must be {rule}, got {value!r}.")
    if not np.all(np.isfinite(values)):
      raise ValueError(f"{name} must be finite, got {value!r}.")


class LossArgumentError(ValueError, TypeError):
  """An unknown keyword argument of a numeric loss.

  A ValueError like the other argument checks, and a TypeError like Python's
  own unexpected-keyword error, so either ``except`` clause catches it.
  """


def check_statistics(stats, labels, vocab_size, digit_token_ids=None) -> None:
  """Raises ValueError unless ``stats`` fit ``labels`` and ``vocab_size``.

  ``digit_logits`` has 10 columns, or one per token of a
  :class:`~ntil_jax.NumberTokens` ``digit_token_ids``.
  """
  if isinstance(vocab_size, (bool, np.bool_)) or not isinstance(
      vocab_size, (int, np.integer)
  ):
    raise ValueError(
        f"vocab_size must be a positive int, got {vocab_size!r} "
        f"({type(vocab_size).__name__})."
    )
  if vocab_size < 1:
    raise ValueError(f"vocab_size must be a positive int, got {vocab_size}.")
  columns = numbers.NUM_DIGITS
  if isinstance(digit_token_ids, vocab.NumberTokens):
    columns = int(np.size(digit_token_ids.values))
  shapes = {
      "log_norm": labels.shape,
      "label_logits": labels.shape,
      "digit_logits": labels.shape + (columns,),
  }
  missing = [name for name in shapes if not hasattr(stats, name)]
  if missing:
    raise ValueError(
        "stats must be a TokenStatistics (ntil_jax.token_statistics or "
        f"fused_token_statistics gives one), got {type(stats).__name__} "
        f"without {', '.join(missing)}."
    )
  for name, shape in shapes.items():
    field = jnp.asarray(getattr(stats, name))
    if field.shape != shape:
      raise ValueError(
          f"stats.{name} shape {field.shape} must be {shape} (labels shape "
          f"{labels.shape}"
          f"{f' + ({columns},)' if name == 'digit_logits' else ''})."
      )
    check_logits_dtype(field, f"stats.{name}")
