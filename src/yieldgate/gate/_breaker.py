"""An asyncio-safe circuit breaker, on pybreaker's state machine.

pybreaker counts failures, moves between closed / open / half-open and
notifies listeners, but it is built for synchronous calls: around an
``await`` it lets every concurrent caller through as a half-open trial, a
slow trial can close a breaker that another trial re-opened, and a
cancellation counts as a failure. This wrapper keeps pybreaker as the record
and adds what asyncio needs:

- **Tickets.** ``acquire`` hands out a ticket stamped with the breaker's
  generation (bumped on every state change); ``record`` ignores a ticket from
  an older generation, so a stale attempt can neither re-open nor close a
  breaker that has moved on.
- **One probe.** In half-open state exactly one ticket is out at a time; other
  callers get ``CircuitOpenError`` until the probe reports.
- **Neutral endings.** Yields, overloads, cancellations and fatal (caller-side)
  errors report ``neutral``: they count neither way, and a neutral probe frees the
  probe slot for the next caller without a verdict.
- **Our clock.** The open -> half-open timeout runs on the Gate's monotonic
  clock: pybreaker's reads the wall clock (``datetime.now``), which steps when
  the system time is set and cannot be driven by a test's virtual clock. So
  pybreaker is built with a reset timeout it never reaches, and the Gate
  calls its ``half_open()`` when our clock says the timeout has passed.
- **A verdict to wait for.** While the probe is out, other callers may wait
  for its verdict (within their deadline) instead of failing at once: the
  probe's success lets them all through, its failure opens the breaker again.
  The breaker only keeps their ``wake`` callbacks; the drivers wait.

Everything else is pybreaker's own: its state machine and listeners, its
counters, and its storage (``state_storage``; a fleet's is a record of its own,
in Redis). Failures reach it as the attempt's real exception
(``AttemptFailure`` when the attempt ended without one), through its own
``call``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from enum import StrEnum
from typing import TYPE_CHECKING, Any, NamedTuple

from yieldgate import _pybreaker
from yieldgate._exceptions import CircuitOpenError
from yieldgate.gate._policy import BreakerPolicy

if TYPE_CHECKING:
    import pybreaker
else:  # without the redis client pybreaker would import for nothing (see _pybreaker)
    pybreaker = _pybreaker.load()

__all__ = [
    "AttemptFailure",
    "Breaker",
    "BreakerPolicy",
    "BreakerState",
    "BreakerTicket",
    "Verdict",
]


class BreakerState(StrEnum):
    """The states of a Gate's circuit breaker (as ``GateStatistics.breaker`` reports them)."""

    CLOSED = "closed"
    """Attempts go through; consecutive failures are counted."""
    OPEN = "open"
    """Calls fail at once with ``CircuitOpenError`` until ``reset_timeout_s`` has passed."""
    HALF_OPEN = "half-open"
    """One probe at a time goes through: ``success_threshold`` successes close it, a failure
    opens it again."""


class Verdict(StrEnum):
    SUCCESS = "success"
    FAILURE = "failure"
    NEUTRAL = "neutral"


class BreakerTicket(NamedTuple):
    """Leave to attempt, stamped with the breaker's generation; ``probe``: the half-open trial."""

    generation: int
    probe: bool


class AttemptFailure(Exception):
    """What pybreaker is told failed when an attempt failed without an exception
    (a 503 response, say): the attempt's own description."""


def _succeed() -> None:
    return None


def _raise(exc: BaseException) -> None:
    raise exc


class _Listener(pybreaker.CircuitBreakerListener):
    def __init__(self, owner: Breaker) -> None:
        self.owner = owner

    def state_change(self, cb: Any, old_state: Any, new_state: Any) -> None:
        old = BreakerState(old_state.name) if old_state is not None else None
        self.owner._changed(old, BreakerState(new_state.name))


