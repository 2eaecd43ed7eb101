"""Opt-in accounting of the test session's compile time, test by test.

``NTIL_TEST_COMPILE_LOG=DIR make test`` (or pytest) writes one JSON line per
test to ``DIR/<worker>.jsonl``: its duration and the seconds this process
spent tracing, lowering and compiling (JAX's monitoring events), with the
number of programs compiled and of persistent-cache hits. Subprocesses a
test starts are not counted (their time is in the test's duration).
Summarise with ``python -m tests.compile_log DIR``.
"""

import collections
import glob
import json
import os
import sys
import time

_EVENTS = {
    "/jax/core/compile/jaxpr_trace_duration": "trace_s",
    "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower_s",
    "/jax/core/compile/backend_compile_duration": "compile_s",
}
_HIT = "/jax/compilation_cache/cache_hits"


class CompileLog:
  """Accumulates JAX's compile events per test and appends them to a file."""

  def __init__(self, path):
    self._path = path
    self._current = collections.Counter()
    self._started = time.perf_counter()

  def register(self):
    from jax import monitoring  # pylint: disable=g-import-not-at-top

    monitoring.register_event_duration_secs_listener(self._on_duration)
    monitoring.register_event_listener(self._on_event)

  def _on_duration(self, event, duration, **kwargs):
    del kwargs
    field = _EVENTS.get(event)
    if field:
      self._current[field] += duration
      if field == "compile_s":
        self._current["programs"] += 1

  def _on_event(self, event, **kwargs):
    del kwargs
    if event == _HIT:
      self._current["cache_hits"] += 1

  def start(self):
    self._current.clear()
    self._started = time.perf_counter()

  def finish(self, nodeid):
    record = dict(test=nodeid, seconds=time.perf_counter() - self._started)
    record.update(self._current)
    with open(self._path, "a") as f:
      f.write(json.dumps(record) + "\n")


_SUMMED = ("seconds", "trace_s", "lower_s", "compile_s", "programs")


def summarise(folder, top=40):
  """Prints the totals, the totals by test file and the slowest tests."""
  records = []
  for path in glob.glob(os.path.join(folder, "*.jsonl")):
    with open(path) as f:
      records += [json.loads(line) for line in f]
  total = collections.Counter()
  by_file = collections.defaultdict(collections.Counter)
  for r in records:
    name = r["test"].split("::")[0]
    for key in _SUMMED + ("cache_hits",):
      total[key] += r.get(key, 0)
      by_file[name][key] += r.get(key, 0)
    by_file[name]["tests"] += 1
  print(
      f"{len(records)} tests, {total['seconds']:.0f} s: trace "
      f"{total['trace_s']:.0f} s, lower {total['lower_s']:.0f} s, compile "
      f"{total['compile_s']:.0f} s ({total['programs']:.0f} programs, "
      f"{total['cache_hits']:.0f} cache hits)"
  )
  print("\nby file: seconds, compile, trace+lower, programs, tests")
  for name, c in sorted(by_file.items(), key=lambda kv: -kv[1]["seconds"]):
    print(
        f"{c['seconds']:7.0f} {c['compile_s']:7.0f} "
        f"{c['trace_s'] + c['lower_s']:6.0f} {c['programs']:5.0f} "
        f"{c['tests']:4.0f}  {name}"
    )
  print(f"\nslowest {top}: seconds, compile, trace+lower, programs")
  for r in sorted(records, key=lambda r: -r["seconds"])[:top]:
    print(
        f"{r['seconds']:7.1f} {r.get('compile_s', 0):7.1f} "
        f"{r.get('trace_s', 0) + r.get('lower_s', 0):6.1f} "
        f"{r.get('programs', 0):5.0f}  {r['test']}"
    )


if __name__ == "__main__":
  summarise(sys.argv[1])
