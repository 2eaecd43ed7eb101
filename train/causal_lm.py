"""`CausalLM`: a tunix Qwen2/Llama3 model with the trainer's model interface.

``model(tokens)`` logits, ``model.hidden_states(tokens)`` and
``model.unembedding`` for the fused loss, ``model.config.vocab_size`` (the
logits size, which may exceed the tokenizer's), and ``model.greedy_decode``
with a KV cache, as the trainer's own `train.models.Transformer`.
"""

from flax import nnx
import jax
import jax.numpy as jnp
import ntil_jax
import numpy as np

from train import decoding
from train import llama_rope
from train import tunix_models


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


def causal_mask(length: int) -> jax.Array:
  """bool [1, T, T]: position t attends to positions <= t."""
  return jnp.tril(jnp.ones((length, length), bool))[None]


class CausalLM(nnx.Module):
  """A tunix Qwen2/Llama3 model with the trainer's model interface.

  Attributes:
    lm: the tunix model (its parameters are this module's).
    family: 'qwen2' or 'llama'.
    config: the tunix ModelConfig (``config.vocab_size`` is the logits size).
    digit_token_ids: the ten digit ids of the snapshot's tokenizer, or its
      number tokens (`ntil_jax.NumberTokens`, as tuples).
    decimal_point_token_id: the id of its '.' token (None if it has none),
      which joins integer and fractional digits into one number.
    rope_scaling: Llama 3.1's RoPE scaling (:func:`train.hf_config.rope_scaling`) or None.
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
    if isinstance(digit_token_ids, ntil_jax.NumberTokens):
      # Static, as the ten ids are: a NumberTokens of tuples.
      self.digit_token_ids = ntil_jax.NumberTokens(
          *(tuple(x.tolist()) for x in map(np.asarray, digit_token_ids))
      )
    else:
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
      with llama_rope.llama_rope(self.config.rope_theta, self.rope_scaling):
        return self._forward(lm, tokens, positions, cache, mask)
    return self._forward(lm, tokens, positions, cache, mask)

  def _forward(self, lm, tokens, positions, cache, mask):
    x = lm.embedder.encode(tokens)
    new_cache = None if cache is None else {}
    if self.family == "qwen2":
      qwen2 = tunix_models.module("qwen2.model")
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
    decoding.check_request(prompts, prompt_lengths, max_new_tokens)
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
      return token, finished | decoding.is_end(token, eos_id)

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
