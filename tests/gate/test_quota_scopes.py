"""Quotas per scope (model, Azure deployment), remaining-only readings (Azure), borrowed
shapes, and a blind send's own reading (issue 29, "Quota scopes", "Every header style")."""

from __future__ import annotations

import anyio
import httpx
import pytest

from tests.gate.test_quota import gate_for
from yieldgate import Cost, QuotaPolicy
from yieldgate.dialects import OPENAI
from yieldgate.dialects._cost import estimate_cost, request_scope
from yieldgate.dialects._hints import retry_hint_s
from yieldgate.dialects._ratelimit import quota_readings
from yieldgate.gate._quota import Claim, Quota, QuotaReading
from yieldgate.protocol import Priority

pytestmark = pytest.mark.anyio


def tokens(n: int, scope: str = "", key: float = 0.0) -> Claim:
    return Claim(Cost(1, n, n, 0, scope), Priority.NORMAL, key)


def read(remaining: float, limit: float | None = 600.0) -> QuotaReading:
    return QuotaReading("openai:tokens", "tokens", limit, remaining)


def answered(quota: Quota, claim: Claim, remaining: float, now: float, **kw: float) -> None:
    """``claim`` taken, sent, and answered with a reading of ``remaining`` tokens."""
    assert quota.try_take(claim, now)
    quota.sent(claim, now)
    quota.observe([read(remaining, **kw)], claim, now)
    quota.finished(claim)


# -- scopes, sans-IO --------------------------------------------------------------------


def test_a_reading_paces_its_own_scope_alone() -> None:
    quota = Quota()
    answered(quota, tokens(100, "a"), 0.0, 0.0)  # model a: its bucket empty
    assert set(quota.buckets) == {"openai:tokens@a"}
    assert not quota.try_take(tokens(100, "a"), 0.0)
    assert quota.try_take(tokens(100, "b"), 0.0)  # model b: nothing learnt, not a's


def test_a_cost_past_one_scopes_learnt_limit_waits_for_its_whole_bucket() -> None:
    """Never refused: the learnt limit is the provider's word as read (or a guess);
    only the provider says a request is too large. Another scope's fits at once."""
    quota = Quota()
    answered(quota, tokens(10, "gpt-4o"), 590.0, 0.0)  # 600 tokens a minute, 590 left
    assert quota.too_large(tokens(40_000, "gpt-4o").cost) is None
    assert quota.try_take(tokens(40_000, "gpt-4o-mini"), 0.0)
    big = tokens(40_000, "gpt-4o")
    assert not quota.try_take(big, 0.0)
    assert quota.binding(big.cost, 0.0) is quota.buckets["openai:tokens@gpt-4o"]
    assert quota.try_take(big, 1.0)  # full again (10 tokens a second): it goes
    assert quota.buckets["openai:tokens@gpt-4o"].level_at(1.0) == 0.0  # spent the whole
    assert not quota.try_take(tokens(10, "gpt-4o"), 1.0)


def test_a_budget_of_the_callers_own_refuses_a_cost_past_its_limit() -> None:
    quota = Quota(tokens_per_minute=1000)
    assert quota.too_large(tokens(1001, "a").cost) is quota.buckets["policy:tokens"]


def test_a_scopes_queue_does_not_hold_another_scope() -> None:
    quota = Quota()
    answered(quota, tokens(100, "a"), 0.0, 0.0)
    waiting = tokens(100, "a")
    assert not quota.try_take(waiting, 0.0)
    quota.join(waiting, lambda: None)
    assert quota.at_head(waiting, 0.0)
    other = tokens(100, "b")
    assert quota.try_take(other, 0.0)  # nobody queued in b's lane
    assert not quota.try_take(tokens(1, "a"), 100.0)  # a's head goes first, even once it fits
    assert quota.take_queued(waiting, 100.0) is None
    assert quota.audit() == ["2 quota claim(s) taken and never sent"]


def test_budgets_of_the_callers_own_put_every_scope_in_one_lane() -> None:
    quota = Quota(tokens_per_minute=600)
    first = tokens(600, "a")
    assert quota.try_take(first, 0.0)
    waiting = tokens(100, "a")
    assert not quota.try_take(waiting, 0.0)
    quota.join(waiting, lambda: None)
    # b spends the same budget: it queues behind a's head, by arrival.
    assert not quota.try_take(tokens(1, "b"), 100.0)


def test_a_blind_sends_own_reading_is_not_counted_twice() -> None:
    quota = Quota()
    blind = Cost(1, 100, 100, 0)
    quota.blind(blind, 1)  # sent while nothing was known, still in flight
    quota.observe([read(500.0)], None, 0.0, blind=blind)
    assert quota.buckets["openai:tokens"].level == 500.0
    quota.blind(blind, -1)


