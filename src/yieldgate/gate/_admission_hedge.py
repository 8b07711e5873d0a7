"""A hedge's admission, sans-IO: what any attempt needs, each taken at once or not at all.

A hedge (``_hedge``) goes through the steps of ``_admission`` without ever
waiting in one: an upstream with no hint hold and a closed breaker (a hedge
never takes the half-open probe), room in its quota and the fleet's take, a
free window slot with a start of the rate cap, a fleet lease, and a draw from
the retry budget. Each is entered in the hedge's own ledger as it is taken;
a hedge refused anything gives back what it took (``_admission.start_over``).
The only wait it yields is a fleet operation (``FleetWait``).
"""

from __future__ import annotations

from yieldgate.gate._admission import FleetWait, Steps, start_over
from yieldgate.gate._call import CallState
from yieldgate.gate._choice import order
from yieldgate.gate._fleet_op import FleetOp
from yieldgate.gate._ledger import Attempt
from yieldgate.gate._quota import Claim
from yieldgate.gate._upstream import Upstream

__all__ = ["hedge"]


def hedge(call: CallState, attempt: Attempt) -> Steps:
    """What a hedge needs, through the same steps as any attempt, taken at once or
    not at all: ``True`` if admitted; else everything taken is given back.

    It needs an upstream with no hint hold and a closed breaker (a hedge
    never takes the half-open probe), room in its quota and the fleet's take, a
    free window slot with a start of the rate cap, a fleet lease, and a draw
    from the retry budget.
    """
    core = call.core
    now = core.clock()
    if call.deadline is not None and now >= call.deadline:
        return False
    with core.lock:
        candidates = [
            u for u in order(call, now) if u.breaker.lets_through and u.takes(call.priority, now)
        ]
    for up in candidates:
        attempt.up = up
        admitted = yield from _hedge_on(call, attempt, up)
        if admitted is None:
            continue  # no free slot there: the next upstream, if any
        if admitted:
            with core.lock:
                core.counters.hedges += 1
            return True
        start_over(attempt)
        with core.lock:
            core.counters.hedges_denied += 1
        return False
    return False


def _hedge_on(call: CallState, attempt: Attempt, up: Upstream) -> Steps:
    """A hedge's needs on ``up``: ``True`` taken, ``False`` refused (given back by
    the caller), ``None`` no free slot there."""
    core = call.core
    lock, clock = core.lock, core.clock
    with lock:
        attempt.permit = up.window.try_acquire(call.priority)  # with the rate cap's start
        if attempt.permit is None:
            return None
        attempt.receipt = core.withdraw()
        if attempt.receipt is None:
            return False
        claim = attempt.claim = Claim(call.cost, call.priority, call.started)
        if not up.quota.try_take(claim, clock()):
            attempt.claim = None
            return False
    shared = core.shared
    if shared is not None and up.quota.shared:
        with lock:
            take = shared.take(up, claim)
        if take is not None:
            got = yield FleetWait(take)  # a hedge refused: the call goes on without it
            with lock:
                call.granted = None
                if not shared.took(core.upstreams, up, claim, got, clock()):
                    attempt.claim = None
                    return False
    if shared is not None and shared.available and shared.policy.inflight_cap is not None:
        got = yield FleetWait(FleetOp("acquire", (up.name, shared.policy.inflight_cap)))
        with lock:
            call.granted = None
            if got:  # False: refused; None: Redis away, the window alone bounds it
                attempt.lease = got
                shared.leased(up, got)
        if got is False:
            return False
    with lock:
        if not up.breaker.lets_through:
            return False
        attempt.ticket = up.breaker.acquire()
    return True
