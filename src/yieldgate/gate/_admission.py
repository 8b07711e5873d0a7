"""Admission, sans-IO: what an attempt needs before it may be sent, and every wait for it.

In order: an upstream whose breaker lets it through (or, when only a
half-open probe stands in the way, its verdict to wait for), room in its
quota (paced, by priority then arrival), the fleet's take, a window slot
together with a start from the rate cap (both by priority then arrival,
held back while a hint is waited out), a fleet in-flight lease (a line by
priority then arrival), the breaker's ticket, and the fleet's half-open
probe. Each is entered in the attempt's ledger (``_ledger.Attempt``) in the
step that acquires it; whatever admission gives up on, it gives back through
the ledger, and an exception anywhere leaves everything to the ledger's
owner, who gives it back in a ``finally``.

``admit`` is a generator that does all the deciding and all the waiting
logic for both drivers. It yields only two kinds of wait:

- ``Park(until)``: block until the call's signal (``call.signal``) is set, or
  ``until`` (a time on the Gate's clock, ``None``: no timer), or the call's
  deadline, whichever comes first; the generator then looks again (and
  raises ``DeadlineExceededError`` if the deadline is what passed);
- ``FleetWait(op)``: run one Redis operation of the fleet; sent back its answer.

A driver (``_async`` for asyncio and trio, ``_sync`` for threads) only
performs these two, and throws into the generator whatever ended a wait (a
cancellation). A hedge's admission (``_admission_hedge``) takes what it
needs at once or gives it all back: it never parks.
"""

from __future__ import annotations

import math
from collections.abc import Generator
from typing import Any, NamedTuple

from yieldgate._exceptions import CircuitOpenError, FleetConfigError, RetryBudgetExhaustedError
from yieldgate.gate import _dropped as dropped
from yieldgate.gate._breaker import Breaker
from yieldgate.gate._call import CallState
from yieldgate.gate._choice import not_after, upstream
from yieldgate.gate._decide import quota_past_deadline
from yieldgate.gate._ledger import Attempt
from yieldgate.gate._quota import Claim
from yieldgate.gate._shared import FleetOp
from yieldgate.gate._upstream import Upstream

__all__ = ["FleetWait", "Park", "Steps", "Wait", "admit", "send_now", "start_over"]


class Park(NamedTuple):
    """Wait until the call's signal is set, ``until`` or the call's deadline (sent
    back: ``None``)."""

    until: float | None


class FleetWait(NamedTuple):
    """Run ``op`` on the Gate's fleet (sent back: what it answered, ``None`` if Redis
    did not)."""

    op: FleetOp


Wait = Park | FleetWait
Steps = Generator[Wait, Any, Any]


def _fleet(call: CallState, op: FleetOp) -> Steps:
    """Run ``op`` on the fleet: what it answered. ``None`` (Redis away) goes on alone,
    unless Redis refused the fleet's credentials or commands, a configuration error
    that the call raises (``FleetPolicy.fail_open`` goes on alone then too)."""
    got = yield FleetWait(op)
    if got is None:
        shared = call.core.shared
        assert shared is not None
        wrong = shared.fleet.statistics().config_error
        if wrong is not None and not shared.policy.fail_open:
            raise call.error(FleetConfigError, f"fleet {call.core.name!r}: {wrong}")
    return got


def _park(call: CallState, until: float | None, while_: str) -> Steps:
    """One park; past the call's deadline, raise."""
    yield Park(until)
    deadline = call.deadline
    if deadline is not None and call.core.clock() >= deadline:
        raise call.deadline_error(while_)


def sleep(call: CallState, seconds: float, while_: str) -> Steps:
    """Sleep ``seconds`` on the Gate's clock (within the call's deadline)."""
    clock = call.core.clock
    end = clock() + seconds
    while clock() < end:
        call.signal.clear()
        yield from _park(call, end, while_)


