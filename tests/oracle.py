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


def del_loss(
    logits, labels, digit_mask, digit_ids=range(10), decimal_mask=None
):
  """DEL per token and its gradient, float64 (the peers' loss, issue 48).

  The place weight is ``2 (e + 1)`` for an integer digit of place ``e`` and
  ``1.02 ** (e - 1)`` for a fractional one; the loss ``w / 10 * sum_k p_k
  BCE(z_k, [k = y])`` with ``p`` the softmax of the ten digit logits ``z``.

  Returns:
    loss [B, T] and grad [B, T, V], float64.
  """
  logits = np.asarray(logits, np.float64)
  ids = [int(i) for i in digit_ids]
  loss = np.zeros(labels.shape)
  grad = np.zeros(logits.shape)
  for b in range(labels.shape[0]):
    row_decimal = None if decimal_mask is None else decimal_mask[b]
    for number in find_numbers(labels[b], digit_mask[b], ids, row_decimal):
      for t, y, place in number:
        w = 2.0 * (place + 1) if place >= 0 else 1.02 ** (place - 1)
        z = logits[b, t, ids]
        p = softmax(z)
        sig = np.array([1 / (1 + math.exp(-v)) for v in z])
        target = np.array([float(k == y) for k in range(10)])
        # BCE(z, 1) = log(1 + e^-z), BCE(z, 0) = log(1 + e^z).
        bce = np.array(
            [math.log1p(math.exp(-v if k == y else v)) for k, v in enumerate(z)]
        )
        mean = float(p @ bce)
        loss[b, t] = w / 10 * mean
        grad[b, t, ids] = w / 10 * (p * (bce - mean) + p * (sig - target))
  return loss, grad


def nl_ntl(
    logits,
    labels,
    digit_mask,
    digit_ids=range(10),
    decimal_mask=None,
    reweigh=False,
):
  """The number-level NTL per token and its gradient, float64, the values
  exact in fractions of the expected digits (ntloss's ``NumberLevelLoss``).

  A number's digits ``y_j`` and expected digits ``e_j = sum_k k p_jk``
  (``p`` the softmax of the ten digit logits) make ``Y`` and ``X`` with
  digit ``j`` weighing ``10**o_j``, ``o_j`` the digits to its right in the
  number (the point skipped); the loss ``|X - Y| / (|X| + |Y| + eps)``,
  ``eps`` float32's, stands on the number's first digit. With
  ``reweigh``, ``l m + 1.01 (1 - m)``, ``m`` the whole vocabulary's
  softmax mass on the ten digit tokens there.

  Returns:
    loss [B, T] and grad [B, T, V] (of the loss's sum), float64.
  """
  logits = np.asarray(logits, np.float64)
  ids = [int(i) for i in digit_ids]
  eps = Fraction(float(np.finfo(np.float32).eps))
  loss = np.zeros(labels.shape)
  grad = np.zeros(logits.shape)
  for b in range(labels.shape[0]):
    row_decimal = None if decimal_mask is None else decimal_mask[b]
    for number in find_numbers(labels[b], digit_mask[b], ids, row_decimal):
      if not number:
        continue
      n = len(number)
      x = y = Fraction(0)
      probs = []
      for j, (t, digit, _) in enumerate(number):
        p = softmax(logits[b, t, ids])
        probs.append(p)
        x += Fraction(float(p @ np.arange(10.0))) * 10 ** (n - 1 - j)
        y += digit * Fraction(10) ** (n - 1 - j)
      total = abs(x) + abs(y) + eps
      value = abs(x - y) / total
      # d value / d X (X, Y >= 0), then X's by each digit logit.
      sign = (x > y) - (x < y)
      by_x = float(Fraction(sign) / total - value / total)
      value = float(value)
      first = number[0][0]
      scale = 1.0
      if reweigh:
        full = softmax(logits[b, first])
        mass = full[ids].sum()
        in_digits = np.zeros(len(full))
        in_digits[ids] = 1.0
        grad[b, first] += (value - 1.01) * full * (in_digits - mass)
        scale = mass
        value = value * mass + 1.01 * (1.0 - mass)
      for j, ((t, _, _), p) in enumerate(zip(number, probs)):
        slope = p * (np.arange(10.0) - p @ np.arange(10.0))
        grad[b, t, ids] += scale * by_x * 10.0 ** (n - 1 - j) * slope
      loss[b, first] = value
  return loss, grad


def smmd_kernel(kernel="gaussian", sigmas=(2.0,), squash_factor=9.0):
  """The SMMD kernel over the digit values 0..9, float64."""
  d = np.abs(np.arange(10.0)[:, None] - np.arange(10.0)[None, :])
  if squash_factor is not None and squash_factor > 1:
    # Non-zero distances 1..9 rescaled linearly to 1..squash_factor.
    d = np.where(d > 0, 1 + (d - 1) * (squash_factor - 1) / 8, 0.0)
  if kernel == "gaussian":
    k = np.mean([np.exp(-(d**2) / (2 * s**2)) for s in sigmas], axis=0)
  else:
    k = np.mean([np.exp(-d / s) for s in sigmas], axis=0)
  return np.clip(k, 0.0, 1.0)


