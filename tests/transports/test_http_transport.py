"""The Gate under httpx and httpx2 clients: retries, held slots, give-up answers.

httpx2 requests go to ``httpx2.MockTransport`` (respx does not intercept
httpx2); httpx requests go through the real ``httpx.AsyncHTTPTransport``,
intercepted by respx. Time is virtual: hinted waits pass at once.
"""

from __future__ import annotations

import gc
import json
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import anyio
import httpx
import httpx2
import pytest
import respx

from tests.vtime import VirtualTimeLoop, gates_read_the_loop_clock
from yieldgate import (
    CallFailedError,
    DeadlineExceededError,
    Gate,
    GatePolicy,
    RetriesExhaustedError,
    RetryPolicy,
    StreamInterruptedError,
    TimeoutPolicy,
    WindowPolicy,
    YieldExhaustedError,
    current_attempt,
    gate_transport,
    http_client,
)
from yieldgate.transports.http import MAX_ERROR_BODY_BYTES

URL = "http://upstream.test/v1/chat/completions"

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, Any]]:
    return ("asyncio", {"loop_factory": VirtualTimeLoop})


@pytest.fixture(autouse=True)
def _loop_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    gates_read_the_loop_clock(monkeypatch)


def yield_body(hint_ms: int, reason: str = "saturated") -> dict[str, Any]:
    return {
        "error": {"message": "full", "type": "yield", "param": None, "code": reason},
        "status": "yield",
        "retry_hint_ms": hint_ms,
        "inflight": 1,
        "max_inflight": 1,
        "reason": reason,
    }


class Script:
    """Answers requests from a list of (status, body, headers); records what it saw."""

    def __init__(self, *replies: tuple[int, Any, dict[str, str]]) -> None:
        self.replies = list(replies)
        self.requests: list[dict[str, Any]] = []

    def record(self, request: Any) -> tuple[int, bytes, dict[str, str]]:
        attempt = current_attempt()
        self.requests.append(
            {
                "content": request.content,
                "headers": dict(request.headers),
                "priority": None if attempt is None else attempt.priority.value,
            }
        )
        status, body, headers = self.replies.pop(0) if len(self.replies) > 1 else self.replies[0]
        content = body if isinstance(body, bytes) else json.dumps(body).encode()
        return status, content, headers


Client = Callable[..., Any]


class Body(httpx2.AsyncByteStream):
    """A body not yet read, as a network transport returns it."""

    def __init__(self, *chunks: bytes) -> None:
        self.chunks = chunks

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for chunk in self.chunks:
            yield chunk


def httpx2_client(script: Script, gate: Gate, dialect: str = "governed-http", **kwargs: Any) -> Any:
    def handler(request: httpx2.Request) -> httpx2.Response:
        status, content, headers = script.record(request)
        # A body not yet read, as a network transport returns it.
        return httpx2.Response(status, headers=headers, stream=Body(content))

    return http_client(gate, dialect=dialect, inner=httpx2.MockTransport(handler), **kwargs)


@pytest.fixture
def respx_router() -> Iterator[respx.MockRouter]:
    with respx.mock(assert_all_called=False) as router:
        yield router


def httpx_client(
    script: Script,
    gate: Gate,
    router: respx.MockRouter,
    dialect: str = "governed-http",
    **kwargs: Any,
) -> Any:
    def handler(request: httpx.Request) -> httpx.Response:
        status, content, headers = script.record(request)
        return httpx.Response(status, content=content, headers=headers)

    router.route(host="upstream.test").mock(side_effect=handler)
    return http_client(gate, dialect=dialect, flavor="httpx", **kwargs)


@pytest.fixture(params=["httpx2", "httpx"])
def make_client(request: pytest.FixtureRequest, respx_router: respx.MockRouter) -> Client:
    if request.param == "httpx2":
        return httpx2_client
    return lambda script, gate, dialect="governed-http", **kwargs: httpx_client(
        script, gate, respx_router, dialect, **kwargs
    )


def one_slot_gate(**retry: Any) -> Gate:
    return Gate(
        GatePolicy(window=WindowPolicy.fixed(1), retry=RetryPolicy(**retry)), name="upstream"
    )


