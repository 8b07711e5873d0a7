"""The retry budget: retries as a bounded share of recent requests.

After Finagle and Envoy (and the SRE book's client-side throttling): over a
sliding window of ``window_s`` seconds, retries may number at most
``ratio`` times the requests made, plus a small floor of ``min_per_s`` per
second so a quiet client can still retry at all. When a backend fails
everything, each request makes at most ``1 + ratio`` attempts on average
instead of ``max_attempts``: retries cannot multiply an outage.

Only retries after failures and overloads withdraw from it. Waiting out a
``yield`` does not: the server asked for that retry, and said when.
"""

from __future__ import annotations

from collections.abc import Callable

from yieldgate.gate._policy import RetryBudgetPolicy

__all__ = ["RetryBudget", "RetryBudgetPolicy"]

_BUCKETS = 10


class RetryBudget:
    """Counts requests and retries in time buckets; answers whether a retry may go."""

    def __init__(self, policy: RetryBudgetPolicy, clock: Callable[[], float]) -> None:
        self.policy = policy
        self._clock = clock
        self._width = policy.window_s / _BUCKETS
        self._requests = [0] * _BUCKETS
        self._retries = [0] * _BUCKETS
        # Set on first use: the clock may need a running event loop.
        self._epoch: int | None = None
        # The current bucket, and when it ends (``deposit`` adds to it until then).
        self._index = 0
        self._edge = float("-inf")

    def _roll(self, now: float | None = None) -> int:
        """Clear buckets that fell out of the window; return the current bucket index."""
        epoch = int((self._clock() if now is None else now) // self._width)
        if self._epoch is None:
            self._epoch = epoch
        gap = epoch - self._epoch
        if gap > 0:
            for i in range(1, min(gap, _BUCKETS) + 1):
                index = (self._epoch + i) % _BUCKETS
                self._requests[index] = 0
                self._retries[index] = 0
            self._epoch = epoch
        self._index = index = epoch % _BUCKETS
        self._edge = (epoch + 1) * self._width
        return index

    def deposit(self, now: float | None = None) -> None:
        """Count one request (a call's first attempt); ``now`` saves a clock read."""
        if now is not None and now < self._edge:
            self._requests[self._index] += 1  # still the current bucket: nothing to roll
            return
        self._requests[self._roll(now)] += 1

    def allowance(self, now: float | None = None, *, roll: bool = True) -> float:
        """Retries still allowed in the current window (as of the last use when not ``roll``:
        for a snapshot taken without a clock)."""
        if roll:
            self._roll(now)
        allowed = (
            self.policy.ratio * sum(self._requests) + self.policy.min_per_s * self.policy.window_s
        )
        return allowed - sum(self._retries)

    def try_withdraw(self) -> bool:
        """Take one retry from the budget, if any is left."""
        return self.withdraw() is not None

    def withdraw(self) -> int | None:
        """Take one retry from the budget; a receipt for ``refund``, or ``None`` if none is left."""
        now = self._clock()
        if self.allowance(now) < 1.0:
            return None
        self._retries[self._roll(now)] += 1
        assert self._epoch is not None
        return self._epoch

    def refund(self, receipt: int) -> None:
        """Give back a retry that was never sent (the call stopped before it could be).

        A receipt from a bucket that has since left the window refunds nothing:
        that retry no longer counts anyway.
        """
        epoch = self._epoch
        if epoch is None or not 0 <= epoch - receipt < _BUCKETS:
            return
        index = receipt % _BUCKETS
        if self._retries[index] > 0:
            self._retries[index] -= 1
