"""train/generated_data.py: the configs of the locally generated datasets."""

import pytest

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
