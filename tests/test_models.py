"""Tests for train/models.py: shapes, causality, RoPE, decoding, sharding."""

import json
import os
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from train import decoding
from train import layers
from train import models

from tests import launch

VOCAB_SIZE = 99  # As train/tokenizer.py: odd-sized, so never sharded.
MAX_LEN = 32
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _tiny_config(**overrides):
  return models.model_config(
      "tiny", vocab_size=VOCAB_SIZE, max_len=MAX_LEN, **overrides
  )


@pytest.fixture(scope="module")
def tiny_model():
  return models.create_model(_tiny_config(), nnx.Rngs(0))


# The model's calls, each compiled as one program: run op by op, one call
# compiled dozens of small programs.
_forward = nnx.jit(lambda model, tokens: model(tokens))
_hidden_states = nnx.jit(lambda model, tokens: model.hidden_states(tokens))
_prefill = nnx.jit(lambda model, tokens: model.prefill(tokens))
_extend = nnx.jit(
    lambda model, tokens, positions, cache: model.extend(
        tokens, positions, cache
    )
)


def _random_tokens(seed, shape):
  return jax.random.randint(
      jax.random.key(seed), shape, 0, VOCAB_SIZE, dtype=jnp.int32
  )


# ----------------------------------------------------------------------------
# Configs and parameter counts.


def test_unknown_size_lists_valid_sizes():
  valid = "'base', 'large', 'small', 'tiny'"
  with pytest.raises(ValueError, match=f"huge.*{valid}"):
    models.model_config("huge", vocab_size=VOCAB_SIZE, max_len=MAX_LEN)


def test_unknown_override_is_rejected():
  with pytest.raises(ValueError, match="num_experts"):
    models.model_config("tiny", VOCAB_SIZE, MAX_LEN, num_experts=4)


def test_overrides_replace_size_defaults():
  config = models.model_config(
      "small", VOCAB_SIZE, 128, num_layers=1, dtype=jnp.bfloat16
  )
  assert (config.num_layers, config.embed_dim, config.dtype) == (
      1,
      models.MODEL_SIZES["small"]["embed_dim"],
      jnp.bfloat16,
  )


def test_odd_head_dim_is_rejected():
  with pytest.raises(ValueError, match="head_dim must be even"):
    _tiny_config(head_dim=15)


def _expected_param_count(config):
  """Counted by hand from the architecture in the module docstring."""
  d, v = config.embed_dim, config.vocab_size
  attention = 4 * d * config.num_heads * config.head_dim
  mlp = 3 * d * config.mlp_dim
  norms = 2 * d
  return 2 * v * d + config.num_layers * (attention + mlp + norms) + d


@pytest.mark.parametrize(
    "size, low, high",
    [
        ("tiny", 5e4, 2e5),
        ("small", 1e6, 3e6),
        ("base", 2e7, 3e7),
        ("large", 8e7, 1.2e8),
    ],
)
def test_param_counts(size, low, high):
  config = models.model_config(size, VOCAB_SIZE, 512)
  # eval_shape: no memory or compute for the large sizes.
  model = nnx.eval_shape(lambda: models.Transformer(config, rngs=nnx.Rngs(0)))
  count = models.count_params(model)
  assert count == _expected_param_count(config)
  assert low <= count <= high


# ----------------------------------------------------------------------------
# Forward pass.


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_output_shapes_and_dtypes(dtype):
  config = _tiny_config(dtype=dtype)
  model = models.create_model(config, nnx.Rngs(0))
  tokens = _random_tokens(1, (3, 11))
  logits = _forward(model, tokens)
  hidden = _hidden_states(model, tokens)
  assert logits.shape == (3, 11, VOCAB_SIZE) and logits.dtype == jnp.float32
  assert hidden.shape == (3, 11, config.embed_dim)
  assert hidden.dtype == jnp.float32
  assert model.unembedding.shape == (config.embed_dim, VOCAB_SIZE)
  assert np.all(np.isfinite(logits))


