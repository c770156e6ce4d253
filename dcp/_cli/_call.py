"""``dcp call``: one request, its reply on stdout (as lines, or as JSON with ``--json``).

Rules:

Rule CL1 - By default a call fails at once when no worker serves its service, as NATS's ``nats
   req`` answers "no responders": the library's default (:mod:`dcp._client.options` Rule
   CO4: the call carries the no-wait option, the broker answers ``no_workers`` at once).
   ``--wait`` (``wait_for_worker=True``) queues the call until a worker comes or
   ``--timeout`` passes. Either way, "no worker serves it" is one line and exit status
   :data:`NO_WORKERS`.
Rule CL2 - ``-v`` (INFO on ``dcp.cli``): the broker it talks to, what it sent (service, parts,
   bytes), each resend as it happens, and the reply (parts, bytes, time). ``-vv`` adds the
   client's DEBUG lines (each message from the broker).
Rule CL3 - A call that timed out (not "no worker") says whether the broker answered: the
   library's :exc:`~dcp.RequestTimeout` says so (:mod:`dcp._core.client.tracker` Rule RT7:
   "nothing heard from ...: is a dcp broker running there?", or "the broker answers, and a
   worker serves ...").
   A broker that refuses the connection fails it within half a second (``dcp._cli._run``
   Rule CR5: :exc:`~dcp.BrokerUnreachable`, exit status :data:`TIMED_OUT`) unless
   ``--wait-for-broker`` or ``--wait`` is given.
Rule CL4 - Exit statuses: 0 a reply; :data:`NO_WORKERS` (4) no worker serves the service;
   :data:`ERROR_REPLY` (5) an error reply (the worker's handler failed, or the broker refused
   the request: its code says which); :data:`TIMED_OUT` (6) no reply in time; 1 any other
   failure (e.g. the broker refused this client's key); 2 a usage error; 130 SIGINT.
Rule CL5 - ``--json``: a failure after the arguments are parsed is also one JSON object on
   stdout, ``{"error": {"type": ..., "code": ..., "message": ...}}`` (``type``: the exception's
   class, e.g. ``RemoteError``; ``code``: the error reply's code, or ``no_workers``,
   ``timeout``, ``usage``, ``error``), after any stream parts already printed; the line on
   stderr and the exit status are the same as without ``--json``.
"""

from __future__ import annotations

import argparse
import base64
import json
import logging
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

import anyio

from dcp._cli._run import USAGE, CLIError, beacon_errors, run_async, until_signal
from dcp._cli._security import client_security
from dcp._io.errors import endpoint_errors

if TYPE_CHECKING:
    from dcp._client.client import Client
    from dcp._errors import DCPError, NoWorkers
    from dcp._models import Response

__all__ = ["ERROR_REPLY", "NO_WORKERS", "TIMED_OUT", "CallFailed", "cmd_call", "reply_json"]

logger = logging.getLogger("dcp.cli")

#: Exit status of a call that no worker serves (Rule CL1).
NO_WORKERS = 4
#: Exit status of a call answered with an error reply (Rule CL4).
ERROR_REPLY = 5
#: Exit status of a call that got no reply in time (Rule CL4).
TIMED_OUT = 6


class CallFailed(CLIError):
    """A call that failed: its one line and exit status (Rule CL4), and what ``--json``
    prints (Rule CL5).

    :param kind: the exception's class name (``RemoteError``, ``NoWorkers``, ...)
    :param error: the error's code (``handler_error``, ``no_workers``, ``timeout``, ...)
    :param detail: the message, without the class name
    """

    def __init__(self, message: str, code: int, *, kind: str, error: str, detail: str) -> None:
        super().__init__(message, code)
        self.kind = kind
        self.error = error
        self.detail = detail


def error_json(exc: CLIError) -> str:
    """Rule CL5: ``exc`` as ``--json`` prints it."""
    if isinstance(exc, CallFailed):
        error = {"type": exc.kind, "code": exc.error, "message": exc.detail}
    else:
        code = "usage" if exc.code == USAGE else "error"
        error = {"type": "UsageError" if code == "usage" else "Error", "code": code}
        error["message"] = exc.message
    return json.dumps({"error": error}, ensure_ascii=False)


