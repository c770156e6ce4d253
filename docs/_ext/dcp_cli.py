"""The ``dcp`` command's reference, written by the command itself.

A block expanded before MyST parses a page (Sphinx's ``source-read`` event)::

    ```{dcp-cli}
    ```

becomes ``dcp --help``, then one section per command (``### `dcp broker` ``) with its
``--help``, in the order ``dcp --help`` lists them, formatted 88 columns wide. A new command
or option needs no edit of the page.
"""

from __future__ import annotations

import os
import re
from typing import Any

_BLOCK = re.compile(r"^```\{dcp-cli\}[ \t]*\n```[ \t]*$", re.MULTILINE)

#: Width of the help texts on the page.
COLUMNS = 88


def render() -> str:
    """The Markdown that replaces a ``dcp-cli`` block."""
    from dcp._cli._parser import build_parser

    saved = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(COLUMNS + 2)  # argparse leaves two columns free
    try:
        parser = build_parser()
        parts = ["```text", "$ dcp --help", parser.format_help().rstrip(), "```"]
        for name, sub in parser.commands.items():
            parts += ["", f"### `dcp {name}`", "", "```text"]
            parts += [f"$ dcp {name} --help", sub.format_help().rstrip(), "```"]
    finally:
        if saved is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = saved
    return "\n".join(parts)


def _expand(app: Any, docname: str, source: list[str]) -> None:
    if _BLOCK.search(source[0]):
        source[0] = _BLOCK.sub(lambda _: render(), source[0])


def setup(app: Any) -> dict[str, Any]:
    app.connect("source-read", _expand)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
