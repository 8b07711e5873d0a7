"""The express lane (``gate/_express.py``): taken exactly where it may be, and a call
that takes it ends as it would on the general path.

``call_sync`` of the plain shape (the policy's timeout, no cost, no telemetry SDK, one
upstream with no quota known, no rate cap, fleet or hedging, a closed breaker and a
free slot) makes and ends its first attempt without a ``CallState``. Every answer that
is not a plain success is handed to a call midway. Each script below runs twice, on a
Gate whose calls take the lane and on one whose calls cannot (their timeout given
explicitly, equal to the policy's), and both must return, raise and count the same.
The interrupt sweeps of the lane are in test_interrupts.py.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.gate.test_drivers import VirtualTimer
from yieldgate import (
    CallFailedError,
    Gate,
    GatePolicy,
    Outcome,
    Priority,
    QuotaPolicy,
    RatePolicy,
    WindowPolicy,
)
from yieldgate.gate import HedgePolicy, NullInstrumentation, _express

TOTAL_S = GatePolicy().timeout.total_s


class Stop(BaseException):
    """Not an ``Exception``: what a KeyboardInterrupt or a SystemExit from the function is."""


def gate(policy: GatePolicy | None = None, **kwargs: Any) -> Gate:
    timer = VirtualTimer()
    built = Gate(policy or GatePolicy(), name="express", clock=timer.now, **kwargs)
    built._timer = timer
    return built


@pytest.fixture
def lane(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """What each call's try of the lane answered (``admit``: taken, or not)."""
    taken: list[bool] = []
    admit = _express.admit

    def counted(*args: Any) -> bool:
        got = admit(*args)
        taken.append(got)
        return got

    monkeypatch.setattr(_express, "admit", counted)
    return taken


def ok() -> str:
    return "ok"


def test_a_default_gates_call_sync_takes_the_lane(lane: list[bool]) -> None:
    g = gate()
    assert [g.call_sync(ok) for _ in range(3)] == ["ok"] * 3
    assert lane == [True, True, True]
    s = g.statistics()
    assert (s.calls, s.calls_ok, s.calls_failed, s.attempts) == (3, 3, 0, 3)
    assert s.window.inflight == 0
    assert g._core.upstreams[0].latency.ewma_s is not None  # what ``begin`` reads


@pytest.mark.parametrize(
    "call",
    [
        pytest.param(lambda g: g.call_sync(ok, timeout=5), id="a timeout"),
        pytest.param(lambda g: g.call_sync(ok, cost=3), id="a cost"),
        pytest.param(lambda g: g.call_sync(ok, priority="high"), id="a priority by name"),
    ],
)
def test_a_call_with_its_own_terms_takes_the_general_path(
    lane: list[bool], call: Callable[[Gate], Any]
) -> None:
    g = gate()
    assert call(g) == "ok"
    assert lane == []
    assert g.statistics().calls_ok == 1


@pytest.mark.parametrize(
    "build",
    [
        pytest.param(lambda: gate(GatePolicy(rate=RatePolicy(per_s=1000))), id="rate cap"),
        pytest.param(lambda: gate(GatePolicy(hedge=HedgePolicy(delay_s=1.0))), id="hedging"),
        pytest.param(lambda: gate(upstreams=["a", "b"]), id="two upstreams"),
    ],
)
def test_a_gate_of_another_shape_takes_the_general_path(
    lane: list[bool], build: Callable[[], Gate]
) -> None:
    g = build()
    assert g.call_sync(ok) == "ok"
    assert lane == []


def test_a_taken_slot_or_a_known_quota_sends_the_call_down_the_general_path(
    lane: list[bool],
) -> None:
    g = gate(GatePolicy(window=WindowPolicy.fixed(1)))
    with g.hold_sync(ok):  # the only slot (the general path: a hold)
        pass
    assert lane == []
    g = gate(GatePolicy(quota=QuotaPolicy(requests_per_minute=600)))
    assert g.call_sync(ok) == "ok"
    assert lane == [False]  # the lane looked, took nothing, and the call went on
    assert g.statistics().calls == 1  # counted once


