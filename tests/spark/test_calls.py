"""The per-task code of ``dcp.spark`` (Arrow in, replies out), outside Spark: a real broker
and worker in a background thread, the code that runs in an executor called directly."""

from __future__ import annotations

import importlib
import inspect
import math
import os
import pickle
import sys
from collections.abc import Iterator, Sequence
from typing import get_type_hints

import pyarrow as pa
import pytest

import dcp
from dcp._io.context import get_context
from dcp.spark import (
    BROKER_ENV,
    BadReply,
    ServiceCall,
    call_arrays,
    call_batches,
    describe_error,
    resolve_broker,
)
from dcp.spark._calls import call_column
from dcp.spark._config import split_brokers
from dcp.spark._dataframe import column_function
from dcp.wire.options import REQUEST_ID_PREFIX
from tests.spark.services import Services, services


@pytest.fixture(scope="module")
def svc() -> Iterator[Services]:
    with services() as s:
        yield s


@pytest.fixture
def rec(svc: Services) -> Services:
    svc.recorder.clear()
    return svc


def open_sockets() -> int:
    """Sockets of the process's zmq context not yet closed."""
    made = list(get_context()._sockets)  # pyzmq lists them only there
    return sum(1 for s in made if not s.closed)


def chunks(values: Sequence[bytes | None], size: int, kind: pa.DataType) -> list[pa.Array]:
    return [pa.array(values[i : i + size], type=kind) for i in range(0, len(values), size)]


def test_every_row_answered_in_order_across_batches(rec: Services) -> None:
    rows: list[bytes | None] = [b"slow%d" % i for i in range(200)]
    call = ServiceCall(rec.endpoint, "svc", window=16)
    before = open_sockets()
    out = list(call_arrays(call, chunks(rows, 4, pa.binary())))
    assert [len(v) for v, _ in out] == [4] * 50
    assert all(e is None for _, e in out)
    got = pa.concat_arrays([v for v, _ in out]).to_pylist()
    assert got == [r.upper() for r in rows if r is not None]
    # The window spans batches (more than one 4-row batch in flight), and is respected.
    assert 4 < rec.recorder.max_in_flight <= 16
    assert len(set(rec.recorder.ids)) == 200
    assert open_sockets() == before


def test_a_work_timeout_travels_with_every_request(rec: Services) -> None:
    call = ServiceCall(rec.endpoint, "svc", work_timeout=2.5)
    out = list(call_arrays(call, chunks([b"a", b"b", b"c"], 2, pa.binary())))
    assert pa.concat_arrays([v for v, _ in out]).to_pylist() == [b"A", b"B", b"C"]
    # (And no no-wait option: a row waits for a worker, so a job rides through a restart.)
    assert rec.recorder.options == [(b"\xffDCP:work-timeout=2500",)] * 3
    with pytest.raises(ValueError, match="work_timeout"):
        ServiceCall(rec.endpoint, "svc", work_timeout=0)


def test_nulls_empty_and_all_null_arrays_are_not_sent(rec: Services) -> None:
    arrays = [
        pa.array([None, None], type=pa.string()),
        pa.array([], type=pa.string()),
        pa.array(["a", None, "", "b"], type=pa.string()),
        pa.array([None], type=pa.string()),
        pa.array(["c"], type=pa.string()),
        pa.array([None, None], type=pa.string()),
    ]
    call = ServiceCall(rec.endpoint, b"svc", output_type="string", window=2)
    out = [v.to_pylist() for v, _ in call_arrays(call, arrays)]
    assert out == [[None, None], [], ["A", None, "", "B"], [None], ["C"], [None, None]]
    assert sorted(rec.recorder.payloads) == [b"", b"a", b"b", b"c"]
    # Nothing to send at all: still one output per input, in order.
    only_nulls = [pa.array([None], type=pa.binary()), pa.array([], type=pa.binary())]
    assert [v.to_pylist() for v, _ in call_arrays(call, only_nulls)] == [[None], []]
    assert list(call_arrays(call, [])) == []