def admit(call: CallState, attempt: Attempt) -> Steps:
    """Fill ``attempt``'s ledger with what it needs, waiting for each in turn.

    The quota comes first, before a window slot: its queue is the one that
    orders callers by priority when a quota is what binds, and a caller
    waiting for it holds no slot another could use. Returns once the attempt
    may be sent; until then, every start-over gives back what was taken.
    """
    core = call.core
    if call.fleet_retry:
        yield from _fleet_budget(call)
    waited = False
    while True:
        target = upstream(call, core.clock())
        if isinstance(target, Breaker):
            yield from _verdict(call, target)
            continue
        up = attempt.up = target
        yield from _fleet_before(call, attempt, up)
        yield from _fleet_first(call, attempt, up)
        paced = yield from _quota(call, attempt, up)
        if paced is None:
            continue
        scope = call.cost.scope
        provisional = not up.quota.knows(scope)
        queued = yield from _window(call, attempt, up)
        waited = waited or paced or queued
        with core.lock:
            held = up.quota.lanes.held_back(attempt.claim, core.clock())
            again = held or (provisional and up.quota.knows(scope))
        if again:
            # Taken while no bucket was known, and one was learnt meanwhile, or
            # before its scope was held: the claim queues again, by the quota's order.
            start_over(attempt)
            continue
        if (yield from _lease(call, attempt, up)):
            waited = True
        outcome = yield from _ticket(call, attempt, up)
        if outcome is True:
            return waited
        if isinstance(outcome, Breaker):
            start_over(attempt)
            yield from _verdict(call, outcome)
            continue
        # The fleet's probe was another member's: look again after a pause.
        start_over(attempt)
        shared = core.shared
        assert shared is not None
        pause = shared.policy.poll_s * (0.5 + core.rng.random())
        yield from sleep(call, max(pause, 0.1), "waiting for the fleet's breaker probe")


def start_over(attempt: Attempt) -> None:
    core = attempt.core
    with core.lock:
        attempt.give_back(core.clock())
    core.after_lock()


def _verdict(call: CallState, breaker: Breaker) -> Steps:
    """Wait for a half-open probe's verdict (the caller starts over after it)."""
    core = call.core
    signal = call.signal
    with core.lock:
        signal.clear()
        if not breaker.await_verdict(signal.wake):
            return
    try:
        yield from _park(call, None, "waiting for the breaker's probe")
    finally:
        with core.lock:
            breaker.leave_verdict(signal.wake)


def _fleet_before(call: CallState, attempt: Attempt, up: Upstream) -> Steps:
    """What the fleet says before admission (``Shared.before``). While another call's
    read of the fleet's holds is out, wait for it: a burst's calls that do not read
    them (they are read every ``HOLDS_EVERY_S``) are held by what it reads too.

    The read and the wait are ``attempt``'s (the ledger ends both, whatever ends
    the attempt: the backstop for an interrupt on a ``finally``'s first line)."""
    core = call.core
    shared = core.shared
    if shared is None:
        return
    try:
        with core.lock:
            ops = shared.before(up, core.clock(), call.cost.scope, attempt)
        for op in ops:
            got = yield from _fleet(call, op)
            with core.lock:
                shared.apply(core.upstreams, up, op, got, core.clock())
    finally:
        with core.lock:
            shared.holds_read(up, attempt)  # whatever ended it: the others look again
    # Bounded: a read never takes longer than the fleet's budget, with its slack.
    until = core.clock() + 2 * shared.policy.budget_s + 1.0
    while True:
        try:
            with core.lock:
                if not shared.reading_holds(up, attempt) or core.clock() >= until:
                    return
                call.signal.clear()
                shared.wait_holds(up, attempt, call.signal.wake)
            yield from _park(call, until, "waiting for the fleet's holds")
        finally:
            with core.lock:
                shared.wait_holds(up, attempt, None)


def _fleet_first(call: CallState, attempt: Attempt, up: Upstream) -> Steps:
    """Before a member's first answer from ``up``: the fleet's first reading of its
    quota (``_first_reading``), asked for, or waited for while another attempt probes
    (the ask and the probe are entered in ``attempt``'s ledger as they are taken)."""
    core = call.core
    shared = core.shared
    if shared is None:
        return
    first = shared.first
    while True:
        try:
            with core.lock:
                now = core.clock()
                if not shared.available:
                    shared.alone(up, now)
                op, until = first.step(up, attempt, now, call.deadline, shared.available)
                if op is None and until is not None:
                    # Entered inside the ``try``: the ``finally`` takes it out, and the
                    # ledger does if an interrupt lands on the ``finally``'s first line.
                    call.signal.clear()
                    first.park(up, attempt, call.signal.wake)
            if op is not None:
                got = yield from _fleet(call, FleetOp(*op))
                with core.lock:
                    call.granted = None  # the probe granted: in the ledger in this step
                    shared.told_first(core.upstreams, up, attempt, got, core.clock())
                continue
            if until is None:
                return
            yield from _park(call, until, "waiting for the fleet's first reading of the quota")
        finally:
            with core.lock:
                first.park(up, attempt, None)


