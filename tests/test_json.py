"""``dcp._json``: JSON read from the network is checked (size, then depth and elements on the
raw bytes) before it is parsed."""

from __future__ import annotations

import json
from typing import Any

import pytest

from dcp._json import JsonLimitError, decode_json, decode_json_limited


def test_a_document_within_the_limits_is_parsed() -> None:
    doc = b'{"a": "[[[[,,,\\"]]]]{{", "b": [1, 2, {"c": []}], "d": "\\\\"}'
    assert decode_json_limited(doc, max_bytes=len(doc), max_depth=4, max_items=8) == {
        "a": '[[[[,,,"]]]]{{',
        "b": [1, 2, {"c": []}],
        "d": "\\",
    }
    assert decode_json_limited(b"7", max_bytes=1, max_depth=0, max_items=0) == 7


@pytest.mark.parametrize(
    ("doc", "match"),
    [
        (b"[" * 33 + b"]" * 33, "nests 33 deep"),
        (b"[" + b"0," * 10_000 + b"0]", "over 10000 elements"),
        (b'{"a": [' + b"{}," * 5_000 + b"{}]}", "over 10000 elements"),
        (b" " * 101, "101 bytes; the limit is 100"),
    ],
)
def test_a_document_over_a_limit_is_refused_without_being_parsed(
    doc: bytes, match: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def parse(*args: Any, **kwargs: Any) -> Any:  # pragma: no cover - the point of the test
        raise AssertionError("parsed")

    monkeypatch.setattr(json, "loads", parse)
    max_bytes = 100 if len(doc) == 101 else 1 << 20
    with pytest.raises(JsonLimitError, match=match):
        decode_json_limited(doc, max_bytes=max_bytes)


def test_invalid_documents_are_value_errors() -> None:
    for doc in (b"\xff", b"[", b'"unterminated [[[[', b"{} {}"):
        with pytest.raises(ValueError, match="not"):
            decode_json_limited(doc, max_bytes=100)


def test_nesting_past_pythons_parser_is_a_value_error() -> None:
    # json.loads raises RecursionError at about 1,000 levels: not a ValueError.
    with pytest.raises(ValueError, match="nests too deep"):
        decode_json(b"[" * 100_000 + b"]" * 100_000)
