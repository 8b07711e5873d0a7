"""google-genai's ``genai.Client`` over the Gate, sync and async, against a fake Gemini API.

The real google-genai package sends through ``yieldgate.http_client(gate,
dialect="gemini")`` passed in its ``HttpOptions`` (``httpx_client`` /
``httpx_async_client``), its own retries off, as docs/recipes/gemini.md shows.
The fake is a real HTTP server on 127.0.0.1 (port 0) that answers ``POST
/v1beta/models/{model}:generateContent`` as the Gemini API documents: a
scripted run of error replies (429 ``RESOURCE_EXHAUSTED`` with ``RetryInfo``,
503 ``UNAVAILABLE``, a daily quota spent), then a ``GenerateContentResponse``.
It stamps each request as it arrives, so the waits are measured by the
server, not by the test's own clock around the call.
"""

from __future__ import annotations

import contextlib
import json
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx2
import pytest
from google import genai
from google.genai import errors, types

import yieldgate
from yieldgate import (
    CallFailedError,
    DeadlineExceededError,
    Gate,
    GatePolicy,
    GaveUpError,
    RetryPolicy,
    YieldExhaustedError,
)

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

MODEL = "gemini-2.0-flash"
API_KEY = "test-key"
# google-genai 3.x calls v1 unless told otherwise; v1beta is the other version Google serves.
_ROUTE = re.compile(r"/(?:v1|v1beta)/models/([^/:]+):(generateContent|streamGenerateContent)")
RETRY_S = 0.3
METRIC = "generativelanguage.googleapis.com/generate_content_free_tier_requests"


def status(code: int, name: str, message: str, *details: Any) -> dict[str, Any]:
    """A ``google.rpc.Status`` error body, as the Gemini API answers one."""
    error: dict[str, Any] = {"code": code, "message": message, "status": name}
    if details:
        error["details"] = list(details)
    return {"error": error}


def quota_failure(quota_id: str) -> dict[str, Any]:
    return {
        "@type": "type.googleapis.com/google.rpc.QuotaFailure",
        "violations": [
            {
                "quotaMetric": METRIC,
                "quotaId": quota_id,
                "quotaDimensions": {"location": "global", "model": MODEL},
                "quotaValue": "15",
            }
        ],
    }


