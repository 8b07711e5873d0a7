"""``Fleet``: one Gate's shared state in Redis, each operation one bounded round trip.

Every operation is built once, as an ``_Op`` (a script or a command, its keys
and arguments, and how to read the reply), and run by one of two drivers:
``_run`` on the sync client, ``_arun`` on the asyncio client. Both ask the
``Health`` circuit first, bound the call by the time budget and turn every
failure into ``None``.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import os
import secrets
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Generic, Literal, Self, TypeAlias, TypeVar

import anyio.to_thread
import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.cluster
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.commands.core import AsyncScript, Script
from redis.retry import Retry

from yieldgate.fleet._health import Health, Pass
from yieldgate.fleet._keys import Keys, check_name
from yieldgate.fleet._records import BreakerView, BucketShape, FleetStatistics, Take
from yieldgate.fleet._scripts import SCRIPTS
from yieldgate.gate._breaker import BreakerState
from yieldgate.gate._policy import BreakerPolicy, RetryBudgetPolicy

__all__ = ["AsyncClient", "Fleet", "SyncClient"]

SyncClient: TypeAlias = "redis.Redis | redis.cluster.RedisCluster"
AsyncClient: TypeAlias = "redis.asyncio.Redis | redis.asyncio.cluster.RedisCluster"

T = TypeVar("T")

_SCHEMES = ("redis://", "rediss://", "unix://")
# Holds cover ranks 0 (the lowest priority) up to the rank given; 64 is plenty.
_MAX_RANK = 63


@dataclass(frozen=True, slots=True)
class _Op(Generic[T]):
    """One round trip: a script by name (or, ``command``, a client's method for a
    plain command), and its reply's reader."""

    name: str
    keys: tuple[str, ...]
    args: tuple[str | int | float, ...]
    decode: Callable[[Any], T]
    command: bool = False


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _flag(value: Any) -> bool:
    return bool(int(value))


