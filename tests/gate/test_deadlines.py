"""Issue 28, deadlines: an attempt ends at its deadline, a call's own deadline is
congestion, and the deadline timer keeps nothing alive that has ended.

Regression tests written before the fix. They run on virtual time: on asyncio
(``VirtualTimeLoop``) "the same loop tick" is exact, and the asyncio-only ones
cover the shared deadline timer of src/yieldgate/gate/_deadlines.py (trio uses
cancel scopes).
"""

from __future__ import annotations

import asyncio
import gc
import random
import weakref
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from tests.gate.holdings import held
from tests.vtime import VirtualTimeLoop
from yieldgate import (
    AttemptTimeoutError,
    DeadlineExceededError,
    Gate,
    GatePolicy,
    RetriesExhaustedError,
    RetryPolicy,
    TimeoutPolicy,
    WindowPolicy,
)
from yieldgate.gate import NullInstrumentation

pytestmark = pytest.mark.anyio

ASYNCIO_ONLY = pytest.mark.parametrize(
    "anyio_backend", [pytest.param(("asyncio", {"loop_factory": VirtualTimeLoop}), id="asyncio")]
)


def gate(**policy: Any) -> Gate:
    return Gate(
        GatePolicy(**policy),
        name="deadlines",
        instrumentation=NullInstrumentation(),
        rng=random.Random(11),
    )


class Value:
    """An attempt's value, to follow with a weak reference."""


# -- 5. a deadline that fires in the same tick as another canceller ------------------------


@ASYNCIO_ONLY
async def test_an_attempt_ends_at_its_deadline_though_its_own_scope_expired_that_tick() -> None:
    """Bug 5: an attempt deadline on the shared asyncio timer was skipped when another
    canceller fired in the same loop tick and swallowed its cancellation, so the attempt ran on."""
    g = gate(timeout=TimeoutPolicy(attempt_s=0.5, total_s=None), retry=RetryPolicy(max_attempts=1))
    finished: list[float] = []

    async def attempt() -> str:
        # The attempt's own bound on one step, expiring with the attempt's deadline:
        # 0.3 us before it, so that it is first of the two in the tick both are due.
        with anyio.move_on_after(0.5 - 3e-7):
            await anyio.sleep(10)
        await anyio.sleep(1.6)
        finished.append(anyio.current_time())
        return "late"

    async def busy() -> None:
        # Another task keeps the loop busy as the deadlines come due: each loop tick
        # then takes a virtual microsecond, and one tick handles both timers.
        await anyio.sleep(0.5 - 10.5e-6)
        for _ in range(50):
            await anyio.lowlevel.checkpoint()

    start = anyio.current_time()
    outcome: Any
    async with anyio.create_task_group() as tg:
        tg.start_soon(busy)
        try:
            outcome = await g.call(attempt)
        except RetriesExhaustedError as exc:
            outcome = exc
        elapsed = anyio.current_time() - start
    assert elapsed == pytest.approx(0.5, abs=0.01), f"the 0.5 s attempt ran {elapsed:.2f} s"
    assert finished == []
    assert isinstance(outcome, RetriesExhaustedError), outcome
    assert isinstance(outcome.__cause__, AttemptTimeoutError)
    assert held(g) == []


# -- 6. what the deadline timer keeps alive ------------------------------------------------


async def _one_call(g: Gate) -> Any:
    async def attempt() -> str:
        return "ok"

    return await g.call(attempt)


def test_a_closed_event_loop_is_garbage_once_dropped() -> None:
    """Bug 6: the deadline timer's per-loop table (a WeakKeyDictionary whose values hold
    their key) kept every event loop that ran an attempt alive for ever."""
    g = gate()
    loops: list[weakref.ref[asyncio.AbstractEventLoop]] = []

    def new_loop() -> asyncio.AbstractEventLoop:
        loop = VirtualTimeLoop()
        loops.append(weakref.ref(loop))
        return loop

    assert anyio.run(_one_call, g, backend="asyncio", backend_options={"loop_factory": new_loop})
    (loop,) = loops
    gc.collect()
    assert loop() is None, "the closed loop is still referenced"


@ASYNCIO_ONLY
async def test_a_finished_attempt_keeps_neither_its_task_nor_its_value() -> None:
    """Bug 6: the deadline heap kept each finished attempt's task (and so the task's
    result) until the deadline's time came, 60 s later by default."""
    g = gate()  # attempts time out after 60 s
    start = anyio.current_time()

    async def attempt() -> Value:
        return Value()

    async def in_a_task_of_its_own() -> Value:
        value: Value = await g.call(attempt)
        return value

    task = asyncio.get_running_loop().create_task(in_a_task_of_its_own())
    value = await task
    task_ref, value_ref = weakref.ref(task), weakref.ref(value)
    del task, value
    # The loop's handle that woke this task refers to the other one until this one yields.
    await anyio.lowlevel.checkpoint()
    gc.collect()
    assert anyio.current_time() - start < 1.0  # the attempt's deadline is far ahead
    assert task_ref() is None, "the finished task is still referenced"
    assert value_ref() is None, "the finished task's value is still referenced"


# -- 8. a call's own deadline is congestion --------------------------------------------------


async def test_calls_that_run_out_their_own_deadline_narrow_the_window() -> None:
    """Bug 8: an attempt cut off by its call's total deadline told the window CANCELLED,
    not congestion: against a buffering backend the window never shrank (16 -> 16)."""
    g = gate(window=WindowPolicy(initial=16, max=64))
    errors: list[DeadlineExceededError] = []

    async def buffering() -> str:
        await anyio.sleep(30)  # queued behind the burst, answered far too late
        return "late"

    async def one() -> None:
        try:
            await g.call(buffering, timeout=1.0)
        except DeadlineExceededError as exc:
            errors.append(exc)

    async with anyio.create_task_group() as tg:
        for _ in range(16):
            tg.start_soon(one)
    window = g.statistics().window
    assert len(errors) == 16
    assert window.decreases > 0, window
    assert window.limit < 16, window
    assert held(g) == []
