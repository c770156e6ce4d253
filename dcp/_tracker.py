"""The client's request tracker: a pure state machine (sans-IO).

It numbers requests, builds their frames, matches replies to them, and decides when to resend
and when to give up. It knows nothing of sockets, anyio or clocks: every call that depends on
time takes ``now`` (seconds, any monotonic clock), and the driver (:class:`dcp.Client`,
:class:`dcp.SyncClient`) sends what it is told to and wakes it at :meth:`next_deadline`.

Output convention (the same for every dcp core): input methods take ``now`` and append the
frames to send to :attr:`RequestTracker.outbox`; the driver drains it after each call or batch
(``out, tracker.outbox = tracker.outbox, []``). Only what is sent goes there: a method's own
answer (:meth:`~RequestTracker.request`'s id, :meth:`~RequestTracker.receive`'s outcome,
:meth:`~RequestTracker.expire`'s failed requests) is its return value.

Rules:

Rule 1 - Ids. Every request gets a 16-byte id: 8 random bytes per tracker, then an 8-byte
  big-endian counter. The id is the *first* metadata part of the request; the user's metadata
  follows. Workers copy metadata into the reply (the spec says so), so the reply's first
  metadata part names its request. Resends carry the same id.
Rule 2 - Replies. A reply whose id is pending completes it: a dcp error reply (see
  :func:`~dcp._messages.parse_error_reply`) as :class:`~dcp.RemoteError`, anything else as a
  :class:`Response`. A reply for an id that completed recently is a *duplicate* (e.g. both
  the original and a resend were answered); one for an id that timed out or was cancelled
  recently is *late*; any other is *unknown*. All three are counted and dropped. The last
  ``remember`` finished ids are remembered for this. Frames that are not a DCP reply with an
  id are counted as *malformed* by reason and dropped. Nothing raises out of
  :meth:`RequestTracker.receive`.
Rule 3 - Timeouts. Each attempt has ``timeout`` seconds to be answered. When attempt ``k``
  (``k = 1`` for the first send) times out and fewer than ``retries`` resends were made, the
  request waits a backoff delay, then is resent with the same id::

      cap   = min(backoff_max, backoff * backoff_factor ** (k - 1))
      delay = cap * (1 - jitter * u)        # u uniform in [0, 1), from ``rng``

  so ``delay`` is in ``(cap * (1 - jitter), cap]``. A reply that arrives during the backoff
  delay (to the earlier attempt) still completes the request. When the last attempt times
  out, the request fails with :class:`~dcp.RequestTimeout`. Worst case until then:
  ``(retries + 1) * timeout`` plus the delays. ``timeout=math.inf`` never times out.
Rule 4 - Cancel. :meth:`RequestTracker.cancel` forgets a request at once; a later reply to it
  is late.

Deadlines live in a heap with lazy deletion: finishing a request does not touch the heap; a
stale entry is skipped when it reaches the top. The heap is rebuilt from the pending requests
when stale entries outnumber them (amortised O(1) per request), so memory stays bounded.

What the tracker does NOT do: send anything, read clocks, wait, limit how many requests are
in flight (the drivers' ``map`` does), or de-duplicate work on the worker side (a slow
worker and a resend can both run a request: services should be idempotent).
"""

from __future__ import annotations

import builtins
import math
import os
import random
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from ._errors import RemoteError, RemoteProtocolError, RequestTimeout
from ._json import decode_json
from ._messages import OPTION_PREFIX, Reply, Request, parse_error_reply
from ._util import DeadlineHeap
from .wire.dcp1 import check_type_width, parse, serialize

__all__ = [
    "ClientStatistics",
    "Outcome",
    "RequestTracker",
    "Response",
]


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


@attrs.frozen
class ClientStatistics:
    """Counters of a client (its tracker and its driver), from ``statistics()``."""

    #: Requests started.
    requests: int
    #: Requests answered with a result (a :class:`Response`).
    replies: int
    #: Requests answered with a dcp error reply (:class:`~dcp.RemoteError`).
    errors: int
    #: Resends after a timed-out attempt.
    retries: int
    #: Requests that failed with :class:`~dcp.RequestTimeout`.
    timeouts: int
    #: Requests cancelled before an answer.
    cancelled: int
    #: Replies for a request that had already been answered.
    duplicates: int
    #: Replies for a request that had timed out or been cancelled.
    late: int
    #: Replies for an id this client does not know (or no longer remembers).
    unknown: int
    #: Incoming messages dropped because they are not a DCP reply with an id, by reason.
    malformed: Mapping[str, int]
    #: Requests waiting for an answer now.
    pending: int
    #: Sends that found zmq's queue full (high-water mark) and had to wait.
    send_waits: int = 0
    #: Resends not made because zmq's queue was full (the attempt then times out again).
    resends_dropped: int = 0


#: How a request ended: a result, an error reply, or a timeout.
Outcome = Response | RemoteError | RequestTimeout


