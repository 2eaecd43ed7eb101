"""Checkpoints: the model, optimizer and data iterator saved together.

Each checkpoint proves its content twice: beside the state and the data
iterator's position orbax writes a digest of both (`digests`), in the same
atomic save, and a restore recomputes it; once the save has completed, a
SHA-256 of every file it wrote goes into ``<step>/files.sha256``
(`seal_finished`), checked before a restore reads anything. orbax saves
asynchronously; a save that cannot be written stops the run at once
(`save_checkpoint`).
`restore_latest` tells a checkpoint saved for another model or optimizer
(refused: `errors.ConfigError`, nothing touched) from a damaged one (an
unreadable file, a digest that does not match, NaN or inf: moved aside with
one warning, and the previous one tried) from a restore that failed for the
machine's sake, or on files that ``files.sha256`` vouches for (the run
stops, nothing moved: `errors.TrainingError`). On several processes every
read of a checkpoint ends alike on every host (`_on_every_process`).
"""

import errno
import hashlib
import json
import os
import re
import shutil

from absl import logging
from flax import nnx
import grain
import jax
import jax.numpy as jnp
from jax.experimental import multihost_utils
import numpy as np
import orbax.checkpoint as ocp

from train import digests
from train import errors
from train import rundir


def checkpoint_manager(workdir, config) -> ocp.CheckpointManager:
  return ocp.CheckpointManager(
      os.path.join(os.path.abspath(workdir), "checkpoints"),
      item_handlers=dict(
          state=ocp.StandardCheckpointHandler(),
          train_iter=grain.checkpoint.CheckpointHandler(),
          digest=ocp.JsonCheckpointHandler(),
      ),
      options=ocp.CheckpointManagerOptions(
          max_to_keep=config.keep_checkpoints,
          create=True,
          enable_async_checkpointing=True,
      ),
  )


def save_checkpoint(manager, step, model, optimizer, train_iter, *, wait=False):
  """Starts an async save of step ``step``; TrainingError if it cannot.

  The digest of the state and of the iterator's position is computed from
  what is being saved and written in the same save, so a checkpoint and its
  digest are committed (or lost) together.

  A directory that cannot be written makes orbax wait out a 300 s barrier
  in a background thread, so a probe write goes first: a failed save stops
  the run at once with the reason.
  """
  directory = str(manager.directory)
  try:
    manager.wait_until_finished()  # orbax would wait for it anyway
    seal_finished(manager)
    if jax.process_index() == 0:
      rundir.probe_writable(directory)
    state = nnx.to_pure_dict(nnx.state((model, optimizer)))
    digest = dict(
        state=digests.tree_digest(state),
        train_iter=digests.iterator_digests(train_iter),
    )
    manager.save(
        step,
        args=ocp.args.Composite(
            state=ocp.args.StandardSave(state),
            train_iter=grain.checkpoint.CheckpointSave(train_iter),
            digest=ocp.args.JsonSave(digest),
        ),
        force=True,
    )
    if wait:
      manager.wait_until_finished()
  except (errors.Interrupted, errors.TrainingError):
    raise
  except Exception as error:  # pylint: disable=broad-except
    raise errors.TrainingError(
        f"saving checkpoint {step} into {directory} failed "
        f"({type(error).__name__}: {errors.first_line(error)}); the run stops. "
        "Free the directory and rerun to resume from the last "
        "checkpoint."
    ) from error


FILE_DIGESTS = "files.sha256"
# Where the seal is written before its rename: left behind by a crash
# between the two, it is no file of the checkpoint.
_SEAL_IN_PROGRESS = FILE_DIGESTS + ".tmp"


def _file_digests(checkpoint: str) -> dict:
  """``{relative path: SHA-256}`` of every file under ``checkpoint``, its
  seal (and a seal left half written) left out."""
  found = {}
  for root, _, names in os.walk(checkpoint):
    for name in names:
      path = os.path.join(root, name)
      relative = os.path.relpath(path, checkpoint)
      if relative in (FILE_DIGESTS, _SEAL_IN_PROGRESS):
        continue
      sha = hashlib.sha256()
      with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
          sha.update(block)
      found[relative] = sha.hexdigest()
  return found


