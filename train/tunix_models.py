"""tunix's Flax NNX models (Qwen2, Llama 3), imported without side effects.

Importing a tunix model module changes a flax flag for the whole process;
:func:`module` imports one and :func:`flags` runs its code with that flag,
putting the old value back afterwards.
"""

import contextlib
import importlib

import flax


@contextlib.contextmanager
def flags():
  """Runs tunix's model code with the flax flags it sets, then restores them.

  Importing a tunix model module turns flax's ``flax_always_shard_variable``
  off for the whole process; `train.models` creates sharded variables with
  it on, so the old value comes back afterwards.
  """
  previous = flax.config.flax_always_shard_variable
  flax.config.update("flax_always_shard_variable", False)
  try:
    yield
  finally:
    flax.config.update("flax_always_shard_variable", previous)


def module(name: str):
  """``tunix.models.<name>``, imported without changing flax's flags."""
  with flags():
    return importlib.import_module(f"tunix.models.{name}")
