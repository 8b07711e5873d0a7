"""Fleet-wide in-flight caps, as leases with a time to live."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from tests.fleet.conftest import Either, wait_for

pytestmark = pytest.mark.anyio

UP = "api.example"


async def test_the_cap_holds_across_members(fleets: Any) -> None:
    a, b = fleets(member="a"), fleets(member="b")
    first = await a.acquire(UP, 2)
    second = await b.acquire(UP, 2)
    assert isinstance(first, str)
    assert isinstance(second, str)
    assert first != second
    assert first.startswith("a#")
    assert await a.acquire(UP, 2) is False
    assert await b.acquire(UP, 2) is False
    assert await a.release(UP, first) is True
    assert await a.release(UP, first) is False  # once
    # b holds its share (one of two) while a waits: the freed slot is a's.
    assert await b.acquire(UP, 2) is False
    third = await a.acquire(UP, 2)
    assert isinstance(third, str)
    assert await a.acquire(UP, 2) is False


async def test_a_member_alone_may_hold_the_whole_cap(fleets: Any) -> None:
    a, b = fleets(member="a"), fleets(member="b")
    held = [await a.acquire(UP, 3) for _ in range(3)]
    assert all(isinstance(lease, str) for lease in held)
    assert await b.acquire(UP, 3) is False  # b waits now
    leases = [await a.acquire(UP, 3) for _ in range(2)]
    assert leases == [False, False]


async def test_a_dead_members_leases_come_back_after_their_ttl(fleets: Any) -> None:
    dead = fleets(member="dead", lease_ttl_s=0.3)
    alive = fleets(member="alive")
    assert isinstance(await dead.acquire(UP, 1), str)  # and never released
    assert await alive.acquire(UP, 1) is False

    async def free() -> bool:
        return isinstance(await alive.acquire(UP, 1), str)

    await wait_for(free)


async def test_renewing_extends_a_lease(fleets: Any, admin: redis.Redis, gate: str) -> None:
    a = fleets(member="a", lease_ttl_s=30.0)
    lease = await a.acquire(UP, 1)
    key = f"yieldgate:{gate}:{{{UP}}}:leases"
    before = admin.zscore(key, lease)
    assert before is not None

    async def later() -> bool:
        assert await a.renew(UP, [lease]) is True
        after = admin.zscore(key, lease)
        return after is not None and after > before

    await wait_for(later)
    assert 29_000 < admin.pttl(key) <= 31_000


async def test_an_expired_lease_is_not_revived(fleets: Any) -> None:
    a = fleets(member="a", lease_ttl_s=0.2)
    b = fleets(member="b")
    lease = await a.acquire(UP, 1)
    assert isinstance(lease, str)

    async def taken_over() -> bool:
        return isinstance(await b.acquire(UP, 1), str)

    await wait_for(taken_over)
    assert await a.renew(UP, [lease]) is False
    assert await a.release(UP, lease) is False
    assert await a.renew(UP, ["never-held"]) is False


async def test_lease_arguments_are_checked(fleet: Either) -> None:
    with pytest.raises(ValueError, match="cap"):
        await fleet.acquire(UP, 0)
    with pytest.raises(ValueError, match="lease"):
        await fleet.renew(UP, "a#1")
