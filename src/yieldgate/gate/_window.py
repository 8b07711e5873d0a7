"""The Window: an adaptive concurrency limit with priority admission.

Congestion control in the manner of TCP, applied to requests in flight:

- **Slow start.** The limit starts small (``initial``) and grows by one per
  success, doubling per round trip, until the first congestion signal or
  ``max``. A cold backend sees a ramp, not a wall.
- **Additive increase.** Past the slow-start threshold, each success adds
  ``increase / limit``: about ``increase`` per window of successes.
- **Multiplicative decrease.** A yield or an overload multiplies the limit by
  ``decrease``, at most once per window: signals from permits granted before
  the last decrease belong to the same congestion event (a burst of 50 yields
  from one overload shrinks the window once, not 50 times).
- **Growth needs demand.** Only permits that were part of a full window (the
  limit bound at or after their grant: it was full, or callers waited) make
  it grow, so a quiet spell cannot inflate it, while a busy round counts in
  full.

Waiting callers are admitted by priority, then in arrival order.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Final

import anyio

from yieldgate.protocol import Priority

__all__ = ["Permit", "Signal", "Window", "WindowPolicy", "WindowStatistics"]

_PRIORITY_ORDER: Final = (Priority.HIGH, Priority.NORMAL, Priority.LOW)


class Signal(StrEnum):
    """How an attempt ended, as far as the window cares."""

    SUCCESS = "success"
    CONGESTION = "congestion"
    FAILURE = "failure"
    CANCELLED = "cancelled"


@dataclass(frozen=True, slots=True, kw_only=True)
class WindowPolicy:
    """Bounds and gains of the adaptive window.

    ``initial`` is where slow start begins, ``max`` a hard ceiling that nothing
    passes, ``min`` the floor a decrease stops at. ``WindowPolicy.fixed(n)``
    is a plain bulkhead of ``n`` slots that never adapts.
    """

    initial: int = 2
    min: int = 1
    max: int = 64
    increase: float = 1.0
    decrease: float = 0.7

    def __post_init__(self) -> None:
        if self.min < 1:
            raise ValueError(f"window min must be >= 1, got {self.min}")
        if self.max < self.min:
            raise ValueError(f"window max ({self.max}) must be >= min ({self.min})")
        if not self.min <= self.initial <= self.max:
            raise ValueError(f"window initial ({self.initial}) must be within [min, max]")
        if not (self.increase >= 0 and math.isfinite(self.increase)):
            raise ValueError("window increase must be a finite number >= 0")
        if not 0.0 < self.decrease <= 1.0:
            raise ValueError("window decrease must be in (0, 1]")

    @classmethod
    def fixed(cls, size: int) -> WindowPolicy:
        """A non-adaptive limit of ``size`` (a bulkhead)."""
        return cls(initial=size, min=size, max=size, increase=0.0, decrease=1.0)


@dataclass(frozen=True, slots=True, kw_only=True)
class WindowStatistics:
    """A snapshot of the window."""

    limit: int
    inflight: int
    waiting: int
    slow_start: bool
    increases: int
    decreases: int


class Permit:
    """One slot of the window, held by one attempt."""

    __slots__ = ("_released", "priority", "seq")

    def __init__(self, seq: int, priority: Priority) -> None:
        self.seq = seq
        self.priority = priority
        self._released = False


class _Waiter:
    __slots__ = ("event", "permit", "priority")

    def __init__(self, priority: Priority) -> None:
        self.priority = priority
        self.event = anyio.Event()
        self.permit: Permit | None = None


class Window:
    """Admits attempts while ``inflight < limit``; the limit adapts to congestion."""

    def __init__(
        self,
        policy: WindowPolicy | None = None,
        *,
        on_change: Callable[[int, int], None] | None = None,
    ) -> None:
        self.policy = policy or WindowPolicy()
        self._cwnd = float(self.policy.initial)
        self._ssthresh = float(self.policy.max)
        self._limit = self.policy.initial
        self._inflight = 0
        self._seq = 0
        self._recovery_seq = 0
        self._full_seq = 0
        self._queues: dict[Priority, deque[_Waiter]] = {p: deque() for p in _PRIORITY_ORDER}
        self._waiting = 0
        self._increases = 0
        self._decreases = 0
        self._on_change = on_change

    @property
    def limit(self) -> int:
        return self._limit

    def _set_cwnd(self, cwnd: float) -> None:
        self._cwnd = cwnd
        self._limit = max(self.policy.min, min(self.policy.max, int(cwnd)))

    @property
    def inflight(self) -> int:
        return self._inflight

    @property
    def waiting(self) -> int:
        return self._waiting

    def statistics(self) -> WindowStatistics:
        return WindowStatistics(
            limit=self.limit,
            inflight=self._inflight,
            waiting=self._waiting,
            slow_start=self._cwnd < self._ssthresh,
            increases=self._increases,
            decreases=self._decreases,
        )

    # -- acquire ------------------------------------------------------------

    def _grant(self, priority: Priority) -> Permit:
        self._inflight += 1
        self._seq += 1
        if self._inflight >= self._limit:
            self._full_seq = self._seq
        return Permit(self._seq, priority)

    def try_acquire(self, priority: Priority = Priority.NORMAL) -> Permit | None:
        """A permit now if one is free and nobody of equal or higher priority waits."""
        if self._inflight < self._limit and (
            not self._waiting or not self._has_waiters_at_or_above(priority)
        ):
            return self._grant(priority)
        return None

    def _has_waiters_at_or_above(self, priority: Priority) -> bool:
        for p in _PRIORITY_ORDER:
            if self._queues[p]:
                return True
            if p is priority:
                return False
        return False  # pragma: no cover - priority is always in the order

    async def acquire(self, priority: Priority = Priority.NORMAL) -> Permit:
        """Wait for a permit. Cancellation while waiting takes nothing."""
        permit = self.try_acquire(priority)
        if permit is not None:
            # Granted without awaiting: nothing can cancel us between the grant
            # and the caller holding the permit (and no event-loop trip is paid).
            return permit
        waiter = _Waiter(priority)
        self._queues[priority].append(waiter)
        self._waiting += 1
        self._full_seq = self._seq  # demand exceeds the limit
        try:
            await waiter.event.wait()
        except BaseException:
            if waiter.permit is not None:
                # Granted just as we were cancelled: hand it on, not lost.
                self.release(waiter.permit, Signal.CANCELLED)
            else:
                self._queues[priority].remove(waiter)
                self._waiting -= 1
            raise
        assert waiter.permit is not None
        return waiter.permit

    def _wake(self) -> None:
        while self._inflight < self._limit and self._waiting:
            for p in _PRIORITY_ORDER:
                if self._queues[p]:
                    waiter = self._queues[p].popleft()
                    break
            else:  # pragma: no cover - _waiting counts queued waiters
                return
            self._waiting -= 1
            waiter.permit = self._grant(waiter.priority)
            waiter.event.set()

    # -- release ------------------------------------------------------------

    def release(self, permit: Permit, signal: Signal) -> None:
        """Return a permit, telling the window how its attempt ended. Idempotent."""
        if permit._released:
            return
        permit._released = True
        self._inflight -= 1
        before = self._limit
        if signal is Signal.SUCCESS and permit.seq <= self._full_seq:
            self._grow()
        elif signal is Signal.CONGESTION and permit.seq > self._recovery_seq:
            self._shrink()
        if self._limit != before and self._on_change is not None:
            self._on_change(before, self._limit)
        if self._waiting:
            self._wake()

    def _grow(self) -> None:
        if self._cwnd >= self.policy.max:
            return
        if self._cwnd < self._ssthresh:
            cwnd = self._cwnd + 1.0
        else:
            cwnd = self._cwnd + self.policy.increase / self._cwnd
        self._set_cwnd(min(cwnd, float(self.policy.max)))
        self._increases += 1

    def _shrink(self) -> None:
        self._set_cwnd(max(float(self.policy.min), self._cwnd * self.policy.decrease))
        self._ssthresh = max(float(self.policy.min), self._cwnd)
        # Signals from permits granted up to now belong to this same event.
        self._recovery_seq = self._seq
        self._decreases += 1
