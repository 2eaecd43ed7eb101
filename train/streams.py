"""Training examples rendered on the fly: a stream that repeats none on a host.

With ``config.train_stream=True`` a task that renders its data (clock_time,
grounding, grounding_single, grounding_multi) trains on examples drawn as
the run reads them instead of a prepared train split; the test split stays
the prepared one. Example ``p`` of the stream (``p = 0, 1, 2, ...``, its
position over the whole run: row ``r`` of global batch ``k`` is ``p = k * B
+ r``) is rendered from its own NumPy generator, keyed by the seed and
``p`` (`example_rng`): no state is carried from one example to the next, so
any host renders any row, and a resumed run renders what an uninterrupted
one renders.

* Hosts: host ``i`` of ``n`` renders only rows ``[i * B / n, (i + 1) * B /
  n)`` of each global batch, so the global batch assembled in process order
  is the one a single host renders, up to the redraws below.
* Never twice on a host: every rendered example's 64-bit digest (BLAKE2b of
  its pixels and its text, `example_digest`) is kept; an example whose
  image and text repeat one already seen, or one of the test split's, is
  drawn again from the key ``(seed, p, attempt + 1)``. Each host checks its
  own rows (every row of the run on one host); hosts exchange nothing. So
  on several hosts two of them can draw the same example, trained twice,
  where one host would have drawn it again, and the global batches can
  differ from one host's from there on. The rendered tasks draw continuous
  parameters and pixel noise, so such a repeat is improbable there; a task
  of few distinct examples repeats them across hosts.
* The keys are the spawn key ``(2, p, attempt)`` of the seed's
  ``SeedSequence``, beside the prepared splits' ``(0,)`` (train) and
  ``(1,)`` (test): another stream of the generator, never the test split's.
* Checkpoints: `StreamIterator` has grain's ``get_state`` / ``set_state``
  (bytes: the next batch and the digests seen), so ``train.checkpoints``
  saves it beside the train state with grain's own handler, one file per
  host, and a resumed run skips nothing and repeats nothing.
"""

import base64
from collections.abc import Callable, Iterable, Sequence
import hashlib
import json
import queue
import threading

import numpy as np

from train import input_pipeline

# The prepared splits are spawn keys (0,) and (1,) of the seed's sequence.
STREAM_KEY = 2
MAX_ATTEMPTS = 100
_STATE_VERSION = 1

# (generators) -> records: dicts with ``image`` and ``answer`` (and
# ``question`` where the task has one), one per generator.
Render = Callable[[Sequence[np.random.Generator]], list[dict]]


def example_rng(seed: int, position: int, attempt: int = 0):
  """The generator of the stream's example ``position`` (its ``attempt``)."""
  if seed < 0 or position < 0 or attempt < 0:
    raise ValueError(
        f"seed, position and attempt must be non-negative, got {seed}, "
        f"{position}, {attempt}."
    )
  return np.random.default_rng(
      np.random.SeedSequence(seed, spawn_key=(STREAM_KEY, position, attempt))
  )


def _text(value) -> bytes:
  return value if isinstance(value, bytes) else str(value).encode("utf-8")


def example_digest(record) -> int:
  """A 64-bit digest of a record's image (shape and pixels) and its text."""
  image = np.ascontiguousarray(record["image"])
  digest = hashlib.blake2b(digest_size=8)
  digest.update(repr((image.shape, image.dtype.str)).encode())
  digest.update(image.tobytes())
  for field in ("question", "answer"):
    digest.update(b"\x00" + _text(record.get(field, b"")))
  return int.from_bytes(digest.digest(), "little")


def record_digests(records: Iterable) -> set[int]:
  """The `example_digest` of each record (e.g. of the test split)."""
  return {example_digest(record) for record in records}


def _pack(digests: Iterable[int]) -> str:
  array = np.sort(np.fromiter(digests, np.uint64))
  return base64.b64encode(array.astype("<u8").tobytes()).decode("ascii")


def _unpack(text: str) -> set[int]:
  array = np.frombuffer(base64.b64decode(text), "<u8")
  return set(array.tolist())


