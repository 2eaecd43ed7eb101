r"""The digits grid's report (digits/results.json -> digits/results.md,
plots) and the tables, figures and reading it shares with `llm_report`.

  python -m experiments.arithmetic_mix.report --profile=digits

The grid (``run.py --profile=digits``): ``arithmetic__add_or_sub`` (easy),
the ``small`` model from scratch, each training problem read once, 5 seeds
of every method, the digit-weighted CE control, each NTIL ablation, NTIL's
peers and CE, EMD and NTIL on numbers in tokens of 1-3 digits; any subset
renders. The breakdowns by answer digits, operation and decimals need the
test problems (`answers.load`) and are left out, saying so, without them or
where a run's stored predictions do not reproduce its recorded exact match.
"""

import collections
import os
import re

import numpy as np

from configs import arithmetic_mix
from experiments import common
from experiments import figures
from experiments import labels
from experiments import prose
from experiments import report_engine
from experiments import stats
from experiments import tables
from experiments.arithmetic_mix import answers

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "digits")

METHODS = arithmetic_mix.METHODS
# NTIL's peers (DEL, SMMD, NL-NTL), run.py's group "peers": rows of the main
# table.
PEERS = arithmetic_mix.PEER_METHODS
SEEDS = (0, 1, 2, 3, 4)
CONTROL = "ce-digit-weight"
# {cell name prefix: label}: run.py's digits_grid ablations.
ABLATIONS = {
    "ntil-no-exp": "NTIL, place-value weighting off (sigma=0)",
    "ntil-no-rel": "NTIL, relative deviation off (alpha=0)",
    "ntil-no-mag": "NTIL, magnitude deviation off (beta=0)",
}
ABLATED = tuple(ABLATIONS)
# run.py's groups: their cell kinds.
GROUPS = dict(main=METHODS, control=(CONTROL,), ablation=ABLATED, peers=PEERS)
# run.py's chunk group: these methods with numbers in tokens of 1-3 digits,
# cell kinds "<method>-chunks".
CHUNK_METHODS = ("ce", "emd", "ntil")
CHUNKS = "-chunks"
EARLY_STEP = 200  # the first point of the learning curve
# CE's mean rise over the last eval interval (points) above which the
# report calls the curve still rising steeply.
STEEP_RISE = 3.0
# The grid's data where a record does not name it.
DATA = dict(module="arithmetic__add_or_sub", difficulty="easy")
# The grids this report renders: profile -> (results file, output folder).
PROFILES = dict(
    digits=("results.json", ""),
    digits_long=("results_long.json", "long"),
)

# The main table's columns and the paired metrics: fields of `run_view`;
# ``{early}`` in a name is the early eval step.
Metric = stats.Metric
VALUES = (
    Metric("em_early", "exact match @{early} (%)", 100, 2),
    Metric("em_end", "exact match, end (%)", 100, 2),
    Metric("within_1_percent", "within 1% (%)", 100, 2),
    Metric("log_error", "mean log10(1+abs err)", 1, 3, False),
)
PAIRED = (
    VALUES[1]._replace(name="exact match at the end (pts)"),
    VALUES[0]._replace(name="exact match at step {early} (pts)"),
    VALUES[2]._replace(name="within 1% (pts)"),
    VALUES[3],
)
UNPARSED = Metric("unparsed", "unparsed (all seeds)", 1, 0)
CURVE = Metric("exact_match", "exact match")  # the plots' learning curve
# How the report names its cells (methods: `labels.LABELS`): the control,
# the ablations and the methods on numbers in tokens of 1-3 digits.
CHUNKED = {
    m + CHUNKS: f"{labels.LABELS[m]}, 1-3 digit tokens" for m in METHODS + PEERS
}
NAMES = {CONTROL: "CE, digit tokens weighted 1.3", **ABLATIONS, **CHUNKED}
SPEC = report_engine.Spec(VALUES, PAIRED, NAMES)
label = SPEC.label


def cell_key(run) -> str:
  """The cell's kind: a method (main, peers), `CONTROL` or an ablation
  prefix."""
  if run["group"] in ("main", "peers"):
    return run["method"]
  return re.sub(r"-s\d+$", "", run["name"])


