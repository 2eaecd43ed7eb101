"""A float64 / exact-fraction NumPy oracle for the numeric losses.

Written loop by loop from the definitions in the NTIL issue and paper, with no
code shared with ntil_jax, so that the tests compare two independent readings
of the same definition.
"""

import math
from fractions import Fraction

import numpy as np


def softmax(z):
  z = np.asarray(z, np.float64)
  e = np.exp(z - z.max())
  return e / e.sum()


def find_numbers(labels, digit_mask, digit_ids, decimal_mask=None):
  """Numbers of one row: a list of numbers, each a list of (t, digit, place).

  A number is a maximal run of positions whose mask is true and whose label is
  a digit token. With a decimal mask, one point between two digits joins them;
  a run with two or more such points is split at every point.
  """
  T = len(labels)
  ids = [int(i) for i in digit_ids]
  is_digit = [bool(digit_mask[t]) and int(labels[t]) in ids for t in range(T)]
  joins = [False] * T
  if decimal_mask is not None:
    for t in range(1, T - 1):
      joins[t] = bool(decimal_mask[t]) and is_digit[t - 1] and is_digit[t + 1]
  runs, current = [], []
  for t in range(T):
    if is_digit[t] or joins[t]:
      current.append(t)
    else:
      if current:
        runs.append(current)
      current = []
  if current:
    runs.append(current)
  numbers = []
  for run in runs:
    points = [t for t in run if joins[t]]
    if len(points) > 1:  # ambiguous: every point splits
      piece = []
      for t in run:
        if joins[t]:
          numbers.append(piece)
          piece = []
        else:
          piece.append(t)
      numbers.append(piece)
      continue
    numbers.append(run)
  out = []
  for run in numbers:
    point = next((t for t in run if joins[t]), None)
    digits = [t for t in run if not joins[t]]
    entries = []
    for t in digits:
      if point is None:
        place = sum(1 for u in digits if u > t)
      elif t < point:
        place = sum(1 for u in digits if t < u < point)
      else:
        place = -sum(1 for u in digits if point < u <= t)
      entries.append((t, ids.index(int(labels[t])), place))
    out.append(entries)
  return out


def value(digits_and_places):
  return sum(
      (Fraction(d) * Fraction(10) ** p for d, p in digits_and_places),
      Fraction(0),
  )


def deviations(x, y):
  """(rel, mag, d rel/dX, d mag/dX) for Fractions x, y."""
  hi, lo = max(x, y), min(x, y)
  rel = float(abs(x - y) / (hi + 1))
  mag = math.log1p(float(abs(x - y) / (lo + 1)))
  if x > y:
    drel, dmag = (y + 1) / (x + 1) ** 2, 1 / (x + 1)
  elif x < y:
    drel, dmag = -1 / (y + 1), -1 / (x + 1)
  else:
    drel, dmag = Fraction(0), Fraction(0)
  return rel, mag, drel, dmag


def ntil(
    logits,
    labels,
    digit_mask,
    digit_ids=range(10),
    *,
    sigma=0.2,
    alpha=0.2,
    beta=0.2,
    tau=0.1,
    noise=None,
    decimal_mask=None,
):
  """Per-token NTIL and its (straight-through) gradient w.r.t. the logits.

  Args:
    logits: [B, T, V]; labels, digit_mask: [B, T]; noise: optional [B, T, 10]
      already scaled Gumbel noise added to the digit logits.

  Returns:
    loss [B, T] float64, grad [B, T, V] float64, and a dict of components.
  """
  logits = np.asarray(logits, np.float64)
  B, T, V = logits.shape
  ids = [int(i) for i in digit_ids]
  loss = np.zeros((B, T))
  grad = np.zeros((B, T, V))
  parts = {k: np.zeros((B, T)) for k in ("emd", "weights", "rel", "mag")}
  parts["weights"][:] = 1.0
  for b in range(B):
    row_decimal = None if decimal_mask is None else decimal_mask[b]
    for number in find_numbers(labels[b], digit_mask[b], ids, row_decimal):
      predicted = []
      soft_grads = []
      for i, (t, y, place) in enumerate(number):
        z = logits[b, t, ids]
        p = softmax(z)
        dist = np.abs(np.arange(10) - y)
        emd = float(p @ dist)
        w = (1 + sigma) ** (len(number) - i - 1)
        loss[b, t] += w * emd
        parts["emd"][b, t], parts["weights"][b, t] = emd, w
        grad[b, t, ids] += w * p * (dist - emd)
        noisy = z + (0 if noise is None else noise[b, t])
        x = int(np.argmax(noisy))
        s = softmax(noisy / tau)
        predicted.append((x, place))
        soft_grads.append(
            (t, place, s * (np.arange(10) - s @ np.arange(10)) / tau)
        )
      x_val = value(predicted)
      y_val = value([(y, place) for _, y, place in number])
      rel, mag, drel, dmag = deviations(x_val, y_val)
      last = number[-1][0]
      loss[b, last] += alpha * rel + beta * mag
      parts["rel"][b, last], parts["mag"][b, last] = rel, mag
      d_term = alpha * drel + beta * dmag
      for t, place, dx_dz in soft_grads:
        grad[b, t, ids] += float(d_term * Fraction(10) ** place) * dx_dz
  return loss, grad, parts


def emd(logits, labels, digit_mask, digit_ids=range(10)):
  ids = [int(i) for i in digit_ids]
  out = np.zeros(labels.shape)
  for b, t in np.ndindex(*labels.shape):
    if digit_mask[b, t] and int(labels[b, t]) in ids:
      y = ids.index(int(labels[b, t]))
      p = softmax(np.asarray(logits[b, t], np.float64)[ids])
      out[b, t] = sum(p[k] * abs(k - y) for k in range(10))
  return out


def ntl_mse(logits, labels, digit_mask, digit_ids=range(10)):
  ids = [int(i) for i in digit_ids]
  out = np.zeros(labels.shape)
  for b, t in np.ndindex(*labels.shape):
    if digit_mask[b, t] and int(labels[b, t]) in ids:
      y = ids.index(int(labels[b, t]))
      p = softmax(np.asarray(logits[b, t], np.float64)[ids])
      out[b, t] = (sum(k * p[k] for k in range(10)) - y) ** 2
  return out


def soft_label_ce(
    logits, labels, digit_mask, digit_ids=range(10), *, eta, width
):
  ids = [int(i) for i in digit_ids]
  out = np.zeros(labels.shape)
  for b, t in np.ndindex(*labels.shape):
    if digit_mask[b, t] and int(labels[b, t]) in ids:
      y = ids.index(int(labels[b, t]))
      log_p = np.log(softmax(np.asarray(logits[b, t], np.float64)))
      psi = np.array(
          [math.exp(-((k - y) ** 2) / (2 * width**2)) for k in range(10)]
      )
      psi /= psi.sum()
      q = [(1 - eta) * (k == y) + eta * psi[k] for k in range(10)]
      out[b, t] = -sum(q[k] * log_p[ids[k]] for k in range(10))
  return out
