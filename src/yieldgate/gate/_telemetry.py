"""Instrumentation: a small protocol, frozen detail records, OpenTelemetry as one hook.

The Gate reports to an ``Instrumentation``: ``start_call`` returns a
``CallObserver`` that hears about each attempt, each wait and the end of the
call; breaker transitions and window changes are reported gate-wide.

``OtelInstrumentation`` (the default) speaks only ``opentelemetry-api``: with no
SDK configured every span and instrument is a no-op costing about a
microsecond. It makes one span per call (``yieldgate.call``) with an event per
attempt and per wait, and these instruments:

==============================  =========  =======================================
``yieldgate.attempts``          counter    attempts, by ``outcome``
``yieldgate.yields``            counter    yield outcomes, by ``reason``
``yieldgate.retries``           counter    waits before another attempt, by ``cause``
``yieldgate.wait.duration``     histogram  seconds waited before retrying
``yieldgate.call.duration``     histogram  seconds per call, by ``outcome``
``yieldgate.breaker.transitions`` counter  breaker state changes, by ``to``
``yieldgate.window.limit``      gauge      the window's current limit
==============================  =========  =======================================

Every instrument carries the ``yieldgate.gate`` attribute (the Gate's name).
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from yieldgate.gate._outcome import OutcomeKind

_RECHECK_S = 1.0

__all__ = [
    "AttemptDetails",
    "BreakerChange",
    "CallDetails",
    "CallObserver",
    "Instrumentation",
    "NullInstrumentation",
    "OtelInstrumentation",
    "WaitDetails",
    "WindowChange",
    "observed",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class AttemptDetails:
    """One attempt, after it ended."""

    gate: str
    """The Gate's name."""
    attempt: int
    """The attempt's number within its call, from 1."""
    outcome: OutcomeKind
    """What the attempt came to."""
    reason: str | None
    """The outcome's reason (a yield's ``saturated``, ``cold_start``...), if it gave one."""
    hint_s: float | None
    """The upstream's retry hint, in seconds, if it sent one."""
    duration_s: float
    """Seconds from the attempt's start to its outcome."""


@dataclass(frozen=True, slots=True, kw_only=True)
class WaitDetails:
    """A wait before the next attempt."""

    gate: str
    """The Gate's name."""
    next_attempt: int
    """The number of the attempt the wait comes before."""
    wait_s: float
    """How long the Gate waits, in seconds (jitter included)."""
    cause: OutcomeKind
    """The outcome that led to the wait: a yield, an overload or a retryable failure."""
    hint_s: float | None
    """The hint the wait follows, in seconds; ``None``: an exponential backoff."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CallDetails:
    """A whole call, after it ended. ``outcome`` is ``ok`` or the error's class name."""

    gate: str
    """The Gate's name."""
    priority: str
    """The call's priority (``high``, ``normal`` or ``low``)."""
    attempts: int
    """Attempts the call made, hedges included."""
    outcome: str
    """``ok``, or the class name of the error the call raised."""
    duration_s: float
    """Seconds from the call's start to its end, waits included."""


@dataclass(frozen=True, slots=True, kw_only=True)
class BreakerChange:
    """A breaker's change of state (for a Gate over several upstreams, one upstream's)."""

    gate: str
    """The Gate's name."""
    old: str
    """The state before: ``closed``, ``open`` or ``half-open``."""
    new: str
    """The state after."""


@dataclass(frozen=True, slots=True, kw_only=True)
class WindowChange:
    """A change of the window's limit, after a success grew it or congestion shrank it."""

    gate: str
    """The Gate's name."""
    old: int
    """The limit before."""
    new: int
    """The limit after."""


@contextlib.contextmanager
def observed(observer: CallObserver, core: Any) -> Iterator[None]:
    """``observer.scope()`` around a call, if it can be entered: a scope that raises
    on the way in or out is logged (``core.hook``'s logger), and the call goes on."""
    try:
        scope = observer.scope()
        scope.__enter__()
    except Exception:
        core.hook(_reraise, sys.exc_info()[1])
        yield
        return
    try:
        yield
    except BaseException:
        try:
            if scope.__exit__(*sys.exc_info()):
                pass  # a scope may not swallow the call's error: it is raised
        except Exception:
            core.hook(_reraise, sys.exc_info()[1])
        raise
    try:
        scope.__exit__(None, None, None)
    except Exception:
        core.hook(_reraise, sys.exc_info()[1])


def _reraise(error: BaseException) -> None:
    raise error


