from __future__ import annotations

import json

import pytest

from yieldgate.harness.metrics import LatencyWindow, ServingMetrics
from yieldgate.harness.qos import SloConfig
from yieldgate.protocol import Priority

# -- LatencyWindow --------------------------------------------------------------


def test_empty_window_has_no_percentiles() -> None:
    window = LatencyWindow()
    assert window.percentiles() == {"p50": None, "p95": None, "p99": None}
    assert window.count == 0


def test_nearest_rank_percentiles_of_one_to_hundred() -> None:
    window = LatencyWindow()
    window.extend([float(v) for v in range(100, 0, -1)])  # order does not matter
    assert window.percentiles() == {"p50": 50.0, "p95": 95.0, "p99": 99.0}
    assert window.count == 100


def test_nearest_rank_on_small_windows() -> None:
    window = LatencyWindow()
    window.extend([10.0, 20.0, 30.0, 40.0])
    # ranks: ceil(0.5*4)=2, ceil(0.95*4)=4, ceil(0.99*4)=4
    assert window.percentiles() == {"p50": 20.0, "p95": 40.0, "p99": 40.0}
    single = LatencyWindow()
    single.add(7.0)
    assert single.percentiles() == {"p50": 7.0, "p95": 7.0, "p99": 7.0}


def test_a_whole_rank_is_taken_as_it_is() -> None:
    # 95% of 20 is rank 19 exactly: the 19th value, not the 20th.
    window = LatencyWindow()
    window.extend([float(v) for v in range(1, 21)])
    assert window.percentiles()["p95"] == 19.0


def test_window_keeps_only_the_most_recent() -> None:
    window = LatencyWindow(capacity=3)
    window.extend([1000.0, 1.0, 2.0, 3.0])
    assert window.count == 3
    assert window.total == 4
    assert window.percentiles()["p99"] == 3.0


def test_window_validates() -> None:
    with pytest.raises(ValueError, match="capacity"):
        LatencyWindow(capacity=0)
    with pytest.raises(ValueError, match="latency"):
        LatencyWindow().add(float("nan"))
    with pytest.raises(ValueError, match="latency"):
        LatencyWindow().add(-1.0)


# -- ServingMetrics ---------------------------------------------------------------


def test_empty_snapshot() -> None:
    snapshot = ServingMetrics(SloConfig()).snapshot()
    assert snapshot["requests"] == 0
    assert snapshot["goodput"] is None
    assert snapshot["offload_ratio"] is None
    assert snapshot["ttft_ms"] == {"p50": None, "p95": None, "p99": None}
    json.dumps(snapshot)


def test_goodput_counts_requests_meeting_both_objectives() -> None:
    metrics = ServingMetrics(SloConfig(ttft_ms_normal=1000.0, tpot_ms=50.0))
    metrics.record_request(ttft_ms=900.0, tpot_ms=40.0, itl_ms=[40.0, 40.0])  # good
    metrics.record_request(ttft_ms=1000.0, tpot_ms=50.0, itl_ms=[50.0])  # good: on the line
    metrics.record_request(ttft_ms=1001.0, tpot_ms=10.0, itl_ms=[10.0])  # TTFT missed
    metrics.record_request(ttft_ms=100.0, tpot_ms=51.0, itl_ms=[51.0])  # TPOT missed
    metrics.record_request(ttft_ms=200.0, tpot_ms=None, itl_ms=[])  # one token: good
    snapshot = metrics.snapshot()
    assert snapshot["requests"] == 5
    assert snapshot["good_requests"] == 3
    assert snapshot["goodput"] == 0.6
    # TTFT sorted: 100, 200, 900, 1000, 1001 -> ranks 3, 5, 5
    assert snapshot["ttft_ms"] == {"p50": 900.0, "p95": 1001.0, "p99": 1001.0}
    # TPOT sorted: 10, 40, 50, 51 -> ranks 2, 4, 4
    assert snapshot["tpot_ms"] == {"p50": 40.0, "p95": 51.0, "p99": 51.0}
    # ITL: 10, 40, 40, 50, 51 -> ranks 3, 5, 5
    assert snapshot["itl_ms"] == {"p50": 40.0, "p95": 51.0, "p99": 51.0}


def test_goodput_uses_the_priority_objective() -> None:
    metrics = ServingMetrics(SloConfig())  # high: none, normal: 2000, low: 500
    metrics.record_request(ttft_ms=10_000.0, tpot_ms=1.0, itl_ms=[], priority=Priority.HIGH)
    metrics.record_request(ttft_ms=600.0, tpot_ms=1.0, itl_ms=[], priority=Priority.LOW)
    metrics.record_request(ttft_ms=600.0, tpot_ms=1.0, itl_ms=[])
    assert metrics.snapshot()["goodput"] == pytest.approx(2 / 3)


def test_no_ttft_objective_counts_only_tpot() -> None:
    metrics = ServingMetrics(SloConfig(ttft_ms_normal=None, tpot_ms=20.0))
    metrics.record_request(ttft_ms=1e6, tpot_ms=20.0, itl_ms=[])
    metrics.record_request(ttft_ms=1.0, tpot_ms=21.0, itl_ms=[])
    assert metrics.snapshot()["goodput"] == 0.5


def test_routes_and_transfers() -> None:
    metrics = ServingMetrics(SloConfig())
    for remote in (True, False, False, True, True):
        metrics.record_route(remote)
    metrics.record_transfer(nbytes=1000, ms=2.0)
    metrics.record_transfer(nbytes=3000, ms=6.0)
    metrics.record_transfer(nbytes=0, ms=1.0)
    snapshot = metrics.snapshot()
    assert snapshot["offload_ratio"] == 0.6
    assert (snapshot["remote_routes"], snapshot["local_routes"]) == (3, 2)
    assert snapshot["transfers"] == 3
    assert snapshot["transfer_bytes_total"] == 4000
    assert snapshot["transfer_ms"] == {"p50": 2.0, "p95": 6.0, "p99": 6.0}
    assert json.loads(json.dumps(snapshot)) == snapshot


def test_metrics_validate_inputs() -> None:
    metrics = ServingMetrics(SloConfig())
    with pytest.raises(ValueError, match="ttft_ms"):
        metrics.record_request(ttft_ms=float("inf"), tpot_ms=None, itl_ms=[])
    with pytest.raises(ValueError, match="itl_ms"):
        metrics.record_request(ttft_ms=1.0, tpot_ms=None, itl_ms=[1.0, -2.0])
    with pytest.raises(ValueError, match="nbytes"):
        metrics.record_transfer(nbytes=-1, ms=1.0)
    # Nothing was half-recorded by the refused calls.
    assert metrics.snapshot()["requests"] == 0
    assert metrics.itl_ms.count == 0
