"""An optional cap on attempt starts per second, with a ramp for cold backends.

A token bucket holding at most ``burst`` starts, refilled at the rate in
force: on the ramp, or at its top. The bucket is plain arithmetic on the time
it is given (``try_take(now)``), so it works under any event loop and is
tested without one. Callers that must wait queue in arrival order
(``join``); only the one at the head sleeps, until ``due`` says a start is
free, re-reading the rate when it wakes: when the ramp moves (or restarts)
the new rate applies to the very next start. The waiting itself is the
driver's (asyncio and trio, or threads).

aiolimiter, which the design card first named for this, is asyncio-only (the
Gate also runs under trio and in threads) and fixes its rate at construction
(a ramp had to swap limiters): a few lines of bucket serve every driver.

A cold start signal from the upstream (a ``cold_start`` yield, HF's
``estimated_time``) restarts the ramp: a backend that has just loaded is
eased into, not hit with the full rate.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from yieldgate.gate._policy import RatePolicy

__all__ = ["RateCap", "RatePolicy"]

# The least sleep before looking again: a float rounding error must not spin.
_MIN_SLEEP_S = 1e-6


class RateWaiter:
    """A caller queued for a start; ``wake`` (the driver's) says it may look again."""

    __slots__ = ("wake",)

    def __init__(self, wake: Callable[[], None]) -> None:
        self.wake = wake


class RateCap:
    """Paces attempt starts: ``try_take`` (never waits), or ``join`` the queue and
    ``take`` at the head when ``due``."""

    def __init__(self, policy: RatePolicy, clock: Callable[[], float]) -> None:
        self.policy = policy
        self._clock = clock
        now = clock()
        self._ramp_start = now
        self._tokens = float(policy.burst)
        self._updated = now
        self._queue: deque[RateWaiter] = deque()

    @property
    def updated(self) -> float:
        """When the bucket was last looked at (a time for ``rate_now`` without a clock)."""
        return self._updated

    def rate_now(self, now: float | None = None) -> float:
        """The cap in force at ``now`` (default: the clock's now), on the ramp or at its top."""
        p = self.policy
        if p.ramp_s <= 0:
            return p.per_s
        start = p.ramp_from_per_s if p.ramp_from_per_s is not None else min(1.0, p.per_s)
        when = self._clock() if now is None else now
        progress = min(1.0, max(0.0, when - self._ramp_start) / p.ramp_s)
        return start + (p.per_s - start) * progress

    def restart_ramp(self, now: float | None = None) -> None:
        """Begin the ramp again (the upstream said it was cold); the next start obeys."""
        if self.policy.ramp_s <= 0:
            return
        when = self._clock() if now is None else now
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

    def _take(self, now: float) -> bool:
        self._refill(now)
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return True
        return False

    def try_take(self, now: float) -> bool:
        """Take a start if one is free at ``now`` and nobody is queued; never waits."""
        if self._queue:
            return False
        return self._take(now)

    def join(self, wake: Callable[[], None]) -> RateWaiter:
        """Queue for a start, in arrival order."""
        waiter = RateWaiter(wake)
        self._queue.append(waiter)
        return waiter

    def at_head(self, waiter: RateWaiter) -> bool:
        """Whether ``waiter`` is next: only the head sleeps towards its start."""
        return bool(self._queue) and self._queue[0] is waiter

    def take_queued(self, waiter: RateWaiter, now: float) -> float | None:
        """For the waiter at the head: take its start (``None``: taken, it has left
        the queue), or say when to look again."""
        if self._take(now):
            self.leave(waiter)
            return None
        wait = (1.0 - self._tokens) / self.rate_now(now)
        return now + max(wait, _MIN_SLEEP_S)

    def leave(self, waiter: RateWaiter) -> None:
        """Leave the queue (started, or gave up); the next at the head is woken."""
        head = bool(self._queue) and self._queue[0] is waiter
        try:
            self._queue.remove(waiter)
        except ValueError:
            return
        if head and self._queue:
            self._queue[0].wake()
