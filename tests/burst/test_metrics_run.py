"""One real run against the reference server: time-outs, priorities, probes, scraping, memory."""

from __future__ import annotations

import pytest

from tests.burst.conftest import schema_errors
from yieldgate.burst import SCHEMA, ArrivalProfile, BurstConfig, Strategy, run_burst
from yieldgate.burst._csv import csv_rows

pytestmark = pytest.mark.e2e


def test_time_outs_priorities_probes_and_scraping_against_a_queueing_server() -> None:
    # 2 slots of 300 ms and a queue: the last 2 of 12 requests at once cannot be done
    # before 1.8 s, past the 1.5 s time-out, however fast the machine; the first 2 can
    # be, with 1.2 s to spare for a busy machine's overhead.
    config = BurstConfig(
        target="openai+http://",
        serve_args=("--max-inflight", "2", "--exec-ms", "300", "--queue", "unbounded"),
        requests=12,
        profile=ArrivalProfile.all_at_once(),
        strategies=(Strategy(name="naive"),),
        timeout_s=1.5,
        priority_mix=(("high", 0.5), ("normal", 0.5)),
        recovery_probe_s=0.05,
        baseline_probes=2,
        sample_interval_s=0.05,
    )
    report = run_burst(config)
    (result,) = report.results
    # Every request either got its reply or was given up on at 1.5 s, nothing else.
    assert set(result.errors_by_kind) <= {"timeout"}
    assert result.timeouts >= 2
    assert result.succeeded >= 1
    assert result.succeeded + result.timeouts == 12
    assert result.latency_s.p99 is not None
    assert result.latency_s.p99 < 1.5 + 0.5  # within its time-out, give or take the loop
    # Priorities were drawn, sent and reported per class.
    classes = {c.priority: c for c in result.priorities}
    assert set(classes) == {"high", "normal"}
    assert sum(c.requests for c in classes.values()) == 12
    assert sum(c.succeeded for c in classes.values()) == result.succeeded
    # The server's queue serves high before normal: the header reached it.
    assert classes["high"].success_rate >= classes["normal"].success_rate
    # The queue was scraped from the server's /metrics while it ran.
    assert max(p.scraped_queue or 0 for p in result.timeline) >= 1
    assert max(p.scraped_running or 0 for p in result.timeline) >= 1
    assert result.server_rss_peak_bytes is not None
    # The probes found the server back at its baseline once the burst was over.
    assert result.recovery is not None
    assert result.recovery.baseline_ms is not None
    assert result.recovery.baseline_ms >= 300
    assert result.recovery.latency_s is not None
    assert result.recovery.yields_s == 0.0  # a queueing server refuses nothing
    assert result.recovery.probes >= 2 + 3
    # All of it in the JSON (schema-checked) and the CSV.
    document = report.as_dict()
    assert schema_errors(document, SCHEMA) == []
    assert document["config"]["timeout_s"] == 1.5
    (row,) = csv_rows(report)
    assert row["timeouts"] == result.timeouts
    assert row["priority_high_requests"] == classes["high"].requests
    assert row["priority_low_requests"] == ""
    assert row["scraped_queue_peak"] >= 1