def seal_finished(manager) -> None:
  """Writes ``files.sha256`` into every finished checkpoint that lacks it.

  Call once no save is in flight (after ``wait_until_finished``). Process 0
  hashes the files of every host (checkpoints live on a shared filesystem).
  """
  if jax.process_index() != 0:
    return
  directory = str(manager.directory)
  # Not manager.all_steps(): on several hosts it is a collective.
  for step in rundir.saved_steps(os.path.dirname(directory)):
    checkpoint = os.path.join(directory, str(step))
    path = os.path.join(checkpoint, FILE_DIGESTS)
    if os.path.exists(path):
      continue
    lines = [
        f"{sha}  {name}\n"
        for name, sha in sorted(_file_digests(checkpoint).items())
    ]
    with open(os.path.join(checkpoint, _SEAL_IN_PROGRESS), "w") as f:
      f.writelines(lines)
      f.flush()
      os.fsync(f.fileno())  # renamed whole, never empty after a power loss
    os.replace(os.path.join(checkpoint, _SEAL_IN_PROGRESS), path)


def _check_files(manager, step) -> bool:
  """Whether ``files.sha256`` vouches for every file; Damaged if one differs.

  False for a checkpoint without it (the run stopped between save and seal),
  or with one that does not list every file it holds (empty, or torn: a
  line cut short, by a copy interrupted say, lists nothing, and a seal with
  a line that is no ``digest  name`` vouches for nothing; the checkpoint is
  then checked as an unsealed one, where its data decide).
  """
  checkpoint = os.path.join(str(manager.directory), str(step))
  path = os.path.join(checkpoint, FILE_DIGESTS)
  if not os.path.exists(path):
    return False  # the run stopped between the save and its seal
  try:
    with open(path, "rb") as f:
      text = f.read()
  except OSError as error:
    raise Damaged(f"its {FILE_DIGESTS} is unreadable") from error
  # Whole lines only: what follows the last newline was cut short.
  lines = text.split(b"\n")[:-1]
  pairs = [line.split(b"  ", 1) for line in lines]
  if not all(len(pair) == 2 for pair in pairs):
    return False
  try:
    want = {name.decode(): digest.decode() for digest, name in pairs}
  except UnicodeDecodeError:
    return False
  # Sealed by an older version beside a seal a crash left half written
  # (then renamed over this one): that file was never the checkpoint's.
  want.pop(_SEAL_IN_PROGRESS, None)
  got = _file_digests(checkpoint)
  bad = sorted(n for n in want if got.get(n) != want[n])
  if bad:
    raise Damaged(
        f"{len(bad)} file(s) differ from {FILE_DIGESTS}, e.g. {bad[0]}"
    )
  # A seal that lists nothing, or not every file (written torn), vouches for
  # none: the checkpoint is read as an unsealed one, and moved aside if it
  # cannot be, where "intact" would stop every rerun.
  return bool(want) and not set(got) - set(want)


def all_finite(tree) -> bool:
  """Whether every floating-point leaf of ``tree`` is finite.

  Small leaves held whole by this process are read in NumPy
  (`digests.on_host`), the others in one compiled reduction: checked op by
  op, each leaf's shape compiled two programs of its own (1.3 s of a
  resumed clock run's start on the 2-core CPU).
  """
  leaves = [
      x
      for x in jax.tree.leaves(tree)
      if jnp.issubdtype(jnp.asarray(x).dtype, jnp.floating)
  ]
  held = jax.device_get([x for x in leaves if digests.on_host(x)])
  if not all(np.isfinite(x).all() for x in held):
    return False
  rest = [x for x in leaves if not digests.on_host(x)]
  return not rest or bool(_all_finite_on_devices(rest))


@jax.jit
def _all_finite_on_devices(leaves):
  return jnp.all(jnp.stack([jnp.isfinite(x).all() for x in leaves]))


class Damaged(Exception):
  """A checkpoint whose files do not hold what was saved."""


# Failures of the machine, not of the files: out of (device) memory, a full
# or vanished filesystem. A checkpoint is never moved aside for one.
_ENVIRONMENT_MARKERS = ("RESOURCE_EXHAUSTED", "out of memory", "Out of memory")


# Not the files' fault either: one host failed before a barrier of orbax's
# restore, and another host's barrier met a different collective.
_OUT_OF_STEP_MARKERS = ("sync_global_devices name mismatch",)


def _environmental(error: BaseException) -> bool:
  if isinstance(error, (MemoryError, PermissionError)):
    return True
  if isinstance(error, OSError) and error.errno in (
      errno.ENOSPC,
      errno.EIO,
      errno.ENOMEM,
      errno.ESTALE,
  ):
    return True
  text = str(error)
  markers = _ENVIRONMENT_MARKERS + _OUT_OF_STEP_MARKERS
  return any(marker in text for marker in markers)


