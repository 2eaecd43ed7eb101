r"""The arithmetic_mix comparison: every method, several seeds, ablations.

  python -m experiments.arithmetic_mix.run                # CPU profile
  python -m experiments.arithmetic_mix.run --profile=accelerator
  python -m experiments.arithmetic_mix.run --groups=main  # main table only
  python -m experiments.arithmetic_mix.run --profile=digits \
      --groups=main,control,ablation   # multi-digit answers, each seen once

The ``digits`` profile trains on ``arithmetic__add_or_sub`` at its easiest
difficulty (answers of 5 digits at the median, 3 in 4 with decimals), with
as many generated problems as the run reads (each seen once), 5 seeds for
every method, the digit-weighted CE control and each NTIL ablation, and
2,000 test problems; its records keep every prediction, for the report's
breakdowns.

Trains the same model from scratch on the same generated data with each loss
method and seed, then the NTIL ablations (the paper's Table 6: place-value
weighting, relative and magnitude deviation each off) and sweeps of sigma and
lambda (Table 8). Each finished cell is appended to ``results.json`` at once,
so an interrupted grid resumes where it stopped (a half-trained cell resumes
from its checkpoint); cells whose config hash is already there are skipped.
Then ``python -m experiments.arithmetic_mix.report`` writes results.md and
the plots from results.json.
"""

import os
import platform
import time

from absl import app
from absl import flags
from absl import logging
import jax

from configs import arithmetic_mix
from experiments import common
from train import arithmetic_data
from train import logs
from train import train

HERE = os.path.dirname(os.path.abspath(__file__))
FLAGS = flags.FLAGS
flags.DEFINE_enum(
    "profile",
    "cpu",
    ["cpu", "accelerator", "smoke", "digits", "digits_smoke"],
    "Grid size (smoke: seconds, for tests).",
)
flags.DEFINE_list(
    "groups",
    ["main", "ablation", "sweep"],
    "Which parts of the grid to run, in this order.",
)
flags.DEFINE_string(
    "results",
    None,
    "Results file (one record per finished run); default results.json, "
    "digits/results.json for the digits profiles.",
)
flags.DEFINE_string(
    "runs_dir",
    os.path.join(HERE, "runs"),
    "Work directories of the runs (not in git).",
)
flags.DEFINE_string("data_dir", "data", "Generated data.")
flags.DEFINE_integer("max_cells", 0, "Stop after this many new cells (0: all).")
flags.DEFINE_integer(
    "data_workers", 2, "Processes generating a profile's data (same result)."
)

# Everything that differs between the CPU grid and the accelerator grid.
PROFILES = {
    "cpu": dict(
        model="tiny",
        train_steps=1500,
        batch_size=64,
        learning_rate=3e-3,
        train_size=20000,
        test_size=1000,
        seeds=(0, 1, 2),
    ),
    "accelerator": dict(
        model="base",
        train_steps=20000,
        batch_size=256,
        learning_rate=1e-3,
        train_size=400000,
        test_size=5000,
        seeds=(0, 1, 2, 3, 4),
    ),
    "smoke": dict(
        model="tiny",
        train_steps=3,
        batch_size=8,
        learning_rate=3e-3,
        train_size=200,
        test_size=20,
        seeds=(0, 1),
    ),
    # Multi-digit answers, abundant data: train_size = steps x batch.
    "digits": dict(
        model="small",
        train_steps=800,
        batch_size=128,
        learning_rate=1e-3,
        train_size=800 * 128,
        test_size=2000,
        seeds=(0, 1, 2, 3, 4),
        module="arithmetic__add_or_sub",
        difficulty="easy",
    ),
    "digits_smoke": dict(
        model="tiny",
        train_steps=3,
        batch_size=8,
        learning_rate=3e-3,
        train_size=24,
        test_size=20,
        seeds=(0,),
        module="arithmetic__add_or_sub",
        difficulty="easy",
    ),
}
# The control of the multi-digit grid: CE with weight 1 + lam on digit
# tokens ("more gradient on digits" without their order).
CONTROL_DIGIT_CE_WEIGHT = 0.3
METHODS = arithmetic_mix.METHODS


def _variant(settings) -> dict:
  """The generated data's module and difficulty (none: the paper's mix)."""
  return {k: settings[k] for k in ("module", "difficulty") if k in settings}


def digits_grid(seeds):
  """The multi-digit grid: every method, the control and the ablations."""
  cells = {"main": [], "control": [], "ablation": []}
  for seed in seeds:  # seed-major: a partial grid still covers every method
    for method in METHODS:
      cells["main"].append(("main", f"{method}-s{seed}", method, seed, {}))
    cells["control"].append(
        (
            "control",
            f"ce-digit-weight-s{seed}",
            "ce",
            seed,
            dict(digit_ce_weight=CONTROL_DIGIT_CE_WEIGHT),
        )
    )
    for name, overrides in (
        ("ntil-no-exp", dict(sigma=0.0)),
        ("ntil-no-rel", dict(alpha=0.0)),
        ("ntil-no-mag", dict(beta=0.0)),
    ):
      cells["ablation"].append(
          ("ablation", f"{name}-s{seed}", "ntil", seed, overrides)
      )
  return cells


