"""The async driver: runs a call's decisions on anyio (asyncio and trio).

It does what the sans-IO core cannot: perform admission's two kinds of wait
(park on the call's signal until a time, run a fleet operation), bound an
attempt by its deadline, and call the user's coroutine function. Every
decision is the core's (``_admission``, ``CallState``), and every wait's
logic too: the sync driver (``_sync``) performs the same waits in a thread.
The core's clock is the Gate's (``time.monotonic`` by default); a wait until
a core time is turned into the loop's time at the moment it starts, so
asyncio, trio (whose clock has an offset) and threads share one timeline.

Every attempt's ledger is created before its admission and closed in a
``finally`` around it and its sending; the call's own (``CallState.close``)
in a ``finally`` around the call.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import sys
import threading
from collections.abc import Awaitable, Callable, Generator
from typing import Any

import anyio

from yieldgate.gate import _admission as admission
from yieldgate.gate import _deadlines, _express
from yieldgate.gate._attempt import CURRENT, current_task
from yieldgate.gate._call import CallState, attempt_timed_out
from yieldgate.gate._core import GateCore
from yieldgate.gate._hedge import hedged_round
from yieldgate.gate._ledger import Attempt
from yieldgate.gate._outcome import Classifier, Outcome, checked, plain_success
from yieldgate.gate._retrying import Strategies, needs_retry
from yieldgate.gate._shared import GRANTS, FleetOp
from yieldgate.protocol import Priority

__all__ = ["AsyncSignal", "drive", "run"]

AsyncFn = Callable[..., Awaitable[Any]]
AsyncDiscard = Callable[[Any], Awaitable[None]]


def _scope_redelivers(entry: _deadlines.Deadline) -> bool:
    """After a ``CancelledError`` that this attempt's deadline fired, when another
    cancellation is pending too: whether that other one is an enclosing anyio cancel
    scope's, which anyio delivers again at the next checkpoint (with its own message).

    asyncio folds two cancellations requested in one loop iteration into one
    ``CancelledError``, and anyio keeps a native one (ours, which has no message)
    over its own; re-raised, ours would not be recognised by the enclosing scope,
    which would let it escape as if the task had been cancelled from outside.
    The attempt timed out; the scope's cancellation follows at the next checkpoint.
    """
    return entry.fired and anyio.current_effective_deadline() == -math.inf


class AsyncSignal:
    """A wake-up for one waiting task that any thread may send.

    From the task's own thread it sets the event at once; from another
    thread (a sync caller of the same Gate releasing a slot) it asks the
    task's event loop to set it.
    """

    __slots__ = ("_event", "_send", "_thread")

    def __init__(self) -> None:
        self._event = anyio.Event()
        self._thread = threading.get_ident()
        self._send: Callable[[Callable[[], None]], object] | None = None
        try:
            self._send = asyncio.get_running_loop().call_soon_threadsafe
        except RuntimeError:  # trio
            trio = sys.modules.get("trio")
            if trio is not None:
                self._send = trio.lowlevel.current_trio_token().run_sync_soon

    def wake(self) -> None:
        if threading.get_ident() == self._thread:
            self._event.set()
        elif self._send is not None:
            # A closed loop (RuntimeError) has nobody waiting any more.
            with contextlib.suppress(RuntimeError):
                self._send(self._set)

    def _set(self) -> None:
        self._event.set()

    def clear(self) -> None:
        if self._event.is_set():
            self._event = anyio.Event()

    async def wait(self, until: float | None, clock: Callable[[], float]) -> None:
        """Until woken or ``until`` (a time on ``clock``) has come."""
        if until is None:
            await self._event.wait()
            return
        with anyio.CancelScope(deadline=anyio.current_time() + (until - clock())):
            await self._event.wait()


async def run_fleet_op(core: GateCore, op: FleetOp) -> Any:
    """Run ``op`` on the Gate's fleet: what it answers (``None`` when Redis does not)."""
    shared = core.shared
    assert shared is not None
    method: Callable[..., Awaitable[Any]] = getattr(shared.fleet, op.name)
    return await method(*op.args, **op.kwargs)


def patience(core: GateCore, deadline: float | None) -> contextlib.AbstractContextManager[Any]:
    """A scope that cuts a call's fleet operation at half of what remains of its time,
    as the first reading waits, where the fleet's own bound may be longer (a busy
    event loop's; while joining, ``join_s``). Cut, the operation answers nothing."""
    shared = core.shared
    if deadline is not None and shared is not None:
        allowed = (deadline - core.clock()) / 2
        if allowed < shared.fleet.longest_op_s:
            return anyio.move_on_after(max(allowed, 0.0))
    return contextlib.nullcontext()