def _quota(call: CallState, attempt: Attempt, up: Upstream) -> Steps:
    """A claim on ``up``'s quota, waited for in its queue, and the fleet's take:
    whether it waited; ``None``: start over (the fleet refused, or Redis is away)."""
    core = call.core
    lock, clock = core.lock, core.clock
    quota = up.quota
    claim = Claim(call.cost, call.priority, call.started)
    claim.not_after = not_after(call, up, clock(), quota=True)  # held by its scope's hint
    with lock:
        # Taken while no bucket is known, a claim is provisional: if one is
        # learnt while it waits for a window slot, it queues again.
        if quota.borrow and not quota.learnt_for(claim.scope):
            quota.borrow_for(claim.scope, clock())
        if quota.active:
            call.too_large(quota)
        attempt.claim = claim
        if not quota.try_take(claim, clock()):
            quota.join(claim, call.signal.wake)
            attempt.queued = True
    waited = attempt.queued
    if waited:
        started = clock()
        try:
            while True:
                with lock:
                    again = None
                    now = clock()
                    if quota.at_head(claim, now):
                        again = quota.take_queued(claim, now)
                        if again is None:
                            attempt.queued = False  # taken: it left the queue
                            break
                        if call.deadline is not None and again > call.deadline:
                            raise quota_past_deadline(call, quota, claim, now, again)
                    call.signal.clear()
                yield from _park(call, again, "waiting for the quota")
        finally:
            with lock:
                core.counters.waited_s += clock() - started
    shared = core.shared
    if shared is None or not quota.shared:
        return waited
    with lock:
        take = shared.take(up, claim)
    if take is None:
        return waited
    got = yield from _fleet(call, take)
    with lock:
        call.granted = None  # entered in the claim (its ``seq``) in this step
        if shared.took(core.upstreams, up, claim, got, clock()):
            return waited
        attempt.claim = None  # refunded: refused (paced until its refill) or Redis away
    return None


def _window(call: CallState, attempt: Attempt, up: Upstream) -> Steps:
    """A window slot on ``up`` (and a start of the rate cap, taken with it); whether
    the caller waited for it."""
    core = call.core
    lock, clock = core.lock, core.clock
    window = up.window
    with lock:
        if core.orphans or core.next_lapse <= clock():
            core.reclaim(clock())
        permit = window.try_acquire(call.priority)
        if permit is not None:
            attempt.permit = permit
            return False
    now = clock()
    latest = not_after(call, up, now)
    with lock:
        waiter = attempt.waiter = window.enqueue(
            call.priority, call.signal.wake, key=call.started, not_after=latest
        )
        held = window.held_until(call.priority, now) > 0
    queued_at = now
    try:
        while True:
            with lock:
                now = clock()
                if core.orphans or core.next_lapse <= now:
                    core.reclaim(now)
                wake_at = window.look(waiter)
                if waiter.permit is not None:
                    attempt.permit, waiter.permit = waiter.permit, None
                    attempt.waiter = None
                    break
                call.signal.clear()
                lapse = core.next_lapse
            if lapse != math.inf and (wake_at is None or lapse < wake_at):
                wake_at = lapse  # a held slot may lapse then
            core.after_lock()
            wake_at = dropped.for_slot(core, window, waiter, queued_at, wake_at)  # may collect
            yield from _park(call, wake_at, "waiting for a window slot")
    finally:
        if held:  # waiting out a hint, as a retry's sleep would
            with lock:
                core.counters.waited_s += clock() - queued_at
    return True


