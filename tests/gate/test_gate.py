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
    HedgePolicy,
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
    # (Hints this short are backed off from the second retry on: twelve fit the deadline.)
    script = Script(*([Outcome.yielded(0.01)] * 12), "ok")
    assert await g.call(script) == "ok"
    stats = g.statistics()
    assert (stats.breaker, stats.yields) == ("closed", 12)


async def test_a_yield_sheds_one_slot_and_an_overload_cuts_the_window() -> None:
    # A yield says exactly "one too many"; an overload may have cost the upstream work.
    g = gate(window=WindowPolicy(initial=8, max=8, decrease=0.5))
    await g.call(Script(Outcome.yielded(0.01), "ok"))
    assert g.statistics().window.limit == 7
    g = gate(window=WindowPolicy(initial=8, max=8, decrease=0.5))
    await g.call(Script(Outcome.overloaded(0.01), "ok"))
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
    # A single probe went out; the other callers waited for its verdict (their
    # deadlines had room) instead of failing, and went once it had closed the breaker.
    probe_at = up.times[0]
    assert all(t >= probe_at + 1.0 for t in up.times[1:])
    assert results == ["ok"] * 20
    assert g.statistics().breaker == "closed"
    assert await g.call(up) == "ok"


# -- timeouts and deadlines ---------------------------------------------------------


async def test_attempt_timeout_is_retryable() -> None:
    slow_then_fast = Script("late", duration_s=10.0)

    async def attempt() -> str:
        if slow_then_fast.calls == 0:
            return await slow_then_fast()
        return "fast"

    g = gate(timeout=TimeoutPolicy(attempt_s=1.0, total_s=60))
    assert await g.call(attempt) == "fast"
    assert g.statistics().failures == 1


async def test_attempt_timeouts_exhaust_into_retries_exhausted() -> None:
    g = gate(timeout=TimeoutPolicy(attempt_s=1.0, total_s=600), retry=RetryPolicy(max_attempts=2))
    with pytest.raises(RetriesExhaustedError) as info:
        await g.call(Script("never", duration_s=100))
    assert isinstance(info.value.__cause__, AttemptTimeoutError)


async def test_total_deadline_cancels_a_running_attempt() -> None:
    g = gate(timeout=TimeoutPolicy(attempt_s=None, total_s=3.0))
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

    g = gate(timeout=TimeoutPolicy(attempt_s=5.0, total_s=20.0))
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

    g = gate(timeout=TimeoutPolicy(attempt_s=5.0, total_s=10.0), retry=RetryPolicy(hint_jitter=0))
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


async def test_a_cancellation_as_the_attempt_times_out_still_cancels_the_call() -> None:
    # The attempt's deadline and an outer scope end at the same instant: the
    # call is cancelled, not turned into a time-out and retried.
    g = gate(timeout=TimeoutPolicy(attempt_s=1.0, total_s=None))
    attempts = 0

    async def slow() -> None:
        nonlocal attempts
        attempts += 1
        await anyio.sleep(5)

    with anyio.move_on_after(1.0) as scope:
        await g.call(slow)
    assert scope.cancelled_caught
    assert attempts == 1
    stats = g.statistics()
    assert (stats.window.inflight, stats.retries, stats.calls_failed) == (0, 0, 1)
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
    g = gate(timeout=TimeoutPolicy(attempt_s=600.0, total_s=None))

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


@pytest.mark.parametrize("share_hints", [False, True])
async def test_a_hundred_callers_with_the_same_hint_spread_out(share_hints: bool) -> None:
    # Not shared, each caller's own jittered wait spreads them; shared (the default),
    # the hold releases them one by one over the same jitter.
    # (A fixed window: an adaptive one would shed a slot per refusal, and let the
    # retries through one by one, spread by slow start rather than by the jitter.)
    g = Gate(
        GatePolicy(window=WindowPolicy.fixed(100), retry=RetryPolicy(share_hints=share_hints)),
        instrumentation=NullInstrumentation(),
    )
    returns: list[float] = []

    async def attempt() -> Outcome:
        info = current_attempt()
        assert info is not None
        if info.number == 1:
            return Outcome.yielded(1.0)
        returns.append(anyio.current_time())
        # Busy a while: no completion clocks an admission within the jitter.
        await anyio.sleep(1.0)
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
    g = Gate(GatePolicy(timeout=TimeoutPolicy(total_s=0.5)), instrumentation=NullInstrumentation())

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
        g._core.upstreams[0].breaker._cb.open()  # ...when failures elsewhere open the breaker
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
        # The attempts take time: one started at the deadline itself would fail.
        script = Script(Outcome.yielded(8.0), "ok", duration_s=0.5)
        assert await g.call(script, timeout=10) == "ok"


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
        timeout=TimeoutPolicy(attempt_s=1.0, total_s=60),
    )
    script = Script("slow", duration_s=5.0)

    async def attempt() -> str:
        if script.calls == 0:
            return str(await script())
        return "fast"

    assert await g.call(attempt) == "fast"
    assert g.statistics().window.limit == 5