def test_a_blind_sends_reading_counts_the_others_still_in_flight() -> None:
    quota = Quota()
    blind = Cost(1, 100, 100, 0)
    quota.blind(blind, 1)
    quota.blind(blind, 1)
    quota.observe([read(500.0)], None, 0.0, blind=blind)
    assert quota.buckets["openai:tokens"].level == 400.0


# -- what remains, alone (Azure) ------------------------------------------------------


def test_azure_headers_read_as_remaining_alone() -> None:
    headers = httpx.Headers(
        {"x-ratelimit-remaining-requests": "9", "x-ratelimit-remaining-tokens": "4000"}
    )
    got = {r.resource: r for r in quota_readings(headers)}
    assert got["tokens"].limit is None
    assert got["tokens"].remaining == 4000
    assert got["requests"].limit is None
    assert got["requests"].remaining == 9
    # A limit sent and unreadable: nothing learnt from what remains.
    bad = {"x-ratelimit-limit-tokens": "lots", "x-ratelimit-remaining-tokens": "5"}
    assert quota_readings(httpx.Headers(bad)) == ()


def test_the_limit_is_the_most_seen_remaining_and_own_cost_plus_in_flight_at_first() -> None:
    quota = Quota()
    inflight = [tokens(100, key=i) for i in range(3)]
    for c in inflight:
        assert quota.try_take(c, 0.0)
        quota.sent(c, 0.0)
    quota.observe([read(900.0, limit=None)], inflight[0], 0.0)
    bucket = quota.buckets["openai:tokens"]
    # 900 left after the answered 100, 200 more still in flight.
    assert bucket.limit == 1200.0
    assert bucket.rate == pytest.approx(1200.0 / 60)
    assert bucket.level == 700.0
    quota.observe([read(100.0, limit=None)], inflight[1], 1.0)
    assert bucket.limit == 1200.0  # less remaining never lowers it
    quota.observe([read(1500.0, limit=None)], inflight[2], 2.0)
    assert bucket.limit == 1600.0  # 1,500 left after its own 100
    # Later, what is in flight is not added: much of it was counted already.
    later = [tokens(100, key=10 + i) for i in range(5)]
    for c in later:
        assert quota.try_take(c, 3.0)
        quota.sent(c, 3.0)
    quota.observe([read(1600.0, limit=None)], later[0], 3.0)
    assert bucket.limit == 1700.0  # 1,600 and its own 100; not the 400 in flight


def test_azure_retry_hints() -> None:
    assert retry_hint_s(httpx.Headers({"x-ms-retry-after-ms": "1500"})) == 1.5
    assert retry_hint_s(httpx.Headers({"retry-after-ms": "20", "retry-after": "9"})) == 0.02


# -- borrowed shapes ----------------------------------------------------------------------


def test_borrow_paces_a_new_scope_by_the_last_ones_shapes_until_its_own_answer() -> None:
    quota = Quota(borrow=True)
    answered(quota, tokens(10, "a"), 590.0, 0.0)
    rq = QuotaReading("openai:requests", "requests", 10.0, 9.0)
    c = tokens(1, "a")
    assert quota.try_take(c, 0.0)
    quota.sent(c, 0.0)
    quota.observe([rq], c, 0.0)
    quota.finished(c)
    assert quota.borrow_for("b", 1.0)
    assert {"openai:tokens@b", "openai:requests@b"} <= set(quota.buckets)
    assert quota.buckets["openai:tokens@b"].limit == 600.0
    assert quota.too_large(tokens(700, "b").cost) is None  # a borrowed limit never refuses
    assert quota.binding(tokens(700, "b").cost, 1.0) is None  # full: it would spend it all
    assert not quota.borrow_for("b", 1.0)  # known now
    # b's own answer: its tokens bucket is its own; the borrowed requests bucket goes.
    answered(quota, tokens(10, "b"), 99_000.0, 2.0, limit=100_000.0)
    assert quota.buckets["openai:tokens@b"].limit == 100_000.0
    assert "openai:requests@b" not in quota.buckets
    assert "openai:requests@a" in quota.buckets


def test_without_borrow_a_new_scope_is_paced_by_nothing_learnt() -> None:
    quota = Quota()
    answered(quota, tokens(10, "a"), 0.0, 0.0)
    assert not quota.borrow_for("b", 0.0)
    assert not quota.knows("b")


