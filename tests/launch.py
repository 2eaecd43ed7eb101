"""The tests' Python subprocesses, forked from an interpreter that has
imported the heavy libraries once.

Many tests run the project's command lines as ``python -m module`` or a
script as ``python -c code``, and a new interpreter spends 3-6 s of CPU
importing JAX, Flax, orbax, grain, TFDS, matplotlib and SciPy (measured on
the 2-core CPU) before it does the work the test is about. :func:`run`
starts such a command instead in a child forked from a fork server
(``multiprocessing``'s ``forkserver``) that imported those libraries and
nothing of this project. Imports set no JAX backend up, so the child starts
as a fresh interpreter would after those imports: it reads its
``XLA_FLAGS`` (a device count, an optimisation level) when its first
computation makes the backend, runs ``-m`` modules through ``runpy`` as
``python -m`` does (``__main__``, ``sys.argv``, ``sys.path[0]`` the working
folder), waits for its threads and runs its ``atexit`` handlers at the end,
and its exit status, stdout and stderr (file descriptors 1 and 2, where XLA
writes too) come back as from :func:`subprocess.run`.

The settings that the interpreter and the libraries read when imported are
the server's. A ``JAX_`` variable that names a JAX option
(``JAX_NUM_CPU_DEVICES``, ``JAX_PLATFORMS``) is set in the child through
``jax.config`` before anything runs. A command whose environment changes
any other ``JAX_``, ``TF_``, ``PYTHON``, ``MPL``, ``OMP_`` or ``OPENBLAS_``
variable from the server's (``PYTHONHASHSEED``), or any command of another
form, runs in a real subprocess (:func:`subprocess.run`), as every command
does when ``NTIL_TESTS_NO_FORK`` is set. One difference stays: a submodule
of a preloaded library (``matplotlib.pyplot``) is already imported in a
forked child, so a command that uses one without importing it passes here
and fails in a new interpreter; the demo's test runs in a new one, and
``NTIL_TESTS_NO_FORK=1`` runs them all so. With ``NTIL_TESTS_LAUNCH_LOG=FILE``
each Python command appends a line to FILE with the variables that kept it
from being forked (none for a forked one).
"""

import atexit
import json
import multiprocessing
import os
import runpy
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import types

# What the server imports: the project's slow imports, none of its modules
# (a module run as ``-m`` must not be imported before it runs).
PRELOAD = (
    "numpy",
    "scipy.stats",
    "jax",
    "jax.numpy",
    "chex",
    "optax",
    "flax.nnx",
    "orbax.checkpoint",
    "grain",
    "tensorflow_datasets",
    "matplotlib",
    "matplotlib.pyplot",
    "absl.app",
    "absl.flags",
    "absl.logging",
)
# Environment variables the interpreter or the libraries read at import.
_READ_AT_IMPORT = ("JAX_", "TF_", "PYTHON", "MPL", "OMP_", "OPENBLAS_")

_SERVER = {}


def _dump_environ(path):
  with open(path, "w") as f:
    json.dump(dict(os.environ), f)


def _context():
  """The fork server's context and environment, made on first use.

  The environment is the server's after its imports (a library may set a
  variable there, as TFDS sets ``TF_CPP_MIN_LOG_LEVEL``), read back from a
  first child.
  """
  if "context" not in _SERVER:
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(list(PRELOAD))
    with tempfile.TemporaryDirectory(prefix="ntil-jax-launch-") as folder:
      path = os.path.join(folder, "environ.json")
      probe = context.Process(target=_dump_environ, args=(path,))
      probe.start()
      probe.join()
      with open(path) as f:
        _SERVER["environ"] = json.load(f)
    _SERVER["context"] = context
  return _SERVER["context"]


def _changed_settings(env) -> set:
  """Variables read at import whose value ``env`` changes."""
  server = _SERVER["environ"]
  keys = set(env) | set(server)
  return {
      k
      for k in keys
      if k.startswith(_READ_AT_IMPORT) and env.get(k) != server.get(k)
  }


