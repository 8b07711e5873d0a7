"""A provider's quota, per upstream: pace attempts so they fit before the 429.

Providers meter requests and tokens per key, in buckets that refill
continuously and hold one window's limit (a minute's, usually), and say on
every response how much is left. A ``Quota`` keeps one ``Bucket`` per
thing metered, each learnt from those headers (a ``QuotaReading``: limit,
remaining, time until full) or set by the caller's ``QuotaPolicy`` (requests
and tokens per minute, for providers that say nothing), and paces each
attempt by its ``Cost`` until every bucket holds it.

Accounting, sans-IO: an attempt that may start takes its cost from every
bucket (a ``Claim``); once sent it is in flight until its response. A
response's reading is the provider's count as of that attempt's arrival, at
some time between its send and its answer: the bucket is set from it as of
the answer (no refill is credited for a time the provider may not have had
it), less the costs of every claim still in flight or not sent yet, since
requests overtake each other on the way and any of those may be uncounted.
That errs low by what the provider did count, which costs no throughput
while callers wait (the bucket never fills), and each new response corrects
it. The reading of the newest send sets the level either way; an older
send's, answered late, may only lower it. Claims that never went out are
refunded. The caller's own buckets (from the policy) are settled against
what the attempt really used: the usage it reports, or nothing when the
upstream refused it before work. An attempt sent while no bucket is known
shares the one ``BLIND`` claim and counts in flight as a number.

Scopes: providers meter per model (OpenAI, Anthropic) or per deployment
(Azure) on one key, so a learnt bucket belongs to the scope of the request
whose answer taught it (``Cost.scope``) and paces only that scope's claims;
the caller's own budgets (``QuotaPolicy``) are the upstream's and pace
every scope. A scope no answer has described yet is paced by nothing learnt
(its first answers teach it), or, with ``borrow``, by copies of the shapes
of the scope read last.

Waiting: one lane per scope (one per upstream when it has budgets of the
caller's own, which every claim spends), by priority and then arrival
(``_quota_lanes``); only the head sleeps, until its cost fits (the time each
bucket needs to refill the difference), re-reading the buckets when it wakes,
as the rate cap does. A cost larger than a caller's budget's whole limit can
never fit: ``too_large`` says so before any wait. A learnt limit never refuses:
a cost past it waits for the whole bucket (``Bucket.spends``) and the provider,
not a guess, says whether it is too large.

What stays on a scope: a provider's 429 for a scope's quota holds that
scope's claims alone (``lanes.hold``; ``_quota_lanes`` says how they go),
and a fleet's refusal holds back only the claims that spend from the buckets
that refused (``refused``): a model whose own buckets have room never waits
for another's. The caller's own budgets are every scope's, so a refusal of
one of them holds every claim.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable, Iterable, Sequence

from yieldgate.gate._claim import BLIND, Claim
from yieldgate.gate._cost import (
    DEFAULT_WINDOW_S,
    LONGEST_WINDOW_S,
    MAX_WINDOW_S,
    MIN_LIMIT,
    NOTHING,
    ONE_REQUEST,
    SCOPE_MARK,
    Bucket,
    Cost,
    QuotaReading,
    as_cost,
    reading_rate,
    scope_of,
    scoped_key,
)
from yieldgate.gate._quota_lanes import Lanes

__all__ = [
    "BLIND",
    "NOTHING",
    "ONE_REQUEST",
    "Bucket",
    "Claim",
    "Cost",
    "Quota",
    "QuotaReading",
    "as_cost",
]

_MIN_SLEEP_S = 1e-6
# The buckets learnt per upstream at most, all scopes together (a provider that
# names a new policy in every answer, or a caller naming a new model in every
# request, must not grow them without bound): to make room, those idle for their
# window (full again: nothing lost but their shape) go, else the least recently read.
MAX_LEARNT_BUCKETS = 64


class Quota:
    """An upstream's buckets, the claims it has in flight, and its queue (see the
    module docstring)."""

    def __init__(
        self,
        *,
        requests_per_minute: float | None = None,
        tokens_per_minute: float | None = None,
        learn: bool = True,
        borrow: bool = False,
        jitter: float = 0.5,
        rng: random.Random | None = None,
    ) -> None:
        self.learn = learn
        self.borrow = borrow
        self.buckets: dict[str, Bucket] = {}
        # Full since forever: built before any clock may be read (outside a loop).
        now = -math.inf
        for resource, per_minute in (
            ("requests", requests_per_minute),
            ("tokens", tokens_per_minute),
        ):
            if per_minute is not None:
                self.buckets[f"policy:{resource}"] = Bucket(
                    f"policy:{resource}",
                    resource,
                    per_minute,
                    per_minute / DEFAULT_WINDOW_S,
                    now,
                    learnt=False,
                )
        self._numbers = itertools.count(1)
        self._inflight: dict[Claim, None] = {}  # sent, not answered yet, in sending order
        self._pending: set[Claim] = set()  # taken, not sent yet
        self._blind: dict[Cost, int] = {}  # blind claims in flight, counted by cost
        self.blind_requests = 0  # those of them that cost ONE_REQUEST (most): a count
        # The queues, by lane: a claim's scope, or one for all when the caller's own
        # budgets (which every claim spends) are buckets too; and the scopes held
        # (``lanes.hold``: a provider's 429 for one scope's quota).
        self.lanes = Lanes(one=bool(self.buckets), jitter=jitter, rng=rng)
        # In a fleet: the fleet's buckets pace (``shared``) and, after a refusal, no
        # claim that spends from a bucket that refused asks again before its time
        # (``_polls``: bucket -> when); learnt buckets hold ``cap`` of
        # what the provider says (1 / members: a member's fair share of a full
        # bucket) and refill at ``pace`` of its rate. While Redis is away the
        # caller's own budgets, the fleet's as a whole, are paced here at the
        # same share (while it answers they are the fleet's, not taken here).
        self.shared = False
        self._polls: dict[str, float] = {}
        self.cap = 1.0
        self.pace = 1.0

    @property
    def active(self) -> bool:
        """Whether any bucket is known or any scope held: else every claim passes at once."""
        return bool(self.buckets) or self.lanes.holding

    @property
    def learnt(self) -> bool:
        """Whether a bucket was learnt (from a response's headers, or a fleet's shapes)."""
        return any(b.learnt for b in self.buckets.values())

    def knows(self, scope: str) -> bool:
        """Whether any bucket paces ``scope``'s claims."""
        return any(b.scope is None or b.scope == scope for b in self.buckets.values())

    def learnt_for(self, scope: str) -> bool:
        """Whether a bucket of ``scope``'s was learnt."""
        return any(b.learnt and b.scope == scope for b in self.buckets.values())

    # -- claiming ----------------------------------------------------------------

    def _of(self, scope: str) -> list[Bucket]:
        """The buckets a claim of ``scope`` spends from: its scope's and the caller's own."""
        return [b for b in self.buckets.values() if b.scope is None or b.scope == scope]

    def too_large(self, cost: Cost) -> Bucket | None:
        """The caller's own bucket whose whole limit ``cost`` exceeds (no wait makes it
        fit). A learnt bucket never refuses: its limit is the provider's word as read,
        or a guess, and a cost past it waits for the whole bucket (``Bucket.spends``)."""
        for bucket in self._of(cost.scope):
            if not bucket.learnt and cost.amount(bucket.resource) > bucket.limit:
                return bucket
        return None

    def _shares(self) -> tuple[float, float]:
        """This member's share of every bucket it paces here: of a full one, of its refill."""
        return (self.cap, self.pace)

    def _local(self, scope: str, claim_shared: bool) -> list[Bucket]:
        """The buckets a claim of ``scope`` takes from here: all of its scope's, or (in
        a fleet, whose buckets hold the caller's own budgets) the learnt ones, for
        this member's share."""
        if not claim_shared:
            return self._of(scope)
        return [b for b in self.buckets.values() if b.learnt and b.scope == scope]

    def _longest(self, cost: Cost, now: float) -> tuple[float, Bucket | None]:
        """The longest refill ``cost`` needs of the buckets a claim takes from (or, in a
        fleet, the longest wait the fleet's refusal of one of them set), and that
        bucket (``0.0, None``: it fits every one now)."""
        wait, binding = 0.0, None
        for b in self._local(cost.scope, self.shared):
            need = b.wait_s(cost.amount(b.resource), now, *self._shares())
            if need > wait:
                wait, binding = need, b
        if self.shared and self._polls:
            for b in self._of(cost.scope):
                need = self._polls.get(b.key, now) - now
                if need > wait and cost.amount(b.resource) > 0:
                    wait, binding = need, b
        return wait, binding

    def _fits(self, cost: Cost, now: float) -> float:
        """0 if ``cost`` fits every bucket now, else the longest refill it needs."""
        return self._longest(cost, now)[0]

    def refused(self, waits: Sequence[tuple[str, float]], now: float) -> None:
        """The fleet refused a take: no claim spending from those buckets asks it again
        for the refill each needs (``(bucket, seconds)``); others go on."""
        polls = self._polls
        for key in [key for key, until in polls.items() if until <= now]:
            del polls[key]
        for key, wait_s in waits:
            # A bucket full again within its window: no refusal stalls a Gate past it.
            until = now + min(wait_s, MAX_WINDOW_S)
            if until > polls.get(key, now):
                polls[key] = until

    def wants(self, cost: Cost) -> list[tuple[str, float, float, float]]:
        """``(bucket, amount, limit, rate)`` for each bucket ``cost`` spends from."""
        return [
            (b.key, float(cost.amount(b.resource)), b.limit, b.rate)
            for b in self._of(cost.scope)
            if cost.amount(b.resource) > 0
        ]

    def _take(self, claim: Claim, now: float) -> None:
        for bucket in self._local(claim.scope, self.shared):
            bucket.take(claim.cost.amount(bucket.resource), now, *self._shares())
        claim.local = True
        claim.fleet = self.shared
        claim.started = now
        claim.taken = True
        if self.learn:
            self._pending.add(claim)

    def sent(self, claim: Claim, now: float) -> None:
        """``claim``'s attempt is being sent: the provider will count it from now, in
        this order (readings are matched to sends, not to claims)."""
        claim.started = now
        if not self.learn or not claim.taken:
            return
        self._pending.discard(claim)
        claim.number = next(self._numbers)
        self._inflight[claim] = None

    def blind(self, cost: Cost, sign: int) -> None:
        """A ``BLIND`` claim of ``cost`` sent (``sign`` 1) or over (-1)."""
        blind = self._blind
        count = blind.get(cost, 0) + sign
        if count:
            blind[cost] = count
        else:
            del blind[cost]

    def try_take(self, claim: Claim, now: float) -> bool:
        """Take ``claim`` now if no hold keeps it back, nobody who may go is queued in
        its lane, and it fits; never waits."""
        if self.lanes.blocks(claim, now):
            return False
        if self.buckets and self._fits(claim.cost, now) > 0:
            return False
        self._take(claim, now)
        return True

    def join(self, claim: Claim, wake: Callable[[], None]) -> None:
        """Queue ``claim``, by priority then arrival; a new head is woken."""
        self.lanes.join(claim, wake)

    def at_head(self, claim: Claim, now: float) -> bool:
        """Whether ``claim`` looks for itself (``take_queued``), or waits to be woken."""
        return self.lanes.at_head(claim, now)

    def take_queued(self, claim: Claim, now: float) -> float | None:
        """For a claim at its head: take it (``None``) or say when to look again."""
        held = self.lanes.held_wait(claim, now)
        if held is not None:
            return max(held, now + _MIN_SLEEP_S)
        wait = self._fits(claim.cost, now) if self.buckets else 0.0
        if wait <= 0:
            self._take(claim, now)
            self.leave(claim, now)
            return None
        return now + max(wait, _MIN_SLEEP_S)

    def leave(self, claim: Claim, now: float) -> None:
        """Leave the queue (taken, or gave up); the next at the head is woken."""
        self.lanes.leave(claim, now)

    def beyond(self, claim: Claim, now: float, again: float) -> str:
        """Why a queued claim cannot be taken before ``again``, past its deadline."""
        if self.lanes.held_back(claim, now):
            what = f"the quota of {claim.scope!r}, held by its provider's hint"
        else:
            bucket = self.binding(claim.cost, now)
            what = "the fleet's quota" if bucket is None else f"quota bucket {bucket.key!r}"
        return f"waiting for {what} (room only in {again - now:.3g} s, past the deadline)"

    def refund(self, claim: Claim, now: float) -> None:
        """Give back a claim that never went out."""
        if not claim.taken:
            return
        claim.taken = False
        # Every bucket counts it: taken from it, or (one learnt since) among the
        # claims a reading's level was set without.
        if claim.local:
            claim.local = False
            for bucket in self._local(claim.scope, claim.fleet):
                bucket.give(claim.cost.amount(bucket.resource), now, *self._shares())
        self._pending.discard(claim)
        self.lanes.wake(claim.scope, now)

    # -- learning ------------------------------------------------------------------

    def settle_own(self, claim: Claim, used: Cost, now: float) -> None:
        """Settle the caller's own buckets against what the attempt really used."""
        changed = False
        if not claim.local or claim.fleet or claim is BLIND:  # the fleet holds its own budgets
            return
        for bucket in self.buckets.values():
            if bucket.learnt:
                continue
            over = claim.cost.amount(bucket.resource) - used.amount(bucket.resource)
            if over > 0:
                bucket.give(over, now, *self._shares())
                changed = True
            elif over < 0:
                bucket.take(-over, now, *self._shares())
        if changed:
            self.lanes.wake(claim.scope, now)

    def observe(
        self,
        readings: Iterable[QuotaReading],
        claim: Claim | None,
        now: float,
        *,
        blind: Cost | None = None,
    ) -> None:
        """Apply a response's readings: the response of ``claim``'s attempt (or of a
        blind attempt of cost ``blind``, still counted in flight: this reading counts it)."""
        if claim is not None:
            self._inflight.pop(claim, None)  # answered: counted, and in this reading
        if not self.learn:
            return
        number = claim.number if claim is not None else 0
        scope = claim.scope if claim is not None and claim is not BLIND else ""
        if blind is not None:
            scope = blind.scope
        mine = claim.cost if claim is not None and claim is not BLIND else NOTHING
        answered = blind if blind is not None else mine  # the answered attempt's cost
        borrowed = False
        for reading in readings:
            key = scoped_key(reading.key, scope)
            bucket = self.buckets.get(key)
            # What the provider may not have counted yet: every claim of the scope
            # still in flight (requests overtake each other on the way), and those
            # not sent; not the answered attempt's own, if it went blind.
            resource = reading.resource
            sent = self._unseen(resource, scope) - (0 if blind is None else blind.amount(resource))
            unseen = sent + sum(
                c.cost.amount(resource) for c in self._pending if c.cost.scope == scope
            )
            limit = reading.limit
            if limit is None:
                # What remains, alone (Azure): the limit is the most ever seen
                # remaining (plus what was in flight at the first reading), the refill
                # that limit over a minute; every answer sets the level again.
                # (In flight counts once, at the first reading: later, much of what
                # is in flight was counted already, and adding it again would feed
                # itself: a higher limit, more in flight, a higher limit.) The
                # answered attempt's own cost was counted before what remains: the
                # limit is at least both (without it, a request costing most of the
                # quota would never fit the limit guessed from its own answer).
                own = answered.amount(resource)
                known = bucket.limit if bucket is not None else 0.0
                limit = max(known, reading.remaining + own + (sent if bucket is None else 0.0))
            if not (MIN_LIMIT <= limit < math.inf):
                continue  # no bucket a request could ever fit
            rate = reading_rate(reading, limit, bucket)
            if bucket is None:
                bucket = Bucket(key, resource, limit, rate, now, learnt=True, scope=scope)
                self._forget_stalest(now)
                self.buckets[key] = bucket
                fresh = True
            else:
                borrowed = borrowed or bucket.applied < 0
                bucket.limit = limit
                bucket.rate = rate
                fresh = False
            # As of now: the provider counted it somewhere between the send and now,
            # and refill credited for that time could be refill it has not yet had.
            level = reading.remaining * self.cap - unseen
            if fresh or number > bucket.applied:
                bucket.level = level  # the newest send's reading: up or down
                bucket.applied = number
            else:
                # An older send's reading, answered late: it may only lower the level.
                bucket.level = min(bucket.level_at(now, self.cap, self.pace), level)
            bucket.updated = now
        if borrowed:
            # The scope's own answer came: shapes borrowed and not read here go.
            for b in [b for b in self.buckets.values() if b.scope == scope and b.applied < 0]:
                del self.buckets[b.key]
        self.lanes.wake(scope, now)

    def _unseen(self, resource: str, scope: str) -> float:
        """What the claims of ``scope`` sent and not answered yet spend of ``resource``."""
        total = sum(c.cost.amount(resource) for c in self._inflight if c.cost.scope == scope)
        total += sum(
            cost.amount(resource) * n for cost, n in self._blind.items() if cost.scope == scope
        )
        if not scope:
            total += ONE_REQUEST.amount(resource) * self.blind_requests
        return total

    def _forget_stalest(self, now: float) -> None:
        """Make room for one more learnt bucket: drop those idle for their window (full
        again by now), or else the one read longest ago."""
        learnt = [b for b in self.buckets.values() if b.learnt]
        if len(learnt) < MAX_LEARNT_BUCKETS:
            return
        idle = [b for b in learnt if now - b.updated >= b.limit / max(b.rate, 1e-12)]
        for b in idle or [min(learnt, key=lambda b: b.updated)]:
            del self.buckets[b.key]

    def borrow_for(self, scope: str, now: float) -> bool:
        """With ``borrow``: know ``scope``'s buckets before its first answer, as copies
        of the shapes of the scope read last (full, as a new bucket is); ``False``
        when there is nothing to borrow or the scope knows its own."""
        if not (self.borrow and self.learn) or self.learnt_for(scope):
            return False
        learnt = [b for b in self.buckets.values() if b.learnt and b.applied >= 0]
        if not learnt:
            return False
        latest = max(learnt, key=lambda b: b.updated).scope
        for b in learnt:
            key = scoped_key(b.key.partition(SCOPE_MARK)[0], scope)
            if b.scope == latest and self.seed(key, b.resource, b.limit, b.rate, now):
                self.buckets[key].applied = -1  # borrowed: the scope's first reading replaces it
        return True

    def binding(self, cost: Cost, now: float) -> Bucket | None:
        """The bucket ``cost`` waits longest for (``None``: it fits every one now)."""
        return self._longest(cost, now)[1]

    def seed(self, key: str, resource: str, limit: float, rate: float, now: float) -> bool:
        """Know a bucket before any answer, from its shape as a fleet last observed it:
        a learnt bucket holding this member's share of its limit. ``False`` if it is
        already known (or learning is off): an answer's reading is worth more."""
        if not self.learn or key in self.buckets or not (MIN_LIMIT <= limit < math.inf):
            return False
        if not (0 <= rate < math.inf):
            return False
        rate = max(rate, limit / LONGEST_WINDOW_S)
        scope = scope_of(key)
        bucket = Bucket(key, resource, limit, rate, now, learnt=True, scope=scope)
        self._forget_stalest(now)
        bucket.level = limit * self.cap
        self.buckets[key] = bucket
        self.lanes.wake(scope, now)
        return True

    def finished(self, claim: Claim) -> None:
        """``claim``'s attempt is over, answered or not: no longer in flight."""
        self._inflight.pop(claim, None)

    def forked(self) -> None:
        """In a forked child: no claim of the parent's is queued, pending or in flight."""
        self._inflight.clear()
        self._pending.clear()
        self._blind.clear()
        self.blind_requests = 0
        self.lanes.clear()

    def audit(self) -> list[str]:
        """Claims queued, taken or in flight (none when no call runs: then nothing is
        unseen, since a reading counts unseen only what is taken or in flight)."""
        problems = []
        queued = self.lanes.queued()
        if queued:
            problems.append(f"{queued} claim(s) queued for the quota")
        if self._pending:
            problems.append(f"{len(self._pending)} quota claim(s) taken and never sent")
        if self._inflight:
            problems.append(f"{len(self._inflight)} quota claim(s) in flight")
        if self._blind or self.blind_requests:
            count = self.blind_requests + sum(self._blind.values())
            problems.append(f"{count} blind attempt(s) counted in flight")
        return problems
