"""The benchmark scripts run end to end on tiny sizes and report what they say.

Only structure and invariants are checked here (timings are noisy and belong
to `make bench`): every row is recorded, the ratios are to the first row of
each family, the target verdict agrees with the recorded ratios and the
report renders the file.
"""

import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from unittest import mock

from absl.testing import absltest
import jax
import jax.numpy as jnp
import pytest

import ntil_jax
from benchmarks import report
from tests.test_experiments import run as run_module


def run_with_json(module, *args):
  """The stdout of ``python -m module *args --out=FILE`` and FILE's JSON."""
  with tempfile.TemporaryDirectory() as tmp:
    out = os.path.join(tmp, "out.json")
    stdout = run_module(module, *args, f"--out={out}")
    with open(out) as f:
      return stdout, json.load(f)


def scripted_interleaved_seconds(durations, *args):
  """`run.interleaved_seconds(fns, (), *args)` on a fake clock: each call of
  ``fns[name]`` takes the next of ``durations[name]``; its estimates and
  the names called, in order."""
  from benchmarks import run  # pylint: disable=g-import-not-at-top

  clock, calls = [0.0], []

  def timed(name):
    def fn():
      clock[0] += durations[name][sum(c == name for c in calls)]
      calls.append(name)
      return name

    return fn

  with mock.patch.object(run.time, "perf_counter", lambda: clock[0]):
    fns = {name: timed(name) for name in durations}
    return run.interleaved_seconds(fns, (), *args), calls