async def test_a_yield_is_waited_out_and_the_same_body_resent(make_client: Client) -> None:
    script = Script((429, yield_body(250), {}), (200, {"ok": True}, {}))
    gate = one_slot_gate()
    async with make_client(script, gate) as client:
        started = anyio.current_time()
        response = await client.post(URL, json={"prompt": "hello"})
        waited = anyio.current_time() - started
    assert response.status_code == 200
    assert response.json() == {"ok": True}
    assert [r["content"] for r in script.requests] == [b'{"prompt":"hello"}'] * 2
    assert 0.25 <= waited <= 0.25 * 1.5 + 0.01  # the hint, with at most 50% jitter
    stats = gate.statistics()
    assert (stats.yields, stats.attempts, stats.window.inflight) == (1, 2, 0)


async def test_the_slot_is_held_until_the_body_is_closed(make_client: Client) -> None:
    script = Script((200, b"data: 1\n\ndata: 2\n\n", {"content-type": "text/event-stream"}))
    gate = one_slot_gate()
    async with (
        make_client(script, gate) as client,
        client.stream("POST", URL, json={"stream": True}) as response,
    ):
        assert gate.statistics().window.inflight == 1
        second_done = anyio.Event()

        async def second() -> None:
            await client.post(URL, json={})
            second_done.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(second)
            await anyio.sleep(5)
            # The window has one slot and the stream holds it.
            assert not second_done.is_set()
            assert gate.statistics().window.waiting == 1
            chunks = [chunk async for chunk in response.aiter_bytes()]
            await response.aclose()
            await second_done.wait()
    assert b"".join(chunks) == b"data: 1\n\ndata: 2\n\n"
    assert gate.statistics().window.inflight == 0
    assert len(script.requests) == 2


async def test_giving_up_returns_the_last_response_to_the_client(make_client: Client) -> None:
    script = Script((429, yield_body(100), {"retry-after-ms": "100"}))
    gate = one_slot_gate(max_yields=3)
    async with make_client(script, gate) as client:
        response = await client.post(URL, json={})
    assert response.status_code == 429
    assert response.json()["status"] == "yield"
    error = response.extensions["yieldgate_error"]
    assert isinstance(error, YieldExhaustedError)
    assert error.attempts == 4
    assert len(script.requests) == 4
    assert gate.statistics().window.inflight == 0


async def test_a_fatal_status_is_returned_at_once(make_client: Client) -> None:
    script = Script((400, {"error": {"message": "bad model"}}, {}))
    gate = one_slot_gate()
    async with make_client(script, gate, "openai") as client:
        response = await client.post(URL, json={})
    assert response.status_code == 400
    assert isinstance(response.extensions["yieldgate_error"], CallFailedError)
    assert len(script.requests) == 1


async def test_5xx_then_success(make_client: Client) -> None:
    script = Script((502, b"bad gateway", {}), (500, b"", {}), (200, b"fine", {}))
    gate = one_slot_gate(max_attempts=4)
    async with make_client(script, gate, "openai") as client:
        response = await client.get(URL)
    assert (response.status_code, response.text) == (200, "fine")
    assert gate.statistics().failures == 2


async def test_connection_errors_exhaust_into_a_typed_error() -> None:
    attempts = 0

    def refuse(request: httpx2.Request) -> httpx2.Response:
        nonlocal attempts
        attempts += 1
        raise httpx2.ConnectError("connection refused", request=request)

    gate = one_slot_gate(max_attempts=3)
    async with http_client(gate, inner=httpx2.MockTransport(refuse)) as client:
        with pytest.raises(RetriesExhaustedError) as info:
            await client.get(URL)
    assert attempts == 3
    assert isinstance(info.value.__cause__, httpx2.ConnectError)
    assert gate.statistics().window.inflight == 0


async def test_a_non_upstream_error_surfaces_as_the_library_raised_it() -> None:
    gate = one_slot_gate()
    async with http_client(gate, flavor="httpx") as client:
        with pytest.raises(httpx.UnsupportedProtocol):
            await client.get("ftp://upstream.test/")
    assert gate.statistics().attempts == 1


