"""What a Gate reports: frozen snapshots of it, its window and its upstreams.

``Gate.statistics()`` builds a ``GateStatistics`` from the running totals in
``Counters`` and the state of each upstream. Every snapshot is a frozen record,
safe to keep, log or compare; a later call returns a new one.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Counters", "GateStatistics", "UpstreamStatistics", "WindowStatistics"]


@dataclass(frozen=True, slots=True, kw_only=True)
class WindowStatistics:
    """A snapshot of the window: how many attempts may be in flight, and how many are."""

    limit: int
    """How many attempts may be in flight now (the adaptive limit)."""
    inflight: int
    """Attempts in flight now, holding a slot."""
    waiting: int
    """Attempts queued for a slot."""
    slow_start: bool
    """Whether the window is still in slow start (growing until the first congestion)."""
    increases: int
    """How many times the limit has grown, since the Gate was made."""
    decreases: int
    """How many times the limit has shrunk (on a yield, an overload or a failure)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class UpstreamStatistics:
    """A snapshot of one upstream of a Gate: its window, its breaker and what it answered."""

    name: str
    """The upstream's name, as the Gate was given it."""
    window: WindowStatistics
    """This upstream's own window."""
    breaker: str
    """This upstream's breaker: ``"closed"``, ``"open"`` or ``"half-open"``."""
    attempts: int
    """Attempts sent to this upstream."""
    successes: int
    """Attempts that it answered with a value."""
    yields: int
    """Attempts that ended in congestion: a yield or an overload."""
    failures: int
    """Attempts that failed (retryable or fatal)."""
    latency_ewma_s: float | None
    """A moving average of its successful attempts' latency, in seconds (``None``: none yet)."""
    hold_s: float
    """Seconds left of the hint hold on it (0: none), after a yield or a 429 with a hint."""


@dataclass(frozen=True, slots=True, kw_only=True)
class GateStatistics:
    """A snapshot of one Gate (``Gate.statistics()``): its window, breaker, budget and totals.

    The counters are totals since the Gate was made. With several upstreams,
    ``window`` sums theirs and ``upstreams`` has each one's own snapshot.
    """

    name: str
    """The Gate's name (``Gate(name=...)``), as its telemetry reports it."""
    window: WindowStatistics
    """The window; with several upstreams, their windows summed."""
    breaker: str
    """``"closed"``, ``"open"`` or ``"half-open"``; ``"mixed"`` when upstreams' differ."""
    breaker_failures: int
    """Consecutive failures the breakers have counted towards opening."""
    retry_allowance: float
    """Retries the retry budget would allow now."""
    calls: int
    """Calls started."""
    calls_ok: int
    """Calls that returned a value."""
    calls_failed: int
    """Calls that raised."""
    attempts: int
    """Attempts started, first attempts, retries and hedges alike."""
    yields: int
    """Attempts answered with a yield (or what a dialect reads as one: a 429)."""
    overloads: int
    """Attempts answered with an overload (a 503 or a reset under load)."""
    failures: int
    """Attempts that failed, retryable or fatal."""
    retries: int
    """Waits started before another attempt."""
    waited_s: float
    """Seconds spent sleeping between attempts and queueing behind hints, all calls together."""
    rejected_open: int
    """Calls refused at once because the breaker was open (``CircuitOpenError``)."""
    rate_per_s: float | None
    """The rate cap now, in attempts per second (``None``: no cap, or no attempt yet)."""
    hedges: int = 0
    """Hedged attempts started (``HedgePolicy``)."""
    hedge_wins: int = 0
    """Calls whose value came from a hedge rather than the first attempt."""
    hedges_denied: int = 0
    """Hedges skipped because the retry budget was spent."""
    losers_cancelled: int = 0
    """Attempts cancelled because another attempt of their call answered first."""
    upstreams: tuple[UpstreamStatistics, ...] = ()
    """One snapshot per named upstream, in the Gate's order (empty for a Gate over one)."""


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
