"""A task's report from its specification: the shared tables, figures, files.

A `Spec` says what a task's report compares: its methods (the rows of the
main table), the columns of that table and the metrics it pairs with a
reference (`stats.Metric`s), and how variants are named; `Spec.section`
draws and tabulates one section from runs grouped by seed (``{key: {seed:
run}}``). `task_report` is the flow of a task's report: its Markdown's
``report`` section, the task's own sections (a hook), the hand-written
parts; `run` its command.
"""

import os
from typing import Mapping, NamedTuple

from absl import flags

from configs import common as config_common
from experiments import common
from experiments import figures
from experiments import labels
from experiments import prose
from experiments import stats
from experiments import tables

FLAGS = flags.FLAGS
# The rows of a task's tables: the five losses of every grid, CE (the
# reference) first, then NTIL's peers (their own groups, run by name): a
# peer's rows appear once it has a record.
METHODS = config_common.METHODS + config_common.PEER_METHODS


class Spec(NamedTuple):
  """What a task's report compares: the main table's ``columns`` (a row a
  method of `METHODS`), the metrics ``paired`` with CE seed by seed, and the
  names of its variants (methods': `labels.LABELS`; None:
  `labels.VARIANT_LABELS`)."""

  columns: tuple[stats.Metric, ...]
  paired: tuple[stats.Metric, ...]
  variant_labels: Mapping[str, str] | None = None

  def label(self, key) -> str:
    """How the report names a method or a variant."""
    return labels.label(key, self.variant_labels)

  def rows(self, keys, grouped=None) -> list[tuple[str, str]]:
    """``(key, label)`` table rows of ``keys`` (those in ``grouped``)."""
    return [(k, self.label(k)) for k in keys if grouped is None or k in grouped]

  def paired_table(self, grouped, keys, reference="ce") -> list[str]:
    """Each of ``keys`` against ``reference``, seed by seed."""
    rows = self.rows(keys, grouped)
    return tables.paired_table(grouped, rows, reference, self.paired)

  def variant_table(self, grouped, keys, metrics, **options) -> list[str]:
    """Mean ± sd over seeds of some run types in ``metrics`` (``options``:
    `tables.values_table`'s)."""
    rows = self.rows(keys, grouped)
    return tables.values_table(grouped, rows, metrics, "run", **options)

  def section(
      self, grouped, plot, title, keys, bars=None, panels=None, rotation=15
  ):
    """Draws a section's seed bars of the methods (``plot("main")``, titled
    ``bars`` or ``title``) and paired dots of ``keys`` against CE (on
    ``panels``, default the paired metrics; ``plot("paired")``); returns
    its tables, named as the Markdown's blocks: ``main_table``, ``paired``
    (the methods against CE), ``reading``, and the controls against CE
    (beside NTIL), ``against_ce``, and against NTIL, ``against_ntil``."""
    paired, label, controls = self.paired, self.label, labels.CONTROLS
    figures.seed_bars(
        grouped, METHODS, paired, plot("main"), bars or title, label, rotation
    )
    figures.paired_dots(
        grouped, keys, panels or paired, plot("paired"), title, label, METHODS
    )
    rows = self.rows(METHODS)
    return dict(
        main_table=tables.values_table(grouped, rows, self.columns),
        paired=self.paired_table(grouped, METHODS),
        reading=tables.reading(grouped, paired, METHODS, labels.LABELS),
        against_ce=self.paired_table(grouped, [*controls, "ntil"]),
        against_ntil=self.paired_table(grouped, controls, "ntil"),
    )


def load(results):
  """The runs of a results file; exits saying so where it holds none."""
  runs = common.load_results(results)
  if not runs:
    raise SystemExit(f"no runs in {results}")
  return runs


def predictions(grouped, count, draw, same=4):
  """CE's and NTIL's seed-0 predictions on ``count`` test examples in test
  order, first those where they differ, then ``same`` where they agree,
  drawn by ``draw(chosen, {"CE": ..., "NTIL": ...})`` (the examples'
  indices, the predictions on them); how many differ (None without both)."""
  ce, ntil = (grouped.get(k, {}).get(0) for k in ("ce", "ntil"))
  if not ce or not ntil:
    return None
  pairs = list(zip(ce["predictions"], ntil["predictions"]))
  differ = [i for i, (a, b) in enumerate(pairs) if a != b]
  agree = [i for i, (a, b) in enumerate(pairs) if a == b]
  chosen = (differ[: count - same] + agree[:same])[:count]
  on = lambda run: [run["predictions"][i] for i in chosen]
  draw(chosen, dict(CE=on(ce), NTIL=on(ntil)))
  return len(differ)


DISCUSSION = "Discussion (written by hand from the numbers above)"


def task_report(module_file, runs, out_dir, sections, hand) -> str:
  """Writes a task's results.md (and makes its plots folder): its
  Markdown's ``report`` section with the first fixed-set run's fields (its
  device, model, ...), their count ``runs`` and the fields of
  ``sections(fixed, streamed)`` (``(fields, lines after it)``; streamed
  runs, regime "stream", go to the task's own section), then a section per
  ``(title, path)`` of ``hand`` whose file exists, its text as is; its
  path."""
  fixed = [r for r in runs if common.regime(r) == common.FIXED]
  streamed = [r for r in runs if common.regime(r) == common.STREAM]
  os.makedirs(os.path.join(out_dir, "plots"), exist_ok=True)
  fields, lines = sections(fixed, streamed)
  head = prose.section(
      module_file, "report", **dict(fixed[0], runs=len(fixed), **fields)
  )
  lines = head + [""] + lines
  for title, path in hand:
    if path and os.path.exists(path):
      with open(path) as f:
        lines += [f"## {title}", "", f.read()]
  return write(out_dir, lines)


def run(here, write_report, **more) -> None:
  """Runs a task report as a command: its flags (`common.define_report_flags`
  and ``more``, name: (default, help)), then ``write_report(runs, out_dir,
  discussion, *more's values)``; notes failed cells and mixed data
  (`common.note_grid`) and prints the path."""
  common.define_report_flags(here)
  for name, (default, text) in more.items():
    flags.DEFINE_string(name, default, text)

  def main(_):
    runs = common.load_results(FLAGS.results)
    extra = [FLAGS[name].value for name in more]
    path = write_report(runs, FLAGS.out_dir, FLAGS.discussion, *extra)
    common.note_grid(FLAGS.results, path)
    print(path)

  common.run_main(main)


def write(out_dir, lines, end="") -> str:
  """Writes ``lines`` (and ``end``) to ``out_dir/results.md``; its path."""
  path = os.path.join(out_dir, "results.md")
  with open(path, "w") as f:
    f.write("\n".join(lines) + end)
  return path
