"""The fleet link's worker thread: what a member does for its fleet off every caller's path.

One thread per Gate that shares its state, started when first needed and
ended when it has nothing left to do:

- it renews the fleet in-flight leases held, a third of their TTL before they
  would lapse (a member that dies stops renewing, and its leases lapse);
- it runs what must not wait for the next call: the release of a lease held
  past its call (``Lease.release``, which may run on an event loop that must
  not block on Redis), and what a cancelled attempt gave back after its driver
  could no longer await;
- before it renews, it tends the Gate's held slots (``tend``: the Gate's
  ``GateCore.tend``): a slot whose ``Lease`` was dropped, or that lapsed (a
  response body nobody reads), gives its fleet lease back then, though no
  caller of this member looks. So it never renews what no one holds: it wakes
  for the next lapse as it does for the next renewal.

Lock order: the Gate's lock, then the worker's ``_cond``, never the reverse:
``tend`` runs outside ``_cond`` (what it gives back takes ``_cond`` to hand the
release over), and what holds the Gate's lock may take ``_cond``. Times here
are ``time.monotonic``'s (Redis's TTLs are real time); a lapse is on the
Gate's clock, and ``tend`` says how far off the next one is.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from yieldgate.gate._fleet_op import FleetOp
from yieldgate.gate._policy import FleetPolicy
from yieldgate.gate._upstream import Upstream

__all__ = ["FleetWorker"]

# The shortest wait for the next lapse: a Gate's clock that stands still (a test's)
# never makes the worker spin.
MIN_TEND_S = 0.005
log = logging.getLogger("yieldgate")


class FleetWorker:
    """The worker's half of a Gate's fleet link (``Shared`` is the other): the leases
    held, the ops to run now, and the thread that does both (see the module docstring)."""

    fleet: Any
    policy: FleetPolicy
    gate: str
    # The Gate's give-back of dropped and lapsed held slots (``GateCore.tend``): the
    # seconds until the next lapse (``None``: none may), run before each renewal.
    tend: Callable[[], float | None] | None = None

    def _init_worker(self) -> None:
        # Leases held now (id -> upstream), renewed by the worker every third of their
        # TTL; ops for it to run at once; both guarded by ``_cond``.
        self._cond = threading.Condition(threading.Lock())
        self.leases: dict[str, str] = {}
        self._soon: deque[FleetOp] = deque()
        # Ops the other members wait on that Redis did not answer, the latest per
        # upstream, to run again once it answers (``Shared.ran``); also under ``_cond``.
        self._again: dict[tuple[str, str], FleetOp] = {}
        self._worker: threading.Thread | None = None
        self._stopped = False
        # When the leases held are next renewed (a third of their TTL after the
        # earliest grant or renewal not yet followed by one), and when a held slot
        # may lapse next (``tend`` again then).
        self._renew_at = math.inf
        self._tend_at = math.inf

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

    def tend_in(self, seconds: float) -> None:
        """A held slot with a fleet lease may lapse in ``seconds``: tend then (under the
        Gate's lock, which is taken before ``_cond``)."""
        due = time.monotonic() + max(seconds, MIN_TEND_S)
        with self._cond:
            if due < self._tend_at:
                self._tend_at = due
                self._cond.notify()

    def release_nowait(self, up: Upstream, lease: str) -> bool:
        """``Shared.release(soon=True)`` if that takes no waiting and no new thread (a garbage
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

    def _ensure_worker(self) -> None:
        # Under ``_cond``: a worker exits only under it, having seen nothing to do.
        if self._worker is None and (self._soon or not self._stopped):
            self._worker = threading.Thread(
                target=self._work, name=f"yieldgate-fleet-{self.gate}", daemon=True
            )
            self._worker.start()

    def _work(self) -> None:
        """Tend the held slots, renew the leases held a third of their TTL before they
        would lapse, and run the ops handed over; end when there is neither lease nor op."""
        every = self.policy.lease_ttl_s / 3
        while True:
            tend = self.tend
            left = None if tend is None else tend()  # outside ``_cond``: see the docstring
            with self._cond:
                if left is not None:
                    self._tend_at = min(self._tend_at, time.monotonic() + max(left, MIN_TEND_S))
                while True:
                    if not self._soon and (self._stopped or not self.leases):
                        self._worker = None
                        self._renew_at = self._tend_at = math.inf
                        return
                    now = time.monotonic()
                    # Run even once closed: they give back what was taken.
                    if self._soon or now >= self._tend_at or now >= self._renew_at:
                        break
                    self._cond.wait(min(self._renew_at, self._tend_at) - now)
                ops = list(self._soon)
                self._soon.clear()
                renew: dict[str, list[str]] = {}
                # Not while a slot may have lapsed: it is tended first (the next round).
                if self._renew_at <= now < self._tend_at and not self._stopped:
                    self._renew_at = now + every
                    for lease, upstream in self.leases.items():
                        renew.setdefault(upstream, []).append(lease)
                # The next round tends, and says when again; a lapse set meanwhile stays.
                self._tend_at = math.inf
            for op in ops:
                try:
                    self.ran(op, getattr(self.fleet, op.name + "_sync")(*op.args, **op.kwargs))
                except Exception:  # pragma: no cover - a fleet op answers None, never raises
                    log.exception("a fleet operation of gate %r raised", self.gate)
            for upstream, leases in renew.items():
                self.fleet.renew_sync(upstream, leases)

    def ran(self, op: FleetOp, got: Any) -> None:
        """What an op run for the link answered (``Shared`` keeps some to run again)."""

    def stop(self) -> list[FleetOp]:
        """Stop renewing; the ops still to run (what leases and attempts gave back,
        not run yet), once the worker has finished those it is running."""
        with self._cond:
            self._stopped = True
            ops = list(self._soon)
            self._soon.clear()
            self._cond.notify()
            worker = self._worker
        if worker is not None and worker is not threading.current_thread():
            # The ops it is running now reach Redis before the link closes.
            worker.join(self.policy.budget_s * 4)
        return ops
