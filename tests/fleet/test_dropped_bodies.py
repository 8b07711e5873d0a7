"""A body dropped in a reference cycle gives its fleet lease back to a caller waiting for one.

With ``FleetPolicy.inflight_cap``, a stream the user left unclosed holds one of the fleet's
in-flight leases as well as a window slot (issue 39, defect 8). A caller of the same member
that waits for a fleet lease collects, as one waiting for a window slot does
(``yieldgate.gate._dropped``): the dropped stream's lease is released in Redis and the
caller goes on, instead of waiting for the body's lapse (the attempt's time, 60 s).
"""

from __future__ import annotations

import gc
import time
from collections.abc import Iterator

import pytest

from tests.fleet.conftest import RedisServer
from tests.gate.holdings import held
from yieldgate import FleetPolicy, Gate, GatePolicy, WindowPolicy
from yieldgate.gate import Lease, _dropped


@pytest.fixture
def member(redis_server: RedisServer, gate: str) -> Iterator[Gate]:
    """A member of a fleet with one in-flight lease, and room in its own window."""
    policy = GatePolicy(
        window=WindowPolicy.fixed(8), fleet=FleetPolicy(inflight_cap=1, budget_s=1.0)
    )
    g = Gate(policy, name=gate, shared=redis_server.url)
    try:
        yield g
    finally:
        g.close()


@pytest.fixture(autouse=True)
def collector(monkeypatch: pytest.MonkeyPatch) -> _dropped.Collector:
    fresh = _dropped.Collector()
    monkeypatch.setattr(_dropped, "COLLECTOR", fresh)
    return fresh


class Cycle:
    """A dropped stream's cycle (openai's ``Stream`` and its generator), with the lease."""

    def __init__(self, lease: Lease) -> None:
        self.lease = lease
        self.me = self


def test_a_caller_waiting_for_a_fleet_lease_finds_the_dropped_body_that_holds_it(
    member: Gate, collector: _dropped.Collector
) -> None:
    _, lease = member.call_and_hold_sync(lambda: "streaming", timeout=30)
    lease.lapse_after(60.0)
    cycle = Cycle(lease)
    del lease
    gc.collect()  # it lived a while: in the oldest generation
    del cycle
    made = time.monotonic()
    # On main: the fleet lease came back only when the body lapsed (60 s), past 10 s.
    assert member.call_sync(lambda: "next", timeout=10) == "next"
    took = time.monotonic() - made
    assert took < 2.0, f"the call waited {took:.2f} s for the fleet lease"
    assert collector.runs[2] >= 1
    assert held(member) == []
