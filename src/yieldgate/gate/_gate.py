"""The Gate: client-side backpressure for one upstream, for async and sync code.

Every call passes, in order: the total deadline, the circuit breaker, the rate
cap, the concurrency window, the attempt (under its own timeout), the
classification of what came back, and the decision to try again. A ``yield``
is congestion, not failure: it narrows the window and is waited out around
the upstream's hint, but it trips no breaker and spends no retry budget.

The Gate is a façade. Its state lives in one ``GateCore`` (``_core``), each
call's decisions in a ``CallState`` (``_call``), and two drivers run them:
``_async`` for coroutines (``call``, ``hold``, ``map``) and ``_sync`` for
threads (``call_sync``, ``hold_sync``, ``map_sync``). Both share the one
window, budget, breaker and hint holds. See docs/design.md.

A call made from inside one of this Gate's own attempts, in the same task or
thread (``GovernedClient.submit`` under ``gate.map``, say), runs as part of
that attempt: the outer call already holds a window slot and retries. A
call made from a task that an attempt spawned is a call of its own.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import inspect
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Mapping
from typing import Any, ParamSpec, TypeVar, TypeVarTuple, overload

import anyio
import anyio.lowlevel

from yieldgate._exceptions import GateClosedError
from yieldgate.gate import _async, _sync
from yieldgate.gate._attempt import CURRENT, current_task
from yieldgate.gate._call import CallState
from yieldgate.gate._core import GateCore, default_clock, unique_name
from yieldgate.gate._outcome import Classifier, OutcomeKind, OutcomeSignal, default_classify
from yieldgate.gate._policy import USE_POLICY, GatePolicy, GateStatistics, UsePolicy
from yieldgate.gate._telemetry import NULL_OBSERVER, CallDetails, Instrumentation
from yieldgate.gate._telemetry import OtelInstrumentation as _Otel
from yieldgate.gate._window import Permit, Signal, Window
from yieldgate.protocol import Priority

__all__ = ["Gate", "Lease"]

# A non-awaiting attempt arms (and disarms) a deadline timer that the event loop
# only drops on its next turn: give it one every so many calls.
_CHECKPOINT_EVERY = 128

T = TypeVar("T")
R = TypeVar("R")
P = ParamSpec("P")
Ts = TypeVarTuple("Ts")

Timeout = float | UsePolicy | None


class Lease:
    """A window slot kept after a call returned (see ``Gate.call_and_hold``).

    ``release`` gives it back and tells the window how the work that followed
    went (``Signal.SUCCESS`` by default). Only the first release counts; it is
    safe from any thread.
    """

    __slots__ = ("_lock", "_permit", "_window")

    def __init__(self, window: Window, permit: Permit | None, lock: Any) -> None:
        self._window = window
        self._permit = permit
        self._lock = lock

    @property
    def released(self) -> bool:
        return self._permit is None

    def release(self, outcome: Signal = Signal.SUCCESS) -> None:
        with self._lock:
            permit, self._permit = self._permit, None
            if permit is not None:
                self._window.release(permit, outcome)


class Gate:
    """Client-side backpressure for one upstream, shared by async and sync callers.

    >>> gate = Gate(GatePolicy.cold_start(), name="hf")
    >>> result = await gate.call(client.generate, prompt)   # doctest: +SKIP
    >>> result = gate.call_sync(sync_client.generate, prompt)   # doctest: +SKIP

    Use one Gate per upstream and share it among the tasks and threads
    calling that upstream: the window, breaker and budget are only as good
    as the traffic they see.

    ``upstreams`` makes it a Gate over a set of interchangeable upstreams
    (names, or a mapping from name to a target such as a URL or a client):
    each keeps its own window, breaker and hint hold, every attempt goes to
    the one with the lowest latency cost whose breaker is not open, and a
    retry or a hedge prefers another one than the attempt before it. The
    attempt function reads ``current_attempt().upstream`` / ``.target`` to
    know where to send; ``GovernedClient`` and ``http_client`` do that
    themselves. The retry budget and the rate cap stay shared by the set.

    ``name`` labels the Gate's telemetry (default: ``gate-1``, ``gate-2``...,
    one per Gate). ``clock`` is the time every decision reads (default
    ``time.monotonic``; a test may give a virtual one).
    """

    def __init__(
        self,
        policy: GatePolicy | None = None,
        *,
        name: str | None = None,
        classify: Classifier | None = None,
        instrumentation: Instrumentation | None = None,
        rng: random.Random | None = None,
        upstreams: Mapping[str, Any] | Iterable[str] | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.policy = policy or GatePolicy()
        self.name = name if name is not None else unique_name()
        core = self._core = GateCore(
            self.policy,
            self.name,
            classify or default_classify,
            instrumentation or _Otel(),
            rng or random.Random(),  # noqa: S311 - jitter, not secrets
            clock or default_clock,
        )
        self._timer = _sync.Timer()
        if upstreams is None:
            core.upstreams.append(
                core.make_upstream(self.name, None, label=self.name, latency=core.latency)
            )
        else:
            items = (
                upstreams.items()
                if isinstance(upstreams, Mapping)
                else ((u, None) for u in upstreams)
            )
            for upstream_name, target in items:
                self.add_upstream(upstream_name, target)
            if not core.upstreams:
                raise ValueError("upstreams, when given, must name at least one upstream")

    def add_upstream(self, name: str, target: Any = None) -> None:
        """Add ``name`` (sent to ``target``) to the Gate's upstream set.

        Adding a name that is there already with the same target (or none)
        does nothing, and gives a target to a name that had none; with another
        target it is a ``ValueError``. A Gate built without ``upstreams``
        cannot take any: its one upstream is implicit.
        """
        core = self._core
        if not isinstance(name, str) or not name:
            raise ValueError(f"an upstream name must be a non-empty string, got {name!r}")
        with core.lock:
            if core.upstreams and not core.named:
                raise ValueError(
                    f"gate {self.name!r} was built without upstreams; "
                    "pass upstreams=[...] to Gate() to use several"
                )
            for upstream in core.upstreams:
                if upstream.name == name:
                    if upstream.target is None:
                        upstream.target = target  # named first, its target given now
                    elif target is not None and upstream.target != target:
                        raise ValueError(
                            f"upstream {name!r} is already registered with target "
                            f"{upstream.target!r}, not {target!r}"
                        )
                    return
            core.named = True
            core.upstreams.append(core.make_upstream(name, target, label=f"{self.name}/{name}"))

    @property
    def upstreams(self) -> tuple[str, ...]:
        """The names of the Gate's upstreams (empty for a Gate without a set)."""
        core = self._core
        return tuple(u.name for u in core.upstreams) if core.named else ()

    # -- lifecycle ----------------------------------------------------------

    def _check_open(self) -> None:
        if self._core.closed:
            raise GateClosedError(f"gate {self.name!r} is closed and cannot be reused")

    async def __aenter__(self) -> Gate:
        self._check_open()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def __enter__(self) -> Gate:
        self._check_open()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Refuse new calls from now on. Calls already running finish as usual."""
        self._core.closed = True

    async def aclose(self) -> None:
        """``close``, for ``async with``."""
        self.close()

    @property
    def closed(self) -> bool:
        return self._core.closed

    def statistics(self) -> GateStatistics:
        """A snapshot of the Gate. With several upstreams, ``window`` adds theirs
        up, ``breaker`` is their common state (or ``"mixed"``) and ``upstreams``
        has each one. Safe from any thread, in or out of an event loop."""
        return self._core.statistics()

    # -- starting a call ----------------------------------------------------

    def _nested(self) -> bool:
        """Whether the running code is one of this Gate's attempts, in its own task."""
        outer = CURRENT.get()
        return outer is not None and outer.call.core is self._core and outer.task is current_task()

    def _outer_priority(self) -> Priority | None:
        """The priority of this Gate's call that the running code is an attempt of."""
        outer = CURRENT.get()
        if outer is not None and outer.call.core is self._core:
            return outer.call.priority
        return None

    def _classify_nested(self, classify: Classifier | None, value: Any, exc: Any) -> Any:
        # Inside one of our own attempts: the outer call already holds a window
        # slot and will retry, so this ran once, as part of it (a second slot
        # from the same window could deadlock a small window).
        outcome = (classify or self._core.classify)(value, exc)
        if outcome.kind is OutcomeKind.OK:
            return outcome.value
        raise OutcomeSignal(outcome) from outcome.error

    def _new_call(self, priority: Priority | str, timeout: Timeout, *, hold: bool) -> CallState:
        core = self._core
        if core.closed:
            raise GateClosedError(f"gate {self.name!r} is closed")
        prio = priority if type(priority) is Priority else Priority(priority)
        total = self.policy.timeout.total_s if isinstance(timeout, UsePolicy) else timeout
        if total is not None and not total > 0:
            raise ValueError(f"timeout must be a positive number or None, got {total}")
        started = core.clock()
        deadline = None if total is None else started + total
        observer = core.instr.start_call(self.name, prio.value)
        with core.lock:
            core.counters.calls += 1
        return CallState(
            core, prio, deadline, started, hold=hold, observer=observer, task=current_task()
        )

    def _ended(self, call: CallState, error: BaseException | None) -> None:
        call.forget()
        core = self._core
        with core.lock:
            if error is None:
                core.counters.calls_ok += 1
            else:
                core.counters.calls_failed += 1
        if call.observer is not NULL_OBSERVER:
            call.observer.on_end(
                CallDetails(
                    gate=self.name,
                    priority=call.priority.value,
                    attempts=call.attempts,
                    outcome="ok" if error is None else type(error).__name__,
                    duration_s=core.clock() - call.started,
                )
            )

    def _lease(self, call: CallState) -> Lease:
        held = call.held
        assert held is not None
        return Lease(held[0].window, held[1], self._core.lock)

    # -- async --------------------------------------------------------------

    async def _run_async(
        self,
        fn: Callable[..., Awaitable[Any]],
        args: tuple[Any, ...],
        call: CallState,
        classify: Classifier | None,
        discard: Callable[[Any], Awaitable[None]] | None,
    ) -> Any:
        core = self._core
        core.since_checkpoint += 1
        if core.since_checkpoint >= _CHECKPOINT_EVERY:
            # Calls whose attempts never await would otherwise never let the loop
            # drop the attempt timers they disarmed (nor run anything else).
            core.since_checkpoint = 0
            await anyio.lowlevel.checkpoint()
        try:
            with call.observer.scope():
                value = await _async.run(call, fn, args, classify or core.classify, discard)
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
    ) -> Any: ...

    async def call(
        self,
        fn: Callable[[*Ts], Awaitable[Any]],
        /,
        *args: *Ts,
        priority: Priority | str = Priority.NORMAL,
        timeout: Timeout = USE_POLICY,
        classify: Classifier | None = None,
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
        call = self._new_call(priority, timeout, hold=False)
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
        value, lease = await self.call_and_hold(
            fn, *args, priority=priority, timeout=timeout, classify=classify, discard=discard
        )
        outcome = Signal.FAILURE
        try:
            yield value
            outcome = Signal.SUCCESS
        except BaseException as exc:
            if isinstance(exc, anyio.get_cancelled_exc_class()):
                outcome = Signal.CANCELLED
            raise
        finally:
            lease.release(outcome)

    async def call_and_hold(
        self,
        fn: Callable[[*Ts], Awaitable[Any]],
        /,
        *args: *Ts,
        priority: Priority | str = Priority.NORMAL,
        timeout: Timeout = USE_POLICY,
        classify: Classifier | None = None,
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
            outer = CURRENT.get()
            assert outer is not None
            value = await self.call(fn, *args, classify=classify)
            return value, Lease(outer.slot.upstream.window, None, self._core.lock)
        call = self._new_call(priority, timeout, hold=True)
        value = await self._run_async(fn, args, call, classify, discard)
        return value, self._lease(call)

    # -- sync ---------------------------------------------------------------

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
            with call.observer.scope():
                value = _sync.run(call, fn, args, classify or core.classify, discard, self._timer)
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
        call = self._new_call(priority, timeout, hold=False)
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
        discard: Callable[[Any], None] | None = None,
    ) -> Iterator[Any]:
        """``hold`` for a plain function: the slot is kept until the ``with`` block exits."""
        value, lease = self.call_and_hold_sync(
            fn, *args, priority=priority, timeout=timeout, classify=classify, discard=discard
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
        discard: Callable[[Any], None] | None = None,
    ) -> tuple[Any, Lease]:
        """``call_and_hold`` for a plain function, in the calling thread."""
        if self._nested():
            outer = CURRENT.get()
            assert outer is not None
            value = self.call_sync(fn, *args, classify=classify)
            return value, Lease(outer.slot.upstream.window, None, self._core.lock)
        call = self._new_call(priority, timeout, hold=True)
        value = self._run_sync(fn, args, call, classify, discard)
        return value, self._lease(call)

    # -- conveniences -------------------------------------------------------

    def wrap(
        self,
        fn: Callable[P, R] | None = None,
        /,
        *,
        priority: Priority | str = Priority.NORMAL,
        timeout: Timeout = USE_POLICY,
        classify: Classifier | None = None,
    ) -> Any:
        """Decorate a function so that every call goes through this Gate.

        ``@gate.wrap`` or ``@gate.wrap(priority="high", timeout=10, classify=...)``,
        on a coroutine function (calls go through ``call``) or a plain one
        (through ``call_sync``) alike.
        """

        def decorate(f: Callable[P, Any]) -> Callable[P, Any]:
            if inspect.iscoroutinefunction(f):

                @functools.wraps(f)
                async def wrapper(*args: P.args, **kwargs: P.kwargs) -> Any:
                    return await self.call(
                        functools.partial(f, *args, **kwargs),
                        priority=priority,
                        timeout=timeout,
                        classify=classify,
                    )

                return wrapper

            @functools.wraps(f)
            def sync_wrapper(*args: P.args, **kwargs: P.kwargs) -> Any:
                return self.call_sync(
                    functools.partial(f, *args, **kwargs),
                    priority=priority,
                    timeout=timeout,
                    classify=classify,
                )

            return sync_wrapper

        return decorate(fn) if fn is not None else decorate

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
                        fn, item, priority=priority, timeout=timeout, classify=classify
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
                    fn, item, priority=priority, timeout=timeout, classify=classify
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

    def _map_limit(self, concurrency: int | None) -> int:
        limit = concurrency if concurrency is not None else self.policy.window.max
        if limit < 1:
            raise ValueError("concurrency must be >= 1")
        return limit