@pytest.mark.parametrize(
    "kind", [pa.string(), pa.large_string(), pa.binary(), pa.large_binary(), pa.string_view()]
)
def test_string_and_binary_inputs(rec: Services, kind: pa.DataType) -> None:
    call = ServiceCall(rec.endpoint, "svc", output_type="string")
    [(values, _)] = call_arrays(call, [pa.array(["x", "é"], type=kind)])
    assert values.type == pa.string()
    assert values.to_pylist() == ["X", "é"]


def test_other_input_types_are_refused(rec: Services) -> None:
    call = ServiceCall(rec.endpoint, "svc")
    with pytest.raises(TypeError, match="string or binary, not int64"):
        list(call_arrays(call, [pa.array([1, 2])]))


ERROR_ROWS: list[bytes | None] = [b"ok", b"bad1", b"two", None, b"none", b"\xff\xfe", b"fine"]


def test_on_error_column_gives_null_and_the_error_text(rec: Services) -> None:
    call = ServiceCall(rec.endpoint, "svc", on_error="column", output_type="string")
    [(values, errors)] = call_arrays(call, [pa.array(ERROR_ROWS, type=pa.binary())])
    assert values.to_pylist() == ["OK", None, None, None, None, None, "FINE"]
    assert errors is not None
    assert errors.to_pylist() == [
        None,
        "handler_error: ValueError: refused b'bad1'",
        "bad_reply: the reply has 2 data parts, not 1",
        None,
        "bad_reply: the reply has 0 data parts, not 1",
        "bad_reply: the reply is not UTF-8 (invalid start byte at byte 0)",
        None,
    ]
    # A batch without failures still has its (all-null) error array.
    [(_, errors)] = call_arrays(call, [pa.array([b"ok"])])
    assert errors is not None and errors.to_pylist() == [None]


def test_on_error_null_and_binary_output(rec: Services) -> None:
    call = ServiceCall(rec.endpoint, "svc", on_error="null")
    [(values, errors)] = call_arrays(call, [pa.array(ERROR_ROWS, type=pa.binary())])
    assert values.to_pylist() == [b"OK", None, None, None, None, b"\xff\xfe", b"FINE"]
    assert errors is None


def test_on_error_raise_stops_and_closes_the_socket(rec: Services) -> None:
    call = ServiceCall(rec.endpoint, "svc", window=4)
    before = open_sockets()
    rows = [b"a", b"b", b"bad!", b"c"] + [b"slow"] * 50
    gen = call_arrays(call, chunks(rows, 2, pa.binary()))
    assert next(gen)[0].to_pylist() == [b"A", b"B"]
    with pytest.raises(dcp.RemoteError, match="handler_error: ValueError: refused") as info:
        next(gen)
    assert info.value.code == "handler_error"
    assert open_sockets() == before
    with pytest.raises(BadReply, match="2 data parts"):
        list(call_arrays(call, [pa.array([b"two"])]))
    assert open_sockets() == before


def test_closing_early_closes_the_socket(rec: Services) -> None:
    call = ServiceCall(rec.endpoint, "svc", window=8)
    before = open_sockets()
    gen = call_arrays(call, chunks([b"slow"] * 400, 10, pa.binary()))
    next(gen)
    assert open_sockets() == before + 2  # the client's DEALER and its monitor's PAIR
    gen.close()
    assert open_sockets() == before
    # Far fewer than 400 were sent: the input is read only as the window moves on.
    assert len(rec.recorder.ids) < 40


def test_timeouts_follow_on_error() -> None:
    with services() as s:
        # 2 s: the broker is asked 10% of it before the end, time enough for its answer.
        nobody = ServiceCall(s.endpoint, "nobody", timeout=2, retries=1, on_error="column")
        [(values, errors)] = call_arrays(nobody, [pa.array([b"x", b"y"])])
        assert values.to_pylist() == [None, None]
        assert errors is not None
        # The broker said nobody serves it, at once (the no-wait option, sent by default).
        assert [
            e.startswith("no_workers: no worker serves 'nobody'") for e in errors.to_pylist()
        ] == [
            True,
            True,
        ]
        with pytest.raises(dcp.RequestTimeout):
            fast = attrs_evolve(nobody, on_error="raise", timeout=0.05)
            list(call_arrays(fast, [pa.array([b"x"])]))


