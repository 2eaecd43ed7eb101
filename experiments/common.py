"""What the experiment grids share: resumable results files and run records."""

import contextlib
import fcntl
import hashlib
import json
import os
import subprocess
import sys
import time

from absl import app
from absl import flags
from absl import logging
import jax

from configs import common as common_config
from experiments import data_fingerprints
from train import compile_cache
from train import errors
from train import plots
from train import rundir
from train import schedule
from train import train


def define_grid_flags(here: str, groups: list[str], data_help: str) -> None:
  """Defines the flags of a task grid's ``run.py`` (clock_time, grounding).

  Args:
    here: the experiment's folder (results.json and runs/ go there).
    groups: the grid's groups, in their default run order.
    data_help: what ``--data_dir`` holds.
  """
  flags.DEFINE_enum(
      "profile",
      "cpu",
      ["cpu", "smoke"],
      "Grid size (smoke: seconds, for tests).",
  )
  flags.DEFINE_list(
      "groups", groups, "Which parts of the grid to run, in this order."
  )
  flags.DEFINE_string(
      "results",
      os.path.join(here, "results.json"),
      "Results file (one record per finished run).",
  )
  flags.DEFINE_string(
      "runs_dir",
      os.path.join(here, "runs"),
      "Work directories of the runs (not in git).",
  )
  flags.DEFINE_string("data_dir", "data", data_help)
  flags.DEFINE_integer(
      "max_runs", 0, "Stop after this many new runs (0: all).", lower_bound=0
  )
  flags.DEFINE_integer(
      "workers",
      1,
      "Processes running the grid at once, one XLA thread each (2 on a "
      "2-core machine trains about twice as fast as 1).",
      lower_bound=1,
  )
  define_data_check_flag()


def define_data_check_flag() -> None:
  """``--accept_changed_data`` (`data_fingerprints.check_unchanged`)."""
  flags.DEFINE_bool(
      "accept_changed_data",
      False,
      "Record new runs even where the data differs from what the recorded "
      "runs read (a changed generator or library); without it the grid "
      "refuses to start.",
  )


def define_report_flags(here: str) -> None:
  """A report's flags: its results, where it writes and its discussion.

  Called when the report runs, not when it is imported, so that tests may
  import several reports that define the same names."""
  flags.DEFINE_string("results", os.path.join(here, "results.json"), "Input.")
  flags.DEFINE_string("out_dir", here, "Where results.md and plots/ go.")
  flags.DEFINE_string(
      "discussion",
      os.path.join(here, "discussion.md"),
      "Hand-written reading of the results, appended if it exists.",
  )


def parse_flags(argv):
  """absl's parsing; a bad flag is one ``error:`` line, exit status 2."""
  try:
    return flags.FLAGS(argv)
  except flags.Error as error:
    print(f"error: {error}", file=sys.stderr)
    sys.exit(2)


def cli_main(main):
  """``main`` for ``app.run``: a refused input is one ``error:`` line.

  A `errors.ConfigError` (a results file that is not JSON, say) or an
  ``app.UsageError`` (an unknown group) exits with status 2, a
  `errors.TrainingError` with 1, with no traceback (`errors.exit_on_error`).
  A grid stopped by SIGINT or SIGTERM, its running cell checkpointed, says
  so in one line and exits with 130.
  """

  def checked(argv):
    try:
      with errors.exit_on_error():
        return main(argv)
    except app.UsageError as error:
      print(f"error: {error}", file=sys.stderr)
      sys.exit(2)
    except KeyboardInterrupt as error:
      print(f"stopped: {error or 'interrupted'}", file=sys.stderr)
      sys.exit(130)

  return checked


def run_main(main) -> None:
  """``app.run(main)`` for the grids and reports: `parse_flags`, `cli_main`."""
  app.run(cli_main(main), flags_parser=parse_flags)


