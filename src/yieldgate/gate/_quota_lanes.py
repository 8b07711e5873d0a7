"""The claims waiting for an upstream's quota (its lanes), and the holds a quota's 429
puts on one scope.

**Lanes.** Claims wait in one lane per scope (one per upstream when the
caller has budgets of its own, which every claim spends), by priority and
then arrival. Only the head sleeps (towards the time its cost fits, as
``Quota.take_queued`` says); the others wait to be woken, so a thousand
waiting claims cost one timer.

**Scope holds.** A provider that refuses a request for its quota (a 429,
reason ``rate_limited``) says so of the quota that request spends: one
model's, one deployment's. Its hint holds that scope's claims only, at the
request's priority and below, as a window's hold holds its waiters: none
goes before the hint has passed; then the held claims go one by one in their
order, spread over the hint's jitter (as their own jittered waits would have
been, but sorted), so the provider sees no wave when the hold ends; a claim
whose deadline comes first (``Claim.not_after``, never before the hint) goes
then. A held claim waits in its lane, but stands aside: the claims of other
scopes sharing the lane pass it, and only the first held claim of the scope
keeps a timer, for the next release. A claim released (``Claim.passed``)
then waits for room in its buckets like any other; a later hint holds it again.

What a window's hold does and a scope's does not: completion clocking. A
success during a window's hold frees a slot upstream, so it admits a held
caller at once; a provider charges its quota at the door, so an answer frees
none of it (its headers set the buckets, which pace the released claims).
"""

from __future__ import annotations

import bisect
import itertools
import random
from collections.abc import Callable

from yieldgate.gate._claim import Claim
from yieldgate.gate._window import RANK
from yieldgate.protocol import Priority

__all__ = ["Lanes"]

# The scopes held at once, at most (a provider that names a new model in every
# answer must not grow them without bound): those over go first, else the one
# that ends soonest.
MAX_SCOPE_HOLDS = 256
# A hold is moved later only by more than this: members read one another's holds
# every 25 ms, on clocks that differ by a round trip, and reading the same hold
# again must not restart its release (nor hold again the claims it released).
EXTEND_S = 0.05

_Entry = tuple[int, float, int, Claim]


class _Hold:
    """One scope's hold, per rank: it ends at ``ends`` (the hint with its jitter);
    ``hints`` is when the provider said to come back; between the two, held
    claims go one by one, the next at ``release_at``."""

    __slots__ = ("ends", "hints", "release_at")

    def __init__(self) -> None:
        self.ends = [0.0, 0.0, 0.0]
        self.hints = [0.0, 0.0, 0.0]
        self.release_at: list[float | None] = [None, None, None]


