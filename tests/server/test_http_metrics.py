"""The Prometheus rendering of a backend's own statistics."""

from __future__ import annotations

from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from yieldgate.server._http_metrics import MetricsExporter
from yieldgate.server.governor import Governor


def samples(stats: dict[str, Any]) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    exporter = MetricsExporter(Governor().stats, {}, lambda: stats)
    text = exporter.render().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def test_backend_statistics_become_gauges() -> None:
    got = samples(
        {
            "device": "cpu",
            "running": 3,
            "decode_step_ms": 2.5,
            "prefill_ms_per_token": None,
            "serving": {"ttft_ms": {"p50": 10.0, "p95": 20.0, "p99": None}, "goodput": 0.75},
            "prefill_workers": [{"pid": 11, "alive": True}, {"pid": 12, "alive": False}],
            "router": {"decisions": {"long": 4}, "by_worker": {"0": 2}},
        }
    )
    assert got[("yieldgate_backend_running", ())] == 3
    assert got[("yieldgate_backend_decode_step_ms", ())] == 2.5
    assert got[("yieldgate_backend_serving_goodput", ())] == 0.75
    assert got[("yieldgate_backend_serving_ttft_ms", (("quantile", "0.5"),))] == 10.0
    assert got[("yieldgate_backend_serving_ttft_ms", (("quantile", "0.95"),))] == 20.0
    assert ("yieldgate_backend_serving_ttft_ms", (("quantile", "0.99"),)) not in got
    assert got[("yieldgate_backend_prefill_workers_alive", (("index", "1"),))] == 0
    assert got[("yieldgate_backend_router_decisions_long", ())] == 4
    assert got[("yieldgate_backend_router_by_worker_0", ())] == 2
    assert not any("device" in name for name, _ in got)
    assert got[("yieldgate_inflight", ())] == 0


def test_without_a_backend_only_the_governor_is_exported() -> None:
    text = MetricsExporter(Governor().stats, {}).render().decode()
    assert "yieldgate_inflight" in text
    assert "yieldgate_backend" not in text