def cell_config(config, settings, dataset_config, seed, overrides, data_dir):
  """``config`` set up for one cell of a task grid: data, schedule, seed.

  Args:
    config: the method's config (from the task's ``configs`` module).
    settings: the grid profile (train_steps, batch_size, test_size,
      eval_every_steps; checkpoint_every_steps, else half the steps).
    dataset_config: the name of the rendered data's TFDS config.
    seed: initialisation and data order.
    overrides: the cell's config changes (controls, ablations).
    data_dir: where the data is.

  Returns:
    ``config``, changed in place; its warmup at most a tenth of the steps.
  """
  config.data_dir = data_dir
  config.dataset_config = dataset_config
  config.train_steps = settings["train_steps"]
  config.batch_size = settings["batch_size"]
  config.seed = seed
  config.log_every_steps = min(25, settings["train_steps"])
  config.eval_every_steps = settings["eval_every_steps"]
  config.checkpoint_every_steps = settings.get(
      "checkpoint_every_steps", settings["train_steps"] // 2 or 1
  )
  config.eval_examples = 0  # the whole test split
  config.eval_batch_size = min(250, settings["test_size"])
  config.num_samples = 0
  # A short run (a smoke profile) keeps its warmup under a tenth of its
  # steps; the profiles' budgets (600 steps and up) keep the config's.
  steps = overrides.get("train_steps", settings["train_steps"])
  config.warmup_steps = schedule.short_run_warmup(config.warmup_steps, steps)
  for name, value in overrides.items():
    config[name] = value
  return config


def run_record(
    config, workdir, digest, metrics, curve_metrics, *, profile, **identity
):
  """Trains one cell (resuming if it can) and returns its results record.

  Args:
    config: the cell's config (`cell_config`).
    workdir: the run's work directory.
    digest: the cell's `config_hash`.
    metrics: the final eval metrics to record.
    curve_metrics: the eval metrics to record per eval step.
    profile: the grid profile's name.
    **identity: what names the cell (name, group, variant, method, seed,
      overrides, ...), first in the record.

  Returns:
    The record: identity, its `regime`, final metrics, train loss, timing,
    device, curves and the test predictions.
  """
  result, wall_seconds = train_once(config, workdir)
  evaluation = result["eval"]
  device = jax.devices()[0]
  return dict(
      **identity,
      regime=STREAM if config.get("train_stream", False) else FIXED,
      profile=profile,
      model=config.model,
      steps=result["step"],
      batch_size=config.batch_size,
      **{metric: evaluation[metric] for metric in metrics},
      num_test_examples=evaluation["num_examples"],
      # The test split's size, the problems skipped as too long included
      # (`num_test_examples` of them were scored).
      **(
          {"test_split_examples": evaluation["test_examples"]}
          if "test_examples" in evaluation
          else {}
      ),
      final_train_loss=result["train"]["loss"],
      final_train_ce=result["train"]["ce"],
      wall_seconds=wall_seconds,
      device=f"{device.platform}:{device.device_kind} x{jax.device_count()}",
      xla_flags=os.environ.get("XLA_FLAGS", ""),
      config_hash=digest,
      prepared_data=data_fingerprints.dataset_of(config),
      curves=curves(os.path.join(workdir, "metrics.jsonl"), curve_metrics),
      predictions=train.read_predictions(workdir),
  )


# How a run's train examples were had: a prepared train split read in
# epochs, or rendered as they were read (``train_stream``).
FIXED, STREAM = "fixed", "stream"


def regime(record) -> str:
  """A record's regime; records made before regimes were recorded: fixed."""
  return record.get("regime", FIXED)


# Where the data lies does not change a result (the data is named by its
# ``dataset_config``): every ``data_dir`` is hashed as this one, the default
# most cells were recorded with, so a grid finds its recorded cells wherever
# its data is (``--data_dir=data``, ``./data`` or an absolute path alike).
HASHED_DATA_DIR = "data"


# The keys of a profile that list its seeds. They say which cells a grid
# has, not what any one cell computes, yet they were hashed with every
# cell's settings: a seed added to a profile changed the hash of each of its
# recorded cells, and the grid would have trained them all again.
SEED_LISTS = ("seeds", "main_seeds", "other_seeds")


