"""benchmarks/step.py at smoke size: every variant runs and is recorded."""

import json

import pytest

from tests.test_experiments import run as run_module

VARIANTS = (
    "ce:logits",
    "ntil:logits",
    "ce:fused",
    "ntil:fused",
    "ce:window",
    "ntil:window",
    "emd:logits",  # a peer of NTIL's, on one path
)


# The project's own decoder runs every variant; a pretrained architecture
# (another model builder, the same step) the two that differ most.
@pytest.mark.slow
@pytest.mark.parametrize(
    "model, variants",
    [("tiny", VARIANTS), ("qwen2-tiny", ("ce:logits", "ntil:window"))],
)
def test_step_benchmark_smoke(tmp_path, model, variants):
  out = tmp_path / "step.json"
  output = run_module(
      "benchmarks.step",
      f"--model={model}",
      "--batch_size=4",
      "--seq_len=16",
      "--scored_len=5",
      "--blocks=1",
      "--per_block=1",
      f"--variants={','.join(variants)}",
      f"--out={out}",
  )
  results = json.loads(out.read_text())
  assert results["model"] == model
  assert set(results["rows"]) == set(variants)
  for row in results["rows"].values():
    assert row["seconds"] > 0
    assert row["tokens_per_second"] == pytest.approx(4 * 16 / row["seconds"])
    assert row["compile_seconds"] > 0
  all_ratios = {
      "ntil/ce time, logits path",
      "ntil/ce time, fused path",
      "fused/logits time, ce",
      "fused/logits time, ntil",
      "ntil/ce time, window path",
      "window/logits time, ce",
      "window/logits time, ntil",
      "emd/ce time, logits path",
  }
  assert set(results["ratios"]) == (all_ratios if model == "tiny" else set())
  rows = results["rows"]
  for name, ratio in results["ratios"].items():
    # "M/ce time, X path" and "X/logits time, M": the first over the
    # second, each the row's own seconds.
    if "/ce time" in name:
      method, path = name.split("/")[0], name.split(", ")[1].split()[0]
      over, under = f"{method}:{path}", f"ce:{path}"
    else:
      path, method = name.split("/")[0], name.split(", ")[1]
      over, under = f"{method}:{path}", f"{method}:logits"
    assert ratio == pytest.approx(
        rows[over]["seconds"] / rows[under]["seconds"]
    )
  for row in rows.values():
    assert row["planned_temp_bytes"] > 0
  assert results["scored_len"] == 5
  assert results["device"].startswith("cpu")
  assert f"| {variants[-1]} |" in output