def test_a_telemetry_observer_keeps_the_call_on_the_general_path(lane: list[bool]) -> None:
    started: list[str] = []

    class Counting(NullInstrumentation):
        def start_call(self, gate: str, priority: str) -> Any:
            started.append(gate)
            return Observer()

    class Observer:
        def scope(self) -> Any:
            import contextlib

            return contextlib.nullcontext()

        def on_attempt(self, details: Any) -> None:
            pass

        def on_wait(self, details: Any) -> None:
            pass

        def on_end(self, details: Any) -> None:
            pass

    g = gate(instrumentation=Counting())
    assert g.call_sync(ok) == "ok"
    assert lane == []
    assert started == ["express"]  # asked once, though the lane asked first


# -- the same script on both paths ---------------------------------------------------------


def answers(*steps: Any) -> Callable[[], Any]:
    """A function answering ``steps`` in turn: a value is returned, an exception raised."""
    it: Iterator[Any] = iter(steps)

    def fn() -> Any:
        step = next(it)
        if isinstance(step, BaseException):
            raise step
        return step

    return fn


def bad_classifier(value: Any, error: BaseException | None) -> Any:
    return "not an outcome"


async def later() -> str:
    return "late"


Script = list[tuple[Callable[[], Any], Any]]
SCRIPTS: dict[str, Callable[[], Script]] = {
    "ok": lambda: [(answers("a"), None), (answers(None), None)],
    "ok with a reason": lambda: [(answers(Outcome(Outcome.ok().kind, "v", None, "partial")), None)],
    "fatal": lambda: [(answers(ValueError("bad")), None)],
    "retried, then ok": lambda: [(answers(TimeoutError("slow"), "b"), None)],
    "yielded, then ok": lambda: [(answers(Outcome.yielded(0.5), Outcome.yielded(0.1), "c"), None)],
    "overloaded, then fatal": lambda: [(answers(Outcome.overloaded(0.2), KeyError("k")), None)],
    "retries spent": lambda: [(answers(*[TimeoutError("slow")] * 10), None)],
    "a classifier's TypeError": lambda: [(answers("x"), bad_classifier)],
    "a coroutine returned": lambda: [(lambda: later(), None)],
    "a BaseException": lambda: [(answers(Stop()), None), (answers("after"), None)],
}


def run(g: Gate, script: Script, general: bool) -> list[Any]:
    results: list[Any] = []
    for fn, classify in script:
        try:
            if general:
                value = g.call_sync(fn, classify=classify, timeout=TOTAL_S)
            else:
                value = g.call_sync(fn, classify=classify)
            results.append(("value", value))
        except Stop:
            results.append(("raised", "Stop"))
        except CallFailedError as exc:
            results.append(("raised", type(exc).__name__, type(exc.__cause__).__name__))
        except Exception as exc:
            results.append(("raised", type(exc).__name__))
    return results


def counts(g: Gate) -> tuple[Any, ...]:
    s = g.statistics()
    return (
        s.calls, s.calls_ok, s.calls_failed, s.attempts, s.yields, s.overloads, s.failures,
        s.retries, s.window.inflight, s.window.limit, s.breaker,
    )  # fmt: skip


@pytest.mark.filterwarnings("ignore:coroutine .* was never awaited")
@pytest.mark.parametrize("name", list(SCRIPTS))
def test_a_call_ends_as_on_the_general_path(lane: list[bool], name: str) -> None:
    express, general = gate(), gate()
    got = run(express, SCRIPTS[name](), general=False)
    taken = list(lane)
    assert run(general, SCRIPTS[name](), general=True) == got
    assert lane == taken  # the general gate's calls never looked at the lane
    assert taken
    assert all(taken)
    assert counts(express) == counts(general)
    assert express._core.audit() == general._core.audit() == []