def attrs_evolve(call: ServiceCall, **changes: object) -> ServiceCall:
    import attrs

    return attrs.evolve(call, **changes)  # type: ignore[arg-type]


def test_each_task_sends_its_own_request_ids(rec: Services) -> None:
    """A retried Spark task is a new call: new ids (and a new socket), so no reply meant for
    an earlier attempt can be taken for one of its own; the service sees the rows again."""
    call = ServiceCall(rec.endpoint, "svc")
    rows = [pa.array([b"a", b"b", b"c"])]
    first = [v.to_pylist() for v, _ in call_arrays(call, rows)]
    ids_first = set(rec.recorder.ids)
    second = [v.to_pylist() for v, _ in call_arrays(call, rows)]
    ids_second = set(rec.recorder.ids) - ids_first
    assert first == second == [[b"A", b"B", b"C"]]
    assert len(ids_first) == len(ids_second) == 3
    # Ids are REQUEST_ID_PREFIX, 8 random bytes per client, then a counter.
    tracker_part = slice(len(REQUEST_ID_PREFIX), len(REQUEST_ID_PREFIX) + 8)
    assert {i[tracker_part] for i in ids_first}.isdisjoint({i[tracker_part] for i in ids_second})


def test_call_batches_sets_or_replaces_columns(rec: Services) -> None:
    batch = pa.RecordBatch.from_pydict(
        {"id": [1, 2, 3], "text": ["a", "bad", None], "out": [0, 0, 0]}
    )
    call = ServiceCall(rec.endpoint, "svc", on_error="column", output_type="string")
    [got] = call_batches(call, [batch], input_col="text", output_col="out")
    assert got.schema.names == ["id", "text", "out", "out_error"]
    assert got.to_pydict() == {
        "id": [1, 2, 3],
        "text": ["a", "bad", None],
        "out": ["A", None, None],
        "out_error": [None, "handler_error: ValueError: refused b'bad'", None],
    }
    plain = ServiceCall(rec.endpoint, "svc")
    batches = [batch.slice(0, 1), batch.slice(2, 1)]
    out = list(call_batches(plain, batches, input_col="text", output_col="text"))
    assert [b.schema.names for b in out] == [["id", "text", "out"]] * 2
    assert [b.column("text").to_pylist() for b in out] == [[b"A"], [None]]
    with pytest.raises(dcp.RemoteError):
        list(call_batches(plain, [batch], input_col="text", output_col="up"))
    named = list(
        call_batches(
            attrs_evolve(plain, on_error="null"),
            [batch],
            input_col="text",
            output_col="up",
            error_col="ignored_without_column_mode",
        )
    )
    assert named[0].schema.names == ["id", "text", "out", "up"]


