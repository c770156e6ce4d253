"""Running a benchmark module as a real subprocess, for the benchmark smoke tests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

__all__ = ["ROOT", "run_module"]

#: The repository's root (the benchmarks package lives there).
ROOT = Path(__file__).resolve().parents[2]


def run_module(module: str, *args: object, timeout: float) -> subprocess.CompletedProcess[str]:
    """``python -m module args`` from the repository's root (with it on ``PYTHONPATH``), no
    stdin, output captured; fails the test with the end of its stderr unless it exits 0."""
    env = dict(os.environ)
    path = env.get("PYTHONPATH")
    env["PYTHONPATH"] = str(ROOT) if not path else os.pathsep.join([str(ROOT), path])
    proc = subprocess.run(
        [sys.executable, "-m", module, *map(str, args)],
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc
