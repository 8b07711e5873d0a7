"""``Lease``: a window slot kept after a call returned, the ledger of a held slot.

A call that holds (``Gate.hold``, ``call_and_hold``, the HTTP transports for a
response body read later) keeps its winning attempt's window permit and its
fleet in-flight lease: the attempt's ledger moves them to a ``Held``, and the
``Lease`` that gives them back is made in that same step (``CallState.end``),
so that there is no moment when nobody owns them: from then on, until the
call hands it out, the call keeps the ``Lease``, and the call's own give-back
(``CallState.close``) covers every path that does not reach the caller.

``release`` gives them back exactly once, from any thread, and tells the
window how the work that followed went. A lease whose owner forgets it is
not lost:

- a ``Lease`` that is garbage collected unreleased gives its slot back (its
  finalizer never takes the Gate's lock: it may run inside any code,
  the Gate's own included; it leaves the slot to be reclaimed by the next
  caller that looks, ``GateCore.reclaim``);
- a lease with an idle bound (``lapse_after``: the transports set one for a
  response body, the attempt's timeout) lapses when nobody has read from it
  for that long and no read is in progress, so a stream dropped half-read
  frees its slot even when no garbage collection comes; its fleet lease too,
  then, given back by the fleet's worker (``GateCore.tend``) when no caller
  of this member looks;
- ``GateCore.release_all`` (the transports' close) gives back those it is told;
- a caller waiting for a slot while a body's lease has gone unread a while
  collects, within a budget, to find the bodies dropped in a reference cycle
  (``_dropped``).

A lapsed or reclaimed lease counts as cancelled for the window. A lease
released while a garbage collection runs on its thread (a collected stream's
generator closing its response) never waits for the lock either: that
collection may have begun inside the Gate's own code.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING

from yieldgate.gate._core import Held
from yieldgate.gate._dropped import in_collection, watch_collections
from yieldgate.gate._quota import Cost
from yieldgate.gate._window import Signal

if TYPE_CHECKING:
    from yieldgate.gate._ledger import Attempt

__all__ = ["Held", "Lease"]


class Lease:
    """A window slot kept after a call returned (see ``Gate.call_and_hold``).

    ``release`` gives it back and tells the window how the work that followed
    went (``Signal.SUCCESS`` by default). Only the first release counts; it is
    safe from any thread. ``report_usage`` tells the Gate what the attempt
    really used, once its body (a stream's last chunk) said so.
    """

    __slots__ = ("__weakref__", "_attempt", "_held")

    def __init__(self, held: Held | None, attempt: Attempt | None = None) -> None:
        self._held = held
        self._attempt = attempt
        if held is not None:
            held.owner = weakref.ref(self)
            if not held.released:
                # Not at exit: a process ending has no slot to give back, nor threads to start.
                weakref.finalize(self, held.core.orphan, held).atexit = False
                watch_collections()  # it may be released inside a collection (``release``)

    def report_usage(self, used: Cost) -> None:
        """What the winning attempt really used (``AttemptInfo.report_usage``)."""
        if self._attempt is not None and not in_collection():
            # Inside a collection the lock may be this thread's: a dropped
            # body's usage is not reported (its attempt keeps the estimate).
            self._attempt.used(used)

    @property
    def released(self) -> bool:
        """Whether the slot has been given back (by ``release``, or as it lapsed)."""
        return self._held is None or self._held.released

    def release(self, outcome: Signal = Signal.SUCCESS) -> None:
        """Give the slot back, telling the window how the work that followed went.

        Only the first release counts; later ones do nothing.
        """
        held = self._held
        if held is None:
            return
        core = held.core
        if in_collection():
            core.orphan(held, outcome)  # never waits: the lock may be this thread's
            return
        with core.lock:
            held.give_back(outcome)
        core.after_lock()

    def lapse_after(self, idle_s: float | None) -> None:
        """Let the slot lapse once nobody has read from it for ``idle_s`` seconds
        (``touch`` marks a read; ``None``: never)."""
        held = self._held
        if held is None:
            return
        core = held.core
        with core.lock:
            held.idle_s = idle_s
            held.touched = now = core.clock()
            if idle_s is not None:
                # Callers waiting for a slot look again then (``GateCore.reclaim``), and
                # the fleet's worker, which renews its fleet lease (``GateCore.tend``).
                core.next_lapse = min(core.next_lapse, now + idle_s)
                if held.lease is not None and core.shared is not None:
                    core.shared.tend_in(idle_s)

    def touch(self, *, reading: bool) -> None:
        """A read begins (``reading``) or has just delivered something: not idle."""
        held = self._held
        if held is not None:
            held.reading = reading
            if held.idle_s is not None:
                held.touched = held.core.clock()
