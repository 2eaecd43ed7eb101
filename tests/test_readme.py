"""The README's usage example runs as written and its loss falls, and the
links of the README and of the docs resolve."""

import pathlib
import re
import sys

import pytest

from tests import launch

ROOT = pathlib.Path(__file__).resolve().parents[1]
# What `make docs` runs, less the output folder: warnings are errors.
SPHINX_ARGS = ("-W", "--keep-going", "-q", "-b", "html", "-c", "docs", ".")


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


def anchors_of(path: pathlib.Path) -> set:
  text = path.read_text()
  return {
      github_anchor(m.group(1)) for m in re.finditer(r"^#+ (.+)$", text, re.M)
  }


def check_links(page: pathlib.Path):
  """Every relative link of ``page`` names a file that exists, and every
  ``#anchor`` (alone or after a Markdown file) one of that file's headings.
  Code blocks are skipped."""
  text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
  links = re.findall(r"\]\(([^)\s]+)\)", text)
  for link in links:
    if re.match(r"https?://", link):
      continue
    target, _, anchor = link.partition("#")
    path = (page.parent / target).resolve() if target else page
    assert path.exists(), (page.name, link)
    if anchor:
      assert anchor in anchors_of(path), (page.name, link)
  return links


def test_readme_links_to_its_own_sections_and_files_resolve():
  assert "the-trainer-tasks-train-configs" in anchors_of(
      ROOT / "docs" / "trainer.md"
  )  # the rule, by hand
  links = check_links(ROOT / "README.md")
  # The README is the index: it links every page of the docs.
  pages = sorted(p.name for p in (ROOT / "docs").glob("*.md"))
  linked = {pathlib.Path(link.partition("#")[0]).name for link in links}
  assert set(pages) - {"api.md"} <= linked, set(pages) - linked


def test_docs_links_resolve():
  pages = sorted((ROOT / "docs").glob("*.md"))
  assert len(pages) >= 8, pages
  for page in pages:
    check_links(page)


@pytest.mark.slow
def test_docs_build_offline_without_warnings(tmp_path):
  """``make docs``: Sphinx builds every page and the API reference from the
  docstrings, a warning (a broken cross-reference, a docstring Sphinx cannot
  read) failing the build."""
  pytest.importorskip("sphinx")
  pytest.importorskip("myst_parser")
  result = launch.run(
      [sys.executable, "-m", "sphinx", *SPHINX_ARGS, str(tmp_path / "html")],
      cwd=ROOT,
      capture_output=True,
      text=True,
      timeout=600,
  )
  assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
  html = tmp_path / "html"
  for page in (ROOT / "docs").glob("*.md"):
    assert (html / "docs" / f"{page.stem}.html").is_file(), page.name
  api = (html / "docs" / "api.html").read_text()
  for name in ("ntil_loss", "numeric_token_loss", "fused_numeric_loss"):
    assert f"ntil_jax.{name}" in api, name
