"""No error a Gate raises has a cycle in its chain of ``__cause__`` and ``__context__``.

Each way a call can end in an error is driven on the three drivers (asyncio,
trio, ``call_sync``) under virtual time, and the error's whole chain walked
(``tests/chains.py``). The transports' and the official clients' errors are
walked in tests/transports/test_error_chains.py.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from tests.chains import assert_acyclic
from tests.gate.test_drivers import Script, answers, call
from yieldgate import (
    AttemptTimeoutError,
    BreakerPolicy,
    CallFailedError,
    CircuitOpenError,
    DeadlineExceededError,
    Gate,
    GatePolicy,
    Outcome,
    RetriesExhaustedError,
    RetryBudgetExhaustedError,
    RetryBudgetPolicy,
    RetryPolicy,
    TimeoutPolicy,
    YieldExhaustedError,
)
from yieldgate.gate import NullInstrumentation


@pytest.fixture(params=["asyncio", "trio", "sync"])
def driver(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def ended_with(driver: str, policy: GatePolicy, *steps: tuple[str, Any, dict[str, Any]]) -> Any:
    """The last step's error, its chain walked (every step's is)."""
    s = Script(driver, policy)
    s.run(list(steps))
    for result in s.results:
        if isinstance(result, BaseException):
            assert_acyclic(result)
    return s.results[-1]


def raises(error: BaseException) -> Any:
    def classify(value: Any, exc: BaseException | None) -> Outcome:
        raise error

    return classify


def test_a_fatal_error(driver: str) -> None:
    error = ended_with(driver, GatePolicy(), call(answers(ValueError("bad request"))))
    assert isinstance(error, CallFailedError)


def test_retries_exhausted_by_one_error_raised_on_every_attempt(driver: str) -> None:
    reset = ConnectionResetError("reset")  # the same instance each time
    error = ended_with(driver, GatePolicy(), call(answers(*[reset] * 4)))
    assert isinstance(error, RetriesExhaustedError)
    assert error.__cause__ is reset


def test_yields_and_overloads_exhausted(driver: str) -> None:
    policy = GatePolicy(retry=RetryPolicy(max_yields=2))
    overload = Outcome.overloaded(0.1, error=RuntimeError("503"))
    error = ended_with(
        driver,
        policy,
        call(answers(*[Outcome.yielded(hint_s=0.1)] * 3)),
        call(answers(*[overload] * 3)),
    )
    assert isinstance(error, YieldExhaustedError)


def test_the_deadline_and_the_retry_budget(driver: str) -> None:
    policy = GatePolicy(budget=RetryBudgetPolicy(ratio=0.0, min_per_s=0.0))
    s = Script(driver, policy)
    s.run(
        [
            call(answers(Outcome.yielded(hint_s=30.0)), timeout=5.0),
            call(answers(ConnectionResetError("reset"), "never")),
        ]
    )
    deadline, budget = s.results
    assert isinstance(deadline, DeadlineExceededError)
    assert isinstance(budget, RetryBudgetExhaustedError)
    assert_acyclic(deadline)
    assert_acyclic(budget)


def test_an_open_circuit(driver: str) -> None:
    policy = GatePolicy(
        retry=RetryPolicy(max_attempts=1), breaker=BreakerPolicy(fail_max=1, reset_timeout_s=10)
    )
    down = ConnectionResetError("down")
    error = ended_with(driver, policy, call(answers(down)), call(answers("not sent")))
    assert isinstance(error, CircuitOpenError)


def test_a_classifier_that_raises_or_returns_no_outcome(driver: str) -> None:
    def junk(value: Any, exc: BaseException | None) -> Any:
        return "not an outcome"

    first = ended_with(
        driver, GatePolicy(), call(answers(ValueError("x")), classify=raises(KeyError("hook")))
    )
    assert isinstance(first, KeyError)
    second = ended_with(driver, GatePolicy(), call(answers(ValueError("x")), classify=junk))
    assert isinstance(second, TypeError)


on_both_loops = pytest.mark.anyio


def gate(policy: GatePolicy) -> Gate:
    return Gate(policy, instrumentation=NullInstrumentation(), clock=anyio.current_time)


@on_both_loops
async def test_attempt_timeouts_and_a_deadline_during_an_attempt() -> None:
    async def forever() -> None:
        await anyio.sleep_forever()

    timeouts = gate(
        GatePolicy(
            retry=RetryPolicy(max_attempts=2), timeout=TimeoutPolicy(attempt_s=1, total_s=None)
        )
    )
    with pytest.raises(RetriesExhaustedError) as exhausted:
        await timeouts.call(forever)
    assert isinstance(exhausted.value.__cause__, AttemptTimeoutError)
    assert_acyclic(exhausted.value)
    deadline = gate(GatePolicy(timeout=TimeoutPolicy(attempt_s=None, total_s=1)))
    with pytest.raises(DeadlineExceededError) as exceeded:
        await deadline.call(forever)
    assert_acyclic(exceeded.value)


@on_both_loops
async def test_a_call_cancelled_during_its_attempt_or_its_wait() -> None:
    g = gate(GatePolicy())
    caught: list[BaseException] = []
    started = anyio.Event()

    async def forever() -> None:
        started.set()
        await anyio.sleep_forever()

    async def waits() -> Outcome:
        return Outcome.yielded(hint_s=60.0)

    for fn in (forever, waits):
        started = anyio.Event()
        async with anyio.create_task_group() as tg:

            async def one(fn: Any = fn) -> None:
                try:
                    await g.call(fn)
                except anyio.get_cancelled_exc_class() as exc:
                    caught.append(exc)
                    raise

            tg.start_soon(one)
            if fn is forever:
                await started.wait()
            else:
                await anyio.sleep(1)  # virtual: the call is waiting out its 60 s hint
            tg.cancel_scope.cancel()
    assert len(caught) == 2
    for exc in caught:
        assert_acyclic(exc)


@on_both_loops
async def test_a_call_of_the_same_gate_inside_an_attempt_that_fails() -> None:
    g = gate(GatePolicy(retry=RetryPolicy(max_attempts=2)))

    async def inner() -> None:
        raise ConnectionResetError("inner")

    async def outer() -> None:
        await g.call(inner)

    with pytest.raises(RetriesExhaustedError) as exhausted:
        await g.call(outer)
    assert_acyclic(exhausted.value)
