"""What :class:`dcp.Client` offers, :class:`dcp.SyncClient` offers too, and the other way
round: every public method and property has a counterpart of the same name with the same
parameters (names, kinds, defaults), except the few listed here with the reason."""

from __future__ import annotations

import inspect

import dcp

#: Only on :class:`dcp.Client`, with the reason.
ONLY_ASYNC = {
    "__aenter__": "an async context manager; SyncClient is a plain one (__enter__)",
    "__aexit__": "an async context manager; SyncClient is a plain one (__exit__)",
    "aclose": "closing awaits a checkpoint; SyncClient.close (trio's naming: aclose is async)",
}
#: Only on :class:`dcp.SyncClient`, with the reason.
ONLY_SYNC = {
    "__enter__": "a plain context manager; Client is an async one (__aenter__)",
    "__exit__": "a plain context manager; Client is an async one (__aexit__)",
    "close": "Client.aclose (trio's naming: aclose is async)",
}


def _public(cls: type) -> dict[str, object]:
    """The public methods and properties of ``cls``, and the special methods it defines."""
    found: dict[str, object] = {}
    for klass in reversed(cls.__mro__[:-1]):  # every class but object, base first
        for name, value in vars(klass).items():
            special = name.startswith("__") and name.endswith("__")
            if special and name in vars(object):
                continue
            if name.startswith("_") and not special:
                continue
            if callable(value) or isinstance(value, property):
                found[name] = value
    for name in ("__init__", "__module__", "__dict__", "__weakref__"):
        found.pop(name, None)
    return found


def _parameters(member: object) -> list[tuple[str, object, object]]:
    """The parameters of a method (or a property's getter) but ``self``."""
    func = member.fget if isinstance(member, property) else member
    assert callable(func)
    params = list(inspect.signature(func).parameters.values())[1:]
    return [(p.name, p.kind, p.default) for p in params]


def test_the_clients_offer_the_same_methods_and_properties() -> None:
    async_api = _public(dcp.Client)
    sync_api = _public(dcp.SyncClient)
    assert set(async_api) - set(sync_api) == set(ONLY_ASYNC)
    assert set(sync_api) - set(async_api) == set(ONLY_SYNC)
    for name in sorted(set(async_api) & set(sync_api)):
        a, s = async_api[name], sync_api[name]
        assert isinstance(a, property) == isinstance(s, property), name
        assert _parameters(a) == _parameters(s), name


def test_the_discovery_methods_are_there() -> None:
    """The ones the blocking client lacked (issue 24), and ``map_outcomes`` on both."""
    for name in ("services", "service_info", "service_stats", "watch_services", "map_outcomes"):
        assert name in _public(dcp.Client) and name in _public(dcp.SyncClient)