async def test_priority_header_sets_the_call_priority(make_client: Client) -> None:
    script = Script((200, b"", {}))
    gate = one_slot_gate()
    async with make_client(script, gate) as client:
        await client.get(URL, headers={"x-yieldgate-priority": "high"})
        await client.get(URL)
        with pytest.raises(ValueError, match="x-yieldgate-priority must be high, normal or low"):
            await client.get(URL, headers={"x-yieldgate-priority": "urgent"})
    assert [r["priority"] for r in script.requests] == ["high", "normal"]
    # Sent on as well, for servers that read it.
    assert script.requests[0]["headers"]["x-yieldgate-priority"] == "high"


async def test_governed_http_sends_the_remaining_budget(make_client: Client) -> None:
    script = Script((200, b"", {}))
    gate = Gate(GatePolicy(window=WindowPolicy.fixed(1)), name="upstream")
    async with make_client(script, gate) as client:
        await client.get(URL)
    async with make_client(script, gate, "openai") as client:
        await client.get(URL)
    sent = int(script.requests[0]["headers"]["x-yieldgate-deadline-ms"])
    assert 0 < sent <= 60_000  # the policy's 60 s attempt timeout
    assert "x-yieldgate-deadline-ms" not in script.requests[1]["headers"]


async def test_a_streamed_upload_is_replayed_on_retry() -> None:
    script = Script((503, {"error": "busy"}, {"retry-after": "1"}), (200, b"", {}))

    def handler(request: httpx2.Request) -> httpx2.Response:
        status, content, headers = script.record(request)
        return httpx2.Response(status, content=content, headers=headers)

    async def body() -> AsyncIterator[bytes]:
        yield b"part one, "
        yield b"part two"

    gate = one_slot_gate()
    async with http_client(gate, inner=httpx2.MockTransport(handler)) as client:
        response = await client.post(URL, content=body())
    assert response.status_code == 200
    assert [r["content"] for r in script.requests] == [b"part one, part two"] * 2


