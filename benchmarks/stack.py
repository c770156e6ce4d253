"""The whole stack: dcp's own Client and Workers against majortomo's own, each through its
own broker (issue 16), and beside NATS (issue 27).

``python -m benchmarks.stack [--rounds 3] [--quick | --tiny] [--sides a,b] [--base TREE]
[--page docs/performance.md | --no-page] [--json FILE] [--render JSON]``

Sides (what a user of each library runs):

- *dcp-trio*, *dcp-asyncio*: ``dcp broker`` (trio, as shipped), :class:`dcp.Client`
  (``map_unordered`` with *window* in flight, ``request`` one at a time for window 1) and
  :class:`dcp.Worker` echo workers, client and workers on that backend
  (:mod:`benchmarks.dcp_peers`); *dcp-uvloop* (asyncio on uvloop), where uvloop is
  installed; *dcp-trio-prefetch*, *dcp-asyncio-prefetch*: the same with workers that
  prefetch (``dcp.Worker(prefetch=PREFETCH)``: each asks for :data:`PREFETCH` requests
  beyond its concurrency while its slots are busy);
- *majortomo*: majortomo 0.2.0's ``Broker``, its ``Client`` (one request in flight each, so
  *window* clients in one process) and its ``Worker`` (one request at a time: one thread per
  request served at once) (:mod:`benchmarks.mdp`);
- *nats*: ``nats-server`` (Debian's package, from ``PATH``, on 127.0.0.1 with a free port)
  with nats-py on asyncio: a queue subscription per request served at once, a client with
  *window* tasks looping ``await nc.request(...)`` (:mod:`benchmarks.nats_peers`). Skipped,
  with a one-line reason, where ``nats-server`` or nats-py is missing.

Shapes: *1x16*, one worker process serving 16 requests at once (one ``dcp.Worker`` with
``concurrency=16``; 16 majortomo Worker threads), and *4x1*, four worker processes serving
one request at a time each. Loads: 16 B echo at window 64 and window 1.

Each round starts every (shape, side) afresh, sides in an order rotated by the round; the
figures are medians over rounds and the ratios medians of same-round ratios side / anchor:
one table against majortomo, one against NATS. Every process is killed by its PID when its
run ends. The result is the ``stack`` section of ``docs/performance.md``
(:mod:`benchmarks.sections`, kept when the suite regenerates the page) and the raw records
in ``docs/perf/stack.json``.

``--base TREE`` (an A/B run, no page) adds, for each dcp side *X*, a side *X@base* whose
client and workers come from the source tree ``TREE`` (e.g. ``git worktree add --detach
/tmp/base main``), in the same rounds and through the same broker, and prints head / base.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from importlib.util import find_spec
from pathlib import Path
from typing import Any

from . import nats_peers
from .common import pid_list, raise_fd_limit
from .procs import ROOT, Proc, ProcessFailed, Procs
from .sections import put_section
from .variants import START_TIMEOUT, Load, start_broker

__all__ = ["SHAPES", "SIDES", "main", "render_section", "run", "summarise"]

#: name: (worker processes, requests each serves at once)
SHAPES: dict[str, tuple[int, int]] = {"1x16": (1, 16), "4x1": (4, 1)}
NATS = "nats"
#: dcp's sides (backend of client and workers), majortomo's and NATS's; ``dcp-uvloop``
#: (asyncio on uvloop, the ``uvloop`` extra) where uvloop is installed; ``nats`` where
#: ``nats-server`` is on ``PATH`` and nats-py installed (:func:`benchmarks.nats_peers.missing`).
SIDES = (
    "dcp-trio",
    "dcp-asyncio",
    "dcp-trio-prefetch",
    "dcp-asyncio-prefetch",
    *(("dcp-uvloop",) if find_spec("uvloop") else ()),
    "majortomo",
    *((NATS,) if nats_peers.missing() is None else ()),
)
THEIRS = "majortomo"
#: The prefetch of the ``-prefetch`` sides' workers: of 1, 2, 4 and 8, the best 4x1
#: throughput at window 64 (docs/performance-stack.md, Round 4).
PREFETCH = 4
PREFETCHING = "-prefetch"
#: The sides others are measured against, in the order of the page's tables.
ANCHORS = (THEIRS, NATS)
PAYLOAD = 16
LOADS = {
    "full": (Load(PAYLOAD, 64, 500, 30_000, 2.0), Load(PAYLOAD, 1, 100, 5_000, 1.5)),
    "quick": (Load(PAYLOAD, 64, 300, 10_000, 1.0), Load(PAYLOAD, 1, 50, 2_000, 0.8)),
    "tiny": (Load(PAYLOAD, 64, 64, 300, 0.3), Load(PAYLOAD, 1, 10, 60, 0.2)),
}
#: Goals (issue 16): req/s at window 64 dcp / majortomo >= 1.25; p50 at window 1 <= 1.0.
RATE_GOAL = 1.25
P50_GOAL = 1.0
#: Goals against each anchor: (req/s at window 64 >=, p50 at window 1 <=); against NATS
#: (issue 27): >= 0.5x and <= 1.3x.
GOALS = {THEIRS: (RATE_GOAL, P50_GOAL), NATS: (0.5, 1.3)}
FIGURES = (
    ("rate", "req/s", 0),
    ("p50_us", "p50 us", 0),
    ("client_cpu_us", "client CPU us/req", 1),
    ("workers_cpu_us", "workers CPU us/req", 1),
    ("broker_cpu_us", "broker CPU us/req", 1),
)

Log = Callable[[str], None]


def _log(msg: str) -> None:
    print(f"[stack {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _launch(procs: Procs, name: str, tree: Path | None, *args: str) -> Proc:
    """``python -m args...``, from this checkout or (A/B runs) from ``tree``."""
    if tree is None:
        return procs.start(name, *args)
    code = (
        f"import runpy, sys; sys.path.insert(0, {str(tree)!r}); sys.argv = {list(args)!r}; "
        f"runpy.run_module({args[0]!r}, run_name='__main__', alter_sys=True)"
    )
    return procs.start(name, sys.executable, "-c", code, module=False)


def _start(
    procs: Procs, side: str, shape: str, base: Path | None = None
) -> tuple[str, int, list[int]]:
    """Start the broker and the worker processes; returns (endpoint, broker pid, worker
    pids), all ready. A side ``X@base`` runs X's peers from the ``base`` tree."""
    nproc, concurrency = SHAPES[shape]
    side, tree = _tree(side, base)
    if side == THEIRS:
        endpoint, _, bpid = start_broker(procs, "majortomo")
        argv = ["benchmarks.mdp", "workers", "--count", str(concurrency)]
    elif side == NATS:
        endpoint, bpid = nats_peers.start_server(procs, START_TIMEOUT)
        argv = ["benchmarks.nats_peers", "workers", "--count", str(concurrency)]
    else:
        endpoint, _, bpid = start_broker(procs, "dcp")
        argv = ["benchmarks.dcp_peers", *_backend(side), "workers", "--count", "1"]
        argv += ["--concurrency", str(concurrency)]
        if side.endswith(PREFETCHING):
            argv += ["--prefetch", str(PREFETCH)]
    argv += ["--endpoint", endpoint]
    started = [_launch(procs, f"{side}-workers", tree, *argv) for _ in range(nproc)]
    for proc in started:
        proc.wait_ready(START_TIMEOUT)
    return endpoint, bpid, [p.pid for p in started]


