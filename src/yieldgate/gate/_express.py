"""The express lane: the common call's first attempt, without building the call.

Most calls are the same: one upstream, no quota known, no rate cap, no fleet,
no hedging, no telemetry SDK, a closed breaker and a free slot, and a plain
answer. For such a call the general path (a ``CallState``, ``send_now``,
``CallState.end``, ``_ended``) does in four steps under the Gate's lock what
these functions do in two: ``admit`` counts the call and takes its slot and
ticket; ``ended_ok`` gives them back and counts the success.

The ledger is the same: the driver makes the ``Attempt`` (empty) before
``admit``, inside the ``try`` whose ``finally`` ends it, and ``admit`` enters
what it takes in the step that takes it. Only ``Attempt.give_back`` gives
anything back. Whatever is not the plain case is the general path's: ``admit``
refuses before it takes anything (the driver then starts the general path,
which counts the call itself), and an answer that is not a plain success is
handed, with its attempt, to a ``CallState`` made then (``handover``), which
ends the attempt and runs the retries exactly as for any other call.
"""

from __future__ import annotations

from yieldgate.gate._breaker import Verdict
from yieldgate.gate._call import CallState
from yieldgate.gate._core import GateCore
from yieldgate.gate._ledger import Attempt
from yieldgate.gate._outcome import Outcome
from yieldgate.gate._quota import ONE_REQUEST
from yieldgate.gate._telemetry import NULL_OBSERVER
from yieldgate.gate._window import Signal
from yieldgate.protocol import Priority

__all__ = ["admit", "attempt", "ended_early", "ended_ok", "handover", "plain"]


def plain(core: GateCore) -> bool:
    """Whether the Gate's shape allows the lane at all (read without the lock: a
    change it misses only sends one call down the general path, or this one)."""
    return (
        len(core.upstreams) == 1
        and core.rate is None
        and core.shared is None
        and not core.orphans
        and not core.named
        and core.policy.hedge is None
    )


def attempt(core: GateCore, priority: Priority, started: float, deadline: float | None) -> Attempt:
    """The first attempt's ledger, empty (made before ``admit``, by its owner)."""
    return Attempt(core, priority, ONE_REQUEST, started, deadline, False)


def admit(core: GateCore, attempt: Attempt, now: float) -> bool:
    """Count the call and send its first attempt, in one step: ``send_now`` and
    ``CallState.sent`` for a call of the plain shape. ``False``: nothing taken,
    nothing counted (the general path runs the call)."""
    up = core.upstreams[0]
    with core.lock:
        if core.closed or up.quota.active:
            return False
        ticket = up.breaker.try_pass()
        if ticket is None:
            return False
        permit = up.window.try_acquire(attempt.priority)
        if permit is None:
            return False
        attempt.up = up
        attempt.permit = permit
        attempt.ticket = ticket
        counters = core.counters
        counters.calls += 1
        counters.attempts += 1
        attempt.number = 1
        attempt.send(now, core.policy.timeout.attempt_s)
        core.budget.deposit(now)  # a request, for the retry budget
    return True


def ended_ok(core: GateCore, attempt: Attempt, now: float) -> None:
    """A plain success: ``CallState.end`` and ``_ended`` for the plain call, in one step."""
    up = attempt.upstream
    with core.lock:
        attempt.ended = True  # with its give-back, in one step: never one alone
        attempt.give_back(now, Signal.SUCCESS, Verdict.SUCCESS, None)
        if attempt.call_deadline is not None:
            # What ``begin`` reads of a call admitted late (``CallState._note``).
            up.latency.record(now - attempt.started)
        core.counters.calls_ok += 1
    core.after_lock()


def ended_early(core: GateCore, attempt: Attempt, now: float) -> None:
    """The attempt stopped before an answer (an interrupt, the function's
    ``BaseException``): given back as cancelled, and the call counted as failed."""
    with core.lock:
        attempt.ended = True
        attempt.give_back(now)
        core.counters.calls_failed += 1
    core.after_lock()


def handover(
    core: GateCore,
    attempt: Attempt,
    outcome: Outcome | None,
    now: float,
    task: object,
    *,
    cut: bool = False,
) -> CallState:
    """The call made now for an answer that is not a plain success (or an attempt
    ``cut`` at the call's deadline): its attempt, already counted and sent, is ended
    by ``CallState.end`` as any other."""
    call = CallState(
        core,
        attempt.priority,
        attempt.call_deadline,
        attempt.key,
        hold=False,
        observer=NULL_OBSERVER,
        task=task,
    )
    call.attempts = 1
    call.end(attempt, outcome, now, cut=cut)
    return call
