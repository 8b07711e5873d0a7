"""The sync driver: runs a call's decisions in the calling thread.

The same decisions as the async driver (they are the ``CallState``'s); only
the waiting differs: a thread blocks on a ``threading.Event`` (woken by
whoever frees what it waits for, in any thread or event loop) with a
timeout on the Gate's clock. Deadlines, priorities, holds, the breaker, the
budget and the rate cap all apply, and callers of both drivers share them.

Two differences follow from threads. An attempt cannot be interrupted: a
blocking call is not a coroutine, so the attempt's deadline is handed to
the code it runs (``current_attempt().remaining_s()``, which the transports
pass on as their request timeout) instead of being enforced from outside.
And the hedge policy is ignored (see ``_hedge``).

``Timer`` is how the driver sleeps and waits; tests give it a virtual one.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from yieldgate.gate import _admission as admission
from yieldgate.gate._attempt import CURRENT, Slot
from yieldgate.gate._breaker import Breaker
from yieldgate.gate._call import CallState
from yieldgate.gate._core import GateCore
from yieldgate.gate._outcome import Classifier, Outcome
from yieldgate.gate._retrying import Strategies, needs_retry
from yieldgate.gate._shared import FleetOp
from yieldgate.gate._upstream import Upstream
from yieldgate.gate._window import Permit

__all__ = ["Timer", "run"]

SyncFn = Callable[..., Any]
SyncDiscard = Callable[[Any], None]


class Timer:
    """Real time: ``sleep`` and ``wait`` block the thread for up to ``seconds``."""

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    def wait(self, event: threading.Event, seconds: float | None) -> bool:
        return event.wait(seconds)


class _Driver:
    """One sync call: its state, function and the waits it makes."""

    __slots__ = ("args", "call", "classify", "core", "discard", "fn", "timer")

    def __init__(
        self,
        call: CallState,
        fn: SyncFn,
        args: tuple[Any, ...],
        classify: Classifier,
        discard: SyncDiscard | None,
        timer: Timer,
    ) -> None:
        self.core = call.core
        self.call = call
        self.fn = fn
        self.args = args
        self.classify = classify
        self.discard = discard
        self.timer = timer

    def _block(self, event: threading.Event, until: float | None, while_: str) -> None:
        """Block until ``event`` is set or ``until``; past the call's deadline, raise."""
        clock = self.core.clock
        deadline = self.call.deadline
        limit = until
        if deadline is not None and (limit is None or deadline < limit):
            limit = deadline
        if self.timer.wait(event, None if limit is None else max(0.0, limit - clock())):
            return
        if deadline is not None and limit == deadline and clock() >= deadline:
            raise self.call.deadline_error(while_)

    def verdict(self, breaker: Breaker) -> None:
        event = threading.Event()
        with self.core.lock:
            if not breaker.await_verdict(event.set):
                return
        while not event.is_set():
            self._block(event, None, "waiting for the breaker's probe")

    def acquire(self, up: Upstream, not_after: float | None) -> Permit:
        call, core = self.call, self.core
        window = up.window
        event = threading.Event()
        with core.lock:
            permit: Permit | None = window.try_acquire(call.priority)
            if permit is not None:
                return permit
            waiter = window.enqueue(call.priority, event.set, key=call.started, not_after=not_after)
        try:
            while True:
                with core.lock:
                    wake_at = window.look(waiter)
                    if waiter.permit is not None:
                        return waiter.permit
                    event.clear()
                self._block(event, wake_at, "waiting for a window slot")
        except BaseException:
            with core.lock:
                window.abandon(waiter)
            raise

    def take_rate(self, rate: admission.Pacer, while_: str = "waiting for the rate cap") -> None:
        core = self.core
        event = threading.Event()
        with core.lock:
            if rate.try_take(core.clock()):
                return
            waiter = rate.join(event.set)
        try:
            while True:
                with core.lock:
                    again = None
                    if rate.at_head(waiter):
                        again = rate.take_queued(waiter, core.clock())
                        if again is None:
                            return
                    event.clear()
                self._block(event, again, while_)
        except BaseException:
            with core.lock:
                rate.leave(waiter)
            raise

    def admit(self) -> Slot:
        """Wait, in this thread, for what an attempt needs (``admission.steps``)."""
        if self.core.shared is not None:
            flush(self.core)
        admitting = admission.steps(self.call)
        advance: Callable[[Any], admission.Wait] = admitting.send
        got: Any = None
        while True:
            try:
                wait = advance(got)
            except StopIteration as done:
                slot: Slot = done.value
                return slot
            try:
                got, advance = self.wait(wait), admitting.send
            except BaseException as exc:  # thrown in: the core gives back what it took
                got, advance = exc, admitting.throw

    def wait(self, wait: admission.Wait) -> Any:
        if isinstance(wait, admission.VerdictWait):
            return self.verdict(wait.breaker)
        if isinstance(wait, admission.WindowWait):
            return self.acquire(wait.up, wait.not_after)
        if isinstance(wait, admission.FleetWait):
            return run_fleet_op(self.core, wait.op)  # bounded by the fleet's budget
        if isinstance(wait, admission.SleepWait):
            self._block(threading.Event(), self.core.clock() + wait.seconds, wait.while_)
            return None
        return self.take_rate(wait.rate, wait.while_)

    def send(self, slot: Slot) -> Outcome:
        return _send(self.call, slot, self.fn, self.args, self.classify)

    def round(self) -> Outcome:
        return self.send(self.admit())

    def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            return  # the hold in the window is the wait: queue there at once
        clock = self.core.clock
        started = clock()
        try:
            self.timer.sleep(seconds)
        finally:
            with self.core.lock:
                self.core.counters.waited_s += clock() - started

    def run(self, first: Outcome | None) -> Any:
        """The call from its first outcome (``None``: not sent yet) to its end."""
        call = self.call
        outcome = first if first is not None else self.send(self.admit())
        if needs_retry(outcome):
            strategies = Strategies(call)
            wait = strategies.first_wait(outcome)
            if wait is not None:
                self.sleep(wait)
                outcome = strategies.retrying(self.sleep)(self.round)
        return call.finish(outcome)


