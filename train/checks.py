"""Everything a run checks before it compiles: config, data and workdir.

Each check raises `errors.ConfigError` with one line that says what to do.
"""

import copy
import math
import os

import jax

from configs import common
import ntil_jax
from train import errors
from train import input_pipeline
from train import models
from train import rundir
from train import snapshots
from train import step
from train import tasks


def get_task(config):
  """The task module of ``config.task``; ConfigError if there is none."""
  try:
    return tasks.get(config.task)
  except ValueError as error:
    raise errors.ConfigError(str(error)) from error


DTYPES = ("float32", "bfloat16", "float16")
# Fields that must be >= 1, and fields that must be >= 0.
_POSITIVE = (
    "train_steps",  # 0 trained nothing and evaluated nothing, in silence
    "batch_size",
    "eval_batch_size",
    "checkpoint_every_steps",
    "log_every_steps",
    "fsdp",
    "keep_checkpoints",
    "max_question_len",
    "max_answer_len",
)
_NON_NEGATIVE = (
    "eval_every_steps",
    "eval_examples",
    "warmup_steps",
    "lr_decay_steps",
    "num_samples",
    "lam",
    "weight_decay",
    "gumbel_noise",
    "digit_ce_weight",
    "worker_count",
    "fused_chunk_size",
)


# Loss parameters in the config, as ntil_jax's parameter checks name them.
_LOSS_PARAMETERS = dict(
    sigma="sigma",
    alpha="alpha",
    beta="beta",
    tau="tau",
    gumbel_noise="noise_scale",
    soft_label_eta="eta",
    soft_label_width="width",
)


def _non_finite_fields(config, prefix=""):
  """Names of the config's float fields (nested too) that are NaN or inf."""
  found = []
  for name, value in config.items():
    if hasattr(value, "items"):
      found += _non_finite_fields(value, f"{prefix}{name}.")
    elif isinstance(value, float) and not math.isfinite(value):
      found.append(f"{prefix}{name}={value}")
  return found


def _check_numbers(config) -> None:
  bad = _non_finite_fields(config)
  if bad:
    raise errors.ConfigError(
        f"config fields must be finite numbers, got {', '.join(bad)}."
    )
  for name, parameter in _LOSS_PARAMETERS.items():
    try:  # every method's, so that a bad value never waits for a switch
      ntil_jax.losses.check_parameters(**{parameter: config[name]})
    except ValueError as error:
      raise errors.ConfigError(
          str(error).replace(parameter, name, 1)
      ) from error
  # tp: the LLM task's tensor parallelism, a field of its config only.
  for name in _POSITIVE + (("tp",) if "tp" in config else ()):
    if config[name] < 1:
      raise errors.ConfigError(f"{name} must be >= 1, got {config[name]}.")
  for name in _NON_NEGATIVE:
    if config[name] < 0:
      raise errors.ConfigError(f"{name} must be >= 0, got {config[name]}.")
  for name in ("learning_rate", "grad_clip_norm"):
    if not config[name] > 0:
      raise errors.ConfigError(f"{name} must be > 0, got {config[name]}.")
  for name in ("train_steps", "warmup_steps", "lr_decay_steps"):
    if config[name] >= 2**31:  # int32 step counts in the schedule
      raise errors.ConfigError(f"{name} must be < 2**31, got {config[name]}.")
  if not 0 <= config.seed < 2**32:  # numpy's and grain's seeds are uint32
    raise errors.ConfigError(f"seed must be in [0, 2**32), got {config.seed}.")


def check_directory(path: str, what: str) -> None:
  """ConfigError if ``path`` exists but is not a directory."""
  if os.path.exists(path) and not os.path.isdir(path):
    raise errors.ConfigError(f"{what} {path} is a file, not a directory.")


