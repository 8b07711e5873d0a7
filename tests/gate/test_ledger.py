"""Issue 28, the ledger: nothing held when nothing runs, whatever ended a call.

Regression tests written before the fix, one per bug, each as a user's code
would meet it: a classifier that returns the wrong type, a telemetry hook that
raises, a call admitted too late to finish, a high-priority call stuck behind
low ones at the rate cap, a call cancelled at the Gate's periodic checkpoint.
Each ends with ``held(gate) == []`` where it can (tests/gate/holdings.py).
They run on virtual time, on asyncio and trio (tests/gate/conftest.py).
"""

from __future__ import annotations

import functools
import logging
import random
from typing import Any

import anyio
import httpx
import pytest

from tests.gate.holdings import held
from tests.gate.hooks import Hooks
from yieldgate import (
    DeadlineExceededError,
    Gate,
    GatePolicy,
    Priority,
    RatePolicy,
    WindowPolicy,
)
from yieldgate.dialects import OPENAI
from yieldgate.gate import (
    NullInstrumentation,
)

pytestmark = pytest.mark.anyio


def gate(instrumentation: Any = None, **policy: Any) -> Gate:
    return Gate(
        GatePolicy(**policy),
        name="ledger",
        instrumentation=instrumentation or NullInstrumentation(),
        rng=random.Random(5),
    )


async def answer(value: Any = "ok", seconds: float = 0.0) -> Any:
    if seconds:
        await anyio.sleep(seconds)
    return value


def broken_once(broken: str | None = None) -> Hooks:
    """Hooks that raise ``HookFailed`` the first time ``broken`` (a hook's name) is called."""
    return Hooks(lambda hook, n: hook == broken and n == 1)


def logged(caplog: pytest.LogCaptureFixture, text: str) -> bool:
    """Whether a record of the ``yieldgate`` logger (or a child) mentions ``text``."""
    for record in caplog.records:
        if record.name == "yieldgate" or record.name.startswith("yieldgate."):
            shown = record.getMessage() + (
                "" if record.exc_info is None else repr(record.exc_info[1])
            )
            if text in shown:
                return True
    return False


# -- 1. a classifier that returns a plain value ------------------------------------------


async def test_a_classifier_returning_a_plain_value_fails_its_call_and_holds_nothing() -> None:
    """Bug 1: a classifier that returns a plain value instead of an Outcome made
    CallState.end raise before releasing, so after ``limit`` such calls nobody was admitted."""
    g = gate(window=WindowPolicy.fixed(2))

    def sloppy(value: Any, error: BaseException | None) -> Any:
        return value  # should have been Outcome.ok(value)

    errors: list[Exception] = []
    for _ in range(3):
        try:
            await g.call(answer, classify=sloppy)
        except Exception as exc:
            errors.append(exc)
    with anyio.move_on_after(5) as scope:
        good = await g.call(answer, "good")
    assert not scope.cancelled_caught, "a good call was never admitted after the bad ones"
    assert good == "good"
    assert len(errors) == 3
    assert all(isinstance(e, TypeError) for e in errors), errors
    assert held(g) == []


# -- 2. telemetry hooks that raise -----------------------------------------------------------