def _number(what: str, value: float, *, positive: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{what} must be a finite number, got {value!r}")
    if value < 0 or (positive and value == 0):
        raise ValueError(f"{what} must be {'> 0' if positive else '>= 0'}, got {value!r}")
    return value


def _count(what: str, value: int, *, least: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"{what} must be an integer >= {least}, got {value!r}")
    return value


def _default_member() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


class Fleet:
    """One Gate's state shared with the other members of its fleet, in Redis (or Valkey).

    ``shared`` is a URL (``redis://host:port/db``, ``rediss://`` for TLS,
    ``unix://``; a password as ``redis://user:password@host``), or a pair
    ``(sync_client, async_client)`` of ready redis-py clients (plain or
    cluster; either may be ``None``). Clients made from a URL are the
    fleet's own (closed by ``close`` / ``aclose``), with their socket
    timeouts set to ``budget_s`` and no retries; a pair passed in stays the
    caller's, as configured.

    ``gate`` names the Gate (keys are ``{prefix}:{gate}:{{upstream}}:...``),
    ``member`` this process (default: host, pid and a random tag).
    ``budget_s`` bounds every operation; ``lease_ttl_s`` is how long a lease
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
        budget_s: float = 0.05,
        member: str | None = None,
        lease_ttl_s: float = 10.0,
        backoff_s: float = 1.0,
        max_backoff_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.keys = Keys(prefix, gate)
        self.gate = gate
        self.budget_s = _number("budget_s", budget_s, positive=True)
        self.lease_ttl_s = _number("lease_ttl_s", lease_ttl_s, positive=True)
        _number("backoff_s", backoff_s, positive=True)
        if not (_number("max_backoff_s", max_backoff_s) >= backoff_s):
            raise ValueError("max_backoff_s must be >= backoff_s")
        self.member = _default_member() if member is None else check_name("member", member)
        self._health = Health(gate, backoff_s=backoff_s, max_backoff_s=max_backoff_s, clock=clock)
        self._leases = itertools.count(1)
        self._closed = False
        self._url: str | None = None
        self._async_clients: dict[asyncio.AbstractEventLoop, tuple[AsyncClient, dict[str, Any]]]
        self._async_clients = {}
        self._given_async: AsyncClient | None = None
        self._given_async_scripts: dict[str, AsyncScript] = {}
        if isinstance(shared, str):
            if not shared.startswith(_SCHEMES):
                raise ValueError(f"shared must be a redis://, rediss:// or unix:// URL: {shared!r}")
            self._url = shared
            self._sync: SyncClient | None = redis.Redis.from_url(
                shared, retry=Retry(NoBackoff(), 0), **self._client_options()
            )
        else:
            if not (isinstance(shared, tuple) and len(shared) == 2):
                raise ValueError("shared must be a URL or a (sync_client, async_client) pair")
            self._sync, self._given_async = shared
            if self._given_async is not None:
                self._given_async_scripts = self._register_async(self._given_async)
        self._sync_scripts: dict[str, Script] = {}
        if self._sync is not None:
            self._sync_scripts = {n: self._sync.register_script(s) for n, s in SCRIPTS.items()}

    def _client_options(self) -> dict[str, Any]:
        return {
            "socket_timeout": self.budget_s,
            "socket_connect_timeout": self.budget_s,
            "health_check_interval": 0,
        }

    @staticmethod
    def _register_async(client: AsyncClient) -> dict[str, AsyncScript]:
        return {name: client.register_script(source) for name, source in SCRIPTS.items()}

    def __repr__(self) -> str:
        return f"<Fleet {self.keys.base!r} member={self.member!r}>"

    # -- drivers -----------------------------------------------------------------

    def _run(self, op: _Op[T]) -> T | None:
        client = self._sync
        if self._closed or client is None:
            return None
        ticket = self._health.admit()
        if ticket is Pass.SKIP:
            return None
        try:
            if op.command:
                raw = getattr(client, op.name)(*op.keys, *op.args)
            else:
                raw = self._sync_scripts[op.name](keys=op.keys, args=op.args)
            result = op.decode(raw)
        except Exception as exc:
            self._health.failed(ticket, exc)
            return None
        except BaseException:
            self._health.abandoned(ticket)
            raise
        self._health.succeeded(ticket)
        return result

    def _async_for(
        self, loop: asyncio.AbstractEventLoop
    ) -> tuple[AsyncClient, dict[str, Any]] | None:
        """The asyncio client for ``loop``: the one given, or one per loop from the URL
        (an asyncio client's connections belong to the loop that made them)."""
        if self._given_async is not None:
            return self._given_async, self._given_async_scripts
        if self._url is None:
            return None
        entry = self._async_clients.get(loop)
        if entry is None:
            for other in [other for other in self._async_clients if other.is_closed()]:
                del self._async_clients[other]
            client = redis.asyncio.Redis.from_url(
                self._url, retry=AsyncRetry(NoBackoff(), 0), **self._client_options()
            )
            entry = client, self._register_async(client)
            self._async_clients[loop] = entry
        return entry

    async def _arun(self, op: _Op[T]) -> T | None:
        if self._closed:
            return None
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # not asyncio (trio): the sync client, off the event loop
            return await anyio.to_thread.run_sync(self._run, op)
        entry = self._async_for(loop)
        if entry is None:
            return await anyio.to_thread.run_sync(self._run, op)
        client, scripts = entry
        ticket = self._health.admit()
        if ticket is Pass.SKIP:
            return None
        try:
            async with asyncio.timeout(self.budget_s):
                if op.command:
                    raw = await getattr(client, op.name)(*op.keys, *op.args)
                else:
                    raw = await scripts[op.name](keys=op.keys, args=op.args)
            result = op.decode(raw)
        except Exception as exc:  # TimeoutError from the budget among them
            self._health.failed(ticket, exc)
            return None
        except BaseException:
            self._health.abandoned(ticket)
            raise
        self._health.succeeded(ticket)
        return result

    # -- quota buckets -----------------------------------------------------------

    def _take(self, upstream: str, wants: Sequence[tuple[str, float, float, float]]) -> _Op[Take]:
        keys = [self.keys.seq(upstream)]
        args: list[float] = []
        for bucket, amount, limit, rate in wants:
            keys.append(self.keys.bucket(upstream, bucket))
            args += (
                _number("amount", amount),
                _number("limit", limit, positive=True),
                _number("rate", rate),
            )

        def decode(raw: Any) -> Take:
            return Take(_flag(raw[0]), int(raw[1]), float(raw[2]))

        return _Op("take", tuple(keys), tuple(args), decode)

    async def take(
        self, upstream: str, wants: Sequence[tuple[str, float, float, float]]
    ) -> Take | None:
        """Take ``amount`` from each bucket of ``wants`` (``(bucket, amount, limit, rate)``),
        all or nothing.

        Each bucket is refilled to now (Redis's time) at its rate, up to its
        limit; a missing one is created full, with the ``limit`` and ``rate``
        given (those of an existing bucket are its own, from the last
        ``observe``). If every amount fits, all are deducted and counted as
        unseen (in flight, not answered yet), and the take gets the
        upstream's next send number: ``Take(True, seq, 0.0)``. Otherwise
        nothing changes: ``Take(False, 0, wait_s)``, the longest refill needed.
        With no ``wants`` it only hands out a send number.
        """
        return await self._arun(self._take(upstream, wants))

    def take_sync(
        self, upstream: str, wants: Sequence[tuple[str, float, float, float]]
    ) -> Take | None:
        """``take``, blocking (within the budget)."""
        return self._run(self._take(upstream, wants))

    def _amounts(self, name: str, upstream: str, amounts: Sequence[tuple[str, float]]) -> _Op[bool]:
        keys = tuple(self.keys.bucket(upstream, bucket) for bucket, _ in amounts)
        args = tuple(_number("amount", amount) for _, amount in amounts)
        return _Op(name, keys, args, _flag)

    async def refund(self, upstream: str, amounts: Sequence[tuple[str, float]]) -> bool | None:
        """Give back a take that was never sent: each bucket's level grows by its
        amount (up to its limit) and its unseen count shrinks by it."""
        return await self._arun(self._amounts("refund", upstream, amounts))

    def refund_sync(self, upstream: str, amounts: Sequence[tuple[str, float]]) -> bool | None:
        """``refund``, blocking (within the budget)."""
        return self._run(self._amounts("refund", upstream, amounts))

    def _observe(
        self,
        upstream: str,
        bucket: str,
        limit: float,
        rate: float,
        remaining: float,
        amount: float,
        seq: int,
        resource: str | None,
    ) -> _Op[bool]:
        keys = (
            self.keys.seq(upstream),
            self.keys.bucket(upstream, bucket),
            self.keys.shapes(upstream),
        )
        if resource is not None and (not isinstance(resource, str) or not resource.isidentifier()):
            raise ValueError(f"a resource must be a name like 'tokens', got {resource!r}")
        args = (
            _number("limit", limit, positive=True),
            _number("rate", rate),
            _number("remaining", remaining),
            _number("amount", amount),
            _count("seq", seq, least=0),
            bucket,
            resource or "",
        )
        return _Op("observe", keys, args, _flag)

    async def observe(
        self,
        upstream: str,
        bucket: str,
        *,
        limit: float,
        rate: float,
        remaining: float,
        amount: float,
        seq: int,
        resource: str | None = None,
    ) -> bool | None:
        """Apply a response's reading of ``bucket``, for the take numbered ``seq``
        that took ``amount`` of it.

        The take is answered: unseen shrinks by ``amount`` (not below 0). The
        bucket's limit and rate become the reading's. The reading less what
        is still unseen (``remaining - unseen``) is the level if ``seq`` is
        newer than the newest reading applied; an older send's reading
        (answered late) may only lower the level. A missing bucket is created
        from the reading. With ``resource`` (what the bucket counts: ``"requests"``,
        ``"tokens"``...), the bucket's shape is recorded for ``shapes``.
        """
        op = self._observe(upstream, bucket, limit, rate, remaining, amount, seq, resource)
        return await self._arun(op)

    def observe_sync(
        self,
        upstream: str,
        bucket: str,
        *,
        limit: float,
        rate: float,
        remaining: float,
        amount: float,
        seq: int,
        resource: str | None = None,
    ) -> bool | None:
        """``observe``, blocking (within the budget)."""
        op = self._observe(upstream, bucket, limit, rate, remaining, amount, seq, resource)
        return self._run(op)

    def _settle(self, upstream: str, corrections: Sequence[tuple[str, float]]) -> _Op[bool]:
        keys = tuple(self.keys.bucket(upstream, bucket) for bucket, _ in corrections)
        args = []
        for _, delta in corrections:
            finite = isinstance(delta, int | float) and math.isfinite(delta)
            if isinstance(delta, bool) or not finite:
                raise ValueError(f"a correction must be a finite number, got {delta!r}")
            args.append(delta)
        return _Op("settle", keys, tuple(args), _flag)

    async def settle(self, upstream: str, corrections: Sequence[tuple[str, float]]) -> bool | None:
        """Correct buckets by what answered requests really used (``(bucket, delta)``:
        a positive delta gives back what was estimated and not used, up to the
        limit; a negative one takes what was used beyond it, the level possibly
        going below zero, so later takes wait for the refill). For the caller's own
        budgets, which no provider's reading corrects. A missing bucket is left alone."""
        return await self._arun(self._settle(upstream, corrections))

    def settle_sync(self, upstream: str, corrections: Sequence[tuple[str, float]]) -> bool | None:
        """``settle``, blocking (within the budget)."""
        return self._run(self._settle(upstream, corrections))

    def _shapes(self, upstream: str) -> _Op[dict[str, BucketShape]]:
        def decode(raw: Any) -> dict[str, BucketShape]:
            shapes = {}
            for i in range(0, len(raw) - 1, 2):
                resource, limit, rate = _text(raw[i + 1]).rsplit(" ", 2)
                shapes[_text(raw[i])] = BucketShape(resource, float(limit), float(rate))
            return shapes

        return _Op("shapes", (self.keys.shapes(upstream),), (), decode)

    async def shapes(self, upstream: str) -> dict[str, BucketShape] | None:
        """The buckets the fleet knows for ``upstream`` (bucket -> its resource, limit
        and rate, as last observed with a resource): what a member that has had no
        answer yet paces by, instead of sending blind."""
        return await self._arun(self._shapes(upstream))

    def shapes_sync(self, upstream: str) -> dict[str, BucketShape] | None:
        """``shapes``, blocking (within the budget)."""
        return self._run(self._shapes(upstream))

    async def finished(self, upstream: str, amounts: Sequence[tuple[str, float]]) -> bool | None:
        """A take was answered without a reading: its amounts are no longer unseen."""
        return await self._arun(self._amounts("finished", upstream, amounts))

    def finished_sync(self, upstream: str, amounts: Sequence[tuple[str, float]]) -> bool | None:
        """``finished``, blocking (within the budget)."""
        return self._run(self._amounts("finished", upstream, amounts))

    # -- hint holds --------------------------------------------------------------

    def _hold(self, upstream: str, rank: int, for_s: float) -> _Op[bool]:
        args = (_count("rank", rank, least=0), _number("for_s", for_s))
        if rank > _MAX_RANK:
            raise ValueError(f"rank must be <= {_MAX_RANK}, got {rank}")
        return _Op("hold", (self.keys.holds(upstream),), args, _flag)

    async def hold(self, upstream: str, rank: int, for_s: float) -> bool | None:
        """Hold the fleet's attempts at ``rank`` and below for ``for_s`` seconds.

        Ranks are the window's: 0 is the lowest priority (``LOW``), 2 ``HIGH``.
        The hold is combined when written: each rank from 0 to ``rank`` ends at
        the later of its current end and now + ``for_s``, so ``holds`` reads
        each rank's own end. The hint's jitter is the reader's to add.
        """
        return await self._arun(self._hold(upstream, rank, for_s))

    def hold_sync(self, upstream: str, rank: int, for_s: float) -> bool | None:
        """``hold``, blocking (within the budget)."""
        return self._run(self._hold(upstream, rank, for_s))

    def _holds(self, upstream: str) -> _Op[dict[int, float]]:
        def decode(raw: Any) -> dict[int, float]:
            return {int(raw[i]): float(raw[i + 1]) for i in range(0, len(raw), 2)}

        return _Op("holds", (self.keys.holds(upstream),), (), decode)

    async def holds(self, upstream: str) -> dict[int, float] | None:
        """Seconds left of each rank's hold; ranks not held are left out."""
        return await self._arun(self._holds(upstream))

    def holds_sync(self, upstream: str) -> dict[int, float] | None:
        """``holds``, blocking (within the budget)."""
        return self._run(self._holds(upstream))

    # -- in-flight leases --------------------------------------------------------

    def _acquire(self, upstream: str, cap: int) -> _Op[str | Literal[False]]:
        lease = f"{self.member}#{next(self._leases)}"
        # A member that stops asking stops waiting after a second.
        args = (_count("cap", cap, least=1), lease, self.lease_ttl_s, self.member, 1.0)

        def decode(raw: Any) -> str | Literal[False]:
            return lease if _flag(raw) else False

        keys = (self.keys.leases(upstream), self.keys.waiters(upstream))
        return _Op("acquire", keys, args, decode)

    async def acquire(self, upstream: str, cap: int) -> str | Literal[False] | None:
        """One of ``cap`` fleet-wide in-flight slots: a lease id, ``False`` when all
        ``cap`` are held, ``None`` when Redis is unavailable.

        A lease lasts ``lease_ttl_s`` unless renewed; expired leases (a member
        that died holding them) are dropped before counting. Fair between
        members: while another member is waiting (it was refused in the last
        second), a member that holds its share of the cap (the cap over the
        members holding or waiting, rounded up) is refused too.
        """
        return await self._arun(self._acquire(upstream, cap))

    def acquire_sync(self, upstream: str, cap: int) -> str | Literal[False] | None:
        """``acquire``, blocking (within the budget)."""
        return self._run(self._acquire(upstream, cap))

    def _release(self, upstream: str, lease: str) -> _Op[bool]:
        return _Op("zrem", (self.keys.leases(upstream),), (lease,), _flag, command=True)

    async def release(self, upstream: str, lease: str) -> bool | None:
        """Give a lease back; ``False`` if it had already expired (or was never held)."""
        return await self._arun(self._release(upstream, lease))

    def release_sync(self, upstream: str, lease: str) -> bool | None:
        """``release``, blocking (within the budget)."""
        return self._run(self._release(upstream, lease))

    def _renew(self, upstream: str, leases: Sequence[str]) -> _Op[bool]:
        if isinstance(leases, str) or not all(isinstance(lease, str) for lease in leases):
            raise ValueError(f"leases must be a sequence of lease ids, got {leases!r}")
        args: tuple[str | float, ...] = (self.lease_ttl_s, *leases)
        return _Op("renew", (self.keys.leases(upstream),), args, _flag)

    async def renew(self, upstream: str, leases: Sequence[str]) -> bool | None:
        """Extend ``leases`` to ``lease_ttl_s`` from now (every ``lease_ttl_s / 3``
        for long calls). ``False`` if any had expired: those are not revived."""
        return await self._arun(self._renew(upstream, leases))

    def renew_sync(self, upstream: str, leases: Sequence[str]) -> bool | None:
        """``renew``, blocking (within the budget)."""
        return self._run(self._renew(upstream, leases))

    # -- membership --------------------------------------------------------------

    def _heartbeat(self, upstream: str, ttl_s: float | None) -> _Op[int]:
        ttl = self.lease_ttl_s if ttl_s is None else _number("ttl_s", ttl_s, positive=True)
        return _Op("heartbeat", (self.keys.members(upstream),), (self.member, ttl), int)

    async def heartbeat(self, upstream: str, ttl_s: float | None = None) -> int | None:
        """Say this member is alive for ``ttl_s`` (default ``lease_ttl_s``) more; the
        members alive."""
        return await self._arun(self._heartbeat(upstream, ttl_s))

    def heartbeat_sync(self, upstream: str, ttl_s: float | None = None) -> int | None:
        """``heartbeat``, blocking (within the budget)."""
        return self._run(self._heartbeat(upstream, ttl_s))

    def _members(self, upstream: str) -> _Op[int]:
        return _Op("members", (self.keys.members(upstream),), (), int)

    async def members(self, upstream: str) -> int | None:
        """How many members are alive (their last heartbeat within ``lease_ttl_s``)."""
        return await self._arun(self._members(upstream))

    def members_sync(self, upstream: str) -> int | None:
        """``members``, blocking (within the budget)."""
        return self._run(self._members(upstream))

    def _leave(self, upstream: str) -> _Op[bool]:
        key = self.keys.members(upstream)
        return _Op("zrem", (key,), (self.member,), _flag, command=True)

    async def leave(self, upstream: str) -> bool | None:
        """Stop counting this member now, not when its heartbeat expires."""
        return await self._arun(self._leave(upstream))

    def leave_sync(self, upstream: str) -> bool | None:
        """``leave``, blocking (within the budget)."""
        return self._run(self._leave(upstream))

    # -- retry budget ------------------------------------------------------------

    def _budget(
        self,
        upstream: str,
        policy: RetryBudgetPolicy,
        op: str,
        value: int,
        decode: Callable[[Any], T],
    ) -> _Op[T]:
        args = (op, policy.window_s, policy.ratio, policy.min_per_s, value)
        return _Op("budget", (self.keys.budget(upstream),), args, decode)

    @staticmethod
    def _receipt(raw: Any) -> int | Literal[False]:
        return int(raw) or False

    async def deposit(self, upstream: str, policy: RetryBudgetPolicy, n: int = 1) -> bool | None:
        """Count ``n`` new calls (first attempts) in the fleet's retry budget."""
        op = self._budget(upstream, policy, "deposit", _count("n", n, least=1), _flag)
        return await self._arun(op)

    def deposit_sync(self, upstream: str, policy: RetryBudgetPolicy, n: int = 1) -> bool | None:
        """``deposit``, blocking (within the budget)."""
        op = self._budget(upstream, policy, "deposit", _count("n", n, least=1), _flag)
        return self._run(op)

    async def withdraw(
        self, upstream: str, policy: RetryBudgetPolicy
    ) -> int | Literal[False] | None:
        """Take one retry from the fleet's budget: a receipt (for ``refund_retry``),
        ``False`` when none is left, ``None`` when Redis is unavailable.

        As ``RetryBudget``: over the last ``window_s`` (ten buckets), retries
        may number ``ratio`` times the calls deposited plus
        ``min_per_s * window_s``. Every member must use the same policy.
        """
        op = self._budget(upstream, policy, "withdraw", 0, self._receipt)
        return await self._arun(op)

    def withdraw_sync(
        self, upstream: str, policy: RetryBudgetPolicy
    ) -> int | Literal[False] | None:
        """``withdraw``, blocking (within the budget)."""
        op = self._budget(upstream, policy, "withdraw", 0, self._receipt)
        return self._run(op)

    async def refund_retry(
        self, upstream: str, policy: RetryBudgetPolicy, receipt: int
    ) -> bool | None:
        """Give back a withdrawn retry that was never sent (nothing once its bucket
        has left the window)."""
        op = self._budget(upstream, policy, "refund", _count("receipt", receipt, least=0), _flag)
        return await self._arun(op)

    def refund_retry_sync(
        self, upstream: str, policy: RetryBudgetPolicy, receipt: int
    ) -> bool | None:
        """``refund_retry``, blocking (within the budget)."""
        op = self._budget(upstream, policy, "refund", _count("receipt", receipt, least=0), _flag)
        return self._run(op)

    # -- breaker -----------------------------------------------------------------

    def _breaker_op(self, upstream: str, args: tuple[str | int | float, ...]) -> _Op[BreakerView]:
        keys = (self.keys.breaker(upstream), self.keys.probe(upstream))

        def decode(raw: Any) -> BreakerView:
            return BreakerView(BreakerState(_text(raw[0])), float(raw[1]), _flag(raw[2]))

        return _Op("breaker", keys, args, decode)

    def _report(
        self, upstream: str, success: bool, policy: BreakerPolicy, probe: bool
    ) -> _Op[BreakerView]:
        keep = max(60.0, 10 * policy.reset_timeout_s)
        args = (
            "report",
            int(bool(success)),
            int(bool(probe)),
            policy.fail_max,
            policy.reset_timeout_s,
            policy.success_threshold,
            keep,
        )
        return self._breaker_op(upstream, args)

    async def report(
        self, upstream: str, success: bool, policy: BreakerPolicy, *, probe: bool = False
    ) -> BreakerView | None:
        """Report an attempt's verdict to the fleet's breaker; its state after it.

        Closed: a failure counts (``fail_max`` in a row open it), a success
        clears the count. Open: reports are stale and ignored until
        ``reset_timeout_s`` has passed; then it is half-open, and only the
        probe's report (``probe=True``, from the member that won
        ``claim_probe``) counts: ``success_threshold`` successes close it, a
        failure opens it again. Neutral endings are not reported.
        """
        return await self._arun(self._report(upstream, success, policy, probe))

    def report_sync(
        self, upstream: str, success: bool, policy: BreakerPolicy, *, probe: bool = False
    ) -> BreakerView | None:
        """``report``, blocking (within the budget)."""
        return self._run(self._report(upstream, success, policy, probe))

    async def breaker(self, upstream: str) -> BreakerView | None:
        """The fleet's breaker for ``upstream``: closed when nothing is known."""
        return await self._arun(self._breaker_op(upstream, ("state",)))

    def breaker_sync(self, upstream: str) -> BreakerView | None:
        """``breaker``, blocking (within the budget)."""
        return self._run(self._breaker_op(upstream, ("state",)))

    def _claim_probe(self, upstream: str, ttl_s: float | None) -> _Op[bool]:
        ttl = self.lease_ttl_s if ttl_s is None else _number("ttl_s", ttl_s, positive=True)
        keys = (self.keys.breaker(upstream), self.keys.probe(upstream))
        args = ("probe", self.member, max(1, math.ceil(ttl * 1000)))
        return _Op("breaker", keys, args, lambda raw: _flag(raw[3]))

    async def claim_probe(self, upstream: str, ttl_s: float | None = None) -> bool | None:
        """Claim the fleet's one half-open probe: ``True`` for one member only, while
        the breaker is half-open. The claim lapses after ``ttl_s`` (default
        ``lease_ttl_s``) if its report never comes."""
        return await self._arun(self._claim_probe(upstream, ttl_s))

    def claim_probe_sync(self, upstream: str, ttl_s: float | None = None) -> bool | None:
        """``claim_probe``, blocking (within the budget)."""
        return self._run(self._claim_probe(upstream, ttl_s))

    def _release_probe(self, upstream: str) -> _Op[bool]:
        keys = (self.keys.breaker(upstream), self.keys.probe(upstream))
        return _Op("breaker", keys, ("unprobe", self.member), lambda raw: _flag(raw[3]))

    async def release_probe(self, upstream: str) -> bool | None:
        """Give back the half-open probe this member claimed, if it still holds it (its
        attempt never went out, or ended without a verdict): another may probe now."""
        return await self._arun(self._release_probe(upstream))

    def release_probe_sync(self, upstream: str) -> bool | None:
        """``release_probe``, blocking (within the budget)."""
        return self._run(self._release_probe(upstream))

    # -- lifecycle ---------------------------------------------------------------

    def statistics(self) -> FleetStatistics:
        """How this member's calls to Redis went."""
        h = self._health
        return FleetStatistics(
            available=h.available,
            calls=h.calls,
            fallbacks=h.fallbacks,
            outages=h.outages,
            rejoins=h.rejoins,
        )

    def close(self) -> None:
        """Close the clients made from the URL (not a pair passed in); every later
        operation returns ``None``. Async clients need ``aclose``."""
        self._closed = True
        if self._url is not None and self._sync is not None:
            self._sync.close()

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
