"""``dcp call``: one request, its reply on stdout (as lines, or as JSON with ``--json``)."""

from __future__ import annotations

import argparse
import base64
import json
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

import zmq

from .._response import Response
from ._commands import client_security
from ._run import USAGE, CLIError, run_async, until_signal, zmq_problem

if TYPE_CHECKING:
    from .._security import CurveClient

__all__ = ["cmd_call", "reply_json"]

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


def cmd_call(args: argparse.Namespace) -> int:
    from .._client import Client
    from .._errors import DCPError

    metadata = [part.encode() for part in args.metadata]
    if not all(metadata):
        raise CLIError("--metadata parts must not be empty", USAGE)
    security = client_security(args)
    data = _data(args.data)
    replies: list[Response] = []

    async def run() -> None:
        if args.stream:
            await call_stream(args, data, metadata, security)
            return
        async with Client(
            args.connect,
            timeout=args.timeout,
            retries=args.retries,
            security=security,
            type_width=args.type_width,
        ) as client:
            try:
                reply = await client.request(
                    args.service.encode(),
                    *data,
                    metadata=metadata,
                    work_timeout=args.work_timeout,
                    no_wait=args.no_wait,
                )
            except DCPError as exc:
                raise CLIError(f"{type(exc).__name__}: {exc}") from None
            replies.append(reply)

    try:
        received = run_async(args.backend, until_signal, run)
    except zmq.ZMQError as exc:
        raise CLIError(zmq_problem(exc, "connect to", [args.connect])) from None
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
    args: argparse.Namespace,
    data: list[bytes],
    metadata: list[bytes],
    security: CurveClient | None,
) -> None:
    """``--stream``: print each part as it arrives (one line per data part, or one JSON
    object per part with ``--json``)."""
    from .._client import Client
    from .._errors import DCPError

    out = sys.stdout.buffer
    async with Client(
        args.connect,
        timeout=args.timeout,
        security=security,
        type_width=args.type_width,
    ) as client:
        try:
            async with client.stream(
                args.service.encode(), *data, metadata=metadata, work_timeout=args.work_timeout
            ) as parts:
                async for part in parts:
                    if args.json:
                        line = json.dumps({"data": [_part(p) for p in part]}, ensure_ascii=False)
                        out.write(line.encode() + b"\n")
                    else:
                        for frame in part:
                            out.write(frame + b"\n")
                    out.flush()
        except DCPError as exc:
            raise CLIError(f"{type(exc).__name__}: {exc}") from None
