"""A fleet's in-flight leases: ``acquire``, ``release``, ``renew``.

A fleet-wide cap on calls in flight, as leases with a time to live, so that a
member killed holding them loses them. One of the groups of operations
``Fleet`` is made of.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, Literal

from yieldgate.fleet._driver import Drivers, Op, check_count, read_flag

__all__ = ["LeaseOps"]


class LeaseOps(Drivers):
    """The in-flight leases of a ``Fleet``."""

    _leases: Iterator[int]  # the lease numbers of this member, set by Fleet

    def _acquire(self, upstream: str, cap: int) -> Op[str | Literal[False]]:
        lease = f"{self.member}#{next(self._leases)}"
        # A member that stops asking stops waiting after a second.
        args = (check_count("cap", cap, least=1), lease, self.lease_ttl_s, self.member, 1.0)

        def decode(raw: Any) -> str | Literal[False]:
            return lease if read_flag(raw) else False

        def undo(got: str | Literal[False]) -> Op[bool] | None:
            return None if got is False else self._release(upstream, got)

        keys = (self.keys.leases(upstream), self.keys.waiters(upstream))
        return Op("acquire", keys, args, decode, undo=undo)

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

    def _release(self, upstream: str, lease: str) -> Op[bool]:
        return Op("zrem", (self.keys.leases(upstream),), (lease,), read_flag, command=True)

    async def release(self, upstream: str, lease: str) -> bool | None:
        """Give a lease back; ``False`` if it had already expired (or was never held)."""
        return await self._arun(self._release(upstream, lease))

    def release_sync(self, upstream: str, lease: str) -> bool | None:
        """``release``, blocking (within the budget)."""
        return self._run(self._release(upstream, lease))

    def _renew(self, upstream: str, leases: Sequence[str]) -> Op[bool]:
        if isinstance(leases, str) or not all(isinstance(lease, str) for lease in leases):
            raise ValueError(f"leases must be a sequence of lease ids, got {leases!r}")
        args: tuple[str | float, ...] = (self.lease_ttl_s, *leases)
        return Op("renew", (self.keys.leases(upstream),), args, read_flag)

    async def renew(self, upstream: str, leases: Sequence[str]) -> bool | None:
        """Extend ``leases`` to ``lease_ttl_s`` from now (every ``lease_ttl_s / 3``
        for long calls). ``False`` if any had expired: those are not revived."""
        return await self._arun(self._renew(upstream, leases))

    def renew_sync(self, upstream: str, leases: Sequence[str]) -> bool | None:
        """``renew``, blocking (within the budget)."""
        return self._run(self._renew(upstream, leases))
