"""The Gate: composition of deadline, breaker, rate cap, window, attempt, retry.

Every test runs on virtual time (see conftest.py): waits and timeouts are real
anyio waits that complete instantly.
"""

from __future__ import annotations

import functools
import gc
import itertools
import random
import weakref
from typing import Any

import anyio
import pytest

from yieldgate import (
    AttemptTimeoutError,
    BreakerPolicy,
    CallFailedError,
    CircuitOpenError,
    DeadlineExceededError,
    Gate,
    GateClosedError,
    GatePolicy,
    Outcome,
    RatePolicy,
    RetriesExhaustedError,
    RetryBudgetExhaustedError,
    RetryBudgetPolicy,
    RetryPolicy,
    TimeoutPolicy,
    TransportError,
    WindowPolicy,
    YieldExhaustedError,
    YieldgateError,
    current_attempt,
)
from yieldgate.gate import NullInstrumentation, Signal
from yieldgate.protocol import Priority

pytestmark = pytest.mark.anyio


def gate(**policy: Any) -> Gate:
    return Gate(
        GatePolicy(**policy),
        name="test",
        instrumentation=NullInstrumentation(),
        rng=random.Random(7),
    )


class Script:
    """An attempt function that plays back a list of outcomes, one per attempt."""

    def __init__(self, *steps: Any, duration_s: float = 0.0) -> None:
        self.steps = list(steps)
        self.calls = 0
        self.times: list[float] = []
        self.duration_s = duration_s

    async def __call__(self) -> Any:
        self.calls += 1
        self.times.append(anyio.current_time())
        if self.duration_s:
            await anyio.sleep(self.duration_s)
        step = self.steps.pop(0) if len(self.steps) > 1 else self.steps[0]
        if isinstance(step, BaseException):
            raise step
        return step


# -- the happy path and the public shape ---------------------------------------


async def test_call_returns_the_value() -> None:
    g = gate()

    async def add(a: int, b: int) -> int:
        return a + b

    assert await g.call(add, 2, 3) == 5
    stats = g.statistics()
    assert (stats.calls, stats.calls_ok, stats.attempts, stats.retries) == (1, 1, 1, 0)


async def test_keyword_arguments_go_through_partial() -> None:
    async def greet(name: str, *, punct: str) -> str:
        return name + punct

    assert await gate().call(functools.partial(greet, "hi", punct="!")) == "hi!"


async def test_wrap_decorator() -> None:
    g = gate()

    @g.wrap
    async def double(x: int) -> int:
        return 2 * x

    @g.wrap(priority="high", timeout=5)
    async def triple(x: int) -> int:
        assert current_attempt() is not None
        return 3 * x

    assert (await double(4), await triple(4)) == (8, 12)
    assert double.__name__ == "double"
    assert g.statistics().calls == 2


async def test_closed_gate_refuses() -> None:
    g = gate()
    async with g:
        pass
    with pytest.raises(GateClosedError):
        await g.call(Script(1))
    with pytest.raises(GateClosedError, match="cannot be reused"):
        async with g:
            pass


async def test_bad_timeout_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="timeout"):
        await gate().call(Script(1), timeout=0)


# -- yields are congestion, not failure -----------------------------------------


async def test_yield_is_waited_out_around_the_hint() -> None:
    script = Script(Outcome.yielded(2.0), Outcome.yielded(1.0), "done")
    g = gate(retry=RetryPolicy(hint_jitter=0.5))
    assert await g.call(script) == "done"
    gaps = [b - a for a, b in zip(script.times, script.times[1:], strict=False)]
    assert 2.0 <= gaps[0] <= 3.0
    assert 1.0 <= gaps[1] <= 1.5
    stats = g.statistics()
    assert (stats.yields, stats.retries, stats.failures) == (2, 2, 0)


async def test_yields_never_open_the_breaker_nor_spend_the_budget() -> None:
    g = gate(
        breaker=BreakerPolicy(fail_max=2),
        budget=RetryBudgetPolicy(ratio=0.0, min_per_s=0.0),
        retry=RetryPolicy(max_yields=100),
    )
    script = Script(*([Outcome.yielded(0.01)] * 50), "ok")
    assert await g.call(script) == "ok"
    stats = g.statistics()
    assert (stats.breaker, stats.yields) == ("closed", 50)


