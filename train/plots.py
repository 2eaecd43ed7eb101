"""Plots from metrics.jsonl files (matplotlib, no display needed)."""

import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
import numpy as np


def read_metrics(path):
  """(train records, eval records) of a metrics.jsonl file."""
  with open(path) as f:
    records = [json.loads(line) for line in f]
  return ([r for r in records if "loss" in r],
          [r for r in records if "exact_match" in r])


def smooth(values, window):
  """Trailing moving average (window clipped at the start)."""
  values = np.asarray(values, float)
  cumulative = np.cumsum(np.insert(values, 0, 0.0))
  starts = np.maximum(np.arange(1, len(values) + 1) - window, 0)
  return (cumulative[1:] - cumulative[starts]) / (np.arange(1, len(values) + 1)
                                                   - starts)


def plot_training(metrics_path, out_path, title=""):
  """Loss, CE and exact match over steps of one run, saved as a PNG."""
  train, evals = read_metrics(metrics_path)
  steps = [r["step"] for r in train]
  window = max(1, len(steps) // 25)
  fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.6))
  for key, label in (("loss", "total loss"), ("ce", "cross-entropy")):
    left.plot(steps, smooth([r[key] for r in train], window), label=label)
  left.set_xlabel("step")
  left.set_ylabel(f"per answer token (moving avg, {window} logs)")
  left.legend()
  left.grid(alpha=0.3)
  if evals:
    right.plot([r["step"] for r in evals],
               [100 * r["exact_match"] for r in evals], marker="o")
  right.set_xlabel("step")
  right.set_ylabel("exact match on test (%)")
  right.grid(alpha=0.3)
  fig.suptitle(title)
  fig.tight_layout()
  fig.savefig(out_path, dpi=110)
  plt.close(fig)
  return out_path
