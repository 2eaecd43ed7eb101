"""Nothing lost on a restart: a run's config and its checkpoints' digests.

A rerun with another config is refused and leaves the workdir byte for byte
as it was; only the schedule's length and the cadences resume; starting
over moves the old run aside; a checkpoint whose files were damaged (even
by a flipped low bit that still decodes as a finite number) is never
resumed from.
"""

import hashlib
import json
import logging
import pathlib
import shutil

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P
import numpy as np
import pytest

from configs import arithmetic_mix_llm
from tests.test_train import logged
from tests.test_train import make_config
from tests.test_train import run_cli
from tests.test_trainer_reliability import assert_one_error
from train import arithmetic_data
from train import checkpoints
from train import checks
from train import compile_cache
from train import digests
from train import errors
from train import rundir
from train import step as step_lib
from train import train


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  directory = tmp_path_factory.mktemp("data")
  arithmetic_data.prepare(str(directory), train_size=400, test_size=40, seed=0)
  return str(directory)


def snapshot(directory: pathlib.Path) -> dict:
  """Every file under ``directory`` (hidden ones too): size and SHA-256."""
  return {
      str(path.relative_to(directory)): (
          path.stat().st_size,
          hashlib.sha256(path.read_bytes()).hexdigest(),
      )
      for path in sorted(directory.rglob("*"))
      if path.is_file()
  }


# ----------------------------------------------------------------------------
# A run's config is part of the run.


@pytest.fixture(scope="module")
def finished_run(data_dir, tmp_path_factory):
  """A finished 6-step run (checkpoints 3 and 6), never modified by tests."""
  workdir = tmp_path_factory.mktemp("finished") / "run"
  train.train_and_evaluate(
      make_config(data_dir, train_steps=6, lr_decay_steps=9), str(workdir)
  )
  return workdir


def test_changed_model_is_refused_and_the_workdir_untouched(
    data_dir, finished_run, tmp_path
):
  workdir = tmp_path / "run"
  shutil.copytree(finished_run, workdir)
  before = snapshot(workdir)
  assert "config.json" in before and "metrics.jsonl" in before
  config = make_config(data_dir, train_steps=6, lr_decay_steps=9)
  config.model = "small"
  result = run_cli(config, workdir, check=False)
  assert_one_error(result, "holds a run with another config")
  assert "model: 'tiny' -> 'small'" in result.stderr
  assert "--start_over" in result.stderr
  assert snapshot(workdir) == before


@pytest.mark.parametrize(
    "overrides, shown",
    [
        (dict(lam=0.5, seed=3), "lam: 0.3 -> 0.5; seed: 0 -> 3"),
        (dict(worker_count=2), "worker_count: 0 -> 2"),
        (dict(method="ce"), "method: 'ntil' -> 'ce'"),
    ],
)
def test_every_other_change_is_refused(
    data_dir, finished_run, tmp_path, overrides, shown
):
  workdir = tmp_path / "run"
  shutil.copytree(finished_run, workdir)
  before = snapshot(workdir)
  config = make_config(data_dir, train_steps=6, lr_decay_steps=9, **overrides)
  with pytest.raises(train.ConfigError, match="another config") as raised:
    train.train_and_evaluate(config, str(workdir))
  assert shown in str(raised.value)
  if "worker_count" in overrides:
    assert "restores only under the worker_count" in str(raised.value)
  assert snapshot(workdir) == before


def test_data_moved_elsewhere_resumes(data_dir, finished_run, tmp_path):
  # The same data under another path (a grid run from another checkout, a
  # copied tree): the run resumes, here already finished, instead of being
  # refused as another config.
  workdir = tmp_path / "run"
  shutil.copytree(finished_run, workdir)
  moved = tmp_path / "moved_data"
  moved.symlink_to(data_dir, target_is_directory=True)
  config = make_config(str(moved), train_steps=6, lr_decay_steps=9)
  result = train.train_and_evaluate(config, str(workdir))
  assert not result["stopped_early"]
  assert result["step"] == 6


def _data_beside(data_dir, tmp_path) -> str:
  """A data folder holding ``data_dir``'s dataset and another beside it."""
  beside = tmp_path / "data"
  (beside / "arithmetic_mix").mkdir(parents=True)
  (beside / "arithmetic_mix" / "train400_test40_seed0").symlink_to(
      pathlib.Path(data_dir) / "arithmetic_mix" / "train400_test40_seed0",
      target_is_directory=True,
  )
  arithmetic_data.prepare(str(beside), train_size=6, test_size=3, seed=1)
  return str(beside)


