"""Pretrained Hugging Face LLMs: loading, tokenizing, decoding, fine-tuning.

The snapshots are the tiny random checkpoints of tests/fixtures/hf, built
by scripts/make_hf_fixtures.py with transformers and PyTorch; their
``expected.npz`` holds transformers' float32 logits and the tokenizer's ids
at build time, so no PyTorch is needed here.
"""

import collections
import json
import os
import pathlib
import shutil
import sys

import flax
import jax
import jax.extend
import jax.numpy as jnp
import ntil_jax
import numpy as np
import pytest

from configs import arithmetic_mix_llm
from train import arithmetic_data
from train import checks
from train import errors
from train import hf_tokenizer
from train import input_pipeline
from train import llama_rope
from train import pretrained
from train import rundir
from train import train
from train.tasks import arithmetic_mix_llm as task

from tests import launch

ROOT = pathlib.Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "hf"
SNAPSHOTS = ("qwen2_tiny", "llama3_tiny")


def expected(name):
  return np.load(FIXTURES / name / "expected.npz")


def copy_snapshot(name, tmp_path, edit=None):
  """A copy of a fixture snapshot, its config.json passed through ``edit``."""
  directory = tmp_path / name
  shutil.copytree(FIXTURES / name, directory)
  if edit is not None:
    path = directory / "config.json"
    config = json.loads(path.read_text())
    edit(config)
    path.write_text(json.dumps(config))
  return str(directory)


@pytest.fixture(scope="module", params=SNAPSHOTS)
def lm(request):
  return pretrained.load(str(FIXTURES / request.param))


# ----------------------------------------------------------------------------
# Loading: the logits are transformers'.


def test_logits_equal_transformers(lm):
  want = expected(os.path.basename(lm.path))
  got = np.asarray(lm.logits(want["ids"]))
  assert got.shape == want["logits"].shape
  assert got.shape[-1] == lm.vocab_size
  np.testing.assert_allclose(got, want["logits"], atol=1e-4, rtol=1e-4)


def _top_level_rope_theta(config):
  """The layout of published Qwen2.5 snapshots (older transformers)."""
  parameters = config.pop("rope_parameters")
  config["rope_theta"] = parameters["rope_theta"]
  config["rope_scaling"] = None


@pytest.mark.parametrize("name", SNAPSHOTS)
def test_both_config_layouts_give_the_same_logits(name, tmp_path):
  fixture = json.loads((FIXTURES / name / "config.json").read_text())
  assert "rope_parameters" in fixture and "rope_theta" not in fixture
  path = copy_snapshot(name, tmp_path, _top_level_rope_theta)
  want = expected(name)
  got = np.asarray(pretrained.load(path).logits(want["ids"]))
  np.testing.assert_allclose(got, want["logits"], atol=1e-4, rtol=1e-4)


def test_llama_uses_its_own_rope_base(tmp_path):
  """tunix 0.1.7's Llama3 ignores rope_theta; the wrapper must not."""
  want = expected("llama3_tiny")

  def other_base(config):
    config["rope_parameters"]["rope_theta"] = 1e6  # tunix's silent default

  moved = pretrained.load(copy_snapshot("llama3_tiny", tmp_path, other_base))
  got = np.asarray(moved.logits(want["ids"]))
  assert np.abs(got - want["logits"]).max() > 1e-3


def _llama31(layout):
  """A config.json edit: Llama 3.1's RoPE scaling, in either layout."""
  rope = json.loads(str(np.load(LLAMA31)["rope_parameters"]))

  def edit(config):
    if layout == "rope_parameters":  # transformers >= 5
      config["rope_parameters"] = dict(rope)
    else:  # as published Llama 3.1 snapshots write it
      config.pop("rope_parameters")
      config["rope_theta"] = rope.pop("rope_theta")
      config["rope_scaling"] = rope

  return edit


LLAMA31 = FIXTURES / "llama3_tiny" / "expected_llama31.npz"


@pytest.mark.parametrize("layout", ["rope_parameters", "rope_scaling"])
def test_llama31_rope_scaling_equals_transformers(layout, tmp_path):
  """Llama 3.1/3.2's scaled RoPE, which tunix 0.1.7 lacks, is applied."""
  want = np.load(LLAMA31)
  path = copy_snapshot("llama3_tiny", tmp_path, _llama31(layout))
  lm = pretrained.load(path)
  assert lm.model.rope_scaling == (8.0, 1.0, 4.0, 256.0)
  got = np.asarray(lm.logits(want["ids"]))
  np.testing.assert_allclose(got, want["logits"], atol=1e-4, rtol=1e-4)
  # The scaling matters here: plain RoPE is far from these logits.
  plain = expected("llama3_tiny")["logits"][:1, : want["ids"].shape[1]]
  assert np.abs(plain - want["logits"]).max() > 1e-2


def test_llama3_inverse_frequencies_bands():
  # Wavelengths 6.3, 167, 4443, 118k positions against 256 / 4 and 256:
  # kept, interpolated, divided by 8, divided by 8.
  inverse = 1.0 / 5e5 ** (np.arange(0, 8, 2) / 8)
  got = llama_rope.llama3_inverse_frequencies(8, 5e5, (8.0, 1.0, 4.0, 256.0))
  smooth = (256 / (2 * np.pi / inverse[1]) - 1.0) / (4.0 - 1.0)
  want = [
      inverse[0],
      (1 - smooth) * inverse[1] / 8 + smooth * inverse[1],
      inverse[2] / 8,
      inverse[3] / 8,
  ]
  np.testing.assert_allclose(got, want, rtol=1e-6)


def test_llama31_greedy_decode_equals_recomputation(tmp_path):
  path = copy_snapshot("llama3_tiny", tmp_path, _llama31("rope_parameters"))
  check_greedy_decode(pretrained.load(path))


def test_llama3_rope_scaling_is_refused_for_qwen2(tmp_path):
  def edit(config):
    config["rope_parameters"].update(
        rope_type="llama3",
        factor=8.0,
        low_freq_factor=1.0,
        high_freq_factor=4.0,
        original_max_position_embeddings=256,
    )

  path = copy_snapshot("qwen2_tiny", tmp_path, edit)
  with pytest.raises(pretrained.SnapshotError, match="Llama only"):
    pretrained.load(path)


def test_logits_vocabulary_exceeds_the_tokenizer(lm):
  assert lm.vocab_size > len(lm.tokenizer.vocab())
  assert lm.vocab_size == lm.hf_config["vocab_size"]


def test_loading_leaves_flax_flags_alone():
  before = flax.config.flax_always_shard_variable
  pretrained.load(str(FIXTURES / "qwen2_tiny"))
  assert flax.config.flax_always_shard_variable == before


def _param_dtypes(model):
  return {
      p.dtype for p in jax.tree.leaves(flax.nnx.state(model, flax.nnx.Param))
  }


