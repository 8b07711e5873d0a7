"""Gates that share their state through a real Redis, in one process (the members'
processes are in test_fleet_e2e.py): the quota, hint holds, the in-flight cap, and
what a Gate does when Redis is slow or gone."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

import anyio
import httpx
import pytest

from tests.fleet.conftest import DelayProxy, RedisServer
from yieldgate import (
    BreakerPolicy,
    CircuitOpenError,
    Cost,
    FleetConfigError,
    FleetPolicy,
    Gate,
    GatePolicy,
    Outcome,
    QuotaPolicy,
    RetriesExhaustedError,
    RetryBudgetExhaustedError,
    RetryBudgetPolicy,
    RetryPolicy,
)
from yieldgate.dialects import OPENAI

pytestmark = pytest.mark.anyio


def openai_reply(remaining: int, limit: int = 1000, reset: str = "60s") -> httpx.Response:
    return httpx.Response(
        200,
        json={"ok": True},
        headers={
            "x-ratelimit-limit-tokens": str(limit),
            "x-ratelimit-remaining-tokens": str(remaining),
            "x-ratelimit-reset-tokens": reset,
        },
    )


async def _ok() -> str:
    return "ok"


async def waits_instead_of_sending(gate: Gate, cost: Cost, for_s: float = 1.0) -> bool:
    """Whether a call of ``cost`` through ``gate`` is still waiting after ``for_s``,
    never sent (it is cancelled then)."""
    sent = 0

    async def count() -> str:
        nonlocal sent
        sent += 1
        return "ok"

    with anyio.move_on_after(for_s) as scope:
        await gate.call(count, cost=cost, classify=OPENAI)
    return scope.cancelled_caught and sent == 0


@pytest.fixture
def gates(redis_server: RedisServer) -> Iterator[Any]:
    made: list[Gate] = []
    name = f"shared-{time.monotonic_ns()}"

    def make(url: str | None = None, **fleet: Any) -> Gate:
        policy = GatePolicy(fleet=FleetPolicy(**{"budget_s": 1.0, **fleet}))
        gate = Gate(policy, name=name, shared=url or redis_server.url)
        made.append(gate)
        return gate

    yield make
    for gate in made:
        gate.close()


def test_a_shared_gate_needs_a_name(redis_server: RedisServer) -> None:
    with pytest.raises(ValueError, match="needs a name"):
        Gate(shared=redis_server.url)


async def test_what_one_member_spends_of_the_quota_paces_the_other(gates: Any) -> None:
    first, second = gates(), gates()

    def replying(remaining: int) -> Any:
        async def answer() -> httpx.Response:
            # 1000 tokens refilled at 100 a second: full again in (1000 - remaining) / 100 s.
            return openai_reply(remaining, limit=1000, reset=f"{(1000 - remaining) / 100}s")

        return answer

    # Both learn the quota from a response each (plenty left).
    await second.call(replying(900), cost=Cost(1, 100), classify=OPENAI)
    await first.call(replying(900), cost=Cost(1, 100), classify=OPENAI)
    # The first spends it all: the provider says nothing is left.
    await first.call(replying(0), cost=Cost(1, 100), classify=OPENAI)
    # The second's own view still says 900 left; the fleet's bucket says 0.
    started = time.monotonic()
    await second.call(replying(500), cost=Cost(1, 500), classify=OPENAI)
    # 500 tokens at 100 a second: about 5 s (some may have refilled while we got here).
    assert time.monotonic() - started >= 2.0
    shared = second._core.shared
    assert shared is not None
    assert shared.available


async def test_a_member_with_no_answer_yet_paces_by_the_fleets_buckets(gates: Any) -> None:
    first, second = gates(), gates()

    async def spent() -> httpx.Response:
        # 1000 tokens refilled at 100 a second, none left.
        return openai_reply(0, limit=1000, reset="10s")

    await first.call(spent, cost=Cost(1, 100), classify=OPENAI)
    # The second has had no answer: it knows the bucket from the fleet, not from a
    # response, and waits for the refill (500 tokens at 100 a second) instead of sending.
    assert await waits_instead_of_sending(second, Cost(1, 500))
    bucket = second._core.upstreams[0].quota.buckets["openai:tokens"]
    assert (bucket.resource, bucket.limit, bucket.rate) == ("tokens", 1000, 100)
    window = second.statistics().window
    assert (window.inflight, window.waiting) == (0, 0)


async def test_before_any_answer_one_members_request_probes_and_the_rest_wait(
    gates: Any,
) -> None:
    """Two members with no answer yet, ten calls each at once: one request goes (the
    probe); every other call waits until its reading is the fleet's, then is paced."""
    first, second = gates(), gates()
    sent: list[int] = []
    answered = anyio.Event()

    async def provider() -> httpx.Response:
        sent.append(len(sent))
        if not answered.is_set():
            await anyio.sleep(0.3)  # the probe's answer takes its time
            answered.set()
        return openai_reply(900, limit=1000, reset="1s")

    async def calls(gate: Gate) -> None:
        async with anyio.create_task_group() as tg:
            for _ in range(10):
                tg.start_soon(lambda: gate.call(provider, cost=Cost(1, 10), classify=OPENAI))

    async def before_the_answer() -> int:
        await answered.wait()
        return len(sent)

    async with anyio.create_task_group() as tg:
        tg.start_soon(calls, first)
        tg.start_soon(calls, second)
        # Only the probe went before its answer came.
        assert await before_the_answer() == 1
    assert len(sent) == 20
    for gate in (first, second):
        assert gate._core.audit() == []


