"""A fleet's breaker: ``report``, ``breaker``, ``claim_probe``.

A small record of the fleet's own (not pybreaker's storage; the package's
docstring says why), updated by one script from each verdict, and one
half-open probe for the whole fleet. One of the groups of operations
``Fleet`` is made of.
"""

from __future__ import annotations

import math
from typing import Any

from yieldgate.fleet._driver import Drivers, Op, check_number, read_flag, read_text
from yieldgate.fleet._records import BreakerView
from yieldgate.gate._breaker import BreakerState
from yieldgate.gate._policy import BreakerPolicy

__all__ = ["BreakerOps"]


class BreakerOps(Drivers):
    """The breaker of a ``Fleet``."""

    def _breaker_op(self, upstream: str, args: tuple[str | int | float, ...]) -> Op[BreakerView]:
        keys = (self.keys.breaker(upstream), self.keys.probe(upstream))

        def decode(raw: Any) -> BreakerView:
            return BreakerView(BreakerState(read_text(raw[0])), float(raw[1]), read_flag(raw[2]))

        return Op("breaker", keys, args, decode)

    def _report(
        self, upstream: str, success: bool, policy: BreakerPolicy, probe: bool
    ) -> Op[BreakerView]:
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

    def _claim_probe(self, upstream: str, ttl_s: float | None) -> Op[bool]:
        ttl = self.lease_ttl_s if ttl_s is None else check_number("ttl_s", ttl_s, positive=True)
        keys = (self.keys.breaker(upstream), self.keys.probe(upstream))
        args = ("probe", self.member, max(1, math.ceil(ttl * 1000)))

        def undo(got: bool) -> Op[bool] | None:
            return self._release_probe(upstream) if got else None

        return Op("breaker", keys, args, lambda raw: read_flag(raw[3]), undo=undo)

    def _release_probe(self, upstream: str) -> Op[bool]:
        keys = (self.keys.breaker(upstream), self.keys.probe(upstream))
        return Op("breaker", keys, ("unprobe", self.member), lambda raw: read_flag(raw[3]))

    async def release_probe(self, upstream: str) -> bool | None:
        """Give back the half-open probe this member claimed, if it still holds it (its
        attempt never went out, or ended without a verdict): another may probe now."""
        return await self._arun(self._release_probe(upstream))

    def release_probe_sync(self, upstream: str) -> bool | None:
        """``release_probe``, blocking (within the budget)."""
        return self._run(self._release_probe(upstream))

    async def claim_probe(self, upstream: str, ttl_s: float | None = None) -> bool | None:
        """Claim the fleet's one half-open probe: ``True`` for one member only, while
        the breaker is half-open. The claim lapses after ``ttl_s`` (default
        ``lease_ttl_s``) if its report never comes."""
        return await self._arun(self._claim_probe(upstream, ttl_s))

    def claim_probe_sync(self, upstream: str, ttl_s: float | None = None) -> bool | None:
        """``claim_probe``, blocking (within the budget)."""
        return self._run(self._claim_probe(upstream, ttl_s))