def test_bad_token_shapes_raise(tiny_model):
  with pytest.raises(ValueError, match=r"\[B, L\]"):
    tiny_model(jnp.zeros((4,), jnp.int32))
  with pytest.raises(ValueError, match="max_len"):
    tiny_model(jnp.zeros((1, MAX_LEN + 1), jnp.int32))


def test_changing_a_token_changes_only_later_logits(tiny_model):
  tokens = _random_tokens(2, (2, 12))
  changed_at = 7
  replacement = (tokens[:, changed_at] + 1) % VOCAB_SIZE
  edited = tokens.at[:, changed_at].set(replacement)
  logits = np.asarray(_forward(tiny_model, tokens))
  edited_logits = np.asarray(_forward(tiny_model, edited))
  np.testing.assert_array_equal(
      logits[:, :changed_at], edited_logits[:, :changed_at]
  )
  # The edit is visible from its own position on: the check above has teeth.
  later_change = np.abs(logits[:, changed_at:] - edited_logits[:, changed_at:])
  assert np.all(later_change.max(axis=-1) > 1e-4)


def test_hidden_states_times_unembedding_is_logits(tiny_model):
  tokens = _random_tokens(3, (2, 9))
  hidden = _hidden_states(tiny_model, tokens)
  np.testing.assert_allclose(
      hidden @ tiny_model.unembedding,
      _forward(tiny_model, tokens),
      rtol=1e-6,
      atol=1e-6,
  )


def test_jit_matches_eager(tiny_model):
  tokens = _random_tokens(4, (2, 9))
  jitted = nnx.jit(lambda model, tokens: model(tokens))(tiny_model, tokens)
  np.testing.assert_allclose(jitted, tiny_model(tokens), rtol=1e-5, atol=1e-5)


def test_dropout_is_random_in_train_mode_only():
  model = models.create_model(
      _tiny_config(dropout_rate=0.5), nnx.Rngs(params=0, dropout=1)
  )
  tokens = _random_tokens(5, (2, 9))
  model.train()
  assert not np.allclose(model(tokens), model(tokens))
  model.eval()
  np.testing.assert_array_equal(model(tokens), model(tokens))


# ----------------------------------------------------------------------------
# Rotary position embedding.


def _rope_oracle(x, positions, base=models.ROPE_BASE):
  """float64 RoPE: multiply (x_i + i x_{i+K/2}) by exp(i * pos * freq_i)."""
  x = np.asarray(x, np.float64)
  half = x.shape[-1] // 2
  out = np.empty_like(x)
  for b in range(x.shape[0]):
    for l in range(x.shape[1]):
      for i in range(half):
        angle = positions[b, l] * base ** (-i / half)
        pair = (x[b, l, :, i] + 1j * x[b, l, :, i + half]) * np.exp(1j * angle)
        out[b, l, :, i], out[b, l, :, i + half] = pair.real, pair.imag
  return out


def test_rope_matches_oracle():
  x = jax.random.normal(jax.random.key(0), (2, 5, 3, 8))
  positions = np.array([[0, 1, 2, 3, 4], [7, 3, 0, 30, 11]])
  np.testing.assert_allclose(
      layers.apply_rope(x, jnp.asarray(positions)),
      _rope_oracle(x, positions),
      rtol=1e-5,
      atol=1e-5,
  )


def test_rope_scores_depend_on_position_difference_only():
  query, key = jax.random.normal(jax.random.key(1), (2, 1, 1, 1, 16))

  def score(query_position, key_position):
    rotated_query = layers.apply_rope(query, jnp.array([[query_position]]))
    rotated_key = layers.apply_rope(key, jnp.array([[key_position]]))
    return float(jnp.sum(rotated_query * rotated_key))

  np.testing.assert_allclose(score(5, 2), score(13, 10), rtol=1e-5)
  assert abs(score(5, 2) - score(5, 4)) > 1e-3


