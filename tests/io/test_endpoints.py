"""``dcp._io.endpoints.check_endpoint``: the form of an endpoint, before zmq sees it."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from dcp._io.endpoints import check_endpoint, ipc_in_use

BOTH = [
    "tcp://127.0.0.1:5555",
    "tcp://localhost:1",
    "tcp://broker-1.example.com:65535",
    "tcp://[::1]:5555",
    "tcp://::1:5555",
    "tcp://eth0:5555",
    "ipc:///tmp/dcp.sock",
    "ipc://@abstract",
    "inproc://broker",
]
BIND_ONLY = [
    "tcp://*:5555",
    "tcp://127.0.0.1:0",
    "tcp://127.0.0.1:*",
    "tcp://*:*",
    "ipc://*",
    "inproc://*",
]


@pytest.mark.parametrize("endpoint", BOTH)
def test_good_endpoints(endpoint: str) -> None:
    assert check_endpoint(endpoint, bind=True) == endpoint
    assert check_endpoint(endpoint, bind=False) == endpoint


@pytest.mark.parametrize(
    ("endpoint", "reason"),
    [
        ("tcp://*:5555", "host '*' (every interface) is for binding only"),
        ("tcp://127.0.0.1:0", "port 0 (any free port) is for binding only"),
        ("tcp://127.0.0.1:*", "port '*' (any free port) is for binding only"),
        ("tcp://*:*", "port '*' (any free port) is for binding only"),
        ("ipc://*", "ipc://* is for binding only"),
        ("inproc://*", "inproc://* is for binding only"),
    ],
)
def test_bind_only_endpoints(endpoint: str, reason: str) -> None:
    assert endpoint in BIND_ONLY
    assert check_endpoint(endpoint, bind=True) == endpoint
    with pytest.raises(ValueError, match=r"^bad endpoint ") as info:
        check_endpoint(endpoint, bind=False)
    assert reason in str(info.value)


@pytest.mark.parametrize(
    ("endpoint", "reason"),
    [
        ("127.0.0.1:5555", "expected tcp://HOST:PORT, ipc://PATH or inproc://NAME"),
        ("udp://127.0.0.1:5555", "scheme must be tcp, ipc or inproc"),
        ("TCP://127.0.0.1:5555", "scheme must be tcp, ipc or inproc"),
        ("ipc://", "nothing after ipc://"),
        ("tcp://127.0.0.1", "no port (expected tcp://HOST:PORT)"),
        ("tcp://127.0.0.1:", "no port (expected tcp://HOST:PORT)"),
        ("tcp://:5555", "no host (expected tcp://HOST:PORT)"),
        ("tcp://127.0.0.1:99999", "port 99999 is out of range (0 to 65535)"),
        ("tcp://127.0.0.1:65536", "port 65536 is out of range (0 to 65535)"),
        ("tcp://127.0.0.1:-1", "port '-1' is not a number from 0 to 65535"),
        ("tcp://127.0.0.1:http", "port 'http' is not a number from 0 to 65535"),
        ("tcp://127.0.0.1:\u0665", "is not a number from 0 to 65535"),  # an Arabic-Indic 5
        ("tcp://[::1:5555", "host '[::1' is not an IPv6 address"),
        ("tcp://[nope]:5555", "host '[nope]' is not an IPv6 address"),
        ("tcp://300.1.1.1:5555", "host '300.1.1.1' is not an IPv4 address"),
        ("tcp://bad host:5555", "host 'bad host' is not a host name or address"),
        ("tcp://-x:5555", "host '-x' is not a host name or address"),
    ],
)
def test_bad_endpoints(endpoint: str, reason: str) -> None:
    for bind in (True, False):
        with pytest.raises(ValueError) as info:
            check_endpoint(endpoint, bind=bind)
        assert str(info.value).startswith(f"bad endpoint {endpoint!r}: ")
        assert reason in str(info.value)


def test_ipc_in_use_probes_only_ipc_paths(tmp_path: Path) -> None:
    assert not ipc_in_use("tcp://127.0.0.1:1")
    assert not ipc_in_use("ipc://*")
    assert not ipc_in_use(f"ipc://{tmp_path / 'nobody.sock'}")  # no file
    stale = tmp_path / "stale.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as unix:
        unix.bind(str(stale))  # a file nobody listens on
    assert not ipc_in_use(f"ipc://{stale}")
    live = tmp_path / "live.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as unix:
        unix.bind(str(live))
        unix.listen(1)
        assert ipc_in_use(f"ipc://{live}")
