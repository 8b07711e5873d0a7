"""What a Gate is told to do (``GatePolicy``) and what it reports (``GateStatistics``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

from yieldgate.gate._breaker import BreakerPolicy, Verdict
from yieldgate.gate._budget import RetryBudgetPolicy
from yieldgate.gate._hedge import HedgePolicy
from yieldgate.gate._outcome import OutcomeKind
from yieldgate.gate._ratecap import RatePolicy
from yieldgate.gate._retry import RetryPolicy, TimeoutPolicy
from yieldgate.gate._upstream import UpstreamStatistics
from yieldgate.gate._window import Signal, WindowPolicy, WindowStatistics

__all__ = ["SIGNALS", "USE_POLICY", "Counters", "GatePolicy", "GateStatistics", "UsePolicy"]


class UsePolicy:
    """The type of ``USE_POLICY``."""

    def __repr__(self) -> str:
        return "USE_POLICY"


USE_POLICY: Final = UsePolicy()
"""``timeout=USE_POLICY`` (the default): the policy's total time; ``None``: no limit."""

# What each kind of outcome tells the window and the breaker.
SIGNALS: Final = {
    OutcomeKind.OK: (Signal.SUCCESS, Verdict.SUCCESS),
    OutcomeKind.YIELD: (Signal.REFUSED, Verdict.NEUTRAL),
    OutcomeKind.OVERLOADED: (Signal.CONGESTION, Verdict.NEUTRAL),
    OutcomeKind.RETRYABLE: (Signal.FAILURE, Verdict.FAILURE),
    OutcomeKind.FATAL: (Signal.FAILURE, Verdict.NEUTRAL),
}


@dataclass(frozen=True, slots=True, kw_only=True)
class GatePolicy:
    """Everything a Gate does, in one frozen record. The defaults are safe:
    slow start from 8 up to 64 in flight, 4 attempts, a 20% retry budget, a
    breaker after 5 consecutive failures, 60 s per attempt and 300 s in all,
    no rate cap and no hedging. With several upstreams, ``window`` and
    ``breaker`` apply to each of them.
    """

    window: WindowPolicy = field(default_factory=WindowPolicy)
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    budget: RetryBudgetPolicy = field(default_factory=RetryBudgetPolicy)
    breaker: BreakerPolicy = field(default_factory=BreakerPolicy)
    timeout: TimeoutPolicy = field(default_factory=TimeoutPolicy)
    rate: RatePolicy | None = None
    hedge: HedgePolicy | None = None

    @classmethod
    def cold_start(cls, *, max_concurrency: int = 16, per_s: float | None = None) -> GatePolicy:
        """For a backend that may be loading: one in flight at first, a patient retry
        policy, and (given ``per_s``) a rate that ramps up over 30 s."""
        rate = None
        if per_s is not None:
            rate = RatePolicy(per_s=per_s, ramp_from_per_s=min(1.0, per_s), ramp_s=30.0)
        return cls(
            window=WindowPolicy(initial=1, max=max_concurrency),
            retry=RetryPolicy(max_attempts=5, max_yields=200),
            timeout=TimeoutPolicy(attempt_s=120.0, total_s=600.0),
            rate=rate,
        )

    @classmethod
    def interactive(cls) -> GatePolicy:
        """A person is waiting: tight timeouts, few retries, fail fast."""
        return cls(
            retry=RetryPolicy(max_attempts=3, max_yields=16, max_backoff_s=2.0),
            timeout=TimeoutPolicy(attempt_s=30.0, total_s=45.0),
        )

    @classmethod
    def batch(cls) -> GatePolicy:
        """Throughput over latency: ride out long overloads, patiently."""
        return cls(
            retry=RetryPolicy(max_attempts=6, max_yields=1000, max_backoff_s=30.0),
            timeout=TimeoutPolicy(attempt_s=300.0, total_s=3600.0),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class GateStatistics:
    """A snapshot of one Gate."""

    name: str
    window: WindowStatistics
    breaker: str
    breaker_failures: int
    retry_allowance: float
    calls: int
    calls_ok: int
    calls_failed: int
    attempts: int
    yields: int
    overloads: int
    failures: int
    retries: int
    waited_s: float
    rejected_open: int
    rate_per_s: float | None
    hedges: int = 0
    hedge_wins: int = 0
    hedges_denied: int = 0
    losers_cancelled: int = 0
    upstreams: tuple[UpstreamStatistics, ...] = ()


@dataclass
class Counters:
    """The Gate's running totals (read by ``statistics``)."""

    calls: int = 0
    calls_ok: int = 0
    calls_failed: int = 0
    attempts: int = 0
    yields: int = 0
    overloads: int = 0
    failures: int = 0
    retries: int = 0
    waited_s: float = 0.0
    rejected_open: int = 0
    hedges: int = 0
    hedge_wins: int = 0
    hedges_denied: int = 0
    losers_cancelled: int = 0
