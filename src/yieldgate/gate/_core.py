"""The Gate's shared state: what every call of one Gate, from either driver, sees.

One ``GateCore`` per Gate holds the upstreams (each with its window, breaker
and latency record), the retry budget, the rate cap, the counters, the clock
and the random source, and the one lock that guards them all. The lock is a
plain ``threading.Lock``: sync callers in threads and async callers on an
event loop (or several loops) share one Gate, nothing ever waits while
holding it, and no user code runs under it, so it is never taken twice by
one thread.

User code the Gate calls while it changes state (instrumentation hooks,
listeners) is queued in ``events`` and run by ``deliver`` once the lock is
released; whatever it raises is logged, and never stops a give-back.

Besides the attempts' ledgers (``_ledger``), the core keeps what outlives a
call: the slots held by leases (``held``: the ledgers of held slots, each
owned by its ``Lease`` from the step that makes it), those whose ``Lease``
was dropped unreleased (``orphans``, given back by the next caller that
looks, or by the fleet's worker: ``tend``), and the retry-budget draws not
yet sent or refunded (``draws``). ``audit`` lists anything held when nothing
should be, a held slot whose ``Lease`` is gone among them.

A process that forks (gunicorn ``--preload``, Celery's prefork pool,
multiprocessing) copies every Gate with the slots its threads held mid-call;
in the child, none of those threads exists. Each Gate's lock is taken before
a fork, so the copy is consistent, and the child's Gates start clean: a new
lock, no slot, waiter, claim or lease held (``epoch`` moves on, so the
parent's attempts and leases, if the forking thread had any, give back
nothing in the child).
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import logging
import os
import random
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any, Final

from yieldgate.gate._aliases import Aliases
from yieldgate.gate._breaker import Breaker, BreakerState
from yieldgate.gate._budget import RetryBudget
from yieldgate.gate._outcome import Classifier
from yieldgate.gate._policy import GatePolicy
from yieldgate.gate._quota import Quota
from yieldgate.gate._ratecap import RateCap
from yieldgate.gate._shared import Shared
from yieldgate.gate._statistics import Counters, GateStatistics
from yieldgate.gate._telemetry import BreakerChange, Instrumentation, WindowChange
from yieldgate.gate._upstream import LatencyTracker, Upstream
from yieldgate.gate._window import Permit, Signal, Window, WindowStatistics

__all__ = ["GateCore", "Held", "default_clock", "log", "unique_name"]

_SERIAL: Final = itertools.count(1)
_NEVER: Final = float("inf")

log: Final = logging.getLogger("yieldgate")

# The Gate's clock unless told otherwise: monotonic, shared by every thread and loop.
default_clock: Final[Callable[[], float]] = time.monotonic


def unique_name() -> str:
    """A name for a Gate built without one: each its own telemetry label."""
    return f"gate-{next(_SERIAL)}"


class GateCore:
    """The state one Gate's calls share (see the module docstring)."""

    def __init__(
        self,
        policy: GatePolicy,
        name: str,
        classify: Classifier,
        instr: Instrumentation,
        rng: random.Random,
        clock: Callable[[], float],
    ) -> None:
        self.policy = policy
        self.name = name
        self.classify = classify
        self.instr = instr
        self.rng = rng
        self.clock = clock
        self.lock = threading.Lock()
        self.epoch = 0
        self.budget = RetryBudget(policy.budget, clock)
        # Retry-budget draws taken and neither sent nor refunded yet.
        self.draws = 0
        self.rate: RateCap | None = None
        if policy.rate is not None:
            self.rate = RateCap(policy.rate, clock)
        self.counters = Counters()
        self.closed = False
        self.since_checkpoint = 0
        hedge = policy.hedge
        self.latency_size = 200 if hedge is None else hedge.samples
        # Every answer of the Gate; the one upstream of a Gate without a set shares it.
        self.latency = LatencyTracker(self.latency_size)
        self.upstreams: list[Upstream] = []
        # True once upstreams are named: attempts then report where they go.
        self.named = False
        # The fleet this Gate shares its state with (``Gate(shared=...)``).
        self.shared: Shared | None = None
        # Notifications for user code, run outside the lock (``deliver``).
        self.events: collections.deque[Callable[[], None]] = collections.deque()
        # The ledgers of held slots, those dropped unreleased, and the earliest
        # time one of them may lapse.
        self.held: set[Held] = set()
        self.orphans: collections.deque[Held] = collections.deque()
        self.next_lapse = float("inf")
        # Names metered as one quota: the caller's (``QuotaPolicy.aliases``), then
        # snapshots answers named for a requested model (``learn_alias``).
        self.aliases = Aliases(policy.quota.aliases)
        _CORES.add(self)

    def make_upstream(
        self, name: str, target: Any, *, label: str, latency: LatencyTracker | None = None
    ) -> Upstream:
        instr = self.instr
        events = self.events

        def window_changed(old: int, new: int) -> None:
            change = WindowChange(gate=label, old=old, new=new)
            events.append(lambda: instr.on_window_change(change))

        def breaker_changed(old: BreakerState, new: BreakerState) -> None:
            change = BreakerChange(gate=label, old=str(old), new=str(new))
            events.append(lambda: instr.on_breaker_change(change))

        window = Window(
            self.policy.window, on_change=window_changed, clock=self.clock, rng=self.rng
        )
        window.pacer = self.rate
        breaker = Breaker(self.policy.breaker, self.clock, name=label, on_change=breaker_changed)
        if latency is None:
            latency = LatencyTracker(self.latency_size)
        q = self.policy.quota
        quota = Quota(
            requests_per_minute=q.requests_per_minute,
            tokens_per_minute=q.tokens_per_minute,
            learn=q.learn,
            borrow=q.borrow,
            jitter=self.policy.retry.hint_jitter,
            rng=self.rng,
        )
        if self.shared is not None:
            quota.shared = self.shared.available
        return Upstream(name, target, window, breaker, latency, quota)

    # -- user code, outside the lock -------------------------------------------------

    def deliver(self) -> None:
        """Run the queued notifications (never under the lock); log what they raise."""
        events = self.events
        while events:
            try:
                hook = events.popleft()
            except IndexError:  # another thread took the last one
                return
            try:
                hook()
            except Exception:
                log.exception("an instrumentation hook of gate %r raised", self.name)

    def after_lock(self) -> None:
        """What follows a change made under the lock: its notifications, delivered."""
        if self.events:
            self.deliver()

    def hook(self, fn: Callable[[Any], object], details: Any) -> None:
        """Call a hook of the user's now (outside the lock); log what it raises."""
        try:
            fn(details)
        except Exception:
            log.exception("an instrumentation hook of gate %r raised", self.name)

    # -- the retry budget's draws ---------------------------------------------------------

    def withdraw(self) -> int | None:
        """One retry from the budget (under the lock): a receipt, counted until the
        retry is sent (``draws``) or refunded; ``None`` when the budget is spent."""
        receipt = self.budget.withdraw()
        if receipt is not None:
            self.draws += 1
        return receipt

    def refund_draw(self, receipt: int) -> None:
        """A draw whose retry was never sent goes back (under the lock)."""
        self.draws -= 1
        self.budget.refund(receipt)

    # -- held slots -------------------------------------------------------------------

    def orphan(self, held: Held, signal: Signal = Signal.CANCELLED) -> None:
        """A ``Lease`` was collected unreleased (or released inside a collection):
        give its slot back, now if the lock is free, else by the next caller that
        looks (as cancelled then). Called by the garbage collector, possibly inside
        the Gate's own code on this thread: it never waits for the lock."""
        if held.released:
            return
        if self.lock.acquire(blocking=False):
            try:
                held.give_back(signal, collected=True)
            finally:
                self.lock.release()
            return
        self.orphans.append(held)

    def tend(self) -> float | None:
        """Give back what dropped and lapsed leases hold, fleet leases included: the
        fleet's worker runs this before it renews, so that it renews no fleet lease
        of a slot nobody holds any more. The seconds until the next held slot may
        lapse, on the Gate's clock (``None``: none may)."""
        if not self.orphans and self.next_lapse == _NEVER:
            return None
        try:
            now: float | None = self.clock()
        except RuntimeError:  # a loop's clock, read outside its loop: lapses wait for callers
            now = None
        with self.lock:
            if now is None:
                self._reclaim_orphans()
            else:
                self.reclaim(now)
            lapse = self.next_lapse
        self.after_lock()
        return None if now is None or lapse == _NEVER else lapse - now

    def _reclaim_orphans(self) -> None:
        orphans = self.orphans
        while orphans:
            try:
                held = orphans.popleft()
            except IndexError:  # pragma: no cover - taken by another thread
                return
            held.give_back(Signal.CANCELLED)

    def reclaim(self, now: float) -> None:
        """Give back dropped and lapsed leases (under the lock)."""
        self._reclaim_orphans()
        if now < self.next_lapse:
            return
        soonest = float("inf")
        for held in list(self.held):
            if held.idle_s is None:
                continue
            if held.lapsed(now):
                held.give_back(Signal.CANCELLED)
            elif not held.reading:
                soonest = min(soonest, held.touched + held.idle_s)
            else:
                soonest = min(soonest, now + held.idle_s)
        self.next_lapse = soonest

    def release_all(self, helds: list[Held]) -> None:
        """Give back these held slots at once (a transport closing its responses)."""
        with self.lock:
            for held in helds:
                held.give_back(Signal.CANCELLED)
        self.after_lock()

    # -- forks ----------------------------------------------------------------------------

    def _forked(self) -> None:
        """In a forked child: a new lock, and nothing held by the parent's threads."""
        self.lock = threading.Lock()
        self.epoch += 1
        self.draws = 0
        self.held.clear()
        self.orphans.clear()
        self.events.clear()
        self.next_lapse = float("inf")
        for up in self.upstreams:
            up.window.reset()
            up.breaker.forked()
            up.quota.forked()
        if self.shared is not None:
            self.shared.forked()

    # -- snapshots ---------------------------------------------------------------------------

    def statistics(self) -> GateStatistics:
        try:
            now: float | None = self.clock()
        except RuntimeError:  # a loop's clock, read outside the loop: as of the last use
            now = None
        with self.lock:
            return self._statistics(now)

    def _statistics(self, now: float | None) -> GateStatistics:
        c = self.counters
        ups = self.upstreams
        if len(ups) == 1:
            window = ups[0].window.statistics()
            breaker = str(ups[0].breaker.state)
        else:
            each = [u.window.statistics() for u in ups]
            window = WindowStatistics(
                limit=sum(w.limit for w in each),
                inflight=sum(w.inflight for w in each),
                waiting=sum(w.waiting for w in each),
                slow_start=any(w.slow_start for w in each),
                increases=sum(w.increases for w in each),
                decreases=sum(w.decreases for w in each),
            )
            states = {str(u.breaker.state) for u in ups}
            breaker = states.pop() if len(states) == 1 else "mixed"
        rate = self.rate
        rate_per_s = None
        if rate is not None and rate.started:
            rate_per_s = rate.rate_now(rate.updated if now is None else now)
        return GateStatistics(
            name=self.name,
            window=window,
            breaker=breaker,
            breaker_failures=sum(u.breaker.failures for u in ups),
            retry_allowance=self.budget.allowance(now, roll=now is not None),
            calls=c.calls,
            calls_ok=c.calls_ok,
            calls_failed=c.calls_failed,
            attempts=c.attempts,
            yields=c.yields,
            overloads=c.overloads,
            failures=c.failures,
            retries=c.retries,
            waited_s=c.waited_s,
            rejected_open=c.rejected_open,
            rate_per_s=rate_per_s,
            hedges=c.hedges,
            hedge_wins=c.hedge_wins,
            hedges_denied=c.hedges_denied,
            losers_cancelled=c.losers_cancelled,
            upstreams=tuple(u.statistics(now) for u in ups) if self.named else (),
        )

    def audit(self) -> list[str]:
        """What the Gate holds that no running call or held lease accounts for:
        empty when it holds nothing it should not. For tests and debugging; meant
        to be read when no call runs (it says what would be stranded): then no
        quota claim is queued, taken or in flight, so nothing is unseen in the
        local buckets, and, in a fleet, no take is still counted unseen in Redis
        (each is settled by its readings and, for the buckets they did not read,
        when its attempt ends). ``Fleet.audit`` says the same of Redis itself."""
        with self.lock:
            with contextlib.suppress(RuntimeError):  # a loop's clock, read outside the loop
                self.reclaim(self.clock())
            problems: list[str] = []
            held_by = collections.Counter(h.up for h in self.held if h.permit is not None)
            # A Held whose Lease was never made, or is gone and did not give it back.
            unowned = collections.Counter(
                h.up for h in self.held if h.owner is None or h.owner() is None
            )
            for up in self.upstreams:
                where = f"{self.name}/{up.name}"
                w = up.window
                if w.inflight != held_by[up]:
                    problems.append(
                        f"{where}: window has {w.inflight} slot(s) in flight, "
                        f"{held_by[up]} of them held by leases"
                    )
                if unowned[up]:
                    problems.append(
                        f"{where}: {unowned[up]} held slot(s) with no Lease to give them back"
                    )
                if w.waiting:
                    problems.append(f"{where}: {w.waiting} waiter(s) queued for the window")
                if up.breaker.probe_pending:
                    problems.append(f"{where}: the breaker's half-open probe is out")
                problems += [f"{where}: {p}" for p in up.quota.audit()]
            if self.draws:
                problems.append(f"{self.draws} retry-budget draw(s) neither sent nor refunded")
            if self.shared is not None:
                problems += self.shared.audit(self.held)
            return problems