class CallObserver(Protocol):
    """Hears about one call.

    Like every hook of an ``Instrumentation``, each method is called outside the
    Gate's lock, after what it reports has been given back (a slot, a claim), in
    the caller's task or thread: it may call the Gate (``statistics()``, other
    calls). What it raises is logged (logger ``yieldgate``) and otherwise
    ignored; it should not block for long.
    """

    def scope(self) -> contextlib.AbstractContextManager[None]:
        """Entered around the call, e.g. to make its span current."""
        ...

    def on_attempt(self, details: AttemptDetails) -> None:
        """Called after each attempt ends, with what it came to."""
        ...

    def on_wait(self, details: WaitDetails) -> None:
        """Called as the Gate starts waiting before another attempt."""
        ...

    def on_end(self, details: CallDetails) -> None:
        """Called once, when the call returns or raises."""
        ...


class Instrumentation(Protocol):
    """What the Gate reports to.

    ``start_call`` is called as a call starts, ``on_breaker_change`` and
    ``on_window_change`` after the change they report, once the Gate's lock is
    released (by whichever task or thread made the change). None of them can
    stop a call or a give-back: what they raise is logged (logger
    ``yieldgate``), and a ``start_call`` that raises leaves its call unobserved.
    """

    def start_call(self, gate: str, priority: str) -> CallObserver:
        """Called as a call starts; returns the observer that hears about that call."""
        ...

    def on_breaker_change(self, details: BreakerChange) -> None:
        """Called after a breaker changed state."""
        ...

    def on_window_change(self, details: WindowChange) -> None:
        """Called after the window's limit changed."""
        ...