def hashed_settings(settings, recorded=None) -> dict:
  """A profile's ``settings`` as a cell's `config_hash` takes them: the seed
  lists replaced by ``recorded`` (those the profile's recorded cells were
  hashed with, which seeds added since leave as they are), or left out
  where there are none (a profile made since)."""
  fields = {k: v for k, v in settings.items() if k not in SEED_LISTS}
  return dict(fields, **(recorded or {}))


def config_hash(config, profile, settings) -> str:
  """A short digest of everything that determines a run's result.

  A field of ``configs.common.ADDED_FIELDS`` that holds its default is left
  out, so cells recorded before it existed keep their hash; ``data_dir`` is
  hashed as :data:`HASHED_DATA_DIR`, whatever it is.
  """
  fields = config.to_dict()
  for name, default in common_config.ADDED_FIELDS.items():
    if name in fields and fields[name] == default:
      del fields[name]
  if "data_dir" in fields:
    fields["data_dir"] = HASHED_DATA_DIR
  text = json.dumps(
      dict(config=fields, profile=profile, data=settings),
      sort_keys=True,
      default=str,
  )
  return hashlib.sha256(text.encode()).hexdigest()[:12]


def check_groups(groups, known, profile) -> None:
  """UsageError unless ``groups`` names some of ``known``, the groups of
  the ``profile`` grid, and nothing else (an empty ``--groups=`` ran no
  cell and exited 0)."""
  unknown = [group for group in groups if group not in known]
  if unknown or not groups:
    named = ",".join(unknown) if unknown else " (empty)"
    raise app.UsageError(
        f"--groups={named}: the {profile} grid has {', '.join(known)}."
    )


def grid_runs_dir(runs_dir, results_path, default_results, given) -> str:
  """The runs folder of a grid whose records go to ``results_path``.

  ``runs_dir`` itself for the grid's default results file, or where
  ``--runs_dir`` is ``given``; for another results file (the CPU's beside
  the accelerator's, say) a folder of its own under it, named by that file:
  two results files then never share a cell's work directory, where the
  second grid would find the first's finished run, evaluate it again and
  record it as its own (its device, both wall times).
  """
  if given or os.path.abspath(results_path) == os.path.abspath(default_results):
    return runs_dir
  name = os.path.splitext(os.path.basename(results_path))[0]
  tag = hashlib.sha256(os.path.abspath(results_path).encode()).hexdigest()
  return os.path.join(runs_dir, f"{name}-{tag[:8]}")


def cell_workdir(runs_dir, profile, name, digest) -> str:
  """A cell's work directory, named by its config hash as well as its name.

  The trainer resumes a workdir whose schedule length changed (a run
  extended on purpose), so a grid cell whose profile changed its
  ``train_steps`` must not find the old cell's finished run there: it would
  resume it with a warm restart of the learning-rate schedule and be
  recorded as a straight run of the new length.
  """
  return os.path.join(runs_dir, profile, f"{name}-{digest}")


# A run's test predictions are most of its record (a thousand strings), so
# they are kept beside results.json, one file per group, and every file stays
# far below git's 2 MiB limit however many runs a grid records:
# ``results.json`` -> ``results_predictions/<group>.json``.
PREDICTIONS = "predictions"


def predictions_dir(path) -> str:
  """Where the predictions of ``path``'s runs are kept, one file a group."""
  stem, _ = os.path.splitext(path)
  return f"{stem}_{PREDICTIONS}"


def _run_key(run):
  """What names a run among its file's predictions (None: kept inline)."""
  return run.get("config_hash") or run.get("name")


def write_text(path, text) -> None:
  """Writes ``text`` to ``path`` whole: a reader never sees half of it."""
  temporary = path + ".tmp"
  with open(temporary, "w") as f:
    f.write(text)
  os.replace(temporary, path)  # never a half-written file


def read_json(path):
  """The JSON value in file ``path``.

  Raises:
    errors.ConfigError: the file is not JSON (the message names it).
  """
  try:
    with open(path, encoding="utf-8") as f:
      return json.load(f)
  except ValueError as error:  # JSONDecodeError, UnicodeDecodeError
    raise errors.ConfigError(
        f"{path} is not valid JSON ({error}); restore it (e.g. git "
        "checkout) or move it aside."
    ) from None


