"""The Messages route's quota on virtual time: Anthropic's buckets, headers, refusals, settling.

Each decision's headers are also read back by the SDK's own parser
(``yieldgate.dialects._ratelimit.quota_readings``) with the same wall clock:
what the server writes is what a Gate learns.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from yieldgate.dialects._ratelimit import quota_readings
from yieldgate.server import ProviderQuota, QuotaConfig
from yieldgate.server._quota_anthropic import rfc3339

WALL = 1_750_000_000.0  # 2025-06-15T15:06:40Z


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def quota(**fields: object) -> tuple[ProviderQuota, Clock, Clock]:
    clock, wall = Clock(100.0), Clock(WALL)
    q = ProviderQuota(QuotaConfig(**fields), clock=clock, wall_clock=wall)  # type: ignore[arg-type]
    return q, clock, wall


def tick(clock: Clock, wall: Clock, seconds: float) -> None:
    clock.now += seconds
    wall.now += seconds


def at(seconds: float) -> str:
    """The RFC 3339 time ``seconds`` after ``WALL``."""
    return rfc3339(WALL + seconds)


def test_reset_times_are_rfc_3339_in_utc_to_the_millisecond_rounded_up() -> None:
    assert rfc3339(WALL) == "2025-06-15T15:06:40.000Z"
    assert rfc3339(WALL + 0.0001) == "2025-06-15T15:06:40.001Z"
    assert rfc3339(WALL + 59.5) == "2025-06-15T15:07:39.500Z"
    assert datetime.fromisoformat(rfc3339(WALL + 1.25)) == datetime.fromtimestamp(WALL + 1.25, UTC)


def test_a_fresh_quota_sends_every_bucket_in_anthropics_order() -> None:
    q, _, _ = quota(rpm=50, itpm=40_000, otpm=8_000)
    assert list(q.headers("claude", family="anthropic")) == [
        ("anthropic-ratelimit-requests-limit", "50"),
        ("anthropic-ratelimit-requests-remaining", "50"),
        ("anthropic-ratelimit-requests-reset", at(0)),
        # Both token buckets together, as Anthropic's answers show them.
        ("anthropic-ratelimit-tokens-limit", "48000"),
        ("anthropic-ratelimit-tokens-remaining", "48000"),
        ("anthropic-ratelimit-tokens-reset", at(0)),
        ("anthropic-ratelimit-input-tokens-limit", "40000"),
        ("anthropic-ratelimit-input-tokens-remaining", "40000"),
        ("anthropic-ratelimit-input-tokens-reset", at(0)),
        ("anthropic-ratelimit-output-tokens-limit", "8000"),
        ("anthropic-ratelimit-output-tokens-remaining", "8000"),
        ("anthropic-ratelimit-output-tokens-reset", at(0)),
    ]


def test_a_charge_takes_input_and_max_tokens_and_the_sdk_reads_the_headers_back() -> None:
    q, _, wall = quota(rpm=60, itpm=6_000, otpm=600)  # 1 request, 100 in, 10 out a second
    decision = q.charge_messages(300, 50, model="claude")
    assert decision.admitted
    h = dict(decision.headers)
    assert h["anthropic-ratelimit-requests-remaining"] == "59"
    assert h["anthropic-ratelimit-requests-reset"] == at(1)
    assert h["anthropic-ratelimit-input-tokens-remaining"] == "5700"
    assert h["anthropic-ratelimit-input-tokens-reset"] == at(3)
    assert h["anthropic-ratelimit-output-tokens-remaining"] == "550"
    assert h["anthropic-ratelimit-output-tokens-reset"] == at(5)
    assert h["anthropic-ratelimit-tokens-remaining"] == "6250"
    assert h["anthropic-ratelimit-tokens-reset"] == at(5)  # the later of the two

    readings = {r.resource: r for r in quota_readings(h, now=wall)}
    assert set(readings) == {"requests", "tokens", "input_tokens", "output_tokens"}
    assert (readings["input_tokens"].limit, readings["input_tokens"].remaining) == (6000, 5700)
    assert (readings["output_tokens"].limit, readings["output_tokens"].remaining) == (600, 550)
    assert (readings["tokens"].limit, readings["tokens"].remaining) == (6600, 6250)
    assert readings["requests"].reset_s == pytest.approx(1.0)
    assert readings["output_tokens"].reset_s == pytest.approx(5.0)
    stats = q.statistics()
    assert (stats.requests_charged, stats.tokens_charged) == (1, 350)


def test_settling_gives_back_the_output_the_answer_did_not_use() -> None:
    q, _, _ = quota(otpm=1000)
    assert q.charge_messages(10, 800, model="claude").admitted
    q.settle_messages(800, 120, model="claude")  # it generated 120 of its 800
    h = dict(q.headers("claude", family="anthropic"))
    assert h["anthropic-ratelimit-output-tokens-remaining"] == "880"
    q.settle_messages(100, 100, model="claude")  # all of it used: nothing to give back
    q.settle_messages(100, 300, model="claude")  # nor when it says it used more
    assert dict(q.headers("claude", family="anthropic")) == h
    assert q.statistics().output_tokens_given_back == 680


def test_the_input_limit_refuses_a_big_prompt_with_the_wait_until_it_fits() -> None:
    q, clock, wall = quota(rpm=1000, itpm=600, otpm=6000)  # 10 input tokens a second
    assert q.charge_messages(500, 10, model="claude").admitted
    before = q.headers("claude", family="anthropic")
    decision = q.charge_messages(300, 10, model="claude")
    refusal = decision.refusal
    assert refusal is not None
    assert (refusal.resource, refusal.limit, refusal.used, refusal.requested) == (
        "input_tokens",
        600,
        500,
        300,
    )
    assert refusal.retry_after_s == pytest.approx(20.0)  # 200 more at 10 a second
    assert refusal.message.startswith(
        "Rate limit reached for claude on input tokens per minute: limit 600, used 500, "
        "requested 300. Try again in 20 s"
    )
    assert q.headers("claude", family="anthropic") == before  # nothing charged
    assert (q.statistics().refused_input_tokens, q.statistics().refused_output_tokens) == (1, 0)
    tick(clock, wall, 19.99)
    assert not q.charge_messages(300, 10, model="claude").admitted
    tick(clock, wall, 0.01)
    assert q.charge_messages(300, 10, model="claude").admitted


def test_the_output_limit_refuses_a_big_max_tokens() -> None:
    q, _, _ = quota(itpm=100_000, otpm=1000)
    assert q.charge_messages(10, 700, model="claude").admitted
    refusal = q.charge_messages(10, 400, model="claude").refusal
    assert refusal is not None
    assert (refusal.resource, refusal.requested) == ("output_tokens", 400)
    assert refusal.retry_after_s == pytest.approx(6.0)  # 100 more at 1000/60 a second
    assert q.statistics().refused_output_tokens == 1


def test_a_request_larger_than_a_whole_bucket_is_refused_for_good() -> None:
    q, _, _ = quota(itpm=1000, otpm=500)
    refusal = q.charge_messages(10, 501, model="claude").refusal
    assert refusal is not None
    assert refusal.too_large
    assert (refusal.resource, refusal.limit, refusal.requested) == ("output_tokens", 500, 501)
    assert refusal.message == (
        "Request too large for claude on output tokens per minute: limit 500, requested 501. "
        "No wait lets it through: reduce the prompt or max_tokens."
    )
    assert q.statistics().too_large == 1


def test_tpm_is_a_combined_tokens_bucket_on_the_messages_route() -> None:
    q, _, _ = quota(tpm=1000)
    assert [name for name, _ in q.headers(family="anthropic")] == [
        "anthropic-ratelimit-tokens-limit",
        "anthropic-ratelimit-tokens-remaining",
        "anthropic-ratelimit-tokens-reset",
    ]
    assert q.charge_messages(300, 500, model="m").admitted
    refusal = q.charge_messages(100, 150, model="m").refusal
    assert refusal is not None
    assert refusal.resource == "tokens"


def test_one_token_limit_alone_sends_no_combined_headers() -> None:
    q, _, _ = quota(itpm=1000)
    assert [name for name, _ in q.headers(family="anthropic")] == [
        "anthropic-ratelimit-input-tokens-limit",
        "anthropic-ratelimit-input-tokens-remaining",
        "anthropic-ratelimit-input-tokens-reset",
    ]


def test_the_messages_route_spends_buckets_of_its_own() -> None:
    q, _, _ = quota(rpm=2, tpm=10_000, itpm=10_000)
    assert q.charge(100, model="m").admitted
    assert q.charge(100, model="m").admitted
    assert not q.charge(100, model="m").admitted  # OpenAI's two requests are spent...
    assert q.charge_messages(10, 10, model="m").admitted  # ...not Anthropic's
    h = dict(q.headers("m", family="anthropic"))
    assert h["anthropic-ratelimit-requests-remaining"] == "1"
    assert dict(q.headers("m"))["x-ratelimit-remaining-requests"] == "0"


def test_itpm_and_otpm_alone_make_a_quota_that_limits_only_the_messages_route() -> None:
    q, _, _ = quota(itpm=10, otpm=10)
    assert q.headers("m") == ()
    for _ in range(5):
        assert q.charge(1_000_000, model="m").admitted
    assert not q.charge_messages(11, 1, model="m").admitted


@pytest.mark.parametrize("name", ["itpm", "otpm"])
def test_a_bad_token_limit_is_a_value_error(name: str) -> None:
    with pytest.raises(ValueError, match=f"quota {name} must be a positive integer"):
        QuotaConfig(**{name: 0})  # type: ignore[arg-type]


def test_per_model_the_messages_route_keeps_buckets_per_model() -> None:
    q, _, _ = quota(rpm=1, otpm=100, per_model=True)
    assert q.charge_messages(1, 1, model="a").admitted
    assert not q.charge_messages(1, 1, model="a").admitted
    assert q.charge_messages(1, 1, model="b").admitted