def test_an_open_breaker_is_seen_by_the_lane(lane: list[bool]) -> None:
    from yieldgate import BreakerPolicy, CircuitOpenError, RetriesExhaustedError, RetryPolicy

    policy = GatePolicy(
        breaker=BreakerPolicy(fail_max=1, reset_timeout_s=60.0),
        retry=RetryPolicy(max_attempts=1),
    )
    g = gate(policy)
    with pytest.raises(RetriesExhaustedError):
        g.call_sync(answers(TimeoutError("down")))
    with pytest.raises(CircuitOpenError):
        g.call_sync(ok)
    assert lane == [True, False]


def test_priority_is_kept_on_the_lane(lane: list[bool]) -> None:
    seen: list[Priority] = []

    def where() -> str:
        from yieldgate import current_attempt

        attempt = current_attempt()
        assert attempt is not None
        seen.append(attempt.priority)
        return "ok"

    g = gate()
    g.call_sync(where, priority=Priority.LOW)
    assert seen == [Priority.LOW]
    assert lane == [True]


# -- the async lane --------------------------------------------------------------------------


def async_of(fn: Callable[[], Any]) -> Callable[[], Any]:
    async def call() -> Any:
        value = fn()
        if hasattr(value, "__await__"):
            return await value
        return value

    return call


async def run_async(g: Gate, script: Script, general: bool) -> list[Any]:
    results: list[Any] = []
    for fn, classify in script:
        try:
            if general:
                value = await g.call(async_of(fn), classify=classify, timeout=TOTAL_S)
            else:
                value = await g.call(async_of(fn), classify=classify)
            results.append(("value", value))
        except Stop:
            results.append(("raised", "Stop"))
        except CallFailedError as exc:
            results.append(("raised", type(exc).__name__, type(exc.__cause__).__name__))
        except Exception as exc:
            results.append(("raised", type(exc).__name__))
    return results


ASYNC_SCRIPTS = [
    name for name in SCRIPTS if name not in ("a coroutine returned", "a BaseException")
]


@pytest.mark.anyio
@pytest.mark.parametrize("name", ASYNC_SCRIPTS)
async def test_an_async_call_ends_as_on_the_general_path(lane: list[bool], name: str) -> None:
    express, general = Gate(name="express"), Gate(name="general")
    got = await run_async(express, SCRIPTS[name](), general=False)
    taken = list(lane)
    assert await run_async(general, SCRIPTS[name](), general=True) == got
    assert lane == taken
    assert taken
    assert all(taken)
    assert counts(express) == counts(general)
    assert express._core.audit() == general._core.audit() == []


def slow_once() -> Callable[[], Any]:
    """A function whose first call sleeps 5 s, and whose later calls answer at once."""
    import anyio

    calls = iter([True, False])

    async def slow() -> str:
        if next(calls):
            await anyio.sleep(5)
        return "done"

    return slow


@pytest.mark.anyio
@pytest.mark.parametrize("total_s", [None, 0.5], ids=["attempt timeout", "call timeout"])
async def test_an_async_attempt_cut_at_its_deadline_ends_as_on_the_general_path(
    lane: list[bool], total_s: float | None
) -> None:
    """The lane's attempt runs under the attempt's and the call's deadlines: cut by
    its own it is retried, cut by the call's the call fails, as on the general path."""
    from yieldgate import TimeoutPolicy

    policy = GatePolicy(timeout=TimeoutPolicy(attempt_s=1.0, total_s=total_s))
    results = []
    for general in (False, True):
        g = Gate(policy, name="cut")

        slow = slow_once()

        try:
            if general:
                got: Any = await g.call(slow, timeout=total_s)
            else:
                got = await g.call(slow)
        except Exception as exc:
            got = type(exc).__name__
        results.append((got, counts(g)))
    assert results[0] == results[1]
    assert lane == [True]
    assert results[0][0] == ("done" if total_s is None else "DeadlineExceededError")
