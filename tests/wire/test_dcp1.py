"""The wire codec against the DagBox reference frames, every malformed shape, and edge cases."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest

from dcp import LocalProtocolError, RemoteProtocolError, _errors
from dcp.wire import (
    PROTOCOL,
    BadProtocolFrame,
    BadTypeFrame,
    Message,
    MessageType,
    MissingClientDelimiter,
    MissingEnvelopeDelimiter,
    MissingMetadataDelimiter,
    MissingServiceName,
    Ping,
    Pong,
    Reconnect,
    Register,
    Reply,
    Request,
    TooFewFrames,
    UnexpectedFrames,
    UnknownMessageType,
    UnsupportedVersion,
    parse,
    serialize,
)
from dcp.wire.messages import ERROR_MARKER, error_reply_data, parse_error_reply
from tests.wire.vectors import Vector, vector_params, vectors_or_skip

CLIENT_68 = bytes.fromhex("006b8b4568")
CLIENT_6A = bytes.fromhex("006b8b456a")

#: What each reference vector means. A vector added to the file without an entry here fails
#: ``test_every_vector_has_an_expected_message``.
EXPECTED: dict[str, Message] = {
    "registration": Register(b"echo"),
    "registration_confirmation": Register(b"echo"),
    "ping": Ping(),
    "pong": Pong(),
    "request_from_client": Request(b"echo", None, (b"req-0",), (b"payload-0",)),
    "request_to_worker": Request(b"echo", CLIENT_68, (b"req-0",), (b"payload-0",)),
    "reply_from_worker": Reply(CLIENT_68, (b"req-0",), (b"payload-0",)),
    "reply_to_client": Reply(CLIENT_68, (b"req-0",), (b"payload-0",)),
    "reconnect": Reconnect(),
    "registration_after_reconnect": Register(b"echo"),
    # DagBox's bug bounced this request to its client; the frames are still a valid request.
    "BUG_queued_request_bounced_to_client": Request(
        b"echo", CLIENT_6A, (b"req-1",), (b"payload-1",)
    ),
    "serializer_pong": Pong(),
    "serializer_request": Request(b"echo", None, (b"meta",), (b"data", b"more data")),
    "serializer_request_no_meta": Request(b"echo", None, (), (b"data",)),
    "serializer_reply": Reply(None, (b"meta",), (b"data", b"more data")),
}


def header(mtype: int, width: int = 1) -> list[bytes]:
    return [b"", PROTOCOL, mtype.to_bytes(width, "little")]


# --- reference vectors -------------------------------------------------------------------


def test_every_vector_has_an_expected_message() -> None:
    names = [v.name for v in vectors_or_skip()]
    assert len(names) == len(set(names))
    assert set(names) == set(EXPECTED)


@pytest.mark.parametrize("vector", vector_params())
def test_vector_parses(vector: Vector) -> None:
    expected = EXPECTED[vector.name]
    assert parse(vector.frames) == (expected, 4)
    assert parse(vector.frames_1byte) == (expected, 1)


@pytest.mark.parametrize("vector", vector_params())
def test_vector_serializes_to_the_exact_frames(vector: Vector) -> None:
    expected = EXPECTED[vector.name]
    assert serialize(expected, width=4) == list(vector.frames)
    assert serialize(expected, width=1) == list(vector.frames_1byte)


@pytest.mark.parametrize("vector", vector_params(router_side=True))
def test_vector_router_side(vector: Vector) -> None:
    assert vector.router_frames is not None
    assert vector.peer_id is not None
    routing_id, *frames = vector.router_frames
    assert routing_id == vector.peer_id
    assert tuple(frames) == vector.frames
    assert parse(frames) == (EXPECTED[vector.name], 4)
    assert [vector.peer_id, *serialize(EXPECTED[vector.name], width=4)] == list(
        vector.router_frames
    )


# --- malformed messages --------------------------------------------------------------------

P = PROTOCOL
MALFORMED: list[tuple[str, Sequence[bytes], type[RemoteProtocolError]]] = [
    ("no-frames", [], TooFewFrames),
    ("only-delimiter", [b""], TooFewFrames),
    ("no-type-frame", [b"", P], TooFewFrames),
    ("non-empty-first-frame", [b"id", P, b"\x02"], MissingEnvelopeDelimiter),
    ("non-empty-first-frame-4", [b"\x00", P, b"\x02\x00\x00\x00"], MissingEnvelopeDelimiter),
    ("bad-magic", [b"", b"MDPW\x01", b"\x02"], BadProtocolFrame),
    ("lowercase-magic", [b"", b"dgbx\x01", b"\x02"], BadProtocolFrame),
    ("magic-without-version", [b"", b"DGBX", b"\x02"], BadProtocolFrame),
    ("magic-with-2-byte-version", [b"", b"DGBX\x01\x00", b"\x02"], BadProtocolFrame),
    ("empty-protocol-frame", [b"", b"", b"\x02"], BadProtocolFrame),
    ("version-2", [b"", b"DGBX\x02", b"\x02"], UnsupportedVersion),
    ("version-0", [b"", b"DGBX\x00", b"\x02"], UnsupportedVersion),
    ("version-255", [b"", b"DGBX\xff", b"\x02\x00\x00\x00"], UnsupportedVersion),
    ("type-0-bytes", [b"", P, b""], BadTypeFrame),
    ("type-2-bytes", [b"", P, b"\x02\x00"], BadTypeFrame),
    ("type-3-bytes", [b"", P, b"\x02\x00\x00"], BadTypeFrame),
    ("type-5-bytes", [b"", P, b"\x02\x00\x00\x00\x00"], BadTypeFrame),
    ("type-0", header(0), UnknownMessageType),
    ("type-7", header(7), UnknownMessageType),
    ("type-255", header(255), UnknownMessageType),
    ("type-0-width-4", header(0, 4), UnknownMessageType),
    ("type-7-width-4", header(7, 4), UnknownMessageType),
    ("type-ping-high-byte-set", [b"", P, b"\x02\x00\x00\x01"], UnknownMessageType),
    ("type-ping-big-endian", [b"", P, b"\x00\x00\x00\x02"], UnknownMessageType),
    ("ping-with-body", [*header(2), b"x"], UnexpectedFrames),
    ("ping-with-empty-frame", [*header(2), b""], UnexpectedFrames),
    ("pong-with-body", [*header(3), b"x"], UnexpectedFrames),
    ("pong-with-body-4", [*header(3, 4), b"", b""], UnexpectedFrames),
    ("reconnect-with-body", [*header(6), b"echo"], UnexpectedFrames),
    ("reconnect-with-body-4", [*header(6, 4), b"echo"], UnexpectedFrames),
    ("register-without-service", header(1), MissingServiceName),
    ("register-without-service-4", header(1, 4), MissingServiceName),
    ("register-extra-frame", [*header(1), b"echo", b"more"], UnexpectedFrames),
    ("register-extra-empty-frame", [*header(1, 4), b"echo", b""], UnexpectedFrames),
    ("request-without-service", header(4), MissingServiceName),
    ("request-without-service-4", header(4, 4), MissingServiceName),
    ("request-without-delimiters", [*header(4), b"echo"], MissingClientDelimiter),
    ("request-client-no-delimiter", [*header(4), b"echo", b"cid"], MissingClientDelimiter),
    (
        "request-client-then-data",
        [*header(4), b"echo", b"cid", b"meta", b"", b"data"],
        MissingClientDelimiter,
    ),
    ("request-no-meta-delimiter", [*header(4), b"echo", b""], MissingMetadataDelimiter),
    (
        "request-meta-no-delimiter",
        [*header(4), b"echo", b"", b"m1", b"m2"],
        MissingMetadataDelimiter,
    ),
    (
        "request-client-meta-no-delimiter",
        [*header(4, 4), b"echo", b"cid", b"", b"meta"],
        MissingMetadataDelimiter,
    ),
    ("reply-header-only", header(5), MissingClientDelimiter),
    ("reply-client-no-delimiter", [*header(5), b"cid"], MissingClientDelimiter),
    ("reply-client-then-meta", [*header(5), b"cid", b"meta", b""], MissingClientDelimiter),
    ("reply-no-meta-delimiter", [*header(5), b""], MissingMetadataDelimiter),
    ("reply-meta-no-delimiter", [*header(5, 4), b"", b"meta"], MissingMetadataDelimiter),
    ("reply-client-meta-no-delim", [*header(5), b"cid", b"", b"m"], MissingMetadataDelimiter),
]


@pytest.mark.parametrize(
    ("frames", "error"), [pytest.param(f, e, id=name) for name, f, e in MALFORMED]
)
def test_malformed(frames: Sequence[bytes], error: type[RemoteProtocolError]) -> None:
    with pytest.raises(RemoteProtocolError) as excinfo:
        parse(frames)
    assert type(excinfo.value) is error
    assert excinfo.value.reason == error.reason
    assert str(excinfo.value)


def test_reasons_are_distinct() -> None:
    subclasses = [
        obj
        for obj in vars(_errors).values()
        if isinstance(obj, type) and issubclass(obj, RemoteProtocolError)
    ]
    assert len(subclasses) >= 11
    reasons = [cls.reason for cls in subclasses]
    assert len(reasons) == len(set(reasons))


# --- edge cases that must parse ------------------------------------------------------------

EDGE: list[tuple[str, list[bytes], Message]] = [
    ("zero-data-parts", [*header(4), b"s", b"", b""], Request(b"s")),
    (
        "empty-data-parts",
        [*header(4), b"s", b"", b"", b"", b""],
        Request(b"s", data=(b"", b"")),
    ),
    (
        "trailing-empty-data-part",
        [*header(4), b"s", b"", b"m", b"", b"d", b""],
        Request(b"s", metadata=(b"m",), data=(b"d", b"")),
    ),
    (
        "leading-empty-data-part",
        [*header(4), b"s", b"cid", b"", b"", b"", b"d"],
        Request(b"s", b"cid", data=(b"", b"d")),
    ),
    ("empty-service-name", [*header(4), b"", b"", b"", b"d"], Request(b"", data=(b"d",))),
    ("register-empty-service", [*header(1), b""], Register(b"")),
    (
        "no-metadata-with-client",
        [*header(4), b"s", b"cid", b"", b"", b"d"],
        Request(b"s", b"cid", data=(b"d",)),
    ),
    ("reply-empty", [*header(5), b"", b""], Reply()),
    ("reply-empty-data-part", [*header(5), b"cid", b"", b"", b""], Reply(b"cid", data=(b"",))),
    (
        "reply-metadata-only",
        [*header(5), b"", b"m1", b"m2", b""],
        Reply(metadata=(b"m1", b"m2")),
    ),
    ("binary-service", [*header(1), b"\x00\xff\n"], Register(b"\x00\xff\n")),
]


@pytest.mark.parametrize("width", [1, 4])
@pytest.mark.parametrize(
    ("frames", "expected"), [pytest.param(f, m, id=name) for name, f, m in EDGE]
)
def test_edge_cases_parse(frames: list[bytes], expected: Message, width: int) -> None:
    frames = [*header(expected.type, width), *frames[3:]]
    assert parse(frames) == (expected, width)
    assert serialize(expected, width=width) == frames


def test_parse_accepts_a_tuple_and_keeps_frames_as_given() -> None:
    frames = (b"", PROTOCOL, b"\x04", b"svc", b"", b"", b"x")
    message, width = parse(frames)
    assert width == 1
    assert isinstance(message, Request)
    assert message.data == (b"x",)


@pytest.mark.parametrize("mtype", list(MessageType))
def test_header_bytes(mtype: MessageType) -> None:
    message: Message = {
        MessageType.REGISTER: Register(b"s"),
        MessageType.PING: Ping(),
        MessageType.PONG: Pong(),
        MessageType.REQUEST: Request(b"s"),
        MessageType.REPLY: Reply(),
        MessageType.RECONNECT: Reconnect(),
    }[mtype]
    assert message.type is mtype
    assert serialize(message)[:3] == [b"", b"DGBX\x01", bytes([mtype])]
    assert serialize(message, width=4)[:3] == [b"", b"DGBX\x01", bytes([mtype, 0, 0, 0])]
    assert serialize(message) == serialize(message, width=1)


# --- messages DCP cannot express -----------------------------------------------------------


@pytest.mark.parametrize(
    "build",
    [
        pytest.param(lambda: Request(b"s", metadata=(b"",)), id="request-empty-metadata"),
        pytest.param(lambda: Request(b"s", metadata=(b"a", b"")), id="request-empty-meta-2"),
        pytest.param(lambda: Request(b"s", client=b""), id="request-empty-client"),
        pytest.param(lambda: Reply(metadata=[b""]), id="reply-empty-metadata"),
        pytest.param(lambda: Reply(client=b""), id="reply-empty-client"),
    ],
)
def test_unexpressible_messages(build: Callable[[], Message]) -> None:
    with pytest.raises(LocalProtocolError):
        build()


@pytest.mark.parametrize("width", [0, 2, 3, 5, 8])
def test_serialize_bad_width(width: int) -> None:
    with pytest.raises(LocalProtocolError, match="width"):
        serialize(Ping(), width=width)


def test_local_protocol_error_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        serialize(Pong(), width=2)


def test_message_fields_become_tuples() -> None:
    request = Request(b"s", metadata=[b"m"], data=iter([b"a", b"b"]))
    assert request.metadata == (b"m",)
    assert request.data == (b"a", b"b")
    assert hash(request) == hash(Request(b"s", None, (b"m",), (b"a", b"b")))


# --- dcp error replies ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "text"),
    [("queue_full", "service 'echo' has 1000 queued requests"), ("handler_error", "")],
)
@pytest.mark.parametrize("width", [1, 4])
def test_error_reply_round_trip(code: str, text: str, width: int) -> None:
    data = error_reply_data(code, text)
    assert data[0] == ERROR_MARKER
    assert parse_error_reply(data) == (code, text)
    assert parse_error_reply(list(data)) == (code, text)
    reply = Reply(CLIENT_68, (b"req-7",), data)
    parsed, parsed_width = parse(serialize(reply, width=width))
    assert (parsed, parsed_width) == (reply, width)
    assert isinstance(parsed, Reply)
    assert parse_error_reply(parsed.data) == (code, text)


def test_error_reply_non_ascii_message() -> None:
    assert parse_error_reply(error_reply_data("bad", "caf\u00e9 \u2603")) == (
        "bad",
        "caf\u00e9 \u2603",
    )
    assert parse_error_reply(error_reply_data("d\u00e9j\u00e0", "x")) == ("d\u00e9j\u00e0", "x")
    # Unencodable text (a lone surrogate) is replaced, not raised.
    assert parse_error_reply(error_reply_data("bad", "x\ud800")) == ("bad", "x?")
    assert parse_error_reply(error_reply_data("b\udfff", "x")) == ("b?", "x")
    # Undecodable bytes from a peer are replaced, not raised.
    assert parse_error_reply((ERROR_MARKER, b"c", b"\xff")) == ("c", "\ufffd")


@pytest.mark.parametrize(
    "data",
    [
        (),
        (b"ok",),
        (ERROR_MARKER, b"code"),
        (ERROR_MARKER, b"code", b"msg", b"extra"),
        (b"\xffDCP-ERRO", b"code", b"msg"),
        (b"DCP-ERROR", b"code", b"msg"),
        (b"a", b"b", b"c"),
    ],
)
def test_not_an_error_reply(data: tuple[bytes, ...]) -> None:
    assert parse_error_reply(data) is None


def test_error_marker_is_not_utf8() -> None:
    with pytest.raises(UnicodeDecodeError):
        ERROR_MARKER.decode("utf-8")
