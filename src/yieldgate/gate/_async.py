"""The async driver: runs a call's decisions on anyio (asyncio and trio).

It does what the sans-IO core cannot: wait (for a window slot, a rate
token, a probe's verdict, a retry's wait), bound an attempt by its deadline
with a cancel scope, and call the user's coroutine function. Every decision
is the ``CallState``'s. The core's clock is the Gate's (``time.monotonic`` by
default); a wait until a core time is turned into the loop's time at the
moment it starts, so asyncio, trio (whose clock has an offset) and threads
share one timeline.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import math
import sys
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio

from yieldgate.gate import _admission as admission
from yieldgate.gate import _deadlines
from yieldgate.gate._attempt import CURRENT, Slot, current_task
from yieldgate.gate._breaker import Breaker
from yieldgate.gate._call import CallState
from yieldgate.gate._core import GateCore
from yieldgate.gate._hedge import hedged_round
from yieldgate.gate._outcome import Classifier, Outcome
from yieldgate.gate._retrying import Strategies, needs_retry
from yieldgate.gate._shared import FleetOp
from yieldgate.gate._window import Permit, Window
from yieldgate.protocol import Priority

__all__ = ["AsyncSignal", "acquire", "run", "take_rate"]

T = TypeVar("T")

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


async def acquire(
    window: Window,
    priority: Priority = Priority.NORMAL,
    *,
    key: float | None = None,
    not_after: float | None = None,
    lock: Any = None,
    clock: Callable[[], float] | None = None,
) -> Permit:
    """Wait for a window permit. Cancellation while waiting takes nothing."""
    lock = lock if lock is not None else threading.RLock()
    clock = clock if clock is not None else window._clock
    with lock:
        permit = window.try_acquire(priority)
        if permit is not None:
            # Granted without awaiting: nothing can cancel us between the grant
            # and the caller holding the permit (and no event-loop trip is paid).
            return permit
        signal = AsyncSignal()
        waiter = window.enqueue(priority, signal.wake, key=key, not_after=not_after)
    try:
        while True:
            with lock:
                wake_at = window.look(waiter)
                if waiter.permit is not None:
                    return waiter.permit
                signal.clear()
            await signal.wait(wake_at, clock)
    except BaseException:
        with lock:
            window.abandon(waiter)
        raise


async def take_rate(rate: admission.Pacer, lock: Any, clock: Callable[[], float]) -> None:
    """Wait for a start from the rate cap (or a quota), in its queue's order."""
    signal = AsyncSignal()
    with lock:
        if rate.try_take(clock()):
            return
        waiter = rate.join(signal.wake)
    try:
        while True:
            with lock:
                again = None
                if rate.at_head(waiter):
                    again = rate.take_queued(waiter, clock())
                    if again is None:
                        return
                signal.clear()
            await signal.wait(again, clock)
    except BaseException:
        with lock:
            rate.leave(waiter)
        raise


async def run_fleet_op(core: GateCore, op: FleetOp) -> Any:
    """Run ``op`` on the Gate's fleet: what it answers (``None`` when Redis does not)."""
    shared = core.shared
    assert shared is not None
    method: Callable[..., Awaitable[Any]] = getattr(shared.fleet, op.name)
    return await method(*op.args, **op.kwargs)