def test_another_dataset_beside_the_data_still_resumes(
    data_dir, finished_run, tmp_path, caplog
):
  # The run named no dataset: it read the only one and recorded its name,
  # so the same command resumes once another was prepared beside it.
  caplog.set_level(logging.INFO, logger="absl")
  recorded = rundir.read_config_record(str(finished_run))
  assert recorded["dataset_config"] == "train400_test40_seed0"
  workdir = tmp_path / "run"
  shutil.copytree(finished_run, workdir)
  beside = _data_beside(data_dir, tmp_path)
  config = make_config(beside, train_steps=6, lr_decay_steps=9)
  assert config.dataset_config == ""
  assert train.train_and_evaluate(config, str(workdir))["step"] == 6
  assert "restored checkpoint 6" in caplog.text
  assert config.dataset_config == ""  # the caller's config is not changed
  # A new run there must name one; the error says how.
  with pytest.raises(train.ConfigError, match="holds several") as raised:
    train.train_and_evaluate(config, str(tmp_path / "new"))
  assert "--config.dataset_config=NAME" in str(raised.value)
  assert not (tmp_path / "new").exists()


def test_a_run_recorded_without_its_dataset_resumes_when_it_is_named(
    data_dir, finished_run, tmp_path, caplog
):
  # Versions before runs named their dataset recorded "": naming the one
  # it read resumes it (one line lists the change) instead of refusing it.
  caplog.set_level(logging.INFO, logger="absl")
  workdir = tmp_path / "run"
  shutil.copytree(finished_run, workdir)
  record = rundir.read_record(str(workdir))
  record["config"]["dataset_config"] = ""
  (workdir / rundir.CONFIG_RECORD).write_text(json.dumps(record))
  beside = _data_beside(data_dir, tmp_path)
  config = make_config(beside, train_steps=6, lr_decay_steps=9)
  with pytest.raises(train.ConfigError, match="holds several"):
    train.train_and_evaluate(config, str(workdir))
  config.dataset_config = "train400_test40_seed0"
  assert train.train_and_evaluate(config, str(workdir))["step"] == 6
  (line,) = [m for m in caplog.messages if m.startswith("resuming with")]
  assert "dataset_config '' -> 'train400_test40_seed0'" in line
  # Nothing records which dataset the run read: with two there, a warning
  # says that the name is taken on trust.
  (warning,) = [m for m in caplog.messages if "recorded without" in m]
  assert "holds 2" in warning and "'train400_test40_seed0' as named" in warning
  assert "restored checkpoint 6" in caplog.text
  recorded = rundir.read_config_record(str(workdir))
  assert recorded["dataset_config"] == "train400_test40_seed0"


def test_longer_schedule_resumes_and_extends(
    data_dir, finished_run, tmp_path, caplog
):
  caplog.set_level(logging.INFO, logger="absl")
  workdir = tmp_path / "run"
  shutil.copytree(finished_run, workdir)
  # A changed cadence and length resume; one log line names the changes.
  result = train.train_and_evaluate(
      make_config(data_dir, train_steps=9, lr_decay_steps=9, log_every_steps=2),
      str(workdir),
  )
  assert result["step"] == 9
  (line,) = [m for m in caplog.messages if m.startswith("resuming with")]
  assert "train_steps 6 -> 9" in line and "log_every_steps 1 -> 2" in line
  assert "restored checkpoint 6" in caplog.text
  assert sorted(logged(str(workdir))) == [1, 2, 3, 4, 5, 6, 8, 9]
  assert rundir.read_config_record(str(workdir))["train_steps"] == 9
  straight = tmp_path / "straight"
  train.train_and_evaluate(
      make_config(data_dir, train_steps=9, lr_decay_steps=9), str(straight)
  )
  want = logged(str(straight))
  assert {s: want[s] for s in (8, 9)} == {
      s: logged(str(workdir))[s] for s in (8, 9)
  }


