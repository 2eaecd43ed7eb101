"""Tests for train/tokenizer.py, train/arithmetic_data.py and train/input_pipeline.py."""

import collections
import logging
import math
import os
import random
import re
import signal
import string
import subprocess
import sys
import time
import types

import grain
import ml_collections
import ntil_jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
import tensorflow_datasets as tfds
from absl import flags

from train import arithmetic_data, evaluate, input_pipeline, tokenizer
from train.tasks import arithmetic_mix, clock_time

from tests import launch

TRAIN_SIZE = 300
TEST_SIZE = 100
SEED = 0
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  path = tmp_path_factory.mktemp("data")
  arithmetic_data.prepare(str(path), TRAIN_SIZE, TEST_SIZE, seed=SEED)
  return str(path)


def read_pairs(dataset_dir, split):
  """All (question, answer) pairs of a split, in stored order."""
  source = tfds.builder_from_directory(dataset_dir).as_data_source(split=split)
  return [input_pipeline.decode_record(source[i]) for i in range(len(source))]


def batch_pairs(batch):
  """(question, answer) of each row of a training batch, decoded from its inputs."""
  pairs = []
  for row in batch["inputs"]:
    question, answer = tokenizer.decode(row).split(tokenizer.SEP_TEXT)
    pairs.append((question, answer))
  return pairs


def oracle_example(question, answer, length):
  """Builds inputs/targets/masks token by token, the obvious way."""
  tokens, is_answer, is_digit = [tokenizer.BOS_ID], [False], [False]
  for char in question:
    tokens.append(tokenizer.vocab()[char]), is_answer.append(
        False
    ), is_digit.append(False)
  tokens.append(tokenizer.SEP_ID), is_answer.append(False), is_digit.append(
      False
  )
  for char in answer:
    tokens.append(tokenizer.vocab()[char]), is_answer.append(
        True
    ), is_digit.append(char in "0123456789")
  tokens.append(tokenizer.EOS_ID), is_answer.append(True), is_digit.append(
      False
  )
  while len(tokens) < length + 1:
    tokens.append(tokenizer.PAD_ID), is_answer.append(False), is_digit.append(
        False
    )
  return {
      "inputs": np.array(tokens[:-1]),
      "targets": np.array(tokens[1:]),
      "loss_mask": np.array(is_answer[1:]),
      "digit_mask": np.array(is_digit[1:]),
  }


# --- tokenizer ---------------------------------------------------------------


def test_digits_are_ids_zero_to_nine():
  assert tokenizer.DIGIT_TOKEN_IDS == tuple(range(10))
  assert tokenizer.encode("0123456789") == list(range(10))
  assert (
      tokenizer.PAD_ID,
      tokenizer.BOS_ID,
      tokenizer.EOS_ID,
      tokenizer.SEP_ID,
  ) == (10, 11, 12, 13)


def test_vocab_ids_are_dense_and_unique():
  ids = sorted(tokenizer.vocab().values())
  assert ids == list(range(tokenizer.VOCAB_SIZE))
  assert tokenizer.VOCAB_SIZE == 14 + 1 + 52 + 32


def test_vocab_covers_mathematics_dataset_characters():
  from mathematics_dataset import generate_settings

  chars = "".join(generate_settings.QUESTION_CHARS)
  assert tokenizer.decode(tokenizer.encode(chars)) == chars


def test_round_trip_and_decode_rules():
  text = "Calculate -8/3 + (2*x)^2, y=0.5? " + string.ascii_letters
  ids = tokenizer.encode(text)
  assert len(ids) == len(text)
  assert tokenizer.decode(ids) == text
  framed = [
      tokenizer.BOS_ID,
      *tokenizer.encode("1+1"),
      tokenizer.SEP_ID,
      2,
      tokenizer.EOS_ID,
      5,
      tokenizer.PAD_ID,
  ]
  assert tokenizer.decode(framed) == "1+1\t2"


def test_strict_decode_keeps_what_is_no_answer_text():
  # A model's answer holding PAD, BOS or SEP is not the answer: decoded
  # for scoring, each shows as a character no answer or parser has.
  bad = tokenizer.UNEXPECTED_TEXT
  ids = tokenizer.encode("2_") + [tokenizer.PAD_ID] + tokenizer.encode("05")
  assert tokenizer.decode(ids + [tokenizer.EOS_ID]) == "2_05"
  assert tokenizer.decode(ids, strict=True) == f"2_{bad}05"
  for special in (tokenizer.BOS_ID, tokenizer.SEP_ID):
    row = [1, special, 2, tokenizer.EOS_ID, tokenizer.PAD_ID]
    assert tokenizer.decode(row, strict=True) == f"1{bad}2"
  assert (
      clock_time.summarize(
          clock_time.score_answers([f"2_{bad}05"], ["2_05"], None)
      )["exact_match"]
      == 0.0
  )


