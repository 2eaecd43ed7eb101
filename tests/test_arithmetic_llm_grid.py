"""The arithmetic_mix grid on a pretrained snapshot (``--profile=llm``).

``llm_smoke`` runs the llm profile's code on the tiny Qwen2 fixture snapshot
(tests/fixtures/hf/qwen2_tiny) in seconds: the zero-shot record, fine-tuned
cells, resuming cell by cell.
"""

import json
import pathlib
import shutil
import sys

import pytest

from experiments import common as results_io

from tests import launch

ROOT = pathlib.Path(__file__).resolve().parents[1]


def run(*args, check=True):
  result = launch.run(
      [sys.executable, "-m", "experiments.arithmetic_mix.run", *args],
      cwd=ROOT,
      capture_output=True,
      text=True,
      timeout=900,
  )
  if check:
    assert result.returncode == 0, result.stderr[-3000:]
  return result


@pytest.mark.slow
def test_llm_smoke_grid_records_zero_shot_and_resumes(tmp_path):
  results = tmp_path / "results.json"
  common = [
      f"--results={results}",
      f"--runs_dir={tmp_path / 'runs'}",
      f"--data_dir={tmp_path / 'data'}",
      "--profile=llm_smoke",
  ]
  run(*common, "--max_cells=3")
  first = results_io.load_results(results)
  assert [r["name"] for r in first] == ["zero-shot", "ce-s0", "emd-s0"]
  zero_shot, trained = first[0], first[1:]
  assert zero_shot["group"] == "zero_shot" and zero_shot["method"] is None
  assert zero_shot["steps"] == 0 and zero_shot["problems_seen"] == 0
  for record in first:
    assert record["snapshot"] == "qwen2_tiny"
    assert len(record["snapshot_sha256"]) == 64  # the weights' content
    assert {"config.json", "tokenizer.json", "model.safetensors"} <= set(
        record["snapshot_files"]
    )
    assert record["dataset"] == "arithmetic_mix" and record["data"] == {}
    assert 0.0 <= record["exact_match"] <= 1.0
    assert record["num_test_examples"] == len(record["predictions"]) == 8
  for record in trained:
    assert record["group"] == "main" and record["seed"] == 0
    assert record["steps"] == 2 and record["learning_rate"] == 1e-3
    assert record["problems_seen"] == 2 * 4  # each problem seen once
    assert record["steps_per_second"] > 0
    workdir = (
        tmp_path
        / "runs"
        / "llm_smoke"
        / "qwen2_tiny"
        / f"{record['name']}-{record['config_hash']}"
    )
    assert (workdir / "metrics.jsonl").is_file()
    assert not (workdir / "checkpoints").exists()  # deleted once recorded
  assert len({r["config_hash"] for r in first}) == 3
  # Rerun with --methods: finished cells (the zero-shot one too) are
  # skipped, and of the others only the losses named run.
  out = run(*common, "--methods=ntil,ce").stdout
  runs = results_io.load_results(results)
  assert runs[:3] == first
  assert [r["name"] for r in runs[3:]] == ["ntil-s0"]
  assert "zero-shot" not in out and "ce-s0" not in out
  # Two processes finish the grid, each cell once.
  run(*common, "--workers=2")
  runs = results_io.load_results(results)
  assert [r["name"] for r in runs[:4]] == [
      "zero-shot",
      "ce-s0",
      "emd-s0",
      "ntil-s0",
  ]
  assert sorted(r["name"] for r in runs[4:]) == ["ntl_mse-s0", "soft_label-s0"]
  assert len({r["config_hash"] for r in runs}) == 6


@pytest.mark.slow
def test_llm_flags_are_refused_for_other_profiles(tmp_path):
  result = run(
      "--profile=smoke",
      "--learning_rate=1e-4",
      f"--results={tmp_path / 'results.json'}",
      check=False,
  )
  assert result.returncode != 0
  assert "--learning_rate: only for --profile=llm" in result.stderr
  result = run(
      "--profile=smoke",
      "--methods=ntil,del,ntl",
      f"--results={tmp_path / 'results.json'}",
      check=False,
  )
  assert result.returncode != 0
  assert "--methods=ntil,del,ntl: choose from ce, emd" in result.stderr
  assert "ntil, del, smmd, nl_ntl." in result.stderr
  result = run(
      "--profile=llm_smoke",
      "--methods=ce,nitl",
      f"--results={tmp_path / 'results.json'}",
      check=False,
  )
  assert result.returncode != 0
  assert "--methods=ce,nitl: choose from ce, emd" in result.stderr
  result = run("--profile=llm", check=False)
  assert result.returncode != 0
  assert "--pretrained=SNAPSHOT_DIR" in result.stderr


