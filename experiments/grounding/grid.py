"""The grounding grid: budget, groups and variants (no flags, importable)."""

from configs import common as config_common
from configs import grounding
from experiments import common
from train import tasks

# The budget (budget.md): chosen by CE pilots so that CE's test Acc@0.5
# sits in the middle regime and has stopped rising, because the train scenes
# are used up rather than because the schedule ends: on 5,000 scenes
# (grounding, grounding_multi) and 1,000 (grounding_single; on 20,000 one
# object is solved, Acc@0.5 99%), CE's test curve levels off or falls after
# about 800-1,000 steps of 128. grounding_multi was not tuned: its F1 is
# still rising at 1,200 steps.
# The cpu profile's budget is the config's defaults (configs/grounding.py).
_DEFAULTS = grounding.get_config()
PROFILES = {
    "cpu": dict(
        train_steps=_DEFAULTS.train_steps,
        batch_size=_DEFAULTS.batch_size,
        train_size=dict(grounding.TRAIN_SIZES),
        test_size=_DEFAULTS.eval_examples,
        main_seeds=(0, 1, 2, 3, 4),
        other_seeds=(0, 1, 2),
        eval_every_steps=_DEFAULTS.eval_every_steps,
    ),
    "smoke": dict(
        train_steps=2,
        batch_size=8,
        train_size=dict(grounding=64, grounding_single=64, grounding_multi=64),
        test_size=16,
        main_seeds=(0, 1),
        other_seeds=(0,),
        eval_every_steps=1,  # two evals: a learning curve to report
        # Saves at the end of a run (a save takes longer than a smoke step);
        # the trainer's resume tests save mid-run.
        checkpoint_every_steps=8,
        # Two of the losses on several boxes: each method's step on this
        # task is another compile, and `main` already runs all five.
        methods=dict(multi=("ce", "ntil")),
    ),
}
# Metrics recorded per task (the eval record's keys).
SINGLE_BOX_METRICS = (
    "acc_at_50",
    "acc_at_75",
    "mean_iou",
    "exact_match",
    "coordinate_accuracy",
    "mean_coordinate_error",
    "parsed_rate",
)
# The seed lists each profile's recorded cells were hashed with (frozen
# 2026-12-03): a cell's hash takes these, whatever seeds its profile lists
# now, so a seed added to a profile adds cells and leaves the recorded ones
# done (`common.hashed_settings`). A profile added since hashes no seeds.
RECORDED_SEEDS = {
    "cpu": dict(main_seeds=(0, 1, 2, 3, 4), other_seeds=(0, 1, 2)),
    "smoke": dict(main_seeds=(0, 1), other_seeds=(0,)),
}
METRICS = {
    "grounding": SINGLE_BOX_METRICS,
    "grounding_single": SINGLE_BOX_METRICS,
    "grounding_multi": (
        "f1_at_50",
        "precision_at_50",
        "recall_at_50",
        "exact_match",
        "count_accuracy",
        "parsed_rate",
    ),
}
CURVE_METRICS = {
    "grounding": ("acc_at_50", "mean_iou", "exact_match"),
    "grounding_single": ("acc_at_50", "mean_iou", "exact_match"),
    "grounding_multi": ("f1_at_50", "exact_match"),
}
# group -> (task, seeds key, {variant: (method, config overrides)}); the
# 'main' variant of a group runs every method (or the methods it names).
GROUPS = {
    # The paper's Table 1: a query names one of 2-4 objects.
    "main": ("grounding", "main_seeds", {"main": None}),
    "control": (
        "grounding",
        "main_seeds",
        {
            "ce_digit_weighted": ("ce", dict(digit_ce_weight=0.3)),
            "ntil_reference": ("ntil", dict(weighting="reference")),
        },
    ),
    # The paper's Table 6.
    "ablation": (
        "grounding",
        "other_seeds",
        {
            "exp_off": ("ntil", dict(sigma=0.0)),
            "rel_off": ("ntil", dict(alpha=0.0)),
            "mag_off": ("ntil", dict(beta=0.0)),
        },
    ),
    # One object: only the coordinates are at stake.
    "single": ("grounding_single", "main_seeds", {"main": None}),
    # The paper's Table 2 (scene text detection): every box of a colour.
    "multi": ("grounding_multi", "main_seeds", {"main": None}),
}
# The groups the grid runs by default, in order.
DEFAULT_GROUPS = tuple(GROUPS)
# NTIL's peers (DEL, SMMD, NL-NTL) at the main budget, 5 seeds, run by name: on
# one object (--groups=single_peers), on a query's object (peers) and on
# every box of a colour (multi_peers); each paired by seed with CE's
# recorded runs of its task.
_PEERS = {"main": config_common.PEER_METHODS}
PEER_GROUPS = {
    "peers": ("grounding", "main_seeds", _PEERS),
    "single_peers": ("grounding_single", "main_seeds", _PEERS),
    "multi_peers": ("grounding_multi", "main_seeds", _PEERS),
}
GROUPS.update(PEER_GROUPS)
# Streamed copies of groups (train_stream: scenes rendered as they are read,
# each new, none of the test split's) at the same steps and batch: the five
# losses and the digit-weighted control on grounding and grounding_single.
# Run them by name (--groups=stream,...); the default run leaves them out.
_DIGIT_WEIGHTED = {"ce_digit_weighted": ("ce", dict(digit_ce_weight=0.3))}
STREAM_GROUPS = {
    "stream": ("grounding", "main_seeds", {"main": None}),
    "stream_control": ("grounding", "main_seeds", _DIGIT_WEIGHTED),
    "stream_single": ("grounding_single", "main_seeds", {"main": None}),
    "stream_single_control": (
        "grounding_single",
        "main_seeds",
        _DIGIT_WEIGHTED,
    ),
    # CE's streamed Acc@0.5 on grounding still rises at 1,200 steps (+2.5
    # points over the last 200, mean of 5 seeds): the same cells at
    # LONG_FACTOR x the steps say where it flattens and what holds there.
    "stream_long": ("grounding", "main_seeds", {"main": None}),
    "stream_long_control": ("grounding", "main_seeds", _DIGIT_WEIGHTED),
    # Streamed, one object reaches Acc@0.5 ~99% but the exact box is still
    # rising steeply at 1,200 steps (+7 points over the last 200).
    "stream_single_long": ("grounding_single", "main_seeds", {"main": None}),
    "stream_single_long_control": (
        "grounding_single",
        "main_seeds",
        _DIGIT_WEIGHTED,
    ),
    # NTIL's peers, each scene new, at 1,200 steps: a query's object and
    # one object.
    "stream_peers": ("grounding", "main_seeds", _PEERS),
    "stream_single_peers": ("grounding_single", "main_seeds", _PEERS),
    # And at LONG_FACTOR x the steps, where CE's curve has flattened.
    "stream_long_peers": ("grounding", "main_seeds", _PEERS),
    "stream_single_long_peers": ("grounding_single", "main_seeds", _PEERS),
}
LONG_GROUPS = (
    "stream_long",
    "stream_long_control",
    "stream_single_long",
    "stream_single_long_control",
    "stream_long_peers",
    "stream_single_long_peers",
)
LONG_FACTOR = 2
GROUPS.update(STREAM_GROUPS)
STREAM = dict(train_stream=True)


