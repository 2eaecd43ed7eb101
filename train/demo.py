r"""The main job on an embedded default: CE vs CE + NTIL reading clocks.

  python -m train.demo --workdir=workdirs/demo

Renders analog clocks locally (if not there yet: about 40 s), trains the
same small model twice from the same seed, once with CE and once with
CE + 0.3 NTIL (about 80 s each on 2 CPU cores), and prints both runs' exact
match and time gap. Writes into the workdir:

* ``predictions.png``: test clocks with both runs' readings, errors marked;
* ``curves.png``: exact match and time gap against step, both runs.

Running it again resumes the runs (or, if they are done, re-evaluates),
loading the compiled programs kept in ``<workdir>/compilation_cache``.
The full comparison (five losses, five seeds, controls, ablations) is
``python -m experiments.clock_time.run``.
"""

import os

from absl import app
from absl import flags
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

from configs import clock_time
from train import compile_cache
from train import logs
from train import plots
from train import schedule
from train import train
from train.tasks import clock_time as task

FLAGS = flags.FLAGS
flags.DEFINE_string("workdir", "workdirs/demo", "Where the runs go.")
flags.DEFINE_string("data_dir", "data", "Where the rendered clocks go.")
flags.DEFINE_integer("train_size", 20000, "Rendered training clocks.")
flags.DEFINE_integer("test_size", 1000, "Rendered test clocks.")
flags.DEFINE_integer("steps", 600, "Training steps (~8 steps/s on 2 cores).")
flags.DEFINE_integer("seed", 0, "Seed of both runs (init and data order).")
flags.DEFINE_bool(
    "start_over",
    False,
    "Move earlier runs in --workdir aside (to <run>/previous-runs/<date>) "
    "instead of resuming them.",
)

METHODS = (("ce", "CE"), ("ntil", "CE + NTIL"))


def demo_config(method):
  config = clock_time.get_config(method)
  config.data_dir = FLAGS.data_dir
  config.dataset_config = task.config_name(FLAGS.train_size, FLAGS.test_size)
  config.train_steps = FLAGS.steps
  # A short demo keeps a warmup shorter than its run (one tenth at most).
  config.warmup_steps = schedule.short_run_warmup(
      config.warmup_steps, FLAGS.steps
  )
  config.seed = FLAGS.seed
  config.eval_every_steps = max(1, FLAGS.steps // 4)
  config.checkpoint_every_steps = max(1, FLAGS.steps // 2)
  config.eval_examples = 0
  config.num_samples = 0
  return config


def plot_curves(workdirs, path):
  fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
  for (method, label), workdir in zip(METHODS, workdirs):
    _, evals = plots.read_metrics(os.path.join(workdir, "metrics.jsonl"))
    steps = [r["step"] for r in evals]
    axes[0].plot(
        steps, [100 * r["exact_match"] for r in evals], marker="o", label=label
    )
    axes[1].plot(
        steps,
        [r["mean_time_gap_minutes"] for r in evals],
        marker="o",
        label=label,
    )
    del method
  axes[0].set_ylabel("test exact match (%)")
  axes[1].set_ylabel("mean time gap (minutes)")
  axes[1].set_yscale("log")
  for ax in axes:
    ax.set_xlabel("step")
    ax.grid(alpha=0.3)
    ax.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)
  return path


def main(argv):
  del argv
  logs.quiet_terminal()
  compile_cache.use_persistent_cache(
      os.path.join(FLAGS.workdir, compile_cache.WORKDIR_FOLDER)
  )
  print(
      f"rendering {FLAGS.train_size} + {FLAGS.test_size} clocks into "
      f"{FLAGS.data_dir} (skipped if there)",
      flush=True,
  )
  task.prepare(FLAGS.data_dir, FLAGS.train_size, FLAGS.test_size)
  results, workdirs = {}, []
  for method, label in METHODS:
    workdir = os.path.join(FLAGS.workdir, method)
    print(f"training {label} for {FLAGS.steps} steps -> {workdir}", flush=True)
    with train.exit_on_error():
      results[method] = train.train_and_evaluate(
          demo_config(method), workdir, start_over=FLAGS.start_over
      )
    train.exit_if_stopped(results[method])
    workdirs.append(workdir)
  clocks = list(task.generate_clocks("test", FLAGS.test_size, 0))
  predictions = {
      label: train.read_predictions(workdir)
      for (_, label), workdir in zip(METHODS, workdirs)
  }
  ce, ntil = predictions["CE"], predictions["CE + NTIL"]
  differ = [i for i in range(len(clocks)) if ce[i] != ntil[i]]
  chosen = (
      differ[:14] + [i for i in range(len(clocks)) if i not in set(differ)][:4]
  )[:18]
  picture = plots.plot_clock_predictions(
      [clocks[i][0] for i in chosen],
      [clocks[i][1] for i in chosen],
      {label: [p[i] for i in chosen] for label, p in predictions.items()},
      os.path.join(FLAGS.workdir, "predictions.png"),
      title=f"test clocks, seed {FLAGS.seed} (x: wrong); first those where "
      "the runs disagree",
  )
  curves = plot_curves(workdirs, os.path.join(FLAGS.workdir, "curves.png"))
  print(
      f"\n{FLAGS.test_size} test clocks, seed {FLAGS.seed}, "
      f"{FLAGS.steps} steps:"
  )
  for method, label in METHODS:
    metrics = results[method]["eval"]
    print(
        f"  {label:10s} exact match {100 * metrics['exact_match']:5.1f}%  "
        f"mean time gap {metrics['mean_time_gap_minutes']:5.1f} min  "
        f"hour right {100 * metrics['hour_accuracy']:5.1f}%  "
        f"within 5 min {100 * metrics['within_5_minutes']:5.1f}%"
    )
  print(
      f"  the runs read {len(differ)} of {len(clocks)} clocks differently."
      "\n  One seed is one sample: see experiments/clock_time/results.md "
      "for 5 paired seeds."
  )
  print(f"pictures: {picture}\n          {curves}")


if __name__ == "__main__":
  app.run(main)