def test_unknown_groups_are_refused_before_the_data_is_made(tmp_path):
  """A group the profile's grid lacks (the digits grid has no 'sweep') is
  one error: line and exit 2, not a KeyError after the data is generated."""
  for profile, groups, grid_groups in (
      ("smoke", "main,peers", "main, ablation, sweep"),
      (
          "digits_smoke",
          "main,sweep",
          "main, control, ablation, peers, chunks, chunks_peers",
      ),
  ):
    result = run(
        f"--profile={profile}",
        f"--groups={groups}",
        f"--results={tmp_path / 'results.json'}",
        f"--data_dir={tmp_path / 'data'}",
        check=False,
    )
    assert result.returncode == 2, result.stderr[-3000:]
    bad = groups.split(",")[1]
    assert f"--groups={bad}: the {profile} grid has {grid_groups}." in (
        result.stderr
    )
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "data").exists()


# Run in a subprocess: importing the grid module defines its absl flags,
# which other test modules' grid and report modules define too.
_HASHES = """
import json, sys
from experiments.arithmetic_mix import run as grid
path, data_dir = sys.argv[1:3]
settings = dict(grid.LLM_PROFILES["llm_smoke"], pretrained=path)
settings["train_size"] = settings["train_steps"] * settings["batch_size"]
config = grid.llm_cell_config(settings, "ntil", 0, data_dir)
assert config.pretrained == path  # the run reads it from there
assert config.data_dir == data_dir
hashes = [
    grid.llm_hash(config, "llm_smoke", settings),
    grid.zero_shot_hash(config, "llm_smoke", settings),
    grid.snapshot_identity(path),
]
# The zero-shot prompts joined to the answer, or with the tokenizer's BOS.
config.tokenize_joined = True
hashes.append(grid.zero_shot_hash(config, "llm_smoke", settings))
config.tokenize_joined, config.prompt_bos = False, "tokenizer"
hashes.append(grid.zero_shot_hash(config, "llm_smoke", settings))
print(json.dumps(hashes))
"""


@pytest.mark.slow
def test_cell_hashes_name_the_snapshot_and_data_not_their_location(tmp_path):
  fixture = ROOT / "tests" / "fixtures" / "hf" / "qwen2_tiny"
  here, there = tmp_path / "a" / "qwen2_tiny", tmp_path / "b" / "qwen2_tiny"
  shutil.copytree(fixture, here)
  shutil.copytree(fixture, there)

  def hashes(path, data_dir="data"):
    result = launch.run(
        [sys.executable, "-c", _HASHES, str(path), data_dir],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.splitlines()[-1])

  ours = hashes(here)
  assert ours == hashes(there)
  # Nor where its data is (a device reads a copy from elsewhere).
  assert ours == hashes(here, str(tmp_path / "elsewhere"))
  assert ours[2].startswith("qwen2_tiny@")
  # The zero-shot prompts' tokenization is part of the zero-shot cell.
  assert len({ours[1], ours[3], ours[4]}) == 3
  # Another model under the same name is another cell.
  config = json.loads((there / "config.json").read_text())
  config["num_hidden_layers"] += 1
  (there / "config.json").write_text(json.dumps(config))
  theirs = hashes(there)
  assert ours[0] != theirs[0] and ours[1] != theirs[1]


