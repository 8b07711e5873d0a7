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

import functools
import inspect
import random
from collections.abc import Callable, Iterable, Mapping
from typing import Any, ParamSpec, TypeVar

from yieldgate._exceptions import GateClosedError
from yieldgate.gate import _sync
from yieldgate.gate._calls import Timeout
from yieldgate.gate._core import GateCore, default_clock, unique_name
from yieldgate.gate._gate_async import AsyncCalls
from yieldgate.gate._gate_sync import SyncCalls
from yieldgate.gate._lease import Lease
from yieldgate.gate._outcome import Classifier, callable_name, default_classify
from yieldgate.gate._policy import USE_POLICY, GatePolicy
from yieldgate.gate._shared import Shared
from yieldgate.gate._statistics import GateStatistics
from yieldgate.gate._telemetry import Instrumentation
from yieldgate.gate._telemetry import OtelInstrumentation as _Otel
from yieldgate.protocol import Priority

__all__ = ["Gate", "Lease"]

R = TypeVar("R")
P = ParamSpec("P")


class Gate(AsyncCalls, SyncCalls):
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
        shared: Any = None,
    ) -> None:
        self.policy = policy or GatePolicy()
        """The policy the Gate follows, fixed when it is made."""
        if shared is not None and name is None:
            raise ValueError(
                "a Gate that shares its state needs a name: it keys the fleet's state in Redis"
            )
        self.name = name if name is not None else unique_name()
        """The Gate's name, in its telemetry, errors and fleet keys (default: a unique one)."""
        core = self._core = GateCore(
            self.policy,
            self.name,
            classify or default_classify,
            instrumentation or _Otel(),
            rng or random.Random(),  # noqa: S311 - jitter, not secrets
            clock or default_clock,
        )
        self._timer = _sync.Timer()
        self._own_fleet = False
        if shared is not None:
            fleet = self._fleet(shared)
            core.shared = Shared(
                fleet,
                self.policy.fleet,
                self.name,
                self.policy.budget,
                hint_jitter=self.policy.retry.hint_jitter,
            )
            core.shared.tend = core.tend
            core.shared.clock = core.clock
        try:
            self._add_upstreams(upstreams)
        except BaseException:
            self.close()  # and the fleet link it made, if any
            raise

    def _add_upstreams(self, upstreams: Mapping[str, Any] | Iterable[str] | None) -> None:
        core = self._core
        if upstreams is None:
            self._check_fleet_name(self.name)
            core.upstreams.append(
                core.make_upstream(self.name, None, label=self.name, latency=core.latency)
            )
            return
        items = (
            upstreams.items() if isinstance(upstreams, Mapping) else ((u, None) for u in upstreams)
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
        self._check_fleet_name(name)
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

    def _check_fleet_name(self, name: str) -> None:
        """In a fleet, an upstream's name is part of Redis keys: one they cannot carry
        (braces, Redis Cluster's hash tags) is a ``ValueError`` now, not at every call."""
        shared = self._core.shared
        if shared is not None:
            shared.fleet.keys.tag(name)

    def _fleet(self, shared: Any) -> Any:
        from yieldgate.fleet import Fleet  # the fleet extra: imported only when used

        if isinstance(shared, Fleet):
            return shared
        fleet = self.policy.fleet
        self._own_fleet = True
        return Fleet(
            shared,
            gate=self.name,
            prefix=fleet.prefix,
            budget_s=fleet.budget_s,
            join_s=fleet.first_reading_s,
            lease_ttl_s=fleet.lease_ttl_s,
        )

    def close(self) -> None:
        """Refuse new calls from now on. Calls already running finish as usual.
        A fleet link the Gate made (``shared`` given as a URL) is closed too."""
        self._core.closed = True
        shared = self._core.shared
        if shared is not None:
            for op in shared.close():  # what was given back and not yet told the fleet
                getattr(shared.fleet, op.name + "_sync")(*op.args, **op.kwargs)
            if self._own_fleet:
                shared.fleet.close()

    async def aclose(self) -> None:
        """``close``, for ``async with``."""
        self._core.closed = True
        shared = self._core.shared
        if shared is not None:
            for op in shared.close():  # what was given back and not yet told the fleet
                await getattr(shared.fleet, op.name)(*op.args, **op.kwargs)
            if self._own_fleet:
                await shared.fleet.aclose()

    @property
    def closed(self) -> bool:
        """Whether the Gate has been closed: it then refuses new calls (``GateClosedError``)."""
        return self._core.closed

    def statistics(self) -> GateStatistics:
        """A snapshot of the Gate. With several upstreams, ``window`` adds theirs
        up, ``breaker`` is their common state (or ``"mixed"``) and ``upstreams``
        has each one. Safe from any thread, in or out of an event loop."""
        return self._core.statistics()

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
        """Decorate a callable so that every call goes through this Gate.

        ``@gate.wrap`` or ``@gate.wrap(priority="high", timeout=10, classify=...)``,
        on a coroutine function, or an object whose ``__call__`` is one (calls
        go through ``call``), or a plain callable (through ``call_sync``). A
        plain callable that returns an awaitable cannot be governed in a
        thread: calling its wrapper raises ``TypeError`` (the awaitable is
        closed, never run); make it ``async def``.
        """

        def decorate(f: Callable[P, Any]) -> Callable[P, Any]:
            if not callable(f):
                raise TypeError(f"gate.wrap needs a callable, got {type(f).__name__}")
            if _is_async(f):

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
                refusal: list[TypeError] = []

                def attempt() -> Any:
                    value = f(*args, **kwargs)
                    if inspect.isawaitable(value):
                        close = getattr(value, "close", None)
                        if close is not None:
                            close()  # never run: it would run outside the Gate
                        refusal.append(
                            TypeError(
                                f"gate.wrap({callable_name(f)}): calling it returned "
                                f"{type(value).__name__}, an awaitable a sync call cannot "
                                "govern; make it an async def (or give wrap an object whose "
                                "__call__ is async def)"
                            )
                        )
                        raise refusal[-1]
                    return value

                try:
                    return self.call_sync(
                        attempt, priority=priority, timeout=timeout, classify=classify
                    )
                except Exception as exc:
                    if refusal and (exc is refusal[-1] or exc.__cause__ is refusal[-1]):
                        raise refusal[-1] from None
                    raise

            return sync_wrapper

        return decorate(fn) if fn is not None else decorate


def _is_async(f: Any) -> bool:
    """A coroutine function, a partial of one, or an object whose ``__call__`` is one."""
    if inspect.iscoroutinefunction(f):
        return True
    call = inspect.getattr_static(type(f), "__call__", None)
    return not inspect.isfunction(f) and inspect.iscoroutinefunction(call)
