"""A run's directory: its lock, config record, metrics and predictions.

Checkpoints live under ``workdir/checkpoints`` (`train.checkpoints`), the
log under ``workdir/train.log`` (`train.logs`), the resolved config under
``workdir/config.json`` (`write_config_record`). Starting over moves a run
aside under ``workdir/previous-runs/<date>`` (`move_run_aside`).
"""

import errno
import fcntl
import json
import math
import os
import re
import shutil
import time

from absl import logging
import jax

from train import errors


def probe_writable(directory: str) -> None:
  """Writes and removes a file in ``directory``; OSError if it cannot.

  A byte is written, not just a file made: a full disk still makes empty
  files.
  """
  probe = os.path.join(directory, f".write-probe-{os.getpid()}")
  fd = os.open(probe, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
  try:
    os.write(fd, b"\n")
    os.fsync(fd)
  finally:
    os.close(fd)
    os.remove(probe)


class WorkdirLock:
  """An exclusive lock on a workdir, so that two runs never share one.

  ``flock`` on ``workdir/.lock``: the kernel releases it when the holding
  process exits, however it exits, so a lock left by a dead run is never
  stale. The file holds the holder's pid, for the error message.
  """

  def __init__(self, workdir: str):
    self.path = os.path.join(workdir, ".lock")
    self.fd = None

  def __enter__(self):
    fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as error:
      holder = os.read(fd, 32).decode(errors="replace").strip() or "unknown"
      os.close(fd)
      if error.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
        raise
      raise errors.ConfigError(
          f"workdir {os.path.dirname(self.path)} is in use by another run "
          f"(pid {holder}); wait for it to end or use another "
          "--workdir."
      ) from None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    self.fd = fd
    return self

  def __exit__(self, *exc):
    if self.fd is not None:
      os.close(self.fd)  # releases the lock
      self.fd = None


class MetricsWriter:
  """metrics.jsonl (one JSON object per line) and TensorBoard, on host 0.

  Each record is one line appended to a file opened for appending (written
  again from where a partial write stopped), so only a crash mid-line can
  leave half of it; a torn last line (a crash, an older writer, a full
  disk) is dropped with a warning when the run resumes.
  """

  def __init__(self, workdir, resume_step):
    self.enabled = jax.process_index() == 0
    self.path = os.path.join(workdir, "metrics.jsonl")
    self.tensorboard = None
    if not self.enabled:
      return
    os.makedirs(workdir, exist_ok=True)
    # Records past the restored step were made by a run that then stopped
    # before checkpointing them; they are replayed now, so drop them.
    kept = [
        json.dumps(record) + "\n"
        for record in read_metrics(self.path)
        if record["step"] <= resume_step
    ]
    with open(self.path + ".tmp", "w") as f:
      f.writelines(kept)
    os.replace(self.path + ".tmp", self.path)
    from tensorboardX import SummaryWriter  # pylint: disable=g-import-not-at-top

    self.tensorboard = SummaryWriter(
        os.path.join(workdir, "tensorboard"), purge_step=resume_step + 1
    )

  def write(self, step, **values):
    """Appends one record; a NaN or inf value is written as null."""
    if not self.enabled:
      return
    values = {k: _finite_or_none(k, v, step) for k, v in values.items()}
    line = json.dumps(dict(step=int(step), **values), allow_nan=False) + "\n"
    data = line.encode()
    fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
      while data:  # a write may take part of it (a full disk: then it raises)
        data = data[os.write(fd, data) :]
    finally:
      os.close(fd)
    for name, value in values.items():
      if isinstance(value, (int, float)):
        self.tensorboard.add_scalar(name, value, step)
    self.tensorboard.flush()

  def close(self):
    if self.tensorboard is not None:
      self.tensorboard.close()


def _finite_or_none(name, value, step):
  """``value``, or None (JSON null) with a warning if it is NaN or inf."""
  if isinstance(value, float) and not math.isfinite(value):
    logging.warning(
        "metric %s is %s at step %d; written as null.", name, value, step
    )
    return None
  return value


def read_metrics(path) -> list[dict]:
  """The records of a metrics.jsonl; a torn line is dropped with a warning."""
  if not os.path.exists(path):
    return []
  records = []
  with open(path) as f:
    for number, line in enumerate(f, 1):
      try:
        records.append(json.loads(line))
      except json.JSONDecodeError:
        logging.warning(
            "%s: dropping torn line %d (%r).", path, number, line[:60]
        )
  return records


def keep_metrics_aside(workdir, step) -> str | None:
  """Copies ``metrics.jsonl`` beside checkpoint ``corrupt-<step>``.

  When checkpoints are rejected as damaged the run resumes from an older
  one (or from step 0) and `MetricsWriter` drops the records past it; the
  copy, ``checkpoints/metrics.jsonl.corrupt-<step>`` (``-2``, ... if taken),
  keeps the history that led to the damaged checkpoints. Process 0 only.

  Returns:
    The copy's path; None if there was nothing to copy (or not process 0).
  """
  source = os.path.join(workdir, "metrics.jsonl")
  if jax.process_index() != 0 or not os.path.exists(source):
    return None
  target = free_path(
      os.path.join(workdir, "checkpoints", f"metrics.jsonl.corrupt-{step}")
  )
  shutil.copyfile(source, target)
  return target


def free_path(path: str) -> str:
  """``path`` if nothing is there, else the first free ``path-2``,
  ``path-3``, ..."""
  target, suffix = path, 1
  while os.path.exists(target):
    suffix += 1
    target = f"{path}-{suffix}"
  return target


def write_predictions(workdir, step, predictions):
  """predictions.jsonl: (test index, answer, prediction) of the final eval.

  With several hosts it holds process 0's share of the test split.
  """
  path = os.path.join(workdir, "predictions.jsonl")
  with open(path + ".tmp", "w") as f:
    for index, answer, prediction in predictions:
      record = dict(
          step=step, index=int(index), answer=answer, prediction=prediction
      )
      f.write(json.dumps(record) + "\n")
  os.replace(path + ".tmp", path)


def has_predictions(workdir) -> bool:
  """Whether the final eval's predictions.jsonl is written."""
  return os.path.exists(os.path.join(workdir, "predictions.jsonl"))


def read_predictions(workdir) -> list[str]:
  """The final eval's predictions (predictions.jsonl), in test order."""
  with open(os.path.join(workdir, "predictions.jsonl")) as f:
    records = sorted((json.loads(line) for line in f), key=lambda r: r["index"])
  return [r["prediction"] for r in records]


CONFIG_RECORD = "config.json"
# Beside the config in CONFIG_RECORD: the pretrained snapshot's digest.
SNAPSHOT_SHA256 = "snapshot_sha256"
PREVIOUS_RUNS = "previous-runs"
_STEP_DIR = re.compile(r"^\d+$")


def config_record(config) -> dict:
  """The resolved config as JSON values (tuples become lists)."""
  return json.loads(json.dumps(config.to_dict(), sort_keys=True, default=str))


def read_record(workdir) -> dict | None:
  """``workdir/config.json`` as written by `write_config_record`; None if
  there is none.

  Raises:
    errors.ConfigError: the record exists but is not a JSON object holding
      a config.
  """
  path = os.path.join(workdir, CONFIG_RECORD)
  if not os.path.exists(path):
    return None
  try:
    with open(path) as f:
      record = json.load(f)
  except (OSError, json.JSONDecodeError) as error:
    raise errors.ConfigError(
        f"{path} is unreadable ({error}); restore it, or pass --start_over "
        "to move the old run aside and start afresh."
    ) from error
  if not isinstance(record, dict) or not isinstance(record.get("config"), dict):
    raise errors.ConfigError(
        f"{path} holds no config record; restore it, or pass --start_over "
        "to move the old run aside and start afresh."
    )
  return record


def read_config_record(workdir) -> dict | None:
  """The config recorded by the run in ``workdir``; None if there is none.

  Raises:
    errors.ConfigError: the record exists but is not a JSON object.
  """
  record = read_record(workdir)
  return None if record is None else record["config"]


def write_config_record(workdir, config, snapshot_sha256=None) -> None:
  """Writes ``workdir/config.json`` atomically (process 0 only).

  ``snapshot_sha256``: the pretrained snapshot's
  `snapshots.contents_sha256`, recorded beside the config.
  """
  if jax.process_index() != 0:
    return
  record = dict(config=config_record(config))
  if snapshot_sha256 is not None:
    record[SNAPSHOT_SHA256] = snapshot_sha256
  path = os.path.join(workdir, CONFIG_RECORD)
  with open(path + ".tmp", "w") as f:
    json.dump(record, f, indent=1, sort_keys=True)
    f.write("\n")
  os.replace(path + ".tmp", path)


def saved_steps(workdir) -> list[int]:
  """The steps of the checkpoints in ``workdir`` (moved-aside ones excluded)."""
  directory = os.path.join(workdir, "checkpoints")
  if not os.path.isdir(directory):
    return []
  return sorted(int(n) for n in os.listdir(directory) if _STEP_DIR.match(n))


# What a run writes in its workdir (and their temporary copies): what
# `move_run_aside` moves. Anything else there (data, notes) is the user's.
_RUN_FILES = re.compile(
    r"^(checkpoints|tensorboard|metrics\.jsonl|predictions\.jsonl"
    r"|config\.json|train(\.\d+)?\.log)(\.tmp)?$"
)


def move_run_aside(workdir) -> str | None:
  """Moves the run in ``workdir`` to a dated folder.

  Its checkpoints, metrics, predictions, config record, logs and
  TensorBoard files go to ``workdir/previous-runs/<YYYYmmdd-HHMMSS>``;
  nothing is deleted, and what else the workdir holds (the data, say)
  stays. Returns that folder, or None if the workdir held nothing to move.
  """
  names = sorted(n for n in os.listdir(workdir) if _RUN_FILES.match(n))
  if not names or jax.process_index() != 0:
    return None
  target = free_path(
      os.path.join(workdir, PREVIOUS_RUNS, time.strftime("%Y%m%d-%H%M%S"))
  )
  os.makedirs(target)
  for name in names:
    os.replace(os.path.join(workdir, name), os.path.join(target, name))
  return target