async def test_a_window_change_hook_that_raises_neither_fails_a_call_nor_strands_waiters(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Bug 2: on_window_change raising inside Window.release freed the slot but woke no
    waiter (the hook ran before _wake), and failed the call that released it."""
    caplog.set_level(logging.DEBUG, logger="yieldgate")
    hooks = broken_once(broken="on_window_change")
    # Slow start from one slot: the first success grows the window, and tells the hook.
    g = gate(hooks, window=WindowPolicy(initial=1, max=4))
    results: list[Any] = [None] * 3

    async def one(i: int) -> None:
        try:
            results[i] = await g.call(answer, i, 1.0)
        except Exception as exc:
            results[i] = exc

    with anyio.move_on_after(60) as scope:
        async with anyio.create_task_group() as tg:
            for i in range(3):
                tg.start_soon(one, i)
    assert not scope.cancelled_caught, f"waiting calls were never woken: {results}"
    assert results == [0, 1, 2]
    assert hooks.heard["on_window_change"] >= 1
    assert logged(caplog, "on_window_change is broken")
    assert held(g) == []


@pytest.mark.parametrize("hook", ["on_attempt", "on_end"])
async def test_a_call_hook_that_raises_neither_fails_a_hold_nor_keeps_its_slot(
    hook: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Bug 2: on_attempt or on_end raising failed the call, and under ``hold`` lost the
    slot it was to hand over (a window of one then admitted nobody)."""
    caplog.set_level(logging.DEBUG, logger="yieldgate")
    hooks = broken_once(broken=hook)
    g = gate(hooks, window=WindowPolicy.fixed(1))
    failure: Exception | None = None
    inside = None
    try:
        async with g.hold(answer, "held") as value:
            inside = value
    except Exception as exc:
        failure = exc
    with anyio.move_on_after(5) as scope:
        after = await g.call(answer, "after")
    assert not scope.cancelled_caught, f"the next call was never admitted (hold: {failure!r})"
    assert failure is None, f"the hook's error failed the call: {failure!r}"
    assert (inside, after) == ("held", "after")
    assert logged(caplog, f"{hook} is broken")
    assert held(g) == []


# -- 3. admitted too late ----------------------------------------------------------------


def ratelimited(value: str = "ok") -> httpx.Response:
    """An OpenAI-style reply with its request quota in the headers (plenty left)."""
    return httpx.Response(
        200,
        json={"value": value},
        headers={
            "x-ratelimit-limit-requests": "10000",
            "x-ratelimit-remaining-requests": "9990",
            "x-ratelimit-reset-requests": "60s",
        },
    )


async def test_a_call_admitted_too_late_to_finish_gives_back_its_quota_claim() -> None:
    """Bug 3: a call that waited for a slot and had less time left than an attempt takes
    gave back its window slot and breaker ticket, but its quota claim stayed pending for ever."""
    g = gate(window=WindowPolicy.fixed(1))

    async def reply(seconds: float) -> httpx.Response:
        await anyio.sleep(seconds)
        return ratelimited()

    # Teaches the Gate the quota (from the headers) and the latency (about 1 s).
    await g.call(reply, 1.0, classify=OPENAI, timeout=30)
    late: list[Exception] = []

    async def too_late() -> None:
        try:
            await g.call(reply, 1.0, classify=OPENAI, timeout=5.5)
        except DeadlineExceededError as exc:
            late.append(exc)

    async with anyio.create_task_group() as tg:
        tg.start_soon(functools.partial(g.call, reply, 5.0, classify=OPENAI, timeout=30))
        await anyio.sleep(0.1)
        for _ in range(5):
            # Each waits for the one slot until 5 s, then has 0.4 s left: too late.
            tg.start_soon(too_late)
    assert len(late) == 5
    assert held(g) == []


# -- 9. the rate cap -----------------------------------------------------------------------


async def test_a_high_priority_call_goes_before_low_ones_queued_for_the_rate_cap() -> None:
    """Bug 9: the rate cap's queue was first come, first served: a HIGH call waited for a
    token behind every LOW call queued before it."""
    g = gate(rate=RatePolicy(per_s=1.0, burst=1))
    starts: list[str] = []

    async def attempt(name: str) -> str:
        starts.append(name)
        return name

    async with anyio.create_task_group() as tg:
        for i in range(4):
            tg.start_soon(functools.partial(g.call, attempt, f"low{i}", priority=Priority.LOW))
        await anyio.sleep(0.5)
        tg.start_soon(functools.partial(g.call, attempt, "high", priority=Priority.HIGH))
    # low0 took the burst's token at once; the high call is next, at 1 s.
    assert starts.index("high") == 1, starts
    assert held(g) == []


async def test_no_window_slot_is_held_while_waiting_for_a_rate_token() -> None:
    """Bug 9: a call waited for the rate cap's token while holding a window slot, so with a
    window of one a later HIGH call could not even queue for the token ahead of it."""
    g = gate(rate=RatePolicy(per_s=1.0, burst=1), window=WindowPolicy.fixed(1))
    starts: list[tuple[str, float]] = []
    t0 = anyio.current_time()

    async def attempt(name: str) -> str:
        starts.append((name, round(anyio.current_time() - t0, 3)))
        return name

    async with anyio.create_task_group() as tg:
        tg.start_soon(functools.partial(g.call, attempt, "a", priority=Priority.LOW))
        await anyio.sleep(0.1)
        # No token until 1 s: b waits for it.
        tg.start_soon(functools.partial(g.call, attempt, "b", priority=Priority.LOW))
        await anyio.sleep(0.2)
        waiting = g.statistics().window
        tg.start_soon(functools.partial(g.call, attempt, "c", priority=Priority.HIGH))
    assert waiting.inflight == 0, f"{waiting.inflight} slot(s) held while no attempt ran"
    assert [name for name, _ in starts] == ["a", "c", "b"], starts
    assert held(g) == []


# -- 10. a call cancelled at the Gate's periodic checkpoint --------------------------------


async def test_every_call_counted_is_ended_even_when_cancelled_before_it_starts() -> None:
    """Bug 10: the checkpoint every 128th call sat outside the try: a call cancelled there
    was counted in ``calls`` but never ended (neither ok nor failed, no on_end)."""
    hooks = broken_once()
    g = gate(hooks)
    for _ in range(300):
        with anyio.CancelScope() as scope:
            scope.cancel()
            await g.call(answer)
    stats = g.statistics()
    assert stats.calls == stats.calls_ok + stats.calls_failed, (
        f"{stats.calls} calls, {stats.calls_ok} ok, {stats.calls_failed} failed"
    )
    assert hooks.heard.get("on_end", 0) == hooks.heard["start_call"]
    assert held(g) == []
