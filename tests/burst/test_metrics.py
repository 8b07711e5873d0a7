"""The figures nobody reports, on synthetic logs: hint accuracy, recovery, priority fairness."""

from __future__ import annotations

import pytest

from yieldgate.burst._metrics import (
    AttemptLog,
    AttemptRecord,
    Probe,
    draw_priorities,
    hint_accuracy,
    jain_index,
    parse_priority_mix,
    priority_fairness,
    recovery,
)
from yieldgate.burst._results import Slo, summarise
from yieldgate.burst._targets import Request


def _ok(start: float, end: float | None = None) -> AttemptRecord:
    return AttemptRecord(
        start_s=start, end_s=end if end is not None else start + 0.05, outcome="ok"
    )


def _yield(end: float, hint: float | None, outcome: str = "yield") -> AttemptRecord:
    return AttemptRecord(start_s=end - 0.001, end_s=end, outcome=outcome, hint_s=hint)


def test_a_hint_is_measured_against_the_next_admission_by_anyone() -> None:
    log = [
        _ok(0.0),
        _yield(0.010, 0.100),  # next admission at 0.120: 110 ms against 100 hinted
        _ok(0.005),  # started before the refusal: does not resolve it
        _ok(0.120),
        _yield(0.200, 0.050, "overloaded"),  # next admission 0.400: +150 ms
        _ok(0.400),
        _yield(0.500, None),  # no hint: not counted
        _yield(0.600, 0.0),  # a zero hint says nothing either
        _yield(0.900, 0.050),  # nothing admitted after it: unresolved
        AttemptRecord(start_s=0.95, end_s=0.97, outcome="fatal"),
    ]
    h = hint_accuracy(log)
    assert (h.hints, h.resolved) == (3, 2)
    # Nearest rank: the median of [10, 150] is 10, the 90th percentile 150.
    assert h.error_ms_p50 == pytest.approx(10.0)
    assert h.error_ms_p90 == pytest.approx(150.0)
    # 10 ms off a 100 ms hint is within max(25 ms, 20 ms); 150 ms off 50 ms is not.
    assert h.within == pytest.approx(0.5)
    assert h.hint_ms_p50 == pytest.approx(50.0)
    assert h.as_dict()["error_ms_p90"] == 150.0


def test_early_capacity_is_a_negative_error() -> None:
    h = hint_accuracy([_yield(1.0, 0.5), _ok(1.1)])
    assert h.error_ms_p50 == pytest.approx(-400.0)
    assert h.within == 0.0


def test_no_hints_no_figures() -> None:
    h = hint_accuracy([_ok(0.0), _yield(0.1, None)])
    assert (h.hints, h.resolved, h.error_ms_p50, h.within) == (0, 0, None, None)


def _probe(sent: float, latency: float, clean: bool = True) -> Probe:
    return Probe(sent_s=sent, end_s=sent + latency, clean=clean)


def test_recovery_waits_for_three_clean_probes_at_baseline_after_the_last_arrival() -> None:
    baseline = [_probe(-0.5 + 0.1 * k, 0.010) for k in range(5)]  # 10 ms
    after = [
        _probe(0.5, 0.005),  # before the last arrival (1.0): ignored
        _probe(1.0, 0.300),  # slow
        _probe(1.3, 0.010, clean=False),  # refused
        _probe(1.4, 0.015),
        _probe(1.5, 0.029),  # threshold: max(2 x 10, 10 + 20) = 30 ms
        _probe(1.6, 0.031),  # just over: the run restarts
        _probe(1.7, 0.010),
        _probe(1.8, 0.010),
        _probe(1.9, 0.010),
        _probe(2.0, 0.010),
    ]
    attempts = [_yield(1.25, 0.05), _ok(1.3)]
    r = recovery(attempts, 1.0, baseline + after)
    assert r.baseline_ms == pytest.approx(10.0)
    assert r.threshold_ms == pytest.approx(30.0)
    assert r.latency_s == pytest.approx(0.7)  # the run that starts at 1.7
    assert r.yields_s == pytest.approx(0.25)
    assert r.recovery_s == pytest.approx(0.7)
    assert r.probes == 15


