"""What both kinds of Gate call share: starting a call, ending it, and the ``Lease``.

``GateBase`` holds the Gate's core and the steps every call takes whichever
driver runs it: refuse if closed, take the priority and the deadline, start
telemetry, and count the call when it ends. ``AsyncCalls`` (``_gate_async``)
and ``SyncCalls`` (``_gate_sync``) build the public methods on it; ``Gate``
(``_gate``) is both.
"""

from __future__ import annotations

from typing import Any

from yieldgate._exceptions import GateClosedError
from yieldgate.gate._attempt import CURRENT, Attempt, current_task
from yieldgate.gate._call import CallState
from yieldgate.gate._core import GateCore
from yieldgate.gate._outcome import Classifier, OutcomeKind, OutcomeSignal
from yieldgate.gate._policy import GatePolicy, UsePolicy
from yieldgate.gate._quota import Cost, as_cost
from yieldgate.gate._telemetry import NULL_OBSERVER, CallDetails
from yieldgate.gate._window import Permit, Signal, Window
from yieldgate.protocol import Priority

__all__ = ["GateBase", "Lease", "Timeout"]

Timeout = float | UsePolicy | None


class Lease:
    """A window slot kept after a call returned (see ``Gate.call_and_hold``).

    ``release`` gives it back and tells the window how the work that followed
    went (``Signal.SUCCESS`` by default). Only the first release counts; it is
    safe from any thread. ``report_usage`` tells the Gate what the attempt
    really used, once its body (a stream's last chunk) said so.
    """

    __slots__ = ("_attempt", "_lock", "_permit", "_window")

    def __init__(
        self, window: Window, permit: Permit | None, lock: Any, attempt: Attempt | None = None
    ) -> None:
        self._window = window
        self._permit = permit
        self._lock = lock
        self._attempt = attempt

    def report_usage(self, used: Cost) -> None:
        """What the winning attempt really used (``AttemptInfo.report_usage``)."""
        if self._attempt is not None:
            self._attempt.call.used(self._attempt, used)

    @property
    def released(self) -> bool:
        return self._permit is None

    def release(self, outcome: Signal = Signal.SUCCESS) -> None:
        with self._lock:
            permit, self._permit = self._permit, None
            if permit is None:
                return
            self._window.release(permit, outcome)
            attempt = self._attempt
            claim = None if attempt is None else attempt.slot.claim
            lease = None if claim is None else claim.lease
            if claim is not None and lease is not None:
                claim.lease = None
        if lease is not None and attempt is not None:
            shared = attempt.call.core.shared
            if shared is not None:
                shared.released(lease)
                # At once, not left for the next call: the fleet waits for this slot.
                # Bounded by the fleet's time budget (it never raises).
                shared.fleet.release_sync(attempt.slot.upstream.name, lease)


class GateBase:
    """The Gate's core and the steps every call takes (see the module docstring)."""

    policy: GatePolicy
    name: str
    _core: GateCore

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

    def _new_call(
        self, priority: Priority | str, timeout: Timeout, *, hold: bool, cost: Cost | int | None
    ) -> CallState:
        core = self._core
        if core.closed:
            raise GateClosedError(f"gate {self.name!r} is closed")
        prio = priority if type(priority) is Priority else Priority(priority)
        total = self.policy.timeout.total_s if isinstance(timeout, UsePolicy) else timeout
        if total is not None and not total > 0:
            raise ValueError(f"timeout must be a positive number or None, got {total}")
        started = core.clock()
        deadline = None if total is None else started + total
        observer = core.instr.start_call(self.name, prio)
        with core.lock:
            core.counters.calls += 1
        call = CallState(
            core, prio, deadline, started, hold=hold, observer=observer, task=current_task()
        )
        if cost is not None:
            call.cost = as_cost(cost)
        return call

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

    def _nested_lease(self) -> Lease:
        """What a nested ``call_and_hold`` hands out: its outer attempt holds the slot."""
        outer = CURRENT.get()
        assert outer is not None
        return Lease(outer.slot.upstream.window, None, self._core.lock)

    def _lease(self, call: CallState) -> Lease:
        held = call.held
        assert held is not None
        return Lease(held[0].window, held[1], self._core.lock, call.winner)

    def _map_limit(self, concurrency: int | None) -> int:
        limit = concurrency if concurrency is not None else self.policy.window.max
        if limit < 1:
            raise ValueError("concurrency must be >= 1")
        return limit
