"""The records the fleet's operations hand back."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from yieldgate.gate._breaker import BreakerState

__all__ = ["BreakerView", "BucketShape", "FirstReading", "FleetStatistics", "Take"]


class Take(NamedTuple):
    """What ``Fleet.take`` did.

    ``ok``: every amount fitted and was taken; ``seq`` is then the take's place
    in the upstream's send sequence (for ``observe``). Otherwise nothing was
    taken, ``seq`` is 0, ``wait_s`` the longest refill a bucket needs (``inf``
    when an amount exceeds its bucket's whole limit), and ``waits`` names each
    bucket that had no room and its own refill: a take that also spent from
    buckets with room (another model's) need not wait for these.
    """

    ok: bool
    """Whether every amount fitted and was taken."""
    seq: int
    """The take's place in the upstream's send sequence (0 when nothing was taken)."""
    wait_s: float
    """When nothing was taken: the longest refill a bucket needs, in seconds (``inf``: never)."""
    waits: tuple[tuple[str, float], ...] = ()
    """When nothing was taken: ``(bucket, seconds)`` for each bucket that had no room."""


class BucketShape(NamedTuple):
    """A quota bucket as the fleet last observed it: what it counts (``"requests"``,
    ``"tokens"``...), its limit and its refill rate per second."""

    resource: str
    """What the bucket counts: ``"requests"``, ``"tokens"``..."""
    limit: float
    """Its size."""
    rate: float
    """Its refill rate, per second."""


class FirstReading(NamedTuple):
    """What a member with no reading of the quota yet is told (``Fleet.first``):
    ``state`` ``"known"`` (with the fleet's ``shapes``), ``"none"`` (the probe's
    answer carried no quota), ``"mine"`` (this member sends the one probe, and
    tells its answer with ``Fleet.probed``) or ``"other"`` (another member does:
    wait for its reading)."""

    state: str
    """``"known"``, ``"none"``, ``"mine"`` or ``"other"``."""
    shapes: dict[str, BucketShape]
    """The fleet's buckets by key, when ``state`` is ``"known"``."""


class BreakerView(NamedTuple):
    """The fleet's breaker for one upstream.

    ``retry_after_s``: while open, the time until a probe may go (0 otherwise);
    ``probe_out``: a member holds the half-open probe.
    """

    state: BreakerState
    """The breaker's state, as the fleet shares it."""
    retry_after_s: float
    """While open, seconds until a probe may go (0 otherwise)."""
    probe_out: bool
    """Whether a member holds the half-open probe."""


@dataclass(frozen=True, slots=True)
class FleetStatistics:
    """A fleet member's view of Redis.

    ``calls``: operations asked for; ``fallbacks``: those answered ``None``
    (Redis failed, was slower than the budget, or was skipped during an
    outage); ``outages``: times Redis went away; ``rejoins``: times it came back.
    ``config_error``: what Redis refused last, when it refused the fleet's
    credentials or commands (``None`` otherwise): the fleet is not shared until
    it is fixed.
    """

    available: bool
    """Whether Redis is answering now (``False`` during an outage)."""
    calls: int
    """Operations asked for."""
    fallbacks: int
    """Operations answered ``None``: Redis failed, was too slow, or was skipped."""
    outages: int
    """Times Redis went away."""
    rejoins: int
    """Times it came back."""
    config_error: str | None = None
    """What Redis refused last, when it refused credentials or commands; else ``None``."""
