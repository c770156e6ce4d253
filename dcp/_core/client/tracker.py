"""The client's request tracker: a pure state machine (sans-IO).

It numbers requests, builds their frames, matches replies to them, and decides when to resend
and when to give up. It knows nothing of sockets, anyio or clocks: every call that depends on
time takes ``now`` (seconds, any monotonic clock), and the driver (:class:`dcp.Client`,
:class:`dcp.SyncClient`) sends what it is told to and wakes it at :meth:`next_deadline`.

It follows the contract of every dcp core (:mod:`dcp._core`): input methods take ``now``;
the frames to send go to :attr:`RequestTracker.outbox` and the outcomes the tracker decides by
itself (a request that timed out) to :attr:`RequestTracker.events`, as
:class:`~dcp._core.client.events.TimedOut` values; the driver takes both with
:meth:`~RequestTracker.drain` after each call or batch. Time is :meth:`~RequestTracker.expire`
and :meth:`~RequestTracker.next_deadline`. A method's own answer
(:meth:`~RequestTracker.request`'s id, :meth:`~RequestTracker.receive`'s outcome) is its return
value, never in the lists.

Rules:

Rule RT1 - Ids. Every request gets a 24-byte id: :data:`~dcp.wire.messages.REQUEST_ID_PREFIX`
  (so a worker can tell it from the caller's own metadata), 8 random bytes per tracker, then
  an 8-byte big-endian counter. The id is the *first* metadata part of the request; dcp's
  request options follow (expires-in, then the work timeout and no-wait the drivers add),
  then the user's metadata. Workers copy metadata into the reply (the spec says so), so the
  reply's first metadata part names its request. Resends carry the same id.
Rule RT2 - Replies. A reply whose id is pending completes it: a dcp error reply (see
  :func:`~dcp.wire.messages.parse_error_reply`) as :class:`~dcp.RemoteError`, except code
  ``no_workers`` (a broker's answer to a no-wait request) as :class:`~dcp.NoWorkers`; anything
  else as a :class:`Response`. A reply for an id that completed recently is a *duplicate*
  (e.g. both the original and a resend were answered); one for an id that timed out or was
  cancelled recently is *late*; any other is *unknown*. All three are counted and dropped.
  The last ``remember`` finished ids are remembered for this. Frames that are not a DCP reply
  with an id are counted as *malformed* by reason and dropped. Nothing raises out of
  :meth:`RequestTracker.receive`.
Rule RT3 - Timeouts. ``timeout`` bounds the whole call: the request fails at ``start +
  timeout`` at the latest, whatever its attempts. Each attempt has ``attempt_timeout``
  seconds (default ``timeout / (retries + 1)``). When attempt ``k`` (``k = 1`` for the first
  send) times out and fewer than ``retries`` resends were made, the request waits a backoff
  delay, then is resent with the same id::

      cap   = min(backoff_max, backoff * backoff_factor ** (k - 1))
      delay = cap * (1 - jitter * u)        # u uniform in [0, 1), from ``rng``

  so ``delay`` is in ``(cap * (1 - jitter), cap]``. A reply that arrives during the backoff
  delay (to the earlier attempt) still completes the request. The request fails when its
  last attempt times out or the call's time is up, whichever comes first (its *end*).
  ``timeout=math.inf`` leaves only the attempts' limit; both infinite: it never times out.
Rule RT4 - Deadline on the wire. Each attempt carries
  :func:`~dcp.wire.messages.expires_in_option` with the time left until the request's end as
  known when it is sent (the call's deadline, or the last attempt's end if that is
  earlier), so a broker can drop it from its queue and a worker skip it once the caller
  has given up. Nothing is added while the end is infinite.
Rule RT5 - No workers. Shortly before a request's end (``min(1 s, 10%)`` of its whole time),
  the tracker asks the broker whether any worker serves the service: a ``mmi.service``
  request with its own id, sent once, and not for ``mmi.*`` services or when ``probe`` is
  off. If the latest answer was ``404``, the request fails with :class:`~dcp.NoWorkers` (a
  :class:`~dcp.RequestTimeout`) at its end; with ``200`` or no answer, with a plain
  :class:`~dcp.RequestTimeout`. The answer itself completes nothing.
Rule RT6 - Cancel. :meth:`RequestTracker.cancel` forgets a request at once; a later reply to it
  is late.
Rule RT7 - Honest timeouts. A :class:`~dcp.RequestTimeout` says what happened: the time the
  request waited and the attempts actually sent (``no reply after 0.05s (1 attempt sent)``),
  then what the broker said, from the probe (Rule RT5) and from whether this tracker has
  heard anything at all: the probe answered ``200``: the broker is there and a worker serves
  the service, but did not reply in time; nothing ever heard: no broker at ``endpoint``
  (``is a dcp broker running at ...?``, as ``dcp call`` says); heard before, but the probe
  unanswered: the broker did not answer it either. Knowing costs the receive path nothing:
  the counters it keeps already say whether anything arrived.
Rule RT8 - Moves. A client with several brokers resends a pending request through another
  broker when the one it is on is lost (:mod:`dcp._core.client.brokers` Rule BK4):
  :meth:`RequestTracker.moved` gives its frames as of ``now`` (same id, the time left in its
  expires-in, Rule RT4), none once its end is reached (it is timed out, not moved). A move is
  not an attempt: it counts no retry, uses none of ``retries`` and leaves the request's timers
  and end as they are.
Rule RT9 - Unreachable broker. A client that does not wait for its broker
  (``wait_for_broker=False``) and has never connected to any of its brokers, whose
  connection attempts are refused (:mod:`dcp._io.handshake` Rule H6), ends every pending
  request at once: :meth:`RequestTracker.unreachable` gives each a
  :class:`~dcp._core.client.events.TimedOut` with a :class:`~dcp.BrokerUnreachable` (a
  :class:`~dcp.RequestTimeout`, counted as a timeout) naming the endpoint(s) and the refused
  connection; a request started while that holds raises the same error
  (:meth:`RequestTracker.unreachable_error`, the driver's to raise). Once a connection
  completed, never: a broker that goes away later is waited for as before.

Deadlines live in a heap with lazy deletion: finishing a request does not touch the heap; a
stale entry is skipped when it reaches the top. The heap is rebuilt from the pending requests
when stale entries outnumber them (amortised O(1) per request), so memory stays bounded.

What the tracker does NOT do: send anything, read clocks, wait, check the parts it is given
(the drivers do, see :mod:`dcp._core.client.calls`), limit how many requests are in flight (the
drivers' ``map`` does), or de-duplicate work on the worker side (a slow worker and a resend
can both run a request: services should be idempotent).
"""

