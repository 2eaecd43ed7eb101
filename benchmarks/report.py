"""benchmarks/results*.json -> benchmarks/results.md (tables of ratios).

python -m benchmarks.report
"""

import glob
import json
import os

from ntil_jax.kernels import chunked

HERE = os.path.dirname(os.path.abspath(__file__))

FAMILIES = (
    ("logits_path", "w.r.t. logits"),
    ("from_hidden", "w.r.t. hidden and W"),
)


def setting(results):
  """Device, dtype, D, jax version (and date) of a results file."""
  date = f", {results['date']}" if "date" in results else ""
  return (
      f"{results['device']}, {results.get('dtype', 'float32')}, "
      f"D={results['hidden_dim']}, jax {results['jax']}{date}"
  )


def _accessed(row):
  ratio = row.get("bytes_accessed_ratio")
  return "-" if ratio is None else f"{ratio:.3f}"


def table(run, results):
  lines = [
      f"### N={run['tokens']}, V={run['vocab']} ({setting(results)})",
      "",
      "| value + grad of | time | x reference | planned memory | x reference "
      "| bytes accessed x reference | ops |",
      "|---|---|---|---|---|---|---|",
  ]
  for family, note in FAMILIES:
    for row in run.get(family, ()):
      lines.append(
          f"| {row['name']} ({note}) | {row['seconds'] * 1e3:.1f} ms "
          f"| {row['time_ratio']:.3f} | {row['bytes'] / 2**20:.1f} MiB"
          f" | {row['memory_ratio']:.3f} | {_accessed(row)} "
          f"| {'-' if row.get('ops') is None else row['ops']} |"
      )
  lines.append("")
  chunk = results.get("chunk_size") or results.get(
      "default_chunk_sizes", {}
  ).get(f"{run['tokens']}:{run['vocab']}")
  if chunk and "from_hidden" in run:
    source = "--chunk_size" if results.get("chunk_size") else "the default"
    rows = run["tokens"] // results["seq_len"]
    positions = chunked.positions_per_chunk(rows, results["seq_len"], chunk)
    lines += [
        f"Fused path: chunks of {rows * positions} tokens ({rows} rows x "
        f"{positions} positions; chunk_size {chunk}, {source}).",
        "",
    ]
  fits = run.get("largest_tokens_in_budget")
  if fits:
    how = (
        "searched: XLA's plan of arguments + temp + output, compiled at "
        "each N"
        if fits.get("method")
        else "this size's temp + output scaled linearly in N, which the "
        "plan is not: an underestimate for the fused path, whose chunk "
        "buffers and [D, V] gradient do not grow with N"
    )
    lines += [
        f"Largest N in {fits['budget_bytes'] / 2**30:.0f} GiB ({how}): "
        f"hidden @ W + optax CE {fits['hidden @ W + optax CE']:,}, fused "
        f"{fits['fused_numeric_loss ntil']:,} tokens.",
        "",
    ]
  elif "from_hidden" not in run:
    lines += [
        "Only the core rows at this size; the from-hidden family is not "
        "measured here.",
        "",
    ]
  return lines


def targets(results):
  lines = [
      f"Targets on {setting(results)}:",
      "",
      "| N x V | numeric_token_loss ntil: time x optax CE | memory x optax "
      "CE | bytes accessed x optax CE | target (time / memory) | "
      "fused_numeric_loss ntil: time / memory x (hidden @ W + optax CE) |",
      "|---|---|---|---|---|---|",
  ]
  for run in results["runs"]:
    target = run["target"]
    verdict = (
        f"<= {target['time_target']} / <= {target['memory_target']}: "
        f"{'met' if target['met'] else '**not met**'}"
    )
    fused = next(
        (
            r
            for r in run.get("from_hidden", ())
            if r["name"] == "fused_numeric_loss ntil"
        ),
        None,
    )
    fused_text = (
        f"{fused['time_ratio']:.2f} / {fused['memory_ratio']:.2f}"
        if fused
        else "not measured"
    )
    row = next(
        (
            r
            for r in run["logits_path"]
            if r["name"] == "numeric_token_loss ntil"
        ),
        {},
    )
    lines.append(
        f"| {run['tokens']} x {run['vocab']} | {target['time_ratio']:.3f} "
        f"| {target['memory_ratio']:.3f} | {_accessed(row)} | {verdict} "
        f"| {fused_text} |"
    )
  return lines + [""]