async def flush(core: GateCore) -> None:
    """Run what attempts left for the fleet, shielded: each op is bounded by the
    fleet's budget, and one lost to a cancellation would leave a lease or a take
    counted until it expires. One an interrupt stops goes back to the backlog
    (the call's ``finally`` hands it to the fleet's worker)."""
    shared = core.shared
    assert shared is not None
    with anyio.CancelScope(shield=True):
        while True:
            op = None
            try:
                with core.lock:
                    if not shared.backlog:
                        return
                    op = shared.backlog.popleft()
                got = await run_fleet_op(core, op)
            except BaseException:
                if op is not None:
                    shared.backlog.appendleft(op)  # run again: see ``_sync.flush``
                raise
            shared.ran(op, got)


async def drive(call: CallState, steps: Generator[admission.Wait, Any, Any]) -> Any:
    """Run one of the core's step generators to its end, performing its waits:
    what it returns. What ends a wait (a cancellation) is thrown into it."""
    core = call.core
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
                signal = call.signal
                assert isinstance(signal, AsyncSignal)
                await signal.wait(until, core.clock)
            elif wait.op.name in GRANTS:
                # The call's from the step it comes in (until admission enters it), on
                # the line the answer comes (the scope ends after it).
                with patience(core, call.deadline):
                    call.granted = (wait.op, got := await run_fleet_op(core, wait.op))
            else:
                with patience(core, call.deadline):  # and by the fleet's budget
                    got = await run_fleet_op(core, wait.op)
        except BaseException as exc:  # thrown in: the core looks at it first
            thrown = exc


class _Driver:
    """One async call: its state, function and the waits it makes."""

    __slots__ = ("args", "call", "classify", "core", "discard", "fn")

    def __init__(
        self,
        call: CallState,
        fn: AsyncFn,
        args: tuple[Any, ...],
        classify: Classifier,
        discard: AsyncDiscard | None,
    ) -> None:
        self.core = call.core
        self.call = call
        self.fn = fn
        self.args = args
        self.classify = classify
        self.discard = discard

    async def admit(self, attempt: Attempt) -> bool:
        """Wait for what ``attempt`` needs (``admission.admit``); whether it waited.
        (The common case is admitted and sent at once, ``admission.send_now``, which
        ``round`` tries first, without this coroutine.)"""
        call = self.call
        if self.core.shared is not None:
            await flush(self.core)
        call.signal = AsyncSignal()
        waited: bool = await drive(call, admission.admit(call, attempt))
        return waited

    async def send(self, attempt: Attempt, waited: bool) -> Outcome:
        """Send an admitted attempt, bounded by its deadline, and end it."""
        call, core = self.call, self.core
        outcome: Outcome | None = None
        cut = False
        try:
            if not attempt.sent:
                call.begin(attempt, core.clock(), waited=waited)
            attempt.task = call.task if call.hedge is None else current_task()
            token = None
            try:
                # Inside the ``try``: an interrupt on the next line must not leave the
                # attempt current in the caller's context.
                token = CURRENT.set(attempt)
                outcome, cut = await bounded(
                    core, attempt, self.fn, self.args, self.classify, self.discard
                )
            finally:
                if token is not None:
                    CURRENT.reset(token)
        finally:
            lost = call.end(attempt, outcome, core.clock(), cut=cut)
        if core.shared is not None:
            await flush(core)  # its readings, its lease, its hint, for the fleet
        if cut:
            raise call.deadline_error("during an attempt")
        assert outcome is not None
        if lost and self.discard is not None:
            # A hedge that answered too after another had won: its value (an
            # open stream, say) is closed, never returned.
            with anyio.CancelScope(shield=True):
                await self.discard(outcome.value)
        return outcome

    async def round(self) -> Outcome:
        """One attempt, or, under a hedge policy, one attempt and its hedges."""
        call = self.call
        attempt = call.attempt()
        try:
            waited = False if admission.send_now(call, attempt) else await self.admit(attempt)
            if call.hedge is None or call.hedging_off:
                return await self.send(attempt, waited)
            return await hedged_round(call, attempt, waited, self.send, drive)
        finally:
            if not attempt.ended:
                call.end(attempt, None, self.core.clock())

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            return  # the hold in the window is the wait: queue there at once
        clock = self.core.clock
        started = clock()
        try:
            await anyio.sleep(seconds)
        finally:
            with self.core.lock:
                self.core.counters.waited_s += clock() - started

    async def retry(self, outcome: Outcome) -> Outcome:
        """The call's retries after ``outcome`` (tenacity's loop asks the core)."""
        strategies = Strategies(self.call)
        wait = strategies.first_wait(outcome)
        if wait is None:
            return outcome
        await self.sleep(wait)
        retried: Outcome = await strategies.async_retrying(self.sleep)(self.round)
        return retried


