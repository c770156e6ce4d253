"""The window of the clients' maps (``map``, ``map_unordered``, ``map_outcomes`` of both
clients): a pure state machine. It says which input to send next, which outcomes may be
yielded, and what is left; the drivers (:mod:`dcp._client.maps`) send, wait and yield.

Rules:

Rule WN1 - Room. At most ``size`` requests are outstanding: sent, their outcome not yet
  yielded. A new input is taken (so checked) before the window looks for room, and given out
  to be sent only when that leaves room (so at most ``size`` outcomes are buffered).
Rule WN5 - Order. An ordered window yields outcomes in input order (the oldest outstanding one,
  once it arrived); an unordered one the outcome that arrived first. Inputs are sent in
  input order, a new one as soon as there is room, before more outcomes are yielded.

What the window does NOT do: send, wait, check the inputs (the drivers do, see
:func:`~dcp._core.client.calls.payload_parts`), or forget requests (it tells which are left:
:meth:`Window.outstanding`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, MutableMapping
from typing import Generic, TypeVar

from dcp._core.client.calls import check_window

__all__ = ["Window"]

P = TypeVar("P")
O = TypeVar("O")  # noqa: E741 (the outcome type)


class Window(Generic[P, O]):
    """One map's window over its ``inputs`` (see the module rules).

    The driver takes :meth:`next_input` while it gives one, sends it and reports its request
    id with :meth:`sent`; outcomes arrive in :attr:`arrived` (the driver, or whoever receives
    them, puts them there by request id); :meth:`next_result` gives what may be yielded;
    :attr:`finished` says when all is done.

    :param inputs: the map's inputs (each sent as one request)
    :param size: most requests outstanding at once (>= 1)
    :param ordered: yield in input order (else in arrival order)
    :param arrived: where outcomes arrive by request id (default: a new dict); it may hold
        other requests' outcomes too, which the window leaves alone
    """

    __slots__ = (
        "_exhausted",
        "_inflight",
        "_inputs",
        "_room",
        "_staged",
        "arrived",
        "finished",
        "ordered",
        "size",
    )

    def __init__(
        self,
        inputs: Iterable[P],
        size: int,
        *,
        ordered: bool,
        arrived: MutableMapping[bytes, O] | None = None,
    ) -> None:
        check_window(size)
        self.size = size
        self.ordered = ordered
        #: Outcomes that arrived, by request id (not yet yielded).
        self.arrived: MutableMapping[bytes, O] = {} if arrived is None else arrived
        #: No input left, and every outcome yielded.
        self.finished = False
        self._inputs: Iterator[tuple[int, P]] = enumerate(inputs)
        #: The input taken but not yet given out (Rule WN1: no room for it yet).
        self._staged: tuple[int, P] | None = None
        self._exhausted = False
        #: Outstanding requests (sent, outcome not yielded): id -> input index, oldest first.
        self._inflight: dict[bytes, int] = {}
        #: ``size`` less the outstanding requests (a counter: no call on the hot path).
        self._room = size

    def next_input(self) -> tuple[int, P] | None:
        """The next input to send and its index, if there is room for it (Rule WN1);
        ``None``: the window is full, or no input is left. Taking an input can raise what
        the inputs' iterator raises."""
        staged = self._staged
        if staged is None:
            if self._exhausted:
                return None
            staged = next(self._inputs, None)
            if staged is None:
                self._exhausted = True
                self.finished = not self._inflight
                return None
        if self._room <= 0:
            self._staged = staged
            return None
        self._staged = None
        return staged

    def sent(self, rid: bytes, index: int) -> None:
        """The input number ``index`` went out as request ``rid``."""
        self._inflight[rid] = index
        self._room -= 1

    def next_result(self) -> tuple[int, O] | None:
        """An outcome that may be yielded now, with its input's index (Rule WN5), taken out
        of the window; ``None``: none yet."""
        arrived = self.arrived
        if not arrived:
            return None
        inflight = self._inflight
        if self.ordered:
            for rid in inflight:  # only the oldest outstanding request (no iter/next calls)
                if rid in arrived:
                    break
                return None
            else:
                return None
        else:
            for rid in arrived:  # the first to arrive (``arrived`` may hold others' too)
                if rid in inflight:
                    break
            else:
                return None
        self._room += 1
        result = inflight.pop(rid), arrived.pop(rid)
        if not inflight and self._exhausted:
            self.finished = True
        return result

    def outstanding(self) -> list[bytes]:
        """The requests sent whose outcome was not yielded (to forget when the map ends
        early), oldest first."""
        return list(self._inflight)

    def __len__(self) -> int:
        """How many requests are outstanding."""
        return len(self._inflight)
