"""Every example runs, as a user would run it, and prints what it promises."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import dcp
from tests.cli.procs import Proc, start_broker

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
ROOT = EXAMPLES.parent

CASES = {
    "broker_trio.py": ["hello -> HELLO", "trio -> TRIO", "requests=3 replies=3"],
    "broker_asyncio.py": ["oicnysa", "oiyna", "pcd"],
    "worker_function.py": ["{'to': 2, 'be': 2, 'or': 1, 'not': 1}"],
    "dag.py": [
        "3 x apple = 1.50",
        "2 x pear = 1.50",
        "10 x plum = 2.00",
        "forwards seen by the broker: 6",
    ],
    "streams.py": [
        "parts: ['3', '2', '1', 'liftoff']",
        "request: ['2', '1', 'liftoff']",
        "stopped early: the worker's generator was closed",
    ],
    "sync_client.py": ["7 squared is 49", "squares: [0, 1, 4, 9, 16, 25, 36, 49, 64, 81]"],
    "secure.py": [
        "alice got HELLO",
        "mallory was turned away: the broker refused this client's CURVE key (ZAP status 400)",
        "the worker may not serve payroll",
        "broker refused: registration_refused, zap_denied",
    ],
    "pubsub.py": [
        "orders.eu.paid went to 2 subscriptions",
        "everything: orders.us.new order 2",
        "billing a: order 1",
        "lost 86 ticks before tick 91",
        "total lost: 86",
    ],
    "services.py": [
        "found the broker: True",
        "HELLO",
        "olleh",
        "upper 1.2.0 workers=1: Upper-cases UTF-8 text",
        "reverse 0.3.1 workers=1: Reverses bytes",
        "upper metadata: {'owner': 'text-team'} schema: {'type': 'string'}",
        "upper requests: 1 queued: 0",
        "refused: describe your service (version) first",
    ],
    "tracing.py": [
        "checkout handle  SERVER",
        "charge forward   PRODUCER",
        "charge handle    SERVER",
        "charged 300",
        "traces: 1",
    ],
}

#: Examples that need an optional extra: the module they import.
NEEDS = {"tracing.py": "opentelemetry.sdk"}


#: Examples with their own test below.
OWN_TESTS = {"spark_pipeline.py"}


def _env() -> dict[str, str]:
    """This checkout's ``dcp`` first, whatever is installed (also for the processes an
    example starts, e.g. Spark's executors)."""
    env = dict(os.environ)
    path = env.get("PYTHONPATH")
    env["PYTHONPATH"] = str(ROOT) if not path else os.pathsep.join([str(ROOT), path])
    return env


def test_every_example_is_covered() -> None:
    assert sorted(p.name for p in EXAMPLES.glob("*.py")) == sorted({*CASES, *OWN_TESTS})


@pytest.mark.parametrize("name", sorted(CASES))
def test_example_runs(name: str) -> None:
    if name in NEEDS:
        pytest.importorskip(NEEDS[name], reason=f"{name} needs the otel extra and the SDK")
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / name)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        env=_env(),
    )
    assert proc.returncode == 0, proc.stderr
    for expected in CASES[name]:
        assert expected in proc.stdout, (expected, proc.stdout, proc.stderr)


def test_worker_example_serves_a_broker_until_ctrl_c(procs: list[Proc], tmp_path: Path) -> None:
    """``worker_function.py ENDPOINT`` (its docstring's recipe) serves until Ctrl-C, then
    stops gracefully: exit status 0 and nothing on stderr, not a KeyboardInterrupt
    traceback."""
    _, tcp = start_broker(procs, tmp_path)
    worker = subprocess.Popen(
        [sys.executable, str(EXAMPLES / "worker_function.py"), tcp],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
    )
    try:
        with dcp.SyncClient(tcp, wait_for_worker=True, timeout=20) as client:
            assert client.request("wordcount", "a b a").json() == {"a": 2, "b": 1}
        worker.send_signal(signal.SIGINT)
        out, err = worker.communicate(timeout=20)
        assert (worker.returncode, out, err) == (0, "", "")
    finally:
        worker.kill()
        worker.communicate(timeout=10)


@pytest.mark.parametrize("page", ["README.md", "docs/index.md"])
def test_readme_example_runs(tmp_path: Path, page: str) -> None:
    """The README's Python example (the docs' first page has it too) does what its comment
    says, and names its service in one spelling, ``str``, in the worker and in the client
    (issue 25, finding 6)."""
    text = (ROOT / page).read_text()
    code = re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL)[0]
    assert re.findall(r"""\b(?:Worker|request)\([^)]*?([bB]?)["']shout["']""", code) == ["", ""]
    script = tmp_path / "readme_example.py"
    script.write_text(code)
    proc = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=30, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "HELLO WORLD\n"
    # The README has it saved as mymodule.py for `dcp worker ... mymodule:shout`: imported,
    # it runs nothing (its main only as a script).
    load = "import readme_example as m; print(m.shout.__name__)"
    proc = subprocess.run(
        [sys.executable, "-c", load],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        cwd=tmp_path,
    )
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "shout\n", "")


@pytest.mark.timeout(150)
@pytest.mark.parametrize("kind", ["classic", "connect"])
def test_spark_pipeline_example(tmp_path: Path, kind: str) -> None:
    """The Spark example on a small slice of its dataset (it starts its own JVM), on a
    classic session and with ``--connect`` (its own local Spark Connect server)."""
    from tests.spark.session import connect_missing, java_missing

    reason = java_missing() or (connect_missing() if kind == "connect" else None)
    if reason:
        pytest.skip(reason)
    argv = [sys.executable, str(EXAMPLES / "spark_pipeline.py"), "--rows", "3000",
            "--out", str(tmp_path)]  # fmt: skip
    if kind == "connect":
        argv.append("--connect")
    proc = subprocess.run(
        argv, capture_output=True, text=True, timeout=140, check=False, env=_env()
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert "dataset: 3,000 lines of the Python standard library" in out, out
    session = "Spark Connect" if kind == "connect" else "classic"
    assert f"spark: {session} session, local mode" in out, out
    assert re.search(r"rows: 3,000 in [\d.]+ s: [\d,]+ rows/s through normalise -> score", out)
    errors = re.search(r"errors: ([\d,]+)", out)
    assert errors is not None, out
    assert "most complex lines:" in out
    import pyarrow.parquet as pq

    table = pq.read_table(tmp_path / "scored")
    assert table.num_rows == 3000
    assert set(table.column_names) == {
        "path", "lineno", "line", "text", "tokens", "keywords", "score", "error"
    }  # fmt: skip
    rows = table.to_pylist()
    # Lines longer than the example's limit (which depends on this Python's stdlib) are
    # per-row errors; every other row is scored.
    long = [r for r in rows if len(" ".join(r["line"].split())) > 120]
    assert int(errors.group(1).replace(",", "")) == len(long)
    assert all("line too long" in r["error"] and r["score"] is None for r in long)
    assert all(r["error"] is None and r["text"] == " ".join(r["line"].split()).lower()
               for r in rows if r not in long)  # fmt: skip
