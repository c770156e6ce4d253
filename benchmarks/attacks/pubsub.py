"""Pub/sub attacks: a stalled subscriber, the last-value cache, fan-out CPU."""

from __future__ import annotations

import zmq

from .frames import request
from .harness import MB, Attacker

__all__ = ["LAST_VALUES_BROKER", "fanout", "last_values", "stalled"]

#: The last-value attack's broker keeps last values (a user's choice; off by default).
LAST_VALUES_BROKER = ("--last-values", "100000")


def subscribe(sid: bytes, pattern: bytes, *options: bytes) -> list[bytes]:
    """A ``\\xffDCP:sub`` request (answered: it carries an id)."""
    return request(b"\xffDCP:sub", sid, pattern, b"", *options, metadata=[b"\xffDCP:id=" + sid])


def publish(subject: bytes, body: bytes) -> list[bytes]:
    """A fire-and-forget ``\\xffDCP:pub`` (no metadata: not answered)."""
    return request(b"\xffDCP:pub", subject, body)


def _subscribed(a: Attacker, sock: zmq.Socket[bytes], count: int) -> int:
    ok = 0
    for _ in range(count):
        frames = a.recv(sock, 3.0)
        if frames is None:
            break
        ok += frames[-1] == b"ok"
    return ok


def stalled(a: Attacker) -> None:
    """A subscriber asking for the largest buffer that never reads, then leaves."""
    count = a.size(1500, 120)
    reader = a.socket(rcvhwm=1)
    a.send(reader, subscribe(b"s", b"stall.>", b"max-pending=100000", b"window=1000"))
    a.notes["subscribed"] = _subscribed(a, reader, 1)
    publisher = a.socket()
    body = b"p" * MB
    sent = 0
    for _ in range(count):
        if not a.send(publisher, publish(b"stall.x", body)):
            break
        sent += 1
    a.notes["published"] = sent
    a.hold(a.size(3, 0.5))


def last_values(a: Attacker) -> None:
    """One publisher, each message to a subject of its own, on a broker keeping last values."""
    count = a.size(1500, 120)
    publisher = a.socket()
    body = b"l" * MB
    sent = 0
    for i in range(count):
        if not a.send(publisher, publish(b"lv.%d" % i, body)):
            break
        sent += 1
    a.notes["published"] = sent
    a.hold(a.size(3, 0.5))


def fanout(a: Attacker) -> None:
    """One peer with its whole share of subscriptions on ``>``, then a burst of one-byte
    publishes: each is delivered once per subscription."""
    subs = a.size(10_000, 2_000)
    count = a.size(2_000, 600)
    reader = a.socket(rcvhwm=1)
    for i in range(subs):
        if not a.send(reader, subscribe(b"f%d" % i, b">", b"max-pending=1")):
            break
    ok = 0
    while ok < subs and (frames := a.recv(reader, 3.0)) is not None:
        ok += frames[-1] == b"ok"
    a.notes["subscriptions"] = ok
    publisher = a.socket()
    sent = 0
    for _ in range(count):
        if not a.send(publisher, publish(b"fan.out", b"x")):
            break
        sent += 1
    a.notes["published"] = sent
    a.hold(a.size(8, 1))
