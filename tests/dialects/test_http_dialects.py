"""Every rule of every HTTP dialect, on real httpx and httpx2 Response objects."""

from __future__ import annotations

import email.utils
import json
from typing import Any

import httpx
import httpx2
import pytest
from hypothesis import given
from hypothesis import strategies as st

from yieldgate import RemoteError
from yieldgate.dialects import (
    GEMINI,
    GOVERNED_HTTP,
    HUGGINGFACE,
    OPENAI,
    TGI,
    HttpDialect,
    ResponseFormatError,
    get_dialect,
    huggingface_text,
    retry_hint_s,
    should_retry,
)
from yieldgate.gate import OutcomeKind
from yieldgate.gate._outcome import MAX_HINT_S

ALL = (OPENAI, GEMINI, HUGGINGFACE, TGI, GOVERNED_HTTP)
LIBS = (httpx, httpx2)


def response(
    status: int, body: Any = None, headers: dict[str, str] | None = None, lib: Any = httpx
) -> Any:
    content = (
        b"" if body is None else body if isinstance(body, bytes) else json.dumps(body).encode()
    )
    return lib.Response(status, headers=headers or {}, content=content)


# -- hints ------------------------------------------------------------------


def test_retry_after_ms_wins_over_retry_after() -> None:
    headers = httpx.Headers({"Retry-After-Ms": "250", "Retry-After": "7"})
    assert retry_hint_s(headers) == 0.25


def test_retry_after_in_seconds_including_fractions() -> None:
    assert retry_hint_s(httpx.Headers({"retry-after": "3"})) == 3.0
    assert retry_hint_s(httpx.Headers({"retry-after": " 1.5 "})) == 1.5


def test_retry_after_as_an_http_date() -> None:
    now = 1_800_000_000.0
    date = email.utils.formatdate(now + 30, usegmt=True)
    assert retry_hint_s(httpx.Headers({"retry-after": date}), now=lambda: now) == pytest.approx(30)
    past = email.utils.formatdate(now - 30, usegmt=True)
    assert retry_hint_s(httpx.Headers({"retry-after": past}), now=lambda: now) == 0.0


@pytest.mark.parametrize("bad", ["soon", "-1", "nan", "inf", "", "Mon, 99 Foo 2026"])
def test_unreadable_hints_give_none(bad: str) -> None:
    assert retry_hint_s(httpx.Headers({"retry-after": bad})) is None


def test_a_bad_retry_after_ms_falls_back_to_retry_after() -> None:
    assert retry_hint_s(httpx.Headers({"retry-after-ms": "x", "retry-after": "2"})) == 2.0


def test_no_hint_headers() -> None:
    assert retry_hint_s(httpx.Headers({})) is None


@pytest.mark.parametrize(
    ("value", "expected"), [("true", True), ("FALSE", False), ("maybe", None), (None, None)]
)
def test_should_retry(value: str | None, expected: bool | None) -> None:
    headers = httpx.Headers({} if value is None else {"x-should-retry": value})
    assert should_retry(headers) is expected


@given(st.text(max_size=40))
def test_hint_parsing_never_raises(text: str) -> None:
    try:
        headers = httpx.Headers({"retry-after": text, "retry-after-ms": text})
    except (UnicodeEncodeError, httpx.LocalProtocolError):
        return  # not a header value httpx would carry
    hint = retry_hint_s(headers)
    assert hint is None or hint >= 0


# -- rules shared by every dialect ---------------------------------------------


@pytest.mark.parametrize("lib", LIBS)
@pytest.mark.parametrize("dialect", ALL, ids=lambda d: d.name)
def test_2xx_is_ok_and_carries_the_response(dialect: HttpDialect, lib: Any) -> None:
    r = response(200, {"x": 1}, lib=lib)
    outcome = dialect.classify(r)
    assert outcome.kind is OutcomeKind.OK
    assert outcome.value is r


