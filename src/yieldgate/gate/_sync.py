"""The sync driver: runs a call's decisions in the calling thread.

The same decisions as the async driver (they are the ``CallState``'s) and
the same waits (admission's, ``_admission``): only how a wait is performed
differs. A thread parks on a ``threading.Event`` (woken by whoever frees
what it waits for, in any thread or event loop) with a timeout on the Gate's
clock. Deadlines, priorities, holds, the breaker, the budget and the rate
cap all apply, and callers of both drivers share them.

Two differences follow from threads. An attempt cannot be interrupted: a
blocking call is not a coroutine, so the attempt's deadline is handed to
the code it runs (``current_attempt().remaining_s()``, which the transports
pass on as their request timeout) instead of being enforced from outside.
And the hedge policy is ignored (see ``_hedge``).

A call may belong to a ``Batch`` (``Gate.map_sync``): stopping the batch
(its first failure, a Ctrl-C) wakes its calls that are waiting, and they end
at once with ``Stopped`` instead of waiting on.

``Timer`` is how the driver sleeps and waits; tests give it a virtual one.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
import time
from collections.abc import Callable, Generator
from types import CoroutineType
from typing import Any

from yieldgate.gate import _admission as admission
from yieldgate.gate import _express
from yieldgate.gate._attempt import CURRENT
from yieldgate.gate._call import CallState
from yieldgate.gate._core import GateCore
from yieldgate.gate._ledger import Attempt
from yieldgate.gate._outcome import Classifier, Outcome, checked, plain_success
from yieldgate.gate._retrying import Strategies, needs_retry
from yieldgate.gate._shared import GRANTS, FleetOp
from yieldgate.protocol import Priority

__all__ = ["Batch", "Stopped", "ThreadSignal", "Timer", "run"]

SyncFn = Callable[..., Any]
SyncDiscard = Callable[[Any], None]


class Timer:
    """Real time: ``sleep`` and ``wait`` block the thread for up to ``seconds``."""

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    def wait(self, event: threading.Event, seconds: float | None) -> bool:
        return event.wait(seconds)


class Stopped(Exception):
    """A call of a stopped ``Batch``: it gave up waiting (never raised to a caller)."""


class ThreadSignal:
    """A wake-up for one waiting thread, that any thread or event loop may send."""

    __slots__ = ("event",)

    def __init__(self) -> None:
        self.event = threading.Event()

    def wake(self) -> None:
        self.event.set()

    def clear(self) -> None:
        self.event.clear()


class Batch:
    """The calls of one ``map_sync``: ``stop`` wakes those waiting, to end them."""

    def __init__(self) -> None:
        self.stopped = False
        self._lock = threading.Lock()
        self._signals: set[ThreadSignal] = set()

    def join(self, signal: ThreadSignal) -> None:
        with self._lock:
            self._signals.add(signal)
        if self.stopped:
            raise Stopped

    def leave(self, signal: ThreadSignal) -> None:
        with self._lock:
            self._signals.discard(signal)

    def stop(self) -> None:
        with self._lock:
            self.stopped = True
            signals = list(self._signals)
        for signal in signals:
            signal.wake()


def drive(
    call: CallState,
    steps: Generator[admission.Wait, Any, Any],
    timer: Timer,
    batch: Batch | None = None,
) -> Any:
    """Run one of the core's step generators to its end in this thread, performing its
    waits: what it returns. What ends a wait (a stop, Ctrl-C) is thrown into it."""
    core = call.core
    clock = core.clock
    signal = ThreadSignal()
    call.signal = signal
    if batch is not None:
        batch.join(signal)
    try:
        got: Any = None
        thrown: BaseException | None = None
        while True:
            try:
                wait = steps.send(got) if thrown is None else steps.throw(thrown)
            except StopIteration as done:
                return done.value
            got = thrown = None
            try:
                if isinstance(wait, admission.Park):
                    until, deadline = wait.until, call.deadline
                    if deadline is not None and (until is None or deadline < until):
                        until = deadline
                    timer.wait(signal.event, None if until is None else max(0.0, until - clock()))
                elif wait.op.name in GRANTS:
                    # The call's from the step it comes in (until admission enters it).
                    # One line: an interrupt between the answer and its entry loses it.
                    with hurried(core, call.deadline):
                        call.granted = (wait.op, got := _granting(core, wait.op))
                else:
                    with hurried(core, call.deadline):  # and by the fleet's budget
                        got = run_fleet_op(core, wait.op)
            except BaseException as exc:  # thrown in: the core looks at it first
                thrown = exc
            if thrown is None and batch is not None and batch.stopped:
                thrown = Stopped()
    finally:
        if batch is not None:
            batch.leave(signal)


def _refuse_coroutine(value: CoroutineType[Any, Any, Any]) -> None:
    """A sync call's function made a coroutine: closed (never "never awaited"), and
    the attempt fails with a ``TypeError`` instead of counting as a success."""
    value.close()
    raise TypeError(
        f"a sync call's function returned a coroutine (made by {value.__qualname__}): "
        "await it with gate.call instead"
    )


def _send(
    call: CallState,
    attempt: Attempt,
    waited: bool,
    fn: SyncFn,
    args: tuple[Any, ...],
    classify: Classifier,
    discard: SyncDiscard | None,
) -> Outcome:
    """Send an admitted attempt in this thread, and end it."""
    clock = call.core.clock
    outcome: Outcome | None = None
    try:
        if not attempt.sent:
            call.begin(attempt, clock(), waited=waited)
        attempt.task = call.task
        outcome = _answer(attempt, fn, args, classify, discard)
    finally:
        call.end(attempt, outcome, clock())  # never a lost race: threads do not hedge
    if call.core.shared is not None:
        flush(call.core)  # its readings, its lease, its hint, for the fleet
    assert outcome is not None  # else the attempt raised
    return outcome


def _answer(
    attempt: Attempt,
    fn: SyncFn,
    args: tuple[Any, ...],
    classify: Classifier,
    discard: SyncDiscard | None,
) -> Outcome:
    """Run a sent attempt's function and classify what it did (what raises here is
    the caller's to raise, once its ``finally`` has ended the attempt)."""
    # The attempt is current in a copy of the caller's context, never in the
    # caller's own: no interrupt, at whatever line, leaves it current there (a
    # later call in a REPL would take itself for part of a dead attempt).
    context = contextvars.copy_context()
    context.run(CURRENT.set, attempt)
    try:
        value = context.run(fn, *args)
        if type(value) is CoroutineType:  # a lambda around an async call
            _refuse_coroutine(value)
    except Exception as exc:
        return context.run(checked, classify, None, exc)
    try:
        outcome: Outcome = context.run(checked, classify, value, None)
    except BaseException:
        if discard is not None and value is not None:
            discard(value)
        raise
    return outcome


