"""The Gate's async calls: ``call``, ``hold``, ``call_and_hold`` and ``map``.

Each starts a ``CallState`` (``GateBase``) and hands it to the async driver
(``_async``), on asyncio or trio.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import Any, TypeVar, TypeVarTuple, overload

import anyio
import anyio.lowlevel

from yieldgate.gate import _async
from yieldgate.gate._call import CallState
from yieldgate.gate._calls import GateBase, Timeout
from yieldgate.gate._lease import Lease
from yieldgate.gate._outcome import Classifier, Outcome
from yieldgate.gate._policy import USE_POLICY
from yieldgate.gate._quota import Cost
from yieldgate.gate._telemetry import NULL_OBSERVER, observed
from yieldgate.gate._window import Signal
from yieldgate.protocol import Priority

__all__ = ["AsyncCalls"]

# A non-awaiting attempt arms (and disarms) a deadline timer that the event loop
# only drops on its next turn: give it one every so many calls.
_CHECKPOINT_EVERY = 128

T = TypeVar("T")
R = TypeVar("R")
Ts = TypeVarTuple("Ts")


class AsyncCalls(GateBase):
    """The coroutine side of a Gate."""

    async def _run_async(
        self,
        fn: Callable[..., Awaitable[Any]],
        args: tuple[Any, ...],
        call: CallState,
        classify: Classifier | None,
        discard: Callable[[Any], Awaitable[None]] | None,
        first: Outcome | None = None,
    ) -> Any:
        core = self._core
        classify = classify or core.classify
        try:
            if first is None:
                core.since_checkpoint += 1
                if core.since_checkpoint >= _CHECKPOINT_EVERY:
                    # Calls whose attempts never await would otherwise never let the loop
                    # drop the attempt timers they disarmed (nor run anything else).
                    core.since_checkpoint = 0
                    await anyio.lowlevel.checkpoint()
            if call.observer is NULL_OBSERVER:
                value = await _async.run(call, fn, args, classify, discard, first)
            else:
                with observed(call.observer, core):
                    value = await _async.run(call, fn, args, classify, discard, first)
        except BaseException as exc:
            self._ended(call, exc)
            raise
        self._ended(call, None)
        return value

    @overload
    async def call(
        self,
        fn: Callable[[*Ts], Awaitable[T]],
        /,
        *args: *Ts,
        priority: Priority | str = ...,
        timeout: Timeout = ...,
        classify: Classifier | None = ...,
        cost: Cost | int | None = ...,
    ) -> T: ...

    @overload
    async def call(
        self,
        fn: Callable[[*Ts], Awaitable[Any]],
        /,
        *args: *Ts,
        priority: Priority | str = ...,
        timeout: Timeout = ...,
        classify: Classifier | None = ...,
        cost: Cost | int | None = ...,
    ) -> Any: ...

    async def call(
        self,
        fn: Callable[[*Ts], Awaitable[Any]],
        /,
        *args: *Ts,
        priority: Priority | str = Priority.NORMAL,
        timeout: Timeout = USE_POLICY,
        classify: Classifier | None = None,
        cost: Cost | int | None = None,
    ) -> Any:
        """Call ``fn(*args)`` under the Gate and return its value.

        ``fn`` runs once per attempt. It may return a value, return an
        ``Outcome`` (to say "yield", "overloaded" or "retry" itself), or raise;
        ``classify`` (else the Gate's classifier) decides what a value or an
        exception means. ``timeout`` overrides the policy's total time for this
        call. Keyword arguments for ``fn`` go through ``functools.partial``.

        Raises a ``YieldgateError``: ``CallFailedError`` for a fatal outcome
        (the original error is its ``__cause__``), or the reason the call
        gave up (retries, yields or budget exhausted, deadline, open circuit).
        """
        if self._nested():
            try:
                value = await fn(*args)
            except Exception as exc:
                return self._classify_nested(classify, None, exc)
            return self._classify_nested(classify, value, None)
        observer = self._lane_observer(priority, timeout, cost)
        if observer is NULL_OBSERVER:
            assert type(priority) is Priority  # as ``_lane_observer`` found
            core = self._core
            core.since_checkpoint += 1
            if core.since_checkpoint >= _CHECKPOINT_EVERY:  # as in ``_run_async``
                core.since_checkpoint = 0
                await anyio.lowlevel.checkpoint()
            outcome, handed = await _async.express(
                core, fn, args, priority, classify or core.classify
            )
            if handed is not None:
                return await self._run_async(fn, args, handed, classify, None, first=outcome)
            if outcome is not None:
                return outcome.value
        call = self._new_call(priority, timeout, hold=False, cost=cost, observer=observer)
        return await self._run_async(fn, args, call, classify, None)

    @contextlib.asynccontextmanager
    async def hold(
        self,
        fn: Callable[[*Ts], Awaitable[Any]],
        /,
        *args: *Ts,
        priority: Priority | str = Priority.NORMAL,
        timeout: Timeout = USE_POLICY,
        classify: Classifier | None = None,
        cost: Cost | int | None = None,
        discard: Callable[[Any], Awaitable[None]] | None = None,
    ) -> AsyncIterator[Any]:
        """Like ``call``, but keep the window slot until the ``async with`` block exits.

        For work that goes on after the attempt returns: a stream read chunk by
        chunk, a response body read later. The retries (and ``timeout``) cover
        getting the value; what the block then does is bounded by the caller.
        A block that raises tells the window its attempt failed.

        ``discard`` closes a value nobody will use: when hedged attempts both
        succeed, the one that lost the race is handed to it (a stream to close).
        """
        lease = None
        outcome = Signal.FAILURE
        try:
            # In the ``try``: an interrupt before the block gets the value gives it back.
            value, lease = await self.call_and_hold(
                fn,
                *args,
                priority=priority,
                timeout=timeout,
                classify=classify,
                discard=discard,
                cost=cost,
            )
            yield value
            outcome = Signal.SUCCESS
        except BaseException as exc:
            if isinstance(exc, anyio.get_cancelled_exc_class()):
                outcome = Signal.CANCELLED
            raise
        finally:
            if lease is not None:
                lease.release(outcome)

    async def call_and_hold(
        self,
        fn: Callable[[*Ts], Awaitable[Any]],
        /,
        *args: *Ts,
        priority: Priority | str = Priority.NORMAL,
        timeout: Timeout = USE_POLICY,
        classify: Classifier | None = None,
        cost: Cost | int | None = None,
        discard: Callable[[Any], Awaitable[None]] | None = None,
    ) -> tuple[Any, Lease]:
        """``call``, returning the value and a ``Lease`` on the window slot it used.

        The slot stays taken until ``lease.release()``: the building block of
        ``hold`` for code that cannot keep an ``async with`` open, such as an
        HTTP transport whose response body is closed later by someone else.
        A lease that is never released keeps its slot; release it in a
        ``finally``.
        """
        if self._nested():
            return await self.call(fn, *args, classify=classify), self._nested_lease()
        call = self._new_call(priority, timeout, hold=True, cost=cost)
        try:
            value = await self._run_async(fn, args, call, classify, discard)
            return value, self._lease(call)
        except BaseException:
            left, won = self._not_handed(call)
            if left and discard is not None:
                with anyio.CancelScope(shield=True):
                    await discard(won)
            raise

    async def map(
        self,
        fn: Callable[[T], Awaitable[R]],
        items: Iterable[T],
        /,
        *,
        priority: Priority | str = Priority.NORMAL,
        concurrency: int | None = None,
        return_exceptions: bool = False,
        timeout: Timeout = USE_POLICY,
        classify: Classifier | None = None,
        cost: Cost | int | None = None,
    ) -> list[R | BaseException]:
        """Call ``fn(item)`` for each item through the Gate; results in input order.

        At most ``concurrency`` calls are open at once (default: the window's
        maximum), so a million items cost that many tasks, not a million; the
        window then decides how many attempts actually run. The first failure
        cancels the rest and is raised, unless ``return_exceptions`` puts each
        failure in its item's place. ``timeout`` and ``classify`` apply to each call.
        """
        work = list(items)
        limit = self._map_limit(concurrency)
        results: list[Any] = [None] * len(work)
        failure: list[BaseException] = []
        pending = iter(enumerate(work))

        async def worker(scope: anyio.CancelScope) -> None:
            for index, item in pending:
                try:
                    results[index] = await self.call(
                        fn, item, priority=priority, timeout=timeout, classify=classify, cost=cost
                    )
                except Exception as exc:
                    if not return_exceptions:
                        failure.append(exc)
                        scope.cancel()
                        return
                    results[index] = exc

        async with anyio.create_task_group() as tg:
            for _ in range(min(limit, len(work))):
                tg.start_soon(worker, tg.cancel_scope)
        if failure:
            raise failure[0]
        return results