async def test_timeout_none_means_no_limit_and_default_means_the_policy() -> None:
    g = gate(timeout=TimeoutPolicy(attempt_s=None, total_s=2.0))
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


# -- issue 16: the promise kept under fire ---------------------------------------------
# Each test here failed on the Gate before the fix it pins; the item number is the
# issue's.


async def test_item3_calls_from_tasks_an_attempt_spawned_are_calls_of_their_own() -> None:
    # A fan-out inside an attempt ran all 20 inner calls at once against a window
    # of 2, with no retries (an inner yield became a fatal ExceptionGroup).
    g = gate(window=WindowPolicy.fixed(2))
    running = peak = 0
    tries: dict[int, int] = {}

    async def inner(i: int) -> Outcome:
        nonlocal running, peak
        tries[i] = tries.get(i, 0) + 1
        if tries[i] == 1 and i % 5 == 0:
            return Outcome.yielded(0.05)  # retried by the inner call itself
        running += 1
        peak = max(peak, running)
        await anyio.sleep(0.1)
        running -= 1
        return Outcome.ok(i)

    async def fan_out() -> list[int]:
        results: list[int] = []

        async def one(i: int) -> None:
            results.append(await g.call(inner, i))

        async with anyio.create_task_group() as tg:
            for i in range(20):
                tg.start_soon(one, i)
        return sorted(results)

    assert await g.call(fan_out) == list(range(20))
    assert peak == 1  # the outer call holds one of the two slots
    stats = g.statistics()
    assert (stats.calls, stats.calls_ok, stats.yields) == (21, 21, 4)
    assert stats.window.inflight == 0


async def test_a_nested_call_in_the_same_task_still_runs_inside_its_attempt() -> None:
    g = gate(window=WindowPolicy.fixed(1))

    async def inner() -> str:
        return "inner"

    async def outer() -> str:
        return str(await g.call(inner))  # same task: no second slot (it would deadlock)

    with anyio.fail_after(5):
        assert await g.call(outer) == "inner"
    assert g.statistics().calls == 1


async def test_item4_a_retry_trimmed_to_the_deadline_keeps_time_for_its_attempt() -> None:
    # Hint 0.16 s, total 0.2 s: the jittered wait used to be trimmed to the deadline
    # itself, and the attempt sent then had no time left (11 of 20 seeds failed).
    for seed in range(20):
        g = Gate(GatePolicy(), instrumentation=NullInstrumentation(), rng=random.Random(seed))
        script = Script(Outcome.yielded(0.16), "ok", duration_s=0.01)
        assert await g.call(script, timeout=0.2) == "ok", seed
        assert script.times[1] >= script.times[0] + 0.01 + 0.16  # never before the hint


async def test_item4_a_private_wait_is_trimmed_the_same_way() -> None:
    for seed in range(20):
        g = Gate(
            GatePolicy(retry=RetryPolicy(share_hints=False)),
            instrumentation=NullInstrumentation(),
            rng=random.Random(seed),
        )
        script = Script(Outcome.yielded(0.16), "ok", duration_s=0.01)
        assert await g.call(script, timeout=0.2) == "ok", seed


async def test_no_attempt_starts_once_the_deadline_has_passed() -> None:
    g = gate(window=WindowPolicy.fixed(1))
    sent: list[float] = []

    async def attempt() -> str:
        sent.append(anyio.current_time())
        await anyio.sleep(0.01)
        return "ok"

    async def holder() -> None:
        async with g.hold(attempt):
            await anyio.sleep(1.0)

    async with anyio.create_task_group() as tg:
        tg.start_soon(holder)
        await anyio.sleep(0.1)
        with pytest.raises(DeadlineExceededError):
            await g.call(attempt, timeout=0.9)  # the slot frees at 1.0 s: too late
    assert len(sent) == 1  # the holder's only


