"""The providers' rate-limit headers, as documented, and malformed ones (ignored, never raised)."""

from __future__ import annotations

from datetime import UTC, datetime

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from yieldgate.dialects._cost import estimate_cost, usage_of
from yieldgate.dialects._ratelimit import go_duration_s, quota_readings
from yieldgate.gate import Cost, QuotaPolicy

NOW = 1_700_000_000.0


def readings(headers: dict[str, str]) -> dict[str, tuple[object, ...]]:
    found = quota_readings(httpx.Headers(headers), now=lambda: NOW)
    return {r.key: (r.resource, r.limit, r.remaining, r.reset_s, r.window_s) for r in found}


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("6m0s", 360.0),
        ("1s", 1.0),
        ("20ms", 0.02),
        ("1.234s", 1.234),
        ("1h2m3.5s", 3723.5),
        ("0s", 0.0),
        ("17", 17.0),
        ("500us", 0.0005),
    ],
)
def test_go_durations(text: str, seconds: float) -> None:
    assert go_duration_s(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "soon", "-1s", "1x", "s", "1s2", "inf", "nan"])
def test_bad_go_durations_are_none(text: str) -> None:
    assert go_duration_s(text) is None


def test_openai_headers() -> None:
    # As on platform.openai.com/docs/guides/rate-limits (Azure OpenAI sends the same names).
    found = readings(
        {
            "x-ratelimit-limit-requests": "60",
            "x-ratelimit-limit-tokens": "150000",
            "x-ratelimit-remaining-requests": "59",
            "x-ratelimit-remaining-tokens": "149984",
            "x-ratelimit-reset-requests": "1s",
            "x-ratelimit-reset-tokens": "6m0s",
        }
    )
    assert found == {
        "openai:requests": ("requests", 60.0, 59.0, 1.0, None),
        "openai:tokens": ("tokens", 150000.0, 149984.0, 360.0, None),
    }


def test_anthropic_headers() -> None:
    reset = datetime.fromtimestamp(NOW + 12, UTC).isoformat().replace("+00:00", "Z")
    found = readings(
        {
            "anthropic-ratelimit-requests-limit": "50",
            "anthropic-ratelimit-requests-remaining": "49",
            "anthropic-ratelimit-requests-reset": reset,
            "anthropic-ratelimit-input-tokens-limit": "40000",
            "anthropic-ratelimit-input-tokens-remaining": "39000",
            "anthropic-ratelimit-input-tokens-reset": reset,
            "anthropic-ratelimit-output-tokens-limit": "8000",
            "anthropic-ratelimit-output-tokens-remaining": "7000",
            "anthropic-ratelimit-output-tokens-reset": (
                datetime.fromtimestamp(NOW - 5, UTC).isoformat()
            ),
        }
    )
    # Every Anthropic limit is per minute: the window, not the reset, gives the rate.
    assert found["anthropic:requests"] == ("requests", 50.0, 49.0, pytest.approx(12.0), 60.0)
    assert found["anthropic:input_tokens"][:3] == ("input_tokens", 40000.0, 39000.0)
    # A reset time already past is "full now", not negative.
    assert found["anthropic:output_tokens"][3] == 0.0


def test_ietf_fields() -> None:
    found = readings(
        {
            "RateLimit-Policy": (
                '"burst";q=100;w=60, "daily";q=1000;w=86400, "bytes";q=9;qu="content-bytes"'
            ),
            "RateLimit": '"burst";r=50;t=30, "daily";r=900;t=3600, "bytes";r=1;t=1',
        }
    )
    assert found == {
        "ietf:burst": ("requests", 100.0, 50.0, 30.0, 60.0),
        "ietf:daily": ("requests", 1000.0, 900.0, 3600.0, 86400.0),
    }


def test_ietf_older_fields() -> None:
    found = readings(
        {"RateLimit-Limit": "100, 100;w=60", "RateLimit-Remaining": "7", "RateLimit-Reset": "20"}
    )
    assert found == {"ietf:default": ("requests", 100.0, 7.0, 20.0, 60.0)}


@pytest.mark.parametrize(
    "headers",
    [
        {"x-ratelimit-limit-tokens": "lots", "x-ratelimit-remaining-tokens": "1"},
        {"x-ratelimit-limit-tokens": "100"},  # nothing remaining said
        {"x-ratelimit-limit-tokens": "0", "x-ratelimit-remaining-tokens": "0"},
        {"x-ratelimit-limit-tokens": "-5", "x-ratelimit-remaining-tokens": "1"},
        {"x-ratelimit-limit-tokens": "inf", "x-ratelimit-remaining-tokens": "1"},
        {"anthropic-ratelimit-tokens-limit": "10", "anthropic-ratelimit-tokens-remaining": "x"},
        {"RateLimit": '"a";r=1;t=1'},  # no policy
        {"RateLimit": "garbage ;;; ,,", "RateLimit-Policy": "=== q=1"},
        {"RateLimit-Limit": "", "RateLimit-Remaining": "1"},
    ],
)
def test_malformed_headers_describe_nothing(headers: dict[str, str]) -> None:
    assert readings(headers) == {}