def grid(profile):
  """(group, name, method, seed, overrides) of every cell, in run order."""
  seeds = PROFILES[profile]["seeds"]
  if _variant(PROFILES[profile]):
    return digits_grid(seeds)
  cells = {"main": [], "ablation": [], "sweep": []}
  for seed in seeds:  # seed-major: a partial grid still covers every method
    for method in METHODS:
      cells["main"].append(("main", f"{method}-s{seed}", method, seed, {}))
  for name, overrides in (
      ("ntil-no-exp", dict(sigma=0.0)),
      ("ntil-no-rel", dict(alpha=0.0)),
      ("ntil-no-mag", dict(beta=0.0)),
  ):
    cells["ablation"].append(("ablation", f"{name}-s0", "ntil", 0, overrides))
  for sigma in (0.1, 0.5):
    cells["sweep"].append(
        ("sweep", f"ntil-sigma{sigma}-s0", "ntil", 0, dict(sigma=sigma))
    )
  for lam in (0.1, 1.0):
    cells["sweep"].append(
        ("sweep", f"ntil-lam{lam}-s0", "ntil", 0, dict(lam=lam))
    )
  return cells


def cell_config(profile, method, seed, overrides, data_dir):
  settings = PROFILES[profile]
  config = arithmetic_mix.get_config(method)
  config.data_dir = data_dir
  config.dataset_config = arithmetic_data.config_name(
      settings["train_size"], settings["test_size"], 0, **_variant(settings)
  )
  config.model = settings["model"]
  config.train_steps = settings["train_steps"]
  config.batch_size = settings["batch_size"]
  config.learning_rate = settings["learning_rate"]
  config.seed = seed
  config.log_every_steps = min(25, settings["train_steps"])
  evals = 4 if _variant(settings) else 3  # a learning curve of 4 points
  config.eval_every_steps = max(1, settings["train_steps"] // evals)
  config.checkpoint_every_steps = max(1, settings["train_steps"] // 3)
  config.eval_examples = 0  # the whole test split
  config.eval_batch_size = min(250, settings["test_size"])
  for name, value in overrides.items():
    config[name] = value
  return config


def config_hash(config, profile) -> str:
  return common.config_hash(config, profile, PROFILES[profile])


def run_cell(profile, group, name, method, seed, overrides, digest):
  config = cell_config(profile, method, seed, overrides, FLAGS.data_dir)
  workdir = os.path.join(FLAGS.runs_dir, profile, name)
  start = time.time()
  result = train.train_and_evaluate(config, workdir)
  if result["stopped_early"]:
    raise KeyboardInterrupt(f"{name} stopped by a signal; rerun to resume")
  evaluation = result["eval"]
  device = jax.devices()[0]
  extra = {}
  if _variant(PROFILES[profile]):  # for the breakdowns of the report
    extra = dict(
        data=_variant(PROFILES[profile]),
        problems_seen=result["step"] * config.batch_size,
        within_1_percent=evaluation["within_1_percent"],
        predictions=train.read_predictions(workdir),
    )
  return dict(
      name=name,
      group=group,
      method=method,
      seed=seed,
      overrides=overrides,
      profile=profile,
      model=config.model,
      steps=result["step"],
      batch_size=config.batch_size,
      exact_match=evaluation["exact_match"],
      parsed_rate=evaluation["parsed_rate"],
      mean_abs_error=evaluation["mean_abs_error"],
      mean_log10_abs_error=evaluation["mean_log10_abs_error"],
      num_test_examples=evaluation["num_examples"],
      exact_match_by_answer_length=evaluation["exact_match_by_answer_length"],
      examples_by_answer_length=evaluation["examples_by_answer_length"],
      final_train_loss=result["train"]["loss"],
      final_train_ce=result["train"]["ce"],
      wall_seconds=round(time.time() - start, 1),
      device=f"{device.platform}:{device.device_kind} x{jax.device_count()}",
      host=platform.node(),
      config_hash=digest,
      curves=common.curves(os.path.join(workdir, "metrics.jsonl")),
      **extra,
  )


def results_path(profile) -> str:
  if FLAGS.results:
    return FLAGS.results
  if _variant(PROFILES[profile]):
    return os.path.join(HERE, "digits", "results.json")
  return os.path.join(HERE, "results.json")


def main(argv):
  del argv
  logs.quiet_terminal()
  settings = PROFILES[FLAGS.profile]
  results = results_path(FLAGS.profile)
  os.makedirs(os.path.dirname(results), exist_ok=True)
  arithmetic_data.prepare(
      FLAGS.data_dir,
      settings["train_size"],
      settings["test_size"],
      workers=FLAGS.data_workers,
      **_variant(settings),
  )
  runs = common.load_results(results)
  done = {r["config_hash"] for r in runs}
  cells = grid(FLAGS.profile)
  todo = [cell for group in FLAGS.groups for cell in cells[group]]
  new = 0
  for index, (group, name, method, seed, overrides) in enumerate(todo):
    config = cell_config(FLAGS.profile, method, seed, overrides, FLAGS.data_dir)
    digest = config_hash(config, FLAGS.profile)
    if digest in done:
      continue
    if FLAGS.max_cells and new >= FLAGS.max_cells:
      break
    logging.info("cell %d/%d: %s", index + 1, len(todo), name)
    record = run_cell(
        FLAGS.profile, group, name, method, seed, overrides, digest
    )
    runs.append(record)
    common.save_results(results, runs)
    new += 1
    print(
        f"[{index + 1}/{len(todo)}] {name}: exact match "
        f"{100 * record['exact_match']:.2f}% ({record['wall_seconds']:.0f}s)",
        flush=True,
    )
  print(
      f"{len(runs)} runs in {results}; "
      "now: python -m experiments.arithmetic_mix.report"
  )


if __name__ == "__main__":
  app.run(main)
