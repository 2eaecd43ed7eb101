"""arithmetic_mix: fine-tune a pretrained Hugging Face LLM (paper, Table 3).

The paper's own setting: Qwen2.5 (or Llama 3) fine-tuned on arithmetic_mix
with CE + lam * numeric loss on the answer tokens. Variants by the argument
after the colon, one per loss method::

  python -m train.main --config=configs/arithmetic_mix_llm.py:ntil \
      --workdir=W --config.data_dir=D --config.pretrained=SNAPSHOT

``SNAPSHOT`` is a local Hugging Face directory (config.json, *.safetensors,
tokenizer.json); nothing is downloaded. Defaults are the paper's: lr 1e-5,
lam 0.3, alpha = beta = sigma = 0.2, 'sum' weighting (see docs/llm.md). The loss
path is chosen by ``fused_loss="auto"``: the logits path (XLA's matmul + CE,
the faster one on a GPU) unless the float32 [N, V] logits and their gradient
would take over a quarter of a device's memory, then the fused path from
hidden states (`train.step.use_fused_loss`; ``True``/``False`` force one).
"""

import ml_collections

from configs import common

METHODS = common.METHODS
loss_kwargs = common.loss_kwargs


def get_config(method: str = "ntil") -> ml_collections.ConfigDict:
  """Returns the config for one loss ``method``."""
  config = common.base_config(common.check_method(method))
  config.task = "arithmetic_mix_llm"
  config.pretrained = ""  # a local Hugging Face snapshot directory
  config.model = "pretrained"  # the size comes from the snapshot
  config.dtype = "float32"  # computation; "bfloat16" on an accelerator
  config.param_dtype = "float32"  # parameters and optimizer (see common.py)
  config.prompt_template = "Question: {question}\nAnswer: "
  config.split_digits = False  # every digit its own token (for Llama 3)
  # Score numbers in the tokenizer's own 1-3 digit tokens (Llama 3) as one
  # number each (ntil_jax.number_tokens); exclusive with split_digits.
  config.number_tokens = False
  # Tokenize the prompt and the answer as one text, as the tokenizer writes
  # it: a space the template ends with joins the answer's first token where
  # the tokenizer joins them ('Answer: -5' ends with 'Ġ-', '5'), and
  # evaluation prompts end before it. False: each apart, the space a prompt
  # token ('Ġ', then '-', '5'), as the recorded SmolLM2 grid trained.
  config.tokenize_joined = True
  # A prompt starts with the BOS the snapshot's tokenizer adds (Llama 3's;
  # none for Qwen2 and SmolLM2). "llama": config.json's BOS for every
  # llama-family model (SmolLM2's is its chat marker '<|im_start|>'), as
  # the recorded SmolLM2 grid ran.
  config.prompt_bos = "tokenizer"
  config.max_question_len = 80  # characters; longer ones are skipped
  config.max_answer_len = 12
  # Prompt tokens (BOS, template, question) to pad to; 0: a bound from
  # max_question_len's characters. Longer prompts are skipped.
  config.max_prompt_tokens = 0
  config.tp = 1  # tensor parallelism: mesh ('data', 'fsdp', 'tp')

  config.learning_rate = 1e-5
  config.warmup_steps = 100
  config.weight_decay = 0.0
  config.batch_size = 32
  config.train_steps = 3000
  config.fused_loss = "auto"

  config.eval_batch_size = 64
  config.eval_examples = 1000
  config.eval_every_steps = 1000
  config.checkpoint_every_steps = 500
  return config
