"""The Governor: a hard cap on work in execution, and an honest ``yield`` past it.

Transport-agnostic and synchronous: a front (TCP, HTTP) asks ``try_acquire``
and gets either a ``Slot`` to execute under or a ``Yield`` to send back at
once. By default there is no queue anywhere: nobody ever waits for a slot.

Buffering, on request (``GovernorConfig.max_queued``, ``yieldgate serve
--queue N``): to measure what governing is compared with, the Governor can
buffer as vLLM and TGI do by default. A submit that finds every slot it may
use busy then gets a *waiting* ``Slot`` while fewer than ``max_queued`` wait
(``None``: no bound), and only past that a ``Yield``. A released slot is
handed straight to the first waiter that may use it (highest priority
first, then first come), so arrivals never overtake the queue. The Governor
only keeps the books and calls the waiter's ``on_granted`` callback; the
driver (``Admission.execute``) does the waiting, under the client's
deadline, and releasing a waiting slot withdraws it from the queue. Queued
work is not shown to the admission hook: a buffering server judges nothing.

Hints. A ``Yield`` carries ``retry_hint_ms``: when a slot this submit may use is
expected to free. Each slot in flight has an expected duration (the backend's
own estimate when it gives one, else an exponential moving average of measured
execution times); its expected remaining time is that minus its elapsed time.
A submit that needs *k* slots to free (more than one when its priority may not
use reserved slots) gets the *k*-th smallest remaining time. Work already past
its expected end is given a residual of the average absolute deviation of
execution times (at least a tenth of the mean): it is late, so it is likely to
end soon, but not instantly. Before any execution was measured, the configured
``initial_exec_ms`` is the estimate.

Priorities. ``PriorityPolicy`` keeps slots back from lower priorities:
``high`` may use every slot, ``normal`` all but ``reserved_for_high``, ``low``
all but ``reserved_for_high + reserved_for_normal``; every priority may always
use at least one slot, so a small capacity (during a ramp) never starves it.

Counters only grow, and at every instant
``admitted_total == executed_total + failed_total + cancelled_total + inflight``.

Here: ``Governor`` and the ``Slot`` it hands out. Its config and the records it
is asked and answers with are ``_governor_records`` (re-exported here); the
estimates behind the hints are ``_exec_estimate``.
"""

from __future__ import annotations

import bisect
import heapq
import math
import sys
import time
from collections import Counter, deque
from collections.abc import Callable, Mapping
from typing import Any, Final

from yieldgate.protocol import Priority, YieldReason
from yieldgate.server._exec_estimate import ExecEstimate, cold_hint_ms
from yieldgate.server._governor_records import (
    QUEUE_WAIT_BUCKETS_MS,
    AdmissionHook,
    AdmissionRequest,
    GovernorConfig,
    GovernorStats,
    PriorityPolicy,
    Rejection,
    Yield,
)
from yieldgate.server._slot import Slot, SlotOutcome

__all__ = [
    "AdmissionHook",
    "AdmissionRequest",
    "Governor",
    "GovernorConfig",
    "GovernorStats",
    "PriorityPolicy",
    "Rejection",
    "Slot",
    "Yield",
]

Clock = Callable[[], float]

_BY_RANK: Final = (Priority.HIGH, Priority.NORMAL, Priority.LOW)
# Looked up once: an enum member read through its class costs a lookup per refusal.
_NORMAL: Final = Priority.NORMAL
_SATURATED: Final = YieldReason.SATURATED


