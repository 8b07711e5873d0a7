"""Ctrl-C anywhere, on an event loop: the async entry points strand nothing either.

As test_interrupts.py does for the sync ones: ``call``, ``call_and_hold``,
``hold``, ``map`` and the async HTTP transport (a request, its body read, the
response closed) are interrupted at the n-th line of the Gate's code that
their tasks run (tests/gate/interrupts.py), for every n they reach, while
their call waits for the only window slot, which the loop's main task frees
once the call is parked. The ``KeyboardInterrupt``, raised in a task, goes up
through every ``finally`` of that task and out of the loop, and ``asyncio.run``
cancels the other tasks (the main one, a ``map``'s other workers), as it does
after Ctrl-C. Then, ``asyncio.run`` having raised, the same checks as for the
sync ones (test_interrupts.check).
"""

from __future__ import annotations

import asyncio
import dataclasses
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx2
import pytest

from tests.gate.interrupts import InterruptAt, answer, strides
from tests.gate.test_interrupts import BODY, URL, build, check
from yieldgate import Gate, Outcome, http_client

pytestmark = pytest.mark.counters_may_drift

AsyncEntry = Callable[[Gate, list[bool]], Awaitable[Any]]


async def async_answer() -> str:
    return "ok"


async def item(value: int) -> int:
    return value


async def chunks() -> AsyncIterator[bytes]:
    yield b'{"choices": '
    yield b"[]}"


async def stream(request: httpx2.Request) -> httpx2.Response:
    return httpx2.Response(200, headers={"content-type": "application/json"}, content=chunks())


# -- the entry points, as a caller uses them (``received``: the caller has what it hands out)


async def call(gate: Gate, received: list[bool]) -> Any:
    return await gate.call(async_answer, timeout=30)


async def call_and_hold(gate: Gate, received: list[bool]) -> Any:
    value, lease = await gate.call_and_hold(async_answer, timeout=30)
    received.append(True)
    lease.release()
    return value


async def hold(gate: Gate, received: list[bool]) -> Any:
    async with gate.hold(async_answer, timeout=30) as value:
        received.append(True)
    return value


async def map_(gate: Gate, received: list[bool]) -> Any:
    assert await gate.map(item, [1, 2, 3], concurrency=2, timeout=30) == [1, 2, 3]
    return "ok"


async def http_async(gate: Gate, received: list[bool]) -> Any:
    async with http_client(gate, inner=httpx2.MockTransport(stream)) as client:
        response = await client.send(client.build_request("POST", URL, json=BODY), stream=True)
        received.append(True)
        try:
            body = await response.aread()
        finally:
            await response.aclose()
    assert body == b'{"choices": []}'
    return "ok"


def interrupted(
    gate: Gate, n: int, entry: AsyncEntry, *, free: bool = False
) -> tuple[InterruptAt, list[Any], list[bool]]:
    """``entry`` run as a task of its own under ``asyncio.run``, interrupted at the
    ``n``-th line of watched code run by any task but the loop's main one; its call
    waits for the only slot (held from outside the loop, freed by the main task once
    the call is parked: a task that waits for the slot is suspended there), or with
    ``free`` finds it free."""
    lease = gate.call_and_hold_sync(answer)[1]
    if free:
        lease.release()
    outcome: list[Any] = []
    received: list[bool] = []
    main: list[asyncio.Task[Any]] = []

    def traced() -> bool:
        try:
            task = asyncio.current_task()
        except RuntimeError:  # no loop running
            return False
        return task is not None and task not in main

    tracer = InterruptAt(gate, n, only=traced)

    async def run() -> Any:
        main.append(asyncio.current_task())  # type: ignore[arg-type]
        target = asyncio.create_task(entry(gate, received))
        while not (gate.statistics().window.waiting or target.done()):  # noqa: ASYNC110
            await asyncio.sleep(0)  # one turn of the loop: the task runs until it parks
        lease.release()
        return await target

    sys.settrace(tracer)
    try:
        outcome.append(asyncio.run(run()))
    except BaseException as exc:  # the interrupt, out of the loop
        outcome.append(exc)
    finally:
        sys.settrace(None)
        lease.release()  # the main task was cancelled before it freed the slot
        main.clear()  # with it, the entry's task and what its frames hold
    return tracer, outcome, received


