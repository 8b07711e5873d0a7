"""The Governor's records: what it is configured with, asked, and hands out.

``GovernorConfig`` and its ``PriorityPolicy``; what an admission hook sees
(``AdmissionRequest``) and answers (``Rejection``); the ``Yield`` a refused
submit gets and the ``GovernorStats`` snapshot. Frozen dataclasses that hold
no state of a Governor's and take none of its decisions (``governor``, which
re-exports them). Apart because they are a vocabulary of their own, which the
fronts, the backends and the harness speak without the admission logic.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from yieldgate.protocol import Priority, YieldReason

__all__ = [
    "QUEUE_WAIT_BUCKETS_MS",
    "AdmissionHook",
    "AdmissionRequest",
    "GovernorConfig",
    "GovernorStats",
    "PriorityPolicy",
    "Rejection",
    "Yield",
]

#: Upper bounds (ms) of the buckets of time spent queued; the last bucket has none.
QUEUE_WAIT_BUCKETS_MS: Final = (1, 5, 10, 25, 50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000)


@dataclass(frozen=True, slots=True, kw_only=True)
class PriorityPolicy:
    """How many slots are kept back from lower priorities.

    With ``max_inflight=8, reserved_for_high=2, reserved_for_normal=2``: high
    may hold 8 slots, normal 6 and low 4 (counting all work in flight).
    """

    reserved_for_high: int = 0
    """Slots only high priority may use (default: 0)."""
    reserved_for_normal: int = 0
    """Slots, beyond those, that low priority may not use (default: 0)."""

    def __post_init__(self) -> None:
        if self.reserved_for_high < 0 or self.reserved_for_normal < 0:
            raise ValueError("reserved slot counts must be >= 0")

    def limit(self, priority: Priority, capacity: int) -> int:
        """The number of in-flight slots below which ``priority`` is admitted."""
        if priority is Priority.HIGH:
            return capacity
        reserved = self.reserved_for_high
        if priority is Priority.LOW:
            reserved += self.reserved_for_normal
        return max(1, capacity - reserved)


@dataclass(frozen=True, slots=True, kw_only=True)
class GovernorConfig:
    """The Governor's policy. All times are in milliseconds."""

    max_inflight: int = 4
    """The hard cap on submits executing at once (default: 4)."""
    priority: PriorityPolicy = field(default_factory=PriorityPolicy)
    """Slots kept back from lower priorities."""
    initial_exec_ms: float = 100.0
    """The execution time hints assume before any was measured (default: 100)."""
    ewma_alpha: float = 0.2
    """The weight of each new measurement in the moving average (default: 0.2)."""
    min_hint_ms: int = 1
    """The shortest ``retry_hint_ms`` sent (default: 1)."""
    max_hint_ms: int = 300_000
    """The longest ``retry_hint_ms`` sent (default: 300000, five minutes)."""
    # Buffering hides overload; it is here to be measured.
    max_queued: int | None = 0
    """Submits that may wait for a slot: 0 (the default) yields at once; ``None``: no bound."""

    def __post_init__(self) -> None:
        if self.max_queued is not None and self.max_queued < 0:
            raise ValueError(f"max_queued must be >= 0 or None, got {self.max_queued}")
        if self.max_inflight < 1:
            raise ValueError(f"max_inflight must be >= 1, got {self.max_inflight}")
        reserved = self.priority.reserved_for_high + self.priority.reserved_for_normal
        if reserved >= self.max_inflight:
            raise ValueError(
                f"reserved slots ({reserved}) must leave low priority at least one of "
                f"max_inflight={self.max_inflight}"
            )
        if not (self.initial_exec_ms > 0 and math.isfinite(self.initial_exec_ms)):
            raise ValueError("initial_exec_ms must be a positive number")
        if not 0.0 < self.ewma_alpha <= 1.0:
            raise ValueError("ewma_alpha must be in (0, 1]")
        if not 0 <= self.min_hint_ms <= self.max_hint_ms:
            raise ValueError("need 0 <= min_hint_ms <= max_hint_ms")


@dataclass(frozen=True, slots=True, kw_only=True)
class AdmissionRequest:
    """What an admission hook sees of a submit that a free slot could take."""

    priority: Priority
    """The submit's priority."""
    body: str
    """The submit's body."""
    params: Mapping[str, Any]
    """The submit's backend parameters."""
    inflight: int
    """Submits executing now."""
    capacity: int
    """Slots usable now: ``max_inflight``, or less during a capacity ramp."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Rejection:
    """An admission hook's refusal: the submit is yielded with this reason and hint."""

    retry_hint_ms: int
    """When the client should come back, in milliseconds."""
    reason: YieldReason = YieldReason.SLO
    """The yield's reason (default: ``slo``)."""


