r"""Builds the tiny random Hugging Face checkpoints that tests/ load.

Needs PyTorch and transformers, which the project itself does not install;
run it by hand in a separate environment, then commit the output (about
1 MiB), so that CI needs neither::

  python3.12 -m venv /tmp/torchenv
  /tmp/torchenv/bin/pip install torch==2.9.1 transformers==5.12.1 \
      tokenizers safetensors numpy
  /tmp/torchenv/bin/python scripts/make_hf_fixtures.py --out=tests/fixtures/hf

Two snapshots, each a directory as `save_pretrained` writes it plus a
``tokenizer.json`` and ``expected.npz`` (prompt ids and transformers' float32
logits on them, for the equality tests):

* ``qwen2_tiny``: Qwen2 with tied embeddings, random non-zero q/k/v biases
  and norm weights, a byte-level BPE tokenizer that splits numbers into
  single digits (Qwen2.5's pre-tokenizer), and 320 logits for its
  ~260-entry vocabulary.
* ``llama3_tiny``: Llama with untied embeddings and a tokenizer that writes
  numbers in 1-3 digit tokens (Llama 3's pre-tokenizer, with merges that
  write every 2- and 3-digit group as one token, ``ab`` + ``c`` and
  ``a`` + ``bc``), and 1408 logits for ~1360 entries; plus
  ``expected_llama31.npz``, transformers' logits of the same weights with
  Llama 3.1's RoPE scaling (``rope_type: llama3``).

Everything is seeded: rerunning gives the same files.
"""

import argparse
import json
import os

import numpy as np
import tokenizers
from tokenizers import decoders
from tokenizers import models
from tokenizers import pre_tokenizers
from tokenizers import processors
import torch
import transformers

# Hugging Face's pre-tokenizer patterns of Qwen2/2.5 and Llama 3: the same
# except for how numbers are cut (one digit, or up to three).
_QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_LLAMA3_PATTERN = _QWEN2_PATTERN.replace(r"|\p{N}|", r"|\p{N}{1,3}|", 1)
# A few merges for frequent words of arithmetic_mix questions, so that the
# tokenizers are real BPE and not only bytes.
_WORD_MERGES = [
    ("W", "h"),
    ("Wh", "a"),
    ("Wha", "t"),
    ("Ġ", "i"),
    ("Ġi", "s"),
    ("C", "a"),
    ("Ca", "l"),
    ("Ġ", "o"),
    ("Ġo", "f"),
    ("Ġ", "-"),
]
PROMPTS = (
    "Question: What is 12 + 345 - 6789?\nAnswer: -6432",
    "Evaluate (-8)/3*(2 - 0.5).",
)


def byte_level_tokenizer(pattern, digit_chunks, special_tokens):
  """A byte-level BPE tokenizer with Hugging Face's pre-tokenizer layout."""
  alphabet = pre_tokenizers.ByteLevel.alphabet()
  vocab = {symbol: index for index, symbol in enumerate(sorted(alphabet))}
  merges = list(_WORD_MERGES)
  if digit_chunks:
    digits = "0123456789"
    merges += [(a, b) for a in digits for b in digits]
    merges += [(a + b, c) for a in digits for b in digits for c in digits]
    # And a + bc: whichever pair of a three-digit group merges first, the
    # group ends as one token, as Llama 3 writes every one of them.
    merges += [(a, b + c) for a in digits for b in digits for c in digits]
  for left, right in merges:
    vocab.setdefault(left + right, len(vocab))
  tokenizer = tokenizers.Tokenizer(
      models.BPE(vocab=vocab, merges=merges, fuse_unk=False)
  )
  tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
      [
          pre_tokenizers.Split(
              tokenizers.Regex(pattern), behavior="isolated", invert=False
          ),
          pre_tokenizers.ByteLevel(
              add_prefix_space=False, trim_offsets=False, use_regex=False
          ),
      ]
  )
  tokenizer.decoder = decoders.ByteLevel()
  tokenizer.add_special_tokens(special_tokens)
  return tokenizer


def randomize(model, seed):
  """Non-trivial values for every parameter, biases and norms included."""
  generator = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for name, parameter in model.named_parameters():
      noise = torch.randn(parameter.shape, generator=generator)
      if name.endswith("norm.weight"):
        parameter.copy_(1.0 + 0.2 * noise)
      elif name.endswith("bias"):
        parameter.copy_(0.3 * noise)
      else:
        parameter.copy_(0.08 * noise)


