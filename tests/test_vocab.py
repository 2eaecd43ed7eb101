"""The number vocabulary: every 1-3 digit token, its value and its width."""

import pathlib

import jax.numpy as jnp
import numpy as np
import pytest

import ntil_jax

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_every_number_token_of_a_llama3_tokenizer_spells_its_digits():
  tokenizers = pytest.importorskip("tokenizers")
  path = ROOT / "tests" / "fixtures" / "hf" / "llama3_tiny" / "tokenizer.json"
  tokenizer = tokenizers.Tokenizer.from_file(str(path))
  tokens = ntil_jax.number_tokens(tokenizer.get_vocab())
  # 0-9, 00-99 and 000-999: Llama 3 writes numbers in 1-3 digit tokens.
  assert np.bincount(tokens.widths).tolist() == [0, 10, 100, 1000]
  for token_id, value, width in zip(tokens.ids, tokens.values, tokens.widths):
    text = tokenizer.decode([int(token_id)])
    assert text == f"{value:0{width}d}", (token_id, text)
  # What the tokenizer makes of a long number is a run of them (its BOS,
  # added as Llama 3 adds it, left out).
  encoded = tokenizer.encode("1234567", add_special_tokens=False).ids
  assert set(encoded) <= set(tokens.ids.tolist())
  by_id = dict(zip(tokens.ids.tolist(), tokens.values.tolist()))
  assert [by_id[i] for i in encoded] == [123, 456, 7]


def test_single_digit_vocabularies_give_the_ten_digit_ids():
  tokenizers = pytest.importorskip("tokenizers")
  path = ROOT / "tests" / "fixtures" / "hf" / "qwen2_tiny" / "tokenizer.json"
  vocab = tokenizers.Tokenizer.from_file(str(path)).get_vocab()
  tokens = ntil_jax.number_tokens(vocab)
  assert tokens.widths.tolist() == [1] * 10
  order = np.argsort(tokens.values)
  np.testing.assert_array_equal(
      tokens.ids[order], ntil_jax.digit_token_ids(vocab)
  )


def test_values_widths_and_word_starts_by_spelling():
  pieces = [
      "<s>",
      "7",
      "07",
      "007",
      "\u2581123",
      "\u0120045",
      " 9",
      "x",  # '##12' in a vocabulary of its own (WordPiece's, below)
      "<0x35>",
      "1234",  # wider than 3: left out
      "\u00b2",  # a numeral, not an ASCII digit: left out
      "\u0663",
      "a1",
      "1.5",
  ]
  tokens = ntil_jax.number_tokens(pieces)
  got = {
      pieces[i]: (v, w, s)
      for i, v, w, s in zip(
          tokens.ids.tolist(),
          tokens.values.tolist(),
          tokens.widths.tolist(),
          tokens.word_starts.tolist(),
      )
  }
  assert got == {
      "7": (7, 1, False),
      "07": (7, 2, False),
      "007": (7, 3, False),
      "\u2581123": (123, 3, True),
      "\u0120045": (45, 3, True),
      " 9": (9, 1, True),
      "<0x35>": (5, 1, False),
  }
  assert tokens.ids.tolist() == sorted(tokens.ids.tolist())
  assert tokens.ids.dtype == np.int32 and tokens.widths.dtype == np.int32
  wide = ntil_jax.number_tokens(pieces, max_width=4)
  assert 9 in wide.ids.tolist()  # '1234'
  narrow = ntil_jax.number_tokens(pieces, max_width=1)
  assert set(narrow.widths.tolist()) == {1}