def test_a_second_schedule_needs_its_own_results_file(tmp_path):
  """Cells of two schedules of one dataset never share a report."""
  import pytest  # pylint: disable=g-import-not-at-top
  from absl import app  # pylint: disable=g-import-not-at-top
  from experiments.arithmetic_mix import run as run_lib  # pylint: disable=g-import-not-at-top

  results = str(tmp_path / "results.json")
  cell = dict(
      name="ce-s0",
      group="main",
      dataset="add_or_sub",
      config_hash="a",
      steps=300,
      batch_size=32,
      learning_rate=1e-4,
      num_test_examples=2000,
  )
  zero = dict(
      cell, name="zero-shot", group="zero_shot", steps=0, config_hash="z"
  )
  results_io.save_results(results, [zero, cell])
  settings = dict(
      dataset="add_or_sub",
      train_steps=300,
      batch_size=32,
      learning_rate=1e-4,
      test_size=2000,
      split_digits=False,
  )
  run_lib.check_one_schedule(results, settings)  # the same schedule
  run_lib.check_one_schedule(results, dict(settings, dataset="arithmetic_mix"))
  with pytest.raises(app.UsageError) as error:
    run_lib.check_one_schedule(
        results, dict(settings, train_steps=3000, learning_rate=1e-5)
    )
  assert "steps 300 there, 3000 here" in str(error.value)
  assert "learning_rate 0.0001 there, 1e-05 here" in str(error.value)
  assert "--results=" in str(error.value)
  # Nor two tokenizations: records without split_digits were run without.
  with pytest.raises(app.UsageError, match="split_digits False there, True"):
    run_lib.check_one_schedule(results, dict(settings, split_digits=True))
  # ... a zero-shot cell alone included (it would be a second zero-shot row).
  results_io.save_results(results, [dict(zero, split_digits=True)])
  with pytest.raises(app.UsageError, match="split_digits True there, False"):
    run_lib.check_one_schedule(results, settings)
  run_lib.check_one_schedule(results, dict(settings, split_digits=True))


def test_other_weights_under_one_snapshot_name_are_refused(tmp_path):
  """A checkpoint saved over another of one architecture keeps the
  snapshot's identity (name, sizes: the cells' hashes); its content digest
  differs, and a grid whose results hold the other weights' cells refuses
  to count them as done."""
  import pytest  # pylint: disable=g-import-not-at-top
  from absl import app  # pylint: disable=g-import-not-at-top
  from experiments.arithmetic_mix import run as run_lib  # pylint: disable=g-import-not-at-top

  here = tmp_path / "qwen2_tiny"
  shutil.copytree(ROOT / "tests" / "fixtures" / "hf" / "qwen2_tiny", here)
  cache = str(tmp_path / "runs" / ".snapshot_digests.json")
  identity = run_lib.snapshot_identity(str(here))
  before = run_lib.snapshot_contents(str(here), cache)
  assert run_lib.snapshot_contents(str(here), cache) == before
  (weights,) = here.glob("*.safetensors")
  data = bytearray(weights.read_bytes())
  data[-1] ^= 1  # retrained: the same names and sizes, other bytes
  weights.write_bytes(bytes(data))
  assert run_lib.snapshot_identity(str(here)) == identity
  after = run_lib.snapshot_contents(str(here), cache)
  assert after != before
  results = str(tmp_path / "results.json")
  record = dict(name="ce-s0", group="main", snapshot="qwen2_tiny")
  results_io.save_results(
      results,
      [
          dict(record, snapshot_sha256=before, config_hash="a"),
          dict(record, name="ce-s1", config_hash="b"),  # before the digests
      ],
  )
  settings = dict(pretrained=str(here))
  run_lib.check_same_snapshot(results, settings, before)
  with pytest.raises(app.UsageError, match="other weights") as error:
    run_lib.check_same_snapshot(results, settings, after)
  assert "ce-s0" in str(error.value) and "ce-s1" not in str(error.value)


def _copy_fixture(tmp_path, name="qwen2_tiny"):
  here = tmp_path / name
  shutil.copytree(ROOT / "tests" / "fixtures" / "hf" / name, here)
  return here


