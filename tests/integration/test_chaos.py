"""Chaos test (issue 5, "Faults"): :mod:`benchmarks.chaos` with real processes.

The fast version runs in CI: one 12-second cycle (a broker SIGKILLed and restarted on the
same port, workers SIGKILLed at random and replaced, one worker hanging with its event loop
running and one with its process stalled), then checks that every request got its own reply
exactly once, that each fault really happened and was recovered from, and that no process
outlived the run. ``-m slow`` runs the long version (60 s, three cycles).

The figures of :mod:`benchmarks.chaos_figures` are also checked on synthetic records, where
the right answer is known.
"""

from __future__ import annotations

import itertools
import json
from collections import Counter
from pathlib import Path
from typing import Any

import attrs
import pytest

import dcp
from benchmarks import chaos, chaos_figures
from benchmarks.chaos_figures import Phase

#: How long a hung worker hangs: long enough that only the rescue (the client's retry after
#: its 1.5 s attempt, the broker's redelivery after 0.6 s of silence) can answer its request
#: first, however slowly a loaded machine runs the other workers.
HANG = ("--hang-for", "8")


def _run(tmp_path: Path, *args: str) -> dict[str, Any]:
    out = tmp_path / "chaos.json"
    code = chaos.main([*args, "--logs", str(tmp_path / "logs"), "--json", str(out)])
    data = json.loads(out.read_text())
    [record] = data["runs"]
    record["command"] = data["command"]
    assert code == 0, record["figures"]
    assert isinstance(record, dict)
    return record


def _check(record: dict[str, Any], cycles: int) -> None:
    fig = record["figures"]
    # Nothing lost, nothing wrong, nothing delivered twice, no error replies.
    assert fig["lost"] == 0
    assert fig["wrong"] == 0
    assert fig["duplicates_delivered"] == 0
    assert fig["errors"] == {}
    assert fig["replies"] == fig["sent"] > 300
    # At least once: every answered request ran at least once, some more than once.
    assert fig["handler_runs"] >= fig["replies"]
    assert fig["requests_run_more_than_once"] >= 1
    # Every fault happened.
    kinds = Counter(f["kind"] for f in record["faults"])
    assert kinds["kill_broker"] == kinds["start_broker"] == fig["broker_restarts"] == cycles
    assert all(f["signal"] == 9 for f in record["faults"] if f["kind"] == "kill_broker")
    assert fig["worker_kills"] >= 2 * cycles
    assert fig["worker_kills_confirmed"] == fig["worker_kills"]
    # Both hangs happened, and each hung request was answered. The blocking hang stalls its
    # process: the broker's liveness check drops it and another worker process answers (held
    # requests are redelivered). The async hang keeps heartbeating: its request stays with
    # it, the client's retries (after its attempt timeout) join it instead of running it
    # elsewhere (routing Rule R8), and it answers when its hang ends.
    modes = Counter(h["mode"] for h in fig["hangs"])
    assert modes == {"hang-async": cycles, "hang-block": cycles}
    for hang in fig["hangs"]:
        assert hang["answered"], hang
        assert hang["elsewhere"] == (hang["mode"] == "hang-block"), hang
    assert fig["client_retries"] >= 1
    assert fig["broker_last"]["expired_workers"] >= 1
    assert fig["broker_last"]["redeliveries"] >= 1
    # Recovery after each broker restart: replies again, then half the baseline rate.
    assert len(fig["recoveries"]) == cycles
    for rec in fig["recoveries"]:
        assert rec["baseline_rate"] > 0
        assert rec["first_reply_s"] is not None, rec
        assert rec["to_50pct_s"] is not None, rec
    down = [p for p in fig["phases"] if p["name"] == "broker down"]
    assert all(p["rate"] < 50 for p in down), down
    # Only loopback; every process started was killed and reaped.
    assert record["endpoint"].startswith("tcp://127.0.0.1:")
    assert record["processes"] >= 1 + 4 + 2 + 2 + fig["worker_kills"]
    assert record["leftovers"] == []
    assert record["tracebacks"] == {}


