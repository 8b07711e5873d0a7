"""A Gate's link to its fleet's quota, sans-IO: the fleet's side of each claim.

In shared mode an attempt's cost is taken from the fleet's buckets as well
as locally (``take``, its answer read by ``took``). Granted, the take gets a
send number (``seq``) and the fleet counts its amounts unseen (in flight, not
answered) until each is settled: by a reading of its bucket (``observe``), or,
for the buckets the answer did not read (no answer; an answer with the
requests headers but not the tokens ones), when the attempt ends
(``settle_unseen``); a take never sent is given back whole (``refund``). So
nothing stays unseen once nothing is in flight (``Shared.audit`` counts the
takes not settled yet). Refused, the take names the buckets that had no room
and how long each needs (``Quota.refused``): only the claims that spend from
those wait (one model's bucket holds back that model's claims, a budget of the
caller's own every claim). The caller's own budgets, which no provider's
reading corrects, are settled in the fleet against what the attempt used
(``settle``).
"""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from yieldgate.gate._cost import scoped_key
from yieldgate.gate._fleet_op import FleetOp
from yieldgate.gate._quota import Claim, Cost, QuotaReading
from yieldgate.gate._upstream import Upstream

__all__ = ["QuotaLink"]


class QuotaLink:
    """The quota operations of a Gate's fleet link (``Shared``, built on it)."""

    backlog: deque[FleetOp]
    clock: Callable[[], float]
    # Takes the fleet granted whose amounts it still counts unseen (``Claim.unseen``).
    unsettled: int = 0

    def _unavailable(self, ups: Sequence[Upstream]) -> None:
        raise NotImplementedError  # pragma: no cover - ``Shared``'s

    def take(self, up: Upstream, claim: Claim) -> FleetOp | None:
        """The fleet's take for ``claim`` (taken locally in shared mode), or ``None``
        when no bucket is known yet (the first answers teach it)."""
        wants = up.quota.wants(claim.cost)
        if not wants:
            return None
        claim.wants = wants  # what it takes there, if granted (``seq`` says whether it was)
        return FleetOp("take", (up.name, wants))

    def took(
        self, ups: Sequence[Upstream], up: Upstream, claim: Claim, got: Any, now: float
    ) -> bool:
        """What the fleet's take answered: ``True`` if ``claim`` may go; else it was
        refused (wait) or Redis is away (go on alone): the caller starts over."""
        if got is None:
            self._unavailable(ups)
            up.quota.refund(claim, now)
            return False
        if not got.ok:
            # Only what refused holds back the claims that spend from it: one scope's
            # bucket its scope's, the caller's own budgets every scope's (a reply
            # that names none, all the take's).
            waits = got.waits or [(key, got.wait_s) for key, _, _, _ in claim.wants]
            up.quota.refused(waits, now)
            up.quota.refund(claim, now)
            return False
        claim.seq = got.seq
        claim.unseen = {key: amount for key, amount, _, _ in claim.wants}
        self.unsettled += 1
        return True

    def refund(self, up: Upstream, claim: Claim) -> None:
        """A claim the fleet had granted was never sent."""
        if claim.seq:
            self.backlog.append(FleetOp("refund", (up.name, _amounts(claim))))
            claim.seq = 0
            self._settled(claim)

    def _settled(self, claim: Claim) -> None:
        if claim.unseen is not None:
            claim.unseen = None
            self.unsettled -= 1

    def observe(
        self, up: Upstream, claim: Claim, readings: Sequence[QuotaReading], now: float
    ) -> None:
        """A response's readings, for the fleet's buckets its claim took from; or, for a
        claim the fleet never numbered (sent before any bucket was known), for every
        bucket read, as a reading older than any take (it may only lower a level, or
        creates the bucket): so the fleet learns the quota from a member's first answer.

        A reading settles what it read: its bucket's amount is no longer unseen. The
        buckets the answer did not read (its requests headers, say, but not its
        tokens ones) are settled when the attempt ends (``settle_unseen``)."""
        taken = {key for key, _, _, _ in claim.wants} if claim.seq else None
        unseen = claim.unseen or {}
        for reading in readings:
            key = scoped_key(reading.key, claim.scope)
            bucket = up.quota.buckets.get(key)
            if (taken is not None and key not in taken) or bucket is None:
                continue
            amount = unseen.pop(key, 0.0)  # settled once, by its first reading
            kwargs = {
                "limit": bucket.limit,
                "rate": bucket.rate,
                "remaining": reading.remaining,
                "amount": amount,
                "seq": claim.seq,
                "resource": bucket.resource,
                # Which reading is newest is told by when its request was sent: its
                # age when the operation goes (it may wait in the backlog a while).
                "age_s": functools.partial(_age, self.clock, claim.started),
            }
            self.backlog.append(FleetOp("observe", (up.name, key), kwargs))

    def settle(self, up: Upstream, claim: Claim, used: Cost) -> None:
        """What the attempt of a claim the fleet granted really used: the caller's own
        budgets (``QuotaPolicy``'s buckets, which no provider's reading corrects) are
        settled in the fleet, as they are locally when alone."""
        if not claim.seq:
            return
        corrections = []
        for key, amount, _, _ in claim.wants:
            bucket = up.quota.buckets.get(key)
            if bucket is None or bucket.learnt:
                continue
            delta = amount - used.amount(bucket.resource)
            if delta:
                corrections.append((key, float(delta)))
        if corrections:
            self.backlog.append(FleetOp("settle", (up.name, corrections)))

    def settle_unseen(self, up: Upstream, claim: Claim) -> None:
        """A sent attempt is over: what of its take no reading settled (no answer, an
        answer without readings, or with some buckets' only) is no longer unseen."""
        if claim.unseen:
            self.backlog.append(FleetOp("finished", (up.name, list(claim.unseen.items()))))
        self._settled(claim)


def _amounts(claim: Claim) -> list[tuple[str, float]]:
    return [(key, amount) for key, amount, _, _ in claim.wants]


def _age(clock: Callable[[], float], sent: float) -> float:
    """Seconds since ``sent``, on the Gate's clock."""
    return max(0.0, clock() - sent)
