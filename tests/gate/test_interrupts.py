"""Ctrl-C anywhere: a ``KeyboardInterrupt`` at any line of the Gate's own code strands nothing.

A signal handler's exception lands between any two lines of Python. For a sync
call, this raises ``KeyboardInterrupt`` at the n-th line the Gate's code runs
(a trace function raising it, as the interpreter would), for every n a call
reaches, and checks each time that the Gate holds nothing afterwards. The
call waits for a window slot that another thread frees, and paces by a quota,
so the lines between a grant and its use (issue 28: "a KeyboardInterrupt
landing between a grant and its try leaks the permit") are among them.

What is checked is what the Gate holds (the counters in ``statistics()`` may
miss the end of a call interrupted between counting it and ending it).
Lines run while the Gate's lock is held are skipped: there the Gate changes
several fields in a row, as any Python code does, and no code can be
interrupted halfway through such an update and stay consistent. (A real
signal's handler runs on the main thread; the trace runs on the caller's
thread: the same interruption, made to land where chosen.)
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

from tests.gate.holdings import held
from yieldgate import Gate, GatePolicy, QuotaPolicy, WindowPolicy
from yieldgate.gate import NullInstrumentation
from yieldgate.gate._cost import QuotaReading

GATE_CODE = str(Path(sys.modules["yieldgate.gate"].__file__ or "").parent)


def answer() -> str:
    return "ok"


class InterruptAt:
    """A trace function that raises ``KeyboardInterrupt`` at the ``n``-th line of the
    Gate's code run by this thread while the Gate's lock is free (``n = 0``: never,
    only count them)."""

    def __init__(self, gate: Gate, n: int) -> None:
        self.lock = gate._core.lock
        self.n = n
        self.lines = 0
        self.fired = False

    def __call__(self, frame: FrameType, event: str, arg: Any) -> Any:
        if not frame.f_code.co_filename.startswith(GATE_CODE):
            return None  # no line events in other code
        return self.local

    def local(self, frame: FrameType, event: str, arg: Any) -> Any:
        if event != "line" or self.fired or self.lock.locked():
            return self.local
        self.lines += 1
        if self.lines == self.n:
            self.fired = True
            raise KeyboardInterrupt
        return self.local


def until(check: Any, what: str, timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while not check():
        if time.monotonic() > end:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(0.001)


def scenario(n: int, *, quota: bool) -> tuple[Gate, InterruptAt]:
    """A call that waits for the only slot (held by this thread, released once the
    call waits), interrupted at its ``n``-th line of Gate code."""
    policy = GatePolicy(
        window=WindowPolicy.fixed(1),
        quota=QuotaPolicy(requests_per_minute=6000) if quota else QuotaPolicy(learn=False),
    )
    gate = Gate(
        policy, name=f"ctrl-c-{n}", instrumentation=NullInstrumentation(), clock=time.monotonic
    )
    if quota:
        # A quota learnt from a reading too: the call's claim goes in flight.
        def read() -> str:
            from yieldgate import current_attempt

            attempt = current_attempt()
            assert attempt is not None
            attempt.report_quota((QuotaReading("x:requests", "requests", 1000, 999, 60.0),))
            return "ok"

        gate.call_sync(read)
    _, lease = gate.call_and_hold_sync(answer)
    tracer = InterruptAt(gate, n)
    outcome: list[BaseException | str] = []

    def caller() -> None:
        sys.settrace(tracer)
        try:
            outcome.append(gate.call_sync(answer, timeout=30))
        except BaseException as exc:  # the interrupt, raised to the caller
            outcome.append(exc)
        finally:
            sys.settrace(None)

    thread = threading.Thread(target=caller)
    thread.start()
    until(lambda: gate.statistics().window.waiting == 1 or outcome, "the call waits")
    lease.release()
    thread.join(30)
    assert not thread.is_alive()
    assert len(outcome) == 1
    if tracer.fired:
        assert isinstance(outcome[0], KeyboardInterrupt), outcome
    else:
        assert outcome == ["ok"]
    return gate, tracer


@pytest.mark.counters_may_drift
@pytest.mark.parametrize("quota", [False, True], ids=["plain", "quota"])
def test_an_interrupt_at_any_line_strands_nothing(quota: bool) -> None:
    _, counted = scenario(0, quota=quota)
    lines = counted.lines
    assert lines > 50  # the call ran through the Gate's code: admission, attempt, end
    for n in range(1, lines + 1):
        gate, tracer = scenario(n, quota=quota)
        assert tracer.fired
        assert held(gate) == [], f"interrupted at line {n} of {lines}"
        # (The counters are not checked: an interrupt between counting a call and the
        # ``try`` that ends it leaves it counted and never ended; nothing is held.)
        # And the Gate goes on: a call after the interrupt gets the slot at once.
        assert gate.call_sync(answer, timeout=5) == "ok"