async def test_yields_shrink_the_window() -> None:
    g = gate(window=WindowPolicy(initial=8, max=8, decrease=0.5))
    await g.call(Script(Outcome.yielded(0.01), "ok"))
    assert g.statistics().window.limit == 4


async def test_endless_yields_end_in_yield_exhausted() -> None:
    g = gate(retry=RetryPolicy(max_yields=5))
    script = Script(Outcome.yielded(0.1, "saturated"))
    with pytest.raises(YieldExhaustedError) as info:
        await g.call(script)
    err = info.value
    assert (err.attempts, script.calls) == (6, 6)
    assert err.last_hint_s == pytest.approx(0.1)
    assert err.last_outcome.reason == "saturated"


async def test_a_hint_past_the_deadline_fails_fast() -> None:
    g = gate()
    start = anyio.current_time()
    with pytest.raises(DeadlineExceededError, match="would pass the call's deadline") as info:
        await g.call(Script(Outcome.yielded(60.0)), timeout=10)
    assert anyio.current_time() - start < 1  # did not sleep toward a hopeless wait
    assert info.value.last_hint_s == pytest.approx(60.0)


async def test_overloads_are_congestion_but_spend_the_budget() -> None:
    g = gate(budget=RetryBudgetPolicy(ratio=0.0, min_per_s=0.2, window_s=10))  # 2 retries
    with pytest.raises(RetryBudgetExhaustedError):
        await g.call(Script(Outcome.overloaded(0.1)))
    stats = g.statistics()
    assert (stats.overloads, stats.retries, stats.breaker) == (3, 2, "closed")


async def test_hints_can_be_ignored() -> None:
    script = Script(Outcome.yielded(30.0), "ok")
    g = gate(retry=RetryPolicy(honour_hints=False, base_s=0.1))
    await g.call(script)
    assert script.times[1] - script.times[0] < 0.2


# -- failures -------------------------------------------------------------------


async def test_retryable_failures_are_retried_with_backoff() -> None:
    script = Script(TransportError("reset"), TransportError("reset"), "ok")
    g = gate(retry=RetryPolicy(base_s=0.1, multiplier=2))
    assert await g.call(script) == "ok"
    gaps = [b - a for a, b in zip(script.times, script.times[1:], strict=False)]
    assert 0.05 <= gaps[0] <= 0.1
    assert 0.1 <= gaps[1] <= 0.2
    assert g.statistics().failures == 2


async def test_retries_exhausted_carries_the_cause() -> None:
    g = gate(retry=RetryPolicy(max_attempts=3))
    with pytest.raises(RetriesExhaustedError) as info:
        await g.call(Script(TransportError("reset")))
    assert info.value.attempts == 3
    assert isinstance(info.value.__cause__, TransportError)


async def test_a_server_hint_on_a_failure_is_honoured() -> None:
    script = Script(Outcome.retryable(hint_s=3.0), "ok")
    await gate().call(script)
    assert script.times[1] - script.times[0] >= 3.0


async def test_fatal_is_raised_at_once_with_its_cause() -> None:
    script = Script(ValueError("bad request"))
    with pytest.raises(CallFailedError) as info:
        await gate().call(script)
    assert script.calls == 1
    assert isinstance(info.value.__cause__, ValueError)
    assert info.value.attempts == 1


async def test_fatal_does_not_open_the_breaker() -> None:
    g = gate(breaker=BreakerPolicy(fail_max=2))
    for _ in range(5):
        with pytest.raises(CallFailedError):
            await g.call(Script(ValueError("caller's mistake")))
    assert g.statistics().breaker == "closed"


async def test_the_budget_stops_retry_storms() -> None:
    g = gate(
        retry=RetryPolicy(max_attempts=10, base_s=0.01),
        budget=RetryBudgetPolicy(ratio=0.1, min_per_s=0.0, window_s=60),
        breaker=BreakerPolicy.disabled(),
    )
    script = Script(TransportError("down"))
    for _ in range(100):
        with pytest.raises((RetriesExhaustedError, RetryBudgetExhaustedError)):
            await g.call(script)
    # Without the budget this would be 1,000 attempts; with it, about 1.1 per call.
    assert script.calls <= 100 + 10 + 1


async def test_a_classifier_decides_what_values_mean() -> None:
    def classify(value: Any, error: BaseException | None) -> Outcome:
        if value == 429:
            return Outcome.overloaded(0.5, value=value)
        return Outcome.ok(value)

    script = Script(429, 200)
    assert await gate().call(script, classify=classify) == 200
    assert script.times[1] - script.times[0] >= 0.5


