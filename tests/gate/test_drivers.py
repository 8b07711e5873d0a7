"""The same scenarios on the three drivers: asyncio, trio, and the sync driver.

Each scenario is a sequence of calls whose attempts are plain functions (they
answer at once); the Gate does all the waiting. On asyncio and trio the calls
run under virtual time (``VirtualTimeLoop``, ``MockClock``), on the sync
driver under a virtual timer, so the times below are exact, not measured.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Iterator
from typing import Any

import anyio
import pytest
from trio.testing import MockClock

from tests.vtime import VirtualTimeLoop
from yieldgate import (
    BreakerPolicy,
    CallFailedError,
    CircuitOpenError,
    DeadlineExceededError,
    Gate,
    GatePolicy,
    Outcome,
    QuotaPolicy,
    RatePolicy,
    RetriesExhaustedError,
    RetryBudgetExhaustedError,
    RetryBudgetPolicy,
    RetryPolicy,
    TimeoutPolicy,
    YieldExhaustedError,
    current_attempt,
)
from yieldgate.gate import NullInstrumentation
from yieldgate.gate._sync import Timer

DRIVERS = ["asyncio", "trio", "sync"]


class VirtualTimer(Timer):
    """The sync driver's sleeps and waits on a clock that only they move."""

    def __init__(self) -> None:
        self.t = 0.0

    def now(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += max(0.0, seconds)

    def wait(self, event: threading.Event, seconds: float | None) -> bool:
        if event.is_set():
            return True
        assert seconds is not None, "a single thread would wait for ever"
        self.t += max(0.0, seconds)
        return event.is_set()


class Script:
    """Calls made in order through one Gate on one driver; what each returned or raised."""

    def __init__(self, driver: str, policy: GatePolicy) -> None:
        self.driver = driver
        self.policy = policy
        self.results: list[Any] = []
        self.started: list[float] = []
        self.elapsed = 0.0
        self.gate: Gate | None = None
        self.upstreams: list[str] | None = None

    def run(self, steps: list[tuple[str, Any]]) -> None:
        """Steps: ("call", fn, kwargs) or ("pause", seconds)."""
        if self.driver == "sync":
            timer = VirtualTimer()
            gate = self.gate = self._gate(timer.now)
            gate._timer = timer
            for step in steps:
                if step[0] == "pause":
                    timer.sleep(step[1])
                    continue
                self.started.append(timer.now())
                try:
                    self.results.append(gate.call_sync(step[1], **step[2]))
                except Exception as exc:
                    self.results.append(exc)
            self.elapsed = timer.now()
            return

        async def main() -> None:
            gate = self.gate = self._gate(anyio.current_time)
            start = anyio.current_time()
            for step in steps:
                if step[0] == "pause":
                    await anyio.sleep(step[1])
                    continue
                fn = step[1]

                async def attempt(fn: Callable[[], Any] = fn) -> Any:
                    return fn()

                self.started.append(anyio.current_time() - start)
                try:
                    self.results.append(await gate.call(attempt, **step[2]))
                except Exception as exc:
                    self.results.append(exc)
            self.elapsed = anyio.current_time() - start

        if self.driver == "trio":
            anyio.run(
                main, backend="trio", backend_options={"clock": MockClock(autojump_threshold=0)}
            )
        else:
            anyio.run(main, backend="asyncio", backend_options={"loop_factory": VirtualTimeLoop})

    def _gate(self, clock: Callable[[], float]) -> Gate:
        return Gate(
            self.policy,
            instrumentation=NullInstrumentation(),
            clock=clock,
            upstreams=self.upstreams,
            rng=random.Random(7),  # the same jitter and tie-breaks on every driver
        )


def answers(*values: Any) -> Callable[[], Any]:
    """An attempt function giving each value in turn (an exception is raised)."""
    it: Iterator[Any] = iter(values)

    def fn() -> Any:
        value = next(it)
        if isinstance(value, BaseException):
            raise value
        return value

    return fn


def call(fn: Callable[[], Any], **kwargs: Any) -> tuple[str, Any, dict[str, Any]]:
    return ("call", fn, kwargs)


@pytest.fixture(params=DRIVERS)
def driver(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_a_value_comes_back_from_one_attempt(driver: str) -> None:
    s = Script(driver, GatePolicy())
    s.run([call(answers("hello"))])
    assert s.results == ["hello"]
    assert s.gate is not None
    stats = s.gate.statistics()
    assert (stats.calls, stats.calls_ok, stats.attempts, stats.window.inflight) == (1, 1, 1, 0)


def test_a_yield_is_waited_out_around_its_hint(driver: str) -> None:
    policy = GatePolicy(retry=RetryPolicy(hint_jitter=0.5))
    s = Script(driver, policy)
    s.run([call(answers(Outcome.yielded(hint_s=2.0), "done"))])
    assert s.results == ["done"]
    assert 2.0 <= s.elapsed <= 3.0 + 1e-6
    assert s.gate is not None
    stats = s.gate.statistics()
    assert (stats.attempts, stats.yields, stats.retries) == (2, 1, 1)


def test_network_errors_are_retried_with_backoff_then_give_up(driver: str) -> None:
    policy = GatePolicy(retry=RetryPolicy(max_attempts=3, base_s=0.5))
    s = Script(driver, policy)
    s.run([call(answers(*[ConnectionResetError("reset")] * 3))])
    (error,) = s.results
    assert isinstance(error, RetriesExhaustedError)
    assert error.attempts == 3
    assert isinstance(error.__cause__, ConnectionResetError)
    assert s.elapsed > 0  # two backoff waits


def test_a_fatal_error_ends_the_call_at_once_with_its_cause(driver: str) -> None:
    s = Script(driver, GatePolicy())
    s.run([call(answers(ValueError("bad request")))])
    (error,) = s.results
    assert isinstance(error, CallFailedError)
    assert isinstance(error.__cause__, ValueError)
    assert error.attempts == 1
    assert s.elapsed == 0


def test_yields_past_max_yields_give_up(driver: str) -> None:
    policy = GatePolicy(retry=RetryPolicy(max_yields=3))
    s = Script(driver, policy)
    s.run([call(answers(*[Outcome.yielded(hint_s=0.1)] * 4))])
    (error,) = s.results
    assert isinstance(error, YieldExhaustedError)
    assert error.attempts == 4
    assert error.last_hint_s == 0.1


def test_a_hint_past_the_deadline_gives_up_without_waiting(driver: str) -> None:
    s = Script(driver, GatePolicy())
    s.run([call(answers(Outcome.yielded(hint_s=30.0)), timeout=5.0)])
    (error,) = s.results
    assert isinstance(error, DeadlineExceededError)
    assert isinstance(error, TimeoutError)
    assert s.elapsed < 5.0


def test_an_empty_retry_budget_stops_retries_of_failures(driver: str) -> None:
    policy = GatePolicy(budget=RetryBudgetPolicy(ratio=0.0, min_per_s=0.0))
    s = Script(driver, policy)
    s.run([call(answers(ConnectionResetError("reset"), "never"))])
    (error,) = s.results
    assert isinstance(error, RetryBudgetExhaustedError)
    assert error.attempts == 1


def test_the_breaker_opens_fails_fast_and_probes_after_its_timeout(driver: str) -> None:
    policy = GatePolicy(
        retry=RetryPolicy(max_attempts=1),
        breaker=BreakerPolicy(fail_max=2, reset_timeout_s=10.0),
    )
    s = Script(driver, policy)
    fail = ConnectionResetError("down")
    s.run(
        [
            call(answers(fail)),
            call(answers(fail)),
            call(answers("not sent")),
            ("pause", 10.0),
            call(answers("probe ok")),
        ]
    )
    first, second, refused, probed = s.results
    assert isinstance(first, RetriesExhaustedError)
    assert isinstance(second, RetriesExhaustedError)
    assert isinstance(refused, CircuitOpenError)
    assert refused.attempts == 0
    assert probed == "probe ok"
    assert s.gate is not None
    assert s.gate.statistics().breaker == "closed"


def test_the_rate_cap_paces_attempt_starts(driver: str) -> None:
    s = Script(driver, GatePolicy(rate=RatePolicy(per_s=10.0)))
    s.run([call(answers(i)) for i in range(5)])
    assert s.results == list(range(5))
    assert s.elapsed == pytest.approx(0.4, abs=1e-3)  # the 5th starts 4 intervals after the 1st


def test_a_token_quota_paces_calls_by_their_cost(driver: str) -> None:
    s = Script(driver, GatePolicy(quota=QuotaPolicy(tokens_per_minute=600, learn=False)))
    s.run([call(answers(i), cost=300) for i in range(4)])
    assert s.results == list(range(4))
    # 600 at once, then 300 more every 30 s (10 tokens a second).
    assert s.started == pytest.approx([0.0, 0.0, 0.0, 30.0], abs=1e-3)
    assert s.elapsed == pytest.approx(60.0, abs=1e-3)


def test_the_attempt_sees_its_number_priority_and_time_left(driver: str) -> None:
    seen: list[tuple[int, str, float | None, float | None]] = []

    def fn() -> Any:
        info = current_attempt()
        assert info is not None
        seen.append((info.number, info.priority.value, info.remaining_s(), info.call_remaining_s()))
        return Outcome.yielded(hint_s=1.0) if len(seen) == 1 else "ok"

    policy = GatePolicy(timeout=TimeoutPolicy(attempt_s=5.0, total_s=20.0))
    s = Script(driver, policy)
    s.run([call(fn, priority="high")])
    assert s.results == ["ok"]
    (n1, p1, r1, c1), (n2, p2, r2, c2) = seen
    assert (n1, p1, r1, c1) == (1, "high", 5.0, 20.0)
    assert (n2, p2, r2) == (2, "high", 5.0)
    assert c2 is not None
    assert c2 <= 20.0 - 1.0  # the hint's second has gone from the call's time


def test_a_set_fails_over_to_the_upstream_that_answers(driver: str) -> None:
    seen: list[str | None] = []

    def fn() -> Any:
        info = current_attempt()
        assert info is not None
        seen.append(info.upstream)
        if info.upstream == "a":
            raise ConnectionResetError("a is down")
        return f"from {info.upstream}"

    policy = GatePolicy(breaker=BreakerPolicy(fail_max=1))
    s = Script(driver, policy)
    s.upstreams = ["a", "b"]
    s.run([call(fn) for _ in range(20)])
    assert s.results == ["from b"] * 20
    # Tried once (an upstream not yet measured gets traffic), then its breaker is open.
    assert seen.count("a") == 1
    assert s.gate is not None
    by_name = {u.name: u for u in s.gate.statistics().upstreams}
    assert by_name["a"].breaker == "open"


def test_a_custom_classifier_turns_a_value_into_a_yield(driver: str) -> None:
    def classify(value: Any, error: BaseException | None) -> Outcome:
        if value == "busy":
            return Outcome.yielded(hint_s=0.5, value=value)
        return Outcome.ok(value)

    s = Script(driver, GatePolicy())
    s.run([call(answers("busy", "busy", "free"), classify=classify)])
    assert s.results == ["free"]
    assert s.gate is not None
    assert s.gate.statistics().yields == 2
    assert s.elapsed >= 1.0


def test_a_sync_call_interrupted_in_its_retry_wait_refunds_the_budget_and_holds_nothing() -> None:
    # The sync counterpart of a cancelled call: KeyboardInterrupt during the backoff.
    class Interrupted(VirtualTimer):
        def sleep(self, seconds: float) -> None:
            raise KeyboardInterrupt

    timer = Interrupted()
    gate = Gate(instrumentation=NullInstrumentation(), clock=timer.now)
    gate._timer = timer
    before = gate.statistics().retry_allowance
    with pytest.raises(KeyboardInterrupt):
        gate.call_sync(answers(ConnectionResetError("reset"), "never"))
    stats = gate.statistics()
    # Its request counted (ratio x 1); the retry it drew and never sent went back.
    assert stats.retry_allowance == pytest.approx(before + gate.policy.budget.ratio)
    assert (stats.window.inflight, stats.window.waiting, stats.calls_failed) == (0, 0, 1)
