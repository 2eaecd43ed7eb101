"""Where the command lines keep compiled programs between runs and restarts.

JAX's persistent compilation cache stores every program that took a second
or more to compile (JAX's threshold, ``jax_persistent_cache_min_compile_time_secs``),
keyed by the program, the backend and XLA's flags, and loads it instead
of compiling it again. A run resumed after a crash or a preemption then
loads its train and eval steps (NTIL's number logic makes a train step's
compile several times CE's, docs/performance.md); so does a new run of the
same shapes that shares the folder. A loaded program is the compiled one:
nothing the run computes changes.
"""

import os

from absl import logging
import jax

# The folder in a workdir (train.main, train.demo): `rundir.move_run_aside`
# leaves it in place, so a run started over in the same workdir reuses it.
WORKDIR_FOLDER = "compilation_cache"


def use_persistent_cache(default_dir, requested=None):
  """Turns on JAX's persistent compilation cache; returns its folder.

  Args:
    default_dir: the folder to use when neither ``requested`` nor the
      caller's JAX settings (``JAX_COMPILATION_CACHE_DIR``,
      ``jax.config.jax_compilation_cache_dir``) name one.
    requested: a folder asked for on the command line (the cache is then
      on); ``""`` turns the cache off; ``None`` leaves the choice to the
      caller's settings (a cache they turned off stays off), then
      ``default_dir``.

  Returns:
    The cache's folder, or None when it is off.
  """
  if requested == "":  # pylint: disable=g-explicit-bool-comparison
    jax.config.update("jax_enable_compilation_cache", False)
    return None
  if requested:
    jax.config.update("jax_enable_compilation_cache", True)
  elif not jax.config.jax_enable_compilation_cache:
    return None
  folder = os.path.expanduser(
      requested or jax.config.jax_compilation_cache_dir or default_dir
  )
  jax.config.update("jax_compilation_cache_dir", folder)
  logging.info("compiled programs are kept in %s", folder)
  return folder