# -- the breaker through the Gate ---------------------------------------------------


async def test_a_failing_backend_opens_the_breaker_and_one_probe_closes_it() -> None:
    g = gate(
        breaker=BreakerPolicy(fail_max=3, reset_timeout_s=5),
        retry=RetryPolicy(max_attempts=1),
    )
    down = Script(TransportError("down"))
    for _ in range(3):
        with pytest.raises(RetriesExhaustedError):
            await g.call(down)
    assert g.statistics().breaker == "open"
    with pytest.raises(CircuitOpenError) as info:
        await g.call(down)
    assert down.calls == 3  # nothing was sent while open
    assert info.value.retry_after_s == pytest.approx(5, abs=0.1)

    await anyio.sleep(5)
    up = Script("ok", duration_s=1.0)
    results: list[Any] = []

    async def caller() -> None:
        try:
            results.append(await g.call(up))
        except CircuitOpenError as exc:
            results.append(exc)

    async with anyio.create_task_group() as tg:
        for _ in range(20):
            tg.start_soon(caller)
    assert up.calls == 1  # a single probe went out
    assert sum(r == "ok" for r in results) == 1
    assert g.statistics().breaker == "closed"
    assert await g.call(up) == "ok"


# -- timeouts and deadlines ---------------------------------------------------------


async def test_attempt_timeout_is_retryable() -> None:
    slow_then_fast = Script("late", duration_s=10.0)

    async def attempt() -> str:
        if slow_then_fast.calls == 0:
            return await slow_then_fast()
        return "fast"

    g = gate(timeouts=TimeoutPolicy(attempt_s=1.0, total_s=60))
    assert await g.call(attempt) == "fast"
    assert g.statistics().failures == 1


async def test_attempt_timeouts_exhaust_into_retries_exhausted() -> None:
    g = gate(timeouts=TimeoutPolicy(attempt_s=1.0, total_s=600), retry=RetryPolicy(max_attempts=2))
    with pytest.raises(RetriesExhaustedError) as info:
        await g.call(Script("never", duration_s=100))
    assert isinstance(info.value.__cause__, AttemptTimeoutError)


async def test_total_deadline_cancels_a_running_attempt() -> None:
    g = gate(timeouts=TimeoutPolicy(attempt_s=None, total_s=3.0))
    start = anyio.current_time()
    with pytest.raises(DeadlineExceededError) as info:
        await g.call(Script("never", duration_s=100))
    assert anyio.current_time() - start == pytest.approx(3.0, abs=0.01)
    assert info.value.attempts == 1
    assert g.statistics().window.inflight == 0


async def test_current_attempt_carries_the_remaining_budget() -> None:
    seen: list[tuple[int, float | None]] = []

    async def attempt() -> Outcome:
        info = current_attempt()
        assert info is not None
        seen.append((info.number, info.remaining_s()))
        return Outcome.ok(1) if info.number == 2 else Outcome.yielded(2.0)

    g = gate(timeouts=TimeoutPolicy(attempt_s=5.0, total_s=20.0))
    await g.call(attempt)
    assert seen[0] == (1, pytest.approx(5.0))  # the attempt timeout binds first
    number, remaining = seen[1]
    assert number == 2
    assert remaining == pytest.approx(5.0)
    assert current_attempt() is None


async def test_remaining_budget_follows_the_call_deadline_near_its_end() -> None:
    seen: list[float | None] = []

    async def attempt() -> Outcome:
        info = current_attempt()
        assert info is not None
        seen.append(info.remaining_s())
        return Outcome.ok(1) if len(seen) == 2 else Outcome.yielded(7.0)

    g = gate(timeouts=TimeoutPolicy(attempt_s=5.0, total_s=10.0), retry=RetryPolicy(hint_jitter=0))
    await g.call(attempt)
    assert seen[1] == pytest.approx(3.0, abs=0.01)  # 10 s total - 7 s spent waiting


# -- the window through the Gate ------------------------------------------------------


async def test_concurrency_never_exceeds_the_window() -> None:
    g = gate(window=WindowPolicy(initial=2, max=5))
    running = 0
    peak = 0

    async def work() -> None:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await anyio.sleep(0.1)
        running -= 1

    async with anyio.create_task_group() as tg:
        for _ in range(50):
            tg.start_soon(g.call, work)
    assert peak == 5
    assert g.statistics().window.limit == 5


