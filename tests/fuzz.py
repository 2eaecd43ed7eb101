r"""Random cases against the float64 oracle: run by hand after touching the
number logic (``make fuzz``), not in the test suite.

    python -m tests.fuzz [--check=ntil,number_tokens,non_finite] [--cases=300]
        [--first_seed=0]

* ``ntil``: NTIL's value and gradient on rows of 1-300 positions (blocks of
  1-32 positions), numbers of 1-70 digits mostly predicted right (long
  borrow chains), leading zeros, decimal points, ignored ids, random
  ``sigma``, ``alpha``, ``beta`` and ``tau``, against :func:`oracle.ntil`.
  Values to ``rtol=2e-5, atol=2e-6``. Gradients to the suite's ``rtol=1e-4,
  atol=2e-5`` plus ``2e-6`` times the position's scale (its largest
  oracle gradient plus 9 times its place weight): with ``sigma > 0`` a
  70-digit number's weights (``1.5**69 = 1e12``) scale float32's rounding
  in the softmax's gradient (``w * p * (|k - y| - emd)``, a difference
  that cancels where the model is sure) far past a per-element tolerance.
  A case with a place weight above the 1e30 cap is skipped (the cap is
  documented; the oracle has none).
* ``number_tokens``: every loss on numbers in tokens of 1-3 digits (random
  chunks, decimal points, word-start tokens), value and gradient, against
  :func:`oracle.digit_slots`, at the suite's tolerances.
* ``non_finite``: the losses' contract for bad logits. Finite logits as
  large as 1e37 give finite values and gradients, and NaN or inf logits at
  positions a loss does not score change nothing (value and gradient equal
  those with zeros there, the gradient zero there), for every loss alone
  and for ``numeric_token_loss`` with ``loss_mask`` off there.

Prints each failing case (seed, shape, settings, worst entry) and a count;
exits 1 if any failed. ``make fuzz`` (300 cases of each) took 3 minutes on
the 2-core CPU on 2026-12-03 (44, 95 and 33 s), every case passing; so
did 1,400 ``ntil`` cases (seeds 0-1399, 54 s).
"""

import sys
import time

from absl import app
from absl import flags
import jax
import numpy as np

import ntil_jax
from tests import oracle
from tests import test_chunks

_CHECKS = ("ntil", "number_tokens", "non_finite")
_CHECK = flags.DEFINE_list("check", list(_CHECKS), f"Any of {_CHECKS}.")
_CASES = flags.DEFINE_integer("cases", 300, "Random cases per check.")
_FIRST_SEED = flags.DEFINE_integer("first_seed", 0, "The first case's seed.")

# The standalone losses, and those that take decimal points.
LOSSES = test_chunks.LOSSES
POINTS = ("ntil", "del", "nl_ntl")


def nearly_right(rng, batch, length):
  """``(logits [B, T, 14], labels, digit mask, point mask)``: runs of 1-70
  digits (a third with leading zeros) between the tokens 10-13 (10 a
  decimal point where marked) and ignored ids; each digit's largest logit
  is the target's with a probability of 0.5, 0.95 or 1 (by row), by a
  margin of 0.01, 1 or 4."""
  labels = np.full((batch, length), 11)
  for b in range(batch):
    t = 0
    while t < length:
      if rng.random() < 0.6:
        n = min(int(rng.choice([1, 2, 3, 8, 20, 45, 70])), length - t)
        labels[b, t : t + n] = rng.integers(0, 10, n)
        if rng.random() < 0.3:
          labels[b, t : t + min(3, n)] = 0
        t += n
      else:
        labels[b, t] = rng.choice([10, 11, 12, 13, -100])
        t += 1
  point = (labels == 10) & (rng.random(labels.shape) < 0.8)
  mask = rng.random(labels.shape) < rng.choice([0.97, 1.01])
  logits = rng.normal(size=labels.shape + (14,)) * rng.choice([0.5, 2, 5])
  is_digit = (labels >= 0) & (labels < 10)
  odds = rng.choice([0.5, 0.95, 1], (batch, 1))
  b, t = np.nonzero(is_digit & (rng.random(labels.shape) < odds))
  margin = rng.choice([0.01, 1.0, 4.0], len(b))
  logits[b, t, labels[b, t]] = logits[b, t, :10].max(-1) + margin
  return logits.astype(np.float32), labels.astype(np.int32), mask, point