async def test_item5_the_caller_that_got_the_yield_goes_first_and_the_rest_in_order() -> None:
    # Calls arriving during a hold slept to its exact end, and the call that got the
    # yield (sleeping hint x (1 + U)) was admitted last of all.
    g = gate(window=WindowPolicy.fixed(32))
    retried: list[str] = []

    async def upstream(tag: str) -> Outcome:
        info = current_attempt()
        assert info is not None
        if tag == "first" and info.number == 1:
            return Outcome.yielded(1.0)
        retried.append(tag)
        return Outcome.ok(tag)

    async with anyio.create_task_group() as tg:
        tg.start_soon(g.call, upstream, "first")
        for i in range(10):
            await anyio.sleep(0.05)
            tg.start_soon(g.call, upstream, f"later {i}")
    assert retried == ["first"] + [f"later {i}" for i in range(10)]


async def test_item5_held_callers_are_released_spread_over_the_jitter_not_at_once() -> None:
    ends: list[float] = []
    for seed in range(5):
        g = Gate(
            GatePolicy(window=WindowPolicy.fixed(64)),
            instrumentation=NullInstrumentation(),
            rng=random.Random(seed),
        )
        sent: list[tuple[float, int]] = []
        start = anyio.current_time()

        async def upstream(
            i: int, sent: list[tuple[float, int]] = sent, start: float = start
        ) -> Outcome:
            info = current_attempt()
            assert info is not None
            now = anyio.current_time()
            if now - start < 0.5 and info.number == 1:
                return Outcome.yielded(1.0)
            sent.append((now, i))
            await anyio.sleep(1.0)  # no completion clocks an admission within the jitter
            return Outcome.ok(None)

        async with anyio.create_task_group() as tg:
            for i in range(40):
                tg.start_soon(g.call, upstream, i)
                await anyio.sleep(0.001)
        times = [t - start for t, _ in sent]
        assert min(times) >= 1.0  # never before the hint
        assert max(times) <= 1.5 + 0.04  # all within the hint's jitter (50%)
        assert max(times) - min(times) > 0.2  # spread, not one wave
        assert len({round(t, 6) for t in times}) > 30
        assert [i for _, i in sent] == list(range(40))  # in their order
        ends.append(max(times))
    assert len({round(e, 6) for e in ends}) == 5  # the spread differs from seed to seed


async def test_item5_a_success_admits_a_held_caller_before_the_hold_ends() -> None:
    # Completion clocking: a success on the upstream is evidence of a free slot.
    g = gate(window=WindowPolicy.fixed(4))
    starts: dict[str, list[float]] = {}

    async def upstream(tag: str) -> Outcome:
        starts.setdefault(tag, []).append(anyio.current_time())
        if tag == "long":
            await anyio.sleep(1.0)
            return Outcome.ok(tag)
        if len(starts[tag]) == 1 and tag == "refused":
            return Outcome.yielded(5.0)  # a pessimistic hint
        return Outcome.ok(tag)

    async with anyio.create_task_group() as tg:
        tg.start_soon(g.call, upstream, "long")
        await anyio.sleep(0.1)
        tg.start_soon(g.call, upstream, "refused")
    assert starts["refused"][1] == pytest.approx(1.0, abs=0.01)  # when "long" completed


@pytest.mark.parametrize("seed", range(4))
async def test_item5_a_simulated_governed_server_is_never_idle_while_calls_wait(
    seed: int,
) -> None:
    # The demo's shape: 8 slots, a quarter of the work long (0.4 s) and the rest
    # short (0.05 s), and a Governor's honest but rough hint (the mean execution
    # time less the elapsed, for the soonest slot). Calls held to a hint's end
    # while short work drained left the server idle with calls waiting.
    g = Gate(GatePolicy(), instrumentation=NullInstrumentation(), rng=random.Random(seed))
    rng = random.Random(seed)
    mean = 0.25 * 0.4 + 0.75 * 0.05
    running: list[tuple[float, float]] = []  # (start, end) of the executions in flight
    idle_while_waiting: list[float] = []
    work = 0.0
    done = 0

    async def server() -> Outcome:
        nonlocal work
        now = anyio.current_time()
        running[:] = [s for s in running if s[1] > now]
        if len(running) >= 8:
            return Outcome.yielded(min(max(mean - (now - s[0]), 0.1 * mean) for s in running))
        duration = 0.4 if rng.random() < 0.25 else 0.05
        work += duration
        running.append((now, now + duration))
        await anyio.sleep(duration)
        return Outcome.ok(None)

    async def watch() -> None:
        while done < 160:
            now = anyio.current_time()
            if not any(s[1] > now for s in running) and now > 0.05:
                idle_while_waiting.append(now)
            await anyio.sleep(0.005)

    async def one() -> None:
        nonlocal done
        await g.call(server)
        done += 1

    start = anyio.current_time()
    async with anyio.create_task_group() as tg:
        tg.start_soon(watch)
        for _ in range(160):
            tg.start_soon(one)
    makespan = anyio.current_time() - start
    assert idle_while_waiting == []
    assert makespan <= 1.2 * work / 8  # the long tail of the last long jobs included
    assert g.statistics().attempts <= 1.1 * 160


