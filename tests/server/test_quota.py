"""``ProviderQuota`` on virtual time: refill, charge, refusal, its hint, the headers, too large."""

from __future__ import annotations

import re

import pytest

from yieldgate.server import ProviderQuota, QuotaConfig
from yieldgate.server.quota import go_duration


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def quota(**fields: object) -> tuple[ProviderQuota, Clock]:
    clock = Clock()
    return ProviderQuota(QuotaConfig(**fields), clock=clock), clock  # type: ignore[arg-type]


def headers(q: ProviderQuota) -> dict[str, str]:
    return dict(q.headers())


def test_a_request_costs_its_prompt_at_four_characters_a_token_and_its_max_tokens() -> None:
    q, _ = quota(tpm=1000, default_max_tokens=16)
    assert q.cost("", 10) == 10
    assert q.cost("abcd", 10) == 11
    assert q.cost("abcde", 10) == 12  # rounded up
    assert q.cost("x" * 40, None) == 10 + 16  # the default output cap


def test_a_fresh_quota_is_full_and_says_so_in_six_headers() -> None:
    q, _ = quota(rpm=60, tpm=30_000)
    assert list(q.headers()) == [
        ("x-ratelimit-limit-requests", "60"),
        ("x-ratelimit-limit-tokens", "30000"),
        ("x-ratelimit-remaining-requests", "60"),
        ("x-ratelimit-remaining-tokens", "30000"),
        ("x-ratelimit-reset-requests", "0s"),
        ("x-ratelimit-reset-tokens", "0s"),
    ]


def test_only_the_limited_resource_has_headers() -> None:
    q, _ = quota(tpm=100)
    assert [name for name, _ in q.headers()] == [
        "x-ratelimit-limit-tokens",
        "x-ratelimit-remaining-tokens",
        "x-ratelimit-reset-tokens",
    ]


def test_a_charge_takes_from_both_buckets_and_the_reset_is_the_time_until_full() -> None:
    q, _ = quota(rpm=60, tpm=30_000)  # 1 request/s and 500 tokens/s
    decision = q.charge(1200, model="gpt-4o")
    assert decision.admitted
    h = dict(decision.headers)
    assert h["x-ratelimit-remaining-requests"] == "59"
    assert h["x-ratelimit-remaining-tokens"] == "28800"
    assert h["x-ratelimit-reset-requests"] == "1s"
    assert h["x-ratelimit-reset-tokens"] == "2.4s"
    stats = q.statistics()
    assert (stats.requests_charged, stats.tokens_charged) == (1, 1200)


def test_the_buckets_refill_continuously_up_to_one_window() -> None:
    q, clock = quota(tpm=600, window_s=60)  # 10 tokens/s
    assert q.charge(600, model="m").admitted
    assert headers(q)["x-ratelimit-remaining-tokens"] == "0"
    assert headers(q)["x-ratelimit-reset-tokens"] == "1m0s"
    clock.now += 6.0
    assert headers(q)["x-ratelimit-remaining-tokens"] == "60"
    assert headers(q)["x-ratelimit-reset-tokens"] == "54s"
    clock.now += 3600.0  # never more than one window's limit
    assert headers(q)["x-ratelimit-remaining-tokens"] == "600"
    assert headers(q)["x-ratelimit-reset-tokens"] == "0s"


def test_a_token_refusal_charges_nothing_and_its_hint_is_the_time_until_it_fits() -> None:
    # OpenAI's own example: 30000 TPM, 29937 used, 385 requested -> "try again in 644ms".
    q, clock = quota(rpm=10_000, tpm=30_000)
    assert q.charge(29_937, model="gpt-4o").admitted
    before = headers(q)
    decision = q.charge(385, model="gpt-4o")
    refusal = decision.refusal
    assert refusal is not None
    assert (refusal.resource, refusal.limit, refusal.used, refusal.requested) == (
        "tokens",
        30_000,
        29_937,
        385,
    )
    assert refusal.retry_after_s == pytest.approx(0.644)
    assert refusal.message == (
        "Rate limit reached for gpt-4o in organization org-yieldgate on tokens per min (TPM): "
        "Limit 30000, Used 29937, Requested 385. Please try again in 644ms. "
        "Visit https://platform.openai.com/account/rate-limits to learn more."
    )
    assert headers(q) == before  # nothing charged, not even the request
    assert q.statistics().refused_tokens == 1
    clock.now += 0.643
    assert not q.charge(385, model="gpt-4o").admitted
    clock.now += 0.001 + 0.001  # the hint, counted from the first refusal, has passed
    assert q.charge(385, model="gpt-4o").admitted


def test_the_hint_waits_for_both_buckets_and_names_the_one_that_binds_longest() -> None:
    q, clock = quota(rpm=2, tpm=100, window_s=10)  # 0.2 requests/s, 10 tokens/s
    assert q.charge(10, model="m").admitted
    assert q.charge(10, model="m").admitted
    refusal = q.charge(10, model="m").refusal
    assert refusal is not None
    assert refusal.resource == "requests"  # 5 s for a request, 0 s for the tokens
    assert refusal.retry_after_s == pytest.approx(5.0)
    assert "on requests per min (RPM): Limit 2, Used 2, Requested 1." in refusal.message
    assert refusal.message.endswith(
        "Please try again in 5s. Visit https://platform.openai.com/account/rate-limits "
        "to learn more."
    )
    assert q.statistics().refused_requests == 1
    clock.now += 5.0
    assert q.charge(10, model="m").admitted