def save(directory, model, tokenizer, extra_config=None):
  """save_pretrained + tokenizer.json + expected.npz of ``PROMPTS``."""
  os.makedirs(directory, exist_ok=True)
  model.save_pretrained(directory, safe_serialization=True)
  tokenizer.save(os.path.join(directory, "tokenizer.json"))
  if extra_config:
    path = os.path.join(directory, "config.json")
    with open(path) as f:
      config = json.load(f)
    config.update(extra_config)
    with open(path, "w") as f:
      json.dump(config, f, indent=2, sort_keys=True)
  encoded = [tokenizer.encode(p, add_special_tokens=False).ids for p in PROMPTS]
  length = max(len(ids) for ids in encoded)
  ids = np.zeros((len(encoded), length), np.int32)
  for row, row_ids in enumerate(encoded):
    ids[row, : len(row_ids)] = row_ids
  with torch.no_grad():
    logits = model(torch.tensor(ids, dtype=torch.long)).logits
  np.savez_compressed(
      os.path.join(directory, "expected.npz"),
      ids=ids,
      lengths=np.asarray([len(r) for r in encoded], np.int32),
      logits=logits.float().numpy(),
      prompts=np.asarray(PROMPTS),
  )


def build_qwen2(directory):
  tokenizer = byte_level_tokenizer(
      _QWEN2_PATTERN, digit_chunks=False, special_tokens=["<|endoftext|>"]
  )
  eos = tokenizer.token_to_id("<|endoftext|>")
  config = transformers.Qwen2Config(
      vocab_size=320,
      hidden_size=32,
      intermediate_size=64,
      num_hidden_layers=2,
      num_attention_heads=4,
      num_key_value_heads=2,
      max_position_embeddings=256,
      rope_theta=10000.0,
      rms_norm_eps=1e-6,
      tie_word_embeddings=True,
      bos_token_id=eos,
      eos_token_id=eos,
      attn_implementation="eager",
  )
  torch.manual_seed(0)
  model = transformers.Qwen2ForCausalLM(config).float().eval()
  randomize(model, seed=1)
  save(directory, model, tokenizer)


def build_llama3(directory):
  tokenizer = byte_level_tokenizer(
      _LLAMA3_PATTERN,
      digit_chunks=True,
      special_tokens=["<|begin_of_text|>", "<|end_of_text|>"],
  )
  # Llama 3's tokenizer.json adds its BOS to every text.
  bos = tokenizer.token_to_id("<|begin_of_text|>")
  tokenizer.post_processor = processors.TemplateProcessing(
      single="<|begin_of_text|> $A",
      pair="<|begin_of_text|> $A <|begin_of_text|> $B",
      special_tokens=[("<|begin_of_text|>", bos)],
  )
  config = transformers.LlamaConfig(
      vocab_size=1408,
      hidden_size=32,
      intermediate_size=64,
      num_hidden_layers=2,
      num_attention_heads=4,
      num_key_value_heads=2,
      max_position_embeddings=256,
      rope_theta=500000.0,
      rms_norm_eps=1e-5,
      tie_word_embeddings=False,
      bos_token_id=tokenizer.token_to_id("<|begin_of_text|>"),
      eos_token_id=tokenizer.token_to_id("<|end_of_text|>"),
      attn_implementation="eager",
  )
  torch.manual_seed(0)
  model = transformers.LlamaForCausalLM(config).float().eval()
  randomize(model, seed=2)
  save(directory, model, tokenizer)


# Llama 3.1's RoPE frequency scaling, with an original context at which the
# tiny fixture's 4 frequencies (wavelengths 6.3, 167, 4443 and 118k
# positions) fall in all three of its bands: kept (< 256 / 4), interpolated,
# divided by the factor (> 256).
LLAMA31_ROPE = dict(
    rope_type="llama3",
    rope_theta=500000.0,
    factor=8.0,
    low_freq_factor=1.0,
    high_freq_factor=4.0,
    original_max_position_embeddings=256,
)


def save_llama31_logits(directory):
  """``expected_llama31.npz``: the llama3_tiny weights with Llama 3.1 RoPE.

  transformers' logits of the first prompt when ``config.json`` says
  ``rope_parameters=LLAMA31_ROPE``; the tests copy the snapshot, write that
  config and compare. No second set of weights is stored.
  """
  model = transformers.LlamaForCausalLM.from_pretrained(
      directory, rope_parameters=dict(LLAMA31_ROPE), torch_dtype=torch.float32
  ).eval()
  assert model.config.rope_parameters["rope_type"] == "llama3"
  expected = np.load(os.path.join(directory, "expected.npz"))
  ids = expected["ids"][:1, : int(expected["lengths"][0])]
  with torch.no_grad():
    logits = model(torch.tensor(ids, dtype=torch.long)).logits
  np.savez_compressed(
      os.path.join(directory, "expected_llama31.npz"),
      ids=ids,
      logits=logits.float().numpy(),
      rope_parameters=json.dumps(LLAMA31_ROPE),
  )


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--out", default="tests/fixtures/hf")
  args = parser.parse_args()
  build_qwen2(os.path.join(args.out, "qwen2_tiny"))
  build_llama3(os.path.join(args.out, "llama3_tiny"))
  save_llama31_logits(os.path.join(args.out, "llama3_tiny"))
  print(f"wrote {args.out}/qwen2_tiny and {args.out}/llama3_tiny")


if __name__ == "__main__":
  main()