def _failed(step, error, *, intact: bool) -> Exception:
  """What a failed read of checkpoint ``step`` raises.

  ``Damaged`` (the checkpoint is moved aside) only where the files may be
  at fault: a failure of the machine, or any failure reading files that
  ``files.sha256`` vouches for, stops the run with the checkpoint untouched,
  so that a full disk or a busy GPU never costs a run its checkpoints and
  its metrics history.
  """
  gist = f"{type(error).__name__}: {errors.first_line(error)}"
  if intact or _environmental(error):
    why = (
        "its files match their files.sha256"
        if intact
        else "the failure is the machine's, not the files'"
    )
    return errors.TrainingError(
        f"restoring checkpoint {step} failed ({gist}); {why}, so nothing "
        "was moved or deleted. Fix the cause (memory, disk, a changed "
        "number of processes) and rerun to resume from it."
    )
  return Damaged(gist)


def _layout(tree) -> dict:
  """``{path: (shape, dtype)}`` of a tree of arrays or array metadata."""
  leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
  return {
      jax.tree_util.keystr(path).replace("'", ""): (
          tuple(leaf.shape),
          str(jnp.dtype(leaf.dtype)),
      )
      for path, leaf in leaves
  }


def layout_mismatch(saved, target) -> str | None:
  """How a checkpoint's arrays differ from the model's (None if alike)."""
  saved, target = _layout(saved), _layout(target)
  if saved == target:
    return None
  missing = sorted(set(target) - set(saved))
  extra = sorted(set(saved) - set(target))
  changed = sorted(p for p in set(saved) & set(target) if saved[p] != target[p])
  parts = []
  if changed:
    path = changed[0]
    parts.append(
        f"{len(changed)} array(s) differ, e.g. {path} is "
        f"{saved[path][0]} {saved[path][1]} there and "
        f"{target[path][0]} {target[path][1]} here"
    )
  if missing:
    parts.append(f"{len(missing)} array(s) missing there, e.g. {missing[0]}")
  if extra:
    parts.append(f"{len(extra)} array(s) not in this model, e.g. {extra[0]}")
  return "; ".join(parts)


def _read_position(manager, step, train_iter, *, intact=False) -> None:
  """Sets ``train_iter`` to this process's saved data position.

  Read the way grain's handler reads it, before orbax's restore: a file
  that this host alone cannot read then fails here, where the hosts can
  agree on it, and not inside orbax's restore, which ends in a barrier
  that a host which failed before it never reaches.
  """
  index, count = jax.process_index(), jax.process_count()
  path = os.path.join(
      str(manager.directory),
      str(step),
      "train_iter",
      f"process_{index}-of-{count}.json",
  )
  try:
    with open(path, "rb") as f:
      state = f.read()
    if isinstance(train_iter, grain.DatasetIterator):
      state = json.loads(state)
    train_iter.set_state(state)
  except Exception as error:  # pylint: disable=broad-except
    raise _failed(step, error, intact=intact) from error


def _saved_layout(manager, step, *, intact=False):
  """The saved state's array metadata; Damaged if it cannot be read."""
  try:
    metadata = manager.item_metadata(step)["state"]
  except Exception as error:  # pylint: disable=broad-except
    raise _failed(step, error, intact=intact) from error
  if metadata is None:
    raise Damaged("its state has no metadata")
  return metadata


def _on_every_process(step, read):
  """``read()``, failing on every process if it fails on any.

  A read that fails on one host alone (its own data position, its memory)
  would send that host on to the previous checkpoint while the others
  resume this one: their collectives would pair up wrongly and the run
  would hang, or resume at two steps. So each host says how its read ended
  (an all-gather), and all end alike: the worst outcome wins (a failure
  that stops the run, then damage, which moves the checkpoint aside).
  """
  try:
    result, failure = read(), None
  except Exception as error:  # pylint: disable=broad-except
    result, failure = None, error
  if jax.process_count() == 1:
    if failure is not None:
      raise failure
    return result
  mine = 0 if failure is None else 1 if isinstance(failure, Damaged) else 2
  if failure is not None:  # the others' messages point here
    logging.warning(
        "process %d: reading checkpoint %d failed (%s: %s)",
        jax.process_index(),
        step,
        type(failure).__name__,
        errors.first_line(failure),
    )
  outcomes = np.asarray(
      multihost_utils.process_allgather(np.asarray(mine, np.int32))
  ).reshape(-1)
  worst = int(outcomes.max())
  if worst > 2:  # an all-gather paired with another collective
    raise errors.TrainingError(
        f"restoring checkpoint {step}: the processes fell out of step (one "
        "failed inside a collective read); nothing was moved or deleted. "
        "Each process's train.log says why; fix the cause and rerun."
    )
  if worst == 0:
    return result
  if mine == worst:
    raise failure
  where = ", ".join(str(i) for i in np.flatnonzero(outcomes == worst))
  if worst == 1:
    raise Damaged(f"process(es) {where} could not read it")
  raise errors.TrainingError(
      f"restoring checkpoint {step} failed on process(es) {where} (their "
      "train.log says why); nothing was moved or deleted. Fix the cause and "
      "rerun to resume from it."
  )


