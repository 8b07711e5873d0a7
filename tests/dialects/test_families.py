"""Every provider's rate-limit headers, one row each (issue 40), and daily quotas' 429s.

The headers are each provider's documented ones (docs/http.md cites the sources):
a provider is a row of ``_families.FAMILIES``, and a row's test is its headers.
"""

from __future__ import annotations

import time

import anyio
import httpx
import pytest

from tests.dialects.test_ratelimit import NOW, readings
from yieldgate import DeadlineExceededError, Gate, GatePolicy, QuotaExhaustedError
from yieldgate.dialects import OPENAI
from yieldgate.dialects._families import DAY, FAMILIES, MINUTE, MONTH
from yieldgate.gate import OutcomeKind
from yieldgate.gate._cost import Bucket, QuotaReading, reading_rate


def test_groq_requests_are_per_day_and_tokens_per_minute() -> None:
    headers = {
        "x-groq-region": "us-east-1",
        "x-ratelimit-limit-requests": "14400",
        "x-ratelimit-limit-tokens": "18000",
        "x-ratelimit-remaining-requests": "14370",
        "x-ratelimit-remaining-tokens": "17997",
        "x-ratelimit-reset-requests": "2m59.56s",
        "x-ratelimit-reset-tokens": "7.66s",
    }
    assert readings(headers) == {
        "groq:requests": ("requests", 14400.0, 14370.0, pytest.approx(179.56), DAY),
        "groq:tokens": ("tokens", 18000.0, 17997.0, pytest.approx(7.66), MINUTE),
    }
    # Paced as daily: 14,400 a day is 1 every 6 s, not 240 a second.
    (requests,) = [r for r in _read(headers) if r.resource == "requests"]
    assert reading_rate(requests, 14400.0, None) == pytest.approx(14400 / DAY)
    # The same names without Groq's marker are OpenAI's (a minute's).
    del headers["x-groq-region"]
    assert set(readings(headers)) == {"openai:requests", "openai:tokens"}


def _read(headers: dict[str, str]) -> tuple[QuotaReading, ...]:
    from yieldgate.dialects._ratelimit import quota_readings

    return quota_readings(httpx.Headers(headers), now=lambda: NOW)


def test_openai_project_limits_are_buckets_beside_the_organisations() -> None:
    found = readings(
        {
            "x-ratelimit-limit-requests": "500",
            "x-ratelimit-remaining-requests": "499",
            "x-ratelimit-limit-tokens": "30000",
            "x-ratelimit-remaining-tokens": "29000",
            "x-ratelimit-limit-project-tokens": "10000",
            "x-ratelimit-remaining-project-tokens": "2000",
            "x-ratelimit-reset-project-tokens": "48s",
            "x-ratelimit-limit-project-requests": "100",
            "x-ratelimit-remaining-project-requests": "90",
        }
    )
    assert found["openai-project:tokens"] == ("tokens", 10000.0, 2000.0, 48.0, None)
    assert found["openai-project:requests"] == ("requests", 100.0, 90.0, None, None)
    assert found["openai:tokens"] == ("tokens", 30000.0, 29000.0, None, None)


def test_cerebras_day_and_minute_suffixes_are_the_windows() -> None:
    found = readings(
        {
            "x-ratelimit-limit-requests-day": "14400",
            "x-ratelimit-limit-tokens-minute": "60000",
            "x-ratelimit-remaining-requests-day": "14399",
            "x-ratelimit-remaining-tokens-minute": "59000",
            "x-ratelimit-reset-requests-day": "33011.38",
            "x-ratelimit-reset-tokens-minute": "11.38",
        }
    )
    assert found == {
        "windowed:requests-day": ("requests", 14400.0, 14399.0, 33011.38, DAY),
        "windowed:tokens-minute": ("tokens", 60000.0, 59000.0, 11.38, MINUTE),
    }


