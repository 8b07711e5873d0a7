"""The retry budget: retries as a bounded share of recent requests."""

from __future__ import annotations

import pytest

from yieldgate.gate._budget import RetryBudget, RetryBudgetPolicy


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def drain(budget: RetryBudget) -> int:
    n = 0
    while budget.try_withdraw():
        n += 1
    return n


def test_ratio_of_requests_plus_a_floor() -> None:
    clock = Clock()
    budget = RetryBudget(RetryBudgetPolicy(ratio=0.2, min_per_s=0.5, window_s=10), clock)
    for _ in range(100):
        budget.deposit()
    assert drain(budget) == 20 + 5


def test_no_floor_means_no_retries_without_traffic() -> None:
    budget = RetryBudget(RetryBudgetPolicy(ratio=0.1, min_per_s=0, window_s=10), Clock())
    assert not budget.try_withdraw()
    for _ in range(10):
        budget.deposit()
    assert drain(budget) == 1


def test_window_slides() -> None:
    clock = Clock()
    budget = RetryBudget(RetryBudgetPolicy(ratio=0.5, min_per_s=0, window_s=10), clock)
    for _ in range(10):
        budget.deposit()
    assert drain(budget) == 5
    clock.now = 5.0
    assert not budget.try_withdraw()
    clock.now = 10.5  # the first bucket's requests and retries fell out together
    assert budget.allowance() == pytest.approx(0)
    for _ in range(4):
        budget.deposit()
    assert drain(budget) == 2
    clock.now = 1000.0  # long idle: everything forgotten
    assert budget.allowance() == 0


def test_policy_validation() -> None:
    for kwargs in ({"ratio": -1}, {"min_per_s": -1}, {"window_s": 0}):
        with pytest.raises(ValueError, match="budget"):
            RetryBudgetPolicy(**kwargs)  # type: ignore[arg-type]


def test_unlimited_preset() -> None:
    budget = RetryBudget(RetryBudgetPolicy.unlimited(), Clock())
    assert all(budget.try_withdraw() for _ in range(10_000))
