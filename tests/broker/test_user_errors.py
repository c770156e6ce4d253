"""Errors a new user sees from a broker (real sockets, both anyio backends): a wrong keyword
names ``Broker``; an endpoint in use (a tcp port another socket holds, an ``ipc://`` path a
live process listens on) is :exc:`dcp.BindFailed` in one line, not zmq's error; subjects are
shown as text, as service names are."""

from __future__ import annotations

import errno
import pickle
import socket
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import zmq

import dcp
from dcp._core.broker.subjects import SubjectError, check_pattern, check_subject

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("cls", [dcp.Broker, dcp.Worker])
def test_a_wrong_keyword_names_the_class_the_user_called(cls: Callable[..., object]) -> None:
    if cls is dcp.Worker and sys.version_info < (3, 11):
        pytest.skip("Python 3.10 names no class in this TypeError (no co_qualname)")
    with pytest.raises(TypeError) as info:
        cls("tcp://127.0.0.1:5555", nonsense=1)
    assert str(info.value) in (
        f"{cls.__name__}() got an unexpected keyword argument 'nonsense'",
        f"{cls.__name__}.__init__() got an unexpected keyword argument 'nonsense'",
    )
    # Keywords the broker passes to its core itself are not the user's either.
    if cls is dcp.Broker:
        wrong = r"^Broker\(\) got an unexpected keyword argument 'guard'"
        with pytest.raises(TypeError, match=wrong):
            dcp.Broker("tcp://127.0.0.1:0", guard=None)


def test_a_core_keyword_is_still_taken() -> None:
    broker = dcp.Broker("tcp://127.0.0.1:0", max_service_name=10, max_memory=None)
    assert isinstance(broker, dcp.Broker)


async def test_a_tcp_port_in_use_is_bind_failed() -> None:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
    holder = ctx.socket(zmq.ROUTER)
    holder.setsockopt(zmq.LINGER, 0)
    try:
        port = holder.bind_to_random_port("tcp://127.0.0.1")
        endpoint = f"tcp://127.0.0.1:{port}"
        with pytest.raises(dcp.BindFailed) as info:
            async with dcp.Broker("tcp://127.0.0.1:0", endpoint):
                pass  # pragma: no cover
        assert str(info.value) == f"cannot bind {endpoint}: Address already in use"
        assert (info.value.endpoint, info.value.errno) == (endpoint, errno.EADDRINUSE)
        assert isinstance(info.value, OSError) and isinstance(info.value, dcp.DCPError)
        assert info.value.__cause__ is None
        assert not isinstance(info.value.__context__, zmq.ZMQError)
        again = pickle.loads(pickle.dumps(info.value))
        assert (str(again), again.endpoint, again.errno) == (
            str(info.value),
            endpoint,
            errno.EADDRINUSE,
        )
    finally:
        holder.close(0)


async def test_a_port_another_broker_of_this_process_holds_is_bind_failed() -> None:
    async with dcp.Broker("tcp://127.0.0.1:0") as first:
        endpoint = first.endpoints[0]
        with pytest.raises(dcp.BindFailed, match="Address already in use"):
            async with dcp.Broker(endpoint):
                pass  # pragma: no cover
        # The first one still serves.
        async with dcp.Client(endpoint, timeout=5) as client:
            assert await client.services() == []


async def test_an_ipc_path_a_live_broker_listens_on_is_bind_failed(tmp_path: Path) -> None:
    endpoint = f"ipc://{tmp_path / 'b.sock'}"
    async with dcp.Broker(endpoint) as first:
        with pytest.raises(dcp.BindFailed) as info:
            async with dcp.Broker("tcp://127.0.0.1:0", endpoint):
                pass  # pragma: no cover
        assert str(info.value) == (
            f"cannot bind {endpoint}: Address already in use (a process listens there)"
        )
        assert info.value.errno == errno.EADDRINUSE
        # zmq would have taken the path over silently: the first broker still has it.
        async with dcp.Client(first.endpoints[0], timeout=5) as client:
            assert await client.services() == []
    # A stale socket file, nobody listening (a killed broker leaves one), is replaced.
    stale = tmp_path / "stale.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as unix:
        unix.bind(str(stale))
    async with dcp.Broker(f"ipc://{stale}") as broker:
        assert broker.endpoints == [f"ipc://{stale}"]


