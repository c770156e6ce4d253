"""Sphinx configuration of the dcp docs site (build it with ``scripts/docs``).

Why Sphinx (and not MkDocs): every docstring in dcp is reST with Python-domain roles
(``:class:``, ``:meth:``, ``:attr:``, ``:mod:``, ``:exc:``) and field lists, as in anyio and trio.
Sphinx's autodoc renders them as written and, in nitpicky mode (``-n``), fails on every role
whose target does not exist, which is what keeps the reference honest. mkdocstrings would need
the docstrings rewritten (or a reST-to-Markdown pass) and checks cross-references less
strictly. The topic pages stay Markdown (MyST); the theme is furo.

What the build picks up by itself (see ``docs/README.md``):

- every ``docs/*.md`` page: the topics toctree in ``index.md`` ends with ``*``, which the
  extension below replaces by the pages it does not list;
- every name in the ``__all__`` of a public namespace: ``api/*.md`` use the ``dcp-api``
  block (``docs/_ext/dcp_api.py``), which reads ``__all__`` at build time and groups the
  names by the private module they come from;
- every private module: ``internals/modules.md`` lists them all (``dcp-modules``); a
  reference to a private object that exists links to its module there;
- every ``dcp`` command's ``--help``: ``cli.md`` has a ``dcp-cli`` block
  (``docs/_ext/dcp_cli.py``).

Third-party targets: the build runs offline (CI has no route to docs.python.org or
readthedocs), so there is no intersphinx. References to the standard library's and
third-party packages' objects are ignored by name prefix in ``nitpick_ignore_regex`` below;
every reference to a dcp object must resolve.
"""

from __future__ import annotations

import sys
from pathlib import Path

import dcp

sys.path.insert(0, str(Path(__file__).parent / "_ext"))

project = "dcp"
author = "dcp developers"
copyright = "dcp developers"
release = dcp.__version__
version = release

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "dcp_api",
    "dcp_cli",
]

source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
root_doc = "index"
# README.md: how to work on the docs (for GitHub readers, not a page). perf/: the benchmark
# suite's data and plots (the plots are included by performance.md as images).
exclude_patterns = ["README.md", "_build", "perf", "_ext"]

# Markdown: headings get anchors (the pages link to each other as page.md#heading).
myst_heading_anchors = 4
# A fence without a language (and a docstring's ``::`` block) is Python.
highlight_language = "python"

html_theme = "furo"
html_title = f"dcp {release}"
html_static_path: list[str] = []

# autodoc
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_typehints_format = "short"
autodoc_preserve_defaults = True
autodoc_default_options = {"show-inheritance": True}

# Every reference must resolve (scripts/docs builds with -W --keep-going -n), except those to
# objects outside dcp: no inventory of them is reachable offline (see the module docstring).
nitpicky = True
_THIRD_PARTY = (
    # the standard library
    "abc|asyncio|collections|concurrent|contextlib|dataclasses|enum|functools|ipaddress"
    "|logging|os|pathlib|random|socket|ssl|threading|types|typing|typing_extensions"
    # dependencies and extras (and those the operations work of issue 14 brings)
    "|anyio|trio|zmq|attrs?|cryptography|pyspark|pyarrow|pandas|outcome"
    "|hypercorn|prometheus_client|opentelemetry|rich|textual"
)
nitpick_ignore_regex = [
    (r"py:.*", rf"({_THIRD_PARTY})(\..+)?"),
]
