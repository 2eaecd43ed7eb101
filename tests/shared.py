"""What a module's fixture makes, made once per test session.

Under pytest-xdist every worker that runs a test of a module runs the
module's fixtures again: a reference run of two processes (20 s) was made
twice when the tests that read it went to both workers. :func:`once` makes
such a folder once for the whole session, whichever worker needs it first.
"""

import fcntl
import os
import pathlib
import shutil


def once(tmp_path_factory, name: str, build) -> pathlib.Path:
  """The folder ``name``, filled by ``build(folder)`` once per session.

  The workers' temporary folders share the session's parent folder: the
  first worker to get here builds ``name`` there under an exclusive lock
  (``fcntl``, released if the worker dies), and the others wait for it and
  then use what it built. A build that raised is made again by the next
  caller. Without workers, the session's own temporary folder. Tests must
  only read the folder.
  """
  root = tmp_path_factory.getbasetemp()
  if os.environ.get("PYTEST_XDIST_WORKER"):
    root = root.parent
  folder = root / f"shared-{name}"
  done = root / f"shared-{name}.done"
  with open(root / f"shared-{name}.lock", "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    if not done.exists():
      shutil.rmtree(folder, ignore_errors=True)
      folder.mkdir()
      build(folder)
      done.touch()
  return folder