@pytest.mark.parametrize("dialect", ALL, ids=lambda d: d.name)
@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (429, OutcomeKind.YIELD),
        (503, OutcomeKind.OVERLOADED),
        (408, OutcomeKind.RETRYABLE),
        (409, OutcomeKind.RETRYABLE),
        (500, OutcomeKind.RETRYABLE),
        (502, OutcomeKind.RETRYABLE),
        (504, OutcomeKind.RETRYABLE),
        (400, OutcomeKind.FATAL),
        (401, OutcomeKind.FATAL),
        (404, OutcomeKind.FATAL),
    ],
)
def test_status_rules(dialect: HttpDialect, status: int, kind: OutcomeKind) -> None:
    r = response(status, {"error": "x"}, {"retry-after-ms": "1500"})
    outcome = dialect.classify(r)
    assert outcome.kind is kind
    assert outcome.value is r
    if kind is not OutcomeKind.FATAL:
        assert outcome.hint_s == 1.5
    if kind is OutcomeKind.YIELD:
        assert outcome.reason == "rate_limited"  # refused at the door: nothing to report
    else:
        assert isinstance(outcome.error, RemoteError)
        assert outcome.error.code == f"http_{status}"


@pytest.mark.parametrize("dialect", ALL, ids=lambda d: d.name)
def test_x_should_retry_overrides_the_status(dialect: HttpDialect) -> None:
    assert dialect.classify(response(400, None, {"x-should-retry": "true"})).kind is (
        OutcomeKind.RETRYABLE
    )
    for status in (429, 500, 503):
        outcome = dialect.classify(response(status, None, {"x-should-retry": "false"}))
        assert outcome.kind is OutcomeKind.FATAL


@pytest.mark.parametrize("dialect", ALL, ids=lambda d: d.name)
def test_non_json_error_bodies_fall_back_to_the_status(dialect: HttpDialect) -> None:
    outcome = dialect.classify(response(503, b"<html>bad gateway</html>", {"retry-after": "2"}))
    assert outcome.kind is OutcomeKind.OVERLOADED
    assert outcome.hint_s == 2.0


# -- family rules ---------------------------------------------------------------


def test_openai_insufficient_quota_is_fatal() -> None:
    body = {
        "error": {"message": "quota", "type": "insufficient_quota", "code": "insufficient_quota"}
    }
    assert OPENAI.classify(response(429, body)).kind is OutcomeKind.FATAL
    rate = {"error": {"message": "slow down", "type": "requests", "code": "rate_limit_exceeded"}}
    assert OPENAI.classify(response(429, rate)).kind is OutcomeKind.YIELD


@pytest.mark.parametrize("dialect", [HUGGINGFACE, GOVERNED_HTTP], ids=lambda d: d.name)
def test_huggingface_loading_is_a_cold_start_yield_with_estimated_time(
    dialect: HttpDialect,
) -> None:
    body = {"error": "Model gpt2 is currently loading", "estimated_time": 20.5}
    outcome = dialect.classify(response(503, body))
    assert outcome.kind is OutcomeKind.YIELD
    assert outcome.reason == "cold_start"
    assert outcome.hint_s == 20.5


def test_huggingface_loading_without_estimate_still_yields() -> None:
    body = {"error": "Model gpt2 is currently loading"}
    outcome = HUGGINGFACE.classify(response(503, body, {"retry-after": "4"}))
    assert (outcome.kind, outcome.reason, outcome.hint_s) == (OutcomeKind.YIELD, "cold_start", 4.0)


@pytest.mark.parametrize(
    ("estimated", "dialect"),
    [(1e8, HUGGINGFACE), (1e9, HUGGINGFACE), (1e300, HUGGINGFACE), (1e8, GOVERNED_HTTP)],
)
def test_a_huge_estimate_is_clamped_like_any_huge_hint(estimated: float, dialect: Any) -> None:
    # Issue 16 item 6: 1e8 was clamped, 1e9 counted as no hint at all.
    outcome = dialect.classify(response(503, {"error": "loading", "estimated_time": estimated}))
    assert (outcome.kind, outcome.reason, outcome.hint_s) == (
        OutcomeKind.YIELD,
        "cold_start",
        MAX_HINT_S,
    )


@pytest.mark.parametrize("millis", [1e12, 10**400])
def test_a_huge_governed_http_hint_is_clamped(millis: float) -> None:
    # 1e12 ms counted as no hint, where 1e11 was honoured.
    body = {"status": "yield", "retry_hint_ms": millis, "reason": "saturated"}
    outcome = GOVERNED_HTTP.classify(response(429, body))
    assert (outcome.kind, outcome.hint_s) == (OutcomeKind.YIELD, MAX_HINT_S)


