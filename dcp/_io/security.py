"""CURVE security settings: key pairs, key files and allow-lists (see ``docs/security.md``).

Keys are zmq CURVE keys. In memory they are z85 text as ``bytes`` (40 characters), as pyzmq
uses them; every API here also takes ``str`` or the raw 32 bytes. On disk they are the ZPL
certificate files that czmq's ``zcert`` and pyzmq's :mod:`zmq.auth` read and write: ``NAME.key``
holds the public key, ``NAME.key_secret`` both keys (readable by its owner only).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TypeAlias

import attrs
import zmq
from zmq.utils import z85

__all__ = [
    "ANY",
    "CurveClient",
    "CurveServer",
    "KeyLike",
    "configure_client_socket",
    "configure_server_socket",
    "load_public_keys",
    "write_key_pair",
    "z85_key",
]

#: A CURVE key: z85 text (40 characters, ``str`` or ``bytes``) or the raw 32 bytes.
KeyLike: TypeAlias = str | bytes
#: A file system path.
PathLike: TypeAlias = str | os.PathLike[str]

#: In :attr:`CurveServer.workers`: as a service, any service; as a key, any key the broker
#: lets connect.
ANY = b"*"

#: The ZAP domain of a secure broker's socket. With ``ZAP_ENFORCE_DOMAIN`` set, libzmq
#: refuses every CURVE handshake when no ZAP handler answers (fail closed).
ZAP_DOMAIN = b"dcp"


def z85_key(key: KeyLike) -> bytes:
    """``key`` as 40 bytes of z85 text.

    :raises ValueError: not a z85-encoded 32-byte key nor 32 raw bytes
    """
    if isinstance(key, str):
        if not key.isascii():
            raise ValueError("a CURVE key is 40 characters of z85 text or 32 raw bytes")
        key = key.encode("ascii")
    raw = bytes(key)
    if len(raw) == 32:
        return z85.encode(raw)
    if len(raw) == 40:
        try:
            if z85.encode(z85.decode(raw)) == raw:
                return raw
        except Exception:  # KeyError, struct.error, ValueError: all mean "not z85"
            pass
    raise ValueError("a CURVE key is 40 characters of z85 text or 32 raw bytes")


def _key_set(keys: Iterable[KeyLike]) -> frozenset[bytes]:
    if isinstance(keys, (str, bytes)):
        raise TypeError("expected a collection of keys, not a single key")
    return frozenset(ANY if k in ("*", ANY) else z85_key(k) for k in keys)


def _optional_key_set(keys: Iterable[KeyLike] | None) -> frozenset[bytes] | None:
    return None if keys is None else _key_set(keys)


def _service_name(service: str | bytes) -> bytes:
    return service.encode() if isinstance(service, str) else bytes(service)


def _permissions(
    workers: Mapping[str | bytes, Iterable[KeyLike]],
) -> Mapping[bytes, frozenset[bytes]]:
    return {_service_name(service): _key_set(keys) for service, keys in workers.items()}


def _check_pair(public: bytes, secret: bytes) -> None:
    if zmq.curve_public(secret) != public:
        raise ValueError("the public key does not belong to the secret key")


def _load_secret(path: PathLike) -> tuple[bytes, bytes]:
    # zmq.auth here and below, not at the top: only CURVE's key files need it.
    from zmq.auth import load_certificate

    public, secret = load_certificate(path)
    if secret is None:
        raise ValueError(f"{os.fspath(path)!r} holds no secret key (use NAME.key_secret)")
    return z85_key(public), z85_key(secret)


def load_public_keys(path: PathLike) -> frozenset[bytes]:
    """The public keys in a certificate file, or in every ``*.key`` file of a directory.

    :raises OSError: no such file or directory
    :raises ValueError: a file holds no valid public key
    """
    from zmq.auth import load_certificate, load_certificates

    if os.path.isdir(path):
        return frozenset(z85_key(k) for k in load_certificates(path))
    public, _ = load_certificate(path)
    return frozenset([z85_key(public)])


@attrs.frozen
class CurveClient:
    """CURVE settings of a client or worker (``security=`` of :class:`dcp.Client`,
    :class:`dcp.SyncClient` and :class:`dcp.Worker`): its own key pair and the broker's
    public key. Every message is encrypted, and the broker is authenticated: a peer
    without the broker's secret key cannot complete the handshake.

    ::

        security = dcp.CurveClient.from_files("keys/alice.key_secret", server="keys/broker.key")
        async with dcp.Client("tcp://broker:5555", security=security) as client: ...

    :ivar server_key: the broker's public key
    :ivar public_key: this peer's public key (the broker's allow-lists name it)
    :ivar secret_key: this peer's secret key (never shown in ``repr``)
    :raises ValueError: a key is malformed, or the key pair does not match
    """

    server_key: bytes = attrs.field(converter=z85_key)
    public_key: bytes = attrs.field(converter=z85_key)
    secret_key: bytes = attrs.field(converter=z85_key, repr=False)

    def __attrs_post_init__(self) -> None:
        _check_pair(self.public_key, self.secret_key)

    @classmethod
    def from_files(cls, keys: PathLike, *, server: PathLike) -> CurveClient:
        """Load the key pair from ``keys`` (a ``NAME.key_secret`` file) and the broker's
        public key from ``server`` (its ``.key`` or ``.key_secret`` file).

        :raises OSError: a file is missing
        :raises ValueError: a file holds no (valid) key
        """
        from zmq.auth import load_certificate

        public, secret = _load_secret(keys)
        server_key, _ = load_certificate(server)
        return cls(server_key, public, secret)


@attrs.frozen
class CurveServer:
    """CURVE settings of a broker (``Broker(security=...)``): its key pair and two
    allow-lists.

    ::

        security = dcp.CurveServer.from_files(
            "keys/broker.key_secret",
            clients=["keys/clients/"],                 # files or directories of .key files
            workers={"echo": ["keys/workers/echo.key"], "*": ["keys/admin.key"]},
        )

    A peer may connect if its key is in :attr:`clients` or anywhere in :attr:`workers`
    (workers call services too); other keys fail the handshake. A connected peer may
    register a service only if :attr:`workers` lists its key for that service or for
    ``"*"`` (any service); ``"*"`` as a key lets every connected peer register it.

    :ivar public_key: the broker's public key (clients and workers need it)
    :ivar secret_key: the broker's secret key (never shown in ``repr``)
    :ivar clients: keys that may connect; ``None`` lets any key connect (encryption
        without client authentication; registrations still need :attr:`workers`)
    :ivar workers: service name -> keys that may register it
    :raises ValueError: a key is malformed, or the key pair does not match
    """

    public_key: bytes = attrs.field(converter=z85_key)
    secret_key: bytes = attrs.field(converter=z85_key, repr=False)
    clients: frozenset[bytes] | None = attrs.field(
        default=frozenset(), converter=_optional_key_set
    )
    workers: Mapping[bytes, frozenset[bytes]] = attrs.field(
        factory=dict, converter=_permissions, eq=False, hash=False
    )
    _connect: frozenset[bytes] = attrs.field(init=False, repr=False, eq=False)

    def __attrs_post_init__(self) -> None:
        _check_pair(self.public_key, self.secret_key)
        keys: set[bytes] = set(self.clients or ())
        for allowed in self.workers.values():
            keys.update(allowed)
        keys.discard(ANY)
        object.__setattr__(self, "_connect", frozenset(keys))

    @classmethod
    def from_files(
        cls,
        keys: PathLike,
        *,
        clients: Iterable[PathLike] | None = (),
        workers: Mapping[str | bytes, Iterable[PathLike | str]] | None = None,
    ) -> CurveServer:
        """Load the broker's key pair from ``keys`` (a ``NAME.key_secret`` file) and the
        allow-lists from public key files or directories of ``*.key`` files.

        :param clients: files or directories; ``None``: any key may connect
        :param workers: service (``"*"``: any) -> files or directories (``"*"``: any key)
        :raises OSError: a file or directory is missing
        :raises ValueError: a file holds no (valid) key
        """
        public, secret = _load_secret(keys)
        client_keys: set[bytes] | None = None
        if clients is not None:
            client_keys = set()
            for path in clients:
                client_keys |= load_public_keys(path)
        permissions: dict[str | bytes, set[bytes]] = {}
        for service, paths in (workers or {}).items():
            allowed = permissions.setdefault(_service_name(service), set())
            for path in paths:
                if path == "*":
                    allowed.add(ANY)
                else:
                    allowed |= load_public_keys(path)
        return cls(public, secret, client_keys, permissions)

    @property
    def connect_keys(self) -> frozenset[bytes]:
        """The keys that may connect (with :attr:`clients` ``None``, any other key too)."""
        return self._connect

    def may_connect(self, key: bytes) -> bool:
        """Whether the peer with public ``key`` (z85) may complete the handshake."""
        return self.clients is None or key in self._connect

    def may_register(self, key: bytes | None, service: bytes) -> bool:
        """Whether the peer with public ``key`` (z85) may register ``service``."""
        if key is None:
            return False
        for name in (service, ANY):
            allowed = self.workers.get(name)
            if allowed is not None and (key in allowed or ANY in allowed):
                return True
        return False


def configure_client_socket(sock: zmq.Socket[bytes], security: CurveClient | None) -> None:
    """Make ``sock`` a CURVE client (before it connects); nothing for ``None``."""
    if security is not None:
        sock.setsockopt(zmq.CURVE_SERVERKEY, security.server_key)
        sock.setsockopt(zmq.CURVE_PUBLICKEY, security.public_key)
        sock.setsockopt(zmq.CURVE_SECRETKEY, security.secret_key)


def configure_server_socket(sock: zmq.Socket[bytes], security: CurveServer) -> None:
    """Make ``sock`` a CURVE server that fails closed without a ZAP handler (before bind)."""
    sock.setsockopt(zmq.CURVE_SERVER, 1)
    sock.setsockopt(zmq.CURVE_PUBLICKEY, security.public_key)
    sock.setsockopt(zmq.CURVE_SECRETKEY, security.secret_key)
    sock.setsockopt(zmq.ZAP_DOMAIN, ZAP_DOMAIN)
    sock.setsockopt(zmq.ZAP_ENFORCE_DOMAIN, 1)


_PUBLIC_BANNER = """#   ****  Generated on {now} by dcp  ****
#   ZeroMQ CURVE Public Certificate
#   Exchange securely, or use a secure mechanism to verify the contents
#   of this file after exchange.

