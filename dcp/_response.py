"""What a successful call returns, and the outcomes a client's caller can get."""

from __future__ import annotations

import builtins
from typing import Any

import attrs

from ._errors import RemoteError, RequestTimeout
from ._json import decode_json

__all__ = ["Outcome", "Response"]


@attrs.frozen
class Response:
    """A successful reply to a request.

    Most replies have exactly one data part; :attr:`bytes`, :attr:`text` and :meth:`json`
    read it (and raise :exc:`ValueError` if there is not exactly one)::

        response = await client.request("greet", "world")
        print(response.text)

    :ivar data: the reply's data parts
    :ivar metadata: the request's metadata as the worker returned it (dcp's request id
        and request options removed)
    """

    data: tuple[builtins.bytes, ...]
    metadata: tuple[builtins.bytes, ...] = ()

    def _single(self) -> builtins.bytes:
        if len(self.data) != 1:
            raise ValueError(
                f"the response has {len(self.data)} data parts, not exactly one: "
                "read response.data"
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
            raise ValueError(f"the response's data part is not UTF-8: {exc}") from None

    def json(self) -> Any:
        """The one data part, decoded as a UTF-8 JSON document.

        :raises ValueError: not exactly one data part, or not a UTF-8 JSON document
        """
        return decode_json(self._single(), name="the response's data part")

    # Last: in the class body, ``bytes`` below this line is the property.
    @property
    def bytes(self) -> builtins.bytes:
        """The one data part.

        :raises ValueError: not exactly one data part
        """
        return self._single()


#: What a request ends with: its reply, an error reply, or a timeout.
Outcome = Response | RemoteError | RequestTimeout
