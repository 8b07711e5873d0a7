"""The rates' window: throughput, goodput and tokens per second are over the longest of the
offered window, the makespan and the lower bound, everywhere they are shown."""

from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from tests.burst.conftest import schema_errors
from yieldgate.burst import SCHEMA, BurstReport, ServerCounters, Slo, StrategyResult, write_csv
from yieldgate.burst._rates import per_window, rate_window_s
from yieldgate.burst._report import markdown_table
from yieldgate.burst._results import summarise
from yieldgate.burst._targets import Request

_ZERO = {
    "max_inflight": 4,
    "exec_ms_ewma": None,
    "exec_ms_total": 0.0,
    "inflight_peak": 0,
    **{f"{k}_total": 0 for k in ("admitted", "executed", "failed", "cancelled", "yielded")},
    "errors_total": 0,
}


def counters(*, executed: int, exec_ms: float, max_inflight: int = 4) -> ServerCounters:
    """The server's counters around a run that executed ``executed`` requests of ``exec_ms``."""
    after = {
        **_ZERO,
        "max_inflight": max_inflight,
        "admitted_total": executed,
        "executed_total": executed,
        "exec_ms_total": executed * exec_ms,
    }
    return ServerCounters.between({**_ZERO, "max_inflight": max_inflight}, after)


def result(
    spans: Sequence[tuple[float, float | None, bool]],
    *,
    server: ServerCounters | None = None,
    name: str = "naive",
    stream: bool = False,
) -> StrategyResult:
    """A result summarised as the runner summarises one, from ``(arrival, end, ok)`` records
    (``end`` None: never finished); a streamed success sends 4 chunks."""
    requests = []
    for i, (arrival, end, ok) in enumerate(spans):
        r = Request(index=i, arrival_s=arrival, end_s=end, ok=ok)
        r.error = None if ok else ("YieldExhaustedError" if end is not None else None)
        if stream and ok and end is not None:
            r.chunk_s.extend(arrival + (end - arrival) * k / 4 for k in (1, 2, 3, 4))
        requests.append(r)
    return summarise(
        strategy=name,
        label=name,
        requests=requests,
        attempts=len(spans),
        yields=sum(1 for _, _, ok in spans if not ok),
        slo=Slo(),
        stream=stream,
        server=server,
        timeline=[],
    )


def test_the_window_is_the_longest_of_offered_makespan_and_bound() -> None:
    assert rate_window_s(4.0, 1.0, None) == 4.0
    assert rate_window_s(0.0, 1.0, 2.5) == 2.5
    assert rate_window_s(0.0, 3.0, 2.5) == 3.0
    assert rate_window_s(1.0, 0.5, None) == 1.0
    assert per_window(10, 2.0) == 5.0
    assert per_window(10, 0.0) == 0.0


def test_an_offered_window_longer_than_the_makespan_is_the_window() -> None:
    # Arrivals over 4 s; the last two never finished, so the makespan ends at 1 s.
    r = result([(0.0, 0.5, True), (1.0, 1.0, True), (3.0, None, False), (4.0, None, False)])
    assert (r.offered_s, r.makespan_s, r.lower_bound_s) == (4.0, 1.0, None)
    assert r.window_s == 4.0
    assert r.throughput_per_s == pytest.approx(2 / 4.0)
    assert r.goodput_per_s == pytest.approx(2 / 4.0)


def test_a_makespan_longer_than_the_offered_window_is_the_window() -> None:
    # Arrivals over 1 s, the last reply at 5 s: the makespan is the window, as it always was.
    r = result([(0.0, 2.0, True), (0.5, 4.0, True), (1.0, 5.0, True)])
    assert (r.offered_s, r.makespan_s) == (1.0, 5.0)
    assert r.window_s == 5.0
    assert r.throughput_per_s == pytest.approx(3 / 5.0)


def test_failing_fast_is_measured_over_the_time_the_burst_needed() -> None:
    # 40 requests at once on 4 slots of 100 ms: the bound is 1 s. naive got 4 replies by
    # 0.1 s and 36 refusals at once; over its makespan that would be 40 successes/s.
    spans = [(0.0, 0.1, True)] * 4 + [(0.0, 0.01, False)] * 36
    r = result(spans, server=counters(executed=4, exec_ms=100.0), stream=True)
    assert r.makespan_s == pytest.approx(0.1)
    assert r.lower_bound_s == pytest.approx(1.0)
    assert r.window_s == pytest.approx(1.0)
    assert r.succeeded / r.makespan_s == pytest.approx(40.0)  # what the makespan said
    assert r.throughput_per_s == pytest.approx(4.0)
    assert r.goodput_per_s == pytest.approx(4.0)
    assert r.tokens_per_s == pytest.approx(16 / 1.0)


def test_json_csv_and_table_agree_on_the_window(tmp_path: Path) -> None:
    spans = [(0.0, 0.1, True)] * 4 + [(0.0, 0.01, False)] * 36
    r = result(spans, server=counters(executed=4, exec_ms=100.0))
    report = BurstReport(
        config={"requests": 40, "profile": {"spec": "all-at-once"}, "target": "tcp://"},
        machine={},
        created="2026-01-01T00:00:00+00:00",
        results=(r,),
    )
    shown = json.loads(json.dumps(report.as_dict()))["results"][0]
    assert schema_errors(shown, SCHEMA["properties"]["results"]["items"]) == []
    assert shown["window_s"] == pytest.approx(1.0)
    assert shown["offered_s"] == 0.0
    assert shown["throughput_per_s"] == pytest.approx(4.0)
    assert shown["goodput"]["per_s"] == pytest.approx(4.0)
    with write_csv(report, tmp_path / "r.csv").open(newline="") as f:
        (row,) = list(csv.DictReader(f))
    assert float(row["window_s"]) == pytest.approx(1.0)
    assert float(row["throughput_per_s"]) == pytest.approx(4.0)
    assert float(row["goodput_per_s"]) == pytest.approx(4.0)
    table = markdown_table(report)
    assert "rates' window s" in table
    assert "10.0%, 4.0/s" in table  # the goodput row