def test_rope_makes_the_model_position_aware(monkeypatch):
  # One layer, no positional signal: the last position's attention sees the
  # prefix as a set, so [a, b, c] and [b, a, c] agree there. RoPE breaks that.
  model = models.create_model(_tiny_config(num_layers=1), nnx.Rngs(0))
  orders = jnp.array([[5, 40, 77], [40, 5, 77]], jnp.int32)

  def last_hidden():
    hidden = np.asarray(model.hidden_states(orders))
    return hidden[0, -1], hidden[1, -1]

  first, swapped = last_hidden()
  assert np.abs(first - swapped).max() > 1e-3
  monkeypatch.setattr(layers, "apply_rope", lambda x, positions: x)
  first, swapped = last_hidden()
  np.testing.assert_allclose(first, swapped, rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------
# Greedy decoding.


def test_extend_from_cache_matches_full_forward(tiny_model):
  tokens = _random_tokens(8, (2, 8))
  full = np.asarray(_hidden_states(tiny_model, tokens))
  # The buffer past the 4 known tokens holds junk that extend overwrites.
  buffer = jnp.concatenate([tokens[:, :4], _random_tokens(9, (2, 4))], axis=1)
  _, cache = _prefill(tiny_model, buffer)
  chunks = [(4, 6), (6, 7), (7, 8)]  # Several tokens at once, or one.
  for start, stop in chunks:
    positions = jnp.broadcast_to(jnp.arange(start, stop), (2, stop - start))
    hidden, cache = _extend(tiny_model, tokens[:, start:stop], positions, cache)
    np.testing.assert_allclose(
        hidden, full[:, start:stop], rtol=1e-5, atol=1e-5
    )


def _naive_greedy(model, prompt, max_new_tokens, eos_id, pad_id):
  """One full forward per token over the unpadded sequence, in Python."""
  sequence = list(prompt)
  generated = []
  while len(generated) < max_new_tokens:
    logits = _forward(model, jnp.array([sequence], jnp.int32))
    token = int(np.argmax(np.asarray(logits[0, -1])))
    generated.append(token)
    sequence.append(token)
    if token == eos_id:
      break
  return generated + [pad_id] * (max_new_tokens - len(generated))


def test_greedy_decode_matches_naive_loop(tiny_model):
  pad_id, max_new_tokens = 10, 4
  prompt_lengths = np.array([2, 4, 6])
  # Junk (not pad) after each prompt: it must be ignored.
  prompts = np.asarray(_random_tokens(6, (3, 6)))
  unpadded = [prompts[b, :n].tolist() for b, n in enumerate(prompt_lengths)]
  never = VOCAB_SIZE  # An EOS id the model cannot emit.
  free_run = [
      _naive_greedy(tiny_model, p, max_new_tokens, never, pad_id)
      for p in unpadded
  ]
  # EOS := a token some row first emits mid-way, so that row stops early.
  eos_id = next(
      row[step]
      for row in free_run
      for step in range(1, 3)
      if row[step] not in row[:step]
  )
  expected = np.array(
      [
          _naive_greedy(tiny_model, p, max_new_tokens, eos_id, pad_id)
          for p in unpadded
      ]
  )
  decode = nnx.jit(decoding.greedy_decode, static_argnums=(3, 4, 5))
  got = decode(
      tiny_model,
      jnp.asarray(prompts),
      jnp.asarray(prompt_lengths),
      max_new_tokens,
      (never, eos_id),  # several end ids: the second one stops the row
      pad_id,
  )
  assert got.dtype == jnp.int32 and got.shape == (3, max_new_tokens)
  np.testing.assert_array_equal(got, expected)
  # The EOS stop was exercised: some row emits EOS and then only padding.
  stopped = [
      row
      for row in expected.tolist()
      if eos_id in row[:-1] and set(row[row.index(eos_id) + 1 :]) == {pad_id}
  ]
  assert stopped


def test_greedy_decode_rejects_overlong_buffer(tiny_model):
  with pytest.raises(ValueError, match="max_len"):
    decoding.greedy_decode(
        tiny_model,
        jnp.zeros((1, MAX_LEN), jnp.int32),
        jnp.array([3]),
        4,
        eos_id=12,
        pad_id=10,
    )


# ----------------------------------------------------------------------------
# Sharding.


def test_params_carry_fsdp_annotations(tiny_model):
  specs = nnx.get_partition_spec(nnx.state(tiny_model, nnx.Param))
  attention = specs["blocks"][0]["attention"]
  mlp = specs["blocks"][0]["mlp"]
  assert attention["query"].get_value() == jax.P("fsdp", None, None)
  assert attention["output"].get_value() == jax.P(None, None, "fsdp")
  assert mlp["gate"].get_value() == jax.P(None, "fsdp")
  assert mlp["down"].get_value() == jax.P("fsdp", None)
  assert specs["embedding"].get_value() == jax.P(None, "fsdp")
  assert specs["unembed"].get_value() == jax.P("fsdp", None)
  assert specs["final_norm"]["scale"].get_value() == jax.P(None)


@pytest.mark.slow
def test_create_model_on_a_one_device_mesh():
  mesh = jax.make_mesh(
      (1, 1), ("data", "fsdp"), axis_types=(jax.sharding.AxisType.Explicit,) * 2
  )
  # rbg keys: a jitted threefry init takes many seconds to compile on CPU.
  key = jax.random.key(0, impl="rbg")
  single = models.create_model(_tiny_config(), nnx.Rngs(key))
  sharded = models.create_model(_tiny_config(), nnx.Rngs(key), mesh)
  assert isinstance(sharded.unembed[...].sharding, jax.sharding.NamedSharding)
  assert sharded.unembed[...].sharding.mesh == mesh
  tokens = _random_tokens(7, (2, 9))
  with jax.set_mesh(mesh):
    logits = _forward(sharded, tokens)
  np.testing.assert_allclose(
      logits, _forward(single, tokens), rtol=1e-5, atol=1e-5
  )


def test_models_of_one_shape_share_the_initialiser_and_keep_their_seeds():
  """A grid builds a model per run: the second of one shape and mesh reuses
  the first's compiled initialiser, and each seed still gets its own
  parameters, those a model built alone from that seed gets."""
  mesh = jax.make_mesh(
      (1, 1), ("data", "fsdp"), axis_types=(jax.sharding.AxisType.Explicit,) * 2
  )
  config = _tiny_config()

  def params(seed):
    model = models.create_model(
        config, nnx.Rngs(jax.random.key(seed, impl="rbg")), mesh
    )
    return [np.asarray(p) for p in jax.tree.leaves(nnx.state(model, nnx.Param))]

  first = params(0)
  misses = models._sharded_init.cache_info().misses
  second, again = params(1), params(0)
  assert models._sharded_init.cache_info().misses == misses
  assert not all(np.array_equal(a, b) for a, b in zip(first, second))
  for a, b in zip(first, again):
    np.testing.assert_array_equal(a, b)
  # Seed 1 as if it were the first model built: traced afresh.
  models._sharded_init.cache_clear()
  for a, b in zip(second, params(1)):
    np.testing.assert_array_equal(a, b)


def test_create_model_needs_an_fsdp_axis():
  mesh = jax.make_mesh((1,), ("data",))
  with pytest.raises(ValueError, match="fsdp"):
    models.create_model(_tiny_config(), nnx.Rngs(0), mesh)


_SHARDED_SCRIPT = textwrap.dedent("""
    import json, sys
    import jax, jax.numpy as jnp, numpy as np
    from flax import nnx
    from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
    from train import decoding, models

    config = models.model_config("tiny", vocab_size=99, max_len=32)
    tokens = jax.random.randint(jax.random.key(1), (4, 12), 0, 99)
    lengths = jnp.array([3, 12, 5, 1])
    decode = nnx.jit(decoding.greedy_decode, static_argnums=(3, 4, 5))
    single = models.create_model(config, nnx.Rngs(0))
    single_logits = np.asarray(single(tokens))
    single_tokens = np.asarray(decode(single, tokens, lengths, 8, 12, 10))
    single_params = jax.tree.leaves(nnx.state(single, nnx.Param))
    report = {"num_devices": jax.device_count()}
    # Both axis types and both mesh shapes, in two meshes to keep it quick.
    for axis_type, shape in ((AxisType.Explicit, (1, 4)),
                             (AxisType.Auto, (2, 2))):
      mesh = jax.make_mesh(shape, ("data", "fsdp"),
                           axis_types=(axis_type, axis_type))
      model = models.create_model(config, nnx.Rngs(0), mesh)
      params = jax.tree.leaves(nnx.state(model, nnx.Param))
      batch = NamedSharding(mesh, P(("data", "fsdp")))
      with jax.set_mesh(mesh):
        forward = nnx.jit(lambda m, t: m(t))
        logits = forward(model, jax.device_put(tokens, batch))
        generated = decode(model, jax.device_put(tokens, batch),
                           jax.device_put(lengths, batch), 8, 12, 10)
      query = model.blocks[0].attention.query[...]
      report[f"{axis_type.name}{shape}"] = {
          "all_named": all(isinstance(p.sharding, NamedSharding)
                           for p in params),
          "num_fsdp_sharded": sum("fsdp" in p.sharding.spec for p in params),
          "num_params": len(params),
          # Auto meshes drop trailing Nones from specs; pad them back.
          "query_spec": [str(a) for a in
                         tuple(query.sharding.spec) + (None,) * 3][:3],
          "query_shard_shapes": sorted({s.data.shape
                                        for s in query.addressable_shards}),
          "params_equal": all(np.array_equal(a, b)
                              for a, b in zip(params, single_params)),
          "logits_error": float(np.abs(np.asarray(logits)
                                       - single_logits).max()),
          "decode_equal": bool(np.array_equal(generated, single_tokens)),
      }
    print(json.dumps(report))
""")


@pytest.mark.slow
def test_sharded_creation_on_four_cpu_devices():
  # XLA's default level, not the session's fast compiles: at level 0 the
  # sharded initialiser's floats differ from the single-device one's in
  # the last bits (measured), and the parameters are compared bit for bit.
  env = dict(
      os.environ,
      XLA_FLAGS="--xla_force_host_platform_device_count=4",
      JAX_PLATFORMS="cpu",
  )
  result = launch.run(
      [sys.executable, "-c", _SHARDED_SCRIPT],
      cwd=REPO_ROOT,
      env=env,
      capture_output=True,
      text=True,
      timeout=300,
  )
  assert result.returncode == 0, result.stderr[-3000:]
  report = json.loads(result.stdout.strip().splitlines()[-1])
  assert report.pop("num_devices") == 4
  assert set(report) == {"Explicit(1, 4)", "Auto(2, 2)"}
  num_layers = models.MODEL_SIZES["tiny"]["num_layers"]
  for mesh_name, mesh_report in report.items():
    fsdp_size = 4 if "(1, 4)" in mesh_name else 2
    assert mesh_report["all_named"], mesh_name
    # Every weight matrix (7 per block, embedding, unembedding); no norm.
    assert mesh_report["num_fsdp_sharded"] == 7 * num_layers + 2, mesh_name
    assert mesh_report["query_spec"] == ["fsdp", "None", "None"], mesh_name
    assert mesh_report["query_shard_shapes"] == [[64 // fsdp_size, 4, 16]]
    assert mesh_report["params_equal"], mesh_name
    assert mesh_report["logits_error"] < 1e-5, mesh_name
    assert mesh_report["decode_equal"], mesh_name
