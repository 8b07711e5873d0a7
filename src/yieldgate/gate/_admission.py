"""Admission, sans-IO: what an attempt needs before it may be sent.

In order: an upstream whose breaker lets it through (or, when only a
half-open probe stands in the way, its verdict to wait for), room in its
quota (paced, by priority then arrival), a window slot (held back while a
hint is waited out), a token from the rate cap, and a ticket from the
breaker. Each function takes the call and the time and says
what the driver must do next: go, or wait for this. ``steps`` strings them
into the one admission loop both drivers run: a generator that yields each
wait (``Wait``) and is sent what the wait got. A hedge takes what it needs at
once or not at all. Every function takes the Gate's lock itself.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator
from typing import Any, NamedTuple, Protocol

from yieldgate._exceptions import (
    CircuitOpenError,
    DeadlineExceededError,
    RetryBudgetExhaustedError,
)
from yieldgate.gate._attempt import Slot
from yieldgate.gate._breaker import Breaker, Verdict
from yieldgate.gate._call import CallState
from yieldgate.gate._quota import BLIND, Claim, QuotaPacer
from yieldgate.gate._ratecap import RateCap
from yieldgate.gate._shared import FleetOp
from yieldgate.gate._upstream import Upstream, choose
from yieldgate.gate._window import Permit, Signal

__all__ = [
    "FleetWait",
    "Pacer",
    "RateWait",
    "SleepWait",
    "VerdictWait",
    "Wait",
    "WindowWait",
    "admit_hedge",
    "admit_now",
    "claim",
    "not_after",
    "steps",
    "upstream",
]


class VerdictWait(NamedTuple):
    """Wait for the verdict of ``breaker``'s half-open probe (sent back: ``None``)."""

    breaker: Breaker


class WindowWait(NamedTuple):
    """Wait for a slot of ``up``'s window, no later than ``not_after`` past a hold
    (sent back: the ``Permit``)."""

    up: Upstream
    not_after: float | None


class RateWait(NamedTuple):
    """Wait for a start from ``rate`` (the rate cap, or a quota's pacer), in its
    queue's order (sent back: ``None``)."""

    rate: Pacer
    while_: str = "waiting for the rate cap"


class FleetWait(NamedTuple):
    """Run ``op`` on the Gate's fleet (sent back: what it answered, ``None`` if Redis
    did not)."""

    op: FleetOp


class SleepWait(NamedTuple):
    """Sleep ``seconds`` (within the call's deadline), then go on (sent back: ``None``)."""

    seconds: float
    while_: str


Wait = VerdictWait | WindowWait | RateWait | FleetWait | SleepWait


class Pacer(Protocol):
    """A queue that paces starts: the rate cap, or one claim on a quota."""

    def try_take(self, now: float) -> bool: ...
    def join(self, wake: Callable[[], None]) -> Any: ...
    def at_head(self, waiter: Any) -> bool: ...
    def take_queued(self, waiter: Any, now: float) -> float | None: ...
    def leave(self, waiter: Any) -> None: ...


def steps(call: CallState) -> Generator[Wait, Any, Slot]:
    """Admission as the drivers run it: each wait yielded, the slot returned.

    A driver sends back what a wait got, or throws in what ended it (a
    deadline, a cancellation): nothing taken is then kept.

    The quota comes first, before a window slot: its queue is the one that
    orders callers by priority when a quota is what binds, and a caller
    waiting for it holds no slot another could use.
    """
    core = call.core
    clock, lock = core.clock, core.lock
    if call.fleet_retry:
        yield from _fleet_budget(call)
    while True:
        target = upstream(call, clock())
        if isinstance(target, Breaker):
            yield VerdictWait(target)
            continue
        up = target
        shared = core.shared
        if shared is not None:
            with lock:
                ops = shared.before(up, clock())
            for op in ops:
                got = yield FleetWait(op)
                with lock:
                    shared.apply(core.upstreams, up, op, got, clock())
        quota_claim = call.claim()
        with lock:
            # Taken while no bucket is known, a claim is provisional: if one is
            # learnt while it waits for a window slot, it queues again.
            provisional = not up.quota.active
            if not provisional:
                call.too_large(up.quota)
            paced = up.quota.try_take(quota_claim, clock())
        if not paced:
            started = clock()
            try:
                yield RateWait(QuotaPacer(up.quota, quota_claim), "waiting for the quota")
            finally:
                with lock:
                    core.counters.waited_s += clock() - started
        if shared is not None and up.quota.shared:
            with lock:
                take = shared.take(up, quota_claim)
            if take is not None:
                try:
                    got = yield FleetWait(take)
                except BaseException:
                    with lock:
                        up.quota.refund(quota_claim, clock())
                    raise
                with lock:
                    granted = shared.took(core.upstreams, up, quota_claim, got, clock())
                if not granted:  # refused (paced until its refill) or Redis away (alone)
                    continue
        try:
            slot = yield from _window_and_rest(
                call, up, quota_claim, waited=not paced, provisional=provisional
            )
        except BaseException:
            _give_back(call, up, quota_claim)
            raise
        if slot is None:  # a probe's verdict was waited for, or a quota learnt: start over
            _give_back(call, up, quota_claim)
            continue
        return slot


