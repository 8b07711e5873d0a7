"""A round trip's time bound counts Redis's time, not the event loop's (issue 39).

A member that fires its whole burst at once keeps its event loop busy building
requests; a reply that came in a millisecond then waits for the loop to read it.
``asyncio.timeout`` (on main) counted that wait against the budget, so the member
went on alone, blind, for a second: the 429s of the users' shape fleet test.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from tests.fleet.conftest import DelayProxy, RedisServer
from yieldgate.fleet import Fleet
from yieldgate.fleet._timeout import LoopLag, RoundTripBound

pytestmark = pytest.mark.anyio

UP = "api"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the bound is asyncio's; trio runs the sync client in a thread


async def test_a_busy_event_loop_is_not_a_slow_redis(redis_server: RedisServer) -> None:
    # Redis answers each command in 20 ms; meanwhile the loop is blocked for 500 ms.
    with DelayProxy(redis_server.port, 0.02) as proxy:
        async with Fleet(proxy.url, gate="busy-loop", budget_s=0.2) as fleet:
            assert await fleet.heartbeat(UP) == 1  # connected
            assert await fleet.members(UP) == 1  # its script loaded

            async def busy() -> None:
                await asyncio.sleep(0)  # the round trip below has sent its command
                time.sleep(0.5)  # noqa: ASYNC251 - a burst's requests built in one go

            counted, _ = await asyncio.gather(fleet.members(UP), busy())
            assert counted == 1  # on main: None, the budget spent while the loop was busy
            stats = fleet.statistics()
            assert (stats.outages, stats.fallbacks) == (0, 0)


async def test_a_slow_redis_on_an_idle_loop_still_times_out(redis_server: RedisServer) -> None:
    with DelayProxy(redis_server.port, 0.0) as proxy:
        async with Fleet(proxy.url, gate="idle-loop", budget_s=0.05) as fleet:
            assert await fleet.heartbeat(UP) == 1  # joined: the budget bounds what follows
            proxy.delay_s = 0.5
            start = time.monotonic()
            assert await fleet.members(UP) is None
            assert time.monotonic() - start < 0.4
            assert fleet.statistics().outages == 1


async def test_the_loops_busy_time_is_left_out() -> None:
    """The loop blocked for 0.5 s right after the round trip began: with a budget of
    10 ms, the bound still waits for Redis's own 10 ms after the block."""

    async def round_trip() -> None:
        async with RoundTripBound(0.01):
            asyncio.get_running_loop().call_soon(time.sleep, 0.5)
            await asyncio.Event().wait()  # a reply that never comes

    start = time.monotonic()
    with pytest.raises(TimeoutError):
        await round_trip()
    assert time.monotonic() - start >= 0.5


async def test_a_loop_busy_throughout_ends_the_round_trip_at_its_cap() -> None:
    """Redis never answers, and the loop is busy nearly all the time (0.3 s blocks):
    the bound still ends, at ``max(20 x budget, 1 s)``, with ``TimeoutError``."""
    stop = asyncio.Event()

    async def keep_busy() -> None:
        while not stop.is_set():
            time.sleep(0.3)  # noqa: ASYNC251 - the loop kept busy, on purpose
            await asyncio.sleep(0)

    hog = asyncio.create_task(keep_busy())
    start = time.monotonic()

    async def round_trip() -> None:
        async with RoundTripBound(0.05):
            await asyncio.Event().wait()

    try:
        with pytest.raises(TimeoutError):
            await round_trip()
    finally:
        stop.set()
        await hog
    assert 0.9 <= time.monotonic() - start < 2.5
    loop = asyncio.get_running_loop()
    assert LoopLag.of(loop)._handle is None  # the ticker stops with the last bound


async def test_a_cancel_from_outside_is_not_a_timeout() -> None:
    async def wait() -> None:
        async with RoundTripBound(5.0):
            await asyncio.Event().wait()

    task = asyncio.create_task(wait())
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
