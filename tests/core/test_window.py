"""The maps' window (:mod:`dcp._core.client.window`) alone: no client, no socket, no clock."""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dcp._core.client.window import Window


def rid(i: int) -> bytes:
    return b"r%d" % i


def test_sends_while_there_is_room_then_yields_in_input_order() -> None:
    w: Window[str, str] = Window("abcd", 2, ordered=True)
    assert w.next_input() == (0, "a")
    w.sent(rid(0), 0)
    assert w.next_input() == (1, "b")
    w.sent(rid(1), 1)
    assert w.next_input() is None  # full (Rule WN1): "c" waits
    assert len(w) == 2
    w.arrived[rid(1)] = "B"
    assert w.next_result() is None  # "a" first (Rule WN5)
    w.arrived[rid(0)] = "A"
    assert w.next_result() == (0, "A")
    assert w.next_input() == (2, "c")  # room again: send before yielding more
    w.sent(rid(2), 2)
    assert w.next_result() == (1, "B")
    assert w.next_input() == (3, "d")
    w.sent(rid(3), 3)
    assert w.next_input() is None  # no input left: finished once both are yielded
    assert w.outstanding() == [rid(2), rid(3)]
    w.arrived[rid(3)] = "D"
    w.arrived[rid(2)] = "C"
    assert [w.next_result(), w.next_result(), w.next_result()] == [(2, "C"), (3, "D"), None]
    assert w.finished and w.outstanding() == [] and not w.arrived


def test_unordered_yields_in_arrival_order() -> None:
    w: Window[int, str] = Window(range(3), 3, ordered=False)
    while (item := w.next_input()) is not None:
        w.sent(rid(item[0]), item[0])
    for i in (2, 0, 1):
        w.arrived[rid(i)] = f"x{i}"
    assert [w.next_result() for _ in range(4)] == [(2, "x2"), (0, "x0"), (1, "x1"), None]
    assert w.finished


def test_the_next_input_is_taken_before_the_window_looks_for_room() -> None:
    """Rule WN1: the input is taken from the iterator (and so checked) even when it must wait
    for room, as ``for payload in payloads`` would; the iterator is not read again until that
    input went out."""
    pulled: list[int] = []

    def inputs() -> Iterator[int]:
        for i in range(3):
            pulled.append(i)
            yield i

    w: Window[int, str] = Window(inputs(), 1, ordered=True)
    assert w.next_input() == (0, 0)
    w.sent(rid(0), 0)
    assert w.next_input() is None and pulled == [0, 1]  # 1 is taken, waits for room
    assert w.next_input() is None and pulled == [0, 1]
    w.arrived[rid(0)] = "a"
    assert w.next_result() == (0, "a")
    assert w.next_input() == (1, 1) and pulled == [0, 1]


def test_the_inputs_errors_come_out_of_next_input() -> None:
    def inputs() -> Iterator[bytes]:
        yield b"ok"
        raise TypeError("payloads[1] is bad")

    w: Window[bytes, str] = Window(inputs(), 4, ordered=True)
    assert w.next_input() == (0, b"ok")
    w.sent(rid(0), 0)
    with pytest.raises(TypeError, match=r"payloads\[1\]"):
        w.next_input()
    assert w.outstanding() == [rid(0)]  # what the driver must forget


def test_outcomes_of_other_requests_are_left_alone() -> None:
    """The blocking client's outcomes of every caller arrive in one dict."""
    shared: dict[bytes, str] = {b"other": "theirs"}
    for ordered in (True, False):
        w: Window[int, str] = Window([0], 1, ordered=ordered, arrived=shared)
        assert w.next_input() == (0, 0)
        w.sent(rid(0), 0)
        assert w.next_result() is None
        shared[rid(0)] = "mine"
        assert w.next_result() == (0, "mine")
        assert shared == {b"other": "theirs"}


def test_empty_inputs_are_finished_at_once_and_bad_sizes_refused() -> None:
    w: Window[int, str] = Window([], 3, ordered=True)
    assert w.next_input() is None and w.next_result() is None and w.finished
    with pytest.raises(ValueError, match="window must be >= 1"):
        Window([1], 0, ordered=True)


@settings(deadline=None)  # a loaded machine must not fail it
@given(
    n=st.integers(0, 40),
    size=st.integers(1, 8),
    ordered=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_a_driven_window_keeps_its_rules(n: int, size: int, ordered: bool, seed: int) -> None:
    """Any arrival order: every input is sent once, in order; never more than ``size``
    outstanding; every outcome yielded once (in input order if ordered, else in arrival
    order); finished exactly at the end."""
    rng = random.Random(seed)
    w: Window[int, int] = Window(range(n), size, ordered=ordered)
    sent: list[int] = []
    in_flight: list[int] = []  # sent, outcome not arrived
    arrivals: list[int] = []
    yielded: list[int] = []
    while True:
        item = w.next_input()
        if item is not None:
            index, value = item
            assert index == value == len(sent)
            sent.append(index)
            w.sent(rid(index), index)
            in_flight.append(index)
            assert len(w) <= size
            continue
        result = w.next_result()
        if result is not None:
            index, outcome = result
            assert outcome == -index
            yielded.append(index)
            continue
        if w.finished:
            break
        assert in_flight, "stuck: nothing to send, yield or wait for"
        i = in_flight.pop(rng.randrange(len(in_flight)))
        arrivals.append(i)
        w.arrived[rid(i)] = -i
    assert sent == list(range(n))
    assert sorted(yielded) == list(range(n))
    assert yielded == (list(range(n)) if ordered else arrivals)
    assert w.next_input() is None and w.next_result() is None and w.outstanding() == []
