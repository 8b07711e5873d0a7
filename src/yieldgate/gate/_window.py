"""The Window: an adaptive concurrency limit with priority admission.

The limit is the ``Limit``'s (``_limit``): congestion control in the manner
of TCP, applied to requests in flight (slow start, additive increase,
decreases on refusal and congestion). This module admits callers under it.

Waiting callers are admitted by priority, then in order of their ``key`` (the
Gate passes when each call started, so a call that waited longest goes
first, a retry included).

**Holds.** An upstream hint ("come back in 200 ms") can be shared: ``hold``
stops admissions at that priority and below. Nobody goes before the hint has
passed; then the callers held behind it go one by one in their order, spread
over the hint's jitter (as their own jittered waits would have been, but
sorted), so no caller jumps the queue and the upstream sees neither a wave
nor a caller waiting longer than the jitter allows. During a hold, every
success reported by ``release`` is evidence that the upstream freed a slot,
so it admits one held caller at once (completion clocking, as TCP's acks
clock its sends): the upstream never idles while callers wait out a hint it
gave before its load moved. A slot freed by a call of one priority admits a
held caller of that priority or a higher one only: an upstream that keeps
slots for high priority may not give a low one the slot a high one left. A
waiter with a ``not_after`` time (the latest it can start and still meet its
deadline, never before the hint) may go then, though the hold lasts longer.

The window is sans-IO: it never waits and never reads a clock it was not
given. A caller that must wait registers a waiter (``enqueue``) with a
``wake`` callback, and the driver it runs on (``_async`` for asyncio and
trio, ``_sync`` for threads) does the waiting: it sleeps until woken or until
``wake_at``, then calls ``look`` again. The Gate calls every method under its
one lock, so callers of both drivers share one window.
"""

from __future__ import annotations

import heapq
import random
import time
from collections.abc import Callable
from typing import Final, Protocol

from yieldgate.gate._limit import Limit, Signal
from yieldgate.gate._policy import WindowPolicy
from yieldgate.gate._statistics import WindowStatistics
from yieldgate.protocol import Priority

__all__ = [
    "Permit",
    "Signal",
    "Waiter",
    "Window",
    "WindowPolicy",
    "WindowStatistics",
]

_PRIORITY_ORDER: Final = (Priority.HIGH, Priority.NORMAL, Priority.LOW)
RANK: Final = {Priority.LOW: 0, Priority.NORMAL: 1, Priority.HIGH: 2}


class Permit:
    """One slot of the window, held by one attempt; ``paced``: a start of the window's
    pacer was taken with it."""

    __slots__ = ("_released", "paced", "priority", "seq")

    def __init__(self, seq: int, priority: Priority, paced: bool) -> None:
        self.seq = seq
        self.priority = priority
        self.paced = paced
        self._released = False


class Pacer(Protocol):
    """What paces a window's grants (the Gate's rate cap): a start taken with each slot."""

    def try_take(self, now: float) -> bool: ...
    def next_at(self, now: float) -> float: ...
    def refund(self, now: float) -> None: ...


class Waiter:
    """A caller waiting for a permit. ``wake`` is the driver's: it must be safe to
    call from any thread, and it is called with the Gate's lock held."""

    __slots__ = ("gone", "not_after", "permit", "priority", "wake")

    def __init__(
        self, priority: Priority, not_after: float | None, wake: Callable[[], None]
    ) -> None:
        self.priority = priority
        self.not_after = not_after
        self.wake = wake
        self.permit: Permit | None = None
        # Granted or cancelled: no longer queued (queues drop such entries lazily).
        self.gone = False


_Entry = tuple[float, int, Waiter]