@pytest.mark.parametrize("name", SNAPSHOTS)
def test_bfloat16_parameters(name):
  lm = pretrained.load(str(FIXTURES / name), dtype="bfloat16")
  assert _param_dtypes(lm.model) == {jnp.dtype(jnp.bfloat16)}
  want = expected(name)
  got = np.asarray(lm.logits(want["ids"]))
  assert got.dtype == np.float32
  # bf16 rounding of weights and activations: close, not equal.
  assert np.abs(got - want["logits"]).max() < 0.25
  assert np.mean(got.argmax(-1) == want["logits"].argmax(-1)) > 0.8


@pytest.mark.parametrize("name", SNAPSHOTS)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_random_model_has_the_dtype_asked_for(name, dtype):
  # tunix's Llama config has no dtype field: its parameters are created in
  # float32 whatever was asked, and must be cast.
  hf_config = pretrained.cached_config(str(FIXTURES / name))
  model = pretrained.random_model(hf_config, dtype=dtype)
  assert _param_dtypes(model) == {jnp.dtype(dtype)}
  assert model.compute_dtype == jnp.dtype(dtype)


# ----------------------------------------------------------------------------
# Tokenizers and digits.


def test_encode_equals_the_tokenizers_ids(lm):
  want = expected(os.path.basename(lm.path))
  for prompt, ids, length in zip(want["prompts"], want["ids"], want["lengths"]):
    assert lm.encode(str(prompt)) == ids[:length].tolist()


def test_digit_ids_spell_the_digits(lm):
  assert lm.digit_token_ids.shape == (10,)
  for digit, token in enumerate(lm.digit_token_ids):
    assert lm.tokenizer.decode([token]) == str(digit)
    assert lm.encode(str(digit)) == [int(token)]


def test_number_chunking_and_split_digits():
  qwen = pretrained.load(str(FIXTURES / "qwen2_tiny"))
  llama = pretrained.load(str(FIXTURES / "llama3_tiny"))
  digits = lambda lm, text: [int(lm.digit_token_ids[int(c)]) for c in text]
  # Qwen2.5 writes every digit as its own token anyway.
  assert qwen.encode("1234567") == digits(qwen, "1234567")
  # Llama 3 writes numbers in 1-3 digit tokens, unless split.
  chunked = llama.encode("1234567")
  assert len(chunked) == 3
  assert llama.tokenizer.decode(chunked) == "1234567"
  assert llama.encode("1234567", split_digits=True) == digits(llama, "1234567")
  text = "What is -12/345?"
  split = llama.encode(text, split_digits=True)
  assert llama.tokenizer.decode(split) == text


def test_split_digits_is_refused_where_pieces_get_word_starts(tmp_path):
  """A SentencePiece-style tokenizer (Llama 2's Metaspace) starts every
  piece with a word start: digits encoded apart each got one ('is 12' as
  'is', '_', '_1', '_2'), text the model never saw. Refused, not silent."""
  tokenizers = pytest.importorskip("tokenizers")
  pieces = ["<unk>", "\u2581"] + list("0123456789") + list("Answer:-.+isx")
  vocab = {p: i for i, p in enumerate(dict.fromkeys(pieces))}
  spm = tokenizers.Tokenizer(
      tokenizers.models.WordPiece(vocab, unk_token="<unk>")
  )
  spm.pre_tokenizer = tokenizers.pre_tokenizers.Metaspace()
  spm.decoder = tokenizers.decoders.Metaspace()
  spm.save(str(tmp_path / "tokenizer.json"))
  tokenizer = hf_tokenizer.Tokenizer(str(tmp_path))
  assert tokenizer.encode("is 12")  # whole, it works
  with pytest.raises(pretrained.SnapshotError, match="split_digits does not"):
    tokenizer.encode("is 12", split_digits=True)


def test_digit_coverage_counts_scored_digits():
  llama = pretrained.load(str(FIXTURES / "llama3_tiny"))
  # 8 digits; chunked, only the 7 and the 1 and 2 of 1/2 stand alone.
  answers = ["7", "12", "-345", "1/2"]
  assert task.digit_coverage(
      llama.tokenizer, answers, split_digits=False
  ) == pytest.approx(3 / 8)
  assert task.digit_coverage(llama.tokenizer, answers, split_digits=True) == 1
  # In Llama 3's own number tokens, every digit is scored.
  assert (
      task.digit_coverage(
          llama.tokenizer, answers, split_digits=False, number_tokens=True
      )
      == 1
  )


def test_digit_coverage_is_of_the_answers_as_trained(tmp_path):
  """A byte-level tokenizer without a digit split (GPT-2's pre-tokenizer)
  writes a joined " 5" as one token, not the digit '5': none of it is
  scored, where the log said a third was (answers encoded alone)."""
  snapshot = pathlib.Path(copy_snapshot("llama3_tiny", tmp_path))
  spec = json.loads((snapshot / "tokenizer.json").read_text())
  spec["pre_tokenizer"] = {
      "type": "ByteLevel",
      "add_prefix_space": False,
      "trim_offsets": True,
      "use_regex": True,
  }
  vocab, merges = spec["model"]["vocab"], spec["model"]["merges"]
  used = {piece for merge in merges for piece in merge}
  spare = next(  # a token no merge builds on, to give its id to " 5"
      piece
      for piece in sorted(vocab, key=vocab.get, reverse=True)
      if len(piece) > 2
      and piece not in used
      and not any(c.isdigit() for c in piece)
  )
  vocab["\u01205"] = vocab.pop(spare)
  merges[:] = [m for m in merges if m[0] + m[1] != spare]
  merges.append(["\u0120", "5"])
  (snapshot / "tokenizer.json").write_text(json.dumps(spec))
  config = arithmetic_mix_llm.get_config("ntil")
  config.pretrained = str(snapshot)
  config.max_question_len, config.max_answer_len = 40, 8
  questions, answers = ["What is 2 + 3?", "What is 50 - 5?"], ["5", "45"]
  batch = task.encode_examples(config, questions, answers)
  assert not batch["digit_mask"].any()  # ' 5'; ' ', '45': no digit token
  shares = task.scored_digit_shares(config, questions, answers)
  assert shares[False] == 0 and shares[True] == 1
  config.tokenize_joined = False  # '5' alone is the digit; '45' is not
  batch = task.encode_examples(config, questions, answers)
  assert batch["digit_mask"].sum() == 1
  assert task.scored_digit_shares(config, questions, answers)[False] == 1 / 3


