"""Figures from raw records: percentiles, the makespan bound, streaming metrics, goodput."""

from __future__ import annotations

import pytest

from yieldgate.burst import Goal, Percentiles, Slo, makespan_lower_bound
from yieldgate.burst._results import summarise
from yieldgate.burst._targets import Request


def test_percentiles_are_nearest_rank() -> None:
    p = Percentiles.of([float(v) for v in range(1, 101)])
    assert (p.count, p.p50, p.p95, p.p99, p.mean) == (100, 50.0, 95.0, 99.0, 50.5)
    assert Percentiles.of([]).p50 is None
    assert Percentiles.of([0.5], 1000).p99 == 500.0


def test_lower_bound_without_cold_start_is_work_over_slots() -> None:
    assert makespan_lower_bound(400, 0.05, 8) == pytest.approx(2.5)
    # A single request still takes one execution.
    assert makespan_lower_bound(1, 0.5, 8) == pytest.approx(0.5)
    # The last arrival bounds it too.
    assert makespan_lower_bound(10, 0.1, 8, last_arrival_s=3.0) == pytest.approx(3.1)


def test_lower_bound_counts_the_cold_start_and_the_ramp() -> None:
    # 2 slots: the first opens at 1 s, the second at 1 + 4 = 5 s; 10 s of work.
    # By t: (t - 1) + (t - 5) = 10  ->  t = 8.
    assert makespan_lower_bound(20, 0.5, 2, cold_start_s=1, ramp_s=4) == pytest.approx(8.0)
    # The seed's cold start: more than the warm bound, less than cold + ramp + warm bound.
    bound = makespan_lower_bound(100, 0.5, 8, cold_start_s=2, ramp_s=5)
    assert 2 + 100 * 0.5 / 8 < bound < 2 + 5 + 100 * 0.5 / 8


def _request(index: int, end: float, chunks: list[float], ok: bool = True) -> Request:
    r = Request(index=index, arrival_s=0.0, end_s=end, ok=ok, error=None if ok else "Boom")
    r.chunk_s.extend(chunks)
    return r


def test_summarise_streaming_and_goodput() -> None:
    requests = [
        _request(0, 1.0, [0.2, 0.3, 0.4, 1.0]),  # TTFT 200 ms, TPOT 266.7 ms
        _request(1, 0.5, [0.1, 0.12, 0.14, 0.5]),  # TTFT 100 ms, TPOT 133.3 ms
        _request(2, 0.2, [], ok=False),
    ]
    result = summarise(
        strategy="naive",
        label="naive",
        requests=requests,
        attempts=4,
        yields=1,
        slo=Slo(ttft_ms=150, tpot_ms=200),
        stream=True,
        server=None,
        timeline=[],
    )
    assert result.succeeded == 2
    assert result.failed == 1
    assert result.errors_by_kind == {"Boom": 1}
    assert result.makespan_s == 1.0
    assert result.attempts_per_request == pytest.approx(4 / 3)
    assert result.lower_bound_s is None
    assert result.makespan_ratio is None
    assert result.streaming is not None
    assert result.streaming["ttft_ms"].p50 == pytest.approx(100)
    assert result.streaming["ttft_ms"].p99 == pytest.approx(200)
    assert result.streaming["tpot_ms"].p99 == pytest.approx(800 / 3)
    assert result.streaming["itl_ms"].count == 6
    # Only request 1 meets both objectives.
    assert result.goodput_good == 1
    assert result.goodput_ratio == pytest.approx(1 / 3)
    assert result.goodput_per_s == pytest.approx(1.0)
    document = result.as_dict()
    assert document["goodput"]["slo"] == {"ttft_ms": 150, "tpot_ms": 200, "e2e_ms": None}


def test_without_slo_every_success_is_good() -> None:
    result = summarise(
        strategy="yieldgate",
        label="yieldgate",
        requests=[_request(0, 2.0, []), _request(1, 1.0, [], ok=False)],
        attempts=2,
        yields=0,
        slo=Slo(),
        stream=False,
        server=None,
        timeline=[],
    )
    assert result.streaming is None
    assert result.goodput_good == 1
    assert result.latency_s.p50 == 2.0


def test_goal_verdicts() -> None:
    result = summarise(
        strategy="yieldgate",
        label="yieldgate",
        requests=[_request(0, 1.0, []), _request(1, 1.0, [])],
        attempts=4,
        yields=2,
        slo=Slo(),
        stream=False,
        server=None,
        timeline=[],
    )
    met, text = Goal(max_attempts_per_request=2.0).verdict(result)
    assert met
    assert "2.00 attempts/request (goal <= 2)" in text
    met, _ = Goal(max_attempts_per_request=1.5).verdict(result)
    assert not met
    met, text = Goal(max_makespan_ratio=1.25).verdict(result)
    assert not met  # no bound without server counters: not met, not guessed
    assert "n/a" in text


def test_slo_validation() -> None:
    with pytest.raises(ValueError, match="ttft_ms"):
        Slo(ttft_ms=0)