@pytest.mark.slow
def test_start_over_moves_the_old_run_aside(data_dir, finished_run, tmp_path):
  workdir = tmp_path / "run"
  shutil.copytree(finished_run, workdir)
  before = snapshot(workdir)
  config = make_config(data_dir, train_steps=2)
  config.model = "small"
  result = run_cli(config, workdir, "--start_over")
  assert "moved the previous run to" in result.stderr
  (previous,) = (workdir / "previous-runs").iterdir()
  moved = snapshot(previous)
  # Everything but the lock moved, byte for byte.
  assert moved == {k: v for k, v in before.items() if k != ".lock"}
  assert sorted(logged(str(workdir))) == [1, 2]
  assert rundir.read_config_record(str(workdir))["model"] == "small"
  assert rundir.saved_steps(str(workdir)) == [2]


def test_start_over_moves_the_runs_files_and_leaves_the_users(tmp_path):
  """--start_over used to move everything in the workdir: data kept there
  went too, and the new run then died on a missing data_dir."""
  run_files = [
      "checkpoints/3/state",
      "tensorboard/events",
      "metrics.jsonl",
      "metrics.jsonl.tmp",
      "predictions.jsonl",
      "config.json",
      "train.log",
      "train.1.log",
  ]
  users = ["data/arithmetic_mix/x", "notes.txt", "train.log.bak", ".lock"]
  # The compiled programs stay too: a run started over reuses them.
  users.append(f"{compile_cache.WORKDIR_FOLDER}/jit_train_step-0123")
  for name in run_files + users:
    (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / name).write_text(name)
  moved = pathlib.Path(rundir.move_run_aside(str(tmp_path)))
  assert moved.parent == tmp_path / rundir.PREVIOUS_RUNS
  for name in run_files:
    assert (moved / name).read_text() == name and not (tmp_path / name).exists()
  for name in users:
    assert (tmp_path / name).read_text() == name
  # Again: nothing of a run is left, so nothing moves.
  assert rundir.move_run_aside(str(tmp_path)) is None


def test_unrecorded_checkpoint_of_another_model_is_refused_untouched(
    data_dir, finished_run, tmp_path
):
  # A run saved before runs recorded their config: the arrays' shapes tell.
  workdir = tmp_path / "run"
  shutil.copytree(finished_run, workdir)
  (workdir / "config.json").unlink()
  checkpoints_before = snapshot(workdir / "checkpoints")
  config = make_config(data_dir, train_steps=6)
  config.model = "small"
  with pytest.raises(train.ConfigError, match="saved for another model"):
    train.train_and_evaluate(config, str(workdir))
  assert snapshot(workdir / "checkpoints") == checkpoints_before


def test_a_tensor_parallelism_of_zero_is_named():
  """tp=0 was refused as "fsdp=1 x tp=0 must divide the 4 devices"."""
  config = arithmetic_mix_llm.get_config("ce")
  config.tp = 0
  with pytest.raises(errors.ConfigError, match=r"^tp must be >= 1, got 0\.$"):
    checks.check_config(config, data=False)


def test_resumable_fields_are_config_fields():
  config = make_config("unused")
  # tp: the LLM task's tensor parallelism, a field of its config only.
  assert set(checks.RESUMABLE_FIELDS) - {"tp"} <= set(config.to_dict())
  assert "tp" in arithmetic_mix_llm.get_config("ntil")


# ----------------------------------------------------------------------------
# A checkpoint proves its content.


class _Restorer:
  """restore_latest as the trainer calls it, on a model built once."""

  def __init__(self, config):
    self.config = config
    task = checks.check_config(config)
    self.mesh = step_lib.make_mesh(config, task)
    with jax.set_mesh(self.mesh):
      self.state = train._create_state(  # pylint: disable=protected-access
          config, task, self.mesh
      )

  def __call__(self, workdir) -> int:
    """The step restored from ``workdir``."""
    with jax.set_mesh(self.mesh):
      manager = checkpoints.checkpoint_manager(workdir, self.config)
      try:
        return checkpoints.restore_latest(
            manager, *self.state, workdir, require_digest=True
        )
      finally:
        manager.close()


def _restore(config, workdir):
  return _Restorer(config)(workdir)


def _array_files(checkpoint: pathlib.Path):
  return sorted(
      p
      for p in (checkpoint / "state").rglob("*")
      if p.is_file() and p.parent.name == "d"
  )


