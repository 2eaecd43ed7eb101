"""A snapshot's tokenizer.json, through the `tokenizers` library."""

import functools
import itertools
import os
import re

import numpy as np

import ntil_jax
from train import snapshots

# Text that digits are cut out of by `encode(..., split_digits=True)`.
_DIGIT_RUNS = re.compile(r"(\d)")
# What `split_digits` must give back whole when decoded.
_SPLIT_PROBE = "Answer: -12.5 + 3 is x9"


class Tokenizer:
  """The snapshot's tokenizer.json through the `tokenizers` library."""

  def __init__(self, path: str):
    import tokenizers  # pylint: disable=g-import-not-at-top

    file = os.path.join(path, "tokenizer.json")
    if not os.path.isfile(file):
      raise snapshots.SnapshotError(
          f"{file} not found; the snapshot needs a tokenizer.json (the "
          "`tokenizers` format)."
      )
    self._split_checked = False
    try:
      self.tokenizer = tokenizers.Tokenizer.from_file(file)
    except Exception as error:  # pylint: disable=broad-exception-caught
      # tokenizers raises a plain Exception for a file it cannot parse.
      raise snapshots.SnapshotError(
          f"{file} is not a readable tokenizer ({error})."
      ) from error

  @functools.cached_property
  def added_prefix(self) -> list[int]:
    """The ids the tokenizer writes before a text when it adds its special
    tokens (a Llama 3 snapshot's ``<|begin_of_text|>``); [] for none."""
    bare = self.tokenizer.encode("0", add_special_tokens=False).ids
    full = self.tokenizer.encode("0", add_special_tokens=True).ids
    for start in range(len(full) - len(bare) + 1):
      if full[start : start + len(bare)] == bare:
        return full[:start]
    return []

  def vocab(self) -> dict:
    return self.tokenizer.get_vocab(with_added_tokens=True)

  @functools.cached_property
  def digit_token_ids(self) -> np.ndarray:
    """int32 [10]: the ids of the single-digit tokens '0'..'9'."""
    try:
      return ntil_jax.digit_token_ids(self.vocab())
    except ValueError as error:
      raise snapshots.SnapshotError(f"tokenizer.json: {error}") from error

  @functools.cached_property
  def number_tokens(self) -> ntil_jax.NumberTokens:
    """Every 1-3 digit token (`ntil_jax.number_tokens`), checked as the
    losses check it: each width writes every digit at every place."""
    try:
      tokens = ntil_jax.number_tokens(self.vocab())
      ntil_jax.chunks.spec_and_ids(tokens)
    except ValueError as error:
      raise snapshots.SnapshotError(f"tokenizer.json: {error}") from error
    return tokens

  def encode(self, text: str, *, split_digits: bool = False) -> list[int]:
    """Token ids of ``text``, no special tokens added.

    With ``split_digits``, every digit is encoded on its own, so numbers
    become single-digit tokens whatever the tokenizer's number chunking.
    """
    return self.encode_batch([text], split_digits=split_digits)[0]

  def encode_batch(self, texts, *, split_digits: bool = False):
    if not split_digits:
      return [
          e.ids
          for e in self.tokenizer.encode_batch(
              list(texts), add_special_tokens=False
          )
      ]
    self._check_split_digits()
    pieces = [[p for p in _DIGIT_RUNS.split(text) if p] for text in texts]
    flat = [p for row in pieces for p in row]
    encoded = iter(
        self.tokenizer.encode_batch(flat, add_special_tokens=False)
        if flat
        else []
    )
    return [[i for _ in row for i in next(encoded).ids] for row in pieces]

  def _check_split_digits(self) -> None:
    """SnapshotError unless text encoded in pieces decodes to the text: a
    SentencePiece-style tokenizer (Llama 2) starts each piece with a word
    start, and digits encoded apart would each get one. Checked once."""
    if self._split_checked:
      return
    pieces = [p for p in _DIGIT_RUNS.split(_SPLIT_PROBE) if p]
    encoded = self.tokenizer.encode_batch(pieces, add_special_tokens=False)
    ids = [i for e in encoded for i in e.ids]
    decoded = self.tokenizer.decode(ids, skip_special_tokens=True)
    if decoded != _SPLIT_PROBE:
      raise snapshots.SnapshotError(
          "split_digits does not work with this tokenizer: "
          f"{_SPLIT_PROBE!r} encoded digit by digit decodes to {decoded!r} "
          "(it adds a word start to each piece, as SentencePiece does)."
      )
    self._split_checked = True

  def decode(self, ids, *, keep_special: bool = False) -> str:
    """The text of ``ids``; special tokens left out, or with
    ``keep_special`` written as their text (``<|endoftext|>``), and an id
    outside the tokenizer's vocabulary as ``<unk:ID>``: a model's logits
    are often wider than its tokenizer (Qwen2.5: 151,936 rows for 151,665
    tokens), and `tokenizers` drops such an id without a word, so "4",
    <id 151,800>, "2" read as the answer 42."""
    ids = [int(i) for i in ids]
    if not keep_special:
      return self.tokenizer.decode(ids, skip_special_tokens=True)
    size = self.tokenizer.get_vocab_size(with_added_tokens=True)
    parts = []
    for known, run in itertools.groupby(ids, lambda i: 0 <= i < size):
      run = list(run)
      parts += (
          [self.tokenizer.decode(run, skip_special_tokens=False)]
          if known
          else [f"<unk:{i}>" for i in run]
      )
    return "".join(parts)
