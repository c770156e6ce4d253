"""A worker serving several brokers (:class:`Brokers`): one :class:`Link` per broker (its
core, connection and streams, each registering, heartbeating and reconnecting on its own) and
one handler pool shared by them all (docs/scaling.md).

Used by :class:`dcp.Worker` given several endpoints; one endpoint takes the worker's own
serving tasks (Rules WL1-WL4 of :mod:`dcp._worker.worker`) and none of this. Each link is
served by a task of its own that reads its socket and runs nothing inline: its requests go to
the pool (the handlers' slots).

Rules:

Rule WB1 - One pool. At most ``concurrency`` handlers run at once across all brokers. Each
  broker may grant up to ``concurrency`` plus the prefetch (its own core's credit, core Rule
  W2: the prefetch is per broker), so the worker may hold up to ``brokers x (concurrency +
  prefetch)`` requests: those beyond the free slots wait here (or in a core's backlog),
  first come first run (a request a core starts from its backlog as one of its own ends
  joins the end of the queue here: a broker that keeps its prefetch full does not starve
  the others' requests); one whose caller's deadline (its expires-in option, counted from its
  arrival at the worker: one a core started from its backlog keeps the deadline its core
  counted, core Rule W4) passed while it waited is answered ``expired`` without running (as
  core Rule W4). A stop drops the waiting ones (core Rule W9; not those of Rule WB5); a
  RECONNECT from a broker (core Rule W8: it gave back what it held) drops the copies it
  brought that wait (another worker runs them).
Rule WB2 - Where an answer goes. Through every broker that brought the request (Rule WB3),
  each as its core's answer (core Rule W3; with the client address and metadata that broker
  gave); a core that is not connected keeps it for its next registration (core Rule W7).
  If none of those brokers is READY, the answer also goes through any READY one (the
  client is connected to it; core Rule W15). A forward (:class:`dcp.Forward`) goes once,
  through the broker that brought the request first; the others' copies are answered with
  a HELD notice (Rule WB4's; it releases the copy there, which a broker would otherwise
  hold until this worker leaves and then give to another: run twice), sent before the
  forward (the forward's broker may hold two copies, and must not see a notice for a copy
  the forward released: it would end the queued forward, routing Rule R11).
Rule WB3 - Duplicates. A request is known by its dcp request id (its first metadata part;
  not for streams, nor requests without one). One whose id the worker holds (running, or
  waiting for a slot) is not run again, whichever broker brings it: it joins the held one,
  whose answer goes to its broker too (a copy waiting in a core's backlog does so when its
  core starts it, Rule WB1, or is answered from the kept answer). One answered in the last
  ``liveness x heartbeat_interval`` seconds (core Rule W13's window and bounds) is answered
  again from the kept answer without running (one forwarded, Rule WB2, with a HELD notice:
  the next service answers it); one older than that runs again. Both are counted
  (``duplicates``).
Rule WB4 - A lost broker. When a link loses its broker (its monitor reports the connection
  down, core Rule W12, or the broker fell silent, core Rule W6; not on a RECONNECT from a
  live broker, nor when the worker leaves it or it refused the registration), then for every
  request it brought that the worker holds (Rule WB1: running, waiting here, or waiting in
  that link's core, its prefetch: kept across a closed connection, core Rule W12, and run
  later; dropped, so not announced, when the broker fell silent, core Rule W7) and that has
  a dcp request id (Rule WB3), a HELD notice (a REPLY whose data is
  ``[HELD_MARKER]``, with the request's client address and metadata as received) goes
  through every other READY broker but those that brought the same request too (the worker
  holds their copy, here or in their core's backlog: there a notice would match it and be
  taken for its answer), and then the answers that link's core would replay (core
  Rule W13), taken from it (not replayed again to the lost broker's successor once it
  registers; with no other READY broker they are kept for it). A client connected to
  several brokers learns at once that its request runs, and gets the answers the lost
  broker took down. Each is a relay (core Rule W15: credit as a PING). The notices are
  fresh messages (never dropped for a full queue, dcp._worker.connection Rule WC6), the
  replays best effort, after them (WC7); answers finished while the link is down go
  through the other brokers as Rule WB2 says.
Rule WB5 - Ends. A refused registration or a failed handshake at any broker ends serving (the
  same keys and services serve every broker: a mistake, not an outage). A stop ends each
  link once its core holds nothing (or the grace passed: the handlers are cancelled), with
  a RECONNECT for its broker (core Rule W9). What a stop drops (Rule WB1) its brokers give
  to another worker when it leaves, but not a lost broker: the requests the worker told
  their clients it holds (Rule WB4) that no live broker brought (waiting here, or in a
  lost link's core) are kept and run within the grace, as the running ones (dropped, their
  clients would wait for their attempt timeout to send them again); a live link leaves
  only once they and the lost links' running ones are answered (through it, Rule WB2).
"""