#: The DATA argument that stands for stdin.
STDIN = "-"


def _data(parts: Sequence[str]) -> list[bytes]:
    """The data parts: each argument in UTF-8, except ``-``: stdin's bytes as they are."""
    if list(parts).count(STDIN) > 1:
        raise CLIError("'-' (stdin) may be given as DATA only once", USAGE)
    return [sys.stdin.buffer.read() if part == STDIN else part.encode() for part in parts]


def _part(part: bytes) -> str | dict[str, str]:
    try:
        return part.decode()
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(part).decode("ascii")}


def reply_json(reply: Response) -> str:
    """``--json``: ``{"data": [...], "metadata": [...]}``, each part a string if it is UTF-8,
    else ``{"base64": "..."}``."""
    return json.dumps(
        {"data": [_part(p) for p in reply.data], "metadata": [_part(p) for p in reply.metadata]},
        ensure_ascii=False,
    )


def _size(parts: Sequence[bytes]) -> str:
    return f"{len(parts)} part(s), {sum(len(p) for p in parts):,} bytes"


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms" if seconds < 1 else f"{seconds:.2f} s"


def _no_workers(exc: NoWorkers, service: str, waited: bool) -> CallFailed:
    """Rule CL1: one line, exit status :data:`NO_WORKERS`."""
    if waited:
        message = str(exc)  # "no worker serves 'x' (the broker says so...)"
    else:
        message = (
            f"no worker serves {service!r} (start one with 'dcp worker', or use --wait to "
            "queue the call until one registers)"
        )
    return CallFailed(message, NO_WORKERS, kind="NoWorkers", error="no_workers", detail=message)


def _failed(exc: DCPError) -> CallFailed:
    """Rule CL4: a call's error (not "no worker"), its exit status and ``--json`` form."""
    from dcp._errors import RemoteError, RequestTimeout

    kind = type(exc).__name__
    line = f"{kind}: {exc}"
    if kind == "BrokerUnreachable":
        line += " (--wait-for-broker waits for one)"
    if isinstance(exc, RemoteError):
        return CallFailed(line, ERROR_REPLY, kind=kind, error=exc.code, detail=exc.message)
    if isinstance(exc, RequestTimeout):
        return CallFailed(line, TIMED_OUT, kind=kind, error="timeout", detail=str(exc))
    error = "".join(f"_{c.lower()}" if c.isupper() else c for c in kind).lstrip("_")
    return CallFailed(line, 1, kind=kind, error=error, detail=str(exc))


def _connected(client: Client, args: argparse.Namespace) -> None:
    """Rule CL2: where the call goes, and its limits."""
    given = ", ".join(args.connect)
    where = ", ".join(client.endpoints)
    heard = "" if where == given else f" (heard from {given})"
    if args.stream:
        limits = f"timeout {args.timeout:g} s, no resends"
    else:
        attempt = args.timeout / (args.retries + 1)
        limits = f"timeout {args.timeout:g} s, {args.retries} resend(s) after {attempt:.3g} s"
    brokers = "brokers" if len(client.endpoints) > 1 else "broker"
    logger.info("%s %s%s; %s", brokers, where, heard, limits)


async def _watch_resends(client: Client, attempts: int) -> None:
    """Rule CL2: log each resend as the client makes it (its statistics count them)."""
    seen = 0
    while True:
        await anyio.sleep(0.05)
        retries = client.statistics().retries
        if retries > seen:
            seen = retries
            logger.info("no reply yet: resent the request (attempt %d of %d)", seen + 1, attempts)