def implementations_section(results, name):
  """Tables of benchmarks/implementations.py's JSON: one per dtype x shape."""
  lines = [
      f"## {name}: the fused path's implementations side by side "
      f"({results['device']}, jax {results['jax']}, tokamax "
      f"{results['tokamax']})",
      "",
      "Value + gradient w.r.t. hidden states and unembedding; ratios to "
      "`hidden @ W + optax CE` measured in the same process, functions "
      f"interleaved. Time: {results['estimator']}. "
      f"{100 * results['digit_fraction']:.0f}% digit labels.",
      "",
  ]
  for run in results["runs"]:
    lines += [
        f"### {run['dtype']}, N={run['tokens']}, D={run['hidden_dim']}, "
        f"V={run['vocab']} ({results['device']})",
        "",
        "| value + grad of | time | x reference | planned memory "
        "| x reference |",
        "|---|---|---|---|---|",
    ]
    for row in run["rows"]:
      lines.append(
          f"| {row['name']} | {row['seconds'] * 1e3:.1f} ms "
          f"| {row['time_ratio']:.3f} | {row['bytes'] / 2**20:.1f} MiB "
          f"| {row['memory_ratio']:.3f} |"
      )
    for row_name, why in run.get("skipped", {}).items():
      lines.append(f"| {row_name} | not run: {why} | - | - | - |")
    lines.append("")
  return lines


def compile_section(results, name):
  """The table of benchmarks/compile.py's JSON: one row per program."""
  lines = [
      f"## {name}: what each loss costs to compile ({results['device']}, "
      f"jax {results['jax']})",
      "",
      "Value + gradient of the mean loss, compiled after "
      "`jax.clear_caches()`, best of "
      f"{results['repeats']}; instructions are the optimized program's "
      "instructions that compute (fused computations included; parameters, "
      "constants, bitcasts and tuples left out), not the entry's ops "
      "(kernels) of the tables above. Ratios to optax CE on the logits, or "
      "to `hidden @ W` + optax CE for the fused path "
      f"(D = {results['hidden_dim']}), and to the same path's EMD, "
      "measured in the same process.",
      "",
      "| B x T x V | program | compile | x CE | x EMD | instructions "
      "| x CE | x EMD | fusions by kind |",
      "|---|---|---|---|---|---|---|---|---|",
  ]
  ratio = lambda row, key: f"{row[key]:.2f}" if key in row else "-"
  for row in results["records"]:
    lines.append(
        f"| {'x'.join(map(str, row['shape']))} | {row['row']} "
        f"| {row['compile_s']:.2f} s | {ratio(row, 'time_vs_ce')} "
        f"| {ratio(row, 'time_vs_emd')} | {row['instructions']} "
        f"| {ratio(row, 'instructions_vs_ce')} "
        f"| {ratio(row, 'instructions_vs_emd')} "
        f"| {_kinds(row.get('fusion_kinds'))} |"
    )
  lines.append("")
  costs = results.get("kernel_costs")
  if costs:
    each = "; ".join(
        f"{kind} {c['seconds_per_kernel'] * 1e3:.1f} ms "
        f"({_kinds(c['fusion_kinds'])} in the chain)"
        for kind, c in costs.items()
    )
    lines += [
        "One kernel's compile on this backend, in the same process (21 "
        f"barrier-separated kernels of a kind less 1, per kernel): {each}.",
        "",
    ]
  return lines


