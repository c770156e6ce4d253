"""The ``dcp`` command's help and errors point at documentation a pip user can open: pages of
the docs site, never paths of the repository (issue 25, finding 10)."""

from __future__ import annotations

import ast
import re

import pytest

from dcp._cli._docs import DOCS_URL
from dcp._cli._parser import build_parser
from tests.cli.procs import ROOT, run

_REPOSITORY_PATH = re.compile(r"\b(?:docs|examples|scripts)/[\w./-]*|\b[\w-]+\.md\b")


def _helps() -> dict[str, str]:
    """``dcp --help`` and every ``dcp COMMAND --help``, as printed (80 columns)."""
    parser = build_parser()
    return {
        "dcp": parser.format_help(),
        **{f"dcp {name}": sub.format_help() for name, sub in parser.commands.items()},
    }


@pytest.mark.parametrize("command", sorted(_helps()))
def test_help_names_no_repository_path(command: str) -> None:
    text = _helps()[command]
    assert _REPOSITORY_PATH.findall(text) == []
    for url in re.findall(r"https?://\S+", text):
        assert url.startswith(DOCS_URL), url


@pytest.mark.parametrize("command", sorted(_helps()))
def test_each_option_says_its_default_once(command: str) -> None:
    """An option's help that says its default itself is not followed by the formatter's own
    ``(default: ...)`` too (``--prefetch`` once read ``(default: 0, none) (default: 0)``)."""
    text = " ".join(_helps()[command].split())
    assert re.findall(r"\(default: [^)]*\) \(default:", text) == []


@pytest.mark.parametrize("command", sorted(_helps()))
def test_help_fits_80_columns(command: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """In a terminal of 80 columns no line of any help is wider: descriptions, epilogs and
    group texts keep their own line breaks (a CURVE group's line was 135 wide)."""
    monkeypatch.setenv("COLUMNS", "80")
    long = [line for line in _helps()[command].splitlines() if len(line) > 80]
    assert long == []


def test_every_argument_has_a_help_text() -> None:
    """Each option and positional argument of every command says what it is (``dcp pub
    --timeout`` once showed no help and no default)."""
    parser = build_parser()
    bare = [
        f"dcp {name} {action.option_strings or action.dest}"
        for name, sub in parser.commands.items()
        for action in sub._actions
        if not action.help
    ]
    assert bare == []
    assert "(default: 5.0)" in " ".join(parser.commands["pub"].format_help().split())


def test_help_links_name_pages_of_the_docs() -> None:
    """Every link is a page that ``docs/`` builds (``doc_url("security")`` for
    ``docs/security.md``), and ``dcp --help`` gives the site itself."""
    texts = _helps()
    assert DOCS_URL in texts["dcp"]
    pages = {
        page for text in texts.values() for page in re.findall(rf"{DOCS_URL}([\w-]+)\.html", text)
    }
    assert {"security", "reliability", "operations", "services", "streams"} <= pages
    assert all((ROOT / "docs" / f"{page}.md").is_file() for page in pages), pages


def test_dcp_help_prints_the_docs_site() -> None:
    code, out, err = run("--help")
    assert (code, err) == (0, "")
    assert f"documentation: {DOCS_URL}" in out
    assert _REPOSITORY_PATH.findall(out) == []


def test_no_message_of_the_package_names_a_repository_path() -> None:
    """Help texts, errors and log lines are string literals that are not docstrings: none
    names ``docs/...`` (docstrings may: they are the contributors' reading and the docs
    site's API pages)."""
    found = []
    for path in sorted((ROOT / "dcp").rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        docstrings = {
            id(node.body[0].value)
            for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and node.body
            and isinstance(node.body[0], ast.Expr)
            and isinstance(node.body[0].value, ast.Constant)
        }
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and id(node) not in docstrings
                and re.search(r"\bdocs/\S*\.md", node.value)
            ):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value!r}")
    assert found == []
