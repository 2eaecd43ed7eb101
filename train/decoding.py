"""Greedy decoding with the decoder's KV cache."""

from collections.abc import Sequence
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp

if TYPE_CHECKING:
  from train import models  # pylint: disable=g-bad-import-order


def is_end(tokens: jax.Array, eos_id: int | Sequence[int]) -> jax.Array:
  """Whether each token is the end token ``eos_id`` or one of them."""
  ids = (eos_id,) if isinstance(eos_id, int) else tuple(eos_id)
  if not ids:
    raise ValueError("eos_id must name at least one end token.")
  ended = tokens == ids[0]
  for other in ids[1:]:
    ended = ended | (tokens == other)
  return ended


def check_request(prompts, prompt_lengths, max_new_tokens) -> None:
  """ValueError unless ``prompts`` are [B, P], ``prompt_lengths`` [B] and
  ``max_new_tokens`` at least 1 (every decoder's contract)."""
  if prompts.ndim != 2:
    raise ValueError(f"prompts must be [B, P], got shape {prompts.shape}.")
  if prompt_lengths.shape != prompts.shape[:1]:
    raise ValueError(
        f"prompt_lengths shape {prompt_lengths.shape} must be "
        f"[B] = {prompts.shape[:1]}."
    )
  if max_new_tokens < 1:
    raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}.")


def greedy_decode(
    model: "models.Transformer",
    prompts: jax.Array,
    prompt_lengths: jax.Array,
    max_new_tokens: int,
    eos_id: int | Sequence[int],
    pad_id: int,
    images: jax.Array | None = None,
) -> jax.Array:
  """Greedy continuation of right-padded prompts, with fixed shapes.

  Each row ``b`` continues from its own ``prompt_lengths[b]`` (>= 1) in a
  buffer of length ``P + max_new_tokens``: one `Transformer.prefill` of the
  buffer, then one `Transformer.extend` per token, writing the argmax just
  after the row's last filled position. A row that has emitted an end token
  (``eos_id``, or any of several) emits ``pad_id`` from then on. Causal attention makes whatever follows
  each row's cursor irrelevant, so the prompts' padding needs no mask.

  Args:
    model: the transformer, in eval mode (``model.eval()``); wrap the call in
      ``nnx.jit`` (``static_argnums=(3, 4, 5)``) for speed.
    prompts: int [B, P] prompt tokens, right-padded.
    prompt_lengths: int [B] number of real tokens in each row, in [1, P],
      sharded like ``prompts``' batch axis.
    max_new_tokens: N, the number of tokens generated per row.
    eos_id: the token that ends a row, or a tuple of them (Llama 3 Instruct
      lists three end tokens).
    pad_id: the token emitted after EOS.
    images: [B, S, S] (or [B, S, S, C]) image prefixes, for a model with
      ``image_size``.

  Returns:
    int32 [B, N] generated tokens (EOS included, pad after it).
  """
  check_request(prompts, prompt_lengths, max_new_tokens)
  prompt_len = prompts.shape[1]
  num_prefix = model.config.num_image_tokens
  if num_prefix + prompt_len + max_new_tokens > model.config.max_len:
    raise ValueError(
        f"{num_prefix} image tokens + prompt length {prompt_len} + "
        f"max_new_tokens {max_new_tokens} exceeds the model's max_len "
        f"{model.config.max_len}."
    )
  buffer = jnp.pad(
      prompts.astype(jnp.int32),
      ((0, 0), (0, max_new_tokens)),
      constant_values=pad_id,
  )
  unembedding = model.unembedding.astype(jnp.float32)

  def next_token(hidden, finished):
    """Argmax of [B, D] hidden states, pad where the row has finished."""
    token = jnp.argmax(hidden @ unembedding, axis=-1).astype(jnp.int32)
    token = jnp.where(finished, pad_id, token)
    return token, finished | is_end(token, eos_id)

  hidden, cache = model.prefill(buffer, images)
  # Cursor: where the next token goes. Derived from prompt_lengths so that
  # the loop state shares its (batch) sharding.
  cursor = prompt_lengths.astype(jnp.int32)
  # A masked sum rather than a gather keeps shardings unambiguous.
  is_last = jnp.arange(buffer.shape[1]) == (cursor - 1)[:, None]
  last_hidden = jnp.sum(jnp.where(is_last[..., None], hidden, 0.0), axis=1)
  first, finished = next_token(last_hidden, jnp.zeros_like(cursor, bool))

  def step(carry, _):
    cache, token, cursor, finished = carry
    hidden, cache = model.extend(token[:, None], cursor[:, None], cache)
    token, finished = next_token(hidden[:, 0], finished)
    return (cache, token, cursor + 1, finished), token

  _, rest = jax.lax.scan(
      step, (cache, first, cursor, finished), None, length=max_new_tokens - 1
  )
  return jnp.concatenate([first[:, None], rest.T], axis=1)
