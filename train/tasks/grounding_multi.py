"""grounding_multi: every box of a colour, F1 at IoU 0.5; see grounding.py."""

from train.tasks import grounding

_TASK = grounding.GroundingTask("grounding_multi")
NAME = _TASK.name
prepare = _TASK.prepare
dataset_config_name = _TASK.dataset_config_name
check_config = _TASK.check_config
check_data = _TASK.check_data
model_fields = _TASK.model_fields
train_iterator = _TASK.train_iterator
render_stream = _TASK.render_stream
eval_batches = _TASK.eval_batches
score_answers = _TASK.score_answers
summarize = _TASK.summarize
headline = _TASK.headline
