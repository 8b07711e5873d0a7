"""Serving metrics: latency percentiles, goodput, offload ratio, KV transfers.

Percentiles are over a bounded window of the most recent values
(``LatencyWindow``) and use the nearest-rank method (``yieldgate._stats``):
the p-th percentile of n sorted values is the value at rank
``ceil(p / 100 * n)`` (1-based), always one of the measured values, never an
interpolation.

Counters (requests, goodput, routes, transfers) are over everything
recorded, not the window. Goodput is the share of recorded requests that
met both objectives: TTFT at most the objective of the request's priority
(``SloConfig.ttft_for``; ``normal`` unless told, and a priority without an
objective always meets it), and TPOT at most ``SloConfig.tpot_ms`` (a
request with no TPOT, one output token, meets it).

Every value ``snapshot()`` returns is JSON-serialisable; ratios and
percentiles are ``None`` until there is something to compute them from.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from typing import Any

from yieldgate._stats import percentile
from yieldgate.harness.qos import SloConfig
from yieldgate.protocol import Priority

__all__ = ["LatencyWindow", "ServingMetrics"]

_PERCENTILES = (("p50", 50), ("p95", 95), ("p99", 99))


def _check_ms(name: str, value: float) -> None:
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")


class LatencyWindow:
    """The most recent ``capacity`` latencies (ms) and their nearest-rank percentiles."""

    def __init__(self, capacity: int = 2048) -> None:
        if type(capacity) is not int or capacity < 1:
            raise ValueError("capacity must be an integer >= 1")
        self.capacity = capacity
        self._values: deque[float] = deque(maxlen=capacity)
        self.total = 0

    @property
    def count(self) -> int:
        """Values in the window now (at most ``capacity``); ``total`` counts every one added."""
        return len(self._values)

    def add(self, value: float) -> None:
        _check_ms("latency", value)
        self._values.append(float(value))
        self.total += 1

    def extend(self, values: Sequence[float]) -> None:
        for value in values:
            self.add(value)

    def percentiles(self) -> dict[str, float | None]:
        """``p50``, ``p95`` and ``p99`` of the window, ``None`` each when it is empty."""
        return {key: percentile(self._values, p, default=None) for key, p in _PERCENTILES}


class ServingMetrics:
    """What a disaggregated server reports: see the module docstring for the definitions."""

    def __init__(self, slo: SloConfig, *, window: int = 2048) -> None:
        self.slo = slo
        self.ttft_ms = LatencyWindow(window)
        self.tpot_ms = LatencyWindow(window)
        self.itl_ms = LatencyWindow(window)
        self.transfer_ms = LatencyWindow(window)
        self.requests = 0
        self.good_requests = 0
        self.remote_routes = 0
        self.local_routes = 0
        self.transfers = 0
        self.transfer_bytes_total = 0

    def record_request(
        self,
        *,
        ttft_ms: float,
        tpot_ms: float | None,
        itl_ms: Sequence[float],
        priority: Priority = Priority.NORMAL,
    ) -> None:
        """A finished request: its TTFT, mean TPOT (``None`` for one token) and gaps."""
        _check_ms("ttft_ms", ttft_ms)
        if tpot_ms is not None:
            _check_ms("tpot_ms", tpot_ms)
        for gap in itl_ms:
            _check_ms("itl_ms", gap)
        self.requests += 1
        self.ttft_ms.add(ttft_ms)
        if tpot_ms is not None:
            self.tpot_ms.add(tpot_ms)
        self.itl_ms.extend(itl_ms)
        objective = self.slo.ttft_for(priority)
        ttft_ok = objective is None or ttft_ms <= objective
        tpot_ok = tpot_ms is None or tpot_ms <= self.slo.tpot_ms
        if ttft_ok and tpot_ok:
            self.good_requests += 1

    def record_transfer(self, *, nbytes: int, ms: float) -> None:
        """One KV transfer from a prefill worker: ``nbytes`` moved in ``ms``."""
        if type(nbytes) is not int or nbytes < 0:
            raise ValueError(f"nbytes must be an integer >= 0, got {nbytes!r}")
        _check_ms("ms", ms)
        self.transfers += 1
        self.transfer_bytes_total += nbytes
        self.transfer_ms.add(ms)

    def record_route(self, remote: bool) -> None:
        """One routing decision: remote (offloaded) or local prefill."""
        if remote:
            self.remote_routes += 1
        else:
            self.local_routes += 1

    def snapshot(self) -> dict[str, Any]:
        """Every metric, as JSON-serialisable values."""
        routes = self.remote_routes + self.local_routes
        return {
            "requests": self.requests,
            "good_requests": self.good_requests,
            "goodput": self.good_requests / self.requests if self.requests else None,
            "ttft_ms": self.ttft_ms.percentiles(),
            "tpot_ms": self.tpot_ms.percentiles(),
            "itl_ms": self.itl_ms.percentiles(),
            "remote_routes": self.remote_routes,
            "local_routes": self.local_routes,
            "offload_ratio": self.remote_routes / routes if routes else None,
            "transfers": self.transfers,
            "transfer_bytes_total": self.transfer_bytes_total,
            "transfer_ms": self.transfer_ms.percentiles(),
        }
