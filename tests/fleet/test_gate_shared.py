"""Gates that share their state through a real Redis, in one process (the members'
processes are in test_fleet_e2e.py): the quota, hint holds, the in-flight cap, and
what a Gate does when Redis is slow or gone."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import anyio
import httpx
import pytest

from tests.fleet.conftest import DelayProxy, RedisServer
from yieldgate import Cost, FleetPolicy, Gate, GatePolicy, Outcome, QuotaPolicy
from yieldgate.dialects import OPENAI

pytestmark = pytest.mark.anyio


def openai_reply(remaining: int, limit: int = 1000, reset: str = "60s") -> httpx.Response:
    return httpx.Response(
        200,
        json={"ok": True},
        headers={
            "x-ratelimit-limit-tokens": str(limit),
            "x-ratelimit-remaining-tokens": str(remaining),
            "x-ratelimit-reset-tokens": reset,
        },
    )


@pytest.fixture
def gates(redis_server: RedisServer) -> Iterator[Any]:
    made: list[Gate] = []
    name = f"shared-{time.monotonic_ns()}"

    def make(url: str | None = None, **fleet: Any) -> Gate:
        policy = GatePolicy(fleet=FleetPolicy(budget_s=1.0, **fleet))
        gate = Gate(policy, name=name, shared=url or redis_server.url)
        made.append(gate)
        return gate

    yield make
    for gate in made:
        gate.close()


def test_a_shared_gate_needs_a_name(redis_server: RedisServer) -> None:
    with pytest.raises(ValueError, match="needs a name"):
        Gate(shared=redis_server.url)


async def test_what_one_member_spends_of_the_quota_paces_the_other(gates: Any) -> None:
    first, second = gates(), gates()

    def replying(remaining: int) -> Any:
        async def answer() -> httpx.Response:
            # 1000 tokens refilled at 100 a second: full again in (1000 - remaining) / 100 s.
            return openai_reply(remaining, limit=1000, reset=f"{(1000 - remaining) / 100}s")

        return answer

    # Both learn the quota from a response each (plenty left).
    await second.call(replying(900), cost=Cost(1, 100), classify=OPENAI)
    await first.call(replying(900), cost=Cost(1, 100), classify=OPENAI)
    # The first spends it all: the provider says nothing is left.
    await first.call(replying(0), cost=Cost(1, 100), classify=OPENAI)
    # The second's own view still says 900 left; the fleet's bucket says 0.
    started = time.monotonic()
    await second.call(replying(500), cost=Cost(1, 500), classify=OPENAI)
    # 500 tokens at 100 a second: about 5 s (some may have refilled while we got here).
    assert time.monotonic() - started >= 2.0
    shared = second._core.shared
    assert shared is not None
    assert shared.available


def test_calls_never_wait_on_a_slow_redis_past_the_budget(redis_server: RedisServer) -> None:
    with DelayProxy(redis_server.port, 3.0) as proxy:
        gate = Gate(
            GatePolicy(fleet=FleetPolicy(budget_s=0.05, inflight_cap=4)),
            name=f"slow-{time.monotonic_ns()}",
            shared=proxy.url,
        )
        with gate:
            started = time.monotonic()
            results = [gate.call_sync(lambda: "ok") for _ in range(5)]
            elapsed = time.monotonic() - started
            shared = gate._core.shared
            assert shared is not None
            stats = shared.fleet.statistics()
    assert results == ["ok"] * 5
    # Each operation would take 3 s through the proxy: none was waited for.
    assert elapsed < 2.5, elapsed
    assert not shared.available
    assert stats.fallbacks >= 1


async def test_a_hint_one_member_sees_holds_the_other(gates: Any) -> None:
    first, second = gates(), gates()

    async def refuse() -> Outcome:
        return Outcome.yielded(2.0, "saturated")

    async def ok() -> str:
        return "ok"

    with anyio.move_on_after(0.5):
        await first.call(refuse)  # its hint goes to the fleet
    started = time.monotonic()
    assert await second.call(ok) == "ok"
    # The second, which saw no refusal itself, waited about the hint before sending.
    assert time.monotonic() - started >= 1.0


async def test_the_fleet_cap_bounds_attempts_in_flight_across_gates(gates: Any) -> None:
    members = [gates(inflight_cap=2) for _ in range(3)]
    running = 0
    peak = 0

    async def work() -> str:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await anyio.sleep(0.05)
        running -= 1
        return "ok"

    async with anyio.create_task_group() as tg:
        for gate in members:
            for _ in range(4):
                tg.start_soon(gate.call, work)
    assert peak == 2
    assert all(g.statistics().calls_ok == 4 for g in members)


def test_a_policy_budget_is_settled_by_the_usage_a_response_reports() -> None:
    # Through the HTTP transport: the body's usage replaces the estimate in the bucket.
    import yieldgate

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            200, json={"usage": {"prompt_tokens": 3, "completion_tokens": 7, "total_tokens": 10}}
        )

    gate = Gate(GatePolicy(quota=QuotaPolicy(tokens_per_minute=6000, learn=False)), name="usage")
    transport = yieldgate.gate_transport(
        gate, sync=True, flavor="httpx", inner=httpx.MockTransport(handler)
    )
    with httpx.Client(transport=transport, base_url="http://provider") as client:
        reply = client.post("/v1/completions", json={"prompt": "x" * 40, "max_tokens": 500})
        reply.read()
    bucket = gate._core.upstreams[0].quota.buckets["policy:tokens"]
    # Estimated 10 + 500 = 510, used 10: the 500 came back.
    assert bucket.level_at(bucket.updated) == pytest.approx(6000 - 10, abs=1.0)