from __future__ import annotations

import math
import os
import random
from collections import deque
from collections.abc import Sequence
from typing import Final

from dcp._core.client.calls import PendingCall, Timing, check_retries, check_timeout
from dcp._core.client.events import TimedOut
from dcp._errors import (
    BrokerUnreachable,
    LocalProtocolError,
    NoWorkers,
    RemoteError,
    RemoteProtocolError,
    RequestTimeout,
)
from dcp._models import Outcome, Response
from dcp._stats import ClientStatistics
from dcp._util import DeadlineHeap
from dcp.wire.dcp1 import (
    PROTOCOL,
    TYPE_FRAMES,
    MessageType,
    check_type_width,
    parse,
    serialize,
    split_body,
)
from dcp.wire.messages import Reply, Request, parse_error_reply
from dcp.wire.options import OPTION_PREFIX, REQUEST_ID_PREFIX, expires_in_option, via_services

__all__ = ["RequestTracker"]


#: Where the expires-in option goes in a request's frames: after ``"" DGBX T service ""
#: id`` (the tracker never sets a client address).
_EXPIRES_AT = 6
#: The mmi.service probe: at most this long before a request's end ...
_PROBE_MAX = 1.0
#: ... and at most this fraction of the request's whole time.
_PROBE_FRACTION = 0.1
_MMI_SERVICE = b"mmi.service"
_NOT_SERVED = (b"404",)
#: The type frame of a reply, in either width (Rule RT2: replies are read in both).
_REPLY_TYPES = (TYPE_FRAMES[1][MessageType.REPLY], TYPE_FRAMES[4][MessageType.REPLY])
#: What :meth:`RequestTracker.drain` gives when there is no event (most calls): no new list.
_NO_EVENTS: Final[Sequence[TimedOut]] = ()