def _give_back(call: CallState, up: Upstream, quota_claim: Claim) -> None:
    """What an admission took and never used: its quota claim, the fleet's take and lease."""
    core = call.core
    with core.lock:
        up.quota.refund(quota_claim, core.clock())
        shared = core.shared
        if shared is not None:
            shared.refund(up, quota_claim)
            shared.ended(up, quota_claim, hold_s=None, rank=0)


def _window_and_rest(
    call: CallState, up: Upstream, quota_claim: Claim, *, waited: bool, provisional: bool
) -> Generator[Wait, Any, Slot | None]:
    """A window slot, the rate token and the breaker's ticket, on ``up``; ``None``
    after waiting for a half-open probe's verdict, or when a quota was learnt
    while a ``provisional`` claim waited (the caller starts over)."""
    core = call.core
    clock, lock = core.clock, core.lock
    with lock:
        permit = up.window.try_acquire(call.priority)
    waited = waited or permit is None
    if permit is None:
        now = clock()
        latest = not_after(call, up, now)
        with lock:
            held = up.window.held_until(call.priority, now) > 0
        try:
            permit = yield WindowWait(up, latest)
        finally:
            if held:  # waiting out a hint, as a retry's sleep would
                with lock:
                    core.counters.waited_s += clock() - now
    if provisional:
        with lock:
            if up.quota.active:
                up.window.release(permit, Signal.CANCELLED)
                return None
    shared = core.shared
    cap = None if shared is None or not shared.available else shared.policy.inflight_cap
    if cap is not None:
        try:
            yield from _lease(call, up, quota_claim, cap)
        except BaseException:
            with lock:
                up.window.release(permit, Signal.CANCELLED)
            raise
        waited = True
    claimed = claim(call, up, permit, quota_claim, clock(), waited=waited)
    if isinstance(claimed, RateCap):
        try:
            yield RateWait(claimed)
        except BaseException:
            with lock:
                up.window.release(permit, Signal.CANCELLED)
            raise
        claimed = claim(call, up, permit, quota_claim, clock(), waited=True, rated=True)
    assert not isinstance(claimed, RateCap)  # claimed with the token in hand
    if isinstance(claimed, Breaker):
        yield VerdictWait(claimed)
        return None
    if claimed.ticket.probe and shared is not None and shared.available:
        # One probe for the whole fleet: another member's may be out already.
        ttl = core.policy.timeout.attempt_s or shared.policy.lease_ttl_s
        got = yield FleetWait(FleetOp("claim_probe", (up.name, ttl)))
        if got is False:
            with lock:
                up.window.release(permit, Signal.CANCELLED)
                up.breaker.record(claimed.ticket, Verdict.NEUTRAL)
                pause = shared.policy.poll_s * (0.5 + core.rng.random())
            yield SleepWait(max(pause, 0.1), "waiting for the fleet's breaker probe")
            return None
    return claimed


def _fleet_budget(call: CallState) -> Generator[Wait, Any, None]:
    """The fleet's retry budget for the retry about to be admitted, or the
    Gate's own when Redis does not answer; ``RetryBudgetExhaustedError`` if spent."""
    core = call.core
    shared = core.shared
    assert shared is not None
    call.fleet_retry = False
    got = yield FleetWait(FleetOp("withdraw", (core.name, core.policy.budget)))
    if got is None:
        with core.lock:
            receipt = core.budget.withdraw()
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


def _lease(
    call: CallState, up: Upstream, quota_claim: Claim, cap: int
) -> Generator[Wait, Any, None]:
    """A lease on one of the fleet's ``cap`` in-flight slots for ``up``, polled for
    (with jitter) while the cap is reached; none when Redis does not answer."""
    core = call.core
    shared = core.shared
    assert shared is not None
    op = FleetOp("acquire", (up.name, cap))
    while True:
        # One poll per member at a time while the cap is reached: each member asks
        # as often as the others, however many of its calls wait.
        with core.lock:
            pause = shared.lease_pause(up, core.clock())
        if pause > 0:
            yield SleepWait(pause, "waiting for a fleet in-flight slot")
            continue
        got = yield FleetWait(op)
        if got is None:
            return  # Redis away: the local window alone bounds this member
        with core.lock:
            if got is not False:
                quota_claim.lease = got
                shared.leased(up, got)
                return
            shared.lease_refused(up, core.clock(), core.rng.random())


