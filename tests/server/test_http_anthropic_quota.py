"""Quota mode on ``POST /v1/messages``: Anthropic's headers and 429s, seen by the anthropic SDK.

A real ``yieldgate serve`` process with Anthropic's limits (``--quota-itpm``,
``--quota-otpm``, ``--quota-rpm``); clients never retry. Windows are long
(600 s: under two tokens a second come back), so no assertion depends on how
fast the machine is: the buckets refill far slower than a test runs.
"""

from __future__ import annotations

import math
import time
from typing import Any

import anthropic
import httpx
import openai
import pytest

from tests.conftest import http_stats, stats_when
from yieldgate.dialects import get_dialect
from yieldgate.dialects._ratelimit import quota_readings
from yieldgate.server import ServerProcess

pytestmark = pytest.mark.e2e

MODEL = "claude-rehearsal"
WINDOW_S = 600.0


def client(server: ServerProcess) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.http_url, api_key="unused", max_retries=0)


def ask(api: anthropic.Anthropic, content: str, max_tokens: int, **kwargs: Any) -> Any:
    """The raw response (headers and all) of one Messages request."""
    return api.messages.with_raw_response.create(
        model=MODEL,
        max_tokens=max_tokens,
        messages=[{"role": "user", "content": content}],
        **kwargs,
    )


def prompt_tokens(content: str) -> int:
    """What the quota charges for a one-message prompt: ``user: ...`` at 4 characters a token."""
    return math.ceil(len(f"user: {content}") / 4)


def test_every_answer_carries_the_headers_and_the_sdks_parser_reads_them(serve: Any) -> None:
    server: ServerProcess = serve(
        "--http-port", "0", "--exec-ms", "5", "--quota-rpm", "50",
        "--quota-itpm", "40000", "--quota-otpm", "8000", "--quota-window-s", str(WINDOW_S),
    )  # fmt: skip
    with client(server) as api:
        whole = ask(api, "hello", 100)
        assert whole.parse().stop_reason == "end_turn"
        streamed = ask(api, "hello", 100, stream=True)
        assert [event.type for event in streamed.parse()][-1] == "message_stop"
    for raw, requests_left in ((whole, 49), (streamed, 48)):
        h = raw.headers
        assert h["anthropic-ratelimit-requests-limit"] == "50"
        assert h["anthropic-ratelimit-requests-remaining"] == str(requests_left)
        assert h["anthropic-ratelimit-input-tokens-limit"] == "40000"
        assert h["anthropic-ratelimit-output-tokens-limit"] == "8000"
        assert h["anthropic-ratelimit-tokens-limit"] == "48000"
        assert "x-ratelimit-limit-requests" not in h  # OpenAI's are the other routes'
    h = whole.headers
    assert int(h["anthropic-ratelimit-input-tokens-remaining"]) == 40000 - prompt_tokens("hello")
    assert int(h["anthropic-ratelimit-output-tokens-remaining"]) == 8000 - 100

    readings = {r.resource: r for r in quota_readings(h, now=time.time)}
    assert set(readings) == {"requests", "tokens", "input_tokens", "output_tokens"}
    assert readings["requests"].limit == 50
    assert readings["input_tokens"].remaining == 40000 - prompt_tokens("hello")
    assert readings["output_tokens"].remaining == 8000 - 100
    assert readings["tokens"].remaining == 48000 - prompt_tokens("hello") - 100
    for reading in readings.values():
        # Reset = when the bucket is full again: what was taken, refilled at limit / window.
        assert reading.reset_s is not None
        assert 0 < reading.reset_s <= WINDOW_S

    # The other routes keep OpenAI's headers, of the buckets they have: requests alone here.
    chat = openai.OpenAI(base_url=f"{server.http_url}/v1", api_key="unused", max_retries=0)
    with chat:
        raw_chat = chat.chat.completions.with_raw_response.create(
            model="gpt-4o", messages=[{"role": "user", "content": "hi"}], max_tokens=5
        )
    assert raw_chat.headers["x-ratelimit-limit-requests"] == "50"
    assert raw_chat.headers["x-ratelimit-remaining-requests"] == "49"  # a bucket of its own
    assert "x-ratelimit-limit-tokens" not in raw_chat.headers
    assert not any(name.startswith("anthropic-") for name in raw_chat.headers)


def test_a_big_prompt_spends_the_input_tokens_and_the_429_says_when(serve: Any) -> None:
    server: ServerProcess = serve(
        "--http-port", "0", "--exec-ms", "5", "--quota-itpm", "1000", "--quota-otpm", "100000",
        "--quota-window-s", str(WINDOW_S),
    )  # fmt: skip
    big = "y" * 2400
    with client(server) as api:
        first = ask(api, big, 10)
        left = int(first.headers["anthropic-ratelimit-input-tokens-remaining"])
        assert left == 1000 - prompt_tokens(big)
        with pytest.raises(anthropic.RateLimitError) as caught:
            ask(api, big, 10)
        assert ask(api, "small", 10).parse().stop_reason == "max_tokens"  # a small one fits
    error = caught.value
    assert error.status_code == 429
    body: Any = error.body
    message = body["error"]["message"]
    assert body == {"type": "error", "error": {"type": "rate_limit_error", "message": message}}
    assert message.startswith(
        f"Rate limit reached for {MODEL} on input tokens per minute: limit 1000, "
        f"used {1000 - left}, requested {prompt_tokens(big)}."
    )
    # The wait until the prompt fits, in whole seconds rounded up (the time the test took
    # has refilled a little of it).
    full_wait_s = (prompt_tokens(big) - left) / (1000 / WINDOW_S)
    retry_after = int(error.response.headers["retry-after"])
    assert full_wait_s - 30 < retry_after <= math.ceil(full_wait_s)
    assert "x-should-retry" not in error.response.headers
    assert error.response.headers["anthropic-ratelimit-input-tokens-limit"] == "1000"
    outcome = get_dialect("anthropic").classify(error.response)
    assert (outcome.kind, outcome.reason, outcome.hint_s) == ("yield", "rate_limited", retry_after)

    stats = http_stats(server)
    assert stats["quota_refused_input_tokens_total"] == 1
    assert stats["quota_refused_output_tokens_total"] == 0
    metrics = httpx.get(f"{server.http_url}/metrics").text
    assert "yieldgate_quota_refused_input_tokens_total 1.0" in metrics


