"""The endpoint's ASGI app: routing and the bearer token (``docs/operations.md``).

Paths (GET or HEAD; anything else ``405``, an unknown path ``404``):

- ``/metrics``: Prometheus text exposition (:mod:`.metrics`);
- ``/status``, ``/status/services``, ``/status/workers``, ``/status/clients``: JSON
  (:mod:`.status`; ``?sort=&limit=&offset=``, a bad one ``400``);
- ``/``: the live status page (``page.html``: static, it fetches ``/status`` every second).

One rule for every path: a trailing slash is ignored (``/metrics/`` is ``/metrics``,
``/status/services/`` is ``/status/services``), as a user or a scraper may type either.

Rule HA1 - With a token (address Rule HB3), a request without ``Authorization: Bearer TOKEN``
  gets ``401`` (with ``WWW-Authenticate: Bearer``), whatever the path. The page itself may
  also be opened as ``/?token=TOKEN`` (a browser cannot send the header on its own): its
  script keeps the token in the tab's ``sessionStorage`` and sends the header to
  ``/status``; the page's ``401`` opens the page again with that token, so a reload works.
  Tokens are compared in constant time.
Rule HA2 - A snapshot is taken per request (nothing is computed while nobody asks), in the
  thread where the broker's core runs, so it is consistent.
Rule HA3 - Before anything else (the token included), a request whose ``Host`` header does not
  name the endpoint (address Rule HB4) gets ``421 Misdirected Request``: a DNS rebinding page
  reads nothing. Refusals are counted by reason (``misdirected``, ``unauthorized``: shown by
  ``/metrics`` as ``dcp_http_refused_total`` and by ``/status`` as ``http_refused``) and
  logged, once per ``Host`` value (at most :data:`_LOGGED_HOSTS` of them).
"""

from __future__ import annotations

import hmac
import importlib.resources
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qs

from dcp._http import metrics, status
from dcp._http.address import HostCheck
from dcp._json import encode_json
from dcp._stats import BrokerSnapshot

__all__ = ["StatusApp"]

logger = logging.getLogger("dcp.http")

#: Distinct refused ``Host`` values logged (Rule HA3); later ones are only counted.
_LOGGED_HOSTS = 64

#: Takes a snapshot (``True``: with every worker and client listed).
Snapshotter = Callable[[bool], Awaitable[BrokerSnapshot]]
Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

_JSON = b"application/json"
_TEXT = b"text/plain; charset=utf-8"
_HTML = b"text/html; charset=utf-8"
#: The page's ``401`` (Rule HA1): opened again with the token the tab keeps, if it has one
#: (and forgets it if that is the token refused).
_LOGIN = b"""<!doctype html><title>dcp broker</title><p id="m">401: open this page as
/?token=TOKEN</p><script>
const t = sessionStorage.getItem("dcp-token");
if (new URLSearchParams(location.search).has("token")) sessionStorage.removeItem("dcp-token");
else if (t) location.replace("/?token=" + encodeURIComponent(t));
</script>
"""