def test_mistral_minute_and_month_token_limits_and_its_limit_by_size() -> None:
    found = readings(
        {
            "x-ratelimit-limit-tokens-minute": "500000",
            "x-ratelimit-remaining-tokens-minute": "499000",
            "x-ratelimit-limit-tokens-month": "1000000000",
            "x-ratelimit-remaining-tokens-month": "999000000",
            "ratelimitbysize-limit": "500000",
            "ratelimitbysize-remaining": "499000",
            "ratelimitbysize-reset": "30",
        }
    )
    assert found["windowed:tokens-minute"][4] == MINUTE
    assert found["windowed:tokens-month"] == ("tokens", 1e9, 999e6, None, MONTH)
    assert found["mistral:tokens"] == ("tokens", 500000.0, 499000.0, 30.0, None)


def test_openrouters_plain_triple_resets_in_epoch_milliseconds() -> None:
    reset_ms = (NOW + 42.5) * 1000
    found = readings(
        {
            "X-RateLimit-Limit": "20",
            "X-RateLimit-Remaining": "3",
            "X-RateLimit-Reset": f"{reset_ms:.0f}",
        }
    )
    assert found == {"ratelimit:requests": ("requests", 20.0, 3.0, pytest.approx(42.5), None)}


@pytest.mark.parametrize(
    ("reset", "seconds"),
    [(f"{NOW + 30:.0f}", 30.0), ("30", 30.0), (f"{(NOW - 5) * 1000:.0f}", 0.0), ("soon", None)],
)
def test_the_plain_triples_reset_is_epoch_seconds_or_a_delay(reset: str, seconds: float) -> None:
    found = readings(
        {"x-ratelimit-limit": "10", "x-ratelimit-remaining": "1", "x-ratelimit-reset": reset}
    )
    assert found["ratelimit:requests"][3] == seconds


def test_together_requests_and_tokens_per_second() -> None:
    found = readings(
        {
            "x-ratelimit-limit": "100",
            "x-ratelimit-remaining": "99",
            "x-ratelimit-reset": "1",
            "x-tokenlimit-limit": "200000",
            "x-tokenlimit-remaining": "199000",
        }
    )
    # Per second, as Together's docs say ("We measure rate limits in seconds").
    assert found == {
        "together:requests": ("requests", 100.0, 99.0, 1.0, 1.0),
        "together:tokens": ("tokens", 200000.0, 199000.0, None, 1.0),
    }


def test_fireworks_prompt_and_generated_tokens_apart_per_second() -> None:
    found = readings(
        {
            "x-ratelimit-limit-requests": "600",
            "x-ratelimit-remaining-requests": "599",
            "x-ratelimit-limit-tokens-prompt": "60000",
            "x-ratelimit-remaining-tokens-prompt": "59000",
            "x-ratelimit-limit-tokens-generated": "12000",
            "x-ratelimit-remaining-tokens-generated": "11900",
        }
    )
    assert found == {
        "openai:requests": ("requests", 600.0, 599.0, None, None),
        "fireworks:input_tokens": ("input_tokens", 60000.0, 59000.0, None, 1.0),
        "fireworks:output_tokens": ("output_tokens", 12000.0, 11900.0, None, 1.0),
    }


def test_a_header_is_read_by_one_row_only() -> None:
    names = [
        name
        for family in FAMILIES
        if family.marker is None
        for bucket in family.buckets
        for name in (bucket.limit, bucket.remaining)
    ]
    assert len(names) == len(set(names))  # rows with a marker stand in for another row


def test_a_daily_window_is_paced_as_daily_not_capped_at_an_hour() -> None:
    reading = QuotaReading("windowed:requests-day", "requests", 14400.0, 14000.0, None, DAY)
    assert reading_rate(reading, 14400.0, None) == pytest.approx(14400 / DAY)
    bucket = Bucket("k", "requests", 14400.0, 14400 / DAY, 0.0, learnt=True)
    bucket.level = 0.0
    assert bucket.wait_s(1, 0.0) == pytest.approx(6.0)


# -- a daily quota's 429 ------------------------------------------------------------------


def _429(body: object, headers: dict[str, str] | None = None) -> httpx.Response:
    return httpx.Response(429, json=body, headers=headers or {})


