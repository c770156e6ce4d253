"""dcp's Sphinx extension: the pages that write themselves, and a few fixes to autodoc output.

Blocks expanded before MyST parses a page (Sphinx's ``source-read`` event):

``dcp-api``: an API reference generated from a namespace's ``__all__``::

    ```{dcp-api} dcp
    Broker = _broker
    Errors = _errors
    ```

  becomes the module's docstring (``automodule``), then every name of its ``__all__``
  (``autoclass`` with members, ``autoexception``, ``autofunction`` or ``autodata``), grouped
  under one heading per private module that defines them (``dcp.Broker`` comes from
  ``dcp._broker.broker``).

  - ``Title = module [module ...]`` lines name and order the groups (module names relative to
    the namespace). A group not named gets the first sentence of its module's docstring as
    title and comes after the named ones, so a new public name never needs wiring.
  - ``:submodules:`` also documents the namespace's public submodules (no leading
    underscore), one heading each, the same way (``dcp.wire`` -> ``dcp.wire.dcp1``, ...).
  - ``:level: N`` is the heading level of the groups (default 2).

  A name keeps the namespace's name (``dcp.Broker``); autodoc records the real location as
  ``:canonical:`` (``dcp._broker.broker.Broker``), so references to either resolve. A name that the
  top-level package exports too (``dcp.wire.dcp1.Request`` is ``dcp.wire.Request``) is documented
  there only; here it gets a link target that points to it.

``dcp-modules``: every private module of a package (found by its files), each a ``py:module``
  target with the first paragraph of its docstring, so ``:mod:`dcp._core.broker.core``` resolves.

In the root page, a toctree line ``*`` becomes the top-level pages that the page does not list
(a glob would do the same, but warns when it matches nothing).

A reference to a private object that is documented nowhere but exists (checked by import)
links to its module's entry in the module map; one that does not exist stays broken.

Fixes to autodoc's output: annotations imported only under ``TYPE_CHECKING`` are qualified
from the module's imports; built-in type names in signatures are plain text (``bytes`` would
otherwise link to :attr:`dcp.Response.bytes`); no "Bases: object"; a constant with no ``#:``
comment does not show its type's docstring.
"""

from __future__ import annotations

import ast
import builtins
import functools
import importlib
import importlib.util
import inspect
import pkgutil
import re
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from docutils import nodes
from sphinx import addnodes

_BLOCK = re.compile(r"^```\{dcp-api\}[ \t]+(\S+)[ \t]*\n(.*?)^```[ \t]*$", re.M | re.S)


def _first_sentence(module: ModuleType) -> str:
    doc = inspect.getdoc(module) or module.__name__
    first = doc.split("\n\n")[0].replace("\n", " ")
    first = re.split(r"(?<=[a-z)])[.:](\s|$)", first)[0]
    # A title holds no roles: ":class:`~a.b.C`" -> "C".
    return re.sub(r":\w+:`~?([^`]*?)`", lambda m: m[1].rsplit(".", 1)[-1], first).strip()


