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

Waiting: one queue per upstream, by priority and then arrival; only the
head sleeps, until its cost fits (the time each bucket needs to refill the
difference), re-reading the buckets when it wakes, as the rate cap does.
A cost larger than a bucket's whole limit can never fit: ``too_large``
says so before any wait.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Callable, Iterable

from yieldgate.gate._cost import NOTHING, ONE_REQUEST, Bucket, Cost, QuotaReading, as_cost
from yieldgate.gate._window import RANK
from yieldgate.protocol import Priority

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

# The window a bucket is assumed to refill over when nothing says otherwise.
DEFAULT_WINDOW_S = 60.0
# A reading whose used share is below this says too little about the refill rate.
_MIN_USED_SHARE = 0.02
_MIN_SLEEP_S = 1e-6
# What a reading may say, whatever a header claims: a bucket is full again within
# its window (a minute unless a header names one, at most an hour), so no reading
# can stall a Gate past it; its limit is one request or token at least.
MAX_WINDOW_S = 3600.0
MIN_LIMIT = 1.0
# The buckets learnt per upstream at most (a provider that names a new policy in
# every answer must not grow them without bound): the least recently read goes.
MAX_LEARNT_BUCKETS = 16


class Claim:
    """One attempt's cost, taken (or to be taken) from an upstream's quota.

    Built for every attempt: only its cost, priority and arrival are set here;
    the rest stays at the class's defaults until used (most never are).
    """

    number = 0  # its place among the sends, once sent
    started = 0.0  # when it was taken, then sent
    taken = False
    local = False  # taken from this process's buckets
    fleet = False  # taken while a fleet's buckets paced
    wake: Callable[[], None] | None = None
    # In a fleet: the send number the fleet's take gave it (0: none), what it took
    # there, and whether its answer was reported.
    seq = 0
    wants: list[tuple[str, float, float, float]] = []  # noqa: RUF012 - replaced, never mutated
    observed = False

    def __init__(self, cost: Cost, priority: Priority, key: float) -> None:
        self.cost = cost
        self.priority = priority
        self.key = key  # arrival: the call's start


BLIND = Claim(ONE_REQUEST, Priority.NORMAL, 0.0)
"""The claim of every attempt sent while its quota knows no bucket (the common case
of a Gate with nothing to pace by): nothing to take, and in flight it is only a
sum (``Quota.blind``), not an entry. Never changed."""


