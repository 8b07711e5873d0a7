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

import random

from yieldgate.gate._policy import RetryPolicy, TimeoutPolicy

__all__ = [
    "RetryPolicy",
    "TimeoutPolicy",
    "backoff_floor_s",
    "backoff_s",
    "hinted_floor_s",
    "hinted_wait_s",
]


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