def admit_now(call: CallState) -> Slot | None:
    """The common case without a wait: one upstream, no hint to wait out, a free
    slot, no rate cap, a closed breaker. ``None``: take the general path."""
    core = call.core
    ups = core.upstreams
    if len(ups) != 1 or core.policy.rate is not None or core.shared is not None:
        return None
    up = ups[0]
    with core.lock:
        if up.quota.buckets:  # a quota known: the general path paces by it
            return None
        ticket = up.breaker.try_pass()
        if ticket is None:
            return None
        permit = up.window.try_acquire(call.priority)  # refuses while a hold is in force
        if permit is None:
            return None
        return Slot(up, permit, ticket, False, BLIND)


def _order(call: CallState, now: float) -> list[Upstream]:
    """The upstreams in the order this call should try them (the one, without a set)."""
    ups = call.core.upstreams
    if len(ups) == 1:
        return ups
    return choose(ups, call.priority, now, call.core.rng, _avoid(call))


def _avoid(call: CallState) -> set[Upstream]:
    avoid = set(call.running or ())
    if call.last_failed is not None:
        avoid.add(call.last_failed)
    return avoid


def upstream(call: CallState, now: float) -> Upstream | Breaker:
    """The upstream for the next attempt, or the breaker whose half-open probe's
    verdict to wait for (when only that stands between the call and an
    upstream). Raises ``CircuitOpenError`` when every breaker says no."""
    core = call.core
    ups = core.upstreams
    with core.lock:
        order = _order(call, now)
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
        probing = [u for u in ups if u.breaker.probe_pending]
        if probing:
            return probing[0].breaker
        raise call.circuit_error(refusal)


def not_after(call: CallState, up: Upstream, now: float) -> float | None:
    """The latest this call can start and still have time for an attempt, for a
    hold that outlasts its deadline (never before the hint itself ends)."""
    if call.deadline is None:
        return None
    with call.core.lock:
        hint_end = up.window.hint_until(call.priority, now)
    if not hint_end:
        return None
    if hint_end > call.deadline:
        raise call.error(
            DeadlineExceededError,
            f"the upstream asked to wait {hint_end - now:.3f} s, past the call's deadline "
            f"({call.deadline - now:.3f} s left), after {call.attempts} attempt(s)",
        )
    return call.deadline - call.margin(up, call.deadline - hint_end)


def claim(
    call: CallState,
    up: Upstream,
    permit: Permit,
    quota_claim: Claim,
    now: float,
    *,
    waited: bool,
    rated: bool = False,
) -> Slot | RateCap | Breaker:
    """With a window slot: take the rate token and the breaker ticket.

    Returns the slot, or what to wait for first: the rate cap (keeping the
    window slot; then ``claim`` again with ``rated``, or give the slot back
    if the wait fails), or a half-open probe's verdict (the slot given
    back; then start over). The rate token is taken
    last, by a caller that can start at once: taken before the window,
    tokens would pile up in its queue and be spent together when slots free.
    """
    core = call.core
    with core.lock:
        rate = core.rate_cap()
        if not rated and rate is not None and not rate.try_take(now):
            return rate  # waited for with the window slot held
        try:
            # Claimed only now that we can send: a half-open probe never queues.
            ticket = up.breaker.acquire()
        except CircuitOpenError as exc:
            up.window.release(permit, Signal.CANCELLED)
            if up.breaker.probe_pending:
                return up.breaker
            raise call.circuit_error(exc) from None
        return Slot(up, permit, ticket, waited or rated, quota_claim)


def admit_hedge(call: CallState, now: float) -> Slot | None:
    """What a hedge needs, taken now or not at all: a hedge never waits.

    It needs an upstream with no hint hold and a closed breaker (a hedge
    never takes the half-open probe), a free window slot there, a rate
    token at hand, room in its quota, and a withdrawal from the retry budget.
    """
    core = call.core
    if call.deadline is not None and now >= call.deadline:
        return None
    with core.lock:
        order = _order(call, now)
        rate = core.rate_cap()
        for up in order:
            if not up.breaker.lets_through or not up.takes(call.priority, now):
                continue
            permit = up.window.try_acquire(call.priority)
            if permit is None:
                continue
            receipt = core.budget.withdraw()
            quota_claim = call.claim()
            if (
                receipt is None
                or not up.quota.try_take(quota_claim, now)
                or (rate is not None and not rate.try_take(now))
            ):
                if receipt is not None:
                    core.budget.refund(receipt)
                up.quota.refund(quota_claim, now)
                up.window.release(permit, Signal.CANCELLED)
                core.counters.hedges_denied += 1
                return None
            core.counters.hedges += 1
            return Slot(up, permit, up.breaker.acquire(), True, quota_claim)
        return None
