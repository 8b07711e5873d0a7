"""Attempt deadlines on asyncio: one timer per event loop, not one per attempt.

Every attempt runs under a deadline (its timeout, 60 s by default), and
nearly every attempt ends long before it. A cancel scope per attempt arms a
timer in the loop's heap and cancels it again: on asyncio that is most of
what a call through the Gate costs. Here the deadlines of all attempts on a
loop share one timer, armed for the earliest: an attempt adds an entry to a
heap and marks it done when it ends; dead entries are dropped when they
reach the top, or all at once when they outnumber the live ones. When the
timer fires, the tasks whose deadlines have passed are cancelled, and the
attempt turns that cancellation into a time-out, as ``asyncio.timeout``
does (counting ``Task.cancelling`` so a cancellation from elsewhere still
propagates). Under trio, whose deadlines cost little, the async driver uses
a cancel scope instead.

A deadline always fires. When it comes while another cancellation of the
task is pending (an anyio scope inside the attempt whose deadline is the same
instant, an inner Gate's attempt), cancelling now would replace that
cancellation's message, by which anyio's scopes know their own; so it waits
for the task to take that cancellation, and fires on the next loop iteration
after it, unless the attempt has ended by then. A canceller that swallows its
own cancellation cannot make the deadline be skipped.

Nothing here keeps a loop or a task alive: the table of loops holds them
weakly, a deadline lets go of its task when its attempt ends, however long
its entry stays in the heap, and the timer runs in a context of its own (not
a copy of the attempt's, which holds the attempt).
"""

from __future__ import annotations

import asyncio
import contextvars
import heapq
import itertools
import math
import weakref
from typing import Any, Final

__all__ = ["Deadline", "add"]

# Dead entries are swept once there are more of them than this and than live ones.
_SWEEP_AT: Final = 1024
# asyncio runs a timer up to its clock's resolution early.
_EARLY_S: Final = 1e-3


class Deadline:
    """One attempt's deadline: ``expired`` once it has passed while the attempt ran,
    and ``fired`` once it cancelled the task."""

    __slots__ = ("active", "cancelling", "expired", "fired", "owner", "task", "when")

    def __init__(self, owner: _Deadlines, when: float, task: asyncio.Task[Any]) -> None:
        self.owner = owner
        self.when = when
        self.task: asyncio.Task[Any] | None = task
        self.cancelling = task.cancelling()
        self.active = True  # in the heap, not yet expired nor done
        self.expired = False
        self.fired = False

    def timed_out(self) -> bool:
        """After a ``CancelledError``: whether it was this deadline's doing alone."""
        task = self.task
        return self.fired and task is not None and task.uncancel() <= self.cancelling

    def done(self) -> None:
        """The attempt ended: the deadline no longer applies, and lets go of its task."""
        if self.active:
            self.owner.remove(self)
        self.task = None

    def expire(self) -> None:
        """The deadline has passed: cancel the task, once no other cancellation of it
        is pending."""
        self.active = False
        self.expired = True
        self._fire()

    def _fire(self) -> None:
        task = self.task
        if task is None or task.done():
            return  # the attempt ended meanwhile
        if task.cancelling() > self.cancelling and _pending(task):
            # Another cancellation is on its way in: let the task take it first.
            task.get_loop().call_soon(self._fire, context=self.owner.context)
            return
        self.fired = True
        task.cancel()


def _pending(task: asyncio.Task[Any]) -> bool:
    """Whether a cancellation of ``task`` was asked for and not yet thrown into it
    (asyncio's own fields, read as anyio reads them)."""
    if getattr(task, "_must_cancel", False):
        return True
    waiter = getattr(task, "_fut_waiter", None)
    return isinstance(waiter, asyncio.Future) and waiter.cancelled()


class _Deadlines:
    """The deadlines of the attempts running on one loop."""

    __slots__ = ("__weakref__", "armed", "context", "dead", "heap", "live", "loop", "seq")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        # Weakly: the table of loops holds these by their loop, weakly too.
        self.loop = weakref.ref(loop)
        # The timer's callbacks run in a context of their own: armed in an attempt's,
        # the timer would keep that attempt (and its task, its value) until it fires.
        self.context = contextvars.Context()
        self.heap: list[tuple[float, int, Deadline]] = []
        self.seq = itertools.count()
        # When the timer is armed for (its handle is the loop's alone: a handle holds
        # its loop, and this table must not).
        self.armed = math.inf
        self.dead = 0
        self.live = 0

    def add(self, when: float, task: asyncio.Task[Any]) -> Deadline:
        entry = Deadline(self, when, task)
        heapq.heappush(self.heap, (when, next(self.seq), entry))
        self.live += 1
        if when < self.armed:
            self._arm(when)
        return entry

    def remove(self, entry: Deadline) -> None:
        entry.active = False
        self.dead += 1
        self.live -= 1
        if not self.live:
            # Nothing left to time: no dead entries either (the timer, when it fires,
            # finds nothing due and is not armed again).
            self.heap.clear()
            self.dead = 0
        elif self.dead > _SWEEP_AT and self.dead * 2 > len(self.heap):
            self.heap = [item for item in self.heap if item[2].active]
            heapq.heapify(self.heap)
            self.dead = 0

    def _arm(self, when: float) -> None:
        # A timer armed for later is left to fire: it finds nothing due and arms the
        # next (cancelling it would mean keeping its handle, which holds the loop).
        loop = self.loop()
        if loop is None:  # pragma: no cover - a loop gone has no attempts left
            return
        loop.call_at(when, self._fire, context=self.context)
        self.armed = when

    def _fire(self) -> None:
        now_armed = self.armed
        loop = self.loop()
        if loop is None:  # pragma: no cover - called by that loop
            return
        if loop.time() < now_armed - _EARLY_S:
            return  # a timer armed before an earlier one was: that one is in charge
        self.armed = math.inf
        heap = self.heap
        now = loop.time()
        while heap and (heap[0][0] <= now or not heap[0][2].active):
            _, _, entry = heapq.heappop(heap)
            if entry.active:
                self.live -= 1
                entry.expire()
            else:
                self.dead -= 1
        if heap:
            self._arm(heap[0][0])


_LOOPS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Deadlines] = (
    weakref.WeakKeyDictionary()
)


# The table last used, weakly: most attempts run on the loop the last one ran on.
_last: weakref.ref[_Deadlines] | None = None


def add(when: float, task: asyncio.Task[Any]) -> Deadline:
    """Cancel ``task`` at ``when`` (its loop's time) unless the deadline is ``done`` first."""
    global _last
    loop = task.get_loop()
    last = None if _last is None else _last()
    if last is not None and last.loop() is loop:
        return last.add(when, task)
    deadlines = _LOOPS.get(loop)
    if deadlines is None:
        deadlines = _LOOPS[loop] = _Deadlines(loop)
    _last = weakref.ref(deadlines)
    return deadlines.add(when, task)