def name_dataset(config, workdir, *, start_over: bool = False):
  """``config`` with ``dataset_config`` named where it was left empty.

  A run that names no dataset reads the one prepared in ``data_dir``; it
  is recorded by name, so that the run still resumes after another dataset
  of its task was prepared beside it. Left empty, the name is the one the
  run in ``workdir`` recorded (not with ``start_over``), else that of the
  only dataset of the task in ``data_dir``; with several and no record,
  it stays empty and `check_config` says to name one. Returns a copy where
  it names one, ``config`` itself otherwise; reads only.
  """
  if config.get("dataset_config") or not config.get("data_dir"):
    return config
  name = ""
  if workdir and not start_over and os.path.isdir(workdir):
    if rundir.saved_steps(workdir):
      recorded = (rundir.read_record(workdir) or {"config": {}})["config"]
      # Another task's name (a clock run's under a grounding config) would
      # only make the refusal of the changed task name a dataset instead.
      if recorded.get("task", config.get("task")) == config.get("task"):
        name = recorded.get("dataset_config") or ""
  if not name:
    task = get_task(config)
    prepared = input_pipeline.prepared_configs(config.data_dir, task.NAME)
    if len(prepared) != 1:
      return config  # none (check_data says how to prepare it) or several
    (name,) = prepared
  config = copy.deepcopy(config)
  config.dataset_config = name
  return config


def check_config(config, *, data: bool = True):
  """The config's task module; ConfigError (one line: what to do) if bad.

  ``data=False`` leaves the data out, for a grid that checks every cell's
  config before it generates the data.
  """
  task = get_task(config)
  methods = common.TRAINER_METHODS
  if config.method not in methods:
    raise errors.ConfigError(
        f"unknown method {config.method!r}; use one of {', '.join(methods)}."
    )
  if not hasattr(task, "create_model") and config.model not in (
      models.MODEL_SIZES
  ):
    raise errors.ConfigError(
        f"unknown model size {config.model!r}; use one of "
        f"{', '.join(sorted(models.MODEL_SIZES))}."
    )
  if config.weighting not in ntil_jax.losses.WEIGHTINGS:
    raise errors.ConfigError(
        f"unknown weighting {config.weighting!r}; use one of "
        f"{', '.join(ntil_jax.losses.WEIGHTINGS)}."
    )
  for name in ("dtype", "param_dtype"):
    if config[name] not in DTYPES:
      raise errors.ConfigError(
          f"unknown {name} {config[name]!r}; use one of {', '.join(DTYPES)}."
      )
  _check_numbers(config)
  if config.digit_ce_weight and config.method != "ce":
    raise errors.ConfigError(
        f"digit_ce_weight={config.digit_ce_weight} is the control of method "
        f"'ce' (CE weighted up on digits), not an addition to "
        f"{config.method!r}; set it to 0 or use --config.method=ce."
    )
  try:
    implementation = common.fused_implementation(config.fused_loss)
    ntil_jax.kernels.check(implementation, config.fused_chunk_size or None)
  except ValueError as error:
    raise errors.ConfigError(str(error)) from error
  if implementation is not None and implementation.startswith("tokamax"):
    if not ntil_jax.kernels.tokamax_ce.available():
      raise errors.ConfigError(
          f"fused_loss={implementation!r} needs tokamax: "
          "pip install 'ntil-jax[tokamax]'."
      )
  if implementation == "tokamax:mosaic_tpu" and jax.default_backend() != "tpu":
    raise errors.ConfigError(
        f"fused_loss='tokamax:mosaic_tpu' is tokamax's TPU kernel; this "
        f"run's devices are {jax.default_backend()!r}: use 'tokamax' (its "
        "choice for the backend), 'tokamax:xla' or 'chunked'."
    )
  try:
    ntil_jax.losses.check_method(
        config.method, config.weighting, common.loss_kwargs(config)
    )
  except (ValueError, TypeError) as error:
    raise errors.ConfigError(str(error)) from error
  devices = jax.device_count()
  if devices % config.fsdp:
    raise errors.ConfigError(
        f"fsdp={config.fsdp} does not divide the {devices} "
        "devices; set --config.fsdp to a divisor."
    )
  for name in ("batch_size", "eval_batch_size"):
    if config[name] % devices:
      raise errors.ConfigError(
          f"{name}={config[name]} is not divisible by the {devices} devices; "
          f"use a multiple of {devices}."
      )
  if data and not config.data_dir:
    raise errors.ConfigError(
        "no data: pass --config.data_dir=DIR after running `python -m "
        f"train.prepare_data --task={config.task} --data_dir=DIR "
        "--train_size=N --test_size=M`."
    )
  if config.get("train_stream", False) and not hasattr(task, "render_stream"):
    raise errors.ConfigError(
        f"train_stream=True: task {config.task} reads a prepared train split "
        "and cannot render its examples; set --config.train_stream=False."
    )
  try:  # the task's checks say how to create missing data
    task.check_config(config)
    if not hasattr(task, "create_model"):  # the model's own checks
      step.model_config(config, task)
    if data:
      task.check_data(config)
  except (ValueError, FileNotFoundError) as error:
    raise errors.ConfigError(str(error)) from error
  if implementation is not None:  # one wrong for the vocabulary: at trace
    try:
      ntil_jax.kernels.check(
          implementation, vocab_size=vocab_size(task, config)
      )
    except ValueError as error:
      raise errors.ConfigError(
          f"fused_loss={implementation!r}: {error}"
      ) from error
  return task


