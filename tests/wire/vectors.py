"""Load the DagBox reference frames (``shared/vectors/dagbox-reference-frames.json``).

The file lives outside the repository, in a ``shared/`` directory beside it (that is how CI
checks it out). It is looked up, in order, in ``$DCP_SHARED_DIR/vectors``,
``<repo>/../shared/vectors`` and ``/work/shared/vectors``. Tests that need it skip, saying
where they looked, when it is in none of them.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

import attrs
import pytest

__all__ = [
    "Vector",
    "find_vectors_file",
    "load_vectors",
    "not_found_reason",
    "vector_params",
    "vectors_or_skip",
]

VECTORS_NAME = "dagbox-reference-frames.json"
_REPO = Path(__file__).resolve().parents[2]


@attrs.frozen
class Vector:
    """One captured message.

    :ivar frames: DEALER-side frames, 4-byte (DagBox C++) type frame
    :ivar frames_1byte: the same message with the spec's 1-byte type frame
    :ivar router_frames: what the broker's ROUTER sees, routing id first (``None`` if the
        vector was not captured through a broker)
    :ivar peer_id: the routing id the ROUTER frames start with (``None`` likewise)
    """

    name: str
    direction: str
    frames: tuple[bytes, ...]
    frames_1byte: tuple[bytes, ...]
    router_frames: tuple[bytes, ...] | None
    peer_id: bytes | None


def _candidates() -> list[Path]:
    dirs = []
    env = os.environ.get("DCP_SHARED_DIR")
    if env:
        dirs.append(Path(env))
    dirs += [_REPO.parent / "shared", Path("/work/shared")]
    return [d / "vectors" / VECTORS_NAME for d in dirs]


def find_vectors_file() -> Path | None:
    """The first vectors file that exists, or ``None``."""
    for path in _candidates():
        if path.is_file():
            return path
    return None


def _hex_frames(values: Sequence[str]) -> tuple[bytes, ...]:
    return tuple(bytes.fromhex(v) for v in values)


def load_vectors(path: Path) -> list[Vector]:
    """Parse the vectors file at ``path``."""
    raw = json.loads(path.read_text(encoding="utf-8"))
    out = []
    for v in raw["vectors"]:
        router = v.get("router_side_frames_hex")
        peer = v.get("peer_id_hex")
        out.append(
            Vector(
                name=v["name"],
                direction=v["direction"],
                frames=_hex_frames(v["frames_hex"]),
                frames_1byte=_hex_frames(v["frames_hex_with_1byte_type_as_written_spec"]),
                router_frames=None if router is None else _hex_frames(router),
                peer_id=None if peer is None else bytes.fromhex(peer),
            )
        )
    return out


def not_found_reason() -> str:
    tried = ", ".join(str(p) for p in _candidates())
    return f"DagBox reference vectors not found (set DCP_SHARED_DIR); tried {tried}"


def vectors_or_skip() -> list[Vector]:
    """The vectors, or skip the calling test if the file cannot be found."""
    path = find_vectors_file()
    if path is None:
        pytest.skip(not_found_reason())
    return load_vectors(path)


def vector_params(*, router_side: bool = False) -> list[object]:
    """One ``pytest.param`` per vector, with its name as id.

    :param router_side: only the vectors captured through a broker (with ROUTER frames)

    If the file is missing, a single skipped param that says why (rather than pytest's
    anonymous "got empty parameter set").
    """
    path = find_vectors_file()
    if path is None:
        skip = pytest.mark.skip(reason=not_found_reason())
        return [pytest.param(None, id="no-vectors", marks=skip)]
    vectors = load_vectors(path)
    if router_side:
        vectors = [v for v in vectors if v.router_frames is not None]
    return [pytest.param(v, id=v.name) for v in vectors]
