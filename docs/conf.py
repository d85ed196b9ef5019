"""Sphinx configuration for the credit documentation (MyST Markdown, MyST-NB notebooks).

Build: `make docs` (warnings are errors). The method catalogue, the recipes, the credit
benchmark's result tables, the API reference and the rendered notebooks are generated at build
time from the code by `_ext/credit_docs.py` into `_generated/` (not checked in).
"""
import os
import sys

DOCS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(DOCS)
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(DOCS, "_ext"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

project = "credit"
author = "the credit authors"
copyright = "the credit authors"

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.mathjax",
    "myst_nb",           # brings myst_parser: Markdown pages and notebooks
    "credit_docs",       # generates the catalogue, recipes, bench, API pages; guards docstrings
]

source_suffix = {".rst": "restructuredtext", ".md": "myst-nb", ".ipynb": "myst-nb"}
root_doc = "index"
# methods/<name>.md are included into the generated method pages, not pages of their own.
exclude_patterns = ["_build", "methods/*", "README.md", "**/.ipynb_checkpoints",
                    "_generated/contract_table.md", "_generated/producers_table.md"]

# Notebooks are rendered as stored; CI runs them with nbmake, the docs build never executes them.
nb_execution_mode = "off"
myst_enable_extensions = ["dollarmath", "colon_fence", "deflist"]
myst_heading_anchors = 3

# Functions and classes stay out of the navigation tree: with ~1000 of them in it, the theme's
# per-page navigation dominated the build time.
toc_object_entries = False

autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_default_options = {"members": True, "show-inheritance": False}
autodoc_inherit_docstrings = False
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_ivar = True          # Attributes: as fields, not duplicate attribute entries
napoleon_use_rtype = False

html_theme = "furo"
html_title = "credit"
html_static_path = []
html_show_sourcelink = False
