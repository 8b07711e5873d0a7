"""A Gate's link to its fleet, sans-IO: what to do in Redis, and what came back.

A Gate built with ``shared=`` keeps its own state as before and shares three
things with the other members of its fleet through a ``yieldgate.fleet.Fleet``:

- **the quota**: in shared mode an attempt's cost is taken from the fleet's
  buckets (``take``), the readings of its response are applied there
  (``observe``), and what never went out is given back (``refund``), by the
  quota link this is built on (``_shared_quota``). The local buckets go on
  learning from every reading, as the fallback.
  A member that has had no answer yet asks the fleet for the buckets' shapes
  (``shapes``) and paces by them from its first call, instead of sending blind.
- **hint holds**: a congestion hint one member sees holds everyone's
  attempts at that priority and below (``hold``); a provider's refusal for
  one scope's quota (a model's) holds that scope's claims alone, everywhere;
  each member reads the holds at most every ``HOLDS_EVERY_S`` before
  admitting (``all_holds``).
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

One background thread per Gate (``_fleet_worker``, whose half of the link
``Shared`` extends) renews the leases held, gives back the fleet leases of
held slots dropped or lapsed, and runs what must not wait for the next call.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from yieldgate.gate._breaker import BreakerState
from yieldgate.gate._first_reading import FirstReadings
from yieldgate.gate._fleet_op import FleetOp
from yieldgate.gate._fleet_worker import FleetWorker
from yieldgate.gate._lease_line import LeaseLine
from yieldgate.gate._policy import FleetPolicy, RetryBudgetPolicy
from yieldgate.gate._quota import Claim
from yieldgate.gate._shared_quota import QuotaLink
from yieldgate.gate._upstream import Upstream
from yieldgate.gate._window import RANK

__all__ = ["GRANTS", "FleetOp", "Shared", "given_back"]

HOLDS_EVERY_S = 0.025
HEARTBEAT_EVERY_S = 1.0
# A member counts in the fleet's shares while it admitted a call this recently.
ACTIVE_S = 3.0
REJOIN_EVERY_S = 1.0
# The (upstream, scope) pairs whose next ask for shapes is remembered, at most.
MAX_SHAPES_DUE = 1024
PRIORITY_OF = {rank: priority for priority, rank in RANK.items()}
# What the other members wait on: an operation of these that Redis did not answer is
# run again once it answers (the first reading's settlement, or its probe handed back;
# each can be run twice).
AGAIN = frozenset({"probed", "abandon_first"})
# The fleet operations whose answer grants what must be given back (``given_back``).
GRANTS = frozenset({"acquire", "take", "withdraw", "claim_probe", "first"})


class Shared(QuotaLink, FleetWorker):
    """The fleet a Gate belongs to, and the state of its link (see the module docstring)."""

    def __init__(
        self,
        fleet: Any,
        policy: FleetPolicy,
        gate: str,
        budget: RetryBudgetPolicy,
        *,
        hint_jitter: float = 0.5,
    ) -> None:
        self.fleet = fleet
        self.policy = policy
        # A hold another member shared is spread over this member's own jitter, as its
        # own hints are (``RetryPolicy.hint_jitter``).
        self.hint_jitter = hint_jitter
        self.clock: Callable[[], float] = time.monotonic  # the Gate's (set by it)
        self.gate = gate
        self.budget_policy = budget
        self.available = True
        self.backlog: deque[FleetOp] = deque()
        self._holds_read: dict[str, float] = {}
        # Per upstream, while a read of the fleet's holds is out: the attempt reading them,
        # and the wake-ups of the attempts that wait for it (what it reads may hold them).
        self._holds_out: dict[str, tuple[object, dict[int, Callable[[], None]]]] = {}
        self._shapes_due: dict[tuple[str, str], float] = {}
        self._heartbeat_due: dict[str, float] = {}
        self.members: dict[str, int] = {}
        self.unsettled = 0
        # The callers of this member waiting for a fleet lease (``_lease_line``).
        self.line = LeaseLine(policy.poll_s)
        # Calls made and not yet told the fleet's retry budget (told in batches).
        self.deposits = 0
        self._deposited = -1.0
        # Upstreams whose last verdict this member reported was a failure: only then
        # does a success need telling (it ends the fleet's run of failures).
        self._failing: set[str] = set()
        # Each upstream's first reading of its quota: one member probes, the rest wait.
        self.first = FirstReadings(policy)
        self._init_worker()

    # -- before admission -----------------------------------------------------------

    def before(
        self, up: Upstream, now: float, scope: str = "", owner: object = None
    ) -> list[FleetOp]:
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
            if up.name not in self._holds_read:
                # The member's first read: its burst waits for it (``holds_read`` ends
                # it), so that none of it goes past a hold another member set. Later
                # reads refresh what is known, and no call waits for them.
                self._holds_out[up.name] = (owner, {})
            self._holds_read[up.name] = now
            ops.append(FleetOp("all_holds", (up.name,)))
            if up.breaker.policy.enabled:
                ops.append(FleetOp("breaker", (up.name,)))
        return ops

    def reading_holds(self, up: Upstream, owner: object) -> bool:
        """Whether another attempt's read of ``up``'s holds is out (``owner``, an
        attempt, waits for it)."""
        out = self._holds_out.get(up.name)
        return out is not None and out[0] is not owner

    def wait_holds(self, up: Upstream, owner: object, wake: Callable[[], None] | None) -> None:
        """``owner`` (an attempt) waits for the read of ``up``'s holds out (``wake``), or
        no longer."""
        out = self._holds_out.get(up.name)
        if out is not None and wake is not None:
            out[1][id(owner)] = wake
        elif out is not None:
            out[1].pop(id(owner), None)

    def holds_read(self, up: Upstream, owner: object) -> None:
        """``owner``'s read of ``up``'s holds is over (answered, or given up; ``owner`` is
        the attempt that read them): the attempts that waited for it look again."""
        out = self._holds_out.get(up.name)
        if out is not None and out[0] is owner:
            del self._holds_out[up.name]
            for wake in out[1].values():
                wake()

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
                self._send_again()
            self._set_share(up)
        elif op.name == "shapes":
            if got is None:
                self._unavailable(ups)
            self._seed(up, got, now)
        elif op.name == "all_holds":
            if got is None:
                self._unavailable(ups)
                return
            for scope, ranks in got.items():
                for rank, left in ranks.items():
                    priority = PRIORITY_OF.get(int(rank))
                    if priority is None or left <= 0:
                        continue
                    if scope:  # one scope's quota: its claims, released over the jitter
                        up.quota.lanes.hold(scope, priority, left, now)
                    else:  # none before the hint, then one by one over the jitter
                        up.window.hold(priority, now + left * (1 + self.hint_jitter), now + left)
        elif op.name == "breaker" and got is not None:
            # The fleet's breaker is the authority: one member's failures open it for all.
            if got.state is not BreakerState.CLOSED:  # open, or half-open: probe first
                up.breaker.trip(got.retry_after_s)
            elif got.state is BreakerState.CLOSED:
                up.breaker.reset()

    def told_first(
        self, ups: Sequence[Upstream], up: Upstream, attempt: Any, got: Any, now: float
    ) -> None:
        """What ``attempt``'s ask for ``up``'s first reading answered (``Fleet.first``)."""
        if got is None:
            self._unavailable(ups)
        shapes, after = self.first.told(up, attempt, got, now)
        self._seed(up, shapes, now)
        if after is not None:
            self.backlog.append(FleetOp(*after))

    def alone(self, up: Upstream, now: float) -> None:
        """Redis is away: this member reads ``up``'s quota itself (``FirstReadings.alone``)."""
        op = self.first.alone(up, now)
        if op is not None:
            with self._cond:
                self._again[op[0], op[1][0]] = FleetOp(*op)

    def _seed(self, up: Upstream, shapes: Any, now: float) -> None:
        for key, shape in (shapes or {}).items():
            up.quota.seed(key, shape.resource, shape.limit, shape.rate, now)

    def ran(self, op: FleetOp, got: Any) -> None:
        """What a backlog's operation answered: one the other members wait on, unanswered
        (Redis away, or slower than the budget), is kept to run again."""
        if got is None and op.name in AGAIN:
            with self._cond:
                self._again[op.name, op.args[0]] = op

    def _send_again(self) -> None:
        """Redis answers again: what it did not answer before goes back in the backlog
        (not a probe handed back that this member has taken again since)."""
        with self._cond:
            if not self._again:
                return
            ops, self._again = list(self._again.values()), {}
        for op in ops:
            if op.name != "abandon_first" or not self.first.probing(op.args[0]):
                self.backlog.append(op)

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

    # -- after an attempt --------------------------------------------------------------

    # -- leases ------------------------------------------------------------------------

    def release(self, up: Upstream, lease: str, *, soon: bool = False) -> None:
        """Give a lease back: no longer renewed, and released in Redis (by the next
        flush, or at once by the worker when ``soon``)."""
        self.released(lease)
        op = FleetOp("release", (up.name, lease))
        if soon:
            self.run_soon([op])
        else:
            self.backlog.append(op)

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

    def close(self) -> list[FleetOp]:
        """Stop renewing; the ops still to run (what leases and attempts gave back, not
        run yet), for the closing Gate to run before its fleet link closes."""
        ops = self.stop()
        while self.backlog:
            try:
                ops.append(self.backlog.popleft())
            except IndexError:
                break
        return ops

    def forked(self) -> None:
        """In a forked child: the parent's leases, ops and thread are not this
        process's (its leases lapse when the parent stops renewing them)."""
        self._init_worker()  # and no operation of the parent's to run again
        self.backlog.clear()
        self.line = LeaseLine(self.policy.poll_s)
        self.deposits = 0
        self.unsettled = 0
        self._holds_out.clear()
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
        if self.unsettled:
            # Nothing in flight, nothing unseen: each take is settled by its readings
            # and, for the buckets they did not read, when its attempt ends.
            problems.append(f"{self.unsettled} fleet take(s) still counted unseen")
        if self._holds_out:
            problems.append(f"{len(self._holds_out)} read(s) of the fleet's holds out")
        problems += self.first.audit()
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
        """An attempt that was sent is over (answered or not)."""
        self.settle_unseen(up, claim)

    def hold(self, up: Upstream, rank: int, hold_s: float, scope: str = "") -> None:
        """Share a congestion hint with the fleet (with ``scope``: a provider's refusal
        for that scope's quota, which holds its claims alone)."""
        if hold_s > 0 and self.available:
            kwargs = {"scope": scope} if scope else {}
            self.backlog.append(FleetOp("hold", (up.name, rank, hold_s), kwargs))

    def release_probe(self, up: Upstream) -> None:
        """The fleet's half-open probe this member held had no verdict: free it."""
        self.backlog.append(FleetOp("release_probe", (up.name,)))


def given_back(op: FleetOp, got: Any) -> FleetOp | None:
    """What gives back what the answer ``got`` to ``op`` granted (``None``: it granted
    nothing): for a grant a call received and never entered in a ledger (an interrupt
    between the two: ``CallState.granted``)."""
    if got is None or got is False:
        return None
    name, upstream = op.name, op.args[0]
    if name == "acquire":
        return FleetOp("release", (upstream, got))
    if name == "take" and got.ok:
        return FleetOp("refund", (upstream, [(key, amount) for key, amount, _, _ in op.args[1]]))
    if name == "withdraw":
        return FleetOp("refund_retry", (*op.args, got))
    if name == "claim_probe" and got is True:
        return FleetOp("release_probe", (upstream,))
    if name == "first" and got.state == "mine":
        return FleetOp("abandon_first", (upstream,))
    return None