async def test_item6_a_tiny_hint_is_backed_off_like_a_zero_hint() -> None:
    # retry-after-ms: 0.001 gave 65 attempts in 0.13 s.
    script = Script(Outcome.yielded(1e-6))
    with pytest.raises(YieldgateError):
        await gate().call(script, timeout=1.0)
    assert script.calls <= 6


async def test_item6_fifty_callers_told_to_come_back_now_do_not_storm() -> None:
    # 50 calls against retry-after: 0 made 3,250 requests in 4.8 s.
    script = Script(Outcome.yielded(0.0))
    g = gate(window=WindowPolicy.fixed(64))

    async def one() -> None:
        with pytest.raises(YieldgateError):
            await g.call(script, timeout=5.0)

    async with anyio.create_task_group() as tg:
        for _ in range(50):
            tg.start_soon(one)
    assert script.calls <= 50 * 9


async def test_a_first_retry_still_honours_a_short_hint_exactly() -> None:
    script = Script(Outcome.yielded(0.002), "ok")
    assert await gate(retry=RetryPolicy(hint_jitter=0)).call(script) == "ok"
    assert script.times[1] - script.times[0] == pytest.approx(0.002, abs=1e-4)


async def test_item8_a_classifier_that_raises_raises_the_same_without_and_with_hedging() -> None:
    def broken(value: Any, error: BaseException | None) -> Outcome:
        raise KeyError("a bug in the classifier")

    async def attempt() -> str:
        await anyio.sleep(0.01)
        return "value"

    for policy in (GatePolicy(), GatePolicy(hedge=HedgePolicy.fixed(0.005))):
        g = Gate(policy, instrumentation=NullInstrumentation())
        with pytest.raises(KeyError, match="a bug in the classifier"):
            await g.call(attempt, classify=broken)
        assert g.statistics().window.inflight == 0


def test_item9_statistics_work_outside_an_event_loop() -> None:
    g = Gate(
        GatePolicy(rate=RatePolicy(per_s=10)),
        name="health",
        instrumentation=NullInstrumentation(),
    )
    multi = Gate(upstreams=["a", "b"], instrumentation=NullInstrumentation())
    script = Script(Outcome.yielded(0.05), "ok")

    async def use() -> None:
        await g.call(script)
        await multi.call(Script("ok"))

    anyio.run(use)
    stats = g.statistics()  # after the loop is gone, as a sync health check would
    assert (stats.calls_ok, stats.yields) == (1, 1)
    assert stats.rate_per_s == 10
    assert stats.retry_allowance > 0
    assert len(multi.statistics().upstreams) == 2


async def test_item10_a_retry_that_was_never_sent_goes_back_to_the_budget() -> None:
    # The retry was withdrawn when it was decided, and kept when the call then
    # stopped before it could send it (here: its deadline passed in the window queue).
    g = gate(
        window=WindowPolicy.fixed(1),
        budget=RetryBudgetPolicy(ratio=0.0, min_per_s=0.3, window_s=10),  # 3 retries
    )
    before = g.statistics().retry_allowance
    script = Script(TransportError("reset"), "never sent")

    async def caller() -> None:
        with pytest.raises(DeadlineExceededError, match="window slot"):
            await g.call(script, timeout=1.0)

    async with anyio.create_task_group() as tg:
        tg.start_soon(caller)
        await anyio.sleep(0.01)  # its first attempt failed; it is backing off
        async with g.hold(Script("held")):  # and now the only slot is taken
            await anyio.sleep(2.0)
    assert script.calls == 1
    assert g.statistics().retry_allowance == before


