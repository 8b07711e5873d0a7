"""A fleet's shared state in Redis: many processes and hosts, one quota, one upstream.

``Fleet`` is the layer a Gate's drivers call (the core is sans-IO and never
waits under its lock): each operation is one round trip to Redis (or Valkey),
one ``EVALSHA`` of a Lua script or one plain command, atomic on the server,
bounded by a small time budget, in an async and a sync form. Each returns
``None`` when Redis is unavailable, too slow or failing, and never raises a
Redis error: the Gate then goes on alone, at a conservative local share.

What is shared, per upstream:

- **Quota buckets** (``take``, ``refund``, ``observe``, ``finished``, ``settle``,
  ``shapes``): the
  provider's request and token buckets, so the fleet paces as one, with the
  core's accounting of readings against sends not yet answered.
- **The first reading** (``first``, ``probed``): before any member has had an
  answer, one member's first request probes the quota while the others wait
  for its reading.
- **Hint holds** (``hold``, ``holds``): a yield or a 429 seen by one member
  holds every member's attempts at that priority and below.
- **In-flight leases** (``acquire``, ``release``, ``renew``): a fleet-wide cap,
  as leases with a time to live, so a member killed holding them loses them.
- **The retry budget** (``deposit``, ``withdraw``, ``refund_retry``).
- **The breaker** (``report``, ``breaker``, ``claim_probe``).
- **Membership** (``heartbeat``, ``members``, ``leave``): how many members are
  alive, for the local share to fall back to.

Choices:

- **Redis's clock.** Every script reads ``TIME``; hosts' clocks never meet,
  and results are durations (seconds), never instants.
- **The breaker is a record of our own, not pybreaker's ``CircuitRedisStorage``.**
  That storage is synchronous, costs a round trip per attribute read
  (pybreaker reads ``current_state`` several times per call, which the Gate
  does under its lock), has no time bound, and stamps ``opened_at`` with
  each host's wall clock, while the Gate's breaker runs on a monotonic clock
  and adds tickets and a single probe around pybreaker. So the fleet keeps
  a tiny record instead: one script updates it from a verdict and answers
  the state, the time until a probe, and whether one is out; the
  fleet-wide half-open probe is a ``SET NX`` key with a TTL, so a probe
  whose member died lapses.
- **Holds are combined when written.** A hold at rank ``r`` covers ranks
  0 (lowest priority) to ``r``, as in the window; ``hold`` extends each of
  those ranks' ends, so ``holds`` reads one number per rank.
- **Membership is a sorted set** (member -> expiry), not a key per member:
  counting it is one command, also on a cluster (no ``SCAN``).
- **A circuit to Redis itself.** After a failure, calls skip Redis for a
  back-off (1 s, doubling to 30 s) and answer ``None`` at once, so a dead
  Redis costs nothing per call; then one call tries again. One warning per
  outage and one info on rejoining, on the ``yieldgate.fleet`` logger.
- **Scripts survive restarts.** Scripts are registered once per client and
  called with ``EVALSHA``; a ``NOSCRIPT`` (a restarted or failed-over Redis)
  loads the script and calls it again.

Key layout (``docs/fleet.md`` has the details): ``{prefix}:{gate}:{{upstream}}:...``,
the upstream's name as a Redis Cluster hash tag, every key with an expiry.

This package imports redis-py (``pip install yieldgate[fleet]``); ``import
yieldgate`` never imports it.
"""

from __future__ import annotations

from yieldgate.fleet import _extra  # noqa: F401 - first: without redis, a clear error
from yieldgate.fleet._fleet import AsyncClient, Fleet, SyncClient
from yieldgate.fleet._records import (
    BreakerView,
    BucketShape,
    FirstReading,
    FleetStatistics,
    Take,
)

__all__ = [
    "AsyncClient",
    "BreakerView",
    "BucketShape",
    "FirstReading",
    "Fleet",
    "FleetStatistics",
    "SyncClient",
    "Take",
]
