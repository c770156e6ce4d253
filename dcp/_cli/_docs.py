"""Where a pip user reads the documentation: the ``--help`` texts and errors of the ``dcp``
command link to pages of the docs site (the pages of ``docs/``, built by ``scripts/docs``),
never to paths of the repository, which an installed package does not have.

What this module does NOT do: check that a page exists (``tests/cli/test_help.py`` does).
"""

from __future__ import annotations

__all__ = ["DOCS_URL", "doc_url"]

#: The docs site; ``pyproject.toml``'s ``[project.urls]`` Documentation is the same URL.
DOCS_URL = "https://dagbox.github.io/dcp/"


def doc_url(page: str) -> str:
    """The URL of a page of the docs site, ``doc_url("security")`` for ``docs/security.md``."""
    return f"{DOCS_URL}{page}.html"
