"""The ``dcp`` argument parser: one-line usage errors, defaults in every help text, checked
numbers and endpoints, and the global options accepted before or after the command."""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NoReturn

from dcp._cli._docs import DOCS_URL, doc_url
from dcp._cli._http import add_broker_http
from dcp._cli._run import USAGE, add_wait_for_broker
from dcp._cli._services import add_broker_beacon, add_commands
from dcp._io.beacon import BEACON_SCHEME, beacon_port
from dcp._io.endpoints import check_endpoint
from dcp._version import DISTRIBUTION, __version__

__all__ = ["DISTRIBUTION", "build_parser"]

_EPILOG = f"""\
global options (--backend, -v) may also follow the command: dcp broker -v ...

exit status: 0 done; 1 error (one line on stderr: a port in use, a missing key
file, ...); 2 usage error (also a handler dcp worker cannot use); 3 the broker
refused a worker's registration; 4 no worker serves the service of a dcp call;
5 dcp call got an error reply; 6 dcp call got no reply in time (or no broker
listens: --wait-for-broker waits for one); 130 stopped by SIGINT (Ctrl-C). A
broker or worker stopped by SIGTERM exits with 0 once it has stopped.

documentation: {DOCS_URL}
the dcp command's page: {doc_url("cli")}"""


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line: ``dcp call: <problem> (see ...)``."""

    #: The subcommands' parsers by name (set on the ``dcp`` parser by :func:`build_parser`).
    commands: Mapping[str, argparse.ArgumentParser]

    def error(self, message: str) -> NoReturn:
        self.exit(USAGE, f"{self.prog}: {message} (see '{self.prog} --help')\n")


class _Intermixed(_Parser):
    """A parser whose options may follow its positional arguments, as in ``dcp call
    --connect E echo hi --json`` (argparse stops at the first positional otherwise)."""

    _inner = False
    _REQUIRED = "the following arguments are required: "

    def error(self, message: str) -> NoReturn:
        # Intermixed parsing names every positional as missing, DATA (nargs "*") too.
        if message.startswith(self._REQUIRED):
            optional = {
                action.metavar or action.dest
                for action in self._actions
                if not action.option_strings and action.nargs in ("*", "?")
            }
            names = message.removeprefix(self._REQUIRED).split(", ")
            message = self._REQUIRED + ", ".join(n for n in names if n not in optional)
        super().error(message)

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        if self._inner:  # parse_known_intermixed_args calls back in (Python < 3.12)
            return super().parse_known_args(args, namespace)
        self._inner = True
        try:
            return self.parse_known_intermixed_args(args, namespace)
        finally:
            self._inner = False


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the description's line breaks and appends each option's default."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        shown = not (
            "%(default)" in text
            or "(default:" in text  # the help says its default in its own words
            or action.nargs == 0  # flags: store_true, count, help, version
            or not action.option_strings
            or default is None
            or default is argparse.SUPPRESS
            or default == []
        )
        return f"{text} (default: %(default)s)" if shown else text


# -- checked values -------------------------------------------------------------------------


def _integer(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, not {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, not {value}")
        return value

    parse.__name__ = "int"
    return parse


def _seconds(*, zero: bool = False) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected seconds, not {text!r}") from None
        if not math.isfinite(value) or value < 0 or (value == 0 and not zero):
            bound = ">= 0" if zero else "> 0"
            raise argparse.ArgumentTypeError(f"must be a finite number {bound}, not {text!r}")
        return value

    parse.__name__ = "float"
    return parse


_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def memory_size(text: str) -> int | None:
    """``--max-memory``: bytes (``512M``, ``1G``, ``1.5g``, ``64KiB``, plain bytes; units
    are powers of 1024), or ``None`` for ``0`` / ``none`` (no budget)."""
    spoken = text.strip().lower()
    if spoken in ("0", "none"):
        return None
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*(?:([kmgt])i?)?b?", spoken)
    value = 0 if match is None else int(float(match[1]) * _UNITS[match[2] or ""])
    if value <= 0:
        raise argparse.ArgumentTypeError(
            f"expected bytes such as 512M, 1G or 1048576 (0 or none: no budget), not {text!r}"
        )
    return value


memory_size.__name__ = "size"


def _endpoints(*, bind: bool) -> Callable[[str], list[str]]:
    """The endpoints of a comma-separated value, each checked as :func:`_endpoint` does."""
    one = _endpoint(bind=bind)

    def parse(text: str) -> list[str]:
        return [one(part.strip()) for part in text.split(",")]

    return parse


def _endpoint(*, bind: bool) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if not bind and text.startswith(BEACON_SCHEME):  # docs/services.md
            try:
                beacon_port(text)
            except ValueError as exc:
                raise argparse.ArgumentTypeError(str(exc)) from None
            return text
        try:
            check_endpoint(text, bind=bind)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        if text.startswith("inproc://"):
            raise argparse.ArgumentTypeError(
                f"bad endpoint {text!r}: inproc:// reaches only the same process; "
                "use tcp:// or ipc://"
            )
        return text

    parse.__name__ = "endpoint"
    return parse


_POSITIVE = _integer(1)
_NATURAL = _integer(0)
_SECONDS = _seconds()


# -- the parser -----------------------------------------------------------------------------


def _add_client_security(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group(f"CURVE security ({doc_url('security')})")
    g.add_argument("--keys", metavar="FILE", help="this peer's NAME.key_secret file")
    g.add_argument("--server-key", metavar="FILE", help="the broker's public NAME.key file")


def _add_type_width(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument(
        "--type-width",
        type=int,
        choices=[1, 4],
        default=1,
        help=f"type-frame width of {what}: 1 byte (the DCP spec) or 4 (a little-endian int, "
        "for the DagBox C++ reference broker, which aborts on 1-byte types)",
    )


def _add_heartbeats(p: argparse.ArgumentParser, who: str) -> None:
    p.add_argument(
        "--heartbeat-interval",
        type=_SECONDS,
        default=1.0,
        metavar="SECONDS",
        help=f"seconds between heartbeats (the same on the broker and {who})",
    )
    p.add_argument(
        "--liveness",
        type=_POSITIVE,
        default=3,
        metavar="N",
        help="heartbeats missed before the peer is considered gone",
    )


def _common() -> _Intermixed:
    """The global options again, for after the command (dest ``sub_*``, merged in main)."""
    common = _Intermixed(add_help=False)
    common.add_argument(
        "--backend",
        dest="sub_backend",
        choices=["trio", "asyncio"],
        help="async backend to run on (default: trio)",
    )
    common.add_argument(
        "-v",
        "--verbose",
        dest="sub_verbose",
        action="count",
        default=0,
        help="log more: -v INFO, -vv DEBUG (default: WARNING)",
    )
    return common


def build_parser() -> _Parser:
    """The ``dcp`` parser; each subcommand sets ``func`` to its ``cmd_*`` function."""
    from dcp._cli._call import cmd_call
    from dcp._cli._commands import cmd_broker, cmd_demo, cmd_keys
    from dcp._cli._pubsub import add_pubsub_commands
    from dcp._cli._top import add_top_command
    from dcp._cli._worker import cmd_worker

    parser = _Parser(
        prog="dcp",
        description="DagBox Communication Protocol v1 broker, worker and client.",
        epilog=_EPILOG,
        formatter_class=_Formatter,
    )
    parser.add_argument(
        "--version", action="version", version=f"%(prog)s ({DISTRIBUTION}) {__version__}"
    )
    parser.add_argument(
        "--backend", choices=["trio", "asyncio"], default="trio", help="async backend to run on"
    )
    parser.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=0,
        help="log more: -v INFO, -vv DEBUG (default: WARNING)",
    )
    sub = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", parser_class=_Intermixed
    )
    parser.commands = sub.choices
    common = _common()

    def command(name: str, **kwargs: Any) -> argparse.ArgumentParser:
        return sub.add_parser(name, parents=[common], formatter_class=_Formatter, **kwargs)

    p = command("broker", help="run a broker until SIGINT or SIGTERM")
    p.add_argument(
        "--bind",
        action="append",
        required=True,
        type=_endpoint(bind=True),
        metavar="ENDPOINT",
        help="zmq endpoint to bind, e.g. tcp://127.0.0.1:5555, tcp://*:5555 (every "
        "interface), tcp://127.0.0.1:0 (a free port) or ipc:///tmp/dcp.sock (repeatable); "
        "the bound endpoints are printed, one per line",
    )
    _add_heartbeats(p, "its workers")
    p.add_argument(
        "--log-summary",
        type=_SECONDS,
        metavar="SECONDS",
        help="log a one-line summary (requests/s, errors, queue depth, workers idle/busy, "
        "clients) at INFO every SECONDS; implies -v (default: none)",
    )
    p.add_argument(
        "--allow-foreign-address",
        action="store_true",
        help="let non-workers send requests carrying another client's address",
    )
    _add_limits(p)
    _add_server_security(p)
    add_broker_beacon(p)
    add_broker_http(p)
    p.set_defaults(func=cmd_broker)

    p = command(
        "worker",
        help="serve a service with a handler function",
        description="Serve one or more services with handler functions until SIGINT or\n"
        "SIGTERM. It says on stderr when it serves (the services, the broker) and, on\n"
        "the first signal, how many requests it is finishing; a second signal stops it\n"
        "at once. --ready-file PATH is written once the broker has confirmed the\n"
        "registration (for a supervisor or a script to wait on) and removed at exit.\n"
        "A handler that cannot be loaded or is not one (a plain def generator, no\n"
        "parameter, ...) is exit status 2.",
    )
    p.add_argument(
        "--connect",
        required=True,
        action="extend",
        type=_endpoints(bind=False),
        metavar="ENDPOINT",
        help="broker endpoint, e.g. tcp://127.0.0.1:5555; give it several times (or a "
        "comma-separated list) to serve several brokers",
    )
    p.add_argument(
        "--service",
        required=True,
        action="append",
        nargs="+",
        metavar=("NAME", "MODULE:FUNC"),
        help="service to register, served by the handler argument; or, repeatable, "
        "--service NAME MODULE:FUNC for several services on one socket",
    )
    p.add_argument(
        "handler",
        nargs="?",
        metavar="module:function",
        help="a handler: async def handler(request), or a plain def (run in a thread)",
    )
    p.add_argument(
        "--concurrency",
        type=_POSITIVE,
        default=1,
        metavar="N",
        help="requests handled at once (per service, with several)",
    )
    p.add_argument(
        "--prefetch",
        type=_NATURAL,
        default=0,
        metavar="N",
        help="requests asked for beyond --concurrency while every slot is busy (per broker): "
        "they wait in this worker and start as slots free, which saves a wake-up per request "
        "when handlers are short; but a request may wait here behind a slow one while "
        "another worker is idle (0: none)",
    )
    _add_heartbeats(p, "the worker")
    p.add_argument(
        "--grace",
        type=_seconds(zero=True),
        default=10.0,
        metavar="SECONDS",
        help="on SIGINT/SIGTERM, time running requests get to finish (a second signal: now)",
    )
    p.add_argument(
        "--ready-file",
        metavar="PATH",
        help="write PATH (JSON: pid, endpoint, services) once the broker has confirmed the "
        "registration; removed at exit (a stale one is removed at start)",
    )
    _add_type_width(p, "every message the worker sends")
    _add_client_security(p)
    p.set_defaults(func=cmd_worker)

    p = command(
        "call",
        help="send one request and print the reply's data parts",
        description="Send one request and print the reply's data parts, one per line (or,\n"
        "with --json, the whole reply as one JSON object). A failure is one line on\n"
        'stderr (with --json, also {"error": {"type": ..., "code": ..., "message": ...}}\n'
        "on stdout) and its exit status:\n"
        "  4  no worker serves the service (at once; --wait queues the call instead)\n"
        "  5  an error reply: the worker's handler failed, or the broker refused the call\n"
        "  6  no reply in time (--timeout), or no broker listens (within 0.5 s, unless\n"
        "     --wait-for-broker or --wait)\n"
        "  1  any other error; 2 a usage error; 130 Ctrl-C\n"
        "Options may also follow SERVICE and DATA.",
    )
    p.add_argument(
        "--connect",
        required=True,
        action="extend",
        type=_endpoints(bind=False),
        metavar="ENDPOINT",
        help="broker endpoint, e.g. tcp://127.0.0.1:5555; give it several times (or a "
        "comma-separated list) to spread over several brokers",
    )
    p.add_argument(
        "--timeout",
        type=_SECONDS,
        default=5.0,
        metavar="SECONDS",
        help="seconds the whole call may take, every attempt included",
    )
    p.add_argument(
        "--retries",
        type=_NATURAL,
        default=2,
        metavar="N",
        help="resends (same request id) after an attempt times out",
    )
    p.add_argument(
        "--work-timeout",
        type=_SECONDS,
        metavar="SECONDS",
        help="seconds one worker may hold the request before the broker gives it to another "
        "(default: the broker's --work-timeout, if any)",
    )
    waiting = p.add_mutually_exclusive_group()
    waiting.add_argument(
        "--wait",
        action="store_true",
        help="when no worker serves the service, queue the call until one registers or "
        "--timeout passes (default: fail at once, exit status 4); waits for the broker too "
        "(--wait-for-broker)",
    )
    waiting.add_argument(
        "--no-wait", action="store_true", help="fail at once (the default; kept for scripts)"
    )
    add_wait_for_broker(p)
    p.add_argument(
        "--metadata",
        action="append",
        default=[],
        metavar="PART",
        help="a metadata part (UTF-8, not empty) the worker returns in its reply (repeatable)",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help='print the reply as one JSON object, {"data": [...], "metadata": [...]}: each '
        'part a string (UTF-8), or {"base64": "..."} if it is not UTF-8; a failure as '
        '{"error": {"type": ..., "code": ..., "message": ...}}',
    )
    p.add_argument(
        "--stream",
        action="store_true",
        help=f"ask for a stream ({doc_url('streams')}) and print each part as it arrives: its "
        "data parts one per line (with --json, one JSON object per part); --timeout bounds the "
        "whole stream, and the request is not resent",
    )
    p.add_argument("service", metavar="SERVICE", help="the service to call, e.g. shout")
    p.add_argument(
        "data",
        nargs="*",
        metavar="DATA",
        help="data parts (UTF-8); '-': one part read from stdin, bytes as they are",
    )
    _add_type_width(p, "the request")
    _add_client_security(p)
    p.set_defaults(func=cmd_call)

    p = command("demo", help="embedded broker, a DAG of workers, clients under load")
    p.add_argument(
        "--requests", type=_POSITIVE, default=4000, metavar="N", help="requests sent in all"
    )
    p.add_argument("--clients", type=_POSITIVE, default=4, metavar="N", help="concurrent clients")
    p.add_argument(
        "--window", type=_POSITIVE, default=32, metavar="N", help="requests in flight per client"
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    _add_type_width(p, "what the clients and workers send")
    p.set_defaults(func=cmd_demo)

    p = command(
        "keys", help="generate a CURVE key pair: NAME.key (public), NAME.key_secret (0600)"
    )
    p.add_argument(
        "name",
        metavar="NAME",
        help="the pair's name: NAME.key_secret is its owner's --keys (a broker's, a "
        "worker's or a client's), NAME.key is what the others are given (--server-key, "
        "--allow-client, --allow-worker)",
    )
    p.add_argument("--dir", default=".", metavar="DIR", help="where to write")
    p.add_argument("--force", action="store_true", help="overwrite existing files")
    p.set_defaults(func=cmd_keys)
    add_pubsub_commands(command, _endpoints(bind=False), _SECONDS, _POSITIVE, _add_client_security)
    add_commands(command, _endpoints(bind=False), _SECONDS, _add_client_security)
    add_top_command(command, _endpoint(bind=False), _SECONDS, _POSITIVE, _add_client_security)
    return parser


def _add_limits(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group(f"limits (see {doc_url('reliability')})")
    g.add_argument(
        "--work-timeout",
        type=_SECONDS,
        metavar="SECONDS",
        help="time a worker may hold a request that carries no work timeout of its own "
        "before it is treated as lost (default: no limit)",
    )
    g.add_argument(
        "--busy-timeout",
        type=_SECONDS,
        default=60.0,
        metavar="SECONDS",
        help="silence allowed from a busy worker that never beats while it works (MDP, "
        "DagBox C++); it is probed meanwhile",
    )
    g.add_argument(
        "--mdp-work-timeout",
        type=_seconds(zero=True),
        default=60.0,
        metavar="SECONDS",
        help="time a Majordomo worker (MDP has no error reply) may hold a request that has no "
        "other work timeout before it is treated as lost (0: no limit)",
    )
    g.add_argument(
        "--mdp-timeout",
        type=_SECONDS,
        default=10.0,
        metavar="SECONDS",
        help="silence allowed from an idle Majordomo worker",
    )
    g.add_argument(
        "--max-queue-wait",
        type=_seconds(zero=True),
        default=300.0,
        metavar="SECONDS",
        help="time a request that carries no expiry of its caller's may wait in a queue "
        "before its client gets a queue_timeout error (0: for ever)",
    )
    limits: list[tuple[str, Callable[[str], int], int, str, str]] = [
        (
            "--max-redeliveries",
            _NATURAL,
            5,
            "N",
            "times a request is put back in its queue before a redelivery_limit error",
        ),
        ("--max-queue", _NATURAL, 100_000, "N", "requests queued per service"),
        ("--max-client-queued", _NATURAL, 10_000, "N", "one client's requests waiting in queues"),
        (
            "--max-client-inflight",
            _NATURAL,
            20_000,
            "N",
            "one client's requests accepted and not yet answered",
        ),
        (
            "--max-message-size",
            _integer(-1),
            64 << 20,
            "BYTES",
            "largest message, all frames together (-1: no limit)",
        ),
        ("--max-frames", _POSITIVE, 4096, "N", "frames per message"),
        ("--max-service-name", _POSITIVE, 1024, "BYTES", "longest service name"),
        ("--max-services", _NATURAL, 10_000, "N", "services that requests may create"),
        (
            "--max-client-services",
            _NATURAL,
            0,
            "N",
            "services without a worker one client's requests may create (0: a tenth of "
            "--max-services)",
        ),
        ("--max-services-per-worker", _NATURAL, 256, "N", "services one worker may register"),
        (
            "--send-hwm",
            _NATURAL,
            1000,
            "MESSAGES",
            "zmq's send high-water mark per peer (0: none)",
        ),
        (
            "--receive-hwm",
            _NATURAL,
            1000,
            "MESSAGES",
            "zmq's receive high-water mark per peer (0: none)",
        ),
    ]
    for flag, kind, default, metavar, text in limits:
        g.add_argument(flag, type=kind, default=default, metavar=metavar, help=text)
    g.add_argument(
        "--max-memory",
        type=memory_size,
        default="512M",  # dcp._core.broker.budget.DEFAULT_MAX_MEMORY
        metavar="SIZE",
        help="bytes the broker may hold on its peers' behalf (queued requests, held "
        "replies, subscription buffers, ...), e.g. 512M, 1G, plain bytes; 0 or none: no "
        f"budget ({doc_url('security')})",
    )


def _add_server_security(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group(
        f"CURVE security ({doc_url('security')})",
        "SIGHUP re-reads the --allow-* files and directories: new keys get in, removed\n"
        "ones are no longer heard, and their workers are removed.",
    )
    g.add_argument(
        "--keys", metavar="FILE", help="the broker's NAME.key_secret file: turns CURVE on"
    )
    g.add_argument(
        "--allow-client",
        action="append",
        default=[],
        metavar="PATH",
        help="a public .key file, or a directory of them, whose keys may connect (repeatable)",
    )
    g.add_argument(
        "--allow-any-client",
        action="store_true",
        help="let any key connect (encryption without client authentication)",
    )
    g.add_argument(
        "--allow-worker",
        action="append",
        default=[],
        metavar="SERVICE=PATH",
        help="keys in PATH (.key file or directory; '*': any connected key) may register "
        "SERVICE ('*': any service); they may also connect (repeatable)",
    )