async def test_a_probes_answer_half_written_is_not_paced_by(
    gates: Any, redis_server: RedisServer
) -> None:
    """While another member's probe is out, the fleet's shapes may hold some of its
    answer's buckets only (each reading writes its own): a member must not pace by
    the requests bucket alone and send the tokens' worth blind."""
    member = gates(first_reading_s=60.0)
    upstream = member._core.upstreams[0].name
    shared = member._core.shared
    assert shared is not None
    from yieldgate.fleet import Fleet

    async with Fleet(redis_server.url, gate=member.name, member="prober", budget_s=1.0) as other:
        assert (await other.first(upstream, 60.0)).state == "mine"
        await other.observe(upstream, "openai:requests", limit=100, rate=1.0, remaining=99,
                            amount=0, seq=0, resource="requests")  # fmt: skip
        assert await waits_instead_of_sending(member, Cost(1, 500))
        assert member._core.upstreams[0].quota.buckets == {}
        # The probe's answer, all of it: the member paces by both buckets, and goes.
        shapes = {
            "openai:requests": ("requests", 100.0, 1.0),
            "openai:tokens": ("tokens", 1000.0, 100.0),
        }
        assert await other.probed(upstream, shapes, 60.0)
        assert await member.call(lambda: _ok(), cost=Cost(1, 500), classify=OPENAI) == "ok"
        assert set(member._core.upstreams[0].quota.buckets) == set(shapes)


async def test_a_probe_answered_with_no_quota_lets_every_member_go(gates: Any) -> None:
    first, second = gates(first_reading_s=60.0), gates(first_reading_s=60.0)
    probe_done = anyio.Event()
    sent = 0

    async def no_headers() -> str:
        nonlocal sent
        sent += 1
        if sent == 1:
            await anyio.sleep(0.2)
            probe_done.set()
        return "ok"

    start = time.monotonic()
    async with anyio.create_task_group() as tg:
        for gate in (first, second):
            for _ in range(5):
                tg.start_soon(lambda g=gate: g.call(no_headers, classify=OPENAI))
    # Every wait ended with the probe's answer: nobody sat out first_reading_s.
    assert time.monotonic() - start < 30.0
    assert sent == 10


