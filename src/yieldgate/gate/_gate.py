"""The Gate: client-side backpressure for one upstream.

Every call passes, in order: the total deadline, the circuit breaker, the rate
cap, the concurrency window, the attempt (under its own timeout), the
classification of what came back, and the decision to try again. A ``yield``
is congestion, not failure: it narrows the window and is waited out around
the upstream's hint, but it trips no breaker and spends no retry budget.

The first attempt runs inline; only a call that must wait and try again
enters the retry loop (tenacity, kept private), so the common case costs
little more than the attempt itself.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import math
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Final, ParamSpec, TypeVar, TypeVarTuple, overload

import anyio
from tenacity import AsyncRetrying, RetryCallState, retry_if_result

from yieldgate._exceptions import (
    AttemptTimeoutError,
    CallFailedError,
    CircuitOpenError,
    DeadlineExceededError,
    GateClosedError,
    RetriesExhaustedError,
    RetryBudgetExhaustedError,
    YieldExhaustedError,
    YieldgateError,
)
from yieldgate.gate._breaker import Breaker, BreakerPolicy, BreakerState, Verdict
from yieldgate.gate._budget import RetryBudget, RetryBudgetPolicy
from yieldgate.gate._outcome import (
    Classifier,
    Outcome,
    OutcomeKind,
    OutcomeSignal,
    default_classify,
)
from yieldgate.gate._ratecap import RateCap, RatePolicy
from yieldgate.gate._retry import (
    RetryPolicy,
    TimeoutPolicy,
    backoff_floor_s,
    backoff_s,
    hinted_wait_s,
)
from yieldgate.gate._telemetry import (
    NULL_OBSERVER,
    AttemptDetails,
    BreakerChange,
    CallDetails,
    CallObserver,
    Instrumentation,
    OtelInstrumentation,
    WaitDetails,
    WindowChange,
)
from yieldgate.gate._window import Permit, Signal, Window, WindowPolicy, WindowStatistics
from yieldgate.protocol import Priority

# Priorities in increasing order, for holds that cover a priority and those below it.
_RANK = {Priority.LOW: 0, Priority.NORMAL: 1, Priority.HIGH: 2}

__all__ = [
    "USE_POLICY",
    "AttemptInfo",
    "Gate",
    "GatePolicy",
    "GateStatistics",
    "Lease",
    "UsePolicy",
    "current_attempt",
]

T = TypeVar("T")
R = TypeVar("R")
P = ParamSpec("P")
Ts = TypeVarTuple("Ts")


class UsePolicy:
    """The type of ``USE_POLICY``."""

    def __repr__(self) -> str:
        return "USE_POLICY"


USE_POLICY: Final = UsePolicy()
"""``timeout=USE_POLICY`` (the default): the policy's total time; ``None``: no limit."""

_SIGNALS: Final = {
    OutcomeKind.OK: (Signal.SUCCESS, Verdict.SUCCESS),
    OutcomeKind.YIELD: (Signal.CONGESTION, Verdict.NEUTRAL),
    OutcomeKind.OVERLOADED: (Signal.CONGESTION, Verdict.NEUTRAL),
    OutcomeKind.RETRYABLE: (Signal.FAILURE, Verdict.FAILURE),
    OutcomeKind.FATAL: (Signal.FAILURE, Verdict.NEUTRAL),
}


