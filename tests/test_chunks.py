"""Every loss on numbers written in tokens of 1-3 digits (Llama 3 style),
against the float64 oracle of `oracle.digit_slots`, and equal to the
single-digit losses on a vocabulary of single digits."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ntil_jax
from tests import oracle

OTHERS = ["+", ".", "x", "=", " "]
METHODS = ("emd", "ntl_mse", "soft_label", "ntil", "del", "smmd", "nl_ntl")
# Each method's stand-alone loss function.
LOSSES = {
    "emd": ntil_jax.emd_loss,
    "ntl_mse": ntil_jax.ntl_mse_loss,
    "soft_label": ntil_jax.soft_label_cross_entropy,
    "ntil": ntil_jax.ntil_loss,
    "del": ntil_jax.del_loss,
    "smmd": ntil_jax.smmd_loss,
    "nl_ntl": ntil_jax.nl_ntl_loss,
}


def llama_pieces(word_starts=()):
  """Every 1-3 digit string (``'7'``, ``'07'``, ``'007'``) and a few
  others, shuffled, with ``'\u2581'`` + each of ``word_starts``."""
  pieces = OTHERS + [str(d) for d in range(10)]
  pieces += [f"{v:02d}" for v in range(100)] + [f"{v:03d}" for v in range(1000)]
  pieces += ["\u2581" + p for p in word_starts]
  order = np.random.default_rng(0).permutation(len(pieces))
  return [pieces[i] for i in order]


def encode(text, pieces, splits=None, chunk=3):
  """Llama 3's pre-tokenization: digits in chunks of 3 from the left
  (``splits``: explicit chunk lengths for this text's digit runs, in
  order); ``~`` before a digit run writes its first chunk with the
  word-start marker."""
  index = {p: i for i, p in enumerate(pieces)}
  splits = list(splits or [])
  out, i, marker = [], 0, False
  while i < len(text):
    if text[i] == "~":
      marker, i = True, i + 1
      continue
    if text[i].isdigit():
      j = i
      while j < len(text) and text[j].isdigit():
        j += 1
      run = text[i:j]
      sizes = splits.pop(0) if splits else None
      if sizes is None:
        sizes = [chunk] * (len(run) // chunk)
        sizes += [len(run) % chunk] if len(run) % chunk else []
      k = 0
      for size in sizes:
        piece = run[k : k + size]
        out.append(index[("\u2581" if marker else "") + piece])
        marker, k = False, k + size
      i = j
    else:
      out.append(index[text[i]])
      i += 1
  return out


def batch(pieces, rows, length):
  labels = np.full((len(rows), length), -100, np.int32)
  for b, row in enumerate(rows):
    labels[b, : len(row)] = row
  return labels


def case(seed=0, word_starts=()):
  pieces = llama_pieces(word_starts)
  rows = [
      encode("1234567+89.25=x", pieces),
      encode("12005+7+1000000", pieces, splits=[[2, 3]]),
      encode("3.007x12+0", pieces),
  ]
  labels = batch(pieces, rows, 16)
  rng = np.random.default_rng(seed)
  logits = rng.normal(0, 2, labels.shape + (len(pieces),)).astype(np.float32)
  mask = np.ones(labels.shape, bool)
  mask[1, 5:] = False  # the last number of row 1 (100|000|0) is not scored
  decimal = labels == pieces.index(".")
  return pieces, logits, labels, mask, decimal


def oracle_tokens(tokens):
  return tokens.ids, tokens.values, tokens.widths, tokens.word_starts


def oracle_loss(method, logits, labels, mask, tokens, decimal):
  """``(loss [B, T], grad [B, T, V] or None)`` of ``method`` by the oracle."""
  slot_logits, slot_labels, slot_mask, slot_decimal, owner, chain = (
      oracle.digit_slots(logits, labels, mask, oracle_tokens(tokens), decimal)
  )
  grad = None
  if method == "ntil":
    loss, slot_grad, _ = oracle.ntil(
        slot_logits, slot_labels, slot_mask, decimal_mask=slot_decimal
    )
    grad = chain(slot_grad)
  elif method == "del":
    loss, slot_grad = oracle.del_loss(
        slot_logits, slot_labels, slot_mask, decimal_mask=slot_decimal
    )
    grad = chain(slot_grad)
  elif method == "smmd":
    loss, slot_grad = oracle.smmd(slot_logits, slot_labels, slot_mask)
    grad = chain(slot_grad)
  elif method == "nl_ntl":
    loss, slot_grad = oracle.nl_ntl(
        slot_logits, slot_labels, slot_mask, range(10), slot_decimal
    )
    grad = chain(slot_grad)
  elif method == "soft_label":
    loss = oracle.soft_label_ce(
        slot_logits, slot_labels, slot_mask, eta=0.1, width=1.0
    )
  else:
    loss = getattr(oracle, method)(slot_logits, slot_labels, slot_mask)
  return oracle.to_tokens(loss, owner, labels.shape), grad


def aux(method, logits, labels, mask, tokens, decimal):
  """The numeric loss alone, through `numeric_token_loss` (lam=1, CE
  subtracted) so that every method runs through one entry point."""
  kwargs = dict(eta=0.1, width=1.0) if method == "soft_label" else {}
  full = ntil_jax.numeric_token_loss(
      logits,
      labels,
      digit_mask=mask,
      method=method,
      lam=1.0,
      digit_token_ids=tokens,
      decimal_point_mask=decimal,
      **kwargs,
  )
  return full - ntil_jax.cross_entropy(logits, labels)


@functools.cache
def oracle_case(method, word_starts=()):
  pieces, logits, labels, mask, decimal = case(word_starts=word_starts)
  tokens = ntil_jax.number_tokens(pieces)
  return (pieces, logits, labels, mask, decimal, tokens) + oracle_loss(
      method, logits, labels, mask, tokens, decimal
  )


@pytest.mark.parametrize("method", METHODS)
def test_every_loss_equals_the_oracle_on_number_tokens(method):
  _, logits, labels, mask, decimal, tokens, want, want_grad = oracle_case(
      method
  )

  def total(z):
    per_token = aux(method, z, labels, mask, tokens, decimal)
    return per_token.sum(), per_token

  # Value and gradient in one program (one compile).
  (_, got), grad = jax.jit(jax.value_and_grad(total, has_aux=True))(logits)
  np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)
  # 1234567 and 12005 are numbers of several tokens: a token's loss is the
  # sum of its digits', so the first token of each scores (the number-level
  # NTL's on the number's first digit alone).
  first, second = (1, 1) if method == "nl_ntl" else (3, 2)
  assert (want[0, :first] > 0).all() and (want[1, :second] > 0).all()
  assert (want[1, 5:8] == 0).all()  # not scored
  if want_grad is not None:
    np.testing.assert_allclose(grad, want_grad, rtol=1e-4, atol=2e-5)


def test_word_start_tokens_begin_a_number():
  pieces = llama_pieces(word_starts=("12",))
  tokens = ntil_jax.number_tokens(pieces)
  glued = batch(pieces, [encode("7~12", pieces)], 4)
  plain = batch(pieces, [encode("712", pieces, splits=[[1, 2]])], 4)
  logits = np.random.default_rng(1).normal(size=glued.shape + (len(pieces),))
  parts = lambda labels: ntil_jax.ntil_components(
      logits.astype(np.float32), labels, digit_token_ids=tokens
  )
  # Two numbers, 7 and 12: each with its own number-level terms, and 7's
  # digit has no place weight from 12's.
  glued_parts, plain_parts = parts(glued), parts(plain)
  assert glued_parts.relative[0, 0] > 0 and glued_parts.relative[0, 1] > 0
  assert glued_parts.weights[0, 0] == 1.0
  # Written "7|12" without the marker, it is the one number 712.
  assert plain_parts.relative[0, 0] == 0 and plain_parts.relative[0, 1] > 0
  np.testing.assert_allclose(plain_parts.weights[0, 0], 1.2**2, rtol=1e-6)
  slot_oracle, _ = oracle_loss(
      "ntil",
      logits,
      glued,
      np.ones(glued.shape, bool),
      tokens,
      None,
  )
  got = ntil_jax.ntil_loss(
      logits.astype(np.float32), glued, digit_token_ids=tokens
  )
  np.testing.assert_allclose(got, slot_oracle, rtol=2e-5, atol=2e-5)


def test_components_per_token():
  pieces, logits, labels, mask, decimal, tokens, *_ = oracle_case("ntil")
  kwargs = dict(digit_token_ids=tokens, decimal_point_mask=decimal)
  parts = ntil_jax.ntil_components(logits, labels, mask, **kwargs)
  total = ntil_jax.ntil_loss(logits, labels, mask, **kwargs)
  alpha = beta = 0.2  # the defaults
  np.testing.assert_allclose(
      parts.weights * parts.emd
      + alpha * parts.relative
      + beta * parts.magnitude,
      total,
      rtol=1e-5,
      atol=1e-5,
  )
  # "1234567" is 123|456|7: the tokens' place weights are those of their
  # last digits, 1.2**4, 1.2 and 1.
  np.testing.assert_allclose(
      parts.weights[0, :3], [1.2**4, 1.2, 1.0], rtol=2e-7
  )
  # The prediction of a token is a value of its width (here below 1000).
  predicted = np.asarray(parts.predicted_digits)
  assert (predicted[0, :2] >= 0).all() and (predicted[0, :2] < 1000).all()
  z = np.asarray(logits[0, 0], np.float64)
  grid = np.full(1000, -np.inf)
  for piece, index in ((p, i) for i, p in enumerate(pieces)):
    if len(piece) == 3 and piece.isdigit():
      grid[int(piece)] = z[index]
  grid = grid.reshape(10, 10, 10)
  want = 0
  for j in range(3):  # each digit's marginal's argmax
    others = tuple(a for a in range(3) if a != j)
    want = 10 * want + int(np.argmax(np.log(np.exp(grid).sum(others))))
  assert predicted[0, 0] == want


def random_digit_case(seed):
  pieces = OTHERS + [str(d) for d in range(10)]
  order = np.random.default_rng(seed).permutation(len(pieces))
  pieces = [pieces[i] for i in order]
  rows = [encode(text, pieces, chunk=1) for text in ("123+4.5=67", "x9.25+100")]
  labels = batch(pieces, rows, 12)
  logits = np.random.default_rng(seed).normal(
      0, 2, labels.shape + (len(pieces),)
  )
  return pieces, logits.astype(np.float32), labels


@pytest.mark.parametrize("method", METHODS)
def test_single_digit_tokens_are_the_digit_ids_exactly(method):
  pieces, logits, labels = random_digit_case(3)
  tokens = ntil_jax.number_tokens(pieces)
  digit_ids = ntil_jax.digit_token_ids(pieces)
  decimal = labels == pieces.index(".")

  def loss(ids, z):
    return ntil_jax.numeric_token_loss(
        z,
        labels,
        method=method,
        digit_token_ids=ids,
        decimal_point_mask=decimal,
    )

  for fn in (loss, jax.grad(lambda ids, z: loss(ids, z).sum(), argnums=1)):
    np.testing.assert_array_equal(fn(tokens, logits), fn(digit_ids, logits))


def test_statistics_and_traced_ids():
  pieces, logits, labels, mask, decimal, tokens, want, _ = oracle_case("emd")
  stats = ntil_jax.token_statistics(logits, labels, tokens)
  assert stats.digit_logits.shape == labels.shape + (len(tokens.ids),)
  from_stats = ntil_jax.loss_from_statistics(
      stats,
      labels,
      vocab_size=len(pieces),
      digit_mask=mask,
      method="emd",
      lam=1.0,
      digit_token_ids=tokens,
  )
  ce = ntil_jax.cross_entropy(logits, labels)
  np.testing.assert_allclose(from_stats - ce, want, rtol=2e-5, atol=2e-5)

  @jax.jit
  def traced(ids, z):
    traced_tokens = tokens._replace(ids=ids)
    return ntil_jax.emd_loss(z, labels, mask, digit_token_ids=traced_tokens)

  np.testing.assert_allclose(
      traced(jnp.asarray(tokens.ids), logits), want, rtol=2e-5, atol=2e-5
  )


def test_bfloat16_logits():
  _, logits, labels, mask, decimal, tokens, *_ = oracle_case("ntil")
  low = jnp.asarray(logits, jnp.bfloat16)
  got = ntil_jax.ntil_loss(
      low, labels, mask, digit_token_ids=tokens, decimal_point_mask=decimal
  )
  assert got.dtype == jnp.float32
  # Computed in float32 from the bfloat16 values: the oracle's on them.
  rounded = np.asarray(low.astype(jnp.float32), np.float64)
  want, _ = oracle_loss("ntil", rounded, labels, mask, tokens, decimal)
  np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)
  grad = jax.grad(
      lambda z: ntil_jax.ntil_loss(
          z, labels, mask, digit_token_ids=tokens
      ).sum()
  )(low)
  assert bool(jnp.isfinite(grad.astype(jnp.float32)).all())


@pytest.mark.parametrize(
    "pieces, message",
    [
        (["1", "2", "12"] + [str(d) for d in range(10)], "no number token of"),
        (
            [str(d) for d in range(10)] + ["00", "01"],
            "width 2 has digit 1 at place 1 of 2",
        ),
    ],
)
def test_a_vocabulary_missing_digits_is_named(pieces, message):
  pieces = list(dict.fromkeys(pieces))
  tokens = ntil_jax.number_tokens(pieces)
  logits = np.zeros((1, 3, len(pieces)), np.float32)
  with pytest.raises(ValueError, match=message):
    ntil_jax.ntil_loss(
        logits, np.zeros((1, 3), np.int32), digit_token_ids=tokens
    )


def test_bad_number_tokens_are_named():
  tokens = ntil_jax.number_tokens([str(d) for d in range(10)] + ["+"])
  logits = np.zeros((1, 2, 5), np.float32)
  with pytest.raises(ValueError, match="out of range for a vocabulary of V=5"):
    ntil_jax.emd_loss(
        logits, np.zeros((1, 2), np.int32), digit_token_ids=tokens
    )
  wide = tokens._replace(widths=tokens.widths + 4)
  with pytest.raises(ValueError, match="widths must be 1 to 4"):
    ntil_jax.emd_loss(
        np.zeros((1, 2, 11)), np.zeros((1, 2), int), digit_token_ids=wide
    )


def test_number_token_values_and_widths_must_be_integers():
  tokens = ntil_jax.number_tokens([str(d) for d in range(10)] + ["+"])
  logits = np.zeros((1, 2, 11), np.float32)
  values = tokens.values.astype(np.float64)
  values[3] = 3.9  # cast, it was scored as the digit 3
  for field, bad in (("values", values), ("widths", tokens.widths * 1.0)):
    with pytest.raises(ValueError, match=f"NumberTokens.{field} must be int"):
      ntil_jax.emd_loss(
          logits,
          np.zeros((1, 2), np.int32),
          digit_token_ids=tokens._replace(**{field: bad}),
      )


@pytest.mark.parametrize("method", ["emd", "soft_label", "ntil"])
def test_invalid_traced_number_token_ids_are_nan_at_the_numbers(method):
  """An id out of the vocabulary, traced (so not checked): NaN at every
  scored number token, as with single digits; soft labels gave +inf at
  the tokens of two digits (their slot logits -inf, not NaN)."""
  pieces, logits, labels, mask, _ = case()
  tokens = ntil_jax.number_tokens(pieces)

  def loss(ids):
    return ntil_jax.numeric_token_loss(
        logits,
        labels,
        digit_mask=mask,
        method=method,
        lam=1.0,
        digit_token_ids=tokens._replace(ids=ids),
    )

  ids = jnp.asarray(tokens.ids).at[-1].set(len(pieces) + 100)
  got = np.asarray(jax.jit(loss)(ids))
  numbers = np.isin(labels, tokens.ids) & mask
  assert numbers.sum() > 5
  assert np.isnan(got[numbers]).all(), got[numbers]
  assert not np.isinf(got).any()


def _softmax_ce(hidden, labels, unembedding):
  """A user's CE kernel for `fused_numeric_loss(implementation=...)`."""
  logits = hidden @ unembedding
  label = jnp.take_along_axis(logits, labels[:, None], -1)[:, 0]
  return jax.nn.logsumexp(logits, -1) - label