def ntil_case(seed):
  """:func:`nearly_right` of a random shape, and NTIL's settings."""
  rng = np.random.default_rng(seed)
  batch = int(rng.integers(1, 4))
  length = int(rng.choice([1, 2, 5, 31, 63, 64, 65, 127, 129, 200, 300]))
  logits, labels, mask, point = nearly_right(rng, batch, length)
  settings = dict(
      sigma=float(rng.choice([0.0, 0.2, 0.5])),
      alpha=float(rng.choice([0.0, 0.2, 1.0])),
      beta=float(rng.choice([0.0, 0.2, 1.0])),
      tau=float(rng.choice([0.1, 0.5, 1.0])),
  )
  point = point if rng.random() < 0.5 else None
  return logits, labels, mask, point, settings


@jax.jit
def _ntil(logits, labels, mask, point, sigma, alpha, beta, tau):
  def total(z):
    per_token = ntil_jax.ntil_loss(
        z,
        labels,
        mask,
        decimal_point_mask=point,
        sigma=sigma,
        alpha=alpha,
        beta=beta,
        tau=tau,
    )
    return per_token.sum(), per_token

  (_, per_token), grad = jax.value_and_grad(total, has_aux=True)(logits)
  return per_token, grad


def check_ntil(seed):
  """A failure's description, or None (also for a case past the cap)."""
  logits, labels, mask, point, settings = ntil_case(seed)
  want, want_grad, parts = oracle.ntil(
      logits, labels, mask, decimal_mask=point, **settings
  )
  if parts["weights"].max() > 1e30:
    return None
  got, grad = map(np.asarray, _ntil(logits, labels, mask, point, **settings))
  scale = np.abs(want_grad).max(-1, keepdims=True)
  scale = scale + 9 * parts["weights"][..., None]
  value_ok = np.allclose(got, want, rtol=2e-5, atol=2e-6)
  error = np.abs(grad - want_grad)
  grad_ok = (error <= 2e-5 + 1e-4 * np.abs(want_grad) + 2e-6 * scale).all()
  if value_ok and grad_ok:
    return None
  worst = np.unravel_index(np.argmax(np.abs(got - want)), got.shape)
  return (
      f"shape {logits.shape}, {settings}, points {point is not None}: value"
      f" {'ok' if value_ok else 'off'} (worst at {worst}: {got[worst]} for"
      f" {want[worst]}), gradient {'ok' if grad_ok else 'off'} (largest"
      f" error {error.max():.3g})"
  )


def token_text(rng):
  """A text of 1-5 numbers (some with points, some word starts) and its
  chunk lengths for :func:`test_chunks.encode`."""
  text, splits = "", []

  def chunks(n):
    sizes = []
    while n > 0:
      sizes.append(int(min(n, rng.integers(1, 4))))
      n -= sizes[-1]
    return sizes

  for _ in range(int(rng.integers(1, 6))):
    digits = "".join(map(str, rng.integers(0, 10, int(rng.integers(1, 13)))))
    if rng.random() < 0.2:
      digits = "0" + digits
    splits.append(chunks(len(digits)))
    if digits in WORD_STARTS and rng.random() < 0.5:
      digits = "~" + digits
    if rng.random() < 0.3:
      fraction = "".join(map(str, rng.integers(0, 10, int(rng.integers(1, 5)))))
      digits += "." + fraction
      splits.append(chunks(len(fraction)))
    text += digits + str(rng.choice(["+", "=", "x", " ", "."]))
  return text, splits


# Numbers a vocabulary also writes as word-start tokens ("\u2581" + digits).
WORD_STARTS = ("12", "7", "305")
_PIECES = test_chunks.llama_pieces(word_starts=WORD_STARTS)
_TOKENS = ntil_jax.number_tokens(_PIECES)
_JITTED = {}


def _aux(method):
  """Value and gradient of ``method``'s loss alone, on number tokens."""
  if method not in _JITTED:

    def total(z, labels, mask, point):
      per_token = test_chunks.aux(method, z, labels, mask, _TOKENS, point)
      return per_token.sum(), per_token

    _JITTED[method] = jax.jit(jax.value_and_grad(total, has_aux=True))
  return _JITTED[method]


def check_number_tokens(seed):
  rng = np.random.default_rng(seed)
  rows = []
  for _ in range(2):
    text, splits = token_text(rng)
    rows.append(test_chunks.encode(text, _PIECES, splits=splits)[:40])
  labels = test_chunks.batch(_PIECES, rows, 40)
  logits = rng.normal(0, rng.choice([0.5, 2.0]), labels.shape + (len(_PIECES),))
  logits = logits.astype(np.float32)
  mask = rng.random(labels.shape) < 0.95
  point = labels == _PIECES.index(".")
  failures = []
  for method in test_chunks.METHODS:
    want, want_grad = test_chunks.oracle_loss(
        method, logits, labels, mask, _TOKENS, point
    )
    (_, got), grad = _aux(method)(logits, labels, mask, point)
    value_ok = np.allclose(got, want, rtol=2e-5, atol=2e-5)
    grad_ok = want_grad is None or np.allclose(
        grad, want_grad, rtol=1e-4, atol=2e-5
    )
    if not (value_ok and grad_ok):
      failures.append(f"{method}: value {value_ok}, gradient {grad_ok}")
  return "; ".join(failures) or None


