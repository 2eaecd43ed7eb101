"""Pretrained Hugging Face LLMs (Qwen2/2.5, Llama 3) as Flax NNX models.

``lm = pretrained.load(path)`` reads a local Hugging Face snapshot
(``config.json``, ``*.safetensors``, ``tokenizer.json``; nothing is fetched)
into tunix's Flax NNX Qwen2 or Llama3 model::

  lm = pretrained.load("/models/Qwen2.5-1.5B")
  ids = lm.encode("What is 12 + 30?")        # the tokenizer's ids, no BOS
  logits = lm.logits(jnp.asarray([ids]))       # [1, T, V] float32
  lm.digit_token_ids                           # ten ids, for ntil_jax
                                               # (load(..., number_tokens=True):
                                               # its NumberTokens)
  lm.model                                     # a `CausalLM`, to train

This module is the loader: the snapshot's checks and weights. The rest is
one concern a module: `train.hf_config` (config.json to tunix's
ModelConfig), `train.causal_lm` (`CausalLM`, the trainer's model interface
over the tunix model), `train.llama_rope` (Llama 3's RoPE base and 3.1's
scaling, which tunix's Llama3 lacks), `train.hf_tokenizer` (tokenizer.json)
and `train.tunix_models` (tunix's modules imported without side effects).
"""

import functools
import os

from flax import nnx
import jax
import jax.numpy as jnp
import ntil_jax
import numpy as np

from train import causal_lm
from train import hf_config as hf_config_lib
from train import hf_tokenizer
from train import snapshots
from train import tunix_models

SnapshotError = snapshots.SnapshotError


class PretrainedLM:
  """What `load` returns: the model, its tokenizer and its special ids."""

  def __init__(self, path, model, tokenizer, hf_config):
    self.path = path
    self.model = model
    self.tokenizer = tokenizer
    self.hf_config = hf_config
    ids = model.digit_token_ids
    if not isinstance(ids, ntil_jax.NumberTokens):  # ten digit ids
      ids = np.asarray(ids, np.int32)
    self.digit_token_ids = ids
    self.eos_id = hf_config_lib.token_id(hf_config, "eos_token_id")
    self.bos_id = hf_config_lib.token_id(hf_config, "bos_token_id")
    if self.eos_id is None:
      raise SnapshotError(f"{path}/config.json has no eos_token_id.")

  @property
  def vocab_size(self) -> int:
    """The logits size (may exceed the tokenizer's vocabulary)."""
    return self.model.config.vocab_size

  def encode(self, text: str, *, split_digits: bool = False) -> list[int]:
    return self.tokenizer.encode(text, split_digits=split_digits)

  def logits(self, token_ids) -> jax.Array:
    """float32 [B, T, V] logits of int [B, T] ids (causal, no padding mask)."""
    token_ids = np.asarray(token_ids)
    if token_ids.ndim != 2:
      raise ValueError(f"token_ids must be [B, T], got {token_ids.shape}.")
    if not np.issubdtype(token_ids.dtype, np.integer):
      raise ValueError(f"token_ids must be integers, got {token_ids.dtype}.")
    # An id outside would read another token's embedding (a gather clamps).
    if token_ids.size and not (
        0 <= token_ids.min() and token_ids.max() < self.vocab_size
    ):
      raise ValueError(
          f"token_ids must be in [0, {self.vocab_size}), got "
          f"{token_ids.min()}..{token_ids.max()}."
      )
    return _logits(self.model, jnp.asarray(token_ids, jnp.int32))


@nnx.jit
def _logits(model, token_ids):
  return model(token_ids)


