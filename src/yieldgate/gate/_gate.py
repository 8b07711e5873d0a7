"""The Gate: client-side backpressure for one upstream.

Every call passes, in order: the total deadline, the circuit breaker, the rate
cap, the concurrency window, the attempt (under its own timeout), the
classification of what came back, and the decision to try again. A ``yield``
is congestion, not failure: it narrows the window and is waited out around
the upstream's hint, but it trips no breaker and spends no retry budget.

The first attempt runs inline; only a call that must wait and try again
enters the retry loop (tenacity, kept private), so the common case costs
little more than the attempt itself.

A call made from inside one of this Gate's own attempts, in the same task
(``GovernedClient.submit`` under ``gate.map``, say), runs as part of that
attempt: the outer call already holds a window slot and retries. A call made
from a task that an attempt spawned is a call of its own, with its own slot,
retries and deadline: a fan-out through the Gate is bounded by its window
like any other traffic.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import math
import random
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, ParamSpec, TypeVar, TypeVarTuple, overload

import anyio
import anyio.lowlevel
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
from yieldgate.gate._breaker import Breaker, BreakerPolicy, BreakerState, BreakerTicket, Verdict
from yieldgate.gate._budget import RetryBudget, RetryBudgetPolicy
from yieldgate.gate._hedge import HedgePolicy, LatencyTracker
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
    hinted_floor_s,
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
from yieldgate.gate._upstream import Upstream, UpstreamStatistics, choose
from yieldgate.gate._window import Permit, Signal, Window, WindowPolicy, WindowStatistics
from yieldgate.protocol import Priority

# A non-awaiting attempt arms (and disarms) a deadline timer that the event loop
# only drops on its next turn: give it one every so many calls.
_CHECKPOINT_EVERY = 128

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
    OutcomeKind.YIELD: (Signal.REFUSED, Verdict.NEUTRAL),
    OutcomeKind.OVERLOADED: (Signal.CONGESTION, Verdict.NEUTRAL),
    OutcomeKind.RETRYABLE: (Signal.FAILURE, Verdict.FAILURE),
    OutcomeKind.FATAL: (Signal.FAILURE, Verdict.NEUTRAL),
}


@dataclass(frozen=True, slots=True, kw_only=True)
class GatePolicy:
    """Everything a Gate does, in one frozen record. The defaults are safe:
    slow start from 8 up to 64 in flight, 4 attempts, a 20% retry budget, a
    breaker after 5 consecutive failures, 60 s per attempt and 300 s in all,
    no rate cap and no hedging. With several upstreams, ``window`` and
    ``breaker`` apply to each of them.
    """

    window: WindowPolicy = field(default_factory=WindowPolicy)
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    budget: RetryBudgetPolicy = field(default_factory=RetryBudgetPolicy)
    breaker: BreakerPolicy = field(default_factory=BreakerPolicy)
    timeouts: TimeoutPolicy = field(default_factory=TimeoutPolicy)
    rate: RatePolicy | None = None
    hedge: HedgePolicy | None = None

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
    hedges: int = 0
    hedge_wins: int = 0
    hedges_denied: int = 0
    losers_cancelled: int = 0
    upstreams: tuple[UpstreamStatistics, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class AttemptInfo:
    """The attempt running now in this task (see ``current_attempt``).

    ``upstream`` names the member of the Gate's upstream set this attempt was
    sent to and ``target`` is what was registered for it (a URL, a client);
    both are ``None`` for a Gate without upstreams. ``hedging`` is true when
    the call may run several attempts at once (a hedge policy is set): a
    transport then keeps each attempt cancellable on its own. ``deadline`` is
    the attempt's (its timeout or the call's, whichever ends first);
    ``call_deadline`` the whole call's (``None``: no total timeout).
    """

    gate: str
    number: int
    priority: Priority
    deadline: float | None
    upstream: str | None = None
    target: Any = None
    hedging: bool = False
    call_deadline: float | None = None

    def remaining_s(self) -> float | None:
        """Seconds left for this attempt (its timeout or the call's deadline), or None."""
        if self.deadline is None:
            return None
        return max(0.0, self.deadline - anyio.current_time())

    def call_remaining_s(self) -> float | None:
        """Seconds left of the whole call's total timeout, or None if it has none.

        What a stream carries upstream: it goes on past its attempt (its first
        chunk), within the budget the caller gave the call.
        """
        if self.call_deadline is None:
            return None
        return max(0.0, self.call_deadline - anyio.current_time())


class _Attempt:
    """One attempt of a hedged call in flight: what ``current_attempt`` reports.

    An attempt of a call that is never hedged is described by the ``_Call``
    itself, which has the same fields: one object less per call.
    """

    __slots__ = ("attempt_deadline", "attempt_number", "call", "task", "upstream")

    def __init__(
        self, call: _Call, number: int, deadline: float | None, upstream: Upstream, task: object
    ) -> None:
        self.call = call
        self.attempt_number = number
        self.attempt_deadline = deadline
        self.upstream = upstream
        self.task = task


def _current_task() -> object:
    """The running task, as cheaply as the event loop allows (asyncio, else trio)."""
    try:
        return asyncio.current_task()
    except RuntimeError:  # no asyncio loop running: trio
        trio = sys.modules.get("trio")
        return None if trio is None else trio.lowlevel.current_task()


def _now_or_none() -> float | None:
    """The event loop's clock, or ``None`` outside one (a sync health check, say)."""
    try:
        return anyio.current_time()
    except RuntimeError:  # anyio's NoEventLoopError (sniffio's error in older versions)
        return None


# Holds the running attempt; the AttemptInfo record is only built when asked for.
_current: contextvars.ContextVar[_Attempt | _Call | None] = contextvars.ContextVar(
    "yieldgate_attempt", default=None
)


def current_attempt() -> AttemptInfo | None:
    """The attempt this code runs under, or ``None`` outside a Gate.

    Transports read it to send the remaining budget upstream (``deadline_ms``)
    and, for a Gate over several upstreams, to learn where to send.
    """
    attempt = _current.get()
    if attempt is None:
        return None
    call = attempt.call
    gate = call.gate
    upstream = attempt.upstream
    named = gate._named
    return AttemptInfo(
        gate=gate.name,
        number=attempt.attempt_number,
        priority=call.priority,
        deadline=attempt.attempt_deadline,
        upstream=upstream.name if named else None,
        target=upstream.target if named else None,
        hedging=call.hedge is not None,
        call_deadline=call.deadline,
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
    hedges: int = 0
    hedge_wins: int = 0
    hedges_denied: int = 0
    losers_cancelled: int = 0


class Gate:
    """Client-side backpressure for one upstream.

    >>> gate = Gate(GatePolicy.cold_start(), name="hf")
    >>> result = await gate.call(client.generate, prompt)   # doctest: +SKIP

    Use one Gate per upstream and share it among the tasks calling that
    upstream: the window, breaker and budget are only as good as the traffic
    they see.

    ``upstreams`` makes it a Gate over a set of interchangeable upstreams
    (names, or a mapping from name to a target such as a URL or a client):
    each keeps its own window, breaker and hint hold, every attempt goes to
    the one with the lowest latency cost (in flight, recent latency, recent
    yields and failures) whose breaker is not open, and a retry or a hedge
    prefers another one than the attempt before it. The attempt function
    reads ``current_attempt().upstream`` / ``.target`` to know where to send;
    ``GovernedClient`` and ``http_client`` do that themselves. The retry
    budget and the rate cap stay shared by the whole set.
    """

    def __init__(
        self,
        policy: GatePolicy | None = None,
        *,
        name: str = "default",
        classify: Classifier | None = None,
        instrumentation: Instrumentation | None = None,
        rng: random.Random | None = None,
        upstreams: Mapping[str, Any] | Iterable[str] | None = None,
    ) -> None:
        self.policy = policy or GatePolicy()
        self.name = name
        self._classify = classify or default_classify
        self._instr: Instrumentation = instrumentation or OtelInstrumentation()
        self._rng = rng or random.Random()  # noqa: S311 - jitter, not secrets
        clock = anyio.current_time
        self._budget = RetryBudget(self.policy.budget, clock)
        self._rate: RateCap | None = None
        self._counters = _Counters()
        self._closed = False
        self._since_checkpoint = 0
        hedge = self.policy.hedge
        self._latency_size = 200 if hedge is None else hedge.window
        # Every answer of the Gate; the one upstream of a Gate without a set shares it.
        self._latency = LatencyTracker(self._latency_size)
        self._upstreams: list[Upstream] = []
        # True once upstreams are named: attempts then report where they go.
        self._named = False
        if upstreams is None:
            self._upstreams.append(
                self._make_upstream(name, None, label=name, latency=self._latency)
            )
        else:
            items = (
                upstreams.items()
                if isinstance(upstreams, Mapping)
                else ((u, None) for u in upstreams)
            )
            for upstream_name, target in items:
                self.add_upstream(upstream_name, target)
            if not self._upstreams:
                raise ValueError("upstreams, when given, must name at least one upstream")

    def _make_upstream(
        self, name: str, target: Any, *, label: str, latency: LatencyTracker | None = None
    ) -> Upstream:
        def window_changed(old: int, new: int) -> None:
            self._instr.on_window_change(WindowChange(gate=label, old=old, new=new))

        def breaker_changed(old: BreakerState, new: BreakerState) -> None:
            self._instr.on_breaker_change(BreakerChange(gate=label, old=str(old), new=str(new)))

        window = Window(self.policy.window, on_change=window_changed, rng=self._rng)
        breaker = Breaker(
            self.policy.breaker, anyio.current_time, name=label, on_change=breaker_changed
        )
        if latency is None:
            latency = LatencyTracker(self._latency_size)
        return Upstream(name, target, window, breaker, latency)

    def add_upstream(self, name: str, target: Any = None) -> None:
        """Add ``name`` (sent to ``target``) to the Gate's upstream set.

        Adding a name that is there already with the same target (or none)
        does nothing, and gives a target to a name that had none; with another
        target it is a ``ValueError``. A Gate built
        without ``upstreams`` cannot take any: its one upstream is implicit.
        """
        if not isinstance(name, str) or not name:
            raise ValueError(f"an upstream name must be a non-empty string, got {name!r}")
        if self._upstreams and not self._named:
            raise ValueError(
                f"gate {self.name!r} was built without upstreams; "
                "pass upstreams=[...] to Gate() to use several"
            )
        for upstream in self._upstreams:
            if upstream.name == name:
                if upstream.target is None:
                    upstream.target = target  # named first, its target given now
                elif target is not None and upstream.target != target:
                    raise ValueError(
                        f"upstream {name!r} is already registered with target "
                        f"{upstream.target!r}, not {target!r}"
                    )
                return
        self._named = True
        self._upstreams.append(self._make_upstream(name, target, label=f"{self.name}/{name}"))

    @property
    def upstreams(self) -> tuple[str, ...]:
        """The names of the Gate's upstreams (empty for a Gate without a set)."""
        return tuple(u.name for u in self._upstreams) if self._named else ()

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

    # -- statistics ---------------------------------------------------------

    def statistics(self) -> GateStatistics:
        """A snapshot of the Gate. With several upstreams, ``window`` adds theirs
        up, ``breaker`` is their common state (or ``"mixed"``) and ``upstreams``
        has each one. Safe outside an event loop (after ``asyncio.run``, from a
        synchronous health check): the time-based figures are then as of the
        last call."""
        c = self._counters
        now = _now_or_none()
        ups = self._upstreams
        if len(ups) == 1:
            window = ups[0].window.statistics()
            breaker = str(ups[0].breaker.state)
        else:
            each = [u.window.statistics() for u in ups]
            window = WindowStatistics(
                limit=sum(w.limit for w in each),
                inflight=sum(w.inflight for w in each),
                waiting=sum(w.waiting for w in each),
                slow_start=any(w.slow_start for w in each),
                increases=sum(w.increases for w in each),
                decreases=sum(w.decreases for w in each),
            )
            states = {str(u.breaker.state) for u in ups}
            breaker = states.pop() if len(states) == 1 else "mixed"
        rate = self._rate
        return GateStatistics(
            name=self.name,
            window=window,
            breaker=breaker,
            breaker_failures=sum(u.breaker.failures for u in ups),
            retry_allowance=self._budget.allowance(now, roll=now is not None),
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
            rate_per_s=None
            if rate is None
            else rate.rate_now(rate.updated if now is None else now),
            hedges=c.hedges,
            hedge_wins=c.hedge_wins,
            hedges_denied=c.hedges_denied,
            losers_cancelled=c.losers_cancelled,
            upstreams=tuple(u.statistics(now) for u in ups) if self._named else (),
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
        if outer is not None and outer.call.gate is self and outer.task is _current_task():
            return await self._nested(fn, args, classify)
        call = self._new_call(fn, args, priority, timeout, classify, hold=False, discard=None)
        value: Any = await self._run(call)
        return value

    def _outer_priority(self) -> Priority | None:
        """The priority of this Gate's call that the running code is an attempt of."""
        outer = _current.get()
        if outer is not None and outer.call.gate is self:
            return outer.call.priority
        return None

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
        timeout: float | UsePolicy | None = USE_POLICY,
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
        outer = _current.get()
        if outer is not None and outer.call.gate is self and outer.task is _current_task():
            # Inside one of our own attempts, in its task: it holds the slot already.
            return await self._nested(fn, args, classify), Lease(outer.upstream.window, None)
        call = self._new_call(fn, args, priority, timeout, classify, hold=True, discard=discard)
        value = await self._run(call)
        held = call.held
        assert held is not None
        return value, Lease(held[0].window, held[1])

    def _new_call(
        self,
        fn: Callable[..., Awaitable[Any]],
        args: tuple[Any, ...],
        priority: Priority | str,
        timeout: float | UsePolicy | None,
        classify: Classifier | None,
        *,
        hold: bool,
        discard: Callable[[Any], Awaitable[None]] | None,
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
        call.discard = discard
        return call

    async def _run(self, call: _Call) -> Any:
        self._since_checkpoint += 1
        if self._since_checkpoint >= _CHECKPOINT_EVERY:
            # Calls whose attempts never await would otherwise never let the loop
            # drop the attempt timers they disarmed (nor run anything else).
            self._since_checkpoint = 0
            await anyio.lowlevel.checkpoint()
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
            await call.abandon()
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


class _Slot:
    """What an attempt holds before it is sent: an upstream, a window slot, a breaker ticket."""

    __slots__ = ("permit", "ticket", "upstream", "waited")

    def __init__(
        self, upstream: Upstream, permit: Permit, ticket: BreakerTicket, waited: bool
    ) -> None:
        self.upstream = upstream
        self.permit = permit
        self.ticket = ticket
        self.waited = waited


class _Call:
    """One call's state across its attempts."""

    __slots__ = (
        "args",
        "attempt_deadline",
        "attempt_number",
        "attempts",
        "classify",
        "congestion",
        "deadline",
        "discard",
        "fn",
        "gate",
        "hedge",
        "hedging_off",
        "held",
        "hold",
        "last",
        "last_failed",
        "last_hint_s",
        "last_upstream",
        "observer",
        "permit",
        "priority",
        "running",
        "shared_until",
        "started",
        "stop_error",
        "task",
        "ticket",
        "upstream",
        "waited",
        "winner",
        "withdrawn",
        "won",
    )

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
        self.held: tuple[Upstream, Permit] | None = None
        self.discard: Callable[[Any], Awaitable[None]] | None = None
        self.fn = fn
        self.args = args
        self.priority = priority
        self.deadline = deadline
        self.classify = classify
        self.hedge = gate.policy.hedge
        self.observer: CallObserver
        self.attempts = 0
        self.congestion = 0
        self.last: Outcome | None = None
        self.last_hint_s: float | None = None
        self.stop_error: YieldgateError | None = None
        # The attempt whose success is the call's (the first to succeed).
        self.winner: _Slot | _Call | None = None
        # The attempt now: a call that is not hedged is its own slot (see _admit_now).
        self.upstream: Upstream
        self.permit: Permit
        self.ticket: BreakerTicket
        self.waited = False
        self.attempt_number = 0
        self.attempt_deadline: float | None = None
        # The task the call runs in: a call of this Gate from this task is nested.
        self.task: object = None
        # Upstreams this call's attempts are using now (tracked for a set or
        # hedging only), and the one that failed last.
        self.running: list[Upstream] | None = [] if gate._named or self.hedge is not None else None
        self.last_failed: Upstream | None = None
        self.last_upstream: Upstream | None = None
        # Set by a yield or an overload: no more hedges for this call.
        self.hedging_off = False
        self.won: Outcome | None = None
        # When the hold that this call's last hint set ends (None: it set none).
        self.shared_until: float | None = None
        # A retry taken from the budget and not sent yet: refunded if never sent.
        self.withdrawn: int | None = None

    def forget(self) -> None:
        """Drop what the call carried, once it is over.

        Timers armed during an attempt keep a copy of its context, which holds
        this call, until they fire or are purged: the request and its response
        must not live that long with them.
        """
        self.fn = _done
        self.args = ()
        self.last = None
        self.won = None
        self.winner = None
        self.discard = None
        # Set only on the fast path; no contextlib.suppress on this hot path.
        try:  # noqa: SIM105
            del self.permit, self.ticket
        except AttributeError:
            pass

    async def abandon(self) -> None:
        """The call ends in an exception: give back what it still holds.

        A retry drawn from the budget but never sent goes back to it. A call
        that meant to hold its winner's slot (``call_and_hold``) but is ending
        without handing out a ``Lease`` (cancelled while a hedge that lost
        cleaned up, say) releases the slot and closes the won value.
        """
        if self.withdrawn is not None:
            self.gate._budget.refund(self.withdrawn)
            self.withdrawn = None
        held, self.held = self.held, None
        if held is None:
            return
        held[0].window.release(held[1], Signal.CANCELLED)
        won, discard = self.won, self.discard
        if won is not None and discard is not None:
            with anyio.CancelScope(shield=True):
                await discard(won.value)

    @property
    def call(self) -> _Call:
        """Itself, for code that reads an attempt's call (see ``_Attempt``)."""
        return self

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
        self.task = _current_task()
        if self.hedge is None:
            outcome = await self._send(self._admit_now() or await self._admit())
        else:
            outcome = await self.round()
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

    async def round(self) -> Outcome:
        """One attempt, or, under a hedge policy, one attempt and its hedges."""
        if self.hedge is None or self.hedging_off:
            return await self._send(await self._admit())
        return await self._hedged_round(self.hedge)

    # -- getting ready to send ------------------------------------------------

    def _avoid(self) -> set[Upstream]:
        avoid = set(self.running or ())
        if self.last_failed is not None:
            avoid.add(self.last_failed)
        return avoid

    def _pick(self) -> Upstream:
        """The cheapest upstream of a set whose breaker lets an attempt through."""
        gate = self.gate
        ups = gate._upstreams
        order = choose(ups, self.priority, anyio.current_time(), gate._rng, self._avoid())
        refusal: CircuitOpenError | None = None
        for up in order:
            try:
                up.breaker.check()
            except CircuitOpenError as exc:
                # Fail over; report the breaker that will let a probe through first.
                if refusal is None or (exc.retry_after_s or math.inf) < (
                    refusal.retry_after_s or math.inf
                ):
                    refusal = exc
                continue
            return up
        assert refusal is not None
        raise refusal

    def _admit_now(self) -> _Call | None:
        """The common case without a wait: one upstream, no hint to wait out, a free
        slot, no rate cap, a closed breaker. ``None``: take the general path."""
        gate = self.gate
        ups = gate._upstreams
        if len(ups) != 1 or gate.policy.rate is not None:
            return None
        up = ups[0]
        breaker = up.breaker
        if not breaker.lets_through:
            return None
        permit = up.window.try_acquire(self.priority)  # refuses while a hold is in force
        if permit is None:
            return None
        self.upstream = up
        self.permit = permit
        self.ticket = breaker.acquire()
        self.waited = False
        return self

    async def _upstream(self) -> Upstream:
        """The upstream for the next attempt; while only a half-open probe stands
        between the call and an upstream, wait for its verdict (within the deadline)."""
        ups = self.gate._upstreams
        while True:
            try:
                if len(ups) == 1:
                    ups[0].breaker.check()  # fail fast before queueing for anything
                    return ups[0]
                return self._pick()
            except CircuitOpenError as exc:
                probing = [u for u in ups if u.breaker.probe_pending]
                if not probing:
                    raise self._circuit_error(exc) from None
                await self._await_verdict(probing[0])

    async def _await_verdict(self, up: Upstream) -> None:
        """Wait, within the deadline, for the verdict of ``up``'s half-open probe."""
        await self._wait(up.breaker.wait_verdict, "waiting for the breaker's probe")

    def _margin(self, up: Upstream, room: float) -> float:
        """How long before the deadline an attempt should start, out of ``room``: its
        expected duration (the upstream's recent latency), else half the room."""
        latency = up.latency.ewma_s
        return min(room, room / 2 if latency is None else latency)

    def _not_after(self, up: Upstream, now: float) -> float | None:
        """The latest this call can start and still have time for an attempt, for a
        hold that outlasts its deadline (never before the hint itself ends)."""
        if self.deadline is None:
            return None
        hint_end = up.window.hint_until(self.priority, now)
        if not hint_end:
            return None
        if hint_end > self.deadline:
            raise self._error(
                DeadlineExceededError,
                f"the upstream asked to wait {hint_end - now:.3f} s, past the call's deadline "
                f"({self.deadline - now:.3f} s left), after {self.attempts} attempt(s)",
            )
        return self.deadline - self._margin(up, self.deadline - hint_end)

    async def _admit(self) -> _Slot:
        """Wait for what an attempt needs: a hint to pass, a window slot, the rate cap,
        a ticket from the breaker."""
        gate = self.gate
        while True:
            up = await self._upstream()
            window = up.window
            permit = window.try_acquire(self.priority)
            waited = permit is None
            if permit is None:
                now = anyio.current_time()
                not_after = self._not_after(up, now)
                held = window.held_until(self.priority, now) > 0
                try:
                    permit = await self._wait(
                        functools.partial(
                            window.acquire, self.priority, key=self.started, not_after=not_after
                        ),
                        "waiting for a window slot",
                    )
                finally:
                    if held:  # waiting out a hint, as a retry's sleep would
                        gate._counters.waited_s += anyio.current_time() - now
            try:
                # The rate token is taken last, by a caller that can start at once:
                # taken before the window, tokens would pile up in its queue and
                # be spent together when slots free.
                rate = gate._rate_cap()
                if rate is not None and not rate.try_take(anyio.current_time()):
                    waited = True
                    await self._wait(rate.acquire, "waiting for the rate cap")
                # Claimed only now that we can send: a half-open probe never queues.
                ticket = up.breaker.acquire()
            except CircuitOpenError as exc:
                window.release(permit, Signal.CANCELLED)
                if not up.breaker.probe_pending:
                    raise self._circuit_error(exc) from None
                await self._await_verdict(up)
                continue
            except BaseException:
                window.release(permit, Signal.CANCELLED)
                raise
            return _Slot(up, permit, ticket, waited)

    def _admit_hedge(self) -> _Slot | None:
        """What a hedge needs, taken now or not at all: a hedge never waits.

        It needs an upstream with no hint hold and a closed breaker (a hedge
        never takes the half-open probe), a free window slot there, a rate
        token at hand, and a withdrawal from the retry budget. Nothing here
        awaits, so nothing taken can be stranded by a cancellation.
        """
        gate = self.gate
        now = anyio.current_time()
        if self.deadline is not None and now >= self.deadline:
            return None
        ups = gate._upstreams
        order = ups if len(ups) == 1 else choose(ups, self.priority, now, gate._rng, self._avoid())
        rate = gate._rate_cap()
        for up in order:
            if not up.breaker.lets_through or not up.takes(self.priority, now):
                continue
            permit = up.window.try_acquire(self.priority)
            if permit is None:
                continue
            receipt = gate._budget.withdraw()
            if receipt is None or (rate is not None and not rate.try_take(now)):
                if receipt is not None:
                    gate._budget.refund(receipt)
                up.window.release(permit, Signal.CANCELLED)
                gate._counters.hedges_denied += 1
                return None
            return _Slot(up, permit, up.breaker.acquire(), True)
        return None

    # -- one attempt --------------------------------------------------------

    async def _send(self, slot: _Slot | _Call) -> Outcome:
        gate = self.gate
        up = slot.upstream
        number = self.attempts + 1
        if slot.waited or number > 1:
            started = anyio.current_time()
            if self.deadline is not None and started >= self.deadline:
                # Admitted only at the deadline: an attempt now could only fail.
                up.window.release(slot.permit, Signal.CANCELLED)
                up.breaker.record(slot.ticket, Verdict.NEUTRAL)
                raise self._deadline_error("before an attempt could start")
        else:
            started = self.started
        self.attempts = number
        self.withdrawn = None  # the retry it paid for is being sent
        gate._counters.attempts += 1
        if number == 1:
            # A request, for the retry budget, is a call that sent something; it
            # counts from when it was sent.
            gate._budget.deposit(started)
        signal = Signal.CANCELLED
        verdict = Verdict.NEUTRAL
        won = False
        running = self.running
        if running is not None:
            running.append(up)
        try:
            outcome = await self._invoke(number, started, up)
            if outcome.kind is OutcomeKind.OK:
                signal, verdict = Signal.SUCCESS, Verdict.SUCCESS
            else:
                signal, verdict = _SIGNALS[outcome.kind]
                if isinstance(outcome.error, AttemptTimeoutError):
                    # A timeout is what a backend that buffers instead of yielding
                    # shows under overload: narrow the window as for a yield.
                    signal = Signal.CONGESTION
                elif outcome.is_congestion:
                    # Held before the slot goes back: else the freed slot would
                    # admit a waiter into the very overload the hint is about.
                    self._hold_from(outcome, up)
        finally:
            if running is not None:
                running.remove(up)
            if signal is Signal.SUCCESS and self.winner is None:
                self.winner = slot
                won = True
            elif signal is Signal.CANCELLED and self.winner is not None:
                gate._counters.losers_cancelled += 1
                # It lost the race: slower than the winner, at least this slow.
                up.latency.record_at_least(anyio.current_time() - started)
            if won and self.hold:
                self.held = (up, slot.permit)  # released by the Lease
            else:
                up.window.release(slot.permit, signal)
            up.breaker.record(slot.ticket, verdict)
        self._note(outcome, number, started, up)
        if won:
            self.won = outcome
        elif signal is Signal.SUCCESS and self.discard is not None:
            # A hedge that answered too after another had won: its value (an
            # open stream, say) is closed, never returned.
            with anyio.CancelScope(shield=True):
                await self.discard(outcome.value)
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

    async def _wait(self, fn: Callable[[], Awaitable[T]], while_: str) -> T:
        """Await ``fn()`` within the call's deadline."""
        if self.deadline is None:
            return await fn()
        with anyio.CancelScope(deadline=self.deadline):
            return await fn()
        raise self._deadline_error(while_)

    async def _invoke(self, number: int, now: float, up: Upstream) -> Outcome:
        attempt_s = self.gate.policy.timeouts.attempt_s
        limit = math.inf if attempt_s is None else now + attempt_s
        if self.deadline is not None and self.deadline < limit:
            limit = self.deadline
        deadline = None if limit == math.inf else limit
        if self.hedge is None:
            self.attempt_number = number
            self.attempt_deadline = deadline
            self.upstream = up
            token = _current.set(self)
        else:
            token = _current.set(_Attempt(self, number, deadline, up, _current_task()))
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

    def _hold_from(self, outcome: Outcome, up: Upstream) -> None:
        """Share a congestion hint: hold the upstream's admissions at this priority
        and below until it (with its jitter) has passed."""
        self.shared_until = None
        retry = self.gate.policy.retry
        if outcome.hint_s is None or not (retry.share_hints and retry.honour_hints):
            return
        hint = min(outcome.hint_s, retry.max_hint_s)
        if hint <= 0:
            return  # "come back now": nothing to hold (the retry spreads and backs off)
        now = anyio.current_time()
        # The callers held behind the hint go one by one over its jitter, as
        # their own jittered waits would have spread them, but in their order.
        until = now + hint * (1.0 + retry.hint_jitter)
        up.window.hold(self.priority, until, now + hint)
        self.shared_until = until

    def _note(self, outcome: Outcome, number: int, started: float, up: Upstream) -> None:
        gate = self.gate
        self.last = outcome
        self.last_upstream = up
        if outcome.hint_s is not None:
            self.last_hint_s = outcome.hint_s
        kind = outcome.kind
        congestion = kind is OutcomeKind.YIELD or kind is OutcomeKind.OVERLOADED
        if not congestion:
            self.shared_until = None
        # Latencies and per-upstream rates feed hedge delays and the choice of
        # upstream: a plain Gate has neither and skips the clock read.
        tracked = gate._named or self.hedge is not None
        observed = self.observer is not NULL_OBSERVER
        now = anyio.current_time() if tracked or observed else 0.0
        if kind is OutcomeKind.OK:
            if tracked:
                up.latency.record(now - started)
                if up.latency is not gate._latency:  # a member of a set: the Gate's too
                    gate._latency.record(now - started)
            if self.last_failed is up:
                self.last_failed = None
        elif kind is OutcomeKind.YIELD:
            gate._counters.yields += 1
        elif kind is OutcomeKind.OVERLOADED:
            gate._counters.overloads += 1
        else:
            gate._counters.failures += 1
            self.last_failed = up
        if gate._named:
            failure = kind is OutcomeKind.RETRYABLE or kind is OutcomeKind.FATAL
            up.note(ok=kind is OutcomeKind.OK, congestion=congestion, failure=failure)
        if congestion:
            # "Too much load" from any attempt: hedging would only add to it.
            self.hedging_off = True
        if outcome.reason == "cold_start" and gate._rate is not None:
            gate._rate.restart_ramp()
        if self.observer is not NULL_OBSERVER:
            self.observer.on_attempt(
                AttemptDetails(
                    gate=gate.name,
                    attempt=number,
                    outcome=kind,
                    reason=outcome.reason,
                    hint_s=outcome.hint_s,
                    duration_s=now - started,
                )
            )

    # -- hedging ------------------------------------------------------------

    def _hedge_delay(self, hedge: HedgePolicy, up: Upstream) -> float:
        if hedge.delay_s is not None:
            return max(hedge.delay_s, hedge.min_delay_s)
        tracker = up.latency if len(up.latency) >= hedge.min_samples else self.gate._latency
        if len(tracker) < hedge.min_samples:
            return max(hedge.initial_delay_s, hedge.min_delay_s)
        observed = tracker.quantile(hedge.quantile)
        assert observed is not None
        return max(observed, hedge.min_delay_s)

    async def _hedged_round(self, hedge: HedgePolicy) -> Outcome:
        """The first attempt, plus a hedge each time it (and the hedges so far) stay
        unanswered past the delay; the first success wins and the rest are cancelled."""
        first = await self._admit()
        gate = self.gate
        outcomes: list[Outcome] = []
        errors: list[YieldgateError] = []
        # Anything else an attempt raised (a classifier's bug, say): raised as
        # is, as it would be without hedging, never wrapped in a group.
        crashes: list[Exception] = []
        settled = anyio.Event()
        running = 0

        async def run(slot: _Slot, scope: anyio.CancelScope) -> None:
            nonlocal running
            try:
                outcomes.append(await self._send(slot))
            except YieldgateError as exc:
                errors.append(exc)  # the deadline passed during this attempt
            except Exception as exc:
                crashes.append(exc)
                scope.cancel()
                settled.set()
                return
            finally:
                running -= 1
            if self.winner is not None:
                scope.cancel()  # the losers: their window slots come back at once
                settled.set()
            elif running == 0:
                settled.set()

        async with anyio.create_task_group() as tg:
            running = 1
            tg.start_soon(run, first, tg.cancel_scope)
            hedges = 0
            while hedges < hedge.max_hedges and not settled.is_set():
                with anyio.move_on_after(self._hedge_delay(hedge, first.upstream)):
                    await settled.wait()
                if settled.is_set() or self.hedging_off:
                    break
                slot = self._admit_hedge()
                if slot is None:
                    continue  # no room to hedge now; look again after another delay
                hedges += 1
                running += 1
                gate._counters.hedges += 1
                tg.start_soon(run, slot, tg.cancel_scope)
        if crashes:
            raise crashes[0]
        if self.winner is not None:
            if self.winner is not first:
                gate._counters.hedge_wins += 1
            assert self.won is not None
            return self.won
        if not outcomes:
            raise errors[0]
        # No success: what the retry loop should act on. A fatal outcome ends the
        # call only when every attempt was fatal; a congestion carries the hint.
        usable = [o for o in outcomes if o.kind is not OutcomeKind.FATAL] or outcomes
        congested = [o for o in usable if o.is_congestion]
        return (congested or usable)[-1]

    # -- retrying -----------------------------------------------------------

    def _elsewhere(self, last: Upstream) -> bool:
        """Whether an upstream other than ``last`` could take an attempt now."""
        ups = self.gate._upstreams
        if len(ups) == 1:
            return False
        now = anyio.current_time()
        return any(up is not last and up.takes(self.priority, now) for up in ups)

    async def retry_loop(self, first: Outcome) -> Outcome:
        replay = [first]

        async def step() -> Outcome:
            # The first outcome is already in hand: tenacity starts by judging it.
            if replay:
                return replay.pop()
            return await self.round()

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
        if seconds <= 0:
            return  # the hold in the window is the wait: queue there at once
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
        now = anyio.current_time()
        last = self.last_upstream
        hold_left = 0.0
        if last is not None and self._elsewhere(last):
            # Another upstream of the set can take the retry now: the hint or the
            # backoff was about the one that just answered. A short jitter only.
            wait = gate._rng.uniform(0, policy.base_s)
            floor = 0.0
        elif hint is not None:
            wait = hinted_wait_s(policy, hint, gate._rng, n)
            floor = hinted_floor_s(policy, hint, n)
            shared = self.shared_until
            if shared is not None and now + floor <= shared:
                # The hint this call got holds the upstream for every caller, and
                # its end (with the jitter) is this call's wait too: it waits in the
                # window, in its place among them, where a completion may admit it
                # early. Its own sleep would put it behind all who came later.
                hold_left = shared - now
                wait = 0.0
        else:
            wait = backoff_s(policy, n, gate._rng)
            floor = backoff_floor_s(policy, n)
        if self.deadline is not None:
            # Give up only when even the least wait would overrun the deadline.
            # The jitter above it is trimmed so that the retry still starts with
            # an attempt's worth of time left, never at the deadline itself.
            left = self.deadline - now
            if floor > left:
                return self._stop(
                    DeadlineExceededError,
                    f"the next wait ({floor:.3f} s at least) would pass the call's deadline "
                    f"({left:.3f} s left) after {self.attempts} attempt(s): {outcome.describe()}",
                )
            up = last if last is not None else gate._upstreams[0]
            wait = min(wait, left - self._margin(up, left - floor))
        retry_after = min(u.breaker.retry_after_s() for u in gate._upstreams)
        if retry_after > max(wait, hold_left):
            # The breaker opened meanwhile and will still be open when we wake.
            return self._stop(
                CircuitOpenError,
                f"circuit opened while retrying; next probe in {retry_after:.2f} s: "
                f"{outcome.describe()}",
                retry_after_s=retry_after,
            )
        if outcome.kind is not OutcomeKind.YIELD:
            receipt = gate._budget.withdraw()
            if receipt is None:
                return self._stop(
                    RetryBudgetExhaustedError,
                    f"retry budget spent (too many retries recently): {outcome.describe()}",
                )
            self.withdrawn = receipt  # refunded if the call stops before sending it
        gate._counters.retries += 1
        if self.observer is not NULL_OBSERVER:
            self.observer.on_wait(
                WaitDetails(
                    gate=gate.name,
                    next_attempt=self.attempts + 1,
                    wait_s=max(wait, hold_left),
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