def test_arithmetic_errors_are_exact_for_any_answer():
  config = ml_collections.ConfigDict(dict(max_answer_len=12))

  def scored(prediction, answer):
    sums = arithmetic_mix.score_answers([prediction], [answer], config)
    return arithmetic_mix.summarize(sums)

  # Exactly 1% off counts (in floats 0.707 vs 0.7 did not); just over not.
  for prediction, answer in (("0.707", "0.7"), ("101", "100"), ("-1.01", "-1")):
    assert scored(prediction, answer)["within_1_percent"] == 1.0
  assert scored("0.70701", "0.7")["within_1_percent"] == 0.0
  # A prediction past float64's range parses: an infinite error, a finite
  # log error (10**400 - 3 + 1 has 400 digits), no crash.
  huge = scored("9" * 400, "3")
  assert huge["parsed_rate"] == 1.0 and huge["exact_match"] == 0.0
  assert huge["mean_abs_error"] == float("inf")
  assert abs(huge["mean_log10_abs_error"] - 400.0) < 1e-9
  assert huge["within_1_percent"] == 0.0
  # Nothing parses: no mean error (0 would read as perfect), every rate 0.
  junk = scored("no idea", "12")
  assert math.isnan(junk["mean_abs_error"])
  assert math.isnan(junk["mean_log10_abs_error"])
  assert junk["parsed_rate"] == junk["exact_match"] == 0.0


def test_evaluation_with_no_example_left_scores_none(caplog):
  # Every test example skipped (too long): metrics of nothing and a
  # warning, not a crash.
  class Model:

    def eval(self):
      pass

    def train(self):
      pass

  task = types.SimpleNamespace(
      score_answers=arithmetic_mix.score_answers,
      summarize=arithmetic_mix.summarize,
      eval_batches=lambda config: iter([]),
  )
  config = ml_collections.ConfigDict(
      dict(max_answer_len=12, max_question_len=64)
  )
  with caplog.at_level(logging.WARNING, logger="absl"):
    metrics, samples, predictions = evaluate.evaluate(
        Model(), config, lambda x: x, task
    )
  assert metrics["num_examples"] == 0 and metrics["exact_match"] == 0.0
  assert samples == [] and predictions == []
  assert "scored no test example" in caplog.text


@pytest.mark.parametrize("char", ["é", "\n", "\t", "→"])
def test_unknown_character_raises_naming_it(char):
  with pytest.raises(ValueError, match=re.escape(repr(char))):
    tokenizer.encode(f"1{char}2")


def test_decode_rejects_out_of_range_ids():
  # The vocabulary decoded is the chunk mode's, which holds the characters'.
  for bad in (tokenizer.CHUNK_VOCAB_SIZE, -1):
    with pytest.raises(ValueError, match="outside the vocabulary"):
      tokenizer.decode([bad])


# --- encode_example ----------------------------------------------------------


def test_masks_on_hand_made_example():
  example = input_pipeline.encode_example(
      "What is 12-5?", "7", max_question_len=13, max_answer_len=4
  )
  length = 13 + 4 + 2
  # Sequence: BOS(0) question(1..13) SEP(14) '7'(15) EOS(16) PAD(17..19); target t is token t+1.
  expected_loss = np.zeros(length, bool)
  expected_loss[[14, 15]] = True
  expected_digit = np.zeros(length, bool)
  expected_digit[14] = True
  np.testing.assert_array_equal(example["loss_mask"], expected_loss)
  np.testing.assert_array_equal(example["digit_mask"], expected_digit)
  assert (
      example["targets"][14] == 7 and example["targets"][15] == tokenizer.EOS_ID
  )
  assert example["targets"][13] == tokenizer.SEP_ID
  assert example["inputs"][0] == tokenizer.BOS_ID
  np.testing.assert_array_equal(example["inputs"][1:], example["targets"][:-1])
  assert list(example["targets"][16:]) == [tokenizer.PAD_ID] * 3


@pytest.mark.parametrize(
    "question, answer",
    [
        ("What is -16/6?", "-8/3"),
        ("What is 12-5?", "7"),
        ("Evaluate 3 - 2 - 1.", "0"),
        ("Calc 1/(-2)?", "-1/2"),
    ],
)
def test_encode_example_matches_oracle(question, answer):
  example = input_pipeline.encode_example(
      question, answer, max_question_len=20, max_answer_len=6
  )
  expected = oracle_example(
      question, answer, input_pipeline.sequence_length(20, 6)
  )
  for key, value in expected.items():
    np.testing.assert_array_equal(example[key], value, err_msg=key)
  assert (
      example["inputs"].dtype == np.int32
      and example["targets"].dtype == np.int32
  )
  assert (
      example["loss_mask"].dtype == bool and example["digit_mask"].dtype == bool
  )


def test_fraction_answer_digit_mask():
  example = input_pipeline.encode_example(
      "What is -16/6?", "-8/3", max_question_len=14, max_answer_len=4
  )
  masked_targets = example["targets"][example["digit_mask"]]
  assert list(masked_targets) == [8, 3]
  assert tokenizer.decode(example["targets"][example["loss_mask"]]) == "-8/3"


def test_too_long_question_or_answer_raises():
  with pytest.raises(ValueError, match="max_question_len=5"):
    input_pipeline.encode_example(
        "What is 1+1?", "2", max_question_len=5, max_answer_len=4
    )
  with pytest.raises(ValueError, match="max_answer_len=2"):
    input_pipeline.encode_example(
        "Q?", "-8/3", max_question_len=5, max_answer_len=2
    )