def load(
    path: str,
    *,
    dtype: str = "float32",
    param_dtype: str | None = None,
    mesh: jax.sharding.Mesh | None = None,
    number_tokens: bool = False,
) -> PretrainedLM:
  """Loads a local Hugging Face Qwen2/2.5 or Llama 3 snapshot.

  Args:
    path: a directory with config.json, *.safetensors and tokenizer.json.
    dtype: 'float32' or 'bfloat16' computation.
    param_dtype: the parameters' dtype; None: ``dtype``. For fine-tuning in
      bfloat16 keep float32 parameters (``param_dtype='float32'``): a
      bfloat16 weight cannot take an update below about 1/256 of itself.
    mesh: shard the parameters over it (axes 'fsdp' and 'tp' at least, as
      tunix's sharding rules name them); None puts them on one device.
    number_tokens: the model's ``digit_token_ids`` are the tokenizer's
      number tokens of 1-3 digits (`ntil_jax.number_tokens`), not its ten
      digits: the losses score numbers as the tokenizer writes them.

  Raises:
    SnapshotError: see `check`.
  """
  path, hf_config, (kind, config), tokenizer = _checked(
      path, dtype, param_dtype
  )
  lm = _load_weights(
      kind, path, config, mesh, hf_config_lib.DTYPES[param_dtype or dtype]
  )
  digits = tokenizer.digit_token_ids
  if number_tokens:
    digits = tokenizer.number_tokens
  model = causal_lm.CausalLM(
      lm,
      kind,
      digits,
      hf_config_lib.rope_scaling(hf_config),
      decimal_point_token_id=tokenizer.vocab().get("."),
      compute_dtype=hf_config_lib.DTYPES[dtype],
  )
  return PretrainedLM(path, model, tokenizer, hf_config)


def _checked(path, dtype, param_dtype):
  """(absolute path, config.json, (family, ModelConfig), Tokenizer)."""
  path = os.path.abspath(os.path.expanduser(path))
  if not os.path.isdir(path):
    raise SnapshotError(
        f"pretrained snapshot {path} is not a directory; pass the "
        "directory of a local Hugging Face snapshot."
    )
  hf_config = hf_config_lib.read_json(
      os.path.join(path, "config.json"), "config"
  )
  kind, config = hf_config_lib.model_config(
      hf_config, dtype=dtype, param_dtype=param_dtype
  )
  tokenizer = hf_tokenizer.Tokenizer(path)
  check_weights(kind, path, config)
  digits = tokenizer.digit_token_ids
  if int(digits.max()) >= config.vocab_size:
    raise SnapshotError(
        f"digit ids {digits.tolist()} reach past the model's "
        f"{config.vocab_size} logits."
    )
  if hf_config_lib.token_id(hf_config, "eos_token_id") is None:
    raise SnapshotError(f"{path}/config.json has no eos_token_id.")
  return path, hf_config, (kind, config), tokenizer


def check(
    path: str, *, dtype: str = "float32", param_dtype: str | None = None
) -> None:
  """What `load` checks, from the files' headers: no weights are read.

  Raises:
    SnapshotError: not a directory; a missing or unreadable config.json,
      tokenizer.json or weight file; an unsupported architecture or config
      field; weights that are not exactly the model config.json describes
      (a tensor missing, left over, in two files or of another shape, a
      weight file its index does not name); a tokenizer without the ten
      single-digit tokens; no eos_token_id.
  """
  _checked(path, dtype, param_dtype)


def random_model(
    hf_config: dict,
    *,
    dtype: str = "float32",
    param_dtype: str | None = None,
    digit_token_ids=tuple(range(10)),
    seed: int = 0,
) -> causal_lm.CausalLM:
  """A model of a config.json's shape with random weights (benchmarks).

  Nothing is read or downloaded: a Qwen2.5-1.5B-shaped model is a dict of
  its config.json's fields away. ``dtype`` and ``param_dtype`` as in `load`.
  """
  kind, config = hf_config_lib.model_config(
      hf_config, dtype=dtype, param_dtype=param_dtype
  )
  module = tunix_models.module(
      f"{'qwen2' if kind == 'qwen2' else 'llama3'}.model"
  )
  model_class = module.Qwen2 if kind == "qwen2" else module.Llama3
  with tunix_models.flags():
    lm = model_class(config, rngs=nnx.Rngs(seed))
  if kind == "llama":  # tunix creates float32 Llama parameters
    lm = causal_lm.cast_floating(lm, hf_config_lib.DTYPES[param_dtype or dtype])
  return causal_lm.CausalLM(
      lm,
      kind,
      digit_token_ids,
      hf_config_lib.rope_scaling(hf_config),
      compute_dtype=hf_config_lib.DTYPES[dtype],
  )


