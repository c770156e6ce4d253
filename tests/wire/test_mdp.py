"""The Majordomo codec (:mod:`dcp.wire.mdp`) and the dialect sniffer: exact frames, round
trips, and garbage that only ever raises a RemoteProtocolError with a reason."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dcp import RemoteProtocolError
from dcp.wire import PROTOCOL, mdp
from dcp.wire.sniff import Family, sniff

FORMS = list(mdp.Form)
frame = st.binary(max_size=12)
nonempty = st.binary(min_size=1, max_size=12)
body = st.lists(frame, max_size=4).map(tuple)


def test_exact_frames_of_each_form() -> None:
    v01 = mdp.peer(mdp.Form.V01, envelope=True, worker=False)
    v02 = mdp.peer(mdp.Form.V02, envelope=False, worker=False)
    mt = mdp.peer(mdp.Form.MAJORTOMO, envelope=True, worker=False)
    # RFC 7: the REQ envelope, no command frame on the client side.
    assert v01.client_request(b"echo", [b"hi"]) == [b"", b"MDPC01", b"echo", b"hi"]
    assert v01.client_answer(b"echo", [b"hi"], final=True) == [b"", b"MDPC01", b"echo", b"hi"]
    # RFC 18: REQUEST 0x01; PARTIAL 0x02 and FINAL 0x03 with the service frame.
    assert v02.client_request(b"echo", [b"hi"]) == [b"MDPC02", b"\x01", b"echo", b"hi"]
    assert v02.client_answer(b"echo", [b"p"], final=False) == [b"MDPC02", b"\x02", b"echo", b"p"]
    assert v02.client_answer(b"echo", [b"f"], final=True) == [b"MDPC02", b"\x03", b"echo", b"f"]
    # majortomo 0.2.0: one command table (REQUEST 0x02, PARTIAL 0x03, FINAL 0x04), no
    # service frame in answers.
    assert mt.client_request(b"echo", [b"hi"]) == [b"", b"MDPC02", b"\x02", b"echo", b"hi"]
    assert mt.client_answer(b"echo", [b"p"], final=False) == [b"", b"MDPC02", b"\x03", b"p"]
    assert mt.client_answer(b"echo", [b"f"], final=True) == [b"", b"MDPC02", b"\x04", b"f"]
    w01 = mdp.peer(mdp.Form.V01, envelope=True, worker=True)
    w02 = mdp.peer(mdp.Form.V02, envelope=False, worker=True)
    assert w01.worker_ready(b"echo") == [b"", b"MDPW01", b"\x01", b"echo"]
    assert w01.worker_request(b"C", [b"x"]) == [b"", b"MDPW01", b"\x02", b"C", b"", b"x"]
    reply = [b"", b"MDPW01", b"\x03", b"C", b"", b"y"]
    assert w01.worker_answer(b"C", [b"y"], final=True) == reply
    assert w01.worker_heartbeat() == [b"", b"MDPW01", b"\x04"]
    assert w01.worker_disconnect() == [b"", b"MDPW01", b"\x05"]
    assert w02.worker_answer(b"C", [b"y"], final=False) == [b"MDPW02", b"\x03", b"C", b"", b"y"]
    assert w02.worker_answer(b"C", [b"y"], final=True) == [b"MDPW02", b"\x04", b"C", b"", b"y"]
    assert w02.worker_heartbeat() == [b"MDPW02", b"\x05"]
    assert w02.worker_disconnect() == [b"MDPW02", b"\x06"]
    with pytest.raises(ValueError, match="no partial"):
        w01.worker_answer(b"C", [], final=False)


@given(st.sampled_from(FORMS), st.booleans(), frame, body)
def test_client_requests_round_trip(
    form: mdp.Form, envelope: bool, service: bytes, data: tuple[bytes, ...]
) -> None:
    sender = mdp.peer(form, envelope=envelope, worker=False)
    frames = sender.client_request(service, data)
    assert sniff(frames) is Family.MDP
    assert mdp.parse(frames) == (mdp.ClientRequest(service, data), sender)


@given(
    st.sampled_from(FORMS),
    st.booleans(),
    st.one_of(
        frame.map(mdp.WorkerReady),
        st.builds(mdp.WorkerAnswer, nonempty, body, st.booleans()),
        st.just(mdp.WorkerHeartbeat()),
        st.just(mdp.WorkerDisconnect()),
    ),
)
def test_worker_commands_round_trip(form: mdp.Form, envelope: bool, event: mdp.Event) -> None:
    # Workers have two forms: MDP/0.1 and MDP/0.2 (majortomo's workers speak MDP/0.2).
    form = mdp.Form.V01 if form is mdp.Form.V01 else mdp.Form.V02
    sender = mdp.peer(form, envelope=envelope, worker=True)
    if isinstance(event, mdp.WorkerReady):
        frames = sender.worker_ready(event.service)
    elif isinstance(event, mdp.WorkerAnswer):
        if form is mdp.Form.V01:
            event = mdp.WorkerAnswer(event.client, event.body, final=True)
        frames = sender.worker_answer(event.client, event.body, final=event.final)
    elif isinstance(event, mdp.WorkerHeartbeat):
        frames = sender.worker_heartbeat()
    else:
        frames = sender.worker_disconnect()
    assert sniff(frames) is Family.MDP
    assert mdp.parse(frames) == (event, sender)


@given(st.lists(st.one_of(frame, st.sampled_from(sorted(mdp.HEADERS))), max_size=8))
def test_garbage_parses_or_raises_a_remote_protocol_error(frames: list[bytes]) -> None:
    try:
        mdp.parse(frames)
    except RemoteProtocolError as exc:
        assert exc.reason and str(exc)


MALFORMED = [
    ("too_few_frames", [b"MDPC02"]),
    ("too_few_frames", [b"", b"MDPW01"]),
    ("unknown_message_type", [b"MDPC02", b"\x03", b"echo"]),
    ("missing_service_name", [b"MDPC02", b"\x01"]),
    ("missing_service_name", [b"MDPW02", b"\x01"]),
    ("unexpected_frames", [b"MDPW02", b"\x01", b"echo", b"more"]),
    ("unexpected_frames", [b"MDPW02", b"\x05", b"x"]),
    ("missing_client_delimiter", [b"MDPW02", b"\x04"]),
    ("missing_client_delimiter", [b"MDPW02", b"\x04", b"C"]),
    ("missing_client_delimiter", [b"MDPW02", b"\x04", b"C", b"not empty"]),
    ("missing_client_delimiter", [b"MDPW02", b"\x04", b"", b""]),
    ("unknown_message_type", [b"", b"MDPW01", b"\x02", b"C", b"", b"x"]),  # broker's REQUEST
    ("unknown_message_type", [b"", b"MDPW01", b"\x06"]),  # DISCONNECT is 0x05 in MDP/0.1
]


@pytest.mark.parametrize(("reason", "frames"), MALFORMED)
def test_malformed_messages_name_their_reason(reason: str, frames: list[bytes]) -> None:
    with pytest.raises(RemoteProtocolError) as info:
        mdp.parse(frames)
    assert info.value.reason == reason


def test_sniff() -> None:
    assert sniff([b"", PROTOCOL, b"\x02"]) is Family.DCP
    assert sniff([b"", b"DGBX\x07"]) is Family.DCP  # its codec says which version is wrong
    assert sniff([b"", b"MDPC01", b"echo"]) is Family.MDP
    assert sniff([b"MDPW02", b"\x05"]) is Family.MDP
    for frames in ([], [b""], [b"x", PROTOCOL], [b"", b"", PROTOCOL], [b"MDPX02", b"\x01"]):
        assert sniff(frames) is None
