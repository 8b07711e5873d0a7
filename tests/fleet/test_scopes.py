"""Scopes in a fleet (issue 39): what a refusal, a 429's hint or a partial reading puts
on one model's quota stays on that model's, and nothing stays unseen in Redis once
nothing is in flight.

Gates serving two models through a real Redis, in one process (each Gate a
member of the fleet), as one application's workers share one key.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import anyio
import httpx
import pytest

from tests.fleet.conftest import RedisServer, wait_for
from yieldgate import Cost, FleetPolicy, Gate, GatePolicy
from yieldgate.dialects import OPENAI
from yieldgate.gate._shared import HOLDS_EVERY_S

pytestmark = pytest.mark.anyio


@pytest.fixture
def gates(redis_server: RedisServer) -> Iterator[Any]:
    made: list[Gate] = []
    name = f"scopes-{time.monotonic_ns()}"

    def make(**fleet: Any) -> Gate:
        gate = Gate(GatePolicy(fleet=FleetPolicy(budget_s=1.0, **fleet)), name=name,
                    shared=redis_server.url)  # fmt: skip
        made.append(gate)
        return gate

    yield make
    for gate in made:
        gate.close()


def tokens_reply(remaining: int, limit: int = 1000, reset: str = "10s") -> httpx.Response:
    return httpx.Response(
        200,
        json={},
        headers={
            "x-ratelimit-limit-tokens": str(limit),
            "x-ratelimit-remaining-tokens": str(remaining),
            "x-ratelimit-reset-tokens": reset,
        },
    )


async def call(gate: Gate, model: str, tokens: int, reply: httpx.Response) -> float:
    """One call of ``model`` costing ``tokens``, answered with ``reply``: its seconds."""

    async def send() -> httpx.Response:
        return reply

    start = time.monotonic()
    await gate.call(send, cost=Cost(1, tokens, tokens, 0, model), classify=OPENAI)
    return time.monotonic() - start


async def queued_for_the_quota(gate: Gate) -> None:
    """Until one of ``gate``'s calls waits in its quota's queue."""
    quota = gate._core.upstreams[0].quota
    deadline = time.monotonic() + 15.0
    while not any("queued for the quota" in p for p in quota.audit()):
        assert time.monotonic() < deadline, "no call queued for the quota"
        await anyio.sleep(0.01)


async def test_a_fleet_refusal_for_one_model_does_not_hold_another(gates: Any) -> None:
    """Regression: on main, the fleet's refusal of model a's take set one wait for the
    whole upstream, and model b's call (room in its own buckets, here and in the
    fleet) waited it out (18.0 s here; 7.75 s in the issue's reproduction)."""
    first, second = gates(), gates()
    # Both learn model a's quota (plenty left); the first then spends it all.
    await call(second, "a", 10, tokens_reply(900))
    await call(first, "a", 10, tokens_reply(900))
    await call(first, "a", 10, tokens_reply(0, reset="60s"))
    await call(second, "b", 10, tokens_reply(99_000, limit=100_000))
    async with anyio.create_task_group() as tg:
        # The second's own view of a has room (its share of 900); the fleet's has none.
        tg.start_soon(call, second, "a", 300, tokens_reply(500))
        await queued_for_the_quota(second)
        waited = await call(second, "b", 10, tokens_reply(99_000, limit=100_000))
        tg.cancel_scope.cancel()
    assert waited < 1.0, waited
    # Model a's claims still wait for a's refill: the refusal stayed on a's bucket.
    quota = second._core.upstreams[0].quota
    assert quota.binding(Cost(1, 300, 300, 0, "a"), time.monotonic()) is not None
    for gate in (first, second):
        assert gate._core.audit() == []


def both(requests_left: int, tokens_left: int) -> httpx.Response:
    """An answer with both buckets' headers: 1,000 requests and 10,000 tokens a minute."""
    return httpx.Response(
        200,
        json={},
        headers={
            "x-ratelimit-limit-requests": "1000",
            "x-ratelimit-remaining-requests": str(requests_left),
            "x-ratelimit-reset-requests": "60ms",
            "x-ratelimit-limit-tokens": "10000",
            "x-ratelimit-remaining-tokens": str(tokens_left),
            "x-ratelimit-reset-tokens": "600ms",
        },
    )


def requests_only(requests_left: int) -> httpx.Response:
    """An answer that reads the requests bucket alone (a proxy that passes some headers)."""
    return httpx.Response(
        200,
        json={},
        headers={
            "x-ratelimit-limit-requests": "1000",
            "x-ratelimit-remaining-requests": str(requests_left),
            "x-ratelimit-reset-requests": "60ms",
        },
    )


def unseen(redis_server: RedisServer, gate: Gate) -> dict[str, float]:
    """Each of the fleet's buckets of ``gate``'s upstream, and what it counts unseen."""
    admin = redis_server.client()
    try:
        pattern = f"yieldgate:{gate.name}:*:quota:*"
        return {
            key.decode().rpartition(":quota:")[2]: float(admin.hget(key, "unseen") or 0)  # type: ignore[arg-type]
            for key in admin.scan_iter(match=pattern)
        }
    finally:
        admin.close()


async def test_readings_of_some_buckets_leave_nothing_unseen(
    gates: Any, redis_server: RedisServer
) -> None:
    """Regression: on main, forty answers that read the requests bucket but not the
    tokens one left 8,000 of the tokens bucket's 10,000 unseen in the fleet with
    nothing in flight, and a 4,000-token call waited for a refill (12.6 s in the
    issue) while the provider said 9,900 tokens were left."""
    gate = gates()
    await call(gate, "gpt-4o", 200, both(999, 9800))  # learns both buckets
    for i in range(40):
        await call(gate, "gpt-4o", 200, requests_only(998 - i))
    await call(gate, "gpt-4o", 1, both(950, 9900))
    # The provider says 9,900 are left: a 4,000-token call goes at once.
    waited = await call(gate, "gpt-4o", 4000, both(949, 5900))
    fleet = unseen(redis_server, gate)
    nothing = {"openai:requests@gpt-4o": 0, "openai:tokens@gpt-4o": 0}
    assert waited < 1.0, (waited, fleet)
    assert fleet == nothing
    upstream = gate._core.upstreams[0].name
    shared = gate._core.shared
    assert shared is not None
    assert shared.fleet.audit_sync(upstream) == []
    assert gate._core.audit() == []


async def test_a_429_one_member_sees_holds_that_model_alone_fleet_wide(gates: Any) -> None:
    """A provider's 429 for model a on one member holds model a's calls on the others
    (over the hint, with its jitter), and never model b's."""
    first, second = gates(), gates()
    await call(second, "b", 10, tokens_reply(99_000, limit=100_000))
    refused_at: list[float] = []

    async def refused_then_ok() -> httpx.Response:
        if refused_at:
            return tokens_reply(900)
        refused_at.append(time.monotonic())
        return httpx.Response(429, headers={"retry-after": "2"}, json={})

    fleet = first._core.shared.fleet  # type: ignore[union-attr]
    upstream = first._core.upstreams[0].name
    async with anyio.create_task_group() as tg:
        tg.start_soon(
            lambda: first.call(refused_then_ok, cost=Cost(1, 10, 10, 0, "a"), classify=OPENAI)
        )

        async def shared() -> bool:
            return bool((await fleet.all_holds(upstream) or {}).get("a"))

        await wait_for(shared)
        await anyio.sleep(HOLDS_EVERY_S)  # each member reads the holds this often
        assert await call(second, "b", 10, tokens_reply(99_000, limit=100_000)) < 1.0
        await call(second, "a", 10, tokens_reply(900))
        a_done = time.monotonic() - refused_at[0]
    # Model a waited out the hint on the member that never saw the 429.
    assert a_done >= 2.0, a_done
    # The whole upstream was never held.
    assert await fleet.holds(upstream) == {}
    for gate in (first, second):
        assert gate._core.audit() == []


def test_the_gates_audit_sees_a_take_left_unseen_in_the_fleet(
    redis_server: RedisServer,
) -> None:
    """What the fleet counts unseen is the member's to settle: its audit says so of a
    take granted and never settled (as a dropped ``finished`` would leave it)."""
    from yieldgate.fleet import Take
    from yieldgate.gate._quota import Claim
    from yieldgate.protocol import Priority

    with Gate(name=f"audit-{time.monotonic_ns()}", shared=redis_server.url) as gate:
        core = gate._core
        shared, up = core.shared, core.upstreams[0]
        assert shared is not None
        claim = Claim(Cost(1, 10, 10, 0, "a"), Priority.NORMAL, 0.0)
        claim.wants = [("openai:tokens@a", 10.0, 1000.0, 10.0)]
        with core.lock:
            assert shared.took(core.upstreams, up, claim, Take(True, 1, 0.0), 0.0)
        assert core.audit() == ["1 fleet take(s) still counted unseen"]
        with core.lock:
            shared.finished(up, claim)  # the attempt ended: what no reading settled is
        assert [op.name for op in shared.backlog] == ["finished"]
        assert [op.args for op in shared.backlog] == [(up.name, [("openai:tokens@a", 10.0)])]
        shared.backlog.clear()
        assert core.audit() == []


def test_a_refusal_that_names_no_bucket_holds_back_every_bucket_of_the_take(
    redis_server: RedisServer,
) -> None:
    """A reply without the buckets that refused (the reply's old form): every bucket the
    take spent from waits, as the whole take had to; the others' claims go on."""
    from yieldgate.fleet import Take
    from yieldgate.gate._quota import Claim, QuotaReading
    from yieldgate.protocol import Priority

    with Gate(name=f"old-{time.monotonic_ns()}", shared=redis_server.url) as gate:
        core = gate._core
        shared, up = core.shared, core.upstreams[0]
        assert shared is not None
        quota = up.quota
        for scope in ("a", "b"):
            quota.observe([QuotaReading("openai:tokens", "tokens", 1000.0, 900.0)],
                          Claim(Cost(0, 0, 0, 0, scope), Priority.NORMAL, 0.0), 0.0)  # fmt: skip

        def claim(scope: str) -> Claim:
            c = Claim(Cost(1, 10, 10, 0, scope), Priority.NORMAL, 0.0)
            c.wants = quota.wants(c.cost)
            return c

        now = core.clock()
        with core.lock:
            assert not shared.took(core.upstreams, up, claim("a"), Take(False, 0, 5.0), now)
            other = claim("b")
            assert quota.try_take(other, now)
            assert not quota.try_take(claim("a"), now)
            assert quota.binding(Cost(1, 10, 10, 0, "a"), now) is quota.buckets["openai:tokens@a"]
            quota.refund(other, now)
        assert core.audit() == []