from __future__ import annotations

import functools
import logging
import math
from collections import deque
from collections.abc import Callable, Sequence

import anyio
import anyio.abc
import anyio.lowlevel
import attrs

from dcp._core.worker.core import (
    BrokerLost,
    Malformed,
    Refused,
    Replays,
    Run,
    State,
    WorkerCore,
)
from dcp._core.worker.replay import Answered
from dcp._errors import RegistrationRefused
from dcp._io.sockets import AsyncSocket, Received
from dcp._models import service_name
from dcp._stats import WorkerStatistics
from dcp._worker.connection import Connection
from dcp._worker.handlers import Handlers, Route, capacity
from dcp._worker.streams import WorkerStreams
from dcp.wire.messages import HELD_MARKER, Reply, Request, error_reply_data
from dcp.wire.options import REQUEST_ID_PREFIX, request_expires_in
from dcp.wire.streams import STREAM_OPTION

__all__ = ["Brokers", "Link"]

logger = logging.getLogger("dcp.worker")

#: Messages read per wake-up before other tasks get a turn.
_BATCH = 64
#: Linger (ms) of a socket closed after a graceful leave (as the one-broker worker's).
_LEAVE_LINGER_MS = 500


def request_key(request: Request) -> bytes | None:
    """Rule WB3: the dcp request id a request is known by, or ``None`` (no id; a stream)."""
    metadata = request.metadata
    if not metadata or not metadata[0].startswith(REQUEST_ID_PREFIX):
        return None
    for part in metadata[1:]:
        if part.startswith(STREAM_OPTION):
            return None
    return metadata[0]


class Link:
    """One broker of a worker serving several: its core, connection and streams.

    :param core: the broker's core
    :param connect: makes the broker's connection, given the core, the streams run for
        requests this broker brought, and what wakes this link's serving task
    """

    def __init__(
        self,
        core: WorkerCore,
        connect: Callable[[WorkerCore, WorkerStreams, Callable[[], None]], Connection],
    ) -> None:
        self.core = core
        #: The streams run for requests this broker brought.
        self.streams = streams = WorkerStreams()
        self.connection = connect(core, streams, self.wake)
        #: Requests this broker brought that were duplicates (Rule WB3).
        self.duplicates = 0
        #: Whether the core was REGISTERING or READY when last looked at (Rule WB4).
        self.up = False
        #: Whether the registration at this broker was logged (once per READY).
        self.announced = False
        #: The core's registration and reconnections when last looked at (a new
        #: registration while up: a RECONNECT, or a loss not seen).
        self.generation = 0
        self.connections = 0
        #: Whether the requests it brought were announced held when it was last lost
        #: (Rule WB4: another broker was READY to carry the notices).
        self.announced_loss = False
        #: Sleeping between connections: the scope :meth:`wake` cancels.
        self.sleep: anyio.CancelScope | None = None

    @property
    def endpoint(self) -> str:
        """The broker's endpoint."""
        return self.connection.endpoint

    def wake(self) -> None:
        """Wake the link's serving task (its socket's wait, or its sleep)."""
        if self.sleep is not None:
            self.sleep.cancel()
        asock = self.connection.socket
        if asock is not None:
            asock.wake()

    def statistics(self) -> WorkerStatistics:
        """The core's counters, with the connection's send failures and the state."""
        return attrs.evolve(
            self.core.statistics(),
            send_failures=self.connection.send_failures,
            replays_dropped=self.connection.replays_dropped,
            registered=self.core.state is State.READY,
            duplicates=self.duplicates,
        )


