"""The round trips of a ``Fleet``: ``Op``, the clients, and the two drivers that run an op.

Every operation is built once, as an ``Op`` (a script or a command, its keys
and arguments, and how to read the reply), and run by one of two drivers:
``_run`` on the sync client, ``_arun`` on the asyncio client. Both ask the
``Health`` circuit first, bound the call by the time budget and turn every
failure into ``None``.

An operation that grants something (a take, a lease, a retry, the half-open
probe) says how to give it back (``Op.undo``). Run by ``_arun`` and
cancelled while Redis answers, it is not lost: the round trip goes on in a
task of its own, and what it granted is given back in Redis as soon as the
reply comes. (A caller that gets the reply owns what it grants.)

A module of its own, below the operations: each group of operations
(``_buckets``, ``_holds``, ``_leases``, ``_members``, ``_budget``,
``_breaker``) is a class built on ``Drivers``, and ``Fleet`` (``_fleet``) is
all of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import math
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeAlias, TypeVar

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
from yieldgate.fleet._keys import Keys
from yieldgate.fleet._scripts import SCRIPTS
from yieldgate.fleet._timeout import RoundTripBound, longest_s

__all__ = [
    "AsyncClient",
    "Drivers",
    "Op",
    "SyncClient",
    "check_count",
    "check_number",
    "read_flag",
    "read_text",
]

SyncClient: TypeAlias = "redis.Redis | redis.cluster.RedisCluster"
"""A ready redis-py client, plain or cluster, for a ``Fleet``'s sync operations."""
AsyncClient: TypeAlias = "redis.asyncio.Redis | redis.asyncio.cluster.RedisCluster"
"""A ready redis-py asyncio client, plain or cluster, for a ``Fleet``'s async operations."""

T = TypeVar("T")

_SCHEMES = ("redis://", "rediss://", "unix://")


def redacted(url: str) -> str:
    """``url`` with its user and password (if any) as ``***``: fit for a message."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    authority, slash, path = rest.partition("/")
    if "@" not in authority:
        return url
    return f"{scheme}{sep}***@{authority.rpartition('@')[2]}{slash}{path}"


@dataclass(frozen=True, slots=True)
class Op(Generic[T]):
    """One round trip: a script by name (or, ``command``, a client's method for a
    plain command), and its reply's reader."""

    name: str
    keys: tuple[str, ...]
    args: tuple[str | int | float, ...]
    decode: Callable[[Any], T]
    command: bool = False
    # What gives back what a reply granted (``None``: it granted nothing).
    undo: Callable[[T], Op[Any] | None] | None = None


def read_text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def read_flag(value: Any) -> bool:
    return bool(int(value))


