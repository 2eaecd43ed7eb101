r"""Generates the arithmetic_mix dataset: mathematics_dataset arithmetic__mixed.

Problems are generated in-process with the ``mathematics_dataset`` package, the
way its own ``generate.py`` (and the TFDS ``math_dataset`` release built from
it) does:

* train: ``modules.train(entropy_fn)`` at the three difficulties
  train-easy / train-medium / train-hard (``_make_entropy_fn(level, 3)``),
  in equal thirds, interleaved easy, medium, hard, easy, ...;
* test: ``modules.test()``, the 'interpolate' regime;
* a problem whose question is longer than 160 characters or whose answer is
  longer than 30 is dropped and drawn again (``generate.sample_from_module``).

The result is a TFDS dataset in ``array_record`` format, readable without
TensorFlow (``tfds.builder_from_directory(...).as_data_source()``), at::

  DATA_DIR/arithmetic_mix/train{N}_test{M}_seed{S}/1.0.0/

Generation runs at about 700 problems/s (train) and 400/s (test) on one core,
logged every 10 s. It is deterministic for a seed, in a fresh process or not:
each split draws from its own stream of Python's ``random`` and NumPy's global
generator (what the package draws from), swapped in only while a problem is
drawn, so the test split does not depend on ``train_size``; see
`GlobalRngStreams`. A dataset that already exists is reused, not regenerated.

Other modules and difficulties (``module="arithmetic__add_or_sub",
difficulty="easy"``: train and test both drawn at that train difficulty, the
test from its own stream) are named ``add_or_sub-easy_train{N}_test{M}_seed{S}``
and drawn in blocks of `BLOCK_SIZE` problems, block ``b`` of a split from its
own stream, so ``workers`` processes write exactly the problems one process
writes. The paper's mix keeps its single stream (and its data) and is drawn
in one process.

The generator and its pinned ``sympy==1.5.1`` are the ``arithmetic-data``
extra, imported only when problems are generated (`generate_problems`), so
training and evaluation on data prepared elsewhere need neither, and the
``train`` extra installs beside PyTorch (which needs a newer sympy). Usage::

  python -m train.prepare_data --data_dir=data --train_size=100000 \
      --test_size=1000 --seed=0
"""

import contextlib
import dataclasses
import hashlib
import importlib
import multiprocessing
import random
import time
import unittest.mock
from collections.abc import Callable, Iterator

import numpy as np
import tensorflow_datasets as tfds
from absl import logging

from train import generated_data

DATASET_NAME = "arithmetic_mix"
MODULE_NAME = "arithmetic__mixed"
VERSION = "1.0.0"
# mathematics_dataset's generate_settings.MAX_QUESTION_LENGTH and
# MAX_ANSWER_LENGTH (a test checks they still agree).
MAX_QUESTION_LENGTH = 160
MAX_ANSWER_LENGTH = 30
NUM_TRAIN_DIFFICULTIES = 3  # train-easy, train-medium, train-hard.
DIFFICULTIES = ("easy", "medium", "hard")
# Problems per stream block of the datasets drawn in blocks.
BLOCK_SIZE = 1000
_SPLIT_STREAMS = {"train": 0, "test": 1}
_LOG_EVERY_SECONDS = 10.0

Problem = tuple[str, str]  # (question, answer)


def _modules():
  """mathematics_dataset's problem modules (the ``arithmetic-data`` extra)."""
  try:
    from mathematics_dataset.modules import modules  # pylint: disable=g-import-not-at-top
  except ImportError as error:
    raise ImportError(
        "generating arithmetic_mix data needs the mathematics_dataset package "
        f"({error}); install it with `pip install -e '.[arithmetic-data]'` "
        "(it pins sympy==1.5.1: use a separate environment from PyTorch), or "
        "prepare the data elsewhere and pass --config.data_dir."
    ) from error
  return modules


def _sympy_assumptions():
  # `sympy.core` is shadowed by a function of that name: import it by path.
  return importlib.import_module("sympy.core.assumptions")


def make_entropy_fn(
    level: int, num_levels: int
) -> Callable[[tuple[float, float]], tuple[float, float]]:
  """Returns a function restricting an entropy range to difficulty ``level``.

  Same as mathematics_dataset ``generate._make_entropy_fn`` (copied so that
  importing this module does not define that script's absl flags): with
  ``level=1, num_levels=3`` it maps ``(x, x + y)`` to ``(x + y/3, x + 2y/3)``.
  """
  if not 0 <= level < num_levels:
    raise ValueError(f"level must be in [0, {num_levels}), got {level}.")
  lower = level / num_levels
  upper = (level + 1) / num_levels

  def modify_entropy(range_: tuple[float, float]) -> tuple[float, float]:
    length = range_[1] - range_[0]
    return (range_[0] + lower * length, range_[0] + upper * length)

  return modify_entropy


