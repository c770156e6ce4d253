"""A worker's first contact with its broker, on real zmq sockets and both anyio backends: a
stop before the broker has echoed the registration (``tg.start(worker.serve)`` returns), and
a connection refused at the endpoint (:mod:`dcp._worker.connection` Rule WC8).
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from dcp._errors import RegistrationRefused
from dcp._models import HandlerRequest
from dcp._worker.worker import Worker
from dcp.wire.messages import Register, Reply, error_reply_data
from tests.worker.test_worker import FakeBroker, eventually, registered

pytestmark = pytest.mark.anyio

SVC = b"echo"
REFUSED = "was refused (is a dcp broker running there?); still trying"


async def upper(request: HandlerRequest) -> bytes:
    return request.data[0].upper()


def closed_port() -> str:
    """A tcp endpoint where nothing listens: a port taken from port 0, then closed."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return f"tcp://127.0.0.1:{port}"


@pytest.fixture
def fake() -> Iterator[FakeBroker]:
    broker = FakeBroker()
    yield broker
    broker.close()


def refusals(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "dcp.worker" and REFUSED in r.getMessage()]


def silent_warnings(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if r.name == "dcp.worker" and r.levelno >= logging.WARNING and "silent" in r.getMessage()
    ]


# -- a stop before the registration is echoed ---------------------------------------------


async def test_a_stop_before_the_echo_lets_tg_start_return(fake: FakeBroker) -> None:
    """The broker reads the registration and says nothing: a stop ends serving, and
    ``tg.start`` returns (no ``RuntimeError``), once the socket is closed."""
    worker = Worker(fake.endpoint, SVC, upper)
    async with anyio.create_task_group() as tg:

        async def stop_once_registering() -> None:
            await fake.expect(Register)
            worker.stop(grace=5)

        tg.start_soon(stop_once_registering)
        with anyio.fail_after(5):
            await tg.start(worker.serve)
        assert not registered(worker)
        with anyio.fail_after(5):
            await worker.aclose()  # serve() has returned already
    assert worker.statistics().in_progress == 0


async def test_a_stop_before_serve_lets_tg_start_return(fake: FakeBroker) -> None:
    worker = Worker(fake.endpoint, SVC, upper)
    worker.stop()
    async with anyio.create_task_group() as tg:
        with anyio.fail_after(5):
            await tg.start(worker.serve)
    assert not registered(worker)
    await fake.expect_silence(0.05)  # it never connected


async def test_a_stop_before_any_broker_echoes_lets_tg_start_return() -> None:
    """Several brokers, none of them listening: the same."""
    worker = Worker([closed_port(), closed_port()], SVC, upper)
    async with anyio.create_task_group() as tg:

        async def stop_soon() -> None:
            await anyio.sleep(0.05)
            worker.stop(grace=5)

        tg.start_soon(stop_soon)
        with anyio.fail_after(5):
            await tg.start(worker.serve)
    assert not registered(worker)


def silent_beacon() -> str:
    """A ``beacon://`` endpoint where no beacon is sent: a UDP port taken from port 0."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return f"beacon://127.0.0.1:{port}"


async def test_a_stop_before_serve_skips_listening_for_a_beacon() -> None:
    """A stop before serve: no beacon is waited for (no ``TimeoutError`` for none heard)."""
    worker = Worker(silent_beacon(), SVC, upper)
    worker.stop()
    async with anyio.create_task_group() as tg:
        with anyio.fail_after(30):  # a hang guard only
            await tg.start(worker.serve)
    assert not registered(worker)


@pytest.mark.parametrize("several", [False, True], ids=["one", "several"])
async def test_a_stop_while_listening_for_a_beacon_lets_tg_start_return(several: bool) -> None:
    """A stop while the worker listens for its broker's beacon ends serving (no
    ``TimeoutError`` for the beacon not heard); ``aclose`` waits for serve's return."""
    beacon = silent_beacon()
    worker = Worker([beacon, closed_port()] if several else beacon, SVC, upper)
    returned = False
    async with anyio.create_task_group() as tg:

        async def serve() -> None:
            nonlocal returned
            await tg.start(worker.serve)
            returned = True

        tg.start_soon(serve)
        await anyio.wait_all_tasks_blocked()  # listening
        with anyio.fail_after(30):  # a hang guard only
            await worker.aclose()
        assert worker.statistics().in_progress == 0
    assert returned
    assert not registered(worker)


async def test_aclose_after_serve_was_cancelled_listening_for_a_beacon() -> None:
    worker = Worker(silent_beacon(), SVC, upper)
    async with anyio.create_task_group() as tg:
        tg.start_soon(worker.serve)
        await anyio.wait_all_tasks_blocked()  # listening
        tg.cancel_scope.cancel()
    with anyio.fail_after(30):  # a hang guard only
        await worker.aclose()


