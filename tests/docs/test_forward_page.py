"""Every Python example in ``docs/forward.md`` runs, as a user would run it, and prints what
the page says it does (issue 25, finding 3: a topic page for ``Forward``)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "forward.md"
TEXT = PAGE.read_text()
BLOCKS = re.findall(r"```python\n(.*?)```", TEXT, flags=re.DOTALL)
PRINTED = re.findall(r"```text\n(.*?)```", TEXT, flags=re.DOTALL)

EXPECTED = [
    "4 words\n",
    "scene (planned) (rendered)\n{'plan': 1, 'render': 1} True\n",
    PRINTED[0],
]


def test_every_block_has_its_expectation() -> None:
    assert len(BLOCKS) == len(EXPECTED)
    assert PRINTED[0].startswith("no worker serves 'nobody' (nf -> nobody)\n")


@pytest.mark.parametrize("index", range(len(EXPECTED)))
def test_docs_example_runs(index: int, tmp_path: Path) -> None:
    script = tmp_path / f"forward_doc_{index}.py"
    script.write_text(BLOCKS[index])
    proc = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == EXPECTED[index], proc.stderr