def _in_tree(side: str, tree: Path) -> bool:
    """Whether ``tree`` can run ``side``'s peers: a tree from before the worker prefetch
    cannot run the prefetch sides (said on stderr; the side then has no ``@base`` copy)."""
    if not side.endswith("-prefetch"):
        return True
    peers = tree / "benchmarks" / "dcp_peers.py"
    if peers.is_file() and "--prefetch" in peers.read_text():
        return True
    print(f"stack: {side}: the base tree has no worker prefetch; no {side}@base", file=sys.stderr)
    return False


def _tree(side: str, base: Path | None) -> tuple[str, Path | None]:
    if side.endswith("@base"):
        if base is None:
            raise ValueError(f"side {side!r} needs --base")
        return side.removesuffix("@base"), base
    return side, None


def _client_argv(side: str) -> list[str]:
    if side == THEIRS:
        return ["benchmarks.mdp", "client"]
    if side == NATS:
        return ["benchmarks.nats_peers", "client"]
    return ["benchmarks.dcp_peers", *_backend(side), "client"]


def _backend(side: str) -> list[str]:
    """``benchmarks.dcp_peers`` options of a dcp side (``dcp-uvloop``: asyncio on uvloop)."""
    if side == "dcp-uvloop":
        return ["--backend", "asyncio", "--uvloop"]
    return ["--backend", side.removeprefix("dcp-").removesuffix(PREFETCHING)]


