"""Every example runs, as a user would run it, and prints what it promises."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"

CASES = {
    "broker_trio.py": ["hello -> HELLO", "trio -> TRIO", "requests=3 replies=3"],
    "broker_asyncio.py": ["oicnysa", "oiyna", "pcd"],
    "worker_function.py": ['{"to": 2, "be": 2, "or": 1, "not": 1}'],
    "dag.py": [
        "3 x apple = 1.50",
        "2 x pear = 1.50",
        "10 x plum = 2.00",
        "forwards seen by the broker: 6",
    ],
    "sync_client.py": ["7 squared is 49", "squares: [0, 1, 4, 9, 16, 25, 36, 49, 64, 81]"],
    "secure.py": [
        "alice got HELLO",
        "mallory got no answer: her key is on no list",
        "the worker may not serve payroll",
        "broker refused: registration_refused, zap_denied",
    ],
}


def test_every_example_is_covered() -> None:
    assert sorted(p.name for p in EXAMPLES.glob("*.py")) == sorted(CASES)


@pytest.mark.parametrize("name", sorted(CASES))
def test_example_runs(name: str) -> None:
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / name)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    for expected in CASES[name]:
        assert expected in proc.stdout, (expected, proc.stdout, proc.stderr)


def test_readme_example_runs(tmp_path: Path) -> None:
    """The README's Python example does what its comment says."""
    readme = (EXAMPLES.parent / "README.md").read_text()
    [code] = re.findall(r"```python\n(.*?)```", readme, flags=re.DOTALL)
    script = tmp_path / "readme_example.py"
    script.write_text(code)
    proc = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=30, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "(b'HELLO WORLD',)\n"