def test_flipped_low_bits_never_resume(data_dir, finished_run, tmp_path):
  config = make_config(data_dir, train_steps=6, lr_decay_steps=9)
  files = _array_files(finished_run / "checkpoints" / "6")
  assert files
  flips = [
      (path.relative_to(finished_run), offset)
      for path in files
      for offset in np.linspace(0, path.stat().st_size - 1, 4).astype(int)
  ]
  restore = _Restorer(config)
  for number, (relative, offset) in enumerate(flips):
    workdir = tmp_path / f"flip{number}"
    shutil.copytree(finished_run / "checkpoints", workdir / "checkpoints")
    data = bytearray((workdir / relative).read_bytes())
    data[offset] ^= 1  # the lowest bit
    (workdir / relative).write_bytes(bytes(data))
    restored = restore(str(workdir))
    assert restored == 3, (relative, offset)
    assert (workdir / "checkpoints" / "corrupt-6").is_dir()
    shutil.rmtree(workdir)


def test_flipped_low_bit_of_a_value_is_caught_by_the_digest(
    data_dir, finished_run, tmp_path, caplog
):
  caplog.set_level(logging.INFO, logger="absl")
  # orbax compresses, so a flip in the files may not reach a value; here
  # one float's lowest bit is changed as it is read, as if it had been
  # damaged on disk and still decoded as a finite number.
  workdir = tmp_path / "run"
  shutil.copytree(finished_run, workdir)
  original = checkpoints.ocp.CheckpointManager.restore

  def restore_then_flip(self, step, *args, **kwargs):
    restored = original(self, step, *args, **kwargs)
    if step == 6 and "state" in restored:
      leaves, tree = jax.tree.flatten(restored["state"])
      index = max(range(len(leaves)), key=lambda i: leaves[i].size)
      values = np.array(leaves[index], np.float32)
      values.reshape(-1).view(np.uint32)[7] ^= 1
      assert np.isfinite(values).all()
      leaves[index] = jax.device_put(values, leaves[index].sharding)
      return dict(restored, state=jax.tree.unflatten(tree, leaves))
    return restored

  config = make_config(data_dir, train_steps=6, lr_decay_steps=9)
  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(
        checkpoints.ocp.CheckpointManager, "restore", restore_then_flip
    )
    assert _restore(config, str(workdir)) == 3
  assert "does not match its digest" in caplog.text
  assert "checkpoint 6 is unreadable" in caplog.text
  assert "restored checkpoint 3" in caplog.text


def _tree(workdir: pathlib.Path) -> dict:
  """``{relative path: SHA-256}`` of every file under ``workdir``."""
  return {
      str(p.relative_to(workdir)): hashlib.sha256(p.read_bytes()).hexdigest()
      for p in sorted(workdir.rglob("*"))
      if p.is_file()
  }


@pytest.mark.parametrize(
    "failure",
    [
        RuntimeError("RESOURCE_EXHAUSTED: Out of memory allocating 1.2GiB"),
        OSError(28, "No space left on device"),
        ValueError("a failure orbax never meant"),  # sealed files: not damage
    ],
)
def test_a_failed_restore_of_intact_files_stops_and_moves_nothing(
    data_dir, finished_run, tmp_path, failure
):
  """A busy GPU or a full disk at restore must not cost a run its
  checkpoints and, through a restart at step 0, its metrics history."""
  workdir = tmp_path / "run"
  shutil.copytree(finished_run, workdir)
  before = _tree(workdir)
  original = checkpoints.ocp.CheckpointManager.restore

  def failing(self, step, *args, **kwargs):
    if "state" in dict(kwargs["args"].items()):
      raise failure
    return original(self, step, *args, **kwargs)

  config = make_config(data_dir, train_steps=9, lr_decay_steps=9)
  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(checkpoints.ocp.CheckpointManager, "restore", failing)
    with pytest.raises(errors.TrainingError, match="nothing was moved"):
      train.train_and_evaluate(config, str(workdir))
  assert _tree(workdir) == before
  assert logged(str(workdir)) == logged(str(finished_run))


def test_a_failure_of_the_machine_moves_nothing_without_a_seal(
    data_dir, finished_run, tmp_path
):
  workdir = tmp_path / "run"
  shutil.copytree(finished_run / "checkpoints", workdir / "checkpoints")
  for step in ("3", "6"):  # stopped between the save and its seal
    (workdir / "checkpoints" / step / checkpoints.FILE_DIGESTS).unlink()
  before = _tree(workdir)
  original = checkpoints.ocp.CheckpointManager.restore

  def failing(self, step, *args, **kwargs):
    if "state" in dict(kwargs["args"].items()):
      raise RuntimeError("RESOURCE_EXHAUSTED: Out of memory")
    return original(self, step, *args, **kwargs)

  config = make_config(data_dir, train_steps=6, lr_decay_steps=9)
  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(checkpoints.ocp.CheckpointManager, "restore", failing)
    with pytest.raises(errors.TrainingError, match="the machine's"):
      _restore(config, str(workdir))
  assert _tree(workdir) == before