@dataclass(frozen=True, slots=True, kw_only=True)
class GatePolicy:
    """Everything a Gate does, in one frozen record. The defaults are safe:
    slow start from 2 up to 64 in flight, 4 attempts, a 20% retry budget, a
    breaker after 5 consecutive failures, 60 s per attempt and 300 s in all.
    """

    window: WindowPolicy = field(default_factory=WindowPolicy)
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    budget: RetryBudgetPolicy = field(default_factory=RetryBudgetPolicy)
    breaker: BreakerPolicy = field(default_factory=BreakerPolicy)
    timeouts: TimeoutPolicy = field(default_factory=TimeoutPolicy)
    rate: RatePolicy | None = None

    @classmethod
    def cold_start(cls, *, max_concurrency: int = 16, per_s: float | None = None) -> GatePolicy:
        """For a backend that may be loading: one in flight at first, a patient retry
        policy, and (given ``per_s``) a rate that ramps up over 30 s."""
        rate = None
        if per_s is not None:
            rate = RatePolicy(per_s=per_s, ramp_from_per_s=min(1.0, per_s), ramp_s=30.0)
        return cls(
            window=WindowPolicy(initial=1, max=max_concurrency),
            retry=RetryPolicy(max_attempts=5, max_yields=200),
            timeouts=TimeoutPolicy(attempt_s=120.0, total_s=600.0),
            rate=rate,
        )

    @classmethod
    def interactive(cls) -> GatePolicy:
        """A person is waiting: tight timeouts, few retries, fail fast."""
        return cls(
            retry=RetryPolicy(max_attempts=3, max_yields=16, max_backoff_s=2.0),
            timeouts=TimeoutPolicy(attempt_s=30.0, total_s=45.0),
        )

    @classmethod
    def batch(cls) -> GatePolicy:
        """Throughput over latency: ride out long overloads, patiently."""
        return cls(
            retry=RetryPolicy(max_attempts=6, max_yields=1000, max_backoff_s=30.0),
            timeouts=TimeoutPolicy(attempt_s=300.0, total_s=3600.0),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class GateStatistics:
    """A snapshot of one Gate."""

    name: str
    window: WindowStatistics
    breaker: str
    breaker_failures: int
    retry_allowance: float
    calls: int
    calls_ok: int
    calls_failed: int
    attempts: int
    yields: int
    overloads: int
    failures: int
    retries: int
    waited_s: float
    rejected_open: int
    rate_per_s: float | None


@dataclass(frozen=True, slots=True, kw_only=True)
class AttemptInfo:
    """The attempt running now in this task (see ``current_attempt``)."""

    gate: str
    number: int
    priority: Priority
    deadline: float | None

    def remaining_s(self) -> float | None:
        """Seconds left for this attempt (its timeout or the call's deadline), or None."""
        if self.deadline is None:
            return None
        return max(0.0, self.deadline - anyio.current_time())


# Holds the running call; the AttemptInfo record is only built when asked for.
_current: contextvars.ContextVar[_Call | None] = contextvars.ContextVar(
    "yieldgate_attempt", default=None
)


def current_attempt() -> AttemptInfo | None:
    """The attempt this code runs under, or ``None`` outside a Gate.

    Transports read it to send the remaining budget upstream (``deadline_ms``).
    """
    call = _current.get()
    if call is None:
        return None
    return AttemptInfo(
        gate=call.gate.name,
        number=call.attempts,
        priority=call.priority,
        deadline=call.attempt_deadline,
    )


@dataclass
class _Counters:
    calls: int = 0
    calls_ok: int = 0
    calls_failed: int = 0
    attempts: int = 0
    yields: int = 0
    overloads: int = 0
    failures: int = 0
    retries: int = 0
    waited_s: float = 0.0
    rejected_open: int = 0


class Gate:
    """Client-side backpressure for one upstream.

    >>> gate = Gate(GatePolicy.cold_start(), name="hf")
    >>> result = await gate.call(client.generate, prompt)   # doctest: +SKIP

    Use one Gate per upstream and share it among the tasks calling that
    upstream: the window, breaker and budget are only as good as the traffic
    they see.
    """

    def __init__(
        self,
        policy: GatePolicy | None = None,
        *,
        name: str = "default",
        classify: Classifier | None = None,
        instrumentation: Instrumentation | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.policy = policy or GatePolicy()
        self.name = name
        self._classify = classify or default_classify
        self._instr: Instrumentation = instrumentation or OtelInstrumentation()
        self._rng = rng or random.Random()  # noqa: S311 - jitter, not secrets
        clock = anyio.current_time
        self._window = Window(self.policy.window, on_change=self._window_changed)
        self._breaker = Breaker(
            self.policy.breaker, clock, name=name, on_change=self._breaker_changed
        )
        self._budget = RetryBudget(self.policy.budget, clock)
        self._rate: RateCap | None = None
        self._counters = _Counters()
        self._closed = False
        # Per priority rank (low, normal, high): no attempt starts before this
        # time, set from upstream hints when the retry policy shares them.
        self._hold_until = [0.0, 0.0, 0.0]

    # -- lifecycle ----------------------------------------------------------

    async def __aenter__(self) -> Gate:
        if self._closed:
            raise GateClosedError(f"gate {self.name!r} is closed and cannot be reused")
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Refuse new calls from now on. Calls already running finish as usual."""
        self._closed = True

    @property
    def closed(self) -> bool:
        return self._closed

    # -- telemetry hooks ----------------------------------------------------

    def _window_changed(self, old: int, new: int) -> None:
        self._instr.on_window_change(WindowChange(gate=self.name, old=old, new=new))

    def _breaker_changed(self, old: BreakerState, new: BreakerState) -> None:
        self._instr.on_breaker_change(BreakerChange(gate=self.name, old=str(old), new=str(new)))

    def statistics(self) -> GateStatistics:
        c = self._counters
        return GateStatistics(
            name=self.name,
            window=self._window.statistics(),
            breaker=str(self._breaker.state),
            breaker_failures=self._breaker.failures,
            retry_allowance=self._budget.allowance(),
            calls=c.calls,
            calls_ok=c.calls_ok,
            calls_failed=c.calls_failed,
            attempts=c.attempts,
            yields=c.yields,
            overloads=c.overloads,
            failures=c.failures,
            retries=c.retries,
            waited_s=c.waited_s,
            rejected_open=c.rejected_open,
            rate_per_s=None if self._rate is None else self._rate.rate_now(),
        )

    def _rate_cap(self) -> RateCap | None:
        # Built on first use: it reads the running loop's clock, and a ramp
        # should start when traffic does, not when the Gate was constructed.
        if self._rate is None and self.policy.rate is not None:
            self._rate = RateCap(self.policy.rate, anyio.current_time)
        return self._rate

    # -- calling ------------------------------------------------------------

    @overload
    async def call(
        self,
        fn: Callable[[*Ts], Awaitable[Outcome]],
        /,
        *args: *Ts,
        priority: Priority | str = ...,
        timeout: float | UsePolicy | None = ...,
        classify: Classifier | None = ...,
    ) -> Any: ...

    @overload
    async def call(
        self,
        fn: Callable[[*Ts], Awaitable[T]],
        /,
        *args: *Ts,
        priority: Priority | str = ...,
        timeout: float | UsePolicy | None = ...,
        classify: Classifier | None = ...,
    ) -> T: ...

    async def call(
        self,
        fn: Callable[[*Ts], Awaitable[Any]],
        /,
        *args: *Ts,
        priority: Priority | str = Priority.NORMAL,
        timeout: float | UsePolicy | None = USE_POLICY,
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
        stopped trying (retries, yields or budget exhausted, deadline, open
        circuit).
        """
        outer = _current.get()
        if outer is not None and outer.gate is self:
            return await self._nested(fn, args, classify)
        call = self._new_call(fn, args, priority, timeout, classify, hold=False)
        value: Any = await self._run(call)
        return value

    async def _nested(
        self, fn: Callable[..., Awaitable[Any]], args: tuple[Any, ...], classify: Classifier | None
    ) -> Any:
        # Called from inside one of our own attempts: the outer call already
        # holds a window slot and will retry, so this runs once, as part of it
        # (a second slot from the same window could deadlock a small window).
        classify = classify or self._classify
        try:
            value = await fn(*args)
        except Exception as exc:
            outcome = classify(None, exc)
        else:
            outcome = classify(value, None)
        if outcome.kind is OutcomeKind.OK:
            return outcome.value
        raise OutcomeSignal(outcome) from outcome.error

    @contextlib.asynccontextmanager
    async def hold(
        self,
        fn: Callable[[*Ts], Awaitable[Any]],
        /,
        *args: *Ts,
        priority: Priority | str = Priority.NORMAL,
        timeout: float | UsePolicy | None = USE_POLICY,
        classify: Classifier | None = None,
    ) -> AsyncIterator[Any]:
        """Like ``call``, but keep the window slot until the ``async with`` block exits.

        For work that goes on after the attempt returns: a stream read chunk by
        chunk, a response body read later. The retries (and ``timeout``) cover
        getting the value; what the block then does is bounded by the caller.
        A block that raises tells the window its attempt failed.
        """
        value, lease = await self.call_and_hold(
            fn, *args, priority=priority, timeout=timeout, classify=classify
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
        timeout: float | UsePolicy | None = USE_POLICY,
        classify: Classifier | None = None,
    ) -> tuple[Any, Lease]:
        """``call``, returning the value and a ``Lease`` on the window slot it used.

        The slot stays taken until ``lease.release()``: the building block of
        ``hold`` for code that cannot keep an ``async with`` open, such as an
        HTTP transport whose response body is closed later by someone else.
        A lease that is never released keeps its slot; release it in a
        ``finally``.
        """
        outer = _current.get()
        if outer is not None and outer.gate is self:
            # Inside one of our own attempts: it holds the slot already.
            return await self._nested(fn, args, classify), Lease(self._window, None)
        call = self._new_call(fn, args, priority, timeout, classify, hold=True)
        value = await self._run(call)
        assert call.held is not None
        return value, Lease(self._window, call.held)

    def _new_call(
        self,
        fn: Callable[..., Awaitable[Any]],
        args: tuple[Any, ...],
        priority: Priority | str,
        timeout: float | UsePolicy | None,
        classify: Classifier | None,
        *,
        hold: bool,
    ) -> _Call:
        if self._closed:
            raise GateClosedError(f"gate {self.name!r} is closed")
        prio = priority if type(priority) is Priority else Priority(priority)
        total = self.policy.timeouts.total_s if isinstance(timeout, UsePolicy) else timeout
        if total is not None and not total > 0:
            raise ValueError(f"timeout must be a positive number or None, got {total}")
        started = anyio.current_time()
        deadline = None if total is None else started + total
        call = _Call(self, fn, args, prio, deadline, classify or self._classify, started)
        call.hold = hold
        return call

    async def _run(self, call: _Call) -> Any:
        observer = self._instr.start_call(self.name, call.priority.value)
        call.observer = observer
        self._counters.calls += 1
        outcome_name = "ok"
        try:
            with observer.scope():
                value = await call.run()
        except BaseException as exc:
            outcome_name = type(exc).__name__
            self._counters.calls_failed += 1
            raise
        finally:
            call.forget()
            if observer is not NULL_OBSERVER:
                observer.on_end(
                    CallDetails(
                        gate=self.name,
                        priority=call.priority.value,
                        attempts=call.attempts,
                        outcome=outcome_name,
                        duration_s=anyio.current_time() - call.started,
                    )
                )
        self._counters.calls_ok += 1
        return value

    @overload
    def wrap(self, fn: Callable[P, Awaitable[R]], /) -> Callable[P, Awaitable[R]]: ...

    @overload
    def wrap(
        self,
        fn: None = None,
        /,
        *,
        priority: Priority | str = ...,
        timeout: float | UsePolicy | None = ...,
        classify: Classifier | None = ...,
    ) -> Callable[[Callable[P, Awaitable[R]]], Callable[P, Awaitable[R]]]: ...

    def wrap(
        self,
        fn: Callable[P, Awaitable[R]] | None = None,
        /,
        *,
        priority: Priority | str = Priority.NORMAL,
        timeout: float | UsePolicy | None = USE_POLICY,
        classify: Classifier | None = None,
    ) -> Any:
        """Decorate an async function so that every call goes through this Gate.

        ``@gate.wrap`` or ``@gate.wrap(priority="high", timeout=10, classify=...)``.
        """

        def decorate(f: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
            @functools.wraps(f)
            async def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
                result: R = await self.call(
                    functools.partial(f, *args, **kwargs),
                    priority=priority,
                    timeout=timeout,
                    classify=classify,
                )
                return result

            return wrapper

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
        timeout: float | UsePolicy | None = USE_POLICY,
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
        limit = concurrency if concurrency is not None else self.policy.window.max
        if limit < 1:
            raise ValueError("concurrency must be >= 1")
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


class Lease:
    """A window slot kept after a call returned (see ``Gate.call_and_hold``).

    ``release`` gives it back and tells the window how the work that followed
    went (``Signal.SUCCESS`` by default). Only the first release counts.
    """

    __slots__ = ("_permit", "_window")

    def __init__(self, window: Window, permit: Permit | None) -> None:
        self._window = window
        self._permit = permit

    @property
    def released(self) -> bool:
        return self._permit is None

    def release(self, outcome: Signal = Signal.SUCCESS) -> None:
        permit, self._permit = self._permit, None
        if permit is not None:
            self._window.release(permit, outcome)


class _Call:
    """One call's state across its attempts."""

    def __init__(
        self,
        gate: Gate,
        fn: Callable[..., Awaitable[Any]],
        args: tuple[Any, ...],
        priority: Priority,
        deadline: float | None,
        classify: Classifier,
        started: float,
    ) -> None:
        self.gate = gate
        self.started = started
        self.hold = False
        self.held: Permit | None = None
        self.fn = fn
        self.args = args
        self.priority = priority
        self.deadline = deadline
        self.classify = classify
        self.observer: CallObserver
        self.attempts = 0
        self.congestion = 0
        self.last: Outcome | None = None
        self.last_hint_s: float | None = None
        self.stop_error: YieldgateError | None = None
        self.attempt_deadline: float | None = None

    def forget(self) -> None:
        """Drop what the call carried, once it is over.

        Timers armed during an attempt keep a copy of its context, which holds
        this call, until they fire or are purged: the request and its response
        must not live that long with them.
        """
        self.fn = _done
        self.args = ()
        self.last = None

    def _error(self, cls: type[YieldgateError], message: str, **extra: Any) -> YieldgateError:
        return cls(
            message,
            attempts=self.attempts,
            last_hint_s=self.last_hint_s,
            last_outcome=self.last,
            **extra,
        )

    async def run(self) -> Any:
        # No scope spans the whole call: attempts carry the deadline in their own
        # scope, waits for the window or rate cap get one only when they must
        # wait, and a retry wait that would pass the deadline is never started.
        outcome = await self.attempt()
        if outcome.kind is not OutcomeKind.OK and outcome.kind is not OutcomeKind.FATAL:
            outcome = await self.retry_loop(outcome)
        return self.finish(outcome)

    def finish(self, outcome: Outcome) -> Any:
        if outcome.kind is OutcomeKind.OK:
            return outcome.value
        if self.stop_error is not None:
            raise self.stop_error from outcome.error
        raise self._error(CallFailedError, f"call failed: {outcome.describe()}") from outcome.error

    def _deadline_error(self, while_: str) -> YieldgateError:
        return self._error(
            DeadlineExceededError,
            f"call exceeded its total timeout {while_} after {self.attempts} attempt(s)",
        )

    # -- one attempt --------------------------------------------------------

    async def attempt(self) -> Outcome:
        gate = self.gate
        breaker = gate._breaker
        try:
            breaker.check()  # fail fast before queueing for anything
        except CircuitOpenError as exc:
            raise self._circuit_error(exc) from None
        waited = await self._wait_out_hint()
        while True:
            permit = gate._window.try_acquire(self.priority)
            if permit is None:
                waited = True
                permit = await self._wait(
                    functools.partial(gate._window.acquire, self.priority),
                    "waiting for a window slot",
                )
            # A hint may have come in while this call queued for the slot: then
            # the slot goes back and the call waits the hint out like the rest.
            if gate._hold_until[_RANK[self.priority]] <= anyio.current_time():
                break
            gate._window.release(permit, Signal.CANCELLED)
            await self._wait_out_hint()
        try:
            # The rate token is taken last, by a caller that can start at once:
            # taken before the window, tokens would pile up in its queue and
            # be spent together when slots free.
            rate = gate._rate_cap()
            if rate is not None:
                waited = True
                await self._wait(rate.acquire, "waiting for the rate cap")
            # Claimed only now that we can send: a half-open probe never queues.
            ticket = breaker.acquire()
        except BaseException as exc:
            gate._window.release(permit, Signal.CANCELLED)
            if isinstance(exc, CircuitOpenError):
                raise self._circuit_error(exc) from None
            raise
        self.attempts += 1
        number = self.attempts
        gate._counters.attempts += 1
        started = anyio.current_time() if waited or number > 1 else self.started
        if number == 1:
            # A request, for the retry budget, is a call that sent something; it
            # counts from when it was sent.
            gate._budget.deposit(started)
        signal = Signal.CANCELLED
        verdict = Verdict.NEUTRAL
        try:
            outcome = await self._invoke(number, started)
            if outcome.kind is OutcomeKind.OK:
                signal, verdict = Signal.SUCCESS, Verdict.SUCCESS
            else:
                signal, verdict = _SIGNALS[outcome.kind]
                if isinstance(outcome.error, AttemptTimeoutError):
                    # A timeout is what a backend that buffers instead of yielding
                    # shows under overload: narrow the window as for a yield.
                    signal = Signal.CONGESTION
        finally:
            if self.hold and signal is Signal.SUCCESS:
                self.held = permit  # released by Gate.hold when its block exits
            else:
                gate._window.release(permit, signal)
            breaker.record(ticket, verdict)
        self._note(outcome, number, started)
        return outcome

    def _circuit_error(self, exc: CircuitOpenError) -> CircuitOpenError:
        self.gate._counters.rejected_open += 1
        return CircuitOpenError(
            exc.message,
            retry_after_s=exc.retry_after_s,
            attempts=self.attempts,
            last_hint_s=self.last_hint_s,
            last_outcome=self.last,
        )

    async def _wait_out_hint(self) -> bool:
        """Wait until a hint the upstream gave this Gate has passed; ``True`` if it waited."""
        until = self.gate._hold_until[_RANK[self.priority]]
        if until <= 0.0:
            return False
        now = anyio.current_time()
        if until <= now:
            return False
        if self.deadline is not None and until > self.deadline:
            raise self._error(
                DeadlineExceededError,
                f"the upstream asked to wait {until - now:.3f} s, past the call's deadline "
                f"({self.deadline - now:.3f} s left), after {self.attempts} attempt(s)",
            )
        await self._sleep(until - now)
        return True

    async def _wait(self, fn: Callable[[], Awaitable[T]], while_: str) -> T:
        """Await ``fn()`` within the call's deadline."""
        if self.deadline is None:
            return await fn()
        with anyio.CancelScope(deadline=self.deadline):
            return await fn()
        raise self._deadline_error(while_)

    async def _invoke(self, number: int, now: float) -> Outcome:
        attempt_s = self.gate.policy.timeouts.attempt_s
        limit = math.inf if attempt_s is None else now + attempt_s
        if self.deadline is not None and self.deadline < limit:
            limit = self.deadline
        self.attempt_deadline = None if limit == math.inf else limit
        token = _current.set(self)
        try:
            # One scope bounds the attempt by whichever ends first: its own
            # timeout or the call's deadline.
            with anyio.CancelScope(deadline=limit):
                try:
                    value = await self.fn(*self.args)
                except Exception as exc:
                    return self.classify(None, exc)
                return self.classify(value, None)
        finally:
            _current.reset(token)
        if self.deadline is not None and limit == self.deadline:
            raise self._deadline_error("during an attempt")
        return Outcome.retryable(
            AttemptTimeoutError(f"attempt {number} ran past {attempt_s} s", attempts=number)
        )

    def _note(self, outcome: Outcome, number: int, started: float) -> None:
        gate = self.gate
        self.last = outcome
        if outcome.hint_s is not None:
            self.last_hint_s = outcome.hint_s
        kind = outcome.kind
        if kind is OutcomeKind.YIELD:
            gate._counters.yields += 1
        elif kind is OutcomeKind.OVERLOADED:
            gate._counters.overloads += 1
        elif kind is OutcomeKind.RETRYABLE or kind is OutcomeKind.FATAL:
            gate._counters.failures += 1
        if outcome.reason == "cold_start" and gate._rate is not None:
            gate._rate.restart_ramp()
        if outcome.hint_s is not None and (
            kind is OutcomeKind.YIELD or kind is OutcomeKind.OVERLOADED
        ):
            retry = gate.policy.retry
            if retry.share_hints and retry.honour_hints:
                until = anyio.current_time() + min(max(outcome.hint_s, 0.0), retry.max_hint_s)
                holds = gate._hold_until
                for rank in range(_RANK[self.priority] + 1):
                    if until > holds[rank]:
                        holds[rank] = until
        if self.observer is not NULL_OBSERVER:
            self.observer.on_attempt(
                AttemptDetails(
                    gate=gate.name,
                    attempt=number,
                    outcome=kind,
                    reason=outcome.reason,
                    hint_s=outcome.hint_s,
                    duration_s=anyio.current_time() - started,
                )
            )

    # -- retrying -----------------------------------------------------------

    async def retry_loop(self, first: Outcome) -> Outcome:
        replay = [first]

        async def step() -> Outcome:
            # The first outcome is already in hand: tenacity starts by judging it.
            if replay:
                return replay.pop()
            return await self.attempt()

        # tenacity asks `wait` before `stop`: the decision is made in _decide
        # (the wait), and `stop` only reads it.
        retrying = AsyncRetrying(
            sleep=self._sleep,
            wait=self._decide,
            stop=lambda _state: self.stop_error is not None,
            retry=retry_if_result(_needs_retry),
            retry_error_callback=_last_result,
            reraise=True,
        )
        outcome: Outcome = await retrying(step)
        return outcome

    async def _sleep(self, seconds: float) -> None:
        started = anyio.current_time()
        try:
            await anyio.sleep(seconds)
        finally:
            self.gate._counters.waited_s += anyio.current_time() - started

    def _decide(self, state: RetryCallState) -> float:
        """Decide whether to try again and, if so, after how long (0 when stopping)."""
        assert state.outcome is not None
        outcome: Outcome = state.outcome.result()
        gate = self.gate
        policy = gate.policy.retry
        if outcome.is_congestion:
            self.congestion += 1
            if self.congestion > policy.max_yields:
                return self._stop(
                    YieldExhaustedError,
                    f"upstream still congested after {self.congestion} yield(s)/overload(s): "
                    f"{outcome.describe()}",
                )
            n = self.congestion
        else:
            n = self.attempts - self.congestion
            if n >= policy.max_attempts:
                return self._stop(
                    RetriesExhaustedError,
                    f"gave up after {n} failed attempt(s): {outcome.describe()}",
                )
        hint = outcome.hint_s if policy.honour_hints else None
        if hint is not None:
            wait = hinted_wait_s(policy, hint, gate._rng)
            floor = min(hint, policy.max_hint_s)
        else:
            wait = backoff_s(policy, n, gate._rng)
            floor = backoff_floor_s(policy, n)
        if self.deadline is not None:
            # Give up only when even the least wait would overrun the deadline;
            # the jitter above it is trimmed to fit.
            left = self.deadline - anyio.current_time()
            if floor > left:
                return self._stop(
                    DeadlineExceededError,
                    f"the next wait ({floor:.3f} s at least) would pass the call's deadline "
                    f"({left:.3f} s left) after {self.attempts} attempt(s): {outcome.describe()}",
                )
            wait = min(wait, left)
        retry_after = gate._breaker.retry_after_s()
        if retry_after > wait:
            # The breaker opened meanwhile and will still be open when we wake.
            return self._stop(
                CircuitOpenError,
                f"circuit opened while retrying; next probe in {retry_after:.2f} s: "
                f"{outcome.describe()}",
                retry_after_s=retry_after,
            )
        if outcome.kind is not OutcomeKind.YIELD and not gate._budget.try_withdraw():
            return self._stop(
                RetryBudgetExhaustedError,
                f"retry budget spent (too many retries recently): {outcome.describe()}",
            )
        gate._counters.retries += 1
        if self.observer is not NULL_OBSERVER:
            self.observer.on_wait(
                WaitDetails(
                    gate=gate.name,
                    next_attempt=self.attempts + 1,
                    wait_s=wait,
                    cause=outcome.kind,
                    hint_s=outcome.hint_s,
                )
            )
        return wait

    def _stop(self, cls: type[YieldgateError], message: str, **extra: Any) -> float:
        self.stop_error = self._error(cls, message, **extra)
        return 0.0


async def _done() -> Any:
    raise RuntimeError("this call is over")


def _needs_retry(outcome: Outcome) -> bool:
    return outcome.kind is not OutcomeKind.OK and outcome.kind is not OutcomeKind.FATAL


def _last_result(state: RetryCallState) -> Outcome:
    assert state.outcome is not None
    outcome: Outcome = state.outcome.result()
    return outcome