def _jax_option(key):
  """The ``jax.config`` option a ``JAX_`` variable sets, or None."""
  import jax  # pylint: disable=g-import-not-at-top

  name = key.lower()
  return name if key.startswith("JAX_") and name in jax.config.values else None


def _forkable(args, env) -> bool:
  """Whether ``args`` can run forked; logged with NTIL_TESTS_LAUNCH_LOG."""
  if env.get("NTIL_TESTS_NO_FORK"):
    return False
  if len(args) < 3 or args[0] != sys.executable or args[1] not in ("-m", "-c"):
    return False
  _context()
  changed = _changed_settings(env)
  refused = sorted(k for k in changed if not (_jax_option(k) and k in env))
  log = os.environ.get("NTIL_TESTS_LAUNCH_LOG")
  if log:
    with open(log, "a") as f:
      f.write(json.dumps(dict(args=args[1:3], refused=refused)) + "\n")
  return not refused


def _set_jax_options(keys, env):
  """``jax.config`` as a fresh interpreter with ``env`` would read it."""
  import jax  # pylint: disable=g-import-not-at-top

  for key in keys:
    name, value = _jax_option(key), env[key]
    current = jax.config.values[name]
    if isinstance(current, bool):
      value = value.lower() in ("1", "true", "t", "yes", "y", "on")
    elif isinstance(current, int):
      value = int(value)
    jax.config.update(name, value)


def _redirect(fd, target):
  """File descriptor ``fd`` onto a file path or a socket."""
  if isinstance(target, socket.socket):
    os.dup2(target.fileno(), fd)
    target.close()
    return
  opened = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
  os.dup2(opened, fd)
  os.close(opened)


def _child(args, cwd, env, jax_keys, out, err):
  """Runs ``python args`` in this forked child; exits with its status.

  ``out`` and ``err`` (file paths or sockets) become its stdout and stderr.
  """
  sys.stdout.flush()
  sys.stderr.flush()
  _redirect(1, out)
  _redirect(2, err)
  os.environ.clear()
  os.environ.update(env)
  _set_jax_options(jax_keys, env)
  if cwd is not None:
    os.chdir(cwd)
  sys.path.insert(0, os.getcwd())
  status = 0
  try:
    if args[0] == "-m":
      sys.argv = [args[1], *args[2:]]
      runpy.run_module(args[1], run_name="__main__", alter_sys=True)
    else:
      sys.argv = ["-c", *args[2:]]
      main = types.ModuleType("__main__")
      sys.modules["__main__"] = main
      exec(compile(args[1], "<string>", "exec"), main.__dict__)  # pylint: disable=exec-used
  except SystemExit as e:
    status = e.code
  except BaseException:  # pylint: disable=broad-except
    traceback.print_exc()
    status = 1
  finally:
    # As an interpreter ends: wait for its threads, then atexit.
    threading._shutdown()  # pylint: disable=protected-access
    atexit._run_exitfuncs()  # pylint: disable=protected-access
    sys.stdout.flush()
    sys.stderr.flush()
  sys.exit(status)


def _start(args, cwd, env, out, err):
  process = _context().Process(
      target=_child,
      args=(
          args[1:],
          None if cwd is None else str(cwd),
          env,
          sorted(_changed_settings(env)),
          out,
          err,
      ),
  )
  process.start()
  return process