def run(
    call: CallState,
    fn: SyncFn,
    args: tuple[Any, ...],
    classify: Classifier,
    discard: SyncDiscard | None,
    timer: Timer,
) -> Any:
    """Run ``call`` to its value or its error; on any exception, give back what it holds."""
    try:
        slot = admission.admit_now(call)
        if slot is not None:
            # The common case, without a driver object: sent at once, and done.
            outcome = _send(call, slot, fn, args, classify)
            if not needs_retry(outcome):
                return call.finish(outcome)
        driver = _Driver(call, fn, args, classify, discard, timer)
        return driver.run(None if slot is None else outcome)
    except BaseException:
        left, value = call.abandon()
        if left and discard is not None:
            discard(value)
        raise


def _send(
    call: CallState, slot: Slot, fn: SyncFn, args: tuple[Any, ...], classify: Classifier
) -> Outcome:
    """One attempt on ``slot``, in this thread."""
    clock = call.core.clock
    attempt = call.begin(slot, clock())
    attempt.task = call.task
    outcome: Outcome | None = None
    token = CURRENT.set(attempt)
    try:
        try:
            value = fn(*args)
        except Exception as exc:
            outcome = classify(None, exc)
        else:
            outcome = classify(value, None)
    finally:
        CURRENT.reset(token)
        call.end(attempt, outcome, clock())  # never a lost race: threads do not hedge
    if call.core.shared is not None:
        flush(call.core)  # its readings, its lease, its hint, for the fleet
    assert outcome is not None  # else the attempt raised
    return outcome


def run_fleet_op(core: GateCore, op: FleetOp) -> Any:
    """Run ``op`` on the Gate's fleet, in this thread: what it answers (``None``
    when Redis does not)."""
    shared = core.shared
    assert shared is not None
    method: Callable[..., Any] = getattr(shared.fleet, op.name + "_sync")
    return method(*op.args, **op.kwargs)


def flush(core: GateCore) -> None:
    """Run what attempts left for the fleet (each op bounded by the fleet's budget)."""
    shared = core.shared
    assert shared is not None
    while True:
        with core.lock:
            if not shared.backlog:
                return
            op = shared.backlog.popleft()
        run_fleet_op(core, op)
