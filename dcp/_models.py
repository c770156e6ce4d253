"""What users hold: what a successful call returns (:class:`Response`) and the outcomes a
client's caller can get; what a handler sees of a request (:class:`HandlerRequest`) and its
answer that passes the request on (:class:`Forward`)."""

from __future__ import annotations

import builtins
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from typing import Any, ClassVar, TypeAlias

import attrs

from dcp._errors import RemoteError, RequestTimeout
from dcp._json import decode_json, encode_json
from dcp._util import to_bytes
from dcp.wire.messages import Request
from dcp.wire.options import OPTION_PREFIX

__all__ = [
    "AsyncHandler",
    "Forward",
    "Handler",
    "HandlerRequest",
    "HandlerResult",
    "OnePart",
    "Outcome",
    "Response",
    "StreamHandler",
    "handler_view",
    "json_reply",
    "service_name",
]


class OnePart:
    """Readers of the one data part most messages have (a mixin of :class:`Response` and
    :class:`~dcp.HandlerRequest`): :attr:`bytes`, :attr:`text` and :meth:`json` raise
    :exc:`ValueError` if there is not exactly one."""

    __slots__ = ()
    #: What the message is called in error messages.
    _what: ClassVar[str] = "message"
    data: tuple[builtins.bytes, ...]

    def _single(self) -> builtins.bytes:
        if len(self.data) != 1:
            raise ValueError(
                f"the {self._what} has {len(self.data)} data parts, not exactly one: "
                f"read {self._what}.data"
            )
        return self.data[0]

    @property
    def text(self) -> str:
        """The one data part, decoded as UTF-8.

        :raises ValueError: not exactly one data part, or not UTF-8
        """
        try:
            return self._single().decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ValueError(f"the {self._what}'s data part is not UTF-8: {exc}") from None

    def json(self) -> Any:
        """The one data part, decoded as a UTF-8 JSON document.

        :raises ValueError: not exactly one data part, or not a UTF-8 JSON document
        """
        return decode_json(self._single(), name=f"the {self._what}'s data part")

    # Last: in the class body, ``bytes`` below this line is the property.
    @property
    def bytes(self) -> builtins.bytes:
        """The one data part.

        :raises ValueError: not exactly one data part
        """
        return self._single()


@attrs.frozen
class Response(OnePart):
    """A successful reply to a request.

    Most replies have exactly one data part; :attr:`bytes`, :attr:`text` and :meth:`json`
    read it (and raise :exc:`ValueError` if there is not exactly one)::

        response = await client.request("greet", "world")
        print(response.text)

    :ivar data: the reply's data parts
    :ivar metadata: the request's metadata as the worker returned it (dcp's request id
        and request options removed)
    """

    _what: ClassVar[str] = "response"
    data: tuple[builtins.bytes, ...]
    metadata: tuple[builtins.bytes, ...] = ()


#: What a request ends with: its reply, an error reply, or a timeout.
Outcome = Response | RemoteError | RequestTimeout


def service_name(wire: builtins.bytes) -> str:
    """A service name from the wire as the API shows it: UTF-8, with ``surrogateescape`` for
    bytes that are not (``name.encode("utf-8", "surrogateescape")`` gives them back)."""
    return wire.decode("utf-8", "surrogateescape")


def _name(value: str | builtins.bytes) -> str:
    if value.__class__ is str:  # the common case (every request a worker sees), first
        return value
    if isinstance(value, str):
        return str(value)
    return service_name(to_bytes(value, "a service name"))


def _part(value: object) -> builtins.bytes:
    if isinstance(value, str):
        return value.encode()
    return to_bytes(value, "a data part")


@attrs.frozen(init=False)
class Forward:
    """A handler's answer that passes the request on to another service (the DAG).

    The worker sends a REQUEST for ``service`` carrying the original client address and the
    original metadata, unchanged, so the final reply goes straight to the client and still
    names its request (dcp clients match replies by the first metadata part), and so the
    broker knows which request the forward finishes. There is deliberately no way to change
    the metadata on the way.

    ``Forward("stats", "text", b"raw")``: a ``str`` data part is sent as UTF-8, as by the
    clients.

    :ivar service: the service that handles the rest of the request
    :ivar data: the data parts of the new request
    """

    service: str
    data: tuple[builtins.bytes, ...]

    def __init__(self, service: str | builtins.bytes, *data: str | builtins.bytes) -> None:
        self.__attrs_init__(_name(service), tuple(_part(part) for part in data))


