"""An attempt's claim on its upstream's quota, and the one ``BLIND`` claim."""

from __future__ import annotations

import math
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
    # Held by a hold of its scope (``_quota_lanes``): when it was released from one
    # (a later hint holds it again), and the latest it may go and still meet its
    # call's deadline (never before the hint).
    passed = -math.inf
    not_after: float | None = None
    # In a fleet: the send number the fleet's take gave it (0: none), what it took
    # there, and what of that the fleet still counts unseen, bucket by bucket (each
    # settled by a reading of its bucket, the rest when the attempt ends; ``None``:
    # nothing, or all settled).
    seq = 0
    wants: list[tuple[str, float, float, float]] = []  # noqa: RUF012 - replaced, never mutated
    unseen: dict[str, float] | None = None

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