def test_encode_prompt_is_right_padded():
  prompt, length = input_pipeline.encode_prompt(
      "What is 2+2?", max_question_len=15
  )
  assert prompt.shape == (17,) and prompt.dtype == np.int32
  assert length == 14
  assert (
      prompt[0] == tokenizer.BOS_ID and prompt[length - 1] == tokenizer.SEP_ID
  )
  assert tokenizer.decode(prompt[1 : length - 1]) == "What is 2+2?"
  assert all(prompt[length:] == tokenizer.PAD_ID)


# --- arithmetic_data ---------------------------------------------------------


def test_prepare_writes_tfds_dataset(data_dir):
  dataset_dir = input_pipeline.find_dataset_dir(data_dir)
  assert dataset_dir.parent.name == arithmetic_data.config_name(
      TRAIN_SIZE, TEST_SIZE, SEED
  )
  builder = tfds.builder_from_directory(dataset_dir)
  assert builder.info.file_format.value == "array_record"
  assert builder.info.splits["train"].num_examples == TRAIN_SIZE
  assert builder.info.splits["test"].num_examples == TEST_SIZE
  assert builder.info.metadata["seed"] == SEED
  train, test = read_pairs(dataset_dir, "train"), read_pairs(
      dataset_dir, "test"
  )
  for question, answer in train + test:
    assert 0 < len(question) <= 160 and 0 < len(answer) <= 30
    tokenizer.encode(question + answer)  # Every character is in the vocabulary.
  assert train[:10] != test[:10]


def test_prepare_is_deterministic_and_seed_dependent(data_dir, tmp_path):
  same = arithmetic_data.prepare(
      str(tmp_path / "same"), TRAIN_SIZE, TEST_SIZE, seed=SEED
  )
  other = arithmetic_data.prepare(
      str(tmp_path / "other"), TRAIN_SIZE, TEST_SIZE, seed=SEED + 1
  )
  original = input_pipeline.find_dataset_dir(data_dir)
  for split in ("train", "test"):
    assert read_pairs(same, split) == read_pairs(original, split)
    assert read_pairs(other, split) != read_pairs(original, split)
  # What a machine elsewhere checks before it generates data to pair with
  # this machine's runs.
  digest = arithmetic_data.problems_digest(str(original))
  assert set(digest) == {"train", "test"}
  assert arithmetic_data.problems_digest(same) == digest
  other_digest = arithmetic_data.problems_digest(other)
  assert all(other_digest[s] != digest[s] for s in digest)


def test_test_split_does_not_depend_on_train_size(data_dir, tmp_path):
  smaller = arithmetic_data.prepare(str(tmp_path), 30, TEST_SIZE, seed=SEED)
  assert read_pairs(smaller, "test") == read_pairs(
      input_pipeline.find_dataset_dir(data_dir), "test"
  )
  assert (
      read_pairs(smaller, "train")
      == read_pairs(input_pipeline.find_dataset_dir(data_dir), "train")[:30]
  )


def test_prepare_reuses_existing_dataset(data_dir, monkeypatch):
  def fail(*args, **kwargs):
    raise AssertionError("regenerated an existing dataset")

  monkeypatch.setattr(arithmetic_data, "generate_problems", fail)
  path = arithmetic_data.prepare(data_dir, TRAIN_SIZE, TEST_SIZE, seed=SEED)
  assert path == str(input_pipeline.find_dataset_dir(data_dir))


def test_generation_neither_uses_nor_disturbs_global_random_state():
  def problems_with_noise_in_between(noise_seed):
    # Code between problems (tfds's writer) may draw from the global generators.
    pairs = []
    for pair in arithmetic_data.generate_problems("train", 12, seed=5):
      pairs.append(pair)
      random.seed(noise_seed)
      np.random.seed(noise_seed)
    return pairs

  assert problems_with_noise_in_between(1) == problems_with_noise_in_between(2)
  random.seed(123)
  np.random.seed(123)
  expected = (random.random(), np.random.rand())
  random.seed(123)
  np.random.seed(123)
  list(arithmetic_data.generate_problems("test", 5, seed=5))
  assert (random.random(), np.random.rand()) == expected


def test_train_cycles_three_difficulties(monkeypatch):
  calls = []

  def fake_fns(module=arithmetic_data.MODULE_NAME):
    assert module == arithmetic_data.MODULE_NAME

    def make(level):
      def problem_fn():
        calls.append(level)
        return type("Problem", (), {"question": f"Q{level}", "answer": "1"})()

      return problem_fn

    return [make(level) for level in range(3)]

  monkeypatch.setattr(arithmetic_data, "train_problem_fns", fake_fns)
  list(arithmetic_data.generate_problems("train", 7, seed=0))
  assert calls == [0, 1, 2, 0, 1, 2, 0]


def test_entropy_fn_matches_package():
  from mathematics_dataset import generate

  for level in range(3):
    ours = arithmetic_data.make_entropy_fn(level, 3)((3.0, 9.0))
    theirs = generate._make_entropy_fn(level, 3)((3.0, 9.0))  # pylint: disable=protected-access
    assert ours == pytest.approx(theirs)
  assert arithmetic_data.make_entropy_fn(1, 3)((0.0, 3.0)) == pytest.approx(
      (1.0, 2.0)
  )