def _tuple_of_bytes(value: Iterable[builtins.bytes]) -> tuple[builtins.bytes, ...]:
    return tuple(value)


@attrs.frozen
class HandlerRequest(OnePart):
    """A request as a worker's handler sees it.

    :attr:`service` is the name the worker serves, as a ``str``; :attr:`metadata` holds the
    caller's own parts only; dcp's parts (every part starting with ``\\xffDCP:``: a dcp
    client's request id, ``\\xffDCP:id=...``, and request options such as ``work-timeout``
    and ``expires-in``) are in :attr:`dcp_metadata`, in the order they came. :attr:`text`,
    :attr:`bytes` and :meth:`json` read its one data part, as on a :class:`~dcp.Response`.
    The worker answers (and forwards) with the request's metadata exactly as it arrived,
    whatever the handler sees.

    :ivar service: the service the request is for (UTF-8 on the wire; a name that is not
        UTF-8 is decoded with ``surrogateescape``)
    :ivar client: the address the answer goes to (the broker's business)
    :ivar metadata: the caller's own metadata parts
    :ivar data: the request's data parts
    :ivar dcp_metadata: dcp's metadata parts, removed from :attr:`metadata`
    """

    _what: ClassVar[str] = "request"
    service: str = attrs.field(converter=_name)
    client: builtins.bytes | None = None
    metadata: tuple[builtins.bytes, ...] = attrs.field(default=(), converter=_tuple_of_bytes)
    data: tuple[builtins.bytes, ...] = attrs.field(default=(), converter=_tuple_of_bytes)
    dcp_metadata: tuple[builtins.bytes, ...] = attrs.field(default=(), converter=_tuple_of_bytes)


def handler_view(request: Request, service: str | None = None) -> HandlerRequest:
    """What the handler of ``request`` sees (:class:`HandlerRequest`).

    :param service: the request's service as a ``str``, if the caller knows it already
    """
    own: list[builtins.bytes] = []
    dcp: list[builtins.bytes] = []
    for part in request.metadata:
        (dcp if part[:1] == b"\xff" and part.startswith(OPTION_PREFIX) else own).append(part)
    name = service_name(request.service) if service is None else service
    return HandlerRequest(name, request.client, own, request.data, dcp)


def json_reply(obj: Any) -> builtins.bytes:
    """``obj`` as one UTF-8 JSON data part: what a handler returns (or yields, or puts in a
    sequence of parts) for a caller of :meth:`dcp.Client.request_json`, which reads it back.

    ::

        async def add(request: dcp.HandlerRequest) -> bytes:
            numbers = request.json()
            return dcp.json_reply({"sum": numbers["a"] + numbers["b"]})

    It writes what the clients write: strict JSON (no ``NaN`` or infinities), compact,
    non-ASCII characters as themselves.

    :raises TypeError: ``obj`` holds something JSON cannot represent (e.g. a ``set``, bytes)
    :raises ValueError: ``obj`` holds ``NaN`` or an infinity, or a circular reference
    """
    return encode_json(obj, name="the reply")


#: What a handler may return: a data part (``bytes``, or ``str`` sent as UTF-8), a sequence of
#: them, or a :class:`~dcp.Forward`.
HandlerResult: TypeAlias = builtins.bytes | str | Sequence[builtins.bytes | str] | Forward
AsyncHandler: TypeAlias = Callable[[HandlerRequest], Awaitable[HandlerResult]]
#: ``async def handler(request: dcp.HandlerRequest) -> bytes | str | Sequence | dcp.Forward``,
#: or the same as a plain ``def`` (run in a worker thread).
#: ``async def handler(request)`` with ``yield``: a stream handler (docs/streams.md).
StreamHandler: TypeAlias = Callable[[HandlerRequest], AsyncIterator[Any]]
Handler: TypeAlias = AsyncHandler | Callable[[HandlerRequest], HandlerResult] | StreamHandler
