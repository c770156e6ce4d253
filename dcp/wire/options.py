"""dcp's request options: metadata parts starting ``\\xffDCP:`` that dcp peers read and
others pass through (``docs/protocol.md``): the request id, the caller's deadline
(``expires-in``), the work timeout, and no-wait; and the parts a broker adds to an error
reply of a forward chain (``via``). Pure.
"""

from __future__ import annotations

__all__ = [
    "MAX_OPTION",
    "NO_WAIT_OPTION",
    "OPTION_PREFIX",
    "REQUEST_ID_PREFIX",
    "VIA_PREFIX",
    "expires_in_option",
    "parse_work_timeout",
    "request_expires_in",
    "request_no_wait",
    "request_work_timeout",
    "via_parts",
    "via_services",
    "without_options",
    "work_timeout_option",
]

#: Metadata parts that start with this are dcp request options, read by dcp brokers (byte 0xFF
#: again: no UTF-8 text starts with it). A client puts them right after its request id.
OPTION_PREFIX = b"\xffDCP:"
_WORK_TIMEOUT = OPTION_PREFIX + b"work-timeout="


#: The longest metadata part starting with :data:`OPTION_PREFIX` (an option or a request id,
#: prefix included) a dcp broker takes, in bytes: a request carrying a longer one is refused
#: (``header_too_long``) before anything of it is kept. Room for a ``via=`` part naming the
#: longest service name a broker allows by default (1,024 bytes), four times over.
MAX_OPTION = 4096

#: A dcp client's request id (the first metadata part) starts with this, so a worker can tell
#: it, like the options, from the caller's own metadata.
REQUEST_ID_PREFIX = OPTION_PREFIX + b"id="
_EXPIRES_IN = OPTION_PREFIX + b"expires-in="
#: Request option: answer at once with a ``no_workers`` error reply if no worker serves the
#: service when the request arrives, instead of queueing it (NATS's "no responders").
NO_WAIT_OPTION = OPTION_PREFIX + b"no-wait"
#: An error reply to a request that went through a forward chain carries one metadata part
#: per service of the chain, in order, each this prefix and the service's name, after the
#: request's own metadata: the last one is the service where the error happened
#: (``docs/protocol.md``). Only a dcp client's request (its first metadata part a dcp
#: request id) gets them; the error reply's data is unchanged.
VIA_PREFIX = OPTION_PREFIX + b"via="


def without_options(metadata: tuple[bytes, ...]) -> tuple[bytes, ...]:
    """``metadata`` without its dcp options (the request id, not an option, is kept)."""
    return tuple(
        part
        for part in metadata
        if part[:1] != b"\xff"
        or not part.startswith(OPTION_PREFIX)
        or part.startswith(REQUEST_ID_PREFIX)
    )


def via_parts(services: tuple[bytes, ...]) -> tuple[bytes, ...]:
    """The metadata parts naming a forward chain's ``services``, in order (:data:`VIA_PREFIX`)."""
    return tuple(VIA_PREFIX + service for service in services)


def via_services(metadata: tuple[bytes, ...]) -> tuple[bytes, ...]:
    """The services a reply's :data:`VIA_PREFIX` parts name, in order (empty: none)."""
    return tuple(
        part[len(VIA_PREFIX) :]
        for part in metadata
        if part[:1] == b"\xff" and part.startswith(VIA_PREFIX)
    )


def _millis_option(prefix: bytes, seconds: float, what: str) -> bytes:
    if not seconds > 0 or seconds == float("inf"):
        raise ValueError(f"{what} must be a positive finite number of seconds")
    return prefix + str(max(1, round(seconds * 1000))).encode()


def _parse_millis(part: bytes, prefix: bytes) -> float | None:
    if part.startswith(prefix):
        digits = part[len(prefix) :]
        if 0 < len(digits) <= 12 and digits.isdigit():
            millis = int(digits)
            if millis:
                return millis / 1000
    return None


def expires_in_option(seconds: float) -> bytes:
    """The metadata part telling the broker and the worker that the caller gives up on this
    request ``seconds`` after sending it (whole milliseconds, at least 1): the broker drops it
    from its queue once that time has passed since it arrived, a worker skips it. Relative,
    so the peers' clocks need not agree."""
    return _millis_option(_EXPIRES_IN, seconds, "expires_in")


def request_expires_in(metadata: tuple[bytes, ...]) -> float | None:
    """The expires-in option a request's metadata carries (the first valid one), if any."""
    for part in metadata:
        if part[:1] == b"\xff":
            seconds = _parse_millis(part, _EXPIRES_IN)
            if seconds is not None:
                return seconds
    return None


def request_no_wait(metadata: tuple[bytes, ...]) -> bool:
    """Whether a request's metadata carries :data:`NO_WAIT_OPTION`."""
    return any(part == NO_WAIT_OPTION for part in metadata if part[:1] == b"\xff")


def work_timeout_option(seconds: float) -> bytes:
    """The metadata part asking the broker to take a request back from a worker that has
    not answered it within ``seconds`` (sent as whole milliseconds, at least 1)."""
    return _millis_option(_WORK_TIMEOUT, seconds, "work_timeout")


def parse_work_timeout(part: bytes) -> float | None:
    """The work timeout in seconds if ``part`` is a valid work-timeout option, else ``None``."""
    return _parse_millis(part, _WORK_TIMEOUT)


def request_work_timeout(metadata: tuple[bytes, ...]) -> float | None:
    """The work timeout a request's metadata carries (the first valid option), if any."""
    for part in metadata:
        if part[:1] == b"\xff":  # cheap test first: most parts are not options
            seconds = parse_work_timeout(part)
            if seconds is not None:
                return seconds
    return None
