"""Slots held by response bodies that were dropped unclosed: found by a bounded collection.

A body the HTTP transports hand out holds its window slot (and its fleet
lease) until it is closed, its ``Lease`` is garbage collected, or it lapses
(``Lease.lapse_after``: nobody read from it for the attempt's time). A body
dropped unclosed is freed by reference counting, unless something keeps it
in a reference cycle: openai's ``Stream`` and ``AsyncStream`` do, as they
keep the generator that reads them (``_iterator``), whose frame refers back
to the stream. A stream left after its first chunk (``for chunk in stream:
break``) then lives until the garbage collector looks at the generation its
cycle is in: soon if it is young, but a stream read for a while is in the
oldest one, which a large process collects rarely (after its long-lived
objects grew by a quarter). Its slot waits for the lapse, and a window of 8
is gone after 8 such streams.

Nothing cheaper than a collection tells a dropped body from one a reader
still holds: the objects of a cycle keep each other's reference counts
above zero whether a user's reference is there or not; only a traversal from
the roots sees the difference (``gc.get_referrers`` walks the whole heap
too). asyncio's hooks for async generators do not help either: they run
when the generator is collected, not when it is dropped. So a caller about
to wait for a window slot (or a fleet lease), at the head of its queue,
while a body of its Gate has gone unread for ``IDLE_S``, collects
(``look``):

- the young generations first (``gc.collect(1)``: a stream dropped soon
  after it was made is there, and that costs well under a millisecond);
- the whole heap only if that gave nothing back;

each at most once per ``IDLE_S`` and for at most ``SHARE`` of the wall time
(a collection that took ``d`` seconds lets the next of its kind start
``d / SHARE`` seconds after it ended; after whole-heap ones that gave nothing
back, up to ``BACKOFF`` times that), one at a time in the process, never
under a Gate's lock. The collection runs the dropped stream's finalizers:
its ``Lease``'s gives the slot back through ``GateCore.orphan``, which never
waits for the lock, and a ``Lease`` released while a collection runs on its
thread (a stream's generator closing its response) never waits for it either
(``in_collection``): an automatic collection may have started inside this
thread's own critical section, at any allocation. A body still referenced is
not collected: a slow reader keeps its slot, whatever the collections cost.

A process that turned the collector off (``gc.disable()``) manages its own
collections: none is made for it, and its dropped bodies lapse.
"""

from __future__ import annotations

import gc
import math
import os
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from yieldgate.gate._core import GateCore, Held
    from yieldgate.gate._window import Waiter, Window

__all__ = [
    "BACKOFF",
    "COLLECTOR",
    "IDLE_S",
    "SHARE",
    "Collector",
    "for_slot",
    "in_collection",
    "look",
    "watch_collections",
]

SHARE: Final = 0.05
"""The most of the wall time that the collections made for waiting callers take."""
BACKOFF: Final = 8
"""Whole-heap collections that give nothing back space out, doubling up to this
many times ``SHARE``'s interval: slow readers that fill the window cost little."""
IDLE_S: Final = 0.1
"""A body nobody has read from for this long may have been dropped; also the
shortest time between two collections of one kind, and between two looks."""

_YOUNG: Final = 1  # gc.collect(1): the two young generations
_FULL: Final = 2

# The thread that runs a garbage collection now, if any (``in_collection``), once
# ``watch_collections`` has been called.
_collecting: int | None = None
_watching = False
_watch_lock = threading.Lock()


def _on_collection(phase: str, info: dict[str, Any]) -> None:
    global _collecting
    _collecting = threading.get_ident() if phase == "start" else None


def watch_collections() -> None:
    """Have ``in_collection`` tell, from now on: called once a ``Lease`` holds a
    slot, so a process that never holds one pays nothing per collection."""
    global _watching
    if _watching:
        return
    with _watch_lock:
        if not _watching:
            gc.callbacks.append(_on_collection)
            _watching = True


def in_collection() -> bool:
    """Whether this thread is running a garbage collection (``watch_collections``),
    whose finalizers may run inside any code of the thread, a Gate's critical
    section included."""
    return _collecting is not None and _collecting == threading.get_ident()