class BenchmarkTest(absltest.TestCase):

  @pytest.mark.slow
  def test_run_writes_every_row_and_the_report_renders_it(self):
    stdout, results = run_with_json(
        "benchmarks.run",
        "--sizes=64:256,128:512",
        "--seq_len=32",
        "--hidden_dim=16",
        "--blocks=2",
        "--per_block=1",
        "--hidden_blocks=1",
        "--chunk_size=8",
        f"--full_max_elements={64 * 256}",
    )
    self.assertIn("median over 2 blocks", results["estimators"]["logits_path"])
    self.assertEqual(
        [(r["tokens"], r["vocab"]) for r in results["runs"]],
        [(64, 256), (128, 512)],
    )
    small, large = results["runs"]
    # Within --full_max_elements every row of both families; beyond, only
    # the core rows.
    self.assertLen(small["logits_path"], 12)
    self.assertContainsSubset(
        {"numeric_token_loss del", "numeric_token_loss smmd"},
        {r["name"] for r in small["logits_path"]},
    )
    self.assertLen(small["from_hidden"], 3)
    self.assertEqual(
        [r["name"] for r in large["logits_path"]],
        ["optax CE", "numeric_token_loss ce", "numeric_token_loss ntil"],
    )
    self.assertNotIn("from_hidden", large)
    for run in results["runs"]:
      for family in ("logits_path", "from_hidden"):
        rows = run.get(family, [])
        for row in rows:
          self.assertGreater(row["seconds"], 0)
          self.assertGreater(row["bytes"], 0)
          self.assertLen(
              row["block_minima"], 2 if family == "logits_path" else 1
          )
          # The estimate is the median of the recorded per-block minima
          # (rounded to 1 us in the file).
          self.assertAlmostEqual(
              row["seconds"], statistics.median(row["block_minima"]), places=5
          )
          self.assertAlmostEqual(
              row["time_ratio"], row["seconds"] / rows[0]["seconds"]
          )
          self.assertAlmostEqual(
              row["memory_ratio"], row["bytes"] / rows[0]["bytes"]
          )
          if family == "logits_path":  # no loop: XLA's counts hold
            self.assertGreater(row["bytes_accessed"], 0)
            self.assertGreater(row["ops"], 0)
            self.assertAlmostEqual(
                row["bytes_accessed_ratio"],
                row["bytes_accessed"] / rows[0]["bytes_accessed"],
            )
      target = run["target"]
      self.assertEqual(
          target["met"],
          target["time_ratio"] <= target["time_target"]
          and target["memory_ratio"] <= target["memory_target"],
      )
    # In chunks of 8 tokens the fused path never plans the [N, V] logits:
    # less memory than hidden @ W followed by optax CE.
    fused = {r["name"]: r for r in small["from_hidden"]}
    self.assertLess(fused["fused_numeric_loss ntil"]["memory_ratio"], 1.0)
    self.assertIn("N=128 V=512", stdout)
    # The fused path loops over chunks, whose body XLA's cost analysis
    # counts once: no bytes-accessed figure for it.
    self.assertIsNone(fused["fused_numeric_loss ntil"]["bytes_accessed"])
    self.assertIsNone(fused["fused_numeric_loss ntil"]["ops"])
    # The largest N is benchmarks.largest_batch's, not searched here.
    self.assertNotIn("largest_tokens_in_budget", small)
    lines = (
        report.targets(results)
        + report.table(small, results)
        + report.table(large, results)
    )
    text = "\n".join(lines)
    self.assertIn("| 64 x 256 |", text)
    self.assertIn("<= 1.03 / <= 1.01: ", text)
    self.assertIn("not measured", text)
    self.assertIn("fused_numeric_loss ntil (w.r.t. hidden and W)", text)
    # The day it ran, in the report's heading.
    self.assertRegex(results["date"], r"^\d{4}-\d{2}-\d{2}$")
    self.assertIn(results["date"], report.setting(results))

  @pytest.mark.slow
  def test_bfloat16_run_records_its_setting(self):
    stdout, results = run_with_json(
        "benchmarks.run",
        "--dtype=bfloat16",
        "--hidden_dim=24",
        "--sizes=64:256",
        "--seq_len=32",
        "--blocks=1",
        "--per_block=1",
        "--hidden_blocks=1",
    )
    device = jax.devices()[0]
    self.assertEqual(results["dtype"], "bfloat16")
    self.assertEqual(results["hidden_dim"], 24)
    self.assertEqual(results["backend"], jax.default_backend())
    self.assertEqual(results["device_kind"], device.device_kind)
    self.assertEqual(results["jax"], jax.__version__)
    self.assertEqual(
        results["default_chunk_sizes"],
        {"64:256": ntil_jax.default_chunk_size(256, num_tokens=64)},
    )
    self.assertIn("bfloat16", stdout)
    (run,) = results["runs"]
    self.assertLen(run["logits_path"], 12)
    self.assertLen(run["from_hidden"], 3)
    text = "\n".join(report.targets(results) + report.table(run, results))
    setting = (
        f"{results['device']}, bfloat16, D=24, jax {jax.__version__}, "
        f"{results['date']}"
    )
    self.assertIn(f"Targets on {setting}", text)
    self.assertIn(f"### N=64, V=256 ({setting})", text)
    chunk = results["default_chunk_sizes"]["64:256"]
    # 2 rows of T = 32, each wholly in one chunk of 64 tokens.
    self.assertIn(
        f"chunks of {chunk} tokens (2 rows x 32 positions; chunk_size "
        f"{chunk}, the default)",
        text,
    )
    # The from-hidden rows reported as measured.
    self.assertNotIn("Largest N", text)
    self.assertNotIn("not measured here", text)

  @pytest.mark.slow
  def test_implementations_side_by_side(self):
    stdout, results = run_with_json(
        "benchmarks.implementations",
        "--shapes=64:16:2048,64:16:1000",
        "--dtypes=float32,bfloat16",
        "--seq_len=32",
        "--blocks=1",
    )
    self.assertIn("median over 1 blocks", results["estimator"])
    self.assertEqual(
        [(r["dtype"], r["vocab"]) for r in results["runs"]],
        [
            ("float32", 2048),
            ("float32", 1000),
            ("bfloat16", 2048),
            ("bfloat16", 1000),
        ],
    )
    for run in results["runs"]:
      names = [r["name"] for r in run["rows"]]
      self.assertEqual(names[0], "hidden @ W + optax CE")
      self.assertIn("hidden @ W + numeric_token_loss ntil", names)
      self.assertIn("fused ntil, chunked", names)
      self.assertIn("fused ntil, tokamax:xla", names)
      self.assertIn("tokamax CE alone, tokamax's default", names)
      # tokamax's chunked_xla runs only where V is a multiple of 2048.
      chunked_xla = "fused ntil, tokamax:chunked_xla"
      if run["vocab"] % 2048 == 0:
        self.assertIn(chunked_xla, names)
      else:
        self.assertNotIn(chunked_xla, names)
        self.assertIn("V=1000", run["skipped"][chunked_xla])
      for row in run["rows"]:
        self.assertAlmostEqual(
            row["time_ratio"], row["seconds"] / run["rows"][0]["seconds"]
        )
    self.assertIn("fused ntil, tokamax:xla", stdout)
    text = "\n".join(report.implementations_section(results, "x.json"))
    self.assertIn("### bfloat16, N=64, D=16, V=1000", text)
    self.assertIn("| fused ntil, tokamax:chunked_xla | not run: V=1000", text)

  def test_interleaved_seconds_is_the_median_of_block_minima(self):
    # Scripted durations of each function's timed calls, two a block over
    # three blocks; the first call of each (the warm-up) takes 100 s.
    durations = {
        "a": [100, 5, 3, 4, 4, 9, 8],
        "b": [100, 1, 2, 7, 6, 2, 2],
        "c": [100, 3, 3, 3, 1, 5, 9],
    }
    estimates, calls = scripted_interleaved_seconds(durations, 3, 2)
    # Minima a: 3, 4, 8; b: 1, 6, 2; c: 3, 1, 5. Medians 4, 2, 3.
    self.assertEqual(
        estimates,
        {"a": (4, [3, 4, 8]), "b": (2, [1, 6, 2]), "c": (3, [3, 1, 5])},
    )
    # Warm-up in order, then each block starts one function later.
    self.assertEqual("".join(calls), "abc" + "aabbcc" + "bbccaa" + "ccaabb")

  def test_a_run_of_calls_back_to_back_is_timed_as_their_mean(self):
    from benchmarks import run  # pylint: disable=g-import-not-at-top

    # Two blocks, one run a block of three calls each; warm-up first (50).
    durations = {"a": [50, 1, 2, 6, 4, 4, 4], "b": [50, 3, 3, 3, 9, 0, 0]}
    estimates, calls = scripted_interleaved_seconds(durations, 2, 1, 3)
    # a: runs of (1+2+6)/3 = 3 and 12/3 = 4; b: 9/3 = 3 and 9/3 = 3.
    self.assertEqual(estimates, {"a": (3.5, [3, 4]), "b": (3, [3, 3])})
    self.assertEqual("".join(calls), "ab" + "aaabbb" + "bbbaaa")
    self.assertIn("a run is 3 calls", run.estimator(2, 1, 3))
    self.assertNotIn("a run is", run.estimator(2, 1))

  @pytest.mark.slow
  def test_largest_batch_is_the_most_rows_the_plan_fits(self):
    from benchmarks import largest_batch  # pylint: disable=g-import-not-at-top
    from benchmarks import run  # pylint: disable=g-import-not-at-top
    import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

    def plan(fn, batch):  # arguments + temp + output, read here directly
      shapes = (
          jax.ShapeDtypeStruct((batch, 32, 16), jnp.float32),
          jax.ShapeDtypeStruct((16, 256), jnp.float32),
          jax.ShapeDtypeStruct((batch, 32), jnp.int32),
          jax.ShapeDtypeStruct((batch, 32), jnp.bool_),
      )
      stats = fn.lower(*shapes).compile().memory_analysis()
      return (
          stats.argument_size_in_bytes
          + stats.temp_size_in_bytes
          + stats.output_size_in_bytes
      )

    fns = run.hidden_family(8)
    budget = 2**21
    for name in ("hidden @ W + optax CE", "fused_numeric_loss ntil"):
      fn = fns[name]
      args = (
          jnp.zeros((2, 32, 16)),
          jnp.zeros((16, 256)),
          jnp.zeros((2, 32), jnp.int32),
          jnp.zeros((2, 32), bool),
      )
      batch = largest_batch.largest_batch(fn, args, budget, start=2)
      self.assertLessEqual(plan(fn, batch), budget)
      self.assertGreater(plan(fn, batch + 1), budget)
      # Where the search starts does not matter.
      self.assertEqual(
          largest_batch.largest_batch(fn, args, budget, start=16), batch
      )
    # The fused path's chunk buffers and [D, V] gradient do not grow with
    # N: one size's plan scaled linearly (the old estimate) falls short.
    fused = fns["fused_numeric_loss ntil"]
    linear = int(budget / plan(fused, 2) * 2)
    self.assertGreater(
        largest_batch.largest_batch(fused, args, budget, start=2), 1.5 * linear
    )

  @pytest.mark.slow
  def test_largest_batch_writes_each_vocabulary_and_the_report_renders_it(
      self,
  ):
    stdout, results = run_with_json(
        "benchmarks.largest_batch",
        "--vocabs=256",
        "--seq_len=32",
        "--hidden_dim=16",
        "--chunk_size=8",
        "--memory_budget_gib=0.001",
    )
    self.assertEqual(results["budget_bytes"], int(0.001 * 2**30))
    self.assertEqual((results["seq_len"], results["hidden_dim"]), (32, 16))
    self.assertIn("compiled at that size", results["method"])
    self.assertEqual([r["vocab"] for r in results["runs"]], [256])
    ref, fused = "hidden @ W + optax CE", "fused_numeric_loss ntil"
    for row in results["runs"]:
      for name in (ref, fused):
        self.assertGreater(row[name], 0)
        self.assertEqual(row[name] % 32, 0)  # whole rows of T = 32
      # In chunks of 8 tokens the fused path never holds the [N, V] logits.
      self.assertGreater(row[fused], row[ref])
    self.assertIn("fused_numeric_loss ntil", stdout)
    text = "\n".join(report.largest_section(results, "largest_batch.json"))
    first = results["runs"][0]
    self.assertIn(
        f"| 256 | {first[ref]:,} | {first[fused]:,} "
        f"| {first[fused] / first[ref]:.0f} |",
        text,
    )
    self.assertIn("in 0.001 GiB", text.splitlines()[0])

  def test_stream_refuses_too_few_steps_to_time(self):
    # Under 50 steps no rate is left after the first record's (the
    # compile's): the median of none was printed as NaN.
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.stream", "--steps=49"],
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
        capture_output=True,
        text=True,
        timeout=120,
    )
    self.assertNotEqual(result.returncode, 0)
    self.assertIn("--steps must be at least 50", result.stderr)

  def test_committed_report_is_what_the_committed_json_makes(self):
    with open(os.path.join(report.HERE, "results.md")) as f:
      committed = f.read()
    self.assertEqual(
        report.markdown(),
        committed,
        "benchmarks/results.md is stale: run `python -m benchmarks.report`.",
    )

  def test_number_tokens_against_digit_ids(self):
    stdout = run_module(
        "benchmarks.number_tokens",
        "--tokens=48",
        "--vocab=1200",
        "--blocks=1",
        "--per_block=1",
    )
    for method in ("emd", "ntil"):
      for ids in ("digit ids", "number tokens"):
        self.assertRegex(stdout, rf"{method} +{ids} .* \d+ instructions")
      self.assertRegex(stdout, rf"{method} +number tokens / digit ids: ")

  def test_number_logic_prints_every_method(self):
    stdout = run_module(
        "benchmarks.number_logic",
        "--tokens=64",
        "--vocab=256",
        "--seq_len=32",
        "--blocks=2",
    )
    for method in ("ce", "emd", "ntl_mse", "soft_label", "ntil"):
      self.assertRegex(stdout, rf"number logic {method} .*, \d+ ops")
    self.assertIn("% of optax CE", stdout)
    self.assertIn("median over 2 blocks", stdout)

  def test_compile_records_each_program(self):
    with tempfile.TemporaryDirectory() as tmp:
      hlo_path = os.path.join(tmp, "hlo.txt")
      stdout, results = run_with_json(
          "benchmarks.compile",
          "--shapes=1x32x32",
          "--methods=emd",
          "--repeats=1",
          "--hidden_dim=8",
          f"--hlo_out={hlo_path}",
      )
      with open(hlo_path) as f:
        hlo = f.read()
    rows = {r["row"]: r for r in results["records"]}
    # Every program's optimized HLO, after its header, in --hlo_out.
    headers = re.findall(r"^# ===== 1x32x32 (.+)$", hlo, re.M)
    self.assertEqual(set(headers), set(rows))
    for program in re.split(r"^# ===== .+$", hlo, flags=re.M)[1:]:
      self.assertIn("ENTRY", program)
    self.assertEqual(
        set(rows),
        {
            "optax CE",
            "hidden @ W + optax CE",
            "numeric_token_loss emd",
            "fused_numeric_loss emd",
        },
    )
    emd = rows["numeric_token_loss emd"]
    # The best compile's phases, which make up its time.
    self.assertEqual(set(emd["phases_s"]), {"trace_s", "lower_s", "xla_s"})
    self.assertAlmostEqual(sum(emd["phases_s"].values()), emd["compile_s"])
    self.assertGreater(rows["optax CE"]["instructions"], 10)
    self.assertAlmostEqual(
        emd["instructions_vs_ce"],
        emd["instructions"] / rows["optax CE"]["instructions"],
    )
    self.assertIn("numeric_token_loss emd", stdout)
    # Every fusion of the entry counted by kind (at least the loss's).
    self.assertGreater(sum(emd["fusion_kinds"].values()), 0)
    costs = results["kernel_costs"]
    self.assertEqual(set(costs), {"elementwise", "reduction"})
    # The longer chain is 21 kernels of their own (one fusion each).
    self.assertGreaterEqual(
        sum(costs["elementwise"]["fusion_kinds"].values()), 21
    )
    self.assertGreater(costs["elementwise"]["seconds_per_kernel"], 0)
    text = "\n".join(report.compile_section(results, "c.json"))
    self.assertIn("| 1x32x32 | numeric_token_loss emd |", text)
    self.assertIn("One kernel's compile on this backend", text)

  @pytest.mark.slow
  def test_tracing_records_each_program_and_a_fresh_eager_call(self):
    stdout, results = run_with_json(
        "benchmarks.tracing",
        "--shapes=1x32x32",
        "--methods=emd,ntil",
        "--repeats=1",
        "--eager_rows=emd",
    )
    rows = {r["row"]: r for r in results["tracing"]}
    self.assertEqual(
        set(rows), {"numeric_token_loss emd", "numeric_token_loss ntil"}
    )
    emd, ntil = rows["numeric_token_loss emd"], rows["numeric_token_loss ntil"]
    self.assertGreater(emd["trace_lower_s"], 0)
    # NTIL's number logic is more to trace than EMD's one distance.
    self.assertGreater(emd["python_calls"], 1000)
    self.assertGreater(ntil["python_calls"], emd["python_calls"])
    (eager,) = results["eager"]
    self.assertEqual(eager["row"], "emd")
    # A fresh process compiles at least one program for the first call.
    self.assertGreaterEqual(eager["programs"], 1)
    self.assertGreater(eager["seconds"], 0)
    self.assertIn("first eager call, emd", stdout)
    text = "\n".join(report.tracing_section(results, "t.json"))
    self.assertIn("| 1x32x32 | numeric_token_loss ntil |", text)
    self.assertIn("| emd |", text)

  def test_fusion_kinds_count_the_kernels_in_loops(self):
    """Only the entry's were counted: the fused path's chunk loop held 11
    kernels more than its row said."""
    from benchmarks import compile as compile_bench  # pylint: disable=g-import-not-at-top

    def f(x, n):
      def body(carry):
        return jnp.sin(carry[0]) * 2 + jnp.cos(carry[0]), carry[1] + 1

      return jax.lax.while_loop(lambda c: c[1] < n, body, (x, 0))[0]

    compiled = jax.jit(f).lower(jnp.ones((64,)), 3).compile()
    text = compiled.as_text()
    # Every kernel, by hand: the entry's and the loop's.
    loops = [line for line in text.splitlines() if " fusion(" in line]
    kinds = compile_bench.fusion_kinds(compiled)
    self.assertEqual(sum(kinds.values()), len(loops))
    self.assertGreater(len(loops), 0)
    entry = text[text.index("\nENTRY ") :].split("\n}")[0]
    self.assertGreater(len(loops), entry.count(" fusion("))

  def test_compile_ratios_are_to_the_same_paths_references(self):
    from benchmarks import compile as compile_bench  # pylint: disable=g-import-not-at-top

    def record(row, seconds, size):
      return {
          "row": row,
          "shape": [1, 8, 8],
          "compile_s": seconds,
          "instructions": size,
      }

    records = compile_bench.ratio_rows(
        [
            record("optax CE", 1.0, 100),
            record("hidden @ W + optax CE", 2.0, 200),
            record("numeric_token_loss emd", 3.0, 300),
            record("numeric_token_loss ntil", 6.0, 900),
            record("fused_numeric_loss emd", 4.0, 400),
            record("fused_numeric_loss ntil", 2.0, 1200),
        ]
    )
    rows = {r["row"]: r for r in records}
    ntil, fused = (
        rows["numeric_token_loss ntil"],
        rows["fused_numeric_loss ntil"],
    )
    self.assertEqual((ntil["time_vs_ce"], ntil["instructions_vs_ce"]), (6, 9))
    self.assertEqual((ntil["time_vs_emd"], ntil["instructions_vs_emd"]), (2, 3))
    self.assertEqual((fused["time_vs_ce"], fused["instructions_vs_ce"]), (1, 6))
    self.assertEqual(
        (fused["time_vs_emd"], fused["instructions_vs_emd"]), (0.5, 3)
    )
    self.assertNotIn("time_vs_emd", rows["numeric_token_loss emd"])

  def test_bf16_updates_counts_what_rounding_loses(self):
    from benchmarks import bf16_updates  # pylint: disable=g-import-not-at-top
    import numpy as np  # pylint: disable=g-import-not-at-top

    # bfloat16 spacing is 2**-7 at 1 and 2**-8 at 0.5: adding 1e-5 moves
    # neither, nor -1; it moves 1e-3 (spacing 2**-17) and 1e-6.
    weights = [np.asarray([1.0, 0.5, 1e-3, 1e-6, -1.0]), np.arange(4)]
    self.assertEqual(
        bf16_updates.unchanged_shares(weights, [1e-5, 1.0]),
        {1e-5: 3 / 5, 1.0: 0.0},
    )
    # Half the spacing at 1 rounds back to 1 (ties to even); a bit more
    # does not.
    self.assertEqual(bf16_updates.unchanged_count([1.0], 2.0**-8), 1)
    self.assertEqual(bf16_updates.unchanged_count([1.0], 2.0**-8 * 1.01), 0)
    with self.assertRaisesRegex(ValueError, "no floating-point weights"):
      bf16_updates.unchanged_shares([np.arange(3)], [1e-5])

  def test_bf16_updates_on_a_snapshot(self):
    stdout, shares = run_with_json(
        "benchmarks.bf16_updates",
        "--snapshot=tests/fixtures/hf/llama3_tiny",
        "--learning_rates=1e-5,10",
    )
    self.assertRegex(stdout, r"\+1e-05: \d+\.\d% unchanged in bfloat16")
    self.assertGreater(shares["parameters"], 0)
    # A tiny random model's weights are O(0.02-1): 1e-5 moves almost none
    # of them, 10 moves every one.
    self.assertGreater(shares["unchanged"]["1e-05"], 0.5)
    self.assertEqual(shares["unchanged"]["10"], 0.0)


if __name__ == "__main__":
  absltest.main()
