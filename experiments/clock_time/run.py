r"""The clock_time comparison: every method paired by seed, controls, ablations.

  python -m experiments.clock_time.run                    # the CPU grid
  python -m experiments.clock_time.run --groups=main      # main table only
  python -m experiments.clock_time.report                 # results.md, plots

Trains the same model from scratch on the same rendered clocks with each loss
and seed. A seed fixes the initialisation and the data order, so the runs of
one seed differ only by their loss (paired). Groups, in run order:

* ``main``: CE, CE + EMD, CE + NTL-MSE, CE + soft labels, CE + NTIL;
* ``control``: CE with weight 1 + lambda on digit tokens
  (``ce_digit_weighted``: more gradient on digits, no ordinal structure) and
  NTIL with the authors' scaling (``ntil_reference``);
* ``ablation`` (the paper's Table 6): NTIL without place-value weighting
  (``exp_off``, sigma=0), relative deviation (``rel_off``) or magnitude
  deviation (``mag_off``);
* ``sweep`` (Table 8): sigma 0.1 and 0.5 (sigma 0 is ``exp_off``), lambda
  0.1 and 1.0;
* ``long``: CE and NTIL with twice the steps.

Each finished run is appended to ``results.json`` at once (with its test
predictions and curves), so an interrupted grid resumes where it stopped (a
half-trained run resumes from its checkpoint); runs whose config hash is
already recorded are skipped.
"""

import os
import sys

from absl import app
from absl import flags
from absl import logging
import jax

from configs import clock_time
from experiments import common
from experiments.clock_time import grid as grid_lib
from train import logs
from train import train
from train.tasks import clock_time as task

HERE = os.path.dirname(os.path.abspath(__file__))
FLAGS = flags.FLAGS
flags.DEFINE_enum(
    "profile", "cpu", ["cpu", "smoke"], "Grid size (smoke: seconds, for tests)."
)
flags.DEFINE_list(
    "groups",
    [
        "converged",
        "converged_control",
        "main",
        "control",
        "ablation",
        "sweep",
        "long",
        "convergence_check",
    ],
    "Which parts of the grid to run, in this order.",
)
flags.DEFINE_string(
    "results",
    os.path.join(HERE, "results.json"),
    "Results file (one record per finished run).",
)
flags.DEFINE_string(
    "runs_dir",
    os.path.join(HERE, "runs"),
    "Work directories of the runs (not in git).",
)
flags.DEFINE_string("data_dir", "data", "Rendered clocks.")
flags.DEFINE_integer("max_runs", 0, "Stop after this many new runs (0: all).")
flags.DEFINE_integer(
    "workers",
    1,
    "Processes running the grid at once, one XLA thread each (2 on a "
    "2-core machine trains about twice as fast as 1).",
)


def run_config(profile, method, seed, overrides, data_dir):
  settings = grid_lib.PROFILES[profile]
  config = clock_time.get_config(method)
  config.data_dir = data_dir
  config.dataset_config = task.config_name(
      settings["train_size"], settings["test_size"], 0
  )
  config.train_steps = settings["train_steps"]
  config.batch_size = settings["batch_size"]
  config.seed = seed
  config.log_every_steps = min(25, settings["train_steps"])
  config.eval_every_steps = settings["eval_every_steps"]
  config.checkpoint_every_steps = settings["train_steps"] // 2 or 1
  config.eval_examples = 0  # the whole test split
  config.eval_batch_size = min(250, settings["test_size"])
  config.num_samples = 0
  for name, value in overrides.items():
    config[name] = value
  return config


def run_one(profile, group, variant, method, seed, overrides, digest):
  config = run_config(profile, method, seed, overrides, FLAGS.data_dir)
  name = (
      f"{variant}-{method}-s{seed}"
      if group in ("main", "converged")
      else (f"{variant}-s{seed}")
  )
  workdir = os.path.join(FLAGS.runs_dir, profile, name)
  result, wall_seconds = common.train_once(config, workdir)
  evaluation = result["eval"]
  predictions = train.read_predictions(workdir)
  device = jax.devices()[0]
  return dict(
      name=name,
      group=group,
      variant=variant,
      method=method,
      seed=seed,
      overrides=overrides,
      profile=profile,
      model=config.model,
      steps=result["step"],
      batch_size=config.batch_size,
      **{metric: evaluation[metric] for metric in grid_lib.METRICS},
      num_test_examples=evaluation["num_examples"],
      final_train_loss=result["train"]["loss"],
      final_train_ce=result["train"]["ce"],
      wall_seconds=wall_seconds,
      device=f"{device.platform}:{device.device_kind} x{jax.device_count()}",
      xla_flags=os.environ.get("XLA_FLAGS", ""),
      config_hash=digest,
      curves=common.curves(
          os.path.join(workdir, "metrics.jsonl"),
          ("exact_match", "mean_time_gap_minutes"),
      ),
      predictions=predictions,
  )


def main(argv):
  del argv
  logs.quiet_terminal()
  settings = grid_lib.PROFILES[FLAGS.profile]
  task.prepare(FLAGS.data_dir, settings["train_size"], settings["test_size"])
  if FLAGS.workers > 1:  # after `prepare`: the workers share its data
    sys.exit(
        common.spawn_workers(
            "experiments.clock_time.run", sys.argv, FLAGS.workers
        )
    )
  cells = grid_lib.grid(FLAGS.profile)
  todo = [(group, *cell) for group in FLAGS.groups for cell in cells[group]]

  def configure(cell):
    group, variant, method, seed, overrides = cell
    del group, variant
    config = run_config(FLAGS.profile, method, seed, overrides, FLAGS.data_dir)
    return common.config_hash(
        config, FLAGS.profile, grid_lib.PROFILES[FLAGS.profile]
    )

  def execute(cell, digest):
    return run_one(FLAGS.profile, *cell, digest)

  def describe(record):
    return (
        f"{record['name']}: exact match "
        f"{100 * record['exact_match']:.1f}%, mean gap "
        f"{record['mean_time_gap_minutes']:.1f} min"
    )

  common.run_grid(
      todo, configure, execute, describe, FLAGS.results, max_runs=FLAGS.max_runs
  )
  logging.info("now: python -m experiments.clock_time.report")


if __name__ == "__main__":
  app.run(main)