def test_every_checkpoint_rejected_restarts_where_a_fresh_run_does(
    data_dir, finished_run, tmp_path, caplog
):
  """A rejected checkpoint's data position must not outlive it."""
  workdir = tmp_path / "run"
  shutil.copytree(finished_run / "checkpoints", workdir / "checkpoints")
  config = make_config(data_dir, train_steps=6, lr_decay_steps=9)
  restore = _Restorer(config)
  train_iter = restore.state[2]
  fresh = train_iter.get_state()
  with pytest.MonkeyPatch.context() as patch:  # restored, then rejected
    patch.setattr(digests, "tree_mismatches", lambda tree, saved: ["[w]"])
    assert restore(str(workdir)) == 0
  assert "training restarts from step 0" in caplog.text
  assert train_iter.get_state() == fresh
  assert (workdir / "checkpoints" / "corrupt-3").is_dir()


def test_every_checkpoint_rejected_keeps_the_old_metrics_aside(
    data_dir, finished_run, tmp_path
):
  """The run restarts from step 0 and rewrites metrics.jsonl: its history
  used to be lost; a copy now sits beside the moved-aside checkpoints."""
  workdir = tmp_path / "run"
  shutil.copytree(finished_run, workdir)
  history = (workdir / "metrics.jsonl").read_text()
  assert len(rundir.read_metrics(str(workdir / "metrics.jsonl"))) >= 6
  restore = _Restorer(make_config(data_dir, train_steps=6, lr_decay_steps=9))
  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(digests, "tree_mismatches", lambda tree, saved: ["[w]"])
    assert restore(str(workdir)) == 0
  rundir.MetricsWriter(str(workdir), 0).close()  # as the restarted run does
  assert (workdir / "metrics.jsonl").read_text() == ""
  checkpoints_dir = workdir / "checkpoints"
  assert (checkpoints_dir / "metrics.jsonl.corrupt-6").read_text() == history
  assert sorted(p.name for p in checkpoints_dir.iterdir()) == [
      "corrupt-3",
      "corrupt-6",
      "metrics.jsonl.corrupt-6",
  ]
  assert rundir.saved_steps(str(workdir)) == []


def test_another_process_count_is_refused_and_nothing_moved(
    data_dir, finished_run, tmp_path
):
  workdir = tmp_path / "run"
  shutil.copytree(finished_run, workdir)
  for step in ("3", "6"):  # as two processes would have saved them
    folder = workdir / "checkpoints" / step / "train_iter"
    (folder / "process_0-of-1.json").rename(folder / "process_0-of-2.json")
  before = _tree(workdir)
  config = make_config(data_dir, train_steps=9, lr_decay_steps=9)
  with pytest.raises(errors.ConfigError, match="saved by 2 process"):
    train.train_and_evaluate(config, str(workdir))
  assert _tree(workdir) == before


def test_missing_digest_counts_as_damage_in_a_recorded_run(
    data_dir, finished_run, tmp_path
):
  workdir = tmp_path / "run"
  shutil.copytree(finished_run, workdir)
  shutil.rmtree(workdir / "checkpoints" / "6" / "digest")
  config = make_config(data_dir, train_steps=6, lr_decay_steps=9)
  assert _restore(config, str(workdir)) == 3


def test_checkpoint_saved_before_digests_restores_with_a_warning(
    data_dir, finished_run, tmp_path, caplog
):
  workdir = tmp_path / "run"
  shutil.copytree(finished_run / "checkpoints", workdir / "checkpoints")
  for step in ("3", "6"):  # as an older version saved them
    shutil.rmtree(workdir / "checkpoints" / step / "digest")
    (workdir / "checkpoints" / step / checkpoints.FILE_DIGESTS).unlink()
  config = make_config(data_dir, train_steps=6, lr_decay_steps=9)
  restore = _Restorer(config)
  with jax.set_mesh(restore.mesh):
    manager = checkpoints.checkpoint_manager(str(workdir), config)
    step = checkpoints.restore_latest(
        manager, *restore.state, str(workdir), require_digest=False
    )
    manager.close()
  assert step == 6
  assert "checkpoint 6 has no digest" in caplog.text
  assert "restored unverified" in caplog.text
  # That resume recorded the config; killed before its first save, the
  # rerun (a recorded run) resumes from the same checkpoints, not step 0.
  assert restore(str(workdir)) == 6
  assert sorted(p.name for p in (workdir / "checkpoints").iterdir()) == [
      "3",
      "6",
      checkpoints.SAVED_WITHOUT_DIGEST,
  ]


