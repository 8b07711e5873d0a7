"""The breaker wrapper: one probe at a time, stale tickets ignored, neutral endings."""

from __future__ import annotations

import pybreaker
import pytest

from yieldgate import CircuitOpenError
from yieldgate.gate._breaker import AttemptFailure, Breaker, BreakerPolicy, BreakerState, Verdict


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def make(**kw: object) -> tuple[Breaker, Clock, list[tuple[str, str]]]:
    clock = Clock()
    changes: list[tuple[str, str]] = []
    breaker = Breaker(
        BreakerPolicy(**kw),  # type: ignore[arg-type]
        clock,
        on_change=lambda old, new: changes.append((str(old), str(new))),
    )
    return breaker, clock, changes


def fail_times(breaker: Breaker, n: int) -> None:
    for _ in range(n):
        breaker.record(breaker.acquire(), Verdict.FAILURE)


def test_opens_after_fail_max_consecutive_failures() -> None:
    breaker, _, changes = make(fail_max=3)
    fail_times(breaker, 2)
    breaker.record(breaker.acquire(), Verdict.SUCCESS)  # resets the streak
    fail_times(breaker, 2)
    assert breaker.state is BreakerState.CLOSED
    fail_times(breaker, 1)
    assert breaker.state is BreakerState.OPEN
    assert changes == [("closed", "open")]


def test_open_rejects_until_the_reset_timeout() -> None:
    breaker, clock, _ = make(fail_max=1, reset_timeout_s=10)
    fail_times(breaker, 1)
    clock.now += 4
    with pytest.raises(CircuitOpenError) as info:
        breaker.acquire()
    assert info.value.retry_after_s == pytest.approx(6)


def test_half_open_lets_exactly_one_probe_through() -> None:
    breaker, clock, changes = make(fail_max=1, reset_timeout_s=10)
    fail_times(breaker, 1)
    clock.now += 10
    probe = breaker.acquire()
    assert probe.probe
    assert breaker.state is BreakerState.HALF_OPEN
    for _ in range(50):
        with pytest.raises(CircuitOpenError, match="probe"):
            breaker.acquire()
    breaker.record(probe, Verdict.SUCCESS)
    assert breaker.state is BreakerState.CLOSED
    assert changes == [("closed", "open"), ("open", "half-open"), ("half-open", "closed")]
    assert not breaker.acquire().probe


def test_failed_probe_reopens_for_another_timeout() -> None:
    breaker, clock, _ = make(fail_max=1, reset_timeout_s=10)
    fail_times(breaker, 1)
    clock.now += 10
    breaker.record(breaker.acquire(), Verdict.FAILURE)
    assert breaker.state is BreakerState.OPEN
    assert breaker.retry_after_s() == pytest.approx(10)


def test_a_stale_ticket_cannot_close_a_reopened_breaker() -> None:
    breaker, clock, _ = make(fail_max=1, reset_timeout_s=10)
    slow = breaker.acquire()  # a slow call started while closed
    fail_times(breaker, 1)  # meanwhile the breaker opened
    clock.now += 10
    breaker.record(breaker.acquire(), Verdict.FAILURE)  # a probe failed: open again
    breaker.record(slow, Verdict.SUCCESS)  # the slow call finally succeeds
    assert breaker.state is BreakerState.OPEN


def test_a_stale_probe_cannot_close_either() -> None:
    breaker, clock, _ = make(fail_max=1, reset_timeout_s=10)
    fail_times(breaker, 1)
    clock.now += 10
    probe = breaker.acquire()
    breaker._cb.open()  # re-opened by someone else (e.g. a manual trip)
    breaker.record(probe, Verdict.SUCCESS)
    assert breaker.state is BreakerState.OPEN


def test_neutral_endings_count_neither_way_and_free_the_probe() -> None:
    breaker, clock, _ = make(fail_max=2, reset_timeout_s=10)
    for _ in range(10):
        breaker.record(breaker.acquire(), Verdict.NEUTRAL)  # yields, cancellations
    assert breaker.state is BreakerState.CLOSED
    fail_times(breaker, 2)
    clock.now += 10
    probe = breaker.acquire()
    breaker.record(probe, Verdict.NEUTRAL)  # the probe was cancelled: no verdict
    assert breaker.state is BreakerState.HALF_OPEN
    second = breaker.acquire()  # so another caller may probe
    breaker.record(second, Verdict.SUCCESS)
    assert breaker.state is BreakerState.CLOSED


def test_success_threshold_needs_consecutive_probes() -> None:
    breaker, clock, _ = make(fail_max=1, reset_timeout_s=1, success_threshold=2)
    fail_times(breaker, 1)
    clock.now += 1
    breaker.record(breaker.acquire(), Verdict.SUCCESS)
    assert breaker.state is BreakerState.HALF_OPEN
    breaker.record(breaker.acquire(), Verdict.SUCCESS)
    assert breaker.state is BreakerState.CLOSED


def test_disabled_never_opens() -> None:
    breaker = Breaker(BreakerPolicy.disabled(), Clock())
    fail_times(breaker, 100)
    assert breaker.state is BreakerState.CLOSED


def test_policy_validation() -> None:
    for kwargs in ({"fail_max": 0}, {"reset_timeout_s": -1}, {"success_threshold": 0}):
        with pytest.raises(ValueError, match="breaker"):
            BreakerPolicy(**kwargs)  # type: ignore[arg-type]


def test_check_raises_like_acquire_but_changes_nothing() -> None:
    breaker, clock, changes = make(fail_max=1, reset_timeout_s=10)
    breaker.check()  # closed: fine
    fail_times(breaker, 1)
    with pytest.raises(CircuitOpenError):
        breaker.check()
    clock.now += 10
    breaker.check()  # due: would let a probe through...
    assert breaker.state is BreakerState.OPEN  # ...but did not claim it
    probe = breaker.acquire()
    with pytest.raises(CircuitOpenError, match="probe"):
        breaker.check()
    breaker.record(probe, Verdict.SUCCESS)
    assert changes == [("closed", "open"), ("open", "half-open"), ("half-open", "closed")]


def test_pybreaker_keeps_the_record_in_its_storage_and_hears_the_real_errors() -> None:
    storage = pybreaker.CircuitMemoryStorage(pybreaker.STATE_CLOSED)
    breaker = Breaker(BreakerPolicy(fail_max=2), Clock(), storage=storage)
    heard: list[BaseException] = []

    class Listener(pybreaker.CircuitBreakerListener):
        def failure(self, cb: pybreaker.CircuitBreaker, exc: BaseException) -> None:
            heard.append(exc)

    breaker._cb.add_listener(Listener())
    reset = ConnectionResetError("reset by peer")
    breaker.record(breaker.acquire(), Verdict.FAILURE, reset)
    breaker.record(breaker.acquire(), Verdict.FAILURE)  # a failed attempt without an exception
    assert heard[0] is reset
    assert isinstance(heard[1], AttemptFailure)
    assert storage.state == "open"  # pybreaker's own state machine, in its own storage
    assert breaker.state is BreakerState.OPEN
