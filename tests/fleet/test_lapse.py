"""Issue 39, defect 6: a held slot that lapses gives its fleet in-flight lease back too.

A response body nobody reads for an attempt's time lapses (``Lease.lapse_after``,
set by the HTTP transports): its window slot is free again. Its fleet lease was
not: the fleet link's worker went on renewing it, so another member of the fleet
waited out its whole time-out while the first one had nothing in flight, until a
later call on the first member happened to look. Real Redis here
(tests/fleet/conftest.py) and real time, with bounds that a loaded machine meets.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx2
import pytest

from tests.fleet.conftest import RedisServer
from tests.gate.holdings import held
from yieldgate import FleetPolicy, Gate, GatePolicy, TimeoutPolicy, http_client

IDLE_S = 0.5  # the attempt's timeout: a body nobody reads this long lapses


def chunks() -> Iterator[bytes]:
    yield b"data: first\n\n"
    yield b"data: second\n\n"


def stream(request: httpx2.Request) -> httpx2.Response:
    return httpx2.Response(200, headers={"content-type": "text/event-stream"}, content=chunks())


@pytest.fixture
def members(redis_server: RedisServer, gate: str) -> Iterator[tuple[Gate, Gate]]:
    """Two members of one fleet whose cap is one attempt in flight; leases last 3 s,
    renewed every second by each member's worker while held."""

    def member() -> Gate:
        policy = GatePolicy(
            fleet=FleetPolicy(inflight_cap=1, lease_ttl_s=3.0, budget_s=1.0),
            timeout=TimeoutPolicy(attempt_s=IDLE_S, total_s=30.0),
        )
        return Gate(policy, name=gate, shared=redis_server.url)

    a, b = member(), member()
    try:
        yield a, b
    finally:
        a.close()
        b.close()


def test_a_lapsed_body_gives_its_fleet_lease_back_with_no_later_call(
    members: tuple[Gate, Gate], redis_server: RedisServer, gate: str
) -> None:
    """Member A reads one chunk of a stream and leaves it, still referenced (no garbage
    collection comes), and makes no other call; member B's call waits for the fleet's
    only in-flight slot. It gets it once A's body has lapsed: promptly, not at B's
    time-out (on the old Gate A's worker renewed the lease for ever)."""
    a, b = members
    with http_client(a, sync=True, inner=httpx2.MockTransport(stream)) as client:
        request = client.build_request("POST", "http://upstream.test/v1/chat/completions")
        response = client.send(request, stream=True)
        body = response.iter_bytes()
        assert next(body) == b"data: first\n\n"
        read_at = time.monotonic()
        leases = redis_server.client()
        key = a._core.shared.fleet.keys.leases(gate)  # type: ignore[union-attr]
        assert leases.zcard(key) == 1  # A's body holds the fleet's only slot
        # B waits for it (a condition wait: its call parks in the fleet's line).
        started: list[float] = []

        def attempt() -> str:
            started.append(time.monotonic())
            return "ok"

        got: Any = b.call_sync(attempt, timeout=8.0)
        assert got == "ok"
        waited = started[0] - read_at
        # The lapse comes IDLE_S after the read; then A's worker gives the lease back
        # and B's next ask (every poll_s) gets it.
        assert IDLE_S <= waited < IDLE_S + 3.0, f"B got the fleet's slot {waited:.2f} s on"
        assert a.statistics().window.inflight == 0  # the lapse freed A's window slot too
        assert not a._core.shared.leases  # type: ignore[union-attr]  # nothing renewed
        assert held(a) == []
        assert held(b) == []
        assert leases.zcard(key) == 0
        leases.close()
        response.close()  # after its lapse: gives nothing back a second time
    assert held(a) == []