async def test_no_wait_for_a_first_reading_when_it_is_off(gates: Any) -> None:
    first, second = gates(first_reading_s=0), gates(first_reading_s=0)
    inflight = peak = 0

    async def slow() -> httpx.Response:
        nonlocal inflight, peak
        inflight += 1
        peak = max(peak, inflight)
        await anyio.sleep(0.2)
        inflight -= 1
        return openai_reply(900)

    async with anyio.create_task_group() as tg:
        for gate in (first, second):
            for _ in range(3):
                tg.start_soon(lambda g=gate: g.call(slow, cost=Cost(1, 10), classify=OPENAI))
    assert peak > 1  # blind, as a Gate alone sends them


async def test_a_model_new_to_a_member_paces_by_what_the_fleet_learnt_of_it(
    gates: Any,
) -> None:
    first, second = gates(), gates()

    async def answer(remaining: int) -> httpx.Response:
        return openai_reply(remaining, limit=1000, reset="10s")

    # The second member knows model a's quota from its own answer (plenty left) ...
    await second.call(lambda: answer(900), cost=Cost(1, 10, scope="a"), classify=OPENAI)
    # ... the first has spent model b's.
    await first.call(lambda: answer(0), cost=Cost(1, 100, scope="b"), classify=OPENAI)
    # The second's first model-b call waits for b's refill instead of sending blind.
    assert await waits_instead_of_sending(second, Cost(1, 500, scope="b"))
    assert "openai:tokens@b" in second._core.upstreams[0].quota.buckets


async def test_a_member_whose_first_answer_is_slow_joins_instead_of_pacing_alone(
    gates: Any, redis_server: RedisServer
) -> None:
    """Issue 39's fleet on a CI machine: one member's first round trip to a Redis
    starved of CPU took longer than the 250 ms budget, so the member went on alone,
    counting itself the only member, and sent 50 requests the quota had no room
    for. Now a member that Redis never answered waits up to ``first_reading_s``
    for its first answer (its calls wait for the fleet's first reading as long):
    here it learns that the quota is spent and waits, as a member of the fleet."""
    first = gates()

    async def answer(remaining: int) -> httpx.Response:
        return openai_reply(remaining, limit=1000, reset="10s")

    await first.call(lambda: answer(900), cost=Cost(1, 100), classify=OPENAI)
    await first.call(lambda: answer(0), cost=Cost(1, 100), classify=OPENAI)
    # The new member's first reply from Redis takes 0.4 s, past its 0.1 s budget.
    with DelayProxy(redis_server.port, 0.4, first=1) as proxy:
        second = gates(proxy.url, budget_s=0.1, first_reading_s=3.0)
        assert await waits_instead_of_sending(second, Cost(1, 500), for_s=1.5)
        shared = second._core.shared
        assert shared is not None
        stats = shared.fleet.statistics()
        assert (stats.outages, stats.fallbacks) == (0, 0), stats
        assert proxy.first == 0  # the first reply was held back


def test_calls_never_wait_on_a_slow_redis_past_the_budget(redis_server: RedisServer) -> None:
    with DelayProxy(redis_server.port, 0.0) as proxy:
        gate = Gate(
            GatePolicy(fleet=FleetPolicy(budget_s=0.05, inflight_cap=4)),
            name=f"slow-{time.monotonic_ns()}",
            shared=proxy.url,
        )
        with gate:
            assert gate.call_sync(lambda: "joined") == "joined"
            proxy.delay_s = 3.0
            started = time.monotonic()
            results = [gate.call_sync(lambda: "ok") for _ in range(5)]
            elapsed = time.monotonic() - started
            shared = gate._core.shared
            assert shared is not None
            stats = shared.fleet.statistics()
    assert results == ["ok"] * 5
    # Each operation would take 3 s through the proxy: none was waited for.
    assert elapsed < 2.5, elapsed
    assert not shared.available
    assert stats.fallbacks >= 1


async def test_a_hint_one_member_sees_holds_the_other(gates: Any) -> None:
    first, second = gates(), gates()

    async def refuse() -> Outcome:
        return Outcome.yielded(2.0, "saturated")

    async def ok() -> str:
        return "ok"

    with anyio.move_on_after(0.5):
        await first.call(refuse)  # its hint goes to the fleet
    started = time.monotonic()
    assert await second.call(ok) == "ok"
    # The second, which saw no refusal itself, waited about the hint before sending.
    assert time.monotonic() - started >= 1.0