async def test_cancellation_returns_the_window_slot() -> None:
    g = gate(window=WindowPolicy.fixed(2))

    async def forever() -> None:
        await anyio.sleep_forever()

    async with anyio.create_task_group() as tg:
        for _ in range(10):
            tg.start_soon(g.call, forever)
        await anyio.sleep(1)
        assert g.statistics().window.inflight == 2
        assert g.statistics().window.waiting == 8
        tg.cancel_scope.cancel()
    stats = g.statistics()
    assert (stats.window.inflight, stats.window.waiting) == (0, 0)
    assert stats.breaker == "closed"  # cancellation is not a failure
    assert await g.call(Script("still works")) == "still works"


async def test_priority_order_through_the_gate() -> None:
    g = gate(window=WindowPolicy.fixed(1))
    order: list[str] = []

    async def job(tag: str) -> None:
        order.append(tag)
        await anyio.sleep(1)

    async with anyio.create_task_group() as tg:
        tg.start_soon(g.call, job, "first")
        await anyio.sleep(0.1)
        for tag, prio in (("low", "low"), ("normal", "normal"), ("high", "high")):
            tg.start_soon(functools.partial(g.call, job, tag, priority=prio))
            await anyio.sleep(0.01)
    assert order == ["first", "high", "normal", "low"]


async def test_hold_keeps_the_slot_until_the_block_exits() -> None:
    g = gate(window=WindowPolicy.fixed(1))
    async with g.hold(Script("value")) as value:
        assert value == "value"
        assert g.statistics().window.inflight == 1
        with anyio.move_on_after(1) as scope:
            await g.call(Script("blocked"))
        assert scope.cancelled_caught
    assert g.statistics().window.inflight == 0
    assert await g.call(Script("free")) == "free"


async def test_hold_after_retries() -> None:
    g = gate(window=WindowPolicy.fixed(1))
    async with g.hold(Script(Outcome.yielded(0.5), "value")) as value:
        assert value == "value"
        assert g.statistics().window.inflight == 1
    assert g.statistics().window.inflight == 0


async def test_call_and_hold_returns_a_lease_released_once() -> None:
    g = gate(window=WindowPolicy(initial=1, min=1, max=4))
    value, lease = await g.call_and_hold(Script("value"))
    assert value == "value"
    assert not lease.released
    assert g.statistics().window.inflight == 1
    lease.release(Signal.SUCCESS)
    lease.release(Signal.FAILURE)  # only the first release counts
    assert lease.released
    stats = g.statistics().window
    assert (stats.inflight, stats.increases, stats.decreases) == (0, 1, 0)


async def test_a_lease_released_as_a_failure_does_not_grow_the_window() -> None:
    g = gate(window=WindowPolicy(initial=1, min=1, max=4))
    _, lease = await g.call_and_hold(Script("value"))
    lease.release(Signal.FAILURE)
    assert g.statistics().window.increases == 0


async def test_call_and_hold_nested_in_an_attempt_gets_an_empty_lease() -> None:
    g = gate(window=WindowPolicy.fixed(1))

    async def inner() -> str:
        return "value"

    async def outer() -> str:
        value, lease = await g.call_and_hold(inner)
        assert lease.released  # the outer attempt owns the slot
        lease.release()
        return str(value)

    with anyio.fail_after(5):
        assert await g.call(outer) == "value"
    assert g.statistics().window.inflight == 0


async def test_a_finished_call_keeps_no_reference_to_its_value() -> None:
    # Timers armed during an attempt hold a copy of its context (and so the
    # call) for a while: the call must let go of what it carried.
    class Big:
        pass

    big = Big()
    ref = weakref.ref(big)
    g = gate(timeouts=TimeoutPolicy(attempt_s=600.0, total_s=None))

    async def fn(payload: Big) -> Big:
        return payload

    result = await g.call(fn, big)
    assert result is big
    del result, big
    gc.collect()
    assert ref() is None


# -- the rate cap through the Gate ------------------------------------------------


async def test_rate_cap_paces_attempts() -> None:
    g = gate(rate=RatePolicy(per_s=10))
    script = Script("ok")
    start = anyio.current_time()
    async with anyio.create_task_group() as tg:
        for _ in range(31):
            tg.start_soon(g.call, script)
    assert anyio.current_time() - start == pytest.approx(3.0, abs=0.2)


