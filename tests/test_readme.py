"""The README's usage example runs as written and its loss falls."""

import pathlib
import re
import sys

from tests import launch

ROOT = pathlib.Path(__file__).resolve().parents[1]


def usage_example() -> str:
  text = (ROOT / "README.md").read_text()
  usage = text.split("## Usage", 1)[1]
  return re.search(r"```python\n(.*?)```", usage, re.S).group(1)


def test_readme_example_runs_and_learns():
  example = usage_example()
  # Record the loss of the first step, then check that training lowered it.
  probe = example.replace(
      "for step in range(20):",
      "initial = float(train_step(model, optimizer, tokens, labels, digit_mask))"
      "\nfor step in range(20):",
  )
  probe += "\nassert float(loss) < 0.5 * initial, (initial, float(loss))\n"
  result = launch.run(
      [sys.executable, "-c", probe],
      cwd=ROOT,
      capture_output=True,
      text=True,
      timeout=300,
  )
  assert result.returncode == 0, result.stderr
  assert "loss after 20 steps:" in result.stdout


def github_anchor(heading: str) -> str:
  """The anchor GitHub gives a heading: lower case, punctuation dropped
  (but '-' and '_'), spaces as '-'."""
  text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
  return text.replace(" ", "-")


def test_readme_links_to_its_own_sections_and_files_resolve():
  text = (ROOT / "README.md").read_text()
  anchors = {
      github_anchor(m.group(1)) for m in re.finditer(r"^#+ (.+)$", text, re.M)
  }
  assert "the-trainer-tasks-train-configs" in anchors  # the rule, by hand
  links = re.findall(r"\]\(([^)\s]+)\)", text)
  assert any(link.startswith("#") for link in links)
  for link in links:
    if link.startswith("#"):
      assert link[1:] in anchors, link
    elif not re.match(r"https?://", link):
      assert (ROOT / link).exists(), link
