"""The train step: mesh, optimizer, loss and the jit-compiled update.

One ``nnx.jit`` function: logits (or, with ``config.fused_loss``, the fused
path from hidden states) -> ``ntil_jax`` statistics -> CE + lam * numeric
loss on the scored tokens -> optax adamw with warmup + cosine decay and
clipping. Parameters are FSDP-sharded and batches data-sharded over a
``('data', 'fsdp')`` mesh with explicit axis types.
"""

import collections
import copy
import json
import os

from absl import logging
from flax import nnx
import jax
import jax.numpy as jnp
from jax.sharding import AxisType
import optax

from configs import common
import ntil_jax
from train import models
from train import schedule
from train import tokenizer

BATCH_AXES = ("data", "fsdp")

# ``fused_loss="auto"`` takes the fused path only where the float32 [N, V]
# logits and their gradient would take more than this share of a device's
# memory. Where they fit, XLA's plain matmul + CE is the faster path on a GPU:
# on one H100 a Qwen2.5-1.5B-shaped model at batch 64 (bf16) trained at 6.3
# steps/s on the logits path and 4.6 with the fused loss (jax 0.11.2, the
# fused path before its accelerator tiling; issue 18).
AUTO_FUSED_MEMORY_FRACTION = 0.25
# The decimal point of the project's character tokenizer.
DECIMAL_POINT_ID = tokenizer.vocab()["."]
fused_mode = common.fused_mode
# The loss weights that sweeps, ablations and controls change (lambda;
# NTIL's sigma, alpha and beta; the digit-weighted CE control's weight):
# float32 arguments of the step, not constants traced into it, so that runs
# that differ only in them share one compiled step (the config's checks have
# vetted their values; `loss_weights`).
TRACED_WEIGHTS = ("lam", "sigma", "alpha", "beta", "digit_ce_weight")


