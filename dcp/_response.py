"""What a successful call returns, and the outcomes a client's caller can get."""

from __future__ import annotations

import builtins
from typing import Any, ClassVar

import attrs

from ._errors import RemoteError, RequestTimeout
from ._json import decode_json

__all__ = ["OnePart", "Outcome", "Response"]


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