def test_number_tokens_make_the_model_and_batches_score_whole_numbers(
    data_dir,
):
  config = make_config(
      data_dir, "llama3_tiny", number_tokens=True, max_answer_len=12
  )
  task.check_config(config)
  model = task.create_model(config, task.make_mesh(config))
  tokens = model.digit_token_ids
  assert isinstance(tokens, ntil_jax.NumberTokens)
  assert sorted(collections.Counter(tokens.widths).items()) == [
      (1, 10),
      (2, 100),
      (3, 1000),
  ]
  lm = pretrained.load(config.pretrained, number_tokens=True)
  assert lm.digit_token_ids == tokens  # the model's, not an array of them
  batch = task.encode_examples(config, ["What is 1234 + 5?"], ["1239"])
  scored = batch["targets"][0][batch["loss_mask"][0]].tolist()
  # ' ' (the prompt's last space, the answer's in joined text), 123|9, EOS.
  assert [lm.tokenizer.decode([t]) for t in scored[:3]] == [" ", "123", "9"]
  digits = batch["targets"][0][batch["digit_mask"][0]].tolist()
  assert digits == scored[1:3]
  with pytest.raises(ValueError, match="exclusive"):
    task.check_config(
        make_config(
            data_dir, "llama3_tiny", number_tokens=True, split_digits=True
        )
    )


# ----------------------------------------------------------------------------
# Decoding with the KV cache.


def reference_greedy(lm, prompt, steps, eos_id):
  """Greedy decoding by recomputing the whole sequence at every step."""
  ids, out = list(prompt), []
  for _ in range(steps):
    if out and out[-1] == eos_id:
      out.append(eos_id)  # pad after EOS (pad_id = eos_id below)
      continue
    logits = np.asarray(lm.logits(np.asarray([ids], np.int32)))
    token = int(logits[0, -1].argmax())
    ids.append(token)
    out.append(token)
  return out


@pytest.mark.slow
def test_greedy_decode_equals_recomputation(lm):
  check_greedy_decode(lm)


def check_greedy_decode(lm):
  texts = ["Question: 3 + 4?\nAnswer: ", "Evaluate 12*(-3) + 100.", "7"]
  rows = [lm.encode(t) for t in texts]
  width = max(map(len, rows)) + 2  # right padding on every row
  prompts = np.full((len(rows), width), 5, np.int32)
  for i, row in enumerate(rows):
    prompts[i, : len(row)] = row
  lengths = np.asarray([len(r) for r in rows], np.int32)
  steps = 6
  # An EOS that the model does predict, so that the pad-after-EOS rule runs.
  eos = reference_greedy(lm, rows[0], 2, -1)[1]
  got = np.asarray(
      jax.jit(
          # Several end ids (as Llama 3 Instruct lists): the second stops.
          lambda p, n: lm.model.greedy_decode(p, n, steps, (-1, eos), eos),
      )(prompts, lengths)
  )
  for i, row in enumerate(rows):
    assert got[i].tolist() == reference_greedy(lm, row, steps, eos)


def test_bad_requests_are_refused(lm):
  # An id outside the vocabulary read another token's embedding (the
  # gather clamps); max_new_tokens=0 decoded one token.
  for ids in ([[5, lm.vocab_size]], [[5, -1]]):
    with pytest.raises(ValueError, match=f"in \\[0, {lm.vocab_size}\\)"):
      lm.logits(ids)
  with pytest.raises(ValueError, match="integers"):
    lm.logits([[5.0, 6.0]])
  prompts, lengths = np.full((1, 3), 5, np.int32), np.asarray([3])
  with pytest.raises(ValueError, match="max_new_tokens must be >= 1, got 0"):
    lm.model.greedy_decode(prompts, lengths, 0, lm.eos_id, lm.eos_id)


# ----------------------------------------------------------------------------
# Bad snapshots: one clear error.


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda c: c.update(model_type="gpt2"), "model_type 'gpt2'"),
        (
            lambda c: c["rope_parameters"].update(
                rope_type="llama3", factor=8.0
            ),
            "RoPE scaling 'llama3' without low_freq_factor, high_freq_factor,"
            " original_max_position_embeddings",
        ),
        (
            lambda c: c["rope_parameters"].update(
                rope_type="llama3",
                factor=8.0,
                low_freq_factor=4.0,
                high_freq_factor=4.0,
                original_max_position_embeddings=256,
            ),
            "high_freq_factor > low_freq_factor",
        ),
        (
            lambda c: c.update(rope_scaling=dict(type="dynamic", factor=2.0)),
            "RoPE scaling 'dynamic'",
        ),
        (lambda c: c.pop("rope_parameters"), "rope_theta"),
        (lambda c: c.update(hidden_act="gelu"), "hidden_act"),
        (lambda c: c.update(attention_bias=True), "attention_bias"),
    ],
)
def test_unsupported_configs_are_refused(tmp_path, edit, message):
  path = copy_snapshot("llama3_tiny", tmp_path, edit)
  with pytest.raises(pretrained.SnapshotError, match=message):
    pretrained.load(path)


def test_missing_files_are_named(tmp_path):
  with pytest.raises(pretrained.SnapshotError, match="not a directory"):
    pretrained.load(str(tmp_path / "nowhere"))
  path = copy_snapshot("qwen2_tiny", tmp_path)
  os.remove(os.path.join(path, "tokenizer.json"))
  with pytest.raises(pretrained.SnapshotError, match="tokenizer.json"):
    pretrained.load(path)


def test_missing_tensor_is_named(tmp_path):
  path = copy_snapshot("llama3_tiny", tmp_path)
  _edit_tensors(path, lambda t: t.pop("model.layers.1.mlp.up_proj.weight"))
  with pytest.raises(
      pretrained.SnapshotError, match="model.layers.1.mlp.up_proj.weight"
  ):
    pretrained.load(path)


def _add_weight_file(path, name, tensors):
  from safetensors import numpy as safetensors_numpy  # pylint: disable=g-import-not-at-top

  safetensors_numpy.save_file(tensors, os.path.join(path, name))


def _weights(path):
  from safetensors import numpy as safetensors_numpy  # pylint: disable=g-import-not-at-top

  return safetensors_numpy.load_file(os.path.join(path, "model.safetensors"))


def test_a_tensor_in_two_weight_files_is_refused(tmp_path):
  """tunix reads every file and keeps the last one's tensor."""
  path = copy_snapshot("qwen2_tiny", tmp_path)
  norm = _weights(path)["model.norm.weight"]
  _add_weight_file(path, "other.safetensors", {"model.norm.weight": 2 * norm})
  with pytest.raises(
      pretrained.SnapshotError,
      match="model.norm.weight is in both model.safetensors and "
      "other.safetensors",
  ):
    pretrained.load(path)


def test_weight_files_the_index_does_not_name_are_refused(tmp_path):
  path = copy_snapshot("qwen2_tiny", tmp_path)
  names = sorted(_weights(path))
  index = {"weight_map": {name: "model.safetensors" for name in names}}
  with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
    json.dump(index, f)
  pretrained.check(path)  # the index names every file and tensor
  _add_weight_file(  # another model's shard, left behind
      path,
      "model-00002-of-00002.safetensors",
      {"model.layers.2.mlp.up_proj.weight": np.zeros((64, 32), np.float32)},
  )
  with pytest.raises(
      pretrained.SnapshotError,
      match="does not name: model-00002-of-00002.safetensors",
  ):
    pretrained.load(path)


