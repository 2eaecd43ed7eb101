"""train/generated_data.py: the configs of the locally generated datasets."""

import threading

import numpy as np
import pytest
import tensorflow_datasets as tfds

from train import errors
from train import generated_data


def test_split_sizes_names_and_describes_the_content():
  config = generated_data.split_sizes(0, 24, 3, "clocks")
  assert config.name == "train0_test24_seed3"  # the folder under the task's
  assert config.description == "0 train, 24 test clocks, seed 3."
  assert (config.train_size, config.test_size, config.seed) == (0, 24, 3)


@pytest.mark.parametrize(
    "train_size, test_size, seed, message",
    [
        (-1, 24, 0, "train_size must be >= 0 and test_size positive"),
        (10, 0, 0, "train_size must be >= 0 and test_size positive"),
        (10, 24, -1, "seed must be non-negative, got -1"),
    ],
)
def test_split_sizes_refuses_bad_sizes(train_size, test_size, seed, message):
  with pytest.raises(ValueError, match=message):
    generated_data.split_sizes(train_size, test_size, seed, "scenes")


def test_text_read_back_as_bytes_is_str():
  assert generated_data.as_str(b"3_07") == "3_07"
  assert generated_data.as_str("3_07") == "3_07"


class _Numbers(generated_data.GeneratedBuilder, skip_registration=True):
  """A tiny generated dataset: the numbers 0..test_size-1."""

  VERSION = tfds.core.Version("1.0.0")
  BUILDER_CONFIG_CLASS = generated_data.SplitSizes

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
        builder=self,
        features=tfds.features.FeaturesDict(
            {"value": tfds.features.Scalar(dtype=np.int64)}
        ),
        disable_shuffling=True,
    )

  def _generate_examples(self, split, size, seed):
    del split
    for index in range(size):
      yield index, {"value": index + seed}


def _numbers(data_dir):
  return _Numbers(
      data_dir=str(data_dir),
      config=generated_data.split_sizes(0, 4, 0, "numbers"),
      file_format="array_record",
  )


def test_a_dataset_being_prepared_elsewhere_is_waited_for(tmp_path):
  """Two grids preparing the same data at once: the second used to write it
  too and fail on TFDS's final rename; now it waits, then reuses it."""
  first, second = _numbers(tmp_path), _numbers(tmp_path)  # none on disk yet
  failures = []

  def prepare_second():
    try:
      generated_data.prepare(second)
    except Exception as error:  # pylint: disable=broad-except
      failures.append(error)

  waiting = threading.Thread(target=prepare_second)
  with generated_data.preparation_lock(first):  # "another process" writes
    waiting.start()
    waiting.join(0.5)
    assert waiting.is_alive()  # it waits for the lock
    first.download_and_prepare()
  waiting.join(60)
  assert not waiting.is_alive() and not failures, failures
  source = second.as_data_source(split="test")
  assert [int(source[i]["value"]) for i in range(len(source))] == [0, 1, 2, 3]


def test_a_data_dir_that_is_a_file_is_named(tmp_path):
  """It raised NotADirectoryError from the preparation lock's makedirs (a
  traceback from the grids and prepare_data; train.main checked it)."""
  afile = tmp_path / "data"
  afile.write_text("not a folder")
  builder = _numbers(afile / "under")
  with pytest.raises(errors.ConfigError, match=f"{afile} is a file, not a dir"):
    generated_data.prepare(builder)
  assert afile.read_text() == "not a folder"
