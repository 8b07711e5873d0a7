"""The ``Slot`` a Governor hands out: one unit of admitted (or queued) work."""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, Protocol

from yieldgate.protocol import Priority

__all__ = ["Slot", "SlotOutcome"]

SlotOutcome = Literal["executed", "failed", "cancelled"]


class _Owner(Protocol):
    """What a slot needs of the Governor that handed it out (which imports this module)."""

    _clock: Callable[[], float]

    def _release(self, slot: Slot, outcome: SlotOutcome) -> float: ...


class Slot:
    """One admitted unit of work. Release it exactly once, however the work ends.

    With a queue, a slot may be handed out *waiting* (``is_waiting``): it is
    admitted once a slot frees (``on_granted`` says when), and releasing it
    before that withdraws it from the queue.
    """

    __slots__ = (
        "_governor",
        "_released",
        "_wake",
        "expected_ms",
        "is_waiting",
        "priority",
        "queued_at",
        "started_at",
    )

    def __init__(
        self,
        governor: _Owner,
        priority: Priority,
        started_at: float,
        expected_ms: float | None,
        *,
        waiting: bool = False,
    ) -> None:
        self._governor = governor
        self._released = False
        self._wake: Callable[[], None] | None = None
        self.priority = priority
        """The priority of the submit it was admitted for."""
        self.started_at = started_at
        """When it was admitted, on the Governor's clock (while waiting: when it was queued)."""
        self.queued_at = started_at if waiting else None
        """When it was queued, on the Governor's clock; ``None``: it never waited."""
        self.expected_ms = expected_ms
        """The backend's estimate of its work, in ms; ``None``: the moving average stands in."""
        self.is_waiting = waiting
        """Whether it is still waiting in the queue for a slot to free."""

    @property
    def released(self) -> bool:
        """Whether the slot has been released (a waiting one: withdrawn from the queue)."""
        return self._released

    def on_granted(self, wake: Callable[[], None]) -> None:
        """Call ``wake`` (once, synchronously) when this waiting slot is admitted."""
        self._wake = wake

    def elapsed_ms(self) -> float:
        """Time since admission, on the Governor's clock."""
        return (self._governor._clock() - self.started_at) * 1000.0

    def release(self, outcome: SlotOutcome) -> float:
        """Free the slot and return the elapsed time in ms.

        ``executed`` and ``failed`` executions are measured into the moving
        average; ``cancelled`` ones are not (they say nothing about how long
        the work takes). A second release is a no-op that returns 0.
        """
        if self._released:
            return 0.0
        self._released = True
        return self._governor._release(self, outcome)