@pytest.mark.parametrize(
    "edit, message",
    [
        (
            lambda c: c.update(num_hidden_layers=1),
            r"9 tensor\(s\) in the safetensors files are not in the llama "
            r"model of config.json \(1 layers.*model.layers.1.",
        ),
        (
            lambda c: c.update(intermediate_size=48),
            r"another shape .*model.layers.0.mlp.down_proj.weight \(32, 64\) "
            r"\(not \(32, 48\)\)",
        ),
    ],
)
def test_weights_beyond_the_config_are_refused(tmp_path, edit, message):
  """A config.json naming fewer layers loaded, the last layer ignored."""
  path = copy_snapshot("llama3_tiny", tmp_path, edit)
  with pytest.raises(pretrained.SnapshotError, match=message):
    pretrained.load(path)


def test_a_saved_head_of_tied_embeddings_must_equal_them(tmp_path):
  path = copy_snapshot("qwen2_tiny", tmp_path)
  _edit_tensors(
      path,
      lambda t: t.update({"lm_head.weight": t["model.embed_tokens.weight"]}),
  )
  pretrained.check(path)  # as transformers saves some tied models
  _edit_tensors(
      path, lambda t: t.update({"lm_head.weight": 2 * t["lm_head.weight"]})
  )
  with pytest.raises(pretrained.SnapshotError, match="lm_head.weight differs"):
    pretrained.load(path)


