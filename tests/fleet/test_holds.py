"""Hint holds: a hold at a rank covers it and every lower rank, fleet-wide."""

from __future__ import annotations

import time
from typing import Any

import pytest
import redis

from tests.fleet.conftest import Either, wait_for

pytestmark = pytest.mark.anyio

UP = "api.example"


async def test_a_hold_covers_its_rank_and_those_below(fleet: Either) -> None:
    assert await fleet.holds(UP) == {}
    start = time.monotonic()
    assert await fleet.hold(UP, 1, 5.0) is True
    holds = await fleet.holds(UP)
    elapsed = time.monotonic() - start
    assert holds is not None
    assert sorted(holds) == [0, 1]
    assert all(5.0 - elapsed - 1e-6 <= left <= 5.0 for left in holds.values())


async def test_holds_only_grow(fleet: Either) -> None:
    await fleet.hold(UP, 1, 5.0)
    await fleet.hold(UP, 2, 1.0)  # shorter: the lower ranks keep their 5 s
    await fleet.hold(UP, 0, 8.0)
    holds = await fleet.holds(UP)
    assert holds is not None
    assert 4.0 < holds[1] <= 5.0
    assert 0.0 < holds[2] <= 1.0
    assert 7.0 < holds[0] <= 8.0


async def test_a_hold_seen_by_one_member_holds_the_others(fleets: Any) -> None:
    a, b = fleets(member="a"), fleets(member="b")
    await a.hold(UP, 2, 3.0)
    holds = await b.holds(UP)
    assert holds is not None
    assert sorted(holds) == [0, 1, 2]


async def test_a_hold_ends_and_its_key_expires(
    fleet: Either, admin: redis.Redis, gate: str
) -> None:
    await fleet.hold(UP, 0, 0.2)
    key = f"yieldgate:{gate}:{{{UP}}}:holds"
    assert 0 < admin.pttl(key) <= 1201  # the hold and a second

    async def over() -> bool:
        return await fleet.holds(UP) == {}

    await wait_for(over)


async def test_hold_arguments_are_checked(fleet: Either) -> None:
    with pytest.raises(ValueError, match="rank"):
        await fleet.hold(UP, -1, 1.0)
    with pytest.raises(ValueError, match="rank"):
        await fleet.hold(UP, 64, 1.0)
    with pytest.raises(ValueError, match="for_s"):
        await fleet.hold(UP, 0, float("inf"))


async def test_a_scopes_hold_is_that_scopes_alone(
    fleets: Any, admin: redis.Redis, gate: str
) -> None:
    """A provider's refusal for one model's quota: the other models and the whole
    upstream are not held; each member reads every scope's holds in one round trip."""
    a, b = fleets(member="a"), fleets(member="b")
    assert await a.hold(UP, 1, 3.0, scope="gpt-4o") is True
    assert await a.hold(UP, 0, 5.0, scope="a b") is True  # a scope may hold a space
    assert await b.holds(UP) == {}  # the whole upstream: not held
    held = await b.all_holds(UP)
    assert held is not None
    assert sorted(held) == ["a b", "gpt-4o"]
    assert sorted(held["gpt-4o"]) == [0, 1]
    assert all(0 < left <= 3.0 for left in held["gpt-4o"].values())
    assert sorted(held["a b"]) == [0]
    await a.hold(UP, 2, 1.0)
    held = await b.all_holds(UP)
    assert held is not None
    assert sorted(held) == ["", "a b", "gpt-4o"]
    key = f"yieldgate:{gate}:{{{UP}}}:scope-holds"
    assert 0 < admin.pttl(key) <= 6001  # the latest hold and a second
    with pytest.raises(TypeError, match="scope"):
        await a.hold(UP, 0, 1.0, scope=3)