# -- the request's scope ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "body", "scope"),
    [
        ("/v1/chat/completions", {"model": "gpt-4o"}, "gpt-4o"),
        ("/openai/deployments/my-dep/chat/completions", {"model": "gpt-4o"}, "my-dep"),
        ("/openai/deployments/a%20b/completions", None, "a b"),
        ("/models/meta-llama/Llama-3-8B/v1/chat/completions", {}, "meta-llama/Llama-3-8B"),
        ("/models/gpt2", None, "gpt2"),
        ("/v1beta/models/gemini-2.0-flash:generateContent", {}, "gemini-2.0-flash"),
        ("/v1/chat/completions", {"model": 3}, ""),
        ("/v1/chat/completions", {"model": "m" * 300}, ""),
        ("/generate", {"inputs": "x"}, ""),
    ],
)
def test_the_scope_a_request_names(path: str, body: object, scope: str) -> None:
    assert request_scope(body, path) == scope


def test_a_body_whose_prompt_is_unreadable_still_has_its_scope() -> None:
    body = b'{"model": "gpt-4o", "messages": 7}'
    assert estimate_cost(body, QuotaPolicy()) == Cost(scope="gpt-4o")
    assert estimate_cost(body, QuotaPolicy(per_model=False)) is None
    azure = "/openai/deployments/dep/chat/completions"
    assert estimate_cost(b"not json", QuotaPolicy(), path=azure) == Cost(scope="dep")


def test_a_cost_scope_must_be_a_string() -> None:
    gate = gate_for(anyio.current_time)
    with pytest.raises(TypeError, match="scope must be a str"):
        gate.call_sync(lambda: None, cost=Cost(1, 0, 0, 0, 5))  # type: ignore[arg-type]


# -- one Gate, several models ---------------------------------------------------------


async def test_one_gate_two_models_each_paced_by_its_own_answers() -> None:
    """After gpt-4o's answer (600 TPM, spent), a gpt-4o-mini call of 40k tokens is
    neither refused as too large nor held behind gpt-4o's quota; a gpt-4o call of 40k
    waits for gpt-4o's whole bucket (a minute) and goes: the provider decides."""
    gate = gate_for(anyio.current_time)
    spent = {"x-ratelimit-limit-tokens": "600", "x-ratelimit-remaining-tokens": "0"}

    async def answer(headers: dict[str, str]) -> httpx.Response:
        return httpx.Response(200, json={}, headers=headers)

    async def call(model: str, cost: int, headers: dict[str, str]) -> float:
        start = anyio.current_time()
        await gate.call(
            lambda: answer(headers), classify=OPENAI, cost=Cost(1, cost, cost, 0, model)
        )
        return anyio.current_time() - start

    await call("gpt-4o", 100, spent)
    big = {"x-ratelimit-limit-tokens": "1000000", "x-ratelimit-remaining-tokens": "999000"}
    assert await call("gpt-4o-mini", 40_000, big) < 0.01
    assert await call("gpt-4o-mini", 40_000, big) < 0.01
    assert 59.0 <= await call("gpt-4o", 40_000, spent) <= 61.0
    assert gate._core.audit() == []


# -- a fleet member alone (Redis away) -------------------------------------------------


def test_alone_a_fleet_member_paces_its_share_of_the_callers_own_budgets() -> None:
    quota = Quota(requests_per_minute=60)
    quota.cap = quota.pace = 0.5  # two members, Redis away: this one's share
    taken = 0
    while quota.try_take(tokens(0, key=taken), 0.0):
        taken += 1
    assert taken == 30
    # ... and it refills at its share of the rate: one request in two seconds.
    assert not quota.try_take(tokens(0), 1.9)
    assert quota.try_take(tokens(0), 2.1)


# -- Anthropic's input and output buckets ----------------------------------------------


def test_anthropic_input_and_output_buckets_are_charged_apart() -> None:
    headers = httpx.Headers(
        {
            "anthropic-ratelimit-input-tokens-limit": "1000",
            "anthropic-ratelimit-input-tokens-remaining": "1000",
            "anthropic-ratelimit-output-tokens-limit": "200",
            "anthropic-ratelimit-output-tokens-remaining": "200",
        }
    )
    quota = Quota()
    quota.observe(quota_readings(headers), None, 0.0)
    assert {b.resource for b in quota.buckets.values()} == {"input_tokens", "output_tokens"}

    def claim(prompt: int, output: int) -> Claim:
        return Claim(Cost.of(prompt, output), Priority.NORMAL, 0.0)

    # 900 in, 150 out: fits each bucket, though 1,050 is more than the output limit.
    assert quota.try_take(claim(900, 150), 0.0)
    # Another 100 in fits the input bucket; 100 out does not fit what is left of output.
    assert not quota.try_take(claim(100, 100), 0.0)
    assert quota.try_take(claim(100, 50), 0.0)
    # An output bound past the whole output limit waits for the whole output bucket.
    assert quota.too_large(Cost.of(1, 201)) is None
    assert quota.binding(Cost.of(1, 201), 0.0) is quota.buckets["anthropic:output_tokens"]