def device_memory_bytes(device=None) -> int:
  """What one device can hold: its allocator's limit, or the host's RAM."""
  device = device or jax.local_devices()[0]
  try:
    stats = device.memory_stats() or {}
  except (NotImplementedError, RuntimeError):  # some backends have none
    stats = {}
  if stats.get("bytes_limit"):
    return int(stats["bytes_limit"])
  return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def logits_bytes_per_device(tokens: int, vocab_size: int, devices: int):
  """Float32 [N, V] logits plus their gradient, on one of ``devices``.

  The batch is split over every device of the ('data', 'fsdp') mesh; this
  is an estimate of the loss's own peak, not of the whole step.
  """
  return 2 * 4 * vocab_size * -(-tokens // max(devices, 1))


def use_fused_loss(config, tokens, vocab_size, *, devices=None, memory=None):
  """Whether the step computes its loss from hidden states (fused path).

  Args:
    config: the run's config; ``fused_loss`` is True, False, 'auto' or the
      name of an implementation of the fused path ('chunked', 'tokamax').
    tokens: tokens per global batch (``batch_size * length``).
    vocab_size: the logits' width V.
    devices: devices the batch is split over (default: all).
    memory: bytes one device holds (default: `device_memory_bytes`).
  """
  mode = fused_mode(config.fused_loss)
  if mode != "auto":
    return bool(mode)  # an implementation's name takes the fused path
  devices = devices or jax.device_count()
  memory = memory or device_memory_bytes()
  need = logits_bytes_per_device(tokens, vocab_size, devices)
  fused = need > AUTO_FUSED_MEMORY_FRACTION * memory
  logging.info(
      "fused_loss=auto: the [N, V] logits and their gradient take %.2f GiB "
      "per device of %.1f GiB: %s path",
      need / 2**30,
      memory / 2**30,
      "fused" if fused else "logits",
  )
  return fused


def make_mesh(config, task) -> jax.sharding.Mesh:
  """The task's mesh if it has one, else ('data', 'fsdp'), Explicit."""
  if hasattr(task, "make_mesh"):
    return task.make_mesh(config)
  devices = jax.device_count()
  return jax.make_mesh(
      (devices // config.fsdp, config.fsdp),
      BATCH_AXES,
      axis_types=(AxisType.Explicit,) * 2,
  )


# The programs of one run that other runs may share: a grid's runs that
# differ only in their seed trace, lower and compile each of them once.
# Keyed by the config without the fields no program reads (`_program_key`:
# the seed, the loss weights and the learning-rate schedule reach the step
# as arguments), and a field that does not change the program only costs a
# miss. The last few are kept: a grid cycles through its methods and
# variants, three programs each.
_SHARED = collections.OrderedDict()
_MAX_SHARED = 96


# Fields that reach none of the shared programs: the seed and the schedule
# (arguments), and when and how much the trainer logs, evaluates and saves.
_NOT_IN_PROGRAM = (
    "seed",
    "learning_rate",
    "warmup_steps",
    "lr_decay_steps",
    "train_steps",
    *common.CADENCE_FIELDS,
)


def _decay_steps(config) -> int:
  """The cosine decay's horizon (warmup included), a schedule argument."""
  decay_steps = config.lr_decay_steps or config.train_steps
  return max(decay_steps, config.warmup_steps + 1)


def _program_key(config) -> str:
  fields = config.to_dict()
  for name in _NOT_IN_PROGRAM + TRACED_WEIGHTS:
    fields.pop(name, None)
  fields["lam_is_zero"] = not config.lam  # `batch_loss` branches on it
  return json.dumps(fields, sort_keys=True, default=repr)


def _optimizer_key(config) -> str:
  """What the optimizer reads of the config: runs of every method, length
  and learning rate share it (the schedule is the step's argument)."""
  return json.dumps(
      dict(
          grad_clip_norm=config.grad_clip_norm,
          weight_decay=config.weight_decay,
      ),
      sort_keys=True,
  )


def _shared(kind, config, build, key=None):
  """``build()`` once per ``kind`` and config without its seed.

  ``key``, when given, stands in for the config (what ``build`` reads).
  """
  key = (kind, _program_key(config) if key is None else key)
  if key in _SHARED:
    _SHARED.move_to_end(key)
    return _SHARED[key]
  value = _SHARED[key] = build()
  while len(_SHARED) > _MAX_SHARED:
    _SHARED.popitem(last=False)
  return value


def make_optimizer(config) -> optax.GradientTransformation:
  """AdamW with warmup and cosine decay, after clipping the global norm.

  Its update takes the schedule as ``schedule=`` (`schedule_values`).
  Pure functions of the config: runs with the same clipping and weight
  decay (any method, seed, length or learning rate) get the same object
  (`_shared`), so that their optimizers share one traced program.
  """
  return _shared(
      "optimizer", config, lambda: _optimizer(config), _optimizer_key(config)
  )


def init_optimizer(model, config) -> nnx.Optimizer:
  """The optimizer of ``model``, its state created on the model's devices."""
  tx = make_optimizer(config)
  # Traced for each model structure it is given (nnx.jit's cache).
  init = _shared(
      "optimizer_init",
      config,
      lambda: nnx.jit(lambda m: nnx.Optimizer(m, tx, wrt=nnx.Param)),
      _optimizer_key(config),
  )
  return init(model)


def schedule_values(config) -> schedule.Values:
  """The step's learning-rate argument: optax's
  ``warmup_cosine_decay_schedule(0, lr, warmup, decay, 0.1 * lr)``."""
  return schedule.values(
      config.learning_rate,
      config.warmup_steps,
      _decay_steps(config),
      0.1 * config.learning_rate,
  )


def _optimizer(config) -> optax.GradientTransformation:
  # optax.adamw(schedule, weight_decay=...) with the schedule's numbers as
  # arguments: the same transformations, the same state.
  return optax.chain(
      optax.clip_by_global_norm(config.grad_clip_norm),
      optax.chain(
          optax.scale_by_adam(),
          optax.add_decayed_weights(config.weight_decay),
          schedule.scale_by_learning_rate(),
      ),
  )


def model_config(config, task) -> models.ModelConfig:
  """The decoder's config: the size's defaults and the task's fields."""
  return models.model_config(
      config.model,
      dtype=config.dtype,
      param_dtype=config.param_dtype,
      **task.model_fields(config),
  )


LABEL_KEYS = ("targets", "loss_mask", "digit_mask")


def scored_window(batch):
  """The batch's labels at its ``score_positions`` only, if it has them.

  A task whose scored tokens sit in a short span of each row (an LLM's
  answer after a long prompt) may add ``score_positions``, int [B, K]: K
  distinct positions per row, in increasing order, that include every
  scored one and every position between two scored ones. The step then
  unembeds only those K positions, not all L: the same loss and gradient
  (the other positions carry none) for K/L of the [N, V] logits' cost. The
  order and the gaps matter: NTIL reads a number from adjacent digits, so
  a window that reorders them, or drops the token between two numbers,
  reads other numbers.

  Returns:
    ``targets``, ``loss_mask`` and ``digit_mask``, each [B, K] (or [B, L]
    when the batch has no ``score_positions``).
  """
  positions = batch.get("score_positions")
  labels = {name: batch[name] for name in LABEL_KEYS}
  if positions is None:
    return labels
  return {
      name: jnp.take_along_axis(value, positions, axis=1)
      for name, value in labels.items()
  }


def scored_hidden_states(model, batch):
  """Final hidden states [B, L, D], or [B, K, D] at ``score_positions``."""
  hidden = model.hidden_states(batch["inputs"], batch.get("images"))
  positions = batch.get("score_positions")
  if positions is None:
    return hidden
  return jnp.take_along_axis(hidden, positions[..., None], axis=1)


def loss_weights(config) -> dict:
  """The config's `TRACED_WEIGHTS`, as the step's float32 arguments."""
  return {name: jnp.float32(config[name]) for name in TRACED_WEIGHTS}


def batch_loss(model, batch, config, key, weights=None):
  """Mean loss over scored tokens and per-component metrics.

  ``weights`` (`loss_weights`) stand in for the config's loss weights, as
  traced values; ``None`` reads them from ``config`` as constants.
  """
  if weights is None:
    weights = {name: config[name] for name in TRACED_WEIGHTS}
  lam = weights["lam"]
  labels = scored_window(batch)
  targets = labels["targets"]
  # A pretrained model's digits are its tokenizer's; ours are ids 0..9.
  digit_ids = getattr(model, "digit_token_ids", None)
  # A '.' between two digits makes "3.25" one number, not the integer 325.
  point_id = getattr(model, "decimal_point_token_id", DECIMAL_POINT_ID)
  # The NTIL authors' loss splits numbers at '.', as their code does; the
  # peers' own code reads '.' as a point (DEL's place weights, NL-NTL's
  # values), whatever the aggregation.
  joins = point_id is not None and not (
      config.weighting == "authors" and config.method == "ntil"
  )
  decimal_points = targets == point_id if joins else None
  # Unscored positions (padding, questions) are masked out of the
  # statistics, so a NaN or inf output there cannot reach loss or gradient.
  scored_mask = labels["loss_mask"]
  if use_fused_loss(config, targets.size, model.config.vocab_size):
    stats = ntil_jax.fused_token_statistics(
        scored_hidden_states(model, batch),
        model.unembedding,
        targets,
        digit_token_ids=digit_ids,
        chunk_size=config.fused_chunk_size or None,
        mask=scored_mask,
        implementation=common.fused_implementation(config.fused_loss),
    )
  else:
    # Zeroed, not just masked: a NaN hidden state at an unscored position
    # would reach the unembedding's gradient through 0 * NaN.
    hidden = jnp.where(
        scored_mask[..., None], scored_hidden_states(model, batch), 0.0
    )
    stats = ntil_jax.token_statistics(
        model.project(hidden),
        targets,
        digit_ids,
        mask=scored_mask,
    )
  shared = dict(
      vocab_size=model.config.vocab_size,
      loss_mask=scored_mask,
      digit_token_ids=digit_ids,
  )
  kwargs = common.loss_kwargs(config)
  for name in TRACED_WEIGHTS:
    if name in kwargs:
      kwargs[name] = weights[name]
  if config.method == "ntil" and config.gumbel_noise > 0:
    kwargs["key"] = key
  per_token = ntil_jax.loss_from_statistics(
      stats,
      targets,
      digit_mask=labels["digit_mask"],
      decimal_point_mask=decimal_points,
      method=config.method,
      lam=lam,
      weighting=config.weighting,
      **shared,
      **kwargs,
  )
  ce = ntil_jax.loss_from_statistics(stats, targets, method="ce", **shared)
  scored = scored_mask.sum()
  digit_tokens = scored_mask & labels["digit_mask"]
  digits = digit_tokens.sum()
  if config.lam and config.weighting == "sum":
    numeric = (per_token - ce).sum() / (lam * jnp.maximum(digits, 1))
  else:  # logged as the plain auxiliary loss: CE alone (lam = 0), or
    # "reference" weighting, under which per_token - ce is CE rescaled
    numeric = jax.lax.stop_gradient(
        ntil_jax.loss_from_statistics(
            stats,
            targets,
            digit_mask=labels["digit_mask"],
            decimal_point_mask=decimal_points,
            method=config.method,
            lam=1.0,
            **shared,
            **kwargs,
        )
        - ce
    ).sum() / jnp.maximum(digits, 1)
  # The control: extra CE weight on digits. Added where the weight is not
  # 0 only, so that CE's runs (weight 0, the same step) add exact zeros,
  # never 0 * inf.
  digit_ce_weight = weights["digit_ce_weight"]
  per_token = per_token + jnp.where(
      digit_tokens & (digit_ce_weight != 0), digit_ce_weight * ce, 0.0
  )
  loss = per_token.sum() / jnp.maximum(scored, 1)
  return loss, dict(
      loss=loss,
      ce=ce.sum() / jnp.maximum(scored, 1),
      numeric=numeric if config.method != "ce" else 0.0 * loss,
  )


def _keyed_step(config):
  """(model, optimizer, batch, step, base_key, weights, lr) -> metrics; the
  seed's key, the loss weights and the learning-rate schedule (`lr`,
  `schedule_values`) arguments, so that the function is the same for every
  seed, weight, run length and learning rate."""

  def train_step(model, optimizer, batch, step, base_key, weights, lr):
    key = jax.random.fold_in(base_key, step)
    grad_fn = nnx.value_and_grad(batch_loss, has_aux=True)
    (_, metrics), grads = grad_fn(model, batch, config, key, weights)
    optimizer.update(model, grads, schedule=lr)
    metrics["grad_norm"] = optax.global_norm(grads)
    return metrics

  return train_step


def _with_seed(step, config):
  base_key = jax.random.key(config.seed + 1)
  weights = loss_weights(config)
  lr = schedule_values(config)

  def train_step(model, optimizer, batch, step_number):
    return step(model, optimizer, batch, step_number, base_key, weights, lr)

  return train_step


def train_step_fn(config):
  """The step, not yet compiled: (model, optimizer, batch, step) -> metrics.

  Updates ``model`` and ``optimizer`` in place (NNX); `make_train_step`
  compiles it for the trainer, benchmarks/step.py as a pure function.
  """
  return _with_seed(_keyed_step(config), config)


def make_train_step(config):
  """The jit-compiled step: (model, optimizer, batch, step) -> metrics.

  Runs that differ only in their seed, length, learning rate or loss
  weights share one compiled step (`_shared`; the seed's key, the weights
  and the schedule are its arguments): a grid traces and lowers it once,
  not once a run. It holds a
  copy of the config, read when it traces.
  """
  frozen = copy.deepcopy(config)
  step = _shared(
      "train_step",
      config,
      lambda: nnx.jit(_keyed_step(frozen), donate_argnums=(0, 1)),
  )
  return _with_seed(step, config)