async def flush(core: GateCore) -> None:
    """Run what attempts left for the fleet, shielded: each op is bounded by the
    fleet's budget, and one lost to a cancellation would leave a lease or a take
    counted until it expires."""
    shared = core.shared
    assert shared is not None
    with anyio.CancelScope(shield=True):
        while True:
            with core.lock:
                if not shared.backlog:
                    return
                op = shared.backlog.popleft()
            await run_fleet_op(core, op)


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

    async def within_deadline(self, wait: Callable[[], Awaitable[T]], while_: str) -> T:
        """Await ``wait()`` within the call's deadline."""
        deadline = self.call.deadline
        if deadline is None:
            return await wait()
        with anyio.CancelScope(deadline=anyio.current_time() + (deadline - self.core.clock())):
            return await wait()
        raise self.call.deadline_error(while_)

    async def verdict(self, breaker: Breaker) -> None:
        signal = AsyncSignal()
        with self.core.lock:
            if not breaker.await_verdict(signal.wake):
                return
        await self.within_deadline(
            lambda: signal.wait(None, self.core.clock), "waiting for the breaker's probe"
        )

    async def admit(self) -> Slot:
        """Wait for what an attempt needs: a hint to pass, a window slot, the rate
        cap, a ticket from the breaker (the core's ``admission.steps``)."""
        if self.core.shared is not None:
            await flush(self.core)
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
                got, advance = await self.wait(wait), admitting.send
            except BaseException as exc:  # thrown in: the core gives back what it took
                got, advance = exc, admitting.throw

    async def wait(self, wait: admission.Wait) -> Any:
        core = self.core
        if isinstance(wait, admission.VerdictWait):
            return await self.verdict(wait.breaker)
        if isinstance(wait, admission.WindowWait):
            window_slot = functools.partial(
                acquire,
                wait.up.window,
                self.call.priority,
                key=self.call.started,
                not_after=wait.not_after,
                lock=core.lock,
                clock=core.clock,
            )
            return await self.within_deadline(window_slot, "waiting for a window slot")
        if isinstance(wait, admission.FleetWait):
            return await run_fleet_op(core, wait.op)  # bounded by the fleet's budget
        if isinstance(wait, admission.SleepWait):
            pause = functools.partial(anyio.sleep, wait.seconds)
            return await self.within_deadline(pause, wait.while_)
        start = functools.partial(take_rate, wait.rate, core.lock, core.clock)
        return await self.within_deadline(start, wait.while_)

    async def send(self, slot: Slot) -> Outcome:
        """One attempt on ``slot``, bounded by its deadline."""
        call, core = self.call, self.core
        attempt = call.begin(slot, core.clock())
        attempt.task = call.task if call.hedge is None else current_task()
        outcome: Outcome | None = None
        token = CURRENT.set(attempt)
        try:
            deadline = attempt.deadline
            task = attempt.task
            if deadline is None:
                outcome = await self._invoke()
            elif isinstance(task, asyncio.Task):
                # One timer per loop for every attempt's deadline (see _deadlines).
                when = task.get_loop().time() + (deadline - core.clock())
                entry = _deadlines.add(when, task)
                try:
                    outcome = await self._invoke()
                except asyncio.CancelledError:
                    if not entry.timed_out() and not _scope_redelivers(entry):
                        raise
                    outcome = call.timed_out(attempt)
                else:
                    if entry.fired:  # the attempt swallowed its cancellation
                        task.uncancel()
                finally:
                    entry.done()
            else:
                with anyio.CancelScope(
                    deadline=anyio.current_time() + (deadline - core.clock())
                ) as scope:
                    outcome = await self._invoke()
                if scope.cancelled_caught:
                    outcome = call.timed_out(attempt)
        finally:
            CURRENT.reset(token)
            lost = call.end(attempt, outcome, core.clock())
        if core.shared is not None:
            await flush(core)  # its readings, its lease, its hint, for the fleet
        assert outcome is not None
        if lost and self.discard is not None:
            # A hedge that answered too after another had won: its value (an
            # open stream, say) is closed, never returned.
            with anyio.CancelScope(shield=True):
                await self.discard(outcome.value)
        return outcome

    async def _invoke(self) -> Outcome:
        try:
            value = await self.fn(*self.args)
        except Exception as exc:
            return self.classify(None, exc)
        return self.classify(value, None)

    async def round(self) -> Outcome:
        """One attempt, or, under a hedge policy, one attempt and its hedges."""
        call = self.call
        if call.hedge is None or call.hedging_off:
            return await self.send(await self.admit())
        return await hedged_round(call, await self.admit(), self.send)

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

    async def run(self) -> Any:
        # No scope spans the whole call: attempts carry the deadline in their own
        # scope, waits get one only when they must wait, and a retry wait that
        # would pass the deadline is never started.
        call = self.call
        if call.hedge is None:
            outcome = await self.send(admission.admit_now(call) or await self.admit())
        else:
            outcome = await self.round()
        if needs_retry(outcome):
            strategies = Strategies(call)
            wait = strategies.first_wait(outcome)
            if wait is not None:
                await self.sleep(wait)
                outcome = await strategies.async_retrying(self.sleep)(self.round)
        return call.finish(outcome)

    async def abandon(self) -> None:
        """The call ends in an exception: give back what it holds, close a won value."""
        left, value = self.call.abandon()
        if left and self.discard is not None:
            with anyio.CancelScope(shield=True):
                await self.discard(value)


async def run(
    call: CallState,
    fn: AsyncFn,
    args: tuple[Any, ...],
    classify: Classifier,
    discard: AsyncDiscard | None,
) -> Any:
    """Run ``call`` to its value or its error; on any exception, give back what it holds."""
    driver = _Driver(call, fn, args, classify, discard)
    try:
        return await driver.run()
    except BaseException:
        await driver.abandon()
        raise