def test_recovery_is_the_later_of_yields_and_latency() -> None:
    probes = [_probe(-1.0, 0.01), *(_probe(2.0 + 0.1 * k, 0.01) for k in range(3))]
    r = recovery([_yield(5.0, 0.1)], 2.0, probes)
    assert (r.latency_s, r.yields_s, r.recovery_s) == (
        pytest.approx(0.0),
        pytest.approx(3.0),
        pytest.approx(3.0),
    )


def test_recovery_without_probes_or_return() -> None:
    r = recovery([_yield(0.5, 0.1)], 1.0)  # refusals all before the last arrival
    assert (r.yields_s, r.latency_s, r.recovery_s, r.probes) == (0.0, None, None, 0)
    never = recovery([], 0.0, [_probe(-1, 0.01), *(_probe(k, 1.0) for k in range(5))])
    assert never.latency_s is None
    assert never.recovery_s is None
    # No clean baseline probe: no baseline, no latency figure.
    assert recovery([], 0.0, [_probe(-1, 0.01, clean=False)]).baseline_ms is None


def test_jain_index() -> None:
    assert jain_index([1.0, 1.0, 1.0]) == pytest.approx(1.0)
    assert jain_index([1.0, 0.0, 0.0, 0.0]) == pytest.approx(0.25)
    assert jain_index([1.0, 3.0]) == pytest.approx(16 / 20)
    assert jain_index([]) is None
    assert jain_index([0.0, 0.0]) == 1.0


def _request(index: int, latency: float | None) -> Request:
    ok = latency is not None
    return Request(index=index, arrival_s=1.0, end_s=1.0 + (latency or 2.0), ok=ok)


def test_priority_fairness_per_class() -> None:
    requests = [
        _request(0, 0.1),
        _request(1, 0.1),
        _request(2, 0.2),
        _request(3, None),
        _request(4, 0.4),
    ]
    classes = priority_fairness(requests, {0: "high", 1: "high", 2: "low", 3: "low"})
    assert [c.priority for c in classes] == ["high", "normal", "low"]
    high, normal, low = classes
    assert (high.requests, high.succeeded, high.success_rate) == (2, 2, 1.0)
    assert high.jain == pytest.approx(1.0)
    assert high.latency_s_p99 == pytest.approx(0.1)
    assert (normal.requests, normal.latency_s_p50) == (1, pytest.approx(0.4))  # unlabelled
    # One served at 5/s, one failed (0): Jain's index 1/2.
    assert (low.success_rate, low.jain) == (0.5, pytest.approx(0.5))
    assert low.as_dict()["priority"] == "low"


def test_priority_mix_parsing_and_drawing() -> None:
    mix = parse_priority_mix(" high=0.2, NORMAL=0.8")
    assert mix == (("high", 0.2), ("normal", 0.8))
    assert parse_priority_mix("low") == (("low", 1.0),)
    for bad in ("urgent=1", "high=x", "high=0", "high=1,high=2", "high=inf"):
        with pytest.raises(ValueError, match="priority mix"):
            parse_priority_mix(bad)
    drawn = draw_priorities(mix, 1000, seed=3)
    assert drawn == draw_priorities(mix, 1000, seed=3)
    assert 150 < drawn.count("high") < 250
    assert set(drawn) == {"high", "normal"}


