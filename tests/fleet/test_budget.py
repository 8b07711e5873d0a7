"""The shared retry budget: ``RetryBudget``'s semantics, over the whole fleet."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from tests.fleet.conftest import Either, wait_for
from yieldgate.gate import RetryBudgetPolicy

pytestmark = pytest.mark.anyio

UP = "api.example"


async def test_retries_are_a_share_of_the_fleets_calls(fleets: Any) -> None:
    a, b = fleets(member="a"), fleets(member="b")
    policy = RetryBudgetPolicy(ratio=0.5, min_per_s=0.0, window_s=60.0)
    assert await a.withdraw(UP, policy) is False
    assert await a.deposit(UP, policy, 2) is True
    assert await b.deposit(UP, policy, 2) is True
    first = await a.withdraw(UP, policy)
    assert isinstance(first, int)
    assert first is not False
    assert isinstance(await b.withdraw(UP, policy), int)
    assert await a.withdraw(UP, policy) is False
    assert await b.refund_retry(UP, policy, first) is True
    assert isinstance(await b.withdraw(UP, policy), int)
    assert await b.withdraw(UP, policy) is False


async def test_the_floor_lets_a_quiet_fleet_retry(fleet: Either) -> None:
    policy = RetryBudgetPolicy(ratio=0.0, min_per_s=0.05, window_s=60.0)  # 3 a window
    for _ in range(3):
        assert isinstance(await fleet.withdraw(UP, policy), int)
    assert await fleet.withdraw(UP, policy) is False


async def test_the_window_slides(fleet: Either, admin: redis.Redis, gate: str) -> None:
    policy = RetryBudgetPolicy(ratio=0.0, min_per_s=2.0, window_s=0.5)  # 1 a window
    assert isinstance(await fleet.withdraw(UP, policy), int)
    assert await fleet.withdraw(UP, policy) is False
    assert 0 < admin.pttl(f"yieldgate:{gate}:{{{UP}}}:budget") <= 1000

    async def again() -> bool:
        return isinstance(await fleet.withdraw(UP, policy), int)

    await wait_for(again)


async def test_a_refund_from_a_bucket_gone_by_gives_nothing_back(fleet: Either) -> None:
    policy = RetryBudgetPolicy(ratio=0.0, min_per_s=0.05, window_s=60.0)
    receipt = await fleet.withdraw(UP, policy)
    assert isinstance(receipt, int)
    assert await fleet.refund_retry(UP, policy, receipt - 10) is True  # outside the window
    for _ in range(2):
        assert isinstance(await fleet.withdraw(UP, policy), int)
    assert await fleet.withdraw(UP, policy) is False
