"""``Fleet``: one Gate's shared state in Redis, each operation one bounded round trip.

``Fleet`` is its groups of operations, one module each: the quota buckets
(``_buckets``), hint holds (``_holds``), in-flight leases (``_leases``),
membership (``_members``), the retry budget (``_budget``), the breaker
(``_breaker``) and the audit (``_audit``). Each operation is built as an
``Op`` and run by the two drivers, ``Fleet._run`` (sync) and ``Fleet._arun``
(asyncio), in ``_driver``. Here: the constructor, the statistics and the
lifecycle.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import secrets
import socket
import time
import weakref
from collections.abc import Callable
from types import TracebackType
from typing import Self

from yieldgate.fleet._audit import AuditOps
from yieldgate.fleet._breaker import BreakerOps
from yieldgate.fleet._buckets import BucketOps
from yieldgate.fleet._budget import BudgetOps
from yieldgate.fleet._driver import AsyncClient, SyncClient, check_number
from yieldgate.fleet._health import Health
from yieldgate.fleet._holds import HoldOps
from yieldgate.fleet._keys import Keys, check_name
from yieldgate.fleet._leases import LeaseOps
from yieldgate.fleet._members import MemberOps
from yieldgate.fleet._records import FleetStatistics

__all__ = ["AsyncClient", "Fleet", "SyncClient"]


def _default_member() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


# The groups last to first: the API reference lists a class's inherited members from
# its last base to its first, and the groups read best buckets first.
class Fleet(AuditOps, BreakerOps, BudgetOps, MemberOps, LeaseOps, HoldOps, BucketOps):
    """One Gate's state shared with the other members of its fleet, in Redis (or Valkey).

    ``shared`` is a URL (``redis://host:port/db``, ``rediss://`` for TLS,
    ``unix://``; a password as ``redis://user:password@host``), or a pair
    ``(sync_client, async_client)`` of ready redis-py clients (plain or
    cluster; either may be ``None``). Clients made from a URL are the
    fleet's own (closed by ``close`` / ``aclose``), with no retries and the
    sync one's socket timeouts set to ``budget_s``; a pair passed in stays the
    caller's, as configured.

    ``gate`` names the Gate (keys are ``{prefix}:{gate}:{{upstream}}:...``),
    ``member`` this process (default: host, pid and a random tag).
    ``budget_s`` bounds every operation (an asyncio one in Redis's time: what
    the event loop spent on other work meanwhile is left out, up to
    ``max(20 x budget_s, 1 s)`` in all). Until Redis first answers this
    member, an operation may take ``join_s`` instead (the sync client made from
    a URL has a twin with those time-outs; a pair passed in keeps its own): a member that has
    never reached the fleet knows nothing of it (not even how many share the
    quota), and going on alone for a slow first answer would spend the whole
    quota as if it were the only member. ``lease_ttl_s`` is how long a lease
    or a membership lasts without renewal. After a failure Redis is skipped
    for ``backoff_s``, doubling to ``max_backoff_s`` while it stays away.

    Every operation has an async form (``take``) and a sync one
    (``take_sync``), each one round trip, and each returns ``None`` when
    Redis is unavailable, slower than the budget, or fails: it never raises
    a Redis error. Bad arguments raise ``ValueError`` before any I/O. The
    async forms run on asyncio's event loop; elsewhere (trio) they run the
    sync form in a worker thread.
    """

    def __init__(
        self,
        shared: str | tuple[SyncClient | None, AsyncClient | None],
        *,
        gate: str,
        prefix: str = "yieldgate",
        budget_s: float = 0.25,
        join_s: float = 5.0,
        member: str | None = None,
        lease_ttl_s: float = 10.0,
        backoff_s: float = 1.0,
        max_backoff_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.keys = Keys(prefix, gate)
        """Names the Redis keys of this Gate's shared state (``{prefix}:{gate}:...``)."""
        self.gate = gate
        """The name of the Gate whose state this is, shared by every member."""
        self.budget_s = check_number("budget_s", budget_s, positive=True)
        """The longest one operation may take, in seconds, before it answers ``None``."""
        self.join_s = max(check_number("join_s", join_s), self.budget_s)
        """The longest an operation may take before Redis first answered this member
        (at least ``budget_s``)."""
        self.lease_ttl_s = check_number("lease_ttl_s", lease_ttl_s, positive=True)
        """Seconds a lease or a membership lasts without renewal."""
        check_number("backoff_s", backoff_s, positive=True)
        if not (check_number("max_backoff_s", max_backoff_s) >= backoff_s):
            raise ValueError("max_backoff_s must be >= backoff_s")
        self.member = _default_member() if member is None else check_name("member", member)
        """This member's name (default: host, pid and a random tag)."""
        self._own_member = member is None
        self._health = Health(gate, backoff_s=backoff_s, max_backoff_s=max_backoff_s, clock=clock)
        self._leases = itertools.count(1)
        self._open(shared)
        _FLEETS.add(self)

    def _forked(self) -> None:
        """In a forked child: a member of its own (the parent's name, with its lease
        numbers, would collide with the parent's leases), and no asyncio client of the
        parent's loops. A ``member`` given by name is the caller's to keep apart."""
        if self._own_member:
            self.member = _default_member()
            self._leases = itertools.count(1)
        self._async_clients = {}

    def __repr__(self) -> str:
        return f"<Fleet {self.keys.base!r} member={self.member!r}>"

    def statistics(self) -> FleetStatistics:
        """How this member's calls to Redis went."""
        h = self._health
        return FleetStatistics(
            available=h.available,
            calls=h.calls,
            fallbacks=h.fallbacks,
            outages=h.outages,
            rejoins=h.rejoins,
            config_error=h.config_error,
        )

    def close(self) -> None:
        """Close the clients made from the URL (not a pair passed in); every later
        operation returns ``None``. Async clients need ``aclose``."""
        self._closed = True
        if self._url is not None and self._sync is not None:
            self._sync.close()
        if self._sync_join is not None:
            self._sync_join.close()

    async def aclose(self) -> None:
        """``close``, and close this event loop's client made from the URL."""
        self.close()
        clients, self._async_clients = self._async_clients, {}
        if self._url is None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        entry = clients.get(loop)
        if entry is not None:
            await entry[0].aclose()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()


# Every fleet, for the fork handler.
_FLEETS: weakref.WeakSet[Fleet] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for fleet in list(_FLEETS):
        fleet._forked()


if hasattr(os, "register_at_fork"):  # pragma: no branch - POSIX
    os.register_at_fork(after_in_child=_after_fork_in_child)