def test_sample_problem_drops_too_long():
  problems = iter([("Q" * 161, "1"), ("Q", "1" * 31), ("What is 1+1?", "2")])

  def problem_fn():
    question, answer = next(problems)
    return type("Problem", (), {"question": question, "answer": answer})()

  assert arithmetic_data.sample_problem(problem_fn) == ("What is 1+1?", "2")


def test_prepare_rejects_bad_sizes(tmp_path):
  with pytest.raises(ValueError, match="must be positive"):
    arithmetic_data.prepare(str(tmp_path), 0, 10)
  with pytest.raises(ValueError, match="non-negative"):
    arithmetic_data.prepare(str(tmp_path), 10, 10, seed=-1)


def test_cli_matches_python_function_in_another_process(tmp_path):
  """The CLI writes the same data as `prepare`, even under another hash seed."""
  env = dict(os.environ, PYTHONHASHSEED="7")
  result = launch.run(
      [
          sys.executable,
          "-m",
          "train.prepare_data",
          f"--data_dir={tmp_path / 'cli'}",
          "--train_size=30",
          "--test_size=12",
          "--seed=4",
      ],
      cwd=REPO_ROOT,
      env=env,
      capture_output=True,
      text=True,
      check=False,
  )
  assert result.returncode == 0, result.stderr[-2000:]
  cli_dir = result.stdout.strip().splitlines()[-1]
  in_process_dir = arithmetic_data.prepare(str(tmp_path / "py"), 30, 12, seed=4)
  for split in ("train", "test"):
    assert read_pairs(cli_dir, split) == read_pairs(in_process_dir, split)


@pytest.mark.slow
def test_workers_cli_writes_what_one_process_writes(tmp_path):
  """prepare_data --workers=2 writes exactly the problems of one process."""
  variant = dict(module="arithmetic__add_or_sub", difficulty="easy")
  result = launch.run(
      [
          sys.executable,
          "-m",
          "train.prepare_data",
          f"--data_dir={tmp_path / 'two'}",
          "--module=arithmetic__add_or_sub",
          "--difficulty=easy",
          "--train_size=2100",  # three blocks, the last one partial
          "--test_size=40",
          "--seed=3",
          "--workers=2",
      ],
      cwd=REPO_ROOT,
      capture_output=True,
      text=True,
      check=False,
  )
  assert result.returncode == 0, result.stderr[-2000:]
  two = result.stdout.strip().splitlines()[-1]
  assert two.endswith("add_or_sub-easy_train2100_test40_seed3/1.0.0")
  one = arithmetic_data.prepare(
      str(tmp_path / "one"), 2100, 40, seed=3, workers=1, **variant
  )
  for split in ("train", "test"):
    assert read_pairs(two, split) == read_pairs(one, split)
  train = read_pairs(one, "train")
  assert len(set(train)) > 2000  # blocks draw from different streams
  assert not set(train) & set(read_pairs(one, "test"))
  # Every answer of add_or_sub is a number, most of several digits.
  digits = [sum(c.isdigit() for c in answer) for _, answer in train]
  assert np.median(digits) >= 4
  other_seed = arithmetic_data.generate_problems("train", 5, seed=4, **variant)
  assert list(other_seed) != train[:5]


def test_paper_mix_keeps_its_stream_and_name():
  assert arithmetic_data.config_name(30, 12, 4) == "train30_test12_seed4"
  assert (
      arithmetic_data.config_name(30, 12, 4, module="arithmetic__mul")
      == "mul-mix_train30_test12_seed4"
  )
  one = list(arithmetic_data.generate_problems("train", 6, seed=4))
  many = list(arithmetic_data.generate_problems("train", 6, seed=4, workers=3))
  assert one == many  # one process, whatever ``workers`` says


def test_bad_variant_refused(tmp_path):
  with pytest.raises(ValueError, match="difficulty must be one of"):
    arithmetic_data.prepare(str(tmp_path), 10, 10, difficulty="trivial")
  with pytest.raises(ValueError, match="arithmetic module"):
    arithmetic_data.prepare(str(tmp_path), 10, 10, module="algebra__linear_1d")
  result = launch.run(
      [
          sys.executable,
          "-m",
          "train.prepare_data",
          "--task=clock_time",
          f"--data_dir={tmp_path}",
          "--train_size=4",
          "--test_size=4",
          "--module=arithmetic__mul",
      ],
      cwd=REPO_ROOT,
      capture_output=True,
      text=True,
      check=False,
  )
  assert result.returncode != 0
  # One line, not the flags' help with the message at its end.
  assert result.stderr.strip().splitlines() == [
      "error: --module is for arithmetic_mix, not --task=clock_time."
  ]


# --- training batches --------------------------------------------------------


def test_train_batch_shapes_and_dtypes(data_dir):
  iterator = input_pipeline.train_iterator(
      data_dir, global_batch_size=8, process_index=0, process_count=2
  )
  batch = next(iterator)
  length = input_pipeline.sequence_length()
  assert length == 192
  assert set(batch) == {"inputs", "targets", "loss_mask", "digit_mask"}
  for key, dtype in [
      ("inputs", np.int32),
      ("targets", np.int32),
      ("loss_mask", bool),
      ("digit_mask", bool),
  ]:
    assert batch[key].shape == (
        4,
        length,
    ), key  # Per-host batch: 8 / 2 processes.
    assert batch[key].dtype == dtype, key


