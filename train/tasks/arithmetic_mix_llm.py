"""arithmetic_mix on a pretrained Hugging Face LLM (NTIL paper, Table 3).

The same data as `train.tasks.arithmetic_mix` (prepared by
``python -m train.prepare_data``), encoded with the snapshot's own tokenizer
(``config.pretrained``) into ``[BOS] template(question) answer EOS``: the
prompt is ``config.prompt_template`` with the question in place of
``{question}``, and only the answer and its EOS are scored. A prompt starts
with the BOS the snapshot's tokenizer adds (``config.prompt_bos``): Llama 3's,
none for Qwen2 and SmolLM2.

With ``config.tokenize_joined`` (the default) the prompt and the answer are
one text, tokenized as the tokenizer writes it: the whitespace the template
ends with (``'Answer: '``) belongs to the answer's tokens (``'Ġ-'`` of
``' -5'``, or a ``'Ġ'`` before digits), and evaluation prompts end before
it, so the model writes it. Without, the two are tokenized apart, that
whitespace a prompt token of its own (``'Ġ'``, then ``'-'``, ``'5'``): what
the recorded SmolLM2 grid trained on.

Llama 3 writes numbers in 1-3 digit tokens. With ``config.number_tokens``
the losses score them as the tokenizer writes them (each token's digits
apart, `ntil_jax.chunks`); with ``config.split_digits`` every digit of the
prompt and the answer is made its own token instead, a tokenization the
model never saw. With neither, the numeric losses score only the
single-digit tokens (as the authors' code does) and most of a Llama answer
gets none; the share scored is logged when training starts
(`scored_digit_shares`).

Beyond the task interface of train/tasks/__init__.py this module defines the
optional hooks ``make_mesh``, ``create_model`` and ``codec``.
"""

import copy
import functools
import json
import math
import os

from absl import logging
import jax
from jax.sharding import AxisType
import numpy as np

from train import hf_config as hf_config_lib
from train import hf_tokenizer
from train import input_pipeline
from train import pretrained
from train.tasks import arithmetic_mix

NAME = arithmetic_mix.NAME
prepare = arithmetic_mix.prepare
dataset_config_name = arithmetic_mix.dataset_config_name
check_data = arithmetic_mix.check_data
score_answers = arithmetic_mix.score_answers
summarize = arithmetic_mix.summarize
headline = arithmetic_mix.headline
MESH_AXES = ("data", "fsdp", "tp")


def check_config(config) -> None:
  """ValueError for a missing, unsupported or inconsistent snapshot (see
  `pretrained.check`: no single-digit tokens, weights that are not the
  config's model, ...) or a bad template."""
  if "pretrained" not in config:  # another task's config, task overridden
    raise ValueError(
        "task arithmetic_mix_llm needs its own config's fields (pretrained, ...): pass"
        " --config=configs/arithmetic_mix_llm.py."
    )
  if not config.pretrained:
    raise ValueError(
        "no model: pass --config.pretrained=DIR, the directory of a local "
        "Hugging Face snapshot (config.json, *.safetensors, tokenizer.json)."
    )
  if not os.path.isdir(config.pretrained):
    raise ValueError(
        f"pretrained snapshot {config.pretrained} is not a directory."
    )
  # Everything `pretrained.load` refuses, from the files' headers: a bad
  # snapshot stops here, not after the data is read or the model built.
  pretrained.check(
      config.pretrained, dtype=config.dtype, param_dtype=config.param_dtype
  )
  if config.get("max_prompt_tokens", 0) < 0:
    raise ValueError(
        f"max_prompt_tokens must be >= 0 (0: from max_question_len), got "
        f"{config.max_prompt_tokens}."
    )
  if config.get("prompt_bos", "llama") not in PROMPT_BOS:
    raise ValueError(
        f"prompt_bos must be one of {', '.join(PROMPT_BOS)}, got "
        f"{config.prompt_bos!r}."
    )
  if config.prompt_template.count("{question}") != 1:
    raise ValueError(
        "prompt_template must hold '{question}' exactly once, got "
        f"{config.prompt_template!r}."
    )
  if config.get("number_tokens", False):
    if config.split_digits:
      raise ValueError(
          "number_tokens and split_digits are exclusive: number_tokens "
          "scores the tokenizer's own 1-3 digit tokens, split_digits "
          "replaces them by single digits; pass one."
      )
    _tokenizer(config).number_tokens  # pylint: disable=pointless-statement
  if config.tp < 1 or jax.device_count() % (config.fsdp * config.tp):
    raise ValueError(
        f"fsdp={config.fsdp} x tp={config.tp} must divide the "
        f"{jax.device_count()} devices."
    )