def run_view(run, problems, early, breakdowns) -> dict:
  """``dict(run, ...)`` with the tables' fields (`VALUES`, ``unparsed``),
  recomputed from the stored predictions against ``problems`` where they
  reproduce the recorded exact match (``from_predictions``), and
  ``breakdowns``: {name: {bucket: rate}}."""
  view = dict(
      run,
      em_end=run["exact_match"],
      em_early=stats.at_step(run, "exact_match", early),
      within_1_percent=run.get("within_1_percent", float("nan")),
      log_error=run["mean_log10_abs_error"],
      unparsed=round((1.0 - run["parsed_rate"]) * run["num_test_examples"]),
      from_predictions=False,
      breakdowns={},
  )
  predictions = run.get("predictions")
  if not problems or len(predictions or ()) != len(problems):
    return view
  scores = answers.score(predictions, problems)
  if abs(scores["exact_match"] - run["exact_match"]) > 1e-9:
    return view  # not the test split the run was scored on
  em_end = scores.pop("exact_match")  # the rest are `VALUES`' names
  view.update(scores, em_end=em_end, from_predictions=True)
  for name, key, _ in breakdowns:
    view["breakdowns"][name] = {
        b: c / t
        for b, (c, t) in answers.breakdown(predictions, problems, key).items()
    }
  return view


def bucket_metric(name, bucket):
  """A run's exact match in one bucket of a breakdown (nan if absent)."""
  return lambda run: run["breakdowns"].get(name, {}).get(bucket, np.nan)


def _term(name: str) -> str:
  """``name`` as the subtracted term of a difference: in parentheses where
  it holds a comma ("NTIL − (CE, digit tokens weighted 1.3)")."""
  return f"({name})" if ", " in name else name