def evaluation_warning(config) -> str | None:
  """A warning where ``eval_every_steps=0``: no evaluation at all, not even
  at the last step (the run ends with no eval metrics or predictions)."""
  if config.eval_every_steps:
    return None
  return (
      "eval_every_steps=0: the run is never evaluated, not even at its last"
      " step (no eval metrics, no predictions.jsonl)."
  )


def unused_settings_warning(config) -> str | None:
  """A warning naming the settings changed from their defaults that this
  run never reads: another method's loss parameters (``tau`` with method
  'emd'), ``lam`` and ``weighting`` with method 'ce' (no numeric term), and
  ``fused_chunk_size`` with ``fused_loss=False`` (the logits path)."""
  own = common.METHOD_SETTINGS.get(config.method, ())
  unused = [
      name
      for name, default in common.LOSS_SETTINGS.items()
      if name not in own and config[name] != default
  ]
  if config.method == "ce":
    unused += [
        name
        for name, default in common.TERM_SETTINGS.items()
        if config[name] != default
    ]
  parts = [
      f"{name}={config[name]!r} (method {config.method!r} does not read it)"
      for name in unused
  ]
  if config.fused_chunk_size and common.fused_mode(config.fused_loss) is False:
    parts.append(
        f"fused_chunk_size={config.fused_chunk_size} (fused_loss=False: the"
        " logits path)"
    )
  if not parts:
    return None
  return "settings this run does not use: " + "; ".join(parts) + "."


def schedule_warning(config) -> str | None:
  """What is off in a schedule that runs but not as its numbers read.

  A warmup as long as the decay's horizon (``lr_decay_steps``, or
  ``train_steps`` without one) leaves no decay: the trainer stretches the
  horizon to ``warmup_steps + 1``. And a run of ``train_steps`` <=
  ``warmup_steps`` never reaches the peak learning rate.
  """
  horizon = config.lr_decay_steps or config.train_steps
  no_decay = horizon <= config.warmup_steps
  no_peak = config.train_steps <= config.warmup_steps
  if config.warmup_steps == 0 or not (no_decay or no_peak):
    return None
  name = "lr_decay_steps" if config.lr_decay_steps else "train_steps"
  parts = [f"warmup_steps={config.warmup_steps}"]
  if no_decay:
    parts.append(
        f"is not below {name}={horizon}: the learning rate does not decay"
    )
  if no_peak:
    parts.append(
        ("and" if no_decay else "outlasts the run:")
        + f" the {config.train_steps} steps end before it reaches"
        f" learning_rate={config.learning_rate}"
    )
  return " ".join(parts) + "."


def vocab_size(task, config) -> int:
  """The width ``V`` of the logits of ``config``'s model, before it is built:
  the task's ``vocab_size(config)`` hook, else its ``model_fields``."""
  if hasattr(task, "vocab_size"):
    return task.vocab_size(config)
  return task.model_fields(config)["vocab_size"]