async def test_callers_another_members_hint_holds_go_one_by_one_over_the_jitter(
    gates: Any,
) -> None:
    """A hold read from the fleet is released as the member's own hints are: none before
    the hint, then one by one over its jitter (``RetryPolicy.hint_jitter``, half the hint
    by default), each completion admitting one more. On main the member applied it with
    no jitter: at the hint's end the hold was over, and the eight callers the window let
    in went within a millisecond, a wave. (No first reading here: its probe would go
    first, the others behind it.)"""
    first, second = gates(first_reading_s=0), gates(first_reading_s=0)
    sent: list[float] = []

    async def refuse() -> Outcome:
        return Outcome.yielded(2.0, "saturated")

    async def ok() -> str:
        sent.append(time.monotonic())
        await anyio.sleep(0.05)  # an answer takes its time (each one may clock the next)
        return "ok"

    with anyio.move_on_after(0.3):
        await first.call(refuse)  # its hint goes to the fleet
    started = time.monotonic()
    async with anyio.create_task_group() as tg:
        for _ in range(10):
            tg.start_soon(second.call, ok)
    offsets = sorted(t - started for t in sent)
    assert offsets[0] >= 1.0, offsets  # held until about the hint (2 s from the first call)
    # Released one by one, not the window's eight at once at the hint's end.
    assert offsets[7] - offsets[0] >= 0.05, offsets
    assert second._core.audit() == []


async def test_a_burst_waits_for_the_one_read_of_the_fleets_holds(gates: Any) -> None:
    """A member reads the fleet's holds at most every 25 ms: the calls of a burst that
    do not read them wait for the one read that is out, and are held by what it reads.
    On main they went on at once, past another member's hint (sent 7 ms in, where the
    hint held the reading call 1.7 s)."""
    first, second = gates(first_reading_s=0), gates(first_reading_s=0)
    sent: list[float] = []

    async def refuse() -> Outcome:
        return Outcome.yielded(2.0, "saturated")

    async def ok() -> str:
        sent.append(time.monotonic())
        await anyio.sleep(0.05)
        return "ok"

    with anyio.move_on_after(0.3):
        await first.call(refuse)  # its hint goes to the fleet
    started = time.monotonic()
    async with anyio.create_task_group() as tg:
        for _ in range(10):
            tg.start_soon(second.call, ok)
    assert min(sent) - started >= 1.0, sorted(t - started for t in sent)
    assert second._core.audit() == []


async def test_the_fleet_cap_bounds_attempts_in_flight_across_gates(gates: Any) -> None:
    members = [gates(inflight_cap=2) for _ in range(3)]
    running = 0
    peak = 0

    async def work() -> str:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await anyio.sleep(0.05)
        running -= 1
        return "ok"

    async with anyio.create_task_group() as tg:
        for gate in members:
            for _ in range(4):
                tg.start_soon(gate.call, work)
    assert peak == 2
    assert all(g.statistics().calls_ok == 4 for g in members)


def test_a_policy_budget_is_settled_by_the_usage_a_response_reports() -> None:
    # Through the HTTP transport: the body's usage replaces the estimate in the bucket.
    import yieldgate

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            200, json={"usage": {"prompt_tokens": 3, "completion_tokens": 7, "total_tokens": 10}}
        )

    gate = Gate(GatePolicy(quota=QuotaPolicy(tokens_per_minute=6000, learn=False)), name="usage")
    transport = yieldgate.gate_transport(
        gate, sync=True, flavor="httpx", inner=httpx.MockTransport(handler)
    )
    with httpx.Client(transport=transport, base_url="http://provider") as client:
        reply = client.post("/v1/completions", json={"prompt": "x" * 40, "max_tokens": 500})
        reply.read()
    bucket = gate._core.upstreams[0].quota.buckets["policy:tokens"]
    # Estimated 10 + 500 = 510, used 10: the 500 came back.
    assert bucket.level_at(bucket.updated) == pytest.approx(6000 - 10, abs=1.0)