def test_large_replies_are_handed_on_in_pieces(rec: Services) -> None:
    """Once the replies of a batch's answered rows hold ``batch_bytes``, those rows are handed
    on: the pieces cover the batch in order (null rows and errors in place), whatever the
    window."""
    rows: list[bytes | None] = [b"abcd", None, b"efgh", b"bad1", None, b"ijkl", b"mnop", None]
    for window in (1, 3, 64):
        call = ServiceCall(rec.endpoint, "svc", window=window, batch_bytes=8,
                           on_error="column", output_type="string")  # fmt: skip
        pieces = list(call_arrays(call, [pa.array(rows), pa.array([b"qrstuvwxyz", b"z"])]))
        assert [(v.to_pylist(), e.to_pylist() if e else e) for v, e in pieces] == [
            (["ABCD", None, "EFGH"], [None, None, None]),
            ([None, None, "IJKL", "MNOP", None],
             ["handler_error: ValueError: refused b'bad1'", None, None, None, None]),
            (["QRSTUVWXYZ"], [None]),  # 10 bytes: handed on alone
            (["Z"], [None]),
        ]  # fmt: skip
    batch = pa.RecordBatch.from_pydict({"id": list(range(8)), "text": rows})
    call = ServiceCall(rec.endpoint, "svc", batch_bytes=4, on_error="null")
    out = list(call_batches(call, [batch, batch], input_col="text", output_col="up"))
    assert [b.num_rows for b in out] == [1, 2, 3, 2, 1, 2, 3, 2]
    up = [b"ABCD", None, b"EFGH", None, None, b"IJKL", b"MNOP", None]
    assert pa.Table.from_batches(out).to_pydict() == {
        "id": list(range(8)) * 2,
        "text": rows * 2,
        "up": up * 2,
    }
    column = call_column(attrs_evolve(call, batch_bytes=6), [pa.array(rows[:3])])
    assert [a.to_pylist() for a in column] == [[b"ABCD", None, b"EFGH"]]


def test_call_column_struct_for_on_error_column(rec: Services) -> None:
    call = ServiceCall(rec.endpoint, "svc", on_error="column")
    [out] = call_column(call, [pa.array([b"a", b"bad"])])
    assert out.type == pa.struct([("value", pa.binary()), ("error", pa.string())])
    assert out.to_pylist() == [
        {"value": b"A", "error": None},
        {"value": None, "error": "handler_error: ValueError: refused b'bad'"},
    ]
    [plain] = call_column(attrs_evolve(call, on_error="raise"), [pa.array([b"a"])])
    assert plain.to_pylist() == [b"A"]


def test_service_call_validation_and_pickling() -> None:
    call = ServiceCall("tcp://127.0.0.1:1", "score", timeout=math.inf)
    assert call.service == b"score"
    assert pickle.loads(pickle.dumps(call)) == call
    assert call.arrow_type == pa.binary()
    cases: list[tuple[dict[str, object], str]] = [
        ({"broker": "localhost:5555"}, "zmq endpoint"),
        ({"window": 0}, "window"),
        ({"timeout": 0.0}, "timeout must be > 0"),
        ({"timeout": math.nan}, "timeout must be > 0"),
        ({"retries": -1}, "retries"),
        ({"on_error": "ignore"}, "on_error must be one of raise, null, column"),
        ({"output_type": "json"}, "output_type must be one of binary, string"),
        ({"batch_bytes": 0}, "batch_bytes"),
    ]
    for bad, match in cases:
        options: dict[str, object] = {"broker": "tcp://127.0.0.1:1", "service": "s"}
        options.update(bad)
        with pytest.raises(ValueError, match=match):
            ServiceCall(**options)  # type: ignore[arg-type]


def test_describe_error() -> None:
    assert describe_error(dcp.RemoteError("queue_full", "busy")) == "queue_full: busy"
    assert describe_error(dcp.RequestTimeout("late")) == "timeout: late"
    assert describe_error(BadReply("odd")) == "bad_reply: odd"
    assert describe_error(dcp.DCPError("other")) == "DCPError: other"


@pytest.mark.skipif(sys.platform == "win32", reason="needs os.fork")
@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # fork with threads (3.12+)
def test_a_forked_child_gets_its_own_context(rec: Services) -> None:
    """Spark's Python workers are forked: a child must not use its parent's zmq context."""
    call = ServiceCall(rec.endpoint, "svc")
    assert [v.to_pylist() for v, _ in call_arrays(call, [pa.array([b"p"])])] == [[b"P"]]
    parent_context = get_context()
    pid = os.fork()
    if pid == 0:  # the child: exit at once whatever happens, never return into pytest
        code = 1
        try:
            out = [v.to_pylist() for v, _ in call_arrays(call, [pa.array([b"c"])])]
            code = 0 if out == [[b"C"]] and get_context() is not parent_context else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert get_context() is parent_context


