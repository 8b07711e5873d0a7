"""The Window: slow start, AIMD, priority admission, cancellation safety."""

from __future__ import annotations

import anyio
import pytest

from yieldgate.gate._async import AsyncSignal
from yieldgate.gate._window import Permit, Signal, Window, WindowPolicy
from yieldgate.protocol import Priority

pytestmark = pytest.mark.anyio


async def acquire(window: Window, priority: Priority = Priority.NORMAL) -> Permit:
    """Wait for a permit as a driver does (the window's own API): cancellation takes nothing."""
    permit = window.try_acquire(priority)
    if permit is not None:
        return permit
    signal = AsyncSignal()
    waiter = window.enqueue(priority, signal.wake)
    try:
        while True:
            wake_at = window.look(waiter)
            if waiter.permit is not None:
                permit, waiter.permit = waiter.permit, None
                return permit
            signal.clear()
            await signal.wait(wake_at, anyio.current_time)
    except BaseException:
        window.abandon(waiter)
        raise


def fill(window: Window, n: int) -> list[Permit]:
    permits = [window.try_acquire() for _ in range(n)]
    assert all(p is not None for p in permits)
    return permits  # type: ignore[return-value]


def test_policy_validation() -> None:
    for kwargs in (
        {"min": 0},
        {"min": 4, "max": 2, "initial": 4},
        {"initial": 100, "max": 10},
        {"decrease": 0.0},
        {"decrease": 1.5},
        {"increase": -1.0},
    ):
        with pytest.raises(ValueError, match="window"):
            WindowPolicy(**kwargs)  # type: ignore[arg-type]


def test_slow_start_doubles_per_round_trip() -> None:
    window = Window(WindowPolicy(initial=1, max=64))
    sizes = []
    for _ in range(5):
        permits = fill(window, window.limit)
        assert window.try_acquire() is None  # the limit binds
        for p in permits:
            window.release(p, Signal.SUCCESS)
        sizes.append(window.limit)
    assert sizes == [2, 4, 8, 16, 32]


def test_yield_shrinks_multiplicatively_once_per_window() -> None:
    window = Window(WindowPolicy(initial=20, max=64, decrease=0.5))
    permits = fill(window, 20)
    # Twenty yields from the same congestion event shrink the window once.
    for p in permits:
        window.release(p, Signal.CONGESTION)
    assert window.limit == 10
    stats = window.statistics()
    assert (stats.decreases, stats.slow_start) == (1, False)
    # A permit granted after the decrease belongs to a new event.
    later = fill(window, 1)[0]
    window.release(later, Signal.CONGESTION)
    assert window.limit == 5


def test_congestion_avoidance_grows_about_one_per_window() -> None:
    window = Window(WindowPolicy(initial=10, max=64, decrease=0.5))
    window.release(fill(window, 1)[0], Signal.CONGESTION)  # leave slow start at 5
    assert window.limit == 5
    for _ in range(3):
        permits = fill(window, window.limit)
        for p in permits:
            window.release(p, Signal.SUCCESS)
    assert window.limit in (7, 8)  # ~ +1 per round trip, not doubling


def test_growth_needs_demand() -> None:
    window = Window(WindowPolicy(initial=4, max=64))
    for _ in range(100):
        window.release(fill(window, 1)[0], Signal.SUCCESS)  # one at a time: limit never binds
    assert window.limit == 4


def test_never_above_max_nor_below_min() -> None:
    window = Window(WindowPolicy(initial=2, min=2, max=3))
    for _ in range(10):
        for p in fill(window, window.limit):
            window.release(p, Signal.SUCCESS)
    assert window.limit == 3
    for _ in range(10):
        window.release(fill(window, 1)[0], Signal.CONGESTION)
    assert window.limit == 2


def test_failures_and_cancellations_leave_the_limit_alone() -> None:
    window = Window(WindowPolicy(initial=4))
    for p in fill(window, 4):
        window.release(p, Signal.FAILURE)
    for p in fill(window, 4):
        window.release(p, Signal.CANCELLED)
    assert window.limit == 4