def check_number(what: str, value: float, *, positive: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{what} must be a finite number, got {value!r}")
    if value < 0 or (positive and value == 0):
        raise ValueError(f"{what} must be {'> 0' if positive else '>= 0'}, got {value!r}")
    return value


def check_count(what: str, value: int, *, least: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"{what} must be an integer >= {least}, got {value!r}")
    return value


class Drivers:
    """The clients of one ``Fleet``, and ``_run`` and ``_arun``, which send an ``Op``
    through them. ``Fleet`` sets what is declared here, then calls ``_open``."""

    keys: Keys
    member: str
    budget_s: float
    join_s: float
    lease_ttl_s: float
    _health: Health

    def _open(self, shared: str | tuple[SyncClient | None, AsyncClient | None]) -> None:
        """The clients: made from a URL (the fleet's own), or a pair passed in."""
        self._closed = False
        # Give-backs of grants whose caller was cancelled, running now.
        self._undoing: set[asyncio.Task[Any]] = set()
        self._url: str | None = None
        self._async_clients: dict[asyncio.AbstractEventLoop, tuple[AsyncClient, dict[str, Any]]]
        self._async_clients = {}
        self._given_async: AsyncClient | None = None
        self._given_async_scripts: dict[str, AsyncScript] = {}
        self._sync_join: redis.Redis | None = None
        # Set in a thread whose operations may not wait out ``join_s`` (``_hurry``).
        self._hurried = threading.local()
        if isinstance(shared, str):
            if not shared.lower().startswith(_SCHEMES):
                raise ValueError(
                    f"shared must be a redis://, rediss:// or unix:// URL: {redacted(shared)!r}"
                )
            scheme, rest = shared.split("://", 1)
            shared = f"{scheme.lower()}://{rest}"  # schemes are case-insensitive
            try:
                self._sync: SyncClient | None = redis.Redis.from_url(
                    shared, retry=Retry(NoBackoff(), 0), **self._client_options(self.budget_s)
                )
                if self.join_s > self.budget_s:
                    # Until Redis first answers: the same, with the join's time-outs.
                    self._sync_join = redis.Redis.from_url(
                        shared, retry=Retry(NoBackoff(), 0), **self._client_options(self.join_s)
                    )
            except ValueError as exc:  # its message may quote the URL: never a password
                message = str(exc).replace(shared, redacted(shared))
                raise ValueError(
                    f"shared is not a Redis URL redis-py can read ({message}): {redacted(shared)!r}"
                ) from None
            self._url = shared
        else:
            if not (isinstance(shared, tuple) and len(shared) == 2):
                raise ValueError("shared must be a URL or a (sync_client, async_client) pair")
            self._sync, self._given_async = shared
            if self._given_async is not None:
                self._given_async_scripts = self._register_async(self._given_async)
        self._sync_scripts: dict[str, Script] = {}
        if self._sync is not None:
            self._sync_scripts = {n: self._sync.register_script(s) for n, s in SCRIPTS.items()}

    @staticmethod
    def _client_options(timeout: float | None) -> dict[str, Any]:
        # An asyncio client's round trips are bounded by ``RoundTripBound`` (fair
        # to a busy event loop), not by socket time-outs that fire while a reply
        # that came in time waits for the loop to read it: ``None`` for those.
        return {
            "socket_timeout": timeout,
            "socket_connect_timeout": timeout,
            "health_check_interval": 0,
        }

    @staticmethod
    def _register_async(client: AsyncClient) -> dict[str, AsyncScript]:
        return {name: client.register_script(source) for name, source in SCRIPTS.items()}

    def _run(self, op: Op[T]) -> T | None:
        client = self._sync
        if self._closed or client is None:
            return None
        ticket = self._health.admit()
        if ticket is Pass.SKIP:
            return None
        if self._sync_join is not None and self.joining and not getattr(self._hurried, "on", False):
            client = self._sync_join  # joining: ``join_s``'s time-outs
        try:
            if op.command:
                raw = getattr(client, op.name)(*op.keys, *op.args)
            else:
                raw = self._sync_scripts[op.name](keys=op.keys, args=op.args, client=client)
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
                self._url,
                retry=AsyncRetry(NoBackoff(), 0),
                **self._client_options(None),
            )
            entry = client, self._register_async(client)
            self._async_clients[loop] = entry
        return entry

    async def _arun(self, op: Op[T]) -> T | None:
        if self._closed:
            return None
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # not asyncio (trio): the sync client, off the event loop
            return await anyio.to_thread.run_sync(self._run, op)
        entry = self._async_for(loop)
        if entry is None:
            return await anyio.to_thread.run_sync(self._run, op)
        if op.undo is None:
            return await self._trip(entry, op)
        round_trip = self._trip(entry, op)
        trip = loop.create_task(round_trip)
        try:
            return await asyncio.shield(trip)
        except BaseException:
            # Cancelled while Redis answers: whatever the reply grants goes back.
            if trip.done():
                self._undo(op, trip)
            else:
                trip.add_done_callback(functools.partial(self._undo, op))
            raise

    async def _trip(self, entry: tuple[AsyncClient, dict[str, Any]], op: Op[T]) -> T | None:
        client, scripts = entry
        ticket = self._health.admit()
        if ticket is Pass.SKIP:
            return None
        try:
            async with self._bound():
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

    @property
    def joining(self) -> bool:
        """Whether Redis has yet to answer this member (its operations may take
        ``join_s``, not just ``budget_s``)."""
        return not self._health.answered and self.join_s > self.budget_s

    @property
    def longest_op_s(self) -> float:
        """The longest an asyncio operation may take now, busy event loop included."""
        most = longest_s(self.budget_s)
        return max(self.join_s, most) if self.joining else most

    @contextlib.contextmanager
    def _hurry(self) -> Iterator[None]:
        """Sync operations in this block, in this thread, wait no longer than
        ``budget_s``, joining or not (a call whose deadline is near)."""
        local = self._hurried
        was = getattr(local, "on", False)
        local.on = True
        try:
            yield
        finally:
            local.on = was

    def _bound(self) -> RoundTripBound:
        """An asyncio round trip's bound: ``budget_s``, or, until Redis first answered
        this member, ``join_s`` (in all, busy loop included, the longer of ``join_s``
        and the budget's own most). The sync client made from a URL has a twin with
        ``join_s``'s socket time-outs for that time (``_sync_join``)."""
        if not self.joining:
            return RoundTripBound(self.budget_s)
        return RoundTripBound(self.join_s, most_s=longest_s(self.budget_s))

    def _undo(self, op: Op[T], trip: asyncio.Task[T | None]) -> None:
        """Give back what ``trip``'s reply granted (nobody took it)."""
        if trip.cancelled() or trip.exception() is not None:
            return
        granted = trip.result()
        back = None if granted is None or op.undo is None else op.undo(granted)
        if back is None:
            return
        task = trip.get_loop().create_task(self._arun(back))
        self._undoing.add(task)
        task.add_done_callback(self._undoing.discard)
