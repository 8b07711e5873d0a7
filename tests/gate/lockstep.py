"""Threads in lockstep on a virtual clock: the sync driver, concurrent and deterministic.

``Lockstep`` is a ``Timer`` (``yieldgate.gate._sync``) for a Gate called from
several real threads. One thread runs at a time; it runs until it waits
(``wait`` or ``sleep``, the only ways the sync driver blocks), and then the
turn passes to the next thread, in round-robin order, whose event is set or
whose wait is over. Time moves only when every thread waits: to the end of
the soonest wait. So the Gate's own code runs in real threads, with real
``threading.Event`` wake-ups from one to another, but every run of the same
bodies interleaves the same way, which a property test needs to shrink.

The Gate's lock is never held while its caller waits, so the thread with the
turn never blocks on a lock another holds. Every wait takes a microsecond of
virtual time, as a loop iteration does on ``VirtualTimeLoop``.

A thread that a body starts without registering it (``Gate.map_sync``'s
worker) stands for the thread that started it, which waits in ``join`` until
it ends: give such a call one worker only (``concurrency=1``), or the workers
would race.

``interrupt_at`` raises ``KeyboardInterrupt`` from the k-th wait of a run in
a registered thread, as Ctrl-C would. A run in which every thread waits with
no timeout and no event is set is stuck: each waiting thread gets ``Stuck``
raised, so that the run ends, and ``stuck`` says so.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Sequence

from yieldgate.gate._sync import Timer

__all__ = ["Clock", "Lockstep", "Stuck"]

_STEP_S = 1e-6


class Clock:
    """The virtual time shared by the Gate (its ``clock``) and the lockstep."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class Stuck(BaseException):
    """Raised in a thread that waits for ever: no thread could ever wake it."""


class Lockstep(Timer):
    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self._cond = threading.Condition()
        self._turn = -1
        # thread number -> (its event, or None; the time its wait ends)
        self._waiting: dict[int, tuple[threading.Event | None, float]] = {}
        self._numbers: dict[int, int] = {}  # thread ident -> thread number
        self.waits = 0
        self.interrupt_at: int | None = None
        self.interrupted = 0
        self.stuck = False

    def run(
        self,
        bodies: Sequence[Callable[[], None]],
        *,
        interrupt_at: int | None = None,
        timeout_s: float = 60.0,
    ) -> None:
        """Run ``bodies``, one thread each, in lockstep, until all are over."""
        self.waits = 0
        self.interrupt_at = interrupt_at
        self.interrupted = 0
        self.stuck = False
        self._numbers.clear()
        # Every thread but the first waits for its first turn as if its wait were over.
        self._waiting = {i: (None, -math.inf) for i in range(1, len(bodies))}
        self._turn = 0
        threads = [
            threading.Thread(target=self._body, args=(i, body), name=f"lockstep-{i}", daemon=True)
            for i, body in enumerate(bodies)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout_s)
            if thread.is_alive():
                raise AssertionError(f"{thread.name} still runs after {timeout_s} s (real)")

    def _body(self, number: int, body: Callable[[], None]) -> None:
        self._numbers[threading.get_ident()] = number
        with self._cond:
            self._cond.wait_for(lambda: self._turn == number)
            self._waiting.pop(number, None)
        try:
            body()
        finally:
            with self._cond:
                # Its ident may be the next thread's: a worker must not pass for this one.
                del self._numbers[threading.get_ident()]
                self._pass(number)

    # -- the Timer -------------------------------------------------------------------

    def sleep(self, seconds: float) -> None:
        self._park(None, seconds)

    def wait(self, event: threading.Event, seconds: float | None) -> bool:
        if event.is_set():
            return True
        self._park(event, seconds)
        return event.is_set()

    def _park(self, event: threading.Event | None, seconds: float | None) -> None:
        ident = threading.get_ident()
        own = ident in self._numbers
        with self._cond:
            me = self._numbers[ident] if own else self._turn  # a worker stands for its starter
            assert self._turn == me, "a thread waited out of turn"
            self.waits += 1
            if own and self.waits == self.interrupt_at:
                self.interrupted += 1
                raise KeyboardInterrupt
            self.clock.now += _STEP_S
            until = math.inf if seconds is None else self.clock.now + max(0.0, seconds)
            self._waiting[me] = (event, until)
            self._pass(me)
            self._cond.wait_for(lambda: self._turn == me)
            del self._waiting[me]
            if self.stuck:
                raise Stuck

    def _pass(self, me: int) -> None:
        """Give the turn to the next thread that may run (under the condition)."""
        waiting = self._waiting
        if not waiting:
            self._turn = -1
            self._cond.notify_all()
            return
        numbers = sorted(waiting)
        after = [n for n in numbers if n > me] + [n for n in numbers if n <= me]
        while True:
            now = self.clock.now
            for n in after:
                event, until = waiting[n]
                if (event is not None and event.is_set()) or until <= now or self.stuck:
                    self._turn = n
                    self._cond.notify_all()
                    return
            soonest = min(until for _, until in waiting.values())
            if soonest == math.inf:
                self.stuck = True  # each waiting thread is woken with Stuck, in turn
            else:
                self.clock.now = soonest
