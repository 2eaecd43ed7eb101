"""Finding the digit and number tokens in a tokenizer's vocabulary."""

from collections.abc import Mapping, Sequence
import re
from typing import NamedTuple

import numpy as np

# The most digits a number token may write for the losses
# (:mod:`ntil_jax.chunks`).
MAX_WIDTH = 4
# How tokenizers spell a lone digit, most specific first: plain, WordPiece
# continuation, byte fallback (Llama/Gemma); then the word starts
# (SentencePiece's, GPT-2 byte-level's, a space), looked for only to refuse
# them by name (each such token starts a number of its own).
_SPELLINGS = ("{d}", "##{d}", "<0x3{d}>")
_WORD_START_SPELLINGS = ("\u2581{d}", "\u0120{d}", " {d}")


def _lookup(vocab) -> dict:
  """``{piece: id}`` of a mapping or of a sequence of pieces (first wins)."""
  if isinstance(vocab, Mapping):
    return dict(vocab)
  if isinstance(vocab, Sequence) and not isinstance(vocab, str):
    lookup = {}
    for index, piece in enumerate(vocab):
      lookup.setdefault(piece, index)
    return lookup
  raise ValueError(
      "vocab must be a str->id mapping or a sequence of pieces, "
      f"got {type(vocab).__name__}."
  )


def _check_token_id(piece, token_id) -> None:
  """ValueError unless ``token_id``, ``piece``'s id, is an int >= 0."""
  if isinstance(token_id, bool) or not isinstance(token_id, (int, np.integer)):
    raise ValueError(
        f"token {piece!r} has id {token_id!r}; ids must be integers."
    )
  if token_id < 0:
    raise ValueError(f"token {piece!r} has a negative id {token_id}.")


def digit_token_ids(vocab) -> np.ndarray:
  """The token ids of the digits 0..9 in ``vocab``.

  Args:
    vocab: a ``str -> id`` mapping (e.g. a Hugging Face tokenizer's
      ``get_vocab()``) or a sequence of pieces whose index is the id (e.g. a
      SentencePiece model's pieces).

  Returns:
    int32 array ``[10]``; entry ``k`` is the id of digit ``k``. For each digit
    the first spelling found among ``"k"``, ``"##k"`` (WordPiece's
    continuation) and ``"<0x3k>"`` (byte fallback) is used.

  Raises:
    ValueError: if a digit has no token, listing the missing digits, if a
      digit's id is not an integer >= 0, or if two digits share an id; and
      where a digit is written only as a word start (``"\u2581k"``,
      ``"\u0120k"``, ``" k"``): such tokens start a word each, so that two
      in a row are two numbers (``"\u25811\u25812"`` is " 1 2", not 12),
      which ten digit ids cannot say; :func:`number_tokens` can (pass it as
      ``digit_token_ids=``).

  The vocabulary may be smaller than the model's logits (padded embeddings):
  the losses take V from the logits, so these ids just have to be below it.

  Example:
    A SentencePiece-style vocabulary with byte-fallback digits:

    >>> pieces = ["<s>", "</s>", *(f"<0x3{d}>" for d in range(10)), "+"]
    >>> digit_token_ids(pieces).tolist()
    [2, 3, 4, 5, 6, 7, 8, 9, 10, 11]
    >>> digit_token_ids({"1": 7})
    Traceback (most recent call last):
    ...
    ValueError: no token for digit(s) 0, 2, 3, 4, 5, 6, 7, 8, 9 in a vocabulary of 1 entries (looked for spellings like ['0', '##0', '<0x30>']).
  """
  lookup = _lookup(vocab)
  ids, missing = [], []
  for digit in range(10):
    piece = next(
        (s.format(d=digit) for s in _SPELLINGS if s.format(d=digit) in lookup),
        None,
    )
    if piece is None:
      missing.append(str(digit))
    else:
      _check_token_id(piece, lookup[piece])
    ids.append(None if piece is None else lookup[piece])
  if missing:
    word_starts = [
        s.format(d=d)
        for d in missing
        for s in _WORD_START_SPELLINGS
        if s.format(d=d) in lookup
    ]
    if word_starts:
      raise ValueError(
          f"digit(s) {', '.join(missing)} are written only as word starts "
          f"({', '.join(map(repr, word_starts[:3]))}): each such token "
          "starts a number of its own (two in a row are ' 1 2', not 12), "
          "which ten digit ids cannot say. Pass "
          "ntil_jax.number_tokens(vocab) as digit_token_ids= instead."
      )
    raise ValueError(
        f"no token for digit(s) {', '.join(missing)} in a vocabulary of "
        f"{len(lookup)} entries (looked for spellings like "
        f"{[s.format(d=missing[0]) for s in _SPELLINGS]})."
    )
  if len(set(ids)) != 10:
    raise ValueError(f"digits share token ids: {ids}.")
  return np.asarray(ids, dtype=np.int32)


# A number token: 1 or more ASCII digits, alone or after a word-start
# marker (SentencePiece's U+2581, GPT-2's byte-level U+0120, a space) or
# WordPiece's continuation '##'; or a byte-fallback digit '<0x30>'..'<0x39>'.
_NUMBER_PIECE = re.compile(r"(\u2581|\u0120| |##)?([0-9]+)")
_BYTE_DIGIT = re.compile(r"<0x3([0-9])>")


