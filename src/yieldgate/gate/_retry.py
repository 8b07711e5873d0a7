"""Retry policy and the waits it prescribes.

The waits spread callers out. A hint ``h`` from the upstream becomes a wait
drawn uniformly from ``[h, h * (1 + hint_jitter)]``: never earlier than the
upstream asked (it expects a slot to free at ``h``, not before), and spread so
that a hundred callers handed the same hint come back over half a hint's
length rather than in one instant. Without a hint, the wait is exponential in
the number of such waits so far, with "equal jitter": half the step fixed and
half random, which spreads callers without ever collapsing to zero.

Backoff is also a floor under hints. The first retry honours any hint, however
short; from the second retry of a call on, a hint shorter than the backoff for
that retry (a zero hint, a ``retry-after-ms: 0.001``) is waited like no hint
at all. An upstream that keeps saying "now" is answered at an exponentially
falling rate, so no hint can make a call's retries amplify an overload.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

__all__ = [
    "RetryPolicy",
    "TimeoutPolicy",
    "backoff_floor_s",
    "backoff_s",
    "hinted_floor_s",
    "hinted_wait_s",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class RetryPolicy:
    """How often and how long a call tries again.

    ``max_attempts`` caps attempts that did not end in congestion (a first
    attempt and its retries after failures); ``max_yields`` caps the waits on
    yields and overloads. Both are further bounded by the call's total
    timeout and, for failures and overloads, by the retry budget.

    ``share_hints``: a yield or overload that carries a hint holds back every
    attempt of the Gate at that priority and below until the hint has passed,
    not only the retry of the call that got it. Calls queued behind a cold or
    full upstream then wait once, instead of each collecting a yield of its own.
    """

    max_attempts: int = 4
    max_yields: int = 64
    base_s: float = 0.1
    multiplier: float = 2.0
    max_backoff_s: float = 10.0
    hint_jitter: float = 0.5
    max_hint_s: float = 120.0
    honour_hints: bool = True
    share_hints: bool = True

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be >= 1")
        if self.max_yields < 0:
            raise ValueError("max_yields must be >= 0")
        for name in ("base_s", "max_backoff_s", "max_hint_s"):
            value = getattr(self, name)
            if not (value > 0 and math.isfinite(value)):
                raise ValueError(f"{name} must be a positive number")
        if not (self.multiplier >= 1 and math.isfinite(self.multiplier)):
            raise ValueError("multiplier must be >= 1")
        if not (self.hint_jitter >= 0 and math.isfinite(self.hint_jitter)):
            raise ValueError("hint_jitter must be a finite number >= 0")

    @classmethod
    def no_retry(cls) -> RetryPolicy:
        """One attempt, no waiting on yields: for callers that retry elsewhere.

        Hints are not shared either: another call's yield must not hold back
        an attempt of a caller that decides about waiting itself.
        """
        return cls(max_attempts=1, max_yields=0, share_hints=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class TimeoutPolicy:
    """Per-attempt and total time limits in seconds (``None``: no limit)."""

    attempt_s: float | None = 60.0
    total_s: float | None = 300.0

    def __post_init__(self) -> None:
        for name in ("attempt_s", "total_s"):
            value = getattr(self, name)
            if value is not None and not (value > 0 and not math.isnan(value)):
                raise ValueError(f"{name} must be a positive number or None")


def _step(policy: RetryPolicy, n: int) -> float:
    return float(min(policy.max_backoff_s, policy.base_s * policy.multiplier ** max(0, n - 1)))


def backoff_s(policy: RetryPolicy, n: int, rng: random.Random) -> float:
    """The wait before retry ``n`` (1-based) when the upstream gave no hint."""
    step = _step(policy, n)
    return step / 2 + rng.uniform(0, step / 2)


def backoff_floor_s(policy: RetryPolicy, n: int) -> float:
    """The least ``backoff_s`` can return for retry ``n``."""
    return _step(policy, n) / 2


def _repeat_floor_s(policy: RetryPolicy, n: int) -> float:
    """The least wait before retry ``n`` whatever the hint: none for the first."""
    return 0.0 if n <= 1 else backoff_floor_s(policy, n - 1)


def hinted_wait_s(policy: RetryPolicy, hint_s: float, rng: random.Random, n: int = 1) -> float:
    """The wait for an upstream hint before retry ``n``: at least the hint, spread above it."""
    hint = min(max(hint_s, 0.0), policy.max_hint_s)
    if hint <= _repeat_floor_s(policy, n):
        # A zero hint, or one shorter than this retry's backoff: "now" from a
        # hundred callers at once is a stampede, and from one caller again and
        # again it is a retry storm. Spread over a base step, then back off.
        if n <= 1:
            return rng.uniform(0, policy.base_s)
        return backoff_s(policy, n - 1, rng)
    return hint * (1.0 + rng.uniform(0, policy.hint_jitter))


def hinted_floor_s(policy: RetryPolicy, hint_s: float, n: int = 1) -> float:
    """The least ``hinted_wait_s`` can return for retry ``n``."""
    hint = min(max(hint_s, 0.0), policy.max_hint_s)
    floor = _repeat_floor_s(policy, n)
    return hint if hint > floor else floor