def run(
    args,
    *,
    cwd=None,
    env=None,
    timeout=None,
    capture_output=False,
    text=False,
    check=False,
    fork=True,
):
  """:func:`subprocess.run` of ``args``, forked from the warm server.

  Takes the arguments the tests use; see the module's docstring for what
  runs in a real subprocess instead. ``fork=False`` always does: for a
  test of what a fresh interpreter prints while it imports.
  """
  args = [str(a) for a in args]
  env = dict(os.environ if env is None else env)
  if not (fork and _forkable(args, env)):
    return subprocess.run(
        args,
        cwd=cwd,
        env=env,
        timeout=timeout,
        capture_output=capture_output,
        text=text,
        check=check,
    )
  with tempfile.TemporaryDirectory(prefix="ntil-jax-launch-") as folder:
    out_path = os.path.join(folder, "stdout")
    err_path = os.path.join(folder, "stderr")
    if not capture_output:
      out_path = err_path = os.devnull
    process = _start(args, cwd, env, out_path, err_path)
    process.join(timeout)
    if process.exitcode is None:
      process.kill()
      process.join()
      raise subprocess.TimeoutExpired(args, timeout)
    stdout = stderr = None
    if capture_output:
      with open(out_path, "rb") as f:
        stdout = f.read()
      with open(err_path, "rb") as f:
        stderr = f.read()
      if text:
        stdout = stdout.decode(errors="replace")
        stderr = stderr.decode(errors="replace")
  result = subprocess.CompletedProcess(
      args, process.exitcode, stdout=stdout, stderr=stderr
  )
  if check:
    result.check_returncode()
  return result


class Forked:
  """The part of :class:`subprocess.Popen` the tests use, for a forked child.

  Its pipes are sockets; ``returncode`` is ``-signal`` for a child a signal
  ended, as :class:`subprocess.Popen` gives.
  """

  def __init__(self, args, process, stdout, stderr):
    self.args = args
    self.pid = process.pid
    self.returncode = None
    self.stdout = stdout
    self.stderr = stderr
    self._process = process
    self._readers = {}
    self._read = {}

  def poll(self):
    if self.returncode is None:
      self.returncode = self._process.exitcode
    return self.returncode

  def wait(self, timeout=None):
    self._process.join(timeout)
    if self.poll() is None:
      raise subprocess.TimeoutExpired(self.args, timeout)
    return self.returncode

  def send_signal(self, sig):
    if self.poll() is None:
      os.kill(self.pid, sig)

  def terminate(self):
    self.send_signal(signal.SIGTERM)

  def kill(self):
    self.send_signal(signal.SIGKILL)

  def communicate(self, timeout=None):
    """Reads both pipes to their end and waits, as Popen.communicate."""
    deadline = None if timeout is None else time.monotonic() + timeout
    for name in ("stdout", "stderr"):
      stream = getattr(self, name)
      if stream is not None and name not in self._readers:
        reader = threading.Thread(
            target=lambda n=name, s=stream: self._read.__setitem__(n, s.read()),
            daemon=True,
        )
        reader.start()
        self._readers[name] = reader
    for reader in self._readers.values():
      reader.join(None if deadline is None else deadline - time.monotonic())
      if reader.is_alive():
        raise subprocess.TimeoutExpired(self.args, timeout)
    self.wait(None if deadline is None else max(0, deadline - time.monotonic()))
    return self._read.get("stdout"), self._read.get("stderr")


def popen(args, *, cwd=None, env=None, stdout=None, stderr=None, text=False):
  """:class:`subprocess.Popen` of ``args``, forked from the warm server.

  ``stdout`` and ``stderr`` are ``subprocess.PIPE`` or None (discarded for
  a forked child). Commands :func:`run` would not fork, or other streams,
  get a real :class:`subprocess.Popen`.
  """
  args = [str(a) for a in args]
  env = dict(os.environ if env is None else env)
  if not _forkable(args, env) or {stdout, stderr} - {None, subprocess.PIPE}:
    return subprocess.Popen(
        args, cwd=cwd, env=env, stdout=stdout, stderr=stderr, text=text
    )
  ends, pipes = [], []
  for wanted in (stdout, stderr):
    if wanted == subprocess.PIPE:
      ours, theirs = socket.socketpair()
      ends.append(theirs)
      pipes.append(ours.makefile("r" if text else "rb"))
      ours.close()  # the file object keeps it open
    else:
      ends.append(os.devnull)
      pipes.append(None)
  process = _start(args, cwd, env, *ends)
  for end in ends:
    if isinstance(end, socket.socket):
      end.close()
  return Forked(args, process, *pipes)
