"""``GET /metrics``: the Governor's counters in Prometheus text format.

A private ``CollectorRegistry`` (never the process-global one) with one
custom collector that reads the counters when scraped, so nothing is counted
twice and nothing has to be kept in step.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from yieldgate.protocol import ErrorCode, YieldReason
from yieldgate.server.governor import GovernorStats

__all__ = ["CONTENT_TYPE", "MetricsExporter"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class _GovernorCollector(Collector):
    def __init__(
        self,
        stats: Callable[[], GovernorStats],
        requests: Mapping[tuple[str, str], int],
    ) -> None:
        self._stats = stats
        self._requests = requests

    def collect(self) -> Iterator[Metric]:
        s = self._stats()
        yield GaugeMetricFamily("yieldgate_inflight", "Admitted work executing now.", s.inflight)
        yield GaugeMetricFamily(
            "yieldgate_max_inflight", "The configured cap on executing work.", s.max_inflight
        )
        yield GaugeMetricFamily(
            "yieldgate_capacity", "Slots usable now (lower while capacity ramps).", s.capacity
        )
        yield GaugeMetricFamily("yieldgate_cold", "1 while the backend warms up.", int(s.cold))
        for name, value, doc in (
            ("admitted", s.admitted_total, "Submits admitted into a slot."),
            ("executed", s.executed_total, "Admitted submits whose execution finished."),
            ("failed", s.failed_total, "Admitted submits whose execution failed."),
            ("cancelled", s.cancelled_total, "Admitted submits cancelled (disconnect, deadline)."),
        ):
            yield CounterMetricFamily(f"yieldgate_{name}", doc, value)
        yielded = CounterMetricFamily(
            "yieldgate_yielded", "Submits answered yield, by reason.", labels=["reason"]
        )
        by_reason = {reason.value: 0 for reason in YieldReason}
        by_reason.update(s.yielded_by_reason)
        for reason, count in sorted(by_reason.items()):
            yielded.add_metric([reason], count)
        yield yielded
        errors = CounterMetricFamily(
            "yieldgate_errors", "Error replies sent by any front, by code.", labels=["code"]
        )
        by_code = {code.value: 0 for code in ErrorCode}
        by_code.update(s.errors_by_code)
        for code, count in sorted(by_code.items()):
            errors.add_metric([code], count)
        yield errors
        requests = CounterMetricFamily(
            "yieldgate_http_requests",
            "HTTP requests answered, by route and status.",
            labels=["route", "status"],
        )
        for (route, status), count in sorted(self._requests.items()):
            requests.add_metric([route, status], count)
        yield requests


class MetricsExporter:
    """Renders the counters of one Governor and HTTP front on demand."""

    def __init__(
        self,
        stats: Callable[[], GovernorStats],
        requests: Mapping[tuple[str, str], int],
    ) -> None:
        self._registry = CollectorRegistry(auto_describe=False)
        self._registry.register(_GovernorCollector(stats, requests))

    def render(self) -> bytes:
        return generate_latest(self._registry)