async def test_cold_start_yield_restarts_the_rate_ramp() -> None:
    g = gate(rate=RatePolicy(per_s=50, ramp_from_per_s=1, ramp_s=10))
    assert g.statistics().rate_per_s is None  # the ramp starts with the first call
    await g.call(Script("ok"))
    assert g.statistics().rate_per_s == pytest.approx(1, abs=0.01)
    await anyio.sleep(20)
    assert g.statistics().rate_per_s == pytest.approx(50)
    await g.call(Script(Outcome.yielded(0.1, "cold_start"), "ok"))
    rate = g.statistics().rate_per_s
    assert rate is not None
    assert rate < 5


# -- map ------------------------------------------------------------------------------


async def test_map_keeps_order_and_bounds_tasks() -> None:
    g = gate(window=WindowPolicy(initial=4, max=4))
    open_calls = 0
    peak = 0

    async def square(x: int) -> int:
        nonlocal open_calls, peak
        open_calls += 1
        peak = max(peak, open_calls)
        await anyio.sleep(random.Random(x).random())
        open_calls -= 1
        return x * x

    results = await g.map(square, range(40), concurrency=6)
    assert results == [x * x for x in range(40)]
    assert peak <= 4


async def test_map_raises_the_first_failure_or_returns_them() -> None:
    g = gate(retry=RetryPolicy(max_attempts=1))

    async def maybe(x: int) -> int:
        if x == 3:
            raise ValueError("three")
        await anyio.sleep(1)
        return x

    with pytest.raises(CallFailedError):
        await g.map(maybe, range(6))
    results = await g.map(maybe, range(6), return_exceptions=True)
    assert [r for i, r in enumerate(results) if i != 3] == [0, 1, 2, 4, 5]
    assert isinstance(results[3], CallFailedError)
    with pytest.raises(ValueError, match="concurrency"):
        await g.map(maybe, [], concurrency=0)


# -- jitter across many callers ----------------------------------------------------


async def test_a_hundred_callers_with_the_same_hint_spread_out() -> None:
    # Each caller's own hint (not shared): the jitter alone must spread them.
    g = Gate(
        GatePolicy(window=WindowPolicy(initial=100, max=100), retry=RetryPolicy(share_hints=False)),
        instrumentation=NullInstrumentation(),
    )
    returns: list[float] = []

    async def attempt() -> Outcome:
        info = current_attempt()
        assert info is not None
        if info.number == 1:
            return Outcome.yielded(1.0)
        returns.append(anyio.current_time())
        return Outcome.ok(None)

    async with anyio.create_task_group() as tg:
        for _ in range(100):
            tg.start_soon(g.call, attempt)
    spread = max(returns) - min(returns)
    assert min(returns) >= 1.0
    assert spread > 0.4
    assert len({round(t, 4) for t in returns}) > 90


async def test_a_shared_hint_holds_back_the_callers_queued_behind_it() -> None:
    # A cold upstream: yields with a 2 s hint until t=2, then serves. A hundred
    # callers through a window of 2 must not each collect a yield of their own.
    g = Gate(
        GatePolicy(window=WindowPolicy(initial=2, max=8)), instrumentation=NullInstrumentation()
    )
    attempts: list[float] = []

    async def upstream() -> Outcome:
        now = anyio.current_time()
        attempts.append(now)
        await anyio.sleep(0.01)
        if now < 2.0:
            return Outcome.yielded(2.0 - now, reason="cold_start")
        return Outcome.ok(None)

    async with anyio.create_task_group() as tg:
        for _ in range(100):
            tg.start_soon(g.call, upstream)
    assert len(attempts) <= 110
    assert g.statistics().yields <= 10
    assert g.statistics().calls_ok == 100


async def test_a_shared_hint_past_the_deadline_fails_fast() -> None:
    g = Gate(GatePolicy(timeouts=TimeoutPolicy(total_s=0.5)), instrumentation=NullInstrumentation())

    async def cold() -> Outcome:
        return Outcome.yielded(5.0, reason="cold_start")

    with pytest.raises(YieldgateError):
        await g.call(cold)
    started = anyio.current_time()
    with pytest.raises(DeadlineExceededError, match="asked to wait"):
        await g.call(cold)
    assert anyio.current_time() - started < 0.01


