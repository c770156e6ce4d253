"""Sections of ``docs/performance.md`` that another benchmark writes (e.g.
:mod:`benchmarks.spark`): marked with HTML comments, replaced in place by their writer and
kept as they are when :mod:`benchmarks.report` regenerates the rest of the page."""

from __future__ import annotations

import re

__all__ = ["kept_sections", "put_section"]

_SECTION = re.compile(
    r"<!-- section: (?P<name>[\w.-]+) -->\n.*?<!-- /section: (?P=name) -->\n", re.DOTALL
)


def _marked(name: str, body: str) -> str:
    return f"<!-- section: {name} -->\n{body.rstrip()}\n<!-- /section: {name} -->\n"


def put_section(page: str, name: str, body: str) -> str:
    """``page`` with section ``name`` set to ``body``: replaced where it is, else appended."""
    block = _marked(name, body)
    for match in _SECTION.finditer(page):
        if match["name"] == name:
            return page[: match.start()] + block + page[match.end() :]
    return page.rstrip("\n") + "\n\n" + block


def kept_sections(page: str) -> str:
    """Every marked section of ``page``, in order, to append to a regenerated page."""
    return "".join("\n" + m.group(0) for m in _SECTION.finditer(page))