def openrouter_per_day(reset_ms: float | None) -> httpx.Response:
    # As OpenRouter answers a spent free-model daily limit (its docs' "Rate Limits").
    relayed = {"X-RateLimit-Limit": "50", "X-RateLimit-Remaining": "0"}
    if reset_ms is not None:
        relayed["X-RateLimit-Reset"] = f"{reset_ms:.0f}"
    error = {
        "message": "Rate limit exceeded: free-models-per-day. Add 10 credits to unlock 1000 "
        "free model requests per day",
        "code": 429,
        "metadata": {"headers": relayed, "provider_name": None},
    }
    return _429({"error": error, "user_id": "user_x"})


def test_openrouters_per_day_limit_without_a_reset_is_fatal() -> None:
    outcome = OPENAI.classify(openrouter_per_day(None))
    assert (outcome.kind, outcome.reason) == (OutcomeKind.FATAL, "daily_quota")


def test_openrouters_per_day_limit_waits_for_the_relayed_reset() -> None:
    outcome = OPENAI.classify(openrouter_per_day((time.time() + 3600) * 1000))
    assert (outcome.kind, outcome.reason) == (OutcomeKind.YIELD, "daily_quota")
    assert outcome.hint_s == pytest.approx(3600, abs=5)


def test_groqs_requests_per_day_message_says_when() -> None:
    message = (
        "Rate limit reached for model `llama-3.1-8b-instant` in organization `org_x` service "
        "tier `on_demand` on requests per day (RPD): Limit 14400, Used 14400, Requested 1. "
        "Please try again in 1m26.4s."
    )
    outcome = OPENAI.classify(
        _429({"error": {"message": message, "type": "requests", "code": "rate_limit_exceeded"}})
    )
    assert (outcome.kind, outcome.reason) == (OutcomeKind.YIELD, "daily_quota")
    assert outcome.hint_s == pytest.approx(86.4)


def test_a_spent_daily_bucket_in_the_headers_is_a_daily_refusal() -> None:
    headers = {
        "x-ratelimit-limit-requests-day": "14400",
        "x-ratelimit-remaining-requests-day": "0",
        "x-ratelimit-reset-requests-day": "33011.38",
    }
    outcome = OPENAI.classify(_429({"message": "Requests per day limit exceeded"}, headers))
    assert (outcome.kind, outcome.reason) == (OutcomeKind.YIELD, "daily_quota")
    assert outcome.hint_s == pytest.approx(33011.38)


def test_a_minutes_429_is_still_rate_limited() -> None:
    message = (
        "Rate limit reached for gpt-4o in organization org-x on tokens per min (TPM): "
        "Limit 30000, Used 29000, Requested 2000. Please try again in 2s."
    )
    outcome = OPENAI.classify(_429({"error": {"message": message, "code": "rate_limit_exceeded"}}))
    assert (outcome.kind, outcome.reason, outcome.hint_s) == (
        OutcomeKind.YIELD,
        "rate_limited",
        2.0,
    )


# -- through a Gate: a spent daily quota fails at once (defect 3) -------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("reset", [None, "hours away"])
async def test_a_spent_daily_quota_fails_the_call_at_once(reset: str | None) -> None:
    """On main: 45-48 attempts over 297 s (each 429 waited out as a minute's), then a
    deadline error; the official client fails in 1.6 s."""
    gate = Gate(GatePolicy(), name="daily")
    attempts = 0

    async def attempt() -> httpx.Response:
        nonlocal attempts
        attempts += 1
        reset_ms = None if reset is None else (time.time() + 5 * 3600) * 1000
        return openrouter_per_day(reset_ms)

    start = anyio.current_time()
    with pytest.raises(QuotaExhaustedError) as raised:
        await gate.call(attempt, classify=OPENAI, timeout=300)
    assert attempts == 1
    assert anyio.current_time() - start < 1.0
    assert not isinstance(raised.value, DeadlineExceededError)
    if reset is not None:
        assert raised.value.reset_s == pytest.approx(5 * 3600, abs=5)
        assert "spent until" in str(raised.value)
    assert gate._core.audit() == []