def check_workdir(workdir: str) -> str:
  """Creates ``workdir`` if needed; returns its absolute path.

  Raises:
    ConfigError: the path is empty, is a file, holds a ``checkpoints`` file,
      or cannot be written.
  """
  if not workdir or not workdir.strip():
    raise errors.ConfigError(
        "--workdir is empty; name a directory for the "
        "checkpoints and metrics."
    )
  workdir = os.path.abspath(workdir)
  check_directory(workdir, "workdir")
  check_directory(os.path.join(workdir, "checkpoints"), "checkpoint path")
  try:
    os.makedirs(workdir, exist_ok=True)
    rundir.probe_writable(workdir)
  except OSError as error:
    raise errors.ConfigError(
        f"workdir {workdir} is not writable " f"({error.strerror or error})."
    ) from error
  return workdir


# Fields a run may change when it resumes: the schedule's length and the
# cadence of logs, evals and saves, how the same computation is laid out
# (the fused loss, FSDP, tensor parallelism), and where the data lies (the
# data itself is named by dataset_config). Any other change would resume a
# different run.
RESUMABLE_FIELDS = (
    "data_dir",
    "train_steps",
    "lr_decay_steps",
    *common.CADENCE_FIELDS,
    "fused_loss",
    "fused_chunk_size",
    "fsdp",
    "tp",
)
_ABSENT = "<absent>"


def _show(value) -> str:
  return _ABSENT if value is _ABSENT else repr(value)


def config_changes(recorded: dict, config) -> tuple[list, list]:
  """``(resumable, refused)``: (field, recorded, now) for every change.

  A field of `common.ADDED_FIELDS` that a run recorded before it existed,
  or that the config's task does not have (``digit_chunks`` outside
  arithmetic_mix), counts as its default there.
  """
  now = {**common.ADDED_FIELDS, **rundir.config_record(config)}
  recorded = {**common.ADDED_FIELDS, **recorded}
  resumable, refused = [], []
  for name in sorted(set(recorded) | set(now)):
    old, new = recorded.get(name, _ABSENT), now.get(name, _ABSENT)
    if old == new:
      continue
    # A run recorded before runs named their dataset read the only one
    # in its data_dir: naming it now resumes that run.
    legacy = name == "dataset_config" and old == ""
    (resumable if name in RESUMABLE_FIELDS or legacy else refused).append(
        (name, old, new)
    )
  return resumable, refused


def _snapshot_sha256(config) -> str | None:
  """The pretrained snapshot's `snapshots.contents_sha256`; None without
  one (or where ``config.pretrained`` is no directory)."""
  path = config.get("pretrained")
  if not path or not os.path.isdir(path):
    return None
  return snapshots.contents_sha256(path)


def snapshot_record(config, workdir) -> str | None:
  """What `rundir.write_config_record` records of the pretrained snapshot.

  The recorded digest where the run recorded one for the same
  ``pretrained`` path (no weight file read again); else the snapshot's.
  """
  if not config.get("pretrained") or jax.process_index() != 0:
    return None  # only process 0 writes the record
  record = rundir.read_record(workdir) or {}
  recorded = record.get(rundir.SNAPSHOT_SHA256)
  if recorded and record["config"].get("pretrained") == config.pretrained:
    return recorded
  return _snapshot_sha256(config)


def unrecorded_run_warning(workdir) -> str | None:
  """A warning where ``workdir`` holds checkpoints but no config record (a
  run from before runs recorded their config, or its config.json deleted,
  the way to resume under a changed config): nothing checks that the
  config given is the run's, past the arrays' shapes."""
  if not rundir.saved_steps(workdir) or rundir.read_record(workdir):
    return None
  return (
      f"{workdir} holds checkpoints but no {rundir.CONFIG_RECORD}: resuming"
      " them with this config, unchecked against the one they were trained"
      " with (--start_over to begin afresh)."
  )


