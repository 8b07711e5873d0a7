"""Pacing by a provider's quota: the sans-IO buckets, and whole bursts on virtual time.

The provider here is the reference server's quota emulation on the loop's
clock, which meters requests as OpenAI documents it: buckets that refill
continuously and hold one window's limit, a request charged its prompt plus
``max_tokens`` at the door, the ``x-ratelimit-*`` headers on every response,
and a 429 whose message says when to try again (and no ``retry-after`` for
tokens).
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from typing import Any

import anyio
import httpx
import pytest

from yieldgate import (
    Cost,
    Gate,
    GatePolicy,
    Priority,
    QuotaPolicy,
    RequestTooLargeError,
    WindowPolicy,
)
from yieldgate.dialects import OPENAI
from yieldgate.gate import NullInstrumentation
from yieldgate.gate._quota import Claim, Quota, QuotaReading
from yieldgate.server.quota import ProviderQuota, QuotaConfig

pytestmark = pytest.mark.anyio


def reading(key: str = "openai:tokens", **kw: Any) -> QuotaReading:
    fields: dict[str, Any] = {"resource": "tokens", "limit": 600.0, "remaining": 600.0}
    fields.update(kw)
    return QuotaReading(key=key, **fields)


def claim(tokens: int, priority: Priority = Priority.NORMAL, key: float = 0.0) -> Claim:
    return Claim(Cost(1, tokens, tokens, 0), priority, key)


# -- the buckets, sans-IO -----------------------------------------------------------


def test_an_unknown_quota_lets_everything_through() -> None:
    quota = Quota()
    assert not quota.active
    assert all(quota.try_take(claim(10**9), 0.0) for _ in range(5))


def test_a_policy_bucket_paces_to_its_rate() -> None:
    quota = Quota(tokens_per_minute=600, learn=False)  # 10 tokens/s, 600 at most
    assert quota.try_take(claim(500), 0.0)
    big = claim(200)
    assert not quota.try_take(big, 0.0)
    quota.join(big, lambda: None)
    assert quota.take_queued(big, 0.0) == pytest.approx(10.0)  # 100 short at 10/s
    assert quota.take_queued(big, 10.0) is None


def test_a_reading_sets_the_level_less_what_is_still_in_flight() -> None:
    quota = Quota()
    first, second, third, unsent = claim(100), claim(50), claim(30), claim(7)
    for c in (first, second, third, unsent):
        assert quota.try_take(c, 0.0)
    for c in (first, second, third):
        quota.sent(c, 0.0)
    # The provider answered the first: 500 left of 600 after it, full in 10 s. The
    # others may have overtaken it or not: both are counted as not seen yet.
    quota.observe([reading(remaining=500, reset_s=10.0)], first, 0.0)
    bucket = quota.buckets["openai:tokens"]
    assert bucket.rate == pytest.approx(10.0)
    assert bucket.level_at(0.0) == pytest.approx(500 - 50 - 30 - 7)
    # The newest send's reading sets the level, as of its answer.
    quota.observe([reading(remaining=400, reset_s=20.0)], third, 1.0)
    assert bucket.level_at(1.0) == pytest.approx(400 - 50 - 7)
    # An older send's reading, answered late, may only lower it.
    quota.observe([reading(remaining=600, reset_s=0.0)], second, 1.0)
    assert bucket.level_at(1.0) == pytest.approx(400 - 50 - 7)
    quota.observe([reading(remaining=300, reset_s=30.0)], second, 1.0)
    assert bucket.level_at(1.0) == pytest.approx(300 - 7)
    # The unsent claim given back: it was counted against the bucket.
    quota.refund(unsent, 1.0)
    assert bucket.level_at(1.0) == pytest.approx(300)


def test_readings_of_some_buckets_leave_nothing_in_flight() -> None:
    """An answer may read the requests bucket and not the tokens one: it was answered,
    so it is no longer in flight for either, and the next tokens reading sets the level
    from what the provider says, less nothing (issue 39, defect 5, the local side)."""
    quota = Quota()
    requests = reading("openai:requests", resource="requests", limit=1000.0, remaining=999.0)
    both = [requests, reading(limit=10_000.0, remaining=9800.0, reset_s=1.2)]
    first = claim(200)
    assert quota.try_take(first, 0.0)
    quota.sent(first, 0.0)
    quota.observe(both, first, 0.0)
    quota.finished(first)
    for i in range(40):
        c = claim(200, key=i)
        assert quota.try_take(c, 0.0)
        quota.sent(c, 0.0)
        quota.observe([requests], c, 0.0)
        quota.finished(c)
    assert quota.audit() == []
    last = claim(1)
    assert quota.try_take(last, 0.0)
    quota.sent(last, 0.0)
    quota.observe([reading(limit=10_000.0, remaining=9900.0, reset_s=0.6)], last, 0.0)
    quota.finished(last)
    assert quota.buckets["openai:tokens"].level_at(0.0) == 9900.0
    assert quota.try_take(claim(4000), 0.0)


def test_a_window_from_the_headers_gives_the_rate_exactly() -> None:
    quota = Quota()
    c = claim(1)
    quota.try_take(c, 0.0)
    quota.observe([reading(limit=100, remaining=100, window_s=4.0)], c, 0.0)
    assert quota.buckets["openai:tokens"].rate == pytest.approx(25.0)


def test_without_a_used_share_the_rate_is_a_minute_of_the_limit() -> None:
    quota = Quota()
    c = claim(1)
    quota.try_take(c, 0.0)
    quota.observe([reading(limit=6000, remaining=6000, reset_s=0.0)], c, 0.0)
    assert quota.buckets["openai:tokens"].rate == pytest.approx(100.0)


def test_a_refund_gives_back_what_was_never_sent() -> None:
    quota = Quota(tokens_per_minute=600, learn=False)
    c = claim(400)
    assert quota.try_take(c, 0.0)
    quota.refund(c, 0.0)
    assert quota.try_take(claim(600), 0.0)


def test_the_queue_is_by_priority_then_arrival() -> None:
    quota = Quota(tokens_per_minute=60, learn=False)
    assert quota.try_take(claim(60), 0.0)
    woken: list[str] = []
    low = claim(10, Priority.LOW, key=0.0)
    normal = claim(10, Priority.NORMAL, key=2.0)
    high = claim(10, Priority.HIGH, key=3.0)
    quota.join(low, lambda: woken.append("low"))
    quota.join(normal, lambda: woken.append("normal"))
    assert woken == ["low"]  # the old head stands back for the new one
    quota.join(high, lambda: woken.append("high"))
    assert quota.at_head(high, 10.0)
    assert quota.take_queued(high, 10.0) is None
    assert quota.at_head(normal, 10.0)
    assert woken[-1] == "normal"


def test_a_cost_above_a_whole_bucket_is_too_large() -> None:
    quota = Quota(tokens_per_minute=600, learn=False)
    assert quota.too_large(Cost(1, 600)) is None
    bucket = quota.too_large(Cost(1, 601))
    assert bucket is not None
    assert bucket.limit == 600


def test_own_budgets_are_settled_by_what_was_used() -> None:
    quota = Quota(tokens_per_minute=600, learn=False)
    c = claim(500)
    assert quota.try_take(c, 0.0)
    quota.settle_own(c, Cost.of(20, 30), 0.0)  # used 50 of the 500 estimated
    assert quota.buckets["policy:tokens"].level_at(0.0) == pytest.approx(550)


def test_learning_off_ignores_readings() -> None:
    quota = Quota(learn=False)
    c = claim(1)
    quota.try_take(c, 0.0)
    quota.observe([reading(remaining=0, reset_s=60.0)], c, 0.0)
    assert not quota.active


# -- a provider on the loop's clock -----------------------------------------------


class Provider:
    """The reference server's quota emulation (``yieldgate.server.quota``) on the loop's
    clock, answering as its HTTP front does: the headers on every answer, and
    OpenAI's 429 body with its "Please try again in ..." message."""

    def __init__(self, clock: Callable[[], float], tpm: int, rpm: int, window_s: float) -> None:
        self.quota = ProviderQuota(QuotaConfig(rpm=rpm, tpm=tpm, window_s=window_s), clock=clock)

    @property
    def refused(self) -> int:
        stats = self.quota.statistics()
        return stats.refused_requests + stats.refused_tokens

    @property
    def charged(self) -> int:
        return self.quota.statistics().tokens_charged

    def admit(self, tokens: int) -> httpx.Response:
        decision = self.quota.charge(tokens, model="gpt-4o")
        headers = dict(decision.headers)
        refusal = decision.refusal
        if refusal is None:
            return httpx.Response(200, json={"ok": True}, headers=headers)
        error = {
            "message": refusal.message,
            "type": refusal.resource,
            "param": None,
            "code": "rate_limit_exceeded",
        }
        return httpx.Response(429, json={"error": error}, headers=headers)