class Grid:
  """A grid's cells as its tables read them: ``grouped``, {cell kind: {seed:
  `run_view`}} (a later record of a cell replacing one before it), the
  ``early`` eval step, the ``breakdowns`` of exact match, the ``keys`` of
  the main table's rows, and of its ``views`` runs how many were
  ``computed`` from their stored predictions against ``problems``."""

  def __init__(self, runs, problems, breakdowns=answers.BREAKDOWNS, early=None):
    # `EARLY_STEP`, or the first eval step of runs that lack it (smoke).
    steps = eval_steps(runs)
    first = EARLY_STEP if EARLY_STEP in steps or not steps else steps[0]
    self.early = early or first
    self.problems, self.breakdowns = problems, breakdowns
    named = lambda m: m._replace(name=m.name.format(early=self.early))
    self.columns, self.metrics = [*map(named, VALUES)], [*map(named, PAIRED)]
    view = lambda run: run_view(run, problems, self.early, breakdowns)
    self.grouped = dict(stats.group_runs(runs, cell_key, view))
    self.keys = self.present(METHODS + PEERS)
    views = [r for runs in self.grouped.values() for r in runs.values()]
    self.steps, self.views = eval_steps(views), len(views)
    self.computed = sum(r["from_predictions"] for r in views)

  def present(self, keys) -> list[str]:
    return [k for k in keys if k in self.grouped]

  def values(self, keys) -> list[str]:
    """`VALUES`, mean ± sd over seeds, and the unparsed answers of each of
    ``keys`` recorded."""
    options = dict(missing="-", listed=True, totals=[UNPARSED])
    return SPEC.variant_table(self.grouped, keys, self.columns, **options)

  def paired(self, pairs) -> list[str]:
    """Per ``(key, reference[, the reference's name])`` with a paired seed:
    `tables.paired_table`'s short cells of each `PAIRED` metric."""
    rows = [
        (k, f"{label(k)} − {_term(n[0] if n else label(r))}", r)
        for k, r, *n in pairs
    ]
    return tables.paired_table(self.grouped, rows, "ce", self.metrics, True)

  def versus_ce(self) -> list[str]:
    """Each loss against CE, paired by seed; below the table, which losses
    ran on other hardware than CE, if any."""
    others = [k for k in self.keys if k != "ce"]
    table = self.paired([(k, "ce") for k in others])
    theirs = devices(self.grouped, ["ce"])
    apart = [k for k in others if devices(self.grouped, [k]) != theirs]
    if not apart or not theirs:
      return table
    names = [label(k) for k in apart]
    runs = (
        ", ".join(names[:-1]) + " and " + names[-1] if apart[1:] else names[0]
    )
    mine = devices(self.grouped, apart)
    note = dict(runs=runs, mine=mine, theirs=theirs)
    return [*table, "", *prose.section(__file__, "across_ce", **note)]

  def compared(self, name, keys, pairs, **values) -> list[str]:
    """Section ``name`` of digits_report.md with its blocks ``values`` (of
    ``keys``) and ``paired`` (of ``pairs``)."""
    blocks = dict(values=self.values(keys), paired=self.paired(pairs))
    return prose.section(__file__, name, **blocks, **values)

  def breakdown_sections(self) -> list[str]:
    """A ``###`` section a breakdown: exact match (%) per bucket, mean over
    seeds; then each run - CE, paired by seed."""
    lines, ce = [], self.grouped.get("ce", {})
    views = (r for runs in self.grouped.values() for r in runs.values())
    scored = stats.group_runs((r for r in views if r["breakdowns"]), cell_key)
    for name, key, order in self.breakdowns:
      counts = collections.Counter(key(q, a) for q, a in self.problems)
      metrics = [
          Metric(bucket_metric(name, b), f"{b} (n={counts[b]})", 100, 2)
          for b in order
          if counts[b]
      ]
      title = prose.section(__file__, f"breakdown_{name}")
      lines += ["", *title, ""]
      lines += SPEC.variant_table(scored, self.keys, metrics, missing="-")
      for k in (k for k in self.keys if k != "ce"):
        ds = [stats.paired(self.grouped[k], ce, m) for m in metrics]
        cells = [tables.delta(d) if d and d["n"] > 1 else "-" for d in ds]
        if any(c != "-" for c in cells):
          row = [f"{label(k)} − CE, paired Δ (seeds better)", "", *cells]
          lines.append(tables.row(row))
    return lines

  def reading(self, seeds=len(SEEDS)) -> list[str]:
    """Statements computed from the numbers: rankings, paired verdicts,
    where NTIL does not beat CE, the control and the ablations; ``seeds``,
    the grid's seeds per cell."""
    grouped, keys = self.grouped, self.keys
    if not keys:
      return ["- No main-grid cell recorded yet."]
    lines = []
    for field in ("end", "early"):
      when = prose.text(__file__, f"when_{field}", early=self.early)
      means = {
          k: 100 * np.nanmean([r[f"em_{field}"] for r in grouped[k].values()])
          for k in keys
      }
      order = sorted(keys, key=lambda k: -means[k])
      ranking = ", ".join(f"{label(k)} {means[k]:.2f}" for k in order)
      best = dict(best=label(order[0]), mean=means[order[0]], ranking=ranking)
      lines += prose.section(__file__, "best", when=when, **best)

    def versus(key, ref, text=None):
      """Appends the paired difference at the end of ``key`` − ``ref``
      (``text`` names it) and its verdict."""
      d = stats.paired(grouped[key], grouped.get(ref, {}), "em_end")
      if d is not None:
        text = text or f"{label(key)} − {'CE' if ref == 'ce' else 'full NTIL'}"
        fields = dict(d, text=text, verdict=tables.verdict(d))
        lines.extend(prose.section(__file__, "versus", **fields))
      return d

    others = [k for k in keys if k != "ce"] + self.present([CONTROL])
    beaten = [label(k) for k in others if tables.beats(versus(k, "ce"))]
    if "ce" in grouped and len(keys) > 1:
      beaten = ", ".join(beaten) or "none"
      lines += prose.section(__file__, "beaten", beaten=beaten)
    lines += self.ntil_vs_ce()
    if CONTROL in grouped and "ntil" in grouped:
      versus("ntil", CONTROL, prose.text(__file__, "versus_control"))
    for k in self.present(ABLATED):
      versus(k, "ntil")
    few = [label(k) for k in keys if len(grouped[k]) < seeds]
    if few:
      have = "has" if len(few) == 1 else "have"
      few = dict(few=", ".join(few), have=have, seeds=seeds)
      lines += prose.section(__file__, "partial", **few)
    return lines

  def chunk_reading(self) -> list[str]:
    """Each loss in tokens of 1-3 digits against CE in the same tokens: its
    verdict at the end, then every paired metric on which a loss differs
    from CE there beyond seed noise (p < 0.05, every seed the same way)."""
    ce = self.grouped.get("ce" + CHUNKS)
    kinds = [m + CHUNKS for m in CHUNK_METHODS + PEERS if m != "ce"]
    keys = self.present(kinds)
    if not ce or not keys:
      return []
    lines, apart, tested = [], [], 0
    for k in keys:
      d = stats.paired(self.grouped[k], ce, "em_end")
      if d is None:
        continue
      text = prose.text(__file__, "versus_chunks", loss=label(k))
      fields = dict(d, text=text, verdict=tables.verdict(d))
      lines += prose.section(__file__, "versus", **fields)
      for key, name, scale, digits, higher in self.metrics:
        d = stats.paired(self.grouped[k], ce, key, scale, higher)
        tested += d is not None and d["n"] > 1
        if d is not None and tables.kind(d) == "unanimous":
          unit = " pts" if scale == 100 else ""
          way = tables.direction(d, higher)
          apart.append(
              f"{label(k)}, {name.replace(' (pts)', '')} "
              f"({d['mean']:+.{digits}f}{unit}, {way} on every seed, "
              f"{stats.p_equals(d['p'])})"
          )
    fields = dict(apart="; ".join(apart) or "none", tested=tested)
    return lines + prose.section(
        __file__, "chunks_apart", **fields, chance=tested / 20
    )

  def ntil_vs_ce(self) -> list[str]:
    """Where NTIL does not beat CE: metrics and breakdown buckets whose
    paired mean is not in NTIL's favour, and whether the rest beat noise."""
    if "ntil" not in self.grouped or "ce" not in self.grouped:
      return ["- NTIL vs CE: no seed has both yet."]
    ntil, ce = self.grouped["ntil"], self.grouped["ce"]
    bucket = lambda name: prose.text(__file__, f"bucket_{name}")
    behind, within, ahead = found = [], [], []
    buckets = [
        Metric(bucket_metric(n, b), f"{bucket(n)} {b}", 100, 2)
        for n, _, order in self.breakdowns
        for b in order
    ]
    for key, name, scale, digits, higher in [*self.metrics, *buckets]:
      d = stats.paired(ntil, ce, key, scale, higher)
      if d is not None:
        unit = " pts" if scale == 100 else ""
        text = f"{name.replace(' (pts)', '')} ({d['mean']:+.{digits}f}{unit})"
        # behind (0), ahead within seed noise (1) or beyond it (2)
        better = tables.direction(d, higher) == "better"
        found[2 if tables.beats(d, higher) else int(better)].append(text)
    tested = sum(map(len, found))
    return prose.section(
        __file__,
        "ntil_vs_ce",
        seeds=prose.count(len(set(ntil) & set(ce)), "seed"),
        behind="; ".join(behind) or "none",
        within="; ".join(within) or "none",
        ahead="; ".join(ahead) or "nothing",
        tested=tested,
        chance=tested / 40,
    )