def sweep(entry: AsyncEntry, *, quota: bool = False, every: int = 1) -> int:
    """Interrupt ``entry`` at each of its lines (or ``every`` so many); how many it has."""
    for _ in range(2):  # the first builds what is built once (a transport's class)
        gate = build(0, quota=quota)
        counted, outcome, received = interrupted(gate, 0, entry)
        check(gate, counted, outcome, received, "not interrupted")
    lines = counted.lines
    for n in strides(lines, every):
        gate = build(n, quota=quota)
        tracer, outcome, received = interrupted(gate, n, entry)
        assert tracer.fired, f"line {n} of {lines} never reached"
        check(gate, tracer, outcome, received, f"interrupted at line {n} of {lines}")
    return lines


@pytest.mark.parametrize("quota", [False, True], ids=["plain", "quota"])
def test_call_survives_an_interrupt_at_any_line(quota: bool) -> None:
    assert sweep(call, quota=quota) > 50


async def express(gate: Gate, received: list[bool]) -> Any:
    return await gate.call(async_answer)  # the policy's timeout, no cost: the express lane


async def retried(gate: Gate, received: list[bool]) -> Any:
    """A first answer that is not a plain success: handed to a call, which retries."""
    answers = iter([Outcome.retryable(TimeoutError("slow")), "ok"])

    async def answer_next() -> Any:
        return next(answers)

    return await gate.call(answer_next)


@pytest.mark.parametrize("entry", [express, retried])
def test_the_express_lane_survives_an_interrupt_at_any_line(entry: AsyncEntry) -> None:
    """As the sync lane's sweep (test_interrupts.py): a call that takes the lane, and
    one handed to a call midway, strand nothing whatever line is interrupted."""
    counted = None
    for _ in range(2):
        gate = quick(0)
        counted, outcome, _ = interrupted(gate, 0, entry, free=True)
        check(gate, counted, outcome, [], "not interrupted")
    assert counted is not None
    for n in range(1, counted.lines + 1):
        gate = quick(n)
        tracer, outcome, received = interrupted(gate, n, entry, free=True)
        assert tracer.fired, f"line {n} of {counted.lines} never reached"
        check(gate, tracer, outcome, received, f"interrupted at line {n} of {counted.lines}")


def quick(n: int) -> Gate:
    """``build``'s Gate, its retries' backoff a millisecond (the sweep waits it out)."""
    gate = build(n, quota=False)
    policy = gate.policy
    gate.policy = gate._core.policy = dataclasses.replace(
        policy, retry=dataclasses.replace(policy.retry, base_s=0.001, max_backoff_s=0.001)
    )
    return gate


@pytest.mark.parametrize("quota", [False, True], ids=["plain", "quota"])
def test_call_and_hold_survives_an_interrupt_at_any_line(quota: bool) -> None:
    assert sweep(call_and_hold, quota=quota) > 50


def test_hold_survives_an_interrupt_at_any_line() -> None:
    assert sweep(hold) > 50


# Workers a task group cancelled before they started (asyncio.run cancels them all).
@pytest.mark.filterwarnings("ignore:coroutine .* was never awaited:RuntimeWarning")
def test_map_survives_an_interrupt_in_any_of_its_tasks_at_any_line() -> None:
    """Its workers' tasks and its own: one in its task group's body comes out of
    ``map`` as a group of the interrupt alone (anyio's task group wraps it)."""
    assert sweep(map_) > 100


def test_the_async_http_transport_survives_an_interrupt_at_any_line() -> None:
    """A request, its body read and the response closed, through ``http_client``."""
    assert sweep(http_async) > 100
