"""A fleet's hint holds: ``hold``, ``holds`` and ``all_holds``.

A yield or a 429 seen by one member holds every member's attempts at that
priority and below; a provider's refusal for one scope's quota (a model's, a
deployment's) holds that scope's only. One of the groups of operations
``Fleet`` is made of.
"""

from __future__ import annotations

from typing import Any

from yieldgate.fleet._driver import Drivers, Op, check_count, check_number, read_flag, read_text

__all__ = ["HoldOps"]

# Holds cover ranks 0 (the lowest priority) up to the rank given; 64 is plenty.
_MAX_RANK = 63


class HoldOps(Drivers):
    """The hint holds of a ``Fleet``."""

    def _hold(self, upstream: str, rank: int, for_s: float, scope: str) -> Op[bool]:
        args = (check_count("rank", rank, least=0), check_number("for_s", for_s), scope)
        if rank > _MAX_RANK:
            raise ValueError(f"rank must be <= {_MAX_RANK}, got {rank}")
        if not isinstance(scope, str):
            raise TypeError(f"a scope must be a string, got {scope!r}")
        key = self.keys.scope_holds(upstream) if scope else self.keys.holds(upstream)
        return Op("hold", (key,), args, read_flag)

    async def hold(self, upstream: str, rank: int, for_s: float, *, scope: str = "") -> bool | None:
        """Hold the fleet's attempts at ``rank`` and below for ``for_s`` seconds.

        Ranks are the window's: 0 is the lowest priority (``LOW``), 2 ``HIGH``.
        The hold is combined when written: each rank from 0 to ``rank`` ends at
        the later of its current end and now + ``for_s``, so ``holds`` reads
        each rank's own end. The hint's jitter is the reader's to add. With a
        ``scope`` (a model, an Azure deployment: a provider refused a request
        for that scope's quota), the hold is that scope's alone: the other
        scopes' quotas have room of their own.
        """
        return await self._arun(self._hold(upstream, rank, for_s, scope))

    def hold_sync(self, upstream: str, rank: int, for_s: float, *, scope: str = "") -> bool | None:
        """``hold``, blocking (within the budget)."""
        return self._run(self._hold(upstream, rank, for_s, scope))

    def _holds(self, upstream: str) -> Op[dict[int, float]]:
        def decode(raw: Any) -> dict[int, float]:
            return {int(raw[i]): float(raw[i + 1]) for i in range(0, len(raw), 2)}

        return Op("holds", (self.keys.holds(upstream),), (), decode)

    async def holds(self, upstream: str) -> dict[int, float] | None:
        """Seconds left of each rank's hold of the whole upstream; ranks not held are
        left out."""
        return await self._arun(self._holds(upstream))

    def holds_sync(self, upstream: str) -> dict[int, float] | None:
        """``holds``, blocking (within the budget)."""
        return self._run(self._holds(upstream))

    def _all_holds(self, upstream: str) -> Op[dict[str, dict[int, float]]]:
        def decode(raw: Any) -> dict[str, dict[int, float]]:
            held: dict[str, dict[int, float]] = {}
            for i in range(0, len(raw) - 1, 2):
                rank, _, scope = read_text(raw[i]).partition(" ")
                held.setdefault(scope, {})[int(rank)] = float(raw[i + 1])
            return held

        keys = (self.keys.holds(upstream), self.keys.scope_holds(upstream))
        return Op("holds", keys, (), decode)

    async def all_holds(self, upstream: str) -> dict[str, dict[int, float]] | None:
        """Every hold in force, in one round trip: seconds left by scope (``""``: the
        whole upstream's, as ``holds`` reads them) and rank."""
        return await self._arun(self._all_holds(upstream))

    def all_holds_sync(self, upstream: str) -> dict[str, dict[int, float]] | None:
        """``all_holds``, blocking (within the budget)."""
        return self._run(self._all_holds(upstream))