class _Driver:
    """One sync call past its first attempt: its state, function and waits."""

    __slots__ = ("args", "batch", "call", "classify", "core", "discard", "fn", "timer")

    def __init__(
        self,
        call: CallState,
        fn: SyncFn,
        args: tuple[Any, ...],
        classify: Classifier,
        discard: SyncDiscard | None,
        timer: Timer,
        batch: Batch | None,
    ) -> None:
        self.core = call.core
        self.call = call
        self.fn = fn
        self.args = args
        self.classify = classify
        self.discard = discard
        self.timer = timer
        self.batch = batch

    def round(self) -> Outcome:
        return _round(
            self.call, self.fn, self.args, self.classify, self.discard, self.timer, self.batch
        )

    def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            return  # the hold in the window is the wait: queue there at once
        clock = self.core.clock
        started = clock()
        try:
            batch = self.batch
            if batch is None:
                self.timer.sleep(seconds)
            else:
                # A sleep a stopped batch cuts short: parked on a signal it wakes.
                signal = ThreadSignal()
                batch.join(signal)
                try:
                    self.timer.wait(signal.event, seconds)
                finally:
                    batch.leave(signal)
                if batch.stopped:
                    raise Stopped
        finally:
            with self.core.lock:
                self.core.counters.waited_s += clock() - started

    def retry(self, outcome: Outcome) -> Outcome:
        """The call's retries after ``outcome`` (tenacity's loop asks the core)."""
        strategies = Strategies(self.call)
        wait = strategies.first_wait(outcome)
        if wait is None:
            return outcome
        self.sleep(wait)
        retried: Outcome = strategies.retrying(self.sleep)(self.round)
        return retried


def _round(
    call: CallState,
    fn: SyncFn,
    args: tuple[Any, ...],
    classify: Classifier,
    discard: SyncDiscard | None,
    timer: Timer,
    batch: Batch | None,
) -> Outcome:
    """One attempt: its ledger opened, filled by admission, closed whatever happens."""
    attempt = call.attempt()
    try:
        if admission.send_now(call, attempt):
            waited = False  # and sent
        else:
            if call.core.shared is not None:
                flush(call.core)
            waited = drive(call, admission.admit(call, attempt), timer, batch)
        return _send(call, attempt, waited, fn, args, classify, discard)
    finally:
        if not attempt.ended:
            call.end(attempt, None, call.core.clock())