def test_train_batches_hold_dataset_examples_with_right_masks(data_dir):
  dataset = set(read_pairs(input_pipeline.find_dataset_dir(data_dir), "train"))
  batch = next(
      input_pipeline.train_iterator(
          data_dir, global_batch_size=16, process_index=0, process_count=1
      )
  )
  for row, (question, answer) in enumerate(batch_pairs(batch)):
    assert (question, answer) in dataset
    expected = oracle_example(
        question, answer, input_pipeline.sequence_length()
    )
    for key, value in expected.items():
      np.testing.assert_array_equal(batch[key][row], value, err_msg=key)


def test_one_epoch_is_a_shuffled_permutation_and_epochs_differ(data_dir):
  dataset = read_pairs(input_pipeline.find_dataset_dir(data_dir), "train")
  iterator = input_pipeline.train_iterator(
      data_dir, global_batch_size=50, seed=3, process_index=0, process_count=1
  )
  epochs = [
      sum((batch_pairs(next(iterator)) for _ in range(TRAIN_SIZE // 50)), [])
      for _ in range(2)
  ]
  for epoch in epochs:
    assert collections.Counter(epoch) == collections.Counter(dataset)
  assert epochs[0] != dataset  # Shuffled.
  assert epochs[0] != epochs[1]  # Reshuffled each epoch.


def test_seed_decides_order(data_dir):
  def first_batch(seed):
    iterator = input_pipeline.train_iterator(
        data_dir,
        global_batch_size=16,
        seed=seed,
        process_index=0,
        process_count=1,
    )
    return next(iterator)

  np.testing.assert_array_equal(
      first_batch(5)["inputs"], first_batch(5)["inputs"]
  )
  assert not np.array_equal(first_batch(5)["inputs"], first_batch(6)["inputs"])


def test_iterator_state_restores_exactly(data_dir):
  kwargs = dict(global_batch_size=16, seed=1, process_index=0, process_count=1)
  iterator = input_pipeline.train_iterator(data_dir, **kwargs)
  for _ in range(5):
    next(iterator)
  state = iterator.get_state()
  expected = [
      next(iterator) for _ in range(25)
  ]  # Runs past the end of the first epoch.

  restored = input_pipeline.train_iterator(data_dir, **kwargs)
  restored.set_state(state)
  for want in expected:
    got = next(restored)
    for key in want:
      np.testing.assert_array_equal(got[key], want[key], err_msg=key)


def test_iterator_round_trips_through_orbax(data_dir, tmp_path):
  kwargs = dict(global_batch_size=8, seed=2, process_index=0, process_count=1)
  iterator = input_pipeline.train_iterator(data_dir, **kwargs)
  for _ in range(3):
    next(iterator)
  with ocp.CheckpointManager(tmp_path / "ckpt") as manager:
    manager.save(
        3,
        args=ocp.args.Composite(
            train_iter=grain.checkpoint.CheckpointSave(iterator)
        ),
    )
    manager.wait_until_finished()
  expected = next(iterator)

  fresh = input_pipeline.train_iterator(data_dir, **kwargs)
  with ocp.CheckpointManager(tmp_path / "ckpt") as manager:
    manager.restore(
        3,
        args=ocp.args.Composite(
            train_iter=grain.checkpoint.CheckpointRestore(fresh)
        ),
    )
  np.testing.assert_array_equal(next(fresh)["inputs"], expected["inputs"])


@pytest.fixture
def parsed_flags():
  """grain's worker processes read absl flags, which a trainer parses in app.run."""
  was_parsed = flags.FLAGS.is_parsed()
  flags.FLAGS.mark_as_parsed()
  yield
  if not was_parsed:
    flags.FLAGS.unparse_flags()


@pytest.mark.slow
def test_worker_processes_give_same_batches_and_restore(data_dir, parsed_flags):
  kwargs = dict(global_batch_size=16, seed=4, process_index=0, process_count=1)
  threaded = input_pipeline.train_iterator(data_dir, **kwargs)
  expected = [next(threaded) for _ in range(8)]
  iterator = input_pipeline.train_iterator(data_dir, worker_count=2, **kwargs)
  try:
    got = [next(iterator) for _ in range(4)]
    state = iterator.get_state()
  finally:
    iterator.close()
  restored = input_pipeline.train_iterator(data_dir, worker_count=2, **kwargs)
  try:
    restored.set_state(state)
    got += [next(restored) for _ in range(4)]
  finally:
    restored.close()
  for want, have in zip(expected, got, strict=True):
    for key in want:
      np.testing.assert_array_equal(have[key], want[key], err_msg=key)


def _children(pid):
  """The live processes whose parent is ``pid`` (from /proc)."""
  return {p for p in _live() if _stat(p)[1] == str(pid)}


def _stat(pid):
  """``(state, parent pid)`` of ``pid``, or None once it is gone."""
  try:
    with open(f"/proc/{pid}/stat") as f:
      fields = f.read().rsplit(")", 1)[1].split()
  except (FileNotFoundError, ProcessLookupError):
    return None
  return fields[0], fields[1]


def _live(pids=None):
  """Those of ``pids`` (every process without) that run: not gone, no
  zombie waiting for a parent that does not reap."""
  if pids is None:
    pids = [p for p in os.listdir("/proc") if p.isdigit()]
  return {p for p in pids if (stat := _stat(p)) and stat[0] != "Z"}


def _python(code):
  """A Python process running ``code`` in the repository, stdout piped."""
  return subprocess.Popen(
      [sys.executable, "-c", code],
      cwd=REPO_ROOT,
      stdout=subprocess.PIPE,
      text=True,
  )


def _still_running_after(pids, seconds):
  """Those of ``pids`` still running ``seconds`` on (or once none is),
  killed then, not to be left to the next test."""
  deadline = time.monotonic() + seconds
  while _live(pids) and time.monotonic() < deadline:
    time.sleep(0.1)
  left = _live(pids)
  for pid in left:
    os.kill(int(pid), signal.SIGKILL)
  return left


@pytest.mark.slow
@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc")
def test_worker_processes_end_with_a_trainer_killed_outright(data_dir):
  # SIGKILL (as the out-of-memory killer sends) left grain's workers
  # running, idle, each holding its memory, with no parent.
  code = f"""
import os, time
from absl import flags
flags.FLAGS.mark_as_parsed()
from train import input_pipeline
batches = input_pipeline.train_iterator(
    {data_dir!r}, global_batch_size=8, worker_count=2, process_index=0,
    process_count=1)
next(batches)
print("ready", flush=True)
time.sleep(600)
"""
  trainer = _python(code)
  try:
    assert trainer.stdout.readline().strip() == "ready"
    workers = _children(trainer.pid)
    assert len(workers) >= 2  # the two workers (and multiprocessing's own)
  finally:
    trainer.kill()
    trainer.wait()
  # Within a second of its init; a worker still importing under a loaded
  # machine (CI) runs its init later, so the bound is generous.
  left = _still_running_after(workers, 120)
  assert not left, f"still running after the trainer: {left}"


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc")
def test_a_worker_starting_after_the_trainer_died_exits():
  # Under load a worker can still be importing when the trainer is killed;
  # its init then ran with the new parent (init, a subreaper) as the one to
  # watch, and it waited forever (seen in CI).
  code = """
import os, time
trainer = os.getpid()
if os.fork():
  os._exit(0)
while os.getppid() == trainer:
  time.sleep(0.01)
from train import input_pipeline
print(os.getpid(), flush=True)
input_pipeline.exit_with_parent(0, 2, parent=trainer)
time.sleep(600)
"""
  trainer = _python(code)
  trainer.wait()
  worker = trainer.stdout.readline().strip()
  assert worker.isdigit()
  left = _still_running_after([worker], 30)
  assert not left, "a worker orphaned before its init kept running"


def test_a_worker_leaves_ctrl_c_to_the_trainer():
  # Ctrl-C reaches the whole process group: the trainer saves and stops,
  # and each grain worker printed a KeyboardInterrupt traceback of its own.
  code = """
import os, signal, time
from train import input_pipeline
input_pipeline.exit_with_parent(0, 2, parent=os.getppid())
os.kill(os.getpid(), signal.SIGINT)
time.sleep(0.5)
print("still here", flush=True)
"""
  worker = _python(code)
  out, err = worker.communicate(timeout=120)
  assert worker.returncode == 0 and out.strip() == "still here", err


def test_worker_processes_need_parsed_flags(data_dir):
  if flags.FLAGS.is_parsed():
    pytest.skip("absl flags already parsed in this process")
  with pytest.raises(ValueError, match="absl flags parsed"):
    input_pipeline.train_iterator(data_dir, global_batch_size=8, worker_count=2)


def test_two_processes_split_each_global_batch(data_dir):
  dataset = read_pairs(input_pipeline.find_dataset_dir(data_dir), "train")
  per_host_epoch = TRAIN_SIZE // 2
  seen = []
  for process_index in range(2):
    iterator = input_pipeline.train_iterator(
        data_dir,
        global_batch_size=20,
        seed=0,
        process_index=process_index,
        process_count=2,
    )
    seen.append(
        sum(
            (batch_pairs(next(iterator)) for _ in range(per_host_epoch // 10)),
            [],
        )
    )
  assert len(seen[0]) == len(seen[1]) == per_host_epoch
  assert collections.Counter(seen[0]) + collections.Counter(
      seen[1]
  ) == collections.Counter(dataset)
  # Host batches stacked in process order are the 1-process global batch.
  single = input_pipeline.train_iterator(
      data_dir, global_batch_size=20, seed=0, process_index=0, process_count=1
  )
  stacked = []
  for batch_index in range(per_host_epoch // 10):
    stacked += (
        seen[0][batch_index * 10 : (batch_index + 1) * 10]
        + seen[1][batch_index * 10 : (batch_index + 1) * 10]
    )
  assert stacked == sum(
      (batch_pairs(next(single)) for _ in range(per_host_epoch // 10)), []
  )


def test_batch_size_must_split_across_processes(data_dir):
  with pytest.raises(ValueError, match="multiple of process_count=3"):
    input_pipeline.train_iterator(
        data_dir, global_batch_size=8, process_index=0, process_count=3
    )
  with pytest.raises(ValueError, match="process_index"):
    input_pipeline.train_iterator(
        data_dir, global_batch_size=8, process_index=2, process_count=2
    )


def test_train_skips_examples_longer_than_max_len(data_dir):
  dataset = read_pairs(input_pipeline.find_dataset_dir(data_dir), "train")
  short = {pair for pair in dataset if len(pair[1]) <= 1}
  assert 8 <= len(short) < len(dataset)  # the data has both kinds
  iterator = input_pipeline.train_iterator(
      data_dir,
      global_batch_size=8,
      max_answer_len=1,
      process_index=0,
      process_count=1,
  )
  seen = sum((batch_pairs(next(iterator)) for _ in range(3)), [])
  assert set(seen) <= short
  evaluated = [
      answer
      for batch in input_pipeline.eval_batches(
          data_dir, global_batch_size=8, max_answer_len=1
      )
      for answer, valid in zip(batch["answers"], batch["valid"])
      if valid
  ]
  assert evaluated and all(len(answer) <= 1 for answer in evaluated)


def test_eval_batches_cover_test_split_in_order(data_dir):
  test = read_pairs(input_pipeline.find_dataset_dir(data_dir), "test")
  batches = list(
      input_pipeline.eval_batches(
          data_dir, global_batch_size=32, process_index=0, process_count=1
      )
  )
  assert len(batches) == 4  # ceil(100 / 32)
  prompt_len = input_pipeline.prompt_length()
  for batch in batches:
    assert (
        batch["prompts"].shape == (32, prompt_len)
        and batch["prompts"].dtype == np.int32
    )
    assert (
        batch["prompt_lengths"].shape == (32,)
        and batch["prompt_lengths"].dtype == np.int32
    )
    assert batch["valid"].shape == (32,) and batch["valid"].dtype == bool
    assert len(batch["answers"]) == len(batch["questions"]) == 32
  assert [int(batch["valid"].sum()) for batch in batches] == [32, 32, 32, 4]
  answers = [
      a
      for batch in batches
      for a, v in zip(batch["answers"], batch["valid"])
      if v
  ]
  assert answers == [answer for _, answer in test]
  first = batches[0]
  for row in range(3):
    length = first["prompt_lengths"][row]
    assert first["prompts"][row, 0] == tokenizer.BOS_ID
    assert first["prompts"][row, length - 1] == tokenizer.SEP_ID
    assert (
        tokenizer.decode(first["prompts"][row, :length])
        == test[row][0] + tokenizer.SEP_TEXT
    )
    assert all(first["prompts"][row, length:] == tokenizer.PAD_ID)
  last = batches[-1]
  assert last["answers"][4:] == [""] * 28 and all(
      last["prompt_lengths"][4:] == 2
  )


def test_eval_batches_two_processes(data_dir):
  test = read_pairs(input_pipeline.find_dataset_dir(data_dir), "test")
  per_process = [
      list(
          input_pipeline.eval_batches(
              data_dir, global_batch_size=24, process_index=i, process_count=2
          )
      )
      for i in range(2)
  ]
  assert (
      len(per_process[0]) == len(per_process[1]) == 5
  )  # ceil(ceil(100 / 2) / 12)
  answers = [
      [
          a
          for batch in batches
          for a, v in zip(batch["answers"], batch["valid"])
          if v
      ]
      for batches in per_process
  ]
  assert answers[0] == [a for _, a in test[0::2]] and answers[1] == [
      a for _, a in test[1::2]
  ]


# --- errors ------------------------------------------------------------------


@pytest.mark.parametrize("make_dir", ["missing", "empty"])
def test_bad_data_dir_tells_how_to_prepare(tmp_path, make_dir):
  path = tmp_path / "data"
  if make_dir == "empty":
    path.mkdir()
  with pytest.raises(
      FileNotFoundError, match="python -m train.prepare_data --data_dir="
  ) as error:
    input_pipeline.train_iterator(str(path), global_batch_size=8)
  assert "\n" not in str(error.value)
  with pytest.raises(FileNotFoundError, match="python -m train.prepare_data"):
    next(input_pipeline.eval_batches(str(path), global_batch_size=8))


def test_empty_data_dir_argument_raises():
  with pytest.raises(ValueError, match="python -m train.prepare_data"):
    input_pipeline.find_dataset_dir("")


def test_several_configs_need_a_name(data_dir, tmp_path):
  arithmetic_data.prepare(str(tmp_path), 6, 3, seed=0)
  arithmetic_data.prepare(str(tmp_path), 6, 3, seed=1)
  with pytest.raises(ValueError, match="--config.dataset_config=NAME"):
    input_pipeline.find_dataset_dir(str(tmp_path))
  assert sorted(
      input_pipeline.prepared_configs(str(tmp_path), "arithmetic_mix")
  ) == ["train6_test3_seed0", "train6_test3_seed1"]
  chosen = input_pipeline.find_dataset_dir(
      str(tmp_path), config_name="train6_test3_seed1"
  )
  assert chosen.parent.name == "train6_test3_seed1"
  with pytest.raises(FileNotFoundError, match="train6_test3_seed9"):
    input_pipeline.find_dataset_dir(
        str(tmp_path), config_name="train6_test3_seed9"
    )


def test_unknown_split_raises(data_dir):
  with pytest.raises(ValueError, match="split must be one of"):
    input_pipeline.load_split(data_dir, "validation")


# --- chunk mode: numbers in tokens of 1-3 digits ------------------------------


def test_chunks_split_digit_runs_from_the_left_and_decode_back():
  for text, pieces in [
      ("1234567", ["123", "456", "7"]),
      ("x-007+12", ["x", "-", "007", "+", "12"]),
      ("3.1415", ["3", ".", "141", "5"]),
      ("10000", ["100", "00"]),
  ]:
    ids = tokenizer.encode(text, chunks=True)
    assert [tokenizer.decode([i]) for i in ids] == pieces
    assert tokenizer.decode(ids) == text
  # Without chunks, one id per character as before.
  assert tokenizer.encode("1234") == [1, 2, 3, 4]


def test_chunk_number_tokens_are_those_the_library_finds():
  # The chunk vocabulary as a tokenizer's pieces: ntil_jax.number_tokens
  # reads the same ids, values and widths from it.
  pieces = [None] * tokenizer.CHUNK_VOCAB_SIZE
  for char, token_id in tokenizer.vocab().items():
    pieces[token_id] = char
  for token_id in range(tokenizer.VOCAB_SIZE, tokenizer.CHUNK_VOCAB_SIZE):
    pieces[token_id] = tokenizer.decode([token_id])
  found = ntil_jax.number_tokens(pieces)
  ours = tokenizer.number_tokens()
  by_id = lambda t: sorted(zip(t.ids, t.values, t.widths))
  assert by_id(ours) == by_id(found) and len(found.ids) == 1110


def test_chunked_examples_mark_every_number_token_of_the_answer():
  batch = input_pipeline.encode_examples(
      ["What is 1000 + 234?"], ["1234"], chunks=True
  )
  targets = batch["targets"][0]
  answer = targets[batch["loss_mask"][0]].tolist()
  assert answer[-1] == tokenizer.EOS_ID
  assert [tokenizer.decode([i]) for i in answer[:-1]] == ["123", "4"]
  assert targets[batch["digit_mask"][0]].tolist() == answer[:-1]
  prompts, lengths = input_pipeline.encode_prompts(
      ["What is 1000 + 234?"], chunks=True
  )
  # BOS, "What is " (8), 100|0, " + " (3), 234, "?", SEP.
  assert lengths.tolist() == [1 + 8 + 2 + 3 + 1 + 1 + 1]
  assert (
      tokenizer.decode(prompts[0][1 : lengths[0] - 1]) == "What is 1000 + 234?"
  )


def test_chunked_texts_of_a_batch_never_join_their_digits():
  # Encoded at once, texts keep their own numbers: "12" then "345" is not
  # the run "12345" cut as 123|45.
  texts = ["12", "", "345", "x9", "1000000", "7"]
  batch = input_pipeline.encode_examples(
      ["q"] * len(texts), texts, max_question_len=4, chunks=True
  )
  for row, text in enumerate(texts):
    answer = batch["targets"][row][batch["loss_mask"][row]][:-1]
    assert answer.tolist() == tokenizer.encode(text, chunks=True)
    assert tokenizer.decode(answer) == text


def test_first_examples_count_what_they_pass_over():
  # 10 examples, 3, 5 and 6 too long.
  usable = np.array([0, 1, 2, 4, 7, 8, 9])
  indices, skipped = input_pipeline.first_examples(usable, 4, 10)
  assert indices.tolist() == [0, 1, 2, 4] and skipped == 1  # example 3
  indices, skipped = input_pipeline.first_examples(usable, 5, 10)
  assert indices.tolist() == [0, 1, 2, 4, 7] and skipped == 3
  for limit in (0, 7, 20):  # every usable one: every long one skipped
    indices, skipped = input_pipeline.first_examples(usable, limit, 10)
    assert indices.tolist() == usable.tolist() and skipped == 3


def test_eval_batches_say_how_many_long_questions_they_skip(data_dir):
  test = read_pairs(input_pipeline.find_dataset_dir(data_dir), "test")
  limit = sorted(len(q) for q, _ in test)[len(test) // 2]  # about half fit
  fits = [len(q) <= limit for q, _ in test]
  want = 10
  passed_over = fits.index(True)  # the index of the 10th that fits, + 1
  for _ in range(want - 1):
    passed_over = fits.index(True, passed_over + 1)
  for max_examples, skipped in (
      (0, fits.count(False)),
      (want, passed_over + 1 - want),
  ):
    batches = list(
        input_pipeline.eval_batches(
            data_dir,
            global_batch_size=8,
            max_question_len=limit,
            max_examples=max_examples,
            process_index=0,
            process_count=1,
        )
    )
    assert {b["skipped_examples"] for b in batches} == {skipped}
    scored = sum(int(b["valid"].sum()) for b in batches)
    assert scored == (max_examples or fits.count(True))
  assert 0 < passed_over + 1 - want < fits.count(False)