def test_import_error_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [m for m in sys.modules if m == "dcp.spark" or m.startswith("dcp.spark.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "pyspark", None)
    with pytest.raises(ImportError, match=r"pip install 'dagbox-dcp\[spark\]'"):
        importlib.import_module("dcp.spark")


def test_column_function_is_an_iterator_arrow_udf(rec: Services) -> None:
    from pyspark.sql.pandas.typehints import infer_eval_type
    from pyspark.util import PythonEvalType

    function = column_function(ServiceCall(rec.endpoint, "svc"))
    assert function.__name__ == "svc"
    assert [a.to_pylist() for a in function(iter([pa.array([b"a"]), pa.array([b"b"])]))] == [
        [b"A"],
        [b"B"],
    ]
    # What arrow_udf() infers from the type hints (without a session).
    kind = infer_eval_type(inspect.signature(function), get_type_hints(function), "arrow")
    assert kind == PythonEvalType.SQL_SCALAR_ARROW_ITER_UDF


def test_resolve_broker_without_a_session(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(BROKER_ENV, "tcp://127.0.0.1:2")
    assert resolve_broker("tcp://127.0.0.1:1", None) == "tcp://127.0.0.1:1"
    assert resolve_broker(None, None) == "tcp://127.0.0.1:2"
    monkeypatch.delenv(BROKER_ENV)
    with pytest.raises(ValueError, match="no dcp broker"):
        resolve_broker(None, None)


def test_several_brokers_from_the_argument_conf_or_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A sequence argument is kept as a tuple; a str argument is one endpoint as it is; the
    environment (as the conf, tested in a session) is split on commas, blanks stripped."""
    a, b = "tcp://127.0.0.1:1", "tcp://127.0.0.1:2"
    monkeypatch.setenv(BROKER_ENV, f" {a} , {b},")
    assert resolve_broker(None, None) == (a, b)
    assert resolve_broker([b, a], None) == (b, a)
    assert resolve_broker(f"{a},{b}", None) == f"{a},{b}"  # not split: one endpoint
    monkeypatch.setenv(BROKER_ENV, f"{a},")
    assert resolve_broker(None, None) == a  # one endpoint: a str, today's path
    assert resolve_broker([], None) == a  # an empty list is no argument
    monkeypatch.setenv(BROKER_ENV, " , ")
    with pytest.raises(ValueError, match="no dcp broker"):
        resolve_broker(None, None)
    assert split_brokers(f"{a}, {b}") == (a, b)
    assert split_brokers("") == ()


def test_a_service_call_takes_several_brokers() -> None:
    a, b = "tcp://127.0.0.1:1", "tcp://127.0.0.1:2"
    call = ServiceCall([a, b], "score")  # converted to a tuple
    assert call.broker == (a, b)
    assert pickle.loads(pickle.dumps(call)) == call
    assert ServiceCall(a, "score").broker == a
    for bad, match in (
        ((), "at least one endpoint"),
        ((a, "localhost:5555"), "zmq endpoint"),
        ((a, b, a), "listed twice"),
    ):
        with pytest.raises(ValueError, match=match):
            ServiceCall(bad, "score")


def test_a_task_spreads_its_rows_over_several_brokers(rec: Services) -> None:
    """A task given two brokers (each with its worker) sends rows to both; every row is
    answered once, in order."""
    with services() as other:
        rows: list[bytes | None] = [b"slow%d" % i for i in range(200)]
        call = ServiceCall([rec.endpoint, other.endpoint], "svc", window=16)
        before = open_sockets()
        out = list(call_arrays(call, chunks(rows, 10, pa.binary())))
        got = pa.concat_arrays([v for v, _ in out]).to_pylist()
        assert got == [r.upper() for r in rows if r is not None]
        assert open_sockets() == before
        first, second = len(rec.recorder.ids), len(other.recorder.ids)
    assert first + second == 200
    assert first and second, (first, second)  # (the first rows may all go to one)