def gate_for(clock: Callable[[], float], quota: QuotaPolicy | None = None) -> Gate:
    policy = GatePolicy() if quota is None else GatePolicy(quota=quota)
    return Gate(policy, instrumentation=NullInstrumentation(), clock=clock, rng=random.Random(3))


async def burst(
    gate: Gate, provider: Provider, costs: list[int], latency_s: float
) -> tuple[float, list[Any]]:
    results: list[Any] = [None] * len(costs)

    async def one(i: int, tokens: int) -> None:
        async def attempt() -> httpx.Response:
            response = provider.admit(tokens)
            await anyio.sleep(latency_s)
            return response

        try:
            results[i] = await gate.call(
                attempt, cost=Cost.of(tokens, 0), classify=OPENAI, timeout=None
            )
        except Exception as exc:
            results[i] = exc

    start = anyio.current_time()
    async with anyio.create_task_group() as tg:
        for i, tokens in enumerate(costs):
            tg.start_soon(one, i, tokens)
    return anyio.current_time() - start, results


def mixed_costs(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.choice((50, 100, 200, 400)) for _ in range(n)]


async def test_a_burst_past_a_learnt_quota_is_paced_not_bounced() -> None:
    costs = mixed_costs(400, seed=1)
    tpm = math.ceil(sum(costs) / 1.5)  # the burst exceeds the quota by half
    window_s = 60.0
    provider = Provider(anyio.current_time, tpm=tpm, rpm=10_000, window_s=window_s)
    gate = gate_for(anyio.current_time)  # configured with nothing
    makespan, results = await burst(gate, provider, costs, latency_s=0.5)
    assert all(isinstance(r, httpx.Response) and r.status_code == 200 for r in results)
    # The bound: what is left after the first full bucket, at the refill rate.
    bound = (sum(costs) - tpm) / (tpm / window_s)
    assert provider.refused <= 0.02 * len(costs), provider.refused
    assert makespan <= 1.15 * bound, (makespan, bound)


