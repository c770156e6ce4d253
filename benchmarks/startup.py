"""Start-up: what ``import dcp``, ``dcp --version`` and ``dcp call`` cost, from two trees.

``python -m benchmarks.startup [--base REV] [--runs 21] [--page docs/performance.md |
--no-page]``

Each command runs as a fresh interpreter (this one, ``sys.executable``) with
``PYTHONPATH`` set to a source tree: the working tree, and with ``--base`` a checkout of
``REV`` in a temporary ``git worktree`` (removed at the end). The runs are interleaved
(every command of every tree once per round, after one warm-up run each that also writes
the tree's ``__pycache__``). Figures: the median wall-clock time of a run, the median CPU
time (user + system, from ``getrusage``) and the number of modules the process imports
(``python -X importtime``, one more run). ``dcp call`` calls an ``echo`` service of a
``dcp broker`` and a ``dcp worker`` run from the working tree; only the calling process
changes between trees. Writes the ``startup`` section of ``docs/performance.md``
(:mod:`benchmarks.sections`).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from .procs import ROOT
from .sections import put_section

__all__ = ["echo", "main"]

#: What is measured: a label and the interpreter's arguments (``{ep}``: the broker).
COMMANDS = (
    ("python -c pass", ["-c", "pass"]),
    ("python -c 'import anyio, zmq'", ["-c", "import anyio, zmq"]),
    ("python -c 'import anyio, zmq, asyncio'", ["-c", "import anyio, zmq, asyncio"]),
    ("python -c 'import anyio, zmq, trio'", ["-c", "import anyio, zmq, trio"]),
    ("python -c 'import dcp'", ["-c", "import dcp"]),
    ("python -c 'from dcp import *'", ["-c", "from dcp import *"]),
    ("dcp --version", ["-m", "dcp", "--version"]),
    ("dcp call (trio)", ["-m", "dcp", "call", "--connect", "{ep}", "echo", "hi"]),
    (
        "dcp --backend asyncio call",
        ["-m", "dcp", "--backend", "asyncio", "call", "--connect", "{ep}", "echo", "hi"],
    ),
)

_HANDLER = "benchmarks.startup:echo"
_IMPORT_TIME = re.compile(r"^import time:\s+\d+ \|", re.M)


async def echo(request: object) -> bytes:
    """The ``echo`` handler of the ``dcp worker`` that ``dcp call`` calls."""
    return b"hi"


@contextlib.contextmanager
def _tree(rev: str | None) -> Iterator[Path]:
    """A checkout of ``rev`` (``None``: this working tree), removed afterwards."""
    if rev is None:
        yield ROOT
        return
    with tempfile.TemporaryDirectory(prefix="dcp-startup-") as tmp:
        path = Path(tmp) / "tree"
        git = ["git", "-C", str(ROOT)]
        subprocess.run([*git, "worktree", "add", "--detach", "-q", str(path), rev], check=True)
        try:
            yield path
        finally:
            subprocess.run([*git, "worktree", "remove", "--force", str(path)], check=False)


def _env(tree: Path) -> dict[str, str]:
    """The runs' environment: ``tree`` first on the path, and bytecode written and read (an
    installed package has its ``.pyc`` files; ``PYTHONDONTWRITEBYTECODE`` would compile every
    module of every run from source)."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