def _one(
    procs: Procs,
    side: str,
    load: Load,
    running: tuple[str, int, list[int]],
    base: Path | None = None,
) -> Any:
    endpoint, bpid, wpids = running
    side, tree = _tree(side, base)
    argv = [*_client_argv(side), "--endpoint", endpoint, *load.argv()]
    argv += ["--broker-pid", str(bpid), "--worker-pids", pid_list(wpids)]
    proc = _launch(procs, f"{side}-client", tree, *argv)
    return proc.result(30.0 + load.duration + 15.0 + 30.0)


def run_rounds(
    rounds: int,
    loads: Sequence[Load],
    log_dir: Path,
    log: Log = _log,
    sides: Sequence[str] = SIDES,
    base: Path | None = None,
) -> list[dict[str, Any]]:
    """Every (round, shape, side, load): one record each (``error`` set if it failed)."""
    out: list[dict[str, Any]] = []
    for r in range(rounds):
        for shape in SHAPES if sides else ():
            k = r % len(sides)
            for side in [*sides[k:], *sides[:k]]:
                key = {"round": r, "shape": shape, "side": side}
                with Procs(log_dir) as procs:
                    try:
                        running = _start(procs, side, shape, base)
                    except ProcessFailed as exc:
                        log(f"{key}: failed to start: {exc}\n{procs.tails()}")
                        out += [{**key, **asdict(ld), "error": str(exc)} for ld in loads]
                        continue
                    for load in loads:
                        rec: dict[str, Any] = {**key, **asdict(load)}
                        try:
                            rec.update(_one(procs, side, load, running, base))
                        except ProcessFailed as exc:
                            rec["error"] = f"{exc}\n{procs.tails()}"
                            log(f"{key} w{load.window}: FAILED {rec['error']}")
                        else:
                            log(
                                f"{key} w{load.window}: {rec['rate']:.0f} req/s, p50 "
                                f"{rec['p50_us']:.0f} us, client {rec['client_cpu_us']:.0f} "
                                f"us/req, workers {rec['workers_cpu_us']:.0f} us/req, "
                                f"lost {rec['lost']}"
                            )
                        out.append(rec)
    return out


def run(
    rounds: int,
    profile: str,
    log_dir: Path,
    log: Log = _log,
    sides: Sequence[str] = SIDES,
    base: Path | None = None,
) -> dict[str, Any]:
    """Run the comparison; the raw records and what they were measured on."""
    from .run import machine

    raise_fd_limit()
    skipped: dict[str, str] = {}
    if NATS in sides and (why := nats_peers.missing()) is not None:
        log(f"side {NATS} skipped: {why}")
        skipped[NATS] = why
        sides = [x for x in sides if x != NATS]
    started = time.monotonic()
    records = run_rounds(rounds, LOADS[profile], log_dir, log, sides, base)
    return {
        "rounds": rounds,
        "profile": profile,
        "skipped": skipped,
        "nats_server": nats_peers.versions() if NATS in sides else None,
        "machine": machine(),
        "duration_s": round(time.monotonic() - started, 1),
        "stack": records,
    }


def _ok(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in records if "error" not in r]


