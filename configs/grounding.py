"""grounding: the box of the object a text query names in a rendered scene.

  python -m train.prepare_data --task=grounding --data_dir=DIR \
      --train_size=5000 --test_size=1000
  python -m train.main --config=configs/grounding.py:ntil --workdir=W \
      --config.data_dir=DIR

Variants ``:ce``, ``:emd``, ``:ntl_mse``, ``:soft_label`` and ``:ntil`` set
``method``. configs/grounding_single.py (one object: localisation only) and
configs/grounding_multi.py (every box of a colour, F1 at IoU 0.5) are this
config for the other two grounding tasks (`get_config`'s ``task``); see
train/tasks/grounding.py.

Image: 48 x 48 RGB, read by a patch encoder (12 x 12 patches with x/y
coordinate channels, 16 image tokens). The defaults are the budget of the
CPU experiment (experiments/grounding, budget.md): the tiny decoder
(0.17M parameters), 1,200 steps of 128 scenes from 5,000 train scenes (1,000
for grounding_single), about 4-5 minutes on one CPU core; there CE's test
Acc@0.5 levels off (about a third for grounding, two thirds for
grounding_single) because the scenes are used up, not the schedule.
"""

import ml_collections

from configs import common

METHODS = common.METHODS
TASKS = ("grounding", "grounding_single", "grounding_multi")
# Scenes prepared for training (train.prepare_data --train_size) per task: on
# 20,000 one object is solved, so grounding_single has 1,000.
TRAIN_SIZES = dict(grounding=5000, grounding_single=1000, grounding_multi=5000)
# Longest query and answer of each task (train/tasks/grounding_scenes.py).
_QUESTION_LEN = dict(grounding=15, grounding_single=15, grounding_multi=6)
_ANSWER_LEN = dict(grounding=11, grounding_single=11, grounding_multi=35)


def get_config(
    method: str = "ntil", task: str = "grounding"
) -> ml_collections.ConfigDict:
  """Returns the config for one loss ``method`` on one grounding ``task``."""
  if task not in TASKS:
    raise ValueError(f"unknown task {task!r}; choose one of {TASKS}.")
  config = common.base_config(common.check_method(method))
  config.task = task
  config.max_question_len = _QUESTION_LEN[task]  # 'yellow triangle'
  config.max_answer_len = _ANSWER_LEN[task]  # '03,17,25,40'
  config.image_size = 48
  # Grounding only (not in common.base_config): the image encoder.
  config.image_encoder = "patch"  # or 'conv' (clock_time's 3 strided convs)
  config.patch_size = 12
  config.image_channels = ()  # the patch MLP's hidden widths: one linear map
  config.model = "tiny"
  config.batch_size = 128
  config.train_steps = 1200
  config.learning_rate = 3e-3
  config.warmup_steps = 50
  config.log_every_steps = 25
  config.eval_every_steps = 200
  config.checkpoint_every_steps = 400
  config.eval_batch_size = 250
  config.eval_examples = 1000
  return config