def test_missing_or_truncated_weights_are_one_error(tmp_path):
  path = copy_snapshot("qwen2_tiny", tmp_path)
  weights = pathlib.Path(path) / "model.safetensors"
  data = weights.read_bytes()
  weights.write_bytes(data[: len(data) // 2])
  with pytest.raises(pretrained.SnapshotError, match="cut short or corrupt"):
    pretrained.load(path)
  weights.unlink()
  with pytest.raises(pretrained.SnapshotError, match="no \\*.safetensors"):
    pretrained.load(path)


def _without_digit(path, digit="7"):
  """The snapshot's tokenizer.json with no single-digit token ``digit``."""
  file = os.path.join(path, "tokenizer.json")
  with open(file) as f:
    tokenizer = json.load(f)
  vocab = tokenizer["model"]["vocab"]
  vocab[f"<digit{digit}>"] = vocab.pop(digit)
  tokenizer["model"]["merges"] = [
      m
      for m in tokenizer["model"]["merges"]
      if digit not in (m.split(" ") if isinstance(m, str) else m)
  ]
  with open(file, "w") as f:
    json.dump(tokenizer, f)
  return path


def test_a_snapshot_without_digit_tokens_is_a_config_error(tmp_path):
  """Before the data is read: the trainer's checks refuse it in one line."""
  path = _without_digit(copy_snapshot("qwen2_tiny", tmp_path))
  config = make_config(str(tmp_path / "no-data"))
  config.pretrained = path
  with pytest.raises(train.ConfigError, match="tokenizer.json: .*'7'"):
    checks.check_config(config)


# ----------------------------------------------------------------------------
# The task's batches.


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  directory = tmp_path_factory.mktemp("data")
  arithmetic_data.prepare(str(directory), train_size=64, test_size=16, seed=0)
  return str(directory)


def make_config(data_dir, name="qwen2_tiny", method="ntil", **overrides):
  config = arithmetic_mix_llm.get_config(method)
  config.data_dir = data_dir
  config.pretrained = str(FIXTURES / name)
  config.batch_size = 8
  config.train_steps = 6
  config.learning_rate = 3e-3
  config.warmup_steps = 1
  config.log_every_steps = 1
  config.eval_every_steps = 0
  config.checkpoint_every_steps = 3
  config.eval_batch_size = 8
  config.eval_examples = 8
  config.max_question_len = 64
  config.max_answer_len = 8
  for key, value in overrides.items():
    config[key] = value
  return config


@pytest.mark.parametrize("split_digits", [False, True])
def test_batches_score_the_answer_and_its_digits(data_dir, split_digits):
  config = make_config(
      data_dir,
      "llama3_tiny",
      split_digits=split_digits,
      max_answer_len=12,
      tokenize_joined=False,
  )
  lm = pretrained.load(config.pretrained)
  questions = ["What is 1234 + 5?", "Calculate -3/7."]
  answers = ["1239", "-3/7"]
  batch = task.encode_examples(config, questions, answers)
  assert batch["inputs"].shape == batch["targets"].shape
  assert batch["inputs"].shape[1] == task.sequence_length(config)
  np.testing.assert_array_equal(
      batch["inputs"][:, 1:], batch["targets"][:, :-1]
  )
  for row, answer in enumerate(answers):
    scored = batch["targets"][row][batch["loss_mask"][row]].tolist()
    assert scored[-1] == lm.eos_id
    assert lm.tokenizer.decode(scored[:-1]) == answer
    assert scored[:-1] == lm.encode(answer, split_digits=split_digits)
    digits = batch["targets"][row][batch["digit_mask"][row]].tolist()
    assert digits == [t for t in scored if t in lm.digit_token_ids.tolist()]
    assert not (batch["digit_mask"][row] & ~batch["loss_mask"][row]).any()
    # Llama's prompt starts with BOS; the input is the prompt and the answer.
    assert batch["inputs"][row][0] == lm.bos_id
  # The window the step unembeds: K distinct positions per row, in range,
  # holding every scored one (the prompt's end is its first).
  positions = batch["score_positions"]
  length = batch["targets"].shape[1]
  assert positions.shape == (len(answers), config.max_answer_len + 1)
  for row in range(len(answers)):
    assert len(set(positions[row].tolist())) == positions.shape[1]
    assert 0 <= positions[row].min() and positions[row].max() < length
    scored = set(np.flatnonzero(batch["loss_mask"][row]).tolist())
    assert scored <= set(positions[row].tolist())
  with pytest.raises(ValueError, match="max_answer_len"):
    task.encode_examples(config, ["Q?"], ["1" * 40])
  if split_digits:
    assert batch["digit_mask"][0].sum() == 4
  else:
    assert batch["digit_mask"][0].sum() == 1  # "123" + "9": only 9 alone


@pytest.mark.parametrize("name", ["qwen2_tiny", "llama3_tiny"])
@pytest.mark.parametrize("split_digits", [False, True])
def test_joined_tokenization_is_the_tokenizers_own(
    data_dir, name, split_digits
):
  """With tokenize_joined (the default), the prompt and its answer are the
  tokenizer's tokens of the whole text: the template's last space goes
  with the answer ('Ġ-' of a negative one), and evaluation prompts end
  before it, where training's do."""
  config = make_config(data_dir, name, split_digits=split_digits)
  assert config.tokenize_joined and task.separator(config) == " "
  lm = pretrained.load(config.pretrained)
  bos = [lm.bos_id] if name == "llama3_tiny" else []
  questions = ["What is 1234 + 5?", "Calculate 0.5 - 2."]
  answers = ["1239", "-1.5"]
  batch = task.encode_examples(config, questions, answers)
  prompts, lengths = task.encode_prompts(config, questions)
  for row, (question, answer) in enumerate(zip(questions, answers)):
    text = config.prompt_template.format(question=question) + answer
    whole = lm.encode(text, split_digits=split_digits)
    prompt = prompts[row, : lengths[row]].tolist()
    assert prompt == bos + lm.encode(
        text[: -len(answer) - 1], split_digits=split_digits
    )
    scored = batch["targets"][row][batch["loss_mask"][row]].tolist()
    assert scored[-1] == lm.eos_id
    # The prompt's tokens and the scored ones are the whole text's.
    assert prompt[len(bos) :] + scored[:-1] == whole
    assert lm.tokenizer.decode(scored[:-1]) == " " + answer
    # The inputs are the prompt then the answer, as evaluation continues.
    assert batch["inputs"][row][: lengths[row]].tolist() == prompt
    digits = batch["targets"][row][batch["digit_mask"][row]].tolist()
    assert digits == [t for t in scored if t in lm.digit_token_ids.tolist()]
  # The negative answer's sign takes the space, as the tokenizer writes it.
  first = batch["targets"][1][batch["loss_mask"][1]][0]
  assert lm.tokenizer.decode([first]) == " -"
  assert task.answer_tokens(config) == config.max_answer_len + 1
  assert batch["score_positions"].shape[1] == config.max_answer_len + 2
  # Apart, the space ends the prompt and the answer is encoded alone.
  apart = make_config(
      data_dir, name, split_digits=split_digits, tokenize_joined=False
  )
  batch = task.encode_examples(apart, questions[1:], answers[1:])
  scored = batch["targets"][0][batch["loss_mask"][0]].tolist()
  assert scored[:-1] == lm.encode("-1.5", split_digits=split_digits)
  prompts, lengths = task.encode_prompts(apart, questions[1:])
  assert lm.tokenizer.decode(prompts[0, : lengths[0]].tolist()).endswith(
      "Answer: "
  )


def test_a_token_across_the_prompts_end_is_refused_joined(data_dir):
  # The template ends in ' i' (no space to leave to the answer): with an
  # answer 's' the tokenizer writes ' is' as one token, and no evaluation
  # prompt ends where that training row's prompt would.
  config = make_config(data_dir, prompt_template="Q: {question} i")
  assert task.separator(config) == ""
  assert task.encode_examples(config, ["2 + 2"], ["4"])["inputs"].size
  with pytest.raises(ValueError, match="tokenize_joined=False"):
    task.encode_examples(config, ["2 + 2"], ["s"])


def test_qwen_prompts_have_no_bos(data_dir):
  config = make_config(data_dir, tokenize_joined=False)
  lm = pretrained.load(config.pretrained)
  prompts, lengths = task.encode_prompts(config, ["What is 2 + 2?"])
  text = config.prompt_template.format(question="What is 2 + 2?")
  assert prompts[0, : lengths[0]].tolist() == lm.encode(text)


def test_prompts_padded_to_the_longest_in_tokens(data_dir):
  config = make_config(data_dir, "llama3_tiny", max_question_len=80)
  char_bound = task.prompt_length(config)
  # The longest prompt of both splits, counted directly, rounded up to 8.
  lm = pretrained.load(config.pretrained)
  longest = 0
  for split in ("train", "test"):
    source, usable = task._usable(config, split)
    for record in source.__getitems__([int(i) for i in usable]):
      question, _ = input_pipeline.decode_record(record)
      # Joined (the default), the template's last space is the answer's.
      text = config.prompt_template.format(question=question)[:-1]
      longest = max(longest, 1 + len(lm.encode(text)))  # BOS + prompt
  measured = task.longest_prompt_tokens(config)
  assert measured == -(-longest // 8) * 8
  assert measured < char_bound
  tight = make_config(
      data_dir, "llama3_tiny", max_question_len=80, max_prompt_tokens=measured
  )
  assert task.prompt_length(tight) == measured
  assert task.answer_tokens(tight) == tight.max_answer_len + 1  # the space
  assert task.sequence_length(tight) == measured + tight.max_answer_len + 1
  # Nothing is skipped at the measured bound; below it, the longer prompts.
  for split in ("train", "test"):
    assert len(task._usable(tight, split)[1]) == len(
        task._usable(config, split)[1]
    )
  short = make_config(
      data_dir,
      "llama3_tiny",
      max_question_len=80,
      max_prompt_tokens=longest - 1,
  )
  kept = task._usable(short, "train")[1]
  assert 0 < len(kept) < len(task._usable(config, "train")[1])
  source = task._usable(short, "train")[0]
  records = source.__getitems__([int(i) for i in kept])
  questions = [input_pipeline.decode_record(r)[0] for r in records]
  assert task.prompt_tokens(short, questions).max() <= longest - 1
  batch = task.encode_examples(tight, questions[:2], ["12", "3"])
  assert batch["inputs"].shape == (2, task.sequence_length(tight))


def test_config_errors_are_one_line(data_dir):
  for overrides, message in [
      (dict(pretrained=""), "--config.pretrained"),
      (dict(pretrained="/nonexistent"), "not a directory"),
      (dict(prompt_template="Q: {q}"), "prompt_template"),
      (dict(dtype="float16"), "dtype"),
      (dict(param_dtype="float16"), "param_dtype 'float16' is not supported"),
      (dict(max_prompt_tokens=-1), "max_prompt_tokens must be >= 0"),
  ]:
    with pytest.raises(train.ConfigError, match=message):
      checks.check_config(make_config(data_dir, **overrides))


# ----------------------------------------------------------------------------
# Fine-tuning through the CLI and in process.


def logged(workdir, key="loss"):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    records = [json.loads(line) for line in f]
  return {r["step"]: r[key] for r in records if key in r}


@pytest.mark.slow
@pytest.mark.parametrize(
    "name, method, split_digits, number_tokens",
    [
        ("qwen2_tiny", "ce", False, False),
        ("llama3_tiny", "ntil", True, False),
        # Llama 3's own 1-3 digit tokens, each number scored as one.
        ("llama3_tiny", "ntil", False, True),
    ],
)
def test_cli_fine_tune_is_finite_and_falling(
    data_dir, tmp_path, name, method, split_digits, number_tokens
):
  command = [
      sys.executable,
      "-m",
      "train.main",
      f"--config={ROOT}/configs/arithmetic_mix_llm.py:{method}",
      f"--workdir={tmp_path}",
      f"--config.data_dir={data_dir}",
      f"--config.pretrained={FIXTURES / name}",
      f"--config.split_digits={split_digits}",
      f"--config.number_tokens={number_tokens}",
      "--config.train_steps=8",
      "--config.batch_size=8",
      "--config.learning_rate=3e-3",
      "--config.warmup_steps=1",
      "--config.log_every_steps=1",
      "--config.eval_every_steps=8",
      "--config.eval_examples=8",
      "--config.eval_batch_size=8",
      "--config.checkpoint_every_steps=8",
  ]
  result = launch.run(
      command, cwd=ROOT, capture_output=True, text=True, timeout=600
  )
  assert result.returncode == 0, result.stderr[-3000:]
  losses = logged(str(tmp_path))
  assert sorted(losses) == list(range(1, 9))
  assert all(np.isfinite(v) for v in losses.values())
  assert np.mean([losses[7], losses[8]]) < np.mean([losses[1], losses[2]])
  numeric = logged(str(tmp_path), "numeric")
  if method == "ce":
    assert set(numeric.values()) == {0.0}
  else:
    assert all(v > 0 for v in numeric.values())
  assert logged(str(tmp_path), "exact_match")[8] >= 0.0
  assert "the numeric loss scores" in result.stderr
  if name == "llama3_tiny":  # every answer digit, in single or 1-3 digit tokens
    assert "the numeric loss scores 100.0% of answer digits" in result.stderr
  assert os.listdir(tmp_path / "checkpoints") == ["8"]


@pytest.mark.slow
def test_resume_equals_straight_run(data_dir, tmp_path):
  straight = make_config(data_dir, train_steps=6, lr_decay_steps=6)
  train.train_and_evaluate(straight, str(tmp_path / "straight"))
  half = make_config(data_dir, train_steps=3, lr_decay_steps=6)
  train.train_and_evaluate(half, str(tmp_path / "resumed"))
  # Resumed from the same snapshot, moved: the run's digest of it matches.
  moved = str(tmp_path / "moved" / "qwen2_tiny")
  shutil.copytree(straight.pretrained, moved)
  later = make_config(data_dir, train_steps=6, lr_decay_steps=6)
  later.pretrained = moved
  resumed = train.train_and_evaluate(later, str(tmp_path / "resumed"))
  assert resumed["step"] == 6
  want = logged(str(tmp_path / "straight"))
  assert sorted(want) == list(range(1, 7))
  assert logged(str(tmp_path / "resumed")) == want


def test_a_moved_snapshot_resumes_only_with_the_same_files(data_dir, tmp_path):
  config = make_config(data_dir)
  workdir = str(tmp_path / "run")
  os.makedirs(os.path.join(workdir, "checkpoints", "3"))
  rundir.write_config_record(
      workdir, config, checks.snapshot_record(config, workdir)
  )
  moved = make_config(data_dir)
  moved.pretrained = str(tmp_path / "moved")
  shutil.copytree(config.pretrained, moved.pretrained)
  assert checks.check_resumable(moved, workdir) == [
      ("pretrained", config.pretrained, moved.pretrained)
  ]
  # Moved and another field changed: refused for that field alone.
  moved.seed += 1
  with pytest.raises(errors.ConfigError) as refused:
    checks.check_resumable(moved, workdir)
  assert "seed" in str(refused.value)
  assert "pretrained" not in str(refused.value)
  moved.seed -= 1
  weights = pathlib.Path(moved.pretrained, "model.safetensors")
  data = bytearray(weights.read_bytes())
  data[-1] ^= 1  # one bit of one weight
  weights.write_bytes(bytes(data))
  with pytest.raises(errors.ConfigError, match="has other files"):
    checks.check_resumable(moved, workdir)
  # A record an older version wrote, with no digest: refused as before.
  rundir.write_config_record(workdir, config)
  shutil.rmtree(moved.pretrained)
  shutil.copytree(config.pretrained, moved.pretrained)
  with pytest.raises(errors.ConfigError, match="recorded no digest"):
    checks.check_resumable(moved, workdir)
  assert checks.check_resumable(config, workdir) == []


@pytest.mark.slow
def test_fsdp_and_tp_over_four_devices_equal_one(data_dir, tmp_path):
  """Two steps over tp=2, resumed over fsdp=2 of 4 CPU devices: one's losses.

  The parameters split over 'tp', then over 'fsdp': a checkpoint written
  in one layout resumes in another.
  """
  config = make_config(data_dir, "llama3_tiny", train_steps=3, lr_decay_steps=3)
  train.train_and_evaluate(config, str(tmp_path / "one"))
  script = f"""
import json, sys
import jax
from absl import flags
from configs import arithmetic_mix_llm
from train import train
from train.tasks import arithmetic_mix_llm as task
for overrides in json.loads(sys.argv[1]):
  config = arithmetic_mix_llm.get_config("ntil")
  config.update(overrides)
  mesh = task.make_mesh(config)
  model = task.create_model(config, mesh)
  value = model.lm.embedder.input_embedding.value
  print("SHARD", dict(mesh.shape), value.addressable_shards[0].data.shape)
  train.train_and_evaluate(config, {str(tmp_path / "four")!r})
"""
  overrides = {k: v for k, v in config.items()}
  runs = [
      {**overrides, "tp": 2, "train_steps": 2, "checkpoint_every_steps": 2},
      {**overrides, "fsdp": 2},
  ]
  result = launch.run(
      [sys.executable, "-c", script, json.dumps(runs)],
      cwd=ROOT,
      capture_output=True,
      text=True,
      timeout=600,
      # The session's XLA flags stay (tests/conftest.py: fast compiles).
      env=dict(os.environ, JAX_NUM_CPU_DEVICES="4"),
  )
  assert result.returncode == 0, result.stderr[-3000:]
  # The embedding [1408, 32] split over tp (its rows), then over fsdp.
  assert "SHARD {'data': 2, 'fsdp': 1, 'tp': 2} (704, 32)" in result.stdout
  assert "SHARD {'data': 2, 'fsdp': 2, 'tp': 1} (1408, 16)" in result.stdout
  one, four = logged(str(tmp_path / "one")), logged(str(tmp_path / "four"))
  assert sorted(four) == [1, 2, 3]
  for step, loss in one.items():
    assert four[step] == pytest.approx(loss, rel=1e-5)


def _edit_tensors(path, edit):
  from safetensors import numpy as safetensors_numpy  # pylint: disable=g-import-not-at-top

  file = os.path.join(path, "model.safetensors")
  tensors = safetensors_numpy.load_file(file)
  edit(tensors)
  safetensors_numpy.save_file(tensors, file)


def test_untied_qwen2_reads_its_lm_head(tmp_path):
  """An untied Qwen2 whose lm_head is the embedding: the tied logits."""
  path = copy_snapshot(
      "qwen2_tiny", tmp_path, lambda c: c.update(tie_word_embeddings=False)
  )
  _edit_tensors(
      path,
      lambda t: t.update({"lm_head.weight": t["model.embed_tokens.weight"]}),
  )
  want = expected("qwen2_tiny")
  lm = pretrained.load(path)
  assert "lm_head" in vars(lm.model.lm)
  got = np.asarray(lm.logits(want["ids"]))
  np.testing.assert_allclose(got, want["logits"], atol=1e-4, rtol=1e-4)


def test_tied_llama_equals_untied_with_a_copied_head(tmp_path):
  untied = copy_snapshot("llama3_tiny", tmp_path / "untied")
  _edit_tensors(
      untied,
      lambda t: t.update({"lm_head.weight": t["model.embed_tokens.weight"]}),
  )
  tied = copy_snapshot(
      "llama3_tiny",
      tmp_path / "tied",
      lambda c: c.update(tie_word_embeddings=True),
  )
  _edit_tensors(tied, lambda t: t.pop("lm_head.weight"))
  ids = expected("llama3_tiny")["ids"]
  want = np.asarray(pretrained.load(untied).logits(ids))
  got = np.asarray(pretrained.load(tied).logits(ids))
  np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.slow
def test_answer_window_gives_the_full_rows_loss_and_gradient(data_dir):
  """The task's score_positions: the trainer's loss and gradient on a real
  (tiny) tunix model are those of unembedding every position."""
  from flax import nnx  # pylint: disable=g-import-not-at-top
  from train import step  # pylint: disable=g-import-not-at-top

  config = make_config(data_dir, "llama3_tiny", method="ntil")
  config.gumbel_noise = 0.0  # deterministic: the same loss twice
  model = pretrained.load(config.pretrained).model
  questions = ["What is 1234 + 5?", "Calculate 0.5 - 2.", "Sum 3 and 4."]
  batch = task.encode_examples(config, questions, ["1239", "-1.5", "7"])
  assert batch["score_positions"].shape[1] < batch["targets"].shape[1]
  full = {k: v for k, v in batch.items() if k != "score_positions"}

  @nnx.jit  # as the trainer runs it (and one program, not one per op)
  def loss_and_grad(model, data):
    def loss(m):
      return step.batch_loss(m, data, config, jax.random.key(0))[0]

    return nnx.value_and_grad(loss)(model)

  value, grads = loss_and_grad(model, jax.tree.map(jnp.asarray, batch))
  full_value, full_grads = loss_and_grad(model, jax.tree.map(jnp.asarray, full))
  assert np.isfinite(value) and value > 0
  np.testing.assert_allclose(value, full_value, rtol=1e-5)
  for ours, theirs in zip(
      jax.tree.leaves(nnx.state(grads)), jax.tree.leaves(nnx.state(full_grads))
  ):
    np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("name", SNAPSHOTS)
def test_bfloat16_computation_on_float32_parameters(name):
  """Mixed precision: float32 parameters and gradients, bfloat16 matmuls."""
  from flax import nnx  # pylint: disable=g-import-not-at-top

  path = str(FIXTURES / name)
  mixed = pretrained.load(path, dtype="bfloat16", param_dtype="float32")
  pure = pretrained.load(path, dtype="bfloat16")
  assert _param_dtypes(mixed.model) == {jnp.dtype(jnp.float32)}
  assert mixed.model.compute_dtype == jnp.bfloat16
  want = expected(name)
  ids = jnp.asarray(want["ids"])
  hidden = nnx.jit(lambda model, ids: model.hidden_states(ids))
  assert hidden(mixed.model, ids).dtype == jnp.bfloat16
  assert mixed.model.unembedding.dtype == jnp.bfloat16
  got = np.asarray(mixed.logits(want["ids"]))
  assert got.dtype == np.float32
  # bfloat16 parameters hold the same rounded values: the same computation.
  np.testing.assert_allclose(
      got, np.asarray(pure.logits(want["ids"])), atol=0.02
  )
  assert np.abs(got - want["logits"]).max() > 1e-3  # not float32's

  # One compiled program, not one per operation (each compiles on its own).
  grads = nnx.jit(nnx.grad(lambda m: m(ids).sum()))(mixed.model)
  leaves = [np.asarray(g) for g in jax.tree.leaves(nnx.state(grads))]
  assert {g.dtype for g in leaves} == {np.dtype(np.float32)}
  assert all(np.isfinite(g).all() for g in leaves)
  assert sum(float(np.abs(g).sum()) for g in leaves) > 0


def _sub_jaxprs(eqn):
  for value in eqn.params.values():
    for item in value if isinstance(value, (list, tuple)) else [value]:
      if isinstance(item, jax.extend.core.ClosedJaxpr):
        yield item.jaxpr
      elif isinstance(item, jax.extend.core.Jaxpr):
        yield item


def _scan_bodies(jaxpr):
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == "scan":
      yield eqn.params["jaxpr"].jaxpr
    for sub in _sub_jaxprs(eqn):
      yield from _scan_bodies(sub)


def _float32_casts(jaxpr, shapes):
  """float32 -> bfloat16 casts of arrays of the given shapes, nested too."""
  count = 0
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == "convert_element_type":
      source = eqn.invars[0].aval
      count += (
          source.dtype == jnp.float32
          and eqn.outvars[0].aval.dtype == jnp.bfloat16
          and tuple(source.shape) in shapes
      )
    for sub in _sub_jaxprs(eqn):
      count += _float32_casts(sub, shapes)
  return count


def test_mixed_precision_decode_casts_parameters_once():
  """bfloat16 decoding of float32 Llama parameters: the same tokens as the
  bfloat16 model, and no parameter cast inside the per-token loop."""
  from flax import nnx  # pylint: disable=g-import-not-at-top

  path = str(FIXTURES / "llama3_tiny")
  mixed = pretrained.load(path, dtype="bfloat16", param_dtype="float32")
  pure = pretrained.load(path, dtype="bfloat16")
  prompts = np.asarray(
      [[7, 8, 9, 5, 5, 5], [10, 11, 12, 13, 14, 15], [3, 5, 5, 5, 5, 5]],
      np.int32,
  )
  lengths = np.asarray([3, 6, 1], np.int32)
  decode = lambda lm: jax.jit(
      lambda p, n: lm.model.greedy_decode(p, n, 5, -1, 0)
  )(prompts, lengths)
  np.testing.assert_array_equal(decode(mixed), decode(pure))

  shapes = {
      tuple(x.shape)
      for x in jax.tree.leaves(nnx.state(mixed.model, nnx.Param))
      if x.ndim >= 2
  }
  shapes |= {s[::-1] for s in shapes}  # the tied unembedding's transpose
  jaxpr = jax.make_jaxpr(
      lambda p, n: mixed.model.greedy_decode(p, n, 5, -1, 0)
  )(prompts, lengths).jaxpr
  bodies = list(_scan_bodies(jaxpr))
  assert bodies  # the decoding loop is a scan
  assert [_float32_casts(body, shapes) for body in bodies] == [0] * len(bodies)
  assert _float32_casts(jaxpr, shapes) > 0  # cast before the loop


def test_trainer_computes_in_dtype_and_keeps_param_dtype(data_dir):
  """--config.dtype=bfloat16 (the default param_dtype float32): a train
  step updates float32 parameters from a bfloat16 computation."""
  from flax import nnx  # pylint: disable=g-import-not-at-top
  from train import step  # pylint: disable=g-import-not-at-top

  config = make_config(data_dir, "llama3_tiny", dtype="bfloat16")
  assert config.param_dtype == "float32"
  task.check_config(config)
  model = task.create_model(config, task.make_mesh(config))
  assert model.compute_dtype == jnp.bfloat16
  before = jax.tree.map(np.array, nnx.state(model, nnx.Param))  # copies
  optimizer = nnx.Optimizer(model, step.make_optimizer(config), wrt=nnx.Param)
  batch = task.encode_examples(
      config, ["What is 1234 + 5?", "Sum 3 and 4."], ["1239", "7"]
  )
  train_step = step.make_train_step(config)
  for index in range(2):  # the learning rate is 0 at step 0 (warmup)
    metrics = train_step(
        model, optimizer, jax.tree.map(jnp.asarray, batch), index
    )
    assert np.isfinite(float(metrics["loss"]))
  after = nnx.state(model, nnx.Param)
  assert _param_dtypes(model) == {jnp.dtype(jnp.float32)}
  moved = [
      float(np.abs(np.asarray(a) - b).max())
      for a, b in zip(jax.tree.leaves(after), jax.tree.leaves(before))
  ]
  assert max(moved) > 0


def test_a_run_recorded_before_joined_tokenization_resumes_apart(data_dir):
  """A record without ``tokenize_joined`` and ``prompt_bos`` was trained
  apart, with the family's BOS: resuming it with the new defaults is
  refused (both values named); with the old ones it is the same run."""
  config = make_config(data_dir)
  recorded = rundir.config_record(config)
  del recorded["tokenize_joined"], recorded["prompt_bos"]
  resumable, refused = checks.config_changes(recorded, config)
  assert not resumable and refused == [
      ("prompt_bos", "llama", "tokenizer"),
      ("tokenize_joined", False, True),
  ]
  config.tokenize_joined, config.prompt_bos = False, "llama"
  assert checks.config_changes(recorded, config) == ([], [])


def test_a_special_token_in_a_prediction_is_not_dropped(data_dir, tmp_path):
  """Decoding skipped special tokens: '1', <|begin_of_text|>, '5' scored as
  the answer 15. Now they stay as text, and the answer ends at the first
  of config.json's end tokens (Llama 3.1 Instruct lists several)."""
  config = make_config(data_dir, "llama3_tiny")
  codec = task.codec(config)
  one, five = codec.tokenizer.encode("1"), codec.tokenizer.encode("5")
  special = 1366  # llama3_tiny's BOS, a special token
  eos = codec.eos_id
  assert codec.tokenizer.decode([special]) == ""  # skipped by default
  prediction = codec.decode(one + [special] + five + [eos, eos])
  assert (
      prediction
      == "1" + codec.tokenizer.decode([special], keep_special=True) + "5"
  )
  assert prediction != "15"
  assert task.score_answers([prediction], ["15"], config)["correct"] == 0
  assert codec.decode(one + five + [eos, special]) == "15"
  # An id past the tokenizer's 1,368 (the logits have 1,408 rows, which
  # greedy decoding can pick): `tokenizers` drops it, so it read as 15.
  padded = 1400
  assert codec.tokenizer.decode([padded]) == ""  # dropped by default
  assert codec.decode(one + [padded] + five + [eos]) == "1<unk:1400>5"
  assert codec.decode([padded, padded + 1]) == "<unk:1400><unk:1401>"
  # Two end tokens: the answer ends at the first of either.
  snapshot = tmp_path / "snapshot"
  shutil.copytree(config.pretrained, snapshot)
  hf_config = json.loads((snapshot / "config.json").read_text())
  hf_config["eos_token_id"] = [eos, special]
  (snapshot / "config.json").write_text(json.dumps(hf_config))
  config.pretrained = str(snapshot)
  both = task.codec(config)
  assert both.eos_id == eos and both.end_ids == [eos, special]
  assert both.decode(one + five + [special] + one + [eos]) == "15"
  # One listed in generation_config.json alone ends it too (Qwen2.5
  # Instruct's <|endoftext|>), as transformers' generate stops there.
  hf_config["eos_token_id"] = eos
  (snapshot / "config.json").write_text(json.dumps(hf_config))
  generation = dict(eos_token_id=[special, eos])
  (snapshot / "generation_config.json").write_text(json.dumps(generation))
  listed = task.codec(config)
  assert listed.eos_id == eos and listed.end_ids == [eos, special]
  assert listed.decode(one + five + [special] + one + [eos]) == "15"


def test_prompts_start_with_the_bos_the_tokenizer_adds(data_dir, tmp_path):
  """The BOS used to be config.json's for every llama-family model, so
  SmolLM2's prompts began with its chat marker '<|im_start|>', which its
  tokenizer never adds (its GGUF: add_bos_token false)."""
  question = ["What is 2 + 2?"]

  def prompt(config):
    prompts, lengths = task.encode_prompts(config, question)
    return prompts[0, : lengths[0]].tolist()

  llama = make_config(data_dir, "llama3_tiny")
  lm = pretrained.load(llama.pretrained)
  text = lm.encode("Question: What is 2 + 2?\nAnswer:")
  assert prompt(llama) == [lm.bos_id] + text  # its post-processor's
  qwen = make_config(data_dir, "qwen2_tiny")
  assert prompt(qwen) == pretrained.load(qwen.pretrained).encode(
      "Question: What is 2 + 2?\nAnswer:"
  )  # none
  # tokenizer_config.json's add_bos_token decides where it is set.
  for add, want in ((False, text), (True, [lm.bos_id] + text)):
    snapshot = tmp_path / f"add{add}"
    shutil.copytree(llama.pretrained, snapshot)
    tokenizer = json.loads((snapshot / "tokenizer.json").read_text())
    tokenizer["post_processor"] = None
    (snapshot / "tokenizer.json").write_text(json.dumps(tokenizer))
    (snapshot / "tokenizer_config.json").write_text(
        json.dumps(dict(add_bos_token=add))
    )
    config = make_config(data_dir, "llama3_tiny", pretrained=str(snapshot))
    assert prompt(config) == want
    # "llama", as the recorded SmolLM2 grid ran: the family's BOS.
    config.prompt_bos = "llama"
    assert prompt(config) == [lm.bos_id] + text
  with pytest.raises(ValueError, match="prompt_bos must be one of"):
    task.check_config(make_config(data_dir, prompt_bos="always"))
