"""A Gate's link to its fleet, sans-IO: what to do in Redis, and what came back.

A Gate built with ``shared=`` keeps its own state as before and shares three
things with the other members of its fleet through a ``yieldgate.fleet.Fleet``:

- **the quota**: in shared mode an attempt's cost is taken from the fleet's
  buckets (``take``), the readings of its response are applied there
  (``observe``), and what never went out is given back (``refund``). The
  local buckets go on learning from every reading, as the fallback.
  A member that has had no answer yet asks the fleet for the buckets' shapes
  (``shapes``) and paces by them from its first call, instead of sending blind.
- **hint holds**: a congestion hint one member sees holds everyone's
  attempts at that priority and below (``hold``); each member reads the
  holds at most every ``HOLDS_EVERY_S`` before admitting (``holds``).
- **in-flight leases**, with ``FleetPolicy.inflight_cap``: an attempt sends
  only with a lease (``acquire``), given back when it ends (``release``).

Nothing here does I/O: admission yields a ``FleetOp`` for the driver to run
and is sent the result; what an attempt leaves to do (its readings, its
lease, its hint) goes to ``backlog``, which the drivers run after each
attempt and before each admission. Every operation answers ``None`` when
Redis is down or slow: the Gate then goes on alone (``available`` false), its
quota paced at ``1 / members`` of what the provider's headers say, and tries
Redis again every ``REJOIN_EVERY_S`` (a membership heartbeat) until it answers.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Sequence
from typing import Any, NamedTuple

from yieldgate.gate._breaker import BreakerState
from yieldgate.gate._policy import FleetPolicy, RetryBudgetPolicy
from yieldgate.gate._quota import Claim, Cost, QuotaReading
from yieldgate.gate._upstream import Upstream
from yieldgate.gate._window import RANK

__all__ = ["FleetOp", "Shared"]

HOLDS_EVERY_S = 0.025
HEARTBEAT_EVERY_S = 1.0
# A member counts in the fleet's shares while it admitted a call this recently.
ACTIVE_S = 3.0
REJOIN_EVERY_S = 1.0
PRIORITY_OF = {rank: priority for priority, rank in RANK.items()}


class FleetOp(NamedTuple):
    """One operation of ``yieldgate.fleet.Fleet`` to run: its name (the async form;
    ``name + "_sync"`` the sync one), arguments and keyword arguments."""

    name: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any] = {}  # noqa: RUF012 - never mutated


class Shared:
    """The fleet a Gate belongs to, and the state of its link (see the module docstring)."""

    def __init__(
        self, fleet: Any, policy: FleetPolicy, gate: str, budget: RetryBudgetPolicy
    ) -> None:
        self.fleet = fleet
        self.policy = policy
        self.gate = gate
        self.budget_policy = budget
        self.available = True
        self.backlog: deque[FleetOp] = deque()
        self._holds_read: dict[str, float] = {}
        self._shapes_due: dict[str, float] = {}
        self._heartbeat_due: dict[str, float] = {}
        self.members: dict[str, int] = {}
        # Leases held now (id -> upstream), renewed by a thread every third of their TTL.
        self.leases: dict[str, str] = {}
        self._renewer: threading.Thread | None = None
        self._lease_poll: dict[str, float] = {}  # upstream -> no lease asked before
        # Calls made and not yet told the fleet's retry budget (told in batches).
        self.deposits = 0
        self._deposited = -1.0
        # Upstreams whose last verdict this member reported was a failure: only then
        # does a success need telling (it ends the fleet's run of failures).
        self._failing: set[str] = set()
        self._stop = threading.Event()

    # -- before admission -----------------------------------------------------------

    def before(self, up: Upstream, now: float) -> list[FleetOp]:
        """What to ask the fleet before admitting to ``up``: a heartbeat when due (also
        the probe that rejoins after an outage), and the holds when last read long ago."""
        ops = []
        if now >= self._heartbeat_due.get(up.name, -1.0):
            # Often enough that a member's share follows the fleet's size.
            every = min(ACTIVE_S / 3, HEARTBEAT_EVERY_S)
            self._heartbeat_due[up.name] = now + (every if self.available else REJOIN_EVERY_S)
            ops.append(FleetOp("heartbeat", (up.name,), {"ttl_s": ACTIVE_S}))
        if self.deposits and now - self._deposited >= HOLDS_EVERY_S:
            self._deposited = now
            n, self.deposits = self.deposits, 0
            self.backlog.append(FleetOp("deposit", (self.gate, self.budget_policy, n)))
        if (
            self.available
            and up.quota.learn
            and not up.quota.learnt
            and now >= self._shapes_due.get(up.name, -1.0)
        ):
            # No answer has taught this member the quota yet: the fleet may know it.
            self._shapes_due[up.name] = now + HEARTBEAT_EVERY_S
            ops.append(FleetOp("shapes", (up.name,)))
        if self.available and now - self._holds_read.get(up.name, -1.0) >= HOLDS_EVERY_S:
            self._holds_read[up.name] = now
            ops.append(FleetOp("holds", (up.name,)))
            if up.breaker.policy.enabled:
                ops.append(FleetOp("breaker", (up.name,)))
        return ops

    def apply(
        self, ups: Sequence[Upstream], up: Upstream, op: FleetOp, got: Any, now: float
    ) -> None:
        """What a ``before`` operation answered."""
        if op.name == "heartbeat":
            if got is None:
                self._unavailable(ups)
            else:
                self.members[up.name] = max(1, int(got))
                self._rejoin(ups)
            self._set_share(up)
        elif op.name == "shapes":
            if got is None:
                self._unavailable(ups)
                return
            for key, shape in got.items():
                up.quota.seed(key, shape.resource, shape.limit, shape.rate, now)
        elif op.name == "holds":
            if got is None:
                self._unavailable(ups)
                return
            for rank, left in got.items():
                priority = PRIORITY_OF.get(int(rank))
                if priority is not None and left > 0:
                    up.window.hold(priority, now + left, now + left)
        elif op.name == "breaker" and got is not None:
            # The fleet's breaker is the authority: one member's failures open it for all.
            if got.state is not BreakerState.CLOSED:  # open, or half-open: probe first
                up.breaker.trip(got.retry_after_s)
            elif got.state is BreakerState.CLOSED:
                up.breaker.reset()

    def _unavailable(self, ups: Sequence[Upstream]) -> None:
        if self.available:
            self.available = False
            for up in ups:
                up.quota.shared = False
                self._set_share(up)

    def _rejoin(self, ups: Sequence[Upstream]) -> None:
        if not self.available:
            self.available = True
            for up in ups:
                up.quota.shared = True

    def _set_share(self, up: Upstream) -> None:
        """A member's share of what the provider's headers say, of a full bucket and of
        its refill: ``1 / members`` of the members that sent calls in the last
        ``ACTIVE_S`` (so that members that start together share it evenly, and one
        left alone gets it all a few seconds later). Alone, from the last count."""
        share = 1.0 / self.members.get(up.name, 1)
        up.quota.cap = share
        up.quota.pace = share

    # -- the quota -------------------------------------------------------------------

    def take(self, up: Upstream, claim: Claim) -> FleetOp | None:
        """The fleet's take for ``claim`` (taken locally in shared mode), or ``None``
        when no bucket is known yet (the first answers teach it)."""
        wants = up.quota.wants(claim.cost)
        if not wants:
            return None
        claim.wants = wants  # what it takes there, if granted (``seq`` says whether it was)
        return FleetOp("take", (up.name, wants))

    def took(
        self, ups: Sequence[Upstream], up: Upstream, claim: Claim, got: Any, now: float
    ) -> bool:
        """What the fleet's take answered: ``True`` if ``claim`` may go; else it was
        refused (wait) or Redis is away (go on alone): the caller starts over."""
        if got is None:
            self._unavailable(ups)
            up.quota.refund(claim, now)
            return False
        if not got.ok:
            up.quota.poll_after = max(up.quota.poll_after, now + got.wait_s)
            up.quota.refund(claim, now)
            return False
        claim.seq = got.seq
        return True

    def refund(self, up: Upstream, claim: Claim) -> None:
        """A claim the fleet had granted was never sent."""
        if claim.seq:
            self.backlog.append(FleetOp("refund", (up.name, _amounts(claim))))
            claim.seq = 0

    def observe(self, up: Upstream, claim: Claim, readings: Sequence[QuotaReading]) -> None:
        """A response's readings, for the fleet's buckets its claim took from; or, for a
        claim the fleet never numbered (sent before any bucket was known), for every
        bucket read, as a reading older than any take (it may only lower a level, or
        creates the bucket): so the fleet learns the quota from a member's first answer."""
        taken = {key: amount for key, amount, _, _ in claim.wants} if claim.seq else None
        for reading in readings:
            amount = 0.0 if taken is None else taken.get(reading.key)
            bucket = up.quota.buckets.get(reading.key)
            if amount is None or bucket is None:
                continue
            kwargs = {
                "limit": reading.limit,
                "rate": bucket.rate,
                "remaining": reading.remaining,
                "amount": amount,
                "seq": claim.seq,
                "resource": bucket.resource,
            }
            self.backlog.append(FleetOp("observe", (up.name, reading.key), kwargs))
        if claim.seq:
            claim.observed = True

    def settle(self, up: Upstream, claim: Claim, used: Cost) -> None:
        """What the attempt of a claim the fleet granted really used: the caller's own
        budgets (``QuotaPolicy``'s buckets, which no provider's reading corrects) are
        settled in the fleet, as they are locally when alone."""
        if not claim.seq:
            return
        corrections = []
        for key, amount, _, _ in claim.wants:
            bucket = up.quota.buckets.get(key)
            if bucket is None or bucket.learnt:
                continue
            delta = amount - used.amount(bucket.resource)
            if delta:
                corrections.append((key, float(delta)))
        if corrections:
            self.backlog.append(FleetOp("settle", (up.name, corrections)))

    # -- after an attempt --------------------------------------------------------------

    def lease_pause(self, up: Upstream, now: float) -> float:
        """How long to wait before asking for a lease (another local call is asking)."""
        return self._lease_poll.get(up.name, 0.0) - now

    def lease_refused(self, up: Upstream, now: float, draw: float) -> None:
        """The cap is reached: nobody here asks again for a jittered ``poll_s``."""
        pause = self.policy.poll_s * (0.5 + draw)
        self._lease_poll[up.name] = max(self._lease_poll.get(up.name, 0.0), now + pause)

    def leased(self, up: Upstream, lease: str) -> None:
        """A lease was granted: renew it until it is released."""
        self.leases[lease] = up.name
        if self._renewer is None or not self._renewer.is_alive():
            self._renewer = threading.Thread(
                target=self._renew, name="yieldgate-fleet-leases", daemon=True
            )
            self._renewer.start()

    def released(self, lease: str) -> None:
        self.leases.pop(lease, None)

    def _renew(self) -> None:
        """Extend every lease held, a third of their TTL before they would lapse, until
        none is left; a member that dies stops renewing, and its leases lapse."""
        while not self._stop.wait(self.policy.lease_ttl_s / 3):
            held: dict[str, list[str]] = {}
            for lease, upstream in list(self.leases.items()):
                held.setdefault(upstream, []).append(lease)
            if not held:
                return
            for upstream, leases in held.items():
                self.fleet.renew_sync(upstream, leases)

    def close(self) -> None:
        self._stop.set()

    def verdict(self, up: Upstream, success: bool, *, probe: bool) -> None:
        """An attempt's verdict for the fleet's breaker (neutral ones are not told). A
        success is told only by a probe, or by a member whose last told verdict was a
        failure: it ends the fleet's run of failures; any other changes nothing."""
        if not self.available or not up.breaker.policy.enabled:
            return
        if success and not probe and up.name not in self._failing:
            return
        if success:
            self._failing.discard(up.name)
        else:
            self._failing.add(up.name)
        policy = up.breaker.policy
        self.backlog.append(FleetOp("report", (up.name, success, policy), {"probe": probe}))

    def ended(self, up: Upstream, claim: Claim, *, hold_s: float | None, rank: int) -> None:
        """An attempt ended: its take answered without a reading, its lease, its hint."""
        if claim.seq and not claim.observed:
            self.backlog.append(FleetOp("finished", (up.name, _amounts(claim))))
            claim.observed = True
        if claim.lease is not None and not claim.lease_held:
            self.backlog.append(FleetOp("release", (up.name, claim.lease)))
            self.released(claim.lease)
            claim.lease = None
        if hold_s is not None and hold_s > 0 and self.available:
            self.backlog.append(FleetOp("hold", (up.name, rank, hold_s)))


def _amounts(claim: Claim) -> list[tuple[str, float]]:
    return [(key, amount) for key, amount, _, _ in claim.wants]
