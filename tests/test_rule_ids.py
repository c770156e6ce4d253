"""Rule ids are unique across the package (``docs/internals/layers.md``): every rule is
stated once, at the top of the module that keeps it, as ``Rule <ID> - <title>``, where
``<ID>`` is the module's letters and a number (``R3``, ``L2``, ``TR1``); every mention of a
rule anywhere in the project names one that exists."""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "dcp"

DEFINITION = re.compile(r"^\s*Rule ([A-Z]{1,3}\d{1,2}) (?:- \S|\()", re.M)
#: A mention: "Rule R3", "Rules Q1-Q4", "Rules W2 and W3", "Rule U1/U3", "(R3)" is not one.
MENTION = re.compile(r"\bRules? ([A-Z]*\d+[A-Za-z]?)((?:\s*(?:[-/,]|and|or)\s*[A-Z]*\d+)*)")


def definitions() -> dict[str, list[str]]:
    """Rule id -> the modules whose docstring states it."""
    found: dict[str, list[str]] = defaultdict(list)
    for path in sorted(PACKAGE.rglob("*.py")):
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        for rule in DEFINITION.findall(doc):
            found[rule].append(str(path.relative_to(ROOT)))
    return found


def mentions() -> list[tuple[str, str]]:
    """Every rule id mentioned in the code, tests and docs: ``(where, id)``."""
    out = []
    files = [
        *PACKAGE.rglob("*.py"),
        *(ROOT / "tests").rglob("*.py"),
        *(ROOT / "docs").rglob("*.md"),
    ]
    for path in sorted(files):
        if path.name == Path(__file__).name:
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            for match in MENTION.finditer(line):
                ids = [match[1], *re.findall(r"[A-Z]*\d+", match[2])]
                out += [(f"{path.relative_to(ROOT)}:{number}", rule) for rule in ids]
    return out


def test_rules_are_stated() -> None:
    assert len(definitions()) > 50


def test_each_rule_id_is_stated_once() -> None:
    twice = {rule: where for rule, where in definitions().items() if len(where) > 1}
    assert twice == {}


def test_a_module_uses_one_prefix() -> None:
    prefixes: dict[str, set[str]] = defaultdict(set)
    for rule, where in definitions().items():
        prefixes[where[0]].add(re.sub(r"\d+$", "", rule))
    assert {module: p for module, p in prefixes.items() if len(p) > 1} == {}


def test_every_mentioned_rule_exists() -> None:
    known = definitions()
    unknown = [f"{where}: Rule {rule}" for where, rule in mentions() if rule not in known]
    assert unknown == []
