r"""Parity fixtures for NTIL's peers, from their authors' PyTorch code.

Needs PyTorch, which the project itself does not install; run it by hand in
a separate environment, on checkouts of the reference repositories outside
this one and the ``ntloss`` package, then commit the output (about 150 KB),
so that CI needs neither torch nor their code::

  python3.12 -m venv /tmp/torchenv
  /tmp/torchenv/bin/pip install torch numpy ntloss==0.2.3
  git clone https://github.com/PolyU-VCLab/DEL /tmp/peers/DEL
  git -C /tmp/peers/DEL checkout 68c3d4dcc74e7f1918b9e41c4630adac9ffc2f56
  git clone https://github.com/Zuozhuo/smmd-loss /tmp/peers/smmd-loss
  git -C /tmp/peers/smmd-loss checkout 581fde6a38a07e75a3c7102e126bd702733df299
  /tmp/torchenv/bin/python scripts/make_peer_fixtures.py \
      --del_repo=/tmp/peers/DEL --smmd_repo=/tmp/peers/smmd-loss \
      --ntloss --out=tests/fixtures/peers

Each peer's file is written where its source is given (``--del_repo``,
``--smmd_repo``, ``--ntloss``), so one can be remade alone.

The authors' code is run as it is, never copied into this repository:

* DEL (PolyU-VCLab/DEL, Apache-2.0, commit 68c3d4d): the functions
  ``generate_place`` and ``DEL`` are nested in ``custom_compute_loss`` of
  ``train-qwen-deepseek.py`` (a script that needs transformers and a GPU
  to import); their source is cut out of the file by name, dedented and
  executed with torch, ``F``, ``math`` and ``pad_sequence``, the names they
  use. ``DEL`` is called as ``custom_compute_loss`` calls it, on the
  batch's logits and labels flattened with the ignored positions (label
  -100) removed, with a stand-in tokenizer whose ``convert_tokens_to_ids``
  maps '0'..'9' and '.' to this fixture's ids. Recorded: its scalar (0.01
  times the mean over the batch's digits), its gradient w.r.t. the
  ``[B, T, V]`` float32 logits, and the place weights their
  ``generate_place`` gives the digits (float32, a few 1e-6 off the exact
  weights: ``log(1.02**k) / log(1.02)``). The ``DEL`` of
  ``train-codellama-mistral.py`` (weight 0.1) does not run as published:
  it names ``probs_digit``, which it never defines (it computes
  ``probs = softmax(logits_digit)``, the same values), so it is not used.
* SMMD (Zuozhuo/smmd-loss, no licence file, commit 581fde6): the package
  ``smmd`` is imported from the checkout and ``SMMDLoss`` built with a
  stand-in tokenizer whose single-token integers are the ten digits (as a
  digit-level tokenizer's are), for each setting in ``SMMD_SETTINGS``.
  Recorded: ``SMMDLoss(...)(logits, labels)`` (the mean over numeric
  targets) and its gradient w.r.t. the logits.
* NL-NTL (``ntloss`` 0.2.3 from PyPI, MIT, the package of "Regress, Don't
  Guess", ICML 2025): ``ntloss.NumberLevelLoss`` built with a stand-in
  tokenizer (the ten digits and '.' at this fixture's ids, every other id a
  word) for each setting in ``NL_NTL_SETTINGS``. Recorded: its
  ``reduction="none"`` output (each number's loss on its first digit) and
  the gradient of its ``"sum"`` w.r.t. the logits. No row starts with a
  number or holds one with a leading point (see ``ntil_jax.nl_ntl_loss``).

The files used are checked against their git blob ids at those commits.
Everything is seeded: rerunning gives the same arrays.
"""

import argparse
import hashlib
import json
import math
import os
import re
import sys
import textwrap

import numpy as np
import torch
from torch.nn.utils.rnn import pad_sequence
import torch.nn.functional as F

# Git blob ids of the files used, at the commits named above.
DEL_FILES = {
    "train-qwen-deepseek.py": "7494cbeb1038fc1a91ce3e8f65c820e0c73bda93",
}
SMMD_FILES = {
    "smmd/__init__.py": "da1dae85e21a370ed89a55b26b007a91119c8643",
    "smmd/digit_tokens.py": "2946685b783832cfc767bcafa829ce10e4200831",
    "smmd/kernels.py": "363ae1c7ed36d2b4660106fed6acd9ec23572f00",
    "smmd/loss.py": "601c1f9d7c5457aad28c7fbf7747883905cef965",
}
NTLOSS_VERSION = "0.2.3"
NTLOSS_FILES = {
    "ntloss/core.py": "7efa2c43a08d20eca2d846709ad1955f482819bf",
    "ntloss/utils.py": "977d022358d991c298a9d054b9842d95ec96bd4b",
}

