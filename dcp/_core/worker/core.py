"""The sans-IO state machine of a dcp worker: registration, credit, heartbeats, liveness.

:class:`WorkerCore` takes whole multipart messages from the broker (``list[bytes]``, DEALER
side) and the current time ``now``, and tells the driver what to do: messages to send, and
events: handlers to start (:class:`Run`), a lost broker to reconnect to
(:class:`BrokerLost`), a refusal (:class:`Refused`), a malformed message to log
(:class:`Malformed`).

It follows the contract of every dcp core (:mod:`dcp._core`): input methods
(:meth:`~WorkerCore.connect`, :meth:`~WorkerCore.receive`, :meth:`~WorkerCore.finish`,
:meth:`~WorkerCore.expire`, :meth:`~WorkerCore.leave`...) take ``now`` where time matters,
return nothing, and append their outputs, in order, to two lists: :attr:`WorkerCore.outbox`,
the messages to send, each a ``list[bytes]`` ready for the socket (serialized in the
type-frame width the core writes, Rule W11), and :attr:`WorkerCore.events` (:data:`Event`).
The driver takes both with :meth:`~WorkerCore.drain` after each call or batch, sends the
messages in order and acts on the events in order. Time is :meth:`~WorkerCore.expire` at
:meth:`~WorkerCore.next_deadline` or later.

The rules (``N`` is the concurrency; ``P`` the prefetch, 0 by default; ``I`` the heartbeat
interval; ``L`` the liveness):

Rule W1 (registration)
    Each connection starts with REGISTER. The broker's echo makes the core READY and resets
    the reconnect backoff. Registering is itself a readiness signal (the broker marks a newly
    registered worker ready, as MDP does with READY), so no PING follows the echo; with a
    broker that does not, the first heartbeat (a PING, Rule W5) asks for work. A PONG follows
    the echo instead: a keep-alive that asks for nothing and tells a dcp broker this worker
    beats while busy, so that its silence while busy means it hung (the broker's peers Rule
    L3; workers that never beat while busy are given a longer busy timeout).
Rule W2 (credit: ask for more work while busy, never for too much)
    The core tracks ``credit``: how many requests the broker may still send us, counting
    those already on their way. It mirrors the broker's rule (see :mod:`dcp._core.broker.core`,
    Rule W1): REGISTER sets it to 1; each REPLY or forwarded REQUEST adds 1 (it frees the
    held request's slot); each request received takes 1; a PING sets it to at least 1. A
    PING is exact only when credit is 0 (the broker's own count can be no higher than ours,
    since ours includes requests in flight), so after receiving a request the core sends a
    PING at once if there is room (``in_progress + backlog < N + P``) and credit is 0.
    Invariant: ``in_progress + backlog + credit <= N + P``, so the broker never sends more
    than the free slots and the prefetch (Rule W4). An answer to a request
    received before the current registration adds nothing: the broker forgot that request
    when it forgot us, so the answer matches nothing there and earns no credit
    (:attr:`Run.generation` tells them apart).
Rule W3 (finish)
    A finished handler's REPLY (or forwarded REQUEST) is sent and adds 1 credit (Rule W2), so
    no PING follows. If the local backlog is not empty, its oldest request takes the freed
    slot.
Rule W4 (the backlog: never more than ``N``, whatever the broker)
    With a dcp broker and no prefetch the invariant of Rule W2 keeps the backlog empty. With
    a prefetch ``P`` the core asks for up to ``P`` requests beyond its free slots (opt-in:
    one may wait here behind a slow one while another worker frees up): they wait in the
    backlog below and start in arrival order as slots free, the deadline rule applying as to
    any backlogged request; work timeouts count from a handler's start (the driver's), but a
    dcp broker counts its own from dispatch (its Rule R7), waiting included. A broker that keeps
    readiness as a single flag (as the DCP spec can be read; the DagBox reference does)
    collapses signals, so our credit can only over-estimate its count: we ask for less, not
    more. Should a request still arrive while all ``N`` slots are busy (a broker that grants
    more than it was asked for, or a re-registration while handlers run: REGISTER always
    earns one request), it waits in a local FIFO backlog and starts when a slot frees: at
    most ``N`` handlers ever run. Such requests are counted (``backlogged``). One whose
    caller's deadline (its expires-in option, counted from its arrival here) passed while it
    waited is not run: it is answered with an ``expired`` error reply at once (which frees
    its slot at the broker, Rule W3; its caller has given up and drops it) and counted
    (``expired``). One that starts carries that deadline (:attr:`Run.deadline`), so a
    driver that makes it wait again (one pool for several brokers, dcp._worker.brokers Rule
    WB1) counts it from the arrival here, not afresh.
Rule W5 (heartbeat)
    While READY, a heartbeat is due when the last one is ``I`` old and either nothing was
    sent or nothing was received for ``I`` (replies are not answered, so replies alone would
    not prove the broker alive). It is a PING if there is room (a free slot or, with a
    prefetch, room in the backlog: Rule W2), the worker is not stopping, and either credit
    is 0 or nothing is running (then a PING cannot raise the broker's count above ours, and
    it restores lost credit with a flag-keeping broker); else a PONG:
    a dcp keep-alive that refreshes the broker's liveness without asking for work.
Rule W6 (broker liveness)
    No message of any kind from the broker for ``L * I`` (also while waiting for the echo):
    the broker is gone. The core becomes DISCONNECTED and emits :class:`BrokerLost` with
    the backoff delay (exponential from ``reconnect_min`` to ``reconnect_max``, with jitter);
    the I/O layer closes the socket, waits, and calls :meth:`WorkerCore.connect` again.
Rule W7 (requests in progress across reconnects)
    Handlers that are running when the broker vanishes keep running; their results are sent
    on whatever connection is current when they finish, or kept and sent right after the
    next REGISTER if there is none (dcp clients keep their address across reconnects and drop
    duplicates by request id). When the broker fell silent (Rule W6: a fresh socket, a new
    routing id) the local backlog is dropped: the broker requeues what it had dispatched,
    and clients retry. When zmq made the connection again (Rule W12: the same socket) it is
    kept and runs as slots free, its answers sent as the running ones'.
Rule W8 (Reconnect from the broker)
    A RECONNECT (0x06) means the broker does not know us: REGISTER again at once on the same
    connection, and drop the local backlog (the broker requeued it when it dropped us).
Rule W9 (stopping)
    After :meth:`WorkerCore.stop` the core asks for no more work (heartbeats are PONGs),
    drops the backlog and every request that still arrives, and lets running handlers
    finish. :meth:`WorkerCore.leave` emits a RECONNECT for the broker (dcp extension: "I am
    leaving; requeue what I hold"), so whatever was dropped is served by another worker.
    Told to keep the backlog (a lost broker's, that no broker will give back and whose
    clients a worker serving several brokers told it holds them, dcp._worker.brokers Rule
    WB5), the core starts it as slots free, as before the stop; :meth:`WorkerCore.leave`
    drops what is left.
Rule W10 (refused registration)
    A REPLY without a client address whose data is a ``registration_refused`` error reply
    and whose metadata names our service (dcp extension, sent by a secure broker) means we
    may not serve: the core becomes CLOSED and emits :class:`Refused`. Any other REPLY is
    counted as unexpected and ignored.
Rule W11 (type-frame width)
    Messages from the broker are read in either width (1 byte, the spec; 4 bytes
    little-endian, the DagBox C++ reference). With ``type_width=1`` we start in 1 byte and
    then write in the width of the broker's last message. With ``type_width=4`` every
    message is written in 4 bytes from the first REGISTER on, whatever the broker writes: the
    explicit setting wins (a DagBox broker aborts on a 1-byte type; a dcp broker reads both).
Rule W12 (a new connection on the same socket)
    zmq reconnects a socket by itself, and the broker at the other end may be a new one (a
    restart) that does not know us. The driver reports the socket's connection events (zmq's
    monitor): :meth:`WorkerCore.connection_lost` makes the core DISCONNECTED without closing
    anything (results that finish meanwhile are kept, Rule W7; so is the backlog: the broker
    there may be the same, which never lost us and holds those requests as given to us, a
    retry joining the held copy, so that dropped they would never be answered; a worker
    serving several brokers tells their clients through the others that it holds them,
    dcp._worker.brokers Rule WB4, so that they are not sent again elsewhere; no
    heartbeats, no liveness deadline: zmq is reconnecting), and
    :meth:`WorkerCore.reconnected` sends REGISTER and then the kept results, so the broker
    knows us before it sees our answers. A new broker routes a registered worker's answer
    to its client though it never saw the request (with CURVE too: its sealing key comes
    from its secret key), so work finished across a restart is delivered, not run again.
Rule W13 (answers the broker may have lost)
    A broker killed takes with it the answers it had received but not passed on, and DCP
    has no acknowledgement: the caller's retry would run them again. So the core keeps the
    REPLYs it sent in the last ``L * I`` seconds (:mod:`dcp._core.worker.replay`: at most
    ``replay_limit`` of them and ``replay_bytes`` bytes, newest kept) and, when the
    connection is lost (:meth:`WorkerCore.connection_lost`, Rule W6, or a RECONNECT, Rule
    8), sends them again right after the next REGISTER (counted as ``replayed``), best
    effort: as one :class:`Replays` event, newest first, after the outbox (the REGISTER
    and the answers kept meanwhile, Rule W7, go first; the driver sends replays only while
    its queue has room, dcp._worker.connection Rule WC7). How many: a broker that fell
    silent (W6) or sent a RECONNECT may have lost anything of the whole window; a loss
    seen at once (the connection closed, W12) can only have taken what the broker had not
    passed on at that moment, so only the answers of the last ``I`` seconds are replayed
    then (a broker that reads and passes on our answers seconds late is a broker behind:
    the driver reports such a loss ``congested``, its send queue found full lately, and
    the whole window is replayed). Only
    answers a client recognises as duplicates: the request's first metadata part is a dcp
    request id (the client's tracker, Rule RT2, drops a reply to a finished request), and not
    a stream. MDP and DagBox clients match replies by order and never get one twice.
    Forwards are not sent again (a new broker would run the next service twice).
Rule W14 (several services)
    A worker may register several services on one connection. Each connection (and each
    RECONNECT) sends first one ``mmi.describe`` request per service that has an info
    document (metadata ``\\xffDCP:describe``, data ``[service, info]``; the broker's answer
    is ignored), then one REGISTER per service. READY comes once every registration is
    echoed; a refusal of any of them closes the core (Rule W10).
Rule W15 (answers for another broker's requests)
    A worker serving several brokers (:class:`dcp.Worker` given several endpoints) sends some
    REPLYs through a broker that did not bring their request: an answer whose own broker is
    not connected, one it replays (Rule W13) after losing that broker, and HELD notices
    (data ``[HELD_MARKER]``, :data:`dcp.wire.messages.HELD_MARKER`). :meth:`WorkerCore.relay`
    sends one while READY (else it is dropped, not kept: the other brokers carry it);
    :meth:`WorkerCore.relay_replays` the replays, as a :class:`Replays` event (best
    effort), taken from the lost broker's core (:meth:`WorkerCore.take_replays`: not
    replayed again to its successor after it registers). A dcp
    broker treats a reply that matches nothing it holds as a PING for credit (its credit
    becomes at least 1), so the core mirrors it as one: ``credit = max(credit, 1)``, never
    +1 (Rule W2). Whatever the broker then grants beyond the free slots waits in the backlog
    (Rule W4).

What the core does NOT do: open or close sockets, read clocks, sleep, run or cancel
handlers, log, or decide how long a graceful stop may take. Time is whatever ``now`` says.
"""