async def test_a_low_priority_hint_does_not_hold_back_high_priority() -> None:
    g = Gate(instrumentation=NullInstrumentation())
    calls: list[str] = []

    async def upstream(who: str) -> Outcome:
        calls.append(who)
        if who == "low" and len(calls) == 1:
            return Outcome.yielded(1.0)
        return Outcome.ok(None)

    async with anyio.create_task_group() as tg:
        tg.start_soon(functools.partial(g.call, upstream, "low", priority=Priority.LOW))
        await anyio.sleep(0.1)
        started = anyio.current_time()
        await g.call(upstream, "high", priority=Priority.HIGH)
        assert anyio.current_time() - started < 0.01
        with anyio.move_on_after(0.1):
            await g.call(upstream, "low-2", priority=Priority.LOW)
        assert "low-2" not in calls  # still held back by the low-priority hint


# -- fixes found by review: each pinned ------------------------------------------------


def test_gates_can_be_built_outside_an_event_loop() -> None:
    # Module-level Gates (and @gate.wrap at import time) must work.
    g = Gate(GatePolicy(rate=RatePolicy(per_s=100)), name="module-level")

    @g.wrap
    async def one() -> int:
        return 1

    async def use() -> int:
        return await one()

    assert anyio.run(use) == 1


async def test_a_probe_is_chosen_when_it_can_send_not_while_it_queues() -> None:
    g = gate(window=WindowPolicy.fixed(1), breaker=BreakerPolicy(fail_max=1, reset_timeout_s=5))
    results: dict[str, Any] = {}

    async def ok() -> str:
        return "ok"

    async def caller(tag: str) -> None:
        try:
            results[tag] = await g.call(ok)
        except CircuitOpenError as exc:
            results[tag] = exc

    async with anyio.create_task_group() as tg, g.hold(ok):  # the only slot is busy...
        g._upstreams[0].breaker._cb.open()  # ...when failures elsewhere open the breaker
        await anyio.sleep(5)  # a probe is now due
        tg.start_soon(caller, "first")
        await anyio.sleep(0.1)
        tg.start_soon(caller, "second")
        await anyio.sleep(0.9)
        # Neither claimed the probe while queued, so neither was turned away.
        assert results == {}
        assert g.statistics().breaker == "open"
        # The slot is free: the first sends, probes and closes the breaker.
    assert results == {"first": "ok", "second": "ok"}
    assert g.statistics().breaker == "closed"


async def test_fail_fast_judges_the_hint_not_its_jitter() -> None:
    for seed in range(20):
        g = Gate(GatePolicy(), instrumentation=NullInstrumentation(), rng=random.Random(seed))
        # An 8 s hint with 10 s left fits; jitter up to 12 s is trimmed, not fatal.
        assert await g.call(Script(Outcome.yielded(8.0), "ok"), timeout=10) == "ok"


async def test_no_sleeping_into_a_breaker_that_opened() -> None:
    g = gate(
        breaker=BreakerPolicy(fail_max=2, reset_timeout_s=60),
        retry=RetryPolicy(max_attempts=5),
    )
    start = anyio.current_time()
    with pytest.raises(CircuitOpenError, match="opened while retrying") as info:
        await g.call(Script(TransportError("down")))
    assert info.value.attempts == 2
    assert anyio.current_time() - start < 1  # did not wait for nothing...
    assert g.statistics().retries == 1  # ...nor spend budget: only the first retry did


async def test_attempts_count_only_what_was_sent() -> None:
    g = gate(window=WindowPolicy.fixed(1))

    async def ok() -> str:
        return "ok"

    async with g.hold(ok):
        with pytest.raises(DeadlineExceededError, match="waiting for a window slot") as info:
            await g.call(ok, timeout=1)
    assert info.value.attempts == 0
    assert g.statistics().attempts == 1  # the held call only


async def test_calls_refused_by_the_breaker_do_not_feed_the_budget() -> None:
    g = gate(
        breaker=BreakerPolicy(fail_max=1, reset_timeout_s=600),
        retry=RetryPolicy(max_attempts=1),
        budget=RetryBudgetPolicy(ratio=0.5, min_per_s=0, window_s=60),
    )
    with pytest.raises(RetriesExhaustedError):
        await g.call(Script(TransportError("down")))
    before = g.statistics().retry_allowance
    for _ in range(50):
        with pytest.raises(CircuitOpenError):
            await g.call(Script("never sent"))
    assert g.statistics().retry_allowance == before


async def test_waited_time_is_what_was_waited() -> None:
    g = gate()
    with anyio.move_on_after(1.0):
        await g.call(Script(Outcome.yielded(30.0), "ok"))
    assert g.statistics().waited_s == pytest.approx(1.0, abs=0.01)


