"""experiments.prose: report text kept as Markdown, filled and unwrapped."""

import pytest

from experiments import prose

TEMPLATE = """\
<!-- anything before the first section is a comment -->

<!-- section: one -->
# A {title}

A paragraph wrapped
over three lines, with {count:,}
items.

| a | b |
|---|---|
{{{rows}}}
Right after a block.

- an item that
  goes on
- {{braces}} stay

![plot](plots/{name}.png)
<!-- section: two -->
Two.

"""


@pytest.fixture(name="module")
def fixture_module(tmp_path):
  (tmp_path / "report.md").write_text(TEMPLATE)
  return str(tmp_path / "report.py")


def test_fields_blocks_and_paragraphs(module):
  got = prose.section(
      module,
      "one",
      title="title",
      count=12345,
      rows=["| 1 | 2 |", "| 3 | 4 |"],
      name="name",
  )
  assert got == [
      "# A title",
      "",
      "A paragraph wrapped over three lines, with 12,345 items.",
      "",
      "| a | b |",
      "|---|---|",
      "| 1 | 2 |",
      "| 3 | 4 |",
      "Right after a block.",
      "",
      "- an item that goes on",
      "- {braces} stay",
      "",
      "![plot](plots/name.png)",
  ]


def test_sections_end_without_blank_lines(module):
  assert prose.section(module, "two") == ["Two."]


def test_a_missing_section_or_field_is_named(module):
  with pytest.raises(KeyError, match="no section 'three'"):
    prose.section(module, "three")
  with pytest.raises(KeyError, match="title"):
    prose.section(module, "one", count=1, rows=[], name="x")
