"""A fleet's hint holds: ``hold`` and ``holds``.

A yield or a 429 seen by one member holds every member's attempts at that
priority and below. One of the groups of operations ``Fleet`` is made of.
"""

from __future__ import annotations

from typing import Any

from yieldgate.fleet._driver import Drivers, Op, check_count, check_number, read_flag

__all__ = ["HoldOps"]

# Holds cover ranks 0 (the lowest priority) up to the rank given; 64 is plenty.
_MAX_RANK = 63


class HoldOps(Drivers):
    """The hint holds of a ``Fleet``."""

    def _hold(self, upstream: str, rank: int, for_s: float) -> Op[bool]:
        args = (check_count("rank", rank, least=0), check_number("for_s", for_s))
        if rank > _MAX_RANK:
            raise ValueError(f"rank must be <= {_MAX_RANK}, got {rank}")
        return Op("hold", (self.keys.holds(upstream),), args, read_flag)

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

    def _holds(self, upstream: str) -> Op[dict[int, float]]:
        def decode(raw: Any) -> dict[int, float]:
            return {int(raw[i]): float(raw[i + 1]) for i in range(0, len(raw), 2)}

        return Op("holds", (self.keys.holds(upstream),), (), decode)

    async def holds(self, upstream: str) -> dict[int, float] | None:
        """Seconds left of each rank's hold; ranks not held are left out."""
        return await self._arun(self._holds(upstream))

    def holds_sync(self, upstream: str) -> dict[int, float] | None:
        """``holds``, blocking (within the budget)."""
        return self._run(self._holds(upstream))
