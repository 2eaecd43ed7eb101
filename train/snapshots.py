"""A local Hugging Face snapshot's files, checked before a model is built.

tunix reads every ``*.safetensors`` file of a snapshot and keeps the tensors
its model has, the last file's where two hold one name, and none of the
others. So a snapshot that is not exactly the model its config.json
describes would load without a word: another model's weight file left
beside the new one, a config.json naming fewer layers than the weights
hold. `check_weights` reads the files' headers (no tensor data) and refuses
such a snapshot, naming the files and tensors; `identity_files` lists what
makes a snapshot what it is, for the grids' digests, and `contents_sha256`
digests their bytes, so that a run resumes from a snapshot that moved.
"""

import hashlib
import json
import os
import re

import numpy as np

INDEX_FILE = "model.safetensors.index.json"
# Besides the weights: what decides a run's tokens and the model's config.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
)
CONFIG_FILES = ("config.json", "generation_config.json")
# Buffers that some checkpoints save beside the weights and that the model
# recomputes from config.json.
_DERIVED = re.compile(r"(^|\.)rotary_emb\.inv_freq$")


class SnapshotError(ValueError):
  """A snapshot that cannot be loaded; the message says why and what to do."""


def _listed(names, limit=4) -> str:
  names = sorted(names)
  more = f" and {len(names) - limit} more" if len(names) > limit else ""
  return ", ".join(names[:limit]) + more


def weight_index(path: str) -> dict | None:
  """The ``weight_map`` of the snapshot's index (tensor -> file), or None."""
  index_path = os.path.join(path, INDEX_FILE)
  if not os.path.exists(index_path):
    return None
  try:
    with open(index_path) as f:
      weight_map = json.load(f).get("weight_map")
  except (OSError, ValueError, AttributeError) as error:
    raise SnapshotError(
        f"{index_path} is not a weight index ({error})."
    ) from error
  if not isinstance(weight_map, dict) or not weight_map:
    raise SnapshotError(f"{index_path} has no weight_map.")
  return weight_map


def weight_files(path: str) -> list[str]:
  """The names of the snapshot's weight files, all of which are read.

  Raises:
    SnapshotError: none, or (with an index) a file the index names that is
      absent, or one it does not name.
  """
  files = sorted(n for n in os.listdir(path) if n.endswith(".safetensors"))
  if not files:
    raise SnapshotError(
        f"no *.safetensors weights in {path}; a snapshot needs config.json, "
        "its weights and tokenizer.json."
    )
  weight_map = weight_index(path)
  if weight_map is not None:
    named = set(weight_map.values())
    if named - set(files):
      raise SnapshotError(
          f"{path}/{INDEX_FILE} names weight files that are not there: "
          f"{_listed(named - set(files))}."
      )
    if set(files) - named:
      raise SnapshotError(
          f"{path} holds weight files that its {INDEX_FILE} does not name: "
          f"{_listed(set(files) - named)}. Every *.safetensors file is read: "
          "move them out (another model's?)."
      )
  return files


def tensor_shapes(path: str) -> dict[str, tuple[str, tuple[int, ...]]]:
  """Tensor name -> (file, shape), from the weight files' headers.

  Raises:
    SnapshotError: no weights, a file cut short or corrupt, one name in two
      files, or a tensor that the index puts in another file.
  """
  from safetensors import SafetensorError  # pylint: disable=g-import-not-at-top
  from safetensors import safe_open  # pylint: disable=g-import-not-at-top

  files = weight_files(path)
  found = {}
  for file in files:
    try:
      with safe_open(os.path.join(path, file), framework="numpy") as f:
        for name in f.keys():
          if name in found:
            raise SnapshotError(
                f"{path}: tensor {name} is in both {found[name][0]} and "
                f"{file}; a snapshot holds each tensor once (is one of the "
                "files another model's?)."
            )
          found[name] = (file, tuple(f.get_slice(name).get_shape()))
    except SafetensorError as error:
      raise SnapshotError(
          f"{path}/{file} is not a readable safetensors file: cut short or "
          f"corrupt ({error})."
      ) from error
  weight_map = weight_index(path)
  if weight_map is not None:
    moved = [
        f"{name} ({file}, indexed in {weight_map.get(name)})"
        for name, (file, _) in sorted(found.items())
        if weight_map.get(name) != file
    ]
    if moved:
      raise SnapshotError(
          f"{path}: tensors not where {INDEX_FILE} puts them: "
          f"{_listed(moved, 3)}."
      )
  return found


