"""An optional cap on attempt starts per second, with a ramp for cold backends.

aiolimiter paces the starts; it fixes its leak rate at construction, so a ramp
swaps in a new limiter whenever the target rate has moved by a tenth, primed
with what the old one still held (from the time of the last start), so a swap
never grants a burst the old limiter would not have. (With ``burst > 1`` the
carried level is a lower bound: a swap may allow up to ``burst - 1`` extra.) A cold
start signal from the upstream (a ``cold_start`` yield, HF's
``estimated_time``) restarts the ramp: a backend that has just loaded is
eased into, not hit with the full rate.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import anyio
from aiolimiter import AsyncLimiter

from yieldgate._locks import acquire

__all__ = ["RateCap", "RatePolicy"]

_RESTEP = 0.1


@dataclass(frozen=True, slots=True, kw_only=True)
class RatePolicy:
    """At most ``per_s`` attempt starts per second, bursting to ``burst``.

    With ``ramp_s > 0`` the cap starts at ``ramp_from_per_s`` and rises
    linearly to ``per_s`` over ``ramp_s`` seconds (slow start for a rate).
    """

    per_s: float
    burst: int = 1
    ramp_from_per_s: float | None = None
    ramp_s: float = 0.0

    def __post_init__(self) -> None:
        if not (self.per_s > 0 and math.isfinite(self.per_s)):
            raise ValueError("rate per_s must be a positive number")
        if self.burst < 1:
            raise ValueError("rate burst must be >= 1")
        if not (self.ramp_s >= 0 and math.isfinite(self.ramp_s)):
            raise ValueError("rate ramp_s must be a finite number >= 0")
        if self.ramp_from_per_s is not None and not 0 < self.ramp_from_per_s <= self.per_s:
            raise ValueError("rate ramp_from_per_s must be in (0, per_s]")


class RateCap:
    """Paces attempt starts; ``acquire`` waits for the next allowed start.

    Callers queue, in arrival order, behind one lock, and only the caller at
    the head waits on the limiter: so when the ramp moves (or restarts) the
    new rate applies to the very next start, and an old limiter never keeps
    admitting beside a new one. Build it inside a running event loop.
    """

    def __init__(self, policy: RatePolicy, clock: Callable[[], float]) -> None:
        self.policy = policy
        self._clock = clock
        self._ramp_start = clock()
        self._rate = self.rate_now()
        self._limiter = self._make(self._rate)
        self._last_start: float | None = None
        self._lock = anyio.Lock()

    def _make(self, rate: float) -> AsyncLimiter:
        burst = self.policy.burst
        return AsyncLimiter(max_rate=burst, time_period=burst / rate)

    def rate_now(self) -> float:
        """The cap in force now, on the ramp or at its top."""
        p = self.policy
        if p.ramp_s <= 0:
            return p.per_s
        start = p.ramp_from_per_s if p.ramp_from_per_s is not None else min(1.0, p.per_s)
        progress = min(1.0, (self._clock() - self._ramp_start) / p.ramp_s)
        return start + (p.per_s - start) * progress

    def restart_ramp(self) -> None:
        """Begin the ramp again (the upstream said it was cold); the next start obeys."""
        if self.policy.ramp_s > 0:
            self._ramp_start = self._clock()

    async def _retarget(self) -> None:
        rate = self.rate_now()
        if abs(rate - self._rate) < _RESTEP * self._rate and not (
            rate == self.policy.per_s and self._rate != rate
        ):
            return
        self._rate = rate
        self._limiter = self._make(rate)
        if self._last_start is not None:
            # Carry the bucket over: what has not leaked since the last start.
            leaked = (self._clock() - self._last_start) * rate
            held = max(0.0, min(float(self.policy.burst), 1.0 - leaked))
            await self._limiter.acquire(held)  # an empty bucket: never waits

    async def try_acquire(self) -> bool:
        """Take a start if one is free now and nobody is queued; never waits for one."""
        if self._lock.locked() or not self._limiter.has_capacity():
            return False
        await self.acquire()
        return True

    async def acquire(self) -> None:
        await acquire(self._lock)
        try:
            await self._retarget()
            await self._limiter.acquire()
            self._last_start = self._clock()
        finally:
            self._lock.release()