@pytest.mark.parametrize("implementation", ["chunked", _softmax_ce])
def test_fused_path_equals_the_logits_path(implementation):
  pieces, _, labels, mask, decimal = case()
  tokens = ntil_jax.number_tokens(pieces)
  rng = np.random.default_rng(4)
  hidden = jnp.asarray(rng.normal(size=labels.shape + (16,)), jnp.float32)
  unembedding = jnp.asarray(rng.normal(size=(16, len(pieces))) / 4, jnp.float32)
  kwargs = dict(
      digit_mask=mask, digit_token_ids=tokens, decimal_point_mask=decimal
  )

  def logits_path(h, w):
    return ntil_jax.numeric_token_loss(h @ w, labels, **kwargs).sum()

  def fused(h, w):
    return ntil_jax.fused_numeric_loss(
        h, w, labels, implementation=implementation, **kwargs
    ).sum()

  want, want_grads = jax.value_and_grad(logits_path, (0, 1))(
      hidden, unembedding
  )
  got, got_grads = jax.jit(jax.value_and_grad(fused, (0, 1)))(
      hidden, unembedding
  )
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
  for g, w in zip(got_grads, want_grads):
    np.testing.assert_allclose(g, w, rtol=1e-3, atol=1e-5)
  # The number tokens' columns of W get their gradient (not only CE's).
  number_columns = np.asarray(tokens.ids)
  assert np.abs(np.asarray(got_grads[1])[:, number_columns]).sum() > 0


