"""A worker's services (:mod:`dcp._worker.services`): handlers and service mappings checked
when a :class:`dcp.Worker` or a :class:`dcp.Service` is made (Rule WV1, issue 25 finding 5),
and a worker serving several services that runs, logs and answers each request under its
own service (issue 25 finding 4), on a real broker and both anyio backends.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import AsyncIterator, Iterator
from typing import Any

import anyio
import pytest

import dcp
from dcp._worker.services import Kind, ServiceTable, handler_kind
from tests.integration.test_end_to_end import fast_broker

EP = "tcp://127.0.0.1:5555"  # never connected: construction makes no socket


async def good_async(request: dcp.HandlerRequest) -> bytes:
    return request.bytes


def good_def(request: dcp.HandlerRequest, suffix: bytes = b"") -> bytes:
    return request.bytes + suffix


async def good_stream(request: dcp.HandlerRequest) -> AsyncIterator[bytes]:
    yield request.bytes


def def_generator(request: dcp.HandlerRequest) -> Iterator[bytes]:
    yield request.bytes


async def no_parameter() -> bytes:
    return b""


def two_parameters(request: dcp.HandlerRequest, other: bytes) -> bytes:
    return other


async def keyword_only(*, request: dcp.HandlerRequest) -> bytes:
    return b""


class CallableObject:
    async def __call__(self, request: dcp.HandlerRequest) -> bytes:
        return request.bytes

    async def method(self, request: dcp.HandlerRequest) -> bytes:
        return request.bytes


class GeneratorObject:
    def __call__(self, request: dcp.HandlerRequest) -> Iterator[bytes]:
        yield b""


GOOD: list[Any] = [
    good_async,
    good_def,
    good_stream,
    functools.partial(good_def, suffix=b"!"),
    CallableObject(),
    CallableObject().method,
    lambda request: b"",
    print,  # a builtin: no signature to read, taken as it is
]

#: A handler that is not one, and what the TypeError says after "service 'x': ".
BAD: list[tuple[Any, str]] = [
    ({"handler": good_async}, "the handler must be a function, not dict; to give a service "
     "options, use dcp.Service(handler, concurrency=...)"),
    (42, "the handler must be a function, not int"),
    (def_generator, "the handler tests.worker.test_services.def_generator is a generator "
     "function (a def with yield): a stream handler is an async def with yield"),
    (GeneratorObject(), "is a generator function (a def with yield)"),
    (functools.partial(def_generator), "is a generator function"),
    (no_parameter, "the handler tests.worker.test_services.no_parameter() cannot be called "
     "with one argument, the request (too many positional arguments)"),
    (two_parameters, "cannot be called with one argument, the request (missing a required "
     "argument: 'other')"),
    (keyword_only, "cannot be called with one argument, the request"),
    (CallableObject, "the handler tests.worker.test_services.CallableObject is a class"),
    (dcp.Service(good_async), "a dcp.Service is not a handler: give it as "
     "services={name: dcp.Service(...)}"),
]  # fmt: skip


@pytest.mark.parametrize("handler", GOOD)
def test_handlers_of_every_kind_are_accepted(handler: Any) -> None:
    dcp.Worker(EP, "x", handler)
    dcp.Worker(EP, services={"x": handler, "y": dcp.Service(handler, concurrency=2)})


@pytest.mark.parametrize(("handler", "problem"), BAD)
def test_a_handler_that_is_not_one_is_refused_at_construction(handler: Any, problem: str) -> None:
    """Finding 5: refused when the worker is made, naming the service, not by each request."""
    with pytest.raises(TypeError) as one:
        dcp.Worker(EP, "x", handler)
    assert str(one.value).startswith("service 'x': ")
    assert problem in str(one.value)
    if not isinstance(handler, dcp.Service):  # in services={...}, it is the way
        with pytest.raises(TypeError) as several:
            dcp.Worker(EP, services={"fine": good_async, "x": handler})
        assert str(several.value) == str(one.value)
        with pytest.raises(TypeError, match=r"^dcp\.Service: ") as spec:
            dcp.Service(handler)
        assert problem in str(spec.value)


def test_a_coroutine_instead_of_its_function_is_refused() -> None:
    coroutine = good_async(dcp.HandlerRequest("x"))
    with pytest.raises(TypeError, match=r"^service 'x': got a coroutine, not a function"):
        dcp.Worker(EP, "x", coroutine)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("services", "error", "message"),
    [
        ([("x", good_async)], TypeError, "services= must map service names to handlers, not list"),
        ({3: good_async}, TypeError, "a service name must be str, not int (3)"),
        ({"": good_async}, ValueError, "a service name must not be empty"),
        ({"x": good_async, b"x": good_def}, ValueError, "service 'x' given twice"),
        ({}, ValueError, "services={} names no service"),
    ],
)
def test_service_mappings_are_checked(services: Any, error: type[Exception], message: str) -> None:
    with pytest.raises(error) as info:
        dcp.Worker(EP, services=services)
    assert str(info.value) == message


def test_handler_kinds() -> None:
    assert handler_kind(good_async) is Kind.ASYNC
    assert handler_kind(CallableObject()) is Kind.ASYNC
    assert handler_kind(good_stream) is Kind.STREAM
    assert handler_kind(functools.partial(good_stream)) is Kind.STREAM
    assert handler_kind(good_def) is Kind.THREAD
    assert handler_kind(print) is Kind.THREAD


def test_service_names_are_str() -> None:
    worker = dcp.Worker(EP, services={"a": good_async, b"b\xff": good_def})
    assert worker.services == ("a", "b\udcff")
    assert worker.service == "a"
    assert dcp.Worker(EP, b"bytes", good_async).service == "bytes"


# -- several services on a real broker ------------------------------------------------------


@pytest.mark.anyio
async def test_several_services_log_and_answer_under_the_requests_own_service(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Finding 4: a failure is logged (and answered) under the service of the request that
    failed, not the worker's first service."""

    async def ok(request: dcp.HandlerRequest) -> bytes:
        return b"ok"

    async def boom(request: dcp.HandlerRequest) -> bytes:
        raise ValueError("no such thing")

    async def wrong(request: dcp.HandlerRequest) -> bytes:
        return 42  # type: ignore[return-value]

    def wrong_in_a_thread(request: dcp.HandlerRequest) -> bytes:
        return None  # type: ignore[return-value]

    async def countdown(request: dcp.HandlerRequest) -> AsyncIterator[object]:
        yield "2"
        yield 1

    services: ServiceTable = {
        "ok": ok,
        "boom": boom,
        "wrong": wrong,
        "thread": wrong_in_a_thread,
        "count": countdown,
    }
    async with fast_broker() as broker:
        ep = broker.endpoints[0]
        with caplog.at_level(logging.INFO, logger="dcp.worker"):
            async with dcp.Worker(ep, services=services), dcp.Client(ep, timeout=10) as client:
                with pytest.raises(dcp.RemoteError) as raised:
                    await client.request("boom", "x")
                assert (raised.value.code, raised.value.message) == (
                    "handler_error",
                    "ValueError: no such thing",
                )
                for service, what in [("wrong", "int"), ("thread", "NoneType")]:
                    with pytest.raises(dcp.RemoteError) as bad:
                        await client.request(service, "x")
                    assert (bad.value.code, bad.value.message) == (
                        "bad_handler_result",
                        f"the handler of service {service!r} returned {what}; expected bytes, "
                        "str, a sequence of them or dcp.Forward",
                    )
                async with client.stream("count") as stream:
                    assert await stream.__anext__() == (b"2",)
                    with pytest.raises(dcp.RemoteError, match="service 'count' yielded int"):
                        await stream.__anext__()
                assert (await client.request("ok")).data == (b"ok",)
    lines = [r.getMessage() for r in caplog.records if r.name == "dcp.worker"]
    assert "handler for service 'boom' raised" in lines
    assert any(line.startswith("the handler of service 'wrong' returned int") for line in lines)
    assert any(line.startswith("the handler of service 'thread' returned") for line in lines)
    assert any(line.startswith("the stream handler of service 'count'") for line in lines)
    assert not any("'ok'" in line and "raised" in line for line in lines)
    assert not any("b'" in line for line in lines), lines


