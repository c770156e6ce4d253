"""``__all__`` of dcp (and of any public submodule) lists exactly what the module exports."""

from __future__ import annotations
import __future__

import pkgutil
from importlib import import_module
from types import ModuleType

import pytest

import dcp


def _public_modules() -> list[ModuleType]:
    names = [
        info.name
        for info in pkgutil.walk_packages(dcp.__path__, "dcp.")
        if not any(part.startswith("_") for part in info.name.split("."))
    ]
    return [dcp, *(import_module(name) for name in names)]


def _exported(module: ModuleType) -> set[str]:
    """Public names bound in ``module``, except submodules and ``from __future__`` flags."""
    return {
        name
        for name, value in vars(module).items()
        if not name.startswith("_") and not isinstance(value, (ModuleType, __future__._Feature))
    }


def _isort_key(name: str) -> tuple[int, str]:
    """CONSTANTS first, then Classes, then functions (ruff RUF022's "isort-style")."""
    if name.isupper():
        return (0, name)
    if name[:1].isupper():
        return (1, name)
    return (2, name)


@pytest.mark.parametrize("module", _public_modules(), ids=lambda m: m.__name__)
def test_all_matches_exports(module: ModuleType) -> None:
    all_names = getattr(module, "__all__", None)
    assert isinstance(all_names, list), f"{module.__name__} has no __all__ list"
    assert len(all_names) == len(set(all_names)), "duplicates in __all__"
    missing = sorted(name for name in all_names if not hasattr(module, name))
    assert not missing, f"in {module.__name__}.__all__ but not defined: {missing}"
    unlisted = sorted(_exported(module) - set(all_names))
    assert not unlisted, f"exported by {module.__name__} but not in __all__: {unlisted}"


@pytest.mark.parametrize("module", _public_modules(), ids=lambda m: m.__name__)
def test_all_is_sorted(module: ModuleType) -> None:
    all_names: list[str] = module.__all__
    assert all_names == sorted(all_names, key=_isort_key)


def test_star_import_gives_exactly_all() -> None:
    namespace: dict[str, object] = {}
    exec("from dcp import *", namespace)
    namespace.pop("__builtins__")
    assert set(namespace) == set(dcp.__all__)


def test_version() -> None:
    assert isinstance(dcp.__version__, str)
    assert dcp.__version__


@pytest.mark.parametrize("namespace", ["dcp", "dcp.wire"])
def test_public_classes_and_functions_show_where_users_import_them(namespace: str) -> None:
    """``repr(dcp.Client)`` is ``<class 'dcp.Client'>`` (trio's ``fixup_module_metadata``),
    and pickles name that path."""
    module = import_module(namespace)
    shown = {
        name: getattr(module, name).__module__
        for name in module.__all__
        if isinstance(getattr(module, name), type) or callable(getattr(module, name))
    }
    assert shown and set(shown.values()) == {namespace}


def test_about_forty_public_names() -> None:
    """What an application uses; the frames are in ``dcp.wire`` (issue 24)."""
    assert 35 <= len(dcp.__all__) <= 45
