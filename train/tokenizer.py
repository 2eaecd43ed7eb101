r"""Character tokenizer for mathematics_dataset questions and answers.

Ids 0..9 are the digit characters '0'..'9', so a numeric loss can use its
default digit ids ``tuple(range(10))`` unchanged. Four special ids follow, then
one id per character of a fixed set: space, ``a-z``, ``A-Z`` and ASCII
punctuation. That is the character set mathematics_dataset itself declares for
its questions (``generate_settings.QUESTION_CHARS``); answers use a subset.

With ``chunks=True`` numbers are written as Llama 3, GPT-4o and
DeepSeek-V3 write them (``\p{N}{1,3}``): each run of digits in tokens of 1-3
digits, greedily from the left (``1234567`` is ``123|456|7``), leading
zeros kept (``007``). The 1,100 tokens of 2 and 3 digits follow the
character ids (`CHUNK_VOCAB_SIZE` in all); `number_tokens` lists every
number token for the losses.

Example::

  >>> encode("7-10")
  [7, 79, 1, 0]
  >>> decode([BOS_ID, 7, 79, 1, 0, EOS_ID, PAD_ID])
  '7-10'
  >>> ids = encode("1234+5", chunks=True)
  >>> ids, decode(ids)
  ([322, 4, 77, 5], '1234+5')
"""

import string
from collections.abc import Iterable

import numpy as np

DIGITS = string.digits
DIGIT_TOKEN_IDS = tuple(range(len(DIGITS)))

PAD_ID = 10
BOS_ID = 11
EOS_ID = 12
SEP_ID = 13  # Separates the question from the answer.
SPECIAL_TOKENS = {
    "<pad>": PAD_ID,
    "<bos>": BOS_ID,
    "<eos>": EOS_ID,
    "<sep>": SEP_ID,
}

# Everything but the digits, in a fixed order; ids start right after SEP_ID.
# string.punctuation is !"#$%&'()*+,-./:;<=>?@[\]^_`{|}~ on every platform.
TEXT_CHARACTERS = (
    " " + string.ascii_lowercase + string.ascii_uppercase + string.punctuation
)
_FIRST_TEXT_ID = SEP_ID + 1

VOCAB_SIZE = _FIRST_TEXT_ID + len(TEXT_CHARACTERS)
# Chunk mode: '00'..'99' at VOCAB_SIZE + value, '000'..'999' after them.
_CHUNK_FIRST_ID = {2: VOCAB_SIZE, 3: VOCAB_SIZE + 100}
CHUNK_VOCAB_SIZE = VOCAB_SIZE + 1100
MAX_CHUNK = 3

# How SEP is shown by `decode`: a tab is not in the character set, so it cannot
# be confused with question or answer text.
SEP_TEXT = "\t"


def vocab() -> dict[str, int]:
  """Returns the full vocabulary: each character and special token to its id."""
  table = {digit: index for index, digit in enumerate(DIGITS)}
  table.update(SPECIAL_TOKENS)
  table.update(
      {
          char: _FIRST_TEXT_ID + index
          for index, char in enumerate(TEXT_CHARACTERS)
      }
  )
  return table


def _id_to_char() -> list[str | None]:
  """Returns, for each id, its character, or None for a special id."""
  chars: list[str | None] = [None] * VOCAB_SIZE
  for char, token_id in vocab().items():
    if char not in SPECIAL_TOKENS:
      chars[token_id] = char
  return chars


def _code_point_to_id() -> np.ndarray:
  """Returns a lookup table from ASCII code point (0..127) to id, -1 if unknown."""
  table = np.full(128, -1, dtype=np.int32)
  for char, token_id in vocab().items():
    if char not in SPECIAL_TOKENS:
      table[ord(char)] = token_id
  return table


_ID_TO_CHAR = _id_to_char()
_CODE_POINT_TO_ID = _code_point_to_id()


def encode_array(text: str) -> np.ndarray:
  """Encodes ``text`` one id per character, as an int32 array of shape [len(text)].

  No BOS/EOS is added. Raises ValueError naming the first character that is
  not in the vocabulary.
  """
  code_points = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
  # Anything beyond ASCII maps to the sentinel slot 128 via the clip, then -1.
  ids = np.append(_CODE_POINT_TO_ID, -1)[np.minimum(code_points, 128)]
  unknown = ids < 0
  if unknown.any():
    position = int(np.argmax(unknown))
    raise ValueError(
        f"Character {text[position]!r} at position {position} of {text!r} is not in the"
        " tokenizer's vocabulary."
    )
  return ids.astype(np.int32)


