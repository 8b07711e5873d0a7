"""The fleet's breaker record: failures counted fleet-wide, one half-open probe."""

from __future__ import annotations

from typing import Any

import pytest

from tests.fleet.conftest import Either, wait_for
from yieldgate.fleet import BreakerView
from yieldgate.gate import BreakerPolicy, BreakerState

pytestmark = pytest.mark.anyio

UP = "api.example"


async def half_open(member: Either) -> None:
    async def check() -> bool:
        view = await member.breaker(UP)
        return view is not None and view.state is BreakerState.HALF_OPEN

    await wait_for(check)


async def test_an_unknown_breaker_is_closed(fleet: Either) -> None:
    assert await fleet.breaker(UP) == BreakerView(BreakerState.CLOSED, 0.0, False)
    assert await fleet.claim_probe(UP) is False


async def test_failures_in_a_row_across_members_open_it(fleets: Any) -> None:
    a, b = fleets(member="a"), fleets(member="b")
    policy = BreakerPolicy(fail_max=3, reset_timeout_s=30.0)
    assert (await a.report(UP, False, policy)).state is BreakerState.CLOSED
    assert (await b.report(UP, True, policy)).state is BreakerState.CLOSED  # clears the count
    await a.report(UP, False, policy)
    await b.report(UP, False, policy)
    opened = await a.report(UP, False, policy)
    assert opened is not None
    assert opened.state is BreakerState.OPEN
    assert 29.0 < opened.retry_after_s <= 30.0
    # Reports while open are stale: a success does not close it.
    view = await b.report(UP, True, policy)
    assert view is not None
    assert view.state is BreakerState.OPEN
    view = await b.breaker(UP)
    assert view is not None
    assert view.state is BreakerState.OPEN


async def test_one_probe_for_the_fleet_and_its_verdict(fleets: Any) -> None:
    a, b = fleets(member="a"), fleets(member="b")
    policy = BreakerPolicy(fail_max=1, reset_timeout_s=0.2)
    await a.report(UP, False, policy)
    await half_open(b)
    assert await b.claim_probe(UP) is True
    assert await a.claim_probe(UP) is False
    view = await a.breaker(UP)
    assert view == BreakerView(BreakerState.HALF_OPEN, 0.0, True)
    # Only the probe's verdict counts.
    view = await a.report(UP, True, policy)
    assert view is not None
    assert view.state is BreakerState.HALF_OPEN
    view = await b.report(UP, False, policy, probe=True)
    assert view is not None
    assert view.state is BreakerState.OPEN
    assert not view.probe_out
    await half_open(a)
    assert await a.claim_probe(UP) is True
    closed = await a.report(UP, True, policy, probe=True)
    assert closed == BreakerView(BreakerState.CLOSED, 0.0, False)


async def test_success_threshold_probes_close_it(fleet: Either) -> None:
    policy = BreakerPolicy(fail_max=1, reset_timeout_s=0.1, success_threshold=2)
    await fleet.report(UP, False, policy)
    await half_open(fleet)
    assert await fleet.claim_probe(UP) is True
    view = await fleet.report(UP, True, policy, probe=True)
    assert view is not None
    assert view.state is BreakerState.HALF_OPEN
    assert await fleet.claim_probe(UP) is True
    view = await fleet.report(UP, True, policy, probe=True)
    assert view is not None
    assert view.state is BreakerState.CLOSED


async def test_a_probe_whose_member_died_lapses(fleets: Any) -> None:
    a, b = fleets(member="a"), fleets(member="b")
    policy = BreakerPolicy(fail_max=1, reset_timeout_s=0.1)
    await a.report(UP, False, policy)
    await half_open(a)
    assert await a.claim_probe(UP, ttl_s=0.2) is True  # a dies before reporting

    async def claimed() -> bool:
        return await b.claim_probe(UP) is True

    await wait_for(claimed)