VOCAB = 24
# Digit ids as a tokenizer might have them: not 0..9, not in order.
DIGIT_IDS = (17, 3, 21, 9, 14, 11, 4, 19, 20, 7)
POINT_ID = 12
OTHER_IDS = tuple(
    i for i in range(VOCAB) if i not in DIGIT_IDS and i != POINT_ID
)

# SMMDLoss keyword arguments, each recorded separately; the JAX names are
# in tests/test_peer_losses.py.
SMMD_SETTINGS = {
    "default": {},
    "mmd": dict(loss_mode="mmd"),
    "smooth": dict(loss_mode="smooth"),
    "laplace_two_sigmas": dict(kernel_type="laplace", sigmas=(1.0, 3.0)),
    "squash5_fixed_weight": dict(
        sigmas=(1.5,), squash_factor=5.0, tau_mode="fixed", tau_fixed=0.5
    ),
    "no_squash": dict(sigmas=(0.7, 2.5), squash_factor=1.0),
}

# NumberLevelLoss keyword arguments, each recorded separately.
NL_NTL_SETTINGS = {
    "integer": dict(float_level=False, reweigh=False),
    "float_level": dict(float_level=True, reweigh=False),
    "reweigh": dict(float_level=False, reweigh=True),
    "float_level_reweigh": dict(float_level=True, reweigh=True),
}


def blob_id(path):
  with open(path, "rb") as f:
    data = f.read()
  return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def check_files(root, files):
  for name, want in files.items():
    got = blob_id(os.path.join(root, name))
    if got != want:
      raise SystemExit(
          f"{os.path.join(root, name)}: git blob {got}, expected {want} "
          "(the pinned commit's)."
      )


def nested_function(source, name):
  """The source of ``def name(`` nested one level (4 spaces) in ``source``."""
  lines = source.splitlines()
  start = next(
      i for i, line in enumerate(lines) if line.startswith(f"    def {name}(")
  )
  end = start + 1
  while end < len(lines) and (
      not lines[end].strip() or re.match(r"^\s{5,}", lines[end])
  ):
    end += 1
  return textwrap.dedent("\n".join(lines[start:end])) + "\n"


def load_del(path):
  """Their ``DEL`` and ``generate_place``, executed from ``path``."""
  with open(path) as f:
    source = f.read()
  namespace = dict(torch=torch, F=F, math=math, pad_sequence=pad_sequence)
  for name in ("generate_place", "DEL"):
    exec(nested_function(source, name), namespace)  # pylint: disable=exec-used
  return namespace["DEL"], namespace["generate_place"]


def del_places(generate_place, labels):
  """Their place weight of each digit of the flattened ``labels``, in order.

  The groups are built as ``DEL`` builds them (runs of consecutive digit
  and '.' labels, digits as 0..9 and '.' as 10, padded with -2), then
  their ``generate_place``; ``place[digit1]`` as ``DEL`` reads it. For the
  tests, to tell their float32 places from the loss.
  """
  codes = {i: d for d, i in enumerate(DIGIT_IDS)} | {POINT_ID: 10}
  groups, current = [], []
  for label in labels:
    if int(label) in codes:
      current.append(codes[int(label)])
    elif current:
      groups.append(current)
      current = []
  if current:
    groups.append(current)
  g = pad_sequence(
      [torch.tensor(group) for group in groups],
      batch_first=True,
      padding_value=-2,
  )
  place, _ = generate_place(g.float())
  return place[(g >= 0) & (g <= 9)].numpy()


class Tokenizer:
  """What their code asks of a tokenizer, for this fixture's ids."""

  vocab_size = VOCAB
  _ids = {str(d): i for d, i in enumerate(DIGIT_IDS)} | {".": POINT_ID}

  def convert_tokens_to_ids(self, tokens):
    return [self._ids[t] for t in tokens]

  def encode(self, text, add_special_tokens=False):
    del add_special_tokens
    # A digit-level tokenizer: every character its own token.
    return [self._ids.get(c, OTHER_IDS[0]) for c in text]


def number_tokens(rng, kind):
  """A number's labels: integer, decimal, or with a '.' at an end."""
  digits = lambda n: list(rng.choice(DIGIT_IDS, n))
  if kind == "integer":
    return digits(rng.integers(1, 7))
  if kind == "long":
    return digits(rng.integers(8, 13))
  if kind == "decimal":
    return digits(rng.integers(1, 5)) + [POINT_ID] + digits(rng.integers(1, 6))
  if kind == "sentence_end":  # "42." at the end of a sentence
    return digits(rng.integers(1, 4)) + [POINT_ID]
  if kind == "decimal_end":  # "3.14."
    return digits(rng.integers(1, 3)) + [POINT_ID] + digits(2) + [POINT_ID]
  if kind == "leading_point":  # ".25"
    return [POINT_ID] + digits(rng.integers(1, 4))
  raise ValueError(kind)


