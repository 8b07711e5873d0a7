"""An optional cap on attempt starts per second, with a ramp for cold backends.

A token bucket holding at most ``burst`` starts, refilled at the rate in
force: on the ramp, or at its top. The bucket is plain arithmetic on the time
it is given (``try_take(now)``), so it works under any event loop and is
tested without one. It has no queue of its own: the windows it paces admit
their waiters in their own order (priority, then arrival) and take a start
with the slot, in one step (``Window.pacer``), so that nobody holds a window
slot while waiting for a start, nor a start while waiting for a slot (starts
saved up behind a full window would be spent together when it frees). The
head of a window's queue sleeps until ``next_at`` says a start is free,
re-reading the rate when it wakes: when the ramp moves (or restarts) the new
rate applies to the very next start.

The ramp begins with the first start, not when the Gate is built: a ramp
should start when traffic does. A start taken for an attempt that is never
sent goes back (``refund``).

aiolimiter, which the design card first named for this, is asyncio-only (the
Gate also runs under trio and in threads) and fixes its rate at construction
(a ramp had to swap limiters): a few lines of bucket serve every driver.

A cold start signal from the upstream (a ``cold_start`` yield, HF's
``estimated_time``) restarts the ramp: a backend that has just loaded is
eased into, not hit with the full rate.
"""

from __future__ import annotations

from collections.abc import Callable

from yieldgate.gate._policy import RatePolicy

__all__ = ["RateCap", "RatePolicy"]

# The least sleep before looking again: a float rounding error must not spin.
_MIN_SLEEP_S = 1e-6


class RateCap:
    """Paces attempt starts: ``try_take`` (never waits), ``next_at`` when one is free."""

    def __init__(self, policy: RatePolicy, clock: Callable[[], float]) -> None:
        self.policy = policy
        self._clock = clock
        # Set by the first start: the clock may need a running event loop.
        self._ramp_start: float | None = None
        self._tokens = float(policy.burst)
        self._updated = 0.0

    @property
    def started(self) -> bool:
        """Whether any start was taken yet (the ramp begins then)."""
        return self._ramp_start is not None

    @property
    def updated(self) -> float:
        """When the bucket was last looked at (a time for ``rate_now`` without a clock)."""
        return self._updated

    def _begin(self, now: float) -> None:
        if self._ramp_start is None:
            self._ramp_start = now
            self._updated = now

    def rate_now(self, now: float | None = None) -> float:
        """The cap in force at ``now`` (default: the clock's now), on the ramp or at its top."""
        p = self.policy
        if p.ramp_s <= 0:
            return p.per_s
        start = p.ramp_from_per_s if p.ramp_from_per_s is not None else min(1.0, p.per_s)
        if self._ramp_start is None:
            return start
        when = self._clock() if now is None else now
        progress = min(1.0, max(0.0, when - self._ramp_start) / p.ramp_s)
        return start + (p.per_s - start) * progress

    def restart_ramp(self, now: float | None = None) -> None:
        """Begin the ramp again (the upstream said it was cold); the next start obeys."""
        if self.policy.ramp_s <= 0:
            return
        when = self._clock() if now is None else now
        self._begin(when)
        self._refill(when)
        self._ramp_start = when
        # A backend that has just loaded gets no burst saved up before it went cold.
        self._tokens = min(self._tokens, 1.0)

    def _refill(self, now: float) -> None:
        elapsed = now - self._updated
        if elapsed <= 0:
            return
        # The mean of the rates at both ends: exact along the (linear) ramp.
        rate = (self.rate_now(self._updated) + self.rate_now(now)) / 2
        self._tokens = min(float(self.policy.burst), self._tokens + elapsed * rate)
        self._updated = now

    def try_take(self, now: float) -> bool:
        """Take a start if one is free at ``now``; never waits."""
        self._begin(now)
        self._refill(now)
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return True
        return False

    def next_at(self, now: float) -> float:
        """When a start will be free (``now`` if one is)."""
        self._begin(now)
        self._refill(now)
        if self._tokens >= 1.0:
            return now
        wait = (1.0 - self._tokens) / self.rate_now(now)
        return now + max(wait, _MIN_SLEEP_S)

    def refund(self, now: float) -> None:
        """Give back a start taken for an attempt that was never sent."""
        self._refill(now)
        self._tokens = min(float(self.policy.burst), self._tokens + 1.0)