class Quota:
    """An upstream's buckets, the claims it has in flight, and its queue (see the
    module docstring)."""

    def __init__(
        self,
        *,
        requests_per_minute: float | None = None,
        tokens_per_minute: float | None = None,
        learn: bool = True,
    ) -> None:
        self.learn = learn
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
        self._queue: list[tuple[int, float, int, Claim]] = []
        self._arrivals = itertools.count()
        # In a fleet: the fleet's buckets pace (``shared``) and, after a refusal, no
        # claim asks them again before ``poll_after``; learnt buckets hold ``cap`` of
        # what the provider says (1 / members: a member's fair share of a full
        # bucket) and refill at ``pace`` of its rate (all of it while the fleet's
        # buckets pace too; 1 / members when alone).
        self.shared = False
        self.poll_after = -math.inf
        self.cap = 1.0
        self.pace = 1.0

    @property
    def active(self) -> bool:
        """Whether any bucket is known: else every claim passes at once."""
        return bool(self.buckets)

    @property
    def learnt(self) -> bool:
        """Whether a bucket was learnt (from a response's headers, or a fleet's shapes)."""
        return any(b.learnt for b in self.buckets.values())

    # -- claiming ----------------------------------------------------------------

    def too_large(self, cost: Cost) -> Bucket | None:
        """The bucket whose whole limit ``cost`` exceeds (no wait makes it fit)."""
        for bucket in self.buckets.values():
            if cost.amount(bucket.resource) > bucket.limit:
                return bucket
        return None

    def _shares(self, bucket: Bucket) -> tuple[float, float]:
        return (self.cap, self.pace) if bucket.learnt else (1.0, 1.0)

    def _local(self, claim_shared: bool) -> list[Bucket]:
        """The buckets a claim takes from here: all, or (in a fleet, whose buckets hold
        the caller's own budgets) the learnt ones, for this member's share."""
        if not claim_shared:
            return list(self.buckets.values())
        return [b for b in self.buckets.values() if b.learnt]

    def _longest(self, cost: Cost, now: float) -> tuple[float, Bucket | None]:
        """The longest refill ``cost`` needs of the buckets a claim takes from, and
        that bucket (``0.0, None``: it fits every one now)."""
        wait, binding = 0.0, None
        for b in self._local(self.shared):
            need = b.wait_s(cost.amount(b.resource), now, *self._shares(b))
            if need > wait:
                wait, binding = need, b
        return wait, binding

    def _fits(self, cost: Cost, now: float) -> float:
        """0 if ``cost`` fits every bucket now, else the longest refill it needs."""
        wait = self._longest(cost, now)[0]
        if self.shared:
            wait = max(wait, self.poll_after - now)
        return wait

    def wants(self, cost: Cost) -> list[tuple[str, float, float, float]]:
        """``(bucket, amount, limit, rate)`` for each bucket ``cost`` spends from."""
        return [
            (key, float(cost.amount(b.resource)), b.limit, b.rate)
            for key, b in self.buckets.items()
            if cost.amount(b.resource) > 0
        ]

    def _take(self, claim: Claim, now: float) -> None:
        for bucket in self._local(self.shared):
            bucket.take(claim.cost.amount(bucket.resource), now, *self._shares(bucket))
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
        """Take ``claim`` now if nobody is queued and it fits; never waits."""
        if self._queue:
            return False
        if self.buckets and self._fits(claim.cost, now) > 0:
            return False
        self._take(claim, now)
        return True

    def join(self, claim: Claim, wake: Callable[[], None]) -> None:
        """Queue ``claim``, by priority then arrival; a new head is woken."""
        claim.wake = wake
        entry = (-RANK[claim.priority], claim.key, next(self._arrivals), claim)
        bisect.insort(self._queue, entry)
        if self._queue[0][3] is claim and len(self._queue) > 1:
            # The old head sleeps towards its own start: it must stand back.
            old = self._queue[1][3].wake
            if old is not None:
                old()

    def at_head(self, claim: Claim) -> bool:
        return bool(self._queue) and self._queue[0][3] is claim

    def take_queued(self, claim: Claim, now: float) -> float | None:
        """For the claim at the head: take it (``None``) or say when to look again."""
        wait = self._fits(claim.cost, now) if self.buckets else 0.0
        if wait <= 0:
            self._take(claim, now)
            self.leave(claim)
            return None
        return now + max(wait, _MIN_SLEEP_S)

    def leave(self, claim: Claim) -> None:
        """Leave the queue (taken, or gave up); the next at the head is woken."""
        for i, entry in enumerate(self._queue):
            if entry[3] is claim:
                del self._queue[i]
                if i == 0 and self._queue:
                    self._wake_head()
                return

    def _wake_head(self) -> None:
        if self._queue:
            wake = self._queue[0][3].wake
            if wake is not None:
                wake()

    def refund(self, claim: Claim, now: float) -> None:
        """Give back a claim that never went out."""
        if not claim.taken:
            return
        claim.taken = False
        # Every bucket counts it: taken from it, or (one learnt since) among the
        # claims a reading's level was set without.
        if claim.local:
            claim.local = False
            for bucket in self._local(claim.fleet):
                bucket.give(claim.cost.amount(bucket.resource), now, *self._shares(bucket))
        self._pending.discard(claim)
        self._wake_head()

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
                bucket.give(over, now)
                changed = True
            elif over < 0:
                bucket.take(-over, now)
        if changed:
            self._wake_head()

    def observe(self, readings: Iterable[QuotaReading], claim: Claim | None, now: float) -> None:
        """Apply a response's readings: the response of ``claim``'s attempt."""
        if claim is not None:
            self._inflight.pop(claim, None)  # answered: counted, and in this reading
        if not self.learn:
            return
        number = claim.number if claim is not None else 0
        for reading in readings:
            if not (MIN_LIMIT <= reading.limit < math.inf):
                continue  # no bucket a request could ever fit
            bucket = self.buckets.get(reading.key)
            rate = _rate(reading, bucket)
            if bucket is None:
                key, resource = reading.key, reading.resource
                bucket = Bucket(key, resource, reading.limit, rate, now, learnt=True)
                self._forget_stalest(now)
                self.buckets[reading.key] = bucket
                fresh = True
            else:
                bucket.limit = reading.limit
                bucket.rate = rate
                fresh = False
            # What the provider may not have counted yet: every claim still in
            # flight (requests overtake each other on the way), and those not sent.
            resource = bucket.resource
            unseen = (
                sum(c.cost.amount(resource) for c in self._inflight)
                + sum(c.cost.amount(resource) for c in self._pending)
                + sum(cost.amount(resource) * n for cost, n in self._blind.items())
                + ONE_REQUEST.amount(resource) * self.blind_requests
            )
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
        self._wake_head()

    def _forget_stalest(self, now: float) -> None:
        """Make room for one more learnt bucket: drop the one read longest ago."""
        learnt = [b for b in self.buckets.values() if b.learnt]
        if len(learnt) >= MAX_LEARNT_BUCKETS:
            stalest = min(learnt, key=lambda b: b.updated)
            del self.buckets[stalest.key]

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
        rate = max(rate, limit / MAX_WINDOW_S)
        bucket = Bucket(key, resource, limit, rate, now, learnt=True)
        self._forget_stalest(now)
        bucket.level = limit * self.cap
        self.buckets[key] = bucket
        self._wake_head()
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
        self._queue.clear()

    def audit(self) -> list[str]:
        """Claims queued, taken or in flight (none when no call runs)."""
        problems = []
        if self._queue:
            problems.append(f"{len(self._queue)} claim(s) queued for the quota")
        if self._pending:
            problems.append(f"{len(self._pending)} quota claim(s) taken and never sent")
        if self._inflight:
            problems.append(f"{len(self._inflight)} quota claim(s) in flight")
        if self._blind or self.blind_requests:
            count = self.blind_requests + sum(self._blind.values())
            problems.append(f"{count} blind attempt(s) counted in flight")
        return problems


def _rate(reading: QuotaReading, bucket: Bucket | None) -> float:
    """The refill rate a reading implies: its window's, the used share over the
    time to full, or what the bucket had (a minute's limit, first)."""
    if reading.window_s is not None and reading.window_s > 0:
        return reading.limit / min(reading.window_s, MAX_WINDOW_S)
    used = reading.limit - reading.remaining
    if (
        reading.reset_s is not None
        and reading.reset_s > 0
        and used >= _MIN_USED_SHARE * reading.limit
    ):
        # Per-minute limits (OpenAI's, Anthropic's) are full again within a minute: a
        # later reset is a daily limit's (its 429's hint says so) or a bad header's.
        rate = used / min(reading.reset_s, DEFAULT_WINDOW_S)
        if math.isfinite(rate) and rate > 0:
            return rate
    if bucket is not None and bucket.limit == reading.limit:
        return bucket.rate
    return reading.limit / DEFAULT_WINDOW_S