def test_ietf_draft_7_dictionary_form() -> None:
    found = readings(
        {"RateLimit": "limit=100, remaining=50, reset=30", "RateLimit-Policy": "10;w=1, 100;w=60"}
    )
    assert found == {"ietf:default": ("requests", 100.0, 50.0, 30.0, 60.0)}
    # Without a policy: no window said (a minute is assumed).
    assert readings({"RateLimit": "limit=5, remaining=0, reset=2"}) == {
        "ietf:default": ("requests", 5.0, 0.0, 2.0, None)
    }
    assert readings({"RateLimit": "remaining=oops"}) == {}


def test_anthropics_unified_limit_rejected_waits_for_its_reset() -> None:
    headers = {
        "anthropic-ratelimit-unified-status": "rejected",
        "anthropic-ratelimit-unified-reset": f"{time.time() + 5 * 3600:.0f}",
        "anthropic-ratelimit-unified-5h-utilization": "1.0",
    }
    body = {"type": "error", "error": {"type": "rate_limit_error", "message": "limit reached"}}
    from yieldgate.dialects import ANTHROPIC

    outcome = ANTHROPIC.classify(_429(body, headers))
    assert (outcome.kind, outcome.reason) == (OutcomeKind.YIELD, "daily_quota")
    assert outcome.hint_s == pytest.approx(5 * 3600, abs=5)
    allowed = {**headers, "anthropic-ratelimit-unified-status": "allowed_warning"}
    assert ANTHROPIC.classify(_429(body, allowed)).reason == "rate_limited"


def test_mistral_requests_per_minute_and_its_older_limit_by_size() -> None:
    found = readings(
        {
            "x-ratelimit-limit-req-minute": "720",
            "x-ratelimit-remaining-req-minute": "717",
            "x-ratelimitbysize-limit-month": "1000000000",
            "x-ratelimitbysize-remaining-month": "999967993",
        }
    )
    assert found == {
        "windowed:req-minute": ("requests", 720.0, 717.0, None, MINUTE),
        "mistral:tokens-month": ("tokens", 1e9, 999967993.0, None, MONTH),
    }


@pytest.mark.parametrize(
    "message",
    [
        "Rate limit exceeded: free-models-per-day-high-balance.",
        "Rate limit exceeded: limit_rpd/meta-llama/llama-3.3-70b:free/abc",
        "Rate limit reached for model `m` in organization `org` on tokens per day (TPD): "
        "Limit 100000, Used 97050, Requested 3619.",
    ],
)
def test_daily_quotas_said_in_the_body(message: str) -> None:
    outcome = OPENAI.classify(_429({"error": {"message": message, "code": 429}}))
    assert (outcome.kind, outcome.reason) == (OutcomeKind.FATAL, "daily_quota")


def test_geminis_openai_compatible_daily_quota_is_fatal_whatever_its_retry_in() -> None:
    # A list, as that endpoint answers; "Please retry in" is no refill of a daily quota.
    violation = {
        "quotaMetric": "generativelanguage.googleapis.com/generate_content_free_tier_requests",
        "quotaId": "GenerateRequestsPerDayPerProjectPerModel-FreeTier",
        "quotaValue": "20",
    }
    body = [
        {
            "error": {
                "code": 429,
                "message": "You exceeded your current quota. Please retry in 51.98s.",
                "status": "RESOURCE_EXHAUSTED",
                "details": [
                    {
                        "@type": "type.googleapis.com/google.rpc.QuotaFailure",
                        "violations": [violation],
                    },
                    {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "26s"},
                ],
            }
        }
    ]
    outcome = OPENAI.classify(_429(body))
    assert (outcome.kind, outcome.reason) == (OutcomeKind.FATAL, "daily_quota")


@pytest.mark.parametrize("reset", [None, "hours away"])
def test_a_spent_daily_quota_fails_a_sync_call_at_once(reset: str | None) -> None:
    gate = Gate(GatePolicy(), name="daily-sync")
    attempts = 0

    def attempt() -> httpx.Response:
        nonlocal attempts
        attempts += 1
        return openrouter_per_day(None if reset is None else (time.time() + 5 * 3600) * 1000)

    with pytest.raises(QuotaExhaustedError) as raised:
        gate.call_sync(attempt, classify=OPENAI, timeout=300)
    assert attempts == 1
    assert raised.value.reason == "daily_quota"
    assert (raised.value.reset_at is None) == (reset is None)
    assert gate._core.audit() == []
