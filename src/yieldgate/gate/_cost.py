"""What a quota meters: an attempt's ``Cost``, a provider's ``QuotaReading``, a ``Bucket``.

The plain records and the bucket arithmetic that ``_quota`` paces by, kept
apart from the pacing itself (claims, the queue, learning from readings):
dialects read and build these without anything else of the Gate's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

__all__ = [
    "DEFAULT_WINDOW_S",
    "LONGEST_WINDOW_S",
    "MAX_WINDOW_S",
    "MIN_LIMIT",
    "NOTHING",
    "ONE_REQUEST",
    "SCOPE_MARK",
    "Bucket",
    "Cost",
    "QuotaReading",
    "as_cost",
    "reading_rate",
    "scope_of",
    "scoped_key",
]

# The window a bucket is assumed to refill over when nothing says otherwise.
DEFAULT_WINDOW_S = 60.0
# A reading whose used share is below this says too little about the refill rate.
_MIN_USED_SHARE = 0.02
# What a reading may say, whatever a header claims: a bucket is full again within
# its window (a minute unless a header names one, at most an hour unless the
# provider's header family documents a longer one: a day's, a month's), so no
# reading can stall a Gate past it; its limit is one request or token at least.
MAX_WINDOW_S = 3600.0
LONGEST_WINDOW_S = 31 * 86_400.0
MIN_LIMIT = 1.0
# Between a learnt bucket's reading key and its scope, in its key (``openai:tokens@gpt-4o``).
SCOPE_MARK = "@"


def scoped_key(key: str, scope: str) -> str:
    """The key of the bucket a reading ``key`` describes for ``scope``."""
    return f"{key}{SCOPE_MARK}{scope}" if scope else key


def scope_of(key: str) -> str:
    """The scope of a learnt bucket's key (``""``: the upstream's own)."""
    return key.partition(SCOPE_MARK)[2]


class Cost(NamedTuple):
    """What one attempt spends of a quota: one request and its tokens.

    ``tokens`` is the total a provider meters (prompt plus the output it may
    produce), ``input_tokens`` and ``output_tokens`` its parts, for providers
    that meter them apart (Anthropic).

    ``scope`` names the quota it spends, where a provider keeps one per model
    (OpenAI, Anthropic) or per deployment (Azure) on one key: the model the
    request names, read by the transport's dialect. Each scope has its own
    buckets, learnt from the answers to its own requests; ``""`` is the
    upstream's one quota (nothing named).
    """

    requests: int = 1
    """Requests it spends (1 for an attempt; 0 for what a yield refused)."""
    tokens: int = 0
    """The tokens a provider meters: the prompt plus the output it may produce."""
    input_tokens: int = 0
    """The prompt's tokens, for providers that meter them apart (Anthropic)."""
    output_tokens: int = 0
    """The output's tokens (at most), for providers that meter them apart."""
    scope: str = ""
    """The quota it spends (a model, an Azure deployment); ``""``: the upstream's one."""

    @classmethod
    def of(cls, input_tokens: int, output_tokens: int, scope: str = "") -> Cost:
        """One request of ``input_tokens`` and at most ``output_tokens``."""
        return cls(1, input_tokens + output_tokens, input_tokens, output_tokens, scope)

    def amount(self, resource: str) -> int:
        """Its count of ``resource``, a field's name (``"tokens"``), as a quota's bucket meters."""
        value: int = getattr(self, resource)
        return value


def as_cost(cost: Cost | int) -> Cost:
    """A ``cost=`` argument as a ``Cost``: an int is a number of tokens, in one request."""
    if isinstance(cost, Cost):
        if any(type(v) is not int or v < 0 for v in cost[:4]):
            raise ValueError(f"a cost's counts must be integers >= 0, got {cost!r}")
        if not isinstance(cost.scope, str):
            raise TypeError(f"a cost's scope must be a str, got {type(cost.scope).__name__}")
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
    ``limit`` is ``None`` when the provider says only what remains (Azure):
    the limit is then learnt as the most ever seen remaining (plus what was in
    flight at the first reading).
    """

    key: str
    """The bucket's name, such as ``openai:tokens``."""
    resource: str
    """What it meters: a ``Cost`` field (``requests``, ``tokens``...)."""
    limit: float | None
    """The bucket's size; ``None`` when the provider says only what remains (Azure)."""
    remaining: float
    """What is left of it now."""
    reset_s: float | None = None
    """Seconds until it is full again, when a header says."""
    window_s: float | None = None
    """The window its limit is for, in seconds, when a header says (IETF's ``w``)."""


class Bucket:
    """A continuously refilling bucket: ``limit`` at most, ``rate`` per second."""

    __slots__ = (
        "applied",
        "key",
        "learnt",
        "level",
        "limit",
        "rate",
        "resource",
        "scope",
        "updated",
    )

    def __init__(
        self,
        key: str,
        resource: str,
        limit: float,
        rate: float,
        now: float,
        *,
        learnt: bool,
        scope: str | None = None,
    ) -> None:
        self.key = key
        # The scope whose costs it meters (``None``: every scope's, as the caller's
        # own budgets do).
        self.scope = scope
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

    def spends(self, amount: float, cap: float = 1.0) -> float:
        """What a claim of ``amount`` spends here. A learnt limit is a reading, or a guess
        from what remains, and may be wrong: a cost past it waits for the whole bucket
        and spends that, never more (it paces; only the provider says a request is too
        large, and its answer corrects the limit). The caller's own budgets are exact."""
        return min(amount, self.limit * cap) if self.learnt else amount

    def take(self, amount: float, now: float, cap: float = 1.0, pace: float = 1.0) -> None:
        self.settle(now, cap, pace)
        self.level -= self.spends(amount, cap)

    def give(self, amount: float, now: float, cap: float = 1.0, pace: float = 1.0) -> None:
        self.settle(now, cap, pace)
        self.level = min(self.limit * cap, self.level + self.spends(amount, cap))

    def wait_s(self, amount: float, now: float, cap: float = 1.0, pace: float = 1.0) -> float:
        """How long until ``amount`` fits (0: now)."""
        short = self.spends(amount, cap) - self.level_at(now, cap, pace)
        if short <= 0:
            return 0.0
        return short / (self.rate * pace)


def reading_rate(reading: QuotaReading, limit: float, bucket: Bucket | None) -> float:
    """The refill rate a reading implies: its window's, the used share over the
    time to full, or what the bucket had (a minute's limit, first)."""
    if reading.window_s is not None and reading.window_s > 0:
        return limit / min(reading.window_s, LONGEST_WINDOW_S)
    used = limit - reading.remaining
    if reading.reset_s is not None and reading.reset_s > 0 and used >= _MIN_USED_SHARE * limit:
        # Per-minute limits (OpenAI's, Anthropic's) are full again within a minute: a
        # later reset is a daily limit's (its 429's hint says so) or a bad header's.
        rate = used / min(reading.reset_s, DEFAULT_WINDOW_S)
        if math.isfinite(rate) and rate > 0:
            return rate
    if bucket is not None and bucket.limit == limit:
        return bucket.rate
    return limit / DEFAULT_WINDOW_S