def _restore(manager, step, target, train_iter, *, intact=False):
  """Restores ``step``: (state, step had a digest); Damaged if it is bad."""

  def read():
    try:
      restored = manager.restore(
          step,
          args=ocp.args.Composite(
              state=ocp.args.StandardRestore(target),
              train_iter=grain.checkpoint.CheckpointRestore(train_iter),
          ),
      )
    except Exception as error:  # pylint: disable=broad-except
      raise _failed(step, error, intact=intact) from error
    return restored["state"], _saved_digest(manager, step)

  # The checks below are collectives, with the same answer on every host.
  state, saved_digest = _on_every_process(step, read)
  if saved_digest is not None:
    bad = digests.tree_mismatches(state, saved_digest.get("state", {}))
    if bad:
      raise Damaged(
          f"its content does not match its digest ({len(bad)} array(s), "
          f"e.g. {bad[0]})"
      )
    if not digests.iterator_matches(train_iter, saved_digest.get("train_iter")):
      raise Damaged("its data-iterator state does not match its digest")
  if not all_finite(state):
    raise Damaged("it holds NaN or inf values")
  return state, saved_digest is not None


def _saved_digest(manager, step):
  """The digest saved with ``step``; None for a checkpoint saved without."""
  path = os.path.join(str(manager.directory), str(step), "digest")
  if not os.path.exists(path):
    return None
  try:
    return manager.restore(
        step, args=ocp.args.Composite(digest=ocp.args.JsonRestore())
    )["digest"]
  except Exception as error:  # pylint: disable=broad-except
    raise Damaged(
        f"its digest is unreadable ({type(error).__name__})"
    ) from error


# In the checkpoints folder: the steps an older version saved without a
# digest, listed when this version first restores one of them (in a run
# that had recorded no config yet). A recorded run restores those
# unverified, as the first resume did, instead of counting them damaged.
SAVED_WITHOUT_DIGEST = "saved_without_digest.json"


def _saved_without_digest(manager) -> set:
  """The steps listed in :data:`SAVED_WITHOUT_DIGEST` (none if unreadable)."""
  path = os.path.join(str(manager.directory), SAVED_WITHOUT_DIGEST)
  try:
    with open(path) as f:
      return {int(step) for step in json.load(f)}
  except (OSError, ValueError, TypeError):
    return set()


def _list_saved_without_digest(manager, steps) -> None:
  """Adds the ``steps`` that have no digest to the list (process 0)."""
  if jax.process_index() != 0:
    return
  directory = str(manager.directory)
  legacy = _saved_without_digest(manager) | {
      step
      for step in steps
      if not os.path.exists(os.path.join(directory, str(step), "digest"))
  }
  path = os.path.join(directory, SAVED_WITHOUT_DIGEST)
  with open(path + ".tmp", "w") as f:
    json.dump(sorted(legacy), f)
  os.replace(path + ".tmp", path)


def _move_aside(manager, workdir, step, reason):
  directory = os.path.join(workdir, "checkpoints")
  # A step found damaged again (a rerun wrote it anew) keeps the first
  # copies: corrupt-<step>-2, -3, ...
  target = rundir.free_path(os.path.join(directory, f"corrupt-{step}"))
  logging.warning(
      "checkpoint %d is unreadable (%s); moved aside to %s, falling back to"
      " the previous one.",
      step,
      reason,
      os.path.basename(target),
  )
  if jax.process_index() == 0:
    shutil.move(os.path.join(directory, str(step)), target)
  if jax.process_count() > 1:  # moved before any host lists the steps
    multihost_utils.sync_global_devices(f"moved aside {step}")
  manager.reload()