async def test_attempt_timeouts_narrow_the_window() -> None:
    g = gate(
        window=WindowPolicy(initial=10, max=10, decrease=0.5),
        timeouts=TimeoutPolicy(attempt_s=1.0, total_s=60),
    )
    script = Script("slow", duration_s=5.0)

    async def attempt() -> str:
        if script.calls == 0:
            return str(await script())
        return "fast"

    assert await g.call(attempt) == "fast"
    assert g.statistics().window.limit == 5


async def test_timeout_none_means_no_limit_and_default_means_the_policy() -> None:
    g = gate(timeouts=TimeoutPolicy(attempt_s=None, total_s=2.0))
    with pytest.raises(DeadlineExceededError):
        await g.call(Script("slow", duration_s=10))
    assert await g.call(Script("slow", duration_s=10), timeout=None) == "slow"


async def test_wrap_and_map_take_classify_and_timeout() -> None:
    def always_ok(value: Any, error: BaseException | None) -> Outcome:
        return Outcome.ok("classified")

    g = gate()

    @g.wrap(classify=always_ok, timeout=5)
    async def boom() -> None:
        raise ValueError("hidden by the classifier")

    assert await boom() == "classified"

    async def item(x: int) -> int:
        await anyio.sleep(x)
        return x

    results = await g.map(item, [0, 10], timeout=5, return_exceptions=True)
    assert results[0] == 0
    assert isinstance(results[1], DeadlineExceededError)
    assert await g.map(item, [1], classify=always_ok) == ["classified"]


async def test_a_call_nested_in_an_attempt_of_the_same_gate_runs_inside_it() -> None:
    g = gate(window=WindowPolicy.fixed(1))
    inner = Script(Outcome.yielded(0.5), "done")

    @g.wrap
    async def through_the_gate() -> Any:
        return await g.call(inner)  # e.g. GovernedClient.submit on a shared Gate

    # map -> wrap -> call: three layers of the same Gate, one slot, no deadlock.
    assert await g.map(lambda _: through_the_gate(), range(3)) == ["done"] * 3
    stats = g.statistics()
    assert stats.calls == 3  # the outer calls only; the inner ones ran within them
    assert stats.yields == 1  # the inner yield reached the outer attempt...
    assert stats.retries == 1  # ...which waited it out


async def test_a_nested_fatal_failure_keeps_its_cause() -> None:
    g = gate()

    async def inner() -> None:
        raise ValueError("bad request")

    async def outer() -> None:
        await g.call(inner)

    with pytest.raises(CallFailedError) as info:
        await g.call(outer)
    assert isinstance(info.value.__cause__, ValueError)


async def test_another_gate_inside_an_attempt_is_a_separate_call() -> None:
    outer_gate, inner_gate = gate(), gate()

    async def outer() -> Any:
        return await inner_gate.call(Script(Outcome.yielded(0.1), "ok"))

    assert await outer_gate.call(outer) == "ok"
    assert inner_gate.statistics().calls == 1
    assert inner_gate.statistics().retries == 1
    assert outer_gate.statistics().retries == 0


async def test_hold_nested_in_an_attempt_of_the_same_gate_does_not_deadlock() -> None:
    g = gate(window=WindowPolicy.fixed(1))

    async def inner() -> str:
        return "value"

    async def outer() -> str:
        async with g.hold(inner) as value:  # e.g. GovernedClient.stream on a shared Gate
            return str(value)

    with anyio.fail_after(5):
        assert await g.call(outer) == "value"


async def test_a_circuit_open_between_attempts_says_when_to_come_back() -> None:
    g = gate(breaker=BreakerPolicy(fail_max=1, reset_timeout_s=10))
    with pytest.raises(CircuitOpenError) as info:
        await g.call(Script(ConnectionResetError()))
    assert info.value.retry_after_s == pytest.approx(10, abs=0.5)


async def test_the_rate_cap_caps_starts_even_behind_the_window() -> None:
    g = gate(rate=RatePolicy(per_s=1), window=WindowPolicy.fixed(5))
    starts: list[float] = []

    async def work() -> None:
        starts.append(anyio.current_time())
        await anyio.sleep(20)

    async with anyio.create_task_group() as tg:
        for _ in range(10):
            tg.start_soon(g.call, work)
    starts.sort()
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    assert min(gaps) >= 0.99  # never two starts in the same instant