def eval_steps(runs) -> list[int]:
  return sorted({s for r in runs for s in r["curves"]["eval_steps"]})


def style(key) -> dict:
  """One colour and line per cell kind, the same in every plot."""
  color = labels.color({CONTROL: "ce_digit_weighted"}.get(key, key), ABLATED)
  return dict(ls="--" if key == CONTROL else "-", color=color)


def plot_curves(grid, plot, panels=(), start=(), xlabel="step"):
  """Exact match vs step, mean over seeds (``plot("exact_match_curve")``):
  a panel a ``(title, keys)`` (default: main and control; NTIL and its
  ablations), from the mean of ``start``, zero-shot scores, at step 0; and
  the paired Δ to CE at every eval step (``plot("paired_delta_curve")``)."""
  panels = panels or (
      ("methods and control (seeds)", grid.keys + grid.present([CONTROL])),
      ("NTIL and its ablations (seeds)", grid.present(["ntil", *ABLATED])),
  )
  panels = [(title, keys, CURVE) for title, keys in panels]
  ylabel = "test exact match (%, mean over seeds)"
  options = dict(xlabel=xlabel, ylabel=ylabel)
  path = plot("exact_match_curve")
  figures.curves(grid.grouped, panels, path, label, style, start, **options)
  keys = grid.keys + grid.present([CONTROL])
  title = "paired by seed: mean ± sd of (run - CE, same seed)"
  path, paired = plot("paired_delta_curve"), [("", grid.grouped, keys)]
  figures.paired_curves(paired, path, label, CURVE, title, style)