class _Pending:
    """One request awaiting its answer."""

    __slots__ = ("attempt", "deadline", "frames", "gen", "resending", "retries", "timeout")

    def __init__(self, frames: list[bytes], timeout: float, retries: int) -> None:
        self.frames = frames
        self.timeout = timeout
        self.retries = retries
        #: Attempts sent so far.
        self.attempt = 1
        self.deadline = math.inf
        #: Matches the heap entry that is this request's live deadline.
        self.gen = 0
        #: True while waiting out a backoff delay before the next attempt.
        self.resending = False


class RequestTracker:
    """Tracks requests and their replies for one client socket (see the module rules).

    :param timeout: default seconds per attempt (``math.inf``: wait forever)
    :param retries: default number of resends after a timed-out attempt
    :param backoff: delay cap before the first resend, in seconds
    :param backoff_factor: growth of the delay cap per further resend
    :param backoff_max: largest delay cap
    :param jitter: fraction of the delay cap that is randomised, in ``[0, 1]``
    :param rng: source of jitter (default: a fresh :class:`random.Random`)
    :param remember: how many finished ids to remember to tell duplicates from unknowns
    :param id_prefix: 8 bytes that start every id (default: random)
    :param type_width: type-frame width of the requests it builds: 1 (the spec) or 4 (the
        DagBox C++ reference broker). Replies are parsed in either width.
    """

    def __init__(
        self,
        *,
        timeout: float = 10.0,
        retries: int = 3,
        backoff: float = 0.1,
        backoff_factor: float = 2.0,
        backoff_max: float = 5.0,
        jitter: float = 0.5,
        rng: random.Random | None = None,
        remember: int = 8192,
        id_prefix: bytes | None = None,
        type_width: int = 1,
    ) -> None:
        check_type_width(type_width)
        _check_timeout(timeout)
        _check_retries(retries)
        if backoff < 0 or backoff_max < 0 or backoff_factor < 1:
            raise ValueError("backoff and backoff_max must be >= 0 and backoff_factor >= 1")
        if not 0 <= jitter <= 1:
            raise ValueError("jitter must be in [0, 1]")
        if remember < 0:
            raise ValueError("remember must be >= 0")
        if id_prefix is None:
            id_prefix = os.urandom(8)
        elif len(id_prefix) != 8:
            raise ValueError("id_prefix must be 8 bytes")
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self.backoff_factor = backoff_factor
        self.backoff_max = backoff_max
        self.jitter = jitter
        #: Type-frame width of every request built (1 or 4).
        self.type_width = type_width
        #: Frames to send, in order (see the output convention in the module docstring):
        #: first attempts from :meth:`request`, resends from :meth:`expire`.
        self.outbox: list[list[bytes]] = []
        self._rng = rng if rng is not None else random.Random()
        self._prefix = id_prefix
        self._counter = 0
        self._pending: dict[bytes, _Pending] = {}
        # Deadlines by request id; an entry stands while its generation is the request's.
        self._heap: DeadlineHeap[bytes] = DeadlineHeap(self._deadline_live)
        self._gen = 0
        # Finished ids: True = answered (a reply is a duplicate), False = timed out or
        # cancelled (a reply is late). Oldest forgotten first.
        self._finished: dict[bytes, bool] = {}
        self._finished_order: deque[bytes] = deque()
        self._remember = remember
        self._requests = self._replies = self._errors = self._retries = 0
        self._timeouts = self._cancelled = 0
        self._duplicates = self._late = self._unknown = 0
        self._malformed: dict[str, int] = {}
        #: Driver counters, reported by :meth:`statistics`.
        self.send_waits = 0
        self.resends_dropped = 0

    # ------------------------------------------------------------------ requests

    def request(
        self,
        service: bytes,
        data: Sequence[bytes],
        now: float,
        *,
        metadata: Sequence[bytes] = (),
        timeout: float | None = None,
        retries: int | None = None,
    ) -> bytes:
        """Start a request: its frames (one message) go to :attr:`outbox`.

        :param timeout: seconds for each attempt (default: the tracker's)
        :param retries: resends after timed-out attempts (default: the tracker's)
        :returns: the request id
        :raises LocalProtocolError: a metadata part is empty
        :raises ValueError: a bad ``timeout`` or ``retries``
        """
        if timeout is None:
            timeout = self.timeout
        else:
            _check_timeout(timeout)
        if retries is None:
            retries = self.retries
        else:
            _check_retries(retries)
        self._counter += 1
        rid = self._prefix + self._counter.to_bytes(8, "big")
        frames = serialize(Request(service, None, (rid, *metadata), data), width=self.type_width)
        pending = _Pending(frames, timeout, retries)
        self._pending[rid] = pending
        self._requests += 1
        self._schedule(rid, pending, now + timeout)
        self.outbox.append(frames)
        return rid

    def cancel(self, request_id: bytes) -> bool:
        """Forget a request at once (Rule 4). ``False`` if it was not pending."""
        if self._pending.pop(request_id, None) is None:
            return False
        self._cancelled += 1
        self._finish(request_id, answered=False)
        return True

    def cancel_all(self) -> list[bytes]:
        """Forget every pending request (the driver is closing); returns their ids."""
        ids = list(self._pending)
        for rid in ids:
            self.cancel(rid)
        self._heap.clear()
        return ids

    def is_pending(self, request_id: bytes) -> bool:
        """True while the request awaits its answer."""
        return request_id in self._pending

    # ------------------------------------------------------------------ replies

    def receive(self, frames: Sequence[bytes]) -> tuple[bytes, Response | RemoteError] | None:
        """Handle one incoming message (frames start with the empty delimiter).

        :returns: the request id and its outcome, or ``None`` if the message was dropped
            (duplicate, late, unknown or malformed; see :meth:`statistics`)
        """
        try:
            msg, _ = parse(frames)
        except RemoteProtocolError as exc:
            self._count_malformed(exc.reason)
            return None
        if not isinstance(msg, Reply):
            self._count_malformed("not_a_reply")
            return None
        metadata = msg.metadata
        if not metadata:
            self._count_malformed("missing_request_id")
            return None
        rid = metadata[0]
        if self._pending.pop(rid, None) is None:
            answered = self._finished.get(rid)
            if answered is None:
                self._unknown += 1
            elif answered:
                self._duplicates += 1
            else:
                self._late += 1
            return None
        self._finish(rid, answered=True)
        data = msg.data
        error = parse_error_reply(data)
        if error is not None:
            self._errors += 1
            return rid, RemoteError(*error)
        self._replies += 1
        user = metadata[1:]
        if user and user[0][:5] == OPTION_PREFIX:
            user = tuple(part for part in user if not part.startswith(OPTION_PREFIX))
        return rid, Response(data, user)

    # ------------------------------------------------------------------ time

    def next_deadline(self) -> float | None:
        """When :meth:`expire` next has something to do (``None``: nothing pending expires)."""
        return self._heap.next_due()

    def expire(self, now: float) -> list[tuple[bytes, RequestTimeout]]:
        """Act on every deadline that is ``<= now``: resend (to :attr:`outbox`), or fail
        (Rule 3).

        :returns: the requests that ran out of attempts, with the error to report
        """
        resend = self.outbox
        failed: list[tuple[bytes, RequestTimeout]] = []
        heap = self._heap
        pending = self._pending
        while (rid := heap.pop(now)) is not None:
            p = pending[rid]
            if p.resending:
                p.resending = False
                p.attempt += 1
                self._retries += 1
                resend.append(p.frames)
                self._schedule(rid, p, now + p.timeout)
            elif p.attempt > p.retries:
                del pending[rid]
                self._timeouts += 1
                self._finish(rid, answered=False)
                failed.append(
                    (rid, RequestTimeout(f"no reply after {p.attempt} attempt(s) of {p.timeout}s"))
                )
            else:
                p.resending = True
                self._schedule(rid, p, now + self.backoff_delay(p.attempt))
        return failed

    def backoff_delay(self, attempt: int) -> float:
        """The delay before resending after attempt number ``attempt`` (1-based) timed out."""
        cap = min(self.backoff_max, self.backoff * self.backoff_factor ** (attempt - 1))
        if self.jitter:
            return cap * (1.0 - self.jitter * self._rng.random())
        return cap

    # ------------------------------------------------------------------ counters

    def statistics(self) -> ClientStatistics:
        """A snapshot of the counters."""
        return ClientStatistics(
            requests=self._requests,
            replies=self._replies,
            errors=self._errors,
            retries=self._retries,
            timeouts=self._timeouts,
            cancelled=self._cancelled,
            duplicates=self._duplicates,
            late=self._late,
            unknown=self._unknown,
            malformed=dict(self._malformed),
            pending=len(self._pending),
            send_waits=self.send_waits,
            resends_dropped=self.resends_dropped,
        )

    def count_malformed(self, reason: str) -> None:
        """Count a message the driver dropped before parsing (e.g. ``"too_many_frames"``)."""
        self._count_malformed(reason)

    def __len__(self) -> int:
        return len(self._pending)

    # ------------------------------------------------------------------ internals

    def _count_malformed(self, reason: str) -> None:
        self._malformed[reason] = self._malformed.get(reason, 0) + 1

    def _schedule(self, rid: bytes, p: _Pending, deadline: float) -> None:
        p.deadline = deadline
        if deadline == math.inf:
            return
        self._gen += 1
        p.gen = self._gen
        heap = self._heap
        heap.live = len(self._pending)  # compaction keeps about twice this many entries
        heap.push(deadline, self._gen, rid)

    def _deadline_live(self, rid: bytes, gen: int) -> bool:
        p = self._pending.get(rid)
        return p is not None and p.gen == gen

    def _finish(self, rid: bytes, *, answered: bool) -> None:
        if not self._remember:
            return
        finished = self._finished
        order = self._finished_order
        if len(order) >= self._remember:
            del finished[order.popleft()]
        finished[rid] = answered
        order.append(rid)


def _check_timeout(timeout: float) -> None:
    if not timeout > 0:  # also rejects NaN
        raise ValueError(f"timeout must be > 0 seconds, not {timeout!r}")


def _check_retries(retries: int) -> None:
    if retries < 0:
        raise ValueError(f"retries must be >= 0, not {retries!r}")
