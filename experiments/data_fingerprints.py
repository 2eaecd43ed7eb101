"""Which data a grid's runs trained on, and a refusal to mix two versions.

Every session generates the grids' data afresh from the code of the day
(nothing is downloaded or kept in git), while ``results.json`` keeps the
runs of earlier sessions. A cell's hash names its settings, not the bytes
its generator wrote: after a change to a renderer or to a library that
draws the data, new cells would train on other data than the recorded
ones, and a report would set the two side by side as one experiment.

Each record keeps ``prepared_data``: the prepared dataset it read (its
folder under ``data_dir``, ``"clock_time/train64_test16_seed0/1.0.0"``) and
a fingerprint of
its records (:func:`fingerprint`). Before a grid trains anything,
:func:`check_unchanged` compares the datasets in ``data_dir`` with the
fingerprints recorded for them and refuses a difference, naming the
dataset and how many runs read the other version. Records made before
fingerprints were kept have none, and are not checked.
"""

import functools
import hashlib
import os

import numpy as np
import tensorflow_datasets as tfds

from train import errors
from train import input_pipeline
from train import tasks

# Records read from a split for its fingerprint: all of a split this size
# or smaller, else this many spread evenly over it (a changed generator
# changes them all; 4,096 decoded clocks take well under a second).
SAMPLE = 4096


@functools.cache
def fingerprint(dataset_dir: str) -> str:
  """A short digest of the examples in ``dataset_dir`` (a prepared TFDS
  dataset's ``.../1.0.0`` folder), as a run reads them: each split's size
  and its records decoded (arrays by dtype, shape and bytes; strings as
  they are), every record of a split of at most :data:`SAMPLE`, else
  that many spread evenly over it. Not the files' bytes: two generations
  of the same clocks wrote the same pixels in different PNG bytes (one
  process and another, measured). Kept per process: the data does not
  change under a running grid."""
  digest = hashlib.sha256()
  builder = tfds.builder_from_directory(dataset_dir)
  for split in sorted(builder.info.splits):
    source = builder.as_data_source(split=split)
    size = len(source)
    digest.update(f"{split}:{size}\0".encode())
    picks = range(size)
    if size > SAMPLE:
      picks = np.linspace(0, size - 1, SAMPLE).astype(np.int64).tolist()
    for i in picks:
      for key, value in sorted(source[i].items()):
        digest.update(key.encode() + b"\0")
        if isinstance(value, np.ndarray):
          digest.update(f"{value.dtype}{value.shape}".encode())
          value = np.ascontiguousarray(value).tobytes()
        elif isinstance(value, str):
          value = value.encode()
        digest.update(bytes(value) + b"\0")
  return digest.hexdigest()[:16]


def dataset_of(config) -> dict:
  """``{"dataset": its folder under data_dir, "fingerprint": ...}`` of the
  prepared dataset ``config`` trains and evaluates on (the folder
  ``<name>/<config>/<version>``)."""
  found = str(
      input_pipeline.find_dataset_dir(
          config.data_dir,
          config_name=config.get("dataset_config") or None,
          dataset_name=tasks.get(config.task).NAME,
      )
  )
  return dict(
      dataset=os.path.relpath(found, config.data_dir),
      fingerprint=fingerprint(found),
  )


def _read(records) -> dict:
  """``{dataset: {fingerprint: run names}}`` of the records that keep one."""
  read = {}
  for record in records:
    data = record.get("prepared_data")
    if isinstance(data, dict) and data.get("fingerprint"):
      prints = read.setdefault(data["dataset"], {})
      prints.setdefault(data["fingerprint"], []).append(record.get("name"))
  return read


def check_unchanged(records, data_dir: str, accept: bool = False) -> None:
  """Refuses data in ``data_dir`` that differs from what ``records`` read.

  For each dataset a record names with a fingerprint, whose folder exists
  in ``data_dir`` now: its fingerprint must be the recorded one.

  Raises:
    errors.ConfigError: naming each dataset that differs, its runs, and
      what to do; not with ``accept`` (the flag ``--accept_changed_data``:
      the new runs are then recorded with the new fingerprint, the old ones
      keep theirs).
  """
  changed = []
  for dataset, prints in sorted(_read(records).items()):
    folder = os.path.join(data_dir, dataset)
    if not os.path.isdir(folder):
      continue  # not prepared here (another profile's data)
    now = fingerprint(folder)
    for recorded, names in sorted(prints.items()):
      if recorded != now:
        changed.append(
            f"{folder} (fingerprint {now}) is not the data {len(names)} "
            f"recorded run(s) read (fingerprint {recorded}; "
            f"{', '.join(names[:3])}{', ...' if len(names) > 3 else ''})"
        )
  if changed and not accept:
    raise errors.ConfigError(
        "the data differs from what the recorded runs trained on: "
        + "; ".join(changed)
        + ". New runs would be reported beside them as one experiment. "
        "Generate the data with the code (and libraries) of those runs, or "
        "record the new runs in another results file (--results), or pass "
        "--accept_changed_data to add them to this one all the same."
    )


def versions_read(records) -> dict:
  """``{dataset: {fingerprint: run names}}`` of the datasets ``records``
  read in more than one version (none: ``{}``)."""
  return {k: v for k, v in _read(records).items() if len(v) > 1}


def note_versions(records, report_path) -> None:
  """Appends to a report the datasets its runs read in several versions
  (new runs recorded with ``--accept_changed_data``): its tables set them
  side by side as one experiment, and the report says so."""
  versions = versions_read(records)
  if not versions:
    return
  lines = [
      "",
      "## Runs on other versions of the data",
      "",
      "These datasets were generated more than once, differently (a "
      "generator or a library changed between the runs), and the tables "
      "above hold runs on each version:",
      "",
  ]
  for dataset, prints in sorted(versions.items()):
    counts = ", ".join(
        f"{len(names)} run(s) on `{fingerprint}`"
        for fingerprint, names in sorted(prints.items())
    )
    lines.append(f"- `{dataset}`: {counts}")
  with open(report_path, "a") as f:
    f.write("\n".join(lines) + "\n")
