"""A wrong argument to a client names the class the user called (Rule CO5 of
dcp._client.options), as a broker's and a worker's do."""

from __future__ import annotations

import inspect
import sys

import pytest

import dcp

pytestmark = pytest.mark.skipif(
    sys.version_info < (3, 11), reason="Python 3.10 names no class in this TypeError"
)


@pytest.mark.parametrize("cls", [dcp.Client, dcp.SyncClient])
def test_a_wrong_keyword_names_the_client_class(cls: type[dcp.Client | dcp.SyncClient]) -> None:
    with pytest.raises(TypeError) as info:
        cls("tcp://127.0.0.1:5555", nonsense=1)  # type: ignore[call-arg]
    assert str(info.value) == (
        f"{cls.__name__}.__init__() got an unexpected keyword argument 'nonsense'"
    )
    with pytest.raises(TypeError, match=rf"^{cls.__name__}\.__init__\(\) takes 2 positional"):
        cls("tcp://127.0.0.1:5555", 30)  # type: ignore[call-arg]


def test_the_signature_and_defaults_are_the_options() -> None:
    assert inspect.signature(dcp.Client) == inspect.signature(dcp.SyncClient)
    assert "wait_for_broker" in inspect.signature(dcp.Client).parameters
    with dcp.SyncClient("tcp://127.0.0.1:5555", retries=0) as client:  # defaults kept
        assert client.wait_for_broker is True
        assert client.wait_for_worker is False
