"""The ``gemini`` dialect on the Gemini API's error bodies, as Google documents them.

Bodies are ``google.rpc.Status`` as JSON (AIP-193): ``error.code``, ``status``,
``message`` and typed ``details`` (``RetryInfo``, ``QuotaFailure``, ``Help``).
Sources: https://ai.google.dev/gemini-api/docs/generate-content/api-errors (the
statuses), https://ai.google.dev/gemini-api/docs/rate-limits (RPM, TPM, RPD;
daily quotas reset at midnight Pacific time), and google.rpc.RetryInfo /
QuotaFailure in googleapis' error_details.proto. Ids and counts are made up.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import httpx2
import pytest
from hypothesis import given
from hypothesis import strategies as st

import yieldgate
from yieldgate import RemoteError
from yieldgate.dialects import DIALECTS, GEMINI, get_dialect
from yieldgate.dialects._gemini import duration_s, retry_delay_s, spent_quota
from yieldgate.gate import OutcomeKind
from yieldgate.gate._outcome import MAX_HINT_S

LIBS = (httpx, httpx2)
RETRY_INFO = "type.googleapis.com/google.rpc.RetryInfo"
QUOTA_FAILURE = "type.googleapis.com/google.rpc.QuotaFailure"
HELP = {
    "@type": "type.googleapis.com/google.rpc.Help",
    "links": [
        {"description": "Learn more", "url": "https://ai.google.dev/gemini-api/docs/rate-limits"}
    ],
}


def retry_info(delay: Any) -> dict[str, Any]:
    return {"@type": RETRY_INFO, "retryDelay": delay}


def quota_failure(quota_id: str, metric: str = "", value: str = "15") -> dict[str, Any]:
    return {
        "@type": QUOTA_FAILURE,
        "violations": [
            {
                "quotaMetric": metric
                or "generativelanguage.googleapis.com/generate_content_free_tier_requests",
                "quotaId": quota_id,
                "quotaDimensions": {"location": "global", "model": "gemini-2.0-flash"},
                "quotaValue": value,
            }
        ],
    }


def status_body(code: int, status: str, message: str, *details: Any) -> dict[str, Any]:
    error: dict[str, Any] = {"code": code, "message": message, "status": status}
    if details:
        error["details"] = list(details)
    return {"error": error}


PER_MINUTE = "GenerateRequestsPerMinutePerProjectPerModel-FreeTier"
PER_DAY = "GenerateRequestsPerDayPerProjectPerModel-FreeTier"
EXCEEDED = "You exceeded your current quota, please check your plan and billing details."


def rate_limited(*details: Any) -> dict[str, Any]:
    return status_body(429, "RESOURCE_EXHAUSTED", EXCEEDED, *details)


def response(
    status: int, body: Any, headers: dict[str, str] | None = None, lib: Any = httpx
) -> Any:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return lib.Response(status, headers=headers or {}, content=content)


def test_gemini_is_a_dialect_by_name() -> None:
    assert get_dialect("gemini") is GEMINI
    assert DIALECTS["gemini"] is GEMINI
    assert yieldgate.dialects.GEMINI is GEMINI


# -- 429 RESOURCE_EXHAUSTED ---------------------------------------------------------


@pytest.mark.parametrize("lib", LIBS, ids=["httpx", "httpx2"])
def test_a_rate_limit_yields_with_retry_info_as_its_hint(lib: Any) -> None:
    # As Gemini sends a per-minute limit: QuotaFailure, Help, then RetryInfo.
    body = rate_limited(quota_failure(PER_MINUTE), HELP, retry_info("20s"))
    r = response(429, body, lib=lib)
    outcome = GEMINI.classify(r)
    assert (outcome.kind, outcome.reason, outcome.hint_s) == (
        OutcomeKind.YIELD,
        "rate_limited",
        20.0,
    )
    assert outcome.value is r


@pytest.mark.parametrize(
    ("delay", "seconds"),
    [
        ("20s", 20.0),
        ("1.5s", 1.5),
        ("0.250s", 0.25),
        ("3.000000001s", 3.000000001),
        ("0s", 0.0),
        ("22.815647s", 22.815647),
        (" 7s ", 7.0),
        ({"seconds": "2", "nanos": 500000000}, 2.5),
        ({"seconds": 4}, 4.0),
    ],
)
def test_retry_delay_is_read_as_a_protobuf_duration(delay: Any, seconds: float) -> None:
    assert duration_s(delay) == pytest.approx(seconds)
    outcome = GEMINI.classify(response(429, rate_limited(retry_info(delay))))
    assert (outcome.kind, outcome.hint_s) == (OutcomeKind.YIELD, pytest.approx(seconds))


@pytest.mark.parametrize(
    "delay",
    [
        "20",
        "20 s",
        "-1s",
        "1m",
        "1e3s",
        "nans",
        "infs",
        "s",
        "",
        "soon",
        20,
        1.5,
        None,
        [],
        True,
        {"seconds": "x"},
        {"seconds": "inf"},
        {"seconds": -5},
    ],
)
def test_a_malformed_retry_delay_is_no_hint_and_no_crash(delay: Any) -> None:
    assert duration_s(delay) is None
    outcome = GEMINI.classify(response(429, rate_limited(retry_info(delay))))
    assert (outcome.kind, outcome.reason, outcome.hint_s) == (
        OutcomeKind.YIELD,
        "rate_limited",
        None,
    )
    # The headers' hint still counts.
    with_header = response(429, rate_limited(retry_info(delay)), {"retry-after": "3"})
    assert GEMINI.classify(with_header).hint_s == 3.0


def test_a_huge_retry_delay_is_clamped_like_any_huge_hint() -> None:
    assert duration_s("99999999999999999999999s") == MAX_HINT_S
    outcome = GEMINI.classify(response(429, rate_limited(retry_info("1e999s"))))
    assert outcome.hint_s is None  # not a duration at all


@pytest.mark.parametrize(
    "details",
    [
        "RetryInfo",
        {"@type": RETRY_INFO, "retryDelay": "2s"},  # an object, not a list
        [None, 3, "x", {"retryDelay": "2s"}, {"@type": 7, "retryDelay": "2s"}],
        [{"@type": "type.googleapis.com/google.rpc.ErrorInfo", "retryDelay": "2s"}],
        [{"@type": QUOTA_FAILURE, "violations": "PerDay"}],
        [{"@type": QUOTA_FAILURE, "violations": [None, 1, {"quotaId": 5}]}],
    ],
)
def test_malformed_details_are_skipped(details: Any) -> None:
    body = {"error": {"code": 429, "status": "RESOURCE_EXHAUSTED", "details": details}}
    outcome = GEMINI.classify(response(429, body))
    assert (outcome.kind, outcome.reason, outcome.hint_s) == (
        OutcomeKind.YIELD,
        "rate_limited",
        None,
    )


@pytest.mark.parametrize(
    "body",
    [{"error": "quota"}, {"error": None}, [], [1, 2], "text", 429, {"error": {"details": None}}],
)
def test_bodies_of_other_shapes_fall_back_to_the_status(body: Any) -> None:
    outcome = GEMINI.classify(response(429, body, {"retry-after": "2"}))
    assert (outcome.kind, outcome.hint_s) == (OutcomeKind.YIELD, 2.0)


def test_retry_info_is_found_whatever_host_its_type_url_names() -> None:
    body = rate_limited({"@type": "example.com/google.rpc.RetryInfo", "retryDelay": "4s"})
    assert GEMINI.classify(response(429, body)).hint_s == 4.0


def test_the_longest_of_several_retry_infos_counts() -> None:
    assert retry_delay_s(rate_limited(retry_info("2s"), retry_info("5s"), retry_info("x"))) == 5.0


@pytest.mark.parametrize(
    ("headers", "hint"),
    [
        ({"retry-after": "30"}, 30.0),  # the header asks for longer
        ({"retry-after": "5"}, 20.0),  # the body asks for longer
        ({"retry-after-ms": "20500"}, 20.5),
        ({"retry-after": "soon"}, 20.0),
    ],
)
def test_the_longer_of_retry_after_and_retry_info_is_the_hint(
    headers: dict[str, str], hint: float
) -> None:
    # Both say "wait at least this long": honouring both is waiting the longer.
    outcome = GEMINI.classify(response(429, rate_limited(retry_info("20s")), headers))
    assert (outcome.kind, outcome.hint_s) == (OutcomeKind.YIELD, hint)


def test_a_429_without_retry_info_takes_retry_after() -> None:
    outcome = GEMINI.classify(response(429, rate_limited(), {"Retry-After": "6"}))
    assert (outcome.kind, outcome.reason, outcome.hint_s) == (
        OutcomeKind.YIELD,
        "rate_limited",
        6.0,
    )


# -- quotas no wait refills ---------------------------------------------------------


@pytest.mark.parametrize(
    ("violation", "reason"),
    [
        (quota_failure(PER_DAY), "daily_quota"),
        (quota_failure("GenerateContentInputTokensPerModelPerDay-FreeTier"), "daily_quota"),
        (
            quota_failure("SomeQuota", metric="example.googleapis.com/requests_per_day"),
            "daily_quota",
        ),
        (quota_failure(PER_MINUTE, value="0"), "no_quota"),
    ],
)
def test_a_quota_no_wait_refills_is_fatal_at_once(violation: Any, reason: str) -> None:
    # A daily quota comes with a RetryInfo too (hours): it must not be waited on.
    body = rate_limited(violation, HELP, retry_info("34000s"))
    r = response(429, body)
    outcome = GEMINI.classify(r)
    assert (outcome.kind, outcome.reason) == (OutcomeKind.FATAL, reason)
    assert outcome.value is r
    assert isinstance(outcome.error, RemoteError)
    assert outcome.error.code == "http_429"
    assert EXCEEDED in str(outcome.error)


def test_a_per_minute_quota_among_the_violations_does_not_make_it_fatal() -> None:
    assert spent_quota(rate_limited(quota_failure(PER_MINUTE))) is None
    two = quota_failure(PER_MINUTE)
    two["violations"].append(quota_failure(PER_DAY)["violations"][0])
    assert spent_quota(rate_limited(two)) == "daily_quota"


def test_a_daily_quota_outside_a_429_keeps_the_status_rules() -> None:
    body = status_body(503, "UNAVAILABLE", "overloaded", quota_failure(PER_DAY))
    assert GEMINI.classify(response(503, body)).kind is OutcomeKind.OVERLOADED


def test_a_spent_prepaid_balance_is_fatal() -> None:
    # 402 RESOURCE_EXHAUSTED: the billing account's prepaid credits are gone.
    body = status_body(402, "RESOURCE_EXHAUSTED", "credits", retry_info("60s"))
    outcome = GEMINI.classify(response(402, body))
    assert (outcome.kind, outcome.reason) == (OutcomeKind.FATAL, "http 402")


def test_x_should_retry_false_beats_every_body_rule() -> None:
    r = response(429, rate_limited(retry_info("1s")), {"x-should-retry": "false"})
    assert GEMINI.classify(r).kind is OutcomeKind.FATAL


# -- the other statuses ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "status", "kind", "reason"),
    [
        (503, "UNAVAILABLE", OutcomeKind.OVERLOADED, "unavailable"),
        (500, "INTERNAL", OutcomeKind.RETRYABLE, "http 500"),
        (504, "DEADLINE_EXCEEDED", OutcomeKind.RETRYABLE, "http 504"),
        (400, "INVALID_ARGUMENT", OutcomeKind.FATAL, "http 400"),
        (400, "FAILED_PRECONDITION", OutcomeKind.FATAL, "http 400"),
        (403, "PERMISSION_DENIED", OutcomeKind.FATAL, "http 403"),
        (404, "NOT_FOUND", OutcomeKind.FATAL, "http 404"),
        (499, "CANCELLED", OutcomeKind.FATAL, "http 499"),
    ],
)
@pytest.mark.parametrize("lib", LIBS, ids=["httpx", "httpx2"])
def test_statuses_as_the_api_documents_them(
    code: int, status: str, kind: OutcomeKind, reason: str, lib: Any
) -> None:
    body = status_body(code, status, "The model is overloaded. Please try again later.")
    r = response(code, body, lib=lib)
    outcome = GEMINI.classify(r)
    assert (outcome.kind, outcome.reason, outcome.hint_s) == (kind, reason, None)
    assert outcome.value is r
    assert isinstance(outcome.error, RemoteError)
    assert "overloaded" in str(outcome.error)


@pytest.mark.parametrize(
    ("code", "kind"),
    [(503, OutcomeKind.OVERLOADED), (500, OutcomeKind.RETRYABLE), (400, OutcomeKind.FATAL)],
)
def test_retry_info_is_the_hint_whatever_the_status(code: int, kind: OutcomeKind) -> None:
    body = status_body(code, "UNAVAILABLE", "busy", retry_info("1.5s"))
    outcome = GEMINI.classify(response(code, body))
    assert outcome.kind is kind
    if kind is not OutcomeKind.FATAL:
        assert outcome.hint_s == 1.5


@pytest.mark.parametrize(
    ("code", "kind"),
    [(429, OutcomeKind.YIELD), (503, OutcomeKind.OVERLOADED), (500, OutcomeKind.RETRYABLE)],
)
def test_a_body_that_is_not_json_falls_back_to_the_status(code: int, kind: OutcomeKind) -> None:
    r = response(code, b"<html><body>Service Unavailable</body></html>", {"retry-after": "2"})
    outcome = GEMINI.classify(r)
    assert (outcome.kind, outcome.hint_s) == (kind, 2.0)


def test_an_error_wrapped_in_a_list_is_read() -> None:
    # Some Google endpoints answer [{"error": {...}}]; google-genai unwraps it too.
    body = [rate_limited(quota_failure(PER_DAY))]
    assert GEMINI.classify(response(429, body)).kind is OutcomeKind.FATAL


@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=8),
        lambda inner: (
            st.lists(inner, max_size=3)
            | st.dictionaries(
                st.sampled_from(
                    [
                        "@type",
                        "retryDelay",
                        "violations",
                        "quotaId",
                        "quotaValue",
                        "seconds",
                        "nanos",
                        "details",
                        "error",
                    ]
                ),
                inner,
                max_size=4,
            )
        ),
        max_leaves=12,
    )
)
def test_reading_any_json_never_raises(body: Any) -> None:
    delay = retry_delay_s({"error": {"details": [body, {"@type": RETRY_INFO, "retryDelay": body}]}})
    assert delay is None or 0 <= delay <= MAX_HINT_S
    spent_quota({"error": {"details": [{"@type": QUOTA_FAILURE, "violations": body}]}})
    assert GEMINI.classify(response(429, body)).kind in (OutcomeKind.YIELD, OutcomeKind.FATAL)


# -- google-genai's own errors, for code that wraps a whole client call ---------------


def test_google_genais_client_error_is_read_from_its_response() -> None:
    errors = pytest.importorskip("google.genai.errors")
    r = response(429, rate_limited(retry_info("0.5s")), lib=httpx2)
    with pytest.raises(errors.ClientError) as raised:
        errors.APIError.raise_for_response(r)
    outcome = GEMINI(None, raised.value)
    assert (outcome.kind, outcome.hint_s, outcome.error) == (OutcomeKind.YIELD, 0.5, raised.value)
    daily = response(429, rate_limited(quota_failure(PER_DAY)), lib=httpx2)
    with pytest.raises(errors.ClientError) as raised:
        errors.APIError.raise_for_response(daily)
    assert GEMINI(None, raised.value).kind is OutcomeKind.FATAL
