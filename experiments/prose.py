"""The reports' prose, kept as Markdown beside each report's code.

A report's text lives in Markdown next to its module (``report.py``'s in
``report.md``), cut into named sections by comment lines ``<!-- section: name -->``. Within a section:

- ``{field}`` and ``{field:format}`` are filled as by `str.format` (write
  ``{{`` and ``}}`` for a brace);
- a line that is only ``{{{name}}}`` (a block) is replaced by the lines of
  the list passed as ``name``, as they are;
- paragraphs may be wrapped: a line joins the one before it (with a space)
  unless either is blank, it starts a table row (``|``), a heading
  (``#``), an image (``![``), a list item (``- ``) or a block, or the line
  before is a table row, a heading, an image or a block. A list item's
  wrapped lines are indented by two spaces.

`section` returns the lines of results.md: one line a paragraph, as the
generated files have always been written.
"""

import functools
import os.path
import re

_SECTION = re.compile(r"^<!-- section: ([\w-]+) -->$", re.MULTILINE)
_BLOCK = re.compile(r"^\{\{\{(\w+)\}\}\}$")
_STARTS = ("|", "#", "![", "- ")


@functools.cache
def _sections(path: str) -> dict[str, list[str]]:
  with open(path) as f:
    parts = _SECTION.split(f.read())[1:]  # name, text, name, text, ...
  # A text runs from the line after its marker; blank lines part sections.
  names, texts = parts[::2], parts[1::2]
  return {n: t[1:].rstrip("\n").splitlines() for n, t in zip(names, texts)}


def _joins(previous: str, line: str) -> bool:
  """Whether ``line`` continues the paragraph or list item of ``previous``."""
  if not previous or not line:
    return False
  if line.startswith(_STARTS) or _BLOCK.match(line):
    return False
  return not (previous.startswith(("|", "#", "![")) or _BLOCK.match(previous))


def section(module_file: str, name: str, /, **values) -> list[str]:
  """The lines of section ``name`` of the Markdown beside ``module_file``
  (its name, ending ``.md``), its fields and blocks filled from ``values``."""
  path = os.path.splitext(module_file)[0] + ".md"
  try:
    template = _sections(path)[name]
  except KeyError:
    raise KeyError(f"{path} has no section {name!r}") from None
  out, previous = [], ""
  for line in template:
    block = _BLOCK.match(line)
    if block:
      out.extend(values[block.group(1)])
    elif _joins(previous, line):
      out[-1] += " " + line.strip().format_map(values)
    else:
      out.append(line.format_map(values))
    previous = line
  return out


def text(module_file: str, name: str, /, **values) -> str:
  """Section ``name`` as one string: its lines joined by spaces (a sentence
  or a fragment that a field of another section takes)."""
  return " ".join(section(module_file, name, **values))


def count(n, word) -> str:
  """``n`` and ``word``, plural but for one: ``1 seed``, ``3 seeds``."""
  return f"{n} {word}{'s' * (n != 1)}"
