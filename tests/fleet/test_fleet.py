"""The drivers: every operation in both forms, bounded by the budget, ``None`` on any failure.

Redis stopped, restarted, flushed of its scripts, or slowed by a proxy: no
call raises, none waits past the budget, and the fleet rejoins when Redis
answers again.
"""

from __future__ import annotations

import hashlib
import inspect
import logging
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

import anyio
import pytest
import redis
import redis.asyncio

from tests.fleet.conftest import DelayProxy, Either, RedisServer, wait_for
from yieldgate import Gate
from yieldgate.fleet import BucketShape, Fleet, Take
from yieldgate.fleet._scripts import SCRIPTS
from yieldgate.gate import BreakerPolicy, RetryBudgetPolicy

pytestmark = pytest.mark.anyio

UP = "api.example"
WANTS = [("tokens", 1, 1000, 10.0)]

OPERATIONS: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = [
    ("take", (UP, WANTS), {}),
    ("refund", (UP, [("tokens", 1)]), {}),
    ("observe", (UP, "tokens"), {"limit": 10, "rate": 0, "remaining": 5, "amount": 1, "seq": 1}),
    ("finished", (UP, [("tokens", 1)]), {}),
    ("shapes", (UP,), {}),
    ("first", (UP, 1.0), {}),
    ("probed", (UP, {"openai:tokens": ("tokens", 600.0, 10.0)}, 1.0), {}),
    ("abandon_first", (UP,), {}),
    ("settle", (UP, [("tokens", -1.5)]), {}),
    ("hold", (UP, 1, 1.0), {}),
    ("holds", (UP,), {}),
    ("all_holds", (UP,), {}),
    ("acquire", (UP, 4), {}),
    ("release", (UP, "x#1"), {}),
    ("renew", (UP, ["x#1"]), {}),
    ("heartbeat", (UP,), {}),
    ("members", (UP,), {}),
    ("leave", (UP,), {}),
    ("deposit", (UP, RetryBudgetPolicy()), {}),
    ("withdraw", (UP, RetryBudgetPolicy()), {}),
    ("refund_retry", (UP, RetryBudgetPolicy(), 1), {}),
    ("report", (UP, False, BreakerPolicy()), {}),
    ("breaker", (UP,), {}),
    ("claim_probe", (UP,), {}),
    ("release_probe", (UP,), {}),
    ("audit", (UP,), {}),
]


def test_the_operations_listed_are_every_operation() -> None:
    lifecycle = {"aclose", "close", "statistics"}
    public = {
        name
        for name, value in inspect.getmembers(Fleet, inspect.isfunction)
        if not name.startswith("_") and name not in lifecycle
    }
    listed = {name for name, _, _ in OPERATIONS}
    assert public == listed | {f"{name}_sync" for name in listed}
    for name in listed:
        assert inspect.iscoroutinefunction(getattr(Fleet, name))
        assert not inspect.iscoroutinefunction(getattr(Fleet, f"{name}_sync"))


async def test_every_operation_answers_from_a_live_redis(fleet: Either) -> None:
    for name, args, kwargs in OPERATIONS:
        assert await getattr(fleet, name)(*args, **kwargs) is not None, name
    stats = fleet.fleet.statistics()
    assert (stats.available, stats.calls, stats.fallbacks) == (True, len(OPERATIONS), 0)