from __future__ import annotations

import math
import random as _random
from collections import deque
from collections.abc import Callable, Mapping, Sequence

from dcp._core.worker.outputs import (
    BrokerLost,
    Event,
    Malformed,
    Refused,
    Replays,
    Run,
    State,
    backoff_delay,
)
from dcp._core.worker.replay import SentReplies
from dcp._errors import RemoteProtocolError
from dcp._stats import WorkerStatistics
from dcp.wire.dcp1 import check_type_width, parse, serialize
from dcp.wire.messages import (
    Message,
    Ping,
    Pong,
    Reconnect,
    Register,
    Reply,
    Request,
    error_reply_data,
    parse_error_reply,
)
from dcp.wire.options import request_expires_in

#: The service a worker's descriptions go to (Rule W14): the broker's (its directory's Rule
#: D3, :data:`dcp._core.broker.directory.DESCRIBE`; the cores do not import each other).
DESCRIBE = b"mmi.describe"
#: The metadata of a worker's ``mmi.describe`` request (Rule W14), to know the answer.
DESCRIBE_TAG = b"\xffDCP:describe"

__all__ = [
    "BrokerLost",
    "Event",
    "Malformed",
    "Refused",
    "Replays",
    "Run",
    "State",
    "WorkerCore",
    "backoff_delay",
]


