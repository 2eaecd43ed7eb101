r"""The grounding comparison: every method paired by seed, controls, ablations.

  python -m experiments.grounding.run                     # the CPU grid
  python -m experiments.grounding.run --groups=main       # main table only
  python -m experiments.grounding.run --groups=stream,stream_single
  python -m experiments.grounding.run --groups=stream_long,stream_long_control,stream_single_long,stream_single_long_control
  python -m experiments.grounding.report                  # results.md, plots

Trains the same model from scratch on the same rendered scenes with each
loss and seed. A seed fixes the initialisation and the data order, so the
runs of one seed differ only by their loss (paired). Groups, in run order
(experiments/grounding/grid.py):

* ``main`` (task ``grounding``, the paper's Table 1): CE, CE + EMD,
  CE + NTL-MSE, CE + soft labels, CE + NTIL;
* ``control`` (``grounding``): CE with weight 1 + lambda on digit tokens
  (``ce_digit_weighted``) and NTIL with the authors' scaling
  (``ntil_reference``);
* ``ablation`` (``grounding``, the paper's Table 6): NTIL without
  place-value weighting (``exp_off``, sigma=0), relative deviation
  (``rel_off``) or magnitude deviation (``mag_off``);
* ``single`` (``grounding_single``): the five methods on one-object scenes;
* ``multi`` (``grounding_multi``, the paper's Table 2): the five methods on
  every-box-of-a-colour answers, F1 at IoU 0.5;
* ``stream``, ``stream_control``, ``stream_single`` and
  ``stream_single_control`` (not run unless named): the five methods and
  the digit-weighted control on ``grounding`` and ``grounding_single`` with
  scenes rendered as they are read (``train_stream``: every train scene new,
  none a test scene), at the same steps and batch; recorded with ``regime:
  "stream"`` (records without a regime are ``"fixed"``: the prepared train
  scenes);
* ``stream_long``, ``stream_long_control``, ``stream_single_long`` and
  ``stream_single_long_control`` (not run unless named): the five methods
  and the control streamed on ``grounding`` and ``grounding_single`` at
  twice the steps (CE's streamed curves still rise at the fixed-set budget);
* ``peers``, ``single_peers``, ``multi_peers``, ``stream_peers``,
  ``stream_single_peers``, ``stream_long_peers`` and
  ``stream_single_long_peers`` (not run unless named): NTIL's peers (DEL,
  SMMD, NL-NTL) in the cells of those groups, paired by seed with CE's runs
  there.

Each finished run is appended to ``results.json`` at once (with its test
predictions and curves), so an interrupted grid resumes where it stopped (a
half-trained run resumes from its checkpoint); runs whose config hash is
already recorded are skipped.
"""

import os
import sys

from absl import flags
from absl import logging

from experiments import common
from experiments.grounding import grid as grid_lib
from train import logs
from train import tasks

HERE = os.path.dirname(os.path.abspath(__file__))
FLAGS = flags.FLAGS
common.define_grid_flags(
    HERE, list(grid_lib.DEFAULT_GROUPS), "Rendered scenes."
)


def run_one(profile, group, task, variant, method, seed, overrides, digest):
  config = grid_lib.cell_config(
      profile, task, method, seed, overrides, FLAGS.data_dir
  )
  name = grid_lib.run_name(group, task, variant, method, seed)
  return common.run_record(
      config,
      common.cell_workdir(FLAGS.runs_dir, profile, name, digest),
      digest,
      grid_lib.METRICS[task],
      grid_lib.CURVE_METRICS[task],
      name=name,
      group=group,
      task=task,
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
  common.check_groups(FLAGS.groups, list(grid_lib.GROUPS), FLAGS.profile)
  FLAGS.runs_dir = common.grid_runs_dir(
      FLAGS.runs_dir,
      FLAGS.results,
      FLAGS["results"].default,
      FLAGS["runs_dir"].present,
  )
  common.check_results(FLAGS.results)
  for group in FLAGS.groups:  # streamed groups: the test split alone
    task = grid_lib.GROUPS[group][0]
    train_size = (
        0 if group in grid_lib.STREAM_GROUPS else settings["train_size"][task]
    )
    tasks.get(task).prepare(FLAGS.data_dir, train_size, settings["test_size"])
  if FLAGS.workers > 1:  # after `prepare`: the workers share its data
    sys.exit(
        common.spawn_workers(
            "experiments.grounding.run", sys.argv, FLAGS.workers
        )
    )
  cells = grid_lib.grid(FLAGS.profile)
  todo = [(group, *cell) for group in FLAGS.groups for cell in cells[group]]

  def configure(cell):
    _, task, _, method, seed, overrides = cell
    return grid_lib.cell_hash(
        FLAGS.profile, task, method, seed, overrides, FLAGS.data_dir
    )

  def execute(cell, digest):
    return run_one(FLAGS.profile, *cell, digest)

  def describe(record):
    if record["task"] == "grounding_multi":
      score = f"F1@0.5 {100 * record['f1_at_50']:.1f}%"
    else:
      score = (
          f"Acc@0.5 {100 * record['acc_at_50']:.1f}%, mean coordinate "
          f"error {record['mean_coordinate_error']:.2f} px"
      )
    return f"{record['name']}: {score}"

  common.run_grid(
      todo,
      configure,
      execute,
      describe,
      FLAGS.results,
      max_runs=FLAGS.max_runs,
      runs_dir=FLAGS.runs_dir,
      data_dir=FLAGS.data_dir,
      accept_changed_data=FLAGS.accept_changed_data,
  )
  logging.info("now: python -m experiments.grounding.report")


if __name__ == "__main__":
  common.run_main(main)
