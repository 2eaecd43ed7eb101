r"""The arithmetic_mix comparison: every method, several seeds, ablations.

  python -m experiments.arithmetic_mix.run                # CPU profile
  python -m experiments.arithmetic_mix.run --profile=accelerator
  python -m experiments.arithmetic_mix.run --groups=main  # main table only
  python -m experiments.arithmetic_mix.run --profile=digits \
      --groups=main,control,ablation   # multi-digit answers, each seen once

  python -m experiments.arithmetic_mix.run --profile=llm \
      --pretrained=SNAPSHOT [--dataset=add_or_sub] [--learning_rate=1e-4 \
      --train_steps=300 --batch_size=32 --seeds=0,1,2]

The ``digits`` profile trains on ``arithmetic__add_or_sub`` at its easiest
difficulty (answers of 5 digits at the median, 3 in 4 with decimals), with
as many generated problems as the run reads (each seen once), 5 seeds for
every method, the digit-weighted CE control and each NTIL ablation, and
2,000 test problems; its records keep every prediction, for the report's
breakdowns.

The ``llm`` profile is the paper's Table 3 for any local Hugging Face
snapshot (``--pretrained``; a GGUF file converts with ``python -m
train.gguf_to_hf``): it fine-tunes the snapshot with CE, EMD, NTL-MSE, soft
labels and NTIL for each seed at the paper's hyperparameters (lr 1e-5, lam
0.3, alpha = beta = sigma = 0.2, batch 32, 3,000 steps; the flags above
change the schedule and the data), every training problem seen once, on
2,000 test problems, after a zero-shot evaluation of the snapshot itself
(once per dataset and test set). Results go to
``llm/<snapshot name>/results.json``; a finished cell's checkpoints are
deleted once it is recorded (a 135M-parameter model's are 1.6 GB).
``llm_smoke`` runs it in seconds on the tiny test snapshot.

Trains the same model from scratch on the same generated data with each loss
method and seed, then the NTIL ablations (the paper's Table 6: place-value
weighting, relative and magnitude deviation each off) and sweeps of sigma and
lambda (Table 8). Each finished cell is appended to ``results.json`` at once,
so an interrupted grid resumes where it stopped (a half-trained cell resumes
from its checkpoint); cells whose config hash is already there are skipped.
Then ``python -m experiments.arithmetic_mix.report`` writes results.md and
the plots from results.json.
"""

import hashlib
import json
import math
import os
import platform
import shutil
import sys
import time

from absl import app
from absl import flags
from absl import logging
import jax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import ml_collections
import numpy as np