def test_fixed_window_is_a_bulkhead() -> None:
    window = Window(WindowPolicy.fixed(3))
    for _ in range(5):
        for p in fill(window, 3):
            window.release(p, Signal.SUCCESS)
    window.release(fill(window, 1)[0], Signal.CONGESTION)
    assert window.limit == 3


def test_release_is_idempotent() -> None:
    window = Window(WindowPolicy(initial=2))
    p = fill(window, 1)[0]
    window.release(p, Signal.SUCCESS)
    window.release(p, Signal.SUCCESS)
    assert window.inflight == 0


async def test_waiters_are_admitted_by_priority_then_arrival() -> None:
    window = Window(WindowPolicy.fixed(1))
    holder = fill(window, 1)[0]
    order: list[str] = []

    async def wait(tag: str, priority: Priority) -> None:
        permit = await acquire(window, priority)
        order.append(tag)
        window.release(permit, Signal.SUCCESS)

    async with anyio.create_task_group() as tg:
        for tag, prio in (
            ("low-1", Priority.LOW),
            ("normal-1", Priority.NORMAL),
            ("high-1", Priority.HIGH),
            ("normal-2", Priority.NORMAL),
            ("high-2", Priority.HIGH),
        ):
            tg.start_soon(wait, tag, prio)
            await anyio.sleep(0.01)
        assert window.waiting == 5
        window.release(holder, Signal.SUCCESS)
    assert order == ["high-1", "high-2", "normal-1", "normal-2", "low-1"]


async def test_try_acquire_does_not_jump_the_queue() -> None:
    window = Window(WindowPolicy.fixed(1))
    holder = fill(window, 1)[0]
    async with anyio.create_task_group() as tg:
        tg.start_soon(acquire, window, Priority.NORMAL)
        await anyio.sleep(0.01)
        window.release(holder, Signal.SUCCESS)  # granted to the waiter
        assert window.try_acquire(Priority.NORMAL) is None
    assert window.inflight == 1


async def test_cancelled_waiter_takes_nothing() -> None:
    window = Window(WindowPolicy.fixed(1))
    holder = fill(window, 1)[0]
    with anyio.move_on_after(1):
        await acquire(window)
    assert (window.waiting, window.inflight) == (0, 1)
    window.release(holder, Signal.SUCCESS)
    assert window.try_acquire() is not None


async def test_a_permit_granted_to_a_cancelled_waiter_is_handed_back() -> None:
    window = Window(WindowPolicy.fixed(1))
    holder = fill(window, 1)[0]
    outcome: list[str] = []

    async def waiter(box: list[anyio.CancelScope]) -> None:
        with anyio.CancelScope() as scope:
            box.append(scope)
            await acquire(window)
            outcome.append("acquired")
        if scope.cancelled_caught:
            outcome.append("cancelled")

    box: list[anyio.CancelScope] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(waiter, box)
        await anyio.sleep(0.01)
        box[0].cancel()  # cancelled first...
        window.release(holder, Signal.SUCCESS)  # ...then granted, before it runs again
    assert outcome == ["cancelled"]
    assert window.inflight == 0  # the grant was handed back, not lost
    assert window.try_acquire() is not None


async def test_no_permit_leaks_under_random_cancellation() -> None:
    window = Window(WindowPolicy(initial=3, max=3))

    async def worker(delay: float) -> None:
        with anyio.move_on_after(delay):
            permit = await acquire(window)
            try:
                await anyio.sleep(0.05)
            finally:
                window.release(permit, Signal.SUCCESS)

    async with anyio.create_task_group() as tg:
        for i in range(200):
            tg.start_soon(worker, (i % 17) * 0.013)
    assert (window.inflight, window.waiting) == (0, 0)


def test_on_change_reports_limit_moves() -> None:
    moves: list[tuple[int, int]] = []
    window = Window(WindowPolicy(initial=1), on_change=lambda old, new: moves.append((old, new)))
    window.release(fill(window, 1)[0], Signal.SUCCESS)
    window.release(fill(window, 1)[0], Signal.CONGESTION)
    assert moves == [(1, 2), (2, 1)]
