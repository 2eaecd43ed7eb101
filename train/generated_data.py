"""The base of the TFDS builders of data generated here (nothing downloaded).

Our builders live in a package and are read back with
``tfds.builder_from_directory``; they share two fixes to TFDS defaults:

* TFDS looks up a builder's source file with the ``importlib_resources``
  backport on Python >= 3.9 (tfds 4.9.10 bug) when the builder lives in a
  package; ``code_path`` here asks Python for the subclass's file instead.
* TFDS prints "Downloading and preparing dataset ..." and "Dataset ...
  downloaded and prepared ..." to stdout for every builder; ours download
  nothing, so the banners become log lines.
"""

import contextlib
import dataclasses
import fcntl
import inspect
import os

from absl import logging
from etils import epath
import tensorflow_datasets as tfds
from tensorflow_datasets.core import utils as tfds_utils

from train import errors
from train import logs


@dataclasses.dataclass
class SplitSizes(tfds.core.BuilderConfig):
  """Builder config: the split sizes and the seed that fix the content."""

  train_size: int = 0
  test_size: int = 0
  seed: int = 0


def config_name(train_size: int, test_size: int, seed: int = 0) -> str:
  """A dataset config's name, e.g. 'train20000_test1000_seed0'."""
  return f"train{train_size}_test{test_size}_seed{seed}"


def split_sizes(
    train_size: int, test_size: int, seed: int, unit: str
) -> SplitSizes:
  """The checked config of a rendered dataset (``unit``: 'clocks', ...).

  ``train_size=0`` is allowed: the test split alone, for runs that render
  their training examples as they read them (``train_stream``).
  """
  if train_size < 0 or test_size <= 0:
    raise ValueError(
        "train_size must be >= 0 and test_size positive, got "
        f"{train_size} and {test_size}."
    )
  if seed < 0:
    raise ValueError(f"seed must be non-negative, got {seed}.")
  return SplitSizes(
      name=config_name(train_size, test_size, seed),
      description=f"{train_size} train, {test_size} test {unit}, seed {seed}.",
      train_size=train_size,
      test_size=test_size,
      seed=seed,
  )


def as_str(value) -> str:
  """A text feature as read back (bytes) or as written (str), as str."""
  return value.decode("utf-8") if isinstance(value, bytes) else value


class GeneratedBuilder(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  """A `GeneratorBasedBuilder` for data generated locally (abstract).

  Its config has ``train_size``, ``test_size`` and ``seed`` (`SplitSizes` or
  a subclass); a subclass writes ``_generate_examples(split, size, seed)``.
  A split of size 0 is not written.
  """

  @tfds_utils.classproperty
  @classmethod
  def code_path(cls) -> epath.Path:
    return epath.Path(inspect.getfile(cls))

  def _log_download_bytes(self):
    logging.info("generating %s into %s", self.name, self.data_dir)

  def _log_download_done(self):
    logs.file_only("generated %s in %s", self.name, self.data_dir)

  def _split_generators(self, dl_manager):
    del dl_manager  # nothing to download
    config = self.builder_config
    return {
        split: self._generate_examples(split, size, config.seed)
        for split, size in (
            ("train", config.train_size),
            ("test", config.test_size),
        )
        if size
    }


@contextlib.contextmanager
def preparation_lock(builder):
  """Holds an exclusive ``flock`` on ``builder``'s dataset while it is made.

  The lock file is ``DATA_DIR/<name>/<config>/.lock``, beside the version
  folders (TFDS reads none but those); the kernel drops the lock when its
  holder exits, however it exits, so it is never stale.
  """
  # data_dir is DATA_DIR/<name>/<config>/<version>.
  folder = os.path.dirname(str(builder.data_dir))
  os.makedirs(folder, exist_ok=True)
  path = os.path.join(folder, ".lock")
  fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
  try:
    fcntl.flock(fd, fcntl.LOCK_EX)
    yield
  finally:
    os.close(fd)  # releases the lock


def _check_no_file_in_the_way(folder) -> None:
  """ConfigError if a file stands where ``folder`` or a folder above it
  would be (a ``--data_dir`` that names a file): a raw NotADirectoryError
  from deep in the preparation, else."""
  path = os.path.abspath(folder)
  while not os.path.exists(path) and os.path.dirname(path) != path:
    path = os.path.dirname(path)
  if not os.path.isdir(path):
    raise errors.ConfigError(
        f"{path} is a file, not a directory: the data would go in {folder}."
    )


def prepare(builder, plot_samples=None, num_samples: int = 24) -> str:
  """Writes ``builder``'s dataset unless it exists; its directory.

  Safe with several processes at once (the grids' workers, two grids on one
  data folder): the first to come writes the dataset under
  `preparation_lock` while the others wait, then reuse it.

  Args:
    builder: a `GeneratedBuilder` with its data_dir and config.
    plot_samples: if given, ``plot_samples(records, path)`` draws the first
      ``num_samples`` test records into ``samples.png`` beside the dataset's
      version folders, unless that file exists.
    num_samples: how many test records ``plot_samples`` gets at most.
  """
  _check_no_file_in_the_way(str(builder.data_dir))
  samples = os.path.join(os.path.dirname(str(builder.data_dir)), "samples.png")
  ready = builder.is_prepared() and (
      plot_samples is None or os.path.exists(samples)
  )
  if ready:
    logging.info("Reusing existing dataset at %s", builder.data_dir)
    return str(builder.data_dir)
  with preparation_lock(builder):
    if builder.is_prepared():
      logging.info("Reusing existing dataset at %s", builder.data_dir)
      # Another process may have written it since ``builder`` was made.
      builder.info.read_from_directory(builder.data_dir)
    else:
      builder.download_and_prepare()
      logging.info("Wrote dataset to %s", builder.data_dir)
    if plot_samples is not None and not os.path.exists(samples):
      source = builder.as_data_source(split="test")
      count = min(num_samples, len(source))
      plot_samples(source.__getitems__(list(range(count))), samples)
  return str(builder.data_dir)