def retry_info(delay: str) -> dict[str, Any]:
    return {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": delay}


def rate_limited(delay_s: float = RETRY_S) -> tuple[int, dict[str, Any]]:
    body = status(
        429,
        "RESOURCE_EXHAUSTED",
        "You exceeded your current quota, please check your plan and billing details.",
        quota_failure("GenerateRequestsPerMinutePerProjectPerModel-FreeTier"),
        retry_info(f"{delay_s:.3f}s"),
    )
    return 429, body


DAILY_QUOTA = (
    429,
    status(
        429,
        "RESOURCE_EXHAUSTED",
        "You exceeded your current quota, please check your plan and billing details.",
        quota_failure("GenerateRequestsPerDayPerProjectPerModel-FreeTier"),
        retry_info("34117.021553s"),
    ),
)
OVERLOADED = (503, status(503, "UNAVAILABLE", "The model is overloaded. Please try again later."))


USAGE = {"promptTokenCount": 2, "candidatesTokenCount": 1, "totalTokenCount": 3}


def answer(text: str, usage: dict[str, int] = USAGE) -> dict[str, Any]:
    """A ``GenerateContentResponse`` with one candidate, and its ``usageMetadata``."""
    return {
        "candidates": [
            {
                "content": {"role": "model", "parts": [{"text": text}]},
                "finishReason": "STOP",
                "index": 0,
            }
        ],
        "usageMetadata": usage,
        "modelVersion": MODEL,
    }


@dataclass
class FakeGemini:
    """Answers the scripted replies in order, then ``answer("hello", usage)`` to every
    request (a stream: ``"hel"`` and ``"lo"`` as two server-sent events, the first
    with the prompt's count alone, the last with ``usage``, as Gemini's last chunk
    has the final counts).

    ``arrivals`` holds the ``time.monotonic()`` of each request as it arrived,
    ``bodies`` its JSON body. The first ``hold`` requests are answered only once
    ``release`` is set; ``released`` says, for each request, whether it was set
    when the request arrived.
    """

    script: list[tuple[int, dict[str, Any]]]
    url: str = ""
    arrivals: list[float] = field(default_factory=list)
    models: list[str] = field(default_factory=list)
    bodies: list[dict[str, Any]] = field(default_factory=list)
    usage: dict[str, int] = field(default_factory=lambda: dict(USAGE))
    hold: int = 0
    release: threading.Event = field(default_factory=threading.Event)
    released: list[bool] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def reply(self, path: str, headers: Any, body: bytes) -> tuple[int, Any]:
        route = _ROUTE.fullmatch(path)
        if route is None:
            return 404, status(404, "NOT_FOUND", f"no route {path}")
        if headers.get("x-goog-api-key") != API_KEY:
            return 403, status(403, "PERMISSION_DENIED", "API key not valid.")
        request = json.loads(body)
        assert request["contents"][0]["parts"][0]["text"]
        with self.lock:
            self.arrivals.append(time.monotonic())
            self.models.append(route.group(1))
            self.bodies.append(request)
            self.released.append(self.release.is_set())
            held = len(self.arrivals) <= self.hold
            scripted = self.script.pop(0) if self.script else None
            usage = dict(self.usage)
        if held:
            self.release.wait(10)
        if scripted is not None:
            return scripted
        if route.group(2) == "streamGenerateContent":
            prompt = usage.get("promptTokenCount", 0)
            first = {"promptTokenCount": prompt, "totalTokenCount": prompt}
            return 200, [answer("hel", first), answer("lo", usage)]  # server-sent events
        return 200, answer("hello", usage)

    def gaps(self) -> list[float]:
        with self.lock:
            return [b - a for a, b in zip(self.arrivals, self.arrivals[1:], strict=False)]


@contextlib.contextmanager
def fake_gemini(*script: tuple[int, dict[str, Any]]) -> Iterator[FakeGemini]:
    """A ``FakeGemini`` on 127.0.0.1 (port 0), shut down and joined on exit, also on error."""
    fake = FakeGemini(list(script))

    class Handler(BaseHTTPRequestHandler):
        # HTTP/1.0: one request per connection, so no handler thread outlives the test.
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length", 0)))
            code, payload = fake.reply(self.path.split("?", 1)[0], self.headers, body)
            if isinstance(payload, list):  # ?alt=sse, as google-genai asks for a stream
                data = b"".join(b"data: " + json.dumps(p).encode() + b"\r\n\r\n" for p in payload)
                kind = "text/event-stream"
            else:
                data, kind = json.dumps(payload).encode(), "application/json; charset=UTF-8"
            self.send_response(code)
            self.send_header("content-type", kind)
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(
        target=server.serve_forever, args=(0.05,), name="fake-gemini", daemon=True
    )
    thread.start()
    try:
        fake.url = f"http://127.0.0.1:{server.server_address[1]}"
        yield fake
    finally:
        fake.release.set()  # no held request outlives the test
        server.shutdown()
        server.server_close()  # joins the handler threads
        thread.join(10)


def options(http: Any, sync: bool, **more: Any) -> types.HttpOptions:
    """The recipe's ``HttpOptions``: the Gate's client, google-genai's retries off."""
    client = {"httpx_client": http} if sync else {"httpx_async_client": http}
    return types.HttpOptions(retry_options=types.HttpRetryOptions(attempts=1), **client, **more)


def gate(**retry: Any) -> Gate:
    return Gate(GatePolicy(retry=RetryPolicy(**retry)), name="gemini")


def assert_waited_out(fake: FakeGemini, hints: list[float]) -> None:
    gaps = fake.gaps()
    assert len(gaps) == len(hints)
    for gap, hint in zip(gaps, hints, strict=True):
        assert gap >= hint, f"retried {gap:.3f} s after a {hint} s RetryInfo: {gaps}"


# -- sync ---------------------------------------------------------------------------


def test_sync_waits_out_retry_info_and_succeeds() -> None:
    g = gate()
    with (
        fake_gemini(rate_limited(), rate_limited()) as fake,
        yieldgate.http_client(g, dialect="gemini", flavor="httpx2", sync=True) as http,
    ):
        opts = options(http, True, base_url=fake.url, api_version="v1beta")
        client = genai.Client(api_key=API_KEY, http_options=opts)
        reply = client.models.generate_content(model=MODEL, contents="hi")
    assert reply.text == "hello"
    assert fake.models == [MODEL] * 3
    assert_waited_out(fake, [RETRY_S, RETRY_S])
    stats = g.statistics()
    assert (stats.calls, stats.calls_ok, stats.attempts, stats.yields) == (1, 1, 3, 2)
    assert stats.waited_s >= 2 * RETRY_S


def test_sync_a_daily_quota_fails_at_once_with_google_genais_client_error() -> None:
    g = gate()
    with (
        fake_gemini(DAILY_QUOTA) as fake,
        yieldgate.http_client(g, dialect="gemini", flavor="httpx2", sync=True) as http,
    ):
        client = genai.Client(api_key=API_KEY, http_options=options(http, True, base_url=fake.url))
        with pytest.raises(errors.ClientError) as caught:
            client.models.generate_content(model=MODEL, contents="hi")
    error = caught.value
    assert (error.code, error.status) == (429, "RESOURCE_EXHAUSTED")
    assert "PerDay" in json.dumps(error.details)
    assert len(fake.arrivals) == 1  # not retried, by the Gate or by google-genai
    assert isinstance(error.response.extensions["yieldgate_error"], CallFailedError)
    assert g.statistics().attempts == 1


def test_sync_a_stream_waits_out_retry_info_and_keeps_its_slot_until_closed() -> None:
    g = gate()
    with (
        fake_gemini(rate_limited()) as fake,
        yieldgate.http_client(g, dialect="gemini", flavor="httpx2", sync=True) as http,
    ):
        client = genai.Client(api_key=API_KEY, http_options=options(http, True, base_url=fake.url))
        stream = client.models.generate_content_stream(model=MODEL, contents="hi")
        first = next(stream)
        assert g.statistics().window.inflight == 1  # the body is still open
        text = (first.text or "") + "".join(chunk.text or "" for chunk in stream)
        assert g.statistics().window.inflight == 0
    assert text == "hello"
    assert_waited_out(fake, [RETRY_S])
    assert (g.statistics().attempts, g.statistics().yields) == (2, 1)


def test_sync_still_overloaded_when_the_gate_stops_is_google_genais_server_error() -> None:
    g = gate(max_yields=1, base_s=0.01)
    with (
        fake_gemini(OVERLOADED, OVERLOADED, OVERLOADED) as fake,
        yieldgate.http_client(g, dialect="gemini", flavor="httpx2", sync=True) as http,
    ):
        client = genai.Client(api_key=API_KEY, http_options=options(http, True, base_url=fake.url))
        with pytest.raises(errors.ServerError) as caught:
            client.models.generate_content(model=MODEL, contents="hi")
    assert (caught.value.code, caught.value.status) == (503, "UNAVAILABLE")
    assert isinstance(caught.value.response.extensions["yieldgate_error"], GaveUpError)
    assert len(fake.arrivals) == 2


def test_sync_no_connection_raises_httpx2s_transport_error_that_is_the_gates(
    refused_url: str,
) -> None:
    g = gate(max_attempts=2, base_s=0.01)
    with yieldgate.http_client(g, dialect="gemini", flavor="httpx2", sync=True) as http:
        client = genai.Client(
            api_key=API_KEY, http_options=options(http, True, base_url=refused_url)
        )
        with pytest.raises(httpx2.TransportError) as caught:
            client.models.generate_content(model=MODEL, contents="hi")
    assert isinstance(caught.value, GaveUpError)
    assert caught.value.attempts == 2
    assert isinstance(caught.value.__cause__, httpx2.ConnectError)


def test_sync_a_deadline_without_a_response_raises_httpx2s_timeout_that_is_the_gates(
    refused_url: str,
) -> None:
    g = gate(max_attempts=100, base_s=0.05)
    with yieldgate.http_client(g, dialect="gemini", flavor="httpx2", sync=True) as http:
        opts = options(http, True, base_url=refused_url, timeout=300)  # milliseconds
        client = genai.Client(api_key=API_KEY, http_options=opts)
        with pytest.raises(httpx2.TimeoutException) as caught:
            client.models.generate_content(model=MODEL, contents="hi")
    assert isinstance(caught.value, DeadlineExceededError)
    assert caught.value.attempts >= 1


# -- async --------------------------------------------------------------------------


async def test_async_waits_out_retry_info_and_succeeds() -> None:
    g = gate()
    with fake_gemini(rate_limited(), rate_limited()) as fake:
        async with yieldgate.http_client(g, dialect="gemini", flavor="httpx2") as http:
            client = genai.Client(
                api_key=API_KEY, http_options=options(http, False, base_url=fake.url)
            )
            reply = await client.aio.models.generate_content(model=MODEL, contents="hi")
    assert reply.text == "hello"
    assert len(fake.arrivals) == 3
    assert_waited_out(fake, [RETRY_S, RETRY_S])
    stats = g.statistics()
    assert (stats.calls, stats.calls_ok, stats.attempts, stats.yields) == (1, 1, 3, 2)


async def test_async_an_overloaded_503_is_retried() -> None:
    g = gate(base_s=0.05)
    with fake_gemini(OVERLOADED, OVERLOADED) as fake:
        async with yieldgate.http_client(g, dialect="gemini", flavor="httpx2") as http:
            client = genai.Client(
                api_key=API_KEY, http_options=options(http, False, base_url=fake.url)
            )
            reply = await client.aio.models.generate_content(model=MODEL, contents="hi")
    assert reply.text == "hello"
    assert len(fake.arrivals) == 3
    stats = g.statistics()
    assert (stats.attempts, stats.overloads, stats.calls_ok) == (3, 2, 1)


async def test_async_a_daily_quota_fails_at_once_with_google_genais_client_error() -> None:
    g = gate()
    with fake_gemini(DAILY_QUOTA) as fake:
        async with yieldgate.http_client(g, dialect="gemini", flavor="httpx2") as http:
            client = genai.Client(
                api_key=API_KEY, http_options=options(http, False, base_url=fake.url)
            )
            with pytest.raises(errors.ClientError) as caught:
                await client.aio.models.generate_content(model=MODEL, contents="hi")
    assert (caught.value.code, caught.value.status) == (429, "RESOURCE_EXHAUSTED")
    assert len(fake.arrivals) == 1


async def test_async_when_the_gate_stops_waiting_the_last_429_is_google_genais_error() -> None:
    g = gate(max_yields=1)
    with fake_gemini(rate_limited(0.05), rate_limited(0.05), rate_limited(0.05)) as fake:
        async with yieldgate.http_client(g, dialect="gemini", flavor="httpx2") as http:
            client = genai.Client(
                api_key=API_KEY, http_options=options(http, False, base_url=fake.url)
            )
            with pytest.raises(errors.ClientError) as caught:
                await client.aio.models.generate_content(model=MODEL, contents="hi")
    assert caught.value.code == 429
    assert isinstance(caught.value.response.extensions["yieldgate_error"], YieldExhaustedError)
    assert len(fake.arrivals) == 2


async def test_async_a_retry_delay_past_google_genais_timeout_ends_the_call_at_once() -> None:
    # HttpOptions.timeout (milliseconds) bounds the whole call, waits included: a
    # RetryInfo longer than the time left is not waited on.
    g = gate()
    with fake_gemini(rate_limited(5.0)) as fake:
        async with yieldgate.http_client(g, dialect="gemini", flavor="httpx2") as http:
            opts = options(http, False, base_url=fake.url, timeout=2000)
            client = genai.Client(api_key=API_KEY, http_options=opts)
            started = time.monotonic()
            with pytest.raises(errors.ClientError) as caught:
                await client.aio.models.generate_content(model=MODEL, contents="hi")
            took = time.monotonic() - started
    assert isinstance(caught.value.response.extensions["yieldgate_error"], DeadlineExceededError)
    assert len(fake.arrivals) == 1
    assert took < 5.0  # the RetryInfo: it was not waited on


async def test_async_no_connection_raises_httpx2s_transport_error_that_is_the_gates(
    refused_url: str,
) -> None:
    g = gate(max_attempts=2, base_s=0.01)
    async with yieldgate.http_client(g, dialect="gemini", flavor="httpx2") as http:
        client = genai.Client(
            api_key=API_KEY, http_options=options(http, False, base_url=refused_url)
        )
        with pytest.raises(httpx2.TransportError) as caught:
            await client.aio.models.generate_content(model=MODEL, contents="hi")
    assert isinstance(caught.value, GaveUpError)