@pytest.mark.parametrize("header", ["0.001", "1e-9"])
def test_a_tiny_header_hint_is_kept_as_it_is(header: str) -> None:
    # Kept: the Gate's backoff floor (from a call's second retry) is what stops a storm.
    outcome = OPENAI.classify(response(429, {}, headers={"retry-after-ms": header}))
    assert outcome.hint_s == pytest.approx(float(header) / 1000)


@pytest.mark.parametrize("header", ["-5", "nan", "inf", "1e999"])
def test_a_negative_or_non_finite_header_hint_is_no_hint(header: str) -> None:
    outcome = OPENAI.classify(response(429, {}, headers={"retry-after-ms": header}))
    assert (outcome.kind, outcome.hint_s) == (OutcomeKind.YIELD, None)


@pytest.mark.parametrize("bad", [-1, "20", True, None, float("nan")])
def test_huggingface_bad_estimates_are_not_hints(bad: Any) -> None:
    outcome = HUGGINGFACE.classify(response(503, {"error": "busy", "estimated_time": bad}))
    assert outcome.kind is OutcomeKind.OVERLOADED
    assert outcome.hint_s is None


def test_estimated_time_is_ignored_by_the_openai_dialect() -> None:
    body = {"error": "Model gpt2 is currently loading", "estimated_time": 20.5}
    outcome = OPENAI.classify(response(503, body))
    assert outcome.kind is OutcomeKind.OVERLOADED
    assert outcome.hint_s is None


def test_huggingface_rate_limit_uses_retry_after() -> None:
    outcome = HUGGINGFACE.classify(response(429, {"error": "rate limit"}, {"Retry-After": "9"}))
    assert (outcome.kind, outcome.hint_s) == (OutcomeKind.YIELD, 9.0)


@pytest.mark.parametrize("dialect", [TGI, GOVERNED_HTTP], ids=lambda d: d.name)
def test_tgi_overloaded(dialect: HttpDialect) -> None:
    body = {"error": "Model is overloaded", "error_type": "overloaded"}
    outcome = dialect.classify(response(429, body))
    assert (outcome.kind, outcome.reason, outcome.hint_s) == (OutcomeKind.YIELD, "overloaded", None)


def test_load_refusals_are_told_from_a_models_quota() -> None:
    """Issue 39: a 429 that refuses one model's quota holds that model alone, and leaves
    the window alone; a 429 that refuses load (the reference server's OpenAI yield,
    TGI's "Model is overloaded" relayed by an endpoint) must narrow the window, so it
    has a reason of its own (on the tree before this, both read ``rate_limited``: a
    Gate of threads and tasks made 2.0-3.1 attempts a call where 1.5 is expected)."""
    governed = {"error": {"message": "full", "type": "yield", "param": None, "code": "saturated"}}
    outcome = OPENAI.classify(response(429, governed, {"retry-after-ms": "40"}))
    assert (outcome.kind, outcome.reason, outcome.hint_s) == (OutcomeKind.YIELD, "saturated", 0.04)
    relayed = HUGGINGFACE.classify(response(429, {"error": "Model is overloaded (saturated)"}))
    assert (relayed.kind, relayed.reason) == (OutcomeKind.YIELD, "overloaded")
    quota = {"error": {"message": "Rate limit reached for requests", "code": "rate_limit_exceeded"}}
    assert OPENAI.classify(response(429, quota, {"retry-after": "2"})).reason == "rate_limited"
    assert HUGGINGFACE.classify(response(429, {"error": "rate limit"})).reason == "rate_limited"


def test_tgi_generation_error_is_retryable_and_validation_fatal() -> None:
    failed = TGI.classify(response(424, {"error": "CUDA OOM", "error_type": "generation"}))
    assert (failed.kind, failed.reason) == (OutcomeKind.RETRYABLE, "generation")
    invalid = TGI.classify(response(422, {"error": "bad", "error_type": "validation"}))
    assert invalid.kind is OutcomeKind.FATAL
    assert OPENAI.classify(response(424, None)).kind is OutcomeKind.FATAL


