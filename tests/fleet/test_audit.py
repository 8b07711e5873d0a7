"""The fleet's audit: what its Redis holds for an upstream that nothing in flight
accounts for (read when no member has a call running)."""

from __future__ import annotations

import pytest
import redis

from tests.fleet.conftest import Either, wait_for
from yieldgate.gate import BreakerPolicy

pytestmark = pytest.mark.anyio

UP = "api.example"


async def test_a_fleet_that_holds_nothing_audits_clean(fleet: Either) -> None:
    assert await fleet.audit(UP) == []
    assert await fleet.audit("a*[glob]?") == []  # an upstream's name is not a pattern


async def test_the_audit_lists_what_nothing_in_flight_accounts_for(
    fleet: Either, admin: redis.Redis, gate: str
) -> None:
    take = await fleet.take(UP, [("requests", 1, 10, 0), ("tokens@a", 300, 1000, 0)])
    assert take is not None
    lease = await fleet.acquire(UP, 4)
    assert lease
    await fleet.report(UP, False, BreakerPolicy(fail_max=1, reset_timeout_s=0.01))

    async def probe_claimed() -> bool:  # half-open 10 ms after it opened
        return bool(await fleet.claim_probe(UP))

    await wait_for(probe_claimed)
    assert (await fleet.first(UP, 5.0)).state == "mine"
    problems = await fleet.audit(UP)
    assert problems is not None
    assert sorted(problems) == sorted(
        [
            "1 in-flight lease(s) held",
            "the breaker's half-open probe held by 'a'",
            "the first reading's probe held by 'a'",
            "bucket 'requests': 1 taken and still unseen",
            "bucket 'tokens@a': 300 taken and still unseen",
        ]
    ), problems
    # Each given back as its owner would: nothing is left.
    await fleet.observe(UP, "tokens@a", limit=1000, rate=0, remaining=700, amount=300, seq=1)
    await fleet.finished(UP, [("requests", 1)])
    await fleet.release(UP, lease)
    await fleet.release_probe(UP)
    await fleet.probed(UP, {}, 60.0)  # the probe's answer carried no quota: '{none}'
    assert await fleet.audit(UP) == []
    assert admin.get(f"yieldgate:{gate}:{{{UP}}}:first") == b"{none}"
