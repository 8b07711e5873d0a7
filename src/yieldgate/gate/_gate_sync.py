"""The Gate's sync calls: ``call_sync``, ``hold_sync``, ``call_and_hold_sync``, ``map_sync``.

Each starts a ``CallState`` (``GateBase``) and hands it to the sync driver
(``_sync``), in the calling thread. They share the Gate's window, budget,
breaker and hint holds with its async calls.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar, TypeVarTuple

from yieldgate.gate import _sync
from yieldgate.gate._call import CallState
from yieldgate.gate._calls import GateBase, Lease, Timeout
from yieldgate.gate._outcome import Classifier
from yieldgate.gate._policy import USE_POLICY
from yieldgate.gate._quota import Cost
from yieldgate.gate._telemetry import NULL_OBSERVER
from yieldgate.gate._window import Signal
from yieldgate.protocol import Priority

__all__ = ["SyncCalls"]

T = TypeVar("T")
R = TypeVar("R")
Ts = TypeVarTuple("Ts")


class SyncCalls(GateBase):
    """The thread side of a Gate."""

    _timer: _sync.Timer

    def _run_sync(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        call: CallState,
        classify: Classifier | None,
        discard: Callable[[Any], None] | None,
    ) -> Any:
        core = self._core
        try:
            if call.observer is NULL_OBSERVER:
                value = _sync.run(call, fn, args, classify or core.classify, discard, self._timer)
            else:
                with call.observer.scope():
                    value = _sync.run(
                        call, fn, args, classify or core.classify, discard, self._timer
                    )
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
    ) -> Any:
        """``call`` for a plain function, in the calling thread (the sync driver).

        Shares this Gate's window, budget, breaker and hint holds with every
        other caller, sync or async. An attempt is not interrupted at its
        deadline (a thread cannot be): the code it runs reads
        ``current_attempt().remaining_s()``, as the transports do.
        """
        if self._nested():
            try:
                value = fn(*args)
            except Exception as exc:
                return self._classify_nested(classify, None, exc)
            return self._classify_nested(classify, value, None)
        call = self._new_call(priority, timeout, hold=False, cost=cost)
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
    ) -> Iterator[Any]:
        """``hold`` for a plain function: the slot is kept until the ``with`` block exits."""
        value, lease = self.call_and_hold_sync(
            fn,
            *args,
            priority=priority,
            timeout=timeout,
            classify=classify,
            discard=discard,
            cost=cost,
        )
        outcome = Signal.FAILURE
        try:
            yield value
            outcome = Signal.SUCCESS
        finally:
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
    ) -> tuple[Any, Lease]:
        """``call_and_hold`` for a plain function, in the calling thread."""
        if self._nested():
            return self.call_sync(fn, *args, classify=classify), self._nested_lease()
        call = self._new_call(priority, timeout, hold=True, cost=cost)
        value = self._run_sync(fn, args, call, classify, discard)
        return value, self._lease(call)

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
    ) -> list[R | BaseException]:
        """``map`` for a plain function, on ``concurrency`` worker threads.

        The first failure stops the items not yet started and is raised once
        the calls in flight end, unless ``return_exceptions``.
        """
        work = list(items)
        limit = self._map_limit(concurrency)
        results: list[Any] = [None] * len(work)
        stop = False

        def one(index: int, item: T) -> None:
            if stop:
                return
            try:
                results[index] = self.call_sync(
                    fn, item, priority=priority, timeout=timeout, classify=classify, cost=cost
                )
            except Exception as exc:
                results[index] = exc
                raise

        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, min(limit, len(work)))) as ex:
            futures = [ex.submit(one, i, item) for i, item in enumerate(work)]
            for future in futures:
                error = future.exception()
                if error is not None and not return_exceptions:
                    stop = True
                    for other in futures:
                        other.cancel()
                    raise error
        return results