def flatten_modules(
    module_tree: dict, prefix: str | None = None
) -> dict[str, Callable]:
  """Flattens a nested module dict to ``{'arithmetic__mixed': fn, ...}`` as generate.py names them."""
  flat = {}
  for key, value in module_tree.items():
    full_name = key if prefix is None else f"{prefix}__{key}"
    if isinstance(value, dict):
      flat.update(flatten_modules(value, full_name))
    else:
      flat[full_name] = value
  return flat


def _train_module(module: str, level: int) -> Callable:
  flat = flatten_modules(
      _modules().train(make_entropy_fn(level, NUM_TRAIN_DIFFICULTIES))
  )
  if module not in flat:
    arithmetic = sorted(n for n in flat if n.startswith("arithmetic__"))
    raise ValueError(
        f"unknown mathematics_dataset module {module!r}; use one of "
        f"{', '.join(arithmetic)}."
    )
  return flat[module]


def train_problem_fns(module: str = MODULE_NAME) -> list[Callable]:
  """Returns ``module``'s problem functions for train-easy, -medium, -hard."""
  return [
      _train_module(module, level) for level in range(NUM_TRAIN_DIFFICULTIES)
  ]


def interpolate_problem_fn(module: str = MODULE_NAME) -> Callable:
  """Returns ``module``'s problem function of the 'interpolate' test regime."""
  return flatten_modules(_modules().test())[module]


def check_variant(module: str, difficulty: str) -> None:
  """ValueError for a module name or difficulty that cannot be generated."""
  if not module.startswith("arithmetic__"):
    raise ValueError(
        f"module must be a mathematics_dataset arithmetic module such as "
        f"'arithmetic__add_or_sub', got {module!r}."
    )
  if difficulty not in ("",) + DIFFICULTIES:
    raise ValueError(
        f"difficulty must be one of {', '.join(DIFFICULTIES)} (or '' for "
        f"the paper's mix), got {difficulty!r}."
    )


def sample_problem(
    problem_fn: Callable,
    *,
    max_question_length: int = MAX_QUESTION_LENGTH,
    max_answer_length: int = MAX_ANSWER_LENGTH,
) -> Problem:
  """Draws problems until one fits the length limits (``generate.sample_from_module``)."""
  while True:
    problem = problem_fn()
    question, answer = str(problem.question), str(problem.answer)
    if (
        len(question) <= max_question_length
        and len(answer) <= max_answer_length
    ):
      return question, answer


class GlobalRngStreams:
  """A private stream for Python's and NumPy's global generators, swapped in only while used.

  mathematics_dataset draws from both global generators, so they are what
  has to be seeded. The stream's state is swapped in around each use and the
  caller's state put back, so code running between problems (tfds's writer,
  which calls `random`) neither disturbs the stream nor is disturbed by it.

  While active, sympy's assumption system keeps its prerequisite order
  instead of calling the global ``random.shuffle``: it does so only the first
  time a fact is asked of a cached object, so the draws would otherwise depend
  on what was generated earlier in the process (a second `prepare` in one
  process would give different data).
  """

  def __init__(self, seed: int, stream: int | tuple[int, ...]):
    key = stream if isinstance(stream, tuple) else (stream,)
    python_seed, numpy_seed = np.random.SeedSequence(
        seed, spawn_key=key
    ).generate_state(2)
    self._python_state = random.Random(int(python_seed)).getstate()
    self._numpy_state = np.random.RandomState(int(numpy_seed)).get_state()

  @contextlib.contextmanager
  def active(self) -> Iterator[None]:
    """Makes this stream the global generators' state for the duration of the block."""
    outer_python_state, outer_numpy_state = (
        random.getstate(),
        np.random.get_state(),
    )
    random.setstate(self._python_state)
    np.random.set_state(self._numpy_state)
    try:
      with unittest.mock.patch.object(
          _sympy_assumptions(), "shuffle", _keep_order
      ):
        yield
    finally:
      self._python_state, self._numpy_state = (
          random.getstate(),
          np.random.get_state(),
      )
      random.setstate(outer_python_state)
      np.random.set_state(outer_numpy_state)


def _keep_order(items: list) -> None:
  """Stands in for `random.shuffle` in sympy's assumptions: leaves ``items`` as they are."""
  del items