def _median(xs: Sequence[float]) -> float | None:
    return statistics.median(xs) if xs else None


def summarise(records: Sequence[dict[str, Any]], anchor: str = THEIRS) -> list[dict[str, Any]]:
    """One row per (shape, window, side other than ``anchor``): medians of both sides,
    same-round ratios side / anchor."""
    ok = _ok(records)

    def pick(shape: str, side: str, window: int) -> dict[int, dict[str, Any]]:
        return {
            r["round"]: r
            for r in ok
            if r["shape"] == shape and r["side"] == side and r["window"] == window
        }

    rows: list[dict[str, Any]] = []
    windows = sorted({int(r["window"]) for r in records}, reverse=True)
    for shape in SHAPES:
        for window in windows:
            theirs = pick(shape, anchor, window)
            for side in dict.fromkeys(r["side"] for r in records):
                if side == anchor:
                    continue
                ours = pick(shape, side, window)
                row: dict[str, Any] = {"shape": shape, "window": window, "side": side}
                for key, _, _ in FIGURES:
                    row[key] = (
                        _median([r[key] for r in theirs.values()]),
                        _median([r[key] for r in ours.values()]),
                        _median(
                            [ours[n][key] / theirs[n][key] for n in ours if n in theirs]
                            if all(theirs[n][key] for n in ours if n in theirs)
                            else []
                        ),
                    )
                row["lost"] = sum(r["lost"] for r in [*theirs.values(), *ours.values()])
                total = [
                    r
                    for r in records
                    if (r["shape"], r["window"]) == (shape, window) and r["side"] in (side, anchor)
                ]
                row["runs"] = (len(theirs) + len(ours), len(total))
                rows.append(row)
    return rows


def render_ab(records: Sequence[dict[str, Any]]) -> str:
    """A/B table (``--base``): each dcp side against the same side from the base tree,
    medians of the same-round ratios head / base."""
    ok = _ok(records)
    lines = [
        "| shape | window | side | "
        + " | ".join(f"{label} base | head | h/b" for _, label, _ in FIGURES)
        + " |",
        "|---|---|---|" + "---|---|---|" * len(FIGURES),
    ]
    for shape in SHAPES:
        for window in sorted({int(r["window"]) for r in records}, reverse=True):
            for side in dict.fromkeys(r["side"] for r in records if r["side"].endswith("@base")):
                head = side.removesuffix("@base")
                a = {
                    r["round"]: r
                    for r in ok
                    if (r["shape"], r["window"], r["side"]) == (shape, window, side)
                }
                b = {
                    r["round"]: r
                    for r in ok
                    if (r["shape"], r["window"], r["side"]) == (shape, window, head)
                }
                cells = []
                for key, _, digits in FIGURES:
                    both = [n for n in a if n in b and a[n][key]]
                    cells += [
                        _num(_median([a[n][key] for n in a]), digits),
                        _num(_median([b[n][key] for n in b]), digits),
                        _ratio(_median([b[n][key] / a[n][key] for n in both])),
                    ]
                lines.append(f"| {shape} | {window} | {head} | {' | '.join(cells)} |")
    return "\n".join(lines) + "\n"


def _num(x: float | None, digits: int = 0) -> str:
    return "-" if x is None else f"{x:,.{digits}f}"


def _ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}x"


def _verdict(row: dict[str, Any], anchor: str = THEIRS) -> str:
    if row["side"] in ANCHORS:
        return "-"  # the goals are dcp's
    rate_goal, p50_goal = GOALS[anchor]
    if row["window"] == 1:
        ratio, goal = row["p50_us"][2], f"p50 <= {p50_goal:.2f}x"
        ok = ratio is not None and ratio <= p50_goal
    else:
        ratio, goal = row["rate"][2], f"req/s >= {rate_goal:.2f}x"
        ok = ratio is not None and ratio >= rate_goal
    if ratio is None:
        return f"{goal}: -"
    return f"{goal}: **{'met' if ok else 'not met'}**"