def test_wordpiece_pieces_without_hashes_start_numbers():
  """WordPiece marks what continues a word: "12 34" is '12' '34', two
  numbers, and "1234" '123' '##4', one. Both were scored as 1234."""
  numbers = [f"{v:0{w}d}" for w in (1, 2, 3) for v in range(10**w)]
  pieces = ["[UNK]", "x", *numbers, *(f"##{n}" for n in numbers)]
  ids = {piece: i for i, piece in enumerate(pieces)}
  tokens = ntil_jax.number_tokens(ids)
  starts = dict(zip(tokens.ids.tolist(), tokens.word_starts.tolist()))
  assert [starts[ids[p]] for p in ("12", "34", "123", "##4", "##12")] == [
      True,
      True,
      True,
      False,
      False,
  ]
  found = dict(zip(tokens.ids.tolist(), tokens.values.tolist()))
  assert found[ids["##12"]] == 12 and found[ids["007"]] == 7

  def components(labels, predicted):
    logits = jnp.full((1, len(labels), len(pieces)), -9.0)
    for i, piece in enumerate(predicted):
      logits = logits.at[0, i, ids[piece]].set(9.0)
    labels = jnp.array([[ids[p] for p in labels]])
    return ntil_jax.ntil_components(logits, labels, digit_token_ids=tokens)

  # "12 34" predicted as 12 35: the second number is off by one. A token's
  # weight is its last digit's: no digit of its number to the right.
  parts = components(["12", "34"], ["12", "35"])
  np.testing.assert_allclose(parts.weights[0], [1.0, 1.0], 1e-6)
  np.testing.assert_allclose(parts.relative[0], [0, 1 / 36], 1e-6)
  # "1234" predicted as 1235: one number, '3' with one digit to its right.
  parts = components(["123", "##4"], ["123", "##5"])
  np.testing.assert_allclose(parts.weights[0], [1.2, 1.0], 1e-6)
  np.testing.assert_allclose(parts.relative[0], [0, 1 / 1236], 1e-6)


@pytest.mark.parametrize(
    "vocab, kwargs, message",
    [
        ("0123456789", {}, "vocab must be a str->id mapping"),
        ({"1": 1}, dict(max_width=0), "max_width must be 1 to 4"),
        # Wider tokens than the losses score: refused here, not at the loss.
        ({"1": 1}, dict(max_width=5), "max_width must be 1 to 4.*got 5"),
        ({"1": 1}, dict(max_width=2.0), "max_width must be an integer"),
        ({"1": -1}, {}, "token '1' has a negative id -1"),
        ({"1": 1.0}, {}, "ids must be integers"),
        ({"1": 4, "12": 4}, {}, "share the id 4"),
        ({"a": 0, "b": 1}, {}, r"no number tokens \(1 to 3 digits\)"),
        # tiktoken's ranks are bytes: said, not skipped in silence.
        ({b"1": 0, b"12": 1}, {}, "pieces must be str, got bytes"),
        # One bytes piece among str ones would never be scored.
        (
            {**{str(d): d for d in range(10)}, b"12": 10},
            {},
            r"pieces must be str, got bytes \(b'12'\) for id 10",
        ),
    ],
)
def test_a_bad_vocabulary_is_named_in_one_line(vocab, kwargs, message):
  with pytest.raises(ValueError, match=message) as caught:
    ntil_jax.number_tokens(vocab, **kwargs)
  assert "\n" not in str(caught.value)


DIGITS = {str(d): d + 3 for d in range(10)}


@pytest.mark.parametrize(
    "changed, message",
    [
        # Two floats that truncate to one id would pass a check for shared
        # ids made before the cast: refused as floats.
        ({"0": 4.2, "1": 4.7}, "token '0' has id 4.2; ids must be integers"),
        ({"0": 3.9}, "ids must be integers"),
        ({"0": True}, "ids must be integers"),
        ({"0": -1}, "token '0' has a negative id -1"),
        ({"0": 4}, r"digits share token ids: \[4, 4,"),
        ({"0": "3"}, "ids must be integers"),
    ],
)
def test_digit_token_ids_refuse_what_number_tokens_refuse(changed, message):
  with pytest.raises(ValueError, match=message):
    ntil_jax.digit_token_ids({**DIGITS, **changed})
  assert ntil_jax.digit_token_ids(DIGITS).tolist() == list(range(3, 13))