KINDS = (
    "integer",
    "integer",
    "decimal",
    "decimal",
    "long",
    "sentence_end",
    "decimal_end",
    "leading_point",
)


def del_row(rng, length, touching, kinds=KINDS):
  """One row of labels: a prompt of -100, numbers between other tokens, an
  end token, padding. ``touching``: numbers also right at the row's ends
  and around an ignored position (where the authors' runs continue)."""
  row = [-100] * int(rng.integers(1, 4))
  row += [] if touching else [int(rng.choice(OTHER_IDS))]
  while True:
    kind = kinds[rng.integers(len(kinds))]
    piece = number_tokens(rng, kind)
    # Not after "3.14.": their run "3.14.7" would have two points.
    if touching and kind != "decimal_end" and rng.random() < 0.3:
      piece = piece + [-100] + number_tokens(rng, "integer")
    gap = [int(rng.choice(OTHER_IDS)) for _ in range(rng.integers(1, 3))]
    if len(row) + len(piece) + len(gap) + 2 > length:
      break
    row += [int(x) for x in piece] + gap
  if touching:
    row += number_tokens(rng, "integer")
  else:
    row += [int(rng.choice(OTHER_IDS))]
  row = row[:length]
  return row + [-100] * (length - len(row))


def row_cases(rng, specs, kinds=KINDS):
  """(logits, labels, touching) of each ``(batch, length, scale,
  touching)`` in ``specs``: rows of ``del_row``, random logits."""
  for batch, length, scale, touching in specs:
    labels = np.array(
        [del_row(rng, length, touching, kinds) for _ in range(batch)],
        np.int64,
    )
    logits = (scale * rng.standard_normal((batch, length, VOCAB))).astype(
        np.float32
    )
    yield logits, labels, touching


def del_cases(rng):
  """(logits, labels, touching) of each case: shapes, scales, rows."""
  specs = [
      (2, 24, 2.0, False),
      (3, 40, 3.0, False),
      (1, 64, 1.0, False),
      (4, 16, 6.0, False),
      (2, 30, 2.0, True),
  ]
  return row_cases(rng, specs)


def run_del(fn, logits, labels):
  """Their loss and its gradient, called as custom_compute_loss calls it."""
  z = torch.tensor(logits, requires_grad=True)
  y = torch.tensor(labels)
  valid = y.view(-1) != -100
  loss = fn(z.view(-1, VOCAB)[valid], y.view(-1)[valid], Tokenizer())
  loss.backward()
  return float(loss.detach()), z.grad.numpy().copy()


def smmd_cases(rng):
  specs = [(2, 16, 2.0), (3, 12, 4.0), (1, 20, 0.5)]
  for batch, length, scale in specs:
    kind = rng.random((batch, length))
    labels = np.where(
        kind < 0.6,
        rng.choice(DIGIT_IDS, (batch, length)),
        rng.choice(OTHER_IDS + (POINT_ID,), (batch, length)),
    )
    labels = np.where(kind > 0.9, -100, labels).astype(np.int64)
    logits = (scale * rng.standard_normal((batch, length, VOCAB))).astype(
        np.float32
    )
    # A position predicted exactly right: r = p - q is 0 to float32.
    logits[0, 0] = 0.0
    labels[0, 0] = DIGIT_IDS[4]
    logits[0, 0, DIGIT_IDS[4]] = 60.0
    yield logits, labels


def run_smmd(loss_module, logits, labels):
  z = torch.tensor(logits, requires_grad=True)
  loss = loss_module(z, torch.tensor(labels))
  loss.backward()
  return float(loss.detach()), z.grad.numpy().copy()


class NTLTokenizer:
  """What ntloss asks of a tokenizer, for this fixture's ids."""

  def __init__(self):
    self._vocab = {f"<w{i}>": i for i in range(VOCAB)}
    for token, i in Tokenizer._ids.items():  # pylint: disable=protected-access
      del self._vocab[f"<w{i}>"]
      self._vocab[token] = i

  def __len__(self):
    return VOCAB

  def add_tokens(self, tokens):
    assert all(t in self._vocab for t in tokens), tokens
    return 0

  def get_vocab(self):
    return dict(self._vocab)

  def convert_tokens_to_ids(self, token):
    return self._vocab[token]


def nl_ntl_cases(rng):
  """(logits, labels): rows as DEL's, without leading points."""
  kinds = tuple(k for k in KINDS if k != "leading_point")
  specs = [
      (2, 24, 2.0, False),
      (3, 40, 3.0, False),
      (2, 30, 1.0, True),
      (1, 48, 6.0, True),
  ]
  for logits, labels, _ in row_cases(rng, specs, kinds):
    yield logits, labels


