"""A Hugging Face config.json as tunix's ModelConfig (Qwen2, Llama 3).

Mapped by hand: Qwen2 (q/k/v biases, tied or untied embeddings) and Llama
(untied or tied, no biases). Both layouts of the RoPE base are read: a
top-level ``rope_theta`` (published Qwen2.5 snapshots) and a
``rope_parameters`` dict (newer transformers); Llama 3.1/3.2's frequency
scaling (``rope_type: llama3``) is read for `train.llama_rope`, and other
scalings are refused. Every refusal is a `snapshots.SnapshotError`.
"""

import json
import os
from typing import Any

import jax.numpy as jnp

from train import snapshots
from train import tunix_models

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
FAMILIES = ("qwen2", "llama")


def read_json(path: str, what: str) -> dict:
  if not os.path.isfile(path):
    raise snapshots.SnapshotError(
        f"{what} {path} not found; pass the directory of a local Hugging "
        "Face snapshot (config.json, *.safetensors, tokenizer.json)."
    )
  with open(path) as f:
    try:
      return json.load(f)
    except json.JSONDecodeError as error:
      raise snapshots.SnapshotError(
          f"{path} is not valid JSON ({error})."
      ) from error


def family(hf_config: dict) -> str:
  """'qwen2' or 'llama', from ``model_type``; snapshots.SnapshotError otherwise."""
  model_type = hf_config.get("model_type", "")
  if model_type not in FAMILIES:
    raise snapshots.SnapshotError(
        f"model_type {model_type!r} is not supported; supported: "
        f"{', '.join(FAMILIES)} (Qwen2/Qwen2.5 and Llama 3)."
    )
  return model_type


ROPE_SCALING_KEYS = (
    "factor",
    "low_freq_factor",
    "high_freq_factor",
    "original_max_position_embeddings",
)


def _rope_sources(hf_config: dict):
  return (
      hf_config.get("rope_parameters") or {},
      hf_config.get("rope_scaling") or {},
  )


def rope_theta(hf_config: dict) -> float:
  """The RoPE base of either config layout.

  Published Qwen2.5 and Llama 3 snapshots have a top-level ``rope_theta``
  (and ``rope_scaling``); transformers >= 5 writes ``rope_parameters`` with
  ``rope_theta`` and ``rope_type`` inside.
  """
  parameters, _ = _rope_sources(hf_config)
  theta = parameters.get("rope_theta", hf_config.get("rope_theta"))
  if theta is None:
    raise snapshots.SnapshotError(
        "config.json has neither rope_theta nor rope_parameters.rope_theta."
    )
  return float(theta)


def rope_scaling(hf_config: dict):
  """Llama 3.1's RoPE scaling as a tuple of ``ROPE_SCALING_KEYS``, or None.

  Read from ``rope_scaling`` (published snapshots) or ``rope_parameters``
  (transformers >= 5); any type other than ``default`` and ``llama3`` is a
  snapshots.SnapshotError.
  """
  found = None
  for source in _rope_sources(hf_config):
    kind = source.get("rope_type", source.get("type", "default"))
    if kind in ("default", None):
      continue
    if kind != "llama3":
      raise snapshots.SnapshotError(
          f"RoPE scaling {kind!r} ({source}) is not supported (only "
          "'llama3', Llama 3.1/3.2's): the logits would not be the "
          "checkpoint's."
      )
    missing = [k for k in ROPE_SCALING_KEYS if source.get(k) is None]
    if missing:
      raise snapshots.SnapshotError(
          f"RoPE scaling 'llama3' without {', '.join(missing)}: {source}"
      )
    found = tuple(float(source[k]) for k in ROPE_SCALING_KEYS)
    if not found[0] > 0 or not found[2] > found[1] > 0 or not found[3] > 0:
      raise snapshots.SnapshotError(
          "RoPE scaling 'llama3' needs factor > 0, high_freq_factor > "
          f"low_freq_factor > 0 and a positive original context: {source}"
      )
  return found


def require(hf_config: dict, name: str) -> Any:
  if name not in hf_config:
    raise snapshots.SnapshotError(f"config.json has no {name!r}.")
  return hf_config[name]


def check_dtype(name: str, dtype: str) -> None:
  if dtype not in DTYPES:
    raise snapshots.SnapshotError(
        f"{name} {dtype!r} is not supported; use one of {', '.join(DTYPES)}."
    )


def model_config(
    hf_config: dict, *, dtype: str = "float32", param_dtype: str | None = None
):
  """The tunix ModelConfig of a Hugging Face config.json dict.

  Args:
    hf_config: the parsed config.json.
    dtype: 'float32' or 'bfloat16', the computation's.
    param_dtype: the parameters' ('float32' or 'bfloat16'); None: ``dtype``.

  Returns:
    (family, tunix ModelConfig).
  """
  kind = family(hf_config)
  check_dtype("dtype", dtype)
  param_dtype = param_dtype or dtype
  check_dtype("param_dtype", param_dtype)
  if hf_config.get("hidden_act", "silu") != "silu":
    raise snapshots.SnapshotError(
        f"hidden_act {hf_config['hidden_act']!r} is not supported (silu)."
    )
  num_heads = require(hf_config, "num_attention_heads")
  hidden_size = require(hf_config, "hidden_size")
  fields = dict(
      num_layers=require(hf_config, "num_hidden_layers"),
      vocab_size=require(hf_config, "vocab_size"),
      embed_dim=hidden_size,
      hidden_dim=require(hf_config, "intermediate_size"),
      num_heads=num_heads,
      head_dim=hf_config.get("head_dim") or hidden_size // num_heads,
      num_kv_heads=hf_config.get("num_key_value_heads") or num_heads,
      rope_theta=rope_theta(hf_config),
      norm_eps=require(hf_config, "rms_norm_eps"),
  )
  tied = bool(hf_config.get("tie_word_embeddings", False))
  if kind == "qwen2":
    qwen2 = tunix_models.module("qwen2.model")
    if rope_scaling(hf_config) is not None:
      raise snapshots.SnapshotError(
          "RoPE scaling 'llama3' is supported for Llama only, not qwen2."
      )
    if hf_config.get("use_sliding_window"):
      raise snapshots.SnapshotError("use_sliding_window=true is not supported.")
    return kind, qwen2.ModelConfig(
        **fields,
        use_tied_embedding=tied,
        dtype=DTYPES[dtype],
        param_dtype=DTYPES[param_dtype],
    )
  llama3 = tunix_models.module("llama3.model")
  for name in ("attention_bias", "mlp_bias"):
    if hf_config.get(name):
      raise snapshots.SnapshotError(f"{name}=true is not supported for Llama.")
  # tunix's Llama computes in its parameters' dtype (its config has none):
  # `CausalLM` casts them to the computation's dtype where they differ.
  return kind, llama3.ModelConfig(**fields, weight_tying=tied)


def token_id(hf_config: dict, name: str):
  """``bos_token_id`` / ``eos_token_id`` of config.json (first of a list)."""
  ids = token_ids(hf_config, name)
  return ids[0] if ids else None


def token_ids(hf_config: dict, name: str) -> list[int]:
  """Every id of ``name`` in config.json (Llama 3.1 Instruct lists three
  end tokens); [] without one."""
  value = hf_config.get(name)
  if value is None:
    return []
  return (
      [int(v) for v in value]
      if isinstance(value, (list, tuple))
      else [int(value)]
  )
