"""The report for people: the rich table, the Markdown table, the plot."""

from __future__ import annotations

from pathlib import Path

import pytest
from rich.console import Console

from tests.burst.conftest import schema_errors
from yieldgate.burst import (
    SCHEMA,
    BurstReport,
    Goal,
    ServerCounters,
    Slo,
    TimelinePoint,
    markdown_table,
    render_table,
    summary_line,
    write_plot,
)
from yieldgate.burst._results import summarise
from yieldgate.burst._targets import Request

COUNTERS = {
    "max_inflight": 2,
    "exec_ms_ewma": 100.0,
    "inflight_peak": 2,
    "admitted_total": 0,
    "executed_total": 0,
    "failed_total": 0,
    "cancelled_total": 0,
    "yielded_total": 0,
    "errors_total": 0,
    "yielded_by_reason": {},
}


def _report(*, with_server: bool) -> BurstReport:
    after = {
        **COUNTERS,
        "admitted_total": 3,
        "executed_total": 3,
        "yielded_total": 2,
        "yielded_by_reason": {"saturated": 2},
        "backend": {"serving": {"ttft_ms": {"p50": 5.0, "p95": 6.0, "p99": 7.0}}},
    }
    server = ServerCounters.between(COUNTERS, after) if with_server else None
    results = []
    for name, ok in (("yieldgate", True), ("naive", False)):
        requests = []
        for i in range(3):
            r = Request(index=i, arrival_s=0.0, end_s=0.1 * (i + 1), ok=ok or i == 0)
            r.error = None if r.ok else "YieldExhaustedError"
            r.chunk_s.extend([0.05 * (i + 1), 0.1 * (i + 1)])
            requests.append(r)
        timeline = [
            TimelinePoint(
                t_s=0.1 * k,
                client_inflight=k % 2,
                client_attempts=k,
                client_yields=k // 2,
                completed=k,
                failed=0,
                server_inflight=(k % 2) if with_server else None,
                server_executed=k if with_server else None,
                server_yielded=k // 2 if with_server else None,
            )
            for k in range(4)
        ]
        results.append(
            summarise(
                strategy=name,
                label=name,
                requests=requests,
                attempts=5,
                yields=2,
                slo=Slo(tpot_ms=100),
                stream=True,
                server=server,
                timeline=timeline,
            )
        )
    return BurstReport(
        config={
            "scenario": "unit",
            "target": "tcp://127.0.0.1:1",
            "requests": 3,
            "profile": {"spec": "all-at-once"},
            "stream": True,
            "slo": {"ttft_ms": None, "tpot_ms": 100.0, "e2e_ms": None},
            "fresh_server_per_strategy": False,
            "serve_args": None,
        },
        machine={},
        created="2026-01-01T00:00:00+00:00",
        results=tuple(results),
        goal=Goal(max_attempts_per_request=2.0),
    )


def test_rich_table_has_a_column_per_strategy_and_every_figure() -> None:
    console = Console(record=True, width=200)
    render_table(_report(with_server=True), console)
    text = console.export_text()
    for needle in (
        "yieldgate",
        "naive",
        "success",
        "attempts / request",
        "1.67 (5)",
        "YieldExhaustedError 2",
        "makespan / bound",
        "TTFT p50/p95/p99 ms",
        "TPOT p50/p95/p99 ms",
        "ITL p50/p95/p99 ms",
        "goodput",
        "server executed / yielded",
        "3 / 2",
        "server TTFT p50/p95/p99 ms",
        "5.0 / 6.0 / 7.0",
        "goodput: TPOT <= 100 ms",
        "yieldgate: success 100.0% (goal >= 100%), 1.67 attempts/request (goal <= 2): met",
    ):
        assert needle in text, needle


def test_markdown_table() -> None:
    lines = markdown_table(_report(with_server=False)).splitlines()
    assert lines[0].startswith("| strategy | success | attempts / request |")
    assert lines[2].startswith("| yieldgate | 100.0% | 1.67 (5) |")
    assert lines[3].startswith("| naive | 33.3% |")
    assert len(lines) == 4
    assert summary_line(_report(with_server=False)).endswith(": met")


@pytest.mark.parametrize("with_server", [True, False])
def test_plot_is_a_png(tmp_path: Path, with_server: bool) -> None:
    out = write_plot(_report(with_server=with_server), tmp_path / "sub" / "plot.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert out.stat().st_size > 10_000


def test_schema_is_self_consistent() -> None:
    assert SCHEMA["properties"]["schema"]["const"] == "yieldgate.burst/1"
    assert schema_errors({"schema": "yieldgate.burst/1"}, SCHEMA)  # far from complete


def test_the_bound_uses_the_runs_mean_execution_not_the_moving_average() -> None:
    # The demo's bound read exec_ms_ewma, which leans to the last executions of a burst
    # (on a batching backend, the fast ones as it drains): it put yieldgate at 1.34x a
    # bound it could not reach.
    before = {**COUNTERS, "exec_ms_total": 1_000.0, "executed_total": 10}
    after = {
        **COUNTERS,
        "exec_ms_ewma": 50.0,
        "exec_ms_total": 1_000.0 + 8 * 200.0,
        "executed_total": 16,
        "failed_total": 2,
    }
    server = ServerCounters.between(before, after)
    assert server.exec_ms_mean == pytest.approx(200.0)
    requests = [Request(index=i, arrival_s=0.0, end_s=1.0, ok=True) for i in range(8)]
    result = summarise(
        strategy="yieldgate",
        label="yieldgate",
        requests=requests,
        attempts=8,
        yields=0,
        slo=Slo(),
        stream=False,
        server=server,
        timeline=[],
    )
    assert result.lower_bound_s == pytest.approx(8 * 0.2 / 2)
    # A server that reports no total: the moving average, as before.
    assert ServerCounters.between(COUNTERS, {**COUNTERS, "executed_total": 1}).exec_ms_mean is None


def test_each_error_kind_is_spelt_one_way_in_every_report() -> None:
    from yieldgate.burst._csv import csv_rows
    from yieldgate.burst._html import html_report

    report = _report(with_server=False)
    naive = report.results[1]
    failed = [Request(index=i, arrival_s=0.0, end_s=0.1, error="CircuitOpenError") for i in (0, 1)]
    cut = Request(index=2, arrival_s=0.0, end_s=0.1, error="unreachable")
    cut.unreachable = "connection refused to 127.0.0.1:1"
    broken = summarise(
        strategy="naive",
        label="naive",
        requests=[*failed, cut],
        attempts=1,
        yields=0,
        slo=Slo(),
        stream=False,
        server=None,
        timeline=[],
    )
    assert naive.errors_by_kind == {"YieldExhaustedError": 2}
    assert naive.as_dict()["errors_by_kind"] == {"YieldExhaustedError": 2}
    assert csv_rows(report)[1]["errors_by_kind"] == "YieldExhaustedError=2"
    assert "YieldExhaustedError 2" in markdown_table(report)
    assert "YieldExhaustedError 2" in html_report(report)
    # An unreachable target comes first, with why, before the breaker it opened.
    assert broken.unreachable == "connection refused to 127.0.0.1:1"
    assert broken.as_dict()["unreachable"] == "connection refused to 127.0.0.1:1"
    one = BurstReport(config=report.config, machine={}, created=report.created, results=(broken,))
    (row,) = [line for line in markdown_table(one).splitlines() if line.startswith("| naive")]
    assert "unreachable 1: connection refused to 127.0.0.1:1; CircuitOpenError 2" in row
    assert csv_rows(one)[0]["unreachable"] == "connection refused to 127.0.0.1:1"