def expected_shapes(kind: str, config) -> dict[str, tuple[int, ...]]:
  """The Hugging Face tensors the model needs from the snapshot, by name,
  with their shapes."""
  dim, hidden = config.embed_dim, config.hidden_dim
  q_rows = config.num_heads * config.head_dim
  kv_rows = config.num_kv_heads * config.head_dim
  shapes = {
      "model.embed_tokens.weight": (config.vocab_size, dim),
      "model.norm.weight": (dim,),
  }
  tied = config.use_tied_embedding if kind == "qwen2" else config.weight_tying
  if not tied:
    shapes["lm_head.weight"] = (config.vocab_size, dim)
  per_layer = {
      "self_attn.q_proj.weight": (q_rows, dim),
      "self_attn.k_proj.weight": (kv_rows, dim),
      "self_attn.v_proj.weight": (kv_rows, dim),
      "self_attn.o_proj.weight": (dim, q_rows),
      "mlp.gate_proj.weight": (hidden, dim),
      "mlp.up_proj.weight": (hidden, dim),
      "mlp.down_proj.weight": (dim, hidden),
      "input_layernorm.weight": (dim,),
      "post_attention_layernorm.weight": (dim,),
  }
  if kind == "qwen2":
    per_layer.update(
        {
            "self_attn.q_proj.bias": (q_rows,),
            "self_attn.k_proj.bias": (kv_rows,),
            "self_attn.v_proj.bias": (kv_rows,),
        }
    )
  for layer in range(config.num_layers):
    for name, shape in per_layer.items():
      shapes[f"model.layers.{layer}.{name}"] = shape
  return shapes


def expected_tensors(kind: str, config) -> list[str]:
  """The Hugging Face tensor names the model needs from the snapshot."""
  return list(expected_shapes(kind, config))


def snapshot_tensors(path: str) -> set[str]:
  """The tensor names in a snapshot's *.safetensors (headers only)."""
  return set(snapshots.tensor_shapes(path))


def check_weights(kind, path, config) -> None:
  """SnapshotError unless the weight files hold exactly the model's tensors
  (`snapshots.check_weights`), from their headers."""
  want = expected_shapes(kind, config)
  snapshots.check_weights(
      path,
      want,
      describe=(
          f"the {kind} model of config.json ({config.num_layers} layers, "
          f"width {config.embed_dim}, vocabulary {config.vocab_size})"
      ),
      tied_to=(
          None
          if "lm_head.weight" in want
          else ("lm_head.weight", "model.embed_tokens.weight")
      ),
  )


def _load_weights(kind, path, config, mesh, dtype):
  """The tunix model with the snapshot's tensors (`check_weights` first)."""
  params = tunix_models.module(
      f"{'qwen2' if kind == 'qwen2' else 'llama3'}.params"
  )
  with tunix_models.flags():
    return params.create_model_from_safe_tensors(
        path, config, mesh=mesh, dtype=dtype
    )


@functools.cache
def cached_tokenizer(path: str) -> hf_tokenizer.Tokenizer:
  """One `Tokenizer` per snapshot path, for the input pipeline."""
  return hf_tokenizer.Tokenizer(path)


def cached_config(path: str) -> dict:
  return hf_config_lib.read_json(os.path.join(path, "config.json"), "config")


def end_token_ids(path: str) -> list[int]:
  """Every id that ends a generation: config.json's ``eos_token_id``, then
  generation_config.json's where the snapshot has one (Qwen2.5 Instruct
  lists ``<|endoftext|>`` there alone), as transformers' ``generate``
  stops at either."""
  ids = hf_config_lib.token_ids(cached_config(path), "eos_token_id")
  extra = os.path.join(path, "generation_config.json")
  if os.path.isfile(extra):
    generation = hf_config_lib.read_json(extra, "generation config")
    ids += hf_config_lib.token_ids(generation, "eos_token_id")
  return list(dict.fromkeys(ids))