# Every array digested on the host (NumPy), or every one on the devices.
_DIGEST_PATHS = pytest.mark.parametrize(
    "host_max_elements", [digests.HOST_MAX_ELEMENTS, -1], ids=["host", "device"]
)


@_DIGEST_PATHS
def test_finite_check_sees_one_nan_or_inf_in_any_float_leaf(
    host_max_elements, monkeypatch
):
  """A restored state with one NaN or inf anywhere is refused, read in
  NumPy or on the devices; integer leaves and PRNG keys are not read."""
  monkeypatch.setattr(digests, "HOST_MAX_ELEMENTS", host_max_elements)
  x = jnp.linspace(-3.0, 3.0, 48).reshape(8, 6)
  tree = dict(
      w=x,
      b=x[0].astype(jnp.bfloat16),
      n=jnp.arange(5),
      key=jax.random.key(0),
      step=3,
  )
  assert checkpoints.all_finite(tree)
  for bad in (np.nan, np.inf, -np.inf):
    for name in ("w", "b"):
      broken = dict(tree, **{name: tree[name].at[-1].set(bad)})
      assert not checkpoints.all_finite(broken), (bad, name)
  assert checkpoints.all_finite(dict(n=jnp.arange(3)))


@_DIGEST_PATHS
def test_digest_sees_any_one_element_and_not_the_sharding(
    host_max_elements, monkeypatch
):
  monkeypatch.setattr(digests, "HOST_MAX_ELEMENTS", host_max_elements)
  x = jax.random.normal(jax.random.key(0), (8, 6), jnp.float32)
  tree = dict(w=x, b=x[0].astype(jnp.bfloat16), n=jnp.arange(5))
  want = digests.tree_digest(tree)
  assert digests.tree_mismatches(tree, want) == []
  bits = jax.lax.bitcast_convert_type(x, jnp.uint32)
  for flat in (0, 13, 47):
    changed = bits.reshape(-1).at[flat].set(bits.reshape(-1)[flat] ^ 1)
    y = jax.lax.bitcast_convert_type(changed, jnp.float32).reshape(x.shape)
    assert digests.tree_mismatches(dict(tree, w=y), want) == ["[w]"]
  # Two elements swapped: same values, other places.
  swapped = x.at[0, 0].set(x[0, 1]).at[0, 1].set(x[0, 0])
  assert digests.tree_mismatches(dict(tree, w=swapped), want) == ["[w]"]
  mesh = jax.make_mesh((1,), ("data",))
  sharded = jax.device_put(x, NamedSharding(mesh, P("data")))
  assert digests.tree_mismatches(dict(tree, w=sharded), want) == []


def _numpy_digest(x) -> str:
  """The digest's definition (train/digests.py) in NumPy, element by element
  in row-major order: checkpoints saved by any version stay verifiable."""
  x = np.asarray(x)
  if x.dtype == np.bool_:
    words = x.astype(np.uint32).reshape(-1)
  elif x.dtype.itemsize == 8:
    words = x.reshape(-1).view(np.uint32)  # each element's two words in turn
  else:
    unsigned = {1: np.uint8, 2: np.uint16, 4: np.uint32}[x.dtype.itemsize]
    words = x.reshape(-1).view(unsigned).astype(np.uint32)

  def fmix(h):
    h = int(h)
    h ^= h >> 16
    h = (h * 0x85EBCA6B) % 2**32
    h ^= h >> 13
    h = (h * 0xC2B2AE35) % 2**32
    return h ^ (h >> 16)

  lanes = []
  for salt in (0x9E3779B9, 0x7F4A7C15):
    total = 0
    for index, word in enumerate(words):
      total += fmix(int(word) ^ fmix((index + salt) % 2**32))
    lanes.append(total % 2**32)
  return "".join(f"{lane:08x}" for lane in lanes)


