"""clock_time: read an analog clock (image prefix) as H_MM text.

  python -m train.prepare_data --task=clock_time --data_dir=DIR \
      --train_size=20000 --test_size=1000
  python -m train.main --config=configs/clock_time.py:ntil --workdir=W \
      --config.data_dir=DIR

Variants ``:ce``, ``:emd``, ``:ntl_mse``, ``:soft_label`` and ``:ntil`` set
``method``. The defaults are the budget of the CPU experiment
(experiments/clock_time): a 0.18M-parameter model (4 stride-2 convs, 9 image
tokens, a 2-layer decoder), 600 steps of 128 clocks, about 80 s on 2 cores,
where CE reads about half of the test clocks exactly.
"""

import ml_collections

from configs import common

METHODS = common.METHODS
# Clocks prepared for training (train.prepare_data --train_size) and tested.
TRAIN_SIZE = 20000


def get_config(method: str = "ntil") -> ml_collections.ConfigDict:
  """Returns the config for one loss ``method``."""
  config = common.base_config(common.check_method(method))
  config.task = "clock_time"
  config.max_question_len = 1  # the prompt is BOS SEP: no question text
  config.max_answer_len = 5  # 12_55
  config.image_size = 48
  config.image_channels = (16, 32, 64)
  config.model = "tiny"
  config.batch_size = 128
  config.train_steps = 600
  config.learning_rate = 3e-3
  config.warmup_steps = 50
  config.log_every_steps = 25
  config.eval_every_steps = 150
  config.checkpoint_every_steps = 300
  config.eval_batch_size = 250
  config.eval_examples = 1000
  return config
