r"""Train on a task (train/tasks: arithmetic_mix, clock_time, grounding, ...).

  python -m train.prepare_data --data_dir=data --train_size=20000 --test_size=1000
  python -m train.main --config=configs/arithmetic_mix.py:ntil --workdir=W \
      --config.data_dir=data --config.model=tiny --config.train_steps=500

  python -m train.prepare_data --task=clock_time --data_dir=data \
      --train_size=20000 --test_size=1000
  python -m train.main --config=configs/clock_time.py:ntil --workdir=W2 \
      --config.data_dir=data

Running the same command again resumes from the newest checkpoint in W; a
changed config is refused (exit 2, W untouched) unless only the schedule's
length or the cadence of logs, evals and saves changed. --start_over moves
the old run aside to W/previous-runs/<date> and starts afresh. Compiled
programs are kept in W/compilation_cache (--compilation_cache_dir), so a
resumed run loads its steps instead of compiling them again.
Several hosts: start one process per host with --coordinator_address,
--num_processes and --process_id (jax.distributed).
"""

import os
import re
import sys

from absl import app
from absl import flags
from absl import logging
import jax
from ml_collections import config_flags

from train import compile_cache
from train import logs
from train import train

FLAGS = flags.FLAGS
flags.DEFINE_string("workdir", None, "Where checkpoints and metrics go.")
config_flags.DEFINE_config_file(
    "config",
    None,
    "Training configuration, e.g. configs/arithmetic_mix.py:ntil",
    lock_config=True,
)
flags.DEFINE_string(
    "coordinator_address",
    None,
    "host:port of process 0, for multi-host training.",
)
flags.DEFINE_integer("num_processes", None, "Number of processes (hosts).")
flags.DEFINE_integer("process_id", None, "This process's index.")
flags.DEFINE_bool(
    "start_over",
    False,
    "Move the run in --workdir aside (to workdir/previous-runs/<date>) and "
    "start afresh, instead of resuming it.",
)
flags.DEFINE_string(
    "compilation_cache_dir",
    None,
    "Where compiled programs are kept, so that a resumed run loads its "
    "train and eval steps instead of compiling them again (JAX's persistent "
    "compilation cache). Default: JAX_COMPILATION_CACHE_DIR if set, else "
    "workdir/compilation_cache; an empty value turns it off.",
)
flags.mark_flags_as_required(["config", "workdir"])


def parse_flags(argv):
  """absl's parsing, with a bad flag or config reported in one line."""
  try:
    argv = FLAGS(argv)
    # config_flags reports a config file it could not load (missing, or
    # failing on import) only when the config is first read.
    getattr(FLAGS.config, "task", None)
    return argv
  except (flags.Error, OSError) as error:
    # config_flags embeds the config file's traceback; its last line is
    # the message that says what is wrong.
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    message = lines[-1] if lines else type(error).__name__
    print(f"error: {message.removeprefix('ValueError: ')}", file=sys.stderr)
    sys.exit(2)
  except AttributeError as error:  # --config.FIELD for a field that is not
    # ml_collections' KeyError message, quoted again: the name and its hint.
    raw = str(error.args[0] if error.args else error)
    raw = raw.replace("\\n", "\n").replace("\\'", "'")
    name, hint = re.fullmatch(r"['\"]*([\w.]*)['\"]*(.*)", raw, re.S).groups()
    hint = " ".join(hint.strip("'\" \n").split())
    print(
        f"error: unknown config field {name!r}"
        + (f" ({hint})" if hint else "")
        + "; see configs/common.py and the task's config",
        file=sys.stderr,
    )
    sys.exit(2)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  logs.quiet_terminal()
  logs.quiet_thread_errors()
  if FLAGS.coordinator_address:
    jax.distributed.initialize(
        coordinator_address=FLAGS.coordinator_address,
        num_processes=FLAGS.num_processes,
        process_id=FLAGS.process_id,
    )
  compile_cache.use_persistent_cache(
      os.path.join(FLAGS.workdir, compile_cache.WORKDIR_FOLDER),
      FLAGS.compilation_cache_dir,
  )
  logging.info(
      "JAX process %d/%d, %d local devices: %s",
      jax.process_index(),
      jax.process_count(),
      jax.local_device_count(),
      jax.devices()[0].device_kind,
  )
  with train.exit_on_error():
    result = train.train_and_evaluate(
        FLAGS.config, FLAGS.workdir, start_over=FLAGS.start_over
    )
  train.exit_if_stopped(result)
  if result["eval"]:
    print(
        f"step {result['step']}: "
        f"{train.get_task(FLAGS.config).headline(result['eval'])}"
    )


if __name__ == "__main__":
  app.run(main, flags_parser=parse_flags)