def smmd(
    logits,
    labels,
    digit_mask,
    digit_ids=range(10),
    *,
    mode="smmd",
    kernel="gaussian",
    sigmas=(2.0,),
    squash_factor=9.0,
    smooth_weight=None,
):
  """SMMD per token and its gradient, float64, written as sums.

  ``mmd = sum_ij K_ij r_i r_j`` and ``smooth = 1/2 sum_ij K_ij (r_i -
  r_j)^2`` for ``r = p - onehot(y)``; the loss ``max(0, mmd + a smooth)``
  (``"smmd"``), ``mmd`` or ``a smooth``, ``a = 1 / (2 mean_i sum_j K_ij)``
  unless given.

  Returns:
    loss [B, T] and grad [B, T, V], float64.
  """
  gram = smmd_kernel(kernel, sigmas, squash_factor)
  a = 1 / (2 * gram.sum(1).mean()) if smooth_weight is None else smooth_weight
  weights = dict(smmd=(1.0, a), mmd=(1.0, 0.0), smooth=(0.0, a))[mode]
  logits = np.asarray(logits, np.float64)
  ids = [int(i) for i in digit_ids]
  loss = np.zeros(labels.shape)
  grad = np.zeros(logits.shape)
  for b, t in np.ndindex(*labels.shape):
    if not (digit_mask[b, t] and int(labels[b, t]) in ids):
      continue
    y = ids.index(int(labels[b, t]))
    p = softmax(logits[b, t, ids])
    r = p - np.eye(10)[y]
    mmd, smooth = 0.0, 0.0
    d_r = np.zeros(10)  # d loss / d r
    for i in range(10):
      for j in range(10):
        mmd += gram[i, j] * r[i] * r[j]
        smooth += 0.5 * gram[i, j] * (r[i] - r[j]) ** 2
        d_r[i] += 2 * weights[0] * gram[i, j] * r[j]
        d_r[i] += 2 * weights[1] * gram[i, j] * (r[i] - r[j])
    value = weights[0] * mmd + weights[1] * smooth
    loss[b, t] = max(value, 0.0)
    if value > 0:
      grad[b, t, ids] = p * (d_r - p @ d_r)
  return loss, grad


def digit_slots(logits, labels, mask, tokens, decimal_mask=None):
  """Number tokens of several digits as single-digit slots, float64.

  ``tokens``: (ids, values, widths, word_starts) lists. Each position whose
  mask is true and whose label is a number token of width w becomes w
  slots (after one non-digit slot if the token starts a word); every other
  position one non-digit slot. A digit slot j of width w has 11 logits:
  for d = 0..9 the log of the summed exp(logit) of the width-w tokens
  whose digit j is d, and one for every other token (log of their summed
  exp), so that its softmax over the 11 is the full vocabulary's.

  Returns:
    (slot_logits [B, S, 11], slot_labels [B, S] (digit d -> d, else 10),
    slot_mask [B, S], slot_decimal [B, S], owner [B][S] (the token of each
    slot, None for padding), chain) where ``chain(grad [B, S, 11])`` is the
    gradient w.r.t. ``logits``.
  """
  logits = np.asarray(logits, np.float64)
  ids, values, widths, starts = (list(x) for x in tokens)
  info = {int(i): (int(v), int(w)) for i, v, w in zip(ids, values, widths)}
  ids = [int(i) for i in ids]
  B, T, V = logits.shape
  slots = []  # per row: (t, kind, width, j, digit, decimal)
  for b in range(B):
    row = []
    for t in range(T):
      label = int(labels[b, t])
      if mask[b, t] and label in info:
        k = ids.index(label)
        v, w = info[label]
        if starts[k]:
          row.append((t, "other", 0, 0, 10, False))
        for j in range(w):
          row.append((t, "digit", w, j, (v // 10 ** (w - 1 - j)) % 10, False))
      else:
        point = bool(decimal_mask[b, t]) if decimal_mask is not None else False
        row.append((t, "other", 0, 0, 10, point))
    slots.append(row)
  S = max(len(r) for r in slots)
  slot_logits = np.zeros((B, S, 11))
  slot_labels = np.full((B, S), 10)
  slot_mask = np.zeros((B, S), bool)
  slot_decimal = np.zeros((B, S), bool)
  owner = [[None] * S for _ in range(B)]
  for b, row in enumerate(slots):
    for s, (t, kind, w, j, digit, point) in enumerate(row):
      owner[b][s] = t
      slot_decimal[b, s] = point
      if kind != "digit":
        continue
      z = logits[b, t]
      top = z.max()
      groups = np.zeros(10)
      rest = 0.0
      for k in range(V):
        if k in info and info[k][1] == w:
          v = info[k][0]
          groups[(v // 10 ** (w - 1 - j)) % 10] += math.exp(z[k] - top)
        else:
          rest += math.exp(z[k] - top)
      slot_logits[b, s, :10] = np.log(groups) + top
      slot_logits[b, s, 10] = math.log(rest) + top if rest > 0 else -np.inf
      slot_labels[b, s] = digit
      slot_mask[b, s] = True

  def chain(slot_grad):
    grad = np.zeros((B, T, V))
    for b, row in enumerate(slots):
      for s, (t, kind, w, j, _, _) in enumerate(row):
        if kind != "digit":
          continue
        z = logits[b, t]
        for k in range(V):
          if k in info and info[k][1] == w:
            v = info[k][0]
            d = (v // 10 ** (w - 1 - j)) % 10
            share = math.exp(z[k] - slot_logits[b, s, d])
            grad[b, t, k] += slot_grad[b, s, d] * share
          else:
            share = math.exp(z[k] - slot_logits[b, s, 10])
            grad[b, t, k] += slot_grad[b, s, 10] * share
    return grad

  return slot_logits, slot_labels, slot_mask, slot_decimal, owner, chain


def to_tokens(slot_values, owner, shape):
  """Per-slot values summed onto their tokens, ``[B, T]``."""
  out = np.zeros(shape)
  for b, row in enumerate(owner):
    for s, t in enumerate(row):
      if t is not None:
        out[b, t] += slot_values[b, s]
  return out