def coverage(grouped, groups) -> list[str]:
  """How many of the cells of the grid's ``groups`` are there, and the
  seeds of each kind."""
  count = lambda g: sum(len(grouped.get(k, {})) for k in GROUPS[g])
  size = lambda g: len(GROUPS[g]) * len(SEEDS)
  total, cells, kinds = sum(map(count, groups)), sum(map(size, groups)), []
  for k in (k for g in groups for k in GROUPS[g]):
    seeds = sorted(grouped.get(k, {}))
    listed = f" ({', '.join(map(str, seeds))})" if seeds else ""
    kinds.append(f"- {label(k)}: {len(seeds)} of {len(SEEDS)} seeds{listed}")
  counts = ", ".join(f"{g} {count(g)}/{size(g)}" for g in groups)
  left_out = "" if total == cells else " " + prose.text(__file__, "left_out")
  fields = dict(total=total, cells=cells, groups=counts, left_out=left_out)
  return prose.section(__file__, "coverage", kinds=kinds, **fields)


def regime(grid, source="") -> list[str]:
  """The set-up, from the records (and the test problems if known)."""
  grouped, problems = grid.grouped, grid.problems
  first = next(r for runs in grouped.values() for r in runs.values())
  data = first.get("data", {})
  seen = first.get("problems_seen", first["steps"] * first["batch_size"])
  test_answers = ""
  if problems:
    decimals = 100 * np.mean([answers.has_decimals(a) for _, a in problems])
    ranged = answers.digit_range(problems)
    test_answers = prose.text(__file__, "answers", **ranged, decimals=decimals)
  # The test split is the same for every training size: only the runs' own
  # dataset (as many problems as they read) names how many it held.
  once = "once_counted" if answers.train_size(source) == seen else "once"
  by_device = collections.defaultdict(list)  # device: its groups, in order
  for runs in grouped.values():
    for run in runs.values():
      if run.get("group") not in by_device[run["device"]]:
        by_device[run["device"]].append(run.get("group"))
  hardware = f"{first['device']} ({first['host']})"
  if len(by_device) > 1:
    hardware = ", ".join(
        f"{device} (groups {', '.join(map(str, groups))})"
        for device, groups in sorted(by_device.items())
    )
  fields = dict(
      first,  # its model, steps, batch_size, num_test_examples
      hardware=hardware,
      module=data.get("module", "?"),
      difficulty=data.get("difficulty", "?"),
      answers=test_answers,
      seen=seen,
      once=prose.text(__file__, once, seen=seen),
      eval_steps=", ".join(str(s) for s in grid.steps),
      ce_rise=ce_rise(grouped.get("ce", {}), grid.steps),
      early=grid.early,
  )
  return prose.section(__file__, "regime", **fields)


