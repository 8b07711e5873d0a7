"""The Gate's sync calls: ``call_sync``, ``hold_sync``, ``call_and_hold_sync``, ``map_sync``.

Each starts a ``CallState`` (``GateBase``) and hands it to the sync driver
(``_sync``), in the calling thread. They share the Gate's window, budget,
breaker and hint holds with its async calls.

A sync call blocks its thread while it waits. On a thread that runs an
event loop that would block the loop, and with it the tasks that could free
what the call waits for: such a call is refused at once
(``BlockingCallError``) unless the caller says it cannot wait
(``allow_event_loop=True``).

A notebook is the exception: a Jupyter (or IPython) cell runs on the kernel's
event loop, and the plain sync clients just work there, blocking it as any sync
code in a cell does. So a sync call on the main thread of an IPython shell
proceeds as if ``allow_event_loop`` were given, with one warning per process:
an async task of that loop (a cell's ``create_task``) cannot free a slot while
the cell waits.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import sys
import threading
import types
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar, TypeVarTuple

from yieldgate._exceptions import BlockingCallError
from yieldgate.gate import _sync
from yieldgate.gate._attempt import current_task
from yieldgate.gate._call import CallState
from yieldgate.gate._calls import GateBase, Timeout
from yieldgate.gate._lease import Lease
from yieldgate.gate._outcome import Classifier, Outcome, callable_name
from yieldgate.gate._policy import USE_POLICY
from yieldgate.gate._quota import Cost
from yieldgate.gate._telemetry import NULL_OBSERVER, observed
from yieldgate.gate._window import Signal
from yieldgate.protocol import Priority

__all__ = ["SyncCalls", "blocking_here", "in_event_loop", "in_notebook_kernel"]

T = TypeVar("T")
R = TypeVar("R")
Ts = TypeVarTuple("Ts")

# How often a thread waiting for map_sync's workers looks up (a Ctrl-C sent as
# ``_thread.interrupt_main`` is only seen when it does).
_JOIN_EVERY_S = 0.05


_running_loop = asyncio._get_running_loop


def in_event_loop() -> bool:
    """Whether this thread is running an event loop (asyncio's, or trio's)."""
    if _running_loop() is not None:
        return True
    trio = sys.modules.get("trio")
    return trio is not None and bool(trio.lowlevel.in_trio_run())


def in_notebook_kernel() -> bool:
    """Whether this is the main thread of an IPython shell (a Jupyter kernel, or
    IPython's terminal running a cell that awaits): its loop is the cells' own."""
    ipython = sys.modules.get("IPython")
    if ipython is None or threading.current_thread() is not threading.main_thread():
        return False
    try:
        return ipython.get_ipython() is not None
    except Exception:  # an IPython of an unexpected shape: not a notebook then
        return False


_warned_notebook = False

NOTEBOOK_WARNING = (
    "yieldgate: a sync call in a notebook cell blocks the kernel's event loop while it "
    "waits, as any sync code there does; an async task of this notebook cannot free a "
    "Gate's slot meanwhile (await the async client in such cells)"
)


def blocking_here() -> bool:
    """Whether a sync call here would block an event loop it must not block: this
    thread runs one, and it is not a notebook kernel's (there, warn once and go on)."""
    if not in_event_loop():
        return False
    if in_notebook_kernel():
        global _warned_notebook
        if not _warned_notebook:
            _warned_notebook = True
            warnings.warn(NOTEBOOK_WARNING, RuntimeWarning, stacklevel=3)
        return False
    return True


def refuse_coroutine_function(gate: str, what: str, fn: Callable[..., Any]) -> None:
    """``TypeError`` (one line) for an ``async def`` handed to a sync call."""
    if (
        type(fn) is types.FunctionType
        and not fn.__code__.co_flags & inspect.CO_COROUTINE
        and not fn.__dict__  # no marker (inspect.markcoroutinefunction), no attributes
    ):
        return  # a plain def (most calls): inspect's answer, without its unwrapping
    if inspect.iscoroutinefunction(fn):
        raise TypeError(
            f"gate {gate!r}: {what}({callable_name(fn)}) got an async function, whose call "
            f"would only make a coroutine: use `await gate.call({callable_name(fn)}, ...)`"
        )


class SyncCalls(GateBase):
    """The thread side of a Gate."""

    _timer: _sync.Timer

    def _thread(self, what: str, fn: Callable[..., Any], allowed: bool) -> object:
        """Where a sync call runs (its thread, or its task when ``allowed`` or in a
        notebook's cell); ``BlockingCallError`` in another loop's thread."""
        if allowed:
            return current_task()
        if in_event_loop():
            self._refuse_in_loop(what, fn)  # a notebook's cell goes on
            return current_task()
        return threading.current_thread()

    def _refuse_in_loop(self, what: str, fn: Callable[..., Any]) -> None:
        """``BlockingCallError`` where a sync call would block a loop."""
        if blocking_here():
            name = callable_name(fn)
            raise BlockingCallError(
                f"gate {self.name!r}: {what}({name}) would block this thread's running "
                f"event loop: use `await gate.{what.removesuffix('_sync')}({name}, ...)` "
                f"here, or run it in a worker thread (`await asyncio.to_thread(...)`)"
            )

    def _run_sync(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        call: CallState,
        classify: Classifier | None,
        discard: Callable[[Any], None] | None,
        batch: _sync.Batch | None = None,
        first: Outcome | None = None,
    ) -> Any:
        core = self._core
        classify = classify or core.classify
        try:
            if call.observer is NULL_OBSERVER:
                value = _sync.run(call, fn, args, classify, discard, self._timer, batch, first)
            else:
                with observed(call.observer, core):
                    value = _sync.run(call, fn, args, classify, discard, self._timer, batch, first)
        except BaseException as exc:
            self._ended(call, exc)
            raise
        self._ended(call, None)
        return value

    def call_sync(
        self,
        fn: Callable[[*Ts], T],
        /,
        *args: *Ts,
        priority: Priority | str = Priority.NORMAL,
        timeout: Timeout = USE_POLICY,
        classify: Classifier | None = None,
        cost: Cost | int | None = None,
        allow_event_loop: bool = False,
    ) -> Any:
        """``call`` for a plain function, in the calling thread (the sync driver).

        Shares this Gate's window, budget, breaker and hint holds with every
        other caller, sync or async. An attempt is not interrupted at its
        deadline (a thread cannot be): the code it runs reads
        ``current_attempt().remaining_s()``, as the transports do.

        Raises ``BlockingCallError`` when called from a thread that runs an
        event loop, unless ``allow_event_loop`` (see the module docstring).
        """
        refuse_coroutine_function(self.name, "call_sync", fn)
        if self._nested():
            try:
                value = fn(*args)
            except Exception as exc:
                return self._classify_nested(classify, None, exc)
            return self._classify_nested(classify, value, None)
        task = self._thread("call_sync", fn, allow_event_loop)
        observer = self._lane_observer(priority, timeout, cost)
        if observer is NULL_OBSERVER:
            assert type(priority) is Priority  # as ``_lane_observer`` found
            core = self._core
            outcome, handed = _sync.express(
                core, fn, args, priority, classify or core.classify, task
            )
            if handed is not None:
                return self._run_sync(fn, args, handed, classify, None, first=outcome)
            if outcome is not None:
                return outcome.value
        call = self._new_call(
            priority, timeout, hold=False, cost=cost, task=task, observer=observer
        )
        return self._run_sync(fn, args, call, classify, None)

    @contextlib.contextmanager
    def hold_sync(
        self,
        fn: Callable[[*Ts], Any],
        /,
        *args: *Ts,
        priority: Priority | str = Priority.NORMAL,
        timeout: Timeout = USE_POLICY,
        classify: Classifier | None = None,
        cost: Cost | int | None = None,
        discard: Callable[[Any], None] | None = None,
        allow_event_loop: bool = False,
    ) -> Iterator[Any]:
        """``hold`` for a plain function: the slot is kept until the ``with`` block exits."""
        lease = None
        outcome = Signal.FAILURE
        try:
            # In the ``try``: an interrupt before the block gets the value gives it back.
            value, lease = self.call_and_hold_sync(
                fn,
                *args,
                priority=priority,
                timeout=timeout,
                classify=classify,
                discard=discard,
                cost=cost,
                allow_event_loop=allow_event_loop,
            )
            yield value
            outcome = Signal.SUCCESS
        except BaseException as exc:
            if not isinstance(exc, Exception):  # Ctrl-C, a generator closed: no verdict
                outcome = Signal.CANCELLED
            raise
        finally:
            if lease is not None:
                lease.release(outcome)

    def call_and_hold_sync(
        self,
        fn: Callable[[*Ts], Any],
        /,
        *args: *Ts,
        priority: Priority | str = Priority.NORMAL,
        timeout: Timeout = USE_POLICY,
        classify: Classifier | None = None,
        cost: Cost | int | None = None,
        discard: Callable[[Any], None] | None = None,
        allow_event_loop: bool = False,
    ) -> tuple[Any, Lease]:
        """``call_and_hold`` for a plain function, in the calling thread."""
        if self._nested():
            return self.call_sync(fn, *args, classify=classify), self._nested_lease()
        refuse_coroutine_function(self.name, "call_and_hold_sync", fn)
        task = self._thread("call_and_hold_sync", fn, allow_event_loop)
        call = self._new_call(priority, timeout, hold=True, cost=cost, task=task)
        try:
            value = self._run_sync(fn, args, call, classify, discard)
            return value, self._lease(call)
        except BaseException:
            left, won = self._not_handed(call)
            if left and discard is not None:
                discard(won)
            raise

    def map_sync(
        self,
        fn: Callable[[T], R],
        items: Iterable[T],
        /,
        *,
        priority: Priority | str = Priority.NORMAL,
        concurrency: int | None = None,
        return_exceptions: bool = False,
        timeout: Timeout = USE_POLICY,
        classify: Classifier | None = None,
        cost: Cost | int | None = None,
        allow_event_loop: bool = False,
    ) -> list[R | BaseException]:
        """``map`` for a plain function, on ``concurrency`` worker threads.

        The first failure stops the batch (unless ``return_exceptions``): no
        item not yet started is started, the calls waiting in the Gate give up
        their place, and the failure is raised once the attempts in flight end.
        A ``KeyboardInterrupt`` (Ctrl-C) stops it the same way and is raised at
        once; attempts in flight then end in their threads, without retrying.
        """
        work = list(items)
        limit = self._map_limit(concurrency)
        if not work:
            return []
        refuse_coroutine_function(self.name, "map_sync", fn)
        if not allow_event_loop:
            self._refuse_in_loop("map_sync", fn)
        results: list[Any] = [None] * len(work)
        failure: list[BaseException] = []
        batch = _sync.Batch()
        pending = iter(enumerate(work))
        take = threading.Lock()

        def worker() -> None:
            while not batch.stopped:
                with take:
                    index, item = next(pending, (-1, None))
                if index < 0:
                    return
                try:
                    call = self._new_call(priority, timeout, hold=False, cost=cost)
                    results[index] = self._run_sync(fn, (item,), call, classify, None, batch)
                except _sync.Stopped:
                    return
                except Exception as exc:
                    results[index] = exc
                    if not return_exceptions:
                        with take:
                            failure.append(exc)
                        batch.stop()
                        return

        threads = [
            threading.Thread(target=worker, name=f"{self.name}-map", daemon=True)
            for _ in range(min(limit, len(work)))
        ]
        try:
            for thread in threads:
                thread.start()
            for thread in threads:
                while thread.is_alive():
                    thread.join(_JOIN_EVERY_S)
        except BaseException:
            batch.stop()  # Ctrl-C: nothing more starts, and nothing waits on
            raise
        if failure:
            raise failure[0]
        return results
