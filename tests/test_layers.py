"""The package's layers (``docs/internals/layers.md``): no module imports a layer above its
own, the three drivers do not import one another, and there are no import cycles, counting
imports under ``TYPE_CHECKING`` and inside functions. Read from the source with :mod:`ast`
(nothing is imported)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "dcp"

#: Each layer and what it holds, lowest first; a module may import its own layer and those
#: below it. A module not named here belongs to its nearest named parent.
LAYERS: list[tuple[str, ...]] = [
    ("dcp._errors", "dcp._json", "dcp._util", "dcp._version"),
    ("dcp.wire",),
    ("dcp._models", "dcp._stats"),
    ("dcp._core",),
    ("dcp._io",),
    ("dcp._http",),
    ("dcp._broker", "dcp._client", "dcp._worker"),
    ("dcp._cli", "dcp.spark", "dcp", "dcp.__main__"),
]
#: Parts of one layer that must not import each other.
APART: list[tuple[str, ...]] = [
    ("dcp._broker", "dcp._client", "dcp._worker"),
    ("dcp._core.broker", "dcp._core.client", "dcp._core.worker"),
]


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


MODULES = _modules()


def _owner(module: str, owners: tuple[str, ...]) -> str | None:
    """The longest of ``owners`` that ``module`` is or lies under."""
    best = None
    for owner in owners:
        if (module == owner or module.startswith(owner + ".")) and (
            best is None or len(owner) > len(best)
        ):
            best = owner
    return best


def layer_of(module: str) -> int:
    owners = tuple(name for layer in LAYERS for name in layer)
    owner = _owner(module, owners)
    assert owner is not None, f"{module} is in no layer: add it to LAYERS"
    return next(i for i, layer in enumerate(LAYERS) if owner in layer)


def imports_of(module: str) -> Iterator[tuple[str, int]]:
    """The dcp modules ``module`` imports (anywhere in it), with the line."""
    path = MODULES[module]
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                if not is_package:
                    base.pop()
                base = base[: len(base) - node.level + 1]
                prefix = ".".join([*base, node.module] if node.module else base)
            else:
                prefix = node.module or ""
            names = [
                f"{prefix}.{alias.name}" if f"{prefix}.{alias.name}" in MODULES else prefix
                for alias in node.names
            ]
        else:
            continue
        for name in names:
            while name and name not in MODULES and "." in name:
                name = name.rsplit(".", 1)[0]
            if name in MODULES and name != module:
                yield name, node.lineno


def test_every_module_is_in_a_layer() -> None:
    for module in MODULES:
        layer_of(module)


def test_no_module_imports_a_layer_above_its_own() -> None:
    upward = [
        f"{module}:{line} imports {target} (layer {layer_of(target)} > {layer_of(module)})"
        for module in sorted(MODULES)
        for target, line in imports_of(module)
        if layer_of(target) > layer_of(module) and not _reexport(module, target)
    ]
    assert upward == []


def _reexport(module: str, target: str) -> bool:
    """A package's ``__init__`` may re-export what its own modules define."""
    return MODULES[module].name == "__init__.py" and target.startswith(module + ".")


def test_parts_kept_apart_do_not_import_each_other() -> None:
    crossing = []
    for parts in APART:
        for module in sorted(MODULES):
            mine = _owner(module, parts)
            if mine is None:
                continue
            for target, line in imports_of(module):
                theirs = _owner(target, parts)
                if theirs is not None and theirs != mine:
                    crossing.append(f"{module}:{line} imports {target}")
    assert crossing == []


def test_no_import_cycles() -> None:
    graph = {module: sorted({t for t, _ in imports_of(module)}) for module in MODULES}
    # A package imports its own modules to re-export them; the cycle that matters is a
    # module importing back up to its package (or a sibling that does), so package
    # re-exports are edges like any other.
    cycles = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in graph[node]:
            if state.get(nxt) == 1:
                cycles.append(" -> ".join([*stack[stack.index(nxt) :], nxt]))
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module)
    assert cycles == []


@pytest.mark.parametrize("module", ["dcp._core", "dcp.wire"])
def test_the_pure_layers_import_no_io(module: str) -> None:
    """The codecs and the sans-IO cores import neither sockets nor an event loop."""
    banned = ("zmq", "anyio", "trio", "asyncio", "socket", "threading", "time")
    found = []
    for name, path in sorted(MODULES.items()):
        if not (name == module or name.startswith(module + ".")):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                tops = [alias.name.split(".")[0] for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                tops = [node.module.split(".")[0]]
            else:
                continue
            found += [f"{name}:{node.lineno} imports {top}" for top in tops if top in banned]
    assert found == []