def _log_progress(split: str, done: int, total: int, start_time: float) -> None:
  """Logs how many problems of ``split`` are done and the rate so far."""
  elapsed = max(time.monotonic() - start_time, 1e-9)
  logging.info(
      "%s: %d/%d problems (%.0f problems/s)", split, done, total, done / elapsed
  )


def _is_paper_mix(module: str, difficulty: str) -> bool:
  return module == MODULE_NAME and not difficulty


def _problem_fns(split, module, difficulty) -> list[Callable]:
  if difficulty:
    return [_train_module(module, DIFFICULTIES.index(difficulty))]
  if split == "train":
    return train_problem_fns(module)
  return [interpolate_problem_fn(module)]


def _generate_block(arguments) -> list[Problem]:
  """One block of problems, from its own stream (a worker's unit of work)."""
  split, seed, block, count, module, difficulty = arguments
  problem_fns = _problem_fns(split, module, difficulty)
  rngs = GlobalRngStreams(seed, (_SPLIT_STREAMS[split], block))
  problems = []
  for index in range(block * BLOCK_SIZE, block * BLOCK_SIZE + count):
    with rngs.active():
      problems.append(sample_problem(problem_fns[index % len(problem_fns)]))
  return problems


def _blocks(split, size, seed, module, difficulty):
  for block in range(-(-size // BLOCK_SIZE)):
    count = min(BLOCK_SIZE, size - block * BLOCK_SIZE)
    yield split, seed, block, count, module, difficulty


def generate_problems(
    split: str,
    size: int,
    seed: int,
    *,
    module: str = MODULE_NAME,
    difficulty: str = "",
    workers: int = 1,
) -> Iterator[Problem]:
  """Yields ``size`` (question, answer) pairs of ``split`` ('train' or 'test'), deterministic for ``seed``.

  With the defaults (the paper's arithmetic__mixed): train cycles through
  easy, medium and hard, so each is a third (the first ones get the
  remainder), and test is the 'interpolate' regime, each split one stream,
  drawn in one process. With a ``difficulty``, train and test are both drawn
  at that train difficulty; any other module or a difficulty draws in
  blocks, each from its own stream, in ``workers`` processes: the same
  problems for any number of workers. Progress is logged with absl every few
  seconds.
  """
  if split not in _SPLIT_STREAMS:
    raise ValueError(
        f"split must be one of {sorted(_SPLIT_STREAMS)}, got {split!r}."
    )
  check_variant(module, difficulty)
  if workers < 1:
    raise ValueError(f"workers must be >= 1, got {workers}.")
  start_time = last_log_time = time.monotonic()
  if _is_paper_mix(module, difficulty):
    if workers > 1:
      logging.warning(
          "the paper's arithmetic__mixed keeps its single stream (and its "
          "data): generating in one process, not %d.",
          workers,
      )
    problem_fns = _problem_fns(split, module, difficulty)
    rngs = GlobalRngStreams(seed, _SPLIT_STREAMS[split])
    for index in range(size):
      with rngs.active():
        problem = sample_problem(problem_fns[index % len(problem_fns)])
      yield problem
      if time.monotonic() - last_log_time > _LOG_EVERY_SECONDS:
        _log_progress(split, index + 1, size, start_time)
        last_log_time = time.monotonic()
  else:
    blocks = _blocks(split, size, seed, module, difficulty)
    with contextlib.ExitStack() as stack:
      if workers > 1:
        pool = stack.enter_context(
            multiprocessing.get_context("spawn").Pool(workers)
        )
        results = pool.imap(_generate_block, blocks)
      else:
        results = map(_generate_block, blocks)
      done = 0
      for problems in results:
        yield from problems
        done += len(problems)
        if time.monotonic() - last_log_time > _LOG_EVERY_SECONDS:
          _log_progress(split, done, size, start_time)
          last_log_time = time.monotonic()
  _log_progress(split, size, size, start_time)


@dataclasses.dataclass
class ArithmeticMixConfig(generated_data.SplitSizes):
  """Builder config: the split sizes, seed and module that fix the content."""

  module: str = MODULE_NAME
  difficulty: str = ""


def config_name(
    train_size: int,
    test_size: int,
    seed: int,
    *,
    module: str = MODULE_NAME,
    difficulty: str = "",
) -> str:
  """The config (sub-directory) name, e.g. 'train1000_test100_seed0'.

  Other modules and difficulties lead with them:
  'add_or_sub-easy_train1000_test100_seed0'.
  """
  name = f"train{train_size}_test{test_size}_seed{seed}"
  if _is_paper_mix(module, difficulty):
    return name
  return f"{module.removeprefix('arithmetic__')}-{difficulty or 'mix'}_{name}"


def make_config(
    train_size: int,
    test_size: int,
    seed: int = 0,
    *,
    module: str = MODULE_NAME,
    difficulty: str = "",
) -> ArithmeticMixConfig:
  """Returns the builder config for these sizes and seed, after checking them."""
  check_variant(module, difficulty)
  if train_size <= 0 or test_size <= 0:
    raise ValueError(
        f"train_size and test_size must be positive, got train_size={train_size},"
        f" test_size={test_size}."
    )
  if seed < 0:
    raise ValueError(f"seed must be non-negative, got {seed}.")
  level = f" ({difficulty})" if difficulty else ""
  return ArithmeticMixConfig(
      name=config_name(
          train_size, test_size, seed, module=module, difficulty=difficulty
      ),
      description=f"{module}{level}: {train_size} train, {test_size} test problems, seed {seed}.",
      train_size=train_size,
      test_size=test_size,
      seed=seed,
      module=module,
      difficulty=difficulty,
  )


class ArithmeticMix(generated_data.GeneratedBuilder, skip_registration=True):
  """mathematics_dataset arithmetic__mixed as (question, answer) text pairs.

  Not registered by name (several modules may import this one); read it with
  ``tfds.builder_from_directory``, which needs no class.
  """

  VERSION = tfds.core.Version(VERSION)
  BUILDER_CONFIG_CLASS = ArithmeticMixConfig

  # tfds's own lookup of this file needs the `importlib_resources` backport on
  # Python >= 3.9 (tfds 4.9.10 bug) when the builder lives in a package.

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
        builder=self,
        description=(
            "mathematics_dataset arithmetic__mixed problems: train from train-easy/medium/hard"
            " in equal thirds, test from 'interpolate'."
        ),
        features=tfds.features.FeaturesDict(
            {"question": tfds.features.Text(), "answer": tfds.features.Text()}
        ),
        supervised_keys=("question", "answer"),
        # Keep generation order on disk; the input pipeline shuffles.
        disable_shuffling=True,
        homepage="https://github.com/google-deepmind/mathematics_dataset",
        # Saved as metadata.json so readers can check what they load.
        metadata=tfds.core.MetadataDict(
            module=self.builder_config.module,
            difficulty=self.builder_config.difficulty,
            train_size=self.builder_config.train_size,
            test_size=self.builder_config.test_size,
            seed=self.builder_config.seed,
            max_question_length=MAX_QUESTION_LENGTH,
            max_answer_length=MAX_ANSWER_LENGTH,
        ),
    )

  workers = 1  # processes drawing the problems (set by `prepare`)

  def _generate_examples(self, split: str, size: int, seed: int):
    config = self.builder_config
    problems = generate_problems(
        split,
        size,
        seed,
        module=config.module,
        difficulty=config.difficulty,
        workers=self.workers,
    )
    for index, (question, answer) in enumerate(problems):
      yield index, {"question": question, "answer": answer}


def prepare(
    data_dir: str,
    train_size: int,
    test_size: int,
    seed: int = 0,
    *,
    module: str = MODULE_NAME,
    difficulty: str = "",
    workers: int = 1,
) -> str:
  """Generates the dataset under ``data_dir`` unless it already exists.

  ``module`` and ``difficulty`` choose the problems (default: the paper's
  arithmetic__mixed); ``workers`` processes draw them, with the same result
  for any number (see `generate_problems`).

  Returns:
    The dataset's directory, ``data_dir/arithmetic_mix/<config>/1.0.0``.
  """
  builder = ArithmeticMix(
      data_dir=data_dir,
      config=make_config(
          train_size, test_size, seed, module=module, difficulty=difficulty
      ),
      file_format="array_record",
  )
  builder.workers = workers
  return generated_data.prepare(builder)


def problems_digest(dataset_dir: str) -> dict[str, str]:
  """``{split: MD5 of its problems in stored order}`` of a prepared dataset.

  Equal where two preparations drew the same problems in the same order, on
  any machine; the record files' bytes are not (the order in which each
  record's serialized fields are written varies between processes).
  """
  builder = tfds.builder_from_directory(dataset_dir)
  digests = {}
  for split in sorted(builder.info.splits):
    source = builder.as_data_source(split=split)
    digest = hashlib.md5()
    for i in range(len(source)):
      question, answer = source[i]["question"], source[i]["answer"]
      digest.update(question + b"\0" + answer + b"\n")
    digests[split] = digest.hexdigest()
  return digests
