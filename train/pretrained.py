"""Pretrained Hugging Face LLMs (Qwen2/2.5, Llama 3) as Flax NNX models.

``lm = pretrained.load(path)`` reads a local Hugging Face snapshot
(``config.json``, ``*.safetensors``, ``tokenizer.json``; nothing is fetched)
into tunix's Flax NNX Qwen2 or Llama3 model::

  lm = pretrained.load("/models/Qwen2.5-1.5B")
  ids = lm.encode("What is 12 + 30?")        # the tokenizer's ids, no BOS
  logits = lm.logits(jnp.asarray([ids]))       # [1, T, V] float32
  lm.digit_token_ids                           # ten ids, for ntil_jax
  lm.model                                     # a `CausalLM`, to train

`CausalLM` wraps the tunix model in the interface the trainer uses for its
own `train.models.Transformer`: ``model(tokens)`` logits,
``model.hidden_states(tokens)`` and ``model.unembedding`` for the fused loss,
``model.config.vocab_size`` (the logits size, which may exceed the
tokenizer's), and ``model.greedy_decode`` with a KV cache.

config.json is mapped by hand (`model_config`): Qwen2 (q/k/v biases, tied or
untied embeddings) and Llama (untied or tied, no biases). Both layouts of the
RoPE base are read: a top-level ``rope_theta`` (published Qwen2.5 snapshots)
and a ``rope_parameters`` dict (newer transformers). Llama 3.1/3.2's RoPE
frequency scaling (``rope_type: llama3``) is applied here, as tunix's Llama3
has only plain RoPE; other scalings are refused.
"""

import contextlib
import functools
import importlib
import json
import os
import re
from typing import Any

import flax
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

import ntil_jax
from train import snapshots

# Text that digits are cut out of by `encode(..., split_digits=True)`.
_DIGIT_RUNS = re.compile(r"(\d)")
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
FAMILIES = ("qwen2", "llama")


SnapshotError = snapshots.SnapshotError


@contextlib.contextmanager
def _tunix_flags():
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


def tunix_module(name: str):
  """``tunix.models.<name>``, imported without changing flax's flags."""
  with _tunix_flags():
    return importlib.import_module(f"tunix.models.{name}")


@contextlib.contextmanager
def _llama_rope(theta: float, scaling=None):
  """Makes tunix's Llama3 use the config's RoPE while tracing.

  tunix 0.1.7's Llama3 attention calls ``apply_rope`` without
  ``rope_theta``, so every Llama ran with its default base 1e6 instead of
  the config's (Llama 3: 5e5), and its logits were not the checkpoint's
  (1.4e-2 off on the test fixture; 8e-7 with this). It has no RoPE scaling
  either. The module's ``apply_rope`` is swapped for one with the right base
  (and, given ``scaling``, Llama 3.1's scaled frequencies) while the forward
  pass is traced, and put back afterwards.
  """
  module = tunix_module("llama3.model")
  original = module.apply_rope
  if scaling is None:
    module.apply_rope = functools.partial(original, rope_theta=theta)
  else:
    module.apply_rope = functools.partial(
        apply_scaled_rope, rope_theta=theta, scaling=scaling
    )
  try:
    yield
  finally:
    module.apply_rope = original


def llama3_inverse_frequencies(head_dim: int, theta: float, scaling):
  """float32 ``[head_dim // 2]`` RoPE frequencies with Llama 3.1's scaling.

  ``scaling`` is ``(factor, low_freq_factor, high_freq_factor,
  original_max_position_embeddings)``. Frequencies whose wavelength is
  shorter than ``context / high_freq_factor`` are kept, those longer than
  ``context / low_freq_factor`` divided by ``factor``, and those between
  interpolated (as transformers' ``rope_type="llama3"``).
  """
  factor, low, high, context = scaling
  exponents = np.arange(0, head_dim, 2, dtype=np.float32) / head_dim
  inverse = (1.0 / np.float32(theta) ** exponents).astype(np.float32)
  wavelength = 2 * np.pi / inverse
  smooth = (context / wavelength - low) / (high - low)
  smoothed = (1 - smooth) * inverse / factor + smooth * inverse
  scaled = np.where(
      wavelength < context / high,
      inverse,
      np.where(wavelength > context / low, inverse / factor, smoothed),
  )
  return scaled.astype(np.float32)


