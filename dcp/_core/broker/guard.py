"""The broker's security rules for CURVE mode: a pure state machine (sans-IO).

:class:`~dcp._core.broker.core.BrokerCore` consults a :class:`Guard` when one is given (the broker
driver makes one when CURVE is on). The *principal* of a message is the public key (z85
text) of the connection it came on, which the ZAP handler vouched for and libzmq attaches
to the message; the driver passes it in.

Rule S1 - Principals. A message without a principal (a transport without a handshake, such
  as inproc) is refused (``unauthenticated``).
Rule S2 - Routing ids belong to keys. A routing id is bound to the first key that used it;
  a message from that id under another key is refused (``routing_id_taken``). This holds for
  the ids peers choose and for the ones the broker's zmq generates for peers that set none
  (first byte 0x00; MDP and DagBox C++ peers): a generated id is predictable, but whoever
  uses it first owns it, so another key can at worst make it unusable for the peer it would
  have been generated for (denial of service by a key holder), never receive that peer's
  replies. (The broker also turns ``ROUTER_HANDOVER`` off, so while a peer is connected
  nobody else can take its routing id; see ``docs/security.md``.) At most ``max_bound``
  bindings are kept, least recently used first out.
Rule S3 - Registrations need permission: ``may_register(key, service)``. A refused one gets a
  ``registration_refused`` error reply (see the broker core).
Rule S5 - Revocation. The allow-lists can be replaced while the broker runs
  (:meth:`Guard.reload`). A key that may no longer connect is refused on every message
  (``revoked``) until the broker has dropped its connection (it drops every accepted tcp
  and ipc connection when a reload revokes a key: :mod:`dcp._broker.connections`), and the broker
  removes every worker whose key may no longer register one of its services, telling it
  as a refused registration and redelivering what it held
  (:meth:`~.redelivery.Redelivery.revoke`). New handshakes follow the new lists at once (the
  ZAP handler asks the same policy).
Rule S4 - Client addresses are sealed. The client address in a request given to a worker is
  ``seal(address)``, an authenticated encryption of the address under a key only this
  broker knows, and the address in a worker's reply or forward must be a sealed one, which
  ``unseal`` turns back (or rejects). So a worker never learns a routing id it could use to
  pose as a client, and cannot address a client whose request it was not given.

The seal is AES-SIV (RFC 5297, deterministic authenticated encryption; here AES-256-SIV
from the ``cryptography`` package, a vetted implementation): ``sealed = SIV tag (16 bytes) ||
ciphertext``, under a key derived from the broker's secret. Unsealing checks the tag; a forged
or altered address fails. It is deterministic: a worker can tell that two requests come from
the same client, nothing more. The most recent ``cache`` pairs are remembered both ways, so a
busy client costs two dict lookups per request (only :meth:`Guard.seal` fills the cache, so a
cached entry is genuine). (Until this release the seal was a home-made SIV construction over
keyed BLAKE2b; AES-SIV is both vetted and, measured here, half its cost per seal and unseal.)
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable

__all__ = ["Guard"]

_TAG = 16


class Guard:
    """Security rules S1-S4 (module docstring) for one broker.

    :param may_register: ``may_register(key, service)`` for registrations (key: z85 bytes)
    :param seal_key: 32 or more secret random bytes for sealing client addresses
    :param may_connect: ``may_connect(key)``, whether a key may still be heard (Rule S5;
        default: every key the ZAP handler let in)
    :param max_bound: routing-id bindings remembered (least recently used out)
    :param cache: sealed addresses remembered (oldest out)
    """

    def __init__(
        self,
        may_register: Callable[[bytes | None, bytes], bool],
        seal_key: bytes,
        *,
        may_connect: Callable[[bytes], bool] | None = None,
        max_bound: int = 65_536,
        cache: int = 4096,
    ) -> None:
        if len(seal_key) < 32:
            raise ValueError("seal_key needs at least 32 bytes")
        self.may_register = may_register
        self.may_connect = may_connect
        #: Rule S5: ``may_connect`` per principal seen since the last reload.
        self._connect: dict[str, bool] = {}
        self.max_bound = max_bound
        # cryptography is imported when a Guard is made (CURVE on), not with dcp.
        from cryptography.exceptions import InvalidTag
        from cryptography.hazmat.primitives.ciphers.aead import AESSIV

        #: What a forged or altered sealed address raises (Rule S4).
        self._forged: type[Exception] = InvalidTag
        # A 64-byte key (AES-256-SIV), derived from the secret for this one use.
        self._siv = AESSIV(hashlib.blake2b(b"dcp seal aes-siv", key=seal_key[:64]).digest())
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
        if self.may_connect is not None:
            allowed = self._connect.get(principal)
            if allowed is None:
                if len(self._connect) >= self.max_bound:
                    self._connect.clear()
                allowed = self._connect[principal] = self.may_connect(principal.encode())
            if not allowed:
                return "revoked"
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

    def reload(
        self,
        may_connect: Callable[[bytes], bool],
        may_register: Callable[[bytes | None, bytes], bool],
    ) -> None:
        """Rule S5: new allow-lists (the caller then removes the workers they refuse)."""
        self.may_connect = may_connect
        self.may_register = may_register
        self._connect = {}

    def may_serve(self, peer: bytes, service: bytes) -> bool:
        """Whether the key ``peer`` is bound to may connect and register ``service``."""
        principal = self._owners.get(peer)
        if principal is None:
            return False
        key = principal.encode()
        if self.may_connect is not None and not self.may_connect(key):
            return False
        return self.may_register(key, service)

    def owner(self, peer: bytes) -> str | None:
        """The key ``peer`` is bound to, if any."""
        return self._owners.get(peer)

    # ---------------------------------------------------------- S4

    def seal(self, address: bytes) -> bytes:
        """The sealed form of a client address, as given to workers."""
        sealed = self._sealed.get(address)
        if sealed is None:
            sealed = self._siv.encrypt(address, None)
            if self.cache:
                if len(self._sealed) >= self.cache:
                    oldest = next(iter(self._sealed))
                    del self._unsealed[self._sealed.pop(oldest)]
                self._sealed[address] = sealed
                self._unsealed[sealed] = address
        return sealed

    def cached(self) -> tuple[int, int]:
        """Sealed addresses remembered, and unsealed ones (the cache keeps both ways)."""
        return len(self._sealed), len(self._unsealed)

    def unseal(self, sealed: bytes) -> bytes | None:
        """The address sealed in ``sealed``, or ``None`` if it was not made by :meth:`seal`."""
        address = self._unsealed.get(sealed)
        if address is not None:
            return address
        if len(sealed) <= _TAG:
            return None
        try:
            return self._siv.decrypt(sealed, None)
        except self._forged:
            return None
