"""Exact-match evaluation by greedy decoding (the NTIL paper's metric)."""

import functools
from fractions import Fraction
import math

from flax import nnx
import jax
from jax.experimental import multihost_utils
import numpy as np

from train import input_pipeline
from train import models
from train import tokenizer


def parse_number(text: str):
  """The value of an answer such as ``-8/3``, ``12`` or ``0.5``; else None."""
  try:
    return Fraction(text.strip())
  except (ValueError, ZeroDivisionError):
    return None


def score_answers(predictions, answers, max_answer_len: int) -> dict:
  """Sums over one host's examples, as float64 arrays that hosts can add.

  ``by_length[k]`` and ``correct_by_length[k]`` count answers of k characters.
  """
  sums = dict(count=0.0, correct=0.0, parsed=0.0, abs_error=0.0,
              log_abs_error=0.0,
              by_length=np.zeros(max_answer_len + 1),
              correct_by_length=np.zeros(max_answer_len + 1))
  for predicted, answer in zip(predictions, answers):
    correct = predicted.strip() == answer.strip()
    sums["count"] += 1
    sums["correct"] += correct
    length = min(len(answer), max_answer_len)
    sums["by_length"][length] += 1
    sums["correct_by_length"][length] += correct
    predicted_value, true_value = parse_number(predicted), parse_number(answer)
    if predicted_value is not None and true_value is not None:
      error = abs(float(predicted_value - true_value))
      sums["parsed"] += 1
      sums["abs_error"] += error
      sums["log_abs_error"] += math.log10(1.0 + error)
  return sums


def summarize(sums: dict) -> dict:
  """Rates and means from (all hosts') summed scores."""
  count, parsed = max(sums["count"], 1.0), max(sums["parsed"], 1.0)
  by_length = {
      int(k): float(sums["correct_by_length"][k] / sums["by_length"][k])
      for k in np.flatnonzero(sums["by_length"])}
  return dict(
      exact_match=float(sums["correct"] / count),
      parsed_rate=float(sums["parsed"] / count),
      mean_abs_error=float(sums["abs_error"] / parsed),
      mean_log10_abs_error=float(sums["log_abs_error"] / parsed),
      num_examples=int(sums["count"]),
      exact_match_by_answer_length=by_length,
      examples_by_answer_length={int(k): int(sums["by_length"][k])
                                 for k in np.flatnonzero(sums["by_length"])},
  )


def _sum_over_hosts(sums: dict) -> dict:
  if jax.process_count() == 1:
    return sums
  flat, tree = jax.tree.flatten(sums)
  gathered = multihost_utils.process_allgather(
      [np.asarray(x, np.float64) for x in flat])
  return jax.tree.unflatten(tree, [np.asarray(g).sum(0) for g in gathered])


def host_rows(array: jax.Array) -> np.ndarray:
  """This host's rows of a batch-sharded global array, in order."""
  if jax.process_count() == 1:
    return np.asarray(array)
  shards = sorted(array.addressable_shards, key=lambda s: s.index[0].start)
  rows, seen = [], set()
  for shard in shards:  # replicas over other axes hold the same rows
    if shard.index[0].start not in seen:
      seen.add(shard.index[0].start)
      rows.append(np.asarray(shard.data))
  return np.concatenate(rows)


@functools.partial(nnx.jit, static_argnums=(3, 4, 5))
def _decode(model, prompts, prompt_lengths, max_new_tokens, eos_id, pad_id):
  return models.greedy_decode(model, prompts, prompt_lengths, max_new_tokens,
                              eos_id, pad_id)


def evaluate(model, config, to_global, *, num_samples: int = 0):
  """Greedy-decodes the test split; returns (metrics, sample predictions).

  Args:
    model: the Transformer (switched to eval mode and back).
    config: the experiment config (data and lengths).
    to_global: places a host-local batch array on the mesh.
    num_samples: how many (question, answer, prediction) triples to return.
  """
  model.eval()
  sums, samples = None, []
  batches = input_pipeline.eval_batches(
      config.data_dir, global_batch_size=config.eval_batch_size,
      config_name=config.dataset_config or None,
      max_question_len=config.max_question_len,
      max_answer_len=config.max_answer_len,
      max_examples=config.eval_examples)
  for batch in batches:
    outputs = _decode(model, to_global(batch["prompts"]),
                      to_global(batch["prompt_lengths"]),
                      config.max_answer_len + 1, tokenizer.EOS_ID,
                      tokenizer.PAD_ID)
    rows = host_rows(outputs)
    valid = batch["valid"]
    predictions = [tokenizer.decode(row) for row, ok in zip(rows, valid) if ok]
    answers = [a for a, ok in zip(batch["answers"], valid) if ok]
    questions = [q for q, ok in zip(batch["questions"], valid) if ok]
    batch_sums = score_answers(predictions, answers, config.max_answer_len)
    sums = batch_sums if sums is None else jax.tree.map(np.add, sums,
                                                        batch_sums)
    samples += list(zip(questions, answers, predictions))[
        :max(0, num_samples - len(samples))]
  model.train()
  return summarize(_sum_over_hosts(sums)), samples
