r"""Steps/s of streamed training (``train_stream``) against a prepared split.

    python -m benchmarks.stream --task=clock_time --steps=300
    python -m benchmarks.stream --task=grounding --steps=300

Trains the grid's CPU cell (experiments/clock_time or experiments/grounding,
NTIL, seed 0: 128 a batch) for ``--steps`` steps, without evaluation, once
per ``--modes`` entry in that order: ``fixed`` reads the prepared train
split (20,000 clocks, 5,000 scenes), ``stream`` renders every example as it
is read. Prints one JSON line per run: steps/s (median over the logged
windows after the first, which holds the compilation) and the data alone
(batches/s taken from the train iterator, 30 batches). One XLA thread, as
the grids' workers run; start two at once to measure ``--workers=2``.
"""

import json
import os
import tempfile
import time

from absl import app
from absl import flags
import numpy as np

FLAGS = flags.FLAGS
flags.DEFINE_enum("task", "clock_time", ["clock_time", "grounding"], "Task.")
flags.DEFINE_integer("steps", 300, "Train steps a run.")
flags.register_validator(
    "steps",
    lambda steps: steps >= 50,
    "--steps must be at least 50: steps/s is the median of the rates logged "
    "every 25 steps after the first (which holds the compile).",
)
flags.DEFINE_list("modes", ["fixed", "stream"], "fixed and/or stream.")
flags.DEFINE_string("data_dir", "data", "Where the data is (or goes).")
flags.DEFINE_string("workdir", None, "Runs go here (default: a temp dir).")
flags.DEFINE_boolean(
    "one_xla_thread", True, "One XLA thread, as the grids' workers."
)
# experiments.common.ONE_THREAD_XLA, set before anything imports JAX.
ONE_THREAD_XLA = (
    "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
)


def cell(task, stream, data_dir):
  """The grid's CPU cell (NTIL, seed 0) and its task module."""
  # pylint: disable=g-import-not-at-top
  from experiments.clock_time import grid as clock_grid
  from experiments.grounding import grid as grounding_grid
  from train import tasks

  overrides = dict(train_stream=True) if stream else {}
  if task == "clock_time":
    config = clock_grid.cell_config("cpu", "ntil", 0, overrides, data_dir)
    train_size = clock_grid.PROFILES["cpu"]["train_size"]
    test_size = clock_grid.PROFILES["cpu"]["test_size"]
  else:
    config = grounding_grid.cell_config(
        "cpu", task, "ntil", 0, overrides, data_dir
    )
    train_size = grounding_grid.PROFILES["cpu"]["train_size"][task]
    test_size = grounding_grid.PROFILES["cpu"]["test_size"]
  module = tasks.get(task)
  module.prepare(data_dir, 0 if stream else train_size, test_size)
  return config, module


def measure(task, mode, steps, data_dir, run_dir):
  from train import train  # pylint: disable=g-import-not-at-top

  config, module = cell(task, mode == "stream", data_dir)
  batches = module.train_iterator(config, process_index=0, process_count=1)
  next(batches)
  start = time.perf_counter()
  for _ in range(30):
    next(batches)
  data_rate = 30 / (time.perf_counter() - start)
  batches.close()
  config.train_steps = steps
  config.eval_every_steps = 0
  config.checkpoint_every_steps = steps
  config.log_every_steps = 25
  start = time.perf_counter()
  train.train_and_evaluate(config, run_dir)
  wall = time.perf_counter() - start
  with open(os.path.join(run_dir, "metrics.jsonl")) as f:
    rates = [
        record["steps_per_second"]
        for record in map(json.loads, f)
        if "steps_per_second" in record
    ][1:]
  return dict(
      task=task,
      mode=mode,
      steps=steps,
      steps_per_second=round(float(np.median(rates)), 2),
      data_batches_per_second=round(data_rate, 1),
      wall_seconds=round(wall, 1),
  )


def main(argv):
  del argv
  if FLAGS.one_xla_thread:  # before JAX starts its backend
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " " + ONE_THREAD_XLA
    ).strip()
  from train import logs  # pylint: disable=g-import-not-at-top

  logs.quiet_terminal()
  workdir = FLAGS.workdir or tempfile.mkdtemp(prefix="stream-bench-")
  for index, mode in enumerate(FLAGS.modes):
    run_dir = os.path.join(
        workdir, f"{FLAGS.task}-{mode}-{os.getpid()}-{index}"
    )
    result = measure(FLAGS.task, mode, FLAGS.steps, FLAGS.data_dir, run_dir)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
  app.run(main)
