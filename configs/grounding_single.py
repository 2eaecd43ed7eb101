"""grounding_single: configs/grounding.py with ``task='grounding_single'``.

  python -m train.main --config=configs/grounding_single.py:ntil --workdir=W \
      --config.data_dir=DIR
"""

import ml_collections

from configs import grounding

METHODS = grounding.METHODS


def get_config(method: str = "ntil") -> ml_collections.ConfigDict:
  """Returns the config for one loss ``method``."""
  return grounding.get_config(method, task="grounding_single")
