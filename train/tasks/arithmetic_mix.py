"""arithmetic_mix: mathematics_dataset arithmetic__mixed (NTIL paper, Table 3).

The task interface (see train/tasks/__init__.py) over the generation in
`train.arithmetic_data` and the text pipeline in `train.input_pipeline`: a
question in, its exact answer (``-8/3``, ``12``) out, scored by exact match
and by the numeric error of answers that parse.
"""

from fractions import Fraction
import math
import re

import numpy as np

from train import arithmetic_data
from train import input_pipeline
from train import tasks
from train import tokenizer

NAME = input_pipeline.DATASET_NAME
prepare = arithmetic_data.prepare
dataset_config_name = arithmetic_data.config_name


def check_config(config) -> None:
  """Nothing beyond the common checks."""
  del config


def check_data(config) -> None:
  """Raises ValueError or FileNotFoundError unless the data can be read."""
  input_pipeline.find_dataset_dir(
      config.data_dir, config_name=config.dataset_config or None
  )


def _chunks(config) -> bool:
  return bool(config.get("digit_chunks", False))


def model_fields(config) -> dict:
  """The `models.model_config` fields this task fixes."""
  return dict(
      vocab_size=(
          tokenizer.CHUNK_VOCAB_SIZE
          if _chunks(config)
          else tokenizer.VOCAB_SIZE
      ),
      max_len=input_pipeline.sequence_length(
          config.max_question_len, config.max_answer_len
      )
      + 1,
  )


def train_iterator(config, *, process_index=None, process_count=None):
  """Checkpointable iterator over this host's train batches (shuffled)."""
  return input_pipeline.train_iterator(
      config.data_dir,
      global_batch_size=config.batch_size,
      seed=config.seed,
      config_name=config.dataset_config or None,
      max_question_len=config.max_question_len,
      max_answer_len=config.max_answer_len,
      worker_count=config.worker_count,
      process_index=process_index,
      process_count=process_count,
      chunks=_chunks(config),
  )


def eval_batches(config, *, process_index=None, process_count=None):
  """This host's test batches: ``BOS question SEP`` prompts and answers."""
  return input_pipeline.eval_batches(
      config.data_dir,
      global_batch_size=config.eval_batch_size,
      config_name=config.dataset_config or None,
      max_question_len=config.max_question_len,
      max_answer_len=config.max_answer_len,
      max_examples=config.eval_examples,
      process_index=process_index,
      process_count=process_count,
      chunks=_chunks(config),
  )


def digit_token_ids(config):
  """With ``config.digit_chunks``, the chunk vocabulary's number tokens
  (`tokenizer.number_tokens`), so that every loss scores the numbers its
  tokens of 1-3 digits write; else None (the digits 0..9)."""
  return tokenizer.number_tokens() if _chunks(config) else None


# The answers' grammar: an integer, a decimal or a fraction of integers.
# Not `Fraction`'s own (it reads exponents: a prediction of "1e400" would
# overflow the scorer, and "1e1000000000" would keep it busy for minutes),
# in ASCII digits only (``\d`` reads "４２" and "٤٢" as 42 too, as Fraction).
_NUMBER = re.compile(r"[-+]?(?:\d+/\d+|\d+(?:\.\d*)?|\.\d+)", re.ASCII)


def parse_number(text: str):
  """The value of an answer such as ``-8/3``, ``12`` or ``0.5``; else None."""
  text = text.strip()
  if not _NUMBER.fullmatch(text):
    return None
  try:
    return Fraction(text)
  except ZeroDivisionError:  # "3/0"
    return None


def absolute_error(predicted: Fraction, true: Fraction) -> float:
  """``|predicted - true|`` as a float; ``inf`` past float64's range (a
  prediction of 309 or more digits)."""
  try:
    return float(abs(predicted - true))
  except OverflowError:
    return math.inf


def log10_error(predicted: Fraction, true: Fraction) -> float:
  """``log10(1 + |predicted - true|)``, finite for any length: the log of
  the exact fraction's numerator and denominator (integers of any size)."""
  error = 1 + abs(predicted - true)
  return math.log10(error.numerator) - math.log10(error.denominator)


def within_1_percent(predicted: Fraction, true: Fraction) -> bool:
  """``|predicted - true| <= |true| / 100``, exactly: an answer exactly 1%
  off counts (in floats, 0.707 against 0.7 did not)."""
  return abs(predicted - true) * 100 <= abs(true)


def score_answers(predictions, answers, config) -> dict:
  """Sums over one host's examples, as float64 arrays that hosts can add.

  ``by_length[k]`` and ``correct_by_length[k]`` count answers of k characters.
  """
  max_answer_len = config.max_answer_len
  sums = dict(
      count=0.0,
      correct=0.0,
      parsed=0.0,
      abs_error=0.0,
      log_abs_error=0.0,
      within_1_percent=0.0,
      by_length=np.zeros(max_answer_len + 1),
      correct_by_length=np.zeros(max_answer_len + 1),
  )
  for predicted, answer in zip(predictions, answers):
    correct = predicted.strip() == answer.strip()
    sums["count"] += 1
    sums["correct"] += correct
    length = min(len(answer), max_answer_len)
    sums["by_length"][length] += 1
    sums["correct_by_length"][length] += correct
    predicted_value, true_value = parse_number(predicted), parse_number(answer)
    if predicted_value is not None and true_value is not None:
      sums["parsed"] += 1
      sums["abs_error"] += absolute_error(predicted_value, true_value)
      sums["log_abs_error"] += log10_error(predicted_value, true_value)
      sums["within_1_percent"] += within_1_percent(predicted_value, true_value)
  return sums


def summarize(sums: dict) -> dict:
  """Rates and means from (all hosts') summed scores.

  The mean errors are over the answers that parse, NaN where none does (0
  would read as a perfect score).
  """
  count = max(sums["count"], 1.0)
  parsed = sums["parsed"] if sums["parsed"] else float("nan")
  by_length = {
      int(k): float(sums["correct_by_length"][k] / sums["by_length"][k])
      for k in np.flatnonzero(sums["by_length"])
  }
  return dict(
      exact_match=float(sums["correct"] / count),
      parsed_rate=float(sums["parsed"] / count),
      mean_abs_error=float(sums["abs_error"] / parsed),
      mean_log10_abs_error=float(sums["log_abs_error"] / parsed),
      # Of all answers: the prediction parses and is within 1% of it.
      within_1_percent=float(sums["within_1_percent"] / count),
      num_examples=int(sums["count"]),
      exact_match_by_answer_length=by_length,
      examples_by_answer_length={
          int(k): int(sums["by_length"][k])
          for k in np.flatnonzero(sums["by_length"])
      },
  )


def headline(metrics: dict) -> str:
  """One line for the log."""
  return (
      f"exact match {metrics['exact_match']:.4f} on "
      f"{tasks.scored(metrics)} problems"
  )