class Window:
    """Admits attempts while ``inflight < limit``; the limit adapts to congestion."""

    def __init__(
        self,
        policy: WindowPolicy | None = None,
        *,
        on_change: Callable[[int, int], None] | None = None,
        clock: Callable[[], float] | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.policy = policy or WindowPolicy()
        self._ctl = Limit(self.policy)
        self._limit = self._ctl.value  # the limit in force (kept in step with ``_ctl``)
        self._inflight = 0
        # Permits are numbered; those up to ``_full_seq`` were part of a full window.
        self._seq = 0
        self._full_seq = 0
        # Per priority, a heap of (key, arrival, waiter): the oldest key first.
        self._queues: dict[Priority, list[_Entry]] = {p: [] for p in _PRIORITY_ORDER}
        self._counts: dict[Priority, int] = dict.fromkeys(_PRIORITY_ORDER, 0)
        self._arrivals = 0
        self._waiting = 0
        self._on_change = on_change
        # Read only while a hold is set: a window without holds never needs a clock.
        self._clock = clock or time.monotonic
        self._rng = rng or random.Random()  # noqa: S311 - jitter, not secrets
        # Per rank: the hold ends at ``_holds`` (the hint with its jitter);
        # ``_hints`` is when the upstream itself said to come back. Between the
        # two, held callers go one by one, the next at ``_release_at``.
        self._holds = [0.0, 0.0, 0.0]
        self._hints = [0.0, 0.0, 0.0]
        self._release_at: list[float | None] = [None, None, None]
        # Per rank: successes during a hold, each of which may admit one held
        # caller of that rank or above.
        self._credits = [0, 0, 0]
        # Waiters with a ``not_after``, soonest first: they may pass a hold then.
        self._due: list[_Entry] = []
        # Starts per second, taken with each slot (the Gate's rate cap), if any.
        self.pacer: Pacer | None = None
        # Set while held bodies may have been dropped: the head of each queue keeps
        # a timer to look for them (``_dropped``), so a new head is woken to take it on.
        self.head_looks = False

    @property
    def limit(self) -> int:
        return self._limit

    @property
    def inflight(self) -> int:
        return self._inflight

    @property
    def waiting(self) -> int:
        return self._waiting

    def statistics(self) -> WindowStatistics:
        ctl = self._ctl
        return WindowStatistics(
            limit=self._limit,
            inflight=self._inflight,
            waiting=self._waiting,
            slow_start=ctl.slow_start,
            increases=ctl.increases,
            decreases=ctl.decreases,
        )

    # -- holds --------------------------------------------------------------

    def hold(self, priority: Priority, until: float, hint_until: float | None = None) -> None:
        """Hold admissions at ``priority`` and below: none before ``hint_until``
        (when the upstream asked callers to come back; default ``until``), the
        held callers one by one in their order from then, all of them by
        ``until`` (the hint with its jitter). Completions admit held callers
        earlier (see the module's docstring)."""
        hint_until = until if hint_until is None else min(hint_until, until)
        now: float | None = None
        for rank in range(RANK[priority] + 1):
            if until > self._holds[rank]:
                if self._waiting:
                    if now is None:
                        now = self._clock()
                    if self._holds[rank] <= now:
                        self._nudge(rank)  # they wait with no timer: give them one
                self._holds[rank] = until
                self._release_at[rank] = None  # the release starts over at the hint's end
            if hint_until > self._hints[rank]:
                self._hints[rank] = hint_until
                self._release_at[rank] = None
            # The upstream has just said it is full: earlier completions admit no more.
            self._credits[rank] = 0

    def _nudge(self, rank: int) -> None:
        """Wake the waiters of ``rank`` to look at the hold (its head sets a timer)."""
        for p, r in RANK.items():
            if r == rank:
                for _, _, waiter in self._queues[p]:
                    if not waiter.gone:
                        waiter.wake()

    def held_until(self, priority: Priority, now: float | None = None) -> float:
        """When the hold on ``priority`` ends, or 0.0 if none is in force."""
        return self._ahead(self._holds[RANK[priority]], now)

    def hint_until(self, priority: Priority, now: float | None = None) -> float:
        """When the upstream asked ``priority`` to come back (the start of the hold's
        release), or 0.0 if that has passed."""
        return self._ahead(self._hints[RANK[priority]], now)

    def _ahead(self, until: float, now: float | None) -> float:
        """``until`` if it is still to come, else 0.0 (the clock is read only for a time set)."""
        if until and until > (self._clock() if now is None else now):
            return until
        return 0.0

    def _held(self, rank: int, now: float) -> bool:
        until = self._holds[rank]
        if not until:
            return False
        if until > now:
            return True
        # Over: no clock reads for it again.
        self._holds[rank] = self._hints[rank] = 0.0
        self._release_at[rank] = None
        return False

    def _release_due(self, rank: int, now: float) -> float:
        """When the next held caller of ``rank`` goes, once the hint has passed.

        The callers held at the hint's end are spread over what is left of the
        hold, one after another: each gap is a random share of the time left,
        divided among those still waiting (as sorted uniform draws would be).
        """
        start = self._hints[rank]
        if now < start:
            return start
        due = self._release_at[rank]
        if due is None:
            due = self._release_at[rank] = start + self._gap(self._holds[rank] - start)
        return due

    def _released_one(self, rank: int, now: float) -> None:
        """A held caller of ``rank`` went on schedule: set when the next may go."""
        self._release_at[rank] = now + self._gap(max(0.0, self._holds[rank] - now))

    def _gap(self, left: float) -> float:
        """The time to the next release: a random share of ``left`` among the waiters."""
        return left * self._rng.uniform(0, 2) / (self._waiting + 1)

    # -- acquire ------------------------------------------------------------

    def _grant(self, priority: Priority, paced: bool) -> Permit:
        self._inflight += 1
        self._seq += 1
        if self._inflight >= self._limit:
            self._full_seq = self._seq
        return Permit(self._seq, priority, paced)

    def try_acquire(self, priority: Priority = Priority.NORMAL) -> Permit | None:
        """A permit now if one is free, no hold is in force for ``priority``, nobody
        of equal or higher priority waits, and the pacer (if any) has a start."""
        if self._inflight >= self._limit:
            return None
        if self._waiting and self._has_waiters_at_or_above(priority):
            return None
        rank = RANK[priority]
        if self._holds[rank] and self._held(rank, self._clock()):
            return None
        pacer = self.pacer
        if pacer is None:
            return self._grant(priority, False)
        if not pacer.try_take(self._clock()):
            return None
        return self._grant(priority, True)

    def _has_waiters_at_or_above(self, priority: Priority) -> bool:
        counts = self._counts
        for p in _PRIORITY_ORDER:
            if counts[p]:
                return True
            if p is priority:
                return False
        return False  # pragma: no cover - priority is always in the order

    def enqueue(
        self,
        priority: Priority,
        wake: Callable[[], None],
        *,
        key: float | None = None,
        not_after: float | None = None,
    ) -> Waiter:
        """Queue a caller that ``try_acquire`` refused; ``look`` tells it what next.

        Waiters of one priority are admitted in order of ``key`` (default: when
        they started waiting). ``not_after`` is the latest this caller can
        start: from then on a hold no longer keeps it back (the limit still
        does). ``wake`` is called when the waiter should ``look`` again.
        """
        waiter = Waiter(priority, not_after, wake)
        self._arrivals += 1
        entry = (self._clock() if key is None else key, self._arrivals, waiter)
        heapq.heappush(self._queues[priority], entry)
        if not_after is not None:
            heapq.heappush(self._due, (not_after, self._arrivals, waiter))
        self._counts[priority] += 1
        self._waiting += 1
        self._full_seq = self._seq  # demand exceeds the limit
        self._wake()  # a held queue may release this one at once
        return waiter

    def look(self, waiter: Waiter) -> float | None:
        """After a wake (or its timer): admit whoever may go now, then say when
        ``waiter``, if still waiting, should look again (``None``: when woken)."""
        if waiter.permit is None:
            self._wake()
        if waiter.permit is not None:
            return None
        return self._wake_at(waiter)

    def is_head(self, waiter: Waiter) -> bool:
        """Whether ``waiter`` is the first of its priority's queue."""
        return self._head(waiter.priority) is waiter

    def abandon(self, waiter: Waiter) -> None:
        """The waiter gives up (cancelled, out of time): it takes nothing with it."""
        permit = waiter.permit
        if permit is not None:
            # Granted just as it gave up: hand the permit (and its start) on, not lost.
            waiter.permit = None
            self.give_back(permit)
        elif not waiter.gone:
            self._leave(waiter)

    def give_back(self, permit: Permit) -> None:
        """Return a permit whose attempt was never sent, and the start taken with it."""
        if permit._released:
            return
        if permit.paced and self.pacer is not None:
            self.pacer.refund(self._clock())
        self.release(permit, Signal.CANCELLED)

    def _wake_at(self, waiter: Waiter) -> float | None:
        """When a waiter should look again (``None``: only a grant or a nudge wakes it).

        Only the head of a queue keeps a timer (for the next release of a hold,
        or the pacer's next start), and a waiter with a ``not_after``; the
        others are nudged when they become the head, so a thousand held
        callers cost one timer, not a thousand.
        """
        rank = RANK[waiter.priority]
        pacer = self.pacer
        times: list[float] = []
        now: float | None = None
        if pacer is not None and self._head(waiter.priority) is waiter:
            # Even while the window is full: a release finding no start free
            # wakes nobody, so the head keeps the pacer's timer itself.
            now = self._clock()
            start = pacer.next_at(now)
            if start > now:  # the pacer is what keeps it: look again at its start
                times.append(start)
        if self._holds[rank]:
            if now is None:
                now = self._clock()
            if self._held(rank, now):
                if self._head(waiter.priority) is waiter:
                    due = self._release_due(rank, now)
                    times.append(due if due > now else self._holds[rank])
                if waiter.not_after is not None and waiter.not_after > now:
                    times.append(waiter.not_after)
        return min(times) if times else None

    def _leave(self, waiter: Waiter) -> None:
        head = self._head(waiter.priority) is waiter
        waiter.gone = True
        self._counts[waiter.priority] -= 1
        self._waiting -= 1
        if head and (
            self.pacer is not None or self._holds[RANK[waiter.priority]] or self.head_looks
        ):
            after = self._head(waiter.priority)
            if after is not None:
                after.wake()  # the new head keeps the hold's (or the pacer's, a look's) timer

    def _head(self, priority: Priority) -> Waiter | None:
        queue = self._queues[priority]
        while queue and queue[0][2].gone:
            heapq.heappop(queue)
        return queue[0][2] if queue else None

    def _overdue(self, now: float) -> Waiter | None:
        due = self._due
        while due and due[0][2].gone:
            heapq.heappop(due)
        if due and due[0][0] <= now:
            return due[0][2]
        return None

    def _next(self) -> Waiter | None:
        """The waiter to admit next, if any may go now."""
        now: float | None = None
        for p in _PRIORITY_ORDER:
            if not self._counts[p]:
                continue
            waiter = self._head(p)
            assert waiter is not None
            rank = RANK[p]
            if self._holds[rank]:
                if now is None:
                    now = self._clock()
                if self._held(rank, now):
                    # Lower priorities are held at least as long: only a
                    # completion, the release schedule, or a waiter out of time
                    # to wait lets anyone go now.
                    credits = self._credits
                    for r in range(rank + 1):
                        if credits[r]:
                            credits[r] -= 1
                            return waiter
                    if self._release_due(rank, now) <= now:
                        self._released_one(rank, now)
                        return waiter
                    return self._overdue(now)
            return waiter
        return None

    def _wake(self) -> None:
        pacer = self.pacer
        while self._inflight < self._limit and self._waiting:
            if pacer is not None:
                now = self._clock()
                if pacer.next_at(now) > now:
                    return  # no start free yet: the head's timer looks again then
            waiter = self._next()
            if waiter is None:
                return
            if pacer is not None and not pacer.try_take(now):
                return  # pragma: no cover - a start was free a moment ago
            self._leave(waiter)
            waiter.permit = self._grant(waiter.priority, pacer is not None)
            waiter.wake()

    def reset(self) -> None:
        """Forget every permit and waiter (a forked child's copy: none of them is its)."""
        self._inflight = 0
        self._queues = {p: [] for p in _PRIORITY_ORDER}
        self._counts = dict.fromkeys(_PRIORITY_ORDER, 0)
        self._waiting = 0
        self._due = []
        self._credits = [0, 0, 0]
        self.head_looks = False

    def _clocking(self) -> bool:
        """Some waiter is held back by a hold in force now."""
        holds = self._holds
        if not (holds[0] or holds[1] or holds[2]):
            return False
        now = self._clock()
        return any(self._counts[p] and self._held(RANK[p], now) for p in _PRIORITY_ORDER)

    # -- release ------------------------------------------------------------

    def release(self, permit: Permit, signal: Signal) -> None:
        """Return a permit, telling the window how its attempt ended. Idempotent."""
        if permit._released:
            return
        permit._released = True
        self._inflight -= 1
        before = self._limit
        if signal is not Signal.FAILURE and signal is not Signal.CANCELLED:
            seq = permit.seq
            self._limit = self._ctl.released(
                seq, signal, full=seq <= self._full_seq, latest=self._seq
            )
        if self._waiting:
            if signal is Signal.SUCCESS and self._clocking():
                rank = RANK[permit.priority]
                if self._credits[rank] < self._waiting:
                    self._credits[rank] += 1  # a slot freed upstream: one held caller may take it
            self._wake()
        # Last: whatever it does, the slot is back and its waiter woken.
        if self._limit != before and self._on_change is not None:
            self._on_change(before, self._limit)
