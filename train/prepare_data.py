r"""Generates a task's data set locally, into a TFDS array_record dataset.

  python -m train.prepare_data --task=clock_time --data_dir=data \
      --train_size=20000 --test_size=1000 --seed=0

``--task`` is any task of `train.tasks.TASKS` (default ``arithmetic_mix``);
each task's ``prepare`` does the work (arithmetic: `train.arithmetic_data`,
which needs the ``arithmetic-data`` extra; clocks: a NumPy renderer). Nothing
is downloaded, and an existing dataset is reused. Prints the dataset's
directory.

Arithmetic takes another mathematics_dataset module and a difficulty, and
draws in several processes with the same result as in one::

  python -m train.prepare_data --data_dir=data --module=arithmetic__add_or_sub \
      --difficulty=easy --train_size=200000 --test_size=2000 --workers=2

Train on it with ``--config.dataset_config=add_or_sub-easy_train200000_test2000_seed0``.

The tasks that render their data (clock_time, grounding, grounding_single,
grounding_multi) take ``--train_size=0``: the test split alone, for runs
with ``--config.train_stream=True`` that render their train examples as
they read them (`train.streams`)::

  python -m train.prepare_data --task=clock_time --data_dir=data \
      --train_size=0 --test_size=1000
"""

import inspect

from absl import app
from absl import flags

from train import logs
from train import tasks


def define_flags() -> None:
  """Defines the flags; only when run as a script, so importers keep theirs."""
  flags.DEFINE_enum(
      "task",
      "arithmetic_mix",
      sorted(tasks.TASKS),
      "Which task's data set to generate.",
  )
  flags.DEFINE_string(
      "data_dir", None, "Directory to write the TFDS dataset under."
  )
  flags.DEFINE_integer("train_size", None, "Number of train examples.")
  flags.DEFINE_integer("test_size", None, "Number of test examples.")
  flags.DEFINE_integer("seed", 0, "Seed of the task's generator.")
  flags.DEFINE_integer(
      "workers", 1, "Processes drawing the problems (arithmetic only)."
  )
  flags.DEFINE_string(
      "module",
      None,
      "arithmetic_mix: a mathematics_dataset module (default "
      "arithmetic__mixed), e.g. arithmetic__add_or_sub.",
  )
  flags.DEFINE_enum(
      "difficulty",
      None,
      ["easy", "medium", "hard"],
      "arithmetic_mix: draw train and test at this train difficulty (default:"
      " the paper's mix, train in equal thirds, test 'interpolate').",
  )
  flags.mark_flags_as_required(["data_dir", "train_size", "test_size"])


def _options(config, prepare) -> dict:
  """The optional flags that were set, for a ``prepare`` that takes them."""
  options = dict(
      module=config.module,
      difficulty=config.difficulty,
      workers=None if config.workers == 1 else config.workers,
  )
  options = {k: v for k, v in options.items() if v is not None}
  takes = inspect.signature(prepare).parameters
  refused = sorted(set(options) - set(takes))
  if refused:
    raise ValueError(
        f"--{' --'.join(refused)} is for arithmetic_mix, not --task="
        f"{config.task}."
    )
  return options


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  logs.quiet_terminal()
  config = flags.FLAGS
  prepare = tasks.get(config.task).prepare
  try:
    path = prepare(
        config.data_dir,
        config.train_size,
        config.test_size,
        config.seed,
        **_options(config, prepare),
    )
  except (ValueError, ImportError) as error:
    # A bad size or option, or the task's generator not installed: one
    # line, not the flags' help above it.
    raise SystemExit(f"error: {error}") from error
  print(path)


if __name__ == "__main__":
  define_flags()
  app.run(main)
