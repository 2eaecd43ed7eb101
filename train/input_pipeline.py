"""Input pipeline for the arithmetic_mix trainer: TFDS array_record + grain.

Reads the dataset written by ``python -m train.prepare_data`` with
``tfds.builder_from_directory(...).as_data_source`` (no TensorFlow needed) and
turns it into fixed-shape batches of NumPy arrays.

Each example is the token sequence ``BOS question SEP answer EOS`` padded with
PAD to ``L + 1`` tokens, where ``L = sequence_length(max_question_len,
max_answer_len)``. A training batch (per host, ``B = global_batch_size /
process_count``) is a dict:

* ``inputs``     int32 [B, L]: the sequence without its last token;
* ``targets``    int32 [B, L]: the sequence without its first token, i.e. the
  next-token label of each input position;
* ``loss_mask``  bool  [B, L]: True exactly where the target is an answer token
  or the EOS after it;
* ``digit_mask`` bool  [B, L]: True exactly where the target is a digit of the
  answer (every digit run of e.g. ``-8/3`` is a number).

Checkpointing: `train_iterator` returns a ``grain.DatasetIterator``. Its
``get_state()`` / ``set_state()`` are exact (a JSON-able dict; with the default
reading threads it is the batch index, ``{'next_index': k}``), and orbax saves
it with grain's own handler, next to the train state::

  manager.save(step, args=ocp.args.Composite(
      state=ocp.args.StandardSave(state),
      train_iter=grain.checkpoint.CheckpointSave(train_iter)))
  manager.restore(step, args=ocp.args.Composite(
      state=ocp.args.StandardRestore(abstract_state),
      train_iter=grain.checkpoint.CheckpointRestore(train_iter)))

grain's handler writes one JSON file per host (``process_{i}-of-{n}.json``).

Evaluation: `eval_batches` yields the test split in order, with prompts
``BOS question SEP`` right-padded with PAD and their lengths, for greedy
decoding that feeds the prompt token while ``position < prompt_length`` and the
model's prediction after it.
"""

import functools
import os
import signal
import threading
import time
from collections.abc import Iterator, Mapping, Sequence

import grain
import jax
import numpy as np
import tensorflow_datasets as tfds
from absl import flags
from absl import logging
from etils import epath

from train import tokenizer

DATASET_NAME = "arithmetic_mix"
DATASET_VERSION = "1.0.0"
# mathematics_dataset's own limits (generate_settings), which prepare_data applies.
MAX_QUESTION_LEN = 160
MAX_ANSWER_LEN = 30
SPLITS = ("train", "test")


def prepare_command(
    data_dir: str | None, dataset_name: str = DATASET_NAME
) -> str:
  """Returns the command that writes the dataset, for error messages."""
  task = "" if dataset_name == DATASET_NAME else f" --task={dataset_name}"
  return f"python -m train.prepare_data{task} --data_dir={data_dir or 'DATA_DIR'} --train_size=N --test_size=M"


def sequence_length(
    max_question_len: int = MAX_QUESTION_LEN,
    max_answer_len: int = MAX_ANSWER_LEN,
) -> int:
  """Returns L, the length of ``inputs`` and ``targets``.

  ``BOS question SEP answer EOS`` is at most ``max_question_len +
  max_answer_len + 3`` tokens; inputs and targets drop one token each.
  """
  if max_question_len <= 0 or max_answer_len <= 0:
    raise ValueError(
        f"max_question_len and max_answer_len must be positive, got {max_question_len} and"
        f" {max_answer_len}."
    )
  return max_question_len + max_answer_len + 2


def prompt_length(max_question_len: int = MAX_QUESTION_LEN) -> int:
  """Returns P, the padded length of ``BOS question SEP`` prompts."""
  if max_question_len <= 0:
    raise ValueError(
        f"max_question_len must be positive, got {max_question_len}."
    )
  return max_question_len + 2