def test_the_attempt_log_hears_the_gates_attempts() -> None:
    import yieldgate
    from yieldgate.gate import AttemptDetails
    from yieldgate.gate._outcome import OutcomeKind

    log = AttemptLog()
    observer = log.start_call("g", "normal")
    with observer.scope():
        observer.on_attempt(
            AttemptDetails(
                gate="g",
                attempt=1,
                outcome=OutcomeKind.YIELD,
                reason="saturated",
                hint_s=0.2,
                duration_s=0.01,
            )
        )
    (record,) = log.records
    assert (record.outcome, record.hint_s) == ("yield", 0.2)
    assert record.end_s - record.start_s == pytest.approx(0.01)
    # And a Gate accepts it as its instrumentation.
    gate = yieldgate.Gate(instrumentation=log)
    assert gate.statistics().attempts == 0


def test_summarise_carries_the_new_figures() -> None:
    requests = [_request(0, 0.1), _request(1, None)]
    requests[1].error = "timeout"
    result = summarise(
        strategy="naive",
        label="naive",
        requests=requests,
        attempts=3,
        yields=1,
        slo=Slo(),
        stream=False,
        server=None,
        timeline=[],
        attempt_log=[_yield(1.05, 0.05), _ok(1.2)],
        priorities={0: "high"},
    )
    assert result.timeouts == 1
    assert result.hint_accuracy is not None
    assert result.hint_accuracy.resolved == 1
    assert result.recovery is not None
    assert result.recovery.yields_s == pytest.approx(0.05)
    assert [c.priority for c in result.priorities] == ["high", "normal"]
    document = result.as_dict()
    assert document["timeouts"] == 1
    assert document["recovery"]["latency_s"] is None
    assert document["server_rss_peak_bytes"] is None


def test_the_table_and_the_csv_show_the_new_figures() -> None:
    from rich.console import Console

    from yieldgate.burst import BurstReport, TimelinePoint, render_table
    from yieldgate.burst._csv import csv_rows

    requests = [_request(0, 0.1), _request(1, None), _request(2, 0.3)]
    requests[1].error = "timeout"
    timeline = [
        TimelinePoint(
            t_s=0.1 * k,
            client_inflight=0,
            client_attempts=k,
            client_yields=0,
            completed=k,
            failed=0,
            scraped_queue=float(k),
            scraped_running=2.0,
            server_rss_bytes=(50 + k) * 2**20,
        )
        for k in range(3)
    ]
    result = summarise(
        strategy="naive",
        label="naive",
        requests=requests,
        attempts=4,
        yields=1,
        slo=Slo(),
        stream=False,
        server=None,
        timeline=timeline,
        attempt_log=[_yield(1.05, 0.05), _ok(1.1)],
        probes=[_probe(-1.0, 0.01), *(_probe(1.5 + 0.1 * k, 0.01) for k in range(3))],
        priorities={0: "high", 1: "high", 2: "low"},
    )
    report = BurstReport(
        config={
            "target": "tcp://127.0.0.1:1",
            "requests": 3,
            "profile": {"spec": "all-at-once"},
            "timeout_s": 0.5,
        },
        machine={},
        created="2026-01-01T00:00:00+00:00",
        results=(result,),
    )
    console = Console(record=True, width=200)
    render_table(report, console)
    text = console.export_text()
    for needle in (
        "time-outs",
        "hint error p50/p90 ms (within)",
        "0.0 / 0.0 (100% of 1)",  # admitted 50 ms after a 50 ms hint
        "recovery s (yields / latency)",
        "0.05 / 0.50",  # all arrived at 1.0; the probes from 1.5 on are clean
        "high: success, p99, Jain",
        "50.0%, 0.10 s, 0.50",
        "low: success, p99, Jain",
        "scraped queue / running peak",
        "2 / 2",
        "server RSS peak MiB",
        "52",
    ):
        assert needle in text, needle
    (row,) = csv_rows(report)
    assert row["timeouts"] == 1
    assert row["recovery_latency_s"] == pytest.approx(0.5)
    assert row["priority_high_success_rate"] == 0.5
    assert row["priority_normal_requests"] == ""
    assert row["scraped_queue_peak"] == 2.0
    assert row["scraped_kv_cache_peak"] == ""
    assert row["server_rss_peak_mb"] == pytest.approx(52.0)