def chunk_ids(ids: np.ndarray, breaks=None):
  r"""Character ids with each run of digits in tokens of 1-3 digits.

  Greedily from the left, as ``\p{N}{1,3}`` splits: ``1234567`` becomes
  ``123|456|7``. ``breaks`` (bool, like ``ids``): positions where a run
  must start anew (the first character of each of several texts encoded
  at once); then returns ``(ids, breaks)`` of the result.
  """
  ids = np.asarray(ids, np.int32)
  digit = is_digit(ids)
  cut = np.zeros(len(ids), bool) if breaks is None else np.asarray(breaks)
  index = np.arange(len(ids))
  # Where each run of digits starts, and each digit's place in its run.
  joins = digit & np.concatenate([[False], digit[:-1]]) & ~cut
  run_start = digit & ~joins
  start = np.maximum.accumulate(np.where(run_start, index, 0))
  offset = index - start
  run_end = digit & ~np.concatenate([joins[1:], [False]])
  end = np.minimum.accumulate(np.where(run_end, index, len(ids))[::-1])[::-1]
  # A token starts at every non-digit and every third digit of a run.
  first = ~digit | (offset % MAX_CHUNK == 0)
  token = np.cumsum(first) - 1
  chunk_start = index - np.where(digit, offset % MAX_CHUNK, 0)
  width = np.where(digit, np.minimum(MAX_CHUNK, end - chunk_start + 1), 1)
  place = width - 1 - (index - chunk_start)
  value = np.zeros(int(first.sum()), np.int64)
  np.add.at(value, token, np.where(digit, ids * 10**place, 0))
  width, other = width[first], ids[first]
  chunk = np.select(
      [width == 2, width == 3],
      [_CHUNK_FIRST_ID[2] + value, _CHUNK_FIRST_ID[3] + value],
      value,
  )
  out = np.where(digit[first], chunk, other).astype(np.int32)
  return out if breaks is None else (out, cut[first])


def encode(text: str, *, chunks: bool = False) -> list[int]:
  """Encodes ``text`` one id per character (no BOS/EOS; see `encode_array`),
  or with ``chunks`` its numbers in tokens of 1-3 digits (`chunk_ids`)."""
  ids = encode_array(text)
  return (chunk_ids(ids) if chunks else ids).tolist()


def is_digit(ids: np.ndarray) -> np.ndarray:
  """Returns a bool array, True where an id is a digit character (ids 0..9)."""
  ids = np.asarray(ids)
  return (ids >= DIGIT_TOKEN_IDS[0]) & (ids <= DIGIT_TOKEN_IDS[-1])


def is_number(ids: np.ndarray) -> np.ndarray:
  """True where an id is a number token: a digit or a chunk of 2-3 digits."""
  ids = np.asarray(ids)
  return is_digit(ids) | ((ids >= VOCAB_SIZE) & (ids < CHUNK_VOCAB_SIZE))


def number_tokens():
  """`ntil_jax.NumberTokens` of the chunk vocabulary, as tuples (static)."""
  import ntil_jax  # pylint: disable=g-import-not-at-top

  widths = [1] * 10 + [2] * 100 + [3] * 1000
  values = list(range(10)) + list(range(100)) + list(range(1000))
  return ntil_jax.NumberTokens(
      ids=tuple(range(10)) + tuple(range(VOCAB_SIZE, CHUNK_VOCAB_SIZE)),
      values=tuple(values),
      widths=tuple(widths),
      word_starts=(False,) * 1110,
  )


def _chunk_text(token_id: int) -> str:
  width = 2 if token_id < _CHUNK_FIRST_ID[3] else 3
  return f"{token_id - _CHUNK_FIRST_ID[width]:0{width}d}"


# What ``decode(..., strict=True)`` shows for PAD, BOS and SEP: no answer
# holds it, and no parser reads it.
UNEXPECTED_TEXT = "\ufffd"


def decode(ids: Iterable[int], *, strict: bool = False) -> str:
  """Decodes ids back to text.

  Stops at the first EOS, skips PAD and BOS, and shows SEP as ``SEP_TEXT``
  (a tab). With ``strict`` (a model's answer, scored), PAD, BOS and SEP
  each show as ``UNEXPECTED_TEXT`` instead: ``2 _ PAD 0 5`` is not the
  answer ``2_05``. Ids from ``VOCAB_SIZE`` up are the chunks of 2-3
  digits (:func:`encode` with ``chunks``). Raises ValueError for an id
  outside ``[0, CHUNK_VOCAB_SIZE)``.
  """
  pieces = []
  for token_id in ids:
    token_id = int(token_id)
    if not 0 <= token_id < CHUNK_VOCAB_SIZE:
      raise ValueError(
          f"Token id {token_id} is outside the vocabulary [0, "
          f"{CHUNK_VOCAB_SIZE})."
      )
    if token_id >= VOCAB_SIZE:  # a chunk of 2-3 digits
      pieces.append(_chunk_text(token_id))
      continue
    if token_id == EOS_ID:
      break
    if strict and token_id in (PAD_ID, BOS_ID, SEP_ID):
      pieces.append(UNEXPECTED_TEXT)
      continue
    if token_id in (PAD_ID, BOS_ID):
      continue
    pieces.append(SEP_TEXT if token_id == SEP_ID else _ID_TO_CHAR[token_id])
  return "".join(pieces)
