"""The virtual clock itself: what the other Gate tests rely on."""

from __future__ import annotations

import time

import anyio
import pytest

pytestmark = pytest.mark.anyio


async def test_sleep_advances_virtual_time_only() -> None:
    wall = time.monotonic()
    start = anyio.current_time()
    await anyio.sleep(3600)
    assert anyio.current_time() - start == pytest.approx(3600)
    assert time.monotonic() - wall < 5


async def test_timers_fire_in_order() -> None:
    order: list[int] = []

    async def after(delay: float, tag: int) -> None:
        await anyio.sleep(delay)
        order.append(tag)

    async with anyio.create_task_group() as tg:
        for delay, tag in ((3, 3), (1, 1), (2, 2)):
            tg.start_soon(after, delay, tag)
    assert order == [1, 2, 3]


async def test_deadlines_use_virtual_time() -> None:
    with anyio.move_on_after(10) as scope:
        await anyio.sleep(100)
    assert scope.cancelled_caught
    assert anyio.current_time() == pytest.approx(10)
