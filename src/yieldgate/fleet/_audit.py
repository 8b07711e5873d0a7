"""A fleet's audit: ``audit``, what its Redis holds for an upstream that nothing in
flight accounts for.

For tests and debugging, read when no member has a call running: every lease
is then released, every take settled (nothing ``unseen``), and neither the
breaker's half-open probe nor the first reading's probe is held by a member.
One of the groups of operations ``Fleet`` is made of.
"""

from __future__ import annotations

import re
from typing import Any

from yieldgate.fleet._driver import Drivers, Op, read_text

__all__ = ["AuditOps"]

# Float sums of whole amounts are exact; a smaller residue is no take left unseen.
_UNSEEN_EPSILON = 1e-6


class AuditOps(Drivers):
    """The audit of a ``Fleet``."""

    def _audit(self, upstream: str) -> Op[list[str]]:
        keys = (self.keys.leases(upstream), self.keys.probe(upstream), self.keys.first(upstream))
        # The upstream's buckets, its tag's glob characters escaped.
        pattern = re.sub(r"([*?\[\]\\])", r"\\\1", self.keys.bucket(upstream, "x")[:-1]) + "*"

        def decode(raw: Any) -> list[str]:
            problems = []
            leases = int(raw[0])
            if leases:
                problems.append(f"{leases} in-flight lease(s) held")
            probe, first = read_text(raw[1]), read_text(raw[2])
            if probe:
                problems.append(f"the breaker's half-open probe held by {probe!r}")
            if first:
                problems.append(f"the first reading's probe held by {first!r}")
            for i in range(3, len(raw) - 1, 2):
                unseen = float(raw[i + 1])
                if abs(unseen) > _UNSEEN_EPSILON:
                    bucket = read_text(raw[i]).rpartition(":quota:")[2]
                    problems.append(f"bucket {bucket!r}: {unseen:g} taken and still unseen")
            return problems

        return Op("audit", keys, (pattern,), decode)

    async def audit(self, upstream: str) -> list[str] | None:
        """What Redis holds for ``upstream`` that nothing in flight accounts for, one
        line each (``[]``: nothing); ``None`` when Redis does not answer.

        Meant to be read when no member of the fleet has a call running (a test
        between steps, a debugging session): then no lease may be held, no bucket
        may count a take as ``unseen`` (each is settled by its readings, or when
        its attempt ends, or refunded), and neither the breaker's half-open probe
        nor the first reading's probe may be held by a member (the first
        reading's ``{done}`` and ``{none}`` are settled states). Retry-budget
        draws are not listed: the fleet counts a retry spent when it is drawn,
        sent or not, and gives back only what a member refunds. It scans the
        upstream's keys (``SCAN``): not for a busy Redis's hot path.
        """
        return await self._arun(self._audit(upstream))

    def audit_sync(self, upstream: str) -> list[str] | None:
        """``audit``, blocking (within the budget)."""
        return self._run(self._audit(upstream))
