"""Signals and background failures, turned into a clean stop of the loop.

SIGTERM/SIGINT set a flag the loop reads, so it checkpoints and stops; inside
a checkpoint save, which it cannot leave, the save may finish first (for up
to `SAVE_GRACE_SECONDS`); after that, or for a second signal,
`errors.Interrupted` is raised.
A checkpoint write that fails in one of orbax's threads (which log the
error and swallow it) stops the run the same way.
"""

import _thread
import contextlib
import logging as pylogging
import os
import signal

from absl import logging
import jax
import jax.numpy as jnp
from jax.experimental import multihost_utils
import numpy as np

from train import errors

# How long a checkpoint save under way may go on after a first SIGTERM or
# SIGINT before the run ends without it (a preemption's notice commonly
# leaves 30 s); a second signal ends it at once.
SAVE_GRACE_SECONDS = 20.0


class StopOnSignal:
  """Turns SIGTERM/SIGINT into a flag, so the loop can checkpoint and stop.

  Where the loop cannot look at the flag, inside a checkpoint save
  (:meth:`grace`), a first signal lets the save finish for up to
  :data:`SAVE_GRACE_SECONDS` and then raises :class:`errors.Interrupted`, so
  a save that hangs still ends the process within that time; a second
  signal raises at once. A checkpoint write that fails in one of orbax's threads is
  reported the same way (:meth:`fail`), as a :class:`errors.TrainingError`:
  orbax itself would wait out a 300 s barrier for the thread that died.
  """

  def __init__(self):
    self.signum = None
    self.failure = None
    self._saving = False
    self._alarm = None  # SIGALRM's handler before this one's, while armed
    self._previous = {}
    for sig in (signal.SIGTERM, signal.SIGINT):
      try:
        self._previous[sig] = signal.signal(sig, self._handle)
      except ValueError:  # not the main thread
        pass

  @property
  def requested(self) -> bool:
    return self.signum is not None

  def fail(self, error: BaseException) -> None:
    """From any thread: stops the run with ``error`` as its reason."""
    if self.failure is None:
      self.failure = error
      if self._previous:
        _thread.interrupt_main(signal.SIGINT)  # wakes a blocked main thread

  def check(self) -> None:
    """Raises the failure reported by :meth:`fail`, if any."""
    if self.failure is not None:
      raise errors.TrainingError(
          "writing a checkpoint failed ("
          f"{type(self.failure).__name__}: {errors.first_line(self.failure)}); "
          "the run stops. Free the checkpoint directory and rerun to resume "
          "from the last checkpoint."
      ) from self.failure

  @contextlib.contextmanager
  def grace(self):
    """Marks a checkpoint save (or its wait) a first signal lets finish.

    The loop cannot look at the flag inside it; the save gets up to
    :data:`SAVE_GRACE_SECONDS` after a first signal, then the run ends. A
    signal received before the save (or its wait) began starts that clock
    here: the loop then waits for a background save it cannot cut short.
    """
    self._saving = True
    if self.requested:
      self._arm()
    try:
      yield
    finally:
      self._saving = False
      self._disarm()

  def _handle(self, signum, frame):
    del frame
    self.check()
    if self.requested:  # a second signal
      self.signum = signum
      raise errors.Interrupted(signum)
    self.signum = signum
    if self._saving:
      logging.warning(
          "signal %d during a checkpoint save: finishing it (at most %g s),"
          " then stopping.",
          signum,
          SAVE_GRACE_SECONDS,
      )
      self._arm()
      return
    logging.warning("signal %d: checkpointing and stopping.", signum)

  def _expired(self, signum, frame):
    del signum, frame
    if self._saving:
      logging.warning(
          "the checkpoint save did not finish in %g s; stopping without it.",
          SAVE_GRACE_SECONDS,
      )
      raise errors.Interrupted(self.signum)

  def _arm(self):
    """Starts the save's :data:`SAVE_GRACE_SECONDS` (once)."""
    if self._alarm is None:
      self._alarm = signal.signal(signal.SIGALRM, self._expired)
      signal.setitimer(signal.ITIMER_REAL, SAVE_GRACE_SECONDS)

  def _disarm(self):
    if self._alarm is not None:
      signal.setitimer(signal.ITIMER_REAL, 0)
      signal.signal(signal.SIGALRM, self._alarm)
      self._alarm = None

  def restore(self):
    self._disarm()
    for sig, handler in self._previous.items():
      signal.signal(sig, handler)


class _BackgroundFailures(pylogging.Handler):
  """Passes errors that orbax's threads log (and swallow) to ``stop.fail``."""

  def __init__(self, stop: StopOnSignal):
    super().__init__(pylogging.ERROR)
    self.stop = stop

  def emit(self, record):
    if not record.exc_info or f"{os.sep}orbax{os.sep}" not in record.pathname:
      return
    error = record.exc_info[1]
    # A second signal raised inside orbax's wait (which logs it on its way
    # out) is the stop itself, not a failed write.
    if not isinstance(error, (errors.Interrupted, KeyboardInterrupt)):
      self.stop.fail(error)


@contextlib.contextmanager
def watch_background_failures(stop: StopOnSignal):
  handler = _BackgroundFailures(stop)
  pylogging.getLogger().addHandler(handler)
  try:
    yield
  finally:
    pylogging.getLogger().removeHandler(handler)


def agreed_signal(signum: int | None) -> int | None:
  """The signal that any process has seen (the largest number), or None.

  On several processes this is a collective, called by all at the same
  point, that waits for every step already dispatched; the loop uses
  :class:`StopAgreement` instead, which does not wait.
  """
  if jax.process_count() == 1:
    return signum
  seen = multihost_utils.process_allgather(np.asarray(signum or 0, np.int32))
  return int(np.max(seen)) or None


class StopAgreement:
  """Agrees on a stop across processes, one step late, without a host sync.

  A stop seen by one host alone (a signal it got first, or alone) would
  leave the others in the next step's collectives, and the run would hang
  until the scheduler killed it, its last save lost; so every process
  stops at the same step. An all-gather of the signal at each step would
  make the host wait for the step just dispatched, and so lose the overlap
  of one step's dispatch with the previous step's work. Instead, each
  :meth:`poll` dispatches the max over processes of the signal seen here
  (on the devices, queued before the step) and reads the one dispatched at
  the previous poll, long since done: every process reads the same value at
  the same step, and stops there.

  On one process :meth:`poll` is the signal itself, with no device work.
  """

  def __init__(self, to_global, rows: int, *, pipelined: bool | None = None):
    """``to_global`` makes a global batch-sharded array of ``rows`` rows."""
    if pipelined is None:
      pipelined = jax.process_count() > 1
    self._to_global = to_global if pipelined else None
    self._rows = rows
    self._pending = None
    self._max = jax.jit(jnp.max)
    self.agreed = None  # the signal every process stops for, once agreed

  def poll(self, signum: int | None) -> int | None:
    """The signal any process had seen at the previous poll, or None."""
    if self.agreed is not None:
      return self.agreed
    if self._to_global is None:
      self.agreed = signum
      return signum
    agreed = None if self._pending is None else int(self._pending) or None
    if agreed is None:  # else every process stops here: nothing to start
      local = np.full(self._rows, signum or 0, np.int32)
      self._pending = self._max(self._to_global(local))
    self.agreed = agreed
    return agreed
