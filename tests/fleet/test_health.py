"""The circuit to Redis itself, on a clock of the test's own."""

from __future__ import annotations

import logging

import pytest

from yieldgate.fleet._health import Health, Pass


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def make(clock: Clock) -> Health:
    return Health("g", backoff_s=1.0, max_backoff_s=4.0, clock=clock)


def test_a_failure_skips_redis_for_the_back_off() -> None:
    clock = Clock()
    health = make(clock)
    ticket = health.admit()
    assert ticket is Pass.GO
    health.failed(ticket, ConnectionError("refused"))
    assert not health.available
    assert health.admit() is Pass.SKIP
    clock.now += 0.99
    assert health.admit() is Pass.SKIP
    clock.now += 0.01
    trial = health.admit()
    assert trial is Pass.TRIAL
    assert health.admit() is Pass.SKIP  # one trial at a time
    assert (health.calls, health.fallbacks, health.outages) == (5, 4, 1)


def test_the_back_off_doubles_to_its_cap_and_resets_on_rejoining() -> None:
    clock = Clock()
    health = make(clock)
    health.failed(health.admit(), TimeoutError())
    waits = []
    for _ in range(4):
        start = clock.now
        while (ticket := health.admit()) is Pass.SKIP:
            clock.now += 0.25
        waits.append(clock.now - start)
        health.failed(ticket, TimeoutError())
    assert waits == [1.0, 2.0, 4.0, 4.0]
    assert health.outages == 1
    clock.now += 4.0
    health.succeeded(health.admit())
    assert health.available
    assert health.rejoins == 1
    health.failed(health.admit(), TimeoutError())
    assert health.outages == 2
    clock.now += 1.0
    assert health.admit() is Pass.TRIAL  # from 1 s again


def test_failures_of_calls_already_out_do_not_extend_the_back_off() -> None:
    clock = Clock()
    health = make(clock)
    first, second = health.admit(), health.admit()
    health.failed(first, TimeoutError())
    clock.now += 0.5
    health.failed(second, TimeoutError())
    clock.now += 0.5
    assert health.admit() is Pass.TRIAL


def test_an_abandoned_trial_lets_the_next_call_try() -> None:
    clock = Clock()
    health = make(clock)
    health.failed(health.admit(), TimeoutError())
    clock.now += 1.0
    trial = health.admit()
    health.abandoned(trial)
    assert health.admit() is Pass.TRIAL


def test_one_warning_per_outage_and_an_info_on_rejoining(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    health = make(clock)
    with caplog.at_level(logging.INFO, logger="yieldgate.fleet"):
        for _ in range(3):
            health.failed(health.admit(), ConnectionError("refused"))
        clock.now += 1.0
        health.succeeded(health.admit())
    levels = [(r.levelname, r.name) for r in caplog.records]
    assert levels == [("WARNING", "yieldgate.fleet"), ("INFO", "yieldgate.fleet")]
    assert "refused" in caplog.records[0].getMessage()
