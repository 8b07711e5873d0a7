"""Upstreams: what a Gate keeps for each place an attempt can be sent.

A Gate over one upstream has one of these; a Gate over a set (two replicas, a
large and a small model, an OpenAI-style and a HuggingFace endpoint) has one
per member, each with its own window, breaker, hint hold and latency record,
and picks one per attempt by an estimated latency cost.
"""

from __future__ import annotations

import random
from collections import deque
from typing import Any

from yieldgate._exceptions import CircuitOpenError
from yieldgate._stats import percentile
from yieldgate.gate._breaker import Breaker
from yieldgate.gate._quota import Quota
from yieldgate.gate._statistics import UpstreamStatistics
from yieldgate.gate._window import Window
from yieldgate.protocol import Priority

__all__ = ["LatencyTracker", "UpstreamStatistics"]

# Moving averages of "this attempt yielded" and "this attempt failed", per upstream.
_ALPHA = 0.2


class LatencyTracker:
    """Recent successful latencies: their quantiles, and a moving average.

    Only attempts that answered are measured; a hedged attempt cancelled as a
    loser is not, so the quantile leans towards the faster attempts.
    """

    __slots__ = ("_recent", "ewma_s")

    def __init__(self, size: int = 200) -> None:
        self._recent: deque[float] = deque(maxlen=size)
        self.ewma_s: float | None = None

    def __len__(self) -> int:
        return len(self._recent)

    def record(self, seconds: float) -> None:
        self._recent.append(seconds)
        self.ewma_s = seconds if self.ewma_s is None else 0.8 * self.ewma_s + 0.2 * seconds

    def record_at_least(self, seconds: float) -> None:
        """An attempt cancelled after ``seconds`` without answering (a hedge's loser):
        its latency was at least that. It moves the average up, never down, and
        stays out of the quantiles, which hold only answers."""
        if self.ewma_s is None or seconds > self.ewma_s:
            self.ewma_s = seconds if self.ewma_s is None else 0.8 * self.ewma_s + 0.2 * seconds

    def quantile(self, q: float) -> float | None:
        """The ``q`` quantile (``0 < q < 1``) of the recent latencies, or None if empty:
        the nearest rank, as every percentile yieldgate reports."""
        return percentile(self._recent, q * 100, default=None)


class Upstream:
    """One upstream's window (with its hint holds), breaker and recent behaviour."""

    __slots__ = (
        "attempts",
        "breaker",
        "failure_rate",
        "failures",
        "latency",
        "name",
        "quota",
        "successes",
        "target",
        "window",
        "yield_rate",
        "yields",
    )

    def __init__(
        self,
        name: str,
        target: Any,
        window: Window,
        breaker: Breaker,
        latency: LatencyTracker,
        quota: Quota,
    ) -> None:
        self.name = name
        self.quota = quota
        self.target = target
        self.window = window
        self.breaker = breaker
        self.latency = latency
        self.attempts = 0
        self.successes = 0
        self.yields = 0
        self.failures = 0
        self.yield_rate = 0.0
        self.failure_rate = 0.0

    def takes(self, priority: Priority, now: float) -> bool:
        """Could an attempt at ``priority`` start here now: no hint hold to wait
        out and a breaker that lets it through."""
        if self.window.held_until(priority, now):
            return False
        try:
            self.breaker.check()
        except CircuitOpenError:
            return False
        return True

    def note(self, *, ok: bool, congestion: bool, failure: bool) -> None:
        self.attempts += 1
        self.successes += ok
        self.yields += congestion
        self.failures += failure
        self.yield_rate += _ALPHA * (congestion - self.yield_rate)
        self.failure_rate += _ALPHA * (failure - self.failure_rate)

    def cost(self, priority: Priority, now: float, default_latency_s: float) -> float:
        """Estimated seconds until an attempt sent here now would answer.

        The time left on a hint hold, plus the recent latency scaled by how far
        the attempt would queue behind the window, plus a penalty for recent
        yields and failures (each worth that many latencies).
        """
        window = self.window
        latency = self.latency.ewma_s
        if latency is None:
            latency = default_latency_s
        limit = max(1, window.limit)
        queued = max(0, window.inflight + window.waiting + 1 - limit)
        cost = latency * (1.0 + queued / limit + self.yield_rate + 2.0 * self.failure_rate)
        until = self.window.held_until(priority, now)
        return cost + (until - now) if until else cost

    def statistics(self, now: float | None) -> UpstreamStatistics:
        # The longest hold is the lowest priority's; without a clock (no event
        # loop running) no hold is reported.
        until = 0.0 if now is None else self.window.held_until(Priority.LOW, now)
        return UpstreamStatistics(
            name=self.name,
            window=self.window.statistics(),
            breaker=str(self.breaker.state),
            attempts=self.attempts,
            successes=self.successes,
            yields=self.yields,
            failures=self.failures,
            latency_ewma_s=self.latency.ewma_s,
            hold_s=0.0 if now is None or not until else until - now,
        )


def choose(
    upstreams: list[Upstream],
    priority: Priority,
    now: float,
    rng: random.Random,
    avoid: set[Upstream] | frozenset[Upstream] = frozenset(),
) -> list[Upstream]:
    """Upstreams in the order an attempt should try them: cheapest first.

    Upstreams in ``avoid`` (those this call's other attempts are using, or the
    one that just failed it) go last, so a set of two is raced and failed over
    across both. Ties are broken at random, so equal replicas share the load.
    """
    known = [u.latency.ewma_s for u in upstreams if u.latency.ewma_s is not None]
    # An upstream not yet measured is assumed as fast as the fastest one known:
    # it gets traffic, and so a measurement.
    default = min(known) if known else 0.0
    return sorted(
        upstreams,
        key=lambda u: (u in avoid, u.cost(priority, now, default), rng.random()),
    )
