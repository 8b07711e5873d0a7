"""The sync driver with real threads, and sync and async callers sharing one Gate.

Real time here (threads cannot run on a virtual clock), so nothing is timed:
each test waits on conditions (events, the Gate's statistics) with generous
limits that only a broken Gate would reach.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import anyio
import anyio.to_thread
import pytest

from yieldgate import Gate, GatePolicy, Outcome, RetryPolicy, WindowPolicy
from yieldgate.gate import NullInstrumentation

LIMIT_S = 20.0


def wait_for(predicate: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + LIMIT_S
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.001)


def fixed(n: int, **kw: Any) -> Gate:
    return Gate(
        GatePolicy(window=WindowPolicy.fixed(n), **kw), instrumentation=NullInstrumentation()
    )


def test_threads_never_exceed_the_window() -> None:
    gate = fixed(3)
    lock = threading.Lock()
    inflight = 0
    peak = 0
    entered = threading.Semaphore(0)

    def attempt(i: int) -> int:
        nonlocal inflight, peak
        with lock:
            inflight += 1
            peak = max(peak, inflight)
        entered.release()
        time.sleep(0.002)
        with lock:
            inflight -= 1
        return i

    results = gate.map_sync(attempt, range(40), concurrency=12)
    assert results == list(range(40))
    assert peak <= 3
    stats = gate.statistics()
    assert (stats.calls_ok, stats.window.inflight, stats.window.waiting) == (40, 0, 0)


def test_map_sync_raises_the_first_failure_or_returns_it_in_place() -> None:
    gate = fixed(2, retry=RetryPolicy.no_retry())

    def attempt(i: int) -> int:
        if i == 3:
            raise ValueError("bad item")
        return i

    with pytest.raises(Exception, match="bad item"):
        gate.map_sync(attempt, range(6), concurrency=2)
    results = gate.map_sync(attempt, range(6), concurrency=2, return_exceptions=True)
    assert results[:3] == [0, 1, 2]
    assert results[4:] == [4, 5]
    assert isinstance(results[3], Exception)


def test_hold_sync_keeps_the_slot_until_the_block_exits() -> None:
    gate = fixed(1)
    with gate.hold_sync(lambda: "stream") as value:
        assert value == "stream"
        assert gate.statistics().window.inflight == 1
    assert gate.statistics().window.inflight == 0


def test_a_nested_sync_call_runs_inside_its_attempt() -> None:
    gate = fixed(1)

    def inner() -> str:
        return "inner"

    def outer() -> str:
        # A second slot from a window of one would wait for ever.
        return "outer+" + gate.call_sync(inner)

    assert gate.call_sync(outer) == "outer+inner"
    assert gate.statistics().calls == 1


def test_wrap_serves_sync_and_async_functions() -> None:
    gate = fixed(2)

    @gate.wrap
    def add(a: int, b: int) -> int:
        return a + b

    @gate.wrap(priority="high")
    async def mul(a: int, b: int) -> int:
        return a * b

    assert add(2, 3) == 5
    assert anyio.run(mul, 2, 3) == 6
    assert gate.statistics().calls_ok == 2


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_a_slot_freed_by_a_thread_admits_a_waiting_task(backend: str) -> None:
    """One window for both drivers: a task waits behind a thread's slot and is
    woken, across threads, when the thread gives it back."""
    gate = fixed(1)
    taken = threading.Event()
    give_back = threading.Event()

    def holder() -> None:
        with gate.hold_sync(lambda: "held"):
            taken.set()
            give_back.wait(LIMIT_S)

    thread = threading.Thread(target=holder)
    thread.start()
    try:
        assert taken.wait(LIMIT_S)

        async def main() -> str:
            async def attempt() -> str:
                return "after the thread"

            async with anyio.create_task_group() as tg:
                result: list[str] = []

                async def caller() -> None:
                    result.append(await gate.call(attempt))

                tg.start_soon(caller)
                await anyio.to_thread.run_sync(
                    wait_for, lambda: gate.statistics().window.waiting > 0, "the task to queue"
                )
                give_back.set()
            return result[0]

        assert anyio.run(main, backend=backend) == "after the thread"
    finally:
        give_back.set()
        thread.join(LIMIT_S)
    stats = gate.statistics()
    assert (stats.calls_ok, stats.window.inflight) == (2, 0)


def test_a_hint_a_task_got_holds_the_threads_too() -> None:
    """A yield seen by an async call holds sync callers of the same Gate until
    the hint has passed: one set of hint holds for both drivers."""
    hint_s = 0.2
    # One yield, then the async call gives up at once: the hold stays for the others.
    gate = fixed(4, retry=RetryPolicy(max_yields=0, hint_jitter=0.0))
    yielded_at: list[float] = []

    async def refused() -> Outcome:
        yielded_at.append(time.monotonic())
        return Outcome.yielded(hint_s=hint_s)

    async def yield_once() -> None:
        with pytest.raises(Exception, match="congested"):
            await gate.call(refused)

    anyio.run(yield_once)
    sent_at: list[float] = []

    def later() -> str:
        sent_at.append(time.monotonic())
        return "later"

    assert gate.call_sync(later) == "later"
    assert sent_at[0] - yielded_at[0] >= hint_s  # held, not sent at once
    stats = gate.statistics()
    assert (stats.attempts, stats.yields) == (2, 1)


def test_sync_and_async_callers_share_one_window_under_load() -> None:
    gate = fixed(2)
    lock = threading.Lock()
    inflight = 0
    peak = 0

    def enter() -> None:
        nonlocal inflight, peak
        with lock:
            inflight += 1
            peak = max(peak, inflight)

    def leave() -> None:
        nonlocal inflight
        with lock:
            inflight -= 1

    def sync_attempt() -> str:
        enter()
        time.sleep(0.002)
        leave()
        return "sync"

    async def async_attempt() -> str:
        enter()
        await anyio.sleep(0.002)
        leave()
        return "async"

    async def main() -> list[Any]:
        async with anyio.create_task_group() as tg:
            for _ in range(4):
                tg.start_soon(
                    anyio.to_thread.run_sync,
                    lambda: gate.map_sync(lambda _: sync_attempt(), range(10), concurrency=2),
                )
            results = await gate.map(lambda _: async_attempt(), range(30), concurrency=8)
        return results

    results = anyio.run(main)
    assert results == ["async"] * 30
    assert peak <= 2
    stats = gate.statistics()
    assert (stats.calls_ok, stats.window.inflight, stats.window.waiting) == (70, 0, 0)
