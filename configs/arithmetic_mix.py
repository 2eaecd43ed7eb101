"""arithmetic_mix: train a small decoder from scratch with a numeric loss.

Variants by the argument after the colon, one per loss method::

  python -m train.main --config=configs/arithmetic_mix.py:ntil --workdir=W \
      --config.data_dir=DIR --config.model=tiny --config.train_steps=N

``:ce``, ``:emd``, ``:ntl_mse``, ``:soft_label`` and ``:ntil`` set ``method``;
every other field is overridden with ``--config.FIELD=VALUE`` (see
configs/common.py for the shared ones).
"""

import ml_collections

from configs import common

METHODS = common.METHODS
PEER_METHODS = common.PEER_METHODS
loss_kwargs = common.loss_kwargs


def get_config(method: str = "ntil") -> ml_collections.ConfigDict:
  """Returns the config for one loss ``method``."""
  config = common.base_config(common.check_method(method))
  config.task = "arithmetic_mix"
  config.max_question_len = 80  # longer ones are skipped
  config.max_answer_len = 12
  # Numbers in tokens of 1-3 digits, greedily from the left as Llama 3 and
  # GPT-4o write them (train/tokenizer.py); the losses score each as one
  # number (ntil_jax.number_tokens). False: one token per character.
  config.digit_chunks = False
  return config