def test_governed_yield_body_reads_hint_and_reason() -> None:
    body = {
        "error": {"message": "full", "type": "yield", "param": None, "code": "saturated"},
        "status": "yield",
        "retry_hint_ms": 340,
        "inflight": 4,
        "max_inflight": 4,
        "reason": "saturated",
    }
    headers = {"retry-after-ms": "999", "retry-after": "1"}
    outcome = GOVERNED_HTTP.classify(response(429, body, headers))
    assert (outcome.kind, outcome.reason, outcome.hint_s) == (OutcomeKind.YIELD, "saturated", 0.34)
    # The same reply through the openai dialect: a yield for load (its error's code),
    # hinted by the header.
    openai_view = OPENAI.classify(response(429, body, headers))
    assert (openai_view.kind, openai_view.reason, openai_view.hint_s) == (
        OutcomeKind.YIELD,
        "saturated",
        0.999,
    )


def test_governed_yield_without_usable_hint_uses_headers_and_error_code() -> None:
    body = {"status": "yield", "retry_hint_ms": "soon", "error": {"code": "slo"}}
    outcome = GOVERNED_HTTP.classify(response(429, body, {"retry-after-ms": "120"}))
    assert (outcome.kind, outcome.reason, outcome.hint_s) == (OutcomeKind.YIELD, "slo", 0.12)


def test_dialect_is_a_gate_classifier() -> None:
    r = response(429, {"error": "x"}, {"retry-after": "1"}, lib=httpx2)
    assert OPENAI(r, None).kind is OutcomeKind.YIELD
    assert OPENAI({"not": "a response"}, None).kind is OutcomeKind.OK
    assert OPENAI(None, httpx.ConnectError("refused")).kind is OutcomeKind.RETRYABLE
    assert OPENAI(None, httpx2.ConnectError("refused")).kind is OutcomeKind.RETRYABLE
    assert OPENAI(None, ValueError("bug")).kind is OutcomeKind.FATAL


def test_get_dialect() -> None:
    assert get_dialect("governed-http") is GOVERNED_HTTP
    assert get_dialect(TGI) is TGI
    with pytest.raises(ValueError, match="unknown dialect 'grpc'"):
        get_dialect("grpc")


# -- HuggingFace text ---------------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        [{"generated_text": "hi"}],
        {"generated_text": "hi"},
        [[{"generated_text": "hi"}]],
        [{"summary_text": "hi"}],
        [{"translation_text": "hi"}],
        {"text": "hi"},
        {"choices": [{"message": {"role": "assistant", "content": "hi"}}]},
        {"choices": [{"text": "hi"}]},
        "hi",
        ["hi"],
    ],
)
def test_huggingface_text_shapes(body: Any) -> None:
    assert huggingface_text(json.dumps(body).encode()) == "hi"
    assert huggingface_text(json.dumps(body)) == "hi"
    if not isinstance(body, str):  # a str argument is JSON text, not decoded JSON
        assert huggingface_text(body) == "hi"


@pytest.mark.parametrize(
    ("body", "match"),
    [
        (b"<html>", "not JSON"),
        (b"\xff\xfe", "not UTF-8"),
        (b"[]", "no generated text"),
        (b'{"labels": ["a"], "scores": [0.5]}', "no generated text"),
        (b'[{"generated_text": 5}]', "no generated text"),
        (b'{"error": "Model is overloaded"}', "is an error: Model is overloaded"),
        (b"null", "no generated text"),
        (b'[[[[[[[["deep"]]]]]]]]', "no generated text"),
    ],
)
def test_huggingface_text_unparseable_bodies_raise_typed_errors(body: bytes, match: str) -> None:
    with pytest.raises(ResponseFormatError, match=match) as info:
        huggingface_text(body)
    assert len(info.value.excerpt) <= 200


@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(),
        lambda c: st.lists(c) | st.dictionaries(st.text(), c),
        max_leaves=20,
    )
)
def test_huggingface_text_returns_text_or_raises_the_typed_error(body: Any) -> None:
    try:
        text = huggingface_text(json.dumps(body))
    except ResponseFormatError:
        return
    assert isinstance(text, str)