#: Each anchor's letter in the tables' headings, and its heading.
_ANCHOR_LABELS = {
    THEIRS: ("m", "Against majortomo's own stack"),
    NATS: ("n", "Against NATS (nats-server, nats-py on asyncio)"),
}


def _table(records: Sequence[dict[str, Any]], anchor: str) -> list[str]:
    """The table of every other side against ``anchor``, with its heading and goals."""
    a, heading = _ANCHOR_LABELS[anchor]
    rate_goal, p50_goal = GOALS[anchor]
    lines = [
        f"### {heading}",
        "",
        f"Goals: req/s at window 64 dcp / {anchor} >= {rate_goal:.2f}x; p50 at window 1 <= "
        f"{p50_goal:.2f}x. *{a}*: {anchor}; *s*: the side of the row; *s/{a}*: the median of "
        "same-round ratios.",
        "",
        "| shape | window | side | "
        + " | ".join(f"{label} {a} | {label} s | s/{a}" for _, label, _ in FIGURES)
        + " | goal | lost | runs ok |",
        "|---|---|---|" + "---|---|---|" * len(FIGURES) + "---|---|---|",
    ]
    for row in summarise(records, anchor):
        cells = []
        for key, _, digits in FIGURES:
            theirs, ours, ratio = row[key]
            cells += [_num(theirs, digits), _num(ours, digits), _ratio(ratio)]
        ok, total = row["runs"]
        lines.append(
            f"| {row['shape']} | {row['window']} | {row['side']} | {' | '.join(cells)} | "
            f"{_verdict(row, anchor)} | {row['lost']} | {ok}/{total} |"
        )
    return lines


def render_section(results: dict[str, Any], command: str) -> str:
    """The ``stack`` section of ``docs/performance.md``."""
    mach = results["machine"]
    lines = [
        "## Whole stack: dcp's Client and Workers against majortomo's and NATS",
        "",
        "What a user of each library runs: dcp's own `Client` and `Worker`s through `dcp "
        "broker` (trio) against majortomo 0.2.0's own `Client`, `Worker`s and `Broker` "
        "(issue 16) and against nats-server with nats-py's client and services (issue 27), "
        "the same 16 B echo work. Made with:",
        "",
        "```console",
        f"$ {command}",
        "```",
        "",
        f"{results['rounds']} interleaved round(s), {results['duration_s']:.0f} s in all, on "
        f"{mach['date']}. {mach['nproc']} CPUs, {mach['kernel']}; Python {mach['python']}, "
        f"pyzmq {mach['pyzmq']}, libzmq {mach['libzmq']}; dcp commit {mach['commit']}, "
        f"majortomo {mach['versions'].get('majortomo', '?')}{_nats_versions(results)}.",
        "",
        "- Shapes: *1x16*, one worker process serving 16 requests at once (one `dcp.Worker`",
        "  with `concurrency=16`; 16 `majortomo.Worker` threads); *4x1*, four worker",
        "  processes serving one request at a time each.",
        "- *dcp-trio* / *dcp-asyncio*: the backend of dcp's client and workers (the broker is",
        "  `dcp broker` on trio for both). Window *w*: `Client.map_unordered(window=w)`, or",
        "  `Client.request` one at a time for window 1. majortomo's `Client` allows one",
        "  request in flight: window *w* is *w* clients in one process.",
        "- *dcp-trio-prefetch* / *dcp-asyncio-prefetch*: the same with workers that prefetch",
        f"  (`dcp.Worker(prefetch={PREFETCH})`): each asks for {PREFETCH} requests beyond its",
        "  concurrency while its slots are busy, so the next request is waiting when one",
        "  ends (opt-in: a request may wait behind a slow one while another worker is idle;",
        "  docs/reliability.md).",
        "- *nats*: `nats-server` (Debian's package, started on 127.0.0.1, no config file)",
        "  with nats-py on asyncio: one queue subscription per request served at once (16",
        "  in one process; 1 in each of four), and one client connection with *w* tasks",
        "  looping `await nc.request(...)`.",
        "- *X@base* (an A/B run, `--base TREE`): side X's client and workers from another",
        "  source tree (the code before a change), in the same rounds.",
        "- CPU per request from `/proc` (all threads): the client process, the worker",
        "  processes (summed), the broker (`nats-server` for *nats*).",
    ]
    sides = {r["side"] for r in results["stack"]}
    for anchor in ANCHORS:
        if anchor in sides:
            lines += ["", *_table(results["stack"], anchor)]
    for side, why in results.get("skipped", {}).items():
        lines += ["", f"Side *{side}* skipped: {why}."]
    lines += [
        "",
        "Where the time goes, the profiles and what was changed: "
        "[performance-stack.md](performance-stack.md).",
    ]
    return "\n".join(lines) + "\n"