# benchmarks/compile_stages.py's files (beside compile.py's).
STAGES = "compile_stages"
_STAGE_NAMES = {
    "place": "EMD weighted by place (the number layout its weights need)",
    "digits": "and the straight-through digits, their deviations zero",
    "comparison": "and the comparison of the two numbers",
    "ntil": "and the sums, the deviations and their gradient (all of NTIL)",
}


def stages_section(results, name):
  """The table of benchmarks/compile_stages.py's JSON: a row per stage."""
  shapes = list(results["shapes"])
  lines = [
      f"## {name}: NTIL's compile, stage by stage ({results['device']}, "
      f"jax {results['jax']}, {results['date']})",
      "",
      "NTIL's logits program (value + gradient) with its number logic cut "
      "after each stage, against EMD's, best of "
      f"{results['repeats']} rounds of compiles after `jax.clear_caches()` "
      "in one process (the cut programs compute something else: they exist "
      "only to be timed).",
      "",
      "| NTIL up to | "
      + " | ".join(f"{s}: x EMD, loop kernels" for s in shapes)
      + " |",
      "|---|" + "---|" * len(shapes),
  ]
  for stage, title in _STAGE_NAMES.items():
    cells = [results["shapes"][s][stage] for s in shapes]
    lines.append(
        f"| {title} | "
        + " | ".join(
            f"{c['ntil_over_emd']:.2f}x, {c['loop_kernels']}" for c in cells
        )
        + " |"
    )
  return lines + [""]


def tracing_section(results, name):
  """The tables of benchmarks/tracing.py's JSON: tracing, then eager calls."""
  lines = [
      f"## {name}: tracing and the first eager call ({results['device']}, "
      f"jax {results['jax']}, {results['date']})",
      "",
      "Value + gradient of the mean of `numeric_token_loss`: traced and "
      "lowered by `jax.jit` after `jax.clear_caches()` (best of "
      f"{results['repeats']} rounds; Python calls counted by `cProfile` in "
      "one more), then called eagerly by `jax.value_and_grad` alone, each "
      "in a fresh process. `op by op` is a counterfactual, timed only: the "
      "number logic run operation by operation, as the code did before "
      "2026-11-27, instead of as one compiled program.",
      "",
      "| B x T x V | program | trace + lower | Python calls |",
      "|---|---|---|---|",
  ]
  for row in results["tracing"]:
    lines.append(
        f"| {'x'.join(map(str, row['shape']))} | {row['row']} "
        f"| {row['trace_lower_s']:.3f} s | {row['python_calls']:,} |"
    )
  lines += [
      "",
      "| B x T x V | first eager value + gradient | seconds "
      "| programs compiled |",
      "|---|---|---|---|",
  ]
  for row in results["eager"]:
    lines.append(
        f"| {'x'.join(map(str, row['shape']))} | {row['row']} "
        f"| {row['seconds']:.2f} s | {row['programs']} |"
    )
  return lines + [""]


def largest_section(results, name):
  """The table of benchmarks/largest_batch.py's JSON: a row per V."""
  ref, fused = "hidden @ W + optax CE", "fused_numeric_loss ntil"
  lines = [
      f"## {name}: the most tokens in {results['budget_bytes'] / 2**30:.3g} "
      f"GiB ({results['device']}, {results['dtype']}, "
      f"D={results['hidden_dim']}, T={results['seq_len']}, jax "
      f"{results['jax']}, {results['date']})",
      "",
      f"Value + gradient from hidden states: {results['method']}.",
      "",
      f"| V | {ref} | {fused} | x {ref} |",
      "|---|---|---|---|",
  ]
  for row in results["runs"]:
    times = f"{row[fused] / row[ref]:.0f}" if row[ref] else "-"
    lines.append(
        f"| {row['vocab']:,} | {row[ref]:,} | {row[fused]:,} | {times} |"
    )
  return lines + [""]


def _kinds(kinds):
  if not kinds:
    return "-"
  return ", ".join(f"{n} {k}" for k, n in kinds.items())


def _seconds(value):
  return "-" if value is None else f"{value:.1f}"