@pytest.mark.anyio
async def test_each_service_keeps_its_concurrency_whatever_its_kind() -> None:
    """With several services each one's handlers are bounded by its own ``concurrency``:
    ``async def``, stream and plain ``def`` alike (the worker's credit is the sum, so it
    holds all nine requests at once)."""
    running = {"a": 0, "s": 0, "t": 0}
    most = dict(running)
    release = anyio.Event()

    def enter(name: str) -> None:
        running[name] += 1
        most[name] = max(most[name], running[name])

    async def a(request: dcp.HandlerRequest) -> bytes:
        enter("a")
        await release.wait()
        running["a"] -= 1
        return b"a"

    async def s(request: dcp.HandlerRequest) -> AsyncIterator[bytes]:
        enter("s")
        await release.wait()
        running["s"] -= 1
        yield b"s"

    def t(request: dcp.HandlerRequest) -> bytes:
        enter("t")
        anyio.from_thread.run(release.wait)
        running["t"] -= 1
        return b"t"

    services: ServiceTable = {
        "a": a,
        "s": s,
        "t": t,
        "idle": dcp.Service(good_async, concurrency=6),
    }
    async with fast_broker() as broker:
        ep = broker.endpoints[0]
        worker = dcp.Worker(ep, services=services)
        async with worker, dcp.Client(ep, timeout=20) as client:
            results: list[bytes] = []

            async def call(name: str) -> None:
                results.append((await client.request(name)).bytes)

            async with anyio.create_task_group() as tg:
                for name in "aaasssttt":
                    tg.start_soon(call, name)
                with anyio.fail_after(10):
                    while worker.statistics().received < 9 or running != {"a": 1, "s": 1, "t": 1}:  # noqa: ASYNC110
                        await anyio.sleep(0.01)
                release.set()
    assert sorted(results) == [b"a"] * 3 + [b"s"] * 3 + [b"t"] * 3
    assert most == {"a": 1, "s": 1, "t": 1}


