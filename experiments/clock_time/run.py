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

from configs import clock_time
from experiments import common
from experiments.clock_time import grid as grid_lib
from train import logs
from train.tasks import clock_time as task

HERE = os.path.dirname(os.path.abspath(__file__))
FLAGS = flags.FLAGS
common.define_grid_flags(
    HERE,
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
    "Rendered clocks.",
)


def run_config(profile, method, seed, overrides, data_dir):
  settings = grid_lib.PROFILES[profile]
  dataset_config = task.config_name(
      settings["train_size"], settings["test_size"], 0
  )
  return common.cell_config(
      clock_time.get_config(method),
      settings,
      dataset_config,
      seed,
      overrides,
      data_dir,
  )


def run_one(profile, group, variant, method, seed, overrides, digest):
  config = run_config(profile, method, seed, overrides, FLAGS.data_dir)
  name = (
      f"{variant}-{method}-s{seed}"
      if group in ("main", "converged")
      else (f"{variant}-s{seed}")
  )
  return common.run_record(
      config,
      os.path.join(FLAGS.runs_dir, profile, name),
      digest,
      grid_lib.METRICS,
      ("exact_match", "mean_time_gap_minutes"),
      name=name,
      group=group,
      variant=variant,
      method=method,
      seed=seed,
      overrides=overrides,
      profile=profile,
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
