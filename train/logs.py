"""What reaches the terminal, and the full log in the workdir.

The terminal shows this project's own INFO lines (progress, results, where
the files are) and every library's warnings and errors. Library INFO lines
(orbax writes dozens per checkpoint; jax, grain and TFDS add more) go only
to ``train.log`` in the workdir, next to the metrics, for when something
needs explaining.
"""

import contextlib
import logging as pylogging
import os
import sys
import threading
import traceback

from absl import logging

# Where this project's code lives: records logged from here are ours.
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_OWN_PACKAGES = tuple(
    os.path.join(_ROOT, name) + os.sep
    for name in ("train", "configs", "experiments", "ntil_jax")
)
# Library warnings that say nothing a user can act on.
_BENIGN_WARNINGS = (
    "Using custom data configuration",  # TFDS: our builders' configs
    "has no dataset_info.json",  # TFDS: a dataset being generated
)
LOG_FILE = "train.log"
_FILE_ONLY = "ntil_file_only"


def file_only(message: str, *args) -> None:
  """Logs an INFO line that goes to train.log but not to the terminal."""
  logging.info(message, *args, extra={_FILE_ONLY: True})


def is_own(record: pylogging.LogRecord) -> bool:
  """Whether ``record`` was logged by this project's code."""
  return os.path.abspath(record.pathname).startswith(_OWN_PACKAGES)


class TerminalFilter(pylogging.Filter):
  """Lets through our own records and library warnings that matter."""

  def filter(self, record):
    if getattr(record, _FILE_ONLY, False):
      return False
    if is_own(record):
      return True
    if record.levelno < pylogging.WARNING:  # library INFO and DEBUG
      return False
    if record.name == "asyncio" and record.exc_info:
      # "Task exception was never retrieved": a read that a failed checkpoint
      # restore left behind; the trainer logs the restore's one warning.
      return False
    if record.exc_info and f"{os.sep}orbax{os.sep}" in record.pathname:
      # A traceback from one of orbax's threads: the trainer reports it as
      # one error line (train.signals.StopOnSignal.fail); the traceback is in
      # train.log.
      return False
    message = record.getMessage()
    return not any(text in message for text in _BENIGN_WARNINGS)


def quiet_terminal() -> None:
  """Keeps library INFO lines and TFDS progress bars off the terminal.

  The filter goes on the handler absl prints with (its ``python_handler``:
  ``ABSLHandler.handle`` skips its own filters), so it sees the records of
  absl's logger and of the libraries' Python loggers alike. Idempotent.
  """
  handler = logging.get_absl_handler().python_handler
  if not any(isinstance(f, TerminalFilter) for f in handler.filters):
    handler.addFilter(TerminalFilter())
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top

  tfds.disable_progress_bar()


@contextlib.contextmanager
def log_file(directory: str, process_index: int = 0):
  """Copies every record of INFO and above to ``directory/train.log``.

  With several processes, process i > 0 writes ``train.<i>.log``.
  """
  name = LOG_FILE if process_index == 0 else f"train.{process_index}.log"
  os.makedirs(directory, exist_ok=True)
  handler = pylogging.FileHandler(os.path.join(directory, name))
  handler.setLevel(pylogging.INFO)
  handler.setFormatter(logging.PythonFormatter())
  root = pylogging.getLogger()
  root.addHandler(handler)
  try:
    yield handler
  finally:
    root.removeHandler(handler)
    handler.close()


def quiet_thread_errors() -> None:
  """Reports a background thread's exception in one line (traceback: train.log).

  Orbax writes checkpoints from its own threads; when a save fails (the
  disk gone), the thread's exception reaches the trainer, which reports it
  in its one ``error:`` line, and Python's default hook would also print
  the thread's traceback on the terminal.
  """

  def hook(args):
    name = args.thread.name if args.thread is not None else "?"
    logging.warning(
        "background thread %s failed: %s: %s",
        name,
        args.exc_type.__name__,
        str(args.exc_value).splitlines()[0] if str(args.exc_value) else "",
    )
    file_only(
        "%s",
        "".join(
            traceback.format_exception(
                args.exc_type, args.exc_value, args.exc_traceback
            )
        ),
    )

  threading.excepthook = hook


def _is_closed_loop_error(exc_type, value, tb) -> bool:
  """A callback of tensorstore hitting the closed event loop of a restore."""
  if exc_type is not RuntimeError or str(value) != "Event loop is closed":
    return False
  while tb is not None and tb.tb_next is not None:
    tb = tb.tb_next
  return tb is None or "asyncio" in tb.tb_frame.f_code.co_filename


@contextlib.contextmanager
def drop_closed_loop_errors():
  """Drops the "Event loop is closed" tracebacks of a failed restore.

  When orbax gives up on a corrupt checkpoint it closes its event loop while
  tensorstore still has reads in flight; each of them then reports, as an
  unraisable exception, a RuntimeError that says nothing about the
  checkpoint (about a hundred per restore). The one warning line that
  matters is logged by the trainer; these are only counted, in train.log.
  """
  previous = sys.unraisablehook
  dropped = [0]

  def hook(unraisable):
    if _is_closed_loop_error(
        unraisable.exc_type, unraisable.exc_value, unraisable.exc_traceback
    ):
      dropped[0] += 1
      return
    previous(unraisable)

  sys.unraisablehook = hook
  try:
    yield
  finally:
    if sys.unraisablehook is hook:
      sys.unraisablehook = previous
    if dropped[0]:
      file_only(
          "dropped %d 'Event loop is closed' tracebacks of tensorstore "
          "after a failed checkpoint restore.",
          dropped[0],
      )
