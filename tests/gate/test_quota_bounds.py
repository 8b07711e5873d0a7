"""Quota readings a Gate cannot be stalled by: hostile resets and windows, limits
below one, a new policy name in every answer, waits past the deadline, bodies the
estimate cannot read (issue 29, "Hostile or odd values")."""

from __future__ import annotations

import json

import anyio
import httpx
import pytest

from tests.gate.test_quota import claim, gate_for, reading
from yieldgate import DeadlineExceededError, QuotaPolicy, RequestTooLargeError
from yieldgate.dialects import OPENAI
from yieldgate.dialects._cost import estimate_cost
from yieldgate.dialects._ratelimit import quota_readings
from yieldgate.gate._quota import MAX_LEARNT_BUCKETS, Quota

pytestmark = pytest.mark.anyio

EMPTY_600 = {"x-ratelimit-limit-tokens": "600", "x-ratelimit-remaining-tokens": "0"}


@pytest.mark.parametrize("reset", ["99999h", "1e308", "2562047h47m16s"])
def test_a_reset_far_away_refills_within_a_minute(reset: str) -> None:
    headers = httpx.Headers({**EMPTY_600, "x-ratelimit-reset-tokens": reset})
    quota = Quota()
    c = claim(100)
    assert quota.try_take(c, 0.0)
    quota.sent(c, 0.0)
    quota.observe(quota_readings(headers), c, 0.0)
    assert quota.buckets["openai:tokens"].rate >= 600 / 60


def test_an_anthropic_reset_in_the_year_9999_refills_within_a_minute() -> None:
    headers = httpx.Headers(
        {
            "anthropic-ratelimit-tokens-limit": "600",
            "anthropic-ratelimit-tokens-remaining": "0",
            "anthropic-ratelimit-tokens-reset": "9999-12-31T23:59:59Z",
        }
    )
    quota = Quota()
    quota.observe(quota_readings(headers), None, 0.0)
    assert quota.buckets["anthropic:tokens"].rate >= 600 / 60


def test_a_window_past_a_month_is_read_as_a_month() -> None:
    # A day's window is a daily quota's (IETF's w=86400, Cerebras' -day headers), paced
    # as daily; three years is a bad header's.
    headers = httpx.Headers({"ratelimit-policy": '"p";q=3600;w=99999999', "ratelimit": '"p";r=0'})
    quota = Quota()
    quota.observe(quota_readings(headers), None, 0.0)
    assert quota.buckets["ietf:p"].rate == pytest.approx(3600 / (31 * 86400))
    daily = httpx.Headers({"ratelimit-policy": '"d";q=8640;w=86400', "ratelimit": '"d";r=0'})
    quota.observe(quota_readings(daily), None, 0.0)
    assert quota.buckets["ietf:d"].rate == pytest.approx(0.1)


def test_a_limit_below_one_is_no_bucket() -> None:
    headers = httpx.Headers(
        {"x-ratelimit-limit-requests": "0.5", "x-ratelimit-remaining-requests": "0.5"}
    )
    assert quota_readings(headers) == ()
    quota = Quota()
    quota.observe([reading(limit=0.5, remaining=0.5)], None, 0.0)
    assert not quota.active
    assert quota.try_take(claim(1), 0.0)


def test_a_new_policy_name_in_every_answer_keeps_the_buckets_bounded() -> None:
    quota = Quota()
    for i in range(2000):
        headers = httpx.Headers(
            {"ratelimit-policy": f'"p{i}";q=100;w=60', "ratelimit": f'"p{i}";r=90;t=6'}
        )
        quota.observe(quota_readings(headers), None, float(i))
    # Those idle for their window (a minute) went first: 60 read in the last minute.
    assert len(quota.buckets) == 60
    assert "ietf:p1999" in quota.buckets
    assert "ietf:p0" not in quota.buckets