@contextlib.contextmanager
def _echo_service() -> Iterator[str]:
    """A ``dcp broker`` and a ``dcp worker`` serving ``echo`` (working tree); the endpoint."""
    env = _env(ROOT)
    python = [sys.executable, "-m", "dcp"]
    broker = subprocess.Popen(
        [*python, "broker", "--bind", "tcp://127.0.0.1:0"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    worker: subprocess.Popen[str] | None = None
    try:
        assert broker.stdout is not None
        endpoint = broker.stdout.readline().strip()
        worker = subprocess.Popen(
            [*python, "worker", "--connect", endpoint, "--service", "echo", _HANDLER],
            cwd=ROOT,
            env=env,
            text=True,
        )
        # Ready when a call that waits for a worker is answered.
        wait = [*python, "call", "--connect", endpoint, "--wait", "--timeout", "60", "echo"]
        subprocess.run(wait, cwd=ROOT, env=env, check=True, capture_output=True, timeout=90)
        yield endpoint
    finally:
        for proc in (worker, broker):
            if proc is not None and proc.poll() is None:
                proc.kill()
            if proc is not None:
                proc.wait(timeout=10)


def _run(tree: Path, args: list[str], cwd: str) -> tuple[float, float]:
    """One run: wall-clock and CPU seconds."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, *args], cwd=cwd, env=_env(tree), capture_output=True, timeout=120
    )
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError(f"{args} failed: {done.stderr.decode(errors='replace')[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def _modules(tree: Path, args: list[str], cwd: str) -> int:
    done = subprocess.run(
        [sys.executable, "-X", "importtime", *args],
        cwd=cwd,
        env=_env(tree),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return len(_IMPORT_TIME.findall(done.stderr))


def measure(trees: dict[str, Path], runs: int) -> dict[str, dict[str, dict[str, float]]]:
    """``{command: {side: {"wall_ms", "cpu_ms", "modules"}}}``, medians of ``runs`` runs."""
    samples: dict[tuple[str, str], list[tuple[float, float]]] = {}
    figures: dict[str, dict[str, dict[str, float]]] = {label: {} for label, _ in COMMANDS}
    with _echo_service() as endpoint, tempfile.TemporaryDirectory() as cwd:
        jobs = [
            (label, side, tree, [a.format(ep=endpoint) for a in args])
            for label, args in COMMANDS
            for side, tree in trees.items()
        ]
        for label, side, tree, args in jobs:  # warm-up (and __pycache__)
            _run(tree, args, cwd)
            figures[label][side] = {"modules": _modules(tree, args, cwd)}
        for _ in range(runs):
            for label, side, tree, args in jobs:
                samples.setdefault((label, side), []).append(_run(tree, args, cwd))
    for (label, side), values in samples.items():
        figures[label][side]["wall_ms"] = 1000 * statistics.median(w for w, _ in values)
        figures[label][side]["cpu_ms"] = 1000 * statistics.median(c for _, c in values)
    return figures


#: What the figures say, under the table.
_NOTES = [
    "`import dcp` runs `dcp/__init__.py` and `dcp._version` only: each public name's module "
    "is imported when the name is first used (`dcp.Client`, `from dcp import Worker`). "
    "`from dcp import *` loads the whole API, still without cryptography (imported when a "
    "broker runs with CURVE), trio (when a program runs on trio), asyncio, ssl or the HTTP "
    "stack (hypercorn and prometheus_client, when a broker is given `http=`). `dcp --version` "
    "is answered before any part of the command is imported (no parser, anyio, zmq or "
    "attrs). `dcp call` builds the command's parser (anyio, zmq and attrs, for the options' "
    "checks), then adds the client's modules and the backend it "
    "runs on: the two `import anyio, zmq, BACKEND` rows are its floor, and trio's import is "
    "the largest single part of a call on trio. The rest is the client's modules (attrs "
    "classes, the wire codecs) and the call itself. `tests/test_import_weight.py` keeps what "
    "each of them may load.",
]


def render_section(
    figures: dict[str, dict[str, dict[str, float]]], sides: list[str], command: str, load: str
) -> str:
    """The ``startup`` section of ``docs/performance.md``."""
    lines = [
        "## Start-up: import dcp, dcp --version, dcp call",
        "",
        "What a process pays before it does anything: each command run as a fresh "
        "interpreter, median wall-clock and CPU time, and the modules it imports (`python -X "
        "importtime`). `import dcp` imports each public name's module on first use; trio is "
        "imported only on trio, cryptography only with CURVE, the HTTP stack only with "
        "`http=` (issue 25). Made with:",
        "",
        "```console",
        f"$ {command}",
        "```",
        "",
        f"On {time.strftime('%Y-%m-%d %H:%M %Z')}: {os.cpu_count()} CPUs, "
        f"{platform.system()} {platform.release()}, Python {platform.python_version()}; "
        f"load average {load} (a loaded machine stretches every figure alike).",
        "",
        "| command | "
        + " | ".join(f"{s} wall ms | {s} CPU ms | {s} modules" for s in sides)
        + " |",
        "|---|" + "---|---|---|" * len(sides),
    ]
    for label, by_side in figures.items():
        cells = []
        for side in sides:
            f = by_side[side]
            cells += [f"{f['wall_ms']:.0f}", f"{f['cpu_ms']:.0f}", f"{f['modules']:.0f}"]
        lines.append(f"| `{label}` | " + " | ".join(cells) + " |")
    lines += ["", *_NOTES]
    return "\n".join(lines) + "\n"


def _load() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.startup",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--base", default=None, metavar="REV", help="also measure this revision")
    parser.add_argument("--runs", type=int, default=21)
    parser.add_argument("--page", type=Path, default=ROOT / "docs" / "performance.md")
    parser.add_argument("--no-page", action="store_true", help="print only")
    args = parser.parse_args(argv)
    command = f"python -m benchmarks.startup --runs {args.runs}"
    if args.base:
        command += f" --base {args.base}"
    with contextlib.ExitStack() as stack:
        trees = {}
        if args.base:
            trees[f"base ({args.base})"] = stack.enter_context(_tree(args.base))
        trees["this tree"] = ROOT
        load_before = _load()
        figures = measure(trees, args.runs)
        load = f"{load_before} before, {_load()} after"
    section = render_section(figures, list(trees), command, load)
    print(section)
    if not args.no_page:
        page = args.page
        text = page.read_text() if page.exists() else "# Performance\n"
        page.write_text(put_section(text, "startup", section))


if __name__ == "__main__":
    main()