def apply_scaled_rope(inputs, positions, head_dim, rope_theta, scaling):
  """tunix's ``apply_rope`` (halves layout) with Llama 3.1's frequencies."""
  inverse = jnp.asarray(
      llama3_inverse_frequencies(head_dim, rope_theta, scaling)
  )
  angles = positions[..., None].astype(jnp.float32) * inverse
  angles = angles[..., None, :]  # [B, T, 1 (heads), head_dim // 2]
  sin, cos = jnp.sin(angles), jnp.cos(angles)
  first, second = jnp.split(inputs, 2, axis=-1)
  out = jnp.concatenate(
      [first * cos - second * sin, second * cos + first * sin], axis=-1
  )
  return out.astype(inputs.dtype)


# ----------------------------------------------------------------------------
# config.json -> tunix ModelConfig.


def read_json(path: str, what: str) -> dict:
  if not os.path.isfile(path):
    raise SnapshotError(
        f"{what} {path} not found; pass the directory of a local Hugging "
        "Face snapshot (config.json, *.safetensors, tokenizer.json)."
    )
  with open(path) as f:
    try:
      return json.load(f)
    except json.JSONDecodeError as error:
      raise SnapshotError(f"{path} is not valid JSON ({error}).") from error


def family(hf_config: dict) -> str:
  """'qwen2' or 'llama', from ``model_type``; SnapshotError otherwise."""
  model_type = hf_config.get("model_type", "")
  if model_type not in FAMILIES:
    raise SnapshotError(
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
    raise SnapshotError(
        "config.json has neither rope_theta nor rope_parameters.rope_theta."
    )
  return float(theta)


def rope_scaling(hf_config: dict):
  """Llama 3.1's RoPE scaling as a tuple of ``ROPE_SCALING_KEYS``, or None.

  Read from ``rope_scaling`` (published snapshots) or ``rope_parameters``
  (transformers >= 5); any type other than ``default`` and ``llama3`` is a
  SnapshotError.
  """
  found = None
  for source in _rope_sources(hf_config):
    kind = source.get("rope_type", source.get("type", "default"))
    if kind in ("default", None):
      continue
    if kind != "llama3":
      raise SnapshotError(
          f"RoPE scaling {kind!r} ({source}) is not supported (only "
          "'llama3', Llama 3.1/3.2's): the logits would not be the "
          "checkpoint's."
      )
    missing = [k for k in ROPE_SCALING_KEYS if source.get(k) is None]
    if missing:
      raise SnapshotError(
          f"RoPE scaling 'llama3' without {', '.join(missing)}: {source}"
      )
    found = tuple(float(source[k]) for k in ROPE_SCALING_KEYS)
    if not found[0] > 0 or not found[2] > found[1] > 0 or not found[3] > 0:
      raise SnapshotError(
          "RoPE scaling 'llama3' needs factor > 0, high_freq_factor > "
          f"low_freq_factor > 0 and a positive original context: {source}"
      )
  return found


def _require(hf_config: dict, name: str) -> Any:
  if name not in hf_config:
    raise SnapshotError(f"config.json has no {name!r}.")
  return hf_config[name]


def _check_dtype(name: str, dtype: str) -> None:
  if dtype not in DTYPES:
    raise SnapshotError(
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
  _check_dtype("dtype", dtype)
  param_dtype = param_dtype or dtype
  _check_dtype("param_dtype", param_dtype)
  if hf_config.get("hidden_act", "silu") != "silu":
    raise SnapshotError(
        f"hidden_act {hf_config['hidden_act']!r} is not supported (silu)."
    )
  num_heads = _require(hf_config, "num_attention_heads")
  hidden_size = _require(hf_config, "hidden_size")
  fields = dict(
      num_layers=_require(hf_config, "num_hidden_layers"),
      vocab_size=_require(hf_config, "vocab_size"),
      embed_dim=hidden_size,
      hidden_dim=_require(hf_config, "intermediate_size"),
      num_heads=num_heads,
      head_dim=hf_config.get("head_dim") or hidden_size // num_heads,
      num_kv_heads=hf_config.get("num_key_value_heads") or num_heads,
      rope_theta=rope_theta(hf_config),
      norm_eps=_require(hf_config, "rms_norm_eps"),
  )
  tied = bool(hf_config.get("tie_word_embeddings", False))
  if kind == "qwen2":
    qwen2 = tunix_module("qwen2.model")
    if rope_scaling(hf_config) is not None:
      raise SnapshotError(
          "RoPE scaling 'llama3' is supported for Llama only, not qwen2."
      )
    if hf_config.get("use_sliding_window"):
      raise SnapshotError("use_sliding_window=true is not supported.")
    return kind, qwen2.ModelConfig(
        **fields,
        use_tied_embedding=tied,
        dtype=DTYPES[dtype],
        param_dtype=DTYPES[param_dtype],
    )
  llama3 = tunix_module("llama3.model")
  for name in ("attention_bias", "mlp_bias"):
    if hf_config.get(name):
      raise SnapshotError(f"{name}=true is not supported for Llama.")
  # tunix's Llama computes in its parameters' dtype (its config has none):
  # `CausalLM` casts them to the computation's dtype where they differ.
  return kind, llama3.ModelConfig(**fields, weight_tying=tied)


def cast_floating(module: nnx.Module, dtype) -> nnx.Module:
  """A copy of ``module`` whose floating-point state is cast to ``dtype``.

  Differentiable: under `nnx.grad`, the gradients reach the original
  (say float32) parameters in their own dtype.
  """
  graphdef, state = nnx.split(module)
  return nnx.merge(
      graphdef,
      jax.tree.map(
          lambda x: (
              x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x
          ),
          state,
      ),
  )


# ----------------------------------------------------------------------------
# The model.


def causal_mask(length: int) -> jax.Array:
  """bool [1, T, T]: position t attends to positions <= t."""
  return jnp.tril(jnp.ones((length, length), bool))[None]


class CausalLM(nnx.Module):
  """A tunix Qwen2/Llama3 model with the trainer's model interface.

  Attributes:
    lm: the tunix model (its parameters are this module's).
    family: 'qwen2' or 'llama'.
    config: the tunix ModelConfig (``config.vocab_size`` is the logits size).
    digit_token_ids: the ten digit ids of the snapshot's tokenizer.
    decimal_point_token_id: the id of its '.' token (None if it has none),
      which joins integer and fractional digits into one number.
    rope_scaling: Llama 3.1's RoPE scaling (:func:`rope_scaling`) or None.
    compute_dtype: the dtype of the matmuls and activations. Parameters
      stored in another dtype (float32 "master" weights under bfloat16
      computation) are cast at each use, so gradients and the optimizer
      stay in the parameters' dtype.
  """

  def __init__(
      self,
      lm,
      family_: str,
      digit_token_ids,
      rope_scaling_=None,
      decimal_point_token_id=None,
      compute_dtype=None,
  ):
    self.lm = lm
    self._compute_dtype = (
        None if compute_dtype is None else jnp.dtype(compute_dtype)
    )
    self.family = family_
    self.config = lm.config
    self.digit_token_ids = tuple(int(i) for i in digit_token_ids)
    self.decimal_point_token_id = (
        None if decimal_point_token_id is None else int(decimal_point_token_id)
    )
    self.rope_scaling = rope_scaling_

  @property
  def param_dtype(self):
    return self.lm.embedder.input_embedding.value.dtype

  @property
  def compute_dtype(self):
    if self._compute_dtype is not None:
      return self._compute_dtype
    if self.family == "qwen2":
      return jnp.dtype(self.config.dtype)
    return self.param_dtype

  def _computing_lm(self):
    """The tunix model to run: Qwen2 casts its parameters itself (its config
    has both dtypes); Llama's are cast here when they differ."""
    if self.family == "qwen2" or self.param_dtype == self.compute_dtype:
      return self.lm
    return cast_floating(self.lm, self.compute_dtype)

  @property
  def unembedding(self) -> jax.Array:
    """The [D, V] unembedding (the embedding's transpose when tied), in the
    computation's dtype."""
    tied = (
        self.config.use_tied_embedding
        if self.family == "qwen2"
        else self.config.weight_tying
    )
    if tied:
      weight = self.lm.embedder.input_embedding.value.T
    else:
      weight = self.lm.lm_head.w.value
    return weight.astype(self.compute_dtype)

  def forward(self, tokens, positions, cache=None, mask=None, lm=None):
    """Final-normed hidden states [B, T, D] and the updated cache.

    Mirrors the tunix model's ``__call__`` without its output projection.
    ``mask`` is bool [B or 1, T, S] (S: T, or the cache length). ``lm`` is
    the tunix model to run, ``_computing_lm()`` by default; a caller that
    runs many forwards (a decoding loop) passes it once cast.
    """
    if lm is None:
      lm = self._computing_lm()
    if self.family == "llama":
      with _llama_rope(self.config.rope_theta, self.rope_scaling):
        return self._forward(lm, tokens, positions, cache, mask)
    return self._forward(lm, tokens, positions, cache, mask)

  def _forward(self, lm, tokens, positions, cache, mask):
    x = lm.embedder.encode(tokens)
    new_cache = None if cache is None else {}
    if self.family == "qwen2":
      qwen2 = tunix_module("qwen2.model")
      sin, cos = qwen2._generate_pos_embeddings(  # pylint: disable=protected-access
          positions, self.config.head_dim, self.config.rope_theta
      )
      sin, cos = sin.astype(x.dtype), cos.astype(x.dtype)
    for i, layer in enumerate(lm.layers):
      name = f"layer_{i}"
      layer_cache = None if cache is None else cache[name]
      if self.family == "qwen2":
        layer_cache, x = layer(x, layer_cache, mask, sin, cos)
      else:
        layer_cache, x = layer(x, positions, layer_cache, mask)
      if cache is not None:
        new_cache[name] = layer_cache
    return lm.final_norm(x), new_cache

  def hidden_states(self, tokens, images=None) -> jax.Array:
    """Hidden states [B, T, D] of right-padded int [B, T] tokens."""
    if images is not None:
      raise ValueError("pretrained language models take no images.")
    positions = jnp.broadcast_to(
        jnp.arange(tokens.shape[1], dtype=jnp.int32), tokens.shape
    )
    return self.forward(tokens, positions, None, causal_mask(tokens.shape[1]))[
        0
    ]

  def project(self, hidden, unembedding=None) -> jax.Array:
    """float32 logits of hidden states, computed as the tunix model does.

    ``unembedding`` defaults to `unembedding` (a decoding loop passes it).
    """
    dtype = self.compute_dtype
    if unembedding is None:
      unembedding = self.unembedding
    return jnp.dot(hidden.astype(dtype), unembedding.astype(dtype)).astype(
        jnp.float32
    )

  def __call__(self, tokens, images=None) -> jax.Array:
    """float32 logits [B, T, V] of int [B, T] tokens."""
    return self.project(self.hidden_states(tokens, images))

  def init_cache(self, batch_size: int, length: int) -> dict:
    shape = (batch_size, length, self.config.num_kv_heads, self.config.head_dim)
    zeros = jnp.zeros(shape, self.compute_dtype)
    return {
        f"layer_{i}": dict(
            k=zeros, v=zeros, end_index=jnp.zeros((batch_size,), jnp.int32)
        )
        for i in range(self.config.num_layers)
    }

  def greedy_decode(
      self, prompts, prompt_lengths, max_new_tokens, eos_id, pad_id, images=None
  ) -> jax.Array:
    """Greedy continuation of right-padded prompts; int32 [B, N].

    The same contract as `train.decoding.greedy_decode`. tunix's cache writes
    every row at one index, so the prompts are moved to the right end of
    the [B, P] window (left padding, masked out) and decoding continues at
    P, P+1, ... for all rows; each row's RoPE positions count from its own
    first token. Parameters stored in another dtype than the computation's
    are cast once, before the decoding loop, not at every token.
    """
    if images is not None:
      raise ValueError("pretrained language models take no images.")
    batch, width = prompts.shape
    total = width + max_new_tokens
    lengths = prompt_lengths.astype(jnp.int32)
    offset = width - lengths  # left padding of each row
    columns = jnp.arange(width)
    source = jnp.clip(columns[None] - offset[:, None], 0, width - 1)
    moved = jnp.take_along_axis(prompts.astype(jnp.int32), source, axis=1)
    moved = jnp.where(columns[None] >= offset[:, None], moved, pad_id)
    positions = jnp.maximum(columns[None] - offset[:, None], 0)
    keys = jnp.arange(total)
    real = keys[None] >= offset[:, None]  # [B, S]: not left padding
    mask = (keys[None, None] <= columns[None, :, None]) & real[:, None]
    lm, unembedding = self._computing_lm(), self.unembedding
    hidden, cache = self.forward(
        moved, positions, self.init_cache(batch, total), mask, lm=lm
    )

    def next_token(hidden_row, finished):
      logits = self.project(hidden_row, unembedding)
      token = jnp.argmax(logits, axis=-1).astype(jnp.int32)
      token = jnp.where(finished, pad_id, token)
      return token, finished | (token == eos_id)

    first, finished = next_token(hidden[:, -1], jnp.zeros((batch,), bool))

    def step(carry, index):
      cache, token, finished = carry
      step_mask = ((keys <= width + index)[None] & real)[:, None]
      hidden, cache = self.forward(
          token[:, None], (lengths + index)[:, None], cache, step_mask, lm=lm
      )
      token, finished = next_token(hidden[:, 0], finished)
      return (cache, token, finished), token

    _, rest = jax.lax.scan(
        step, (cache, first, finished), jnp.arange(max_new_tokens - 1)
    )
    return jnp.concatenate([first[:, None], rest.T], axis=1)


# ----------------------------------------------------------------------------
# Loading.


class Tokenizer:
  """The snapshot's tokenizer.json through the `tokenizers` library."""

  def __init__(self, path: str):
    import tokenizers  # pylint: disable=g-import-not-at-top

    file = os.path.join(path, "tokenizer.json")
    if not os.path.isfile(file):
      raise SnapshotError(
          f"{file} not found; the snapshot needs a tokenizer.json (the "
          "`tokenizers` format)."
      )
    try:
      self.tokenizer = tokenizers.Tokenizer.from_file(file)
    except Exception as error:  # pylint: disable=broad-exception-caught
      # tokenizers raises a plain Exception for a file it cannot parse.
      raise SnapshotError(
          f"{file} is not a readable tokenizer ({error})."
      ) from error

  def vocab(self) -> dict:
    return self.tokenizer.get_vocab(with_added_tokens=True)

  @functools.cached_property
  def digit_token_ids(self) -> np.ndarray:
    """int32 [10]: the ids of the single-digit tokens '0'..'9'."""
    try:
      return ntil_jax.digit_token_ids(self.vocab())
    except ValueError as error:
      raise SnapshotError(f"tokenizer.json: {error}") from error

  def encode(self, text: str, *, split_digits: bool = False) -> list[int]:
    """Token ids of ``text``, no special tokens added.

    With ``split_digits``, every digit is encoded on its own, so numbers
    become single-digit tokens whatever the tokenizer's number chunking.
    """
    return self.encode_batch([text], split_digits=split_digits)[0]

  def encode_batch(self, texts, *, split_digits: bool = False):
    if not split_digits:
      return [
          e.ids
          for e in self.tokenizer.encode_batch(
              list(texts), add_special_tokens=False
          )
      ]
    pieces = [[p for p in _DIGIT_RUNS.split(text) if p] for text in texts]
    flat = [p for row in pieces for p in row]
    encoded = iter(
        self.tokenizer.encode_batch(flat, add_special_tokens=False)
        if flat
        else []
    )
    return [[i for _ in row for i in next(encoded).ids] for row in pieces]

  def decode(self, ids) -> str:
    return self.tokenizer.decode(
        [int(i) for i in ids], skip_special_tokens=True
    )


def token_id(hf_config: dict, name: str):
  """``bos_token_id`` / ``eos_token_id`` of config.json (first of a list)."""
  value = hf_config.get(name)
  if isinstance(value, (list, tuple)):
    value = value[0] if value else None
  return value


class PretrainedLM:
  """What `load` returns: the model, its tokenizer and its special ids."""

  def __init__(self, path, model, tokenizer, hf_config):
    self.path = path
    self.model = model
    self.tokenizer = tokenizer
    self.hf_config = hf_config
    self.digit_token_ids = np.asarray(model.digit_token_ids, np.int32)
    self.eos_id = token_id(hf_config, "eos_token_id")
    self.bos_id = token_id(hf_config, "bos_token_id")
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
    token_ids = jnp.asarray(token_ids, jnp.int32)
    if token_ids.ndim != 2:
      raise ValueError(f"token_ids must be [B, T], got {token_ids.shape}.")
    return _logits(self.model, token_ids)


@nnx.jit
def _logits(model, token_ids):
  return model(token_ids)


def load(
    path: str,
    *,
    dtype: str = "float32",
    param_dtype: str | None = None,
    mesh: jax.sharding.Mesh | None = None,
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

  Raises:
    SnapshotError: see `check`.
  """
  path, hf_config, (kind, config), tokenizer = _checked(
      path, dtype, param_dtype
  )
  lm = _load_weights(kind, path, config, mesh, DTYPES[param_dtype or dtype])
  digits = tokenizer.digit_token_ids
  model = CausalLM(
      lm,
      kind,
      digits,
      rope_scaling(hf_config),
      decimal_point_token_id=tokenizer.vocab().get("."),
      compute_dtype=DTYPES[dtype],
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
  hf_config = read_json(os.path.join(path, "config.json"), "config")
  kind, config = model_config(hf_config, dtype=dtype, param_dtype=param_dtype)
  tokenizer = Tokenizer(path)
  check_weights(kind, path, config)
  digits = tokenizer.digit_token_ids
  if int(digits.max()) >= config.vocab_size:
    raise SnapshotError(
        f"digit ids {digits.tolist()} reach past the model's "
        f"{config.vocab_size} logits."
    )
  if token_id(hf_config, "eos_token_id") is None:
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
) -> CausalLM:
  """A model of a config.json's shape with random weights (benchmarks).

  Nothing is read or downloaded: a Qwen2.5-1.5B-shaped model is a dict of
  its config.json's fields away. ``dtype`` and ``param_dtype`` as in `load`.
  """
  kind, config = model_config(hf_config, dtype=dtype, param_dtype=param_dtype)
  module = tunix_module(f"{'qwen2' if kind == 'qwen2' else 'llama3'}.model")
  model_class = module.Qwen2 if kind == "qwen2" else module.Llama3
  with _tunix_flags():
    lm = model_class(config, rngs=nnx.Rngs(seed))
  if kind == "llama":  # tunix creates float32 Llama parameters
    lm = cast_floating(lm, DTYPES[param_dtype or dtype])
  return CausalLM(
      lm,
      kind,
      digit_token_ids,
      rope_scaling(hf_config),
      compute_dtype=DTYPES[dtype],
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
  params = tunix_module(f"{'qwen2' if kind == 'qwen2' else 'llama3'}.params")
  with _tunix_flags():
    return params.create_model_from_safe_tensors(
        path, config, mesh=mesh, dtype=dtype
    )


@functools.cache
def cached_tokenizer(path: str) -> Tokenizer:
  """One `Tokenizer` per snapshot path, for the input pipeline."""
  return Tokenizer(path)


def cached_config(path: str) -> dict:
  return read_json(os.path.join(path, "config.json"), "config")
