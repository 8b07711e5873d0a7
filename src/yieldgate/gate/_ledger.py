"""The ledger: what one attempt holds, and the one place that gives it back.

An ``Attempt`` is created, empty, before its admission begins, by the driver
that will close it in a ``finally``. Everything admission acquires is
entered in it at the moment it is acquired, under the Gate's lock, in the
same step as the acquisition (a waiter granted a slot by another thread
holds it on its ``Waiter``, which the ledger owns from the moment it
queued): a queued quota claim, the claim taken from the quota (and the
fleet's take), a window waiter, the window permit (with the rate cap's start
taken with it), a fleet in-flight lease or a place in the line for one, the
breaker's ticket, the fleet's half-open probe, and a hedge's retry-budget
draw.

``give_back`` returns all of it, each exactly once, whatever ended the
attempt: an answer (its signal and verdict tell the window and the breaker
how it went), a failure, a cancellation, a deadline, an exception from user
code, an admission that starts over. Nothing else releases anything. The
one exception is the slot of a call that holds its winner's slot: that is
moved, in the same step, to a ``Lease`` (``_lease``), the ledger of a held
slot. An attempt of a process that has forked since it began (``epoch``)
touches nothing: its resources were its parent's.

User code never runs here: the window's and the breaker's listeners only
queue their notifications (``GateCore.events``), delivered once the lock is
released.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from yieldgate.gate._breaker import BreakerTicket, Verdict
from yieldgate.gate._fleet_op import FleetOp
from yieldgate.gate._quota import BLIND, NOTHING, ONE_REQUEST, Claim, Cost, QuotaReading
from yieldgate.gate._window import Permit, Signal, Waiter
from yieldgate.protocol import Priority

if TYPE_CHECKING:
    from yieldgate.gate._core import GateCore
    from yieldgate.gate._upstream import Upstream

__all__ = ["Attempt"]


class Attempt:
    """One attempt of a call: who it is for, when it runs, and its ledger.

    The call's traits an attempt needs later (its priority, cost, arrival,
    deadline) are copied here, so that the attempt and what reads it
    (``current_attempt``, a stream reporting its usage after the call
    returned) never need the call itself.
    """

    __slots__ = (
        "blind",
        "call_deadline",
        "claim",
        "core",
        "cost",
        "deadline",
        "ended",
        "epoch",
        "first",
        "hedging",
        "key",
        "lease",
        "number",
        "permit",
        "priority",
        "probe",
        "queued",
        "read",
        "receipt",
        "sent",
        "settled",
        "started",
        "task",
        "ticket",
        "turn",
        "up",
        "waiter",
    )

    def __init__(
        self,
        core: GateCore,
        priority: Priority,
        cost: Cost,
        key: float,
        call_deadline: float | None,
        hedging: bool,
    ) -> None:
        self.core = core
        self.epoch = core.epoch
        self.priority = priority
        self.cost = cost
        self.key = key  # the call's arrival: its place in every queue
        self.call_deadline = call_deadline
        self.hedging = hedging
        self.number = 0  # set when sent
        self.started = 0.0
        self.deadline: float | None = None
        self.task: object = None
        self.settled = False  # its quota claim settled against what it used
        self.sent = False
        self.ended = False  # its end was recorded (``CallState.end``)
        self.read = False  # its answer carried quota readings
        # -- the ledger: each None / False until acquired, and again once given back
        self.up: Upstream | None = None
        self.claim: Claim | None = None  # taken from the quota (or BLIND)
        self.queued = False  # ``claim`` is in the quota's queue
        self.blind = False  # a BLIND claim counted in flight
        self.waiter: Waiter | None = None  # queued for a window slot
        self.permit: Permit | None = None
        self.turn: Any = None  # in the line for a fleet lease
        self.lease: str | None = None  # a fleet in-flight lease
        self.ticket: BreakerTicket | None = None
        self.probe = False  # holds the fleet's half-open probe
        self.first: str | None = None  # asks for, or probes, the fleet's first reading
        self.receipt: int | None = None  # a hedge's retry-budget draw

    @property
    def upstream(self) -> Upstream:
        up = self.up
        assert up is not None  # set before anything else is acquired
        return up

    # -- what it reports after it was sent ---------------------------------------

    def used(self, used: Cost) -> None:
        """What the attempt really used: the caller's own budgets are settled by it."""
        core = self.core
        claim, up = self.claim, self.up
        if claim is None or up is None:
            return
        if core.policy.quota.settle != "usage":
            return  # the caller's budgets keep what was estimated at the door
        with core.lock:
            if self.settled or self.epoch != core.epoch:
                return
            self.settled = True
            up.quota.settle_own(claim, used, core.clock())
            if core.shared is not None:
                core.shared.settle(up, claim, used)

    def observe(self, readings: tuple[QuotaReading, ...]) -> None:
        """A response's quota readings, for the upstream this attempt went to."""
        core = self.core
        claim, up = self.claim, self.up
        if up is None:
            return
        with core.lock:
            if self.epoch != core.epoch:
                return
            if readings:
                self.read = True
            # A blind attempt is still counted in flight: its own reading counts it.
            blind = self.cost if self.blind else None
            up.quota.observe(readings, claim, core.clock(), blind=blind)
            if core.shared is not None and claim is not None:
                core.shared.observe(up, claim, readings, core.clock())

    def answered_model(self, model: str) -> None:
        """The model the answer names (its ``model`` field): a snapshot of the scope
        requested is metered as that scope from now on (``Aliases.learn``)."""
        core = self.core
        if self.cost.scope and model != self.cost.scope:
            with core.lock:
                core.aliases.learn(self.cost.scope, model)

    def refused(self, now: float) -> None:
        """Refused at the door (a yield), before any work: it used nothing."""
        if self.settled or self.claim is None or self.up is None:
            return
        self.settled = True
        self.up.quota.settle_own(self.claim, NOTHING, now)
        if self.core.shared is not None:
            self.core.shared.settle(self.up, self.claim, NOTHING)

    # -- admission's entries --------------------------------------------------------

    def send(self, now: float, attempt_s: float | None) -> None:
        """The attempt goes out now (under the lock): its start, its deadline (its own
        timeout, ``attempt_s``, or the call's, whichever ends first), its claim in flight."""
        deadline = self.call_deadline
        if attempt_s is not None and (deadline is None or now + attempt_s < deadline):
            deadline = now + attempt_s
        self.started = now
        self.deadline = deadline
        self.mark_sent(now)

    def mark_sent(self, now: float) -> None:
        """The attempt is going out: its claim is in flight from now (under the lock)."""
        self.sent = True
        up, claim = self.up, self.claim
        assert up is not None
        if claim is None or claim is BLIND:
            self.claim = BLIND
            self.blind = True
            if self.cost is ONE_REQUEST:
                up.quota.blind_requests += 1
            else:
                up.quota.blind(self.cost, 1)
        else:
            up.quota.sent(claim, now)  # the provider counts it from its arrival

    # -- the give-back -----------------------------------------------------------------

    def give_back(
        self,
        now: float,
        signal: Signal = Signal.CANCELLED,
        verdict: Verdict = Verdict.NEUTRAL,
        error: BaseException | None = None,
    ) -> None:
        """Give back everything held, each thing once (under the Gate's lock).

        ``signal`` and ``verdict`` say how a sent attempt went, for the window
        and the breaker; one never sent gives back as cancelled and neutral,
        and its quota claim, fleet take, rate start and budget draw are
        refunded. The ledger stays usable: an admission that starts over
        fills it again.
        """
        core = self.core
        up = self.up
        if up is None or self.epoch != core.epoch:
            self._forget()
            return
        shared = core.shared
        sent = self.sent
        # Places in lines first: nobody may be granted to a caller that is leaving.
        claim = self.claim
        if self.queued:
            self.queued = False
            if claim is not None:
                up.quota.leave(claim, now)
        turn, self.turn = self.turn, None
        if turn is not None and shared is not None:
            shared.line.leave(up, turn)
        waiter, self.waiter = self.waiter, None
        if waiter is not None:
            up.window.abandon(waiter)  # hands on a permit granted just now
        # The quota: in flight until answered, or refunded if never sent.
        if claim is not None:
            if claim is BLIND:
                if self.blind:
                    self.blind = False
                    if self.cost is ONE_REQUEST:
                        up.quota.blind_requests -= 1
                    else:
                        up.quota.blind(self.cost, -1)
            elif sent:
                up.quota.finished(claim)
                if shared is not None:
                    shared.finished(up, claim)
            else:
                up.quota.refund(claim, now)
                if shared is not None:
                    shared.refund(up, claim)
            if not sent:
                self.claim = None
        lease, self.lease = self.lease, None
        if lease is not None and shared is not None:
            shared.release(up, lease)
        if shared is not None:
            if self.first is not None:
                # Only an answer that came back settles the fleet's first reading.
                answered = sent and signal is Signal.SUCCESS
                op = shared.first.left(up, self, read=self.read, answered=answered)
                if op is not None:
                    shared.backlog.append(FleetOp(*op))
            # Waits and reads this attempt entered (taken out by their ``finally``s,
            # unless an interrupt landed on one's first line), and a probe handed on
            # to waiters none of which took it.
            op = shared.first.leaving(up, self)
            if op is not None:
                shared.backlog.append(FleetOp(*op))
            shared.holds_read(up, self)
            shared.wait_holds(up, self, None)
        if self.probe:
            self.probe = False
            if shared is not None and (not sent or verdict is Verdict.NEUTRAL):
                # The fleet's probe had no verdict: the next member may take it now.
                shared.release_probe(up)
        permit, self.permit = self.permit, None
        if permit is not None:
            if sent:
                up.window.release(permit, signal)
            else:
                up.window.give_back(permit)  # and the rate cap's start taken with it
        ticket, self.ticket = self.ticket, None
        if ticket is not None:
            up.breaker.record(ticket, verdict if sent else Verdict.NEUTRAL, error)
            if shared is not None and sent and verdict is not Verdict.NEUTRAL:
                shared.verdict(up, verdict is Verdict.SUCCESS, probe=ticket.probe)
        receipt, self.receipt = self.receipt, None
        if receipt is not None:
            if sent:
                core.draws -= 1  # spent: the hedge went out
            else:
                core.refund_draw(receipt)

    def _forget(self) -> None:
        """Drop every entry without touching any state (nothing was acquired, or the
        state it was acquired from is a forked parent's)."""
        self.queued = self.blind = self.probe = False
        self.first = None
        self.turn = self.waiter = self.permit = self.lease = self.ticket = None
        self.receipt = None
        if not self.sent:
            self.claim = None

    def holds(self) -> bool:
        """Whether anything is entered (for the invariant checks)."""
        return bool(
            self.queued
            or self.blind
            or self.probe
            or self.first is not None
            or self.turn is not None
            or self.waiter is not None
            or self.permit is not None
            or self.lease is not None
            or self.ticket is not None
            or self.receipt is not None
        )
