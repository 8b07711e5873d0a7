"""``GET /metrics``: the Governor's counters in Prometheus text format.

A private ``CollectorRegistry`` (never the process-global one) with custom
collectors that read the counters when scraped, so nothing is counted twice
and nothing has to be kept in step.

Every front's connection counters are exported as they appear in ``/stats``
(``yieldgate_<name>``; a ``*_total`` is a counter, the rest are gauges).

A backend with a ``stats()`` method (the harness) is exported too, as gauges
named ``yieldgate_backend_<path>``: numbers as they are, booleans as 0 / 1,
percentile records (``p50``/``p95``/``p99``) as one gauge with a
``quantile`` label, lists of records with an ``index`` label. Text is left
out.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from yieldgate.protocol import ErrorCode, YieldReason
from yieldgate.server._governor_records import QUEUE_WAIT_BUCKETS_MS, GovernorStats

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
        yield from _queue_metrics(s)
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


def _queue_metrics(s: GovernorStats) -> Iterator[Metric]:
    """The queue (``serve --queue``): its length, its bound, and the time spent in it."""
    yield GaugeMetricFamily("yieldgate_queued", "Submits waiting for a slot now.", s.queued)
    yield GaugeMetricFamily(
        "yieldgate_queued_peak", "The most submits that waited at once.", s.queued_peak
    )
    bound = math.inf if s.max_queued is None else s.max_queued
    yield GaugeMetricFamily(
        "yieldgate_max_queued", "How many may wait (0: none, yield at once).", bound
    )
    yield CounterMetricFamily(
        "yieldgate_queue_entered", "Submits that waited for a slot.", s.queued_total
    )
    yield CounterMetricFamily(
        "yieldgate_queue_abandoned",
        "Queued submits that left before a slot (deadline, client gone).",
        s.queue_abandoned_total,
    )
    cumulative = 0
    buckets = []
    for bound_ms, count in zip(
        (*QUEUE_WAIT_BUCKETS_MS, math.inf), s.queue_wait_buckets, strict=True
    ):
        cumulative += count
        buckets.append(("+Inf" if bound_ms == math.inf else f"{bound_ms / 1000:g}", cumulative))
    yield HistogramMetricFamily(
        "yieldgate_queue_wait_seconds",
        "Time submits spent queued, counted when they leave the queue.",
        buckets=buckets,
        sum_value=s.queue_wait_ms_total / 1000,
    )


class _ConnectionCollector(Collector):
    def __init__(self, counters: Callable[[], Mapping[str, int]]) -> None:
        self._counters = counters

    def collect(self) -> Iterator[Metric]:
        for name, value in sorted(self._counters().items()):
            if name == "http_requests_total":
                continue  # yieldgate_http_requests, by route and status, says it all
            if name.startswith("quota_"):
                yield CounterMetricFamily(f"yieldgate_{name[:-6]}", "Provider quota.", value)
            elif name.endswith("_total"):
                yield CounterMetricFamily(f"yieldgate_{name[:-6]}", "Connections.", value)
            else:
                yield GaugeMetricFamily(f"yieldgate_{name}", "Connections.", value)


_QUANTILES = {"p50": "0.5", "p95": "0.95", "p99": "0.99"}
_UNSAFE = re.compile(r"[^a-zA-Z0-9_]")


class _BackendCollector(Collector):
    def __init__(self, stats: Callable[[], Mapping[str, Any]]) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        yield from _flatten("yieldgate_backend", self._stats())


def _flatten(name: str, value: Any) -> Iterator[Metric]:
    if isinstance(value, bool):
        yield GaugeMetricFamily(name, "Backend statistic.", int(value))
    elif isinstance(value, int | float):
        yield GaugeMetricFamily(name, "Backend statistic.", value)
    elif isinstance(value, Mapping):
        if value and set(value) <= set(_QUANTILES) | {"count", "total"}:
            family = GaugeMetricFamily(name, "Backend latency percentile.", labels=["quantile"])
            for key, quantile in _QUANTILES.items():
                if isinstance(value.get(key), int | float):
                    family.add_metric([quantile], value[key])
            yield family
            return
        for key, item in value.items():
            yield from _flatten(f"{name}_{_UNSAFE.sub('_', str(key))}", item)
    elif isinstance(value, list) and value and all(isinstance(i, Mapping) for i in value):
        keys = sorted({k for item in value for k, v in item.items() if _number(v)})
        for key in keys:
            family = GaugeMetricFamily(
                f"{name}_{_UNSAFE.sub('_', key)}", "Backend statistic.", labels=["index"]
            )
            for index, item in enumerate(value):
                if _number(item.get(key)):
                    family.add_metric(
                        [str(index)], int(item[key]) if isinstance(item[key], bool) else item[key]
                    )
            yield family


def _number(value: Any) -> bool:
    return isinstance(value, int | float)


class MetricsExporter:
    """Renders the counters of one Governor and HTTP front (and its backend) on demand."""

    def __init__(
        self,
        stats: Callable[[], GovernorStats],
        requests: Mapping[tuple[str, str], int],
        backend_stats: Callable[[], Mapping[str, Any]] | None = None,
        connections: Callable[[], Mapping[str, int]] | None = None,
    ) -> None:
        self._registry = CollectorRegistry(auto_describe=False)
        self._registry.register(_GovernorCollector(stats, requests))
        if connections is not None:
            self._registry.register(_ConnectionCollector(connections))
        if backend_stats is not None:
            self._registry.register(_BackendCollector(backend_stats))

    def render(self) -> bytes:
        return generate_latest(self._registry)