def test_another_tokenizer_is_another_snapshot(tmp_path):
  """The identity covers the tokenizer (version 2); cells recorded before
  keep their version-1 hashes."""
  import pytest  # pylint: disable=g-import-not-at-top
  from absl import app  # pylint: disable=g-import-not-at-top
  from experiments.arithmetic_mix import run as run_lib  # pylint: disable=g-import-not-at-top

  here = _copy_fixture(tmp_path)
  cache = str(tmp_path / "runs" / ".snapshot_digests.json")
  # What the recorded cells were hashed and checked with, unchanged.
  assert run_lib.snapshot_identity(str(here), 1) == "qwen2_tiny@e827fe4f8a9e"
  assert run_lib.snapshot_contents(str(here), cache) == (
      "a3a2323ab2a99cc7921886382d4ae84768cc0dd94452ee86e071bc5f43896a4b"
  )
  settings = dict(run_lib.LLM_PROFILES["llm_smoke"], pretrained=str(here))
  settings["train_size"] = settings["train_steps"] * settings["batch_size"]
  config = run_lib.llm_cell_config(settings, "ce", 0, "data")
  before = run_lib.snapshot_files(str(here), cache)
  hashes = [
      run_lib.llm_hash(config, "llm_smoke", settings, version)
      for version in (1, 2)
  ]
  tokenizer = here / "tokenizer.json"
  tokenizer.write_text(tokenizer.read_text().replace('"!"', '"!!"', 1))
  after = run_lib.snapshot_files(str(here), cache)
  assert [n for n in before if before[n] != after[n]] == ["tokenizer.json"]
  assert run_lib.llm_hash(config, "llm_smoke", settings, 1) == hashes[0]
  assert run_lib.llm_hash(config, "llm_smoke", settings) != hashes[1]

  # A cell recorded before version 2 stays done; any other is hashed anew.
  def cell_hash(legacy):
    return run_lib.llm_cell_hash(
        run_lib.llm_hash, config, "llm_smoke", settings, legacy
    )

  assert cell_hash({hashes[0]}) == hashes[0]
  assert cell_hash(set()) == run_lib.llm_hash(config, "llm_smoke", settings)
  # Results holding the other tokenizer's cells are refused, naming it.
  contents = run_lib.snapshot_contents(str(here), cache)
  results = str(tmp_path / "results.json")
  record = dict(name="ce-s0", group="main", snapshot="qwen2_tiny")
  results_io.save_results(
      results,
      [
          dict(
              record,
              snapshot_sha256=contents,
              snapshot_files=before,
              config_hash="a",
          ),
          dict(  # made before version 2
              record, name="ce-s1", snapshot_sha256=contents, config_hash="b"
          ),
      ],
  )
  assert run_lib.legacy_hashes(results) == {"b"}
  # Kept as done, but never silently: the grid warns, naming the cells.
  notice = run_lib.legacy_notice(results, "qwen2_tiny")
  assert "1 cell(s) of qwen2_tiny" in notice and "(ce-s1)" in notice
  assert "tokenizer" in notice and "Delete their records" in notice
  assert run_lib.legacy_notice(results, "another_snapshot") is None
  with pytest.raises(app.UsageError, match="tokenizer.json differ") as error:
    run_lib.check_same_snapshot(results, settings, contents, after)
  assert "ce-s0" in str(error.value) and "ce-s1" not in str(error.value)
  run_lib.check_same_snapshot(results, settings, contents, before)


def test_flags_and_snapshot_are_checked_before_any_work(tmp_path, monkeypatch):
  """A snapshot without single-digit tokens, or a bad seed, is refused
  before the data is generated and the zero-shot cell runs (a ConfigError
  or UsageError: one error: line, exit status 2)."""
  import pytest  # pylint: disable=g-import-not-at-top
  from absl import app  # pylint: disable=g-import-not-at-top
  from absl import flags  # pylint: disable=g-import-not-at-top
  from absl.testing import flagsaver  # pylint: disable=g-import-not-at-top
  from experiments.arithmetic_mix import run as run_lib  # pylint: disable=g-import-not-at-top
  from train import errors  # pylint: disable=g-import-not-at-top

  here = _copy_fixture(tmp_path)
  tokenizer = json.loads((here / "tokenizer.json").read_text())
  vocab = tokenizer["model"]["vocab"]
  vocab["<seven>"] = vocab.pop("7")
  (here / "tokenizer.json").write_text(json.dumps(tokenizer))

  def work(*args, **kwargs):
    raise AssertionError(f"work started: {args} {kwargs}")

  monkeypatch.setattr(run_lib.arithmetic_data, "prepare", work)
  monkeypatch.setattr(run_lib, "snapshot_files", work)
  flags.FLAGS.mark_as_parsed()
  where = dict(
      profile="llm_smoke",
      results=str(tmp_path / "results.json"),
      runs_dir=str(tmp_path / "runs"),
  )
  with flagsaver.flagsaver(**where, seeds=["0", "-1"]):
    with pytest.raises(app.UsageError, match=r"-1 not in \[0, 2\*\*32\)"):
      run_lib.run_llm("llm_smoke")
  with flagsaver.flagsaver(**where, pretrained=str(here)):
    with pytest.raises(errors.ConfigError, match="tokenizer.json: .*'7'"):
      run_lib.run_llm("llm_smoke")