@pytest.mark.parametrize("method", METHODS)
def test_each_loss_function_takes_number_tokens(method):
  loss = LOSSES[method]
  _, logits, labels, mask, decimal, tokens, want, _ = oracle_case(method)
  kwargs = dict(eta=0.1, width=1.0) if method == "soft_label" else {}
  if method in ("ntil", "del", "nl_ntl"):
    kwargs["decimal_point_mask"] = decimal
  got = loss(logits, labels, mask, digit_token_ids=tokens, **kwargs)
  if method in ("ntil", "del", "nl_ntl"):
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)
  else:  # their per-digit losses do not depend on the decimal points
    np.testing.assert_allclose(
        got, aux(method, logits, labels, mask, tokens, None), atol=2e-5
    )
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("method", METHODS)
def test_an_empty_batch_scores_nothing(method):
  tokens = ntil_jax.number_tokens(llama_pieces())
  logits = np.zeros((0, 5, len(tokens.ids) + len(OTHERS)), np.float32)
  got = LOSSES[method](
      logits, np.zeros((0, 5), np.int32), digit_token_ids=tokens
  )
  assert got.shape == (0, 5)


@pytest.mark.parametrize("method", sorted(set(METHODS) - {"soft_label"}))
def test_an_infinite_logit_of_a_width_not_scored_there_is_ignored(method):
  # +inf on '12' where the target is '7' (one digit): the digit terms read
  # only the one-digit tokens there; the gradient was NaN (0 * inf).
  # Soft labels are left out: their log-normalizer reads every logit.
  pieces = (
      ["+"] + [str(d) for d in range(10)] + [f"{v:02d}" for v in range(100)]
  )
  tokens = ntil_jax.number_tokens(pieces)
  labels = np.array([[pieces.index("7"), 0]])

  def value_and_grad(logits):
    total = lambda z: LOSSES[method](z, labels, digit_token_ids=tokens).sum()
    return jax.value_and_grad(total)(jnp.asarray(logits))

  logits = np.zeros((1, 2, len(pieces)), np.float32)
  want, want_grad = value_and_grad(logits)
  logits[0, 0, pieces.index("12")] = np.inf
  got, grad = value_and_grad(logits)
  assert float(got) == float(want)
  np.testing.assert_array_equal(grad, want_grad)
  assert np.asarray(grad)[0, 0, pieces.index("12")] == 0.0