def load_results(path):
  """The runs of ``path``, each with its predictions put back.

  Args:
    path: a results file written by `save_results` (or before predictions
      were kept apart: then they are in the records).

  Returns:
    The list of run records, in file order.

  Raises:
    errors.ConfigError: ``path`` or a predictions file beside it is not
      JSON, or not what `save_results` writes (the message names the file).
  """
  if not os.path.exists(path):
    return []
  contents = read_json(path)
  runs = contents.get("runs") if isinstance(contents, dict) else None
  if not isinstance(runs, list) or not all(isinstance(r, dict) for r in runs):
    raise errors.ConfigError(
        f'{path} holds no {{"runs": [...]}} list of records; restore it '
        "(e.g. git checkout) or move it aside."
    )
  folder = predictions_dir(path)
  if not os.path.isdir(folder):
    return runs
  kept = {}
  for name in sorted(os.listdir(folder)):
    if name.endswith(".json"):
      predictions = read_json(os.path.join(folder, name))
      if not isinstance(predictions, dict):
        raise errors.ConfigError(
            f"{os.path.join(folder, name)} holds no {{run: predictions}} "
            "map; restore it (e.g. git checkout) or move it aside."
        )
      kept.update(predictions)
  for run in runs:
    key = _run_key(run)
    if PREDICTIONS not in run and key in kept:
      run[PREDICTIONS] = kept[key]
  return runs


def save_results(path, runs):
  """Writes ``{"runs": [...]}`` with one run per line, predictions apart.

  One compact line per run keeps the file small (the curves are long lists)
  and a new run a one-line diff. The predictions go to
  ``<stem>_predictions/<group>.json`` (`predictions_dir`), a ``{run: [...]}``
  map per group, written before the records that name them; the folder then
  holds exactly the given runs' predictions.
  """
  groups = {}
  records = []
  for run in runs:
    key = _run_key(run)
    if PREDICTIONS in run and key is not None:
      group = str(run.get("group") or "runs")
      groups.setdefault(group, {})[key] = run[PREDICTIONS]
      run = {k: v for k, v in run.items() if k != PREDICTIONS}
    records.append(run)
  folder = predictions_dir(path)
  if groups or os.path.isdir(folder):
    os.makedirs(folder, exist_ok=True)
    for group, predictions in groups.items():
      lines = ",\n".join(
          f"{json.dumps(key)}:{json.dumps(value, separators=(',', ':'))}"
          for key, value in predictions.items()
      )
      write_text(os.path.join(folder, f"{group}.json"), "{\n" + lines + "\n}\n")
    for name in os.listdir(folder):  # groups no longer in ``runs``
      if name.endswith(".json") and name[: -len(".json")] not in groups:
        os.remove(os.path.join(folder, name))
  lines = ",\n".join(json.dumps(run, separators=(",", ":")) for run in records)
  write_text(path, '{"runs": [\n' + lines + "\n]}\n")


def curves(metrics_path, eval_keys=("exact_match",)):
  """Loss/CE per log and the eval metrics per eval, for report plots."""
  train_records, eval_records = plots.read_metrics(metrics_path)
  result = dict(
      steps=[r["step"] for r in train_records],
      loss=[round(r["loss"], 5) for r in train_records],
      ce=[round(r["ce"], 5) for r in train_records],
      eval_steps=[r["step"] for r in eval_records],
  )
  for key in eval_keys:
    result[key] = [r[key] for r in eval_records]
  return result


# In a run's workdir: the seconds every grid session spent on the run.
WALL_SECONDS = "wall_seconds.txt"


def train_once(config, workdir):
  """Trains one run to the end; (result, wall seconds). Resumes if it can.

  The seconds are those of every session that worked on the run since it
  last started from step 0, kept in the workdir (:data:`WALL_SECONDS`), so
  a run resumed from a checkpoint, or only evaluated again, is not recorded
  as taking the last session's time, and one trained again from scratch
  (its checkpoints deleted) not as taking both. A session that ends by an
  exception or a signal counts; a killed process's does not.
  """
  if not rundir.saved_steps(workdir):  # from step 0: a count of its own
    with contextlib.suppress(FileNotFoundError):
      os.remove(os.path.join(workdir, WALL_SECONDS))
  start = time.time()
  try:
    result = train.train_and_evaluate(config, workdir)
  finally:
    seconds = _add_wall_seconds(workdir, time.time() - start)
  if result["stopped_early"]:
    raise KeyboardInterrupt(f"{workdir} stopped by a signal; rerun to resume")
  return result, round(seconds, 1)