def run_name(group, task, variant, method, seed) -> str:
  """A cell's name, which is also its work directory under runs/<profile>."""
  prefix = "stream-" if group in STREAM_GROUPS else ""
  if group in LONG_GROUPS:  # not the 1,200-step cell's directory
    prefix = "stream-long-"
  if variant == "main":
    return f"{prefix}{task}-{method}-s{seed}"
  return f"{prefix}{task}-{variant}-s{seed}"


def cell_config(profile, task, method, seed, overrides, data_dir):
  """The config of one cell: the method's, with the profile's budget.

  A streamed cell (``train_stream`` in ``overrides``) reads the test split
  of the dataset prepared with ``train_size=0``.
  """
  settings = PROFILES[profile]
  train_size = (
      0 if overrides.get("train_stream") else settings["train_size"][task]
  )
  dataset_config = tasks.get(task).dataset_config_name(
      train_size, settings["test_size"], 0
  )
  return common.cell_config(
      grounding.get_config(method, task=task),
      settings,
      dataset_config,
      seed,
      overrides,
      data_dir,
  )


def cell_hash(profile, task, method, seed, overrides, data_dir) -> str:
  """The config hash that names a cell in results.json."""
  config = cell_config(profile, task, method, seed, overrides, data_dir)
  return common.config_hash(
      config,
      profile,
      common.hashed_settings(PROFILES[profile], RECORDED_SEEDS.get(profile)),
  )


def grid(profile):
  """{group: [(task, variant, method, seed, overrides)]}, in run order."""
  settings = PROFILES[profile]
  cells = {}
  for group, (task, seeds_key, variants) in GROUPS.items():
    seeds = settings[seeds_key]
    extra = STREAM if group in STREAM_GROUPS else {}
    if group in LONG_GROUPS:
      extra = dict(extra, train_steps=LONG_FACTOR * settings["train_steps"])
    if "main" in variants:
      cells[group] = [
          (task, "main", method, seed, dict(extra))
          for seed in seeds  # seed-major
          for method in variants["main"]
          or settings.get("methods", {}).get(group, grounding.METHODS)
      ]
    else:
      cells[group] = [
          (task, variant, method, seed, {**overrides, **extra})
          for seed in seeds
          for variant, (method, overrides) in variants.items()
      ]
  return cells
