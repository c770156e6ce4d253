"""``dcp top``: a live terminal view of a running broker, read from the services the broker
answers itself: ``mmi.stats`` (one entry per service) and ``mmi.broker`` (broker-wide
figures), see :mod:`dcp._core.broker.directory` and ``docs/operations.md``.

Rules:

Rule TP1 - Rates are counter deltas between two polls divided by the time between their answers. A
   counter that went down (the broker restarted; a service forgotten and known again) has
   no rate for that poll. The first poll has no rates (``-``).
Rule TP2 - ``--once`` polls once, prints one table (plain text, no ANSI codes, when stdout is not a
   terminal) and exits 0. Live mode redraws after every poll (not a terminal: prints each
   poll's view after the last); a poll that gets no answer
   keeps the last figures, marked as stale, and polling goes on, until Ctrl-C or
   ``--count`` polls.
Rule TP3 - The first poll that gets no answer within ``--timeout`` is an error (one line, exit 1):
   nothing is shown until the broker has answered once. Ctrl-C stops at once (exit 130).
Rule TP4 - A broker that does not answer ``mmi.broker`` (an older dcp broker) still gets its
   services table; the broker-wide line says what is missing.
Rule TP5 - The broker-wide counters count since the broker started, the rows since their service
   became known (a service nobody serves and nothing waits for is forgotten, with its
   counts). The header says so and reconciles them: ``requests`` = the listed services'
   requests + those of forgotten services (``mmi.broker``'s ``forgotten_requests``, taken at
   the same instant); ``errors`` is the rows' sum; refusals and retries that replaced a
   queued copy are not requests (docs/operations.md, "Reading the figures").
Rule TP6 - The byte budget (``mmi.broker``'s ``memory``, ``dcp._core.broker.budget``): one line
   with the bytes held in every account together, of ``max_memory``, and the refusals
   (``memory_budget``) of each account that refused any; then the accounts that hold
   something, as ``name used/limit``. A broker that does not say (older) shows no line.
Rule TP7 - Several brokers (``--connect`` given more than once): each broker is polled by a client
   of its own (its own questions, never spread across the brokers), all at once, and shown as
   a block of its own (its header and table, as for one broker) in the order given, under a
   line counting those up and down. A broker that does not answer a poll (or is not a dcp
   broker) is shown as one line, ``[down: why]``, and polling goes on; it is shown again when
   it answers. The first poll is an error only if no broker answers it (Rule TP3). With one
   ``--connect``, nothing changes.
Rule TP8 - ``--once`` is a one-shot command (``dcp._cli._run`` Rule CR5): its clients do not wait
   for a broker that refuses connections (``wait_for_broker=False``, unless
   ``--wait-for-broker``), so no broker listening is one line within half a second,
   ``cannot connect to ENDPOINT: connection refused ...`` (several brokers: when every one
   refuses), not a wait of ``--timeout``. Live mode waits for its brokers as before (Rule TP3).

``rich`` (the ``top`` extra) is imported only by :func:`cmd_top`.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import sys
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import attrs

from dcp._cli._docs import doc_url
from dcp._cli._run import CLIError, add_wait_for_broker, run_async, until_signal

if TYPE_CHECKING:
    from rich.console import Console, RenderableType

    from dcp._client.client import Client

__all__ = [
    "SORT_KEYS",
    "Row",
    "Snapshot",
    "add_top_command",
    "cmd_top",
    "make_console",
    "render_many",
    "rows",
]

_INSTALL = "pip install 'dagbox-dcp[top]'"


@attrs.frozen
class Snapshot:
    """What one poll read: the time of its answer (the client's clock), each service's
    ``mmi.stats`` entry, and the ``mmi.broker`` document (``None``: not answered)."""

    at: float
    services: tuple[Mapping[str, Any], ...]
    broker: Mapping[str, Any] | None


@attrs.frozen
class Row:
    """One service as ``dcp top`` shows it (rates: ``None`` when unknown, Rule TP1)."""

    name: str
    rate: float | None
    requests: int
    replies: int
    errors: int
    error_rate: float | None
    queued: int
    oldest: float
    workers: int
    idle: int
    busy: int
    #: Mean processing time of answered requests, seconds.
    average: float


def _rate(now: int, before: int | None, elapsed: float) -> float | None:
    if before is None or now < before or elapsed <= 0:
        return None
    return (now - before) / elapsed


def rows(previous: Snapshot | None, current: Snapshot) -> list[Row]:
    """The services of ``current``, with rates against ``previous`` (Rule TP1), by name."""
    before: dict[str, Mapping[str, Any]] = {}
    elapsed = 0.0
    if previous is not None:
        before = {s["name"]: s for s in previous.services}
        elapsed = current.at - previous.at
    out = []
    for s in current.services:
        old = before.get(s["name"], {})
        requests = int(s.get("num_requests", 0))
        errors = int(s.get("num_errors", 0))
        out.append(
            Row(
                name=str(s["name"]),
                rate=_rate(requests, old.get("num_requests"), elapsed),
                requests=requests,
                replies=int(s.get("num_answered", 0)),
                errors=errors,
                error_rate=_rate(errors, old.get("num_errors"), elapsed),
                queued=int(s.get("queued", 0)),
                oldest=float(s.get("oldest_queued_age", 0.0)),
                workers=int(s.get("workers", 0)),
                idle=int(s.get("idle", 0)),
                busy=int(s.get("busy", 0)),
                average=int(s.get("average_processing_time", 0)) / 1e9,
            )
        )
    return sorted(out, key=lambda r: r.name)


def _by(field: str) -> Callable[[Row], Any]:
    def key(row: Row) -> Any:
        value = getattr(row, field)
        return -math.inf if value is None else value

    return key


#: ``--sort`` keys: the busiest first, except ``name``.
SORT_KEYS: dict[str, Callable[[Row], Any]] = {
    "name": _by("name"),
    "rate": _by("rate"),
    "requests": _by("requests"),
    "errors": _by("errors"),
    "queued": _by("queued"),
    "busy": _by("busy"),
    "workers": _by("workers"),
}


def sort_rows(table: list[Row], key: str) -> list[Row]:
    """``table`` (sorted by name) sorted by ``key``: descending, ties by name."""
    if key == "name":
        return table
    return sorted(table, key=SORT_KEYS[key], reverse=True)


def add_top_command(
    command: Callable[..., argparse.ArgumentParser],
    connect: Callable[[str], str],
    seconds: Callable[[str], float],
    positive: Callable[[str], int],
    security: Callable[[argparse.ArgumentParser], None],
) -> None:
    """Add ``dcp top`` (``command`` makes a subcommand's parser)."""
    p = command(
        "top",
        help="a live view of a running broker: services, rates, queues, workers",
        description="Poll a broker's mmi.stats and mmi.broker services and show, per\n"
        "service, requests per second, replies, errors, queue depth and idle/busy\n"
        "workers, with the broker's uptime, peers and refusals. Needs the top extra:\n"
        f"{_INSTALL}. Ctrl-C stops it.\nReading the figures: {doc_url('operations')}",
    )
    p.add_argument(
        "--connect",
        required=True,
        action="append",
        type=connect,
        metavar="ENDPOINT",
        help="broker endpoint, e.g. tcp://127.0.0.1:5555 or beacon://[HOST]:PORT; "
        "repeat it to watch several brokers, each shown on its own",
    )
    p.add_argument(
        "--interval", type=seconds, default=1.0, metavar="SECONDS", help="seconds between polls"
    )
    p.add_argument(
        "--timeout",
        type=seconds,
        default=1.0,
        metavar="SECONDS",
        help="seconds to wait for each answer (the first unanswered poll is an error)",
    )
    p.add_argument("--once", action="store_true", help="print one snapshot and exit")
    p.add_argument(
        "--count",
        type=positive,
        metavar="N",
        help="stop after N polls (default: run until Ctrl-C)",
    )
    p.add_argument(
        "--sort", choices=sorted(SORT_KEYS), default="rate", help="order of the services"
    )
    add_wait_for_broker(p)  # Rule TP8: with --once
    security(p)
    p.set_defaults(func=cmd_top)


# -- polling --------------------------------------------------------------------------------


async def _ask(client: Client, name: str, timeout: float) -> Any:
    from dcp._json import decode_json

    response = await client.request(name, timeout=timeout, retries=0)
    if response.data == (b"501",):
        return None
    return decode_json(response.bytes, name=f"{name} answer")


async def _pages(client: Client, timeout: float) -> list[Any] | None:
    """Every ``mmi.stats`` entry, a page at a time (directory Rule D6); ``None``: not
    answered."""
    from dcp._client.services import mmi_page

    listing: list[Any] = []
    after: bytes | None = None
    while True:
        data = () if after is None else (b"", after)
        response = await client.request("mmi.stats", *data, timeout=timeout, retries=0)
        if response.data == (b"501",):
            return None
        page, after = mmi_page("mmi.stats", response, after)
        listing += page
        if after is None:
            return listing


async def poll(client: Client, timeout: float) -> Snapshot:
    """One :class:`Snapshot` (``mmi.stats``, then ``mmi.broker``).

    :raises RuntimeError: the broker does not answer ``mmi.stats`` (not a dcp broker)
    :raises dcp.RequestTimeout: no answer within ``timeout``
    """
    import anyio

    services = await _pages(client, timeout)
    if services is None:
        raise RuntimeError("the broker does not answer mmi.stats (not a dcp broker?)")
    at = anyio.current_time()
    broker = await _ask(client, "mmi.broker", timeout)
    return Snapshot(at, tuple(services), broker)


# -- rendering ------------------------------------------------------------------------------


def _duration(seconds: float) -> str:
    whole = int(seconds)
    days, rest = divmod(whole, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d{hours:02d}h{minutes:02d}m"
    if hours:
        return f"{hours}h{minutes:02d}m{secs:02d}s"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def _num(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _delta(now: Mapping[str, Any], before: Mapping[str, Any] | None, key: str) -> str:
    value = int(now.get(key, 0))
    if before is None or key not in before or value < int(before[key]):
        return f"{value:,}"
    return f"{value:,} (+{value - int(before[key]):,})"


def header(endpoint: str, previous: Snapshot | None, current: Snapshot, stale: str) -> str:
    """The broker-wide lines above the table (Rule TP4)."""
    first = f"dcp top - {endpoint}"
    if stale:
        first += f"  [stale: {stale}]"
    doc = current.broker
    if doc is None:
        return first + "\nthis broker does not answer mmi.broker: services only"
    old = previous.broker if previous is not None else None
    elapsed = current.at - previous.at if previous is not None else 0.0
    was: Mapping[str, Any] = old or {}
    rate = _rate(int(doc.get("requests", 0)), was.get("requests"), elapsed)
    replies = _rate(int(doc.get("replies", 0)), was.get("replies"), elapsed)
    lines = [
        f"{first}  up {_duration(float(doc.get('uptime', 0.0)))}",
        f"workers {doc.get('workers', 0)}  clients waiting {doc.get('clients', 0)}  "
        f"services {doc.get('services', 0)}  queued {doc.get('queued', 0)}  "
        f"expired workers {_delta(doc, old, 'expired_workers')}",
        f"since start: req/s {_num(rate)}  replies/s {_num(replies)}  "
        f"requests {_delta(doc, old, 'requests')}  replies {_delta(doc, old, 'replies')}  "
        f"redelivered {_delta(doc, old, 'redeliveries')}",
    ]
    if "forgotten_requests" in doc:  # Rule TP5 (an older broker does not say)
        forgotten = int(doc["forgotten_requests"])
        listed = int(doc.get("requests", 0)) - forgotten
        lines.append(
            f"  requests = rows {listed:,} + forgotten services {forgotten:,}  "
            f"expired in queue {_delta(doc, old, 'expired_in_queue')}  "
            f"replaced retries {_delta(doc, old, 'replaced')}"
        )
    lines.append(
        f"rows: since each service became known; their errors {_delta(doc, old, 'errors')}"
    )
    lines.extend(memory_lines(doc))
    refused: Mapping[str, int] = doc.get("rejections") or {}
    if refused:
        old_refused: Mapping[str, int] = (old or {}).get("rejections") or {}
        shown = sorted(refused.items(), key=lambda kv: (-kv[1], kv[0]))[:6]
        lines.append(
            "refusals (not requests): "
            + ", ".join(f"{reason} {_delta(refused, old_refused, reason)}" for reason, _ in shown)
        )
    return "\n".join(lines)


def _size(n: float | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError  # pragma: no cover


def memory_lines(doc: Mapping[str, Any]) -> list[str]:
    """Rule TP6: the byte budget's lines (none if the broker does not say)."""
    accounts: Mapping[str, Mapping[str, Any]] | None = doc.get("memory")
    if not isinstance(accounts, Mapping):
        return []
    limit = doc.get("max_memory")
    used = sum(int(a.get("used", 0)) for a in accounts.values())
    refused = [(name, int(a.get("refused", 0))) for name, a in accounts.items()]
    line = f"memory {_size(used)} held of " + (_size(limit) if limit is not None else "no budget")
    shown = [f"{name} {count:,}" for name, count in refused if count]
    line += "  refused: " + (", ".join(shown) if shown else "none")
    lines = [line]
    held = [
        f"{name} {_size(a.get('used', 0))}/{_size(a.get('limit'))}"
        for name, a in accounts.items()
        if a.get("used")
    ]
    if held:
        lines.append("  " + "  ".join(held))
    return lines


_COLUMNS = (
    "SERVICE",
    "REQ/S",
    "REQS",
    "REPLIES",
    "ERRS",
    "ERR/S",
    "QUEUED",
    "OLDEST",
    "IDLE",
    "BUSY",
    "AVG MS",
)


def cells(row: Row) -> tuple[str, ...]:
    """One row's cells, in :data:`_COLUMNS` order."""
    return (
        row.name,
        _num(row.rate),
        f"{row.requests:,}",
        f"{row.replies:,}",
        f"{row.errors:,}",
        _num(row.error_rate),
        f"{row.queued:,}",
        f"{row.oldest:.1f}s" if row.queued else "-",
        str(row.idle),
        str(row.busy),
        f"{row.average * 1000:.2f}",
    )


def render(
    endpoint: str, previous: Snapshot | None, current: Snapshot, sort: str, stale: str = ""
) -> RenderableType:
    """The whole view: broker-wide lines, then the services table."""
    from rich import box
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    # One space between columns: the eleven of them fit in 80 columns.
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 0, 0, 1))
    for i, title in enumerate(_COLUMNS):
        table.add_column(
            title, justify="left" if i == 0 else "right", no_wrap=True, min_width=len(title)
        )
    shown = sort_rows(rows(previous, current), sort)
    for row in shown:
        style = "red" if row.error_rate else ("yellow" if row.queued and not row.idle else None)
        table.add_row(*cells(row), style=style)
    parts: list[RenderableType] = [Text(header(endpoint, previous, current, stale)), table]
    if not shown:
        parts.append(Text("no services yet"))
    return Group(*parts)


# -- the command ----------------------------------------------------------------------------


def make_console() -> Console:
    """Where ``dcp top`` draws: the terminal, or plain text 160 columns wide if stdout is
    not one."""
    from rich.console import Console

    if sys.stdout.isatty():
        return Console()
    # Not a terminal (a pipe, a test): plain text, and wide enough not to wrap the table.
    return Console(width=160, no_color=True, highlight=False)


def _need_rich() -> None:
    try:
        import rich  # noqa: F401
    except ImportError:
        raise CLIError(f"needs the rich library: {_INSTALL}") from None


def render_many(
    endpoints: list[str],
    views: list[tuple[Snapshot | None, Snapshot | None, str]],
    sort: str,
) -> RenderableType:
    """Several brokers (Rule TP7): a line counting them, then each one's block in the order
    given: ``views[i]`` is broker ``i``'s (previous, current, why it is down: ``""`` if up)."""
    from rich.console import Group
    from rich.text import Text

    down = sum(1 for _, current, why in views if why or current is None)
    parts: list[RenderableType] = [
        Text(f"dcp top - {len(endpoints)} brokers: {len(endpoints) - down} up, {down} down")
    ]
    for endpoint, (previous, current, why) in zip(endpoints, views, strict=True):
        parts.append(Text(""))
        if why or current is None:
            parts.append(Text(f"dcp top - {endpoint}  [down: {why or 'no answer yet'}]"))
        else:
            parts.append(render(endpoint, previous, current, sort))
    return Group(*parts)


def _waits(args: argparse.Namespace) -> bool:
    """Rule TP8: whether the clients wait for a broker that refuses connections."""
    return not args.once or args.wait_for_broker


async def _watch_many(args: argparse.Namespace, console: Console, security: Any) -> None:
    """``dcp top`` with several ``--connect`` (Rule TP7)."""
    import anyio
    from rich.live import Live

    from dcp._client.client import Client
    from dcp._errors import BrokerUnreachable, DCPError

    waits = _waits(args)
    async with contextlib.AsyncExitStack() as stack:
        clients = [
            await stack.enter_async_context(
                Client(each, security=security, timeout=args.timeout, wait_for_broker=waits)
            )
            for each in args.connect
        ]
        refused = [False] * len(clients)  # Rule TP8
        endpoints = [c.endpoint for c in clients]  # a beacon:// endpoint's broker, as heard
        views: list[tuple[Snapshot | None, Snapshot | None, str]] = [(None, None, "")] * len(
            clients
        )

        async def one(i: int) -> None:
            previous, current, _ = views[i]
            try:
                fresh = await poll(clients[i], args.timeout)
            except (DCPError, RuntimeError) as exc:
                refused[i] = isinstance(exc, BrokerUnreachable)
                views[i] = (previous, current, str(exc))
            else:
                views[i] = (current, fresh, "")

        async def poll_all() -> RenderableType:
            async with anyio.create_task_group() as tg:
                for i in range(len(clients)):
                    tg.start_soon(one, i)
            return render_many(endpoints, views, args.sort)

        first = await poll_all()
        if all(refused):  # Rule TP8
            raise CLIError(
                f"cannot connect to any of {', '.join(endpoints)}: connection refused "
                "(nothing listens there): is a dcp broker running there?"
            )
        if all(why for _, _, why in views):  # Rule TP3: no broker answered
            raise CLIError(
                f"no answer from any of {', '.join(endpoints)} within {args.timeout:g} s: "
                "is a dcp broker running there?"
            )
        if args.once:
            console.print(first)
            return
        live = Live(first, console=console, auto_refresh=False) if console.is_terminal else None
        if live is None:
            console.print(first)
        with live or contextlib.nullcontext():
            polls = 1
            while args.count is None or polls < args.count:
                polls += 1
                await anyio.sleep(args.interval)
                view = await poll_all()
                if live is None:
                    console.print(view)
                else:
                    live.update(view, refresh=True)


def cmd_top(args: argparse.Namespace) -> int:
    from dcp._cli._run import exit_code
    from dcp._cli._security import client_security
    from dcp._client.client import Client
    from dcp._errors import BrokerUnreachable, DCPError, RequestTimeout

    _need_rich()
    security = client_security(args)
    console = make_console()

    async def run() -> None:
        import anyio
        from rich.live import Live

        if len(args.connect) > 1:
            await _watch_many(args, console, security)
            return
        async with Client(
            args.connect[0],
            security=security,
            timeout=args.timeout,
            wait_for_broker=_waits(args),  # Rule TP8
        ) as client:
            endpoint = client.endpoint  # a beacon:// endpoint's broker, as heard
            try:
                current = await poll(client, args.timeout)
            except BrokerUnreachable as exc:  # Rule TP8
                raise CLIError(str(exc)) from None
            except RequestTimeout:
                raise CLIError(
                    f"no answer from {endpoint} within {args.timeout:g} s: "
                    "is a dcp broker running there?"
                ) from None
            if args.once:
                console.print(render(endpoint, None, current, args.sort))
                return
            previous: Snapshot | None = None
            first = render(endpoint, None, current, args.sort)
            # Not a terminal: each poll's view printed after the last (as top's batch mode).
            live = (
                Live(first, console=console, auto_refresh=False) if console.is_terminal else None
            )
            if live is None:
                console.print(first)
            with live or contextlib.nullcontext():
                polls = 1
                while args.count is None or polls < args.count:
                    polls += 1
                    await anyio.sleep(args.interval)
                    try:
                        fresh = await poll(client, args.timeout)
                    except DCPError as exc:
                        view = render(endpoint, previous, current, args.sort, stale=str(exc))
                    else:
                        previous, current = current, fresh
                        view = render(endpoint, previous, current, args.sort)
                    if live is None:
                        console.print(view)
                    else:
                        live.update(view, refresh=True)

    try:
        received = run_async(args.backend, until_signal, run)
    except (DCPError, RuntimeError, ValueError, TimeoutError) as exc:
        # TimeoutError: no beacon heard for a beacon:// endpoint.
        raise CLIError(str(exc)) from None
    except OSError as exc:  # a beacon:// endpoint's UDP port cannot be listened on
        raise CLIError(f"cannot listen for a beacon: {exc}") from None
    return exit_code(received)