@pytest.mark.parametrize("method", METHODS)
def test_non_finite_logits_off_numbers_get_zero_gradient(method):
  """NaN and inf logits where the label is no number token (another token,
  an ignore id) score 0 with a zero gradient, as with ten digit ids; and a
  -inf on every token of one width (a logit bias) keeps the gradient
  finite, equal to the single-digit one where no such token is scored."""
  pieces = (
      OTHERS + [str(d) for d in range(10)] + [f"{v:02d}" for v in range(100)]
  )
  tokens = ntil_jax.number_tokens(pieces)
  digits = ntil_jax.digit_token_ids(pieces)
  labels = jnp.array(
      [[pieces.index("12"), pieces.index("+"), -100, pieces.index("3")]]
  )
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(1, 4, len(pieces))).astype(np.float32)
  logits[0, 1] = np.nan
  logits[0, 2] = np.inf
  loss = LOSSES[method]

  def total(z, ids):
    return loss(z, labels, digit_token_ids=ids).sum()

  value, grad = jax.value_and_grad(total)(jnp.asarray(logits), tokens)
  assert np.isfinite(float(value))
  assert np.isfinite(np.asarray(grad)).all()
  np.testing.assert_array_equal(np.asarray(grad)[0, 1:3], 0.0)
  assert np.abs(np.asarray(grad)[0, 0]).sum() > 0  # '12' is scored
  # -inf on every 2-digit token: the one-digit number '3' is scored as
  # with the ten digit ids, gradient included.
  wide = np.array([len(p) == 2 and p.isdigit() for p in pieces])
  biased = np.where(wide, -np.inf, logits[:, 3:]).astype(np.float32)
  only = labels[:, 3:]
  got = jax.value_and_grad(
      lambda z: loss(z, only, digit_token_ids=tokens).sum()
  )(jnp.asarray(biased))
  want = jax.value_and_grad(
      lambda z: loss(z, only, digit_token_ids=digits).sum()
  )(jnp.asarray(biased))
  assert np.isfinite(np.asarray(got[1])).all()
  np.testing.assert_allclose(float(got[0]), float(want[0]), rtol=1e-5)
  np.testing.assert_allclose(got[1], want[1], rtol=1e-5, atol=1e-7)