def run_nl_ntl(loss_module, logits, labels):
  """Their ``"none"`` output and the gradient of their ``"sum"``."""
  z = torch.tensor(logits, requires_grad=True)
  y = torch.tensor(labels)
  per_token = loss_module(z, y, reduction="none").detach().numpy().copy()
  loss_module(z, y, reduction="sum").backward()
  return per_token, z.grad.numpy().copy()


def ntloss_fixtures(out):
  import ntloss  # pylint: disable=g-import-not-at-top

  if ntloss.__version__ != NTLOSS_VERSION:
    raise SystemExit(f"ntloss {ntloss.__version__}, expected {NTLOSS_VERSION}")
  check_files(os.path.dirname(os.path.dirname(ntloss.__file__)), NTLOSS_FILES)
  modules = {
      name: ntloss.NumberLevelLoss(NTLTokenizer(), vocab_size=VOCAB, **kwargs)
      for name, kwargs in NL_NTL_SETTINGS.items()
  }
  arrays = dict(
      digit_ids=np.asarray(DIGIT_IDS),
      point_id=np.asarray(POINT_ID),
      settings=np.asarray(json.dumps(NL_NTL_SETTINGS)),
  )
  for i, (logits, labels) in enumerate(nl_ntl_cases(np.random.default_rng(2))):
    assert (labels[:, 0] == -100).all()  # no number starts a row
    arrays[f"case{i}_logits"] = logits
    arrays[f"case{i}_labels"] = labels
    for name, module in modules.items():
      per_token, grad = run_nl_ntl(module, logits, labels)
      arrays[f"case{i}_{name}_per_token"] = per_token
      arrays[f"case{i}_{name}_grad"] = grad
      print(f"NL-NTL case {i} {name}: sum {per_token.sum():.7g}")
  np.savez_compressed(os.path.join(out, "nl_ntl.npz"), **arrays)


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--del_repo")
  parser.add_argument("--smmd_repo")
  parser.add_argument("--ntloss", action="store_true")
  parser.add_argument("--out", default="tests/fixtures/peers")
  args = parser.parse_args()
  os.makedirs(args.out, exist_ok=True)
  torch.use_deterministic_algorithms(True)
  if args.del_repo:
    del_fixtures(args.del_repo, args.out)
  if args.smmd_repo:
    smmd_fixtures(args.smmd_repo, args.out)
  if args.ntloss:
    ntloss_fixtures(args.out)


def del_fixtures(repo, out):
  check_files(repo, DEL_FILES)
  del_fn, generate_place = load_del(
      os.path.join(repo, "train-qwen-deepseek.py")
  )
  arrays = dict(digit_ids=np.asarray(DIGIT_IDS), point_id=np.asarray(POINT_ID))
  for i, (logits, labels, touching) in enumerate(
      del_cases(np.random.default_rng(0))
  ):
    arrays[f"case{i}_logits"] = logits
    arrays[f"case{i}_labels"] = labels
    arrays[f"case{i}_touching"] = np.asarray(touching)
    value, grad = run_del(del_fn, logits, labels)
    flat = labels.reshape(-1)
    arrays[f"case{i}_places"] = del_places(generate_place, flat[flat != -100])
    arrays[f"case{i}_value"] = np.asarray(value, np.float32)
    arrays[f"case{i}_grad"] = grad
    print(f"DEL case {i}: {value:.7g}")
  np.savez_compressed(os.path.join(out, "del.npz"), **arrays)


def smmd_fixtures(repo, out):
  check_files(repo, SMMD_FILES)
  sys.path.insert(0, repo)
  from smmd import SMMDLoss  # pylint: disable=g-import-not-at-top

  modules = {
      name: SMMDLoss(Tokenizer(), **kwargs)
      for name, kwargs in SMMD_SETTINGS.items()
  }
  for name, module in modules.items():
    assert module.vnum_token_ids.tolist() == list(DIGIT_IDS), name
  arrays = dict(
      digit_ids=np.asarray(DIGIT_IDS),
      settings=np.asarray(json.dumps(SMMD_SETTINGS)),
  )
  for i, (logits, labels) in enumerate(smmd_cases(np.random.default_rng(1))):
    arrays[f"case{i}_logits"] = logits
    arrays[f"case{i}_labels"] = labels
    for name, module in modules.items():
      value, grad = run_smmd(module, logits, labels)
      arrays[f"case{i}_{name}_value"] = np.asarray(value, np.float32)
      arrays[f"case{i}_{name}_grad"] = grad
      print(f"SMMD case {i} {name}: {value:.7g}")
  np.savez_compressed(os.path.join(out, "smmd.npz"), **arrays)


if __name__ == "__main__":
  main()