def restore_latest(
    manager, model, optimizer, train_iter, workdir, *, require_digest=False
) -> int:
  """Restores the newest good checkpoint; returns its step (0 if none).

  A checkpoint that fails to restore, whose content does not match its
  digest, or that holds a non-finite value, is moved aside
  (``corrupt-<step>``, kept for inspection) with one warning line, and the
  previous one is tried. Before the first is moved, ``metrics.jsonl`` is
  copied to ``checkpoints/metrics.jsonl.corrupt-<step>``
  (`rundir.keep_metrics_aside`): the resumed run rewrites it from the step
  it resumes at. With ``require_digest`` (a run that recorded its
  config, so saved every checkpoint with a digest) a checkpoint without a
  digest counts as damaged, unless an earlier resume restored checkpoints
  of that run saved by a version before digests (they are listed in
  :data:`SAVED_WITHOUT_DIGEST`, so that a run upgraded mid-way resumes
  from them again, not from step 0); else it is restored unverified, with
  a warning, and the steps without a digest are listed.

  Raises:
    ConfigError: a checkpoint holds arrays of other shapes or names than
      the model and optimizer built from this config: it was saved for
      another config and is left untouched.
  """
  state = nnx.state((model, optimizer))
  target = jax.tree.map(
      ocp.utils.to_shape_dtype_struct, nnx.to_pure_dict(state)
  )
  steps = sorted(manager.all_steps(), reverse=True)
  # A rejected checkpoint may have moved the iterator before its digest
  # was checked: with none left, training starts where a fresh run does.
  fresh_position = train_iter.get_state()
  metrics_kept = False
  legacy = _saved_without_digest(manager) if require_digest else set()
  for step in steps:
    _check_process_count(manager, step)
    try:

      def check(step=step):
        intact = _check_files(manager, step)
        _read_position(manager, step, train_iter, intact=intact)
        return intact, _saved_layout(manager, step, intact=intact)

      intact, saved = _on_every_process(step, check)
      mismatch = layout_mismatch(saved, target)
      if mismatch:
        raise errors.ConfigError(
            f"checkpoint {step} in {manager.directory} was saved for another "
            f"model or optimizer ({mismatch}); rerun with that run's config "
            "to resume it, or pass --start_over to move it aside and start "
            "afresh."
        )
      restored, verified = _restore(
          manager, step, target, train_iter, intact=intact
      )
      if require_digest and not verified and step not in legacy:
        raise Damaged("it has no digest")
    except Damaged as damage:
      if not metrics_kept:  # the records past the step resumed are dropped
        metrics_kept = True
        kept = rundir.keep_metrics_aside(workdir, step)
        if kept:
          logging.info("metrics.jsonl as it was: copied to %s", kept)
      _move_aside(manager, workdir, step, damage)
      continue
    if not verified:
      logging.warning(
          "checkpoint %d has no digest (saved by an older version): "
          "restored unverified.",
          step,
      )
      _list_saved_without_digest(manager, steps)
    nnx.replace_by_pure_dict(state, restored)
    nnx.update((model, optimizer), state)
    logging.info(
        "restored checkpoint %d (%s)",
        step,
        os.path.join(str(manager.directory), str(step)),
    )
    return step
  if steps:
    train_iter.set_state(fresh_position)
    logging.warning(
        "no readable checkpoint among steps %s: training "
        "restarts from step 0.",
        sorted(steps),
    )
  return 0


_PROCESS_FILE = re.compile(r"process_\d+-of-(\d+)\.json")


def _check_process_count(manager, step) -> None:
  """ConfigError if ``step`` was saved by another number of processes.

  Each process saves its own data position (grain's
  ``process_<i>-of-<n>.json``), so a run resumes with the processes that
  saved it; anything else would read no position or another's.
  """
  folder = os.path.join(str(manager.directory), str(step), "train_iter")
  try:
    names = os.listdir(folder)
  except OSError:
    return  # no iterator folder: the restore says what is wrong
  counts = {
      int(match.group(1))
      for match in map(_PROCESS_FILE.fullmatch, names)
      if match
  }
  if counts and counts != {jax.process_count()}:
    saved = "/".join(str(n) for n in sorted(counts))
    raise errors.ConfigError(
        f"checkpoint {step} in {manager.directory} was saved by {saved} "
        f"process(es) and this run has {jax.process_count()}: each process "
        "saved its own data position, so resume with the same number of "
        "processes (or pass --start_over to move the checkpoints aside)."
    )