@_DIGEST_PATHS
def test_digest_is_its_definition_for_every_dtype(
    host_max_elements, monkeypatch
):
  monkeypatch.setattr(digests, "HOST_MAX_ELEMENTS", host_max_elements)
  rng = np.random.default_rng(3)
  tree = dict(
      w=rng.standard_normal((3, 5)).astype(np.float32),
      again=rng.standard_normal((3, 5)).astype(np.float32),  # same signature
      b=jnp.asarray(rng.standard_normal(7), jnp.bfloat16),
      steps=np.arange(4, dtype=np.int32),
      mask=rng.random((2, 3)) < 0.5,
      small=rng.integers(0, 255, (6,)).astype(np.uint8),
      key=jax.random.key(5),
      count=7,  # a Python int: digested as jnp.asarray makes it, int32
      rate=0.5,  # float32
  )
  got = digests.tree_digest(tree)
  key_words = jax.random.key_data(tree["key"])
  want = {
      f"[{name}]": _numpy_digest(
          key_words if name == "key" else jnp.asarray(value)
      )
      for name, value in tree.items()
  }
  assert got == want


def test_digest_of_a_large_array_on_the_devices_is_that_on_the_host(
    monkeypatch,
):
  """Arrays above HOST_MAX_ELEMENTS are digested on the devices, sharded
  or not; the same definition as the host's (the element-by-element one is
  too slow at this size)."""
  x = jax.random.normal(jax.random.key(1), (8, 4096), jnp.float32)
  mesh = jax.make_mesh((1,), ("data",))
  tree = dict(w=x, sharded=jax.device_put(x, NamedSharding(mesh, P("data"))))
  monkeypatch.setattr(digests, "HOST_MAX_ELEMENTS", x.size - 1)
  on_devices = digests.tree_digest(tree)
  monkeypatch.setattr(digests, "HOST_MAX_ELEMENTS", x.size)
  on_host = digests.tree_digest(tree)
  assert on_devices == on_host
  assert on_devices["[w]"] == on_devices["[sharded]"]


def test_a_seal_left_half_written_does_not_condemn_its_checkpoint(
    data_dir, finished_run, tmp_path
):
  """A crash between writing files.sha256.tmp and renaming it left the
  temporary file in the checkpoint: the next seal listed it and then
  renamed it away, so the good checkpoint was moved aside as damaged (with
  one kept, the run restarted from step 0)."""
  config = make_config(data_dir, train_steps=6, lr_decay_steps=9)
  restore = _Restorer(config)
  workdir = tmp_path / "run"
  shutil.copytree(finished_run / "checkpoints", workdir / "checkpoints")
  checkpoint = workdir / "checkpoints" / "6"
  seal = checkpoint / checkpoints.FILE_DIGESTS
  half = checkpoint / (checkpoints.FILE_DIGESTS + ".tmp")
  half.write_text(seal.read_text()[:50])  # the crash, mid-seal
  seal.unlink()
  with jax.set_mesh(restore.mesh):
    manager = checkpoints.checkpoint_manager(str(workdir), config)
    checkpoints.seal_finished(manager)  # the rerun's seal
    manager.close()
  assert ".tmp" not in seal.read_text() and not half.exists()
  assert restore(str(workdir)) == 6
  # A checkpoint an older version sealed that way lists the file it then
  # renamed away: that entry is no file of the checkpoint.
  digest = hashlib.sha256(b"half a seal").hexdigest()
  with open(seal, "a") as f:
    f.write(f"{digest}  {checkpoints.FILE_DIGESTS}.tmp\n")
  assert restore(str(workdir)) == 6
  assert sorted(p.name for p in (workdir / "checkpoints").iterdir()) == [
      "3",
      "6",
  ]


@pytest.mark.parametrize("seal", ["empty", "torn"])
def test_a_seal_that_lists_too_little_does_not_vouch_for_its_checkpoint(
    data_dir, finished_run, tmp_path, seal
):
  """A seal renamed into place before it reached the disk (a power loss)
  can be empty: it listed nothing to compare, so the checkpoint counted as
  intact, its unreadable metadata as the machine's failure, and every
  rerun stopped there instead of falling back to step 3."""
  config = make_config(data_dir, train_steps=6, lr_decay_steps=9)
  workdir = tmp_path / "run"
  shutil.copytree(finished_run / "checkpoints", workdir / "checkpoints")
  checkpoint = workdir / "checkpoints" / "6"
  path = checkpoint / checkpoints.FILE_DIGESTS
  lines = path.read_text().splitlines(keepends=True)
  path.write_text("" if seal == "empty" else lines[0])
  (checkpoint / "state" / "_METADATA").write_text("garbage")
  assert _Restorer(config)(str(workdir)) == 3
  assert sorted(p.name for p in (workdir / "checkpoints").iterdir()) == [
      "3",
      "corrupt-6",
  ]


