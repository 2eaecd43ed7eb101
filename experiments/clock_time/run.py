r"""The clock_time comparison: every method paired by seed, controls, ablations.

  python -m experiments.clock_time.run                    # the CPU grid
  python -m experiments.clock_time.run --groups=main      # main table only
  python -m experiments.clock_time.run --groups=stream,stream_control
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
* ``long``: CE and NTIL with twice the steps;
* ``peers``, ``converged_peers``, ``stream_peers`` and
  ``stream_converged_peers`` (not run unless named): NTIL's peers DEL,
  SMMD and NL-NTL, 5 seeds, at the main and the converged budget on the
  fixed set and on streamed clocks, paired with CE's recorded runs;
* ``stream`` and ``stream_control`` (not run unless named): the five losses
  and the digit-weighted control on clocks rendered as they are read
  (``train_stream``: every train clock new, none a test clock), at the main
  grid's steps and batch; recorded with ``regime: "stream"`` (records
  without a regime are ``"fixed"``: the prepared 20,000 clocks).

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


def run_name(group, variant, method, seed):
  if group in ("main", "converged", "peers", "converged_peers"):
    return f"{variant}-{method}-s{seed}"
  if group in ("stream", "stream_peers"):
    return f"stream-{method}-s{seed}"
  if group in ("stream_converged", "stream_converged_peers"):
    return f"stream-converged-{method}-s{seed}"
  if group in grid_lib.STREAM_GROUPS:
    return f"stream-{variant}-s{seed}"
  return f"{variant}-s{seed}"


def run_one(profile, group, variant, method, seed, overrides, digest):
  config = grid_lib.cell_config(
      profile, method, seed, overrides, FLAGS.data_dir
  )
  name = run_name(group, variant, method, seed)
  return common.run_record(
      config,
      common.cell_workdir(FLAGS.runs_dir, profile, name, digest),
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
  cells = grid_lib.grid(FLAGS.profile)
  common.check_groups(FLAGS.groups, list(cells), FLAGS.profile)
  FLAGS.runs_dir = common.grid_runs_dir(
      FLAGS.runs_dir,
      FLAGS.results,
      FLAGS["results"].default,
      FLAGS["runs_dir"].present,
  )
  common.check_results(FLAGS.results)
  streamed = [g for g in FLAGS.groups if g in grid_lib.STREAM_GROUPS]
  if len(streamed) < len(FLAGS.groups):
    task.prepare(FLAGS.data_dir, settings["train_size"], settings["test_size"])
  if streamed:  # the test split alone: the train clocks are rendered
    task.prepare(FLAGS.data_dir, 0, settings["test_size"])
  if FLAGS.workers > 1:  # after `prepare`: the workers share its data
    sys.exit(
        common.spawn_workers(
            "experiments.clock_time.run", sys.argv, FLAGS.workers
        )
    )
  todo = [(group, *cell) for group in FLAGS.groups for cell in cells[group]]

  def configure(cell):
    _, _, method, seed, overrides = cell
    return grid_lib.cell_hash(
        FLAGS.profile, method, seed, overrides, FLAGS.data_dir
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
  logging.info("now: python -m experiments.clock_time.report")


if __name__ == "__main__":
  common.run_main(main)