def ce_rise(ce, steps) -> list[str]:
  """How much CE's exact match rose over the last eval interval, and
  whether that is steep (`STEEP_RISE`): a list item, none without CE."""
  if not ce or len(steps) < 2:
    return []
  late, end = steps[-2], steps[-1]
  before = [stats.at_step(r, "exact_match", late) for r in ce.values()]
  after = [stats.at_step(r, "exact_match", end) for r in ce.values()]
  rise = 100 * (np.nanmean(after) - np.nanmean(before))
  kind = "steep" if rise >= STEEP_RISE else "slow" if rise > 0 else "flat"
  verdict = prose.text(__file__, f"rise_{kind}", rise=rise, interval=end - late)
  return prose.section(
      __file__,
      "ce_rise",
      before=100 * np.nanmean(before),
      late=late,
      after=100 * np.nanmean(after),
      end=end,
      seeds=prose.count(len(ce), "seed"),
      rising=sum(a > b for a, b in zip(after, before)),
      n=len(ce),
      verdict=verdict,
  )


def device_check(runs, other) -> list[str]:
  """Cells recorded twice (same config hash, other hardware): how far apart
  the two runs end, a floor for what one seed's difference can mean."""
  mine = {r["config_hash"]: r for r in runs if r.get("config_hash")}
  pairs = [
      (mine[o["config_hash"]], o) for o in other if o.get("config_hash") in mine
  ]
  if not pairs:
    return []
  deltas = [100 * (r["exact_match"] - t["exact_match"]) for r, t in pairs]
  mixed = len({run["device"] for run, _ in pairs}) > 1
  rows = [
      f"| {run['name']} | {100 * run['exact_match']:.2f}"
      f"{f' ({run["device"]})' if mixed else ''} | "
      f"{100 * twin['exact_match']:.2f} ({twin['device']}) | {delta:+.2f} |"
      for (run, twin), delta in zip(pairs, deltas)
  ]
  by_pair = collections.defaultdict(list)  # (device, other's): |deltas|
  for (run, twin), delta in zip(pairs, deltas):
    by_pair[run["device"], twin["device"]].append(abs(delta))
  apart = "; ".join(
      f"{np.mean(d):.2f} over {len(d)} between {a} and {b}"
      for (a, b), d in sorted(by_pair.items())
  )
  fields = dict(
      device="this grid" if mixed else pairs[0][0]["device"],
      rows=rows,
      mean=np.mean(np.abs(deltas)),
      count=len(pairs),
      apart=f" ({apart})" if len(by_pair) > 1 else "",
  )
  return prose.section(__file__, "device_check", **fields)


def write_report(
    runs, problems, out_dir, problems_source="", profile="digits", other=()
):
  """Writes results.md and plots/ under ``out_dir`` from the grid's
  ``runs``, the test ``problems`` ((question, answer) pairs, or None) and
  ``other`` runs of the same cells (another device); its path."""
  grid = Grid(runs, problems)
  os.makedirs(os.path.join(out_dir, "plots"), exist_ok=True)
  plot_curves(grid, os.path.join(out_dir, "plots", "{}.png").format)
  # The 3,200-step grid runs the first three groups (45 cells).
  groups = [*GROUPS][:3] if profile == "digits_long" else [*GROUPS]
  if grid.computed:
    breakdowns = prose.section(__file__, "breakdowns", source=problems_source)
    breakdowns += grid.breakdown_sections()
  else:
    missing = "not_found" if problems is None else "not_reproduced"
    why = prose.text(__file__, missing, source=problems_source)
    seen = runs[0]["steps"] * runs[0]["batch_size"]
    command = answers.prepare_command(runs, "data", DATA, seen)
    breakdowns = prose.section(
        __file__, "no_breakdowns", why=why, command=command
    )
  control = CONTROL in grid.grouped and grid.compared(
      "control", ["ce", CONTROL, "ntil"], [(CONTROL, "ce"), ("ntil", CONTROL)]
  )
  ablated = grid.present(ABLATED)
  pairs = [(k, "ntil", "full NTIL") for k in ablated]
  ablations = ablated and grid.compared("ablations", ["ntil", *ablated], pairs)
  chunks = elsewhere = []
  if profile == "digits":
    heading = "## Numbers in tokens of 1-3 digits"
    other_grid = Grid(other, None, early=grid.early)
    chunks = ["", heading, "", *chunk_section(grid, other_grid)]
    elsewhere = elsewhere_section(other_grid)
  check = device_check(runs, other)
  how = "recorded" if problems is None else "recomputed"
  counts = dict(computed=grid.computed, views=grid.views)
  lines = prose.section(
      __file__,
      "report",
      profile=profile,
      groups=",".join(groups),
      results=PROFILES[profile][0],
      regime=regime(grid, problems_source),
      coverage=coverage(grid.grouped, groups),
      main_table=grid.values(grid.keys),
      figures=prose.text(__file__, how, **counts),
      paired=grid.versus_ce(),
      breakdowns=breakdowns,
      control=control or ["Not run yet."],
      ablations=ablations or ["Not run yet."],
      chunks=chunks,
      elsewhere=elsewhere,
      reading=grid.reading() + grid.chunk_reading(),
      device_check=check and ["", *check],
  )
  return report_engine.write(out_dir, lines, end="\n")


