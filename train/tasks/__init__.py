"""Tasks: everything the trainer needs to know about a data set.

The trainer (train/train.py) never names a task; it looks one up by
``config.task`` and calls only these module-level names:

* ``NAME``: the TFDS dataset name, e.g. 'clock_time'.
* ``prepare(data_dir, train_size, test_size, seed=0) -> str``: generates the
  data locally into a TFDS array_record dataset (nothing is downloaded);
  a task with ``render_stream`` takes ``train_size=0`` (the test split
  alone).
* ``dataset_config_name(train_size, test_size, seed) -> str``.
* ``check_config(config)`` and ``check_data(config)``: raise ValueError or
  FileNotFoundError, with a message that says what to do.
* ``model_fields(config) -> dict``: `models.model_config` fields the task
  fixes (vocab_size, max_len, and image_size for an image prefix).
* ``train_iterator(config, *, process_index=None, process_count=None)``: a
  checkpointable grain iterator over this host's rows of each global batch,
  dicts with ``inputs``, ``targets``, ``loss_mask``, ``digit_mask`` [B, L]
  (see `train.input_pipeline`) and, for image tasks, ``images`` [B, S, S]
  (grayscale) or [B, S, S, C].
* ``eval_batches(config, ...)``: this host's test batches, dicts with
  ``prompts`` [B, P], ``prompt_lengths`` [B], ``answers``, ``questions``,
  ``valid`` [B], ``test_examples`` (the test split's size, examples the
  task skips included: the evaluation says how many it scored of how many)
  and optionally ``images`` and ``indices``.
* ``score_answers(predictions, answers, config) -> dict`` of sums that hosts
  add, ``summarize(sums) -> dict`` of metrics (``num_examples``: how many
  were scored), ``headline(metrics) -> str`` (`scored` says how many).

Optional hook, for tasks that render their data (clock_time, grounding*):

* ``render_stream(rngs) -> list[dict]``: one train record (``image``,
  ``answer`` and ``question`` where the task has one) from each NumPy
  generator; with ``config.train_stream`` the task's ``train_iterator`` is
  a `train.streams.StreamIterator` over them (a task without this hook
  refuses ``train_stream``).

Optional hooks, for tasks that bring their own model (arithmetic_mix_llm):

* ``make_mesh(config)``: the device mesh (default ``('data', 'fsdp')``).
* ``vocab_size(config)``: the model's logits width, known before the model
  is built (default: ``model_fields(config)["vocab_size"]``).
* ``create_model(config, mesh)``: the model, with ``__call__(tokens,
  images)``, ``hidden_states``, ``unembedding``, ``config.vocab_size``,
  ``digit_token_ids``, ``decimal_point_token_id`` (or None) and
  ``greedy_decode`` (default: `train.models`, decoded by
  `train.decoding.greedy_decode`).
* ``digit_token_ids(config)``: for a `train.models` model, the ids its
  losses score (a `ntil_jax.NumberTokens` for numbers in tokens of 1-3
  digits), or None for the digits 0..9 (arithmetic_mix's chunk mode).
* ``codec(config)``: ``eos_id``, ``pad_id`` and ``decode(ids) -> str`` for
  evaluation, and optionally ``end_ids``, every token that ends a greedy
  decoding (default: ``[eos_id]``; `train.tokenizer` is the default codec).
* ``answer_tokens(config)``: the most tokens of an answer, its EOS not
  counted (default: ``config.max_answer_len``); evaluation decodes one more.

A new task is a module here, an entry in `TASKS` and a config.
"""

import importlib

TASKS = {
    "arithmetic_mix": "train.tasks.arithmetic_mix",
    "arithmetic_mix_llm": "train.tasks.arithmetic_mix_llm",
    "clock_time": "train.tasks.clock_time",
    "grounding": "train.tasks.grounding",
    "grounding_multi": "train.tasks.grounding_multi",
    "grounding_single": "train.tasks.grounding_single",
}


def scored(metrics: dict) -> str:
  """How many examples an evaluation scored: ``'4 of 8'``, of the test
  split's ``test_examples`` where the metrics hold it, else ``'4'``."""
  count = metrics["num_examples"]
  total = metrics.get("test_examples")
  return f"{count}" if total is None else f"{count} of {total}"


def get(name: str):
  """The task module called ``name``; ValueError naming the known ones."""
  if name not in TASKS:
    raise ValueError(
        f"unknown task {name!r}; use one of " f"{', '.join(sorted(TASKS))}."
    )
  return importlib.import_module(TASKS[name])