class Governor:
    """Admits work into at most ``max_inflight`` slots, or yields at once."""

    def __init__(
        self,
        config: GovernorConfig | None = None,
        *,
        admission_hook: AdmissionHook | None = None,
        clock: Clock = time.monotonic,
    ) -> None:
        self.config = config or GovernorConfig()
        """The cap, the reserved slots and the bounds of the hints."""
        self._policy = self.config.priority
        self._min_hint = self.config.min_hint_ms
        self._max_hint = self.config.max_hint_ms
        self.admission_hook = admission_hook
        """Asked about each submit a free slot could take; its ``Rejection`` yields it early."""
        self._clock = clock
        self._capacity = self.config.max_inflight
        self._saturated_total = 0
        self._slots: set[Slot] = set()
        self._peak = 0
        self._admitted = 0
        self._executed = 0
        self._failed = 0
        self._cancelled = 0
        self._yields: Counter[str] = Counter()
        self._errors: Counter[str] = Counter()
        self._estimate = ExecEstimate(self.config)
        self._cold_until: float | None = None
        self._cold_expected_s = 0.0
        self._shutting_down = False
        self._last_yield = Yield(-1, _SATURATED, 0, 0)  # matches no real yield
        self._set_limits()
        # The queue, when there is one: a deque per priority, highest first. A
        # withdrawn slot stays in its deque (released) until it reaches the head.
        max_queued = self.config.max_queued
        self._queue_room = sys.maxsize if max_queued is None else max_queued
        self._waiting: tuple[deque[Slot], ...] = (deque(), deque(), deque())
        self._waiting_by_rank = [0, 0, 0]  # live waiters, withdrawn ones left out
        self._queued = 0
        self._queued_peak = 0
        self._queued_total = 0
        self._queue_abandoned = 0
        self._queue_wait_ms = 0.0
        self._queue_waits = [0] * (len(QUEUE_WAIT_BUCKETS_MS) + 1)

    # -- state --------------------------------------------------------------

    @property
    def inflight(self) -> int:
        """Submits executing now."""
        return len(self._slots)

    @property
    def queued(self) -> int:
        """Submits waiting for a slot now."""
        return self._queued

    @property
    def capacity(self) -> int:
        """Slots usable now: ``max_inflight`` unless a ramp lowered it."""
        return self._capacity

    @property
    def is_cold(self) -> bool:
        """Whether the backend is warming up: every submit yields ``cold_start``."""
        return self._cold_until is not None

    @property
    def shutting_down(self) -> bool:
        """Whether ``begin_shutdown`` was called: new work is refused."""
        return self._shutting_down

    def set_capacity(self, capacity: int) -> None:
        """Use only ``capacity`` of the ``max_inflight`` slots (a capacity ramp).

        Work already admitted keeps its slots; new work sees the new limit.
        """
        if not 1 <= capacity <= self.config.max_inflight:
            raise ValueError(f"capacity must be in [1, {self.config.max_inflight}], got {capacity}")
        self._capacity = capacity
        self._set_limits()
        if self._queued:
            self._grant()

    def _set_limits(self) -> None:
        # Each priority's limit, worked out once per capacity change, not per submit.
        self._limit_normal = self._policy.limit(Priority.NORMAL, self._capacity)
        self._limit_low = self._policy.limit(Priority.LOW, self._capacity)

    def _limit(self, priority: Priority) -> int:
        if priority is Priority.NORMAL:
            return self._limit_normal
        if priority is Priority.HIGH:
            return self._capacity
        return self._limit_low

    def begin_cold_start(self, expected_s: float) -> None:
        """Yield every submit with ``cold_start`` until ``mark_warm``.

        ``expected_s`` is the honest estimate of how long warming takes; hints
        count down from it.
        """
        if not (expected_s >= 0 and math.isfinite(expected_s)):
            raise ValueError("expected_s must be a finite number >= 0")
        self._cold_expected_s = expected_s
        self._cold_until = self._clock() + expected_s

    def mark_warm(self) -> None:
        """End the cold start: submits are admitted again."""
        self._cold_until = None

    def begin_shutdown(self) -> None:
        """Refuse new work from now on (fronts answer ``shutting_down``)."""
        self._shutting_down = True

    def record_error(self, code: str) -> None:
        """Count an ``error`` reply sent by any front."""
        self._errors[code] += 1

    # -- admission ----------------------------------------------------------

    def refuse(self, priority: Priority = Priority.NORMAL) -> Yield | None:
        """The yield for a submit that cannot be admitted now whatever it is, else ``None``.

        Cold, or every slot this priority may use is busy: the cheap check a
        front makes before it looks at the submit any further. ``None`` does
        not admit anything; ``try_acquire`` still decides (and consults the
        admission hook).
        """
        inflight = len(self._slots)
        if self._cold_until is not None:
            hint = cold_hint_ms(self._cold_until, self._cold_expected_s, self._clock())
            return self._yield(YieldReason.COLD_START, hint, inflight)
        limit = self._limit_normal if priority is _NORMAL else self._limit(priority)
        if inflight < limit:
            return None
        queued = self._queued
        if queued < self._queue_room:
            return None  # there is room to wait: try_acquire queues it
        hint = self._saturated_hint(self._clock(), inflight - limit + 1 + queued)
        return self._yield(_SATURATED, hint, inflight)

    def try_acquire(
        self,
        priority: Priority = Priority.NORMAL,
        *,
        body: str = "",
        params: Mapping[str, Any] | None = None,
        expected_ms: float | None = None,
    ) -> Slot | Yield:
        """Admit into a slot now, or say when to come back. Never waits.

        ``expected_ms`` is the backend's estimate of this work's duration, used
        for hints while it runs; without it the measured average is used. With
        a queue, the slot may be a waiting one (``Slot.is_waiting``).
        """
        refusal = self.refuse(priority)
        if refusal is not None:
            return refusal
        now = self._clock()
        inflight = len(self._slots)
        if self._queue_room and (
            inflight >= self._limit(priority) or (self._queued and self._ahead(priority))
        ):
            return self._enqueue(priority, now, expected_ms)
        if self.admission_hook is not None:
            rejection = self.admission_hook(
                AdmissionRequest(
                    priority=priority,
                    body=body,
                    params=params or {},
                    inflight=inflight,
                    capacity=self._capacity,
                )
            )
            if rejection is not None:
                return self._yield(rejection.reason, rejection.retry_hint_ms, inflight)
        slot = Slot(self, priority, now, expected_ms)
        self._slots.add(slot)
        self._admitted += 1
        if len(self._slots) > self._peak:
            self._peak = len(self._slots)
        return slot

    def _yield(self, reason: YieldReason, hint_ms: float, inflight: int) -> Yield:
        if reason is _SATURATED:
            self._saturated_total += 1  # the hot case: no hashing of an enum member
        else:
            self._yields[reason.value] += 1
        hint = round(hint_ms)
        if hint < self._min_hint:
            hint = self._min_hint
        elif hint > self._max_hint:
            hint = self._max_hint
        last = self._last_yield
        if (
            last.retry_hint_ms == hint
            and last.inflight == inflight
            and last.reason is reason
            and last.max_inflight == self._capacity
        ):
            return last
        # max_inflight is the limit in force: lower than configured while capacity ramps up.
        self._last_yield = last = Yield(hint, reason, inflight, self._capacity)
        return last

    def _saturated_hint(self, now: float, need: int) -> float:
        estimate = self._estimate
        mean = estimate.mean_ms
        residual = estimate.residual_ms
        if need == 1:
            # The common case, on every yield of a saturated server: the soonest end.
            soonest = math.inf
            for slot in self._slots:
                expected = mean if slot.expected_ms is None else slot.expected_ms
                left = expected - (now - slot.started_at) * 1000.0
                if left <= 0:
                    left = residual
                if left < soonest:
                    soonest = left
            return soonest
        remaining = []
        for slot in self._slots:
            expected = mean if slot.expected_ms is None else slot.expected_ms
            left = expected - (now - slot.started_at) * 1000.0
            remaining.append(left if left > 0 else residual)
        if not remaining:
            return mean
        # Capacity may have been lowered below what is in flight: wait for enough to end.
        soonest = heapq.nsmallest(min(need, len(remaining)), remaining)[-1]
        # A queue ahead: each further round of the slots takes a whole execution.
        return soonest + (need - 1) // len(remaining) * mean

    # -- the queue ----------------------------------------------------------

    def _ahead(self, priority: Priority) -> bool:
        """Whether a submit of ``priority`` or higher waits (an arrival goes behind it)."""
        return sum(self._waiting_by_rank[: _BY_RANK.index(priority) + 1]) > 0

    def _enqueue(self, priority: Priority, now: float, expected_ms: float | None) -> Slot:
        slot = Slot(self, priority, now, expected_ms, waiting=True)
        rank = _BY_RANK.index(priority)
        self._waiting[rank].append(slot)
        self._waiting_by_rank[rank] += 1
        self._queued += 1
        self._queued_total += 1
        if self._queued > self._queued_peak:
            self._queued_peak = self._queued
        return slot

    def _head(self) -> Slot | None:
        for waiting in self._waiting:
            while waiting:
                slot = waiting[0]
                if not slot._released:
                    return slot
                waiting.popleft()  # withdrawn while it waited
        return None

    def _grant(self) -> None:
        """Hand free slots to the waiters that may use them, in queue order."""
        now = self._clock()
        while self._queued:
            slot = self._head()
            if slot is None or len(self._slots) >= self._limit(slot.priority):
                # A lower priority's limit is never higher: nobody behind fits either.
                return
            rank = _BY_RANK.index(slot.priority)
            self._waiting[rank].popleft()
            self._waiting_by_rank[rank] -= 1
            self._queued -= 1
            self._waited(slot, now)
            slot.is_waiting = False
            slot.started_at = now
            self._slots.add(slot)
            self._admitted += 1
            if len(self._slots) > self._peak:
                self._peak = len(self._slots)
            wake = slot._wake
            if wake is not None:
                slot._wake = None
                wake()

    def _withdraw(self, slot: Slot) -> None:
        # Left in its deque, released: skipped once it reaches the head.
        rank = _BY_RANK.index(slot.priority)
        self._waiting_by_rank[rank] -= 1
        if not self._waiting_by_rank[rank]:
            self._waiting[rank].clear()  # only withdrawn ones were left
        self._queued -= 1
        self._queue_abandoned += 1
        self._waited(slot, self._clock())

    def _waited(self, slot: Slot, now: float) -> None:
        assert slot.queued_at is not None
        waited_ms = (now - slot.queued_at) * 1000.0
        self._queue_wait_ms += waited_ms
        self._queue_waits[bisect.bisect_left(QUEUE_WAIT_BUCKETS_MS, waited_ms)] += 1

    # -- release ------------------------------------------------------------

    def _release(self, slot: Slot, outcome: SlotOutcome) -> float:
        if slot.is_waiting:
            self._withdraw(slot)  # never admitted: nothing ran, nothing to count
            return 0.0
        self._slots.discard(slot)
        if self._queued:
            self._grant()
        elapsed_ms = (self._clock() - slot.started_at) * 1000.0
        if outcome == "cancelled":
            self._cancelled += 1
        else:
            if outcome == "executed":
                self._executed += 1
            else:
                self._failed += 1
            self._estimate.observe(elapsed_ms)
        return elapsed_ms

    def _yields_by_reason(self) -> dict[str, int]:
        counts = dict(self._yields)
        if self._saturated_total:
            counts[YieldReason.SATURATED.value] = self._saturated_total
        return counts

    def stats(self) -> GovernorStats:
        """A snapshot of the counters (what the ``stats`` op reports)."""
        return GovernorStats(
            inflight=len(self._slots),
            max_inflight=self.config.max_inflight,
            capacity=self._capacity,
            inflight_peak=self._peak,
            admitted_total=self._admitted,
            executed_total=self._executed,
            failed_total=self._failed,
            cancelled_total=self._cancelled,
            yielded_total=sum(self._yields.values()) + self._saturated_total,
            errors_total=sum(self._errors.values()),
            yielded_by_reason=self._yields_by_reason(),
            errors_by_code=dict(self._errors),
            exec_ms_ewma=self._estimate.ewma,
            exec_ms_total=self._estimate.total_ms,
            cold=self.is_cold,
            shutting_down=self._shutting_down,
            max_queued=self.config.max_queued,
            queued=self._queued,
            queued_peak=self._queued_peak,
            queued_total=self._queued_total,
            queue_abandoned_total=self._queue_abandoned,
            queue_wait_ms_total=self._queue_wait_ms,
            queue_wait_buckets=tuple(self._queue_waits),
        )