class StreamIterator:
  """This host's rows of the stream's global batches, encoded; resumable.

  Iterating renders the next batch's rows (`Render`), redraws any that
  repeat an example seen (or ``excluded``), and returns ``encode(records)``.
  With ``prefetch > 0`` a thread renders up to that many batches ahead
  (NumPy drops the GIL while it paints, so rendering overlaps the step);
  it keeps its own copy of the digests, and the iterator's state moves only
  as batches are taken, so the batches and the state are those of
  rendering each batch when it is asked for. ``get_state()`` /
  ``set_state()`` are grain's (bytes), for grain's orbax handler;
  ``redrawn`` counts the examples drawn again.
  """

  def __init__(
      self,
      render: Render,
      encode: Callable[[list[dict]], dict],
      *,
      seed: int,
      global_batch_size: int,
      process_index: int,
      process_count: int,
      excluded: frozenset[int] = frozenset(),
      prefetch: int = 2,
  ):
    self.batch_size = input_pipeline.per_host_batch_size(
        global_batch_size, process_count
    )
    if seed < 0:
      raise ValueError(f"the stream's seed must be non-negative, got {seed}.")
    if not 0 <= process_index < process_count:
      raise ValueError(
          f"Need 0 <= process_index < process_count, got {process_index} "
          f"and {process_count}."
      )
    if prefetch < 0:
      raise ValueError(f"prefetch must be >= 0, got {prefetch}.")
    self.render, self.encode, self.seed = render, encode, seed
    self.global_batch_size = global_batch_size
    self.first_row = process_index * self.batch_size
    self.excluded = frozenset(excluded)
    self.prefetch = prefetch
    # The state: batches taken so far, the digests of their examples.
    self.next_batch = 0
    self.seen: set[int] = set()
    self.redrawn = 0
    self._reader = None  # (thread, queue, stop event) while reading ahead

  def __iter__(self):
    return self

  def positions(self, batch: int) -> range:
    """The stream positions of this host's rows of global batch ``batch``."""
    first = batch * self.global_batch_size + self.first_row
    return range(first, first + self.batch_size)

  def _render_batch(self, batch: int, seen: set[int]):
    """(records, their digests, redraws) of ``batch``; adds them to ``seen``."""
    positions = self.positions(batch)
    attempts = [0] * len(positions)
    records = self.render([example_rng(self.seed, p) for p in positions])
    digests = [0] * len(positions)
    todo, redrawn = range(len(positions)), 0
    while True:
      again = []
      for row in todo:
        digest = example_digest(records[row])
        if digest in seen or digest in self.excluded:
          again.append(row)
        else:
          seen.add(digest)
          digests[row] = digest
      if not again:
        return records, digests, redrawn
      for row in again:
        attempts[row] += 1
        if attempts[row] >= MAX_ATTEMPTS:
          raise RuntimeError(
              f"stream example {positions[row]}: {MAX_ATTEMPTS} draws all "
              "repeat examples already seen; the task has too few distinct "
              "examples to stream."
          )
      redrawn += len(again)
      records_again = self.render(
          [example_rng(self.seed, positions[r], attempts[r]) for r in again]
      )
      for row, record in zip(again, records_again):
        records[row] = record
      todo = again

  def _read_ahead(self, batch, seen, ready, stop):
    """The reading thread: renders batches from ``batch`` on into ``ready``."""
    while not stop.is_set():
      try:
        records, digests, redrawn = self._render_batch(batch, seen)
        item = (records, self.encode(records), digests, redrawn)
      except Exception as error:  # pylint: disable=broad-except
        item = error  # raised where the batch is taken
      while not stop.is_set():
        try:
          ready.put(item, timeout=0.1)
          break
        except queue.Full:
          continue
      if isinstance(item, Exception):
        return
      batch += 1

  def _take(self):
    """(records, encoded batch) of the next batch; the state moves past it."""
    if not self.prefetch:
      # On a copy, as the reading thread's: a batch that fails (its encoding,
      # or too many redraws) leaves the state as it was, and a retry draws
      # the same batch.
      records, digests, redrawn = self._render_batch(
          self.next_batch, set(self.seen)
      )
      batch = self.encode(records)
      self.seen.update(digests)
    else:
      if self._reader is None:
        ready, stop = queue.Queue(maxsize=self.prefetch), threading.Event()
        thread = threading.Thread(
            target=self._read_ahead,
            args=(self.next_batch, set(self.seen), ready, stop),
            name="train-stream",
            daemon=True,
        )
        thread.start()
        self._reader = (thread, ready, stop)
      item = self._reader[1].get()
      if isinstance(item, Exception):
        self.close()
        raise item
      records, batch, digests, redrawn = item
      self.seen.update(digests)
    self.next_batch += 1
    self.redrawn += redrawn
    return records, batch

  def next_records(self) -> list[dict]:
    """The next batch's records (this host's rows), none seen before."""
    return self._take()[0]

  def __next__(self) -> dict:
    return self._take()[1]

  # grain's DataLoaderIterator protocol, for grain.checkpoint's handler.

  def get_state(self) -> bytes:
    return json.dumps(
        dict(
            version=_STATE_VERSION,
            next_batch=self.next_batch,
            redrawn=self.redrawn,
            seen=_pack(self.seen),
        ),
        sort_keys=True,
    ).encode()

  def set_state(self, state: bytes) -> None:
    state = json.loads(state)
    if state.get("version") != _STATE_VERSION:
      raise ValueError(f"unknown stream state version {state.get('version')}")
    self.close()  # what was read ahead follows the old position
    self.next_batch = int(state["next_batch"])
    self.redrawn = int(state["redrawn"])
    self.seen = _unpack(state["seen"])

  def start_prefetch(self) -> None:
    """Nothing to start: the reading thread starts with the next batch."""

  def close(self) -> None:
    """Stops the reading thread (what it read ahead is dropped)."""
    if self._reader is not None:
      thread, _, stop = self._reader
      stop.set()
      thread.join()
      self._reader = None


def train_iterator(
    config,
    render: Render,
    encode: Callable[[list[dict]], dict],
    test_records: Iterable = (),
    *,
    process_index=None,
    process_count=None,
) -> StreamIterator:
  """A task's stream of train batches: ``config.seed``, ``batch_size``.

  ``test_records`` (the prepared test split) are never drawn for training.
  """
  process_index, process_count = input_pipeline.resolve_process(
      process_index, process_count
  )
  return StreamIterator(
      render,
      encode,
      seed=config.seed,
      global_batch_size=config.batch_size,
      process_index=process_index,
      process_count=process_count,
      excluded=frozenset(record_digests(test_records)),
  )