class Breaker:
    """Guards one upstream. ``acquire`` before an attempt, ``record`` after it."""

    def __init__(
        self,
        policy: BreakerPolicy,
        clock: Callable[[], float],
        *,
        name: str | None = None,
        on_change: Callable[[BreakerState, BreakerState], None] | None = None,
        storage: pybreaker.CircuitBreakerStorage | None = None,
    ) -> None:
        self.policy = policy
        self._clock = clock
        self._on_change = on_change
        self._generation = 0
        self._opened_at = 0.0
        self._probe_out = False
        # Callers waiting for the probe's verdict: woken when it reports or the
        # state moves on.
        self._verdict_waiters: list[Callable[[], None]] = []
        self._cb = pybreaker.CircuitBreaker(
            fail_max=policy.fail_max,
            # We decide when an open breaker may probe; pybreaker must never do it itself.
            reset_timeout=1e9,
            success_threshold=policy.success_threshold,
            listeners=[_Listener(self)],
            name=name,
            state_storage=storage,
        )
        # The plain ticket of a closed (or disabled) breaker, kept while its state is
        # known here (pybreaker's storage is ours: every change goes through ``_changed``);
        # ``None``: ask pybreaker. The hot path reads it instead of pybreaker's state.
        self._known = storage is None
        self._pass: BreakerTicket | None = BreakerTicket(0, probe=False) if self._known else None
        # A failure was counted since the last success told pybreaker (with our storage).
        self._failed = False

    @property
    def state(self) -> BreakerState:
        return BreakerState(self._cb.current_state)

    @property
    def lets_through(self) -> bool:
        """Closed (or disabled): ``acquire`` would hand out a plain ticket."""
        return not self.policy.enabled or self._cb.current_state == "closed"

    def try_pass(self) -> BreakerTicket | None:
        """A plain ticket if the breaker is closed (or disabled), else ``None``
        (then ``check`` and ``acquire`` say why, or hand out the probe)."""
        if self._known:
            return self._pass
        if self.policy.enabled and self._cb.current_state != "closed":
            return None
        return BreakerTicket(self._generation, probe=False)

    @property
    def probe_pending(self) -> bool:
        """Half-open with its one probe out: a verdict is coming."""
        return self._probe_out and self._cb.current_state == "half-open"

    def await_verdict(self, wake: Callable[[], None]) -> bool:
        """Call ``wake`` once the probe out reports (or the state moves on).
        ``False`` (and no call) when no probe is out: nothing to wait for."""
        if not self.probe_pending:
            return False
        self._verdict_waiters.append(wake)
        return True

    def leave_verdict(self, wake: Callable[[], None]) -> None:
        """A caller stops waiting for the verdict (cancelled, out of time)."""
        with contextlib.suppress(ValueError):
            self._verdict_waiters.remove(wake)

    def _announce(self) -> None:
        waiters, self._verdict_waiters = self._verdict_waiters, []
        for wake in waiters:
            wake()

    def forked(self) -> None:
        """In a forked child: no ticket of the parent's counts, no probe is out."""
        self._generation += 1
        self._probe_out = False
        self._verdict_waiters = []
        if self._pass is not None:
            self._pass = BreakerTicket(self._generation, probe=False)

    @property
    def failures(self) -> int:
        """Consecutive failures counted toward opening."""
        return int(self._cb.fail_counter)

    def retry_after_s(self) -> float:
        """How long until an open breaker lets a probe through (0 if it would now)."""
        if self.state is not BreakerState.OPEN:
            return 0.0
        return max(0.0, self._opened_at + self.policy.reset_timeout_s - self._clock())

    def _changed(self, old: BreakerState | None, new: BreakerState) -> None:
        self._generation += 1
        if self._known:
            plain = not self.policy.enabled or new is BreakerState.CLOSED
            self._pass = BreakerTicket(self._generation, probe=False) if plain else None
        if new is BreakerState.OPEN:
            self._opened_at = self._clock()
        if new is not BreakerState.HALF_OPEN:
            self._probe_out = False
            self._announce()
        if self._on_change is not None and old is not None and old != new:
            self._on_change(old, new)

    def trip(self, retry_after_s: float) -> None:
        """Open now, as a fleet's breaker is: a probe may go in ``retry_after_s``."""
        if not self.policy.enabled or self._cb.current_state == "open":
            return
        self._cb.open()
        self._opened_at = self._clock() - self.policy.reset_timeout_s + retry_after_s

    def reset(self) -> None:
        """Close now, as a fleet's breaker has (its probe succeeded elsewhere)."""
        if not self.policy.enabled or self._cb.current_state == "closed" or self._probe_out:
            return
        self._cb.close()

    def check(self) -> None:
        """Raise ``CircuitOpenError`` if ``acquire`` would, without changing any state.

        The Gate checks before it queues for the window, so that an open breaker
        fails fast, and takes the ticket only once it can send: a half-open probe
        never waits in a queue while every other caller is turned away.
        """
        if not self.policy.enabled:
            return
        current = self._cb.current_state
        if current == "closed":
            return
        if current == "open":
            wait = self.retry_after_s()
            if wait > 0:
                raise self._open_error(wait)
        elif self._probe_out:
            raise self._probe_error()

    def _open_error(self, wait: float) -> CircuitOpenError:
        return CircuitOpenError(
            f"circuit open after {self.policy.fail_max} consecutive failures; "
            f"next probe in {wait:.2f} s",
            retry_after_s=wait,
        )

    @staticmethod
    def _probe_error() -> CircuitOpenError:
        return CircuitOpenError(
            "circuit half-open: a probe is already testing the upstream", retry_after_s=None
        )

    def acquire(self) -> BreakerTicket:
        """A ticket to attempt, or ``CircuitOpenError`` when the breaker says no."""
        if not self.policy.enabled:
            return BreakerTicket(self._generation, probe=False)
        current = self._cb.current_state
        if current == "closed":
            return BreakerTicket(self._generation, probe=False)
        state = BreakerState(current)
        if state is BreakerState.OPEN:
            wait = self.retry_after_s()
            if wait > 0:
                raise self._open_error(wait)
            self._cb.half_open()  # bumps the generation through the listener
            state = BreakerState.HALF_OPEN
        if state is BreakerState.HALF_OPEN:
            if self._probe_out:
                raise self._probe_error()
            self._probe_out = True
            return BreakerTicket(self._generation, probe=True)
        return BreakerTicket(self._generation, probe=False)

    def record(
        self, ticket: BreakerTicket, verdict: Verdict, error: BaseException | None = None
    ) -> None:
        """Report how the ticket's attempt ended (a failure with its ``error``, if
        it raised one). Stale tickets are ignored."""
        if not self.policy.enabled or ticket.generation != self._generation:
            return
        if ticket.probe:
            self._probe_out = False
        if verdict is Verdict.SUCCESS:
            # A success in a closed breaker with no failures counted changes nothing.
            if ticket.probe or not self._known or self._failed:
                self._cb.call(_succeed)
                self._failed = False
        elif verdict is Verdict.FAILURE:
            failure = error if isinstance(error, Exception) else AttemptFailure("attempt failed")
            traceback = failure.__traceback__
            self._failed = True  # counted (or opening): the next success must say so
            try:
                with contextlib.suppress(type(failure), pybreaker.CircuitBreakerError):
                    self._cb.call(_raise, failure)
            finally:
                failure.__traceback__ = traceback  # the caller's error, as it was raised
        if ticket.probe:
            # Closed, open again, or (a neutral probe) half-open with the probe
            # slot free for the next caller: whoever waited looks again.
            self._announce()