def step_markdown(results) -> str:
  """A table of one `benchmarks.step` run and its ratios."""
  lines = [
      f"One train step, {results['model']} ({results['parameters']:,} "
      f"parameters, V={results['vocab_size']:,}), {results['dtype']}, "
      f"batch {results['batch_size']} x {results['seq_len']} tokens, on "
      f"{results['device']} (jax {results['jax_version']}):",
      "",
      "| variant | ms/step | steps/s | tokens/s | XLA temp MiB | compile s |",
      "|---|---|---|---|---|---|",
  ]
  for variant, row in results["rows"].items():
    temp = row["planned_temp_bytes"]
    lines.append(
        f"| {variant} | {1e3 * row['seconds']:.2f} | "
        f"{row['steps_per_second']:.2f} | {row['tokens_per_second']:,.0f} | "
        f"{'' if temp is None else f'{temp / 2**20:.1f}'} | "
        f"{_seconds(row.get('compile_seconds'))} |"
    )
  lines.append("")
  for name, value in results["ratios"].items():
    lines.append(f"* {name}: {value:.3f}")
  return "\n".join(lines)


def markdown() -> str:
  """benchmarks/results.md's text, from the JSON files beside it."""
  lines = [
      "# Benchmark results",
      "",
      "Generated by `python -m benchmarks.report` from the JSON files "
      "that `make bench` (`python -m benchmarks.run`) writes. Each family "
      "is measured in one process, its functions interleaved; ratios are "
      "to the family's first row: optax CE on the logits, and "
      "`hidden @ W` followed by optax CE from hidden states. Memory is "
      "XLA's plan for the compiled function (temp + output bytes); bytes "
      "accessed is XLA's count of the bytes the compiled function reads "
      "and writes (`cost_analysis()`) and ops the number of ops (on a GPU, "
      "kernel launches) of the optimized program: proxies that do not "
      "depend on load, left out (-) for programs with a loop, whose body "
      "XLA counts once. Every table names the device, dtype, D and jax version it was "
      "measured with.",
      "",
  ]
  for path in sorted(glob.glob(os.path.join(HERE, "results*.json"))):
    with open(path) as f:
      results = json.load(f)
    estimators = results["estimators"]
    lines += [
        f"## {os.path.basename(path)}: {setting(results)}, "
        f"{100 * results['digit_fraction']:.0f}% digit labels, "
        f"T={results['seq_len']}",
        "",
        f"Time estimator, logits path: {estimators['logits_path']}. From "
        f"hidden states: {estimators['from_hidden']}.",
        "",
    ]
    if results.get("skipped"):
      lines += [
          f"Skipped (not enough host memory): "
          f"{', '.join(results['skipped'])}.",
          "",
      ]
    lines += targets(results)
    for run in results["runs"]:
      lines += table(run, results)
  for path in sorted(glob.glob(os.path.join(HERE, "implementations*.json"))):
    with open(path) as f:
      lines += implementations_section(json.load(f), os.path.basename(path))
  for path in sorted(glob.glob(os.path.join(HERE, "compile*.json"))):
    name = os.path.basename(path)
    section = stages_section if name.startswith(STAGES) else compile_section
    with open(path) as f:
      lines += section(json.load(f), name)
  for path in sorted(glob.glob(os.path.join(HERE, "tracing*.json"))):
    with open(path) as f:
      lines += tracing_section(json.load(f), os.path.basename(path))
  for path in sorted(glob.glob(os.path.join(HERE, "largest_batch*.json"))):
    with open(path) as f:
      lines += largest_section(json.load(f), os.path.basename(path))
  for path in sorted(glob.glob(os.path.join(HERE, "step_*.json"))):
    with open(path) as f:
      lines += [
          f"## {os.path.basename(path)}: a whole train step",
          "",
          step_markdown(json.load(f)),
          "",
      ]
  return "\n".join(lines) + "\n"


def main():
  with open(os.path.join(HERE, "results.md"), "w") as f:
    f.write(markdown())
  print(f"wrote {os.path.join(HERE, 'results.md')}")


if __name__ == "__main__":
  main()