class Held:
    """What a held slot holds (a ``Lease``'s ledger, ``_lease``): its own record,
    apart from the ``Lease`` object, so that a finalizer can give it back after
    the ``Lease`` is gone. The core keeps every one not yet given back; each
    knows its ``Lease`` weakly (``owner``), which ``audit`` reads."""

    __slots__ = (
        "core", "epoch", "idle_s", "lease", "owner", "permit", "reading", "touched", "up",
    )  # fmt: skip

    def __init__(
        self, core: GateCore, up: Upstream, permit: Permit | None, lease: str | None
    ) -> None:
        self.core = core
        self.epoch = core.epoch
        self.up = up
        self.permit = permit
        self.lease = lease  # the fleet's in-flight lease, if any
        # The Lease that gives it back (set by the Lease, in the step that makes both).
        self.owner: weakref.ref[Any] | None = None
        self.idle_s: float | None = None
        self.touched = 0.0
        self.reading = False

    @property
    def released(self) -> bool:
        return self.permit is None and self.lease is None

    def give_back(self, signal: Signal, *, collected: bool = False) -> None:
        """Give back the slot and the fleet lease, once (under the Gate's lock).

        ``collected``: called from a garbage collector's finalizer, which may run
        inside any code of this thread (the fleet link's own included): the fleet
        lease is then released only if that takes no waiting; else it is left to the
        next caller that looks (``GateCore.reclaim``).
        """
        core = self.core
        permit, self.permit = self.permit, None
        if self.epoch != core.epoch:
            self.lease = None
            return  # a forked parent's slot
        if permit is not None:
            self.up.window.release(permit, signal)
        lease = self.lease
        shared = core.shared
        if lease is not None and shared is not None:
            if collected and not shared.release_nowait(self.up, lease):
                core.orphans.append(self)  # its fleet lease, given back by reclaim
                return
            if not collected:
                shared.release(self.up, lease, soon=True)
        self.lease = None
        core.held.discard(self)

    def lapsed(self, now: float) -> bool:
        idle = self.idle_s
        # The same sum as the time a waiter wakes for it (``reclaim``): a difference
        # compared with ``idle`` may round below it at that very time.
        return idle is not None and not self.reading and now >= self.touched + idle


# Every Gate's core, for the fork handlers.
_CORES: weakref.WeakSet[GateCore] = weakref.WeakSet()


def _before_fork() -> None:
    # Each lock taken, so that the child copies no state half-changed; nothing waits
    # while holding one, so this waits for a few field updates at most.
    for core in list(_CORES):
        core.lock.acquire()
        _LOCKED.append(core)


def _after_fork_in_parent() -> None:
    while _LOCKED:
        _LOCKED.pop().lock.release()


def _after_fork_in_child() -> None:
    locked = set(_LOCKED)
    _LOCKED.clear()
    for core in list(_CORES):
        if core in locked:
            core._forked()


_LOCKED: list[GateCore] = []
if hasattr(os, "register_at_fork"):  # pragma: no branch - POSIX
    os.register_at_fork(
        before=_before_fork,
        after_in_parent=_after_fork_in_parent,
        after_in_child=_after_fork_in_child,
    )