def _add_wall_seconds(workdir, seconds) -> float:
  """Adds ``seconds`` to ``workdir``'s :data:`WALL_SECONDS`; the total."""
  path = os.path.join(workdir, WALL_SECONDS)
  try:
    with open(path) as f:
      seconds += float(f.read())
  except (OSError, ValueError):
    pass  # the run's first session (or a workdir from before the count)
  if os.path.isdir(workdir):
    with open(path + ".tmp", "w") as f:
      f.write(f"{seconds:.1f}\n")
    os.replace(path + ".tmp", path)
  return seconds


# Each worker process of a grid runs XLA's CPU kernels on one thread: two
# one-thread processes on two cores train about twice as fast as one process
# with two threads (small ops do not split well).
ONE_THREAD_XLA = (
    "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
)


# The grids' limits on the cells a command runs: the command's, not each
# worker's.
_CELL_LIMITS = ("--max_cells", "--max_runs")


def _worker_args(args: list[str], workers: int) -> list[list[str]]:
  """Each worker's arguments: a cell limit is shared out between them (a
  limit of N runs N cells in all, on at most N workers)."""
  rest, limit, flag = [], 0, None
  arguments = iter(args)
  for arg in arguments:
    name, equals, value = arg.partition("=")
    if name in _CELL_LIMITS:
      flag, limit = name, int(value if equals else next(arguments))
    else:
      rest.append(arg)
  if not limit:
    return [args] * workers
  shares = [limit // workers + (k < limit % workers) for k in range(workers)]
  return [rest + [f"{flag}={share}"] for share in shares if share]


def spawn_workers(module: str, argv: list[str], workers: int) -> int:
  """Runs ``workers`` copies of ``python -m module argv`` at once; worst rc.

  Each copy takes the next run no other copy holds (see `run_grid`), so they
  share one grid and one results file. Used by the grids' ``--workers``.
  """
  env = dict(os.environ)
  env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " " + ONE_THREAD_XLA).strip()
  # On a GPU each process would take 75% of its memory up front: share it.
  env.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", f"{0.9 / workers:.2f}")
  args = [a for a in argv[1:] if not a.startswith("--workers")]
  processes = [
      subprocess.Popen(
          [sys.executable, "-m", module, *own, "--workers=1"], env=env
      )
      for own in _worker_args(args, workers)
  ]
  try:
    return max(process.wait() for process in processes)
  except KeyboardInterrupt:  # the children got the signal too: let them save
    return max(process.wait() for process in processes)


def append_result(path, record) -> None:
  """Adds ``record`` to results.json; safe with several grid processes.

  The file is re-read under an exclusive lock on its directory, so records
  another process added in the meantime are kept; a record whose config
  hash is there already (another grid process, with runs of its own, ran
  the same cell) is not added again: the first one stands.
  """
  with _results_lock(path):
    runs = load_results(path)
    if any(r.get("config_hash") == record["config_hash"] for r in runs):
      logging.warning(
          "%s: %s (%s) is recorded already; this run's record is not added",
          path,
          record.get("name"),
          record["config_hash"],
      )
      return
    save_results(path, runs + [record])


@contextlib.contextmanager
def _results_lock(path):
  """An exclusive ``flock`` on the directory of results file ``path``."""
  fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
  try:
    fcntl.flock(fd, fcntl.LOCK_EX)
    yield
  finally:
    os.close(fd)  # releases the lock


