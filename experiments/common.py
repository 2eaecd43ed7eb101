"""What the experiment grids share: resumable results files and run records."""

import hashlib
import json
import os
import time

from absl import logging
import jax

from train import plots
from train import train


def config_hash(config, profile, settings) -> str:
  """A short digest of everything that determines a run's result."""
  text = json.dumps(
      dict(config=config.to_dict(), profile=profile, data=settings),
      sort_keys=True,
      default=str,
  )
  return hashlib.sha256(text.encode()).hexdigest()[:12]


def load_results(path):
  if not os.path.exists(path):
    return []
  with open(path) as f:
    return json.load(f)["runs"]


def save_results(path, runs):
  temporary = path + ".tmp"
  with open(temporary, "w") as f:
    json.dump(dict(runs=runs), f, indent=1)
  os.replace(temporary, path)  # never a half-written file


def curves(metrics_path, eval_keys=("exact_match",)):
  """Loss/CE per log and the eval metrics per eval, for report plots."""
  train_records, eval_records = plots.read_metrics(metrics_path)
  result = dict(
      steps=[r["step"] for r in train_records],
      loss=[round(r["loss"], 5) for r in train_records],
      ce=[round(r["ce"], 5) for r in train_records],
      eval_steps=[r["step"] for r in eval_records],
  )
  for key in eval_keys:
    result[key] = [r[key] for r in eval_records]
  return result


def train_once(config, workdir):
  """Trains one run to the end; (result, wall seconds). Resumes if it can."""
  start = time.time()
  result = train.train_and_evaluate(config, workdir)
  if result["stopped_early"]:
    raise KeyboardInterrupt(f"{workdir} stopped by a signal; rerun to resume")
  return result, round(time.time() - start, 1)


def run_grid(todo, configure, execute, describe, results_path, *, max_runs=0):
  """Runs each cell of ``todo`` whose config hash is not yet recorded.

  Args:
    todo: the cells, in run order.
    configure: cell -> config hash.
    execute: (cell, hash) -> the run's record (a dict with 'config_hash').
    describe: record -> one line for the progress log.
    results_path: results.json; every finished record is saved at once.
    max_runs: stop after this many new runs (0: no limit).
  """
  # Runs of one shape share compiled steps across seeds and restarts.
  jax.config.update(
      "jax_compilation_cache_dir",
      os.path.join(os.path.dirname(results_path), ".jax_cache"),
  )
  runs = load_results(results_path)
  done = {r["config_hash"] for r in runs}
  new, start = 0, time.time()
  pending = [cell for cell in todo if configure(cell) not in done]
  logging.info("%d of %d runs to do", len(pending), len(todo))
  for index, cell in enumerate(pending):
    if max_runs and new >= max_runs:
      break
    record = execute(cell, configure(cell))
    runs.append(record)
    save_results(results_path, runs)
    new += 1
    per_run = (time.time() - start) / new
    print(
        f"[{index + 1}/{len(pending)}] {describe(record)} "
        f"({record['wall_seconds']:.0f}s; ETA "
        f"{per_run * (len(pending) - index - 1) / 60:.0f} min)",
        flush=True,
    )
  print(f"{len(runs)} runs in {results_path}", flush=True)
