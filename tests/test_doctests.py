"""The docstrings' examples run and print what they say (doctest)."""

import doctest
import importlib

import pytest

# Modules whose docstrings hold examples; each must keep at least one.
MODULES = (
    "ntil_jax.ntil",
    "ntil_jax.baselines",
    "ntil_jax.vocab",
    "ntil_jax.losses",
    "ntil_jax.numbers",
    "ntil_jax.statistics",
    "ntil_jax.fused",
    "train.tokenizer",
    "train.models",
)


@pytest.mark.parametrize("name", MODULES)
def test_examples_run_and_print_what_they_say(name):
  module = importlib.import_module(name)
  result = doctest.testmod(
      module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
  )
  assert result.attempted > 0, f"{name} has no examples"
  assert result.failed == 0, f"{result.failed} example(s) of {name} failed"