def chunk_pairs(methods) -> list[tuple]:
  """Each method's chunk cells against its single-digit ones, and (but
  CE's) against CE's chunk cells: `Grid.paired`'s pairs."""
  both = "CE, both in chunks"
  return [(m + CHUNKS, m) for m in methods] + [
      (m + CHUNKS, "ce" + CHUNKS, both) for m in methods if m != "ce"
  ]


def chunk_section(grid, elsewhere) -> list[str]:
  """Numbers in tokens of 1-3 digits (``--config.digit_chunks``): each
  method against itself on single digits, the others (NTIL, EMD and NTIL's
  peers) against CE in chunks; without such cells, where they ran instead
  (``elsewhere``, the cells of other devices), if anywhere."""
  grouped = grid.grouped
  kinds = [m + CHUNKS for m in CHUNK_METHODS + PEERS]
  keys = grid.present(kinds)
  single = [k.removesuffix(CHUNKS) for k in keys]
  groups = (
      f"groups `chunks` and `chunks_peers`, {len(kinds) * len(SEEDS)} cells"
  )
  if not keys:
    ran = elsewhere.present(kinds)
    if not ran:
      return [f"Not run yet ({groups})."]
    device = devices(elsewhere.grouped, ran)
    return [
        f"Not run on this report's hardware ({groups}): the cells run on"
        f" {device} are in their own section below."
    ]
  mine, theirs = devices(grouped, keys), devices(grouped, single)
  across = prose.text(__file__, "across", mine=mine, theirs=theirs)
  across = " " + across if mine != theirs else ""
  count = sum(len(grouped[k]) for k in keys)
  cells = len(kinds) * len(SEEDS)
  fields = dict(count=count, cells=cells, across=across)
  return grid.compared("chunks", keys, chunk_pairs(single), **fields)


def elsewhere_section(elsewhere) -> list[str]:
  """The cells recorded on another device (``results_cpu.json``), paired
  by seed on it: each loss against CE, and the chunk cells as in
  `chunk_section`; none without them."""
  grouped = elsewhere.grouped
  single = elsewhere.present(METHODS + PEERS)
  keys = [k for m in METHODS + PEERS for k in (m, m + CHUNKS) if k in grouped]
  if not keys:
    return []
  chunked = [m for m in CHUNK_METHODS + PEERS if m + CHUNKS in grouped]
  pairs = [(k, "ce") for k in single if k != "ce"] + chunk_pairs(chunked)
  device = devices(grouped, keys)
  return ["", *elsewhere.compared("elsewhere", keys, pairs, device=device)]


def devices(grouped, keys) -> str:
  """The devices of the cells of ``keys``, in order."""
  found = {r["device"] for k in keys for r in grouped.get(k, {}).values()}
  return ", ".join(sorted(found))


def main(results, out_dir, data_dir, profile="digits", other_results=()):
  """Writes the report of ``results`` (test problems from ``data_dir``,
  the same cells run elsewhere from ``other_results`` where they exist);
  the path of results.md."""
  runs = report_engine.load(results)
  other = [r for path in other_results for r in common.load_results(path)]
  seen = runs[0]["steps"] * runs[0]["batch_size"]
  problems, source, _ = answers.load(runs, data_dir, results, DATA, seen)
  return write_report(runs, problems, out_dir, source, profile, other)