async def test_a_broker_restarted_on_its_ipc_path_binds_it(tmp_path: Path) -> None:
    """The listener of a broker just stopped in this process is closed by zmq's I/O thread a
    moment later: the next broker on that path waits for it instead of calling it in use
    (it did, about once in 25 restarts)."""
    endpoint = f"ipc://{tmp_path / 'b.sock'}"
    for _ in range(100):
        async with dcp.Broker(endpoint) as broker:
            assert broker.endpoints == [endpoint]


def test_subject_errors_show_text_not_bytes() -> None:
    cases: list[tuple[Callable[[], object], str]] = [
        (lambda: check_subject(b"a.*"), "subject 'a.*' holds a wildcard"),
        (lambda: check_subject(b"a b"), "subject 'a b' holds whitespace or NUL"),
        (lambda: check_pattern(b"a..b"), "pattern 'a..b' has an empty token"),
        (lambda: check_pattern(b"a.>.b"), "pattern 'a.>.b': '>' may only be the last token"),
        (lambda: check_subject("é.*".encode()), "subject 'é.*' holds a wildcard"),
    ]
    for call, text in cases:
        with pytest.raises(SubjectError) as info:
            call()
        assert str(info.value).startswith(text), str(info.value)


async def test_a_client_sees_subjects_as_text() -> None:
    async with (
        dcp.Broker("tcp://127.0.0.1:0") as broker,
        dcp.Client(broker.endpoints[0], timeout=5) as client,
    ):
        with pytest.raises(ValueError, match=r"^subject 'a\.\*' holds a wildcard"):
            await client.publish("a.*", b"")
        with pytest.raises(ValueError, match=r"^pattern 'a\.\.b' has an empty token"):
            async with client.subscribe("a..b"):
                pass  # pragma: no cover


async def test_a_forbidden_subject_is_shown_as_text() -> None:
    server_public, server_secret = zmq.curve_keypair()
    public, secret = zmq.curve_keypair()
    options = dcp.PubSubOptions(publishers={"news.>": [public]}, subscribers={"news.>": [public]})
    server = dcp.CurveServer(server_public, server_secret, clients=[public])
    async with (
        dcp.Broker("tcp://127.0.0.1:0", security=server, pubsub=options) as broker,
        dcp.Client(
            broker.endpoints[0], security=dcp.CurveClient(server_public, public, secret), timeout=5
        ) as client,
    ):
        with pytest.raises(dcp.RemoteError) as info:
            await client.publish("weather", b"x", ack=True)
        assert info.value.code == "forbidden_subject"
        assert info.value.message == "may not publish to 'weather'"
        with pytest.raises(dcp.RemoteError) as info:
            async with client.subscribe("sport.*"):
                pass  # pragma: no cover
        assert info.value.message == "may not subscribe to 'sport.*'"


@pytest.mark.parametrize("wait_for_worker", [False, True])
async def test_a_service_name_too_long_is_refused_as_such(wait_for_worker: bool) -> None:
    async with (
        dcp.Broker("tcp://127.0.0.1:0", max_service_name=10) as broker,
        dcp.Client(broker.endpoints[0], timeout=10) as client,
    ):
        with pytest.raises(dcp.RemoteError) as info:
            await client.request("a" * 20, b"x", wait_for_worker=wait_for_worker)
        assert type(info.value) is dcp.RemoteError  # not NoWorkers
        assert info.value.code == "service_name_too_long"
        assert info.value.message == "service name of 20 bytes (max_service_name is 10)"
        assert broker.statistics().rejections == {"service_name_too_long": 1}
        # A name at the limit is a service like any other: nobody serves it.
        with pytest.raises(dcp.NoWorkers):
            await client.request("a" * 10, b"x")


async def test_a_forward_to_a_name_too_long_is_refused_as_such() -> None:
    async def forward(request: dcp.HandlerRequest) -> dcp.Forward:
        return dcp.Forward("b" * 20, request.data[0])

    async with (
        dcp.Broker("tcp://127.0.0.1:0", max_service_name=10) as broker,
        dcp.Worker(broker.endpoints[0], "fw", forward),
        dcp.Client(broker.endpoints[0], timeout=10) as client,
    ):
        with pytest.raises(dcp.RemoteError) as info:
            await client.request("fw", b"x", wait_for_worker=True)
        assert type(info.value) is dcp.RemoteError  # not NoWorkers
        assert info.value.code == "service_name_too_long"