_STANDALONE = {}


def _standalone(name, points):
  key = (name, points)
  if key not in _STANDALONE:

    def total(z, labels, mask, point):
      kwargs = dict(decimal_point_mask=point) if points else {}
      per_token = LOSSES[name](z, labels, mask, **kwargs)
      return per_token.sum(), per_token

    _STANDALONE[key] = jax.jit(jax.value_and_grad(total, has_aux=True))
  return _STANDALONE[key]


@jax.jit
def _combined(logits, labels, digit_mask, loss_mask, point):
  out = {}
  for method in ntil_jax.NUMERIC_LOSSES:

    def total(z, method=method):
      per_token = ntil_jax.numeric_token_loss(
          z,
          labels,
          loss_mask=loss_mask,
          digit_mask=digit_mask,
          method=method,
          decimal_point_mask=point,
      )
      return per_token.sum(), per_token

    out[method] = jax.value_and_grad(total, has_aux=True)(logits)
  return out


def check_non_finite(seed):
  rng = np.random.default_rng(seed)
  shape = (2, int(rng.choice([7, 33, 70])))
  labels = np.where(
      rng.random(shape) < 0.6,
      rng.integers(0, 10, shape),
      rng.choice([10, 11, 12, -100], shape),
  ).astype(np.int32)
  mask = rng.random(shape) < 0.9
  point = labels == 10
  huge = np.array([1e37, -1e37, 1e30, -1e30, 1e10, -1e10], np.float32)
  logits = rng.normal(size=shape + (14,)).astype(np.float32)
  logits = np.where(
      rng.random(logits.shape) < 0.2, rng.choice(huge, logits.shape), logits
  ).astype(np.float32)
  unscored = ~((labels >= 0) & (labels < 10) & mask)
  bad = np.array([np.nan, np.inf, -np.inf], np.float32)
  spoiled = np.where(
      unscored[..., None] & (rng.random(logits.shape) < 0.5),
      rng.choice(bad, logits.shape),
      logits,
  ).astype(np.float32)
  zeroed = np.where(unscored[..., None], 0.0, logits).astype(np.float32)
  failures = []
  for name in LOSSES:
    for points in (False, True) if name in POINTS else (False,):
      run = _standalone(name, points)
      (_, value), grad = run(logits, labels, mask, point)
      if not (np.isfinite(value).all() and np.isfinite(grad).all()):
        failures.append(f"{name} (points {points}): huge logits, not finite")
    (_, value), grad = _standalone(name, False)(spoiled, labels, mask, point)
    (_, want), want_grad = _standalone(name, False)(zeroed, labels, mask, point)
    scored = ~unscored[..., None]
    if not (
        np.array_equal(value, want)
        and (grad[unscored] == 0).all()
        and np.array_equal(grad * scored, want_grad * scored)
    ):
      failures.append(f"{name}: NaN or inf where unscored changed it")
  loss_mask = ~unscored
  results = _combined(spoiled, labels, mask, loss_mask, point)
  wanted = _combined(zeroed, labels, mask, loss_mask, point)
  for method, ((_, value), grad) in results.items():
    (_, want), _ = wanted[method]
    finite = np.isfinite(value).all() and np.isfinite(grad).all()
    if not (finite and np.allclose(value, want, rtol=1e-6, atol=1e-6)):
      failures.append(f"numeric_token_loss {method}: loss_mask off, changed")
  return "; ".join(failures) or None


CHECKS = {
    "ntil": check_ntil,
    "number_tokens": check_number_tokens,
    "non_finite": check_non_finite,
}


def run_checks(checks, first_seed, cases) -> int:
  """Runs ``cases`` seeds of each check; returns the number that failed."""
  failed = 0
  for name in checks:
    start, bad = time.perf_counter(), 0
    for seed in range(first_seed, first_seed + cases):
      failure = CHECKS[name](seed)
      if failure:
        bad += 1
        print(f"{name} seed {seed}: {failure}", flush=True)
    seconds = time.perf_counter() - start
    print(f"{name}: {bad} of {cases} cases failed ({seconds:.0f} s)")
    failed += bad
  return failed


def main(argv):
  del argv
  unknown = sorted(set(_CHECK.value) - set(CHECKS))
  if unknown:
    raise app.UsageError(f"unknown --check {unknown}; known: {_CHECKS}")
  sys.exit(
      1 if run_checks(_CHECK.value, _FIRST_SEED.value, _CASES.value) else 0
  )


if __name__ == "__main__":
  app.run(main)
