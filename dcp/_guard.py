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
address XOR keystream``, the keystream being ``BLAKE2b-512(k2, tag || block number)``
blocks. Unsealing decrypts and recomputes the tag; a forged or altered address fails. It is
deterministic: a worker can tell that two requests come from the same client, nothing more.
The most recent ``cache`` pairs are remembered both ways, so a busy client costs two dict
lookups per request instead of four hashes (only :meth:`Guard.seal` fills the cache, so a
cached entry is genuine).
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
    :param cache: sealed addresses remembered (oldest out)
    """

    def __init__(
        self,
        may_register: Callable[[bytes | None, bytes], bool],
        seal_key: bytes,
        *,
        max_bound: int = 65_536,
        cache: int = 4096,
    ) -> None:
        if len(seal_key) < 32:
            raise ValueError("seal_key needs at least 32 bytes")
        self.may_register = may_register
        self.max_bound = max_bound
        tag_key = hashlib.blake2b(b"dcp seal tag", key=seal_key[:64]).digest()
        stream_key = hashlib.blake2b(b"dcp seal stream", key=seal_key[:64]).digest()
        # Keyed once; copying a keyed state is cheaper than keying a new one.
        self._tag = hashlib.blake2b(key=tag_key, digest_size=_TAG)
        self._stream = hashlib.blake2b(key=stream_key)
        self._owners: OrderedDict[bytes, str] = OrderedDict()
        self.cache = cache
        self._sealed: dict[bytes, bytes] = {}
        self._unsealed: dict[bytes, bytes] = {}

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
        sealed = self._sealed.get(address)
        if sealed is None:
            tag = self._mac(address)
            sealed = tag + self._xor(tag, address)
            if self.cache:
                if len(self._sealed) >= self.cache:
                    oldest = next(iter(self._sealed))
                    del self._unsealed[self._sealed.pop(oldest)]
                self._sealed[address] = sealed
                self._unsealed[sealed] = address
        return sealed

    def unseal(self, sealed: bytes) -> bytes | None:
        """The address sealed in ``sealed``, or ``None`` if it was not made by :meth:`seal`."""
        address = self._unsealed.get(sealed)
        if address is not None:
            return address
        if len(sealed) <= _TAG:
            return None
        tag = sealed[:_TAG]
        address = self._xor(tag, sealed[_TAG:])
        return address if hmac.compare_digest(tag, self._mac(address)) else None

    def _mac(self, address: bytes) -> bytes:
        h = self._tag.copy()
        h.update(address)
        return h.digest()

    def _xor(self, tag: bytes, data: bytes) -> bytes:
        n = len(data)
        blocks = []
        for i in range((n + _BLOCK - 1) // _BLOCK):
            h = self._stream.copy()
            h.update(tag + i.to_bytes(4, "little"))
            blocks.append(h.digest())
        stream = b"".join(blocks)[:n]
        return (int.from_bytes(data, "little") ^ int.from_bytes(stream, "little")).to_bytes(
            n, "little"
        )
