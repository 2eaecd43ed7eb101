"""Evaluation by greedy decoding, scored by the task (exact match and more)."""

import functools

from absl import logging
from flax import nnx
import jax
from jax.experimental import multihost_utils
import numpy as np

from train import decoding
from train import tokenizer


def _sum_over_hosts(sums: dict) -> dict:
  """Every host's metric sums added, in float64.

  `multihost_utils.process_allgather` puts its input on a device, where a
  float64 becomes a float32 unless x64 is on (an error sum of 1e39, one
  39-digit prediction of tokens of 1-3 digits, became inf): the float64
  bits travel as uint32 pairs instead, and the sum is NumPy's.
  """
  if jax.process_count() == 1:
    return sums
  flat, tree = jax.tree.flatten(sums)
  values = [np.asarray(x, np.float64) for x in flat]
  bits = np.concatenate([v.ravel() for v in values]).view(np.uint32)
  gathered = np.asarray(multihost_utils.process_allgather(bits), np.uint32)
  total = gathered.reshape(jax.process_count(), -1).view(np.float64).sum(0)
  ends = np.cumsum([v.size for v in values])[:-1]
  return jax.tree.unflatten(
      tree,
      [part.reshape(v.shape) for part, v in zip(np.split(total, ends), values)],
  )


def answer_tokens(task, config) -> int:
  """The task's bound on an answer's tokens (its EOS not counted)."""
  if hasattr(task, "answer_tokens"):
    return task.answer_tokens(config)
  return config.max_answer_len


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
def _decode(
    model, prompts, prompt_lengths, max_new_tokens, eos_id, pad_id, images
):
  args = (prompts, prompt_lengths, max_new_tokens, eos_id, pad_id, images)
  if hasattr(model, "greedy_decode"):  # a pretrained model's own decoding
    return model.greedy_decode(*args)
  return decoding.greedy_decode(model, *args)


class _CharCodec:
  """Decoding with the character tokenizer of `train.tokenizer`."""

  eos_id = tokenizer.EOS_ID
  pad_id = tokenizer.PAD_ID
  # An answer holding PAD, BOS or SEP is not the answer without them.
  decode = staticmethod(functools.partial(tokenizer.decode, strict=True))


def evaluate(
    model, config, to_global, task, *, num_samples: int = 0, stop=None
):
  """Greedy-decodes the task's test split.

  Args:
    model: the Transformer (switched to eval mode and back).
    config: the experiment config (data and lengths).
    to_global: places a host-local batch array on the mesh.
    task: the task module (`train.tasks`), which builds and scores batches.
    num_samples: how many (question, answer, prediction) triples to return.
    stop: called before each batch (on every host at once: it may be a
      collective); a true answer abandons the evaluation.

  Returns:
    (metrics, samples, predictions): the task's summary over all hosts
    (``num_examples`` scored, and ``test_examples`` in the test split), up
    to ``num_samples`` triples, and this host's ``(index, answer,
    prediction)`` for every example it scored (index -1 if the task gives
    none); None if ``stop`` abandoned it. Where fewer examples were scored
    than the test split holds (less ``config.eval_examples``, a deliberate
    cut), the task skipped some (too long for ``max_question_len`` or
    ``max_answer_len``) and a warning says how many.
  """
  model.eval()
  codec = task.codec(config) if hasattr(task, "codec") else _CharCodec()
  sums, samples, predictions_out = None, [], []
  test_examples, skipped = None, 0
  for batch in task.eval_batches(config):
    test_examples = batch.get("test_examples", test_examples)
    skipped = batch.get("skipped_examples", skipped)
    if stop is not None and stop():
      model.train()
      return None
    images = batch.get("images")
    outputs = _decode(
        model,
        to_global(batch["prompts"]),
        to_global(batch["prompt_lengths"]),
        answer_tokens(task, config) + 1,
        tuple(getattr(codec, "end_ids", None) or (codec.eos_id,)),
        codec.pad_id,
        None if images is None else to_global(images),
    )
    rows = host_rows(outputs)
    valid = batch["valid"]
    indices = batch.get("indices", [-1] * len(valid))
    predictions = [codec.decode(row) for row, ok in zip(rows, valid) if ok]
    answers = [a for a, ok in zip(batch["answers"], valid) if ok]
    questions = [q for q, ok in zip(batch["questions"], valid) if ok]
    batch_sums = task.score_answers(predictions, answers, config)
    sums = (
        batch_sums if sums is None else jax.tree.map(np.add, sums, batch_sums)
    )
    samples += list(zip(questions, answers, predictions))[
        : max(0, num_samples - len(samples))
    ]
    predictions_out += list(
        zip([i for i, ok in zip(indices, valid) if ok], answers, predictions)
    )
  model.train()
  if sums is None:  # every test example skipped: nothing was decoded
    logging.warning(
        "evaluation scored no test example: every one was skipped (too long"
        " for max_question_len=%s / max_answer_len=%s, or eval_examples).",
        config.get("max_question_len"),
        config.get("max_answer_len"),
    )
    sums = task.score_answers([], [], config)
  metrics = task.summarize(_sum_over_hosts(sums))
  if test_examples is not None:
    metrics["test_examples"] = int(test_examples)
    _warn_if_dropped(metrics, skipped, config)
  return metrics, samples, predictions_out


def _warn_if_dropped(metrics, skipped, config) -> None:
  """A warning if the task skipped ``skipped`` test examples as too long."""
  if not skipped:
    return
  limit = config.get("eval_examples", 0)
  logging.warning(
      "evaluation scored %d of the %d test examples%s: %d were skipped as "
      "too long for max_question_len=%s / max_answer_len=%s (or the "
      "prompt length); its metrics are of the rest only.",
      metrics["num_examples"],
      metrics["test_examples"],
      f" (eval_examples={limit}: the first that fit, at most {limit})"
      if limit
      else "",
      skipped,
      config.get("max_question_len"),
      config.get("max_answer_len"),
  )