@pytest.mark.parametrize("cut", ["in_a_digest", "in_a_name"])
def test_a_seal_cut_short_leaves_an_intact_checkpoint_restored(
    data_dir, finished_run, tmp_path, cut
):
  """A seal cut mid-line (a copy of the workdir interrupted) read as
  unreadable, or as a file that differs from it: the intact checkpoint was
  moved aside and the run fell back a checkpoint. Its whole lines vouch for
  too little; the checkpoint's own data decide."""
  config = make_config(data_dir, train_steps=6, lr_decay_steps=9)
  workdir = tmp_path / "run"
  shutil.copytree(finished_run / "checkpoints", workdir / "checkpoints")
  path = workdir / "checkpoints" / "6" / checkpoints.FILE_DIGESTS
  text = path.read_bytes()
  second = text.index(b"\n") + 1  # where the second line starts
  end = second + (30 if cut == "in_a_digest" else 64 + 2 + 5)
  path.write_bytes(text[:end])
  assert _Restorer(config)(str(workdir)) == 6
  assert sorted(p.name for p in (workdir / "checkpoints").iterdir()) == [
      "3",
      "6",
  ]


def test_a_step_damaged_again_is_moved_aside_beside_the_first(
    data_dir, finished_run, tmp_path, caplog
):
  """The same step found damaged three times (rerun, damaged again) used to
  nest the second copy inside the first and crash the third restore."""
  config = make_config(data_dir, train_steps=6, lr_decay_steps=9)
  restore = _Restorer(config)
  workdir = tmp_path / "run"
  checkpoints_dir = workdir / "checkpoints"
  for attempt in range(3):
    shutil.copytree(finished_run / "checkpoints" / "6", checkpoints_dir / "6")
    if attempt == 0:
      shutil.copytree(finished_run / "checkpoints" / "3", checkpoints_dir / "3")
    (array,) = _array_files(checkpoints_dir / "6")[:1]
    data = bytearray(array.read_bytes())
    data[0] ^= 1
    array.write_bytes(bytes(data))
    assert restore(str(workdir)) == 3
  assert sorted(p.name for p in checkpoints_dir.iterdir()) == [
      "3",
      "corrupt-6",
      "corrupt-6-2",
      "corrupt-6-3",
  ]
  assert all(
      (checkpoints_dir / name / "state").is_dir()
      for name in ("corrupt-6", "corrupt-6-2", "corrupt-6-3")
  )
  assert "moved aside to corrupt-6-3" in caplog.text


def test_another_tasks_run_does_not_name_this_tasks_dataset(tmp_path):
  """A grounding config on a clock run's workdir took the clock dataset's
  name from its record, so the refusal named a dataset the user never gave
  (``No grounding config 'train256_test64_seed0'``) instead of the task."""
  from configs import grounding  # pylint: disable=g-import-not-at-top
  from train.tasks import grounding as grounding_task  # pylint: disable=g-import-not-at-top

  workdir = tmp_path / "run"
  (workdir / "checkpoints" / "4").mkdir(parents=True)
  (workdir / rundir.CONFIG_RECORD).write_text(
      json.dumps(
          {"config": {"task": "clock_time", "dataset_config": "clocks_only"}}
      )
  )
  prepared = tmp_path / "data" / grounding_task.NAME / "scenes" / "1.0.0"
  prepared.mkdir(parents=True)
  (prepared / "dataset_info.json").write_text("{}")
  config = grounding.get_config("ce")
  config.data_dir = str(tmp_path / "data")
  assert checks.name_dataset(config, str(workdir)).dataset_config == "scenes"
  # The same task's record still names the run's dataset.
  (workdir / rundir.CONFIG_RECORD).write_text(
      json.dumps(
          {"config": {"task": config.task, "dataset_config": "recorded"}}
      )
  )
  assert checks.name_dataset(config, str(workdir)).dataset_config == "recorded"