@contextlib.contextmanager
def claim(directory, digest):
  """Yields whether this process now holds run ``digest`` (an ``flock``).

  The kernel drops the lock when its holder dies, so a crashed worker's run
  is taken by the next one to ask.
  """
  os.makedirs(directory, exist_ok=True)
  fd = os.open(os.path.join(directory, digest), os.O_RDWR | os.O_CREAT, 0o644)
  try:
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      yield False
      return
    yield True
  finally:
    os.close(fd)


def _records_dir(results_path) -> str:
  return os.path.join(os.path.dirname(results_path), "runs", ".records")


def _made_for(results_path, runs_dir) -> dict:
  """The grid a kept record belongs to: its results file and runs folder."""
  return dict(
      results=os.path.abspath(results_path), runs_dir=os.path.abspath(runs_dir)
  )


def _kept_record_path(results_path, runs_dir, digest) -> str:
  """Where run ``digest``'s record is kept for this results file and runs
  folder (named by both: two grids in one folder keep theirs apart)."""
  made_for = _made_for(results_path, runs_dir)
  tag = hashlib.sha256(
      f"{made_for['results']}\n{made_for['runs_dir']}".encode()
  ).hexdigest()[:8]
  return os.path.join(_records_dir(results_path), f"{digest}-{tag}.json")


def _keep_record(results_path, runs_dir, record) -> None:
  """A copy of a finished run's record beside its run, before results.json.

  results.json is tracked by git and so can be reverted (a checkout, a
  stash, a device machine's copy of the tree) or be left without the record
  by a crash; the copy under the ignored ``runs/`` then restores it. The
  copy names the results file and runs folder it was made for.
  """
  path = _kept_record_path(results_path, runs_dir, record["config_hash"])
  os.makedirs(os.path.dirname(path), exist_ok=True)
  temporary = f"{path}.tmp{os.getpid()}"
  with open(temporary, "w") as f:
    json.dump(
        dict(made_for=_made_for(results_path, runs_dir), record=record), f
    )
  os.replace(temporary, path)


def _read_kept(path, digest):
  """(made_for, record) of kept-record file ``path``; None unless it holds
  a record of run ``digest``. Older files hold the bare record (made_for
  None)."""
  try:
    with open(path) as f:
      kept = json.load(f)
  except (OSError, ValueError) as error:
    logging.warning("%s unreadable (%s): the cell runs again.", path, error)
    return None
  if not isinstance(kept, dict):
    return None
  made_for, record = kept.get("made_for"), kept.get("record", kept)
  if not isinstance(record, dict) or record.get("config_hash") != digest:
    return None
  return made_for, record


def _kept_record(results_path, runs_dir, digest):
  """The record of run ``digest`` kept for this grid, or None.

  A record is reused only for the results file and runs folder it was made
  for: another grid in the same folder (another ``--results`` or
  ``--runs_dir``) that ran the same cell trains its own. A record kept
  before records named their grid (``<digest>.json``) is reused with a
  warning that says where it came from.
  """
  path = _kept_record_path(results_path, runs_dir, digest)
  if os.path.exists(path):
    kept = _read_kept(path, digest)
    if kept is None or kept[0] != _made_for(results_path, runs_dir):
      return None
    logging.info(
        "run %s: finished before, its record restored from %s (delete it to "
        "run the cell again)",
        digest,
        path,
    )
    return kept[1]
  legacy = os.path.join(_records_dir(results_path), f"{digest}.json")
  kept = _read_kept(legacy, digest) if os.path.exists(legacy) else None
  if kept is None:
    return None
  logging.warning(
      "run %s: NOT RUN; its record (metrics, wall time, predictions) is "
      "copied from %s, kept by an older version that did not note which "
      "results file and runs folder it was made for: it may be another "
      "grid's. Delete that file to run the cell again.",
      digest,
      legacy,
  )
  return kept[1]


def check_results(results_path) -> None:
  """`errors.ConfigError` unless ``results_path``, its predictions and its
  ``failed.json`` read as a grid writes them: a grid calls it before it
  prepares data or starts workers (it would refuse them after that work)."""
  if os.path.isdir(results_path):
    raise errors.ConfigError(
        f"--results={results_path} is a directory; name a file in it "
        "(results.json)."
    )
  load_results(results_path)
  load_failures(results_path)