async def test_a_stopped_redis_costs_nothing_per_call(
    fresh_redis: RedisServer, gate: str, mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    async with Fleet(fresh_redis.url, gate=gate) as fleet:
        either = Either(fleet, mode)
        assert await either.take(UP, WANTS) is not None
        fresh_redis.stop()
        with caplog.at_level(logging.INFO, logger="yieldgate.fleet"):
            for name, args, kwargs in OPERATIONS:
                assert await getattr(either, name)(*args, **kwargs) is None, name
            calls = 1000
            start = time.monotonic()
            for _ in range(calls):
                assert await either.take(UP, WANTS) is None
            per_call = (time.monotonic() - start) / calls
        # Skipped, not tried: a small fraction of the budget each, however slow the machine.
        assert per_call < fleet.budget_s / 10
        stats = fleet.statistics()
        assert not stats.available
        assert (stats.outages, stats.rejoins) == (1, 0)
        assert stats.fallbacks == len(OPERATIONS) + calls
        warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1


async def test_a_restarted_redis_is_rejoined_and_its_scripts_reloaded(
    fresh_redis: RedisServer, gate: str, mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    async with Fleet(fresh_redis.url, gate=gate, backoff_s=0.05, max_backoff_s=0.2) as fleet:
        either = Either(fleet, mode)
        assert await either.take(UP, WANTS) is not None
        fresh_redis.stop()
        assert await either.take(UP, WANTS) is None
        fresh_redis.start()  # the same port, no scripts, no state

        async def answers() -> bool:
            return await either.take(UP, WANTS) is not None

        with caplog.at_level(logging.INFO, logger="yieldgate.fleet"):
            await wait_for(answers)
        stats = fleet.statistics()
        assert stats.available
        assert (stats.outages, stats.rejoins) == (1, 1)
        assert any("rejoined" in r.getMessage() for r in caplog.records)
        admin = fresh_redis.client()
        try:
            sha = hashlib.sha1(SCRIPTS["take"].encode()).hexdigest()
            assert admin.script_exists(sha) == [True]
            assert admin.get(f"yieldgate:{gate}:{{{UP}}}:seq") == b"1"  # state starts over
        finally:
            admin.close()


async def test_scripts_flushed_from_redis_are_loaded_again(
    fleet: Either, admin: redis.Redis
) -> None:
    assert await fleet.take(UP, WANTS) is not None
    admin.script_flush()
    take = await fleet.take(UP, WANTS)
    assert take is not None
    assert take.seq == 2
    assert fleet.fleet.statistics().fallbacks == 0


@pytest.mark.parametrize("delay_s", [0.1, 1.0])
async def test_a_slow_redis_is_given_up_on_within_the_budget(
    redis_server: RedisServer, gate: str, mode: str, delay_s: float
) -> None:
    with DelayProxy(redis_server.port, 0.0) as proxy:
        async with Fleet(proxy.url, gate=gate, budget_s=0.05) as fleet:
            either = Either(fleet, mode)
            assert await either.take(UP, WANTS) is not None  # joined: Redis answered once
            proxy.delay_s = delay_s
            start = time.monotonic()
            assert await either.take(UP, WANTS) is None
            elapsed = time.monotonic() - start
            assert await either.holds(UP) is None  # skipped at once now
            assert fleet.statistics().outages == 1
    if delay_s >= 1.0:
        # An answer would have taken a second: given up on long before.
        assert elapsed < 0.5


async def test_a_member_joining_waits_for_a_slow_first_answer(
    redis_server: RedisServer, gate: str, mode: str
) -> None:
    """Until Redis first answers a member, a round trip may take ``join_s``, not just
    ``budget_s``: a member that never reached its fleet does not know how many share
    the quota, and alone it would pace the whole of it as its own. Once joined, the
    budget bounds every round trip (the sync client's socket time-outs too)."""
    with DelayProxy(redis_server.port, 0.3) as proxy:
        async with Fleet(proxy.url, gate=gate, budget_s=0.05, join_s=2.0) as fleet:
            either = Either(fleet, mode)
            first = await either.take(UP, WANTS)
            assert first == Take(True, 1, 0.0)
            assert fleet.statistics().outages == 0
            assert await either.take(UP, WANTS) is None  # joined: the budget bounds it
            assert fleet.statistics().outages == 1


async def test_a_join_bound_no_longer_than_the_budget_is_the_budget(
    redis_server: RedisServer, gate: str
) -> None:
    with DelayProxy(redis_server.port, 0.3) as proxy:
        async with Fleet(proxy.url, gate=gate, budget_s=0.05, join_s=0.0) as fleet:
            assert fleet.join_s == 0.05
            assert await fleet.take(UP, WANTS) is None
    with pytest.raises(ValueError, match="join_s must be"):
        Fleet(redis_server.url, gate=gate, join_s=-1.0)


async def test_a_slow_redis_within_a_larger_budget_answers(
    redis_server: RedisServer, gate: str, mode: str
) -> None:
    with DelayProxy(redis_server.port, 0.1) as proxy:
        async with Fleet(proxy.url, gate=gate, budget_s=5.0) as fleet:
            take = await Either(fleet, mode).take(UP, WANTS)
            assert take == Take(True, 1, 0.0)


async def test_a_cancelled_call_is_no_verdict_on_redis(
    redis_server: RedisServer, gate: str
) -> None:
    with DelayProxy(redis_server.port, 1.0) as proxy:
        async with Fleet(proxy.url, gate=gate, budget_s=10.0) as fleet:
            with anyio.move_on_after(0.1) as scope:
                await fleet.take(UP, WANTS)
            assert scope.cancelled_caught
            stats = fleet.statistics()
            assert stats.available
            assert stats.fallbacks == 0


async def test_a_pair_of_clients_stays_the_callers(redis_server: RedisServer, gate: str) -> None:
    sync = redis.Redis(host="127.0.0.1", port=redis_server.port)
    async_client = redis.asyncio.Redis(host="127.0.0.1", port=redis_server.port)
    fleet = Fleet((sync, async_client), gate=gate)
    assert await fleet.take(UP, WANTS) == Take(True, 1, 0.0)
    assert fleet.take_sync(UP, WANTS) == Take(True, 2, 0.0)
    await fleet.aclose()
    assert await fleet.take(UP, WANTS) is None  # closed
    assert sync.ping()  # the caller's, still open
    assert await async_client.ping()
    sync.close()
    await async_client.aclose()


async def test_an_async_form_without_an_async_client_uses_the_sync_one(
    redis_server: RedisServer, gate: str
) -> None:
    sync = redis.Redis(host="127.0.0.1", port=redis_server.port, decode_responses=True)
    fleet = Fleet((sync, None), gate=gate)
    assert await fleet.take(UP, WANTS) == Take(True, 1, 0.0)
    view = await fleet.breaker(UP)
    assert view is not None
    assert view.state == "closed"
    fleet.close()
    sync.close()


@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_the_async_forms_run_on_trio_too(redis_server: RedisServer, gate: str) -> None:
    async with Fleet(redis_server.url, gate=gate) as fleet:
        assert await fleet.take(UP, WANTS) == Take(True, 1, 0.0)
        assert await fleet.hold(UP, 0, 1.0) is True


def test_importing_yieldgate_needs_no_redis_and_leaves_the_fleet_out() -> None:
    # pybreaker (the breaker's state machine) imports redis by itself when it is
    # installed, for its own CircuitRedisStorage; yieldgate must not need it.
    code = (
        "import sys; sys.modules['redis'] = None; "
        "import yieldgate, yieldgate.gate; "
        "print(sorted(m for m in sys.modules if m.startswith('yieldgate.fleet')))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"


def test_a_forked_child_is_a_member_of_its_own(redis_server: RedisServer) -> None:
    """A child forked from a member (a prefork server) inherited its name and its lease
    numbers: the two processes' leases had the same ids, so one's release freed the
    other's slot. A member named by the caller keeps its name."""
    own = Fleet(redis_server.url, gate="fork", budget_s=1.0)
    named = Fleet(redis_server.url, gate="fork", member="web-1", budget_s=1.0)
    parent_lease = own.acquire_sync("up", 4)
    assert isinstance(parent_lease, str)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report its names and its first lease, then leave at once
        try:
            lease = own.acquire_sync("up", 4)
            os.write(write, f"{own.member}|{named.member}|{lease}".encode())
        finally:
            os._exit(0)
    os.close(write)
    try:
        with os.fdopen(read, "rb") as pipe:
            member, named_member, child_lease = pipe.read().decode().split("|")
    finally:
        end = time.monotonic() + 30
        while os.waitpid(pid, os.WNOHANG) == (0, 0):
            if time.monotonic() > end:
                os.kill(pid, 9)
            time.sleep(0.01)
    assert member != own.member
    assert named_member == "web-1"
    assert child_lease.startswith(member)
    assert child_lease != parent_lease
    own.close()
    named.close()


@pytest.mark.parametrize(
    "url",
    [
        "http://user:s3cret-pw@127.0.0.1/0",  # not Redis
        "redis://:s3cret-pw@127.0.0.1:notaport/0",  # redis-py cannot read it
    ],
)
def test_a_bad_url_is_refused_without_its_password(url: str) -> None:
    for build in (lambda: Fleet(url, gate="g"), lambda: Gate(name="g", shared=url)):
        with pytest.raises(ValueError, match="shared") as caught:
            build()
        message = "".join(str(e) for e in (caught.value, caught.value.__cause__) if e)
        assert "s3cret-pw" not in message
        assert "***@127.0.0.1" in message


def test_a_url_scheme_in_capitals_is_a_redis_url(redis_server: RedisServer) -> None:
    url = redis_server.url.replace("redis://", "REDIS://")
    with Fleet(url, gate=f"caps-{uuid.uuid4().hex[:6]}") as fleet:
        assert fleet.heartbeat_sync("up") is not None


def test_an_upstream_name_redis_keys_cannot_carry_is_refused_when_the_gate_is_built(
    redis_server: RedisServer,
) -> None:
    with pytest.raises(ValueError, match="braces"):
        Gate(name="g", upstreams=["a{b}"], shared=redis_server.url)
    with Fleet(redis_server.url, gate="named-ok") as fleet:
        with pytest.raises(ValueError, match="braces"):
            Gate(name="x{y}", shared=fleet)  # its one upstream is named after it
        gate = Gate(name="g", upstreams=["a"], shared=fleet)
        with pytest.raises(ValueError, match="braces"):
            gate.add_upstream("c}")
        assert gate.upstreams == ("a",)


# -- the first reading of a quota ----------------------------------------------------


async def test_the_first_member_to_ask_probes_and_the_others_wait(
    fleets: Callable[..., Either],
) -> None:
    a, b = fleets(member="a"), fleets(member="b")
    assert (await a.first(UP, 30.0)).state == "mine"
    assert (await a.first(UP, 30.0)).state == "mine"  # asked again: still its own
    assert (await b.first(UP, 30.0)).state == "other"
    # One bucket of the probe's answer already observed: not all of them yet, b waits.
    await a.observe(UP, "openai:requests@m", limit=60, rate=1, remaining=59, amount=0, seq=0,
                    resource="requests")  # fmt: skip
    assert (await b.first(UP, 30.0)).state == "other"
    # The probe's member tells every bucket its answer taught, at once.
    shapes = {
        "openai:requests@m": ("requests", 60.0, 1.0),
        "openai:tokens@m": ("tokens", 600.0, 10.0),
    }
    assert await a.probed(UP, shapes, 30.0)
    known = await b.first(UP, 30.0)
    assert known.state == "known"
    assert known.shapes == {key: BucketShape(*shape) for key, shape in shapes.items()}


async def test_a_probe_answered_with_no_quota_ends_every_wait(
    fleets: Callable[..., Either],
) -> None:
    a, b = fleets(member="a"), fleets(member="b")
    assert (await a.first(UP, 30.0)).state == "mine"
    assert await b.probed(UP, {}, 30.0)  # not b's probe: changes nothing
    assert (await b.first(UP, 30.0)).state == "other"
    assert await a.probed(UP, {}, 30.0)
    assert (await b.first(UP, 30.0)).state == "none"
    assert (await a.first(UP, 30.0)).state == "none"


async def test_a_probe_whose_member_vanished_lapses_to_the_next(
    fleets: Callable[..., Either],
) -> None:
    a, b = fleets(member="a"), fleets(member="b")
    assert (await a.first(UP, 0.05)).state == "mine"
    await wait_for(lambda: _state_is(b, "mine"))


async def _state_is(member: Either, state: str) -> bool:
    got = await member.first(UP, 0.05)
    return got is not None and got.state == state


async def test_a_probe_abandoned_goes_to_the_next_member_that_asks(
    fleets: Callable[..., Either],
) -> None:
    a, b = fleets(member="a"), fleets(member="b")
    assert (await a.first(UP, 30.0)).state == "mine"
    assert (await b.first(UP, 30.0)).state == "other"
    assert await b.abandon_first(UP) is False  # not b's: changes nothing
    assert (await b.first(UP, 30.0)).state == "other"
    # a's probe never got its answer: b, asking next, takes it at once (not in 30 s).
    assert await a.abandon_first(UP) is True
    assert (await b.first(UP, 30.0)).state == "mine"
    assert (await a.first(UP, 30.0)).state == "other"
    # A settled reading is never abandoned.
    assert await b.probed(UP, {}, 30.0)
    assert await b.abandon_first(UP) is False
    assert (await a.first(UP, 30.0)).state == "none"