def test_settled_by_the_estimate_a_policy_budget_keeps_what_the_door_charged() -> None:
    import yieldgate

    def handler(request: httpx.Request) -> httpx.Response:
        usage = {"prompt_tokens": 300, "completion_tokens": 7, "total_tokens": 307}
        return httpx.Response(200, json={"usage": usage})

    policy = QuotaPolicy(tokens_per_minute=6000, learn=False, settle="estimate")
    gate = Gate(GatePolicy(quota=policy), name="estimate")
    transport = yieldgate.gate_transport(
        gate, sync=True, flavor="httpx", inner=httpx.MockTransport(handler)
    )
    with httpx.Client(transport=transport, base_url="http://provider") as client:
        reply = client.post("/v1/completions", json={"prompt": "x" * 40, "max_tokens": 500})
        reply.read()
    bucket = gate._core.upstreams[0].quota.buckets["policy:tokens"]
    # Estimated 10 + 500 = 510 at the door: neither the 493 unused nor the longer prompt count.
    assert bucket.level_at(bucket.updated) == pytest.approx(6000 - 510, abs=1.0)
    with pytest.raises(ValueError, match="settle"):
        QuotaPolicy(settle="tokens")  # type: ignore[arg-type]


def test_in_a_fleet_a_policy_budget_is_settled_there(redis_server: RedisServer) -> None:
    import yieldgate

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            200, json={"usage": {"prompt_tokens": 3, "completion_tokens": 7, "total_tokens": 10}}
        )

    name = f"settle-{time.monotonic_ns()}"
    # 1000 tokens a minute: 16.7 a second, so a refill of 500 would take 30 s.
    policy = GatePolicy(quota=QuotaPolicy(tokens_per_minute=1000, learn=False))
    with Gate(policy, name=name, shared=redis_server.url) as gate:
        transport = yieldgate.gate_transport(
            gate, sync=True, flavor="httpx", inner=httpx.MockTransport(handler)
        )
        with httpx.Client(transport=transport, base_url="http://provider") as client:
            reply = client.post("/v1/completions", json={"prompt": "x" * 40, "max_tokens": 500})
            reply.read()
            gate.call_sync(lambda: None)  # flushes what the last attempt left to do
        admin = redis_server.client()
        keys = admin.keys(f"yieldgate:{name}:*:quota:policy:tokens")
        assert len(keys) == 1
        level = float(admin.hget(keys[0], "level"))  # type: ignore[arg-type]
    # Estimated 10 + 500 = 510, used 10: the 500 came back (unsettled, the level would be
    # 490 plus 16.7 a second since).
    assert 1000 - 10 <= level <= 1000


async def test_the_retry_budget_is_the_fleets(redis_server: RedisServer) -> None:
    # One retry per 10 s window for the whole fleet, whatever each member's traffic.
    budget = RetryBudgetPolicy(ratio=0.0, min_per_s=0.1, window_s=10.0)
    policy = GatePolicy(
        budget=budget,
        retry=RetryPolicy(max_attempts=5, base_s=0.01),
        fleet=FleetPolicy(budget_s=1.0),
    )
    name = f"budget-{time.monotonic_ns()}"
    first = Gate(policy, name=name, shared=redis_server.url)
    second = Gate(policy, name=name, shared=redis_server.url)
    calls = {"first": 0, "second": 0}

    def failing(who: str) -> Any:
        async def fail() -> None:
            calls[who] += 1
            raise ConnectionResetError("reset")

        return fail

    with pytest.raises(RetryBudgetExhaustedError):
        await first.call(failing("first"))
    assert calls["first"] == 2  # the fleet's one retry
    with pytest.raises(RetryBudgetExhaustedError):
        await second.call(failing("second"))
    assert calls["second"] == 1  # none left for the second member
    first.close()
    second.close()


