"""Membership: how many members are alive, from heartbeats with a time to live."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from tests.fleet.conftest import wait_for

pytestmark = pytest.mark.anyio

UP = "api.example"


async def test_members_count_the_live_heartbeats(
    fleets: Any, admin: redis.Redis, gate: str
) -> None:
    a, b = fleets(member="a"), fleets(member="b", lease_ttl_s=0.3)
    assert await a.members(UP) == 0
    assert await a.heartbeat(UP) == 1
    assert await b.heartbeat(UP) == 2
    assert await a.heartbeat(UP) == 2  # again: still two
    assert await b.members(UP) == 2
    assert admin.pttl(f"yieldgate:{gate}:{{{UP}}}:members") > 0

    async def b_gone() -> bool:
        return await a.members(UP) == 1

    await wait_for(b_gone)
    assert await a.leave(UP) is True
    assert await a.members(UP) == 0