async def test_item10_callers_behind_a_half_open_probe_wait_for_its_verdict() -> None:
    g = gate(
        breaker=BreakerPolicy(fail_max=1, reset_timeout_s=5), retry=RetryPolicy(max_attempts=1)
    )
    with pytest.raises(RetriesExhaustedError):
        await g.call(Script(TransportError("down")))
    await anyio.sleep(5)  # a probe is due
    probe = Script(TransportError("still down"), duration_s=1.0)
    outcomes: list[Any] = []

    async def caller() -> None:
        try:
            outcomes.append(await g.call(probe, timeout=10))
        except YieldgateError as exc:
            outcomes.append(exc)

    async with anyio.create_task_group() as tg:
        for _ in range(5):
            tg.start_soon(caller)
    # The probe failed: the four behind it learnt so when it did, with when to come back.
    assert probe.calls == 1
    refused = [o for o in outcomes if isinstance(o, CircuitOpenError)]
    assert len(refused) == 4
    assert all(o.retry_after_s == pytest.approx(5, abs=0.1) for o in refused)


async def test_item10_calls_that_never_await_leave_no_pile_of_timers(anyio_backend: Any) -> None:
    # 200,000 such calls left a cancelled deadline timer each on the loop (+136 MB)
    # until the loop got a turn.
    if anyio_backend[0] != "asyncio":
        pytest.skip("reads asyncio's timer heap")
    import asyncio

    g = gate()

    async def instant() -> int:
        return 1

    for _ in range(20_000):
        await g.call(instant)
    scheduled = asyncio.get_running_loop()._scheduled  # type: ignore[attr-defined]
    assert len(scheduled) < 1_000
    # The attempts' deadlines share one timer; their ended entries are swept.
    from yieldgate.gate import _deadlines

    deadlines = _deadlines._LOOPS[asyncio.get_running_loop()]
    assert len(deadlines.heap) <= 2 * _deadlines._SWEEP_AT + 2


async def test_an_enclosing_scope_cancelled_as_the_attempt_times_out_keeps_its_cancellation(
    anyio_backend: Any,
) -> None:
    # The attempt's deadline cancels first; while the attempt's task group winds down
    # (as anyio.connect_tcp's does), the caller's own scope is cancelled too. asyncio
    # folds both into the first CancelledError, the Gate's, which has no message, and
    # anyio keeps it over its own: the caller's scope must still catch it, not let it
    # escape as if the task had been cancelled from outside (which cut bursts short).
    g = gate(timeout=TimeoutPolicy(attempt_s=1.0), retry=RetryPolicy(max_attempts=1))
    outer = anyio.CancelScope()

    async def child() -> None:
        try:
            await anyio.sleep_forever()
        finally:
            outer.cancel()

    async def connect() -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(child)
            await anyio.Event().wait()

    escaped: BaseException | None = None
    try:
        with outer:
            await g.call(connect)
    except BaseException as exc:  # what escapes is the finding
        escaped = exc
    assert escaped is None or isinstance(escaped, YieldgateError), repr(escaped)
    assert outer.cancel_called
    if anyio_backend[0] == "asyncio":
        import asyncio

        task = asyncio.current_task()
        assert task is not None
        assert task.cancelling() == 0
    # The Gate is left as it was: nothing in flight.
    assert g.statistics().window.inflight == 0


async def test_a_call_admitted_with_less_time_left_than_an_attempt_takes_is_not_sent(
    anyio_backend: Any,
) -> None:
    g = gate(window=WindowPolicy(initial=1, min=1, max=1), timeout=TimeoutPolicy(total_s=1.0))
    sent: list[str] = []

    async def work(name: str, seconds: float) -> str:
        sent.append(name)
        await anyio.sleep(seconds)
        return name

    assert await g.call(work, "first", 0.5) == "first"  # an attempt takes about 0.5 s
    results: dict[str, Any] = {}

    async def run(name: str, seconds: float, total: float) -> None:
        try:
            results[name] = await g.call(work, name, seconds, timeout=total)
        except DeadlineExceededError as exc:
            results[name] = exc

    async with anyio.create_task_group() as tg:
        tg.start_soon(run, "a", 0.7, 5.0)  # takes the one slot for 0.7 s
        await anyio.sleep(0.01)
        started = anyio.current_time()
        tg.start_soon(run, "b", 0.5, 1.0)  # its turn comes with 0.3 s left: too late
        await anyio.sleep(0.01)
        tg.start_soon(run, "c", 0.5, 5.0)  # behind it, with time: served at once
    assert results["a"] == "a"
    assert isinstance(results["b"], DeadlineExceededError)
    # The upstream's latency then: 0.5 s, moved by a's 0.7 s.
    assert "0.310 s left, and an attempt takes about 0.540 s" in str(results["b"])
    assert results["c"] == "c"
    assert sent == ["first", "a", "c"]  # b was never sent
    # c went when a ended, not after b's deadline.
    assert anyio.current_time() - started == pytest.approx(0.7 + 0.5, abs=0.05)
    assert g.statistics().window.inflight == 0