class WorkerCore:
    """The worker's protocol state (see the module docstring for the rules).

    :param service: the service name to register
    :param concurrency: ``N``, the most requests held at once
    :param heartbeat_interval: ``I``, in seconds
    :param liveness: ``L``; the broker is gone after ``L * I`` seconds of silence
    :param random: source of jitter in ``[0, 1)``
    :param type_width: type-frame width of what we send (Rule W11): 1 (the spec) follows the
        broker; 4 (the DagBox C++ reference) is kept whatever the broker writes
    :param replay_limit: the most recent replies kept to send again after a lost
        connection (Rule W13; 0: none)
    :param replay_bytes: the most data bytes those replies may hold together
    :param prefetch: ``P``, how many requests beyond ``concurrency`` to ask for while the
        slots are busy (Rules W2 and W4; 0: none)
    """

    def __init__(
        self,
        service: bytes,
        *,
        concurrency: int = 1,
        heartbeat_interval: float = 1.0,
        liveness: int = 3,
        reconnect_min: float = 0.1,
        reconnect_max: float = 5.0,
        random: Callable[[], float] = _random.random,
        type_width: int = 1,
        more_services: Sequence[bytes] = (),
        infos: Mapping[bytes, bytes] | None = None,
        replay_limit: int = 1024,
        replay_bytes: int = 8 << 20,
        prefetch: int = 0,
    ) -> None:
        check_type_width(type_width)
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if prefetch < 0:
            raise ValueError("prefetch must be at least 0")
        if not heartbeat_interval > 0:
            raise ValueError("heartbeat_interval must be positive")
        if liveness < 1:
            raise ValueError("liveness must be at least 1")
        if not 0 < reconnect_min <= reconnect_max:
            raise ValueError("need 0 < reconnect_min <= reconnect_max")
        self.service = service
        #: Every service registered (Rule W14): ``service`` first.
        self.services = (service, *more_services)
        #: Their info documents, sent with ``mmi.describe`` before the registrations.
        self.infos = dict(infos or {})
        self._unconfirmed: set[bytes] = set()
        #: ``N``, the most requests held at once.
        self.concurrency = concurrency
        #: ``P``, the requests asked for beyond :attr:`concurrency` (Rules W2, W4).
        self.prefetch = prefetch
        #: ``N + P``: the most requests held at once, running or waiting (Rule W2).
        self._room = concurrency + prefetch
        self.heartbeat_interval = heartbeat_interval
        self.liveness = liveness
        self.reconnect_min = reconnect_min
        self.reconnect_max = reconnect_max
        self._random = random
        #: The messages to send, in order, each ready for the socket (the module docstring).
        self.outbox: list[list[bytes]] = []
        #: What else the driver must do, in order (:data:`Event`).
        self.events: list[Event] = []
        #: Where we stand with the broker.
        self.state = State.DISCONNECTED
        #: True once :meth:`stop` was called.
        self.stopping = False
        #: The type-frame width we were told to write (Rule W11).
        self.type_width = type_width
        #: The type-frame width of what we send now (Rule W11).
        self.width = type_width
        self._in_progress = 0
        #: Counts registrations; the broker forgets our held requests between them.
        self._generation = 0
        #: Requests the broker may still send us, including those in flight (Rule W2).
        self._credit = 0
        #: Requests waiting for a slot, with the time their caller gives up (Rule W4).
        self._backlog: deque[tuple[Request, float]] = deque()
        self._pending: list[Message] = []
        #: Answers to send again after the next REGISTER, best effort (Rule W13).
        self._replays: list[Reply] = []
        self._last_send = self._last_recv = self._last_beat = 0.0
        self._failures = 0
        self._connections = 0
        self._received = self._replies = self._forwards = self._errors = 0
        self._cancelled = self._dropped = self._backlogged = self._expired = 0
        self._reregistrations = self._malformed = self._unexpected = 0
        self._sent = SentReplies(liveness * heartbeat_interval, replay_limit, replay_bytes)

    @property
    def in_progress(self) -> int:
        """Handlers running now (never more than :attr:`concurrency`)."""
        return self._in_progress

    @property
    def generation(self) -> int:
        """The current registration's number (:attr:`Run.generation` of its requests)."""
        return self._generation

    # -- inputs -------------------------------------------------------------------------

    def connect(self, now: float) -> None:
        """A fresh connection: send REGISTER, then results that finished while disconnected."""
        if self.state is not State.DISCONNECTED:
            raise RuntimeError(f"connect() in state {self.state.name}")
        self._connections += 1
        self.state = State.REGISTERING
        self._last_recv = self._last_beat = now
        self._generation += 1
        self._credit = 1
        outbox = self.outbox
        width = self.width
        for message in self._registrations():
            outbox.append(serialize(message, width=width))
        self._emit_replays(now)  # an event: sent after the outbox (remembered first: older)
        for message in self._pending:
            outbox.append(serialize(message, width=width))
            if type(message) is Reply:
                self._sent.remember(message, now)
        self._pending.clear()
        self._last_send = now

    def connection_lost(self, now: float, *, congested: bool = False) -> None:
        """Rule W12: the socket's connection went down (zmq is reconnecting it).

        :param congested: the socket's send queue was found full lately (the broker was
            behind): the whole replay window is kept, not only its last ``I`` seconds (Rule
            W13)
        """
        if self.state in (State.REGISTERING, State.READY):
            self.state = State.DISCONNECTED  # the backlog is kept (Rule W12)
            window = None if congested else self.heartbeat_interval
            self._replays[:0] = self._sent.take(now, window)

    def reconnected(self, now: float) -> None:
        """Rule W12: the socket has a new connection: REGISTER, then the kept results."""
        if self.state is State.DISCONNECTED:
            self.connect(now)
        elif self.state in (State.REGISTERING, State.READY):  # no loss was reported
            self._reregister(now)

    def receive(self, frames: Sequence[bytes], now: float) -> None:
        """A message from the broker. One that does not parse is counted and reported
        (:class:`Malformed`); it still proves the broker alive."""
        if self.state not in (State.REGISTERING, State.READY):
            return
        self._last_recv = now
        try:
            msg, width = parse(frames)
        except RemoteProtocolError as exc:
            self._malformed += 1
            self.events.append(Malformed(exc.reason, str(exc)))
            return
        if self.type_width == 1:
            self.width = width  # Rule W11: answer in kind
        if isinstance(msg, Request):
            self._on_request(msg, now)
            return
        if isinstance(msg, Register) and msg.service in self.services:
            self._unconfirmed.discard(msg.service)
            if self._unconfirmed:
                return  # Rule W14: ready once every registration is echoed
            self.state = State.READY
            self._failures = 0
            # Rule W1: a PONG tells a dcp broker that we beat while busy (its peers Rule L3).
            self._send(Pong(), now)
            return
        if isinstance(msg, Reconnect):
            self._reregister(now)
            return
        if isinstance(msg, Reply) and msg.client is None:
            refusal = parse_error_reply(msg.data)
            if (
                refusal is not None
                and refusal[0] == "registration_refused"
                and any(msg.metadata == ((s,) if s else ()) for s in self.services)
            ):
                self.state = State.CLOSED
                self.stopping = True
                self._drop_backlog()
                refused = msg.metadata[0] if msg.metadata else b""
                self.events.append(Refused(refusal[1], refused))
                return
        if isinstance(msg, Reply) and msg.metadata == (DESCRIBE_TAG,):
            return  # the broker's answer to mmi.describe (Rule W14)
        if not isinstance(msg, (Ping, Pong)):
            self._unexpected += 1

    def finish(
        self, message: Reply | Request | None, now: float, *, generation: int | None = None
    ) -> None:
        """A handler ended with ``message`` to send, or ``None`` if it was cancelled.

        :param generation: :attr:`Run.generation` of the handler's request (``None``: the
            current registration)
        """
        if self._in_progress <= 0:
            raise RuntimeError("finish() without a running handler")
        self._in_progress -= 1
        if message is None:
            self._cancelled += 1
        else:
            if isinstance(message, Request):
                self._forwards += 1
            elif parse_error_reply(message.data) is not None:
                self._errors += 1
            else:
                self._replies += 1
            if generation is None or generation == self._generation:
                # The broker releases the request and adds one credit. An answer to a
                # request from before we registered again matches nothing there: no credit.
                self._credit += 1
            self._send(message, now)
        if self._backlog:  # mostly empty: no call then
            self._start_backlog(now)

    def relay(self, reply: Reply, now: float) -> None:
        """Rule W15: send ``reply``, which answers (or is a HELD notice for) a request another
        broker brought, if READY; credit as a PING. Not kept for a replay (Rule W13)."""
        if self.state is not State.READY:
            return
        self._credit = max(self._credit, 1)
        self._last_send = now
        self.outbox.append(serialize(reply, width=self.width))

    def relay_replays(self, replies: Sequence[Reply], now: float) -> None:
        """Rule W15: send ``replies`` (another broker's answers, Rule W13) as a
        :class:`Replays` event (best effort) if READY; credit as a PING."""
        if self.state is not State.READY or not replies:
            return
        self._credit = max(self._credit, 1)
        self._last_send = now
        width = self.width
        self.events.append(Replays(tuple(serialize(r, width=width) for r in reversed(replies))))

    def backlog_requests(self) -> list[Request]:
        """The requests waiting in the backlog (Rule W4), oldest first, left there: a worker
        serving several brokers tells their clients it holds them when this broker is lost
        (Rule W12)."""
        return [request for request, _ in self._backlog]

    def take_replays(self) -> list[Reply]:
        """The answers kept to send again after the next registration (Rule W13), oldest
        first, forgotten here: a worker serving several brokers sends them through the
        others at once (W15), and not again to this broker's successor."""
        replays, self._replays = self._replays, []
        return replays

    def drain(self) -> tuple[list[list[bytes]], list[Event]]:
        """Take what the calls since the last drain asked for: the messages to send and
        the events, each in order (the core's lists start empty again)."""
        outbox, events = self.outbox, self.events
        self.outbox = []
        self.events = []
        return outbox, events

    def expire(self, now: float) -> None:
        """Time passed: maybe a heartbeat (Rule W5), maybe the broker is gone (Rule W6)."""
        if self.state not in (State.REGISTERING, State.READY):
            return
        if now >= self._last_recv + self.liveness * self.heartbeat_interval:
            self.state = State.DISCONNECTED
            self._drop_backlog()
            self._replays[:0] = self._sent.take(now)
            delay = backoff_delay(
                self._failures, self.reconnect_min, self.reconnect_max, self._random()
            )
            self._failures += 1
            self.events.append(BrokerLost(delay))
        elif self.state is State.READY and now >= self._heartbeat_due():
            if self._has_room() and (self._credit == 0 or self._in_progress == 0):
                self._credit = max(self._credit, 1)
                self._send(Ping(), now)
            else:
                self._send(Pong(), now)

    def next_deadline(self) -> float | None:
        """When :meth:`expire` next has something to do (``None``: nothing until more
        input)."""
        if self.state not in (State.REGISTERING, State.READY):
            return None
        lost = self._last_recv + self.liveness * self.heartbeat_interval
        if self.state is State.READY:
            return min(lost, self._heartbeat_due())
        return lost

    def stop(self, *, keep_backlog: bool = False) -> None:
        """Stop asking for work and drop the backlog (Rule W9). Idempotent.

        :param keep_backlog: keep the backlog instead, to start as slots free
        """
        self.stopping = True
        if not keep_backlog:
            self._drop_backlog()

    def leave(self) -> None:
        """Leave for good: a RECONNECT for the broker if we are (being) registered."""
        if self.state in (State.REGISTERING, State.READY):
            self.outbox.append(serialize(Reconnect(), width=self.width))
        self.stopping = True
        self.state = State.CLOSED
        self._drop_backlog()
        self._pending.clear()
        self._replays.clear()

    def statistics(self) -> WorkerStatistics:
        """A snapshot of the counters."""
        return WorkerStatistics(
            received=self._received,
            replies=self._replies,
            forwards=self._forwards,
            errors=self._errors,
            cancelled=self._cancelled,
            dropped=self._dropped,
            in_progress=self._in_progress,
            backlog=len(self._backlog),
            backlogged=self._backlogged,
            reconnects=max(0, self._connections - 1),
            reregistrations=self._reregistrations,
            malformed=self._malformed,
            unexpected=self._unexpected,
            expired=self._expired,
            replayed=self._sent.replayed,
        )

    # -- helpers ------------------------------------------------------------------------

    def _registrations(self) -> list[Message]:
        """Rule W14: every description, then every registration."""
        self._unconfirmed = set(self.services)
        infos = self.infos
        described: list[Message] = [
            Request(DESCRIBE, None, (DESCRIBE_TAG,), (name, infos[name]))
            for name in self.services
            if name in infos
        ]
        return described + [Register(name) for name in self.services]

    def _on_request(self, request: Request, now: float) -> None:
        self._received += 1
        if self._credit:
            self._credit -= 1
        if self.stopping:
            self._dropped += 1
            return
        if self._in_progress < self.concurrency:
            self._in_progress += 1
            self.events.append(Run(request, self._generation))
        else:
            expires_in = request_expires_in(request.metadata)
            self._backlog.append((request, math.inf if expires_in is None else now + expires_in))
            self._backlogged += 1
        # Rule W2: ask for more if there is room and no request is owed to us already.
        if self.state is State.READY and self._credit == 0 and self._has_room():
            self._credit = 1
            self._send(Ping(), now)

    def _start_backlog(self, now: float) -> None:
        """Rule W4: the oldest backlog request whose caller still waits takes the free slot;
        those past their deadline are answered ``expired`` (each adds 1 credit, Rule W3)."""
        backlog = self._backlog
        while backlog:
            request, deadline = backlog.popleft()
            if now < deadline:
                self._in_progress += 1
                self.events.append(Run(request, self._generation, deadline))
                return
            self._expired += 1
            self._credit += 1
            data = error_reply_data(
                "expired", "the caller's deadline passed while the request waited for a slot"
            )
            self._send(Reply(request.client, request.metadata, data), now)

    def _reregister(self, now: float) -> None:
        """Rule W8: REGISTER again on this connection."""
        self._reregistrations += 1
        self.state = State.REGISTERING
        self._drop_backlog()
        self._generation += 1
        self._credit = 1  # the broker forgot us: nothing is on its way, REGISTER grants 1
        self._replays[:0] = self._sent.take(now)
        for message in self._registrations():
            self._send(message, now)
        self._emit_replays(now)

    def _emit_replays(self, now: float) -> None:
        """Rule W13: the kept answers, as one :class:`Replays` event (newest first), after
        the outbox; remembered again (a later loss replays them too)."""
        replays = self._replays
        if not replays:
            return
        self._replays = []
        width = self.width
        remember = self._sent.remember
        for reply in replays:
            remember(reply, now)
        self.events.append(Replays(tuple(serialize(r, width=width) for r in reversed(replays))))

    def _has_room(self) -> bool:
        """Rule W2: a free slot, or (with a prefetch) room in the backlog."""
        return not self.stopping and self._in_progress + len(self._backlog) < self._room

    def _heartbeat_due(self) -> float:
        quiet = min(self._last_send, self._last_recv)
        return max(self._last_beat, quiet) + self.heartbeat_interval

    def _send(self, message: Message, now: float) -> None:
        if self.state in (State.REGISTERING, State.READY):
            self._last_send = now
            if isinstance(message, (Ping, Pong)):
                self._last_beat = now
            elif type(message) is Reply:
                self._sent.remember(message, now)
            self.outbox.append(serialize(message, width=self.width))
        elif self.state is State.DISCONNECTED and isinstance(message, (Reply, Request)):
            self._pending.append(message)  # Rule W7: sent after the next REGISTER

    def _drop_backlog(self) -> None:
        self._dropped += len(self._backlog)
        self._backlog.clear()
