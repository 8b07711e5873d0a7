"""What a quota meters: an attempt's ``Cost``, a provider's ``QuotaReading``, a ``Bucket``.

The plain records and the bucket arithmetic that ``_quota`` paces by, kept
apart from the pacing itself (claims, the queue, learning from readings):
dialects read and build these without anything else of the Gate's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

__all__ = ["NOTHING", "ONE_REQUEST", "Bucket", "Cost", "QuotaReading", "as_cost"]


class Cost(NamedTuple):
    """What one attempt spends of a quota: one request and its tokens.

    ``tokens`` is the total a provider meters (prompt plus the output it may
    produce), ``input_tokens`` and ``output_tokens`` its parts, for providers
    that meter them apart (Anthropic).
    """

    requests: int = 1
    tokens: int = 0
    input_tokens: int = 0
    output_tokens: int = 0

    @classmethod
    def of(cls, input_tokens: int, output_tokens: int) -> Cost:
        """One request of ``input_tokens`` and at most ``output_tokens``."""
        return cls(1, input_tokens + output_tokens, input_tokens, output_tokens)

    def amount(self, resource: str) -> int:
        value: int = getattr(self, resource)
        return value


def as_cost(cost: Cost | int) -> Cost:
    """A ``cost=`` argument as a ``Cost``: an int is a number of tokens, in one request."""
    if isinstance(cost, Cost):
        if any(type(v) is not int or v < 0 for v in cost):
            raise ValueError(f"a cost's fields must be integers >= 0, got {cost!r}")
        return cost
    if type(cost) is not int or cost < 0:
        raise ValueError(f"cost must be a Cost or a number of tokens >= 0, got {cost!r}")
    return Cost(1, cost)


ONE_REQUEST = Cost()
"""The cost of an attempt nothing more is known of."""
NOTHING = Cost(0)
"""What an attempt refused before any work used."""


@dataclass(frozen=True, slots=True)
class QuotaReading:
    """One bucket as a provider's headers describe it.

    ``key`` names the bucket (``openai:tokens``), ``resource`` what it meters
    (a ``Cost`` field). ``reset_s`` is the time until it is full again,
    ``window_s`` the window its limit is for, when a header says (IETF's ``w``).
    """

    key: str
    resource: str
    limit: float
    remaining: float
    reset_s: float | None = None
    window_s: float | None = None


class Bucket:
    """A continuously refilling bucket: ``limit`` at most, ``rate`` per second."""

    __slots__ = ("applied", "key", "learnt", "level", "limit", "rate", "resource", "updated")

    def __init__(
        self, key: str, resource: str, limit: float, rate: float, now: float, *, learnt: bool
    ) -> None:
        self.key = key
        self.resource = resource
        self.limit = limit
        self.rate = rate
        self.level = limit
        self.updated = now
        self.learnt = learnt  # from headers (the provider's count), else the caller's own
        self.applied = 0  # the send number of the newest reading applied

    def level_at(self, now: float, cap: float = 1.0, pace: float = 1.0) -> float:
        """The level at ``now``, holding ``cap`` of the limit and refilling at ``pace``
        of the rate (a member's shares of a fleet's quota)."""
        if now <= self.updated:
            return self.level
        return min(self.limit * cap, self.level + (now - self.updated) * self.rate * pace)

    def settle(self, now: float, cap: float = 1.0, pace: float = 1.0) -> None:
        self.level = self.level_at(now, cap, pace)
        self.updated = max(self.updated, now)

    def take(self, amount: float, now: float, cap: float = 1.0, pace: float = 1.0) -> None:
        self.settle(now, cap, pace)
        self.level -= amount

    def give(self, amount: float, now: float, cap: float = 1.0, pace: float = 1.0) -> None:
        self.settle(now, cap, pace)
        self.level = min(self.limit * cap, self.level + amount)

    def wait_s(self, amount: float, now: float, cap: float = 1.0, pace: float = 1.0) -> float:
        """How long until ``amount`` fits (0: now)."""
        short = amount - self.level_at(now, cap, pace)
        if short <= 0:
            return 0.0
        return short / (self.rate * pace)
