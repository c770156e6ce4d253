"""Property tests of the wire codec: it never crashes on junk, and it round-trips exactly."""

from __future__ import annotations

from hypothesis import event, given, settings
from hypothesis import strategies as st

from dcp import RemoteProtocolError
from dcp.wire import (
    PROTOCOL,
    Message,
    Ping,
    Pong,
    Reconnect,
    Register,
    Reply,
    Request,
    parse,
    serialize,
)

WIDTHS = st.sampled_from([1, 4])
SMALL = st.binary(max_size=6)
NON_EMPTY = st.binary(min_size=1, max_size=6)


def _type_frame(code: int, width: int) -> bytes:
    return code.to_bytes(width, "little")


@st.composite
def frame_lists(draw: st.DrawFn) -> list[bytes]:
    """Mostly a plausible DCP header (either width, types 0-7), then junk with many delimiters."""

    def usually() -> bool:
        # sampled_from, unlike one_of over repeated branches, really is weighted.
        return draw(st.sampled_from([True, True, True, False]))

    first = b"" if usually() else draw(SMALL)
    proto = PROTOCOL if usually() else draw(st.sampled_from([b"DGBX\x02", b"DGBX"]) | SMALL)
    if usually():
        tframe = _type_frame(draw(st.integers(0, 7)), draw(WIDTHS))
    else:
        tframe = draw(st.builds(_type_frame, st.integers(0, 2**32 - 1), st.just(4)) | SMALL)
    header = [first, proto, tframe][: 3 if usually() else draw(st.integers(0, 2))]
    # Empty frames are the delimiters: make them common.
    body = draw(st.lists(st.sampled_from([b"", b"", b"x"]) | SMALL, max_size=8))
    return header + body


messages: st.SearchStrategy[Message] = st.one_of(
    st.builds(Register, SMALL),
    st.just(Ping()),
    st.just(Pong()),
    st.just(Reconnect()),
    st.builds(
        Request,
        SMALL,
        st.none() | NON_EMPTY,
        st.lists(NON_EMPTY, max_size=3),
        st.lists(SMALL, max_size=4),
    ),
    st.builds(
        Reply,
        st.none() | NON_EMPTY,
        st.lists(NON_EMPTY, max_size=3),
        st.lists(SMALL, max_size=4),
    ),
)


@settings(max_examples=400)
@given(frame_lists())
def test_parse_raises_only_remote_protocol_errors(frames: list[bytes]) -> None:
    try:
        message, width = parse(frames)
    except RemoteProtocolError as exc:
        assert exc.reason
        event(exc.reason)
        return
    event(f"parsed {type(message).__name__}")
    # Whatever parses is canonical: building it again gives back the very same frames.
    assert width in (1, 4)
    assert serialize(message, width=width) == frames


@settings(max_examples=300)
@given(messages, WIDTHS)
def test_round_trip(message: Message, width: int) -> None:
    frames = serialize(message, width=width)
    assert all(isinstance(f, bytes) for f in frames)
    assert parse(frames) == (message, width)
    parsed, parsed_width = parse(frames)
    assert serialize(parsed, width=parsed_width) == frames


@settings(max_examples=100)
@given(messages, WIDTHS)
def test_routing_id_prefix_does_not_parse(message: Message, width: int) -> None:
    """A ROUTER-side message (routing id still on) is rejected, never misread."""
    try:
        parse([b"\x00id", *serialize(message, width=width)])
    except RemoteProtocolError:
        pass
    else:
        raise AssertionError("a message with a routing id in front parsed")
