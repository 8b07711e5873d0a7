"""Quota mode end to end: ``yieldgate serve --quota-*`` against the unmodified openai client.

The server runs in a real process with a short window; the client never
retries (``max_retries=0``), so every 429 is seen. No assertion depends on how
fast the machine is: a burst runs until the quota refuses, however long that
takes, and the hint is checked by waiting it out (the buckets only refill).
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable
from typing import Any

import httpx
import openai
import pytest

from yieldgate.dialects._hints import message_hint_s
from yieldgate.server import ServerProcess

pytestmark = pytest.mark.e2e

_DURATION = re.compile(r"(?:(\d+)h)?(?:(\d+)m(?!s))?(?:(\d+(?:\.\d+)?)s|(\d+)ms)")
_HINT = re.compile(r"Please try again in (\S+)\. Visit ")
_TPM = 300
_WINDOW_S = 6.0  # 50 tokens/s
_MAX_TOKENS = 146  # "user: hi" is 8 characters: 2 tokens; 148 a request


def seconds(duration: str) -> float:
    """A Go duration (``6m0s``, ``1.234s``, ``20ms``) in seconds."""
    match = _DURATION.fullmatch(duration)
    assert match is not None, duration
    hours, minutes, secs, ms = match.groups()
    return int(hours or 0) * 3600 + int(minutes or 0) * 60 + float(secs or 0) + int(ms or 0) / 1000


def client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.http_url}/v1", api_key="unused", max_retries=0)


def chat(api: openai.OpenAI, *, max_tokens: int = _MAX_TOKENS, stream: bool = False) -> Any:
    return api.chat.completions.with_raw_response.create(
        model="gpt-4o",
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=max_tokens,
        stream=stream,
    )


def refused(send: Callable[[], Any], timeout: float = 60.0) -> openai.RateLimitError:
    """Send until the quota refuses (each success charges more than the refill brings)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            send()
        except openai.RateLimitError as exc:
            return exc
    raise AssertionError("the quota never refused")


def test_the_openai_client_reads_the_headers_and_a_token_429_and_its_hint(serve: Any) -> None:
    server: ServerProcess = serve(
        "--http-port", "0", "--exec-ms", "5",
        "--quota-tpm", str(_TPM), "--quota-rpm", "1000", "--quota-window-s", str(_WINDOW_S),
    )  # fmt: skip
    with client(server) as api:
        raw = chat(api, stream=True)
        for _ in raw.parse():
            pass  # a stream carries the headers too
        h = raw.headers
        assert h["x-ratelimit-limit-tokens"] == str(_TPM)
        assert h["x-ratelimit-limit-requests"] == "1000"
        assert int(h["x-ratelimit-remaining-tokens"]) <= _TPM - (2 + _MAX_TOKENS)
        assert int(h["x-ratelimit-remaining-requests"]) <= 999
        assert 0 < seconds(h["x-ratelimit-reset-tokens"]) <= _WINDOW_S
        assert 0 < seconds(h["x-ratelimit-reset-requests"]) <= _WINDOW_S

        exc = refused(lambda: chat(api))
        assert exc.status_code == 429
        assert exc.code == "rate_limit_exceeded"
        assert isinstance(exc.body, dict)
        assert exc.body["type"] == "tokens"
        assert exc.body["param"] is None
        assert exc.body["message"].startswith(
            f"Rate limit reached for gpt-4o in organization org-yieldgate on tokens per min "
            f"(TPM): Limit {_TPM}, Used "
        )
        assert "retry-after" not in exc.response.headers
        assert "retry-after-ms" not in exc.response.headers
        assert exc.response.headers["x-ratelimit-limit-tokens"] == str(_TPM)
        remaining = int(exc.response.headers["x-ratelimit-remaining-tokens"])
        assert remaining < 2 + _MAX_TOKENS
        hint = _HINT.search(exc.body["message"])
        assert hint is not None
        wait_s = seconds(hint.group(1))
        assert 0 < wait_s <= (2 + _MAX_TOKENS) / (_TPM / _WINDOW_S)
        assert message_hint_s(exc.body["message"]) == pytest.approx(wait_s)  # the SDK reads it

        # Nothing else charges this quota: once the hint has passed, the request fits.
        time.sleep(wait_s)
        ok = chat(api)
        assert ok.parse().choices[0].message.content

        # Larger than the whole bucket: refused for good, and nothing is charged.
        with pytest.raises(openai.RateLimitError) as too_large:
            chat(api, max_tokens=_TPM)
        assert too_large.value.code == "rate_limit_exceeded"
        assert "Request too large for gpt-4o" in too_large.value.message
        assert f"Limit {_TPM}, Requested {_TPM + 2}." in too_large.value.message

    stats = httpx.get(f"{server.http_url}/stats").json()
    assert stats["quota_refused_tokens_total"] >= 1
    assert stats["quota_too_large_total"] == 1
    assert stats["quota_tokens_charged_total"] == stats["quota_requests_charged_total"] * (
        2 + _MAX_TOKENS
    )
    # A refusal never took a slot: the Governor admitted exactly what the quota charged.
    assert stats["admitted_total"] == stats["quota_requests_charged_total"]