"""
_SECRET_BANNER = """#   ****  Generated on {now} by dcp  ****
#   ZeroMQ CURVE **Secret** Certificate
#   DO NOT PROVIDE THIS FILE TO OTHER USERS nor change its permissions.

"""


def _write(path: Path, text: str, mode: int, overwrite: bool) -> None:
    flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if overwrite else os.O_EXCL)
    fd = os.open(path, flags, mode)
    with os.fdopen(fd, "w", encoding="ascii") as f:
        os.fchmod(fd, mode)  # an overwritten file keeps its old mode otherwise
        f.write(text)


def write_key_pair(
    directory: PathLike, name: str, *, overwrite: bool = False
) -> tuple[Path, Path]:
    """Generate a CURVE key pair and write ``NAME.key`` (public, mode 0644) and
    ``NAME.key_secret`` (both keys, mode 0600) in ``directory``, in the ZPL certificate
    format of czmq and :func:`zmq.auth.load_certificate`.

    :returns: the paths of the public and the secret file
    :raises FileExistsError: a file exists and ``overwrite`` is false
    """
    if not name or os.sep in name or name in (".", ".."):
        raise ValueError(f"not a plain file name: {name!r}")
    import datetime  # only here: key files are written by dcp keys, not by a broker or client

    public, secret = zmq.curve_keypair()
    now = datetime.datetime.now().isoformat(timespec="seconds")
    folder = Path(directory)
    public_path = folder / f"{name}.key"
    secret_path = folder / f"{name}.key_secret"
    body = f'metadata\ncurve\n    public-key = "{public.decode()}"\n'
    if not overwrite:
        for path in (public_path, secret_path):
            if path.exists():
                raise FileExistsError(f"{path} exists (overwrite it with --force)")
    _write(
        secret_path,
        _SECRET_BANNER.format(now=now) + body + f'    secret-key = "{secret.decode()}"\n',
        0o600,
        overwrite,
    )
    _write(public_path, _PUBLIC_BANNER.format(now=now) + body, 0o644, overwrite)
    return public_path, secret_path