from configs import arithmetic_mix
from configs import arithmetic_mix_llm
from experiments import common
from experiments import data_fingerprints
from train import arithmetic_data
from train import checks
from train import evaluate
from train import logs
from train import plots
from train import schedule
from train import snapshots
from train import step as step_lib
from train import train
from train.tasks import arithmetic_mix_llm as llm_task

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
FLAGS = flags.FLAGS
flags.DEFINE_enum(
    "profile",
    "cpu",
    [
        "cpu",
        "accelerator",
        "smoke",
        "digits",
        "digits_long",
        "digits_smoke",
        "llm",
        "llm_smoke",
    ],
    "Grid size (smoke: seconds, for tests); llm: a pretrained snapshot.",
)
flags.DEFINE_list(
    "groups",
    ["main", "ablation", "sweep"],
    "Which parts of the grid to run, in this order (default: all of the "
    "profile's grid).",
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
flags.DEFINE_integer(
    "max_cells", 0, "Stop after this many new cells (0: all).", lower_bound=0
)
flags.DEFINE_integer(
    "data_workers",
    2,
    "Processes generating a profile's data (same result).",
    lower_bound=1,
)
flags.DEFINE_integer(
    "workers",
    1,
    "Processes running the grid at once, each taking the next cell no other "
    "holds (on one GPU they share its memory).",
    lower_bound=1,
)
common.define_data_check_flag()
# The llm profiles only (their defaults are in LLM_PROFILES).
flags.DEFINE_string(
    "pretrained",
    None,
    "llm: a local Hugging Face snapshot directory (config.json, "
    "*.safetensors, tokenizer.json).",
)
flags.DEFINE_enum(
    "dataset",
    None,
    ["arithmetic_mix", "add_or_sub"],
    "llm: the paper's arithmetic_mix (default) or arithmetic__add_or_sub at "
    "its easiest difficulty (multi-digit answers).",
)
flags.DEFINE_float("learning_rate", None, "llm: peak learning rate.")
flags.register_validator(
    "learning_rate",
    lambda value: value is None or (math.isfinite(value) and value > 0),
    message="--learning_rate must be a positive number.",
)
flags.DEFINE_integer(
    "train_steps", None, "llm: fine-tuning steps a cell.", lower_bound=1
)
flags.DEFINE_integer("batch_size", None, "llm: problems a step.", lower_bound=1)
flags.DEFINE_list("seeds", None, "llm: the seeds, e.g. 0,1,2.")
flags.DEFINE_integer("test_size", None, "llm: test problems.", lower_bound=1)
flags.DEFINE_bool(
    "split_digits", None, "llm: every digit its own token (for Llama 3)."
)
flags.DEFINE_list(
    "methods",
    None,
    "The losses whose cells to run (default: all); the others' cells are "
    "left for a later run, e.g. --methods=ce,ntil on a short device loan.",
)
LLM_FLAGS = (
    "pretrained",
    "dataset",
    "learning_rate",
    "train_steps",
    "batch_size",
    "seeds",
    "test_size",
    "split_digits",
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
        # Saves at the end of a run (a save takes longer than a smoke step);
        # the trainer's resume tests save mid-run.
        checkpoint_every_steps=8,
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
        # Saves at the end of a run (a save takes longer than a smoke step);
        # the trainer's resume tests save mid-run.
        checkpoint_every_steps=8,
    ),
}
# The digits grid on 4x the budget (and 4x the problems, each seen once),
# where CE's curve flattens: a trained model rather than a fixed budget.
PROFILES["digits_long"] = dict(
    PROFILES["digits"], train_steps=3200, train_size=3200 * 128, evals=8
)
# The seed lists each profile's recorded cells were hashed with (frozen
# 2026-12-03): a cell's hash takes these, whatever seeds its profile lists
# now, so a seed added to a profile adds cells and leaves the recorded ones
# done (`common.hashed_settings`). A profile added since hashes no seeds.
RECORDED_SEEDS = {
    "cpu": dict(seeds=(0, 1, 2)),
    "accelerator": dict(seeds=(0, 1, 2, 3, 4)),
    "smoke": dict(seeds=(0, 1)),
    "digits": dict(seeds=(0, 1, 2, 3, 4)),
    "digits_smoke": dict(seeds=(0,)),
    "digits_long": dict(seeds=(0, 1, 2, 3, 4)),
}
# The paper's Table 3 on a pretrained snapshot: its hyperparameters
# (configs/arithmetic_mix_llm.py), every problem seen once. Kept apart from
# PROFILES, whose entries are part of the other grids' cell hashes.
_LLM_DEFAULTS = arithmetic_mix_llm.get_config()
LLM_PROFILES = {
    "llm": dict(
        pretrained=None,
        dataset="arithmetic_mix",
        train_steps=_LLM_DEFAULTS.train_steps,
        batch_size=_LLM_DEFAULTS.batch_size,
        learning_rate=_LLM_DEFAULTS.learning_rate,
        test_size=2000,
        seeds=(0, 1, 2),
        split_digits=False,
    ),
    "llm_smoke": dict(
        pretrained=os.path.join(ROOT, "tests", "fixtures", "hf", "qwen2_tiny"),
        dataset="arithmetic_mix",
        train_steps=2,
        batch_size=4,
        learning_rate=1e-3,
        test_size=8,
        seeds=(0,),
        split_digits=False,
        # Saves at the end of a run (a save takes longer than a smoke step);
        # the trainer's resume tests save mid-run.
        checkpoint_every_steps=8,
    ),
}
LLM_DATASETS = {
    "arithmetic_mix": {},  # the paper's arithmetic__mixed
    "add_or_sub": dict(module="arithmetic__add_or_sub", difficulty="easy"),
}
# How the recorded LLM cells tokenized their prompts: the prompt and the
# answer apart, Llama's BOS (configs/arithmetic_mix_llm.py's defaults join
# them). A grid run otherwise is another grid: its cells hash apart, and the
# zero-shot cell's hash holds these fields only where they differ.
RECORDED_TOKENIZATION = dict(tokenize_joined=False, prompt_bos="llama")
# A record without ``split_digits`` was run before the flag: not split.
SPLIT_DIGITS_UNRECORDED = False
# The control of the multi-digit grid: CE with weight 1 + lam on digit
# tokens ("more gradient on digits" without their order).
CONTROL_DIGIT_CE_WEIGHT = 0.3
METHODS = arithmetic_mix.METHODS


def _variant(settings) -> dict:
  """The generated data's module and difficulty (none: the paper's mix)."""
  return {k: settings[k] for k in ("module", "difficulty") if k in settings}


