"""A fleet's membership: ``heartbeat``, ``members``, ``leave``.

How many members are alive, for a member's local share to fall back to. One
of the groups of operations ``Fleet`` is made of.
"""

from __future__ import annotations

from yieldgate.fleet._driver import Drivers, Op, check_number, read_flag

__all__ = ["MemberOps"]


class MemberOps(Drivers):
    """The membership of a ``Fleet``."""

    def _heartbeat(self, upstream: str, ttl_s: float | None) -> Op[int]:
        ttl = self.lease_ttl_s if ttl_s is None else check_number("ttl_s", ttl_s, positive=True)
        return Op("heartbeat", (self.keys.members(upstream),), (self.member, ttl), int)

    async def heartbeat(self, upstream: str, ttl_s: float | None = None) -> int | None:
        """Say this member is alive for ``ttl_s`` (default ``lease_ttl_s``) more; the
        members alive."""
        return await self._arun(self._heartbeat(upstream, ttl_s))

    def heartbeat_sync(self, upstream: str, ttl_s: float | None = None) -> int | None:
        """``heartbeat``, blocking (within the budget)."""
        return self._run(self._heartbeat(upstream, ttl_s))

    def _members(self, upstream: str) -> Op[int]:
        return Op("members", (self.keys.members(upstream),), (), int)

    async def members(self, upstream: str) -> int | None:
        """How many members are alive (their last heartbeat within ``lease_ttl_s``)."""
        return await self._arun(self._members(upstream))

    def members_sync(self, upstream: str) -> int | None:
        """``members``, blocking (within the budget)."""
        return self._run(self._members(upstream))

    def _leave(self, upstream: str) -> Op[bool]:
        key = self.keys.members(upstream)
        return Op("zrem", (key,), (self.member,), read_flag, command=True)

    async def leave(self, upstream: str) -> bool | None:
        """Stop counting this member now, not when its heartbeat expires."""
        return await self._arun(self._leave(upstream))

    def leave_sync(self, upstream: str) -> bool | None:
        """``leave``, blocking (within the budget)."""
        return self._run(self._leave(upstream))