def _encode_texts(
    texts: Sequence[str], max_len: int, what: str, chunks: bool = False
) -> tuple[np.ndarray, np.ndarray]:
  """Encodes several texts at once.

  Returns:
    Their ids concatenated, int32 [sum of lengths], and their lengths, int32 [len(texts)].

  Raises:
    ValueError: a text is longer than ``max_len`` or has a character outside the vocabulary.

  With ``chunks``, numbers are in tokens of 1-3 digits (`tokenizer.chunk_ids`);
  ``max_len`` still counts characters, a bound on the tokens.
  """
  lengths = np.array([len(text) for text in texts], dtype=np.int32)
  too_long = np.flatnonzero(lengths > max_len)
  if too_long.size:
    text = texts[too_long[0]]
    raise ValueError(
        f"{what} {text!r} has {len(text)} characters, more than max_{what}_len={max_len}."
    )
  try:
    ids = tokenizer.encode_array("".join(texts))
  except ValueError:
    for text in texts:
      tokenizer.encode_array(
          text
      )  # Raises naming the text that holds the character.
    raise
  if chunks:  # digits of two texts never join: each text starts anew
    starts = np.zeros(len(ids), bool)
    starts[(np.cumsum(lengths) - lengths)[lengths > 0]] = True
    ids, starts = tokenizer.chunk_ids(ids, starts)
    text = np.flatnonzero(lengths > 0)[np.cumsum(starts) - 1]  # each token's
    lengths = np.bincount(text, minlength=len(texts)).astype(np.int32)
  return ids, lengths


def _scatter_rows(
    out: np.ndarray,
    ids: np.ndarray,
    lengths: np.ndarray,
    first_columns: np.ndarray,
) -> None:
  """Writes the i-th run of ``ids`` (``lengths[i]`` long) into row i of ``out`` from column ``first_columns[i]``."""
  rows = np.repeat(np.arange(len(lengths)), lengths)
  run_starts = np.cumsum(lengths) - lengths
  columns = np.arange(len(ids)) - np.repeat(run_starts - first_columns, lengths)
  out[rows, columns] = ids


def encode_examples(
    questions: Sequence[str],
    answers: Sequence[str],
    *,
    max_question_len: int = MAX_QUESTION_LEN,
    max_answer_len: int = MAX_ANSWER_LEN,
    chunks: bool = False,
) -> dict[str, np.ndarray]:
  """Encodes (question, answer) pairs to a batch of ``inputs``, ``targets``, ``loss_mask``, ``digit_mask``.

  Each is of shape [B, L], ``B = len(questions)``, ``L =
  sequence_length(max_question_len, max_answer_len)``; see the module
  docstring for what they hold. Raises ValueError for a text longer than its
  maximum or with a character outside the vocabulary. With ``chunks``,
  numbers are in tokens of 1-3 digits and ``digit_mask`` marks every number
  token of the answer.
  """
  if len(questions) != len(answers) or not questions:
    raise ValueError(
        f"Need as many answers as questions, at least one; got {len(questions)} questions and"
        f" {len(answers)} answers."
    )
  question_ids, question_lens = _encode_texts(
      questions, max_question_len, "question", chunks
  )
  answer_ids, answer_lens = _encode_texts(
      answers, max_answer_len, "answer", chunks
  )
  width = sequence_length(max_question_len, max_answer_len) + 1
  rows = np.arange(len(questions))
  answer_starts = (
      question_lens + 2
  )  # Column of the first answer token: after BOS, question, SEP.
  answer_ends = answer_starts + answer_lens  # Column of the EOS.

  sequences = np.full((len(questions), width), tokenizer.PAD_ID, dtype=np.int32)
  sequences[:, 0] = tokenizer.BOS_ID
  _scatter_rows(
      sequences, question_ids, question_lens, np.ones_like(question_lens)
  )
  sequences[rows, question_lens + 1] = tokenizer.SEP_ID
  _scatter_rows(sequences, answer_ids, answer_lens, answer_starts)
  sequences[rows, answer_ends] = tokenizer.EOS_ID

  columns = np.arange(width)
  is_answer = (columns >= answer_starts[:, None]) & (
      columns < answer_ends[:, None]
  )
  is_answer_or_eos = is_answer | (columns == answer_ends[:, None])
  numbers = tokenizer.is_number if chunks else tokenizer.is_digit
  is_answer_digit = is_answer & numbers(sequences)
  return {
      "inputs": sequences[:, :-1],
      "targets": sequences[:, 1:],
      "loss_mask": is_answer_or_eos[:, 1:],
      "digit_mask": is_answer_digit[:, 1:],
  }