def test_with_no_bucket_idle_the_stalest_makes_room() -> None:
    quota = Quota()
    for i in range(200):
        headers = httpx.Headers(
            {"ratelimit-policy": f'"p{i}";q=100;w=60', "ratelimit": f'"p{i}";r=90;t=6'}
        )
        quota.observe(quota_readings(headers), None, i / 1000)
    assert len(quota.buckets) == MAX_LEARNT_BUCKETS
    assert "ietf:p199" in quota.buckets  # the newest kept, the stalest gone
    assert f"ietf:p{199 - MAX_LEARNT_BUCKETS}" not in quota.buckets
    assert f"ietf:p{200 - MAX_LEARNT_BUCKETS}" in quota.buckets


async def test_after_a_hostile_reset_the_next_call_is_answered_within_its_deadline() -> None:
    gate = gate_for(anyio.current_time)
    answers = [{**EMPTY_600, "x-ratelimit-reset-tokens": "99999h"}, {}]

    async def attempt() -> httpx.Response:
        return httpx.Response(200, json={}, headers=answers.pop(0))

    await gate.call(attempt, cost=100, classify=OPENAI)
    t0 = anyio.current_time()
    await gate.call(attempt, cost=100, classify=OPENAI, timeout=30.0)
    # 100 of 600 a minute: 10 s (the first send, made blind, is counted once, by
    # its own reading, not again as still in flight).
    assert anyio.current_time() - t0 <= 10.0 + 1e-3


async def test_a_quota_wait_past_the_deadline_fails_at_once_naming_its_bucket() -> None:
    gate = gate_for(anyio.current_time, QuotaPolicy(tokens_per_minute=600, learn=False))
    await gate.call(_noop, cost=600)
    t0 = anyio.current_time()
    with pytest.raises(DeadlineExceededError, match="policy:tokens") as caught:
        await gate.call(_noop, cost=300, timeout=5.0)  # room in 30 s
    assert anyio.current_time() == t0
    assert caught.value.attempts == 0
    # Nothing was kept by the call that gave up: 300 fit after 30 s.
    await gate.call(_noop, cost=300, timeout=31.0)
    assert anyio.current_time() - t0 == pytest.approx(30.0)


async def _noop() -> None:
    return None


def test_a_body_nested_past_the_parsers_depth_costs_one_request() -> None:
    body = b'{"messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    assert estimate_cost(body, QuotaPolicy()) is None


def test_a_responses_input_of_messages_and_parts_is_counted() -> None:
    text = "x" * 400
    body = {
        "model": "gpt-4o",
        "instructions": "be brief",
        "input": [
            {"role": "user", "content": text},
            {"role": "user", "content": [{"type": "input_text", "text": text}]},
            {"type": "input_text", "text": text},
        ],
        "max_output_tokens": 16,
    }
    cost = estimate_cost(json.dumps(body).encode(), QuotaPolicy())
    assert cost is not None
    assert cost.output_tokens == 16
    assert cost.input_tokens >= 300  # three texts of 100 tokens each, at least


def test_an_embeddings_request_is_charged_its_input_and_no_output() -> None:
    body = json.dumps({"model": "text-embedding-3-small", "input": ["x" * 400, "y" * 400]})
    cost = estimate_cost(body.encode(), QuotaPolicy(), path="/v1/embeddings")
    assert cost is not None
    assert cost.output_tokens == 0
    assert 200 <= cost.input_tokens <= 201  # two texts of 100 tokens, and a newline
    chat = estimate_cost(body.encode(), QuotaPolicy(), path="/v1/responses")
    assert chat is not None
    assert chat.output_tokens == QuotaPolicy().default_output_tokens


async def test_a_providers_request_too_large_raises_request_too_large_at_once() -> None:
    from tests.dialects.server_replies import REPLIES

    reply = REPLIES["openai-request-too-large"]
    gate = gate_for(anyio.current_time)
    sent = 0

    async def attempt() -> httpx.Response:
        nonlocal sent
        sent += 1
        response: httpx.Response = reply.response()
        return response

    with pytest.raises(RequestTooLargeError, match="request_too_large"):
        await gate.call(attempt, classify=OPENAI)
    assert sent == 1  # not retried: no wait makes it fit
