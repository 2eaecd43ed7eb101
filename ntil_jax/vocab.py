"""Finding the ten digit tokens in a tokenizer's vocabulary."""

from collections.abc import Mapping, Sequence

import numpy as np

# How tokenizers spell a lone digit, most specific first: plain, SentencePiece
# word start, GPT-2 byte-level word start, WordPiece continuation, byte
# fallback (Llama/Gemma), and the same with a space.
_SPELLINGS = ("{d}", "\u2581{d}", "\u0120{d}", "##{d}", "<0x3{d}>", " {d}")


def digit_token_ids(vocab) -> np.ndarray:
  """The token ids of the digits 0..9 in ``vocab``.

  Args:
    vocab: a ``str -> id`` mapping (e.g. a Hugging Face tokenizer's
      ``get_vocab()``) or a sequence of pieces whose index is the id (e.g. a
      SentencePiece model's pieces).

  Returns:
    int32 array ``[10]``; entry ``k`` is the id of digit ``k``. For each digit
    the first spelling found among ``"k"``, ``"\u2581k"``, ``"\u0120k"``,
    ``"##k"``, ``"<0x3k>"``, ``" k"`` is used.

  Raises:
    ValueError: if a digit has no token, listing the missing digits, or if two
      digits share an id.

  The vocabulary may be smaller than the model's logits (padded embeddings):
  the losses take V from the logits, so these ids just have to be below it.

  Example:
    A SentencePiece-style vocabulary where digits start words:

    >>> pieces = ["<s>", "</s>", *(f"\u2581{d}" for d in range(10)), "+"]
    >>> digit_token_ids(pieces).tolist()
    [2, 3, 4, 5, 6, 7, 8, 9, 10, 11]
    >>> digit_token_ids({"1": 7})
    Traceback (most recent call last):
    ...
    ValueError: no token for digit(s) 0, 2, 3, 4, 5, 6, 7, 8, 9 in a vocabulary of 1 entries (looked for spellings like ['0', '\u25810', '\u01200', '##0', '<0x30>', ' 0']).
  """
  if isinstance(vocab, Mapping):
    lookup = dict(vocab)
  elif isinstance(vocab, Sequence) and not isinstance(vocab, str):
    lookup = {}
    for index, piece in enumerate(vocab):
      lookup.setdefault(piece, index)
  else:
    raise ValueError(
        "vocab must be a str->id mapping or a sequence of pieces, "
        f"got {type(vocab).__name__}."
    )
  ids, missing = [], []
  for digit in range(10):
    found = next(
        (
            lookup[s.format(d=digit)]
            for s in _SPELLINGS
            if s.format(d=digit) in lookup
        ),
        None,
    )
    if found is None:
      missing.append(str(digit))
    ids.append(found)
  if missing:
    raise ValueError(
        f"no token for digit(s) {', '.join(missing)} in a vocabulary of "
        f"{len(lookup)} entries (looked for spellings like "
        f"{[s.format(d=missing[0]) for s in _SPELLINGS]})."
    )
  if len(set(ids)) != 10:
    raise ValueError(f"digits share token ids: {ids}.")
  return np.asarray(ids, dtype=np.int32)