def encode_example(
    question: str,
    answer: str,
    *,
    max_question_len: int = MAX_QUESTION_LEN,
    max_answer_len: int = MAX_ANSWER_LEN,
) -> dict[str, np.ndarray]:
  """Encodes one (question, answer) pair: `encode_examples` with arrays of shape [L]."""
  batch = encode_examples(
      [question],
      [answer],
      max_question_len=max_question_len,
      max_answer_len=max_answer_len,
  )
  return {key: value[0] for key, value in batch.items()}


def encode_prompts(
    questions: Sequence[str],
    *,
    max_question_len: int = MAX_QUESTION_LEN,
    chunks: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
  """Encodes ``BOS question SEP`` prompts, right-padded with PAD.

  Returns:
    prompts: int32 [B, P], ``P = prompt_length(max_question_len)``.
    prompt_lengths: int32 [B], the unpadded lengths (question length + 2).
  """
  question_ids, question_lens = _encode_texts(
      questions, max_question_len, "question", chunks
  )
  prompts = np.full(
      (len(questions), prompt_length(max_question_len)),
      tokenizer.PAD_ID,
      dtype=np.int32,
  )
  prompts[:, 0] = tokenizer.BOS_ID
  _scatter_rows(
      prompts, question_ids, question_lens, np.ones_like(question_lens)
  )
  prompts[np.arange(len(questions)), question_lens + 1] = tokenizer.SEP_ID
  return prompts, question_lens + 2


def encode_prompt(
    question: str, *, max_question_len: int = MAX_QUESTION_LEN
) -> tuple[np.ndarray, int]:
  """Encodes one prompt: `encode_prompts` for a single question, as ([P], length)."""
  prompts, lengths = encode_prompts(
      [question], max_question_len=max_question_len
  )
  return prompts[0], int(lengths[0])


def decode_record(record: Mapping[str, bytes | str]) -> tuple[str, str]:
  """Returns (question, answer) of a TFDS record, whose Text features come back as bytes."""

  def as_str(value: bytes | str) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else value

  return as_str(record["question"]), as_str(record["answer"])


def _encode_records(
    records: Sequence[Mapping[str, bytes]],
    *,
    max_question_len: int,
    max_answer_len: int,
    chunks: bool = False,
) -> dict[str, np.ndarray]:
  """Encodes a batch of TFDS records with `encode_examples`."""
  questions, answers = zip(*(decode_record(record) for record in records))
  return encode_examples(
      questions,
      answers,
      max_question_len=max_question_len,
      max_answer_len=max_answer_len,
      chunks=chunks,
  )


def find_dataset_dir(
    data_dir: str | None,
    *,
    config_name: str | None = None,
    dataset_name: str = DATASET_NAME,
) -> epath.Path:
  """Returns ``data_dir/<dataset_name>/<config>/1.0.0``, the prepared dataset's directory.

  ``config_name`` (e.g. 'train100000_test1000_seed0') may be left out when
  ``data_dir`` holds a single prepared config.

  Raises:
    ValueError: ``data_dir`` is empty, or holds several configs and none was chosen.
    FileNotFoundError: ``data_dir`` or the dataset in it does not exist.
  """
  command = prepare_command(data_dir, dataset_name)
  if not data_dir:
    raise ValueError(
        f"data_dir is empty; create the dataset with `{prepare_command(None, dataset_name)}`."
    )
  root = epath.Path(data_dir)
  if root.exists() and not root.is_dir():
    raise FileNotFoundError(
        f"data_dir {data_dir} is a file, not a directory; create the dataset with `{command}`."
    )
  if not root.is_dir():
    raise FileNotFoundError(
        f"data_dir {data_dir} does not exist; create the dataset with `{command}`."
    )
  prepared = prepared_configs(data_dir, dataset_name)
  if config_name is not None:
    if config_name not in prepared:
      raise FileNotFoundError(
          f"No {dataset_name} config {config_name!r} in {data_dir} (found {sorted(prepared)});"
          f" create it with `{command}`."
      )
    return prepared[config_name]
  if not prepared:
    raise FileNotFoundError(
        f"No {dataset_name} dataset in {data_dir}; create it with `{command}`."
    )
  if len(prepared) > 1:
    raise ValueError(
        f"{data_dir} holds several {dataset_name} datasets {sorted(prepared)};"
        " name the one to read with --config.dataset_config=NAME (config_name)."
    )
  return next(iter(prepared.values()))


def prepared_configs(data_dir: str, dataset_name: str) -> dict:
  """``{config name: directory}`` of the datasets prepared in ``data_dir``.

  Empty where ``data_dir`` or its ``dataset_name`` folder does not exist.
  """
  return {
      info_file.parent.parent.name: info_file.parent
      for info_file in sorted(
          epath.Path(data_dir).glob(
              f"{dataset_name}/*/{DATASET_VERSION}/dataset_info.json"
          )
      )
  }


def load_split(
    data_dir: str,
    split: str,
    *,
    config_name: str | None = None,
    dataset_name: str = DATASET_NAME,
) -> Sequence[Mapping[str, bytes]]:
  """Returns a random-access data source over ``split`` of the prepared dataset.

  arithmetic_mix records are dicts with ``question`` and ``answer`` as UTF-8 bytes.
  """
  if split not in SPLITS:
    raise ValueError(f"split must be one of {SPLITS}, got {split!r}.")
  builder = tfds.builder_from_directory(
      find_dataset_dir(
          data_dir, config_name=config_name, dataset_name=dataset_name
      )
  )
  return builder.as_data_source(split=split)


def split_source(dataset_dir, split: str, *, prepare: str = ""):
  """A random-access data source over ``split`` of a prepared dataset.

  Raises:
    ValueError: the dataset has no such split (a train split of
      ``--train_size=0`` is not written); ``prepare`` says what to do.
  """
  builder = tfds.builder_from_directory(dataset_dir)
  if split not in builder.info.splits:
    raise ValueError(
        f"{dataset_dir} has no {split} split (it was prepared with "
        f"--{split}_size=0){'; ' + prepare if prepare else ''}."
    )
  return builder.as_data_source(split=split)


def fitting_indices(
    source,
    *,
    max_question_len: int,
    max_answer_len: int,
    chunk: int = 4096,
    questions_fit=None,
) -> np.ndarray:
  """Indices of the records whose question and answer fit the maximum lengths.

  Reads every record once (about 9k records/s); records that do not fit are
  skipped rather than truncated, which would change the problem.

  Args:
    source: the split's data source.
    max_question_len: the longest question kept, in characters.
    max_answer_len: the longest answer kept, in characters.
    chunk: records read at a time.
    questions_fit: optional ``list[str] -> bool array``, a further test of
      the questions that fit in characters (e.g. their length in tokens).
  """
  keep = []
  for start in range(0, len(source), chunk):
    records = source.__getitems__(
        list(range(start, min(start + chunk, len(source))))
    )
    indices, questions = [], []
    for offset, record in enumerate(records):
      question, answer = decode_record(record)
      if len(question) <= max_question_len and len(answer) <= max_answer_len:
        indices.append(start + offset)
        questions.append(question)
    if questions_fit is not None and indices:
      fits = np.asarray(questions_fit(questions), dtype=bool)
      indices = [i for i, fit in zip(indices, fits) if fit]
    keep += indices
  return np.asarray(keep, dtype=np.int64)


def resolve_process(
    process_index: int | None, process_count: int | None
) -> tuple[int, int]:
  """Returns (process_index, process_count), from JAX where not given, after checking them."""
  process_index = (
      jax.process_index() if process_index is None else process_index
  )
  process_count = (
      jax.process_count() if process_count is None else process_count
  )
  if process_count <= 0 or not 0 <= process_index < process_count:
    raise ValueError(
        f"Need 0 <= process_index < process_count, got process_index={process_index},"
        f" process_count={process_count}."
    )
  return process_index, process_count


def per_host_batch_size(global_batch_size: int, process_count: int) -> int:
  """Returns the batch size of one host: the global batch size split evenly across hosts."""
  if global_batch_size <= 0 or global_batch_size % process_count:
    raise ValueError(
        f"global_batch_size must be a positive multiple of process_count={process_count},"
        f" got {global_batch_size}."
    )
  return global_batch_size // process_count


def train_dataset(
    data_dir: str,
    *,
    global_batch_size: int,
    seed: int = 0,
    config_name: str | None = None,
    max_question_len: int = MAX_QUESTION_LEN,
    max_answer_len: int = MAX_ANSWER_LEN,
    process_index: int | None = None,
    process_count: int | None = None,
    chunks: bool = False,
) -> grain.MapDataset:
  """Returns the infinite dataset of this host's training batches.

  The train split is shuffled with ``seed`` (a new order every epoch),
  repeated forever and cut into global batches of ``global_batch_size``
  examples (which run across epoch boundaries, so nothing is dropped). Host
  ``i`` of ``n`` reads only rows ``[i*B, (i+1)*B)`` of each global batch,
  ``B = global_batch_size // n``, and encodes them with `encode_examples`.
  So the global batch, assembled across hosts in process order, holds the
  same examples whatever the number of hosts: a 2-process run sees exactly
  the data of a 1-process run.
  """
  process_index, process_count = resolve_process(process_index, process_count)
  per_host_batch_size(
      global_batch_size, process_count
  )  # Checks it before reading.
  source = load_split(data_dir, "train", config_name=config_name)
  usable = fitting_indices(
      source, max_question_len=max_question_len, max_answer_len=max_answer_len
  )
  if len(usable) < len(source):
    logging.info(
        "Skipping %d of %d train examples longer than max_question_len=%d / max_answer_len=%d.",
        len(source) - len(usable),
        len(source),
        max_question_len,
        max_answer_len,
    )
  encode = functools.partial(
      _encode_records,
      max_question_len=max_question_len,
      max_answer_len=max_answer_len,
      chunks=chunks,
  )
  return host_batches(
      source,
      usable,
      encode,
      global_batch_size=global_batch_size,
      seed=seed,
      process_index=process_index,
      process_count=process_count,
  )


def host_batches(
    source,
    usable: np.ndarray,
    encode,
    *,
    global_batch_size: int,
    seed: int,
    process_index: int,
    process_count: int,
) -> grain.MapDataset:
  """This host's rows of shuffled global batches of ``source[usable]``, each encoded by ``encode``.

  The records are shuffled with ``seed`` (a new order every epoch), repeated
  forever and cut into global batches of ``global_batch_size`` (which run
  across epoch boundaries). Host ``i`` of ``n`` reads only rows ``[i*B,
  (i+1)*B)`` of each, ``B = global_batch_size // n``, and ``encode`` turns
  that list of records into a dict of arrays.
  """
  batch_size = per_host_batch_size(global_batch_size, process_count)
  if len(usable) < global_batch_size:
    raise ValueError(
        f"The train split has {len(usable)} usable examples, fewer than global_batch_size={global_batch_size}."
    )
  first_row = process_index * batch_size
  return (
      grain.MapDataset.source(usable)
      .shuffle(seed=seed)
      .repeat()  # Reseeds the shuffle each epoch.
      .batch(global_batch_size, drop_remainder=True, batch_fn=list)
      .map(
          lambda indices: source.__getitems__(
              [int(i) for i in indices[first_row : first_row + batch_size]]
          )
      )
      .map(encode)  # A whole batch at once: no Python loop over tokens.
  )


def check_worker_count(worker_count: int) -> None:
  """Raises ValueError for a worker count grain cannot use here."""
  if worker_count < 0:
    raise ValueError(f"worker_count must be >= 0, got {worker_count}.")
  if worker_count and not flags.FLAGS.is_parsed():
    raise ValueError(
        "worker_count > 0 needs absl flags parsed: run under app.run or call flags.FLAGS(argv)."
    )


def iterate(
    dataset: grain.MapDataset,
    *,
    read_options: grain.ReadOptions | None = None,
    worker_count: int = 0,
):
  """A checkpointable iterator over ``dataset``, read ahead by threads or ``worker_count`` processes."""
  check_worker_count(worker_count)
  read_options = read_options or grain.ReadOptions(
      num_threads=4, prefetch_buffer_size=8
  )
  batches = dataset.to_iter_dataset(read_options)
  if worker_count:
    batches = batches.mp_prefetch(
        grain.MultiprocessingOptions(num_workers=worker_count),
        worker_init_fn=functools.partial(exit_with_parent, parent=os.getpid()),
    )
  return iter(batches)


def exit_with_parent(
    worker_index: int, worker_count: int, *, parent: int
) -> None:
  """Ends a grain worker process once its parent is no longer ``parent``.

  grain's workers outlive a trainer killed outright (SIGKILL, the
  out-of-memory killer), each idle and holding its memory; this watch, run
  in each worker as it starts, exits it within a second of the trainer.
  ``parent`` is the trainer's pid, taken in the trainer: a worker still
  starting when the trainer dies sees its new parent from the first and
  exits at once (read in the worker, that new parent would be watched).
  Ctrl-C, sent to the whole process group, is the trainer's to handle (it
  saves, then stops): each worker ignores it, where each printed a
  KeyboardInterrupt traceback of its own.
  """
  del worker_index, worker_count
  if threading.current_thread() is threading.main_thread():
    signal.signal(signal.SIGINT, signal.SIG_IGN)

  def watch():
    while os.getppid() == parent:
      time.sleep(0.5)
    os._exit(1)  # pylint: disable=protected-access

  threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


def train_iterator(
    data_dir: str,
    *,
    global_batch_size: int,
    seed: int = 0,
    config_name: str | None = None,
    max_question_len: int = MAX_QUESTION_LEN,
    max_answer_len: int = MAX_ANSWER_LEN,
    process_index: int | None = None,
    process_count: int | None = None,
    read_options: grain.ReadOptions | None = None,
    worker_count: int = 0,
    chunks: bool = False,
) -> grain.DatasetIterator:
  """Returns a checkpointable iterator over `train_dataset`'s batches.

  Batches are read ahead by ``read_options`` threads (default 4 threads, 8
  batches). Reading is GIL-bound (about 9k examples/s on 2 cores), so
  ``worker_count > 0`` reads in that many processes instead (grain
  ``mp_prefetch``): the same batches in the same order, but it needs absl
  flags parsed (as under ``app.run``), its iterator should be ``close()``d,
  and its state only restores into an iterator with the same ``worker_count``.

  ``get_state()`` / ``set_state()`` restore the position exactly; save it with
  ``grain.checkpoint.CheckpointSave(iterator)`` in orbax.
  """
  check_worker_count(worker_count)  # Before reading any data.
  dataset = train_dataset(
      data_dir,
      global_batch_size=global_batch_size,
      seed=seed,
      config_name=config_name,
      max_question_len=max_question_len,
      max_answer_len=max_answer_len,
      process_index=process_index,
      process_count=process_count,
      chunks=chunks,
  )
  return iterate(dataset, read_options=read_options, worker_count=worker_count)


def task_train_iterator(
    config, source, usable, encode, *, process_index=None, process_count=None
):
  """A task's train iterator over ``source[usable]``, encoded by ``encode``.

  `host_batches` with ``config.batch_size`` and ``config.seed``, read ahead
  by `iterate` with ``config.worker_count``.
  """
  process_index, process_count = resolve_process(process_index, process_count)
  check_worker_count(config.worker_count)
  dataset = host_batches(
      source,
      usable,
      encode,
      global_batch_size=config.batch_size,
      seed=config.seed,
      process_index=process_index,
      process_count=process_count,
  )
  return iterate(dataset, worker_count=config.worker_count)


def num_eval_batches(
    num_examples: int, global_batch_size: int, process_count: int
) -> int:
  """Returns how many batches each host yields to cover ``num_examples`` (the same on every host)."""
  batch_size = per_host_batch_size(global_batch_size, process_count)
  examples_per_host = -(-num_examples // process_count)
  return -(-examples_per_host // batch_size)


def first_examples(usable: np.ndarray, max_examples: int, total: int):
  """``(indices, skipped)``: the first ``max_examples`` of ``usable`` (every
  one for 0), and how many of the split's ``total`` examples were passed
  over to reach them, as too long: those before the last index taken, or
  every one that does not fit when all the usable ones are taken."""
  if max_examples and len(usable) > max_examples:
    usable = usable[:max_examples]
    return usable, int(usable[-1]) + 1 - max_examples
  return usable, total - len(usable)


def eval_batches(
    data_dir: str,
    *,
    global_batch_size: int,
    split: str = "test",
    config_name: str | None = None,
    max_question_len: int = MAX_QUESTION_LEN,
    max_answer_len: int = MAX_ANSWER_LEN,
    max_examples: int = 0,
    process_index: int | None = None,
    process_count: int | None = None,
    chunks: bool = False,
) -> Iterator[dict]:
  """Yields this host's fixed-shape evaluation batches of ``split``, in order, once.

  Examples whose question or answer exceed the maximum lengths are skipped
  (`train.evaluate.evaluate` warns, naming how many it scored of how many),
  and only the first ``max_examples`` are used if it is non-zero. This host takes examples ``process_index::process_count``; every host
  yields `num_eval_batches` batches of ``B = global_batch_size //
  process_count`` rows, the missing rows of the last ones padded. Each batch:

  * ``prompts``        int32 [B, P]: ``BOS question SEP`` right-padded with PAD,
    ``P = prompt_length(max_question_len)``;
  * ``prompt_lengths`` int32 [B]: unpadded prompt lengths;
  * ``questions``, ``answers``: lists of B str (reference answers);
  * ``valid``          bool  [B]: False on padding rows, whose prompt is
    ``BOS SEP`` and whose question and answer are '';
  * ``test_examples``  int: the size of ``split``, skipped examples too;
  * ``skipped_examples`` int: those skipped as too long
    (:func:`first_examples`).
  """
  process_index, process_count = resolve_process(process_index, process_count)
  batch_size = per_host_batch_size(global_batch_size, process_count)
  source = load_split(data_dir, split, config_name=config_name)
  usable, skipped = first_examples(
      fitting_indices(
          source,
          max_question_len=max_question_len,
          max_answer_len=max_answer_len,
      ),
      max_examples,
      len(source),
  )
  for records, _ in host_eval_records(
      source,
      usable,
      global_batch_size=global_batch_size,
      process_index=process_index,
      process_count=process_count,
  ):
    pairs = [decode_record(record) for record in records]
    num_padding = batch_size - len(pairs)
    questions = [question for question, _ in pairs] + [""] * num_padding
    answers = [answer for _, answer in pairs] + [""] * num_padding
    prompts, prompt_lengths = encode_prompts(
        questions, max_question_len=max_question_len, chunks=chunks
    )
    yield {
        "prompts": prompts,
        "prompt_lengths": prompt_lengths,
        "questions": questions,
        "answers": answers,
        "valid": np.arange(batch_size) < len(pairs),
        "test_examples": len(source),
        "skipped_examples": skipped,
    }


def host_eval_records(
    source,
    usable: np.ndarray,
    *,
    global_batch_size: int,
    process_index: int,
    process_count: int,
) -> Iterator[tuple[list, list[int]]]:
  """Yields (records, their indices) of this host's evaluation batches, in order, once.

  This host takes ``usable[process_index::process_count]``, in batches of at
  most ``B = global_batch_size // process_count`` records; every host yields
  `num_eval_batches` batches (the last ones short or empty), so that hosts
  stay in step. The caller pads each batch to ``B`` rows.
  """
  batch_size = per_host_batch_size(global_batch_size, process_count)
  indices = [int(i) for i in usable[process_index::process_count]]
  for batch_index in range(
      num_eval_batches(len(usable), global_batch_size, process_count)
  ):
    batch_indices = indices[
        batch_index * batch_size : (batch_index + 1) * batch_size
    ]
    yield (
        source.__getitems__(batch_indices) if batch_indices else []
    ), batch_indices