def failures_path(results_path) -> str:
  """Where the cells of ``results_path``'s grid whose run diverged are kept:
  ``failed.json`` beside ``results.json``, ``<stem>_failed.json`` beside any
  other results file. A folder holds the grids of several devices (a
  cell's hash names no device), and one file for all had a divergence on
  one device skip that cell on the other, and its report list the other's.
  """
  folder, name = os.path.split(results_path)
  stem = os.path.splitext(name)[0]
  return os.path.join(
      folder, "failed.json" if stem == "results" else f"{stem}_failed.json"
  )


def load_failures(results_path) -> dict:
  """``{config hash: {"cell", "error"}}`` of the cells that diverged."""
  path = failures_path(results_path)
  if not os.path.exists(path):
    return {}
  failures = read_json(path)
  if not isinstance(failures, dict):
    raise errors.ConfigError(
        f"{path} holds no {{config hash: failure}} map; restore it or move "
        "it aside."
    )
  return failures


def _record_failure(results_path, digest, cell, error) -> None:
  """Adds a diverged cell to failed.json, under results.json's lock."""
  path = failures_path(results_path)
  with _results_lock(results_path):
    failures = load_failures(results_path)
    failures[digest] = dict(cell=str(cell), error=errors.first_line(error))
    temporary = f"{path}.tmp{os.getpid()}"
    with open(temporary, "w") as f:
      json.dump(failures, f, indent=1, sort_keys=True)
      f.write("\n")
    os.replace(temporary, path)


def note_grid(results_path, report_path) -> None:
  """Appends to a report what its tables cannot show: the cells that
  diverged (`note_failures`) and runs on several versions of one dataset
  (`data_fingerprints.note_versions`)."""
  note_failures(results_path, report_path)
  data_fingerprints.note_versions(load_results(results_path), report_path)


def note_failures(results_path, report_path) -> None:
  """Appends to a report the cells of its grid that diverged, if any.

  Their runs are not in results.json, so the tables would pass them over
  in silence; the report says which, and why.
  """
  recorded = {r.get("config_hash") for r in load_results(results_path)}
  failures = {
      digest: entry
      for digest, entry in load_failures(results_path).items()
      if digest not in recorded
  }
  if not failures:
    return
  lines = [
      "",
      "## Cells that diverged",
      "",
      f"These {len(failures)} cell(s) went non-finite and are in no table "
      f"above (`{os.path.basename(failures_path(results_path))}`):",
      "",
  ]
  lines += [
      f"- {entry['cell']}: {entry['error']}"
      for entry in sorted(failures.values(), key=lambda e: e["cell"])
  ]
  with open(report_path, "a") as f:
    f.write("\n".join(lines) + "\n")


