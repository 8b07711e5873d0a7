"""An attempt's claim on its upstream's quota, and the one ``BLIND`` claim."""

from __future__ import annotations

from collections.abc import Callable

from yieldgate.gate._cost import ONE_REQUEST, Cost
from yieldgate.protocol import Priority

__all__ = ["BLIND", "Claim"]


class Claim:
    """One attempt's cost, taken (or to be taken) from an upstream's quota.

    Built for every attempt: only its cost, priority and arrival are set here;
    the rest stays at the class's defaults until used (most never are).
    """

    number = 0  # its place among the sends, once sent
    started = 0.0  # when it was taken, then sent
    taken = False
    local = False  # taken from this process's buckets
    fleet = False  # taken while a fleet's buckets paced
    wake: Callable[[], None] | None = None
    # In a fleet: the send number the fleet's take gave it (0: none), what it took
    # there, and whether its answer was reported.
    seq = 0
    wants: list[tuple[str, float, float, float]] = []  # noqa: RUF012 - replaced, never mutated
    observed = False

    def __init__(self, cost: Cost, priority: Priority, key: float) -> None:
        self.cost = cost
        self.priority = priority
        self.key = key  # arrival: the call's start

    @property
    def scope(self) -> str:
        return self.cost.scope


BLIND = Claim(ONE_REQUEST, Priority.NORMAL, 0.0)
"""The claim of every attempt sent while its quota knows no bucket (the common case
of a Gate with nothing to pace by): nothing to take, and in flight it is only a
sum (``Quota.blind``), not an entry. Never changed."""