@pytest.mark.anyio
async def test_the_worker_says_at_info_when_it_serves_and_what_it_finishes_when_stopped(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Finding 8: the library logs on ``dcp.worker`` at INFO the line ``dcp worker`` prints:
    the services and the broker once the registration is echoed, and on a graceful stop how
    many requests it is finishing and for how long."""
    started, release = anyio.Event(), anyio.Event()

    async def slow(request: dcp.HandlerRequest) -> bytes:
        started.set()
        await release.wait()
        return b"done"

    async with fast_broker() as broker:
        ep = broker.endpoints[0]
        worker = dcp.Worker(ep, services={"slow": slow, "fast": dcp.Service(good_async, 2)})
        with caplog.at_level(logging.INFO, logger="dcp.worker"):
            async with anyio.create_task_group() as tg:
                await tg.start(worker.serve)
                serving = [r.getMessage() for r in caplog.records if r.name == "dcp.worker"]
                assert serving == [f"worker serving 'slow', 'fast' at {ep} (concurrency 3)"]
                async with (
                    dcp.Client(ep, timeout=20) as client,
                    anyio.create_task_group() as calls,
                ):
                    replies: list[bytes] = []

                    async def call() -> None:
                        replies.append((await client.request("slow")).bytes)

                    calls.start_soon(call)
                    with anyio.fail_after(10):
                        await started.wait()
                    worker.stop(grace=30)
                    release.set()
    lines = [r.getMessage() for r in caplog.records if r.name == "dcp.worker"]
    assert (
        "worker for 'slow', 'fast' stopping: finishing 1 request(s) in progress, for at most 30 s"
        in lines
    )
    assert replies == [b"done"]