class _Held:
    """A request the worker holds (Rule WB1): the run given to the pool and every broker's
    copy of it (Rule WB3)."""

    __slots__ = ("deadline", "joined", "key", "run")

    def __init__(self, key: bytes | None, link: Link, run: Run, deadline: float) -> None:
        self.key = key
        self.run = run
        self.deadline = deadline
        #: (link, that broker's run), the first the one run.
        self.joined: list[tuple[Link, Run]] = [(link, run)]


class Brokers:
    """Serve several brokers with one handler pool (the module's rules).

    :param links: one per broker, in the order given
    :param handlers: the worker's handlers (their :attr:`~Handlers.finish` and
        :attr:`~Handlers.route` are set here, Rule WH7)
    :param names: the services, for log lines
    :param ready: called once the first broker has echoed the registration
    """

    def __init__(
        self,
        links: Sequence[Link],
        handlers: Handlers,
        *,
        names: str,
        ready: Callable[[], None],
    ) -> None:
        self.links = tuple(links)
        self._handlers = handlers
        handlers.finish = self._finish
        handlers.route = self._route
        self._names = names
        self._ready = ready
        first = self.links[0].core
        self.concurrency = first.concurrency
        sent = first.liveness * first.heartbeat_interval
        self._answered = Answered(sent, 1024, 8 << 20)
        #: Held requests by request id (Rule WB3), and by their run's id.
        self._by_key: dict[bytes, _Held] = {}
        self._by_run: dict[int, _Held] = {}
        #: Held requests waiting for a slot (Rule WB1), and handlers running.
        self._waiting: deque[_Held] = deque()
        self._running = 0
        #: Duplicates joined or answered from a kept answer (Rule WB3).
        self.duplicates = 0
        #: Waiting requests answered ``expired`` (Rule WB1), HELD notices sent (WB4).
        self.expired = self.notices = 0
        #: When a stop ends (``None``: not stopping).
        self.stop_deadline: float | None = None
        #: What ended serving, if it must end: a refusal (Rule WB5).
        self.refused: RegistrationRefused | None = None
        self._scope: anyio.CancelScope | None = None

    # -- serving -------------------------------------------------------------------------

    async def serve(self) -> None:
        """Serve every link until each has left (a stop) or one must end serving (Rule
        WB5)."""
        async with anyio.create_task_group() as tg:
            self._scope = tg.cancel_scope
            for link in self.links:
                tg.start_soon(self._serve_link, link, tg)

    def stop(self, deadline: float) -> None:
        """Begin a stop ending at ``deadline`` (Rule WB5); drop the waiting requests but
        those announced held after a loss."""
        if self.stop_deadline is None or deadline < self.stop_deadline:
            self.stop_deadline = deadline
        for link in self.links:
            # No more work, nor the cores' backlogs (core Rule W9); a lost broker's that
            # was announced (Rule WB4) runs: no broker gives it back.
            link.core.stop(keep_backlog=link.announced_loss and not link.up)
        waiting, self._waiting = self._waiting, deque()
        for held in waiting:
            if all(link.announced_loss and not link.up for link, _ in held.joined):
                self._waiting.append(held)
            else:
                self._answer(held, None)
        for link in self.links:
            link.wake()

    def close(self) -> None:
        """Close every connection at once (linger 0); the cores are closed (not registered
        anywhere any more; nothing is sent)."""
        for link in self.links:
            link.connection.close(0)
            link.core.leave()
            link.core.drain()

    def statistics(self) -> WorkerStatistics:
        """The worker's totals: every broker's counters summed (a request each broker
        brought counted at each), registered at any; expired waits (Rule WB1) counted as
        ``expired``, not as the error replies the cores saw."""
        each = [link.statistics() for link in self.links]
        fields = [f.name for f in attrs.fields(WorkerStatistics) if f.name != "registered"]
        totals = {name: sum(getattr(stats, name) for stats in each) for name in fields}
        totals["expired"] += self.expired
        totals["errors"] -= self.expired
        return WorkerStatistics(**totals, registered=any(stats.registered for stats in each))

    def in_progress(self) -> int:
        """Requests held at every broker (each broker's copy counted)."""
        return sum(link.core.in_progress for link in self.links)

    def _announced_work(self) -> bool:
        """Rule WB5: whether a lost broker's requests announced held are still held (their
        answers go through a live broker: it leaves only after them)."""
        return any(
            link.announced_loss and not link.up and link.core.in_progress for link in self.links
        )

    def _end(self) -> None:
        """Rule WB5: end serving at every broker."""
        if self._scope is not None:
            self._scope.cancel()

    async def _serve_link(self, link: Link, tg: anyio.abc.TaskGroup) -> None:
        core = link.core
        connection = link.connection
        while self.stop_deadline is None:
            asock = connection.open(tg)
            core.connect(anyio.current_time())
            lost = self._flush(link)
            if lost is None:
                lost = await self._session(link, asock)
            link.streams.cancel_all()  # the broker forgot our streams
            if type(lost) is not BrokerLost:
                if connection.failure is not None or self.refused is not None:
                    self._end()
                return
            refused = connection.refused  # said already (dcp._worker.connection Rule WC8)
            connection.close(0)
            self._look(link)
            logger.log(
                logging.DEBUG if refused else logging.WARNING,
                "broker %s silent; reconnecting in %.2fs",
                link.endpoint,
                lost.delay,
            )
            with anyio.CancelScope(deadline=anyio.current_time() + lost.delay) as scope:
                link.sleep = scope
                try:
                    await anyio.sleep_forever()
                finally:
                    link.sleep = None
        # Stopping without a connection: wait for what this broker brought, then leave.
        deadline = self.stop_deadline
        while core.in_progress and anyio.current_time() < deadline:
            with anyio.CancelScope(deadline=deadline) as scope:
                link.sleep = scope
                try:
                    await anyio.sleep_forever()
                finally:
                    link.sleep = None
        if core.in_progress:
            self._handlers.cancel()
        core.leave()
        core.drain()

    async def _session(self, link: Link, asock: AsyncSocket) -> BrokerLost | Refused | None:
        """Serve one connection of ``link``; why it ended (``None``: left, or failed)."""
        core = link.core
        connection = link.connection
        receive = link.streams.receive
        now = anyio.current_time
        batch: list[Received] = []
        while True:
            for received in batch:
                frames = received.frames
                if receive(frames):
                    continue  # a stream's credit or cancel
                core.receive(frames, now())
                ended = self._flush(link)
                if ended is not None:
                    return ended
            if batch:
                await anyio.lowlevel.checkpoint()  # the pool's runs, and the other links
            connection.poll()
            self._look(link)
            if connection.failure is not None:
                return None
            stop = self.stop_deadline
            if stop is not None and (
                (core.in_progress == 0 and not self._announced_work()) or now() >= stop
            ):
                if core.in_progress:
                    self._handlers.cancel()
                core.leave()
                self._flush(link)
                connection.close(_LEAVE_LINGER_MS)
                return None
            core.expire(now())
            ended = self._flush(link)
            if ended is not None:
                return ended
            deadline = core.next_deadline()
            if deadline is None:
                deadline = math.inf
            if stop is not None:
                deadline = min(deadline, stop)
            await asock.wait_readable(deadline)
            batch = asock.drain(_BATCH)

    def _flush(self, link: Link) -> BrokerLost | Refused | None:
        """Send what ``link``'s core asked for and act on its events; the event that ends
        its session, if any."""
        core = link.core
        outbox, events = core.drain()
        send = link.connection.send
        for frames in outbox:
            send(frames)
        ended: BrokerLost | Refused | None = None
        for event in events:
            if type(event) is Run:
                self._admit(link, event)
            elif type(event) is Replays:  # best effort (dcp._worker.connection Rule WC7)
                link.connection.send_replays(event.messages)
            elif type(event) is BrokerLost:
                ended = event
            elif type(event) is Malformed:
                logger.warning(
                    "malformed message from broker %s (%s): %s",
                    link.endpoint,
                    event.reason,
                    event.message,
                )
            elif type(event) is Refused:
                refused = service_name(event.service) if event.service else self._names
                logger.error(
                    "broker %s refused the registration for %r: %s",
                    link.endpoint,
                    refused,
                    event.message,
                )
                self.refused = RegistrationRefused(refused, event.message)
                ended = event
        self._look(link)
        return ended

    def _look(self, link: Link) -> None:
        """Note ``link``'s state: its first registration (ready), a lost broker (WB4), a
        broker that gave back what it held (WB1)."""
        core = link.core
        state = core.state
        if state is State.READY or state is State.REGISTERING:
            generation = core.generation
            if generation != link.generation:
                link.generation = generation
                if link.up:
                    connections = core.statistics().reconnects
                    if connections != link.connections:
                        self._lost(link)  # lost and connected again unseen (core Rule W12)
                    else:  # registered again on the same connection: a RECONNECT (W8)
                        self._given_back(link)
                link.connections = core.statistics().reconnects
        if state is State.READY:
            link.up = True
            if not link.announced:
                link.announced = True
                logger.info(
                    "worker serving %s at %s (%s)",
                    self._names,
                    link.endpoint,
                    capacity(self.concurrency, core.prefetch),
                )
                self._ready()
        elif state is State.REGISTERING:
            link.up = True
        elif link.up:
            link.up = False
            link.announced = False
            if state is State.DISCONNECTED:  # not CLOSED: left (a stop) or refused
                self._lost(link)

    # -- the pool (Rules WB1-WB3) ------------------------------------------------------------

    def _admit(self, link: Link, run: Run) -> None:
        """A request from ``link``'s core: join it, answer it from a kept answer, run it, or
        let it wait for a slot."""
        request = run.request
        key = request_key(request)
        now = anyio.current_time()
        if key is not None:
            held = self._by_key.get(key)
            if held is not None:  # Rule WB3: running or waiting: join it
                self.duplicates += 1
                link.duplicates += 1
                held.joined.append((link, run))
                return
            data = self._answered.get(key, now)
            if data is not None:  # Rule WB3: answered lately
                self.duplicates += 1
                link.duplicates += 1
                link.core.finish(
                    Reply(request.client, request.metadata, data), now, generation=run.generation
                )
                self._flush(link)
                return
        deadline = run.deadline  # Rule WB1: from its core's backlog, counted there
        if deadline is None:
            expires_in = request_expires_in(request.metadata)
            deadline = math.inf if expires_in is None else now + expires_in
        held = _Held(key, link, run, deadline)
        if key is not None:
            self._by_key[key] = held
        self._by_run[id(run)] = held
        if self._running < self.concurrency and not self._waiting:
            self._start(held)
        else:  # behind those waiting: one a core starts from its backlog too (Rule WB1)
            self._waiting.append(held)

    def _given_back(self, link: Link) -> None:
        """Rule WB1 with core Rule W8: ``link``'s broker re-registered us (it forgot us and
        gave back what it held, to run elsewhere): its copies still waiting for a slot are
        dropped, as the core drops its backlog (ended as cancelled there)."""
        core = link.core
        generation = core.generation
        now = anyio.current_time()
        for held in list(self._waiting):
            kept = [
                (one, run)
                for one, run in held.joined
                if one is not link or run.generation == generation
            ]
            if len(kept) == len(held.joined):
                continue
            for one, run in held.joined:
                if one is link and run.generation != generation:
                    core.finish(None, now, generation=run.generation)
            self._by_run.pop(id(held.run), None)
            if not kept:
                self._waiting.remove(held)
                if held.key is not None:
                    self._by_key.pop(held.key, None)
                continue
            held.joined = kept
            held.run = kept[0][1]
            self._by_run[id(held.run)] = held

    def _start(self, held: _Held) -> None:
        slots = self._handlers.slots
        assert slots is not None
        self._running += 1
        slots.submit(held.run)

    def _finish(self, message: Reply | Request | None, run: Run) -> None:
        """Rule WH7: a run ended with ``message``; answer it (WB2), start a waiting one."""
        held = self._by_run.get(id(run))
        if held is None:  # pragma: no cover - every run given to the slots is held
            return
        self._running -= 1
        self._answer(held, message)
        now = anyio.current_time()
        waiting = self._waiting
        while waiting and self._running < self.concurrency:
            held = waiting.popleft()
            if now < held.deadline:
                self._start(held)
                break
            self.expired += 1  # Rule WB1
            request = held.run.request
            data = error_reply_data(
                "expired", "the caller's deadline passed while the request waited for a slot"
            )
            self._answer(held, Reply(request.client, request.metadata, data))
        if self.stop_deadline is not None:
            for link in self.links:
                link.wake()

    def _answer(self, held: _Held, message: Reply | Request | None) -> None:
        """Rule WB2: end ``held`` at every broker that brought it, with ``message``."""
        self._by_run.pop(id(held.run), None)
        if held.key is not None:
            self._by_key.pop(held.key, None)
        now = anyio.current_time()
        is_reply = type(message) is Reply
        if held.key is not None and message is not None:
            # Rule WB3; a forward is kept as a HELD notice: the next service answers it.
            data = message.data if type(message) is Reply else (HELD_MARKER,)
            self._answered.remember(held.key, data, now)
        delivered = False
        copies = held.joined
        if type(message) is Request and len(copies) > 1:
            # The HELD notices first: one through the forward's broker must release its
            # copy there before the forward queues the next service's (which a notice
            # matching nothing would end, routing Rule R11).
            copies = [*copies[1:], copies[0]]
        for link, joined in copies:
            link.connection.poll()
            self._look(link)
            out: Reply | Request | None = None
            if joined is held.run:
                out = message
            elif is_reply:
                assert type(message) is Reply
                request = joined.request
                out = Reply(request.client, request.metadata, message.data)
            elif message is not None:
                # A forward goes once (through the first broker); this broker's copy ends
                # with a HELD notice: released there (not given to another worker when
                # this one leaves, which would run it twice), its client told it runs.
                request = joined.request
                out = Reply(request.client, request.metadata, (HELD_MARKER,))
            core = link.core
            if out is not None and core.state is State.READY:
                delivered = True
            core.finish(out, now, generation=joined.generation)
            self._flush(link)
        if is_reply and not delivered:
            assert type(message) is Reply
            for link in self.links:  # Rule WB2: through any READY broker
                if link.core.state is State.READY:
                    link.core.relay(message, now)
                    self._flush(link)
                    break

    def _route(self, request: Request) -> Route:
        """Rule WH7: a stream's parts go through the broker that brought it."""
        link = self.links[0]
        for held in self._by_run.values():
            if held.run.request is request:
                link = held.joined[0][0]
                break
        return (
            link.streams,
            link.connection.send_part,
            functools.partial(getattr, link.core, "width"),
        )

    # -- a lost broker (Rule WB4) ----------------------------------------------------------

    def _lost(self, lost: Link) -> None:
        others = [
            link for link in self.links if link is not lost and link.core.state is State.READY
        ]
        lost.announced_loss = bool(others)
        if not others:
            return
        now = anyio.current_time()
        # Who holds a copy of each request: the links whose copies the pool holds, and those
        # whose core keeps one in its backlog. No notice goes through those (the worker holds
        # their copy: a notice would match it there and be taken for its answer, releasing
        # it and granting a credit the worker does not mirror).
        holders: dict[bytes, set[Link]] = {}
        for link in self.links:
            for request in link.core.backlog_requests():
                key = request_key(request)
                if key is not None:
                    holders.setdefault(key, set()).add(link)
        # One notice per request the lost broker brought: held here, then waiting in its
        # core's backlog (its prefetch: kept, core Rule W12, and run later).
        notices: dict[bytes, Reply] = {}
        for held in self._by_run.values():
            key = held.key
            if key is None:
                continue
            links = holders.setdefault(key, set())
            for link, joined in held.joined:
                links.add(link)
                if link is lost and key not in notices:
                    request = joined.request
                    notices[key] = Reply(request.client, request.metadata, (HELD_MARKER,))
        for request in lost.core.backlog_requests():
            key = request_key(request)
            if key is not None and key not in notices:
                notices[key] = Reply(request.client, request.metadata, (HELD_MARKER,))
        # Taken: sent through the others now, not again to the lost broker's successor.
        replays = lost.core.take_replays()
        for link in others:
            core = link.core
            for key, notice in notices.items():
                if link not in holders[key]:
                    core.relay(notice, now)
                    self.notices += 1
            core.relay_replays(replays, now)  # after the notices, best effort
            self._flush(link)
