"""The shared JSON codec (``dcp._json``) and :class:`dcp.Response`'s single-part accessors."""

from __future__ import annotations

import json
import math

import pytest

import dcp
from dcp import Response
from dcp._json import decode_json, encode_json


def test_encode_is_compact_strict_utf8_and_decode_reverses_it() -> None:
    obj = {"name": "Zoë", "n": [1, 2.5, None, True], "nested": {"empty": []}}
    data = encode_json(obj)
    assert data == '{"name":"Zoë","n":[1,2.5,null,true],"nested":{"empty":[]}}'.encode()
    assert decode_json(data) == obj
    assert decode_json(bytearray(b"[1]")) == [1]
    assert decode_json(memoryview(b'"x"')) == "x"


@pytest.mark.parametrize(
    ("obj", "error"),
    [({1, 2}, TypeError), (b"raw", TypeError), (math.nan, ValueError), ([math.inf], ValueError)],
)
def test_encode_errors_name_the_argument(obj: object, error: type[Exception]) -> None:
    with pytest.raises(error, match=r"^obj is not JSON-serialisable"):
        encode_json(obj)
    with pytest.raises(error, match=r"^payload is not JSON-serialisable"):
        encode_json(obj, name="payload")


def test_encode_refuses_circular_references_and_lone_surrogates() -> None:
    loop: list[object] = []
    loop.append(loop)
    with pytest.raises(ValueError, match="obj is not JSON-serialisable"):
        encode_json(loop)
    with pytest.raises(ValueError, match="obj is not JSON-serialisable"):
        encode_json("\ud800")


def test_decode_errors_name_the_argument() -> None:
    with pytest.raises(ValueError, match=r"^data is not UTF-8"):
        decode_json(b'"\xff"')
    with pytest.raises(ValueError, match=r"^data is not a JSON document"):
        decode_json(b"{nope")
    with pytest.raises(ValueError, match=r"^data is not a JSON document"):
        decode_json(b"")
    with pytest.raises(TypeError, match=r"^reply must be bytes, not str"):
        decode_json("[]", name="reply")  # type: ignore[arg-type]


def test_response_single_part_accessors() -> None:
    r = Response((b'{"ok": true}',), (b"m",))
    assert r.bytes == b'{"ok": true}'
    assert r.text == '{"ok": true}'
    assert r.json() == {"ok": True}
    assert Response(("é".encode(),)).text == "é"
    assert Response((b"",)).bytes == b""


@pytest.mark.parametrize("data", [(), (b"a", b"b")])
def test_response_accessors_need_exactly_one_part(data: tuple[bytes, ...]) -> None:
    r = Response(data)
    message = f"the response has {len(data)} data parts, not exactly one"
    with pytest.raises(ValueError, match=message):
        r.bytes  # noqa: B018
    with pytest.raises(ValueError, match=message):
        r.text  # noqa: B018
    with pytest.raises(ValueError, match=message):
        r.json()


def test_response_text_and_json_errors() -> None:
    with pytest.raises(ValueError, match="the response's data part is not UTF-8"):
        Response((b"\xff",)).text  # noqa: B018
    with pytest.raises(ValueError, match="the response's data part is not a JSON document"):
        Response((b"not json",)).json()


@pytest.mark.anyio
async def test_json_from_call_to_handler_and_back() -> None:
    """``request_json`` sends one JSON part; the handler reads it with ``request.json()`` and
    answers with ``json.dumps(...)``; the caller gets the object back."""

    async def add(request: dcp.HandlerRequest) -> bytes:
        numbers = request.json()
        return json.dumps({"sum": sum(numbers), "text": request.text}).encode()

    async with (
        dcp.Broker("tcp://127.0.0.1:0") as broker,
        dcp.Worker(broker.endpoints[0], "add", add),
        dcp.Client(broker.endpoints[0], timeout=5) as client,
    ):
        assert await client.request_json("add", [1, 2, 39]) == {"sum": 42, "text": "[1,2,39]"}