async def test_a_steady_stream_uses_the_quota_to_the_full() -> None:
    tpm, window_s = 6000, 10.0
    provider = Provider(anyio.current_time, tpm=tpm, rpm=100_000, window_s=window_s)
    gate = gate_for(anyio.current_time)
    costs = mixed_costs(1500, seed=2)  # about 7 windows' worth past the first bucket
    makespan, results = await burst(gate, provider, costs, latency_s=0.3)
    assert all(isinstance(r, httpx.Response) and r.status_code == 200 for r in results)
    # Tokens per second once the first bucket is spent, against the refill rate.
    throughput = (provider.charged - tpm) / makespan
    assert throughput >= 0.95 * (tpm / window_s), throughput


async def test_a_policy_paces_a_provider_that_says_nothing() -> None:
    costs = [100] * 30  # 3000 tokens against 1200 a minute
    gate = gate_for(anyio.current_time, QuotaPolicy(tokens_per_minute=1200, learn=False))
    starts: list[float] = []
    t0 = anyio.current_time()

    async def one(tokens: int) -> None:
        async def attempt() -> str:
            starts.append(anyio.current_time() - t0)
            return "ok"

        await gate.call(attempt, cost=tokens)

    async with anyio.create_task_group() as tg:
        for tokens in costs:
            tg.start_soon(one, tokens)
    # 12 at once, then one every 5 s (100 tokens at 20 a second).
    starts.sort()
    assert starts[11] == pytest.approx(0.0, abs=1e-3)
    assert starts[12] == pytest.approx(5.0, abs=1e-3)
    assert starts[-1] == pytest.approx((30 - 12) * 5.0, abs=1e-3)