class RequestTracker:
    """Tracks requests and their replies for one client socket (see the module rules).

    :param timeout: default seconds for a whole call (``math.inf``: no overall limit)
    :param attempt_timeout: default seconds per attempt (``None``: ``timeout / (retries +
        1)`` of each call)
    :param retries: default number of resends after a timed-out attempt
    :param backoff: delay cap before the first resend, in seconds
    :param backoff_factor: growth of the delay cap per further resend
    :param backoff_max: largest delay cap
    :param jitter: fraction of the delay cap that is randomised, in ``[0, 1]``
    :param rng: source of jitter (default: a fresh :class:`random.Random`)
    :param remember: how many finished ids to remember to tell duplicates from unknowns
    :param id_prefix: 8 bytes that start every id after ``REQUEST_ID_PREFIX`` (default:
        random)
    :param type_width: type-frame width of the requests it builds: 1 (the spec) or 4 (the
        DagBox C++ reference broker). Replies are parsed in either width.
    :param probe: ask the broker (``mmi.service``) whether a worker serves a request's
        service shortly before the request fails (Rule RT5)
    """

    def __init__(
        self,
        *,
        timeout: float = 30.0,
        attempt_timeout: float | None = None,
        retries: int = 2,
        backoff: float = 0.1,
        backoff_factor: float = 2.0,
        backoff_max: float = 5.0,
        jitter: float = 0.5,
        rng: random.Random | None = None,
        remember: int = 8192,
        id_prefix: bytes | None = None,
        type_width: int = 1,
        probe: bool = True,
    ) -> None:
        check_type_width(type_width)
        check_timeout(timeout, "timeout")
        if attempt_timeout is not None:
            check_timeout(attempt_timeout, "attempt_timeout")
        check_retries(retries)
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
        self.attempt_timeout = attempt_timeout
        self.retries = retries
        self.backoff = backoff
        self.backoff_factor = backoff_factor
        self.backoff_max = backoff_max
        self.jitter = jitter
        #: Type-frame width of every request built (1 or 4).
        self.type_width = type_width
        #: Whether to probe ``mmi.service`` before a request fails (Rule RT5).
        self.probe = probe
        #: The broker's endpoint, named in timeout messages only (Rule RT7; the driver sets it).
        self.endpoint = ""
        #: The brokers' endpoints, one by one (:meth:`unreachable_error`; the driver sets it).
        self.endpoints: tuple[str, ...] = ()
        #: Frames to send, in order (the contract in the module docstring): first attempts
        #: from :meth:`request`, resends and probes from :meth:`expire`.
        self.outbox: list[list[bytes]] = []
        #: What else the driver must do, in order: deliver the error of each request that
        #: :meth:`expire` ended (Rules RT3 and RT5).
        self.events: list[TimedOut] = []
        self._rng = rng if rng is not None else random.Random()
        self._prefix = REQUEST_ID_PREFIX + id_prefix
        self._counter = 0
        self._pending: dict[bytes, PendingCall] = {}
        # Probe id -> the id of the request it asks for.
        self._probes: dict[bytes, bytes] = {}
        # Deadlines by request id; an entry stands while its generation is the request's.
        self._heap: DeadlineHeap[bytes] = DeadlineHeap(self._deadline_live)
        self._gen = 0
        # Finished ids: True = answered (a reply is a duplicate), False = timed out or
        # cancelled (a reply is late). Oldest forgotten first.
        self._finished: dict[bytes, bool] = {}
        self._finished_order: deque[bytes] = deque()
        self._remember = remember
        self._requests = self._replies = self._errors = self._retries = 0
        self._timeouts = self._cancelled = self._no_workers = self._probes_sent = 0
        self._duplicates = self._late = self._unknown = self._probe_answers = 0
        self._malformed: dict[str, int] = {}
        #: The first frames of every request this tracker builds (Rule RT1's frames follow).
        self._request_head = (b"", PROTOCOL, TYPE_FRAMES[type_width][MessageType.REQUEST])
        self._default_timing = Timing.resolve(
            (self.timeout, self.attempt_timeout, self.retries), None, None, None
        )
        #: The limits of the last first attempt built with an expires-in option, and that
        #: option: a first attempt's time left depends on its limits only (Rule RT4), so
        #: the next request with the same limits reuses it.
        self._first_expires: tuple[Timing | None, bytes] = (None, b"")
        #: Driver counters, reported by :meth:`statistics`.
        self.send_waits = 0
        self.resends_dropped = 0

    # ------------------------------------------------------------------ requests

    def timing(
        self,
        timeout: float | None = None,
        attempt_timeout: float | None = None,
        retries: int | None = None,
    ) -> Timing:
        """The limits of a call: each one given, else the tracker's default; the attempt
        timeout, if neither gives one, is ``timeout / (retries + 1)``.

        :raises ValueError: a timeout that is not > 0, or ``retries`` < 0
        """
        if timeout is None and attempt_timeout is None and retries is None:
            return self._default_timing  # the common call
        return Timing.resolve(
            (self.timeout, self.attempt_timeout, self.retries), timeout, attempt_timeout, retries
        )

    def request(
        self,
        service: bytes,
        data: Sequence[bytes],
        now: float,
        *,
        metadata: Sequence[bytes] = (),
        timing: Timing | None = None,
    ) -> bytes:
        """Start a request: its frames (one message) go to :attr:`outbox`.

        :param metadata: dcp's request options and the user's metadata, after the id and
            the expires-in option the tracker puts first
        :param timing: the call's limits (default: the tracker's, see :meth:`timing`)
        :returns: the request id
        :raises LocalProtocolError: a metadata part is empty
        """
        for part in metadata:  # Request's own check, before anything changes
            if not part:
                raise LocalProtocolError(
                    "metadata parts must be non-empty (an empty part ends them)"
                )
        if timing is None:
            timing = self._default_timing
        self._counter += 1
        rid = self._prefix + self._counter.to_bytes(8, "big")
        p = PendingCall(service, timing, now)
        p.attempt = 1
        if timing.retries == 0:
            p.end = end = min(p.end, now + timing.attempt_timeout)
        else:
            p.retry_at = now + timing.attempt_timeout
            end = p.end
        # The frames serialize(Request(service, None, (id, expires-in, *metadata), data))
        # gives, built from the tracker's template (no message object on this path).
        if end < math.inf:
            p.has_expires = True
            made_for, option = self._first_expires
            if made_for is not timing and made_for != timing:
                option = expires_in_option(end - now)
                self._first_expires = (timing, option)
            frames = [*self._request_head, service, b"", rid, option, *metadata, b"", *data]
            self._plan_probe(p)
        else:
            frames = [*self._request_head, service, b"", rid, *metadata, b"", *data]
        p.frames = frames
        self._pending[rid] = p
        self._requests += 1
        self._schedule(rid, p)
        self.outbox.append(frames)
        return rid

    def drain(self) -> tuple[list[list[bytes]], Sequence[TimedOut]]:
        """Take what the calls since the last drain put in :attr:`outbox` and
        :attr:`events`, in order; both start empty again. The lists are the caller's."""
        out = self.outbox
        self.outbox = []
        events = self.events
        if not events:
            return out, _NO_EVENTS
        self.events = []
        return out, events

    def deadline_of(self, request_id: bytes) -> float:
        """When the request next needs :meth:`expire` (its attempt's or its own end, or its
        probe); ``inf`` if never or not pending. A driver bounds a first send's wait by it."""
        p = self._pending.get(request_id)
        return math.inf if p is None else p.deadline

    def cancel(self, request_id: bytes) -> bool:
        """Forget a request at once (Rule RT6). ``False`` if it was not pending."""
        p = self._pending.pop(request_id, None)
        if p is None:
            return False
        self._cancelled += 1
        self._done(request_id, p, answered=False)
        return True

    def cancel_all(self) -> list[bytes]:
        """Forget every pending request (the driver is closing); returns their ids."""
        ids = list(self._pending)
        for rid in ids:
            self.cancel(rid)
        self._heap.clear()
        return ids

    def unreachable(self) -> None:
        """End every pending request at once (Rule RT9): a
        :class:`~dcp._core.client.events.TimedOut` each, with
        :meth:`unreachable_error`, to :attr:`events`."""
        pending = self._pending
        for rid in list(pending):
            p = pending.pop(rid)
            self._timeouts += 1
            self.events.append(TimedOut(rid, self.unreachable_error()))
            self._done(rid, p, answered=False)

    def unreachable_error(self) -> BrokerUnreachable:
        """What a request fails with while no broker can be reached (Rule RT9)."""
        where = self.endpoint or "the endpoint"
        return BrokerUnreachable(
            self.endpoints or (where,),
            f"cannot connect to {where}: connection refused (nothing listens there): "
            "is a dcp broker running there?",
        )

    def moved(self, request_id: bytes, now: float) -> list[bytes] | None:
        """The frames that move a pending request to another broker at ``now`` (Rule RT8),
        for the driver to send (not put in :attr:`outbox`); ``None`` if it is not pending, or
        its end is ``now`` or past (not moved: :meth:`expire` times it out)."""
        p = self._pending.get(request_id)
        if p is None or p.end <= now:
            return None
        return self._frames_at(p, now)

    def is_pending(self, request_id: bytes) -> bool:
        """True while the request awaits its answer."""
        return request_id in self._pending

    # ------------------------------------------------------------------ replies

    def receive(self, frames: Sequence[bytes]) -> tuple[bytes, Outcome] | None:
        """Handle one incoming message (frames start with the empty delimiter).

        :returns: the request id and its outcome, or ``None`` if the message was dropped
            (duplicate, late, unknown or malformed; see :meth:`statistics`) or was the
            answer to a probe
        """
        # A reply's body is split as parse splits it, without a message object; anything
        # else goes through parse, which says what it is.
        try:
            if (
                len(frames) > 3
                and not frames[0]
                and frames[1] == PROTOCOL
                and frames[2] in _REPLY_TYPES
            ):
                _, metadata, data = split_body(frames, 3)
            else:
                msg, _ = parse(frames)
                if not isinstance(msg, Reply):
                    self._count_malformed("not_a_reply")
                    return None
                metadata, data = msg.metadata, msg.data
        except RemoteProtocolError as exc:
            self._count_malformed(exc.reason)
            return None
        if not metadata:
            self._count_malformed("missing_request_id")
            return None
        rid = metadata[0]
        p = self._pending.pop(rid, None)
        if p is None:
            asked = self._probes.pop(rid, None)
            if asked is not None:  # a probe's answer: note it, complete nothing
                self._probe_answers += 1
                self._pending[asked].no_workers = data == _NOT_SERVED
                return None
            answered = self._finished.get(rid)
            if answered is None:
                self._unknown += 1
            elif answered:
                self._duplicates += 1
            else:
                self._late += 1
            return None
        self._done(rid, p, answered=True)
        error = parse_error_reply(data)
        if error is not None:
            code, message = error
            via = via_services(metadata)  # routing Rule R9: a forward chain's
            chain = tuple(_text(service) for service in via)
            if code == "no_workers":
                self._no_workers += 1
                if via:
                    text = f"no worker serves {_name(via[-1])} ({' -> '.join(chain)})"
                    return rid, NoWorkers(via[-1], text, chain)
                return rid, NoWorkers(p.service, _no_workers_text(p.service, message))
            self._errors += 1
            return rid, RemoteError(code, message, chain)
        self._replies += 1
        # The user's metadata: without dcp's options if they lead it (as sent).
        n = len(metadata)
        i = 1
        while i < n and metadata[i][:5] == OPTION_PREFIX:
            i += 1
        user = metadata[i:]
        if i > 1 and user:
            user = tuple(part for part in user if not part.startswith(OPTION_PREFIX))
        return rid, Response(data, user)

    # ------------------------------------------------------------------ time

    def next_deadline(self) -> float | None:
        """When :meth:`expire` next has something to do (``None``: nothing pending expires)."""
        return self._heap.next_due()

    def expire(self, now: float) -> None:
        """Act on every deadline that is ``<= now``: resend or probe (to :attr:`outbox`),
        or end the request (a :class:`~dcp._core.client.events.TimedOut` to
        :attr:`events`; Rules RT3 and RT5)."""
        heap = self._heap
        pending = self._pending
        while (rid := heap.pop(now)) is not None:
            p = pending[rid]
            if p.end <= now:
                del pending[rid]
                self.events.append(TimedOut(rid, self._ended(p)))
                self._done(rid, p, answered=False)
                continue
            if p.retry_at <= now:
                if p.resending:
                    self._resend(p, now)
                else:  # the attempt timed out (a resend is left: see retry_at)
                    p.resending = True
                    p.retry_at = now + self.backoff_delay(p.attempt)
            if p.probe_at <= now:
                self._send_probe(rid, p, now)
            self._schedule(rid, p)

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
            no_workers=self._no_workers,
            probes=self._probes_sent,
        )

    def count_malformed(self, reason: str) -> None:
        """Count a message the driver dropped before parsing (e.g. ``"too_many_frames"``)."""
        self._count_malformed(reason)

    def __len__(self) -> int:
        return len(self._pending)

    # ------------------------------------------------------------------ internals

    def _resend(self, p: PendingCall, now: float) -> None:
        timing = p.timing
        p.resending = False
        p.attempt += 1
        self._retries += 1
        if p.attempt > timing.retries:  # the last attempt: it bounds the request's end
            p.retry_at = math.inf
            if now + timing.attempt_timeout < p.end:
                p.end = now + timing.attempt_timeout
                self._plan_probe(p)
        else:
            p.retry_at = now + timing.attempt_timeout
        self.outbox.append(self._frames_at(p, now))

    def _frames_at(self, p: PendingCall, now: float) -> list[bytes]:
        """A request's frames as sent at ``now`` (Rule RT4: the time left), kept as its
        frames."""
        frames = p.frames
        if p.end < math.inf:  # Rule RT4: the time left, as of this attempt
            option = expires_in_option(p.end - now)
            rest = frames[_EXPIRES_AT + 1 :] if p.has_expires else frames[_EXPIRES_AT:]
            frames = [*frames[:_EXPIRES_AT], option, *rest]
            p.has_expires = True
        p.frames = frames
        return frames

    def _plan_probe(self, p: PendingCall) -> None:
        """Set when to probe (Rule RT5), unless a probe was sent or none is wanted."""
        if (
            self.probe
            and p.probe_id is None
            and p.end < math.inf
            and not p.service.startswith(b"mmi.")
        ):
            p.probe_at = p.end - min(_PROBE_MAX, _PROBE_FRACTION * (p.end - p.start))

    def _send_probe(self, rid: bytes, p: PendingCall, now: float) -> None:
        p.probe_at = math.inf
        self._counter += 1
        probe_id = self._prefix + self._counter.to_bytes(8, "big")
        p.probe_id = probe_id
        self._probes[probe_id] = rid
        self._probes_sent += 1
        metadata = (probe_id, expires_in_option(max(p.end - now, 0.001)))
        probe = Request(_MMI_SERVICE, None, metadata, (p.service,))
        self.outbox.append(serialize(probe, width=self.type_width))

    def _ended(self, p: PendingCall) -> RequestTimeout:
        """The error of a request that timed out (Rules RT5 and RT7)."""
        sent = f"{p.attempt} attempt{'' if p.attempt == 1 else 's'} sent"
        # The time it waited: until its end (Rule RT3), not the moment the driver woke up.
        waited = f"no reply after {p.end - p.start:.3g}s ({sent})"
        if p.no_workers:
            self._no_workers += 1
            return NoWorkers(
                p.service, f"no worker serves {_name(p.service)} (the broker says so; {waited})"
            )
        self._timeouts += 1
        where = self.endpoint or "the endpoint"
        if p.no_workers is False:  # the probe's answer was 200
            why = (
                f"; the broker answers, and a worker serves {_name(p.service)}: "
                "it did not reply in time"
            )
        elif not self._heard():
            why = f"; nothing heard from {where}: is a dcp broker running there?"
        elif p.probe_id is not None:
            why = f"; no answer from the broker at {where} to mmi.service either"
        else:
            why = ""
        return RequestTimeout(waited + why)

    def _heard(self) -> bool:
        """Whether anything ever arrived from the broker (Rule RT7): a reply, an error, a
        duplicate, late or unknown reply, a probe's answer or a malformed message."""
        return bool(
            self._replies
            or self._errors
            or self._no_workers
            or self._duplicates
            or self._late
            or self._unknown
            or self._probe_answers
            or self._malformed
        )

    def _count_malformed(self, reason: str) -> None:
        self._malformed[reason] = self._malformed.get(reason, 0) + 1

    def _schedule(self, rid: bytes, p: PendingCall) -> None:
        deadline = min(p.end, p.retry_at, p.probe_at)
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

    def _done(self, rid: bytes, p: PendingCall, *, answered: bool) -> None:
        """A request left :attr:`_pending`: forget its probe, remember its id."""
        if p.probe_id is not None and self._probes.pop(p.probe_id, None) is not None:
            self._finish(p.probe_id, answered=False)  # a later answer is late, not unknown
        self._finish(rid, answered=answered)

    def _finish(self, rid: bytes, *, answered: bool) -> None:
        if not self._remember:
            return
        finished = self._finished
        order = self._finished_order
        if len(order) >= self._remember:
            del finished[order.popleft()]
        finished[rid] = answered
        order.append(rid)


def _no_workers_text(service: bytes, message: str) -> str:
    """A ``no_workers`` reply's text: the service named once, then what the broker's own text
    adds (nothing when it only says "no worker serves ...", as dcp's broker does)."""
    text = f"no worker serves {_name(service)}"
    if not message or message.startswith("no worker serves "):
        return text
    return f"{text}: {message}"


def _text(service: bytes) -> str:
    """A service name as text (UTF-8; other bytes escaped)."""
    return service.decode("utf-8", "backslashreplace")


def _name(service: bytes) -> str:
    """A service name for messages: its text if it is UTF-8, quoted."""
    return repr(_text(service))