class Collector:
    """The collections made for waiting callers: one at a time in the process (the
    heap is the process's), each kind within its share of the wall time."""

    def __init__(
        self,
        share: float = SHARE,
        *,
        timer: Callable[[], float] = time.perf_counter,
        collect: Callable[[int], object] = gc.collect,
    ) -> None:
        self.share = share
        self._timer = timer
        self._collect = collect
        self._lock = threading.Lock()
        # Per kind: when it may run again, on ``timer``.
        self._next = {_YOUNG: 0.0, _FULL: 0.0}
        # The interval's multiple after whole-heap collections that gave nothing back.
        self._spacing = 1
        self.runs = {_YOUNG: 0, _FULL: 0}
        self.spent_s = 0.0

    def run(self, gave_back: Callable[[], bool]) -> float:
        """Collect what the budget allows: the young generations, then the whole
        heap if ``gave_back()`` is still false. Seconds until another may run."""
        if not self._lock.acquire(blocking=False):
            return IDLE_S  # another thread collects now: its finalizers wake us
        try:
            for kind in (_YOUNG, _FULL):
                start = self._timer()
                if start < self._next[kind]:
                    continue
                self._collect(kind)
                end = self._timer()
                found = gave_back()
                spacing = 1
                if kind == _FULL:
                    spacing = self._spacing
                    self._spacing = 1 if found else min(spacing * 2, BACKOFF)
                interval = (end - start) / self.share * spacing
                self._next[kind] = end + max(interval, IDLE_S)
                self.runs[kind] += 1
                self.spent_s += end - start
                if found:
                    break
            return max(0.0, min(self._next.values()) - self._timer())
        finally:
            self._lock.release()

    def forked(self) -> None:
        """In a forked child: the lock anew (a thread of the parent may have held it)."""
        self._lock = threading.Lock()


def _forked() -> None:
    global _collecting
    _collecting = None  # a thread of the parent's, which the child does not have
    COLLECTOR.forked()


COLLECTOR: Final = Collector()


def for_slot(
    core: GateCore, window: Window, waiter: Waiter, since: float, until: float | None
) -> float | None:
    """``look``, for a caller waiting since ``since`` for a slot of ``window``
    (``waiter``) that no lock is held for: by the head of its queue only, and only
    while bodies hold slots of a full window. When it should look again."""
    if core.next_lapse == math.inf and not window.head_looks:
        return until  # no body holds a slot: the common case, without the lock
    with core.lock:
        # The head of each queue keeps the look's timer: a new one is woken to take it on.
        looks = window.head_looks = core.next_lapse != math.inf
        looks = looks and window.inflight >= window.limit and window.is_head(waiter)
    return look(core, since, until) if looks else until


def look(core: GateCore, since: float, until: float | None, *, fleet: bool = False) -> float | None:
    """Collect for a caller of ``core`` waiting since ``since`` for a window slot
    (``fleet``: a fleet lease), once it has waited ``IDLE_S`` and a body of ``core``
    that holds one has gone unread as long. Called holding no lock. When the caller
    should look again, on the Gate's clock: ``until`` (its own wake-up, ``None``:
    none), or sooner to look for dropped bodies again.

    The caller's own wait lets a wait that is soon over cost nothing, and lets
    an event loop first run what the streams dropped just before left it: an
    async generator left by ``async for ... break`` is closed by a task that
    asyncio schedules, and keeps its stream alive until that task has run.
    """
    again = _again(core, since, fleet)
    if again is None or (until is not None and until <= again):
        return until
    return again


def _again(core: GateCore, since: float, fleet: bool) -> float | None:
    """``look``'s collection, if it is time: when to look again (``None``: no body
    holds what the caller waits for, nothing a collection could give back)."""
    if not gc.isenabled():
        return None
    suspects: list[Held] = []
    soonest = math.inf
    with core.lock:
        now = core.clock()
        bodies = [
            held
            for held in core.held  # not a body's, or no fleet lease to give back: skipped
            if held.idle_s is not None and (held.lease is not None or not fleet)
        ]
        for held in bodies:
            # A sum, as the time looked again at: a difference may round below it then.
            due = now + IDLE_S if held.reading else held.touched + IDLE_S
            if now >= due:
                suspects.append(held)
            else:
                soonest = min(soonest, due)
    if not bodies:
        return None
    if now < since + IDLE_S:
        return since + IDLE_S
    if not suspects:
        return soonest

    def gave_back() -> bool:
        if core.orphans:
            return True
        return any((held.lease if fleet else held.permit) is None for held in suspects)

    wait_s = COLLECTOR.run(gave_back)
    # Those collected while another thread held the lock, given back now (and the
    # notifications of those given back inside the collection, delivered).
    core.tend()
    return core.clock() + max(wait_s, IDLE_S)


if hasattr(os, "register_at_fork"):  # pragma: no branch - POSIX
    os.register_at_fork(after_in_child=_forked)