async def _given_back(server: ServerProcess, amount: int) -> None:
    async def read() -> dict[str, Any]:
        return http_stats(server)

    await stats_when(read, lambda s: s["quota_output_tokens_given_back_total"] >= amount)


@pytest.mark.anyio
async def test_max_tokens_spends_the_output_tokens_until_the_answer_gives_back_the_rest(
    serve: Any,
) -> None:
    server: ServerProcess = serve(
        "--http-port", "0", "--exec-ms", "5", "--quota-itpm", "100000", "--quota-otpm", "1000",
        "--quota-window-s", str(WINDOW_S),
    )  # fmt: skip
    with client(server) as api:
        # An answer that uses all of its max_tokens keeps them all.
        used_all = ask(api, "x" * 700, 600)
        assert used_all.parse().usage.output_tokens == 600
        assert used_all.headers["anthropic-ratelimit-output-tokens-remaining"] == "400"

        with pytest.raises(anthropic.RateLimitError) as caught:
            ask(api, "hi", 600)  # 600 more at the door: more than what remains
        message = caught.value.body["error"]["message"]  # type: ignore[index]
        assert "on output tokens per minute: limit 1000, used 600, requested 600." in message
        assert int(caught.value.response.headers["retry-after"]) > 0

        # Larger than the whole bucket: no wait lets it in, and the SDK is told not to retry.
        with pytest.raises(anthropic.RateLimitError) as too_large:
            ask(api, "hi", 1001)
        assert too_large.value.body["error"]["message"].startswith(  # type: ignore[index]
            f"Request too large for {MODEL} on output tokens per minute: limit 1000, "
            "requested 1001."
        )
        assert "retry-after" not in too_large.value.response.headers
        assert too_large.value.response.headers["x-should-retry"] == "false"
        assert get_dialect("anthropic").classify(too_large.value.response).kind == "fatal"

        # An answer far shorter than its max_tokens gives the rest back once it ends.
        short = ask(api, "hi", 300)
        assert short.parse().usage.output_tokens == len("user: hi")
        await _given_back(server, 300 - len("user: hi"))
        # So 380 fits now: 400 - 300 + 292, and a little refill.
        assert ask(api, "hi", 380).parse().stop_reason == "end_turn"

    stats = http_stats(server)
    assert stats["quota_refused_output_tokens_total"] == 1
    assert stats["quota_too_large_total"] == 1


@pytest.mark.anyio
async def test_a_stream_the_client_leaves_gives_back_what_it_did_not_generate(
    serve: Any,
) -> None:
    server: ServerProcess = serve(
        "--http-port", "0", "--exec-ms", "5", "--quota-otpm", "1000",
        "--quota-window-s", str(WINDOW_S),
    )  # fmt: skip
    prompt = "user: " + "z" * 100  # streamed in 4 pieces of 27, 27, 26, 26 bytes, 2 s apart
    with client(server) as api:
        stream = api.messages.create(
            model=MODEL,
            max_tokens=500,
            messages=[{"role": "user", "content": prompt[len("user: ") :]}],
            stream=True,
            extra_body={"backend_params": {"exec_ms": 8000, "chunks": 4}},
        )
        assert next(iter(stream)).type == "message_start"  # sent with the first piece
        stream.close()  # the client leaves; the server cancels the rest

    async def read() -> dict[str, Any]:
        return http_stats(server)

    stats = await stats_when(
        read, lambda s: s["inflight"] == 0 and s["quota_output_tokens_given_back_total"] > 0
    )
    # 500 charged at the door; what was generated before it left is kept, the rest given back.
    assert 500 - len(prompt) <= stats["quota_output_tokens_given_back_total"] <= 500 - 27
    assert stats["cancelled_total"] == 1


def test_the_requests_limit_is_a_rate_limit_error_too(serve: Any) -> None:
    server: ServerProcess = serve(
        "--http-port", "0", "--exec-ms", "5", "--quota-rpm", "2", "--quota-window-s",
        str(WINDOW_S),
    )  # fmt: skip
    with client(server) as api:
        ask(api, "a", 5)
        last = ask(api, "b", 5)
        assert last.headers["anthropic-ratelimit-requests-remaining"] == "0"
        assert [n for n in last.headers if n.startswith("anthropic-ratelimit-")] == [
            "anthropic-ratelimit-requests-limit",
            "anthropic-ratelimit-requests-remaining",
            "anthropic-ratelimit-requests-reset",
        ]
        with pytest.raises(anthropic.RateLimitError) as caught:
            ask(api, "c", 5)
    assert "on requests per minute: limit 2, used 2, requested 1." in str(caught.value)
    assert int(caught.value.response.headers["retry-after"]) > 0