async def test_one_members_failures_open_the_breaker_for_all(redis_server: RedisServer) -> None:
    policy = GatePolicy(
        breaker=BreakerPolicy(fail_max=2, reset_timeout_s=30.0),
        retry=RetryPolicy(max_attempts=1),
        fleet=FleetPolicy(budget_s=1.0),
    )
    name = f"breaker-{time.monotonic_ns()}"
    first = Gate(policy, name=name, shared=redis_server.url)
    second = Gate(policy, name=name, shared=redis_server.url)
    sent = {"second": 0}

    async def fail() -> None:
        raise ConnectionResetError("reset")

    async def work() -> str:
        sent["second"] += 1
        return "ok"

    assert await second.call(work) == "ok"  # closed for everyone at first
    for _ in range(2):
        with pytest.raises(RetriesExhaustedError):
            await first.call(fail)
    await anyio.sleep(0.05)  # past the second's last read of the fleet's breaker
    with pytest.raises(CircuitOpenError) as caught:
        await second.call(work)
    assert sent["second"] == 1  # refused without sending
    assert caught.value.retry_after_s is not None
    assert caught.value.retry_after_s > 20
    first.close()
    second.close()


async def test_a_half_open_fleet_sends_one_probe(redis_server: RedisServer) -> None:
    policy = GatePolicy(
        breaker=BreakerPolicy(fail_max=1, reset_timeout_s=0.3),
        retry=RetryPolicy(max_attempts=1),
        fleet=FleetPolicy(budget_s=1.0),
    )
    name = f"probe-{time.monotonic_ns()}"
    members = [Gate(policy, name=name, shared=redis_server.url) for _ in range(3)]
    spans: list[tuple[float, float]] = []

    async def fail() -> None:
        raise ConnectionResetError("reset")

    async def slow_ok() -> str:
        start = time.monotonic()
        await anyio.sleep(0.2)
        spans.append((start, time.monotonic()))
        return "ok"

    with pytest.raises(RetriesExhaustedError):
        await members[0].call(fail)  # opens the fleet's breaker
    await anyio.sleep(0.5)  # past its reset timeout: half-open
    results: list[str] = []

    async def call(gate: Gate) -> None:
        results.append(await gate.call(slow_ok))

    async with anyio.create_task_group() as tg:
        for gate in members:
            tg.start_soon(call, gate)
    assert results == ["ok"] * 3
    # The probe went alone: the others started only after it had succeeded.
    probe, *rest = sorted(spans)
    assert all(start >= probe[1] for start, _ in rest), spans
    for gate in members:
        gate.close()


def test_a_gate_goes_on_alone_while_redis_is_down_and_rejoins(fresh_redis: RedisServer) -> None:
    gate = Gate(
        GatePolicy(fleet=FleetPolicy(budget_s=0.5, inflight_cap=4)),
        name=f"rejoin-{time.monotonic_ns()}",
        shared=fresh_redis.url,
    )
    shared = gate._core.shared
    assert shared is not None
    with gate:
        assert gate.call_sync(lambda: "ok") == "ok"
        assert shared.available
        fresh_redis.stop()
        assert [gate.call_sync(lambda: "ok") for _ in range(3)] == ["ok"] * 3
        assert not shared.available
        fresh_redis.start()  # the same port, empty
        deadline = time.monotonic() + 60
        while not shared.available:  # the next heartbeat after the fleet's back-off
            assert time.monotonic() < deadline, "never rejoined"
            assert gate.call_sync(lambda: "ok") == "ok"
            time.sleep(0.05)
        assert shared.fleet.statistics().rejoins >= 1
        assert gate.call_sync(lambda: "ok") == "ok"


# -- a fleet misconfigured: credentials and permissions ------------------------------