async def test_a_stop_before_the_echo_lets_async_with_enter(fake: FakeBroker) -> None:
    """``async with`` enters (the worker stopped already) and leaves without error."""
    worker = Worker(fake.endpoint, SVC, upper)
    async with anyio.create_task_group() as tg:

        async def stop_once_registering() -> None:
            await fake.expect(Register)
            worker.stop(grace=5)

        tg.start_soon(stop_once_registering)
        with anyio.fail_after(5):
            async with worker:
                assert not registered(worker)


async def test_a_refusal_is_still_an_error_before_the_echo(fake: FakeBroker) -> None:
    """Only a stop reports readiness without the echo: a refused registration still raises
    out of ``tg.start``."""
    worker = Worker(fake.endpoint, SVC, upper)

    async def refuse() -> None:
        ident, _ = await fake.expect(Register)
        data = error_reply_data("registration_refused", "not allowed")
        fake.send(ident, Reply(None, (SVC,), data))

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(refuse)
            with pytest.raises(RegistrationRefused):
                await tg.start(worker.serve)


# -- a connection refused ------------------------------------------------------------------


@pytest.mark.parametrize("transport", ["tcp", "ipc"])
async def test_a_refused_connection_is_said_once_at_once(
    transport: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Nothing listens: one WARNING, before the liveness (here 0.5 s) would say the broker is
    silent; none again while the worker keeps trying, on new sockets too, and the
    reconnections themselves are not warned about."""
    endpoint = closed_port() if transport == "tcp" else f"ipc://{tmp_path}/none.sock"
    worker = Worker(
        endpoint,
        SVC,
        upper,
        heartbeat_interval=0.1,
        liveness=5,
        reconnect_min=0.01,
        reconnect_max=0.02,
    )
    caplog.set_level(logging.DEBUG, logger="dcp.worker")
    async with anyio.create_task_group() as tg:
        tg.start_soon(worker.serve)
        await eventually(lambda: bool(refusals(caplog)))
        assert worker.statistics().reconnects == 0  # said before the liveness ran out
        (said,) = refusals(caplog)
        assert said.levelno == logging.WARNING
        assert said.getMessage() == f"worker for 'echo': the connection to {endpoint} {REFUSED}"
        # Two new sockets later (each refused many times over): nothing more.
        await eventually(lambda: worker.statistics().reconnects >= 2)
        assert len(refusals(caplog)) == 1
        assert silent_warnings(caplog) == []
        await worker.aclose(grace=1)


async def test_a_refusal_is_said_again_after_a_connection(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Refused, then a broker comes and goes (a successful handshake in between): said
    again; a broker that answers clears nothing else."""
    endpoint = closed_port()
    worker = Worker(endpoint, SVC, upper, reconnect_min=0.01, reconnect_max=0.02)
    caplog.set_level(logging.WARNING, logger="dcp.worker")
    async with anyio.create_task_group() as tg:
        tg.start_soon(worker.serve)
        await eventually(lambda: len(refusals(caplog)) == 1)
        broker = FakeBroker(endpoint)  # the broker starts late: the worker connects
        try:
            ident, msg = await broker.expect(Register)
            broker.send(ident, msg)
            await eventually(lambda: registered(worker))
            assert len(refusals(caplog)) == 1
        finally:
            broker.close()  # and goes away: refused again
        await eventually(lambda: len(refusals(caplog)) == 2)
        await worker.aclose(grace=1)


async def test_a_live_broker_says_nothing_of_a_refusal(
    fake: FakeBroker, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="dcp.worker")
    worker = Worker(fake.endpoint, SVC, upper)
    async with anyio.create_task_group() as tg:
        tg.start_soon(worker.serve)
        ident, msg = await fake.expect(Register)
        fake.send(ident, msg)
        await eventually(lambda: registered(worker))
        await worker.aclose(grace=1)
    assert refusals(caplog) == []


async def test_each_broker_refusing_is_said_once(caplog: pytest.LogCaptureFixture) -> None:
    """Several brokers: a warning per endpoint that refuses (a connection each)."""
    endpoints = [closed_port(), closed_port()]
    caplog.set_level(logging.WARNING, logger="dcp.worker")
    worker = Worker(endpoints, SVC, upper, heartbeat_interval=0.1, liveness=3)
    async with anyio.create_task_group() as tg:
        tg.start_soon(worker.serve)
        await eventually(lambda: len(refusals(caplog)) == 2)
        await eventually(lambda: worker.statistics().reconnects >= 4)  # new sockets, each
        said = sorted(r.getMessage() for r in refusals(caplog))
        assert said == sorted(
            f"worker for 'echo': the connection to {e} {REFUSED}" for e in endpoints
        )
        assert silent_warnings(caplog) == []
        await worker.aclose(grace=1)
