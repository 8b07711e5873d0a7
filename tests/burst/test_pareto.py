"""The Pareto front ranks successful work: goodput over the rates' window against the burst's
p99, a failure never answered; a strategy that fails most of its requests is not on it."""

from __future__ import annotations

import math

import pytest

from tests.burst.test_rates import counters, result
from yieldgate.burst import BurstConfig, BurstReport, Strategy, run_burst
from yieldgate.burst._html import html_report
from yieldgate.burst._pareto import candidates, front_latency_s, pareto_front


def _report(*results: object) -> BurstReport:
    return BurstReport(
        config={"requests": 40, "profile": {"spec": "all-at-once"}, "target": "tcp://"},
        machine={},
        created="2026-01-01T00:00:00+00:00",
        results=tuple(results),  # type: ignore[arg-type]
    )


def _front_labels(report: BurstReport) -> list[str]:
    found, front = candidates(report)
    return [found[i].label for i in front]


def test_a_strategy_failing_90_percent_is_off_the_front_and_below_the_gates_goodput() -> None:
    # 40 requests at once, 4 slots of 100 ms (bound 1 s). The Gate serves all 40 in 1.05 s;
    # naive gets 4 through in 0.1 s and 36 refused at once: faster, and failing 90%.
    server = counters(executed=40, exec_ms=100.0)
    gate = result(
        [(0.0, 0.1 * (1 + i // 4) + 0.05, True) for i in range(40)], server=server, name="yieldgate"
    )
    naive = result(
        [(0.0, 0.1, True)] * 4 + [(0.0, 0.01, False)] * 36,
        server=counters(executed=4, exec_ms=100.0),
        name="naive",
    )
    assert naive.success_rate == pytest.approx(0.1)
    # Over its makespan naive's successes would have out-rated the Gate's: 40/s against 38/s.
    assert naive.succeeded / naive.makespan_s > gate.goodput_per_s
    assert naive.goodput_per_s == pytest.approx(4.0)  # over the bound, 1 s
    assert naive.goodput_per_s < gate.goodput_per_s
    # naive's successes were faster than any of the Gate's, but 90% of its callers were
    # never answered, so its p99 is infinite and the Gate dominates it.
    assert naive.latency_s.p99 is not None
    assert gate.latency_s.p99 is not None
    assert naive.latency_s.p99 < gate.latency_s.p99
    assert front_latency_s(naive) == math.inf
    assert _front_labels(_report(gate, naive)) == ["yieldgate"]
    text = html_report(_report(gate, naive))
    assert "On the front: yieldgate: " in text
    assert "Kept off the front so: naive (10.0% success)." in text


def test_the_burst_p99_is_infinite_once_more_than_1_percent_failed() -> None:
    ok = [(0.0, 0.5, True)]
    assert front_latency_s(result(ok * 99 + [(0.0, 0.1, False)])) == pytest.approx(0.5)
    assert front_latency_s(result(ok * 98 + [(0.0, 0.1, False)] * 2)) == math.inf
    # Nearest rank: of 40 requests the 99th percentile is the 40th, so one failure is enough.
    assert front_latency_s(result(ok * 39 + [(0.0, 0.1, False)])) == math.inf


def test_when_every_run_failed_more_than_1_percent_the_most_goodput_wins() -> None:
    # The same 40 arrivals over 2 s; a serves 30 in a second each, b 10 in 0.2 s each.
    a = result([(0.05 * i, 0.05 * i + 1.0, i % 4 != 0) for i in range(40)], name="a")
    b = result([(0.05 * i, 0.05 * i + 0.2, i % 4 == 0) for i in range(40)], name="b")
    assert (a.window_s, b.window_s) == (pytest.approx(2.95), pytest.approx(2.15))
    assert a.goodput_per_s > b.goodput_per_s
    assert a.latency_s.p99 is not None
    assert b.latency_s.p99 is not None
    assert b.latency_s.p99 < a.latency_s.p99
    assert _front_labels(_report(a, b)) == ["a"]


def test_runs_that_served_the_burst_trade_latency_for_goodput() -> None:
    fast = result([(0.0, 0.5, True)] * 20, name="fast")  # 40/s, p99 0.5 s
    busy = result([(0.0, 0.5, True)] * 10 + [(0.0, 0.25, True)] * 30, name="busy")  # 80/s
    slow = result([(0.0, 2.0, True)] * 20, name="slow")  # beaten on both
    assert _front_labels(_report(slow, busy, fast)) == ["busy"]
    assert pareto_front([(0.5, 40.0), (0.5, 80.0), (2.0, 10.0)]) == [1]
    assert pareto_front([(0.5, 40.0), (1.0, 80.0), (math.inf, 90.0)]) == [0, 1, 2]
    assert pareto_front([(math.inf, 90.0), (math.inf, 30.0)]) == [0]


def test_a_run_with_no_good_request_is_not_ranked() -> None:
    failed = result([(0.0, 0.1, False)] * 5, name="failed")
    found, front = candidates(_report(failed))
    assert (found, front) == ([], [])


@pytest.mark.e2e
def test_a_real_burst_keeps_the_fast_failing_naive_off_the_front() -> None:
    report = run_burst(
        BurstConfig(
            target="tcp://",
            serve_args=("--max-inflight", "4", "--exec-ms", "100"),
            requests=40,
            strategies=(Strategy(name="yieldgate"), Strategy(name="naive")),
            scenario="pareto",
        )
    )
    gate, naive = report.results
    assert gate.success_rate == 1.0
    # naive meets 4 free slots and refusals for the rest: most of it fails, and fast.
    assert naive.success_rate <= 0.5
    assert naive.makespan_s < naive.window_s == naive.lower_bound_s
    assert naive.goodput_per_s < gate.goodput_per_s
    assert _front_labels(report) == ["yieldgate"]