class StatusApp:
    """The ASGI app (plain ASGI 3; see the module's rules).

    :param take: takes a snapshot where the broker's core runs
    :param token: the bearer token every request needs (``None``: none)
    :param version: the broker's version, shown by every path
    :param endpoints: the broker's bound zmq endpoints
    :param hosts: which ``Host`` headers name the endpoint (Rule HA3; ``None``: any)
    :param tags: how routing ids are shown (status Rule HS3; default: a new random key)
    """

    def __init__(
        self,
        take: Snapshotter,
        *,
        token: str | None,
        version: str,
        endpoints: list[str],
        hosts: HostCheck | None = None,
        tags: status.PeerTags | None = None,
    ) -> None:
        self._take = take
        self._token = None if token is None else token.encode()
        self._version = version
        self._endpoints = endpoints
        self._hosts = hosts
        self._tags = status.PeerTags() if tags is None else tags
        self._started = time.time()
        self._page: bytes | None = None
        #: Requests refused, by reason (Rule HA3).
        self.refused: dict[str, int] = {}
        self._logged: set[bytes] = set()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "lifespan":
            await _lifespan(receive, send)
            return
        if kind != "http":  # pragma: no cover - hypercorn sends websocket scopes elsewhere
            return
        if self._hosts is not None and not self._hosts.allows(_host(scope)):
            self._misdirected(_host(scope))
            await _respond(send, 421, b"this endpoint is not served under that Host\n", _TEXT)
            return
        path: str = scope["path"]
        if len(path) > 1 and path.endswith("/"):
            path = path[:-1]  # one rule for every path (module docstring)
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        if self._token is not None and not self._authorized(scope, path, query):
            self.refused["unauthorized"] = self.refused.get("unauthorized", 0) + 1
            body, text = (_LOGIN, _HTML) if path == "/" else (b"a bearer token is needed\n", _TEXT)
            await _respond(send, 401, body, text, [(b"www-authenticate", b"Bearer")])
            return
        if scope["method"] not in ("GET", "HEAD"):
            await _respond(send, 405, b"GET only\n", _TEXT, [(b"allow", b"GET, HEAD")])
            return
        head = scope["method"] == "HEAD"
        if path == "/metrics":
            snap = await self._take(False)
            body, content_type = metrics.render(
                snap, self._version, self._started, http=self.refused
            )
            await _respond(send, 200, body, content_type.encode(), head=head)
        elif path == "/status" or path.startswith("/status/"):
            await self._status(send, path[len("/status/") :], query, head)
        elif path == "/":
            await _respond(send, 200, self._page_html(), _HTML, head=head)
        else:
            await _respond(send, 404, b"no such path: try /, /status or /metrics\n", _TEXT)

    async def _status(
        self, send: Send, part: str, query: dict[str, list[str]], head: bool
    ) -> None:
        try:
            paging = status.Paging.from_query(query)
            if part and part not in status.LISTS:
                await _respond(send, 404, f"no list {part!r}\n".encode(), _TEXT)
                return
            snap = await self._take(part in ("workers", "clients") or (not part and paging.peers))
            if part:
                doc: dict[str, Any] = status.list_page(snap, part, paging, self._tags)
            else:
                doc = status.document(
                    snap,
                    paging,
                    version=self._version,
                    started=self._started,
                    endpoints=self._endpoints,
                    tags=self._tags,
                    http=self.refused,
                )
        except ValueError as exc:
            await _respond(send, 400, f"{exc}\n".encode(), _TEXT)
            return
        await _respond(send, 200, encode_json(doc), _JSON, head=head)

    def _misdirected(self, host: bytes | None) -> None:
        self.refused["misdirected"] = self.refused.get("misdirected", 0) + 1
        shown = b"" if host is None else host[:128]
        if shown not in self._logged and len(self._logged) < _LOGGED_HOSTS:
            self._logged.add(shown)
            logger.warning(
                "HTTP request refused (421): Host %r does not name this endpoint (a DNS "
                "rebinding page, or a name to allow with --http-host)",
                shown.decode("latin-1"),
            )

    def _authorized(self, scope: Scope, path: str, query: dict[str, list[str]]) -> bool:
        token = self._token
        assert token is not None
        for name, value in scope["headers"]:
            if name == b"authorization":
                scheme, _, given = bytes(value).partition(b" ")
                return scheme.lower() == b"bearer" and hmac.compare_digest(given.strip(), token)
        if path == "/" and "token" in query:
            return hmac.compare_digest(query["token"][-1].encode(), token)
        return False

    def _page_html(self) -> bytes:
        if self._page is None:
            self._page = (importlib.resources.files(__package__) / "page.html").read_bytes()
        return self._page


def _host(scope: Scope) -> bytes | None:
    for name, value in scope["headers"]:
        if name == b"host":
            return bytes(value)
    return None


async def _lifespan(receive: Receive, send: Send) -> None:
    """ASGI lifespan: nothing to set up or tear down."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


async def _respond(
    send: Send,
    code: int,
    body: bytes,
    content_type: bytes,
    headers: list[tuple[bytes, bytes]] | None = None,
    *,
    head: bool = False,
) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": code,
            "headers": [
                (b"content-type", content_type),
                (b"content-length", str(len(body)).encode()),
                (b"cache-control", b"no-store"),
                *(headers or []),
            ],
        }
    )
    await send({"type": "http.response.body", "body": b"" if head else body})
