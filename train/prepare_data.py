r"""Generates a task's data set locally, into a TFDS array_record dataset.

  python -m train.prepare_data --task=clock_time --data_dir=data \
      --train_size=20000 --test_size=1000 --seed=0

``--task`` is any task of `train.tasks.TASKS` (default ``arithmetic_mix``);
each task's ``prepare`` does the work (arithmetic: `train.arithmetic_data`,
which needs the ``arithmetic-data`` extra; clocks: a NumPy renderer). Nothing
is downloaded, and an existing dataset is reused. Prints the dataset's
directory.
"""

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
  flags.mark_flags_as_required(["data_dir", "train_size", "test_size"])


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  logs.quiet_terminal()
  config = flags.FLAGS
  try:
    path = tasks.get(config.task).prepare(
        config.data_dir, config.train_size, config.test_size, config.seed
    )
  except ValueError as error:
    raise app.UsageError(str(error)) from error
  except ImportError as error:  # the task's generator is not installed
    raise SystemExit(f"error: {error}") from error
  print(path)


if __name__ == "__main__":
  define_flags()
  app.run(main)
