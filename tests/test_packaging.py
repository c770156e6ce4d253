"""What ``pip install dagbox-dcp`` gets: the LICENSE in the sdist and the wheel, and the
project's URLs in the metadata (issue 25, finding 10). Builds both with ``python -m build``
(the sdist, then the wheel from it, as a user's pip does from PyPI); the build backend comes
from the package index, as in any isolated build."""

from __future__ import annotations

import email
import importlib.util
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from dcp._cli._docs import DOCS_URL
from dcp._version import __version__
from tests.cli.procs import ROOT


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if importlib.util.find_spec("build") is None:
        pytest.fail("python -m build is missing: scripts/bootstrap installs it (the dev extra)")
    out = tmp_path_factory.mktemp("dist")
    done = subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(out), str(ROOT)],
        # not from the repository's root: its build/ folder (scripts/docs writes there)
        # would shadow the build package for ``python -m``
        cwd=out,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out


def test_the_repository_has_the_mit_license() -> None:
    text = (ROOT / "LICENSE").read_text()
    assert text.startswith("MIT License\n")
    assert "Copyright (c) " in text and "dcp developers" in text


def test_the_sdist_carries_the_license(dist: Path) -> None:
    [sdist] = dist.glob("*.tar.gz")
    with tarfile.open(sdist) as tar:
        license_file = tar.extractfile(f"dagbox_dcp-{__version__}/LICENSE")
        assert license_file is not None
        assert license_file.read() == (ROOT / "LICENSE").read_bytes()


def test_the_wheel_carries_the_license_and_the_urls(dist: Path) -> None:
    [wheel] = dist.glob("*.whl")
    info = f"dagbox_dcp-{__version__}.dist-info"
    with zipfile.ZipFile(wheel) as zf:
        assert zf.read(f"{info}/licenses/LICENSE") == (ROOT / "LICENSE").read_bytes()
        metadata = email.message_from_bytes(zf.read(f"{info}/METADATA"))
    assert metadata["License-Expression"] == "MIT"
    assert metadata.get_all("License-File") == ["LICENSE"]
    urls = dict(url.split(", ", 1) for url in metadata.get_all("Project-URL") or [])
    assert set(urls) == {"Documentation", "Source", "Issues", "Changelog"}
    assert all(url.startswith("https://") for url in urls.values())
    # The links in the dcp command's help lead to the same site.
    assert urls["Documentation"] == DOCS_URL