def _same_tensor(path, first, second) -> bool:
  from safetensors import safe_open  # pylint: disable=g-import-not-at-top

  arrays = []
  for name, (file, _) in (first, second):
    with safe_open(os.path.join(path, file), framework="numpy") as f:
      arrays.append(f.get_tensor(name))
  return np.array_equal(arrays[0], arrays[1])


def check_weights(path: str, want: dict, *, describe: str, tied_to=None):
  """SnapshotError unless the weights are exactly the tensors in ``want``.

  Args:
    path: the snapshot directory.
    want: tensor name -> shape, as config.json implies them.
    describe: the model, for the messages ("the llama model of config.json
      (2 layers, ...)").
    tied_to: with tied embeddings, (head, embedding) names: a saved head
      equal to the embedding is accepted, as transformers saves some.

  Returns:
    The tensors' (file, shape) by name.
  """
  found = tensor_shapes(path)
  missing = [name for name in want if name not in found]
  if missing:
    raise SnapshotError(
        f"{path}: {len(missing)} tensor(s) {describe} needs are missing from "
        f"the safetensors files: {', '.join(missing[:5])}"
        f"{' ...' if len(missing) > 5 else ''}."
    )
  extra = {n for n in found if n not in want and not _DERIVED.search(n)}
  if tied_to and tied_to[0] in extra:
    head, embedding = tied_to
    if not _same_tensor(
        path, (head, found[head]), (embedding, found[embedding])
    ):
      raise SnapshotError(
          f"{path}: config.json ties the embeddings, but {head} differs from "
          f"{embedding}: set tie_word_embeddings to false, or drop {head}."
      )
    extra.discard(head)
  if extra:
    raise SnapshotError(
        f"{path}: {len(extra)} tensor(s) in the safetensors files are not in "
        f"{describe}: {_listed(extra)} ({found[min(extra)][0]}); a "
        "config.json or a weight file of another model?"
    )
  wrong = [
      f"{name} {found[name][1]} (not {tuple(shape)})"
      for name, shape in want.items()
      if found[name][1] != tuple(shape)
  ]
  if wrong:
    raise SnapshotError(
        f"{path}: tensors of another shape than {describe} has: "
        f"{'; '.join(wrong[:3])}{' ...' if len(wrong) > 3 else ''}."
    )
  return found


def identity_files(path: str) -> list[str]:
  """The files that make the snapshot what it is: config, generation
  config, tokenizer, weight index and weights (those present), by name."""
  present = set(os.listdir(path))
  names = [n for n in CONFIG_FILES + TOKENIZER_FILES if n in present]
  if INDEX_FILE in present:
    names.append(INDEX_FILE)
  return names + sorted(n for n in present if n.endswith(".safetensors"))


def file_sha256(path: str) -> str:
  """SHA-256 of the file's bytes, in hex."""
  with open(path, "rb") as f:
    return hashlib.file_digest(f, "sha256").hexdigest()


def contents_sha256(path: str) -> str:
  """SHA-256 over the names and bytes of the snapshot's `identity_files`.

  The same wherever the folder lies: a run records it, and resumes from the
  same snapshot moved elsewhere (``--pretrained`` changed) when it matches.
  Reads every weight file once a process, while no file changes (the
  resume check and the record it writes share one reading).
  """
  names = identity_files(path)
  stats = []
  for name in names:
    stat = os.stat(os.path.join(path, name))
    stats.append((name, stat.st_size, stat.st_mtime_ns))
  key = (os.path.abspath(path), tuple(stats))
  if key not in _CONTENTS:
    digest = hashlib.sha256()
    for name in names:
      sha = file_sha256(os.path.join(path, name))
      digest.update(f"{name}:{sha}\n".encode())
    _CONTENTS[key] = digest.hexdigest()
  return _CONTENTS[key]


# contents_sha256 by folder and its files' sizes and times.
_CONTENTS = {}