@pytest.mark.timeout(120)
def test_chaos_fast(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Mixed peers: dcp workers, majortomo's Worker and DagBox-style DCP workers (the last
    # two silent while busy) are killed, hung and restarted on alike.
    record = _run(tmp_path, "--duration", "12", "--seed", "5", "--peers", "mixed", *HANG)
    _check(record, cycles=1)
    table = capsys.readouterr().out
    assert "| duplicates delivered to the application | 0 |" in table
    assert "| lost (timed out or unfinished) | 0 |" in table
    assert "mixed (dcp, majortomo, DagBox-style) workers" in table
    assert record["command"].startswith("python -m benchmarks.chaos --duration 12")


@pytest.mark.timeout(90)
def test_chaos_deadlines(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    record = _run(tmp_path, "--scenario", "deadlines", "--slow-work", "3")
    cfg = record["config"]
    fig = record["figures"]
    # The long job ran to the end, far past the fast requests' work timeout, and once:
    # unless a stall of the machine made the broker drop its worker for silence (liveness,
    # not work timeouts; delivery is at least once).
    slow = fig["slow"]
    broker = fig["broker_last"]
    assert slow["ok"] is True, slow
    assert slow["runs"] == 1 or broker["expired_workers"] > 0, (slow, broker)
    assert 3.0 <= slow["latency_s"] < 10 * 3.0
    # Every fast request answered, correctly, once; none needed a client retry (retries=0).
    fast = fig["fast"]
    assert fast["replies"] == fast["sent"] > 100
    assert fast["timeouts"] == fast["unfinished"] == fast["wrong"] == fast["duplicates"] == 0
    assert fast["errors"] == {}
    assert fast["retries"] == 0
    # The hung fast request: the broker gave it to another worker after its work timeout,
    # and the hung worker cancelled its handler.
    [hang] = fig["fast_hangs"]
    assert hang["answered"], hang
    assert hang["worker_cancelled"]
    assert cfg["fast_work_timeout"] <= hang["latency_s"] < 10 * cfg["fast_work_timeout"] + 5
    # The job every worker hangs on: run max_redeliveries + 1 times, then an error reply.
    doomed = fig["doomed"]
    assert doomed["error"] == "redelivery_limit", doomed
    assert doomed["runs"] == cfg["max_redeliveries"] + 1 == fig["doomed_runs_expected"]
    assert doomed["latency_s"] >= doomed["runs"] * cfg["doomed_work_timeout"]
    assert broker["work_timeouts"] >= cfg["max_redeliveries"] + 2
    assert broker["rejections"].get("redelivery_limit") == 1
    assert record["endpoint"].startswith("tcp://127.0.0.1:")
    assert record["leftovers"] == []
    assert record["tracebacks"] == {}
    table = capsys.readouterr().out
    assert "| slow job: runs | 1 |" in table
    assert "error `redelivery_limit`" in table


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_chaos_long(tmp_path: Path) -> None:
    # Three cycles of 30 s: each hangs phase (the last 30%, 9 s) outlasts the 8 s hang, so the
    # async hang is answered by its own worker before the phase's end stops the hangers
    # (with 60 s, 6 s phases, the hanger was stopped mid-hang and its request went elsewhere).
    record = _run(tmp_path, "--duration", "90", "--cycles", "3", "--seed", "11", *HANG)
    _check(record, cycles=3)
    # Worker core Rules W12-W13: no dcp.Worker's request runs again across a broker restart
    # while that worker lives. (Not asserted in the short CI run: there, a worker process
    # descheduled past its liveness on a loaded machine is dropped by the broker and its
    # request redelivered, which this figure would count; tests/integration/test_restart.py checks
    # the mechanism deterministically.)
    assert record["figures"]["reruns_worker_survived_dcp"] == 0


# --------------------------------------------------------------------------- schedule


def test_schedule_is_seeded_and_faults_stay_in_their_phases() -> None:
    cfg = chaos.Config(duration=40, seed=3, workers=5)
    events, phases = chaos.schedule(cfg)
    assert chaos.schedule(cfg) == (events, phases)
    assert chaos.schedule(chaos.Config(duration=40, seed=4, workers=5))[0] != events
    assert cfg.n_cycles == 2
    assert [p.name for p in phases[:5]] == [
        "steady",
        "broker down",
        "broker recovery",
        "worker kills",
        "hangs",
    ]
    for a, b in itertools.pairwise(phases):
        assert a.end == pytest.approx(b.start)
    assert phases[-1].end == pytest.approx(40)
    for ev in events:
        [phase] = [p for p in phases if p.start <= ev.t < p.end]
        expected = {
            "kill_broker": "broker down",
            "start_broker": "broker recovery",
            "kill_worker": "worker kills",
            "hang": "hangs",
            "end_hangs": "hangs",
        }[ev.kind]
        assert phase.name == expected, ev
        if ev.kind == "kill_worker":
            assert 0 <= int(ev.arg) < 5
    assert sum(ev.kind == "end_hangs" for ev in events) == 1  # the last cycle's run to the end


# --------------------------------------------------------------------------- figures


def test_recovery_from_a_synthetic_timeline() -> None:
    # 1000 replies/s (10 per 10 ms bucket) until the kill at 2.0 s, none until 2.5 s, then
    # 300/s for 0.5 s, then 1000/s again.
    timeline: dict[int, int] = {}
    for i in range(600):
        t = i / 100
        if t < 2.0 or t >= 3.0:
            timeline[i] = 10
        elif t >= 2.5:
            timeline[i] = 3
    rec = chaos_figures.recovery(timeline, 0.01, kill=2.0, restart=2.4, end=6.0)
    assert rec["baseline_rate"] == pytest.approx(1000)
    assert rec["downtime_s"] == pytest.approx(0.4)
    assert rec["first_reply_s"] == pytest.approx(0.1)
    # 50% of 1000/s over 0.25 s = 125 replies: the window ending at 3.0 + 0.11 s holds
    # 11 buckets of 10 and 14 of 3 = 152; at 3.0 + 0.09 it holds 9 x 10 + 16 x 3 = 138;
    # at 3.08: 8 x 10 + 17 x 3 = 131; at 3.07: 7 x 10 + 18 x 3 = 124 < 125.
    assert rec["to_50pct_s"] == pytest.approx(3.08 - 2.4)
    assert rec["to_90pct_s"] == pytest.approx(3.0 + 0.25 * 0.9 - 2.4, abs=0.011)
    never = chaos_figures.recovery(timeline, 0.01, kill=2.0, restart=2.4, end=2.9)
    assert never["to_50pct_s"] is None
    assert never["to_90pct_s"] is None
    empty = chaos_figures.recovery({}, 0.01, kill=2.0, restart=2.4, end=6.0)
    assert empty["first_reply_s"] is None
    assert empty["to_50pct_s"] is None


def test_broker_statistics_from_its_log_line() -> None:
    # Every counter 0 (whatever fields the broker has by now), a few set.
    fields: dict[str, Any] = {f.name: 0 for f in attrs.fields(dcp.BrokerStatistics)}
    fields.update(
        requests=10,
        redeliveries=2,
        expired_workers=2,
        rejections={"reply_from_non_worker": 1},
        services={b"chaos": dcp.QueueStatistics(workers=4, idle=4, queued=0)},
    )
    stats = dcp.BrokerStatistics(**fields)
    log = f"x dcp.cli INFO broker listening\nx dcp.cli INFO broker stopped: {stats}\n"
    parsed = chaos_figures.broker_statistics(log)
    assert parsed["redeliveries"] == 2
    assert parsed["expired_workers"] == 2
    assert parsed["requests"] == 10
    assert parsed["rejections"] == {"reply_from_non_worker": 1}
    assert "idle" not in parsed  # per-service figures are not counters of the broker
    assert chaos_figures.broker_statistics("no such line") == {}


def _client_record(name: str, **over: Any) -> dict[str, Any]:
    rec: dict[str, Any] = {
        "name": name,
        "mode": "async/trio",
        "sent": 4,
        "replies": 4,
        "wrong": 0,
        "duplicates": 0,
        "timeouts": 0,
        "unfinished": 0,
        "errors": {},
        "stats": {"retries": 1, "duplicates": 1, "late": 0, "malformed": {}},
        "timeline": {"0": 2, "150": 2},
        "latency_ms": {"1": 3, "900": 1},
        "by_worker": {"11": 3, "12": 1},
        "slow": [[f"{name}:3", "12", 0.9]],
    }
    rec.update(over)
    return rec


def test_compute_and_render() -> None:
    records = [_client_record("c0"), _client_record("c1", timeouts=1, sent=5)]
    events = [
        {"ev": "run", "id": "c0:3", "pid": 13},
        {"ev": "run", "id": "c0:3", "pid": 12},
        {"ev": "hang", "mode": "hang-async", "id": "c0:3", "pid": 13, "t": 0.0},
        {"ev": "hang", "mode": "hang-block", "id": "c1:7", "pid": 14, "t": 0.0},
        # Run by 15 (killed), then again; run by 16 (alive, not hung), then again.
        {"ev": "run", "id": "c1:1", "pid": 15},
        {"ev": "run", "id": "c1:1", "pid": 12},
        {"ev": "run", "id": "c1:2", "pid": 16},
        {"ev": "run", "id": "c1:2", "pid": 12},
    ]
    faults = [
        {"kind": "kill_broker", "t": 0.5, "pid": 10, "signal": 9},
        {"kind": "start_broker", "t": 1.0, "pid": 11},
        {"kind": "kill_worker", "t": 1.2, "pid": 15, "signal": 9},
        {"kind": "kill_worker", "t": 1.3, "pid": 17, "signal": None},
    ]
    phases = [Phase("steady", 0, 0.5), Phase("broker down", 0.5, 1.0)]
    phases += [Phase("broker recovery", 1.0, 2.0)]
    fig = chaos_figures.compute(
        records=records,
        worker_events=events,
        faults=faults,
        phases=phases,
        bucket=0.01,
        duration=2.0,
        broker_stats={"redeliveries": 1, "rejections": {}},
    )
    assert fig["sent"] == 9
    assert fig["lost"] == 1
    assert fig["client_retries"] == 2
    assert fig["handler_runs"] == 6
    assert fig["requests_run_more_than_once"] == 3
    assert fig["reruns_worker_survived"] == 1  # c1:2 (c0:3's first run hung, c1:1's died)
    assert fig["worker_kills"] == 2
    assert fig["worker_kills_confirmed"] == 1
    assert fig["broker_restarts"] == 1
    assert fig["per_second"] == [4, 4]
    assert fig["latency_ms"] == {"p50": 1.0, "p99": 900.0, "p999": 900.0, "max": 900.0}
    [rescued, unanswered] = fig["hangs"]
    assert rescued["answered"] and rescued["elsewhere"] and rescued["answered_by"] == 12
    assert not unanswered["answered"] and unanswered["answered_by"] is None
    [rec] = fig["recoveries"]
    assert rec["first_reply_s"] == pytest.approx(0.5)
    assert [p["rate"] for p in fig["phases"]] == [8.0, 0.0, 4.0]
    table = chaos_figures.render(fig, "settings")
    assert table.startswith("settings\n")
    assert "| lost (timed out or unfinished) | 1 |" in table
    assert "| hung requests answered / by another worker process | 1 / 1 of 2 |" in table
    assert "| hang-block | 14 | - | - |" in table
    assert "| messages refused (last broker) | 0 |" in table
    assert "| ... of them where the first worker survived | 1 |" in table


def test_restart_while_jobs_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # benchmarks.restart, one short round: the jobs end just after the new broker is up.
    from benchmarks import restart

    out = tmp_path / "restart.json"
    argv = ["--rounds", "1", "--jobs", "4", "--work", "1.5", "--json", str(out)]
    assert restart.main(argv) == 0
    [fig] = json.loads(out.read_text())["rounds"]
    assert fig["answered"] == fig["handler_runs"] == 4  # each job run once
    assert fig["client_retries"] == 0
    assert fig["new_broker_rejections"] == {}
    assert "every job answered, run once" in capsys.readouterr().out


def test_a_worker_killed_after_the_re_run_does_not_excuse_it() -> None:
    events = [
        {"ev": "run", "id": "a", "pid": 15, "t": 10.0},
        {"ev": "run", "id": "a", "pid": 12, "t": 11.0},  # 15 still alive: counts
        {"ev": "run", "id": "b", "pid": 16, "t": 10.0},
        {"ev": "run", "id": "b", "pid": 12, "t": 13.0},  # 16 killed at 12.0: excused
        {"ev": "run", "id": "b", "pid": 12, "t": 14.0},
    ]
    faults = [
        {"kind": "kill_worker", "t": 2.0, "pid": 15, "clock": 12.0},
        {"kind": "kill_worker", "t": 2.0, "pid": 16, "clock": 12.0},
    ]
    assert chaos_figures.reruns_worker_survived(events, faults) == 1
    # Old records without times: a worker killed at any time excuses its re-runs.
    untimed = [{k: v for k, v in e.items() if k != "t"} for e in events]
    assert chaos_figures.reruns_worker_survived(untimed, faults) == 0