def run(
    call: CallState,
    fn: SyncFn,
    args: tuple[Any, ...],
    classify: Classifier,
    discard: SyncDiscard | None,
    timer: Timer,
    batch: Batch | None = None,
    first: Outcome | None = None,
) -> Any:
    """Run ``call`` to its value or its error; whatever ends it, give back what it
    holds. ``first``: its first attempt's outcome, when the express lane made and
    ended that attempt (``express``)."""
    handed = False
    try:
        if first is None:
            outcome = _round(call, fn, args, classify, discard, timer, batch)
        else:
            outcome = first
        if needs_retry(outcome):
            outcome = _Driver(call, fn, args, classify, discard, timer, batch).retry(outcome)
        value = call.finish(outcome)
        handed = True  # a held slot's Lease: the caller's to hand out (``_not_handed``)
        return value
    finally:
        if (
            call.withdrawn is not None
            or call.fleet_receipt is not None
            or call.granted is not None
            or (call.held is not None and not handed)
        ):
            left, won = call.close(handed=handed)
            if left and discard is not None:
                discard(won)
        shared = call.core.shared
        if shared is not None and shared.backlog:
            shared.hand_over()  # what the ledgers gave back, run off this path


def express(
    core: GateCore,
    fn: SyncFn,
    args: tuple[Any, ...],
    priority: Priority,
    classify: Classifier,
    task: object,
) -> tuple[Outcome | None, CallState | None]:
    """A plain call's first attempt in the express lane (``_express``): ``(outcome,
    None)``, a plain success, the call over and counted; ``(outcome, call)``, any
    other answer, the attempt ended by ``call``, which ``run`` goes on with
    (``first``); ``(None, None)``: not taken (nothing acquired, nothing counted)."""
    now = core.clock()
    total = core.policy.timeout.total_s
    attempt = _express.attempt(core, priority, now, None if total is None else now + total)
    call = None
    try:
        if not _express.admit(core, attempt, now):
            return None, None
        attempt.task = task
        outcome = _answer(attempt, fn, args, classify, None)
        if plain_success(outcome):
            _express.ended_ok(core, attempt, core.clock())
            return outcome, None
        call = _express.handover(core, attempt, outcome, core.clock(), task)
        return outcome, call
    finally:
        if call is None and attempt.up is not None and not attempt.ended:
            _express.ended_early(core, attempt, core.clock())


def _granting(core: GateCore, op: FleetOp) -> Any:
    """``run_fleet_op`` for an operation that grants. Interrupted while Redis answered,
    what it granted is unknown: the first reading's probe is handed back by name (which
    gives back nothing another member holds); a lease or a take lapses with its TTL."""
    try:
        return run_fleet_op(core, op)
    except BaseException:
        shared = core.shared
        if op.name == "first" and shared is not None:
            shared.backlog.append(FleetOp("abandon_first", (op.args[0],)))
        raise


def run_fleet_op(core: GateCore, op: FleetOp) -> Any:
    """Run ``op`` on the Gate's fleet, in this thread: what it answers (``None``
    when Redis does not)."""
    shared = core.shared
    assert shared is not None
    method: Callable[..., Any] = getattr(shared.fleet, op.name + "_sync")
    return method(*op.args, **op.kwargs)


def hurried(core: GateCore, deadline: float | None) -> contextlib.AbstractContextManager[Any]:
    """While the fleet is joining, a call with less than twice ``join_s`` left has its
    operations wait no longer than the budget (a socket read cannot be cut at half
    of the call's time, as an asyncio round trip is)."""
    shared = core.shared
    if deadline is not None and shared is not None:
        fleet = shared.fleet
        if fleet.joining and (deadline - core.clock()) / 2 < fleet.join_s:
            hurry: contextlib.AbstractContextManager[Any] = fleet._hurry()
            return hurry
    return contextlib.nullcontext()


def flush(core: GateCore) -> None:
    """Run what attempts left for the fleet (each op bounded by the fleet's budget).

    One an interrupt stops goes back to the backlog (the call's ``finally`` hands it
    to the fleet's worker): a give-back lost would leave a lease or a take counted in
    Redis. (If the interrupt came while Redis answered, the op may run twice: a
    release, a hold or a reading changes nothing the second time; a refund or an
    answered take's count gives back once more, which the buckets' limits bound.)
    """
    shared = core.shared
    assert shared is not None
    while True:
        op = None
        try:
            with core.lock:
                if not shared.backlog:
                    return
                op = shared.backlog.popleft()
            got = run_fleet_op(core, op)
        except BaseException:
            if op is not None:
                shared.backlog.appendleft(op)
            raise
        shared.ran(op, got)