def legacy_dataset_warning(changes, config) -> str | None:
  """A warning where a run that recorded no dataset resumes on a named one
  while ``data_dir`` holds several of its task: nothing records which one
  that run read, so the name is the user's word for it."""
  if not any(n == "dataset_config" and o == "" for n, o, _ in changes):
    return None
  prepared = input_pipeline.prepared_configs(
      config.data_dir, get_task(config).NAME
  )
  if len(prepared) < 2:
    return None
  return (
      f"the run was recorded without its dataset and {config.data_dir} holds"
      f" {len(prepared)} ({', '.join(sorted(prepared))}): it resumes on"
      f" {config.dataset_config!r} as named; if it read another, its"
      " later steps train on other data (--start_over to begin afresh)."
  )


def horizon_warning(changes, config) -> str | None:
  """A warning where a resumed run's decay horizon moves with train_steps.

  With ``lr_decay_steps=0`` the cosine decay runs to ``train_steps``: a run
  resumed with another ``train_steps`` trains its remaining steps on the new
  horizon after its first ones followed the old (a finished run's rate
  rises again). A changed ``lr_decay_steps`` is the user's own word and is
  not named.
  """
  changed = {name: (old, new) for name, old, new in changes}
  if (
      "train_steps" not in changed
      or "lr_decay_steps" in changed
      or config.lr_decay_steps
  ):
    return None
  old, new = changed["train_steps"]
  return (
      f"train_steps {old} -> {new} with lr_decay_steps=0: the learning"
      f" rate's decay now ends at step {new}, not {old}, so the resumed"
      " steps follow another schedule than the steps trained (the run is"
      f" neither {old} nor {new} steps straight);"
      f" --config.lr_decay_steps={old} keeps the schedule it had."
  )


def check_resumable(config, workdir) -> list:
  """The resumable changes from the run recorded in ``workdir``.

  Reads only: a refused workdir is left byte for byte as it was.

  Returns:
    ``[(field, recorded, now)]`` for the fields in `RESUMABLE_FIELDS` that
    changed; empty when the workdir holds no checkpoint or no record.

  A changed ``pretrained`` path resumes where the snapshot there has the
  digest the run recorded (`snapshot_record`): the same snapshot, moved.

  Raises:
    ConfigError: any other field changed (each named with both values).
  """
  if not rundir.saved_steps(workdir):
    return []  # nothing to resume: a new run
  record = rundir.read_record(workdir)
  if record is None:
    return []  # saved before runs recorded their config
  resumable, refused = config_changes(record["config"], config)
  moved = [change for change in refused if change[0] == "pretrained"]
  recorded_snapshot = record.get(rundir.SNAPSHOT_SHA256)
  if (
      moved
      and recorded_snapshot
      and recorded_snapshot == _snapshot_sha256(config)
  ):
    refused.remove(moved[0])  # the same snapshot, moved
    resumable.append(moved[0])
  if not refused:
    return resumable
  shown = "; ".join(f"{n}: {_show(o)} -> {_show(v)}" for n, o, v in refused)
  why = ""
  if moved and moved[0] in refused:
    why = (
        " (the snapshot at the new --config.pretrained path has other files "
        "than the one the run recorded)"
        if recorded_snapshot
        else " (the run recorded no digest of its snapshot, an older version"
        " did not, so a moved snapshot cannot be told from another)"
    )
  if any(name == "worker_count" for name, _, _ in refused):
    why = (
        " (the data iterator's saved position restores only under the "
        "worker_count it was saved with)"
    )
  if any(name == "train_stream" for name, _, _ in refused):
    why = (
        " (a streamed run and one on the prepared train split read other "
        "examples; the saved position of one means nothing to the other)"
    )
  raise errors.ConfigError(
      f"workdir {workdir} holds a run with another config ({shown}){why}; "
      "nothing was changed. Rerun with the recorded values to resume it (see "
      f"{os.path.join(workdir, rundir.CONFIG_RECORD)}), or pass --start_over "
      "to move the old run aside and start afresh."
  )