class NumberTokens(NamedTuple):
  """The number tokens of a vocabulary, one entry per token id.

  All fields are NumPy arrays ``[M]``, sorted by id.

  Attributes:
    ids: int32 token ids.
    values: int64 values of the digits the token writes (``'007'``: 7).
    widths: int32 number of digits (``'007'``: 3).
    word_starts: bool, true where the piece starts a word (``'\u2581123'``,
      ``'\u0120123'``, ``' 123'``; in a WordPiece vocabulary, one with
      ``'##'`` number pieces, every piece without ``'##'``): such a token
      begins a new number.
  """

  ids: np.ndarray
  values: np.ndarray
  widths: np.ndarray
  word_starts: np.ndarray


def number_tokens(vocab, *, max_width: int = 3) -> NumberTokens:
  """Every token of ``vocab`` that writes 1 to ``max_width`` digits.

  Llama 3, GPT-4 (cl100k), GPT-4o (o200k) and DeepSeek-V3 write numbers in
  tokens of up to 3 digits (``1234567`` is ``123|456|7``, and ``'007'`` is a
  token of its own); Qwen2.5, Gemma and SmolLM2 in single digits, the case
  where every width is 1 (:func:`digit_token_ids` gives those ten).

  Args:
    vocab: a ``str -> id`` mapping (a Hugging Face tokenizer's
      ``get_vocab()``) or a sequence of pieces whose index is the id.
    max_width: the widest number token kept (1 to :data:`MAX_WIDTH`,
      what the losses score). Wider digit strings
      (some vocabularies hold years or ``'000000'``) are left out, as are
      numerals other than the ASCII digits (``'\u00b2'``, ``'\u0663'``).

  Returns:
    :class:`NumberTokens`. A piece is a number token when it is digits
    alone or after a word-start marker (``'\u2581'``, ``'\u0120'``, a
    space) or ``'##'``, or a byte-fallback digit ``'<0x35>'``; pieces that
    write the same digits are distinct entries (``'123'`` and
    ``'\u0120123'``).

  Raises:
    ValueError: naming the problem in one line: ``vocab`` neither a mapping
      nor a sequence, ``max_width`` out of range, pieces that are not str
      (bytes: decode them first), a negative or non-integer id, one
      id given to two number pieces, or no number token at all.

  Example:
    A Llama 3 style vocabulary (numbers in tokens of 1-3 digits):

    >>> vocab = {"1": 16, "12": 717, "123": 4513, "007": 8897, "+": 10}
    >>> tokens = number_tokens(vocab)
    >>> tokens.ids.tolist(), tokens.values.tolist(), tokens.widths.tolist()
    ([16, 717, 4513, 8897], [1, 12, 123, 7], [1, 2, 3, 3])
    >>> number_tokens(["<s>", "\u2581", "a"])
    Traceback (most recent call last):
    ...
    ValueError: no number tokens (1 to 3 digits) in a vocabulary of 3 entries.
  """
  if isinstance(max_width, bool) or not isinstance(max_width, int):
    raise ValueError(f"max_width must be an integer, got {max_width!r}.")
  if not 1 <= max_width <= MAX_WIDTH:
    raise ValueError(
        f"max_width must be 1 to {MAX_WIDTH} (digits a number token may "
        f"write), got {max_width}."
    )
  lookup = _lookup(vocab)
  found = {}
  for piece, token_id in lookup.items():
    if not isinstance(piece, str):  # one left out would never be scored
      raise ValueError(
          f"the vocabulary's pieces must be str, got {type(piece).__name__} "
          f"({piece!r}) for id {token_id}: decode them first."
      )
    match = _NUMBER_PIECE.fullmatch(piece)
    if match:
      prefix, digits = match.groups()
      prefix = prefix or ""
    else:
      byte = _BYTE_DIGIT.fullmatch(piece)
      if byte is None:
        continue
      prefix, digits = None, byte.group(1)
    if len(digits) > max_width:
      continue
    _check_token_id(piece, token_id)
    if token_id in found and found[token_id][0] != piece:
      raise ValueError(
          f"tokens {found[token_id][0]!r} and {piece!r} share the id "
          f"{token_id}; each number token needs its own id."
      )
    found[int(token_id)] = (piece, int(digits), len(digits), prefix)
  if not found:
    raise ValueError(
        f"no number tokens (1 to {max_width} digits) in a vocabulary of "
        f"{len(lookup)} entries."
    )
  ids = sorted(found)
  prefixes = [found[i][3] for i in ids]
  # WordPiece marks the pieces that continue a word ('##4'), not those that
  # start one: there "12 34" is '12' '34', two numbers, and "1234" '123'
  # '##4', one.
  starts = {"\u2581", "\u0120", " "}
  if "##" in prefixes:
    starts.add("")
  return NumberTokens(
      ids=np.asarray(ids, np.int32),
      values=np.asarray([found[i][1] for i in ids], np.int64),
      widths=np.asarray([found[i][2] for i in ids], np.int32),
      word_starts=np.asarray([p in starts for p in prefixes], bool),
  )
