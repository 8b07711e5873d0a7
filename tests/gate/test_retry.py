"""Retry waits: exponential with equal jitter, hints honoured and spread."""

from __future__ import annotations

import random
import statistics

import pytest

from yieldgate.gate._retry import RetryPolicy, TimeoutPolicy, backoff_s, hinted_wait_s


def test_backoff_grows_and_is_capped() -> None:
    policy = RetryPolicy(base_s=0.1, multiplier=2, max_backoff_s=1.0)
    rng = random.Random(1)
    for n, step in ((1, 0.1), (2, 0.2), (3, 0.4), (4, 0.8), (5, 1.0), (9, 1.0)):
        waits = [backoff_s(policy, n, rng) for _ in range(200)]
        assert min(waits) >= step / 2
        assert max(waits) <= step
        assert max(waits) - min(waits) > step / 4  # jittered, not fixed


def test_a_hint_is_never_undercut() -> None:
    policy = RetryPolicy(hint_jitter=0.5)
    rng = random.Random(2)
    waits = [hinted_wait_s(policy, 2.0, rng) for _ in range(1000)]
    assert min(waits) >= 2.0
    assert max(waits) <= 3.0


def test_hundred_callers_with_one_hint_do_not_come_back_in_lockstep() -> None:
    policy = RetryPolicy()
    rng = random.Random(3)
    hint = 1.0
    waits = sorted(hinted_wait_s(policy, hint, rng) for _ in range(100))
    assert len(set(waits)) == 100
    assert waits[-1] - waits[0] > 0.4 * hint  # spread over about half a hint
    # No instant is crowded: a 5%-of-hint slice holds about 10 of 100, never a crowd.
    assert max(sum(1 for w in waits if t <= w < t + 0.05) for t in waits) <= 25
    assert statistics.pstdev(waits) > 0.1 * hint


def test_a_zero_hint_still_spreads() -> None:
    policy = RetryPolicy(base_s=0.2)
    rng = random.Random(4)
    waits = [hinted_wait_s(policy, 0.0, rng) for _ in range(100)]
    assert min(waits) >= 0
    assert max(waits) <= 0.2
    assert statistics.pstdev(waits) > 0.03


def test_hints_are_capped() -> None:
    policy = RetryPolicy(max_hint_s=5.0, hint_jitter=0.0)
    assert hinted_wait_s(policy, 3600.0, random.Random(5)) == 5.0


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_attempts": 0},
        {"max_yields": -1},
        {"base_s": 0},
        {"max_backoff_s": float("inf")},
        {"multiplier": 0.5},
        {"hint_jitter": -0.1},
    ],
)
def test_policy_validation(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 - each names its own field
        RetryPolicy(**kwargs)  # type: ignore[arg-type]


def test_timeouts_validation() -> None:
    assert TimeoutPolicy(attempt_s=None, total_s=None).total_s is None
    for kwargs in ({"attempt_s": 0}, {"total_s": -1}, {"total_s": float("nan")}):
        with pytest.raises(ValueError, match="must be a positive number"):
            TimeoutPolicy(**kwargs)  # type: ignore[arg-type]


def test_no_retry_preset() -> None:
    policy = RetryPolicy.no_retry()
    assert (policy.max_attempts, policy.max_yields) == (1, 0)
