"""The broker's security rules for CURVE mode: a pure state machine (sans-IO).

:class:`~dcp._broker_core.BrokerCore` consults a :class:`Guard` when one is given (the broker
driver makes one when CURVE is on). The *principal* of a message is the public key (z85
text) of the connection it came on, which the ZAP handler vouched for and libzmq attaches
to the message; the driver passes it in.

Rule S1 - Principals. A message without a principal (a transport without a handshake, such
  as inproc) is refused (``unauthenticated``), and so is one from a routing id that zmq
  generated (first byte 0x00): such ids are predictable, and any peer may claim one.
Rule S2 - Routing ids belong to keys. A routing id is bound to the first key that used it;
  a message from that id under another key is refused (``routing_id_taken``). (The broker
  also turns ``ROUTER_HANDOVER`` off, so while a peer is connected nobody else can take
  its routing id; see ``docs/security.md``.) At most ``max_bound`` bindings are kept, least
  recently used first out.
Rule S3 - Registrations need permission: ``may_register(key, service)``. A refused one gets a
  ``registration_refused`` error reply (see the broker core).
Rule S4 - Client addresses are sealed. The client address in a request given to a worker is
  ``seal(address)``, an authenticated encryption of the address under a key only this
  broker knows, and the address in a worker's reply or forward must be a sealed one, which
  ``unseal`` turns back (or rejects). So a worker never learns a routing id it could use to
  pose as a client, and cannot address a client whose request it was not given.

The seal is deterministic authenticated encryption in the SIV style, built from keyed
BLAKE2b as the pseudo-random function: ``tag = BLAKE2b-128(k1, address)``, ``sealed = tag ||
address XOR BLAKE2b(k2, tag || block)...``. Unsealing decrypts and recomputes the tag; a
forged or altered alias fails. It is deterministic: a worker can tell that two requests come
from the same client, nothing more.
"""

from __future__ import annotations

import hashlib
import hmac
from collections import OrderedDict
from collections.abc import Callable

__all__ = ["Guard"]

_TAG = 16
_BLOCK = 64


class Guard:
    """Security rules S1-S4 (module docstring) for one broker.

    :param may_register: ``may_register(key, service)`` for registrations (key: z85 bytes)
    :param seal_key: 32 or more secret random bytes for sealing client addresses
    :param max_bound: routing-id bindings remembered (least recently used out)
    """

    def __init__(
        self,
        may_register: Callable[[bytes | None, bytes], bool],
        seal_key: bytes,
        *,
        max_bound: int = 65_536,
    ) -> None:
        if len(seal_key) < 32:
            raise ValueError("seal_key needs at least 32 bytes")
        self.may_register = may_register
        self.max_bound = max_bound
        self._tag_key = hashlib.blake2b(b"dcp seal tag", key=seal_key[:64]).digest()
        self._stream_key = hashlib.blake2b(b"dcp seal stream", key=seal_key[:64]).digest()
        self._owners: OrderedDict[bytes, str] = OrderedDict()

    # ---------------------------------------------------------- S1, S2

    def admit(self, peer: bytes, principal: str | None) -> str | None:
        """``None`` if a message from ``peer`` under ``principal`` may be handled, else the
        reason to refuse it."""
        if principal is None:
            return "unauthenticated"
        if not peer or peer[0] == 0:
            return "anonymous_routing_id"
        owners = self._owners
        owner = owners.get(peer)
        if owner is None:
            owners[peer] = principal
            if len(owners) > self.max_bound:
                owners.popitem(last=False)
        elif owner != principal:
            return "routing_id_taken"
        else:
            owners.move_to_end(peer)
        return None

    def owner(self, peer: bytes) -> str | None:
        """The key ``peer`` is bound to, if any."""
        return self._owners.get(peer)

    # ---------------------------------------------------------- S4

    def seal(self, address: bytes) -> bytes:
        """The sealed form of a client address, as given to workers."""
        tag = hashlib.blake2b(address, key=self._tag_key, digest_size=_TAG).digest()
        return tag + self._xor(tag, address)

    def unseal(self, sealed: bytes) -> bytes | None:
        """The address sealed in ``sealed``, or ``None`` if it was not made by :meth:`seal`."""
        if len(sealed) <= _TAG:
            return None
        tag = sealed[:_TAG]
        address = self._xor(tag, sealed[_TAG:])
        expected = hashlib.blake2b(address, key=self._tag_key, digest_size=_TAG).digest()
        return address if hmac.compare_digest(tag, expected) else None

    def _xor(self, tag: bytes, data: bytes) -> bytes:
        n = len(data)
        key = self._stream_key
        if n <= _BLOCK:
            stream = hashlib.blake2b(tag, key=key, digest_size=n).digest()
        else:
            blocks = [
                hashlib.blake2b(tag + i.to_bytes(4, "little"), key=key).digest()
                for i in range((n + _BLOCK - 1) // _BLOCK)
            ]
            stream = b"".join(blocks)[:n]
        return (int.from_bytes(data, "little") ^ int.from_bytes(stream, "little")).to_bytes(
            n, "little"
        )