def run_grid(
    todo,
    configure,
    execute,
    describe,
    results_path,
    *,
    max_runs=0,
    after_keep=None,
    runs_dir=None,
    data_dir=None,
    accept_changed_data=False,
):
  """Runs each cell of ``todo`` whose config hash is not yet recorded.

  Several processes may run one grid at once (``--workers``): each takes the
  next cell that is neither recorded nor held by another process. Each
  finished record is also kept under ``runs/.records/`` beside results.json,
  named by its results file and runs folder: a cell whose record is kept
  for this grid but missing from results.json (a crash between the two
  writes, or results.json reverted) is recorded again without being rerun;
  another grid's record of the same cell (another ``--results`` or
  ``--runs_dir``) is never reused.

  A cell whose run diverges (`errors.Diverged`: a non-finite loss, the same
  on every rerun) is listed in ``failed.json`` beside results.json, with
  the error, and the grid goes on; later runs of the grid skip it, with a
  warning, until its entry is deleted. Any other failure stops the grid.

  Args:
    todo: the cells, in run order.
    configure: cell -> config hash.
    execute: (cell, hash) -> the run's record (a dict with 'config_hash').
    describe: record -> one line for the progress log.
    results_path: results.json; every finished record is saved at once.
    max_runs: stop after this many new runs (0: no limit); `spawn_workers`
      shares a command's limit out between its workers.
    after_keep: (cell, hash) -> None, called once the cell's record is kept
      (say, to delete what the run needs no more: before that, a crash
      would leave neither the record nor what it takes to resume).
    runs_dir: the runs' work directories (default: ``runs/`` beside
      results.json).
    data_dir: where the grid's prepared data is: each dataset there must be
      the one the recorded runs read (`data_fingerprints.check_unchanged`),
      unless ``accept_changed_data``.
    accept_changed_data: record new runs beside recorded ones that read
      other data (``--accept_changed_data``).

  Raises:
    ValueError: a negative ``max_runs``.
    errors.ConfigError: results.json or failed.json is not JSON, or a
      record there has no config hash, or the data differs from what the
      recorded runs read.
  """
  if max_runs < 0:
    raise ValueError(f"max_runs must be >= 0 (0: no limit), got {max_runs}.")
  if data_dir is not None:
    data_fingerprints.check_unchanged(
        load_results(results_path), data_dir, accept_changed_data
    )
  if runs_dir is None:
    runs_dir = os.path.join(os.path.dirname(results_path), "runs")
  # Runs of one shape share compiled steps across seeds and restarts (in
  # the cache the caller set, e.g. by JAX_COMPILATION_CACHE_DIR, if any).
  compile_cache.use_persistent_cache(
      os.path.join(os.path.dirname(results_path), ".jax_cache")
  )
  # A claim guards a cell's work directory, which is under runs_dir: the
  # workers of one grid, or two grids sharing a runs folder, take turns on
  # a cell; a grid with runs of its own is never held up by another's.
  claims = os.path.join(runs_dir, ".claims")

  def recorded():
    runs = load_results(results_path)
    for i, run in enumerate(runs):
      if not isinstance(run.get("config_hash"), str):
        raise errors.ConfigError(
            f"record {i} of {results_path} has no config_hash, so the grid "
            "cannot tell which cell it is (a record merged by hand?); give "
            "it the hash of its cell or move it to another file."
        )
    return {run["config_hash"] for run in runs}

  done = recorded()
  digests = [configure(cell) for cell in todo]
  failed = load_failures(results_path)
  diverged = [c for c, d in zip(todo, digests) if d in failed]
  if diverged:
    logging.warning(
        "skipping %d cell(s) that diverged before (%s; delete an entry of "
        "%s to run its cell again): %s",
        len(diverged),
        "non-finite loss",
        failures_path(results_path),
        ", ".join(str(cell) for cell in diverged),
    )
  new, start = 0, time.time()
  pending = [
      c for c, d in zip(todo, digests) if d not in done and d not in failed
  ]
  logging.info("%d of %d runs to do", len(pending), len(todo))
  for index, cell in enumerate(pending):
    if max_runs and new >= max_runs:
      break
    digest = configure(cell)
    with claim(claims, digest) as mine:
      # Another worker has it, has recorded it, or found it diverging.
      if (
          not mine
          or digest in recorded()
          or digest in load_failures(results_path)
      ):
        continue
      record = _kept_record(results_path, runs_dir, digest)
      if record is None:
        try:
          record = execute(cell, digest)
        except errors.Diverged as error:
          _record_failure(results_path, digest, cell, error)
          print(
              f"[{index + 1}/{len(pending)}] {cell}: diverged "
              f"({errors.first_line(error)}); listed in "
              f"{failures_path(results_path)}, the grid goes on",
              flush=True,
          )
          continue
        _keep_record(results_path, runs_dir, record)
      if after_keep is not None:
        after_keep(cell, digest)
      append_result(results_path, record)
    new += 1
    per_run = (time.time() - start) / new
    print(
        f"[{index + 1}/{len(pending)}] {describe(record)} "
        f"({record['wall_seconds']:.0f}s; ETA "
        f"{per_run * (len(pending) - index - 1) / 60:.0f} min)",
        flush=True,
    )
  print(f"{len(load_results(results_path))} runs in {results_path}", flush=True)
  failed = load_failures(results_path)
  if any(d in failed for d in digests):
    print(
        f"{sum(d in failed for d in digests)} cell(s) diverged: "
        f"{failures_path(results_path)}",
        flush=True,
    )