def test_a_request_larger_than_the_whole_bucket_is_refused_with_no_hint() -> None:
    q, clock = quota(tpm=30_000)
    refusal = q.charge(31_538, model="gpt-4o").refusal
    assert refusal is not None
    assert refusal.too_large
    assert refusal.retry_after_s is None
    assert refusal.message == (
        "Request too large for gpt-4o in organization org-yieldgate on tokens per min (TPM): "
        "Limit 30000, Requested 31538. The input or output tokens must be reduced in order "
        "to run successfully. Visit https://platform.openai.com/account/rate-limits to learn more."
    )
    clock.now += 3600.0
    assert not q.charge(31_538, model="gpt-4o").admitted
    assert q.charge(30_000, model="gpt-4o").admitted  # exactly the bucket fits
    stats = q.statistics()
    assert (stats.too_large, stats.refused_tokens) == (2, 0)


def test_the_hint_is_rounded_up_to_the_millisecond() -> None:
    q, _ = quota(tpm=3, window_s=1)  # 3 tokens/s: one token in 333.33 ms
    assert q.charge(3, model="m").admitted
    refusal = q.charge(1, model="m").refusal
    assert refusal is not None
    assert refusal.retry_after_s == pytest.approx(0.334)
    assert "Please try again in 334ms." in refusal.message


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0s"),
        (-1, "0s"),
        (0.0001, "1ms"),
        (0.02, "20ms"),
        (0.999, "999ms"),
        (1, "1s"),
        (1.234, "1.234s"),
        (1.5, "1.5s"),
        (59.9999, "1m0s"),
        (60, "1m0s"),
        (65.5, "1m5.5s"),
        (360, "6m0s"),
        (3600, "1h0m0s"),
        (3723.25, "1h2m3.25s"),
    ],
)
def test_durations_are_written_as_go_writes_them(seconds: float, text: str) -> None:
    assert go_duration(seconds) == text
    assert re.fullmatch(r"(\d+h)?(\d+m)?(\d+(\.\d+)?s|\d+ms)", text)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({}, "rpm, tpm or both"),
        ({"tpm": 0}, "tpm must be a positive integer"),
        ({"rpm": -1}, "rpm must be a positive integer"),
        ({"tpm": 1.5}, "tpm must be a positive integer"),
        ({"tpm": True}, "tpm must be a positive integer"),
        ({"tpm": 10, "window_s": 0}, "window_s must be a positive number"),
        ({"tpm": 10, "window_s": float("inf")}, "window_s must be a positive number"),
        ({"tpm": 10, "default_max_tokens": 0}, "default_max_tokens"),
        ({"tpm": 10, "organization": ""}, "organization"),
        ({"tpm": 10, "headers": "aws"}, "headers must be 'openai' or 'azure'"),
        ({"models": {"": (1, 1)}}, "non-empty string"),
        ({"models": {"m": (1,)}}, "limits must be \\(rpm, tpm\\)"),
        ({"models": {"m": (0, 5)}}, "positive integers or None"),
        ({"models": {"m": (None, None)}}, "needs rpm, tpm or both"),
    ],
)
def test_a_bad_config_is_a_value_error(fields: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        QuotaConfig(**fields)  # type: ignore[arg-type]


# -- per model, and Azure's headers ----------------------------------------------------


def test_per_model_each_model_has_buckets_of_its_own() -> None:
    q, _ = quota(tpm=100, per_model=True)
    assert q.charge(100, model="a").admitted
    assert not q.charge(1, model="a").admitted
    b = q.charge(100, model="b")
    assert b.admitted
    assert dict(b.headers)["x-ratelimit-remaining-tokens"] == "0"
    assert dict(q.headers("c"))["x-ratelimit-remaining-tokens"] == "100"


def test_models_named_have_limits_of_their_own_and_others_the_default() -> None:
    q, _ = quota(tpm=100, models={"big": (None, 1000)})
    assert q.config.scoped
    assert q.charge(900, model="big").admitted
    refused = q.charge(900, model="small")
    assert refused.refusal is not None
    assert refused.refusal.too_large
    assert "Request too large for small" in refused.refusal.message
    assert dict(q.headers("big"))["x-ratelimit-limit-tokens"] == "1000"


def test_one_quota_for_every_model_unless_per_model() -> None:
    q, _ = quota(tpm=100)
    assert q.charge(100, model="a").admitted
    assert not q.charge(1, model="b").admitted


def test_azure_headers_say_what_remains_alone() -> None:
    q, _clock = quota(rpm=10, tpm=100, headers="azure")
    decision = q.charge(60, model="dep")
    assert dict(decision.headers) == {
        "x-ratelimit-remaining-requests": "9",
        "x-ratelimit-remaining-tokens": "40",
    }
    refused = q.charge(60, model="dep")
    assert refused.refusal is not None
    assert refused.refusal.retry_after_s is not None
