"""dcp streams in the broker: partial replies with credit and cancel. Sans-IO.

A *stream* is a request whose answer comes in parts (frames in :mod:`dcp.wire.streams`,
the whole design in ``docs/streams.md``). The broker relays parts from the worker to the
reader and credit and cancels from the reader to the worker, and polices the credit. It
stores no part of a dcp reader's stream: a part is written to the reader's socket at once,
and credit bounds how many parts of one stream are between the broker and its reader
(*outstanding*). Only for readers without credit does it hold a bounded few (Rule ST3).

Rule ST1 - Open. The broker knows a stream from the first PARTIAL its worker sends for a
  request it holds (matched by client address and metadata, as a reply is; a Majordomo
  worker's by client address). Its reader is the request's client if it asked for a stream
  (the ``\\xffDCP:stream=<window>`` option, DCP) or speaks a dialect with partials (MDP/0.2,
  majortomo). Otherwise the part is dropped and counted (``partial_dropped``): a plain DCP
  v1 client only ever gets the final reply. A PARTIAL that matches no held request is
  counted (``stream_unmatched``) and answered with CANCEL.
Rule ST2 - Credit. A stream's credit starts at its window; each part forwarded takes 1 and
  each CREDIT from the reader adds its count and is relayed to the worker. A part beyond the
  credit (a DCP worker that ignores it) is an *overrun*: dropped, the worker is sent CANCEL
  and the reader an error reply ``stream_overrun``. So at most *window* parts of one stream
  are ever outstanding, whatever the reader's speed.
Rule ST3 - Readers without credit. An MDP/0.2 or majortomo client has no credit: the broker
  asks for a stream on its behalf (it adds the stream option with ``STREAM_WINDOW`` to the
  request) and is the reader towards the worker: it grants the worker credit again as it
  writes parts to the client's socket (topping it up to the window once half is used). A
  part the client's socket cannot take (its high-water mark) is *held*, with everything
  after it for that client (parts and final replies, in order; at most ``MAX_HELD``), and
  the worker gets no more credit: it pauses. Held messages are sent again every
  ``RETRY_DELAY`` (2 ms) while any are held (the core's ``next_deadline`` says when;
  :meth:`Streams.retry`); once a retry went out whole, the client's streams get credit
  again. A held part beyond ``MAX_HELD`` (only a worker without credit,
  Rule ST4, gets there) is dropped and counted (``partial_dropped``) and the stream
  cancelled. A client that is gone cancels its streams (Rule ST5).
Rule ST4 - Writers without credit. A Majordomo worker's partials are forwarded as they come
  (MDP has no credit and no cancel): a cancel only stops forwarding them.
Rule ST5 - Cancel. A CANCEL from the reader (or a part its socket could not take) is relayed
  to the worker and its later parts are dropped; the worker's final reply still releases the
  request (and reaches the reader, who drops it). A CANCEL for a stream whose first part has
  not come yet is remembered (at most ``max_cancelled``, oldest forgotten first) and acted
  on when that part comes. A CANCEL for a stream the broker does not know is ignored.
Rule ST6 - No redelivery after a part. A worker that goes away holding a request of which a
  part was forwarded does not give it back to the queue (routing Rule R5): the reader gets an
  error reply ``stream_broken`` naming how many parts were sent. A stream without parts
  yet is redelivered as any request.
Rule ST7 - End. The final reply ends the stream (it is routed as any reply).
Rule ST8 - Bytes. The parts written to a DCP reader and not yet credited back sit in the
  broker's socket queue: each is charged to its reader in the byte budget's ``streams``
  account (:mod:`.budget`, Rules MB1-MB4) when it is forwarded, and released when the reader
  credits it back (oldest first) or the stream ends. A part the budget refuses (the account
  is full, or the reader holds its share) is dropped, the worker is sent CANCEL and the
  reader an error reply ``memory_budget`` (counted by that reason): the window a reader
  asks for is a promise the broker keeps only as far as the reader's share allows. (Readers
  without credit, Rule ST3, are bounded by ``STREAM_WINDOW`` and ``MAX_HELD`` instead.)

What this module does NOT do: buffer parts beyond Rule ST3's bound, time streams (work
timeouts, routing Rule R7, bound the whole stream), parse or authenticate stream messages (the
DCP handler does, :mod:`.dcp1`), or release requests (routing does, and tells
:meth:`Streams.finished`; when a worker goes away, :mod:`.redelivery` asks
:meth:`Streams.lost` which of its requests are not to be redelivered).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Sequence

import dcp.wire.streams as wire
from dcp._core.broker.budget import Account, cost
from dcp._core.broker.dialects import DcpDialect, Dialect
from dcp._core.broker.outputs import Outputs
from dcp._core.broker.records import Pending, Session
from dcp._stats import StreamStatistics
from dcp.wire import mdp
from dcp.wire.streams import StreamMessage, StreamType, stream_window

__all__ = ["MAX_CANCELLED", "MAX_HELD", "RETRY_DELAY", "STREAM_WINDOW", "Stream", "Streams"]

#: The window the broker asks for on behalf of readers without credit (Rule ST3).
STREAM_WINDOW = 32
#: Early cancels remembered (Rule ST5).
MAX_CANCELLED = 10_000
#: Messages held per client without credit whose socket is full (Rule ST3).
MAX_HELD = 2 * STREAM_WINDOW + 1
#: Seconds between retries of held messages (Rule ST3).
RETRY_DELAY = 0.002
_MDP_C02 = mdp.C02


class Stream:
    """A stream the broker knows (Rule ST1)."""

    __slots__ = (
        "cancelled",
        "charges",
        "credit",
        "key",
        "outstanding",
        "parts",
        "pending",
        "window",
    )

    def __init__(self, pending: Pending, window: int, key: tuple[bytes, bytes] | None) -> None:
        self.pending = pending
        #: The reader's first credit.
        self.window = window
        #: Parts the worker may still send (Rule ST2).
        self.credit = window
        #: Parts forwarded to the reader, and of those not yet credited back.
        self.parts = 0
        self.outstanding = 0
        #: ``(client, request id)`` of a DCP reader, by which its CREDIT and CANCEL name it;
        #: ``None`` for a reader without credit (Rule ST3).
        self.key = key
        self.cancelled = False
        #: Bytes charged for the parts not yet credited back, oldest first (Rule ST8).
        self.charges: deque[int] = deque()


class Streams:
    """The streams the broker relays (the module's rules).

    :param outputs: where messages, counts and refusals go
    :param memory: the ``streams`` account (Rule ST8; ``None``: one without a limit)
    """

    def __init__(self, outputs: Outputs, memory: Account | None = None) -> None:
        self._out = outputs
        self._memory = Account("streams", None, None) if memory is None else memory
        self._outbox = outputs.outbox
        self._counters = outputs.counters
        #: Open streams, by the request they answer (Rules ST1, ST7).
        self.open: dict[Pending, Stream] = {}
        self._keys: dict[tuple[bytes, bytes], Stream] = {}
        #: Rule ST5: cancels that came before their stream's first part, oldest first.
        self.early_cancels: OrderedDict[tuple[bytes, bytes], None] = OrderedDict()
        # Rule ST3: messages held for clients whose socket was full, the clients whose held
        # messages the last retry sent, and when to retry next.
        self._held_out: dict[bytes, deque[list[bytes]]] = {}
        self._retried: set[bytes] = set()
        self._retry_at = 0.0
        self._stats = {
            "cancelled": 0,
            "broken": 0,
            "overruns": 0,
            "outstanding_max": 0,
            "held": 0,
        }

    # ------------------------------------------------------------------ input

    def dcp_partial(
        self, peer: bytes, worker: Session, client: bytes, shown: bytes, msg: StreamMessage
    ) -> None:
        """A DCP worker's PARTIAL for ``client`` (unsealed; ``shown``: as the worker named
        it) (Rules ST1, ST2, ST5)."""
        pending = None
        for held in worker.held:
            if held.client == client and held.metadata == msg.metadata:
                pending = held
                break
        if pending is None:
            self._counters.count("stream_unmatched")
            self._tell_worker(worker, StreamType.CANCEL, shown, msg.metadata)
            return
        stream = self._stream(pending)
        if stream is None:
            self._counters.count("partial_dropped")
            self._tell_worker(worker, StreamType.CANCEL, shown, msg.metadata)
            return
        if stream.cancelled:
            self._counters.count("partial_dropped")
            return
        if stream.credit <= 0:
            # Rule ST2: an overrun.
            self._stats["overruns"] += 1
            self._out.reject(peer, "stream_overrun", "a part sent without credit")
            self._cancel(stream)
            self._error(pending, "stream_overrun", "the worker sent a part without credit")
            return
        self._forward(stream, msg.data)

    def mdp_partial(self, worker: Session, client: bytes, body: Sequence[bytes]) -> None:
        """A Majordomo worker's PARTIAL for ``client`` (unsealed) (Rules ST1, ST4)."""
        pending = worker.held_for(client)
        if pending is None:
            self._counters.count("partial_dropped")
            return
        stream = self._stream(pending)
        if stream is not None and not stream.cancelled:
            self._forward(stream, body)
        else:
            self._counters.count("partial_dropped")

    def reader(self, peer: bytes, msg: StreamMessage) -> None:
        """A CREDIT or CANCEL from reader ``peer`` (Rules ST2, ST5)."""
        if not msg.metadata:
            self._out.reject(peer, "stream_without_id", "CREDIT or CANCEL names no request")
            return
        key = (peer, msg.metadata[0])
        stream = self._keys.get(key)
        if msg.type is StreamType.CANCEL:
            if stream is None:
                early = self.early_cancels
                early[key] = None
                if len(early) > MAX_CANCELLED:
                    early.popitem(last=False)
            elif not stream.cancelled:
                self._cancel(stream)
            return
        if stream is None or stream.cancelled:
            self._counters.count("stream_unknown")
            return
        stream.credit += msg.credit
        stream.outstanding = max(0, stream.outstanding - msg.credit)
        charges = stream.charges
        if charges:
            release = self._memory.release
            for _ in range(min(msg.credit, len(charges))):
                release(peer, charges.popleft())  # Rule ST8
        self._relay_credit(stream, msg.credit)

    # ------------------------------------------------------------------ rules

    def _stream(self, pending: Pending) -> Stream | None:
        """Rule ST1: the stream of held ``pending``, opened now if this is its first part;
        ``None`` if its client gets no parts."""
        stream = self.open.get(pending)
        if stream is not None:
            return stream
        origin = pending.origin
        key: tuple[bytes, bytes] | None = None
        if isinstance(origin, DcpDialect):
            window = stream_window(pending.metadata)
            if window is None or not pending.metadata:
                return None
            key = (pending.client, pending.metadata[0])
        elif origin.partials:
            window = STREAM_WINDOW
        else:
            return None
        stream = Stream(pending, window, key)
        self.open[pending] = stream
        if key is not None:
            self._keys[key] = stream
            if self.early_cancels.pop(key, 0) is None:
                self._cancel(stream)  # Rule ST5: cancelled before its first part
        return stream

    def _forward(self, stream: Stream, data: Sequence[bytes]) -> None:
        pending = stream.pending
        origin = pending.origin
        client = pending.client
        if isinstance(origin, DcpDialect):
            frames = [
                client,
                *wire.build(
                    StreamType.PARTIAL, client, pending.metadata, data, width=origin.width
                ),
            ]
            n = cost(frames)
            if not self._memory.charge(client, n):  # Rule ST8
                self._out.reject(client, "memory_budget", "stream parts not credited back")
                self._cancel(stream)
                self._error(pending, "memory_budget", "stream parts beyond the reader's share")
                return
            stream.charges.append(n)
            stream.credit -= 1
            stream.parts += 1
            self._counters.partials += 1
            self._outbox.append(frames)
            stream.outstanding += 1
            if stream.outstanding > self._stats["outstanding_max"]:
                self._stats["outstanding_max"] = stream.outstanding
            return
        stream.credit -= 1
        stream.parts += 1
        self._counters.partials += 1
        frames = origin.reply(client, pending.service.name, pending.metadata, data, final=False)
        held = self._held_out.get(client)
        if held is not None:
            self._hold(stream, held, frames)  # Rule ST3: after what is held; no credit
            return
        self._outbox.append(frames)
        if client not in self._retried and stream.credit <= stream.window // 2:
            self._top_up(stream)

    def _top_up(self, stream: Stream) -> None:
        """Rule ST3: the broker reads for this client; top the worker's credit up."""
        if stream.credit < stream.window:
            grant = stream.window - stream.credit
            stream.credit = stream.window
            self._relay_credit(stream, grant)

    def _hold(self, stream: Stream, held: deque[list[bytes]], frames: list[bytes]) -> None:
        if len(held) < MAX_HELD:
            held.append(frames)
        else:
            self._counters.count("partial_dropped")
            self._cancel(stream)

    def _relay_credit(self, stream: Stream, n: int) -> None:
        pending = stream.pending
        worker = pending.holder
        if worker is not None and isinstance(worker.dialect, DcpDialect):
            self._tell_worker(worker, StreamType.CREDIT, pending.shown, pending.metadata, n)

    def _cancel(self, stream: Stream) -> None:
        """Rule ST5: stop the stream: CANCEL to its (DCP) worker, later parts dropped."""
        stream.cancelled = True
        self._stats["cancelled"] += 1
        pending = stream.pending
        worker = pending.holder
        if worker is not None and isinstance(worker.dialect, DcpDialect):
            self._tell_worker(worker, StreamType.CANCEL, pending.shown, pending.metadata)

    def _tell_worker(
        self,
        worker: Session,
        mtype: StreamType,
        client: bytes,
        metadata: tuple[bytes, ...],
        n: int = 0,
    ) -> None:
        dialect = worker.dialect
        assert isinstance(dialect, DcpDialect)
        frames = wire.build(mtype, client, metadata, credit=n, width=dialect.width)
        self._outbox.append([worker.ident, *frames])

    def _error(self, pending: Pending, code: str, message: str) -> None:
        """An error reply ending ``pending``'s stream (after what is held, Rule ST3; none to
        an MDP client, majordomo Rule M1)."""
        client = pending.client
        frames = pending.origin.error(
            client, pending.service.name, pending.metadata, code, message
        )
        if frames is not None:
            self.answer(client, frames)

    # ------------------------------------------------------------ for the other parts

    def answer(self, client: bytes, frames: list[bytes]) -> None:
        """Send a final reply to ``client`` (after its held messages, Rule ST3)."""
        held = self._held_out.get(client)
        if held is None:
            self._outbox.append(frames)
        else:
            held.append(frames)

    def finished(self, pending: Pending) -> None:
        """Rule ST7: the stream (if any) of ``pending`` ends with it (routing released it, or
        stopped tracking it)."""
        stream = self.open.pop(pending, None)
        if stream is not None:
            if stream.key is not None:
                self._keys.pop(stream.key, None)
            if stream.charges:
                self._memory.release(pending.client, sum(stream.charges))  # Rule ST8
                stream.charges.clear()

    def lost(self, pending: Pending) -> bool:
        """Rule ST6: the worker holding ``pending`` went away. Whether a part of it was
        forwarded (then it is not to be redelivered: its reader gets ``stream_broken``,
        unless it cancelled the stream)."""
        stream = self.open.get(pending)
        if stream is None:
            return False
        if not stream.cancelled:
            self._stats["broken"] += 1
            self._counters.count("stream_broken")
            self._error(
                pending, "stream_broken", f"the worker went away after {stream.parts} part(s)"
            )
        return True

    def undelivered(self, frames: list[bytes], why: str) -> bool:
        """Rules ST3, ST5: the driver could not send ``frames``. An answer to an MDP/0.2 or
        majortomo client whose socket is full is held (returns ``True``: handled); a reader
        that is gone has its streams cancelled (returns ``False``: counted as usual)."""
        peer = frames[0]
        held = self._held_out.get(peer)
        if held is None:
            if why == "full" and _MDP_C02 in frames[1:3]:
                if not self._held_out and not self._retried:
                    self._retry_at = self._out.now + RETRY_DELAY
                held = self._held_out[peer] = deque()
            else:
                if self.open:
                    for stream in list(self.open.values()):
                        if stream.pending.client == peer and not stream.cancelled:
                            self._cancel(stream)
                return False
        # After a failure, the driver fails the rest of its flush to that peer (in order).
        if len(held) < MAX_HELD:
            held.append(frames)
            self._stats["held"] += 1
        else:
            self._counters.count("partial_dropped")
        return True

    # ------------------------------------------------------------------ time

    def next_retry(self) -> float | None:
        """When held messages are to be sent again, or were just sent again and the retry's
        outcome is to be acted on (Rule ST3; ``None``: nothing held)."""
        if self._held_out or self._retried:
            return self._retry_at
        return None

    def retry(self, now: float) -> None:
        """Rule ST3, if due at ``now``: send what is held again. Clients whose last retry went
        out whole get credit again for their streams."""
        if now < self._retry_at or not (self._held_out or self._retried):
            return
        retried = self._retried
        if retried:
            delivered = retried.difference(self._held_out)
            if delivered:
                for stream in list(self.open.values()):
                    if stream.key is None and stream.pending.client in delivered:
                        self._top_up(stream)
        held, self._held_out = self._held_out, {}
        self._retried = set(held)
        if held:
            self._retry_at = now + RETRY_DELAY
        for messages in held.values():
            self._outbox.extend(messages)

    def statistics(self) -> StreamStatistics:
        """A snapshot of the stream figures."""
        stats = self._stats
        return StreamStatistics(
            open=len(self.open),
            outstanding=sum(s.outstanding for s in self.open.values()),
            outstanding_max=stats["outstanding_max"],
            cancelled=stats["cancelled"],
            broken=stats["broken"],
            overruns=stats["overruns"],
            held=stats["held"],
        )


def mdp_metadata(dialect: Dialect) -> tuple[bytes, ...]:
    """Rule ST3: the metadata of an MDP client's request (asking for a stream if its dialect
    has partials)."""
    return _MDP_STREAM if dialect.partials else ()


_MDP_STREAM = (wire.stream_option(STREAM_WINDOW),)