def test_a_bad_reset_keeps_the_bucket_without_one() -> None:
    found = readings(
        {
            "x-ratelimit-limit-tokens": "100",
            "x-ratelimit-remaining-tokens": "150",  # more than the limit: clamped
            "x-ratelimit-reset-tokens": "whenever",
        }
    )
    assert found == {"openai:tokens": ("tokens", 100.0, 100.0, None, None)}


_NAMES = st.sampled_from(
    [
        "x-ratelimit-limit-tokens",
        "x-ratelimit-remaining-tokens",
        "x-ratelimit-reset-tokens",
        "anthropic-ratelimit-tokens-limit",
        "anthropic-ratelimit-tokens-remaining",
        "anthropic-ratelimit-tokens-reset",
        "ratelimit",
        "ratelimit-policy",
        "ratelimit-limit",
        "ratelimit-remaining",
        "ratelimit-reset",
    ]
)


@given(st.dictionaries(_NAMES, st.text(alphabet=st.characters(codec="latin-1"), max_size=40)))
def test_no_header_value_raises(headers: dict[str, str]) -> None:
    raw = {name: value.encode("latin-1") for name, value in headers.items()}
    for reading in quota_readings(httpx.Headers(raw), now=lambda: NOW):
        assert reading.remaining >= 0
        if reading.limit is not None:  # None: what remains, alone (Azure's style)
            assert reading.limit > 0
            assert reading.remaining <= reading.limit


# -- what a request costs, and what it used -------------------------------------------


def test_the_cost_of_a_chat_request() -> None:
    body = (
        b'{"model": "m", "max_tokens": 50, "messages": [{"role": "user", "content": "hello"}, '
        b'{"role": "user", "content": [{"type": "text", "text": "abc"}]}]}'
    )
    # "user: hello\nuser: abc" is 21 characters: 6 tokens at four characters each.
    assert estimate_cost(body, QuotaPolicy()) == Cost.of(6, 50, "m")
    # One quota per upstream: no scope.
    assert estimate_cost(body, QuotaPolicy(per_model=False)) == Cost.of(6, 50)


def test_the_cost_uses_a_tokenizer_when_given_and_a_default_output_bound() -> None:
    policy = QuotaPolicy(count_tokens=lambda text: len(text.split()), default_output_tokens=9)
    assert estimate_cost(b'{"prompt": "one two three"}', policy) == Cost.of(3, 9)
    assert estimate_cost(
        b'{"inputs": "a b", "parameters": {"max_new_tokens": 4}}', policy
    ) == Cost.of(2, 4)


@pytest.mark.parametrize("body", [b"", b"not json", b"[1, 2]", b'{"other": 1}', b"\xff\xfe"])
def test_bodies_that_say_nothing_cost_nothing_known(body: bytes) -> None:
    assert estimate_cost(body, QuotaPolicy()) is None


def test_a_tokenizer_that_fails_falls_back_to_characters() -> None:
    def broken(text: str) -> int:
        raise RuntimeError("no vocabulary")

    assert estimate_cost(b'{"prompt": "12345678"}', QuotaPolicy(count_tokens=broken)) == Cost.of(
        2, 256
    )


def test_usage_from_the_end_of_a_body() -> None:
    whole = (
        b'{"id": "x", "usage": {"prompt_tokens": 12, "completion_tokens": 5, '
        b'"total_tokens": 17, "prompt_tokens_details": {"cached_tokens": 0}}}'
    )
    assert usage_of(whole) == Cost.of(12, 5)
    stream = (
        b'data: {"choices": [], "usage": null}\n\n'
        b'data: {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 4}}\n\n'
        b"data: [DONE]\n\n"
    )
    assert usage_of(stream) == Cost.of(3, 4)
    assert usage_of(b'{"usage": {"input_tokens": 7, "output_tokens": 1}}') == Cost.of(7, 1)
    assert usage_of(b'{"no": "usage"}') is None


def test_an_ietf_partition_key_is_a_bucket_of_its_own() -> None:
    headers = httpx.Headers(
        {
            "ratelimit-policy": '"burst";q=100;w=60',
            "ratelimit": '"burst";r=50;t=30;pk=:dXNlcjE=:',
        }
    )
    (one,) = quota_readings(headers)
    assert one.key == "ietf:burst:dXNlcjE=:"
    assert (one.limit, one.remaining, one.window_s) == (100, 50, 60)
    other = httpx.Headers({**headers, "ratelimit": '"burst";r=7;t=30;pk=:dXNlcjI=:'})
    assert quota_readings(other)[0].key == "ietf:burst:dXNlcjI=:"


def test_a_policy_name_cannot_pose_as_a_scope() -> None:
    headers = httpx.Headers({"ratelimit-policy": '"a@b";q=100;w=60', "ratelimit": '"a@b";r=50'})
    assert [r.key for r in quota_readings(headers)] == ["ietf:a_b"]
