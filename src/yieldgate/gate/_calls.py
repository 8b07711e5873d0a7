"""What both kinds of Gate call share: starting a call and ending it.

``GateBase`` holds the Gate's core and the steps every call takes whichever
driver runs it: refuse if closed, take the priority and the deadline, start
telemetry, and count the call when it ends. ``AsyncCalls`` (``_gate_async``)
and ``SyncCalls`` (``_gate_sync``) build the public methods on it; ``Gate``
(``_gate``) is both. A user's telemetry (``start_call``, ``on_end``) is
called here outside the Gate's lock; what it raises is logged, and the call
goes on as if it had none.
"""

from __future__ import annotations

from typing import Any

from yieldgate._exceptions import GateClosedError
from yieldgate.gate import _express
from yieldgate.gate._attempt import CURRENT, current_task
from yieldgate.gate._call import CallState
from yieldgate.gate._core import GateCore, log
from yieldgate.gate._lease import Lease
from yieldgate.gate._outcome import Classifier, OutcomeKind, OutcomeSignal, checked
from yieldgate.gate._policy import USE_POLICY, GatePolicy, UsePolicy
from yieldgate.gate._quota import Cost, as_cost
from yieldgate.gate._telemetry import NULL_OBSERVER, CallDetails, CallObserver
from yieldgate.protocol import Priority

__all__ = ["GateBase", "Timeout"]

Timeout = float | UsePolicy | None


class GateBase:
    """The Gate's core and the steps every call takes (see the module docstring)."""

    policy: GatePolicy
    name: str
    _core: GateCore

    def _nested(self) -> bool:
        """Whether the running code is one of this Gate's attempts, in its own task."""
        outer = CURRENT.get()
        return outer is not None and outer.core is self._core and outer.task is current_task()

    def _outer_priority(self) -> Priority | None:
        """The priority of this Gate's call that the running code is an attempt of."""
        outer = CURRENT.get()
        if outer is not None and outer.core is self._core:
            return outer.priority
        return None

    def _classify_nested(self, classify: Classifier | None, value: Any, exc: Any) -> Any:
        # Inside one of our own attempts: the outer call already holds a window
        # slot and will retry, so this ran once, as part of it (a second slot
        # from the same window could deadlock a small window).
        outcome = checked(classify or self._core.classify, value, exc)
        if outcome.kind is OutcomeKind.OK:
            return outcome.value
        raise OutcomeSignal(outcome) from outcome.error

    def _observer(self, prio: Priority) -> CallObserver:
        try:
            return self._core.instr.start_call(self.name, prio)
        except Exception:
            log.exception("an instrumentation hook of gate %r raised", self.name)
            return NULL_OBSERVER

    def _lane_observer(
        self, priority: Priority | str, timeout: Timeout, cost: Cost | int | None
    ) -> CallObserver | None:
        """For a call that may take the express lane (``_express``: a ``Priority``, the
        policy's timeout, no cost, a Gate of the plain shape), its observer, asked for
        now (``NULL_OBSERVER``: it takes the lane); ``None`` for any other call."""
        if (
            type(priority) is Priority
            and timeout is USE_POLICY
            and cost is None
            and _express.plain(self._core)
        ):
            return self._observer(priority)
        return None

    def _new_call(
        self,
        priority: Priority | str,
        timeout: Timeout,
        *,
        hold: bool,
        cost: Cost | int | None,
        task: object = None,
        observer: CallObserver | None = None,
    ) -> CallState:
        core = self._core
        if core.closed:
            raise GateClosedError(f"gate {self.name!r} is closed")
        prio = priority if type(priority) is Priority else Priority(priority)
        total = self.policy.timeout.total_s if isinstance(timeout, UsePolicy) else timeout
        if total is not None and not total > 0:
            raise ValueError(f"timeout must be a positive number or None, got {total}")
        charge = None if cost is None else as_cost(cost)
        started = core.clock()
        deadline = None if total is None else started + total
        if observer is None:  # else the express lane asked for it already
            observer = self._observer(prio)
        with core.lock:
            core.counters.calls += 1
        if task is None:
            task = current_task()
        call = CallState(core, prio, deadline, started, hold=hold, observer=observer, task=task)
        if charge is not None:
            call.cost = core.aliases.scoped(charge) if core.aliases else charge
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
            core.hook(
                call.observer.on_end,
                CallDetails(
                    gate=self.name,
                    priority=call.priority.value,
                    attempts=call.attempts,
                    outcome="ok" if error is None else type(error).__name__,
                    duration_s=core.clock() - call.started,
                ),
            )

    def _nested_lease(self) -> Lease:
        """What a nested ``call_and_hold`` hands out: its outer attempt holds the slot."""
        return Lease(None)

    def _lease(self, call: CallState) -> Lease:
        """What a holding call hands out: the ``Lease`` made with its held slot (in the
        step that ended its winning attempt), no longer the call's to give back."""
        lease, call.lease = call.lease, None
        return Lease(None) if lease is None else lease

    def _not_handed(self, call: CallState) -> tuple[bool, Any]:
        """A holding call that raised before its caller got its ``Lease`` (an interrupt
        between its end and the hand-over): its slot goes back now, not when the
        ``Lease`` is collected (a traceback kept, as a REPL keeps the last, keeps it).
        Whether a won value is left to discard, and the value (``CallState.close``)."""
        if call.held is None:
            return False, None
        return call.close(handed=False)

    def _map_limit(self, concurrency: int | None) -> int:
        limit = concurrency if concurrency is not None else self.policy.window.max
        if limit < 1:
            raise ValueError("concurrency must be >= 1")
        return limit