async def test_a_response_never_closed_returns_its_slot_when_collected() -> None:
    def handler(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(200, stream=Body(b"x" * 10))

    gate = one_slot_gate()
    transport = gate_transport(gate, inner=httpx2.MockTransport(handler))
    request = httpx2.Request("GET", URL)
    response = await transport.handle_async_request(request)
    assert gate.statistics().window.inflight == 1
    del response
    gc.collect()
    assert gate.statistics().window.inflight == 0
    await transport.aclose()


@pytest.mark.parametrize("flavor", ["httpx2", "httpx"])
async def test_closing_the_client_gives_back_the_slot_of_a_body_left_open(flavor: str) -> None:
    lib = {"httpx": httpx, "httpx2": httpx2}[flavor]

    class Endless(lib.AsyncByteStream):  # type: ignore[name-defined, misc]
        async def __aiter__(self) -> AsyncIterator[bytes]:
            while True:
                yield b"data: more\n\n"
                await anyio.sleep(1)

    def handler(request: Any) -> Any:
        headers = {"content-type": "text/event-stream"}
        return lib.Response(200, headers=headers, stream=Endless())

    gate = one_slot_gate()
    client = http_client(gate, inner=lib.MockTransport(handler))
    response = await client.send(client.build_request("GET", URL), stream=True)
    # Kept: the library closes a response whose byte iterator is dropped.
    reader = response.aiter_bytes()
    assert await reader.__anext__()
    assert gate.statistics().window.inflight == 1
    await client.aclose()
    assert gate.statistics().window.inflight == 0
    await reader.aclose()  # closed late: the slot was given back once, not twice
    assert gate.statistics().window.inflight == 0


async def test_a_body_that_breaks_mid_read_counts_as_a_failure() -> None:
    class Broken(httpx2.AsyncByteStream):
        async def __aiter__(self) -> AsyncIterator[bytes]:
            yield b"partial"
            raise httpx2.ReadError("connection reset")

    def handler(request: httpx2.Request) -> httpx2.Response:
        headers = {"content-type": "text/event-stream"}
        return httpx2.Response(200, stream=Broken(), headers=headers)

    gate = Gate(GatePolicy(window=WindowPolicy(initial=4, min=1, max=8)), name="upstream")
    async with http_client(gate, inner=httpx2.MockTransport(handler)) as client:
        # Past the first chunk: a typed error with what arrived, not a retry.
        with pytest.raises(StreamInterruptedError) as caught:
            await client.get(URL)
    assert caught.value.chunks == [b"partial"]
    assert isinstance(caught.value.__cause__, httpx2.ReadError)
    stats = gate.statistics()
    assert stats.attempts == 1
    assert stats.window.inflight == 0
    assert stats.window.increases == 0  # a failed body is no success


async def test_a_body_that_breaks_before_its_first_chunk_is_retried() -> None:
    class Broken(httpx2.AsyncByteStream):
        async def __aiter__(self) -> AsyncIterator[bytes]:
            raise httpx2.ReadError("connection reset")
            yield b""  # pragma: no cover - makes this a generator

    sent = []

    def handler(request: httpx2.Request) -> httpx2.Response:
        sent.append(request)
        if len(sent) == 1:
            return httpx2.Response(200, stream=Broken())
        return httpx2.Response(200, content=b"whole")

    gate = Gate(GatePolicy(retry=RetryPolicy(base_s=0.01)), name="upstream")
    async with http_client(gate, inner=httpx2.MockTransport(handler)) as client:
        response = await client.get(URL)
    assert response.content == b"whole"
    assert len(sent) == 2
    assert gate.statistics().window.inflight == 0


def test_unknown_flavor_and_dialect_are_refused() -> None:
    gate = one_slot_gate()
    with pytest.raises(ValueError, match="flavor must be 'httpx' or 'httpx2'"):
        http_client(gate, flavor="requests")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown dialect"):
        http_client(gate, dialect="soap")


def test_client_kwargs_reach_the_client() -> None:
    gate = one_slot_gate()
    client = http_client(
        gate, base_url="http://upstream.test", headers={"x-team": "a"}, flavor="httpx"
    )
    assert isinstance(client, httpx.AsyncClient)
    assert str(client.base_url) == "http://upstream.test"
    assert client.headers["x-team"] == "a"
    # ``timeout`` is the Gate's. The library gets no network timeout of its own
    # (the Gate bounds attempts and calls), which a request then could not lift.
    assert http_client(gate, timeout=7.0, flavor="httpx").timeout == httpx.Timeout(None)
    with pytest.raises(TypeError, match="inner="):
        http_client(gate, transport=httpx.AsyncHTTPTransport())


async def test_timeout_bounds_each_request_retries_and_waits_included(
    make_client: Client,
) -> None:
    # The upstream yields for 1 s, again and again: a 2.5 s request stops at the
    # wait that would pass it, and the client gets the last 429.
    script = Script((429, yield_body(1000), {"retry-after-ms": "1000"}))
    gate = one_slot_gate(max_yields=100)
    async with make_client(script, gate, timeout=2.5) as client:
        started = anyio.current_time()
        response = await client.post(URL, json={})
        took = anyio.current_time() - started
    assert response.status_code == 429
    assert isinstance(response.extensions["yieldgate_error"], DeadlineExceededError)
    assert took <= 2.5
    assert 2 <= len(script.requests) <= 3


def test_the_flavor_is_the_inner_transports_else_the_installed_clients() -> None:
    gate = one_slot_gate()
    # openai 3.x (installed here) is built on httpx2: so is a client nobody named a flavor for.
    assert isinstance(http_client(gate), httpx2.AsyncClient)
    assert isinstance(http_client(gate, sync=True), httpx2.Client)
    respond = lambda request: None  # noqa: E731 - never called
    assert isinstance(http_client(gate, inner=httpx.MockTransport(respond)), httpx.AsyncClient)
    assert isinstance(http_client(gate, inner=httpx.HTTPTransport(), sync=True), httpx.Client)
    with pytest.raises(ValueError, match="inner is a transport of httpx"):
        http_client(gate, flavor="httpx2", inner=httpx.AsyncHTTPTransport())
    with pytest.raises(ValueError, match="inner is an async transport, but a sync one"):
        http_client(gate, inner=httpx2.AsyncHTTPTransport(), sync=True)


async def test_a_response_the_inner_transport_already_read_frees_its_slot_at_once() -> None:
    def handler(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(200, content=b"read already")  # loaded and closed

    gate = one_slot_gate()
    transport = gate_transport(gate, inner=httpx2.MockTransport(handler))
    response = await transport.handle_async_request(httpx2.Request("GET", URL))
    assert response.content == b"read already"
    assert gate.statistics().window.inflight == 0


async def test_an_error_body_cut_off_by_the_attempt_timeout_is_still_closed() -> None:
    closed: list[bool] = []

    class SlowBody(httpx2.AsyncByteStream):
        async def __aiter__(self) -> AsyncIterator[bytes]:
            yield b'{"error": '
            await anyio.sleep(60)  # the rest never comes in time
            yield b'"late"}'

        async def aclose(self) -> None:
            closed.append(True)  # httpcore shields its own close from cancellation

    def handler(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(503, stream=SlowBody())

    policy = GatePolicy(
        window=WindowPolicy.fixed(1),
        retry=RetryPolicy(max_attempts=2),
        timeout=TimeoutPolicy(attempt_s=1.0, total_s=30.0),
    )
    gate = Gate(policy, name="upstream")
    async with http_client(gate, inner=httpx2.MockTransport(handler)) as client:
        with pytest.raises(RetriesExhaustedError):
            await client.get(URL)
    assert closed == [True, True]  # one per attempt, though both were cancelled mid-read
    assert gate.statistics().window.inflight == 0


class Endless(httpx2.AsyncByteStream):
    """A 100 MiB body, produced lazily; counts what was pulled and whether it was closed."""

    CHUNK = b"x" * (1 << 20)

    def __init__(self, chunks: int = 100) -> None:
        self.chunks = chunks
        self.pulled = 0
        self.closed = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield b'{"error": {"message": "slow down", "code": "rate_limit_exceeded"}, "pad": "'
        for _ in range(self.chunks):
            self.pulled += len(self.CHUNK)
            yield self.CHUNK
        yield b'"}'

    async def aclose(self) -> None:
        self.closed = True


async def test_item7_a_huge_error_body_is_read_only_up_to_the_cap() -> None:
    # A 429 with a 100 MiB body was downloaded whole on every attempt.
    bodies: list[Endless] = []

    def handler(request: httpx2.Request) -> httpx2.Response:
        body = Endless()
        bodies.append(body)
        return httpx2.Response(429, headers={"retry-after-ms": "10"}, stream=body)

    gate = Gate(GatePolicy(retry=RetryPolicy(max_yields=2)), name="upstream")
    inner = httpx2.MockTransport(handler)
    async with http_client(gate, dialect="openai", inner=inner) as client:
        response = await client.post(URL, json={})
    assert response.status_code == 429
    assert len(bodies) == 3
    for body in bodies:
        assert body.pulled <= 2 * MAX_ERROR_BODY_BYTES  # not 100 MiB
        assert body.closed  # the rest was never read; the connection goes
    assert len(response.content) == MAX_ERROR_BODY_BYTES  # a bounded body, handed on
    assert response.extensions["yieldgate_truncated"] is True
    assert gate.statistics().window.inflight == 0


async def test_a_small_error_body_is_handed_on_whole_and_decoded(make_client: Client) -> None:
    script = Script((400, {"error": {"message": "bad model"}}, {}))
    gate = one_slot_gate()
    async with make_client(script, gate, "openai") as client:
        response = await client.post(URL, json={})
    assert response.json() == {"error": {"message": "bad model"}}
    assert "yieldgate_truncated" not in response.extensions


async def test_item16_a_priority_header_in_any_case_is_forwarded_as_the_server_reads_it(
    make_client: Client,
) -> None:
    # The client lower-cased the header for itself but forwarded "High" as given.
    script = Script((200, {"ok": True}, {}))
    gate = one_slot_gate()
    async with make_client(script, gate) as client:
        await client.post(URL, json={}, headers={"X-Yieldgate-Priority": " High "})
    assert script.requests[0]["priority"] == "high"
    assert script.requests[0]["headers"]["x-yieldgate-priority"] == "high"
