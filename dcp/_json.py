"""The JSON codec dcp's helpers share (clients' :meth:`~dcp.Client.request_json` and
:meth:`~dcp.Response.json`, and the worker's JSON handlers): one UTF-8 JSON document per part.

What dcp writes is strict JSON, so that every peer, in any language, reads it: no ``NaN`` or
``Infinity``, compact separators, non-ASCII characters written as themselves (UTF-8). What it
reads is whatever Python's :func:`json.loads` accepts, from UTF-8 only.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["decode_json", "encode_json"]

_encoder = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))


def encode_json(obj: Any, *, name: str = "obj") -> bytes:
    """``obj`` as one UTF-8 JSON document.

    :param name: what to call ``obj`` in error messages
    :raises TypeError: ``obj`` holds something JSON cannot represent (e.g. a ``set``, bytes)
    :raises ValueError: ``obj`` holds ``NaN`` or an infinity, or a circular reference
    """
    try:
        return _encoder.encode(obj).encode("utf-8")
    except TypeError as exc:
        raise TypeError(f"{name} is not JSON-serialisable: {exc}") from None
    except ValueError as exc:  # NaN, infinities, circular references, lone surrogates
        raise ValueError(f"{name} is not JSON-serialisable: {exc}") from None


def decode_json(data: bytes | bytearray | memoryview, *, name: str = "data") -> Any:
    """The object of the UTF-8 JSON document ``data``.

    :param name: what to call ``data`` in error messages
    :raises TypeError: ``data`` is not bytes-like
    :raises ValueError: ``data`` is not UTF-8, or not one JSON document
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"{name} must be bytes, not {type(data).__name__}")
    try:
        return json.loads(bytes(data).decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ValueError(f"{name} is not UTF-8: {exc}") from None
    except ValueError as exc:
        raise ValueError(f"{name} is not a JSON document: {exc}") from None