def test_a_request_limit_429_carries_retry_after_in_seconds(serve: Any) -> None:
    server: ServerProcess = serve(
        "--http-port", "0", "--exec-ms", "5", "--quota-rpm", "2", "--quota-window-s", "30",
    )  # fmt: skip
    with client(server) as api:
        exc = refused(lambda: chat(api, max_tokens=1))
    assert exc.code == "rate_limit_exceeded"
    assert isinstance(exc.body, dict)
    assert exc.body["type"] == "requests"
    assert "on requests per min (RPM): Limit 2, Used 2, Requested 1." in exc.message
    hint = _HINT.search(exc.message)
    assert hint is not None
    assert exc.response.headers["retry-after"] == str(math.ceil(seconds(hint.group(1))))
    assert exc.response.headers["x-ratelimit-remaining-requests"] == "0"
    assert "x-ratelimit-limit-tokens" not in exc.response.headers


def test_other_dialects_answer_the_quota_in_their_own_shape(serve: Any) -> None:
    server: ServerProcess = serve("--http-port", "0", "--exec-ms", "5", "--quota-tpm", "10")
    reply = httpx.post(
        f"{server.http_url}/generate",
        json={"inputs": "hello", "parameters": {"max_new_tokens": 20}},
    )
    assert reply.status_code == 429
    assert reply.json()["code"] == "rate_limit_exceeded"
    assert reply.json()["error"].startswith("Request too large for yieldgate-sim")
    assert reply.headers["x-ratelimit-limit-tokens"] == "10"
    ok = httpx.post(
        f"{server.http_url}/generate", json={"inputs": "hi", "parameters": {"max_new_tokens": 9}}
    )
    assert ok.status_code == 200
    assert ok.headers["x-ratelimit-remaining-tokens"] == "0"
    metrics = httpx.get(f"{server.http_url}/metrics").text.splitlines()
    assert "yieldgate_quota_too_large_total 1.0" in metrics
    assert "yieldgate_quota_tokens_charged_total 10.0" in metrics


def test_azure_mode_answers_as_azure_on_a_deployment_route(serve: Any) -> None:
    server: ServerProcess = serve(
        "--http-port", "0", "--exec-ms", "5", "--quota-tpm", "300", "--quota-window-s", "6",
        "--quota-headers", "azure", "--quota-per-model",
    )  # fmt: skip
    api = openai.AzureOpenAI(
        azure_endpoint=server.http_url, api_version="2024-10-21", api_key="x", max_retries=0
    )
    first = api.chat.completions.with_raw_response.create(
        model="dep-a", messages=[{"role": "user", "content": "hi"}], max_tokens=_MAX_TOKENS
    )
    assert first.parse().model == "dep-a"
    assert first.headers["x-ratelimit-remaining-tokens"] == str(_TPM - 148)
    assert "x-ratelimit-limit-tokens" not in first.headers
    assert "x-ratelimit-reset-tokens" not in first.headers
    api.chat.completions.create(
        model="dep-a", messages=[{"role": "user", "content": "hi"}], max_tokens=_MAX_TOKENS
    )
    with pytest.raises(openai.RateLimitError) as caught:
        api.chat.completions.create(
            model="dep-a", messages=[{"role": "user", "content": "hi"}], max_tokens=_MAX_TOKENS
        )
    error = caught.value
    assert error.response.json()["error"]["code"] == "429"
    assert "Please retry after" in error.response.json()["error"]["message"]
    millis = int(error.response.headers["retry-after-ms"])
    assert error.response.headers["x-ms-retry-after-ms"] == str(millis)
    assert int(error.response.headers["retry-after"]) == math.ceil(millis / 1000)
    # Another deployment has its own quota.
    other = api.chat.completions.create(
        model="dep-b", messages=[{"role": "user", "content": "hi"}], max_tokens=_MAX_TOKENS
    )
    assert other.model == "dep-b"


def test_the_responses_route_meters_instructions_and_input_parts(serve: Any) -> None:
    server: ServerProcess = serve(
        "--http-port", "0", "--exec-ms", "5", "--quota-tpm", "1000", "--quota-window-s", "60"
    )
    api = client(server)
    reply = api.responses.with_raw_response.create(
        model="gpt-4o",
        instructions="Be brief.",
        input=[{"role": "user", "content": [{"type": "input_text", "text": "hello there"}]}],
        max_output_tokens=10,
    )
    # "system: Be brief.\nuser: hello there" is 35 characters: 9 tokens, plus 10.
    assert reply.headers["x-ratelimit-remaining-tokens"] == str(1000 - 19)
    response = reply.parse()
    assert response.output_text
    assert response.usage is not None
    assert response.usage.output_tokens <= 10
    assert response.model == "gpt-4o"
    plain = api.responses.create(model="gpt-4o", input="hi", max_output_tokens=3)
    assert plain.status in ("completed", "incomplete")
    assert (plain.status == "incomplete") == (plain.incomplete_details is not None)
    with pytest.raises(openai.BadRequestError, match="stream"):
        api.responses.create(model="gpt-4o", input="hi", stream=True)
    with pytest.raises(openai.BadRequestError, match="input"):
        api.responses.create(model="gpt-4o", input=[])