async def _request(
    client: Client, args: argparse.Namespace, data: list[bytes], metadata: list[bytes]
) -> Response:
    """The call itself, its resends logged as they happen (Rule CL2). Its error is raised
    as it is, not in an exception group."""
    from dcp._errors import DCPError

    outcome: Response | DCPError | None = None
    async with anyio.create_task_group() as tg:
        tg.start_soon(_watch_resends, client, args.retries + 1)
        try:
            outcome = await client.request(
                args.service.encode(),
                *data,
                metadata=metadata,
                work_timeout=args.work_timeout,
                wait_for_worker=args.wait,
            )
        except DCPError as exc:
            outcome = exc
        finally:
            tg.cancel_scope.cancel()
    if isinstance(outcome, DCPError):
        raise outcome
    assert outcome is not None
    return outcome


def cmd_call(args: argparse.Namespace) -> int:
    """``dcp call``; with ``--json``, a failure is also one JSON object on stdout (Rule CL5)."""
    try:
        return _call(args)
    except CLIError as exc:
        if args.json:
            print(error_json(exc), flush=True)
        raise


def _call(args: argparse.Namespace) -> int:
    from dcp._client.client import Client
    from dcp._errors import DCPError, NoWorkers

    metadata = [part.encode() for part in args.metadata]
    if not all(metadata):
        raise CLIError("--metadata parts must not be empty", USAGE)
    security = client_security(args)
    data = _data(args.data)
    replies: list[Response] = []

    async def run() -> None:
        async with Client(
            args.connect,
            timeout=args.timeout,
            retries=args.retries,
            security=security,
            type_width=args.type_width,
            wait_for_broker=args.wait or args.wait_for_broker,  # dcp._cli._run Rule CR5
        ) as client:
            _connected(client, args)
            logger.info(
                "request to %r: data %s, metadata %s%s",
                args.service,
                _size(data),
                _size(metadata),
                "; waits for a worker (--wait)" if args.wait else "",
            )
            began = anyio.current_time()
            try:
                if args.stream:
                    await call_stream(client, args, data, metadata)
                    return
                reply = await _request(client, args, data, metadata)
            except NoWorkers as exc:
                took = _ms(anyio.current_time() - began)
                logger.info("the broker says no worker serves %r (after %s)", args.service, took)
                raise _no_workers(exc, args.service, args.wait) from None
            except DCPError as exc:
                took = _ms(anyio.current_time() - began)
                logger.info("no reply: %s (after %s)", type(exc).__name__, took)
                raise _failed(exc) from None
            logger.info(
                "reply after %s: data %s, metadata %s",
                _ms(anyio.current_time() - began),
                _size(reply.data),
                _size(reply.metadata),
            )
            replies.append(reply)

    try:
        with (
            endpoint_errors("connect to", args.connect, CLIError),  # dcp._io.errors Z3
            beacon_errors(args.connect),
        ):
            received = run_async(args.backend, until_signal, run)
    except (TypeError, ValueError) as exc:  # the client's own checks of the request
        raise CLIError(str(exc), USAGE) from None
    if received is not None:
        return 128 + received
    if args.stream:
        return 0
    (reply,) = replies
    if args.json:
        print(reply_json(reply), flush=True)
    else:
        out = sys.stdout.buffer
        for part in reply.data:
            out.write(part + b"\n")
        out.flush()
    return 0


async def call_stream(
    client: Client, args: argparse.Namespace, data: list[bytes], metadata: list[bytes]
) -> None:
    """``--stream``: print each part as it arrives (one line per data part, or one JSON
    object per part with ``--json``). Without ``--wait`` it fails at once when no worker
    serves the service (Rule CL1).

    :raises dcp.NoWorkers: the broker says nobody serves the service (without ``--wait``)
    """
    service = args.service.encode()
    out = sys.stdout.buffer
    parts = 0
    async with client.stream(
        service,
        *data,
        metadata=metadata,
        work_timeout=args.work_timeout,
        wait_for_worker=args.wait,
    ) as stream:
        async for part in stream:
            parts += 1
            logger.info("part %d: %s", parts, _size(part))
            if args.json:
                line = json.dumps({"data": [_part(p) for p in part]}, ensure_ascii=False)
                out.write(line.encode() + b"\n")
            else:
                for frame in part:
                    out.write(frame + b"\n")
            out.flush()
