"""The docstrings' examples run and print what they say (doctest)."""

import doctest
import importlib

import pytest

# Modules whose docstrings hold examples; each must keep at least one.
MODULES = (
    "ntil_jax.ntil",
    "ntil_jax.arrays",
    "ntil_jax.baselines",
    "ntil_jax.vocab",
    "ntil_jax.losses",
    "ntil_jax.numbers",
    "ntil_jax.statistics",
    "ntil_jax.fused",
    "ntil_jax.kernels.chunked",
    "ntil_jax.digit_entropy",
    "ntil_jax.smmd",
    "ntil_jax.number_level",
    "train.tokenizer",
    "train.models",
    "train.schedule",
    "experiments.tables",
)


@pytest.mark.parametrize("name", MODULES)
def test_examples_run_and_print_what_they_say(name):
  module = importlib.import_module(name)
  result = doctest.testmod(
      module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
  )
  assert result.attempted > 0, f"{name} has no examples"
  assert result.failed == 0, f"{result.failed} example(s) of {name} failed"


def test_every_public_function_of_ntil_jax_has_an_example():
  import inspect  # pylint: disable=g-import-not-at-top

  import ntil_jax  # pylint: disable=g-import-not-at-top

  functions = [
      name
      for name in ntil_jax.__all__
      if inspect.isfunction(getattr(ntil_jax, name))
  ]
  assert len(functions) >= 18, functions
  missing = [
      name
      for name in functions
      if ">>> " not in (getattr(ntil_jax, name).__doc__ or "")
  ]
  assert not missing, missing
  # Each example is run: its module is one of MODULES.
  modules = {getattr(ntil_jax, name).__module__ for name in functions}
  assert modules <= set(MODULES), modules - set(MODULES)
