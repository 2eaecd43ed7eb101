"""train.step: which loss path ``fused_loss`` picks, and its checks."""

from flax import nnx
import jax
import jax.numpy as jnp
import ml_collections
import pytest

from configs import arithmetic_mix
from configs import arithmetic_mix_llm
from train import checks
from train import errors
from train import step

GIB = 2**30


@pytest.mark.parametrize(
    "value, mode",
    [
        (True, True),
        (False, False),
        ("auto", "auto"),
        ("AUTO", "auto"),
        ("True", True),
        (" false ", False),
        ("chunked", "chunked"),
        ("Tokamax", "tokamax"),
        ("tokamax:xla", "tokamax:xla"),
    ],
)
def test_fused_mode_accepts_bools_and_their_spellings(value, mode):
  assert step.fused_mode(value) is mode or step.fused_mode(value) == mode


@pytest.mark.parametrize("value", ["yes", "", 1, None, 0.5, "tokamax:gpu"])
def test_fused_mode_refuses_anything_else(value):
  with pytest.raises(ValueError, match="fused_loss must be True, False,"):
    step.fused_mode(value)


def test_logits_bytes_per_device_by_hand():
  # 8192 tokens x 151,936 logits x (4 bytes logits + 4 bytes gradient).
  assert step.logits_bytes_per_device(8192, 151936, 1) == 8192 * 151936 * 8
  # Split over 8 devices, rounded up to whole tokens.
  assert step.logits_bytes_per_device(8193, 100, 8) == 1025 * 100 * 8


def _config(fused_loss):
  config = ml_collections.ConfigDict()
  config.fused_loss = fused_loss
  return config


def test_auto_takes_the_logits_path_where_they_fit():
  # Qwen2.5's V at batch 64 x 128 tokens on an 80 GiB device: 10 GB of
  # logits and gradient, under a quarter of the device.
  assert not step.use_fused_loss(
      _config("auto"), 64 * 128, 151936, devices=1, memory=80 * GIB
  )


def test_auto_takes_the_fused_path_where_they_do_not():
  # Four times the tokens: 40 GB, over a quarter of 80 GiB.
  assert step.use_fused_loss(
      _config("auto"), 4 * 64 * 128, 151936, devices=1, memory=80 * GIB
  )
  # ... unless the batch is split over enough devices.
  assert not step.use_fused_loss(
      _config("auto"), 4 * 64 * 128, 151936, devices=4, memory=80 * GIB
  )


@pytest.mark.parametrize(
    "value, implementation",
    [
        (True, None),
        ("auto", None),
        ("chunked", "chunked"),
        ("tokamax", "tokamax"),
    ],
)
def test_implementation_names_take_the_fused_path(value, implementation):
  assert step.common.fused_implementation(value) == implementation
  if implementation is not None:
    assert step.use_fused_loss(_config(value), 8, 151936, memory=10**15)


def test_chunk_size_with_tokamax_is_a_config_error():
  config = arithmetic_mix.get_config("ntil")
  config.fused_loss = "tokamax"
  config.fused_chunk_size = 64
  with pytest.raises(errors.ConfigError, match="chunk_size applies"):
    checks.check_config(config)
  # With 'chunked' the chunk size passes: the next check is the data's.
  config.fused_loss = "chunked"
  with pytest.raises(errors.ConfigError, match="no data"):
    checks.check_config(config)


@pytest.mark.parametrize("forced", [True, False])
def test_true_and_false_ignore_memory(forced):
  for memory in (1, 10**15):
    assert (
        step.use_fused_loss(
            _config(forced), 4096, 151936, devices=1, memory=memory
        )
        is forced
    )


def test_device_memory_is_positive():
  assert step.device_memory_bytes() > 2**20


def test_llm_config_defaults_to_auto():
  assert arithmetic_mix_llm.get_config("ntil").fused_loss == "auto"


@pytest.mark.parametrize("seed", [-1, 2**32])
def test_seed_out_of_range_is_a_config_error(seed):
  """Before anything is built or compiled, not from the data pipeline."""
  config = arithmetic_mix.get_config("ntil")
  config.seed = seed
  with pytest.raises(
      errors.ConfigError, match=r"seed must be in \[0, 2\*\*32\)"
  ):
    checks.check_config(config)


def test_bad_fused_loss_is_a_config_error():
  config = arithmetic_mix.get_config("ntil")
  with config.ignore_type():
    config.fused_loss = "sometimes"
  with pytest.raises(errors.ConfigError, match="fused_loss must be"):
    checks.check_config(config)


def test_model_config_takes_both_dtypes():
  """``dtype`` is the computation's, ``param_dtype`` the parameters'."""
  from train import models  # pylint: disable=g-import-not-at-top
  from train import tasks  # pylint: disable=g-import-not-at-top

  config = arithmetic_mix.get_config("ce")
  config.model = "tiny"
  config.dtype = "bfloat16"
  assert config.param_dtype == "float32"  # the default: master weights
  model_config = step.model_config(config, tasks.get(config.task))
  model = models.create_model(model_config, nnx.Rngs(params=0))
  params = nnx.state(model, nnx.Param)
  assert {p.dtype for p in jax.tree.leaves(params)} == {jnp.dtype(jnp.float32)}
  assert jnp.dtype(model_config.dtype) == jnp.bfloat16
  config.param_dtype = "bfloat16"
  model_config = step.model_config(config, tasks.get(config.task))
  model = models.create_model(model_config, nnx.Rngs(params=0))
  params = nnx.state(model, nnx.Param)
  assert {p.dtype for p in jax.tree.leaves(params)} == {jnp.dtype(jnp.bfloat16)}
