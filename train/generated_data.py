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

import inspect

from absl import logging
from etils import epath
import tensorflow_datasets as tfds
from tensorflow_datasets.core import utils as tfds_utils

from train import logs


class GeneratedBuilder(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  """A `GeneratorBasedBuilder` for data generated locally (abstract)."""

  @tfds_utils.classproperty
  @classmethod
  def code_path(cls) -> epath.Path:
    return epath.Path(inspect.getfile(cls))

  def _log_download_bytes(self):
    logging.info("generating %s into %s", self.name, self.data_dir)

  def _log_download_done(self):
    logs.file_only("generated %s in %s", self.name, self.data_dir)
