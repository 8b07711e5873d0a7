"""The Gate's shared state: what every call of one Gate, from either driver, sees.

One ``GateCore`` per Gate holds the upstreams (each with its window, breaker
and latency record), the retry budget, the rate cap, the counters, the clock
and the random source, and the one lock that guards them all. The lock is a
``threading.RLock``: sync callers in threads and async callers on an event
loop (or several loops) share one Gate, and nothing ever waits while holding
it, so an event loop is never blocked on it for longer than a few field
updates take.
"""

from __future__ import annotations

import itertools
import random
import threading
import time
from collections.abc import Callable
from typing import Any, Final

from yieldgate.gate._breaker import Breaker, BreakerState
from yieldgate.gate._budget import RetryBudget
from yieldgate.gate._outcome import Classifier
from yieldgate.gate._policy import Counters, GatePolicy, GateStatistics
from yieldgate.gate._quota import Quota
from yieldgate.gate._ratecap import RateCap
from yieldgate.gate._shared import Shared
from yieldgate.gate._telemetry import BreakerChange, Instrumentation, WindowChange
from yieldgate.gate._upstream import LatencyTracker, Upstream
from yieldgate.gate._window import Window, WindowStatistics

__all__ = ["GateCore", "default_clock", "unique_name"]

_SERIAL: Final = itertools.count(1)


# The Gate's clock unless told otherwise: monotonic, shared by every thread and loop.
default_clock: Final[Callable[[], float]] = time.monotonic


def unique_name() -> str:
    """A name for a Gate built without one: each its own telemetry label."""
    return f"gate-{next(_SERIAL)}"


class GateCore:
    """The state one Gate's calls share (see the module docstring)."""

    def __init__(
        self,
        policy: GatePolicy,
        name: str,
        classify: Classifier,
        instr: Instrumentation,
        rng: random.Random,
        clock: Callable[[], float],
    ) -> None:
        self.policy = policy
        self.name = name
        self.classify = classify
        self.instr = instr
        self.rng = rng
        self.clock = clock
        self.lock = threading.RLock()
        self.budget = RetryBudget(policy.budget, clock)
        self.rate: RateCap | None = None
        self.counters = Counters()
        self.closed = False
        self.since_checkpoint = 0
        hedge = policy.hedge
        self.latency_size = 200 if hedge is None else hedge.samples
        # Every answer of the Gate; the one upstream of a Gate without a set shares it.
        self.latency = LatencyTracker(self.latency_size)
        self.upstreams: list[Upstream] = []
        # True once upstreams are named: attempts then report where they go.
        self.named = False
        # The fleet this Gate shares its state with (``Gate(shared=...)``).
        self.shared: Shared | None = None

    def make_upstream(
        self, name: str, target: Any, *, label: str, latency: LatencyTracker | None = None
    ) -> Upstream:
        instr = self.instr

        def window_changed(old: int, new: int) -> None:
            instr.on_window_change(WindowChange(gate=label, old=old, new=new))

        def breaker_changed(old: BreakerState, new: BreakerState) -> None:
            instr.on_breaker_change(BreakerChange(gate=label, old=str(old), new=str(new)))

        window = Window(
            self.policy.window, on_change=window_changed, clock=self.clock, rng=self.rng
        )
        breaker = Breaker(self.policy.breaker, self.clock, name=label, on_change=breaker_changed)
        if latency is None:
            latency = LatencyTracker(self.latency_size)
        q = self.policy.quota
        quota = Quota(
            requests_per_minute=q.requests_per_minute,
            tokens_per_minute=q.tokens_per_minute,
            learn=q.learn,
        )
        if self.shared is not None:
            quota.shared = self.shared.available
        return Upstream(name, target, window, breaker, latency, quota)

    def rate_cap(self) -> RateCap | None:
        # Built on first use: a ramp should start when traffic does, not when
        # the Gate was constructed.
        if self.rate is None and self.policy.rate is not None:
            self.rate = RateCap(self.policy.rate, self.clock)
        return self.rate

    def statistics(self) -> GateStatistics:
        try:
            now: float | None = self.clock()
        except RuntimeError:  # a loop's clock, read outside the loop: as of the last use
            now = None
        with self.lock:
            return self._statistics(now)

    def _statistics(self, now: float | None) -> GateStatistics:
        c = self.counters
        ups = self.upstreams
        if len(ups) == 1:
            window = ups[0].window.statistics()
            breaker = str(ups[0].breaker.state)
        else:
            each = [u.window.statistics() for u in ups]
            window = WindowStatistics(
                limit=sum(w.limit for w in each),
                inflight=sum(w.inflight for w in each),
                waiting=sum(w.waiting for w in each),
                slow_start=any(w.slow_start for w in each),
                increases=sum(w.increases for w in each),
                decreases=sum(w.decreases for w in each),
            )
            states = {str(u.breaker.state) for u in ups}
            breaker = states.pop() if len(states) == 1 else "mixed"
        rate = self.rate
        rate_per_s = None
        if rate is not None:
            rate_per_s = rate.rate_now(rate.updated if now is None else now)
        return GateStatistics(
            name=self.name,
            window=window,
            breaker=breaker,
            breaker_failures=sum(u.breaker.failures for u in ups),
            retry_allowance=self.budget.allowance(now, roll=now is not None),
            calls=c.calls,
            calls_ok=c.calls_ok,
            calls_failed=c.calls_failed,
            attempts=c.attempts,
            yields=c.yields,
            overloads=c.overloads,
            failures=c.failures,
            retries=c.retries,
            waited_s=c.waited_s,
            rejected_open=c.rejected_open,
            rate_per_s=rate_per_s,
            hedges=c.hedges,
            hedge_wins=c.hedge_wins,
            hedges_denied=c.hedges_denied,
            losers_cancelled=c.losers_cancelled,
            upstreams=tuple(u.statistics(now) for u in ups) if self.named else (),
        )
