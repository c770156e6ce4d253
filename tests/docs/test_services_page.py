"""Every Python example in ``docs/services.md`` runs, as a user would run it, and prints what
the page says it does."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "services.md"
BLOCKS = re.findall(r"```python\n(.*?)```", PAGE.read_text(), flags=re.DOTALL)

EXPECTED = [
    "HI hi\n",
    "2.1.0 approved\nrefused: up needs version 2.x, not '1.9.0'\n",
    "echo 0.1.0 1 1\n200\n",
    "found: True\nBEACON\n",
]


def test_every_block_has_its_expectation() -> None:
    assert len(BLOCKS) == len(EXPECTED)


@pytest.mark.parametrize("index", range(len(EXPECTED)))
def test_docs_example_runs(index: int, tmp_path: Path) -> None:
    script = tmp_path / f"services_doc_{index}.py"
    script.write_text(BLOCKS[index])
    proc = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == EXPECTED[index], proc.stderr