# The chunk group: numbers in tokens of 1-3 digits (Llama 3's split), these
# methods, paired by seed with the main group's single-digit runs.
CHUNK_METHODS = ("ce", "emd", "ntil")
# NTIL's peers (DEL, SMMD, NL-NTL), their own group: paired by seed with the
# main group's CE, rows of the main table.
PEER_METHODS = arithmetic_mix.PEER_METHODS


def digits_grid(seeds, extra=True):
  """The multi-digit grid: every method, the control, the ablations and,
  with ``extra``, NTIL's peers (group ``peers``), the same problems with
  numbers in tokens of 1-3 digits (group ``chunks``) and NTIL's peers on
  them (group ``chunks_peers``)."""
  cells = {
      "main": [],
      "control": [],
      "ablation": [],
      "peers": [],
      "chunks": [],
      "chunks_peers": [],
  }
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
    for method in PEER_METHODS if extra else ():
      cells["peers"].append(("peers", f"{method}-s{seed}", method, seed, {}))
    for group, methods in (
        ("chunks", CHUNK_METHODS),
        ("chunks_peers", PEER_METHODS),
    ):
      for method in methods if extra else ():
        cells[group].append(
            (group, f"{method}-chunks-s{seed}", method, seed, _CHUNKS)
        )
  return cells


_CHUNKS = dict(digit_chunks=True)


