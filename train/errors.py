"""How a run fails: the trainer's exceptions and the CLI's exit statuses.

Exit status 2 for a bad config, 1 for a run that failed, 128 + N for signal
N (130 for Ctrl-C, 143 for SIGTERM), as shells report them.
"""

import contextlib
import errno
import os
import sys

# What a disk that takes no more says: full, over quota, read-only.
_DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)


class ConfigError(ValueError):
  """A bad config, workdir or data directory; the message says what to do."""


class TrainingError(RuntimeError):
  """A run that cannot go on (non-finite loss, failed checkpoint save)."""


class Diverged(TrainingError):
  """A non-finite loss or gradient norm: the run's config diverges."""


class Interrupted(Exception):  # pylint: disable=g-bad-exception-name
  """SIGTERM/SIGINT while the loop could not stop cleanly (or a second one)."""

  def __init__(self, signum):
    super().__init__(f"stopped by signal {signum}")
    self.signum = signum


def first_line(error, limit=200) -> str:
  """The gist of an error: its first line, without tensorstore's specs."""
  text = str(error).strip()
  text = text.splitlines()[0] if text else ""
  for tail in (" [tensorstore_spec", " See full TensorStore details"):
    text = text.split(tail)[0]
  return text if len(text) <= limit else text[: limit - 3] + "..."


def disk_error(error: BaseException) -> OSError | None:
  """The OSError of a full or read-only disk in ``error``'s chain, or None.

  A write that fails in the loop often fails again in its clean-up, which
  then raises: the first such error is found through the chain.
  """
  seen = set()
  while error is not None and id(error) not in seen:
    seen.add(id(error))
    if isinstance(error, OSError) and error.errno in _DISK_ERRNOS:
      return error
    error = error.__cause__ or error.__context__
  return None


@contextlib.contextmanager
def exit_on_error():
  """For command-line entry points: a known failure is one ``error:`` line.

  So is a disk that fills up (or turns read-only) under the run: whatever
  was writing, the checkpoints written so far are whole, and the run
  resumes from the last one.
  """
  try:
    yield
  except ConfigError as error:
    print(f"error: {error}", file=sys.stderr)
    sys.exit(2)
  except TrainingError as error:
    _exit_now(f"error: {error}", 1)
  except Interrupted as error:
    _exit_now(
        f"error: {error} before the run could checkpoint; rerun to "
        "resume from the last checkpoint.",
        128 + error.signum,
    )
  except Exception as error:  # pylint: disable=broad-exception-caught
    disk = disk_error(error)
    if disk is None:
      raise
    what = f"writing {disk.filename}" if disk.filename else "a write"
    _exit_now(
        f"error: {what} failed ({disk.strerror or disk}); free "
        "space (or make it writable) and rerun the same command to resume "
        "from the last checkpoint.",
        1,
    )


def _exit_now(message, code):
  """Exits without waiting for threads: a failed save may hold some."""
  print(message, file=sys.stderr)
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(code)  # pylint: disable=protected-access


def exit_if_stopped(result) -> None:
  """Exits with 128 + N if signal N stopped the run (after checkpointing)."""
  if result["stopped_early"]:
    print(
        f"stopped by signal {result['signal']} at step {result['step']}; "
        "rerun the same command to resume.",
        file=sys.stderr,
    )
    sys.exit(128 + result["signal"])
