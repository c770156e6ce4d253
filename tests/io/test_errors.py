"""What dcp does with zmq's errors (dcp._io.errors, Rules Z1 to Z4), on real sockets, and
the one place that catches them: an AST check that no module outside ``dcp/_io`` catches a
zmq error itself but the few listed, each with its reason."""

from __future__ import annotations

import ast
import errno
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
import zmq

from dcp._io.errors import (
    FULL,
    GONE,
    endpoint_errors,
    endpoint_problem,
    refusal,
    socket_errors,
)
from dcp._io.sockets import AsyncSocket

PACKAGE = Path(__file__).resolve().parents[2] / "dcp"

#: zmq's exception classes (``zmq.error``), as a module names them.
ZMQ_ERRORS = {
    name
    for name in dir(zmq.error)
    if isinstance(getattr(zmq.error, name), type)
    and issubclass(getattr(zmq.error, name), zmq.error.ZMQBaseError)
}

#: Modules outside dcp/_io that still catch zmq's errors themselves, and why (none).
ALLOWED: dict[str, str] = {}


def _modules() -> Iterator[tuple[str, Path]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        yield ".".join(parts), path


def _names_a_zmq_error(node: ast.expr | None) -> bool:
    """Whether an ``except`` clause's type (or a ``suppress`` argument) names a zmq error:
    ``zmq.Again``, ``zmq.error.ZMQError``, ``ZMQError`` imported by name, or a tuple of
    them."""
    if node is None:
        return False
    if isinstance(node, ast.Tuple):
        return any(_names_a_zmq_error(element) for element in node.elts)
    if isinstance(node, ast.Attribute):
        return node.attr in ZMQ_ERRORS
    if isinstance(node, ast.Name):
        return node.id in ZMQ_ERRORS
    return False


def catches_zmq_errors(source: str) -> list[int]:
    """The lines of ``source`` that catch a zmq error: ``except`` clauses and
    ``suppress(...)`` calls naming one."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ExceptHandler):
            caught = _names_a_zmq_error(node.type)
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            caught = name == "suppress" and any(_names_a_zmq_error(arg) for arg in node.args)
        else:
            continue
        if caught:
            lines.append(node.lineno)
    return sorted(lines)


def test_the_check_finds_every_form() -> None:
    source = """
import contextlib
import zmq
from zmq import Again, ZMQError
from contextlib import suppress
try: pass
except zmq.Again: pass
try: pass
except (OSError, zmq.error.ZMQError): pass
try: pass
except ZMQError as exc: pass
with contextlib.suppress(Again): pass
with suppress(KeyError, zmq.ZMQError): pass
try: pass
except (OSError, KeyError): pass
with contextlib.suppress(OSError): pass
"""
    assert catches_zmq_errors(source) == [7, 9, 11, 12, 13]


def test_only_dcp_io_catches_zmq_errors() -> None:
    """Rule: zmq's errors are caught in ``dcp/_io`` (dcp._io.errors), nowhere else but in
    the modules of :data:`ALLOWED`."""
    found = {
        module: catches_zmq_errors(path.read_text())
        for module, path in _modules()
        if not (module == "dcp._io" or module.startswith("dcp._io."))
    }
    catching = {module: lines for module, lines in found.items() if lines}
    unexpected = {module: lines for module, lines in catching.items() if module not in ALLOWED}
    assert unexpected == {}, "use dcp._io (AsyncSocket.try_send, socket_errors, endpoint_errors)"


# -- Rules Z1 and Z2: what a refused send means -------------------------------------------


class Sockets:
    """Makes sockets in a context of its own, and closes them all at the end."""

    def __init__(self) -> None:
        self.context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.made: list[zmq.Socket[bytes]] = []

    def __call__(self, kind: int) -> zmq.Socket[bytes]:
        sock = self.context.socket(kind)
        self.made.append(sock)
        return sock

    def close(self) -> None:
        for sock in self.made:
            sock.close(0)
        self.context.term()


@pytest.fixture
def socket() -> Iterator[Sockets]:
    sockets = Sockets()
    yield sockets
    sockets.close()


def test_a_sent_message_is_none(socket: Sockets) -> None:
    router = socket(zmq.ROUTER)
    router.setsockopt(zmq.ROUTER_MANDATORY, 1)
    router.bind("inproc://sent")
    dealer = socket(zmq.DEALER)
    dealer.setsockopt(zmq.ROUTING_ID, b"D")
    dealer.connect("inproc://sent")
    dealer.send(b"hello")  # the router learns the dealer's routing id
    assert router.recv_multipart() == [b"D", b"hello"]
    assert AsyncSocket(router).try_send([b"D", b"back"]) is None
    assert dealer.recv_multipart() == [b"back"]


def test_a_peer_that_is_not_there_is_gone(socket: Sockets) -> None:
    router = socket(zmq.ROUTER)
    router.setsockopt(zmq.ROUTER_MANDATORY, 1)
    router.bind("inproc://gone")
    assert AsyncSocket(router).try_send([b"nobody", b"x"]) == GONE == "gone"


def test_a_peer_whose_queue_is_full_is_full(socket: Sockets) -> None:
    router = socket(zmq.ROUTER)
    router.setsockopt(zmq.ROUTER_MANDATORY, 1)
    router.setsockopt(zmq.SNDHWM, 1)
    router.bind("inproc://full")
    dealer = socket(zmq.DEALER)
    dealer.setsockopt(zmq.ROUTING_ID, b"D")
    dealer.setsockopt(zmq.RCVHWM, 1)
    dealer.connect("inproc://full")
    dealer.send(b"hello")
    router.recv_multipart()
    asock = AsyncSocket(router)
    sent = 0
    while (refused := asock.try_send([b"D", b"%d" % sent])) is None:
        sent += 1
        assert sent < 10_000, "the high-water mark never stopped the sends"
    assert refused == FULL == "full"
    assert sent >= 1  # the queue took some before it was full


def test_any_other_error_of_a_send_is_raised(socket: Sockets) -> None:
    """A socket closed under us (Rule Z2's last sentence): anyio's BrokenResourceError, the
    zmq error its cause."""
    router = socket(zmq.ROUTER)
    asock = AsyncSocket(router)
    router.close(0)
    with pytest.raises(anyio.BrokenResourceError) as info:
        asock.try_send([b"D", b"x"])
    assert isinstance(info.value.__cause__, zmq.ZMQError)
    assert info.value.__cause__.errno == errno.ENOTSOCK


def test_refusal_names_what_a_send_error_means() -> None:
    assert refusal(zmq.Again()) == FULL
    assert refusal(zmq.ZMQError(errno.EHOSTUNREACH)) == GONE
    error = zmq.ZMQError(errno.ENOTSOCK)
    with pytest.raises(anyio.BrokenResourceError) as info:
        refusal(error)
    assert info.value.__cause__ is error


# -- Rule Z3: a failed bind or connect in one line -----------------------------------------


def test_endpoint_problem_uses_the_endpoint_zmq_names() -> None:
    error = zmq.ZMQError(zmq.EADDRINUSE, "Address already in use (addr='tcp://h:1')")
    assert endpoint_problem(error, "bind", ["tcp://x:2"]) == (
        "cannot bind tcp://h:1: Address already in use"
    )
    error = zmq.ZMQError(zmq.EINVAL, "Invalid argument")
    assert endpoint_problem(error, "connect to", ["tcp://x:2", "ipc://y"]) == (
        "cannot connect to tcp://x:2, ipc://y: Invalid argument"
    )


class LineError(Exception):
    pass


def test_endpoint_errors_raise_the_callers_error(socket: Sockets) -> None:
    busy = socket(zmq.ROUTER)
    busy.bind("tcp://127.0.0.1:0")
    taken = busy.getsockopt_string(zmq.LAST_ENDPOINT)
    other = socket(zmq.ROUTER)
    line = f"^cannot bind {taken}: Address already in use$"
    with pytest.raises(LineError, match=line) as info, endpoint_errors("bind", [taken], LineError):
        other.bind(taken)
    assert info.value.__cause__ is None and info.value.__suppress_context__
    # Anything but a zmq error goes through untouched.
    with pytest.raises(KeyError), endpoint_errors("bind", [taken], LineError):
        raise KeyError("not zmq's")


# -- Rule Z4: a socket closed under us -----------------------------------------------------


def test_socket_errors_report_or_drop(socket: Sockets) -> None:
    sock = socket(zmq.DEALER)
    sock.close(0)
    reported: list[int | None] = []
    with socket_errors(lambda exc: reported.append(exc.errno)):
        sock.send(b"x")
    assert reported == [errno.ENOTSOCK]
    with socket_errors():
        sock.send(b"x")  # dropped
    with pytest.raises(KeyError), socket_errors(lambda exc: reported.append(0)):
        raise KeyError("not zmq's")
    assert reported == [errno.ENOTSOCK]


def test_socket_errors_report_may_raise_the_callers_error(
    socket: Sockets,
) -> None:
    sock = socket(zmq.DEALER)
    sock.close(0)

    def broken(exc: zmq.ZMQError) -> None:
        raise LineError("closed") from exc

    with pytest.raises(LineError) as info, socket_errors(broken):
        sock.send(b"x")
    assert isinstance(info.value.__cause__, zmq.ZMQError)