@pytest.fixture
def acl_user(redis_server: RedisServer) -> Iterator[Any]:
    """Make Redis users for the test (``make(name, *rules)``), deleted after it."""
    admin = redis_server.client()
    made: list[str] = []

    def make(name: str, *rules: str) -> str:
        admin.execute_command("ACL", "SETUSER", name, "reset", "on", *rules)
        made.append(name)
        return name

    yield make
    for name in made:
        admin.execute_command("ACL", "DELUSER", name)
    admin.close()


def _url(redis_server: RedisServer, user: str, password: str) -> str:
    return f"redis://{user}:{password}@127.0.0.1:{redis_server.port}/0"


def test_a_wrong_password_is_a_configuration_error_not_an_outage(
    redis_server: RedisServer, acl_user: Any
) -> None:
    user = acl_user("yg-pw", ">right-one", "~*", "&*", "+@all")
    gate = Gate(name=f"auth-{time.monotonic_ns()}", shared=_url(redis_server, user, "s3cret-x"))
    with gate, pytest.raises(FleetConfigError, match="refused the fleet's credentials") as caught:
        gate.call_sync(lambda: "ok")
    assert "s3cret-x" not in str(caught.value)
    shared = gate._core.shared
    assert shared is not None
    assert shared.fleet.statistics().config_error is not None
    assert gate._core.audit() == []


def test_an_acl_user_without_evalsha_is_a_configuration_error(
    redis_server: RedisServer, acl_user: Any
) -> None:
    user = acl_user("yg-noeval", ">pw", "~*", "&*", "+@all", "-evalsha", "-eval")
    gate = Gate(name=f"acl-{time.monotonic_ns()}", shared=_url(redis_server, user, "pw"))
    with gate, pytest.raises(FleetConfigError, match="may not run its commands"):
        gate.call_sync(lambda: "ok")


def test_failing_open_a_misconfigured_fleet_goes_on_alone_and_says_why(
    redis_server: RedisServer, acl_user: Any, caplog: pytest.LogCaptureFixture
) -> None:
    user = acl_user("yg-open", ">right-one", "~*", "&*", "+@all")
    gate = Gate(
        GatePolicy(fleet=FleetPolicy(fail_open=True)),
        name=f"open-{time.monotonic_ns()}",
        shared=_url(redis_server, user, "s3cret-y"),
    )
    with gate, caplog.at_level(logging.WARNING, logger="yieldgate.fleet"):
        assert [gate.call_sync(lambda: "ok") for _ in range(3)] == ["ok"] * 3
        shared = gate._core.shared
        assert shared is not None
        assert not shared.available
        assert "credentials" in (shared.fleet.statistics().config_error or "")
    warned = [r.getMessage() for r in caplog.records if "check the fleet's URL" in r.getMessage()]
    assert warned
    assert all("s3cret-y" not in message for message in warned)


async def test_a_call_waits_for_a_joining_members_redis_half_its_time_at_most(
    gates: Any, redis_server: RedisServer
) -> None:
    """Joining, a member's round trips may take ``first_reading_s``; a call with less
    time than that waits for them half of what remains of its own, as it waits for the
    first reading, then goes on alone: Redis slow at the start fails no call that
    would have succeeded without it."""
    with DelayProxy(redis_server.port, 3.0) as proxy:
        gate = gates(proxy.url, budget_s=0.1, first_reading_s=5.0)
        started = time.monotonic()
        assert await gate.call(_ok, timeout=1.0) == "ok"
        assert time.monotonic() - started < 1.0


def test_a_sync_call_with_little_time_does_not_wait_out_the_join(
    gates: Any, redis_server: RedisServer
) -> None:
    """The sync client's twin waits ``first_reading_s`` for Redis's first answer; a
    call with less than twice that left uses the budget's socket time-outs instead."""
    with DelayProxy(redis_server.port, 3.0) as proxy:
        gate = gates(proxy.url, budget_s=0.1, first_reading_s=5.0)
        started = time.monotonic()
        assert gate.call_sync(lambda: "ok", timeout=2.0) == "ok"
        assert time.monotonic() - started < 2.0
        shared = gate._core.shared
        assert shared is not None
        assert shared.fleet.joining  # Redis has not answered it yet