def grid(profile):
  """(group, name, method, seed, overrides) of every cell, in run order."""
  seeds = PROFILES[profile]["seeds"]
  if _variant(PROFILES[profile]):
    cells = digits_grid(seeds, extra=profile != "digits_long")
    return {group: c for group, c in cells.items() if c}
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
  # A learning curve of 3-8 points.
  evals = settings.get("evals", 4 if _variant(settings) else 3)
  config.eval_every_steps = max(1, settings["train_steps"] // evals)
  config.checkpoint_every_steps = settings.get(
      "checkpoint_every_steps", max(1, settings["train_steps"] // 3)
  )
  config.eval_examples = 0  # the whole test split
  config.eval_batch_size = min(250, settings["test_size"])
  for name, value in overrides.items():
    config[name] = value
  return config


def config_hash(config, profile) -> str:
  settings = PROFILES[profile]
  recorded = RECORDED_SEEDS.get(profile)
  return common.config_hash(
      config, profile, common.hashed_settings(settings, recorded)
  )


def run_cell(profile, group, name, method, seed, overrides, digest):
  config = cell_config(profile, method, seed, overrides, FLAGS.data_dir)
  workdir = common.cell_workdir(FLAGS.runs_dir, profile, name, digest)
  result, wall_seconds = common.train_once(config, workdir)
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
      wall_seconds=wall_seconds,
      device=f"{device.platform}:{device.device_kind} x{jax.device_count()}",
      host=platform.node(),
      config_hash=digest,
      prepared_data=data_fingerprints.dataset_of(config),
      curves=common.curves(os.path.join(workdir, "metrics.jsonl")),
      **extra,
  )


def selected_groups(cells, profile) -> list[str]:
  """The groups ``--groups`` names (without the flag, all of the grid's, in
  order); UsageError naming the grid's groups for one it does not have."""
  groups = FLAGS.groups if FLAGS["groups"].present else list(cells)
  common.check_groups(groups, list(cells), profile)
  return groups


def results_path(profile) -> str:
  return FLAGS.results or default_results_path(profile)


def default_results_path(profile) -> str:
  if profile == "digits_long":
    return os.path.join(HERE, "digits", "results_long.json")
  if _variant(PROFILES[profile]):
    return os.path.join(HERE, "digits", "results.json")
  return os.path.join(HERE, "results.json")


# ----------------------------------------------------------------------------
# The llm profiles: the paper's Table 3 on a pretrained snapshot.


def llm_settings(profile) -> dict:
  """The profile's settings with the flags' overrides; UsageError if bad."""
  settings = dict(LLM_PROFILES[profile])
  for name in LLM_FLAGS:
    if FLAGS[name].value is not None:
      settings[name] = FLAGS[name].value
  try:
    settings["seeds"] = tuple(int(seed) for seed in settings["seeds"])
  except ValueError as error:
    raise app.UsageError(f"--seeds: {error}") from error
  outside = [seed for seed in settings["seeds"] if not 0 <= seed < 2**32]
  if outside:  # numpy's and grain's seeds are uint32, as the trainer checks
    raise app.UsageError(
        f"--seeds: {', '.join(map(str, outside))} not in [0, 2**32)."
    )
  if not settings["pretrained"]:
    raise app.UsageError(
        f"--profile={profile} needs --pretrained=SNAPSHOT_DIR, a local "
        "Hugging Face snapshot (python -m train.gguf_to_hf converts a GGUF "
        "file into one)."
    )
  settings["pretrained"] = os.path.abspath(
      os.path.expanduser(settings["pretrained"])
  )
  if not os.path.isdir(settings["pretrained"]):
    raise app.UsageError(
        f"--pretrained={settings['pretrained']} is not a directory."
    )
  for name in ("train_steps", "batch_size", "test_size"):
    if settings[name] < 1:
      raise app.UsageError(f"--{name} must be positive, got {settings[name]}.")
  if not settings["seeds"]:
    raise app.UsageError("--seeds is empty.")
  # Every training problem seen once.
  settings["train_size"] = settings["train_steps"] * settings["batch_size"]
  return settings


def snapshot_name(settings) -> str:
  return os.path.basename(settings["pretrained"].rstrip(os.sep))


def chosen_methods(methods=METHODS) -> tuple[str, ...]:
  """``--methods`` (default: all of ``methods``), in their order;
  UsageError for a name that is not one."""
  if FLAGS.methods is None:
    return tuple(methods)
  unknown = [m for m in FLAGS.methods if m not in methods]
  if unknown or not FLAGS.methods:
    raise app.UsageError(
        f"--methods={','.join(FLAGS.methods)}: choose from "
        f"{', '.join(methods)}."
    )
  return tuple(m for m in methods if m in FLAGS.methods)


def llm_grid(settings, methods=METHODS):
  """The zero-shot evaluation, then each of ``methods`` for each seed."""
  cells = {"zero_shot": [("zero_shot", "zero-shot", None, None, {})]}
  cells["main"] = [
      ("main", f"{method}-s{seed}", method, seed, {})
      for seed in settings["seeds"]  # seed-major, as the other grids
      for method in methods
  ]
  return cells


def llm_cell_config(settings, method, seed, data_dir):
  """configs/arithmetic_mix_llm.py (the paper's) with the profile's schedule."""
  steps = settings["train_steps"]
  config = arithmetic_mix_llm.get_config(method)
  config.data_dir = data_dir
  config.dataset_config = arithmetic_data.config_name(
      settings["train_size"],
      settings["test_size"],
      0,
      **LLM_DATASETS[settings["dataset"]],
  )
  config.pretrained = settings["pretrained"]
  config.split_digits = settings["split_digits"]
  for name, recorded in RECORDED_TOKENIZATION.items():
    config[name] = settings.get(name, recorded)
  config.train_steps = steps
  config.batch_size = settings["batch_size"]
  config.learning_rate = settings["learning_rate"]
  config.warmup_steps = schedule.short_run_warmup(
      config.warmup_steps, steps, minimum=1
  )
  config.seed = seed
  config.log_every_steps = min(25, steps)
  config.eval_every_steps = max(1, steps // 2)  # halfway and at the end
  config.checkpoint_every_steps = settings.get(
      "checkpoint_every_steps", max(1, steps // 3)
  )
  config.eval_examples = 0  # the whole test split
  config.eval_batch_size = min(64, settings["test_size"])
  config.max_prompt_tokens = settings.get("max_prompt_tokens", 0)
  return config


# Version 2 of a snapshot's identity covers its tokenizer and generation
# config too. Records made before it (no SNAPSHOT_FILES field) keep their
# version-1 hashes: `llm_cell_hash`.
IDENTITY_VERSION = 2
SNAPSHOT_FILES = "snapshot_files"


def snapshot_identity(path, version=IDENTITY_VERSION) -> str:
  """What names a snapshot in cell hashes: its folder's name, a digest of
  its config.json, its weight files' names and sizes and (version 2) the
  bytes of its other files (`snapshots.identity_files`: tokenizer,
  generation config, weight index). Not its location, so a grid resumes
  and its results merge wherever the snapshot sits."""
  digest = hashlib.sha256()
  with open(os.path.join(path, "config.json"), "rb") as f:
    digest.update(f.read())
  for name in sorted(os.listdir(path)):
    if name.endswith(".safetensors"):
      size = os.path.getsize(os.path.join(path, name))
      digest.update(f"{name}:{size}".encode())
  if version >= 2:
    for name in snapshots.identity_files(path):
      if name != "config.json" and not name.endswith(".safetensors"):
        sha = snapshots.file_sha256(os.path.join(path, name))
        digest.update(f"\n{name}:{sha}".encode())
  return f"{os.path.basename(path.rstrip(os.sep))}@{digest.hexdigest()[:12]}"


def snapshot_files(path, cache_path) -> dict[str, str]:
  """SHA-256 of each of the snapshot's `snapshots.identity_files`, by name.

  Each file's digest is cached in ``cache_path`` by its path, size and
  mtime, so a grid reads the weights once.
  """
  try:
    with open(cache_path) as f:
      cache = json.load(f)
  except (OSError, ValueError):
    cache = {}
  digests = {}
  for name in snapshots.identity_files(path):
    file_path = os.path.abspath(os.path.join(path, name))
    stat = os.stat(file_path)
    key = [stat.st_size, stat.st_mtime_ns]
    entry = cache.get(file_path)
    if entry is None or entry[:2] != key:
      entry = cache[file_path] = key + [snapshots.file_sha256(file_path)]
    digests[name] = entry[2]
  os.makedirs(os.path.dirname(os.path.abspath(cache_path)), exist_ok=True)
  temporary = f"{cache_path}.tmp{os.getpid()}"
  with open(temporary, "w") as f:
    json.dump(cache, f)
  os.replace(temporary, cache_path)
  return digests


def snapshot_contents(path, cache_path) -> str:
  """SHA-256 over the bytes of the snapshot's config.json and weights.

  `snapshot_identity` names the snapshot in cell hashes by its folder name
  and its files' sizes, so that recorded cells keep their hashes; two
  checkpoints of one architecture saved under one name have the same
  identity. This digest (each record's ``snapshot_sha256``) tells them
  apart (`check_same_snapshot`); `snapshot_files` gives every file's.
  """
  digests = snapshot_files(path, cache_path)
  names = ["config.json"] + sorted(
      n for n in digests if n.endswith(".safetensors")
  )
  digest = hashlib.sha256()
  for name in names:
    digest.update(f"{name}:{digests[name]}\n".encode())
  return digest.hexdigest()


def check_same_snapshot(results, settings, contents, files=None) -> None:
  """UsageError if ``results`` holds cells of this snapshot's name made
  from other files: other weights (``contents``, `snapshot_contents`) or,
  for records that list their files (``files``, `snapshot_files`), another
  tokenizer or generation config. Their cells would count as done, or be
  reported beside this snapshot's."""
  other, changed = [], set()
  for record in common.load_results(results):
    if record.get("snapshot") != snapshot_name(settings):
      continue
    differ = set()
    if record.get("snapshot_sha256") not in (None, contents):
      differ.add("weights")
    if files is not None and record.get(SNAPSHOT_FILES) is not None:
      recorded = record[SNAPSHOT_FILES]
      differ |= {
          name
          for name in set(recorded) | set(files)
          if recorded.get(name) != files.get(name)
      }
    if differ:
      other.append(record["name"])
      changed |= differ
  if other:
    raise app.UsageError(
        f"{results} holds cells ({', '.join(other[:3])}"
        f"{', ...' if len(other) > 3 else ''}) of a snapshot named "
        f"{snapshot_name(settings)} with other files than "
        f"{settings['pretrained']} ({', '.join(sorted(changed))} differ"
        f"{'; other weights, same names and sizes' if 'weights' in changed else ''}"
        "): rename this snapshot's folder, or pass --results=ANOTHER.json."
    )


def _located_nowhere(config, settings, version):
  """``config`` and ``settings`` with the snapshot path replaced by its
  `snapshot_identity` and no data directory, for hashing."""
  identity = snapshot_identity(settings["pretrained"], version)
  config = ml_collections.ConfigDict(config.to_dict())
  config.pretrained = identity
  config.data_dir = ""  # the data is named by dataset_config, wherever it is
  data = {k: v for k, v in settings.items() if k != "seeds"}
  data["pretrained"] = identity
  return config, data


def llm_hash(config, profile, settings, version=IDENTITY_VERSION) -> str:
  """A trained cell's hash; the seed list is left out (``--seeds`` grows),
  and the snapshot counts by its identity, not its path."""
  config, data = _located_nowhere(config, settings, version)
  return common.config_hash(config, profile, data)


ZERO_SHOT_FIELDS = (
    "task",
    "pretrained",
    "dtype",
    "prompt_template",
    "split_digits",
    "max_question_len",
    "max_answer_len",
    "eval_examples",
)


def zero_shot_hash(config, profile, settings, version=IDENTITY_VERSION) -> str:
  """Only what the zero-shot score depends on: snapshot, test set, prompt."""
  config, _ = _located_nowhere(config, settings, version)
  fields = {name: config[name] for name in ZERO_SHOT_FIELDS}
  # The prompts' tokenization, hashed where it is not the recorded cells'.
  for name, recorded in RECORDED_TOKENIZATION.items():
    if config[name] != recorded:
      fields[name] = config[name]
  fields = ml_collections.ConfigDict(fields)
  data = dict(
      zero_shot=True,
      dataset=settings["dataset"],
      test_size=settings["test_size"],
  )
  return common.config_hash(fields, profile, data)


def legacy_hashes(results) -> set[str]:
  """The hashes of ``results``' records made before `IDENTITY_VERSION` 2."""
  return {
      record["config_hash"]
      for record in common.load_results(results)
      if SNAPSHOT_FILES not in record
  }


def legacy_notice(results, snapshot) -> str | None:
  """The warning for ``results``' cells of ``snapshot`` (its name) made
  before `IDENTITY_VERSION` 2, or None if there are none.

  Their hashes do not cover the tokenizer or generation config, so they
  stay done whatever the snapshot's tokenizer is now: said once, loudly,
  with how to rerun them.
  """
  names = [
      record["name"]
      for record in common.load_results(results)
      if SNAPSHOT_FILES not in record and record.get("snapshot") == snapshot
  ]
  if not names:
    return None
  return (
      f"{len(names)} cell(s) of {snapshot} in {results} "
      f"({', '.join(names[:3])}{', ...' if len(names) > 3 else ''}) were "
      "recorded before a snapshot's identity covered its tokenizer and "
      "generation config: they count as done whatever this snapshot's "
      "tokenizer is. Delete their records to rerun them with it."
  )


def llm_cell_hash(hash_function, config, profile, settings, legacy) -> str:
  """A cell's hash (``hash_function``: `llm_hash` or `zero_shot_hash`).

  Its version-1 hash where a record made before version 2 has it (in
  ``legacy``, `legacy_hashes`): a cell recorded then stays done, with the
  tokenizer it had. Otherwise the version-2 hash, so that another tokenizer
  is another cell, with its own work directory.
  """
  old = hash_function(config, profile, settings, version=1)
  if old in legacy:
    return old
  return hash_function(config, profile, settings)


def check_llm_cells(settings, methods) -> None:
  """ConfigError if any cell's config would be refused by the trainer:
  checked before the data is generated or the zero-shot cell runs (the
  snapshot's files, its digit tokens, the seeds, ...)."""
  configs = [llm_cell_config(settings, "ce", 0, "")] + [
      llm_cell_config(settings, method, seed, "")
      for _, _, method, seed, _ in llm_grid(settings, methods)["main"]
  ]
  for config in configs:
    checks.check_config(config, data=False)


def _device() -> str:
  device = jax.devices()[0]
  return f"{device.platform}:{device.device_kind} x{jax.device_count()}"


def _eval_fields(evaluation) -> dict:
  return dict(
      exact_match=evaluation["exact_match"],
      parsed_rate=evaluation["parsed_rate"],
      mean_abs_error=evaluation["mean_abs_error"],
      mean_log10_abs_error=evaluation["mean_log10_abs_error"],
      within_1_percent=evaluation["within_1_percent"],
      num_test_examples=evaluation["num_examples"],
      exact_match_by_answer_length=evaluation["exact_match_by_answer_length"],
      examples_by_answer_length=evaluation["examples_by_answer_length"],
  )


def _llm_identity(profile, settings) -> dict:
  return dict(
      profile=profile,
      snapshot=snapshot_name(settings),
      pretrained=settings["pretrained"],
      dataset=settings["dataset"],
      data=LLM_DATASETS[settings["dataset"]],
      split_digits=settings["split_digits"],
  )


def zero_shot_record(profile, settings, config, digest) -> dict:
  """Greedy-decodes the test split with the snapshot as it is (no training)."""
  start = time.time()
  task = checks.check_config(config)
  mesh = step_lib.make_mesh(config, task)
  sharding = NamedSharding(mesh, P(step_lib.BATCH_AXES))

  def to_global(local):
    return jax.make_array_from_process_local_data(sharding, np.asarray(local))

  with jax.set_mesh(mesh):
    model = task.create_model(config, mesh)
    evaluation, _, predictions = evaluate.evaluate(
        model, config, to_global, task
    )
  return dict(
      name="zero-shot",
      group="zero_shot",
      method=None,
      seed=None,
      overrides={},
      **_llm_identity(profile, settings),
      model="pretrained",
      steps=0,
      problems_seen=0,
      **_eval_fields(evaluation),
      wall_seconds=round(time.time() - start, 1),
      device=_device(),
      host=platform.node(),
      config_hash=digest,
      predictions=[prediction for _, _, prediction in predictions],
  )


def _steps_per_second(metrics_path) -> float | None:
  """The median training speed over the run's logs (the first compiles)."""
  rates = [
      r["steps_per_second"]
      for r in plots.read_metrics(metrics_path)[0]
      if "steps_per_second" in r
  ]
  rates = rates[1:] or rates
  return float(np.median(rates)) if rates else None


def llm_workdir(profile, settings, name, digest) -> str:
  """One directory per cell and settings: a changed flag never resumes it."""
  return common.cell_workdir(
      os.path.join(FLAGS.runs_dir, profile),
      snapshot_name(settings),
      name,
      digest,
  )


def llm_cell_record(profile, settings, cell, config, digest) -> dict:
  """Fine-tunes one cell (resuming if it can) and returns its record."""
  group, name, method, seed, overrides = cell
  workdir = llm_workdir(profile, settings, name, digest)
  result, wall_seconds = common.train_once(config, workdir)
  metrics_path = os.path.join(workdir, "metrics.jsonl")
  return dict(
      name=name,
      group=group,
      method=method,
      seed=seed,
      overrides=overrides,
      **_llm_identity(profile, settings),
      model="pretrained",
      steps=result["step"],
      batch_size=config.batch_size,
      learning_rate=config.learning_rate,
      problems_seen=result["step"] * config.batch_size,
      **_eval_fields(result["eval"]),
      final_train_loss=result["train"]["loss"],
      final_train_ce=result["train"]["ce"],
      steps_per_second=_steps_per_second(metrics_path),
      wall_seconds=wall_seconds,
      device=_device(),
      host=platform.node(),
      config_hash=digest,
      prepared_data=data_fingerprints.dataset_of(config),
      curves=common.curves(metrics_path),
      predictions=train.read_predictions(workdir),
  )


def llm_results_path(settings) -> str:
  return FLAGS.results or default_llm_results_path(settings)


def default_llm_results_path(settings) -> str:
  return os.path.join(HERE, "llm", snapshot_name(settings), "results.json")


def check_one_schedule(results, settings) -> None:
  """UsageError if ``results`` holds this dataset's cells at another schedule.

  The report pairs a dataset's cells by method and seed: cells of two
  schedules (steps, batch, learning rate, test size) or two tokenizations
  (``split_digits``, of the zero-shot cell too; a record without it was
  run without it) in one file would be compared as if they were one grid.
  """
  wanted = dict(
      steps=settings["train_steps"],
      batch_size=settings["batch_size"],
      learning_rate=settings["learning_rate"],
      num_test_examples=settings["test_size"],
  )
  for record in common.load_results(results):
    if record.get("dataset") != settings["dataset"]:
      continue
    differ = {}
    recorded = record.get("split_digits", SPLIT_DIGITS_UNRECORDED)
    if recorded != settings["split_digits"]:
      differ["split_digits"] = (recorded, settings["split_digits"])
    if record["group"] == "main":
      differ |= {
          k: (record.get(k), v) for k, v in wanted.items() if record.get(k) != v
      }
    if differ:
      raise app.UsageError(
          f"{results} holds {settings['dataset']} cells at another schedule or tokenization ("
          + ", ".join(
              f"{k} {a} there, {b} here" for k, (a, b) in differ.items()
          )
          + "): pass --results=ANOTHER.json for this one, so that each "
          "report compares one grid."
      )


def run_llm(profile) -> None:
  """The llm grid: zero-shot, then each method and seed; resumable."""
  settings = llm_settings(profile)
  methods = chosen_methods()
  check_llm_cells(settings, methods)
  results = llm_results_path(settings)
  FLAGS.runs_dir = common.grid_runs_dir(
      FLAGS.runs_dir,
      results,
      default_llm_results_path(settings),
      FLAGS["runs_dir"].present,
  )
  common.check_results(results)
  check_one_schedule(results, settings)
  cache = os.path.join(FLAGS.runs_dir, ".snapshot_digests.json")
  files = snapshot_files(settings["pretrained"], cache)
  contents = snapshot_contents(settings["pretrained"], cache)
  check_same_snapshot(results, settings, contents, files)
  legacy = legacy_hashes(results)
  notice = legacy_notice(results, snapshot_name(settings))
  if notice:
    logging.warning(notice)
  os.makedirs(os.path.dirname(os.path.abspath(results)), exist_ok=True)
  arithmetic_data.prepare(
      FLAGS.data_dir,
      settings["train_size"],
      settings["test_size"],
      workers=FLAGS.data_workers,
      **LLM_DATASETS[settings["dataset"]],
  )
  # Prompts padded to what the data needs, not the character bound.
  settings["max_prompt_tokens"] = llm_task.longest_prompt_tokens(
      llm_cell_config(settings, "ce", 0, FLAGS.data_dir)
  )
  logging.info("prompts padded to %d tokens", settings["max_prompt_tokens"])
  cells = llm_grid(settings, methods)
  groups = selected_groups(cells, profile)
  if FLAGS.workers > 1:  # after `prepare`: the workers share its data
    sys.exit(
        common.spawn_workers(
            "experiments.arithmetic_mix.run", sys.argv, FLAGS.workers
        )
    )
  todo = [cell for group in groups for cell in cells[group]]

  def configure(cell):
    group, _, method, seed, _ = cell
    if group == "zero_shot":
      config = llm_cell_config(settings, "ce", 0, FLAGS.data_dir)
      return llm_cell_hash(zero_shot_hash, config, profile, settings, legacy)
    config = llm_cell_config(settings, method, seed, FLAGS.data_dir)
    return llm_cell_hash(llm_hash, config, profile, settings, legacy)

  def execute(cell, digest):
    group, _, method, seed, _ = cell
    if group == "zero_shot":
      config = llm_cell_config(settings, "ce", 0, FLAGS.data_dir)
      record = zero_shot_record(profile, settings, config, digest)
    else:
      config = llm_cell_config(settings, method, seed, FLAGS.data_dir)
      record = llm_cell_record(profile, settings, cell, config, digest)
    return dict(record, snapshot_sha256=contents, **{SNAPSHOT_FILES: files})

  def after_keep(cell, digest):
    # Recorded: its checkpoints (1.6 GB for 135M parameters) are never read
    # again. Not before the record is kept, or a crash in between retrains.
    group, name, _, _, _ = cell
    if group != "zero_shot":
      shutil.rmtree(
          os.path.join(
              llm_workdir(profile, settings, name, digest), "checkpoints"
          ),
          ignore_errors=True,
      )

  def describe(record):
    return (
        f"{settings['dataset']} {record['name']}: exact match "
        f"{100 * record['exact_match']:.2f}%"
    )

  common.run_grid(
      todo,
      configure,
      execute,
      describe,
      results,
      max_runs=FLAGS.max_cells,
      after_keep=after_keep,
      runs_dir=FLAGS.runs_dir,
      data_dir=FLAGS.data_dir,
      accept_changed_data=FLAGS.accept_changed_data,
  )
  logging.info(
      "now: python -m experiments.arithmetic_mix.report --profile=llm "
      "--snapshot=%s",
      snapshot_name(settings),
  )


def main(argv):
  del argv
  logs.quiet_terminal()
  if FLAGS.profile in LLM_PROFILES:
    run_llm(FLAGS.profile)
    return
  given = [name for name in LLM_FLAGS if FLAGS[name].value is not None]
  if given:
    raise app.UsageError(
        f"--{', --'.join(given)}: only for --profile=llm (or llm_smoke)."
    )
  settings = PROFILES[FLAGS.profile]
  cells = grid(FLAGS.profile)
  groups = selected_groups(cells, FLAGS.profile)  # before the data is made
  methods = chosen_methods(METHODS + PEER_METHODS)
  results = results_path(FLAGS.profile)
  FLAGS.runs_dir = common.grid_runs_dir(
      FLAGS.runs_dir,
      results,
      default_results_path(FLAGS.profile),
      FLAGS["runs_dir"].present,
  )
  common.check_results(results)
  os.makedirs(os.path.dirname(results), exist_ok=True)
  arithmetic_data.prepare(
      FLAGS.data_dir,
      settings["train_size"],
      settings["test_size"],
      workers=FLAGS.data_workers,
      **_variant(settings),
  )
  if FLAGS.workers > 1:  # after `prepare`: the workers share its data
    sys.exit(
        common.spawn_workers(
            "experiments.arithmetic_mix.run", sys.argv, FLAGS.workers
        )
    )
  todo = [c for g in groups for c in cells[g] if c[2] in methods]

  def configure(cell):
    _, _, method, seed, overrides = cell
    config = cell_config(FLAGS.profile, method, seed, overrides, FLAGS.data_dir)
    return config_hash(config, FLAGS.profile)

  def execute(cell, digest):
    return run_cell(FLAGS.profile, *cell, digest)

  def describe(record):
    return f"{record['name']}: exact match {100 * record['exact_match']:.2f}%"

  common.run_grid(
      todo,
      configure,
      execute,
      describe,
      results,
      max_runs=FLAGS.max_cells,
      runs_dir=FLAGS.runs_dir,
      data_dir=FLAGS.data_dir,
      accept_changed_data=FLAGS.accept_changed_data,
  )
  logging.info("now: python -m experiments.arithmetic_mix.report")


if __name__ == "__main__":
  common.run_main(main)
