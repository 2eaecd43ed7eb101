"""Sphinx configuration: ``make docs`` builds the site into docs/_build/html.

The source folder is the repository itself, limited to the pages (this
folder, the README and the experiments' and benchmarks' generated
reports), so a link from a page to a report or to the README is a checked
cross-reference. The API reference is generated from the docstrings.
"""

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

project = "ntil-jax"
author = "ntil-jax authors"
root_doc = "docs/index"
extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
    "sphinx.ext.mathjax",
]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
include_patterns = [
    "docs/**",
    "README.md",
    "experiments/**/*.md",
    "benchmarks/*.md",
]
exclude_patterns = [
    "docs/_build/**",
    # Prose the reports read in (no title of their own).
    "experiments/*/discussion.md",
    "experiments/*/budget.md",
    # The reports' prose templates (experiments/prose.py).
    "experiments/*/report.md",
    "experiments/*/*_report.md",
]
myst_heading_anchors = 4
myst_enable_extensions = ["dollarmath"]
# The generated reports go from '#' to '###' in places; a skipped heading
# level is not a broken link.
suppress_warnings = ["myst.header"]
autosummary_generate = True
autodoc_member_order = "bysource"
autodoc_typehints = "description"
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_ivar = True
html_theme = "alabaster"
html_title = "ntil-jax"