def _import_sources(module: ModuleType) -> dict[str, str]:
    """Where each name of a package's ``__init__`` is imported from (``from dcp._x import y``
    or ``from ._x import y``)."""
    path = getattr(module, "__file__", None)
    if path is None or Path(path).name != "__init__.py":
        return {}
    sources: dict[str, str] = {}
    for node in ast.walk(ast.parse(Path(path).read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            if node.level > 0:
                base = module.__name__.rsplit(".", node.level - 1)[0] if node.level > 1 else ""
                base = base or module.__name__
                source = f"{base}.{node.module}" if node.module else base
            else:
                source = node.module or ""
            for alias in node.names:
                sources[alias.asname or alias.name] = source
    return sources


@functools.cache
def _definitions(package: str) -> dict[int, str]:
    """``id(obj)`` -> the module of ``package`` whose source defines ``obj`` at its top level
    (a public package shows re-exported objects as its own, ``dcp.Client``, so their
    ``__module__`` no longer says where they live)."""
    root = Path(next(iter(importlib.import_module(package).__path__)))
    found: dict[int, str] = {}
    for path in sorted(root.rglob("*.py")):
        parts = [package, *path.relative_to(root).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        if parts[-1] == "__main__":
            continue
        name = ".".join(parts)
        tree = ast.parse(path.read_text(encoding="utf-8"))
        defined = [
            node.name
            for node in tree.body
            if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        ]
        if not defined:
            continue
        try:
            module = importlib.import_module(name)
        except ImportError:  # an optional dependency (OpenTelemetry, hypercorn, pyspark)
            continue
        for attr in defined:
            obj = getattr(module, attr, None)
            if obj is not None:
                found.setdefault(id(obj), name)
    return found


def defining_module(obj: Any) -> str | None:
    """The dcp module whose source defines ``obj`` (``None``: not one of dcp's)."""
    module = getattr(obj, "__module__", None)
    if not isinstance(module, str):
        return None
    top = module.split(".")[0]
    return _definitions(top).get(id(obj), module) if top == "dcp" else module


def _source_module(namespace: ModuleType, name: str, obj: Any, imports: dict[str, str]) -> str:
    top = namespace.__name__.split(".")[0]
    owner = defining_module(obj) if callable(obj) else None
    if isinstance(owner, str) and owner.startswith(top) and owner != namespace.__name__:
        return owner
    return imports.get(name, namespace.__name__)


def _rst(text: str) -> str:
    """A reST block in MyST: autodoc emits reST, which MyST's own directives would not parse."""
    return f"```{{eval-rst}}\n{text}```\n"


# Members inherited from these are not repeated on every class (an Enum's name and value, an
# exception's args); members inherited from dcp's own classes are (Response.text).
_NOT_INHERITED = (
    "object, Enum, IntEnum, Flag, IntFlag, int, str, bytes, tuple, dict, Generic, BaseException,"
    " Exception, ValueError, RuntimeError, TimeoutError"
)
# Undocumented members too: attrs fields are described by the class's ``:ivar:`` fields, which
# make no link target for ``:attr:`` references.
_CLASS_OPTIONS = f"   :members:\n   :undoc-members:\n   :inherited-members: {_NOT_INHERITED}\n"


def _directive(name: str, obj: Any) -> str:
    if inspect.isclass(obj) and issubclass(obj, BaseException):
        return _rst(f".. autoexception:: {name}\n{_CLASS_OPTIONS}")
    if inspect.isclass(obj):
        return _rst(f".. autoclass:: {name}\n{_CLASS_OPTIONS}")
    if inspect.isfunction(obj) or inspect.isbuiltin(obj):
        return _rst(f".. autofunction:: {name}\n")
    return _rst(f".. autodata:: {name}\n")


def _parse_options(body: str) -> tuple[dict[str, str], dict[str, str], list[str]]:
    options: dict[str, str] = {}
    titles: dict[str, str] = {}
    order: list[str] = []
    for raw in body.splitlines():
        line = raw.strip()
        if not line:
            continue
        if option := re.fullmatch(r":([\w-]+):\s*(.*)", line):
            options[option[1]] = option[2]
        elif "=" in line:
            title, _, modules = line.partition("=")
            for module in modules.split():
                titles[module] = title.strip()
            if title.strip() not in order:
                order.append(title.strip())
        else:
            raise ValueError(f"dcp-api: cannot read {raw!r} (Title = module ... or :option:)")
    return options, titles, order


def _home(module: ModuleType, name: str, obj: Any) -> str | None:
    """Where else ``obj`` is documented: a parent package is the home of every name it
    exports, so ``dcp.wire.messages.Request`` (the same object as ``dcp.wire.Request``) is
    listed, not documented twice."""
    if not isinstance(obj, type | Callable | bytes | str | int):
        return None
    parts = module.__name__.split(".")
    for depth in range(1, len(parts)):
        parent = importlib.import_module(".".join(parts[:depth]))
        for exported in getattr(parent, "__all__", ()):
            if getattr(parent, exported) is obj:
                return f"{parent.__name__}.{exported}"
    return None


def _alias(name: str, obj: Any, home: str | None) -> str:
    """A link target in this namespace for a name documented at its home (not a second copy:
    no ``:canonical:``, so no duplicate object)."""
    if inspect.isclass(obj):
        kind = "exception" if issubclass(obj, BaseException) else "class"
    else:
        kind = "function" if callable(obj) else "data"
    return f".. py:{kind}:: {name}\n   :no-contents-entry:\n\n   The same as :py:obj:`{home}`.\n\n"


def render(module_name: str, body: str) -> str:
    """The Markdown that replaces one ``dcp-api`` block."""
    options, titles, order = _parse_options(body)
    level = int(options.get("level", "2"))
    module = importlib.import_module(module_name)
    names: list[str] = list(getattr(module, "__all__", []))
    imports = _import_sources(module)

    def absolute(relative: str) -> str:
        return relative if relative.startswith(module_name) else f"{module_name}.{relative}"

    wanted = {absolute(source): title for source, title in titles.items()}
    groups: dict[str, list[str]] = {}
    for name in names:
        source = _source_module(module, name, getattr(module, name), imports)
        groups.setdefault(source, []).append(name)

    sections: dict[str, list[str]] = {title: [] for title in order}
    for source, members in groups.items():
        if source in wanted:
            title = wanted[source]
        elif source == module_name:
            title = ""
        else:
            title = _first_sentence(importlib.import_module(source))
        sections.setdefault(title, []).extend(members)

    out = [_rst(f".. automodule:: {module_name}\n")]
    elsewhere: list[str] = []
    for title, members in sections.items():
        homes = {name: _home(module, name, getattr(module, name)) for name in members}
        here = [name for name in members if homes[name] is None]
        elsewhere.extend(
            _alias(name, getattr(module, name), homes[name]) for name in members if homes[name]
        )
        if not here:
            continue
        if title and len(sections) > 1:
            out.append(f"{'#' * level} {title}\n")
        out.extend(_directive(name, getattr(module, name)) for name in here)
    if elsewhere:
        out.insert(1, _rst("".join(elsewhere)))

    if "submodules" in options and hasattr(module, "__path__"):
        for info in pkgutil.iter_modules(module.__path__):
            if info.name.startswith("_"):
                continue
            sub = f"{module_name}.{info.name}"
            out.append(f"{'#' * level} `{sub}`\n")
            out.append(render(sub, f":level: {level + 1}\n"))
    return "\n".join(out)


def _summary(path: Path) -> str:
    """A module's first docstring paragraph as plain reST: roles become literals (their targets
    may be private objects that have no page)."""
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    first = " ".join(doc.split("\n\n")[0].split())
    return re.sub(r":[\w:]+:`~?([^`<]*?)(?:\s*<[^>]*>)?`", r"``\1``", first) or "(no docstring)"


def render_modules(package_name: str) -> str:
    """The ``dcp-modules`` block: a link target and summary for every private module."""
    package = importlib.import_module(package_name)
    root = Path(next(iter(package.__path__)))
    lines: list[str] = []
    # The files, not pkgutil: dcp._core is a namespace package, which pkgutil does not walk.
    for path in sorted(root.rglob("*.py")):
        parts = [package_name, *path.relative_to(root).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        if parts[-1] == "__main__" or not any(p.startswith("_") for p in parts[1:]):
            continue
        name = ".".join(parts)
        lines += [f".. py:module:: {name}", "", f"``{name}``", f"   {_summary(path)}", ""]
    return _rst("\n".join(lines) + "\n")


_MODULES_BLOCK = re.compile(r"^```\{dcp-modules\}[ \t]+(\S+)[ \t]*\n^```[ \t]*$", re.M)


def _other_pages(app: Any, text: str) -> str:
    """In the root page, a toctree line ``*`` becomes the top-level pages that the page does not
    list: new topic pages come after the ones listed in reading order, with no wiring (and no
    warning while there are none, as a glob that matches nothing would give)."""
    pages = sorted(
        doc for doc in app.env.found_docs if "/" not in doc and doc != app.config.root_doc
    )
    listed = set(re.findall(r"^(\S+)[ \t]*$", text, re.M))
    others = "\n".join(page for page in pages if page not in listed)
    return re.sub(r"^\*[ \t]*\n", f"{others}\n" if others else "", text, flags=re.M)


def _expand(app: Any, docname: str, source: list[str]) -> None:
    if docname == app.config.root_doc:
        source[0] = _other_pages(app, source[0])
    source[0] = _BLOCK.sub(lambda m: render(m[1], m[2]), source[0])
    source[0] = _MODULES_BLOCK.sub(lambda m: render_modules(m[1]), source[0])


_BUILTINS = frozenset(name for name in dir(builtins) if not name.startswith("_"))


def _unlink_builtins(app: Any, doctree: nodes.document) -> None:
    """``bytes`` in a signature is the built-in type, not :attr:`dcp.Response.bytes`.

    Sphinx resolves a type name in a signature by suffix when no object has that exact name,
    so ``bytes`` would link to (or be ambiguous between) the ``bytes`` properties of dcp's
    classes. Built-ins have no page here (no inventory offline): they stay plain text.
    """
    for xref in list(doctree.findall(addnodes.pending_xref)):
        if (
            xref.get("refdomain") == "py"
            and xref.get("reftype") in ("class", "obj")
            and xref.get("reftarget") in _BUILTINS
        ):
            xref.replace_self(xref.children)


def _drop_object_base(app: Any, name: str, obj: Any, options: Any, bases: list[type]) -> None:
    """No "Bases: object" line under every plain class."""
    if bases == [object]:
        bases.clear()


def _drop_type_docstring(
    app: Any, what: str, name: str, obj: Any, options: Any, lines: list[str]
) -> None:
    """A constant with no ``#:`` comment shows nothing, not its type's docstring (``bytes``)."""
    if what in ("data", "attribute") and not callable(obj) and not isinstance(obj, property):
        own = "\n".join(lines).strip()
        doc = type(obj).__doc__
        if own and isinstance(doc, str) and own == inspect.cleandoc(doc):
            lines.clear()


def _imported_names(module_name: str) -> dict[str, str]:
    """Every ``from X import Name [as Alias]`` of a module, wherever it is (``if
    TYPE_CHECKING:`` blocks included): alias -> qualified name."""
    spec = importlib.util.find_spec(module_name)
    if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
        return {}
    package = module_name if spec.submodule_search_locations else module_name.rpartition(".")[0]
    names: dict[str, str] = {}
    for node in ast.walk(ast.parse(Path(spec.origin).read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            for alias in node.names:
                names[alias.asname or alias.name] = f"{base}.{alias.name}"
    return names


_NAME = re.compile(r"(?<![\w.~'\"])([A-Za-z_]\w*)(?![\w:=])")


def _qualify(
    app: Any,
    what: str,
    name: str,
    obj: Any,
    options: Any,
    signature: str | None,
    return_annotation: str | None,
) -> tuple[str | None, str | None] | None:
    """Annotations that stayed strings (a name imported only for type checkers, such as
    ``TracerProvider`` or ``Handler``) are qualified from the imports of the module that wrote
    them (``~opentelemetry.trace.TracerProvider``), so they resolve or match the third-party
    prefixes like every evaluated annotation."""
    module = defining_module(obj)
    if not isinstance(module, str) or not (signature or return_annotation):
        return None
    imports = _imported_names(module)

    def qualify(text: str | None) -> str | None:
        if not text:
            return text
        return _NAME.sub(lambda m: f"~{imports[m[1]]}" if m[1] in imports else m[1], text)

    return qualify(signature), qualify(return_annotation)


def _private_target(name: str) -> str | None:
    """The private module that holds ``name`` (``dcp._core.broker.directory.broker_entry`` ->
    ``dcp._core.broker.directory``) if ``name`` really exists there, else ``None``."""
    parts = name.split(".")
    if parts[0] != "dcp" or not any(part.startswith("_") for part in parts[1:]):
        return None
    for cut in range(len(parts), 1, -1):
        module_name = ".".join(parts[:cut])
        try:
            obj: Any = importlib.import_module(module_name)
        except ImportError:
            continue
        for attribute in parts[cut:]:
            if not hasattr(obj, attribute):
                return None
            obj = getattr(obj, attribute)
        return module_name if any(p.startswith("_") for p in parts[1:cut]) else None
    return None


def _link_private(app: Any, env: Any, node: Any, contnode: Any) -> Any:
    """A reference to a private object that exists but is not documented (a helper function
    of ``dcp._core.broker.directory``) links to its module in the module map; a name that does not
    exist stays a broken reference (and fails the build)."""
    if node.get("refdomain") != "py" or node.get("reftype") == "mod":
        return None
    target = node["reftarget"].lstrip(".~")
    context = node.get("py:module") or ""
    parents = [".".join(context.split(".")[:cut]) for cut in range(context.count(".") + 1, 0, -1)]
    for candidate in [target, *(f"{parent}.{target}" for parent in parents if parent)]:
        module_name = _private_target(candidate)
        if module_name is not None:
            domain = env.domains["py"]
            return domain.resolve_xref(
                env, node["refdoc"], app.builder, "mod", module_name, node, contnode
            )
    return None


def _restore_modules() -> None:
    """Give the objects that ``dcp`` and ``dcp.wire`` show as their own
    (:func:`dcp._util.fixup_module_metadata`) their real ``__module__`` back for the build:
    autodoc reads ``#:`` attribute comments and annotations from the module that wrote them.
    The pages still name them ``dcp.Broker`` (the directives use the namespace's names)."""
    for name in ("dcp", "dcp.wire"):
        namespace = importlib.import_module(name)
        for exported in namespace.__all__:
            obj = getattr(namespace, exported)
            real = _definitions("dcp").get(id(obj))
            if real is not None and getattr(obj, "__module__", None) == name:
                obj.__module__ = real


def setup(app: Any) -> dict[str, Any]:
    _restore_modules()
    app.connect("missing-reference", _link_private)
    app.connect("autodoc-process-signature", _qualify)
    app.connect("autodoc-process-docstring", _drop_type_docstring)
    app.connect("autodoc-process-bases", _drop_object_base)
    app.connect("source-read", _expand)
    app.connect("doctree-read", _unlink_builtins)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