async def test_higher_priorities_go_first_when_the_quota_binds() -> None:
    gate = gate_for(anyio.current_time, QuotaPolicy(requests_per_minute=60, learn=False))
    order: list[str] = []
    await gate.call(_noop, cost=Cost(60))  # spend the whole minute

    async def one(name: str, priority: Priority) -> None:
        async def attempt() -> None:
            order.append(name)

        await gate.call(attempt, priority=priority)

    async with anyio.create_task_group() as tg:
        for i in range(3):
            tg.start_soon(one, f"low{i}", Priority.LOW)
            await anyio.sleep(0.01)  # one after the other: their arrival order is known
        tg.start_soon(one, "high", Priority.HIGH)
    assert order[0] == "high"
    assert order[1:] == ["low0", "low1", "low2"]


async def test_a_call_that_waited_for_the_quota_still_waits_for_the_window() -> None:
    """A call paced by the quota took no window slot once its claim fitted: with a window
    of one, attempts that had waited for the quota ran beside the one in flight."""
    gate = Gate(
        GatePolicy(
            window=WindowPolicy.fixed(1),
            quota=QuotaPolicy(requests_per_minute=60, learn=False),
        ),
        name="quota-window",
        clock=anyio.current_time,
        instrumentation=NullInstrumentation(),
    )
    running = peak = 0

    async def slow() -> None:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await anyio.sleep(5)  # longer than the quota's one request a second
        running -= 1

    await gate.call(_noop, cost=Cost(60))  # the minute spent: the next calls are paced
    async with anyio.create_task_group() as tg:
        for _ in range(3):
            tg.start_soon(gate.call, slow)
    assert peak == 1
    assert gate.statistics().window.inflight == 0


async def _noop() -> None:
    return None


async def test_a_request_larger_than_the_quota_fails_at_once() -> None:
    gate = gate_for(anyio.current_time, QuotaPolicy(tokens_per_minute=1000, learn=False))
    t0 = anyio.current_time()
    with pytest.raises(RequestTooLargeError) as caught:
        await gate.call(_noop, cost=1001)
    assert anyio.current_time() == t0
    assert caught.value.resource == "tokens"
    assert caught.value.cost == 1001
    assert caught.value.limit == 1000
    assert caught.value.attempts == 0


async def test_a_call_cancelled_while_paced_gives_its_claim_back() -> None:
    gate = gate_for(anyio.current_time, QuotaPolicy(tokens_per_minute=600, learn=False))
    await gate.call(_noop, cost=600)
    with anyio.move_on_after(1.0):
        await gate.call(_noop, cost=300)  # would wait 30 s
    # Nothing was taken by the cancelled call: 300 fit after 30 s, not 60.
    t0 = anyio.current_time()
    await gate.call(_noop, cost=300)
    assert anyio.current_time() - t0 == pytest.approx(29.0)


async def test_a_yield_gives_back_what_own_budgets_charged() -> None:
    gate = gate_for(anyio.current_time, QuotaPolicy(tokens_per_minute=600, learn=False))
    answers = iter(
        [httpx.Response(429, headers={"retry-after": "1"}), httpx.Response(200, json={})]
    )

    async def attempt() -> httpx.Response:
        return next(answers)

    t0 = anyio.current_time()
    await gate.call(attempt, cost=400, classify=OPENAI)
    # The refused attempt was refunded, so the second went after the hint, not 20 s later.
    assert anyio.current_time() - t0 < 5.0


def test_bad_costs_are_refused() -> None:
    gate = Gate(clock=time.monotonic)
    for bad in (-1, 1.5, Cost(1, -3)):
        with pytest.raises(ValueError, match="cost"):
            gate.call_sync(lambda: None, cost=bad)  # type: ignore[arg-type]


def test_bad_quota_policies_are_refused() -> None:
    with pytest.raises(ValueError, match="tokens_per_minute"):
        QuotaPolicy(tokens_per_minute=0)
    with pytest.raises(ValueError, match="default_output_tokens"):
        QuotaPolicy(default_output_tokens=-1)
