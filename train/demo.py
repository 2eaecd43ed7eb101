r"""The main job on an embedded default: NTIL on arithmetic_mix, a few minutes.

  python -m train.demo --workdir=workdirs/demo

Generates a small arithmetic_mix dataset locally (if not there yet), trains
the tiny model with CE + 0.3 NTIL on the CPU, prints exact match and sample
predictions, and writes a loss-curve PNG into the workdir. Running it again
resumes (or, if finished, just re-evaluates nothing and re-plots).
"""

import os

from absl import app
from absl import flags
from absl import logging

from configs import arithmetic_mix
from train import plots
from train import prepare_data
from train import train

FLAGS = flags.FLAGS
flags.DEFINE_string("workdir", "workdirs/demo", "Where the run goes.")
flags.DEFINE_string("data_dir", "data", "Where the generated data goes.")
flags.DEFINE_integer("train_size", 20000, "Generated training problems.")
flags.DEFINE_integer("test_size", 500, "Generated test problems.")
flags.DEFINE_integer("steps", 1500, "Training steps (~8 steps/s on 2 cores).")
flags.DEFINE_string("method", "ntil", "Loss method.")


def demo_config():
  config = arithmetic_mix.get_config(FLAGS.method)
  config.data_dir = FLAGS.data_dir
  config.dataset_config = prepare_data.config_name(FLAGS.train_size,
                                                   FLAGS.test_size, 0)
  config.model = "tiny"
  config.batch_size = 64
  config.learning_rate = 3e-3
  config.train_steps = FLAGS.steps
  config.log_every_steps = 25
  config.eval_every_steps = 500
  config.checkpoint_every_steps = 500
  config.eval_examples = FLAGS.test_size
  return config


def main(argv):
  del argv
  train.quiet_library_logs()
  logging.info("generating %d + %d problems into %s (skipped if present)",
               FLAGS.train_size, FLAGS.test_size, FLAGS.data_dir)
  prepare_data.prepare(FLAGS.data_dir, FLAGS.train_size, FLAGS.test_size)
  result = train.train_and_evaluate(demo_config(), FLAGS.workdir)
  png = plots.plot_training(
      os.path.join(FLAGS.workdir, "metrics.jsonl"),
      os.path.join(FLAGS.workdir, "loss_curve.png"),
      title=f"tiny model, CE + 0.3 {FLAGS.method.upper()}, arithmetic_mix")
  if result["eval"]:
    print(f"\nexact match after {result['step']} steps: "
          f"{100 * result['eval']['exact_match']:.1f}% of "
          f"{result['eval']['num_examples']} test problems")
  print(f"loss curve: {png}")


if __name__ == "__main__":
  app.run(main)