def _lease(call: CallState, attempt: Attempt, up: Upstream) -> Steps:
    """A lease on one of the fleet's in-flight slots for ``up``, waited for in line;
    none when there is no cap or Redis does not answer. Whether it waited."""
    core = call.core
    shared = core.shared
    if shared is None or not shared.available or shared.policy.inflight_cap is None:
        return False
    op = FleetOp("acquire", (up.name, shared.policy.inflight_cap))
    lock, clock = core.lock, core.clock
    with lock:
        turn = attempt.turn = shared.line.join(up, call.priority, call.started, call.signal.wake)
    waited = False
    while True:
        with lock:
            now = clock()
            first = shared.line.first(up, turn)
            pause = shared.line.pause(up, now) if first else 0.0
            if not first or pause > 0:
                call.signal.clear()
        if not first or pause > 0:  # behind another caller, or the line's pause
            waited = True
            until = now + pause if first else None
            if first:  # the head, refused by the fleet: it may collect dropped bodies
                until = dropped.look(core, call.started, now + pause, fleet=True)
            yield from _park(call, until, "waiting for a fleet in-flight slot")
            continue
        got = yield from _fleet(call, op)
        with lock:
            call.granted = None  # entered in the ledger in this step
            if got is not False:
                if got is not None:  # Redis away: the local window alone bounds it
                    attempt.lease = got
                    shared.leased(up, got)
                attempt.turn = None
                shared.line.leave(up, turn)
                return waited
            shared.line.refused(up, clock(), core.rng.random())
        waited = True


def _ticket(call: CallState, attempt: Attempt, up: Upstream) -> Steps:
    """The breaker's ticket, and the fleet's probe if it is one. ``True``: admitted;
    a ``Breaker``: its probe is out, wait for the verdict; ``False``: the fleet's
    probe is another member's."""
    core = call.core
    with core.lock:
        try:
            # Claimed only now that we can send: a half-open probe never queues.
            attempt.ticket = ticket = up.breaker.acquire()
        except CircuitOpenError as exc:
            if up.breaker.probe_pending:
                return up.breaker
            raise call.circuit_error(exc) from None
    shared = core.shared
    if not ticket.probe or shared is None or not shared.available:
        return True
    # One probe for the whole fleet: another member's may be out already.
    ttl = core.policy.timeout.attempt_s or shared.policy.lease_ttl_s
    got = yield from _fleet(call, FleetOp("claim_probe", (up.name, ttl)))
    with core.lock:
        call.granted = None  # entered in the ledger in this step
        attempt.probe = got is True
    return got is not False


def _fleet_budget(call: CallState) -> Steps:
    """The fleet's retry budget for the retry about to be admitted, or the
    Gate's own when Redis does not answer; ``RetryBudgetExhaustedError`` if spent."""
    core = call.core
    shared = core.shared
    assert shared is not None
    call.fleet_retry = False
    got = yield from _fleet(call, FleetOp("withdraw", (core.name, core.policy.budget)))
    with core.lock:
        call.granted = None  # entered in the call's ledger in this step
        if got is None:
            receipt = core.withdraw()
            if receipt is not None:
                call.withdrawn = receipt
                return
        elif got is not False:
            call.fleet_receipt = got
            return
    last = call.last
    raise call.error(
        RetryBudgetExhaustedError,
        "retry budget spent (too many retries recently, fleet-wide)"
        + ("" if last is None else f": {last.describe()}"),
    )


def send_now(call: CallState, attempt: Attempt) -> bool:
    """The common case without a wait: one upstream, no hint to wait out, a free
    slot, no rate cap, a closed breaker, no quota known: admitted and sent in one
    step (``CallState.sent``). ``False``: take ``admit``, then ``CallState.begin``."""
    core = call.core
    ups = core.upstreams
    if len(ups) != 1 or core.rate is not None or core.shared is not None or core.orphans:
        return False
    up = ups[0]
    now = core.clock()
    with core.lock:
        if up.quota.active:  # a quota known (or a scope held): the general path paces
            return False
        ticket = up.breaker.try_pass()
        if ticket is None:
            return False
        permit = up.window.try_acquire(call.priority)  # refuses while a hold is in force
        if permit is None:
            return False
        attempt.up = up
        attempt.permit = permit
        attempt.ticket = ticket
        call.sent(attempt, now)
    return True