AdmissionHook = Callable[[AdmissionRequest], Rejection | None]


@dataclass(frozen=True, slots=True)
class Yield:
    """A submit that was not admitted; send it back at once.

    A saturated server refuses thousands of submits a second with the same
    hint (it moves by the millisecond), so the Governor hands back the same
    ``Yield`` for as long as its fields would not change.
    """

    retry_hint_ms: int
    """When a slot this submit may use is expected to free, in milliseconds."""
    reason: YieldReason
    """Why it was not admitted."""
    inflight: int
    """Submits executing when it was decided."""
    max_inflight: int
    """The slots in force then: the cap, or less during a capacity ramp."""


@dataclass(frozen=True, slots=True, kw_only=True)
class GovernorStats:
    """A snapshot of the Governor's counters."""

    inflight: int
    """Submits executing now; never above ``max_inflight``."""
    max_inflight: int
    """The configured cap."""
    capacity: int
    """Slots usable now: ``max_inflight``, or less during a capacity ramp."""
    inflight_peak: int
    """The highest ``inflight`` since start."""
    admitted_total: int
    """Submits admitted into a slot."""
    executed_total: int
    """Admitted submits that ran to an ``ok``."""
    failed_total: int
    """Admitted submits that ended in ``backend_error``."""
    cancelled_total: int
    """Admitted submits stopped before the end (cancelled, deadline, shutdown...)."""
    yielded_total: int
    """``yield`` replies, for any reason."""
    errors_total: int
    """``error`` replies, of any code."""
    yielded_by_reason: Mapping[str, int]
    """Yields per reason; a reason appears once it has been used."""
    errors_by_code: Mapping[str, int]
    """Errors per code; a code appears once it has been used."""
    exec_ms_ewma: float | None
    """The moving average of measured execution times, in ms; ``None`` until one."""
    exec_ms_total: float
    """The sum of measured execution times, in ms."""
    cold: bool
    """Whether the backend is still warming up (every submit yields ``cold_start``)."""
    shutting_down: bool
    """Whether a graceful shutdown has begun."""
    max_queued: int | None = 0
    """Submits that may wait for a slot (0: none; ``None``: no bound)."""
    queued: int = 0
    """Submits waiting for a slot now."""
    queued_peak: int = 0
    """The highest ``queued`` since start."""
    queued_total: int = 0
    """Submits that waited for a slot."""
    queue_abandoned_total: int = 0
    """Queued submits that left before a slot (deadline, cancel, shutdown)."""
    queue_wait_ms_total: float = 0.0
    """Time spent queued, in ms, summed over the submits that left the queue."""
    queue_wait_buckets: tuple[int, ...] = (0,) * (len(QUEUE_WAIT_BUCKETS_MS) + 1)
    """Submits that left the queue (given a slot or abandoned), per bucket of
    ``QUEUE_WAIT_BUCKETS_MS`` and one past the last bound."""

    def as_dict(self) -> dict[str, Any]:
        """The counters as the ``stats`` op reports them."""
        return {
            "inflight": self.inflight,
            "max_inflight": self.max_inflight,
            "capacity": self.capacity,
            "inflight_peak": self.inflight_peak,
            "admitted_total": self.admitted_total,
            "executed_total": self.executed_total,
            "failed_total": self.failed_total,
            "cancelled_total": self.cancelled_total,
            "yielded_total": self.yielded_total,
            "errors_total": self.errors_total,
            "yielded_by_reason": dict(self.yielded_by_reason),
            "errors_by_code": dict(self.errors_by_code),
            "exec_ms_ewma": None if self.exec_ms_ewma is None else round(self.exec_ms_ewma, 3),
            "exec_ms_total": round(self.exec_ms_total, 3),
            "cold": self.cold,
            "shutting_down": self.shutting_down,
            "max_queued": self.max_queued,
            "queued": self.queued,
            "queued_peak": self.queued_peak,
            "queued_total": self.queued_total,
            "queue_abandoned_total": self.queue_abandoned_total,
            "queue_wait_ms_total": round(self.queue_wait_ms_total, 3),
            "queue_waits_total": sum(self.queue_wait_buckets),
        }