class Lanes:
    """An upstream's lanes of waiting claims and its scope holds (see the module docstring)."""

    def __init__(self, *, one: bool, jitter: float, rng: random.Random | None) -> None:
        self.one = one  # one lane for every scope: the caller's own budgets pace them all
        self._queues: dict[str, list[_Entry]] = {}
        self._arrivals = itertools.count()
        self._holds: dict[str, _Hold] = {}
        self.jitter = jitter  # a hint ``h`` holds its scope from ``h`` to ``h * (1 + jitter)``
        self._rng = rng or random.Random()  # noqa: S311 - jitter, not secrets

    def _lane(self, scope: str) -> list[_Entry] | None:
        return self._queues.get("" if self.one else scope)

    def queued(self) -> int:
        return sum(len(q) for q in self._queues.values())

    def clear(self) -> None:
        """Forget every waiting claim (a forked child's copy: none of them is its)."""
        self._queues.clear()

    # -- holds ---------------------------------------------------------------------

    @property
    def holding(self) -> bool:
        """Whether any scope may be held (until a look finds its hold over)."""
        return bool(self._holds)

    def hold(self, scope: str, priority: Priority, hint_s: float, now: float) -> float:
        """A provider's quota refused a request of ``scope`` and said to come back in
        ``hint_s``: hold ``scope``'s claims at ``priority`` and below, none before the
        hint, the held ones one by one from then, all of them by the hint with its
        jitter (returned: when the hold ends)."""
        hold = self._holds.get(scope)
        if hold is None:
            self._make_room(now)
            hold = self._holds[scope] = _Hold()
        until, hint_until = now + hint_s * (1.0 + self.jitter), now + hint_s
        moved = False
        for rank in range(RANK[priority] + 1):
            slack = EXTEND_S if hold.ends[rank] > now else 0.0  # in force: read again?
            if until > hold.ends[rank] + slack:
                hold.ends[rank] = until
                hold.release_at[rank] = None  # the release starts over at the hint's end
                moved = True
            if hint_until > hold.hints[rank] + slack:
                hold.hints[rank] = hint_until
                hold.release_at[rank] = None
                moved = True
        queue = self._lane(scope)
        if queue and moved:
            # The first held claim takes the hold's timer (it may sleep towards a
            # take that the hold now puts off, or with no timer at all), and the
            # first free one, if that changed, its turn.
            self._wake(self._hold_head(queue, scope, now))
            self._wake(self._first_free(queue, now))
        return max(until, hold.ends[RANK[priority]])

    def _make_room(self, now: float) -> None:
        if len(self._holds) < MAX_SCOPE_HOLDS:
            return
        over = [s for s, h in self._holds.items() if max(h.ends) <= now]
        for scope in over or [min(self._holds, key=lambda s: max(self._holds[s].ends))]:
            del self._holds[scope]

    def hint_until(self, scope: str, priority: Priority, now: float) -> float:
        """When the provider asked ``scope``'s claims at ``priority`` to come back (now,
        once that has passed while the hold still releases them), or 0.0 if no hold
        of it is in force: the earliest a held claim may go."""
        hold = self._holds.get(scope)
        if hold is None:
            return 0.0
        rank = RANK[priority]
        return max(hold.hints[rank], now) if hold.ends[rank] > now else 0.0

    def held_back(self, claim: Claim | None, now: float) -> bool:
        """Whether a hold of ``claim``'s scope keeps it back now: one in force at its
        priority, whose hint is later than the claim's release from an earlier one."""
        if claim is None or not self._holds:
            return False
        hold = self._holds.get(claim.scope)
        if hold is None:
            return False
        rank = RANK[claim.priority]
        return hold.ends[rank] > now and claim.passed < hold.hints[rank]

    def _release(self, claim: Claim, now: float) -> None:
        hold = self._holds[claim.scope]
        claim.passed = max(now, hold.hints[RANK[claim.priority]])

    def _due(self, hold: _Hold, rank: int, now: float, held: int) -> float:
        """When the next held claim of ``rank`` goes, once the hint has passed: the
        claims held at the hint's end are spread over what is left of the hold, each
        gap a random share of the time left among those still held."""
        start = hold.hints[rank]
        if now < start:
            return start
        due = hold.release_at[rank]
        if due is None:
            due = hold.release_at[rank] = start + self._gap(hold.ends[rank] - start, held)
        return due

    def _gap(self, left: float, held: int) -> float:
        return left * self._rng.uniform(0, 2) / (held + 1)

    def _held_of(self, queue: list[_Entry], scope: str, now: float) -> list[Claim]:
        return [e[3] for e in queue if e[3].scope == scope and self.held_back(e[3], now)]

    def _hold_head(self, queue: list[_Entry], scope: str, now: float) -> Claim | None:
        for entry in queue:
            claim = entry[3]
            if claim.scope == scope and self.held_back(claim, now):
                return claim
        return None

    def held_wait(self, claim: Claim, now: float) -> float | None:
        """For a held claim that keeps a timer: when it looks again (its release, or its
        ``not_after``); ``None`` if ``claim`` is not held back."""
        if not self.held_back(claim, now):
            return None
        hold = self._holds[claim.scope]
        rank = RANK[claim.priority]
        times = [hold.ends[rank]]
        queue = self._lane(claim.scope)
        if queue and self._hold_head(queue, claim.scope, now) is claim:
            times.append(self._due(hold, rank, now, len(self._held_of(queue, claim.scope, now))))
        if claim.not_after is not None:
            times.append(claim.not_after)
        return min(times)

    # -- the queue ---------------------------------------------------------------------

    def _first_free(self, queue: list[_Entry], now: float) -> Claim | None:
        """The first claim of ``queue`` no hold keeps back: the one that takes next."""
        if not self._holds:
            return queue[0][3]
        for entry in queue:
            if not self.held_back(entry[3], now):
                return entry[3]
        return None

    def blocks(self, claim: Claim, now: float) -> bool:
        """Whether ``claim`` may not take now whatever the buckets say: it is held, or
        a claim that may go waits in its lane (it would jump the queue)."""
        queue = self._lane(claim.scope)
        if not self._holds:
            return bool(queue)
        for scope in [s for s, h in self._holds.items() if max(h.ends) <= now]:
            del self._holds[scope]  # over: no look at it again
        if self.held_back(claim, now):
            return True
        return queue is not None and self._first_free(queue, now) is not None

    def join(self, claim: Claim, wake: Callable[[], None]) -> None:
        """Queue ``claim``, by priority then arrival; a new head is woken."""
        claim.wake = wake
        entry = (-RANK[claim.priority], claim.key, next(self._arrivals), claim)
        queue = self._queues.setdefault("" if self.one else claim.scope, [])
        bisect.insort(queue, entry)
        if queue[0][3] is claim and len(queue) > 1:
            # The old head sleeps towards its own start: it must stand back.
            self._wake(queue[1][3])

    def at_head(self, claim: Claim, now: float) -> bool:
        """Whether ``claim`` keeps a timer now (``Quota.take_queued`` says until when):
        the first free claim of its lane, or, held, the first held claim of its scope
        or one with a ``not_after`` of its own. A held claim whose turn has come (the
        release schedule's, or its ``not_after``) is released first."""
        queue = self._lane(claim.scope)
        if not queue:
            return False
        if not self._holds:
            return queue[0][3] is claim
        if self.held_back(claim, now):
            hold = self._holds[claim.scope]
            rank = RANK[claim.priority]
            held = self._held_of(queue, claim.scope, now)
            head = held[0] is claim
            if head and self._due(hold, rank, now, len(held)) <= now:
                self._release(claim, now)
                hold.release_at[rank] = now + self._gap(max(0.0, hold.ends[rank] - now), len(held))
                if len(held) > 1:
                    self._wake(held[1])  # the next keeps the release's timer
            elif claim.not_after is not None and claim.not_after <= now:
                self._release(claim, now)  # out of time to wait: it goes, the schedule stands
            else:
                return head or claim.not_after is not None
        return self._first_free(queue, now) is claim

    def leave(self, claim: Claim, now: float) -> None:
        """Leave the queue (taken, or gave up); the next at the head is woken."""
        lane = "" if self.one else claim.scope
        queue = self._queues.get(lane)
        if not queue:
            return
        for i, entry in enumerate(queue):
            if entry[3] is claim:
                del queue[i]
                if not queue:
                    del self._queues[lane]
                elif self._holds:
                    self._wake(self._first_free(queue, now))
                    self._wake(self._hold_head(queue, claim.scope, now))
                elif i == 0:
                    self._wake(queue[0][3])
                return

    def wake(self, scope: str, now: float) -> None:
        """Wake the first free claim of ``scope``'s lane: what it waits for may have changed."""
        queue = self._lane(scope)
        if queue:
            self._wake(self._first_free(queue, now))

    @staticmethod
    def _wake(claim: Claim | None) -> None:
        if claim is not None and claim.wake is not None:
            claim.wake()
