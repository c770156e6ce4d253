"""The JSON codec dcp's helpers share (clients' :meth:`~dcp.Client.request_json` and
:meth:`~dcp.Response.json`, and the worker's JSON handlers): one UTF-8 JSON document per part.

What dcp writes is strict JSON, so that every peer, in any language, reads it: no ``NaN`` or
``Infinity``, compact separators, non-ASCII characters written as themselves (UTF-8). What it
reads is whatever Python's :func:`json.loads` accepts, from UTF-8 only.

JSON read from the network goes through :func:`decode_json_limited`, which checks the
document's size, then its nesting depth and element count on the raw bytes, before anything
is parsed (Python's parser keeps up to about 31 bytes per input byte of ``[[]],``-style
input, and raises :exc:`RecursionError` on about 1,000 levels of nesting).
"""

from __future__ import annotations

import itertools
import json
import re
from typing import Any

__all__ = ["JsonLimitError", "decode_json", "decode_json_limited", "encode_json"]

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
    :raises ValueError: ``data`` is not UTF-8, or not one JSON document (or one nested too
        deep for Python's parser)
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"{name} must be bytes, not {type(data).__name__}")
    try:
        return json.loads(bytes(data).decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ValueError(f"{name} is not UTF-8: {exc}") from None
    except ValueError as exc:
        raise ValueError(f"{name} is not a JSON document: {exc}") from None
    except RecursionError:  # about 1,000 levels of nesting
        raise ValueError(f"{name} nests too deep to be read") from None


class JsonLimitError(ValueError):
    """A JSON document over one of :func:`decode_json_limited`'s limits (it was not parsed)."""


#: A JSON string (what may hold brackets and commas that are not structure).
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
#: Structure characters, once strings are taken out.
_STRUCTURE = re.compile(rb"[^\[\]{}]+")
_DEPTH = {ord("["): 1, ord("{"): 1, ord("]"): -1, ord("}"): -1}


def decode_json_limited(
    data: bytes | bytearray | memoryview,
    *,
    max_bytes: int,
    max_depth: int = 32,
    max_items: int = 10_000,
    name: str = "data",
) -> Any:
    """The object of the UTF-8 JSON document ``data``, read from the network: its size is
    checked first, then (on the raw bytes, strings left out) its nesting depth and its number
    of elements (values in arrays and objects, and the containers themselves); only a
    document within all three is parsed. A document that is not valid JSON may be refused
    for a limit rather than for its syntax.

    :param max_bytes: the largest document accepted, in bytes
    :param max_depth: the most arrays and objects nested in one another
    :param max_items: the most elements, all containers together
    :param name: what to call ``data`` in error messages
    :raises JsonLimitError: ``data`` is over a limit (nothing was parsed)
    :raises ValueError: ``data`` is not UTF-8, or not one JSON document
    """
    size = len(data)
    if size > max_bytes:
        raise JsonLimitError(f"{name} is {size} bytes; the limit is {max_bytes}")
    raw = bytes(data)
    if b'"' in raw:
        raw = _STRING.sub(b'""', raw)
    containers = raw.count(b"[") + raw.count(b"{")
    if containers:
        items = containers + raw.count(b",")
        if items > max_items:
            raise JsonLimitError(f"{name} has over {max_items} elements ({items})")
        depth = max(itertools.accumulate(map(_DEPTH.__getitem__, _STRUCTURE.sub(b"", raw))))
        if depth > max_depth:
            raise JsonLimitError(f"{name} nests {depth} deep; the limit is {max_depth}")
    return decode_json(data, name=name)
