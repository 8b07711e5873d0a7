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
  The callers of one member wait for a lease in a line (``_lease_line``), by
  priority then arrival, as they do for a window slot; only the head asks
  Redis, so each member polls at one pace however many of its calls wait.

Nothing here does I/O: admission yields a ``FleetOp`` for the driver to run
and is sent the result; what an attempt leaves to do (its readings, its
lease, its hint) goes to ``backlog``, which the drivers run after each
attempt and before each admission. Every operation answers ``None`` when
Redis is down or slow: the Gate then goes on alone (``available`` false), its
quota paced at ``1 / members`` of what the provider's headers say, and tries
Redis again every ``REJOIN_EVERY_S`` (a membership heartbeat) until it answers.

One background thread per Gate (started when first needed, ended when it has
nothing left to do) renews the leases held and runs what must not wait for
the next call: the release of a lease held past its call (``Lease.release``,
which may run on an event loop that must not block on Redis), and what a
cancelled attempt gave back after its driver could no longer await.
"""

from __future__ import annotations

import functools
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from yieldgate.gate._breaker import BreakerState
from yieldgate.gate._cost import scoped_key
from yieldgate.gate._first_reading import FirstReadings
from yieldgate.gate._lease_line import LeaseLine
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
# The (upstream, scope) pairs whose next ask for shapes is remembered, at most.
MAX_SHAPES_DUE = 1024
PRIORITY_OF = {rank: priority for priority, rank in RANK.items()}
log = logging.getLogger("yieldgate")


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
        self.clock: Callable[[], float] = time.monotonic  # the Gate's (set by it)
        self.gate = gate
        self.budget_policy = budget
        self.available = True
        self.backlog: deque[FleetOp] = deque()
        self._holds_read: dict[str, float] = {}
        self._shapes_due: dict[tuple[str, str], float] = {}
        self._heartbeat_due: dict[str, float] = {}
        self.members: dict[str, int] = {}
        # The callers of this member waiting for a fleet lease (``_lease_line``).
        self.line = LeaseLine(policy.poll_s)
        # Calls made and not yet told the fleet's retry budget (told in batches).
        self.deposits = 0
        self._deposited = -1.0
        # Upstreams whose last verdict this member reported was a failure: only then
        # does a success need telling (it ends the fleet's run of failures).
        self._failing: set[str] = set()
        # What the worker runs first on each round (the Gate gives back the fleet leases
        # of its dropped leases: ``GateCore.drain_orphans``).
        self.drain: Callable[[], None] | None = None
        # Each upstream's first reading of its quota: one member probes, the rest wait.
        self.first = FirstReadings(policy)
        self._init_worker()

    def _init_worker(self) -> None:
        # Leases held now (id -> upstream), renewed by the worker every third of their
        # TTL; ops for it to run at once; both guarded by ``_cond``.
        self._cond = threading.Condition(threading.Lock())
        self.leases: dict[str, str] = {}
        self._soon: deque[FleetOp] = deque()
        self._worker: threading.Thread | None = None
        self._stopped = False
        # When the leases held are next renewed (a third of their TTL after the
        # earliest grant or renewal not yet followed by one).
        self._renew_at = math.inf

    # -- before admission -----------------------------------------------------------

    def before(self, up: Upstream, now: float, scope: str = "") -> list[FleetOp]:
        """What to ask the fleet before admitting a call of ``scope`` to ``up``: a
        heartbeat when due (also the probe that rejoins after an outage), the holds
        when last read long ago, and the buckets' shapes while no answer has taught
        this member the scope's quota."""
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
            and not up.quota.learnt_for(scope)
            and self.first.settled(up)
            and now >= self._shapes_due.get((up.name, scope), -1.0)
        ):
            # No answer has taught this member the quota yet: the fleet may know it.
            if len(self._shapes_due) >= MAX_SHAPES_DUE:
                self._shapes_due.clear()  # bounded: at worst, asked again a little early
            self._shapes_due[up.name, scope] = now + HEARTBEAT_EVERY_S
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
        elif op.name in ("shapes", "first"):
            if got is None:
                self._unavailable(ups)
            shapes = got if op.name == "shapes" else self.first.told(up, got, now)
            for key, shape in (shapes or {}).items():
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

    def observe(
        self, up: Upstream, claim: Claim, readings: Sequence[QuotaReading], now: float
    ) -> None:
        """A response's readings, for the fleet's buckets its claim took from; or, for a
        claim the fleet never numbered (sent before any bucket was known), for every
        bucket read, as a reading older than any take (it may only lower a level, or
        creates the bucket): so the fleet learns the quota from a member's first answer."""
        taken = {key: amount for key, amount, _, _ in claim.wants} if claim.seq else None
        for reading in readings:
            key = scoped_key(reading.key, claim.scope)
            amount = 0.0 if taken is None else taken.get(key)
            bucket = up.quota.buckets.get(key)
            if amount is None or bucket is None:
                continue
            kwargs = {
                "limit": bucket.limit,
                "rate": bucket.rate,
                "remaining": reading.remaining,
                "amount": amount,
                "seq": claim.seq,
                "resource": bucket.resource,
                # Which reading is newest is told by when its request was sent: its
                # age when the operation goes (it may wait in the backlog a while).
                "age_s": functools.partial(_age, self.clock, claim.started),
            }
            self.backlog.append(FleetOp("observe", (up.name, key), kwargs))
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

    # -- leases ------------------------------------------------------------------------

    def leased(self, up: Upstream, lease: str) -> None:
        """A lease was granted: renew it, a third of its TTL from now, until it is released."""
        due = time.monotonic() + self.policy.lease_ttl_s / 3  # from the grant, not the worker
        with self._cond:
            self.leases[lease] = up.name
            if due < self._renew_at:
                self._renew_at = due
                self._cond.notify()
            self._ensure_worker()

    def released(self, lease: str) -> None:
        with self._cond:
            self.leases.pop(lease, None)

    def release(self, up: Upstream, lease: str, *, soon: bool = False) -> None:
        """Give a lease back: no longer renewed, and released in Redis (by the next
        flush, or at once by the worker when ``soon``)."""
        self.released(lease)
        op = FleetOp("release", (up.name, lease))
        if soon:
            self.run_soon([op])
        else:
            self.backlog.append(op)

    def release_nowait(self, up: Upstream, lease: str) -> bool:
        """``release(soon=True)`` if that takes no waiting and no new thread (a garbage
        collector's finalizer may run inside this very code); ``False``: not done."""
        if not self._cond.acquire(blocking=False):
            return False
        try:
            if self._worker is None:
                return False
            self.leases.pop(lease, None)
            self._soon.append(FleetOp("release", (up.name, lease)))
            self._cond.notify()
        finally:
            self._cond.release()
        return True

    def run_soon(self, ops: Sequence[FleetOp]) -> None:
        """Have the worker run ``ops`` now, off every caller's path."""
        with self._cond:
            self._soon.extend(ops)
            self._ensure_worker()
            self._cond.notify()

    def hand_over(self) -> None:
        """What attempts left for the fleet, run by the worker (a driver that can no
        longer await it: a cancelled call)."""
        ops = []
        while self.backlog:
            try:
                ops.append(self.backlog.popleft())
            except IndexError:
                break
        if ops:
            self.run_soon(ops)

    def _ensure_worker(self) -> None:
        # Under ``_cond``: a worker exits only under it, having seen nothing to do.
        if self._worker is None and (self._soon or not self._stopped):
            self._worker = threading.Thread(
                target=self._work, name=f"yieldgate-fleet-{self.gate}", daemon=True
            )
            self._worker.start()

    def _work(self) -> None:
        """Renew the leases held a third of their TTL before they would lapse, and run
        the ops handed over; end when there is neither (a member that dies stops
        renewing, and its leases lapse)."""
        every = self.policy.lease_ttl_s / 3
        while True:
            drain = self.drain
            if drain is not None:
                drain()  # outside ``_cond``: it takes the Gate's lock, then ours
            with self._cond:
                while True:
                    if not self._soon and (self._stopped or not self.leases):
                        self._worker = None
                        self._renew_at = math.inf
                        return
                    if self._soon:  # run even once closed: they give back what was taken
                        break
                    left = self._renew_at - time.monotonic()
                    if left <= 0:
                        break
                    self._cond.wait(left)
                ops = list(self._soon)
                self._soon.clear()
                renew: dict[str, list[str]] = {}
                if time.monotonic() >= self._renew_at and not self._stopped:
                    self._renew_at = time.monotonic() + every
                    for lease, upstream in self.leases.items():
                        renew.setdefault(upstream, []).append(lease)
            for op in ops:
                try:
                    getattr(self.fleet, op.name + "_sync")(*op.args, **op.kwargs)
                except Exception:  # pragma: no cover - a fleet op answers None, never raises
                    log.exception("a fleet operation of gate %r raised", self.gate)
            for upstream, leases in renew.items():
                self.fleet.renew_sync(upstream, leases)

    def close(self) -> list[FleetOp]:
        """Stop renewing; the ops still to run (what leases and attempts gave back, not
        run yet), for the closing Gate to run before its fleet link closes."""
        with self._cond:
            self._stopped = True
            ops = list(self._soon)
            self._soon.clear()
            self._cond.notify()
            worker = self._worker
        if worker is not None and worker is not threading.current_thread():
            # The ops it is running now reach Redis before the link closes.
            worker.join(self.policy.budget_s * 4)
        while self.backlog:
            try:
                ops.append(self.backlog.popleft())
            except IndexError:
                break
        return ops

    def forked(self) -> None:
        """In a forked child: the parent's leases, ops and thread are not this
        process's (its leases lapse when the parent stops renewing them)."""
        self._init_worker()
        self.backlog.clear()
        self.line = LeaseLine(self.policy.poll_s)
        self.deposits = 0
        self.first.forked()

    def audit(self, held: Any) -> list[str]:
        """What the fleet link holds that no held slot accounts for (see GateCore.audit)."""
        problems = []
        kept = {h.lease for h in held if h.lease is not None}
        with self._cond:
            stray = [lease for lease in self.leases if lease not in kept]
            queued = len(self._soon)
        if stray:
            problems.append(f"{len(stray)} fleet lease(s) held and renewed with no call")
        waiting = self.line.waiting()
        if waiting:
            problems.append(f"{waiting} caller(s) in line for a fleet lease")
        if self.backlog or queued:
            problems.append(f"{len(self.backlog) + queued} fleet operation(s) not yet run")
        return problems

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

    def finished(self, up: Upstream, claim: Claim) -> None:
        """An attempt's take was answered without a reading (or not at all)."""
        if claim.seq and not claim.observed:
            self.backlog.append(FleetOp("finished", (up.name, _amounts(claim))))
            claim.observed = True
        told = self.first.answered(up)
        if told is not None:
            self.backlog.append(FleetOp(*told))

    def hold(self, up: Upstream, rank: int, hold_s: float) -> None:
        """Share a congestion hint with the fleet."""
        if hold_s > 0 and self.available:
            self.backlog.append(FleetOp("hold", (up.name, rank, hold_s)))

    def release_probe(self, up: Upstream) -> None:
        """The fleet's half-open probe this member held had no verdict: free it."""
        self.backlog.append(FleetOp("release_probe", (up.name,)))


def _amounts(claim: Claim) -> list[tuple[str, float]]:
    return [(key, amount) for key, amount, _, _ in claim.wants]


def _age(clock: Callable[[], float], sent: float) -> float:
    """Seconds since ``sent``, on the Gate's clock."""
    return max(0.0, clock() - sent)