class _NullObserver:
    __slots__ = ()

    def scope(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def on_attempt(self, details: AttemptDetails) -> None:
        pass

    def on_wait(self, details: WaitDetails) -> None:
        pass

    def on_end(self, details: CallDetails) -> None:
        pass


NULL_OBSERVER: CallObserver = _NullObserver()
"""The observer that hears nothing: the Gate skips building details for it."""


class NullInstrumentation:
    """Reports nowhere."""

    def start_call(self, gate: str, priority: str) -> CallObserver:
        """An observer that hears nothing: the Gate then builds no details at all."""
        return NULL_OBSERVER

    def on_breaker_change(self, details: BreakerChange) -> None:
        """Ignores the change."""

    def on_window_change(self, details: WindowChange) -> None:
        """Ignores the change."""


class _OtelObserver:
    __slots__ = ("_owner", "_span")

    def __init__(self, owner: OtelInstrumentation, span: Any) -> None:
        self._owner = owner
        self._span = span

    @contextlib.contextmanager
    def scope(self) -> Iterator[None]:
        with self._owner._trace.use_span(self._span, end_on_exit=False):
            yield

    def on_attempt(self, d: AttemptDetails) -> None:
        attrs: dict[str, Any] = {
            "yieldgate.attempt": d.attempt,
            "yieldgate.outcome": str(d.outcome),
            "yieldgate.duration_s": d.duration_s,
        }
        if d.reason is not None:
            attrs["yieldgate.reason"] = d.reason
        if d.hint_s is not None:
            attrs["yieldgate.hint_s"] = d.hint_s
        self._span.add_event("attempt", attrs)
        o = self._owner
        o.attempts.add(1, {"yieldgate.gate": d.gate, "outcome": str(d.outcome)})
        if d.outcome is OutcomeKind.YIELD:
            o.yields.add(1, {"yieldgate.gate": d.gate, "reason": d.reason or "unknown"})

    def on_wait(self, d: WaitDetails) -> None:
        self._span.add_event(
            "wait",
            {
                "yieldgate.next_attempt": d.next_attempt,
                "yieldgate.wait_s": d.wait_s,
                "yieldgate.cause": str(d.cause),
            },
        )
        labels = {"yieldgate.gate": d.gate, "cause": str(d.cause)}
        self._owner.retries.add(1, labels)
        self._owner.waits.record(d.wait_s, labels)

    def on_end(self, d: CallDetails) -> None:
        span = self._span
        span.set_attribute("yieldgate.attempts", d.attempts)
        span.set_attribute("yieldgate.outcome", d.outcome)
        if d.outcome != "ok":
            span.set_status(
                self._owner._trace.Status(self._owner._trace.StatusCode.ERROR, d.outcome)
            )
        span.end()
        self._owner.calls.record(d.duration_s, {"yieldgate.gate": d.gate, "outcome": d.outcome})


class _OtelMetricsObserver:
    """Records the metrics of a call whose span is not recording."""

    __slots__ = ("_owner",)

    def __init__(self, owner: OtelInstrumentation) -> None:
        self._owner = owner

    def scope(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def on_attempt(self, d: AttemptDetails) -> None:
        o = self._owner
        o.attempts.add(1, {"yieldgate.gate": d.gate, "outcome": str(d.outcome)})
        if d.outcome is OutcomeKind.YIELD:
            o.yields.add(1, {"yieldgate.gate": d.gate, "reason": d.reason or "unknown"})

    def on_wait(self, d: WaitDetails) -> None:
        labels = {"yieldgate.gate": d.gate, "cause": str(d.cause)}
        self._owner.retries.add(1, labels)
        self._owner.waits.record(d.wait_s, labels)

    def on_end(self, d: CallDetails) -> None:
        self._owner.calls.record(d.duration_s, {"yieldgate.gate": d.gate, "outcome": d.outcome})


class OtelInstrumentation:
    """Spans and metrics through ``opentelemetry-api``.

    Providers default to the global ones (no-ops until an SDK is installed);
    pass them explicitly to route a Gate's telemetry elsewhere (tests do).
    """

    def __init__(self, *, tracer_provider: Any = None, meter_provider: Any = None) -> None:
        from opentelemetry import metrics, trace

        from yieldgate import __version__

        self._trace = trace
        self._metrics = metrics
        self._explicit_meter = meter_provider is not None
        self._explicit_tracer = tracer_provider is not None
        self._recheck_at = 0.0
        self._live = (True, True)
        self._tracer = trace.get_tracer("yieldgate", __version__, tracer_provider=tracer_provider)
        meter = metrics.get_meter("yieldgate", __version__, meter_provider=meter_provider)
        self.attempts = meter.create_counter("yieldgate.attempts", "{attempt}", "Attempts made")
        """The ``yieldgate.attempts`` counter: attempts, by ``outcome``."""
        self.yields = meter.create_counter("yieldgate.yields", "{yield}", "Yield outcomes")
        """The ``yieldgate.yields`` counter: yield outcomes, by ``reason``."""
        self.retries = meter.create_counter(
            "yieldgate.retries", "{retry}", "Waits before another attempt"
        )
        """The ``yieldgate.retries`` counter: waits before another attempt, by ``cause``."""
        self.waits = meter.create_histogram("yieldgate.wait.duration", "s", "Wait before retrying")
        """The ``yieldgate.wait.duration`` histogram: seconds waited before retrying."""
        self.calls = meter.create_histogram("yieldgate.call.duration", "s", "Duration of calls")
        """The ``yieldgate.call.duration`` histogram: seconds per call, by ``outcome``."""
        self.transitions = meter.create_counter(
            "yieldgate.breaker.transitions", "{transition}", "Circuit breaker state changes"
        )
        """The ``yieldgate.breaker.transitions`` counter: breaker changes, by ``to``."""
        self.window = meter.create_gauge("yieldgate.window.limit", "{slot}", "Window limit")
        """The ``yieldgate.window.limit`` gauge: the window's current limit."""

    def start_call(self, gate: str, priority: str) -> CallObserver:
        """Opens the call's ``yieldgate.call`` span (when a tracing SDK records it)."""
        if time.monotonic() < self._recheck_at:  # _liveness's answer, kept (inline)
            tracing, metering = self._live
        else:
            tracing, metering = self._liveness()
        if tracing:
            span = self._tracer.start_span(
                "yieldgate.call",
                attributes={"yieldgate.gate": gate, "yieldgate.priority": priority},
            )
            if span.is_recording():
                return _OtelObserver(self, span)
        # No tracing SDK (or a sampler said no): skip the span's work, and the
        # metrics too while no metrics SDK is installed either.
        return _OtelMetricsObserver(self) if metering else NULL_OBSERVER

    # The API's own providers (a proxy until an SDK is set, or a no-op) drop
    # everything; once an SDK is installed, the get_*_provider() calls return
    # it. Each call reads os.environ, so the answer is kept for a second: an
    # SDK set up after the Gate was made is picked up within that.

    def _liveness(self) -> tuple[bool, bool]:
        now = time.monotonic()
        if now >= self._recheck_at:
            self._live = (self._tracing_live(), self._metrics_live())
            self._recheck_at = now + _RECHECK_S
        return self._live

    def _tracing_live(self) -> bool:
        if self._explicit_tracer:
            return True
        provider = self._trace.get_tracer_provider()
        return not isinstance(
            provider, self._trace.ProxyTracerProvider | self._trace.NoOpTracerProvider
        )

    def _metrics_live(self) -> bool:
        if self._explicit_meter:
            return True
        provider = self._metrics.get_meter_provider()
        return not (
            isinstance(provider, self._metrics.NoOpMeterProvider)
            or type(provider).__name__ == "_ProxyMeterProvider"
        )

    def on_breaker_change(self, d: BreakerChange) -> None:
        """Counts the change on ``yieldgate.breaker.transitions``."""
        self.transitions.add(1, {"yieldgate.gate": d.gate, "from": d.old, "to": d.new})

    def on_window_change(self, d: WindowChange) -> None:
        """Sets the ``yieldgate.window.limit`` gauge."""
        self.window.set(d.new, {"yieldgate.gate": d.gate})