async def bounded(
    core: GateCore,
    attempt: Attempt,
    fn: AsyncFn,
    args: tuple[Any, ...],
    classify: Classifier,
    discard: AsyncDiscard | None,
) -> tuple[Outcome | None, bool]:
    """A sent attempt under its deadline: its outcome, and whether the call's own
    deadline cut it (then ``None``)."""
    deadline = attempt.deadline
    if deadline is None:
        return await _invoke(fn, args, classify, discard), False
    task = attempt.task
    if isinstance(task, asyncio.Task):
        # One timer per loop for every attempt's deadline (see _deadlines).
        when = task.get_loop().time() + (deadline - core.clock())
        entry = _deadlines.add(when, task)
        try:
            outcome = await _invoke(fn, args, classify, discard)
        except asyncio.CancelledError:
            if not entry.timed_out() and not _scope_redelivers(entry):
                raise
            timed = attempt_timed_out(core, attempt)
            return timed, timed is None
        else:
            if entry.fired:  # the attempt swallowed its cancellation
                task.uncancel()
        finally:
            entry.done()
        return outcome, False
    with anyio.CancelScope(deadline=anyio.current_time() + (deadline - core.clock())) as scope:
        outcome = await _invoke(fn, args, classify, discard)
    if scope.cancelled_caught:
        timed = attempt_timed_out(core, attempt)
        return timed, timed is None
    return outcome, False


async def _invoke(
    fn: AsyncFn, args: tuple[Any, ...], classify: Classifier, discard: AsyncDiscard | None
) -> Outcome:
    try:
        value = await fn(*args)
    except Exception as exc:
        return checked(classify, None, exc)
    try:
        outcome: Outcome = checked(classify, value, None)
    except BaseException:
        if discard is not None and value is not None:
            with anyio.CancelScope(shield=True):
                await discard(value)
        raise
    return outcome


async def express(
    core: GateCore, fn: AsyncFn, args: tuple[Any, ...], priority: Priority, classify: Classifier
) -> tuple[Outcome | None, CallState | None]:
    """A plain call's first attempt in the express lane (``_express``), as the sync
    driver's ``express``: ``(outcome, None)``, a plain success, the call over and
    counted; ``(outcome, call)``, any other answer, the attempt ended by ``call``,
    which ``run`` goes on with (``first``); ``(None, call)``: the call's deadline
    cut the attempt; ``(None, None)``: not taken."""
    now = core.clock()
    total = core.policy.timeout.total_s
    attempt = _express.attempt(core, priority, now, None if total is None else now + total)
    call = None
    token = None
    try:
        if not _express.admit(core, attempt, now):
            return None, None
        attempt.task = task = current_task()
        token = CURRENT.set(attempt)
        outcome, cut = await bounded(core, attempt, fn, args, classify, None)
        token = CURRENT.reset(token)  # type: ignore[func-returns-value]  # one line: reset, and None
        if outcome is not None and not cut and plain_success(outcome):
            _express.ended_ok(core, attempt, core.clock())
            return outcome, None
        call = _express.handover(core, attempt, outcome, core.clock(), task, cut=cut)
        return outcome, call
    finally:
        if token is not None:
            CURRENT.reset(token)
        if call is None and attempt.up is not None and not attempt.ended:
            _express.ended_early(core, attempt, core.clock())


async def run(
    call: CallState,
    fn: AsyncFn,
    args: tuple[Any, ...],
    classify: Classifier,
    discard: AsyncDiscard | None,
    first: Outcome | None = None,
) -> Any:
    """Run ``call`` to its value or its error; whatever ends it, give back what it
    holds. ``first``: its first attempt's outcome, when the express lane made and
    ended that attempt (``express``)."""
    driver = _Driver(call, fn, args, classify, discard)
    handed = False
    try:
        # No scope spans the whole call: attempts carry the deadline in their own
        # scope, waits get one only when they must wait, and a retry wait that
        # would pass the deadline is never started.
        if first is not None:
            outcome = first
        elif call.attempts:  # the express lane's attempt, cut at the call's deadline
            raise call.deadline_error("during an attempt")
        else:
            outcome = await driver.round()
        if needs_retry(outcome):
            outcome = await driver.retry(outcome)
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
                with anyio.CancelScope(shield=True):
                    await discard(won)
        shared = call.core.shared
        if shared is not None and shared.backlog:
            shared.hand_over()  # what the ledgers gave back, run off this path