def _nats_versions(results: dict[str, Any]) -> str:
    v = results.get("nats_server")
    return f", nats-server {v['nats-server']}, nats-py {v['nats-py']}" if v else ""


def write_section(page: Path, results: dict[str, Any], command: str) -> None:
    text = page.read_text() if page.exists() else "# Performance\n"
    page.write_text(put_section(text, "stack", render_section(results, command)))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.stack",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--rounds", type=int, default=3)
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--quick", action="store_true", help="shorter loads")
    group.add_argument("--tiny", action="store_true", help="seconds: 1 round, tiny loads")
    parser.add_argument("--page", type=Path, default=ROOT / "docs" / "performance.md")
    parser.add_argument("--no-page", action="store_true", help="print only")
    parser.add_argument(
        "--json", type=Path, default=None,
        help="save the raw records here (default with a page: perf/stack.json beside it)",
    )  # fmt: skip
    parser.add_argument(
        "--render", type=Path, default=None, metavar="JSON",
        help="only rewrite the page section from the records a --json run saved",
    )  # fmt: skip
    parser.add_argument("--sides", default=",".join(SIDES), help="comma-separated subset")
    parser.add_argument(
        "--base", type=Path, default=None,
        help="A/B: also run each dcp side's client and workers from this source tree "
        "(e.g. a `git worktree` of the base revision); prints head / base; implies --no-page",
    )  # fmt: skip
    args = parser.parse_args(argv)
    sides = [x for x in args.sides.split(",") if x]
    if args.base is not None:
        args.no_page = True
        sides += [f"{x}@base" for x in sides if x not in ANCHORS and _in_tree(x, args.base)]
    profile = "tiny" if args.tiny else "quick" if args.quick else "full"
    command = f"python -m benchmarks.stack --rounds {args.rounds}"
    if args.quick:
        command += " --quick"
    if args.tiny:
        args.rounds, args.no_page = 1, True
        command = "python -m benchmarks.stack --tiny"
    if args.base is not None:
        command += f" --sides {','.join(x for x in sides if '@' not in x)} --base {args.base}"
    elif args.sides != ",".join(SIDES):
        command += f" --sides {args.sides}"
    if args.render is not None:
        results = json.loads(args.render.read_text())
    else:
        from .run import exclusive

        # The tiny run (the smoke test) neither waits for nor blocks a real run.
        lock = exclusive(1800.0) if not args.tiny else contextlib.nullcontext()
        with lock, tempfile.TemporaryDirectory(prefix="dcp-bench-stack-") as tmp:
            results = run(args.rounds, profile, Path(tmp), sides=sides, base=args.base)
        results["command"] = command
        if args.json is None and not args.no_page:
            args.json = args.page.parent / "perf" / "stack.json"
        if args.json is not None:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(results, indent=1) + "\n")
    print(render_section(results, results.get("command", command)))
    if any(r["side"].endswith("@base") for r in results["stack"]):
        print(f"A/B: head (this tree) against base ({args.base}):\n")
        print(render_ab(results["stack"]))
    if not args.no_page:
        write_section(args.page, results, results.get("command", command))
        print(f"wrote the stack section of {args.page}", file=sys.stderr)
    failed = [r for r in results["stack"] if "error" in r]
    if failed:
        print(f"{len(failed)} failed runs", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