# ----------------------------------------------------------------------------
# Model hooks.


def vocab_size(config) -> int:
  """The snapshot's logits width ``V``: its config.json's ``vocab_size``."""
  return int(pretrained.cached_config(config.pretrained)["vocab_size"])


def make_mesh(config) -> jax.sharding.Mesh:
  """('data', 'fsdp', 'tp'), Auto: the axis names of tunix's shardings."""
  devices = jax.device_count()
  return jax.make_mesh(
      (devices // (config.fsdp * config.tp), config.fsdp, config.tp),
      MESH_AXES,
      axis_types=(AxisType.Auto,) * 3,
  )


def create_model(config, mesh):
  """The snapshot's model (a `causal_lm.CausalLM`), sharded over ``mesh``."""
  return pretrained.load(
      config.pretrained,
      dtype=config.dtype,
      param_dtype=config.param_dtype,
      mesh=mesh,
      number_tokens=config.number_tokens,
  ).model


class Codec:
  """What decoding needs: EOS and pad ids, and ids -> text up to EOS."""

  def __init__(self, config):
    self.tokenizer = _tokenizer(config)
    # Any of them ends an answer, and its greedy decoding; the first is the
    # one training writes.
    self.end_ids = pretrained.end_token_ids(config.pretrained)
    self.eos_id = self.end_ids[0]
    self.pad_id = self.eos_id

  def decode(self, ids) -> str:
    """The text before the first end token, without the spaces around it.

    Any other special token stays in it as its text (``<|endoftext|>``): a
    prediction holding one is not the answer without it.
    """
    ids = [int(i) for i in ids]
    ends = [k for k, i in enumerate(ids) if i in self.end_ids]
    if ends:
      ids = ids[: ends[0]]
    return self.tokenizer.decode(ids, keep_special=True).strip()


def codec(config) -> Codec:
  return Codec(config)


# ----------------------------------------------------------------------------
# Encoding.


def _tokenizer(config) -> hf_tokenizer.Tokenizer:
  return pretrained.cached_tokenizer(os.path.abspath(config.pretrained))


PROMPT_BOS = ("tokenizer", "llama")


def _bos(config) -> list[int]:
  """What a prompt starts with (``config.prompt_bos``): with "tokenizer"
  (the default), the BOS the snapshot's tokenizer adds (`tokenizer_bos`);
  with "llama", config.json's BOS for a llama-family model and nothing for
  Qwen2, as the recorded SmolLM2 grid ran (SmolLM2 adds none: its BOS id
  is the chat marker ``<|im_start|>``)."""
  if config.get("prompt_bos", "llama") == "tokenizer":
    return tokenizer_bos(config.pretrained)
  hf_config = pretrained.cached_config(config.pretrained)
  bos = hf_config_lib.token_id(hf_config, "bos_token_id")
  if hf_config_lib.family(hf_config) == "llama" and bos is not None:
    return [int(bos)]
  return []


@functools.cache
def tokenizer_bos(path) -> list[int]:
  """The BOS the snapshot at ``path`` adds to a text, as transformers'
  tokenizer does: config.json's ``bos_token_id`` where
  tokenizer_config.json sets ``add_bos_token`` (a GGUF conversion writes
  it: false for SmolLM2, true for Llama 3), nothing where it clears it,
  and without that field what tokenizer.json's post-processor adds (Llama
  3's ``<|begin_of_text|>``; Qwen2 adds none)."""
  settings = os.path.join(path, "tokenizer_config.json")
  add = None
  if os.path.isfile(settings):
    with open(settings) as f:
      add = json.load(f).get("add_bos_token")
  if add is None:
    return list(pretrained.cached_tokenizer(os.path.abspath(path)).added_prefix)
  bos = hf_config_lib.token_id(pretrained.cached_config(path), "bos_token_id")
  return [int(bos)] if add and bos is not None else []


def _joined(config) -> bool:
  return bool(config.get("tokenize_joined", False))


def separator(config) -> str:
  """The whitespace the prompt template ends with that a joined
  tokenization gives the answer (``config.tokenize_joined``), else ''."""
  if not _joined(config):
    return ""
  template = config.prompt_template
  return template[len(template.rstrip()) :]


def answer_tokens(config) -> int:
  """The most tokens of an answer, its EOS not counted: one a character of
  ``max_answer_len`` (byte-level BPE gives at most one a byte, and the text
  is ASCII), and tokenized joined, one a byte of the `separator`."""
  return config.max_answer_len + len(separator(config).encode())


def _prompt_texts(config, questions) -> list[str]:
  """Each question's prompt, the `separator` left to its answer."""
  cut = len(separator(config))
  texts = [config.prompt_template.format(question=q) for q in questions]
  return [text[: len(text) - cut] for text in texts]


def prompt_length(config) -> int:
  """P, the padded prompt length: an upper bound on its tokens.

  ``config.max_prompt_tokens`` if set (problems whose prompt is longer are
  skipped); else a bound from characters: byte-level BPE gives at most one
  token per ASCII character, and mathematics_dataset's text is ASCII
  (`encode_batch` checks it anyway). The character bound is loose (about 3
  characters a token on arithmetic text): `longest_prompt_tokens` measures
  a tight one.
  """
  if config.get("max_prompt_tokens", 0):
    return config.max_prompt_tokens
  template = config.prompt_template.replace("{question}", "")
  template = template[: len(template) - len(separator(config))]
  return len(_bos(config)) + len(template.encode()) + config.max_question_len


def prompt_tokens(config, questions) -> np.ndarray:
  """int [B]: the tokens of each question's prompt (BOS, template, question)."""
  texts = _prompt_texts(config, questions)
  rows = _tokenizer(config).encode_batch(
      texts, split_digits=config.split_digits
  )
  return np.asarray([len(_bos(config)) + len(row) for row in rows], np.int64)


def longest_prompt_tokens(config, multiple: int = 8) -> int:
  """The longest prompt of both splits in tokens, rounded up to ``multiple``.

  For ``config.max_prompt_tokens``: pads every prompt to what the prepared
  data needs rather than the character bound (e.g. 40 tokens instead of
  101 on add_or_sub with SmolLM2), so a step computes 2-3x fewer positions.
  """
  longest = 0
  for split in input_pipeline.SPLITS:
    source, usable = _usable(config, split)
    for start in range(0, len(usable), 4096):
      records = source.__getitems__(
          [int(i) for i in usable[start : start + 4096]]
      )
      questions = [input_pipeline.decode_record(r)[0] for r in records]
      longest = max(longest, int(prompt_tokens(config, questions).max()))
  return -(-longest // multiple) * multiple


def sequence_length(config) -> int:
  """L, the length of ``inputs`` and ``targets`` (prompt, answer, EOS - 1)."""
  return prompt_length(config) + answer_tokens(config)


def encode_prompts(config, questions):
  """int32 [B, P] right-padded prompts and their lengths [B]."""
  tokenizer = _tokenizer(config)
  texts = _prompt_texts(config, questions)
  rows = tokenizer.encode_batch(texts, split_digits=config.split_digits)
  rows = [_bos(config) + row for row in rows]
  return _pad(rows, prompt_length(config), Codec(config).pad_id, "prompt")


def _pad(rows, width, pad_id, what):
  out = np.full((len(rows), width), pad_id, np.int32)
  lengths = np.asarray([len(row) for row in rows], np.int32)
  if lengths.size and lengths.max() > width:
    raise ValueError(
        f"a {what} has {lengths.max()} tokens, more than the {width} its "
        "maximum length allows (non-ASCII text?)."
    )
  for index, row in enumerate(rows):
    out[index, : len(row)] = row
  return out, lengths


def encode_examples(config, questions, answers) -> dict:
  """A training batch: ``inputs``, ``targets``, ``loss_mask``, ``digit_mask``.

  Each [B, L]; the loss mask covers the answer tokens and the EOS after
  them, the digit mask the answer tokens that are single digits. And
  ``score_positions``, int32 [B, K] with K = `answer_tokens` + 1: the
  window of each row that holds its scored positions, the only ones the
  step unembeds (``train.step.scored_window``; 13 of 44 positions on
  add_or_sub with SmolLM2).
  """
  eos = Codec(config).eos_id
  prompts, prompt_lengths = encode_prompts(config, questions)
  answer_rows = _answer_rows(
      config, questions, answers, prompts, prompt_lengths
  )
  width = sequence_length(config) + 1
  rows = [
      list(prompt[:length]) + answer + [eos]
      for prompt, length, answer in zip(prompts, prompt_lengths, answer_rows)
  ]
  sequences, _ = _pad(rows, width, eos, "question and answer")
  columns = np.arange(width)
  answer_lengths = np.asarray([len(a) for a in answer_rows])
  if answer_lengths.size and answer_lengths.max() > answer_tokens(config):
    joined = separator(config)
    raise ValueError(
        f"an answer has {answer_lengths.max()} tokens, more than "
        f"max_answer_len={config.max_answer_len}"
        + (f" and the {joined!r} before it" if joined else "")
        + "."
    )
  start = prompt_lengths[:, None]
  end = start + answer_lengths[:, None]  # the EOS column
  is_answer = (columns >= start) & (columns < end)
  is_digit = np.isin(sequences, _digit_ids(config))
  return {
      "inputs": sequences[:, :-1],
      "targets": sequences[:, 1:],
      "loss_mask": ((columns >= start) & (columns <= end))[:, 1:],
      "digit_mask": (is_answer & is_digit)[:, 1:],
      "score_positions": score_positions(prompt_lengths, config),
  }


def _answer_rows(config, questions, answers, prompts, prompt_lengths):
  """Each answer's tokens as training writes them: after its prompt in one
  text (`_joined_answers`), or alone."""
  if _joined(config):
    return _joined_answers(config, questions, answers, prompts, prompt_lengths)
  return _tokenizer(config).encode_batch(
      list(answers), split_digits=config.split_digits
  )


def _joined_answers(config, questions, answers, prompts, prompt_lengths):
  """Each answer's tokens in its prompt and answer tokenized as one text:
  those after the prompt's (`encode_prompts`' ``prompts`` and
  ``prompt_lengths``).

  Raises:
    ValueError: where the joined text does not start with the prompt's
      tokens (a tokenizer that writes the prompt's end and the answer's
      start in one token): its evaluation prompt could not end there.
  """
  texts = [
      config.prompt_template.format(question=q) + a
      for q, a in zip(questions, answers)
  ]
  rows = _tokenizer(config).encode_batch(
      texts, split_digits=config.split_digits
  )
  skip = len(_bos(config))
  out = []
  for row, prompt, length, text, prompt_text in zip(
      rows, prompts, prompt_lengths, texts, _prompt_texts(config, questions)
  ):
    prompt = prompt[skip:length].tolist()
    if row[: len(prompt)] != prompt:
      raise ValueError(
          f"the tokenizer writes {text!r} with a token across the end of its"
          f" prompt {prompt_text!r}: evaluation prompts cannot end where"
          " training's do; pass --config.tokenize_joined=False to tokenize"
          " the prompt and the answer apart."
      )
    out.append(row[len(prompt) :])
  return out


def score_positions(prompt_lengths, config) -> np.ndarray:
  """int32 [B, K]: each row's K = `answer_tokens` + 1 positions from its
  first scored target (the prediction of the answer's first token). They
  hold the answer and its EOS, at most K targets, so every scored position,
  and end by the row's end: a prompt has at most P tokens and a row
  P + `answer_tokens`."""
  window = answer_tokens(config) + 1
  first = np.asarray(prompt_lengths) - 1
  return (first[:, None] + np.arange(window)).astype(np.int32)


def _digit_ids(config):
  tokenizer = _tokenizer(config)
  if config.get("number_tokens", False):
    return np.asarray(tokenizer.number_tokens.ids)
  return tokenizer.digit_token_ids


def digit_coverage(
    tokenizer,
    answers,
    *,
    split_digits: bool,
    number_tokens: bool = False,
    rows=None,
) -> float:
  """The share of the answers' digit characters that the losses score.

  Those in single-digit tokens, or with ``number_tokens`` in any number
  token of 1-3 digits; the rest get cross-entropy only. ``rows``: the
  answers' tokens as trained (`scored_digit_shares`); default, each answer
  encoded alone.
  """
  if number_tokens:
    tokens = tokenizer.number_tokens
    digits = dict(zip(np.asarray(tokens.ids).tolist(), tokens.widths.tolist()))
  else:
    digits = dict.fromkeys(tokenizer.digit_token_ids.tolist(), 1)
  if rows is None:
    rows = tokenizer.encode_batch(list(answers), split_digits=split_digits)
  scored = sum(sum(digits.get(i, 0) for i in row) for row in rows)
  total = sum(sum(c.isdigit() for c in answer) for answer in answers)
  return scored / max(total, 1)


# ----------------------------------------------------------------------------
# The task's data.


def _encode_records(records, *, config):
  questions, answers = zip(*map(input_pipeline.decode_record, records))
  return encode_examples(config, questions, answers)


def _usable(config, split):
  source = input_pipeline.load_split(
      config.data_dir, split, config_name=config.dataset_config or None
  )
  limit = config.get("max_prompt_tokens", 0)
  usable = input_pipeline.fitting_indices(
      source,
      max_question_len=config.max_question_len,
      max_answer_len=config.max_answer_len,
      questions_fit=(
          (lambda questions: prompt_tokens(config, questions) <= limit)
          if limit
          else None
      ),
  )
  return source, usable


def scored_digit_shares(config, questions, answers) -> dict:
  """``{split_digits: share}``: `digit_coverage` of the answers tokenized
  as training does (after their prompt with ``tokenize_joined``, where a
  tokenizer without a digit split writes " 5" as one token, not the digit
  '5'), with ``config.split_digits`` and with the other setting (NaN where
  that one cannot tokenize them)."""
  numbers = config.get("number_tokens", False)
  shares = {}
  for split in (False, True):
    variant = copy.deepcopy(config)
    variant.split_digits = split
    try:
      prompts, prompt_lengths = encode_prompts(variant, questions)
      rows = _answer_rows(variant, questions, answers, prompts, prompt_lengths)
    except (ValueError, pretrained.SnapshotError):
      shares[split] = math.nan
      continue
    shares[split] = digit_coverage(
        _tokenizer(variant),
        answers,
        split_digits=split,
        number_tokens=numbers,
        rows=rows,
    )
  return shares


def log_digit_coverage(config, source, usable, count=2000) -> dict:
  """Logs (and returns) `scored_digit_shares` of up to ``count`` train
  examples."""
  records = source.__getitems__([int(i) for i in usable[:count]])
  questions, answers = zip(*map(input_pipeline.decode_record, records))
  numbers = config.get("number_tokens", False)
  shares = scored_digit_shares(config, list(questions), list(answers))
  logging.info(
      "the numeric loss scores %.1f%% of answer digits%s with "
      "split_digits=%s (%.1f%% with split_digits=%s), over %d answers",
      100 * shares[config.split_digits],
      " (number_tokens)" if numbers else "",
      config.split_digits,
      100 * shares[not config.split_digits],
      not config.split_digits,
      len(answers),
  )
  return shares


def train_iterator(config, *, process_index=None, process_count=None):
  """Checkpointable iterator over this host's train batches (shuffled)."""
  input_pipeline.check_worker_count(config.worker_count)
  source, usable = _usable(config, "train")
  log_digit_coverage(config, source, usable)
  return input_pipeline.task_train_iterator(
      config,
      source,
      usable,
      functools.partial(_encode_records, config=config),
      process_index=process_index,
      process_count=process_count,
  )


def eval_batches(config, *, process_index=None, process_count=None):
  """This host's test batches: right-padded prompts and the answers."""
  process_index, process_count = input_pipeline.resolve_process(
      process_index, process_count
  )
  batch_size = input_pipeline.per_host_batch_size(
      config.eval_batch_size, process_count
  )
  source, usable = _usable(config, "test")
  usable, skipped = input_pipeline.first_examples(
      usable, config.eval_examples, len(source)
  )
  for records, _ in input_pipeline.host_eval_records(
      source,
      usable,
      global_batch_size=config.eval_batch_size,
      process_index=process_index,
      process_count=process_count,
  ):
    pairs = [input_pipeline.decode_record(r) for r in records]
    padding = batch_size - len(pairs)
    questions = [q for q, _ in pairs] + [""] * padding
    answers = [a for _, a in pairs] + [""] * padding
    prompts, lengths = encode_prompts(config, questions)
    yield {
        "prompts": prompts,
        "prompt_lengths": lengths,
        "questions": questions,
        "answers": answers,
        "valid": np.arange(batch_size) < len(pairs),
        "test_examples": len(source),
        "skipped_examples": skipped,
    }
